"""The GPU device's own code (`logos_ir.runtime.cuda.devices.Gpu`), run here against a stand-in for cupy that
records which stream each allocation, fill, copy and launch goes on and executes the launches with the lane's
emulator (bf16 as uint16 bit patterns, as on a GPU): every one of them is on the non-blocking work stream, never the
legacy default stream; each kernel's function is resolved once; the decode step is captured once (after a
synchronize) and replayed; the tokens are the reference's. No GPU is needed, and none is claimed."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from logos_ir.generate import Generator
from logos_ir.numerics import bf16_bits
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda import devices, generator
from logos_ir.runtime.cuda.emulator import KernelEmulator, LaunchShape
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights

PROMPT = [3, 17, 250, 9, 41]


class FakeCupy(types.ModuleType):
    """The parts of cupy the GPU device uses, recording (what, stream) for each call."""

    float32, uint16, int64, uint32 = np.float32, np.uint16, np.int64, np.uint32

    def __init__(self) -> None:
        super().__init__("cupy")
        self.log: list[tuple[str, Any]] = []
        self.current: list[Any] = [None]  # None: the legacy default stream
        self.resolved: list[str] = []
        fake = self

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                self.non_blocking, self.capture, self.ptr = non_blocking, None, id(self)

            def __enter__(self) -> Stream:
                fake.current.append(self)
                return self

            def __exit__(self, *exc: Any) -> None:
                fake.current.pop()

            def synchronize(self) -> None:
                fake.log.append(("synchronize", self))

            def begin_capture(self) -> None:
                fake.log.append(("begin_capture", self))
                self.capture = []

            def end_capture(self) -> Any:
                nodes, self.capture = self.capture, None
                fake.log.append(("end_capture", self))
                return Graph(nodes)

        class Graph:
            def __init__(self, nodes: list[Any]) -> None:
                self.nodes = nodes

            def launch(self, stream: Any) -> None:
                fake.log.append(("graph_launch", stream))
                for node in self.nodes:
                    node()

        class Device:
            compute_capability = "90"

            def __init__(self, index: int = 0) -> None:
                self.index = index

            def use(self) -> None:
                fake.log.append(("use", self.index))

        self.cuda = types.SimpleNamespace(
            Stream=Stream,
            Device=Device,
            runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, deviceSynchronize=lambda: None),
        )

    def stream(self) -> Any:
        return self.current[-1]

    def zeros(self, shape: Any, dtype: Any) -> FakeArray:
        self.log.append(("alloc", self.stream()))
        return FakeArray(self, np.zeros(shape, dtype))

    def empty(self, shape: Any, dtype: Any) -> FakeArray:
        self.log.append(("alloc", self.stream()))
        return FakeArray(self, np.zeros(shape, dtype))


class FakeArray:
    def __init__(self, cp: FakeCupy, data: np.ndarray) -> None:
        self.cp, self.host = cp, data
        self.shape, self.dtype, self.size = data.shape, data.dtype, data.size
        self.widened: np.ndarray | None = None  # bf16 bit patterns as the f32 values the emulator reads

    def values(self) -> np.ndarray:
        if self.dtype != np.uint16:
            return self.host
        if self.widened is None:
            self.widened = (self.host.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return self.widened

    def set(self, values: np.ndarray, stream: Any = None) -> None:
        self.cp.log.append(("set", stream))
        self.host[...] = values
        self.widened = None

    def get(self, stream: Any = None) -> np.ndarray:
        self.cp.log.append(("get", stream))
        return self.host.copy()

    def fill(self, value: Any) -> None:
        self.cp.log.append(("fill", self.cp.stream()))
        self.host.fill(value)
        self.widened = None


def kernel_writes(kernel: Any) -> list[bool]:
    stored = {op.operands[1] for op in kernel.walk() if op.name in ("memref.store", "memref.atomic_rmw")}
    return [arg in stored for arg in kernel.body.block.args]


def _module(cp: FakeCupy, kernels: dict[str, Any]) -> Any:
    """A compiled kernels.cu: each function runs the lane's emulator on the arrays (bf16 bit patterns widened for
    it and rounded back where the kernel wrote them)."""

    def get_function(name: str) -> Any:
        cp.resolved.append(name)
        emulator = KernelEmulator(kernels[name])
        writes = kernel_writes(kernels[name])

        def run(grid: Any, block: Any, args: tuple[FakeArray, ...]) -> None:
            stream = cp.stream()

            def execute() -> None:
                views = [a.values() for a in args]
                emulator.run(views, LaunchShape.of(tuple(grid), block[0]))
                for a, view, written in zip(args, views, writes, strict=True):
                    if a.dtype == np.uint16 and written:
                        a.host[...] = bf16_bits(view)

            cp.log.append(("launch", stream))
            if stream is not None and stream.capture is not None:
                stream.capture.append(execute)
            else:
                execute()

        return run

    return types.SimpleNamespace(get_function=get_function)


@pytest.mark.parametrize("weights", ["f32", "bf16"])
def test_the_gpu_device_keeps_everything_on_its_work_stream(monkeypatch: pytest.MonkeyPatch, weights: str) -> None:
    cp = FakeCupy()
    kernels: dict[str, Any] = {}
    make = generator.build_program

    def built(*args: Any) -> Any:
        build = make(*args)
        kernels.update(build.plan.kernels)
        return build

    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(generator, "build_program", built)
    monkeypatch.setattr(devices, "_compile_cuda", lambda cupy, source: _module(cupy, kernels))
    store = RandomWeights(ModelSpec.preset("tiny"), seed=9)
    lane = generator.cuda_generator(RunRequest(store, None, 4, 1, weights))
    got = lane.generate(PROMPT, 4)
    if weights == "f32":
        assert got == Generator(store, prefill_rows=4).generate(PROMPT, 4)
    (device,) = lane.runtime.devices
    assert isinstance(device, devices.Gpu) and device.stream.non_blocking
    streams = {stream for what, stream in cp.log if what in ("alloc", "fill", "set", "get", "launch")}
    assert streams == {device.stream}  # nothing on the legacy default stream
    assert len(cp.resolved) == len(set(cp.resolved))  # each kernel's function resolved once
    kinds = [what for what, _ in cp.log]
    assert kinds.count("begin_capture") == kinds.count("end_capture") == 1  # the decode step, once
    assert kinds[kinds.index("begin_capture") - 1] == "synchronize"  # a fault of the eager run surfaces first
    assert kinds.count("graph_launch") == 2  # 4 tokens: the prefill's, then 3 decode steps, the last 2 replays
