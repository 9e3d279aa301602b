"""The driver call the GPU device makes itself (`logos_ir.runtime.cuda.driver`): its ctypes structures have the
sizes and field offsets of `cuda.h`'s (`CUlaunchConfig`, `CUlaunchAttribute`) and the programmatic attribute's id,
read by a C compiler from the toolkit's header; a wrong layout would pass garbage to cuLaunchKernelEx on a GPU. The
Hopper products' tensor maps (`logos_ir.runtime.cuda.tensor_maps`): cuda.h's enum values, and the arguments each map of
a wgmma kernel is encoded with."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from logos_ir.errors import LogosError
from logos_ir.runtime.cuda import driver, tensor_maps

HEADER = Path("/usr/local/cuda/include/cuda.h")
CC = shutil.which("cc") or shutil.which("gcc")


@pytest.mark.skipif(CC is None or not HEADER.exists(), reason="no C compiler or no CUDA toolkit header (cuda.h) here")
def test_the_launch_structures_match_cuda_h(tmp_path: Path) -> None:
    fields = ["gridDimX", "blockDimX", "sharedMemBytes", "hStream", "attrs", "numAttrs"]
    lines = [f'printf("{f} %zu\\n", offsetof(CUlaunchConfig, {f}));' for f in fields]
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <cuda.h>\nint main(void) {\n"
        + "\n".join(lines)
        + '\nprintf("config %zu\\n", sizeof(CUlaunchConfig));'
        + '\nprintf("attribute %zu\\n", sizeof(CUlaunchAttribute));'
        + '\nprintf("value %zu\\n", offsetof(CUlaunchAttribute, value));'
        + '\nprintf("id %d\\n", (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);'
        + "\nreturn 0; }\n"
    )
    binary = tmp_path / "layout"
    subprocess.run([CC, f"-I{HEADER.parent}", str(source), "-o", str(binary)], check=True)
    header = dict(
        line.split() for line in subprocess.run([str(binary)], capture_output=True, text=True).stdout.splitlines()
    )
    ours = {f: getattr(driver.LaunchConfig, f).offset for f in fields}
    ours |= {
        "config": ctypes.sizeof(driver.LaunchConfig),
        "attribute": ctypes.sizeof(driver.LaunchAttribute),
        "value": driver.LaunchAttribute.value.offset,
        "id": driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    }
    assert {k: int(v) for k, v in header.items()} == ours


@pytest.mark.skipif(CC is None or not HEADER.exists(), reason="no C compiler or no CUDA toolkit header (cuda.h) here")
def test_the_tensor_map_enums_match_cuda_h(tmp_path: Path) -> None:
    names = {
        "CU_TENSOR_MAP_DATA_TYPE_FLOAT32": tensor_maps.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16": tensor_maps.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        "CU_TENSOR_MAP_INTERLEAVE_NONE": tensor_maps.CU_TENSOR_MAP_INTERLEAVE_NONE,
        "CU_TENSOR_MAP_SWIZZLE_NONE": tensor_maps.CU_TENSOR_MAP_SWIZZLE[0],
        "CU_TENSOR_MAP_SWIZZLE_32B": tensor_maps.CU_TENSOR_MAP_SWIZZLE[32],
        "CU_TENSOR_MAP_SWIZZLE_64B": tensor_maps.CU_TENSOR_MAP_SWIZZLE[64],
        "CU_TENSOR_MAP_SWIZZLE_128B": tensor_maps.CU_TENSOR_MAP_SWIZZLE[128],
        "CU_TENSOR_MAP_L2_PROMOTION_L2_256B": tensor_maps.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE": tensor_maps.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": tensor_maps.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    }
    lines = [f'printf("{name} %d\\n", (int){name});' for name in names]
    lines.append('printf("bytes %zu\\n", sizeof(CUtensorMap));')
    source = tmp_path / "enums.c"
    source.write_text(
        "#include <stdio.h>\n#include <cuda.h>\nint main(void) {\n" + "\n".join(lines) + "\nreturn 0; }\n"
    )
    binary = tmp_path / "enums"
    subprocess.run([CC, f"-I{HEADER.parent}", str(source), "-o", str(binary)], check=True)
    out = subprocess.run([str(binary)], capture_output=True, text=True).stdout.splitlines()
    header = {k: int(v) for k, v in (line.split() for line in out)}
    assert header == {**names, "bytes": tensor_maps.TENSOR_MAP_BYTES}


def test_a_hopper_kernels_tensor_maps_are_encoded_for_its_buffers() -> None:
    """The maps a wgmma product takes, in the order kernels.cu declares them, each encoded by cuTensorMapEncodeTiled
    (a stand-in recording its arguments: no GPU here) with the tensor's dims innermost first, its row pitch, the
    box, the 128B swizzle and zero fill; and the dynamic shared memory its launch asks for."""
    import dataclasses
    import io
    import re

    from logos_ir.passes.cuda.emit_cuda import KernelPrinter
    from logos_ir.program import Cut
    from logos_ir.runtime.cuda.artifacts import build_program
    from logos_ir.spec import ModelSpec

    spec = dataclasses.replace(ModelSpec.preset("tiny"), hidden=128, intermediate=384, head_dim=32)
    plan = build_program(spec, Cut.prefill(200, 256), 1, "bf16")[0]
    kernel = next(k for name, k in plan.kernels.items() if name.startswith("gate_up_wgmma_"))
    specs = tensor_maps.tensor_map_specs(kernel)
    assert [(s.arg, s.shape, s.box, s.swizzle) for s in specs] == [
        (0, (200, 128), (128, 64), 128),
        (1, (384, 128), (64, 64), 128),
        (2, (384, 128), (64, 64), 128),
    ]
    text = io.StringIO()
    KernelPrinter(kernel, text).print()
    declared = re.findall(r"__grid_constant__ LogosTensorMap (\w+)", text.getvalue())
    assert declared == ["a_bf16_map_128x64_sw128", "gate_map_64x64_sw128", "up_map_64x64_sw128"]
    # the two rings, the full barriers (1024-aligned like every buffer), the empty barriers: 4 stages of 8 bytes each
    assert tensor_maps.dynamic_shared_bytes(kernel) == 4 * (128 + 128) * 64 * 2 + 1024 + 4 * 8

    calls: list[tuple[Any, ...]] = []

    class Library:
        @staticmethod
        def cuTensorMapEncodeTiled(*args: Any) -> int:  # noqa: N802 (the driver's name)
            calls.append(args)
            return 0

        cuFuncSetAttribute = staticmethod(lambda *args: 0)  # noqa: N815

    encoded = tensor_maps.TensorMapEncoder(Library()).encode(specs[1], 0x7F0000001000)
    assert ctypes.addressof(encoded) % 64 == 0 and ctypes.sizeof(encoded) == 128
    (_, kind, rank, address, dims, strides, box, steps, interleave, swizzle, promotion, fill) = calls[0]
    assert (kind.value, rank.value, address.value) == (9, 2, 0x7F0000001000)
    assert (list(dims), list(strides), list(box), list(steps)) == ([128, 384], [256], [64, 64], [1, 1])
    assert (interleave.value, swizzle.value, promotion.value, fill.value) == (0, 3, 3, 0)
    with pytest.raises(LogosError, match="16-byte aligned"):
        specs[0].encode_args(0x7F0000001008)
