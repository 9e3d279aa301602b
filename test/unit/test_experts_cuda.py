"""Mixtures of experts (`logos.experts`) on the CUDA lane, emulated: the tiny Mixtral, Qwen3-MoE (renormalized and
not, and with 4 key-value heads) and OLMoE give transformers' greedy tokens (`goldens.json`) with f32 weights on
one chip and, split by experts, on two and four (OLMoE's whole-projection norms are refused split, by name); a
bf16 image follows the reference teacher-forced; the tokens depend on every chosen expert's product; stacked
experts held in a block format are refused by name in a decode step; the decode build's report counts the chosen
experts' bytes alone (the figures derived here from the weights' shapes), and the Qwen3-30B-A3B decode step reads
at most 1.2 times its active parameters' bytes. The lowered IR is pinned by `test/cuda/kernels-experts.test`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_families import FAMILIES, GOLDENS, _lane

from logos_ir.build import BuildRequest
from logos_ir.errors import LogosError
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec

MIXTURES = ["mixtral", "qwen3_moe", "qwen3_moe-unnormed", "qwen3_moe-kv4", "olmoe"]
SPLIT = [
    "mixtral",
    "qwen3_moe",
    "qwen3_moe-unnormed",
    "qwen3_moe-kv4",
]  # OLMoE's whole-projection norms are refused split


@pytest.mark.parametrize(("family", "tp"), [*((f, 1) for f in MIXTURES), *((f, 2) for f in SPLIT)])
def test_a_mixture_on_the_cuda_lane_gives_transformers_tokens(family: str, tp: int) -> None:
    """Each prompt through prefill chunks of 4 rows (the rows grouped by expert) then decode steps (the chosen
    experts' GEMVs), f32 weights, the emulator executing the printed kernels; over 2 chips each holds 2 of the 4
    experts and an all-reduce adds the partial sums."""
    lane = _lane(family, "cuda", True, tp)
    for run in GOLDENS[family]["runs"]:
        assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.parametrize("family", ["qwen3_moe-kv4", "mixtral", "qwen3_moe"])
def test_a_mixture_over_4_chips_gives_transformers_tokens(family: str) -> None:
    """Over 4 chips each holds one expert of the 4: qwen3_moe-kv4 as it is (one key-value head a chip), Mixtral and
    Qwen3-MoE with their 2 key-value heads repeated to 4 (test_experts' `_kv_replicated`, which changes no token
    on the reference)."""
    from test_experts import _kv_replicated

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest
    from logos_ir.weights import open_model

    store = open_model(str(FAMILIES / family))
    if store.spec.kv_heads < 4:
        store = _kv_replicated(store, 4)
    request = RunRequest(store, ctx=32, tp=4, prefill_rows=4, weights="f32", emulate=True)
    lane = backends()["cuda"].generator()(request)
    for run in GOLDENS[family]["runs"]:
        assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def test_olmoes_split_is_refused_by_name() -> None:
    with pytest.raises(LogosError) as refused:
        _lane("olmoe", "cuda", True, 2).generate([1, 2, 3], 2)
    assert "@main holds 'shard.all_slice', which the CUDA lane does not lower" in str(refused.value)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_tokens_depend_on_every_chosen_expert(monkeypatch: pytest.MonkeyPatch, tp: int) -> None:
    """The sum kernel built to add only each row's first chosen expert (the lowest index) gives other tokens: the
    golden test above sees the second expert's product."""
    from logos_ir.passes.cuda import decode_kernels

    built = decode_kernels.experts_sum

    def first_only(b, args, shapes, held, *rest):  # noqa: ANN001, ANN002, ANN202
        return built(b, args, [shapes[0], (shapes[1][0], 1), *shapes[2:]], held, *rest)

    monkeypatch.setattr(decode_kernels, "experts_sum", first_only)
    run = GOLDENS["mixtral"]["runs"][0]
    assert _lane("mixtral", "cuda", True, tp).generate(run["prompt"], len(run["tokens"])) != run["tokens"]


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_a_bf16_image_follows_the_reference_teacher_forced(family: str) -> None:
    from logos_ir.runtime.cuda.agreement import teacher_forced
    from logos_ir.weights import open_model

    run = GOLDENS[family]["runs"][0]
    result = teacher_forced(open_model(str(FAMILIES / family)), run["prompt"], 6, "bf16", prefill_rows=4)
    assert len(result.matches) == 7
    assert result.agreement == 1.0
    assert result.min_cosine >= 0.999


def _spec(family: str) -> ModelSpec:
    return ModelSpec.from_hf_config(json.loads((FAMILIES / family / "config.json").read_text()))


def test_stacked_experts_held_in_blocks_are_refused_in_a_decode_step() -> None:
    """The experts' GEMVs read float images alone: a decode step of a model whose stacked experts are stored as
    Q8_0 is refused by name (its other weights would be read as stored); a prefill chunk reads every weight's
    image, experts included."""
    from logos_ir.runtime.cuda.artifacts import build_program

    spec = _spec("mixtral")
    spec = replace(spec, storage=tuple((n, "q8_0") for n, s in spec.weights() if len(s) >= 2))
    with pytest.raises(LogosError) as refused:
        build_program(spec, Cut.decode(32), 1, "bf16")
    message = str(refused.value)
    assert "'logos.experts' %routed reads stacked experts stored as q8_0" in message
    assert "expert GEMVs read f32 and bf16 images only" in message
    plan, _, _ = build_program(spec, Cut.prefill(4, 32), 1, "bf16")
    assert {b.element for b in plan.buffers.values() if b.kind == "weight"} == {"bf16", "f32"}


def _report(source: ModelSource, cut: str, tp: int, weights: str, ptxas: str = "off") -> dict:
    from logos_ir.passes.cuda.build import build_cuda

    options = {"ptxas": "off"} if ptxas == "off" else {}
    return build_cuda(BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent(), options)).report


@pytest.mark.parametrize("tp", [1, 2])
def test_the_decode_report_counts_only_the_chosen_experts_bytes(tp: int) -> None:
    """The tiny Mixtral's decode step (f32, ctx 32): its experts' share of the bytes read is 2 of 4 experts a layer
    (on 2 chips, the 2 a chip holds, at most), not all of them; on one chip the step's whole figure, summed here
    launch by launch from the config's shapes (each weight once, the embedding's and rotary tables' one row, the
    caches whole, the activations and inputs each launch reads, the experts 2 of 4), is the report's."""
    spec = _spec("mixtral")
    report = _report(ModelSource.resolve(str(FAMILIES / "mixtral")), "decode ctx=32", tp, "f32")
    h, i, e, k, layers = spec.hidden, spec.intermediate, spec.experts, spec.experts_per_token, spec.layers
    held = e // tp
    expert = 3 * i * h * 4  # one expert's gate, up and down rows, f32
    assert report["expert_weight_bytes"] == layers * held * expert
    assert report["expert_bytes_read"] == layers * min(k, held) * expert
    assert report["active_weight_bytes"] == report["weight_bytes"] - layers * (held - min(k, held)) * expert
    if tp > 1:
        return
    f, index, ctx = 4, 8, 32
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    layer = (
        h * f + (q + 2 * kv) * h * f + h * f + index + 2 * spec.head_dim * f  # qkv: x, weight, norm, position, rope
        + q * f + 2 * kv * ctx * f + index + index  # attention (query, caches, position) and its merge (position)
        + q * f + h * q * f + h * f  # output projection: x, weight, residual
        + 2 * h * f  # the norm before the mixture
        + h * f + e * h * f  # the router's projection
        + e * f  # the router's softmax and top-k
        + h * f + k * 2 * i * h * f  # the chosen experts' gate and up
        + k * i * h * f  # their down
        + h * f  # the residual, added in the experts' sum
    )  # fmt: skip
    ends = (h * f + index) + (h * f + spec.vocab * h * f + h * f) + spec.vocab * f  # embedding, head, arg-max
    assert report["bytes_read"] == layers * layer + ends


def test_the_qwen3_30b_a3b_decode_step_reads_at_most_1_2_times_its_active_parameters() -> None:
    """The preset's decode step (bf16, ctx 1024, one chip), as `logos-compile --model qwen3-30b-a3b --target cuda`
    builds it: its active parameters counted here from the preset's shapes (every weight but the unchosen
    experts, the embedding table whole) in bf16 (norm scales f32), and the step's bytes read against them."""
    spec = ModelSpec.preset("qwen3-30b-a3b")
    report = _report(ModelSource.resolve("qwen3-30b-a3b"), "decode ctx=1024", 1, "bf16")
    h, layers, heads, kv, d = spec.hidden, spec.layers, spec.heads, spec.kv_heads, spec.head_dim
    chosen = 3 * spec.experts_per_token * spec.intermediate * h
    attention = h * heads * d * 2 + h * kv * d * 2  # q and o, k and v
    router = spec.experts * h
    norms = 2 * h + 2 * d  # the layer's two norms and the query and key head norms (f32)
    active = 2 * (2 * spec.vocab * h + layers * (attention + router + chosen)) + 4 * (layers * norms + h)
    assert report["active_weight_bytes"] == active
    assert report["bytes_read"] <= 1.2 * active
    assert report["bytes_read_per_active_byte"] == pytest.approx(report["bytes_read"] / active)
    assert report["expert_bytes_read"] == 2 * layers * chosen


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here: the kernels are not compiled")
def test_the_mixtures_kernels_compile_for_sm90_without_spills(tmp_path: Path) -> None:
    """Every kernel of the tiny Mixtral's and Qwen3-MoE's builds (decode, a prefill chunk, a batch, two chips; bf16
    and f32 images), the experts' among them, compiles in one nvcc call with no register spill."""
    from test_cuda_nvcc import _kernels, spills

    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.passes.cuda.emit_cuda import PREAMBLE

    kernels: dict[str, str] = {}
    for family in ("mixtral", "qwen3_moe"):
        source = ModelSource.resolve(str(FAMILIES / family))
        for cut, tp in (
            ("decode ctx=64", 1),
            ("prefill rows=8 ctx=64", 1),
            ("batch rows=4 ctx=64", 1),
            ("decode ctx=64", 2),
        ):
            for weights in ("bf16", "f32"):
                request = BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent(), {"ptxas": "off"})
                cu = next(a for a in build_cuda(request).artifacts if a.path == "kernels.cu")
                kernels.update(_kernels(cu.data.decode()))
    for stem in ("experts_route", "experts_group", "experts_norm_gate_up", "experts_gate_up_grouped", "experts_sum"):
        assert any(name.startswith(f"{stem}_") for name in kernels), stem
    cu = tmp_path / "kernels.cu"
    cu.write_text(PREAMBLE + "\n".join(kernels[name] for name in sorted(kernels)))
    command = [
        "nvcc",
        "-arch=sm_90",
        "-O3",
        "-fmad=false",
        "-Xptxas",
        "-v",
        "-cubin",
        "-o",
        str(tmp_path / "k"),
        str(cu),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    report = spills(run.stderr + run.stdout)
    assert len(report) == len(kernels)
    spilled = {name: sizes for name, sizes in report.items() if sizes != (0, 0)}
    assert not spilled, spilled


def _route(logits: np.ndarray, top_k: int, renormalize: bool, held: int, chip: int | None) -> tuple:
    """The router's kernel as the lane builds it, run alone on the emulator: (chosen, weights)."""
    from xdsl.dialects import gpu
    from xdsl.dialects.builtin import MemRefType, f32, i64

    from logos_ir.numerics import ceil_div
    from logos_ir.passes.cuda import decode_kernels
    from logos_ir.passes.cuda.thread_code import Body
    from logos_ir.runtime.cuda.emulator import KernelEmulator, LaunchShape

    rows, experts = logits.shape
    kinds = [MemRefType(f32, [rows, experts]), *([MemRefType(i64, [1])] if chip is not None else [])]
    kinds += [MemRefType(i64, [rows, top_k]), MemRefType(f32, [rows, top_k])]
    kernel = gpu.FuncOp("route", (kinds, []), kernel=True)
    b = Body(kernel.body.block)
    args = list(kernel.body.block.args)
    shapes = [tuple(k.get_shape()) for k in kinds]
    decode_kernels.experts_route(b, args, shapes, top_k, renormalize, held)
    b.op(gpu.ReturnOp([]))
    chosen, weights = np.full((rows, top_k), -7, np.int64), np.zeros((rows, top_k), np.float32)
    arrays = [logits, *([np.array([chip], np.int64)] if chip is not None else []), chosen, weights]
    KernelEmulator(kernel).run(arrays, LaunchShape.of((ceil_div(rows, 4), 1, 1), 128))
    return chosen, weights


@pytest.mark.parametrize(("experts", "top_k"), [(4, 2), (40, 3), (128, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("chip", [None, 1])
def test_the_router_kernel_chooses_as_torch_topk_on_ties(experts: int, top_k: int, renormalize: bool, chip) -> None:  # noqa: ANN001
    """Logits of a few integer values (so most rows hold ties): the kernel's experts are the reference's (softmax in
    f32, a stable sort of the probabilities, the lowest index first on a tie: `interpreter.kernels.experts`' rule)
    in ascending index, each weight the reference's within f32 rounding (the softmax's sum is a butterfly, not
    numpy's order); on chip 1 of a split, this chip's experts by their index here, the others `held`."""
    rng = np.random.default_rng(experts + top_k)
    rows = 9
    logits = rng.integers(0, 3, size=(rows, experts)).astype(np.float32)
    logits[0] = 1.0  # every expert tied
    held = experts // 2 if chip is not None else experts
    chosen, weights = _route(logits, top_k, renormalize, held, chip)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = exp / exp.sum(axis=1, keepdims=True)
    picked = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    want = np.take_along_axis(probs, picked, axis=1)
    if renormalize:
        want = want / want.sum(axis=1, keepdims=True)
    order = np.argsort(picked, axis=1)
    picked, want = np.take_along_axis(picked, order, axis=1), np.take_along_axis(want, order, axis=1)
    assert list(chosen[0]) == (list(range(top_k)) if chip is None else [held] * top_k)
    if chip is not None:
        first = chip * held
        picked = np.where((picked >= first) & (picked < first + held), picked - first, held)
    np.testing.assert_array_equal(chosen, picked)
    np.testing.assert_allclose(weights, want, rtol=2e-7)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_batch_of_sequences_through_a_mixture_gives_the_reference_tokens(tp: int) -> None:
    """A batch of 3 sequences (the rows grouped by expert, as a chunk's) decoded 5 steps on the tiny Mixtral's
    weights gives the reference interpreter's tokens on the same program, on one chip and split by experts."""
    from test_cuda_lane import batch_gives_the_reference_tokens  # the suite's rootdir-relative imports

    from logos_ir.weights import open_model

    plan = batch_gives_the_reference_tokens(open_model(str(FAMILIES / "mixtral")), Cut.batch(3, 32), tp)
    assert any(kernel.startswith("experts_group_") for kernel in plan.kernels)
