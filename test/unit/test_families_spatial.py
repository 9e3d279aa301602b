"""The model families the spatial lane lowers give transformers' greedy tokens on the fabric simulator
(`backends()["spatial"]`, as `test_families._lane` builds it: one grid, f32 weights; the lane does not split over
chips, so tp=1 only), each from its tiny model under `test/unit/families/` and the tokens in `goldens.json`; and
built for a WSE-3 and with f16 weights, through `logos-compile`'s spatial target (the grid's static check run), the
same from the build folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_families import FAMILIES, GOLDENS, _lane

from logos_ir.build import BuildRequest
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.registry import compile_targets
from logos_ir.runtime.spatial.generator import SpatialGenerator
from logos_ir.weights import open_model

# Each family the lane now lowers (docs/spatial.md, "The model families"). The families shaped as a GGUF can say
# them (`test_gguf_families.py`) compute these families' ops: of them, Phi-3's partial rotary alone is a feature
# of its own.
SPATIAL_FAMILIES = [
    "qwen2",
    "llama-biases",
    "mistral-window",
    "qwen2-window",
    "qwen3",
    "phi3-gguf-partial",
    "gemma2",
    "gemma3_text",
    "gemma3_text-linear",
]


@pytest.mark.parametrize("family", SPATIAL_FAMILIES)
def test_the_family_gives_transformers_tokens_on_the_fabric(family: str) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, "spatial", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def _from_build(family: str, folder: Path, weights: str, arch: str, grid: str) -> list[int]:
    """The family's greedy tokens from a build folder of `logos-compile --target spatial` (ctx 32)."""
    store = open_model(str(FAMILIES / family))
    options = {"arch": arch, **({"grid": grid} if grid else {})}
    request = BuildRequest(
        ModelSource("preset", family, store.spec), Cut.decode(32), 1, weights, False, Progress.silent(), options
    )
    built = compile_targets()["spatial"].build()(request)
    for artifact in built.artifacts:
        (folder / artifact.path).write_bytes(artifact.data)
    run = GOLDENS[family]["runs"][0]
    return SpatialGenerator(store, ctx=32, image=weights, build=folder).generate(run["prompt"], len(run["tokens"]))


@pytest.mark.parametrize(
    ("family", "weights", "arch", "grid"),
    [
        ("qwen2", "f32", "wse3", ""),
        ("llama-biases", "f16", "wse2", ""),
        ("qwen2-window", "f32", "wse3", ""),
        ("mistral-window", "f16", "wse2", ""),
        ("qwen3", "f16", "wse3", ""),
        ("gemma2", "f16", "wse3", ""),
        ("phi3-gguf-partial", "f32", "wse3", ""),
        ("gemma3_text-linear", "f32", "wse3", ""),
        ("qwen3", "f32", "wse2", "5x7"),  # rows straddling heads: a head's features over two rows' elements
    ],
)
def test_the_family_built_for_a_wse3_or_with_f16_weights(
    family: str, weights: str, arch: str, grid: str, tmp_path: Path
) -> None:
    assert _from_build(family, tmp_path, weights, arch, grid) == GOLDENS[family]["runs"][0]["tokens"]


@pytest.mark.parametrize(("family", "image"), [("qwen3", "f32"), ("qwen2-window", "f32"), ("qwen3", "f16")])
def test_the_family_with_kv_heads_kept_narrow(family: str, image: str) -> None:
    """One copy of each KV head (as llama-3.1-8b's build keeps them): the query's heads of a group read one cached
    key tile, each normed head's features and each bias at the narrow layout's rows."""
    from logos_ir.runtime.spatial.host import GridMachine
    from logos_ir.testing import lower_decode

    store = open_model(str(FAMILIES / family))
    lowered = lower_decode(store.spec, 32, image, 6, copies=1)  # the query's chunk twice the key's
    assert lowered.plan.kv_copies == 1
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    run = GOLDENS[family]["runs"][0]
    tokens, out = list(run["prompt"]), []
    for position in range(1, len(run["prompt"]) + len(run["tokens"])):
        token = tokens[position - 1] if position <= len(tokens) else out[-1]
        predicted = machine.step(token + 1, position) - 1
        if position >= len(tokens):
            out.append(predicted)
    assert out == run["tokens"]


def test_a_windowed_layer_caches_only_its_window() -> None:
    """Mistral's window of 4 (every layer) on a 6-wide grid at ctx 32: each layer caches one slot an element (a ring
    of 4 positions), not ctx's 6, and the memory band's arrays count the smaller cache; Qwen2's (layer 0 whole, layer
    1 windowed) caches 6 + 1 slots."""
    from dataclasses import replace

    from logos_ir.passes.spatial.convert_logos_to_csl import memory_use
    from logos_ir.testing import lower_decode

    windowed = open_model(str(FAMILIES / "mistral-window")).spec
    ring = lower_decode(windowed, 32, "f32", 6)
    whole = lower_decode(replace(windowed, sliding_window=None), 32, "f32", 6)
    c = ring.plan.kv_chunk
    assert ring.plan.rings == (4, 4) and whole.plan.rings == ()
    assert ring.host["arrays"]["key_cache"][0] == 2 * 1 * c and whole.host["arrays"]["key_cache"][0] == 2 * 6 * c
    saved = memory_use(whole)["arrays"] - memory_use(ring)["arrays"]
    assert saved >= 2 * (2 * 5 * c) * 4  # the key and value caches' 5 slots a layer, f32
    mixed = lower_decode(open_model(str(FAMILIES / "qwen2-window")).spec, 32, "f32", 6)
    assert mixed.plan.rings == (32, 4) and mixed.host["arrays"]["key_cache"][0] == (6 + 1) * c


def test_a_partial_rotary_pairs_and_tables() -> None:
    """Phi-3's partial rotary (8 of each head's 16 numbers): the cached key's rows pair i with i + 4 for i < 4 and
    keep the other 8 in order, and the rotary tables give those 8 a frequency of 0 (cos 1, sin 0: passed through),
    the rotary pairs the reference's own over rotary_dim."""
    import numpy as np

    from logos_ir.passes.spatial import grid as g
    from logos_ir.rope import rope_inv_freq

    spec = open_model(str(FAMILIES / "phi3-gguf-partial")).spec
    assert spec.rotary_dim == 8 and spec.head_dim == 16
    plan = g.GridPlan.of(spec, 32, "f32", (2, 2), kv_copies=1)
    assert g.kv_rows(plan)[:16] == [0, 4, 1, 5, 2, 6, 3, 7, *range(8, 16)]
    whole = rope_inv_freq(16, spec.rope_theta)  # what the host passes: the whole head's
    first = g.inv_freq_rows(whole, plan, plan.kv_chunk)[0, :8]  # row 0's pairs of KV head 0
    np.testing.assert_array_equal(first, np.asarray([*rope_inv_freq(8, spec.rope_theta), 0, 0, 0, 0], np.float32))


def test_a_rotation_by_a_layers_own_base() -> None:
    """A local layer's own rope base (Gemma 3's, here on the tiny preset: layer 0 local with base 100, layer 1 the
    model's 10000; a window of 64 that never bites, so the base is the one difference): its tables are made on the
    element (`_local_angles`), the model's read from the host's; the reference's tokens, which the same weights
    rotated by the model's base in every layer do not give."""
    from dataclasses import replace

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import RandomWeights

    spec = replace(ModelSpec.preset("tiny"), sliding_window=64, full_layers=(1,), local_rope_theta=100.0)
    prompt = [5, 90, 3, 41, 7]

    def tokens(backend: str, model: ModelSpec) -> list[int]:
        request = RunRequest(RandomWeights(model, seed=1), ctx=32, prefill_rows=4, weights="f32")
        return backends()[backend].generator()(request).generate(prompt, 8)

    reference = tokens("reference", spec)
    assert tokens("spatial", spec) == reference
    assert tokens("reference", replace(spec, local_rope_theta=None)) != reference
