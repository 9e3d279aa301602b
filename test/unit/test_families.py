"""Each model family gives transformers' greedy tokens, on the reference and on every lane.

The tiny random models under `test/unit/families/` and their greedy continuations (`goldens.json`) were made by
Hugging Face transformers itself (`tools/family_goldens.py`: the families' own config and model classes, eager
attention, float32), so the tokens here come from the definition, not from logos-ir. A family that computes as a
Llama but stores its checkpoint otherwise (Phi-3's fused `qkv_proj` and `gate_up_proj`) is read through the
weight manifest (`logos_ir/weights/manifest.py`): its program is a Llama's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from logos_ir.errors import LogosError
from logos_ir.registry import backends
from logos_ir.runtime import RunRequest
from logos_ir.sampling import Sampler
from logos_ir.weights import open_model
from logos_ir.weights.store import ArrayStore

FAMILIES = Path(__file__).parent / "families"
GOLDENS = json.loads((FAMILIES / "goldens.json").read_text())["families"]


def _runs() -> list[tuple[str, list[int], list[int]]]:
    return [(family, run["prompt"], run["tokens"]) for family, made in GOLDENS.items() for run in made["runs"]]


# The mixtures of experts (logos.experts: Mixtral's, Qwen3-MoE's with and without norm_topk_prob): the reference
# routes them as transformers does, on 1 chip and on 2 split by experts (test_experts.py runs them on 4); the CUDA
# lane (test_experts_cuda.py) and the D5005 engine (test_experts_d5005.py) run them, the wafer refuses the op by name.
MIXTURES = {"mixtral", "qwen3_moe", "qwen3_moe-unnormed", "olmoe", "qwen3_moe-kv4"}


@pytest.mark.parametrize(("family", "prompt", "tokens"), _runs(), ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("tp", [1, 2])
def test_the_reference_gives_transformers_tokens(family: str, prompt: list[int], tokens: list[int], tp: int) -> None:
    request = RunRequest(open_model(str(FAMILIES / family)), tp=tp)
    lane = backends()["reference"].generator()(request)
    assert lane.generate(prompt, len(tokens)) == tokens


def test_the_routing_is_what_the_mixtures_tokens_depend_on() -> None:
    """Qwen3-MoE's tokens with norm_topk_prob off are not those of the same weights with it on, nor of the same
    weights routed to one expert a token: the goldens pin the renormalisation and the choice, not just the MLPs."""
    store = open_model(str(FAMILIES / "qwen3_moe-unnormed"))
    run = GOLDENS["qwen3_moe-unnormed"]["runs"][0]
    arrays = {name: store.get(name) for name in store.names()}
    for change in ({"renormalize": True}, {"experts_per_token": 1}):
        spec = replace(store.spec, **change)
        lane = backends()["reference"].generator()(RunRequest(ArrayStore(spec, arrays)))
        assert lane.generate(run["prompt"], len(run["tokens"])) != run["tokens"], change


def test_the_rope_scaling_and_partial_rotary_are_what_the_tokens_depend_on() -> None:
    """The linear scalings' goldens pin the scaling: the same weights unscaled give other tokens (a Llama's in
    every layer, Gemma 3's in its global layers), and Gemma 3's windowed layers rotate unscaled (with their own
    base), as transformers' `sliding_attention` rope parameters have no scaling; Phi-3's partial rotary likewise
    (the same weights rotating every number of each head give other tokens)."""
    for family in ("llama-linear", "gemma3_text-linear"):
        store = open_model(str(FAMILIES / family))
        run = GOLDENS[family]["runs"][0]
        arrays = {name: store.get(name) for name in store.names()}
        assert store.spec.rope_scaling is not None and store.spec.rope_scaling.rope_type == "linear"
        lane = backends()["reference"].generator()(
            RunRequest(ArrayStore(replace(store.spec, rope_scaling=None), arrays))
        )
        assert lane.generate(run["prompt"], len(run["tokens"])) != run["tokens"], family
    partial = open_model(str(FAMILIES / "phi3-gguf-partial"))  # the same weights rotating the whole head
    run = GOLDENS["phi3-gguf-partial"]["runs"][0]
    arrays = {name: partial.get(name) for name in partial.names()}
    lane = backends()["reference"].generator()(RunRequest(ArrayStore(replace(partial.spec, rotary_dim=None), arrays)))
    assert lane.generate(run["prompt"], len(run["tokens"])) != run["tokens"]
    gemma = open_model(str(FAMILIES / "gemma3_text-linear")).spec
    assert [gemma.rope_scaling_of(layer) for layer in range(gemma.layers)] == [None, gemma.rope_scaling]


# The families whose projections add biases: the reference computes them (above), and so does every lane: the CUDA
# lane in its projections' epilogues (test_families_cuda.py), the D5005 engine in its matvec's epilogue
# (test_families_d5005.py), the wafer on each element's slice after the product's reduction
# (test_families_spatial.py).
BIASED = {"qwen2", "llama-biases"}
# The families whose heads of the query and key are RMS-normed (logos.head_rms_norm): the reference computes them,
# and so does every lane: a kernel a head on CUDA, in its rope on the D5005 engine, where the product leaves the
# head's features on the wafer.
HEAD_NORMED = {"qwen3"}
# The families whose sliding window bites (shorter than the runs): the reference applies it (logos.attention's
# window), and so does every lane, each reading only the window: CUDA's attention bounded to it, the D5005 engine's
# pass over the window's rows, the wafer's window cached as a ring.
WINDOWED = {"mistral-window", "qwen2-window"}
# Gemma 2: its norms by one plus the weight, scaled embedding, GeGLU, soft-caps and sandwich norms on the reference,
# on the CUDA lane (test_families_cuda.py), on the D5005 engine (test_families_d5005_gemma.py) and on the wafer
# (test_families_spatial.py), with Gemma 3's local layers' own rope base.
GEMMA = {"gemma2", "gemma3_text", "gemma3_text-linear"}
# The families shaped as a GGUF can say them (test_gguf_families reads each from the GGUF it writes): the same
# operations as their families above, so the lanes' cells are those families'.
GGUF_SHAPED = {"gemma2-gguf", "gemma3_text-gguf", "gemma3_text-gguf-linear", "phi3-gguf", "phi3-gguf-partial"}
# YaRN's and LongRoPE's scalings: each lane's rope tables compute them, cos and sin scaled by the attention factor
# (test_rope_scaling.py runs them on each lane).
ROPE_SCALED = {"qwen2-yarn", "phi3-longrope", "phi3-longrope-two"}


def _lane(family: str, backend: str, emulate: bool, tp: int = 1):  # noqa: ANN202
    request = RunRequest(
        open_model(str(FAMILIES / family)), ctx=32, tp=tp, prefill_rows=4, weights="f32", emulate=emulate
    )
    return backends()[backend].generator()(request)


# Llama itself is left out here: its lanes are held to the reference by each lane's own tests, and the reference to
# transformers above; a family is here for what it changes below the program (a checkpoint's layout, a window).
@pytest.mark.parametrize(
    "family",
    sorted(set(GOLDENS) - {"llama"} - BIASED - HEAD_NORMED - WINDOWED - GEMMA - GGUF_SHAPED - MIXTURES - ROPE_SCALED),
)
@pytest.mark.parametrize(
    ("backend", "emulate"),
    [("cuda", True), ("d5005", False), ("spatial", False)],
    ids=["cuda-emulated", "d5005-pocl", "spatial-fabric"],
)
def test_every_lane_gives_transformers_tokens(family: str, backend: str, emulate: bool) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, backend, emulate).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.parametrize("tp", [1, 2])
def test_qwen2s_biases_on_the_cuda_lane_give_transformers_tokens(tp: int) -> None:
    run = GOLDENS["qwen2"]["runs"][0]
    assert _lane("qwen2", "cuda", True, tp).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.parametrize(
    ("family", "backend", "emulate", "refusal"),
    [
        ("mixtral", "spatial", False, "the spatial grid does not lower 'logos.experts'"),
    ],
    ids=[
        "spatial-mixtral",
    ],
)
def test_a_lane_refuses_an_op_it_does_not_lower_by_name(family: str, backend: str, emulate: bool, refusal: str) -> None:
    with pytest.raises(LogosError) as refused:
        _lane(family, backend, emulate).generate([1, 2, 3], 2)
    assert refusal in str(refused.value)


class _Recording(Sampler):
    """Greedy, but asks the backend for its logits and keeps each step's (a soft-cap of the logits is monotonic:
    greedy tokens alone cannot tell whether it was applied)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits: list[np.ndarray] = []

    @property
    def greedy(self) -> bool:
        return False

    def choose(self, argmax: int, logits: np.ndarray | None) -> int:
        assert logits is not None
        self.logits.append(np.asarray(logits, np.float64).reshape(-1))
        return argmax


@pytest.mark.parametrize("tp", [1, 2])
def test_gemma2s_soft_capped_logits_are_transformers_own(tp: int) -> None:
    run = GOLDENS["gemma2"]["runs"][0]
    lane = backends()["reference"].generator()(RunRequest(open_model(str(FAMILIES / "gemma2")), tp=tp))
    sampler = _Recording()
    assert lane.generate(run["prompt"], len(run["tokens"]), sampler=sampler) == run["tokens"]
    first, expected = sampler.logits[0], np.array(run["first_logits"])
    assert np.abs(first).max() < 5.0  # within the cap
    np.testing.assert_allclose(first, expected, atol=2e-4)


def test_the_goldens_are_transformers_own() -> None:
    made = json.loads((FAMILIES / "goldens.json").read_text())
    assert made["made_by"] == "tools/family_goldens.py" and made["transformers"]
    for family in GOLDENS:
        config = json.loads((FAMILIES / family / "config.json").read_text())
        assert config["model_type"] == family.split("-")[0] and config["transformers_version"] == made["transformers"]
        assert config["architectures"] == [GOLDENS[family]["model_class"]]
    # each step's best logit leads the next by more than f32 noise, so the tokens are not a near-tie's
    assert min(run["min_top1_margin"] for made in GOLDENS.values() for run in made["runs"]) > 1e-3
    # and each token's k-th expert's probability leads the next one's likewise: no routing is a near-tie's
    routes = [run["min_route_margin"] for family in MIXTURES for run in GOLDENS[family]["runs"]]
    assert len(routes) == 2 * len(MIXTURES) and min(routes) > 1e-4
