"""The driver call the GPU device makes itself (`logos_ir.runtime.cuda.driver`): its ctypes structures have the
sizes and field offsets of `cuda.h`'s (`CUlaunchConfig`, `CUlaunchAttribute`) and the programmatic attribute's id,
read by a C compiler from the toolkit's header; a wrong layout would pass garbage to cuLaunchKernelEx on a GPU."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from logos_ir.runtime.cuda import driver

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
