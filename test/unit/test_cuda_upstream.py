"""Upstream MLIR reads the CUDA lane's lowered module: `iree-opt` (from `iree-base-compiler`, the `mlir` extra)
parses and verifies the embedded model's decode step as `logos-compile` writes it (step.mlir: generic form,
upstream's spelling of the thread dimension and of gpu.func's block size), with the lane's own `cuda` ops (and
`shard`, which IREE does not register) as unregistered ops; skipped where the tool is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from logos_ir.build import BuildRequest
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec

IREE_OPT = shutil.which("iree-opt")


def _step(cut: str, tp: int) -> str:
    from logos_ir.passes.cuda.build import build_cuda

    spec = ModelSpec.preset("smollm2-135m")
    request = BuildRequest(
        ModelSource("preset", "smollm2-135m", spec), Cut.parse(cut), tp, "bf16", False, Progress.silent()
    )
    return next(a for a in build_cuda(request).artifacts if a.path == "step.mlir").data.decode()


def test_step_mlir_reads_back_in_both_spellings() -> None:
    from logos_ir.passes.cuda.host_plan import from_upstream, read_plan

    text = _step("decode ctx=64", 1)
    assert "#gpu.dim<x>" in text and "#gpu<dim" not in text and "gpu.known_block_size" not in text
    upstream, ours = read_plan(text), read_plan(from_upstream(text))
    assert [s.kernel for s in upstream.launches] == [s.kernel for s in ours.launches]


@pytest.mark.skipif(IREE_OPT is None, reason="iree-opt is not installed (pip install 'logos-ir[mlir]')")
@pytest.mark.parametrize(("cut", "tp"), [("decode ctx=1024", 1), ("decode ctx=1024", 3)])
def test_iree_opt_parses_and_verifies_the_lowered_decode_step(tmp_path: Path, cut: str, tp: int) -> None:
    path = tmp_path / "step.mlir"
    path.write_text(_step(cut, tp))
    assert IREE_OPT is not None
    done = subprocess.run(
        [IREE_OPT, "--allow-unregistered-dialect", str(path), "-o", str(tmp_path / "out.mlir")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = (tmp_path / "out.mlir").read_text()
    assert "gpu.func @qkv_" in printed and "known_block_size = array<i32: 128, 1, 1>" in printed
