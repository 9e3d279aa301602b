"""The one CUDA driver call the GPU device makes itself: `cuLaunchKernelEx` with the programmatic-stream-serialization
attribute (Hopper's programmatic dependent launch), which cupy's kernel call cannot pass. Through ctypes on the
driver library (`libcuda.so.1`, which every CUDA installation with a GPU has); the structures are `cuda.h`'s (CUDA
12 and 13: `CUlaunchConfig`, `CUlaunchAttribute` with its 64-byte value union), checked against the header by
`test/unit/test_cuda_driver.py` where the toolkit is installed. Launched so inside a stream capture, the launch
becomes a kernel node joined to the one before it by a programmatic edge (CUDA 12.3 and later)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from logos_ir.errors import LogosError

# cuda.h's CUlaunchAttributeID value (CUDA 12.0 onwards)
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttributeValue(ctypes.Union):
    """`CUlaunchAttributeValue`: a 64-byte union; the programmatic attribute's value is its first int."""

    _fields_ = [("pad", ctypes.c_char * 64), ("programmaticStreamSerializationAllowed", ctypes.c_int)]


class LaunchAttribute(ctypes.Structure):
    """`CUlaunchAttribute`: the attribute's id (an enum, 4 bytes), padding to 8, its value."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """`CUlaunchConfig`."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def programmatic_config(
    grid: tuple[int, int, int], block: int, stream: int, shared: int = 0, programmatic: bool = True
) -> tuple[LaunchConfig, ctypes.Array[LaunchAttribute]]:
    """The launch configuration of a launch on `stream` with `shared` bytes of dynamic shared memory, programmatic
    or not (the attribute array kept with it: the configuration points into it)."""
    attrs = (LaunchAttribute * 1)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attrs[0].value.programmaticStreamSerializationAllowed = 1
    config = LaunchConfig(*grid, block, 1, 1, shared, ctypes.c_void_p(stream), attrs, 1 if programmatic else 0)
    return config, attrs


class Driver:
    """`cuLaunchKernelEx` of the driver library, loaded once."""

    def __init__(self, library: Any = None):
        if library is None:
            try:
                library = ctypes.CDLL("libcuda.so.1")
            except OSError as error:
                raise LogosError(f"the CUDA driver library (libcuda.so.1) could not be loaded: {error}") from None
        self.library = library
        self.launch_ex = library.cuLaunchKernelEx
        self.launch_ex.restype = ctypes.c_int
        self.launch_ex.argtypes = [
            ctypes.POINTER(LaunchConfig),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ]

    def launch_programmatic(
        self, function: int, grid: tuple[int, int, int], block: int, pointers: Sequence[int], stream: int
    ) -> None:
        """Launches the kernel `function` (a CUfunction) on device pointers `pointers` (its parameters, in order)."""
        config, attrs = programmatic_config(grid, block, stream)
        values = [ctypes.c_void_p(p) for p in pointers]
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        status = self.launch_ex(ctypes.byref(config), ctypes.c_void_p(function), params, None)
        del attrs  # kept alive until the call has returned
        if status != 0:
            raise LogosError(f"cuLaunchKernelEx (programmatic launch) failed with CUresult {status}")

    def launch_with(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: int,
        params: Any,
        shared: int,
        stream: int,
        programmatic: bool,
    ) -> None:
        """Launches `function` with ready `params` (`tensor_maps.kernel_params`: pointers and tensor maps) and
        `shared` bytes of dynamic shared memory, programmatic or not."""
        config, attrs = programmatic_config(grid, block, stream, shared, programmatic)
        status = self.launch_ex(ctypes.byref(config), ctypes.c_void_p(function), params, None)
        del attrs
        if status != 0:
            raise LogosError(f"cuLaunchKernelEx failed with CUresult {status}")
