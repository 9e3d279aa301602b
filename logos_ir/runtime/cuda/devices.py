"""The devices the CUDA host runtime drives, behind one interface (load kernels, allocate, upload, write, fill, read,
launch, collectives on the work stream, graph capture and replay): `Emulator` (the emulator: numpy buffers, each
kernel a `KernelEmulator` of the build's `gpu.func`, the stream executed in order and logged, a graph replayed in
lockstep over the local ranks) and `Gpu` (cupy: one non-blocking work stream for everything, `kernels.cu` compiled
once by nvcc or NVRTC and each kernel resolved once, the step captured as a CUDA graph with its all-reduces).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from logos_ir.errors import LogosError
from logos_ir.numerics import bf16_bits, bf16_rounded
from logos_ir.passes.cuda.host_plan import UNIT_BYTES
from logos_ir.runtime.cuda.emulator import KernelEmulator, LaunchShape


class Emulator:
    """The emulator as a device of the host runtime: buffers are numpy arrays (bf16 held as bf16-rounded f32),
    kernels are `KernelEmulator`s of the plan's `gpu.func`s (made once), the work stream is executed in order and
    logged (`stream`: what was enqueued, by kind and buffer), a graph is the list of nodes (launches, collectives)
    recorded between `begin_capture` and `end_capture`, replayed in that order."""

    kind = "emulator"

    def __init__(self, rank: int = 0, seed: int | None = None):
        self.rank, self.seed = rank, seed  # seed: kernels that hand work between warps run interleaved by it
        self.stream: list[tuple[str, str]] = []
        self.kernels: dict[str, KernelEmulator] = {}
        self.launches: dict[tuple[tuple[int, int, int], int], LaunchShape] = {}
        self.kernel_seconds: dict[str, float] = {}
        self.graph: list[tuple[Any, ...]] | None = None

    def load(self, kernels: dict[str, Any], cuda_source: str) -> None:
        for name, kernel in kernels.items():
            if name not in self.kernels:
                self.kernels[name] = KernelEmulator(kernel, self.seed)
        self.stream.append(("load", f"{len(kernels)} kernels"))

    def alloc(self, name: str, shape: tuple[int, ...], element: str) -> np.ndarray:
        self.stream.append(("alloc", name))
        return np.zeros(shape, np.int64 if element == "i64" else np.float32)

    def upload(self, name: str, values: np.ndarray, element: str) -> np.ndarray:
        self.stream.append(("upload", name))
        if element in UNIT_BYTES:  # a weight read as stored: its blocks' units, as they are
            return np.array(values)
        if values.dtype == np.uint16:  # bf16 bit patterns from an image file
            return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if element == "i64":
            return np.array(values, np.int64)
        return bf16_rounded(values) if element == "bf16" else np.array(values, np.float32)

    def write(self, name: str, array: np.ndarray, values: np.ndarray) -> None:
        self.stream.append(("write", name))
        array[...] = values

    def fill(self, name: str, array: np.ndarray) -> None:
        self.stream.append(("fill", name))
        array.fill(0)

    def read(self, name: str, array: np.ndarray) -> np.ndarray:
        self.stream.append(("read", name))
        return array.copy()

    def launch(
        self, kernel: str, grid: tuple[int, int, int], block: int, arrays: list[np.ndarray], programmatic: bool = False
    ) -> None:
        """One launch, run now or recorded in a capture; launches run one after another here, so a programmatic
        launch's wait is always met (the kernel's emulator refuses one that touches memory before its wait)."""
        node = ("launch", kernel, grid, block, arrays)
        if self.graph is not None:
            self.graph.append(node)
            return
        self.stream.append(("launch", kernel))
        self._execute(node)

    def collective(self, name: str, work: Callable[[], None] | None, kind: str = "all_reduce") -> None:
        """A collective on the work stream (None: this rank's part is done by another local rank's node)."""
        node = ("collective", name, work)
        if self.graph is not None:
            self.graph.append(node)
            return
        self.stream.append((kind, name))
        self._execute(node)

    def begin_capture(self) -> None:
        self.synchronize()
        self.stream.append(("begin_capture", ""))
        self.graph = []

    def end_capture(self) -> list[tuple[Any, ...]]:
        graph, self.graph = self.graph, None
        assert graph is not None
        self.stream.append(("end_capture", f"{len(graph)} nodes"))
        return graph

    @staticmethod
    def replay(devices: Sequence[Emulator], graphs: Sequence[list[tuple[Any, ...]]]) -> None:
        """The local ranks' graphs node by node in lockstep, so a collective runs once every rank reached it."""
        for device in devices:
            device.stream.append(("graph_launch", f"{len(graphs[0])} nodes"))
        for nodes in zip(*graphs, strict=True):
            for device, node in zip(devices, nodes, strict=True):
                device._execute(node)

    def synchronize(self) -> None:
        """Everything enqueued has run (the emulator executes in order as it is enqueued)."""

    def _execute(self, node: tuple[Any, ...]) -> None:
        if node[0] == "collective":
            if node[2] is not None:
                node[2]()
            return
        _, kernel, grid, block, arrays = node
        shape = self.launches.get((grid, block))
        if shape is None:
            shape = self.launches[(grid, block)] = LaunchShape.of(grid, block)
        started = time.perf_counter()
        self.kernels[kernel].run(arrays, shape)
        self.kernel_seconds[kernel] = self.kernel_seconds.get(kernel, 0.0) + time.perf_counter() - started


class Gpu:
    """A GPU (through cupy) as a device of the host runtime: one non-blocking work stream that every allocation,
    fill, copy, launch and collective goes on; `kernels.cu` compiled once per source and each kernel's function
    resolved once; bf16 buffers as uint16 bit patterns; a graph captured from the work stream (after a check that
    nothing before it failed) and replayed on it."""

    kind = "gpu"

    # Host-to-device copies of weights go through this many pinned chunks of STAGING_BYTES, in turn: a chunk is
    # refilled once the copy that last used it has completed (its event), so the host holds at most these chunks
    # besides the one share it is uploading.
    STAGING_CHUNKS = 2
    STAGING_BYTES = 32 << 20

    def __init__(self, rank: int = 0, cupy: Any = None):
        if cupy is None:
            import cupy  # type: ignore[import-not-found, no-redef]
        self.cp, self.rank = cupy, rank
        count = max(int(cupy.cuda.runtime.getDeviceCount()), 1)
        cupy.cuda.Device(rank % count).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.modules: dict[str, Any] = {}
        self.functions: dict[str, Any] = {}
        self.capturing = False
        self.pinned: dict[str, tuple[np.ndarray, Any]] = {}  # a pinned host buffer a name, and its last copy's event
        self.staging: list[tuple[np.ndarray, Any]] = []
        self.turn = 0
        # Programmatic dependent launch needs sm_90 (Hopper) or later; `bench/gpu_decode.py` turns it off to time the
        # same kernels launched plainly beside it.
        self.programmatic = int(cupy.cuda.Device().compute_capability) >= 90
        self.driver: Any = None
        self.hopper: dict[str, tuple[list[Any], int]] = {}  # kernel -> its tensor maps and dynamic shared bytes
        self.encoded: dict[tuple[str, tuple[int, ...]], Any] = {}  # (kernel, pointers) -> its launch parameters

    def _type(self, element: str) -> Any:
        if element in UNIT_BYTES:  # a weight read as stored: its blocks' 16- or 32-bit units
            return self.cp.uint16 if UNIT_BYTES[element] == 2 else self.cp.uint32
        return {"f32": self.cp.float32, "bf16": self.cp.uint16, "i64": self.cp.int64}[element]

    def load(self, kernels: dict[str, Any], cuda_source: str) -> None:
        module = self.modules.get(cuda_source)
        if module is None:
            module = self.modules[cuda_source] = _compile_cuda(self.cp, cuda_source)
        from logos_ir.runtime.cuda.tensor_maps import dynamic_shared_bytes, tensor_map_specs

        for name, kernel in kernels.items():
            if name not in self.functions:
                self.functions[name] = module.get_function(name)
            specs, shared = tensor_map_specs(kernel), dynamic_shared_bytes(kernel)
            if specs or shared:  # a Hopper product: tensor maps by value and dynamic shared memory
                self.hopper[name] = (specs, shared)

    def alloc(self, name: str, shape: tuple[int, ...], element: str) -> Any:
        with self.stream:  # cupy's pool is stream-ordered; the zero fill is a kernel on the work stream
            return self.cp.zeros(shape, self._type(element))

    def _page_locked(self, nbytes: int) -> np.ndarray:
        memory = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(memory, np.uint8, max(nbytes, 1))

    def _host_buffer(self, name: str, nbytes: int) -> np.ndarray:
        """The pinned host buffer of `name` (inputs, outputs), once its last copy is done."""
        found = self.pinned.get(name)
        if found is None or found[0].nbytes < nbytes:
            found = (self._page_locked(nbytes), None)
            self.pinned[name] = found
        elif found[1] is not None:
            found[1].synchronize()
        return found[0][:nbytes]

    def _copy(self, to: int, source: int, nbytes: int, kind: int) -> Any:
        """One cudaMemcpyAsync on the work stream, and an event recorded after it."""
        self.cp.cuda.runtime.memcpyAsync(to, source, nbytes, kind, self.stream.ptr)
        event = self.cp.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)
        return event

    def upload(self, name: str, values: np.ndarray, element: str) -> Any:
        """A share to the device through the pinned staging chunks (asynchronous copies on the work stream):
        `values` may be a memory-mapped view of a file (bf16 bit patterns), read a chunk at a time."""
        bits = values.dtype == np.uint16 or element in UNIT_BYTES
        host = values if bits else bf16_bits(values) if element == "bf16" else values
        host = np.ascontiguousarray(host, self._type(element))
        with self.stream:
            array = self.cp.empty(values.shape, self._type(element))
        flat = host.reshape(-1).view(np.uint8)
        if not self.staging:
            self.staging = [(self._page_locked(self.STAGING_BYTES), None) for _ in range(self.STAGING_CHUNKS)]
        for start in range(0, flat.nbytes, self.STAGING_BYTES):
            part = flat[start : start + self.STAGING_BYTES]
            chunk, event = self.staging[self.turn]
            if event is not None:
                event.synchronize()  # the copy that last used this chunk is done
            chunk[: part.nbytes] = part
            done = self._copy(array.data.ptr + start, chunk.ctypes.data, part.nbytes, _HOST_TO_DEVICE)
            self.staging[self.turn] = (chunk, done)
            self.turn = (self.turn + 1) % self.STAGING_CHUNKS
        return array

    def write(self, name: str, array: Any, values: np.ndarray) -> None:
        """Inputs through the name's pinned buffer, copied on the work stream (asynchronous)."""
        host = np.ascontiguousarray(values, array.dtype)
        pinned = self._host_buffer(name, host.nbytes)
        pinned[:] = host.reshape(-1).view(np.uint8)
        done = self._copy(array.data.ptr, pinned.ctypes.data, host.nbytes, _HOST_TO_DEVICE)
        self.pinned[name] = (self.pinned[name][0], done)

    def fill(self, name: str, array: Any) -> None:
        with self.stream:
            array.fill(0)

    def read(self, name: str, array: Any) -> np.ndarray:
        """The buffer's values, copied on the work stream into its pinned buffer (asynchronous: the host waits for
        that copy's event alone, not for the device)."""
        nbytes = int(array.size) * np.dtype(array.dtype).itemsize
        pinned = self._host_buffer(name, nbytes)
        done = self._copy(pinned.ctypes.data, array.data.ptr, nbytes, _DEVICE_TO_HOST)
        self.pinned[name] = (self.pinned[name][0], done)
        done.synchronize()
        return pinned.view(array.dtype).reshape(array.shape).copy()

    def launch(
        self, kernel: str, grid: tuple[int, int, int], block: int, arrays: list[Any], programmatic: bool = False
    ) -> None:
        """A launch on the work stream; `programmatic` (its kernel waits for the launch before it at its top): on a
        Hopper or later, with `self.programmatic` on, through `cuLaunchKernelEx` with the programmatic attribute
        (`driver.Driver`), else as cupy launches."""
        if kernel in self.hopper:
            self._launch_hopper(kernel, grid, block, arrays, programmatic and self.programmatic)
            return
        if programmatic and self.programmatic:
            if self.driver is None:
                from logos_ir.runtime.cuda.driver import Driver

                self.driver = Driver()
            pointers = [array.data.ptr for array in arrays]
            self.driver.launch_programmatic(self.functions[kernel].kernel.ptr, grid, block, pointers, self.stream.ptr)
            return
        with self.stream:
            self.functions[kernel](grid, (block, 1, 1), tuple(arrays))

    def _launch_hopper(
        self, kernel: str, grid: tuple[int, int, int], block: int, arrays: list[Any], programmatic: bool
    ) -> None:
        """A kernel taking tensor maps (encoded once for the buffers it is launched on: a plan's buffers are fixed)
        and dynamic shared memory, through `cuLaunchKernelEx`."""
        from logos_ir.runtime.cuda.driver import Driver
        from logos_ir.runtime.cuda.tensor_maps import TensorMapEncoder, kernel_params

        if self.driver is None:
            self.driver = Driver()
        specs, shared = self.hopper[kernel]
        function = self.functions[kernel].kernel.ptr
        pointers = tuple(array.data.ptr for array in arrays)
        found = self.encoded.get((kernel, pointers))
        if found is None:
            encoder = TensorMapEncoder(self.driver.library)
            encoder.allow_shared(function, shared)
            maps = [encoder.encode(spec, pointers[spec.arg]) for spec in specs]
            found = self.encoded[(kernel, pointers)] = kernel_params(pointers, maps)
        self.driver.launch_with(function, grid, block, found[0], shared, self.stream.ptr, programmatic)

    def collective(self, name: str, work: Callable[[], None] | None, kind: str = "all_reduce") -> None:
        if work is not None:
            work()

    def begin_capture(self) -> None:
        self.synchronize()  # a fault of an eager launch surfaces here, not as a broken capture
        self.stream.begin_capture()
        self.capturing = True

    def end_capture(self) -> Any:
        self.capturing = False
        return self.stream.end_capture()

    @staticmethod
    def replay(devices: Sequence[Gpu], graphs: Sequence[Any]) -> None:
        for device, graph in zip(devices, graphs, strict=True):
            graph.launch(stream=device.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()
        self.cp.cuda.runtime.deviceSynchronize()


def gpu_count() -> int:
    """How many CUDA GPUs this process sees (0 without cupy or a driver)."""
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, no driver, no device: all mean no GPU here
        return 0


NO_GPU = (
    "the cuda backend found no GPU here (no CUDA device visible through cupy);"
    " add --emulate to run its kernels on the CPU"
)

# The rule the emitted CUDA and the IR share: products the IR keeps apart print as __fmul_rn and fused ones as
# __fmaf_rn, so -fmad cannot change a rounding; -fmad=false says so to nvcc as well.
NVCC_FLAGS = ("-O3", "-fmad=false")
_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind


def _compile_cuda(cp: Any, source: str) -> Any:
    """kernels.cu as a loaded module, a cubin for the device's architecture: nvcc's when nvcc is here, else NVRTC's
    (`nvrtc.compile_cubin`: the lane's own options, not cupy's, which add -ftz=true)."""
    from logos_ir.runtime.cuda import nvrtc

    capability = cp.cuda.Device().compute_capability
    arch = f"sm_{capability}"
    if "wgmma." in source:  # arch-specific PTX (sm_90a): a cubin that runs on compute capability 9.0 only
        if str(capability) != "90":
            raise LogosError(f"kernels.cu uses wgmma (sm_90a), which runs on compute capability 9.0, not {capability}")
        arch = "sm_90a"
    nvcc = shutil.which("nvcc")
    with tempfile.TemporaryDirectory(prefix="logos-cuda-") as folder:
        cu, cubin = Path(folder) / "kernels.cu", Path(folder) / "kernels.cubin"
        if nvcc is None:
            cubin.write_bytes(nvrtc.compile_cubin(source, arch).cubin)
        else:
            cu.write_text(source)
            subprocess.run([nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-o", str(cubin), str(cu)], check=True)
        return cp.RawModule(path=str(cubin))
