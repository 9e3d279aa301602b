"""The GPU device's own code (`logos_ir.runtime.cuda.devices.Gpu`), run here against a stand-in for cupy that
records which stream each allocation, fill, copy and launch goes on and executes the launches with the lane's
emulator (bf16 as uint16 bit patterns, as on a GPU): every one of them is on the non-blocking work stream, never the
legacy default stream; each kernel's function is resolved once; the decode step is captured once (after a
synchronize) and replayed; the tokens are the reference's. No GPU is needed, and none is claimed."""

from __future__ import annotations

import ctypes
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
from logos_ir.sampling import Sampler, SamplingSettings
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
                fake.by_ptr[self.ptr] = self

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

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
                self.stream: Any = None

            def record(self, stream: Any) -> None:
                self.stream = stream

            def synchronize(self) -> None:
                fake.log.append(("event_synchronize", self.stream))

        def alloc_pinned_memory(nbytes: int) -> Any:
            fake.log.append(("pinned", nbytes))
            memory = (ctypes.c_uint8 * nbytes)()
            fake.pinned.append((ctypes.addressof(memory), nbytes))
            return memory

        def memcpyAsync(to: int, source: int, nbytes: int, kind: int, stream: int) -> None:  # noqa: N802 - cupy's
            """cudaMemcpyAsync: host side from pinned memory alone (a pageable copy is not asynchronous)."""
            host, device = (source, to) if kind == 1 else (to, source)
            assert any(a <= host and host + nbytes <= a + n for a, n in fake.pinned), "a copy from pageable memory"
            array, offset = fake.find(device)
            raw = array.host.reshape(-1).view(np.uint8)
            if kind == 1:
                raw[offset : offset + nbytes] = np.frombuffer(ctypes.string_at(host, nbytes), np.uint8)
                array.widened = None
            else:
                ctypes.memmove(host, raw[offset:].ctypes.data, nbytes)
            fake.log.append(("memcpy_h2d" if kind == 1 else "memcpy_d2h", fake.by_ptr[stream]))
            fake.copies.append(("h2d" if kind == 1 else "d2h", nbytes))

        self.functions: dict[int, Any] = {}  # each resolved kernel by its CUfunction handle
        self.pinned: list[tuple[int, int]] = []
        self.copies: list[tuple[str, int]] = []
        self.arrays: list[FakeArray] = []
        self.by_ptr: dict[int, Any] = {}
        self.cuda = types.SimpleNamespace(
            Stream=Stream,
            Device=Device,
            Event=Event,
            alloc_pinned_memory=alloc_pinned_memory,
            runtime=types.SimpleNamespace(
                getDeviceCount=lambda: 1, deviceSynchronize=lambda: None, memcpyAsync=memcpyAsync
            ),
        )

    def find(self, pointer: int) -> tuple[FakeArray, int]:
        for array in self.arrays:
            if array.data.ptr <= pointer < array.data.ptr + max(array.host.nbytes, 1):
                return array, pointer - array.data.ptr
        raise AssertionError(f"no device array at {pointer}")

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
        self.data = types.SimpleNamespace(ptr=data.ctypes.data)  # a device pointer: the fake's memory
        cp.arrays.append(self)
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

        run.kernel = types.SimpleNamespace(ptr=id(run))  # type: ignore[attr-defined]  # cupy's CUfunction handle
        cp.functions[id(run)] = run
        return run

    return types.SimpleNamespace(get_function=get_function)


class FakeDriver:
    """`driver.Driver` on the fake: cuLaunchKernelEx runs the kernel's function on its stream, logged apart."""

    def __init__(self, cp: FakeCupy) -> None:
        self.cp = cp

    def launch_programmatic(self, function: int, grid: Any, block: int, pointers: Any, stream: int) -> None:
        self.cp.log.append(("launch_programmatic", self.cp.by_ptr[stream]))
        arrays = []
        for pointer in pointers:
            array, offset = self.cp.find(pointer)
            assert offset == 0
            arrays.append(array)
        with self.cp.by_ptr[stream]:
            self.cp.functions[function](grid, (block, 1, 1), tuple(arrays))


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
    from logos_ir.runtime.cuda import driver

    monkeypatch.setattr(driver, "Driver", lambda: FakeDriver(cp))
    store = RandomWeights(ModelSpec.preset("tiny"), seed=9)
    lane = generator.cuda_generator(RunRequest(store, None, 4, 1, weights))
    got = lane.generate(PROMPT, 4)
    if weights == "f32":
        assert got == Generator(store, prefill_rows=4).generate(PROMPT, 4)
    (device,) = lane.runtime.devices
    assert isinstance(device, devices.Gpu) and device.stream.non_blocking
    moves = ("alloc", "fill", "memcpy_h2d", "memcpy_d2h", "launch", "launch_programmatic")
    streams = {stream for what, stream in cp.log if what in moves}
    assert streams == {device.stream}  # nothing on the legacy default stream
    # every kernel waits at its top, so on this sm_90 every launch is programmatic (cuLaunchKernelEx)
    assert [what for what, _ in cp.log if what.startswith("launch")].count("launch_programmatic") * 2 == sum(
        what.startswith("launch") for what, _ in cp.log
    )
    kinds = [what for what, _ in cp.log]
    assert "set" not in kinds and "get" not in kinds  # every copy asynchronous, from or into pinned memory
    # greedy: the token is the device's arg-max; one 8-byte read a run (2 prefill chunks' of 4 and 1 rows, 3 decode
    # steps'), and the logits never leave the device
    assert [c for c in cp.copies if c[0] == "d2h"] == [("d2h", 8)] * 5
    staged = sum(n for _, n in (c for c in cp.log if c[0] == "pinned"))
    assert staged <= devices.Gpu.STAGING_CHUNKS * devices.Gpu.STAGING_BYTES + 4096  # chunks, and inputs/outputs
    if weights == "bf16":
        return
    vocab = store.spec.vocab  # sampling reads the logits back, once a token
    del cp.copies[:]
    sampled = lane.generate(PROMPT, 3, sampler=Sampler(SamplingSettings(temperature=0.8, seed=1)))
    assert len(sampled) == 3
    assert (
        sorted(n for k, n in cp.copies if k == "d2h") == [8] * 4 + [4 * vocab] * 3
    )  # 2 chunks, 2 decode steps; 3 draws
    assert len(cp.resolved) == len(set(cp.resolved))  # each kernel's function resolved once
    assert kinds.count("begin_capture") == kinds.count("end_capture") == 1  # the decode step, once
    assert kinds[kinds.index("begin_capture") - 1] == "synchronize"  # a fault of the eager run surfaces first
    assert kinds.count("graph_launch") == 2  # 4 tokens: the prefill's, then 3 decode steps, the last 2 replays


class FakeHopperDriver(FakeDriver):
    """`FakeDriver` with `launch_with` (a kernel taking tensor maps and dynamic shared memory) and a stand-in driver
    library whose cuTensorMapEncodeTiled and cuFuncSetAttribute record their calls."""

    def __init__(self, cp: FakeCupy, kernels: dict[str, Any]) -> None:
        super().__init__(cp)
        self.kernels, self.encoded, self.attributes, self.launches = kernels, [], [], []
        fake = self

        class Library:
            @staticmethod
            def cuTensorMapEncodeTiled(*args: Any) -> int:  # noqa: N802 (the driver's name)
                fake.encoded.append(args)
                return 0

            @staticmethod
            def cuFuncSetAttribute(function: Any, attribute: int, value: int) -> int:  # noqa: N802
                fake.attributes.append((attribute, value))
                return 0

        self.library = Library()

    def launch_with(self, function: int, grid: Any, block: int, params: Any, shared: int, stream: int, _: bool) -> None:
        run = self.cp.functions[function]
        count = len(self.kernels[run.name].body.block.args)
        pointers = [ctypes.c_void_p.from_address(params[i]).value for i in range(count)]
        self.launches.append((run.name, tuple(pointers), shared, len(params) - count))
        arrays = []
        for pointer in pointers:
            array, offset = self.cp.find(pointer)
            assert offset == 0
            arrays.append(array)
        with self.cp.by_ptr[stream]:
            run(grid, (block, 1, 1), tuple(arrays))


def test_the_gpu_device_launches_the_wgmma_products_with_their_tensor_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 chunk of 72 rows (more than a batch: the wgmma path): each product's launch goes through
    cuLaunchKernelEx with its tensor maps by value and 132 KB of dynamic shared memory, the maps encoded (and the
    function's shared memory raised) once for each kernel and set of buffers, and the token is the reference's."""
    spec = ModelSpec.preset("tiny")  # hidden 64, intermediate 128: depths of whole 64-element slices
    prompt = [int(t) for t in np.random.default_rng(4).integers(0, spec.vocab - 1, 72)]
    store = RandomWeights(spec, seed=9)
    want = Generator(store, prefill_rows=72).generate(prompt, 1)  # the reference's (bf16 agrees here: seeds fixed)
    cp = FakeCupy()
    kernels: dict[str, Any] = {}
    make = generator.build_program

    def built(*args: Any) -> Any:
        build = make(*args)
        kernels.update(build.plan.kernels)
        return build

    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(generator, "build_program", built)

    def module(cupy: Any, source: str) -> Any:
        compiled = _module(cupy, kernels)
        get = compiled.get_function

        def named(name: str) -> Any:
            run = get(name)
            run.name = name
            return run

        return types.SimpleNamespace(get_function=named)

    monkeypatch.setattr(devices, "_compile_cuda", module)
    from logos_ir.runtime.cuda import driver

    fake = FakeHopperDriver(cp, kernels)
    monkeypatch.setattr(driver, "Driver", lambda: fake)
    lane = generator.cuda_generator(RunRequest(store, None, 72, 1, "bf16"))
    assert lane.generate(prompt, 1) == want
    products = {name for name, *_ in fake.launches}
    assert products and all("_wgmma_" in name for name in products)
    assert {(shared, maps) for name, _, shared, maps in fake.launches if "gate_up" not in name} == {(132128, 2)}
    assert {(shared, maps) for name, _, shared, maps in fake.launches if "gate_up" in name} == {(132128, 3)}
    # the maps encoded and the shared memory raised once for each kernel and set of buffers it is launched on
    assert fake.attributes == [(8, 132128)] * len(fake.launches)
    assert len(fake.encoded) == sum(maps for *_, maps in fake.launches)
    assert lane.generate(prompt, 1) == want  # the same buffers again: nothing encoded anew
    assert (
        len(fake.launches) == 2 * len(fake.attributes) and len(fake.encoded) == sum(m for *_, m in fake.launches) // 2
    )
