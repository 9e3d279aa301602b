"""The families of issue 26 on the CUDA lane, emulated: each tiny model gives transformers' greedy tokens
(`goldens.json`) on one chip and on two, the lane's kernels running as the emulator executes the printed CUDA; and
every kernel those families' builds emit (decode, a prefill chunk, a batch, two chips; bf16 and f32 images)
compiles for sm_90 with no register spill where nvcc is installed.

What each family asks of the lane (`docs/cuda.md`): Llama's biases on every projection (the SwiGLU's in
`cuda.gate_up`'s epilogue, the down and output projections' in `cuda.linear`'s, before the residual; at two chips
the row-parallel projections' on chip 0 alone in the partial sum).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_cuda_nvcc import _kernels, spills
from test_families import FAMILIES, GOLDENS, _lane

from logos_ir.build import BuildRequest
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress

ENABLED = ["llama-biases", "mistral-window", "qwen2-window"]
NVCC = shutil.which("nvcc")
BUILDS = [("decode ctx=64", 1), ("prefill rows=80 ctx=128", 1), ("batch rows=4 ctx=64", 1), ("decode ctx=64", 2)]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("family", ENABLED)
def test_a_family_on_the_cuda_lane_gives_transformers_tokens(family: str, tp: int) -> None:
    for run in GOLDENS[family]["runs"]:
        assert _lane(family, "cuda", True, tp).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def _family_kernels(family: str) -> dict[str, str]:
    from logos_ir.passes.cuda.build import build_cuda

    source = ModelSource.resolve(str(FAMILIES / family))
    kernels: dict[str, str] = {}
    for cut, tp in BUILDS:
        for weights in ("bf16", "f32"):
            request = BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent(), {"ptxas": "off"})
            cu = next(a for a in build_cuda(request).artifacts if a.path == "kernels.cu")
            kernels.update(_kernels(cu.data.decode()))
    return kernels


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed here: the families' kernels are not compiled")
def test_the_families_kernels_compile_for_sm90a_without_spills(tmp_path: Path) -> None:
    from logos_ir.passes.cuda.emit_cuda import PREAMBLE, TENSOR_MAP_PREAMBLE

    kernels: dict[str, str] = {}
    for family in ["llama", *ENABLED]:  # the plain Llama's beside them: a spill both share is not the families'
        kernels.update(_family_kernels(family))
    assert any("bias" in name for name in kernels)  # the families' own kernels are among them
    cu = tmp_path / "kernels.cu"
    cu.write_text(PREAMBLE + TENSOR_MAP_PREAMBLE + "\n".join(kernels[name] for name in sorted(kernels)))
    flags = ["-arch=sm_90a", "-O3", "-fmad=false", "-Xptxas", "-v", "-cubin"]
    command = [NVCC, *flags, "-o", str(tmp_path / "k.cubin"), str(cu)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = spills(run.stderr + run.stdout)
    assert len(report) == len(kernels)
    spilled = {name: sizes for name, sizes in report.items() if sizes != (0, 0)}
    # Known, and not the families': the mma.sync residual product of a 4-row batch at depth 128 (the tiny models'
    # down projection) spills 72 bytes with or without a bias (the plain Llama's kernel does too).
    known = "linear_residual_tc_4x128f32_64x128bf16_4x64f32_4x64f32"
    assert spilled.get(known) == (72, 72)
    alike = {name for name, sizes in spilled.items() if name.startswith("linear_bias_residual_tc_4x128f32_64x128bf16")}
    assert all(spilled[name] == spilled[known] for name in alike)
    others = {name: sizes for name, sizes in spilled.items() if name != known and name not in alike}
    assert not others, f"ptxas spilled registers in {others}"


def test_the_windowed_families_tokens_depend_on_the_kernels_bounded_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same lane with attention's range not bounded to the window (each row attending its whole live length)
    gives other tokens: the goldens above pin the window, not a plain attention."""
    from logos_ir.passes.cuda import decode_kernels

    monkeypatch.setattr(decode_kernels, "_live", lambda b, length, window: (length, None))
    for family in ("mistral-window", "qwen2-window"):
        run = GOLDENS[family]["runs"][0]
        assert _lane(family, "cuda", True).generate(run["prompt"], len(run["tokens"])) != run["tokens"]
