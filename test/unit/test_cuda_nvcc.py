"""Every kernel the CUDA lane emits for the embedded model (SmolLM2-135M: a decode step, a prefill chunk of 32 rows,
a batch of 4, a decode step over 3 chips, bf16 and f32 images) compiles with nvcc for sm_90, and ptxas reports no
register spill for any of them. All distinct kernels go through one nvcc call."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from logos_ir.build import BuildRequest
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec

NVCC = shutil.which("nvcc")
BUILDS = [("decode ctx=1024", 1), ("prefill rows=32 ctx=1024", 1), ("batch rows=4 ctx=1024", 1), ("decode ctx=1024", 3)]
_KERNEL = re.compile(r'^extern "C" __global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(', re.M)
_PTXAS_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _kernels(text: str) -> dict[str, str]:
    """Each kernel of a kernels.cu by name, its text from its `extern` line to its closing brace."""
    starts = [m.start() for m in _KERNEL.finditer(text)]
    bodies = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    return {_KERNEL.match(body).group(1): body for body in bodies}  # type: ignore[union-attr]


def _all_kernels() -> tuple[str, int]:
    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.passes.cuda.emit_cuda import PREAMBLE

    spec = ModelSpec.preset("smollm2-135m")
    source = ModelSource("preset", "smollm2-135m", spec)
    kernels: dict[str, str] = {}
    for cut, tp in BUILDS:
        for weights in ("bf16", "f32"):
            request = BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent())
            cu = next(a for a in build_cuda(request).artifacts if a.path == "kernels.cu")
            kernels.update(_kernels(cu.data.decode()))
    return PREAMBLE + "\n".join(kernels[name] for name in sorted(kernels)), len(kernels)


def spills(ptxas_report: str) -> dict[str, tuple[int, int]]:
    """(spill store bytes, spill load bytes) of each function in ptxas's `-v` report."""
    found: dict[str, tuple[int, int]] = {}
    current = None
    for line in ptxas_report.splitlines():
        function = _PTXAS_FUNCTION.search(line)
        if function:
            current = function.group(1)
        spill = _PTXAS_SPILL.search(line)
        if spill and current is not None:
            found[current] = (int(spill.group(1)), int(spill.group(2)))
    return found


def test_the_spill_parser_reads_ptxas_reports() -> None:
    report = (
        "ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
        "ptxas info    : Function properties for a\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
        "ptxas info    : Function properties for b\n"
        "    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
    )
    assert spills(report) == {"a": (0, 0), "b": (8, 4)}


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed here")
def test_every_kernel_of_the_embedded_model_compiles_for_sm90_without_spills(tmp_path: Path) -> None:
    source, count = _all_kernels()
    cu = tmp_path / "kernels.cu"
    cu.write_text(source)
    assert NVCC is not None
    run = subprocess.run(
        [NVCC, "-arch=sm_90", "-Xptxas", "-v", "-cubin", "-o", str(tmp_path / "kernels.cubin"), str(cu)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = spills(run.stderr + run.stdout)
    assert len(report) == count
    spilled = {name: sizes for name, sizes in report.items() if sizes != (0, 0)}
    assert not spilled, f"ptxas spilled registers in {spilled}"
