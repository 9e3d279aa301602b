"""The host's side of the Hopper products' TMA copies: the CUtensorMaps a kernel takes, and its dynamic shared memory.

A kernel with `cuda.tma_load` ops takes, after its buffer pointers, one `__grid_constant__` CUtensorMap a distinct
(tensor, box, swizzle) (`cuda.tensor_maps`, the order the emitter declares them in); the host encodes each with the
driver's `cuTensorMapEncodeTiled` for the buffer the launch passes: a 2-d tensor of bf16 (the innermost dimension
first, as cuda.h takes it: its columns, then its rows, the row pitch in bytes), the box (columns, rows), element
strides 1, no interleave, the swizzle, L2 promotion of 256 bytes (CUTLASS's choice for its operands) and zero fill
past the edges (what the emulator does). The kernel's shared buffers are carved out of dynamic shared memory
(`cuda.shared_layout`: 128 KB and more for the 4-stage ring), so its launch asks for those bytes and the function's
maximum is raised first (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`). The enum values are cuda.h's (CUDA 12
and 13), checked against the toolkit's header by `test/unit/test_cuda_driver.py` where it is installed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import BFloat16Type, Float32Type

from logos_ir.dialects import cuda
from logos_ir.errors import LogosError

# cuda.h's enum values
CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7
CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # CU_TENSOR_MAP_SWIZZLE_NONE, _32B, _64B, _128B
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # elements past the tensor's edge read as zero
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
TENSOR_MAP_BYTES = 128  # CU_TENSOR_MAP_NUM_QWORDS (16) x 8


@dataclass(frozen=True)
class TensorMapSpec:
    """One CUtensorMap a kernel takes: which of its parameters is the tensor, its element type, its shape (rows,
    columns), the box (rows, columns) and the swizzle in bytes."""

    arg: int
    element: str
    shape: tuple[int, int]
    box: tuple[int, int]
    swizzle: int

    def encode_args(self, address: int) -> tuple[Any, ...]:
        """`cuTensorMapEncodeTiled`'s arguments after the map itself, for the tensor at device `address`."""
        if address % 16:
            raise LogosError(f"a TMA tensor must start 16-byte aligned, not at {address:#x}")
        size = 2 if self.element == "bf16" else 4
        rows, columns = self.shape
        if (columns * size) % 16:
            raise LogosError(f"a TMA tensor's row pitch must be whole 16 bytes, not {columns * size}")
        kind = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 if self.element == "bf16" else CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        return (
            ctypes.c_int(kind),
            ctypes.c_uint(2),
            ctypes.c_void_p(address),
            (ctypes.c_uint64 * 2)(columns, rows),
            (ctypes.c_uint64 * 1)(columns * size),
            (ctypes.c_uint32 * 2)(self.box[1], self.box[0]),
            (ctypes.c_uint32 * 2)(1, 1),
            ctypes.c_int(CU_TENSOR_MAP_INTERLEAVE_NONE),
            ctypes.c_int(CU_TENSOR_MAP_SWIZZLE[self.swizzle]),
            ctypes.c_int(CU_TENSOR_MAP_L2_PROMOTION_L2_256B),
            ctypes.c_int(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        )


def tensor_map_specs(kernel: Any) -> list[TensorMapSpec]:
    """The CUtensorMaps a `gpu.func` takes after its pointers, in the emitter's order."""
    args = list(kernel.body.block.args)
    specs = []
    for src, box, swizzle in cuda.tensor_maps(kernel):
        kind = src.type
        element = kind.element_type
        if not isinstance(element, BFloat16Type | Float32Type):
            raise LogosError(f"kernel {kernel.sym_name.data}: no TMA tensor map for {element}")
        name = "bf16" if isinstance(element, BFloat16Type) else "f32"
        rows, columns = kind.get_shape()
        specs.append(TensorMapSpec(args.index(src), name, (rows, columns), box, swizzle))
    return specs


def dynamic_shared_bytes(kernel: Any) -> int:
    """The dynamic shared memory a launch of `kernel` asks for: its shared buffers when it carves them from dynamic
    shared memory (a kernel with TMA copies), else none."""
    if not any(isinstance(op, cuda.TmaLoadOp) for op in kernel.walk()):
        return 0
    return cuda.shared_layout(kernel)[1]


class TensorMapEncoder:
    """`cuTensorMapEncodeTiled` and `cuFuncSetAttribute` of the driver library."""

    def __init__(self, library: Any):
        self.encode_tiled = library.cuTensorMapEncodeTiled
        self.encode_tiled.restype = ctypes.c_int
        self.set_attribute = library.cuFuncSetAttribute
        self.set_attribute.restype = ctypes.c_int
        self.set_attribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]

    def encode(self, spec: TensorMapSpec, address: int) -> ctypes.Array[ctypes.c_char]:
        """The 128 bytes of the map (64-byte aligned, as the kernel parameter is), to be passed by value."""
        raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 64)
        offset = (-ctypes.addressof(raw)) % 64
        tensor_map = (ctypes.c_char * TENSOR_MAP_BYTES).from_buffer(raw, offset)
        status = self.encode_tiled(ctypes.byref(tensor_map), *spec.encode_args(address))
        if status != 0:
            raise LogosError(f"cuTensorMapEncodeTiled failed with CUresult {status} for {spec}")
        tensor_map._owner = raw  # type: ignore[attr-defined]  # keeps the buffer alive with the view
        return tensor_map

    def allow_shared(self, function: int, nbytes: int) -> None:
        status = self.set_attribute(ctypes.c_void_p(function), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        if status != 0:
            raise LogosError(f"cuFuncSetAttribute (dynamic shared memory of {nbytes} bytes) failed: CUresult {status}")


def kernel_params(pointers: Sequence[int], maps: Sequence[Any]) -> tuple[Any, list[Any]]:
    """`cuLaunchKernelEx`'s kernelParams: a pointer to each parameter's value, the device pointers then the maps
    (passed by value: the driver copies each map's 128 bytes); the values kept alive beside."""
    values: list[Any] = [ctypes.c_void_p(p) for p in pointers] + list(maps)
    params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    return params, values
