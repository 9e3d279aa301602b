"""The spatial lane's simulator against the reference interpreter: the same greedy tokens with f32 weights on tiny
random models of every shape the lane must handle (grouped-query and multi-query attention, tied and untied heads, a
head size that is not hidden / heads, widths that are not whole tiles) and on the embedded SmolLM2-135M; with f16
weights, teacher-forced agreement on a tiny model. The embedded-model f32 run is the lane's one embedded-model run in
the suite (`test_embedded_model_f32_tokens`); the 64-step f16 agreement on it is `bench/spatial_agreement.py`.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from logos_ir.generate import Generator
from logos_ir.program import Cut
from logos_ir.runtime import RunRequest
from logos_ir.runtime.spatial import SpatialGenerator, spatial_generator
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights, WeightStore, open_model

PROMPT = [3, 17, 42, 5, 99]
NEW = 16


def _spec(**sizes: int | bool) -> ModelSpec:
    base: dict = dict(
        vocab=256,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
    )
    base.update(sizes)
    return ModelSpec(**base)


MODELS = {
    "gqa": _spec(),
    "mqa": _spec(kv_heads=1),
    "tied": _spec(tie_embeddings=True),
    "head_dim_not_hidden_over_heads": _spec(hidden=48, heads=4, kv_heads=2, head_dim=24),
    "ragged_widths": _spec(vocab=300, hidden=40, heads=5, kv_heads=1, head_dim=8, intermediate=100, layers=3),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_f32_tokens_match_reference(name: str) -> None:
    store = RandomWeights(MODELS[name], seed=7)
    expected = Generator(store).generate(PROMPT, NEW)
    generator = SpatialGenerator(store, image="f32")
    assert generator.generate(PROMPT, NEW) == expected
    assert generator.stats.new_tokens == NEW
    assert generator.stats.decode_steps == NEW - 1
    assert [i.cut.kind for i in generator.identities] == ["decode_embed"] + ["decode_layer"] * store.spec.layers + [
        "decode_head"
    ]


def test_counters_follow_the_cycle_model() -> None:
    """Every step moves exactly the words the placement sends between regions, and cycles grow with the cache."""
    store = RandomWeights(MODELS["gqa"], seed=1)
    generator = SpatialGenerator(store, image="f32")
    machine = generator.machine(64)
    machine.reset()
    spec = store.spec
    machine.step(5, 1)
    first = machine.counters.cycles
    per_token = spec.hidden * (spec.layers + 1) + spec.layers + 2
    assert machine.counters.words_between == per_token
    machine.step(6, 2)
    assert machine.counters.words_between == 2 * per_token
    assert machine.counters.cycles > 2 * first - 1  # a longer cache costs no fewer cycles
    assert machine.counters.word_hops_inside > 0


def _teacher_forced(store: WeightStore, image: str, tokens: list[int], ctx: int) -> float:
    """The share of positions where the spatial f16/f32 grid predicts the reference's next token, both fed the same
    tokens (the reference's own greedy continuation)."""
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    machine = SpatialGenerator(store, image=image).machine(ctx)
    machine.reset()
    agree = 0
    for position, token in enumerate(tokens[:-1], start=1):
        run = {names["token"]: np.array([token + 1]), names["position"]: np.array([position])}
        expected = int(reference.run(**run)[0])
        agree += machine.step(token + 1, position) == expected
    return agree / (len(tokens) - 1)


def test_f16_teacher_forced_agreement_tiny() -> None:
    store = RandomWeights(MODELS["gqa"], seed=3)
    tokens = PROMPT + Generator(store).generate(PROMPT, 40)
    assert _teacher_forced(store, "f16", tokens, 64) >= 0.9


def test_backend_refuses_what_it_does_not_run() -> None:
    store = RandomWeights(MODELS["gqa"], seed=0)
    with pytest.raises(Exception, match="no --emulate mode"):
        spatial_generator(RunRequest(store, emulate=True))
    with pytest.raises(Exception, match="one grid"):
        spatial_generator(RunRequest(store, tp=2))
    with pytest.raises(Exception, match="f16 or f32"):
        SpatialGenerator(store, image="bf16")


def test_logos_run_spatial_backend_tiny() -> None:
    """`logos-run --backend spatial --weights f32` prints the reference backend's tokens."""

    def run(*extra: str) -> str:
        command = [sys.executable, "-m", "logos_ir.tools.logos_run", "--model", "tiny", "--prompt-ids", "3,17,42"]
        done = subprocess.run([*command, "--max-new-tokens", "8", *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()[0]

    assert run("--backend", "spatial", "--weights", "f32") == run("--backend", "reference")


# -- the one embedded-model run of the lane ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded() -> WeightStore:
    return open_model(None)


def test_embedded_model_f32_tokens(embedded: WeightStore) -> None:
    """EMBEDDED-MODEL RUN (the spatial lane's one): SmolLM2-135M, 16 new tokens, the reference's greedy tokens."""
    prompt = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    expected = Generator(embedded, ctx=64).generate(prompt, 16)
    generator = SpatialGenerator(embedded, ctx=64, image="f32")
    assert generator.generate(prompt, 16) == expected


def test_the_simulator_runs_the_spatial_program() -> None:
    """The grid computes what its `spatial` ops say, not what the LOGOS program says: a residual `add` edited into a
    `mul` in one layer's placed program changes the tokens (and the unedited program gives the reference's)."""
    from xdsl.dialects.builtin import StringAttr

    from logos_ir.dialects import spatial as sp
    from logos_ir.passes.spatial.decode_step import lower_decode_step
    from logos_ir.runtime.spatial import Machine

    store = RandomWeights(MODELS["gqa"], seed=5)
    expected = Generator(store, ctx=64).generate(PROMPT, 8)

    def tokens(edit: bool) -> list[int]:
        parts = lower_decode_step(store.spec, 64, "f32")
        if edit:
            residual = next(
                op for op in parts[1].region.body.block.ops if isinstance(op, sp.MapOp) and op.fn.data == "add"
            )
            residual.fn = StringAttr("mul")
        machine = Machine.build(parts, store)
        token, out = 0, []
        for position, prompt_token in enumerate(PROMPT, start=1):
            token = machine.step(prompt_token + 1, position)
        for position in range(len(PROMPT) + 1, len(PROMPT) + 9):
            out.append(token - 1)
            token = machine.step(token, position)
        return out

    assert tokens(edit=False) == expected
    assert tokens(edit=True) != expected
