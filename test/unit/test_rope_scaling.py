"""YaRN's and LongRoPE's rotary scaling: a fact of the program (its sentence, its attribute on the model and on each
rotation), read from a config, computed by the reference, and flowing into each lane's rope tables.

The frequencies are held to figures worked out by hand from YaRN's definition (the correction range's pair
indices, the ramp's values), not to the formula that computes them; the lanes are held to the reference's tokens
on the same weights, which themselves differ from the unscaled model's, and, on tiny Qwen2 and Phi-3 models
made by transformers itself, the reference and the lanes to transformers' greedy tokens (`goldens.json`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import builtin, func, shard
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser

from logos_ir.author import write
from logos_ir.dialects.logos import LOGOS
from logos_ir.errors import LogosError, ParseError, SpecError
from logos_ir.parser import parse_program
from logos_ir.passes.cut_extract import CutExtract
from logos_ir.passes.tp_split import TpSplit
from logos_ir.printer import print_program
from logos_ir.program import Cut
from logos_ir.registry import backends
from logos_ir.rope import base_inv_freq, rope_inv_freq, yarn_ramp
from logos_ir.runtime import RunRequest
from logos_ir.spec import ModelSpec, RopeScaling
from logos_ir.testing import F32, STRING, U32, mlir_text, model_gguf
from logos_ir.weights import hf_config, open_model
from logos_ir.weights.store import ArrayStore

FAMILIES = Path(__file__).parent / "families"
TINY = open_model(str(FAMILIES / "llama")).spec  # heads of 16 numbers (8 pairs), two key-value heads

YARN = RopeScaling(
    4.0, original_max_position_embeddings=16, rope_type="yarn", beta_fast=32.0, beta_slow=1.0, attention_factor=1.25
)
# one factor a pair of the tiny families' heads of 16
LONGROPE = RopeScaling(
    8.0,
    original_max_position_embeddings=16,
    rope_type="longrope",
    attention_factor=1.5,
    factors=(1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0),
)
# Phi-3-mini-128k's kind: short factors within the original context, long ones past it
LONGROPE_TWO = replace(LONGROPE, long_factors=(1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0, 24.0))


def test_yarn_keeps_the_fast_pairs_divides_the_slow_ones_and_ramps_between() -> None:
    """Qwen2.5's long-context YaRN (factor 4 over 32768, head of 128, base 1e6): the pair that turns 32 times over
    the original context is index 128 ln(32768 / 64 pi) / 2 ln(1e6) = 23.6, the one that turns once 39.65, so
    pairs up to 23 keep their frequency, from 40 on are divided by 4, and pair 24 is 1/17 of the way."""
    qwen = RopeScaling(
        4.0, original_max_position_embeddings=32768, rope_type="yarn", beta_fast=32.0, beta_slow=1.0,
        attention_factor=1.0,
    )  # fmt: skip
    assert yarn_ramp(qwen, 128, 1e6) == (23, 40)
    ratio = rope_inv_freq(128, 1e6, qwen) / base_inv_freq(128, 1e6)
    assert np.allclose(ratio[:24], 1.0) and np.allclose(ratio[40:], 0.25)
    assert ratio[24] == pytest.approx(1 - (1 / 17) * 0.75)


def test_longrope_divides_each_pair_by_its_own_factor() -> None:
    assert np.allclose(base_inv_freq(16, 1e4) / rope_inv_freq(16, 1e4, LONGROPE), LONGROPE.factors)


ATTRIBUTES = {"yarn": "#logos.yarn_rope_scaling", "longrope": "#logos.longrope_scaling"}


@pytest.mark.parametrize("scaling", [YARN, LONGROPE], ids=["yarn", "longrope"])
def test_the_scaling_fact_round_trips_through_the_passes(scaling: RopeScaling) -> None:
    spec = replace(TINY, rope_scaling=scaling)
    text = write(spec, Cut.decode(32)).text
    assert print_program(parse_program(text)) == text
    program = parse_program(text)
    assert program.model.spec == spec
    module_text = mlir_text(text)
    assert ATTRIBUTES[scaling.rope_type] + "<" in module_text
    context = Context()
    for dialect in (builtin.Builtin, func.Func, shard.Shard, LOGOS):
        context.load_dialect(dialect)
    reparsed = Parser(context, module_text).parse_module()
    assert reparsed.ops.first.spec == spec  # type: ignore[union-attr]
    for module_pass in (CutExtract("decode_layer layer=0 ctx=32"), TpSplit(2)):
        module = ModuleOp([program.clone()])
        module_pass.apply(Context(), module)
        module.verify()
        ropes = [op for op in module.walk() if op.name == "logos.rope"]
        assert ropes and all(op.rope_scaling == scaling for op in ropes)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("ramped between 1.0 and 32.0 turns", "ramped between 32.0 and 1.0 turns", "beta_fast must be greater"),
        ("over original context 16,", "over original context 16.5,", "expected a whole number, got '16.5'"),
        ("scaled by 1.25.", "scaled by -1.25.", "attention_factor must be a positive number"),
        ("scaled by YaRN by", "scaled by YaRN with", "malformed rotary scaling fact"),
    ],
)
def test_a_wrong_yarn_fact_is_refused_at_its_line(old: str, new: str, message: str) -> None:
    text = write(replace(TINY, rope_scaling=YARN), Cut.decode(32)).text
    assert old in text
    line = next(i for i, t in enumerate(text.splitlines(), 1) if old in t)
    with pytest.raises(ParseError, match=message) as refused:
        parse_program(text.replace(old, new))
    assert f":{line}:" in str(refused.value)


def test_a_longrope_fact_needs_a_factor_for_each_pair() -> None:
    text = write(replace(TINY, rope_scaling=LONGROPE), Cut.decode(32)).text
    with pytest.raises(ParseError, match="7 factors, not one for each of 8 pairs"):
        parse_program(text.replace("factors 1.0, 1.25,", "factors 1.25,"))
    with pytest.raises(ParseError, match="expected a number, got 'x'"):
        parse_program(text.replace("factors 1.0, 1.25,", "factors 1.0, x,"))


def _reference(spec: ModelSpec, arrays: dict, prompt: list[int], count: int, **options) -> list[int]:  # noqa: ANN003
    request = RunRequest(ArrayStore(spec, arrays), ctx=32, prefill_rows=4, weights="f32", **options)
    return backends()["reference"].generator()(request).generate(prompt, count)


@pytest.fixture(scope="module")
def llama() -> tuple[ModelSpec, dict]:
    store = open_model(str(FAMILIES / "llama"))
    return store.spec, {name: store.get(name) for name in store.names()}


PROMPT = [5, 17, 101, 3, 250, 64, 9, 31, 77, 12, 200, 140, 8, 66, 91, 23, 45, 150]  # past the original context of 16


@pytest.mark.parametrize("scaling", [YARN, LONGROPE], ids=["yarn", "longrope"])
def test_the_scaling_and_its_attention_factor_are_what_the_tokens_depend_on(llama, scaling: RopeScaling) -> None:
    spec, arrays = llama
    scaled = _reference(replace(spec, rope_scaling=scaling), arrays, PROMPT, 6)
    assert scaled != _reference(spec, arrays, PROMPT, 6)
    unscaled_cos = replace(scaling, attention_factor=1.0)
    assert scaled != _reference(replace(spec, rope_scaling=unscaled_cos), arrays, PROMPT, 6)


# Tiny models of each kind made by transformers (`tools/family_goldens.py`): Qwen2 with YaRN over an original
# context of 32 stretched to 128, Phi-3 with LongRoPE's factors a pair (short and long alike) over the same.
GOLDENS = json.loads((FAMILIES / "goldens.json").read_text())["families"]
SCALED = {"qwen2-yarn": "yarn", "phi3-longrope": "longrope", "phi3-longrope-two": "longrope"}
# each kind on each lane that computes it, the CUDA lane's YaRN run split over two chips too (its tables per chip)
LANE_RUNS = [
    ("qwen2-yarn", "cuda", True, 1),
    ("phi3-longrope", "cuda", True, 1),
    ("qwen2-yarn", "cuda", True, 2),
    ("qwen2-yarn", "d5005", False, 1),
    ("phi3-longrope", "d5005", False, 1),
    ("qwen2-yarn", "spatial", False, 1),
    ("phi3-longrope", "spatial", False, 1),
]
# The LongRoPE model with short and long factors, each of its two runs on each lane: the short prompt over a cache of
# 32 positions (within its original context of 64: the short factors), the long one (70 tokens) over 128 (the long)
TWO_RUNS = [(0, 32), (1, 128)]


def _family_lane(family: str, backend: str, emulate: bool, tp: int = 1):  # noqa: ANN202
    request = RunRequest(open_model(str(FAMILIES / family)), ctx=32, tp=tp, prefill_rows=4, weights="f32",
                         emulate=emulate)  # fmt: skip
    return backends()[backend].generator()(request)


def test_the_scaled_families_goldens_pin_the_scaling() -> None:
    """The tiny models' goldens are their scaling's: the same weights unscaled, or scaled without the attention
    factor, give other tokens on the reference."""
    for family, kind in SCALED.items():
        store = open_model(str(FAMILIES / family))
        assert store.spec.rope_scaling is not None and store.spec.rope_scaling.rope_type == kind
        run = GOLDENS[family]["runs"][0]
        arrays = {name: store.get(name) for name in store.names()}
        for scaling in (None, replace(store.spec.rope_scaling, attention_factor=1.0)):
            tokens = _reference(replace(store.spec, rope_scaling=scaling), arrays, run["prompt"], len(run["tokens"]))
            assert tokens != run["tokens"], (family, scaling)


@pytest.mark.parametrize(
    ("family", "backend", "emulate", "tp"),
    LANE_RUNS,
    ids=["cuda-emulated-yarn", "cuda-emulated-longrope", "cuda-emulated-tp2-yarn", "d5005-pocl-yarn",
         "d5005-pocl-longrope", "spatial-fabric-yarn", "spatial-fabric-longrope"],
)  # fmt: skip
def test_the_lanes_rope_tables_give_transformers_tokens(family: str, backend: str, emulate: bool, tp: int) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _family_lane(family, backend, emulate, tp).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.parametrize(("run", "ctx"), TWO_RUNS, ids=["short", "long"])
@pytest.mark.parametrize(
    ("backend", "emulate"),
    [("reference", False), ("cuda", True), ("d5005", False), ("spatial", False)],
    ids=["reference", "cuda-emulated", "d5005-pocl", "spatial-fabric"],
)
def test_longropes_short_and_long_factors_give_transformers_tokens_at_their_contexts(
    backend: str, emulate: bool, run: int, ctx: int
) -> None:
    """transformers turns by the short factors while a sequence is within the original context and by the long
    ones past it; a program over a cache longer than the original context turns by the long ones (llama.cpp's
    rule), so a prompt that stays within it over a short cache and one that starts past it over a long cache give
    transformers' tokens on every lane."""
    golden = GOLDENS["phi3-longrope-two"]["runs"][run]
    request = RunRequest(open_model(str(FAMILIES / "phi3-longrope-two")), ctx=ctx, prefill_rows=16, weights="f32",
                         emulate=emulate)  # fmt: skip
    lane = backends()[backend].generator()(request)
    assert lane.generate(golden["prompt"], len(golden["tokens"])) == golden["tokens"]


def test_longropes_goldens_pin_which_factors_each_context_takes() -> None:
    """Each run of the two-factor model turns by its own set: the same weights with only the other set (short and
    long alike) give other tokens on the reference, at the same cache length."""
    store = open_model(str(FAMILIES / "phi3-longrope-two"))
    scaling = store.spec.rope_scaling
    assert scaling is not None and scaling.long_factors is not None and scaling.original_max_position_embeddings == 64
    arrays = {name: store.get(name) for name in store.names()}
    for (run, ctx), other in zip(TWO_RUNS, (scaling.long_factors, scaling.factors), strict=True):
        golden = GOLDENS["phi3-longrope-two"]["runs"][run]
        one = replace(store.spec, rope_scaling=replace(scaling, factors=other, long_factors=None))
        lane = backends()["reference"].generator()(RunRequest(ArrayStore(one, arrays), ctx=ctx, weights="f32"))
        assert lane.generate(golden["prompt"], len(golden["tokens"])) != golden["tokens"], run


def test_a_program_states_the_longrope_factors_of_its_context() -> None:
    """The spec keeps both sets; a program over a cache within the original context (16) states the short ones,
    one past it the long ones, so the identity changes with the set; a cut with no cache (the head) the short."""
    spec = replace(TINY, rope_scaling=LONGROPE_TWO)
    short = ", ".join(repr(f) for f in LONGROPE_TWO.factors)  # type: ignore[union-attr]
    long = ", ".join(repr(f) for f in LONGROPE_TWO.long_factors)  # type: ignore[union-attr]
    for cut, factors in ((Cut.decode(16), short), (Cut.decode(17), long), (Cut.decode_head(), short)):
        text = write(spec, cut).text
        assert f"divided by LongRoPE's factors {factors} for" in text, cut
        assert parse_program(text).model.spec.rope_scaling.long_factors is None  # type: ignore[union-attr]
    assert spec.at_context(16).rope_scaling == replace(LONGROPE, long_factors=None)
    assert spec.at_context(17).rope_scaling.factors == LONGROPE_TWO.long_factors  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="rotates with one set, chosen by the context"):
        rope_inv_freq(16, 1e4, LONGROPE_TWO)


def _config(family: str, **changes) -> dict:  # noqa: ANN003
    """The family's config with `changes`, its rope settings only where they say them (the older `rope_scaling`)."""
    config = json.loads((FAMILIES / family / "config.json").read_text())
    if "rope_scaling" in changes:
        config["rope_theta"] = config.pop("rope_parameters")["rope_theta"]
    return {**config, **changes}


def test_a_yarn_config_is_read_as_transformers_computes_it() -> None:
    """Qwen's long-context YaRN: factor 4 over the original context, the attention factor 1 + ln(4) / 10."""
    rope = {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    spec = ModelSpec.from_hf_config(_config("qwen2", rope_parameters=rope, max_position_embeddings=128))
    assert spec.rope_scaling == RopeScaling(
        4.0, original_max_position_embeddings=32, rope_type="yarn", beta_fast=32.0, beta_slow=1.0,
        attention_factor=1.1386294361119891,
    )  # fmt: skip
    deepseek = {**rope, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 16}  # mscale over mscale_all_dim: 1
    read = ModelSpec.from_hf_config(_config("qwen2", rope_parameters=deepseek, max_position_embeddings=128))
    assert (read.rope_scaling.attention_factor, read.rope_scaling.beta_fast) == (1.0, 16.0)  # type: ignore[union-attr]


def test_a_longrope_config_is_read_with_phi3s_original_context() -> None:
    """Phi-3's LongRoPE: the original context at the config's top level, the factor max_position_embeddings over it
    (4096 over 128: 32), the attention factor sqrt(1 + ln 32 / ln 128) = sqrt(1 + 5/7)."""
    factors = [1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0][: TINY.head_dim // 2]
    rope = {"type": "longrope", "short_factor": factors, "long_factor": factors}
    config = _config("llama", rope_scaling=rope, max_position_embeddings=4096, original_max_position_embeddings=128)
    scaling = ModelSpec.from_hf_config(config).rope_scaling
    assert scaling is not None and scaling.factors == tuple(factors) and scaling.factor == 32.0
    assert scaling.attention_factor == pytest.approx(math.sqrt(12 / 7), rel=1e-15)


PHI3 = {"original_max_position_embeddings": 32}  # Phi-3 says LongRoPE's original context at the config's top level


@pytest.mark.parametrize(
    ("rope", "top", "message"),
    [
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}, {},
         "factor is 2.0, but max_position_embeddings over original_max_position_embeddings is 128 / 32 = 4.0"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "truncate": False}, {},
         "a yarn rope scaling with truncate False is not said yet"),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": "fast"}, {},
         "field 'beta_fast' must be a number"),
        ({"rope_type": "yarn", "factor": 4.0, "extrapolation": 1}, {},
         "rope_scaling: key 'extrapolation' is not one logos-ir reads"),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "beta_fast": 32.0}, {},
         "key 'beta_fast' of a llama3 rope scaling is not one logos-ir reads"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 7}, PHI3,
         "the longrope rope scaling has 8 short factors and 7 long ones"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}, PHI3,
         "a LongRoPE scaling has 3 factors, not one for each of 8 pairs"),
        ({"rope_type": "longrope", "long_factor": [1.0] * 8}, PHI3,
         "field 'short_factor' must be a list of numbers"),
        ({"rope_type": "dynamic", "factor": 2.0}, {}, "rope scaling of type 'dynamic' is not supported"),
    ],
    ids=["factor", "truncate", "beta", "key", "llama3-key", "short-long-count", "pairs", "short", "dynamic"],
)  # fmt: skip
def test_a_long_context_scaling_a_program_cannot_say_is_refused_by_name(rope: dict, top: dict, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        ModelSpec.from_hf_config(_config("llama", rope_scaling=rope, max_position_embeddings=128, **top))


YARN_GGUF = [
    ("llama.rope.scaling.type", STRING, "yarn"),
    ("llama.rope.scaling.factor", F32, 4.0),
    ("llama.rope.scaling.original_context_length", U32, 32),
]


def test_a_ggufs_yarn_is_read_as_llama_cpp_computes_it(tmp_path: Path) -> None:
    """A GGUF's YaRN: its factor over its original context, the betas the file's (32 and 1 where it has none), cos
    and sin scaled by 1 + 0.1 ln(factor) times `rope.scaling.attn_factor` (llama.cpp's mscale)."""
    path = tmp_path / "model.gguf"
    betas = [("llama.rope.scaling.yarn_beta_fast", F32, 16.0), ("llama.rope.scaling.attn_factor", F32, 2.0)]
    path.write_bytes(model_gguf(extra_metadata=[*YARN_GGUF, *betas]))
    assert open_model(str(path)).spec.rope_scaling == RopeScaling(
        4.0, original_max_position_embeddings=32, rope_type="yarn", beta_fast=16.0, beta_slow=1.0,
        attention_factor=2 * 1.1386294361119891,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("metadata", "tensors", "message"),
    [
        ([*YARN_GGUF[:2]], [], "needs its GGUF metadata 'llama.rope.scaling.original_context_length'"),
        ([*YARN_GGUF, ("llama.rope.scaling.yarn_ext_factor", F32, 0.5)], [],
         "'llama.rope.scaling.yarn_ext_factor' is 0.5: a YaRN blend other than the full one"),
        ([*YARN_GGUF, ("llama.rope.scaling.yarn_log_multiplier", F32, 0.1)], [],
         "'llama.rope.scaling.yarn_log_multiplier' is 0.1"),
        ([*YARN_GGUF, ("llama.rope.scaling.yarn_attn_factor", F32, 1.0)], [],
         "'llama.rope.scaling.yarn_attn_factor' is 1.0: llama.cpp's versions apply it differently"),
        ([("llama.rope.scaling.yarn_beta_fast", F32, 16.0)], [],
         "'llama.rope.scaling.yarn_beta_fast' is 16.0, which a rope scaling of type 'none' cannot say"),
        ([("llama.rope.scaling.attn_factor", F32, 1.5)], [],
         "'llama.rope.scaling.attn_factor' is 1.5, which a rope scaling of type 'none' cannot say"),
        ([("llama.rope.scaling.type", STRING, "longrope")], [], "a longrope rope scaling is read from a GGUF of phi3"),
        ([], ["rope_factors_long.weight"], "tensor 'rope_factors_long.weight' is not read by the model's program"),
        ([], ["rope_factors_short.weight"], "tensor 'rope_factors_short.weight' is not read by the model's program"),
    ],
    ids=["yarn-original", "yarn-ext", "yarn-log-mul", "yarn-attn", "beta-unscaled", "attn-unscaled",
         "longrope-llama", "long-factors", "short-factors"],
)  # fmt: skip
def test_a_ggufs_yarn_or_longrope_is_refused_by_name(
    tmp_path: Path, metadata: list, tensors: list, message: str
) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(model_gguf(extra_metadata=metadata, extra_tensors=tensors))
    with pytest.raises(LogosError, match=re.escape(message)):
        open_model(str(path))


@pytest.mark.parametrize("scaling", [YARN, LONGROPE, LONGROPE_TWO], ids=["yarn", "longrope", "longrope-two"])
def test_a_written_config_reads_back_to_the_same_scaling(scaling: RopeScaling) -> None:
    spec = replace(TINY, rope_scaling=scaling)
    config = hf_config(spec)
    assert config["max_position_embeddings"] == {"yarn": 64, "longrope": 128}[scaling.rope_type]
    assert ModelSpec.from_hf_config(config) == spec


def test_a_longrope_original_context_only_in_the_scaling_is_refused() -> None:
    """transformers 5 reads LongRoPE's original context from the config's top level only (else it is
    max_position_embeddings, and `factor` the scaling's): one given in the scaling alone is ambiguous."""
    config = hf_config(replace(TINY, rope_scaling=LONGROPE))
    config["rope_scaling"]["original_max_position_embeddings"] = config.pop("original_max_position_embeddings")
    with pytest.raises(SpecError, match="is read at the config's top level"):
        ModelSpec.from_hf_config(config)


def test_the_spatial_lane_rotates_by_yarns_frequencies(llama) -> None:
    """The wafer's rotary tables are the frequencies: a YaRN scaling with an attention factor of 1 (a config that
    says one) runs there and gives the reference's tokens, which are not the unscaled model's."""
    spec, arrays = llama
    yarn = replace(spec, rope_scaling=replace(YARN, attention_factor=1.0))
    expected = _reference(yarn, arrays, PROMPT, 3)
    assert expected != _reference(spec, arrays, PROMPT, 3)
    request = RunRequest(ArrayStore(yarn, arrays), ctx=32, weights="f32")
    assert backends()["spatial"].generator()(request).generate(PROMPT, 3) == expected
