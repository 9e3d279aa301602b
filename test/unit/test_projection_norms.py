"""OLMoE's norm of the whole query and the whole key (`projection_norms`): a fact, two plain RMS norms written after
the projections, through the printer, the split over chips (the projection gathered whole for the norm, each
chip's heads sliced back out), and the lanes that compute it or refuse it by name.

OLMoE's tokens against transformers' are pinned in test_families (the reference) and test_experts (its GGUF); this
file holds what a norm of the whole projection changes below the program, on a dense model that has one (a LOGOS
program can say it without a mixture; no published family does)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from logos_ir.author import write, written_split
from logos_ir.dialects import logos
from logos_ir.dialects.shard_ext import AllSliceOp
from logos_ir.errors import LogosError
from logos_ir.parser import parse_program
from logos_ir.passes.tp_split import TpSplit
from logos_ir.printer import print_program
from logos_ir.program import Cut
from logos_ir.registry import backends
from logos_ir.runtime import RunRequest
from logos_ir.spec import ModelSpec
from logos_ir.testing import RandomWeights

FAMILIES = Path(__file__).parent / "families"
PROMPT = [1, 17, 42, 200, 5]


def _olmoe() -> ModelSpec:
    return ModelSpec.from_hf_config(json.loads((FAMILIES / "olmoe" / "config.json").read_text()))


def _dense() -> ModelSpec:
    """OLMoE's attention over a dense SwiGLU MLP: the lanes' MoE refusal does not come first."""
    return replace(_olmoe(), experts=None, experts_per_token=None, renormalize=False, intermediate=128)


def test_the_norms_are_of_the_whole_query_and_key() -> None:
    spec = _dense()
    program = parse_program(write(spec, Cut.decode_layer(0, 8)).text)
    norms = {
        op.results[0].name_hint: [operand.type.get_shape() for operand in op.operands]
        for op in program.walk()
        if op.name == "logos.rms_norm"
    }
    # the whole query (4 heads of 16) and the whole key (2 key-value heads): one norm each, not one a head
    assert norms["normed_query"] == [(1, 64), (64,)] and norms["normed_key"] == [(1, 32), (32,)]
    assert not any(op.name == "logos.head_rms_norm" for op in program.walk())
    assert print_program(program) == write(spec, Cut.decode_layer(0, 8)).text


def test_the_projection_norms_tokens_are_not_the_per_head_norms() -> None:
    """The same weights normed one head at a time (Qwen3's norm, with each norm's weight the first head's) give
    other tokens: the whole-projection norm is what the reference computes, not a per-head one by another name."""
    spec = _dense()
    weights = RandomWeights(spec, seed=3)
    tokens = backends()["reference"].generator()(RunRequest(weights, ctx=32)).generate(PROMPT, 6)
    per_head = replace(spec, projection_norms=False, head_norms=True)
    norms = ("q_norm.weight", "k_norm.weight")
    arrays = {name: weights.get(name) for name in weights.names()}
    arrays |= {name: array[: spec.head_dim] for name, array in arrays.items() if name.endswith(norms)}
    from logos_ir.weights.store import ArrayStore

    other = backends()["reference"].generator()(RunRequest(ArrayStore(per_head, arrays), ctx=32)).generate(PROMPT, 6)
    assert other != tokens


@pytest.mark.parametrize("cut", [Cut.decode(8), Cut.decode_layer(1, 8), Cut.batch(2, 8)])
def test_split_the_norm_reads_the_gathered_projection_and_each_chip_keeps_its_heads(cut: Cut) -> None:
    """Over 2 chips (vLLM's OLMoE under tensor parallelism): each chip's share of the query all-gathered whole,
    normed whole by the whole weight on every chip, and the chip's own heads all-sliced back out for the rotation;
    tp-split of the unsplit program is the author's split program, byte for byte, and it round-trips."""
    spec = _dense()
    authored, _ = written_split(spec, cut, "", 2)
    module = ModuleOp([parse_program(write(spec, cut).text)])
    TpSplit(2).apply(Context(), module)
    program = module.ops.first
    assert print_program(program) == authored.text
    assert print_program(parse_program(authored.text)) == authored.text
    lines = authored.text.splitlines()
    at = next(i for i, line in enumerate(lines) if "Let query be the concatenation" in line)
    assert [line.strip() for line in lines[at : at + 3]] == [
        "Let query be the concatenation over the chips of query_part.",
        "Let normed_query be the RMS norm of query with query_norm.",
        "Let normed_query_part be the share on this chip of normed_query.",
    ]
    slices = [op for op in program.walk() if isinstance(op, AllSliceOp)]
    assert [logos.tensor_shape(op.result) for op in slices[:2]] == [(cut.rows or 1, 32), (cut.rows or 1, 16)]


def test_split_over_2_chips_the_tokens_are_one_chips() -> None:
    weights = RandomWeights(_dense(), seed=3)
    tokens = backends()["reference"].generator()(RunRequest(weights, ctx=32)).generate(PROMPT, 6)
    assert backends()["reference"].generator()(RunRequest(weights, ctx=32, tp=2)).generate(PROMPT, 6) == tokens


def test_the_cuda_lane_refuses_the_split_norm_by_name() -> None:
    request = RunRequest(RandomWeights(_dense(), seed=3), ctx=32, tp=2, prefill_rows=4, weights="f32", emulate=True)
    with pytest.raises(LogosError, match="'shard.all_slice', which the CUDA lane does not lower"):
        backends()["cuda"].generator()(request).generate(PROMPT, 2)


def test_the_cuda_lane_computes_the_whole_projection_norms() -> None:
    """The CUDA lane's RMS-norm kernel takes any width: the query's norm is its kernel over 64 numbers (emulated, the
    printed kernels; decode and prefill chunks), the reference's tokens."""
    weights = RandomWeights(_dense(), seed=3)
    tokens = backends()["reference"].generator()(RunRequest(weights, ctx=32)).generate(PROMPT, 6)
    request = RunRequest(weights, ctx=32, prefill_rows=4, weights="f32", emulate=True)
    assert backends()["cuda"].generator()(request).generate(PROMPT, 6) == tokens


@pytest.mark.parametrize(
    ("backend", "named"),
    [
        ("spatial", "convert-logos-to-csl: the model RMS-norms the whole query and the whole key"),
    ],
)
def test_the_lanes_that_do_not_compute_them_refuse_by_name(backend: str, named: str) -> None:
    request = RunRequest(RandomWeights(_dense(), seed=3), ctx=32, prefill_rows=4, weights="f32")
    with pytest.raises(LogosError, match=named):
        backends()[backend].generator()(request).generate(PROMPT, 2)
