"""The model families on the CUDA lane, emulated: each tiny model gives transformers' greedy tokens
(`goldens.json`) on one chip, and on two where a split changes what its features compute (`SPLIT`), the lane's
kernels running as the emulator executes the printed CUDA; and every kernel those families' builds emit (decode, a
prefill chunk, a batch, two chips; bf16 and f32 images) compiles for sm_90 with no register spill where nvcc is
installed.

What each family asks of the lane (`docs/cuda.md`): Llama's biases on every projection (the SwiGLU's in
`cuda.gate_up`'s epilogue, the down and output projections' in `cuda.linear`'s, before the residual; at two chips
the row-parallel projections' on chip 0 alone in the partial sum); Mistral's and Qwen2's sliding windows (each
windowed layer's attention range bounded to its window, the cache before it never read; Qwen2's first layer
global); Qwen3's RMS norm of each query and key head (`cuda.head_rms_norm`, a warp a head, before the rotation);
Phi-3's partial rotary (the rotation's pairs half the rotary part apart, tables of their own passing the rest
through); a layer's own rotary base (Gemma 3's local layers: tables of that base) and a layer rotating unscaled
beside the model's linear scaling (Gemma 3's local layers again); Gemma's scaled embedding (`cuda.scale`), norms
by one plus the weight (`cuda.rms_norm {plus_one}`, never folded into a prologue, and Gemma 3's head norms), the
sandwich norms around attention and the MLP, GeGLU (`cuda.gate_up {gelu_tanh}`), attention's own scale and
soft-cap (in the split kernel's scores) and the soft-capped logits (`cuda.softcap`).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_cuda_nvcc import _kernels, spills
from test_families import FAMILIES, GOLDENS, _lane, _Recording

from logos_ir.build import BuildRequest
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.registry import backends
from logos_ir.runtime import RunRequest
from logos_ir.spec import ModelSpec
from logos_ir.testing import RandomWeights

ENABLED = [
    *("llama-biases", "mistral-window", "qwen2-window", "qwen3", "phi3-gguf-partial"),
    *("gemma2", "gemma3_text", "gemma3_text-linear"),
]
# Over two chips, the families whose features a split changes: biases split with their columns (the row-parallel
# ones added once, on chip 0), head norms with their heads, a window's bounded range on each chip's heads, partial
# rotary's and a layer's own base's tables with their heads, Gemma 2's soft-caps and sandwich norms around the
# partial sums. The families shaped as a GGUF can say them (`test_gguf_families.py`) compute these families' ops,
# so their kernels are these.
SPLIT = ["llama-biases", "mistral-window", "qwen2-window", "qwen3", "phi3-gguf-partial", "gemma2", "gemma3_text-linear"]
NVCC = shutil.which("nvcc")
BUILDS = [("decode ctx=64", 1), ("prefill rows=80 ctx=128", 1), ("batch rows=4 ctx=64", 1), ("decode ctx=64", 2)]


@pytest.mark.parametrize(("family", "tp"), [*((family, 1) for family in ENABLED), *((family, 2) for family in SPLIT)])
def test_a_family_on_the_cuda_lane_gives_transformers_tokens(family: str, tp: int) -> None:
    lane = _lane(family, "cuda", True, tp)  # one lane for both prompts: each program is built once
    for run in GOLDENS[family]["runs"]:
        assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]


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
    # Known, and not the families': the mma.sync product of a 4-row batch at depth 128 (the tiny models' down
    # projection, `_tc_4x128f32_64x128bf16`) spills 72-76 bytes whatever its epilogue (the plain Llama's residual
    # one does too); every other kernel, the families' own among them, spills nothing.
    known = "linear_residual_tc_4x128f32_64x128bf16_4x64f32_4x64f32"
    assert spilled.get(known) == (72, 72)
    tile = {name: sizes for name, sizes in spilled.items() if "_tc_4x128f32_64x128bf16_" in name}
    assert all(max(sizes) <= 76 for sizes in tile.values()), tile
    others = {name: sizes for name, sizes in spilled.items() if name not in tile}
    assert not others, f"ptxas spilled registers in {others}"


def test_the_windowed_families_tokens_depend_on_the_kernels_bounded_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same lane with attention's range not bounded to the window (each row attending its whole live length)
    gives other tokens: the goldens above pin the window, not a plain attention."""
    from logos_ir.passes.cuda import decode_kernels

    monkeypatch.setattr(decode_kernels, "_live", lambda b, length, window: (length, None))
    for family in ("mistral-window", "qwen2-window"):
        run = GOLDENS[family]["runs"][0]
        assert _lane(family, "cuda", True).generate(run["prompt"], len(run["tokens"])) != run["tokens"]


def _logits(backend: str, spec: ModelSpec, tp: int, prompt: list[int], steps: int) -> tuple[list[int], list]:
    emulate = backend == "cuda"
    request = RunRequest(RandomWeights(spec), ctx=32, tp=tp, prefill_rows=4, weights="f32", emulate=emulate)
    sampler = _Recording()
    tokens = backends()[backend].generator()(request).generate(prompt, steps, sampler=sampler)
    return tokens, sampler.logits


@pytest.mark.parametrize("tp", [1, 2])
def test_a_rotation_by_a_layers_own_base_is_the_references(tp: int) -> None:
    """Gemma 3's local layers rotate with a base of their own (here layer 0's 5000, layer 1 global by the model's
    10000; a window that never bites, 64 positions over a cache of 32, so the base is the one variant): the lane
    rotates them by tables of that base and gives the reference's tokens and logits, which the model's base does
    not give."""
    spec = replace(ModelSpec.preset("tiny"), sliding_window=64, full_layers=(1,), local_rope_theta=5000.0)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    tokens, logits = _logits("cuda", spec, tp, prompt, 6)
    want_tokens, want = _logits("reference", spec, tp, prompt, 6)
    assert tokens == want_tokens
    for got, expected in zip(logits, want, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-4)
    _, plain = _logits("reference", replace(spec, local_rope_theta=None), tp, prompt, 6)
    assert max(np.abs(a - b).max() for a, b in zip(plain, want, strict=True)) > 1e-2


@pytest.mark.parametrize("tp", [1, 2])
def test_gemma2s_soft_capped_logits_on_the_cuda_lane_are_transformers_own(tp: int) -> None:
    """A soft-cap of the logits is monotonic, so the tokens alone cannot tell whether it was applied: the first
    step's logits are transformers' own, within the cap."""
    run = GOLDENS["gemma2"]["runs"][0]
    sampler = _Recording()
    assert (
        _lane("gemma2", "cuda", True, tp).generate(run["prompt"], len(run["tokens"]), sampler=sampler) == run["tokens"]
    )
    first = sampler.logits[0]
    assert np.abs(first).max() < 5.0
    np.testing.assert_allclose(first, np.array(run["first_logits"]), atol=2e-4)


def test_a_windowed_layer_reads_only_its_window_in_the_build_report() -> None:
    """The build report's bytes (`traffic.py`) count a windowed layer's attention at its window: Mistral's tiny
    model (a window of 4 in both layers) reads the cache's 60 of 64 positions fewer than the plain Llama of the same
    shapes."""
    from logos_ir.passes.cuda.build import build_cuda

    def report(family: str) -> dict:
        request = BuildRequest(
            ModelSource.resolve(str(FAMILIES / family)), Cut.parse("decode ctx=64"), 1, "f32", False,
            Progress.silent(), {"ptxas": "off"},
        )  # fmt: skip
        return build_cuda(request).report

    windowed, plain = report("mistral-window"), report("llama")
    assert windowed["weight_bytes"] == plain["weight_bytes"] and windowed["cache_bytes"] == plain["cache_bytes"]
    skipped = plain["cache_bytes"] * (64 - 4) // 64
    assert plain["bytes_read"] - windowed["bytes_read"] == skipped
    assert plain["bytes_minimum"] - windowed["bytes_minimum"] == skipped
