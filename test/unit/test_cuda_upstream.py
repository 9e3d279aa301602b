"""Upstream MLIR reads the CUDA lane's lowered module. The kernels of a decode step are upstream ops only (`arith`,
`math`, `memref`, `scf`, `gpu`, `vector`, `llvm.fence`, `nvvm.bar.warp.sync`, `nvvm.griddepcontrol`), checked
here on the IR; and where
`iree-opt` (from `iree-base-compiler`, the `mlir` extra) is installed, it parses and verifies the `gpu.module` of
the embedded model's decode step, as `logos-compile` writes it in step.mlir, with no unregistered op allowed, and the
whole step.mlir with the host function's `cuda.buffer` and `shard` ops (which IREE does not register) as
unregistered ones; skipped with its reason where the tool is not installed."""

from __future__ import annotations

import io
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
UPSTREAM = (
    "arith.",
    "math.",
    "memref.",
    "scf.",
    "gpu.",
    "vector.",
    "llvm.fence",
    "nvvm.bar.warp.sync",
    "nvvm.griddepcontrol",
)


def _step(cut: str, tp: int, weights: str = "bf16", spec: ModelSpec | None = None) -> str:
    from logos_ir.passes.cuda.build import build_cuda

    spec = spec or ModelSpec.preset("smollm2-135m")
    source = ModelSource("preset", "smollm2-135m", spec)
    request = BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent(), {"ptxas": "off"})
    return next(a for a in build_cuda(request).artifacts if a.path == "step.mlir").data.decode()


def _kernels(step: str) -> tuple[str, list[str]]:
    """The gpu.module of a step.mlir, read back by the lane's own reader and printed alone (generic form, upstream's
    spelling) in a module of its own, and the names of the ops its kernels hold."""
    from xdsl.dialects import gpu
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.parser import Parser
    from xdsl.printer import Printer

    from logos_ir.passes.cuda.host_plan import from_upstream, lowered_context, to_upstream

    module = Parser(lowered_context(), from_upstream(step)).parse_module()
    kernels = next(op for op in module.ops if isinstance(op, gpu.ModuleOp))
    names = sorted({op.name for op in kernels.walk()})
    kernels.detach()
    out = io.StringIO()
    Printer(stream=out, print_generic_format=True).print_op(ModuleOp([kernels]))
    return to_upstream(out.getvalue()), names


def test_step_mlir_reads_back_in_both_spellings() -> None:
    from logos_ir.passes.cuda.host_plan import from_upstream, read_plan

    text = _step("decode ctx=64", 1)
    assert "#gpu.dim<x>" in text and "#gpu<dim" not in text and "gpu.known_block_size" not in text
    upstream, ours = read_plan(text), read_plan(from_upstream(text))
    assert [s.kernel for s in upstream.launches] == [s.kernel for s in ours.launches]


@pytest.mark.parametrize("weights", ["bf16", "f32"])
def test_the_decode_kernels_hold_upstream_ops_only(weights: str) -> None:
    _, names = _kernels(_step("decode ctx=64", 1, weights))
    assert [n for n in names if not n.startswith(UPSTREAM)] == []
    assert "vector.load" in names and "vector.extract" in names and "gpu.shuffle" in names
    # the split-K QKV hand-off (SmolLM2's f32 image splits each pair's depth in 2; attention's merge is a launch of
    # its own, so the bf16 step has no hand-off between warps at all)
    assert ("llvm.fence" in names) == ("memref.atomic_rmw" in names) == (weights == "f32")


def _iree_opt(path: Path, *flags: str) -> str:
    assert IREE_OPT is not None
    out = path.with_suffix(".out.mlir")
    done = subprocess.run(
        [IREE_OPT, *flags, str(path), "-o", str(out)], capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out.read_text()


@pytest.mark.skipif(IREE_OPT is None, reason="iree-opt is not installed (pip install 'logos-ir[mlir]')")
@pytest.mark.parametrize(("cut", "tp"), [("decode ctx=1024", 1), ("decode ctx=1024", 3)])
def test_iree_opt_parses_and_verifies_the_lowered_decode_step(tmp_path: Path, cut: str, tp: int) -> None:
    step = _step(cut, tp, "f32")  # f32: its split-K QKV hand-off holds the fence
    kernels = tmp_path / "kernels.mlir"
    kernels.write_text(_kernels(step)[0])
    printed = _iree_opt(kernels)  # no unregistered op allowed: every op of the kernels is upstream's
    assert "gpu.func @qkv_" in printed and "known_block_size = array<i32: 128, 1, 1>" in printed
    assert "vector.load" in printed and "alignment = 16" in printed and "gpu.shuffle xor" in printed
    assert 'llvm.fence syncscope("device") seq_cst' in printed
    whole = tmp_path / "step.mlir"
    whole.write_text(step)
    printed = _iree_opt(whole, "--allow-unregistered-dialect")  # the host function's cuda.buffer and shard ops
    assert '"cuda.buffer"' in printed and "gpu.launch_func" in printed
