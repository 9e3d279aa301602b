"""The reference interpreter on tiny random models: cuts compose, prefill and batches agree with decode steps,
texts run directly, split programs agree with unsplit ones, and bad weights are refused.

Tolerances: the same kernels on the same inputs give the same floats, so cut composition is checked to float32
rounding (rtol 1e-6). Where the shapes differ (a prefill's or a batch's matrix products against a decode
step's vector products, or chips summing partial products) BLAS accumulates in another order, which moves
float32 results by about 1e-6 relative on these O(1) activations (measured: at most 2e-6 absolute on hidden
states and logits up to 5 in size); 1e-5 leaves room above that and still catches any real error, which moves
values by O(1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from logos_ir.author import decode_at, prefill_at, written, written_split
from logos_ir.errors import LogosError, WeightError
from logos_ir.generate import Generator
from logos_ir.interpreter import Interpreter, KVState, run_text
from logos_ir.parser import parse_program
from logos_ir.program import Cut
from logos_ir.rope import llama3_rope_divisors, rope_inv_freq
from logos_ir.spec import ModelSpec, RopeScaling
from logos_ir.weights import RandomWeights, open_model, save_model

TINY = ModelSpec.preset("tiny")
CTX = 40
FIRST = 7  # a first token (from 1) whose greedy continuation on these seeds does not settle into one repeated id
EXACT = {"rtol": 1e-6, "atol": 1e-6}
REORDERED = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def tiny() -> RandomWeights:
    return RandomWeights(TINY, seed=0)


def compiled(store, cut: Cut, state: KVState | None = None, tp: int | None = None) -> Interpreter:
    """The interpreter of the author's text for `cut`, parsed back (split over `tp` chips when given)."""
    if tp is None:
        text = written(store.spec, cut)[0].text
    else:
        text = written_split(store.spec, cut, "", tp)[0].text
    return Interpreter(parse_program(text), store, state)


def greedy(step: Interpreter, first: int, steps: int) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    """`steps` greedy decode steps from token `first` at position 1: the tokens (from 1) and each step's
    values."""
    tokens, values = [first], []
    for position in range(1, steps + 1):
        out = step.run(token=np.array([tokens[-1]]), position=np.array([position]))
        tokens.append(int(out[0]))
        values.append(dict(step.last_values))
    return tokens, values


def hidden_names(spec: ModelSpec) -> list[str]:
    return [f"x{i}" for i in range(spec.layers + 1)]


# -- one program, cut into pieces ----------------------------------------------------------------------------


def test_embedding_layers_and_head_compose_into_the_decode_step(tiny: RandomWeights) -> None:
    step = compiled(tiny, Cut.decode(CTX))
    embed = compiled(tiny, Cut.decode_embed())
    pieces = KVState()  # the layer cuts' caches, apart from the whole step's
    layers = [compiled(tiny, Cut.decode_layer(i, CTX), pieces) for i in range(TINY.layers)]
    head = compiled(tiny, Cut.decode_head())
    token = FIRST
    for position in range(1, 9):
        whole = int(step.run(token=np.array([token]), position=np.array([position]))[0])
        x = embed.run(token=np.array([token]))
        np.testing.assert_allclose(x, step.last_values["x0"], **EXACT)
        for i, layer in enumerate(layers):
            x = layer.run(**{f"x{i}": x, "position": np.array([position])})
            np.testing.assert_allclose(x, step.last_values[f"x{i + 1}"], **EXACT)
        assert int(head.run(**{f"x{TINY.layers}": x})[0]) == whole
        token = whole


def test_prefill_then_decode_equals_decode_steps(tiny: RandomWeights) -> None:
    tokens, values = greedy(compiled(tiny, Cut.decode(CTX)), FIRST, 6)
    state = KVState()
    prefill = compiled(tiny, Cut.prefill(5, CTX), state)
    out = prefill.run(tokens=np.array(tokens[:5]), positions=np.arange(1, 6))
    assert int(out[0]) == tokens[5]
    for name in hidden_names(TINY):  # row r of the prefill is the decode step at position r + 1
        np.testing.assert_allclose(prefill.last_values[name], [v[name][0] for v in values[:5]], **REORDERED)
    decode = compiled(tiny, Cut.decode(CTX), state)
    assert int(decode.run(token=np.array([tokens[5]]), position=np.array([6]))[0]) == tokens[6]
    for name in hidden_names(TINY):
        np.testing.assert_allclose(decode.last_values[name], values[5][name], **REORDERED)


def test_a_batch_of_rows_equals_separate_sequences(tiny: RandomWeights) -> None:
    rows, steps = 3, 4
    starts = [
        1,
        3,
        6,
    ]  # each row at its own position: a row starting at 3 attends empty positions 1 and 2, as a
    firsts = [7, 40, 201]  # sequence started at 3 on an empty cache does
    batch = compiled(tiny, Cut.batch(rows, CTX))
    alone = [compiled(tiny, Cut.decode(CTX)) for _ in range(rows)]  # each its own KVState
    tokens = list(firsts)
    for offset in range(steps):
        positions = [start + offset for start in starts]
        together = batch.run(tokens=np.array(tokens), positions=np.array(positions))
        for row in range(rows):
            single = alone[row].run(token=np.array([tokens[row]]), position=np.array([positions[row]]))
            assert int(together[row]) == int(single[0])
            for name in hidden_names(TINY):
                np.testing.assert_allclose(batch.last_values[name][row], alone[row].last_values[name][0], **REORDERED)
        tokens = [int(t) for t in together]


def test_the_forward_equals_a_decode_step_at_position_1(tiny: RandomWeights) -> None:
    forward = compiled(tiny, Cut.forward())
    step = compiled(tiny, Cut.decode(CTX))
    for token in (1, FIRST, TINY.vocab):
        logits = forward.run(token=np.array([token]))
        assert logits.shape == (1, TINY.vocab)
        assert int(step.run(token=np.array([token]), position=np.array([1]))[0]) == int(np.argmax(logits)) + 1
        for name in hidden_names(TINY):
            np.testing.assert_allclose(forward.last_values[name], step.last_values[name], **EXACT)


def test_texts_at_a_runs_inputs_run_directly(tiny: RandomWeights) -> None:
    prompt = [FIRST, 100, 3, 250]
    direct = KVState()
    first = run_text(prefill_at(TINY, "", CTX, prompt, 1).text, tiny, direct)
    second = run_text(decode_at(TINY, "", CTX, int(first[0]), len(prompt) + 1).text, tiny, direct)
    bound = KVState()
    prefill = compiled(tiny, Cut.prefill(len(prompt), CTX), bound)
    assert int(prefill.run(tokens=np.array(prompt), positions=np.arange(1, 5))[0]) == int(first[0])
    decode = compiled(tiny, Cut.decode(CTX), bound)
    assert int(decode.run(token=first, position=np.array([5]))[0]) == int(second[0])


def test_weights_saved_as_safetensors_run_the_same(tiny: RandomWeights, tmp_path) -> None:
    save_model(tiny, tmp_path)
    reopened = open_model(str(tmp_path))
    assert (
        greedy(compiled(reopened, Cut.decode(CTX)), FIRST, 8)[0] == greedy(compiled(tiny, Cut.decode(CTX)), FIRST, 8)[0]
    )


# -- split programs ------------------------------------------------------------------------------------------


def logits_of(head: Interpreter, spec: ModelSpec, values: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Each step's logits, from its last hidden state through the (unsplit) forward head."""
    return np.concatenate([head.run(**{f"x{spec.layers}": v[f"x{spec.layers}"]}) for v in values])


@pytest.mark.parametrize(
    ("preset", "seed", "tp"), [("tiny", 0, 2), ("tiny-tp8", 5, 2), ("tiny-tp8", 5, 4), ("tiny-tp8", 5, 8)]
)
def test_split_programs_agree_with_the_unsplit_one(preset: str, seed: int, tp: int) -> None:
    store = RandomWeights(ModelSpec.preset(preset), seed)
    spec = store.spec
    whole = compiled(store, Cut.decode(CTX))
    tokens, values = greedy(whole, FIRST, 32)
    split_state = KVState()
    split = compiled(store, Cut.decode(CTX), split_state, tp=tp)
    split_tokens, split_values = greedy(split, FIRST, 32)
    assert split_tokens == tokens
    # the head split by vocabulary rows: each chip's logits, all-gathered, are the whole head's (last step's)
    np.testing.assert_allclose(split.logits, whole.logits, **REORDERED)
    for name in hidden_names(spec):
        np.testing.assert_allclose([v[name] for v in split_values], [v[name] for v in values], **REORDERED)
    head = compiled(store, Cut.forward_head())
    # Partial products summed over chips differ from whole products by float32 reordering only: measured up to
    # 2e-6 on logits of magnitude up to 4 (about 4e-7 relative); 1e-5 leaves room and still catches any real
    # error.
    np.testing.assert_allclose(logits_of(head, spec, split_values), logits_of(head, spec, values), **REORDERED)
    # Each layer all-reduces the attention output and the MLP output: two rows of `hidden` float32 numbers.
    report = split.communication_bytes_per_run()
    assert report.per_section == {f"layer_{i}": 2 * spec.hidden * 4 for i in range(spec.layers)}
    assert report.total == spec.layers * 2 * spec.hidden * 4


def test_each_chip_holds_only_its_share_of_the_caches(tiny: RandomWeights) -> None:
    whole, split = KVState(), KVState()
    greedy(compiled(tiny, Cut.decode(CTX), whole), FIRST, 5)
    greedy(compiled(tiny, Cut.decode(CTX), split, tp=2), FIRST, 5)
    share = TINY.kv_heads // 2
    for chip in range(2):
        for layer in range(TINY.layers):
            mine = split.get(chip, layer, "key")
            assert mine is not None and mine.shape == (share, CTX, TINY.head_dim)
            reference = whole.get(0, layer, "key")[chip * share : (chip + 1) * share]
            np.testing.assert_allclose(mine, reference, **REORDERED)
    assert compiled(tiny, Cut.decode(CTX)).communication_bytes_per_run().total == 0


# -- errors --------------------------------------------------------------------------------------------------


class _Edited(RandomWeights):
    """Random weights with one tensor missing or reshaped."""

    def __init__(self, spec: ModelSpec, missing: str | None = None, reshaped: str | None = None):
        super().__init__(spec, 0)
        self.missing, self.reshaped = missing, reshaped

    def names(self) -> list[str]:
        return [n for n in super().names() if n != self.missing]

    def shape(self, name: str) -> tuple[int, ...]:
        if name == self.missing:
            raise self._missing(name)
        shape = super().shape(name)
        return (shape[0] + 1, *shape[1:]) if name == self.reshaped else shape


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"missing": "model.layers.1.mlp.up_proj.weight"}, "missing"),
        ({"reshaped": "model.layers.0.self_attn.k_proj.weight"}, "shape [33, 64]"),
    ],
)
def test_bad_weights_are_one_weight_error(edit: dict[str, str], words: str) -> None:
    store = _Edited(TINY, **edit)
    program = parse_program(written(TINY, Cut.decode(CTX))[0].text)
    with pytest.raises(WeightError) as caught:
        Interpreter(program, store)
    message = str(caught.value)
    assert next(iter(edit.values())) in message and store.source in message and words in message


def test_inputs_are_checked(tiny: RandomWeights) -> None:
    step = compiled(tiny, Cut.decode(CTX))
    layer = compiled(tiny, Cut.decode_layer(0, CTX))
    with pytest.raises(LogosError, match="hidden state"):
        layer.run(position=np.array([1]))
    with pytest.raises(LogosError, match="no input named 'tokens'"):
        step.run(tokens=np.array([1]))
    with pytest.raises(LogosError, match="outside the cache"):
        step.run(position=np.array([CTX + 1]))
    with pytest.raises(LogosError, match="token ids run from 1"):
        step.run(token=np.array([0]))
    with pytest.raises(LogosError, match="KV state holds"):
        compiled(tiny, Cut.decode(CTX + 1), step.state)


# -- rotary frequencies --------------------------------------------------------------------------------------


def test_llama3_rope_scaling_matches_the_divisors_llama_cpp_stores() -> None:
    scaling = RopeScaling(32.0, 1.0, 4.0, 8192)
    plain = rope_inv_freq(64, 500000.0)
    np.testing.assert_allclose(
        rope_inv_freq(64, 500000.0, scaling), plain / llama3_rope_divisors(scaling, 64, 500000.0), rtol=1e-12
    )
    assert rope_inv_freq(64, 500000.0, scaling)[0] == plain[0]  # the highest frequency is kept
    assert rope_inv_freq(64, 500000.0, scaling)[-1] == plain[-1] / 32.0  # the lowest is divided by the factor


def test_rope_rotates_halves_by_position_minus_one(tiny: RandomWeights) -> None:
    """A key written at position p is the key projection rotated by (p - 1) * inv_freq, Hugging Face's way."""
    state = KVState()
    step = compiled(tiny, Cut.decode(CTX), state)
    step.run(token=np.array([FIRST]), position=np.array([4]))
    normed_key = _first_layer_key(tiny, step.last_values["x0"][0])
    half = TINY.head_dim // 2
    angles = 3 * rope_inv_freq(TINY.head_dim, TINY.rope_theta)
    cos, sin = np.cos(angles), np.sin(angles)
    heads = normed_key.reshape(TINY.kv_heads, TINY.head_dim)
    expected = np.concatenate(
        [heads[:, :half] * cos - heads[:, half:] * sin, heads[:, half:] * cos + heads[:, :half] * sin], axis=1
    )
    np.testing.assert_allclose(state.get(0, 0, "key")[:, 3], expected, rtol=1e-5, atol=1e-5)


def _first_layer_key(store: RandomWeights, x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    normed = x / np.sqrt(np.mean(x * x) + TINY.rms_eps) * store.get("model.layers.0.input_layernorm.weight")
    return store.get("model.layers.0.self_attn.k_proj.weight") @ normed


# -- generation ----------------------------------------------------------------------------------------------


def test_generation_is_the_same_in_chunks_in_one_prefill_and_split(tiny: RandomWeights) -> None:
    prompt = [6, 99, 2, 249, 17, 0, 80]  # ids from 0
    expected = [t - 1 for t in greedy_after(tiny, [t + 1 for t in prompt], 12)]
    for rows, tp in ((3, 1), (16, 1), (1, 1), (16, 2)):
        generator = Generator(tiny, ctx=CTX, prefill_rows=rows, tp=tp)
        seen: list[int] = []
        assert generator.generate(prompt, 12, on_token=seen.append) == expected == seen
        assert generator.stats.new_tokens == 12 and generator.stats.decode_steps == 11
    lines = [identity.line() for identity in generator.identities]
    assert lines == [f"LOGOS program: decode step, ctx {CTX} over 2 chips, sha256 {lines[0][-64:]}"]


def greedy_after(store: RandomWeights, prompt: list[int], count: int) -> list[int]:
    """`count` greedy tokens (from 1) after `prompt` (from 1), all through decode steps."""
    step = compiled(store, Cut.decode(CTX))
    for position, token in enumerate(prompt, start=1):
        out = int(step.run(token=np.array([token]), position=np.array([position]))[0])
    tokens = [out]
    while len(tokens) < count:
        position += 1
        tokens.append(int(step.run(token=np.array([tokens[-1]]), position=np.array([position]))[0]))
    return tokens


def test_generation_stops_at_eos_and_when_the_cache_is_full(tiny: RandomWeights) -> None:
    prompt = [6, 99, 2]
    free = Generator(tiny, ctx=CTX).generate(prompt, 10)
    assert Generator(tiny, ctx=CTX).generate(prompt, 10, eos_id=free[3]) == free[: free.index(free[3]) + 1]
    # A cache of 5 positions holds the prompt's 3 and two more: the tokens predicted at positions 3, 4 and 5.
    assert Generator(tiny, ctx=5).generate(prompt, 10) == free[:3]
    with pytest.raises(LogosError, match="do not fit"):
        Generator(tiny, ctx=2).generate(prompt, 1)
    with pytest.raises(LogosError, match="outside the vocabulary"):
        Generator(tiny, ctx=CTX).generate([TINY.vocab], 1)


def test_logos_run_on_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    from logos_ir.tools import logos_run

    assert logos_run.main(["--model", "tiny", "--prompt-ids", "6,99,2", "--max-new-tokens", "5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["prompt_ids"] == [6, 99, 2] and report["text"] is None
    assert report["new_ids"] == Generator(RandomWeights(TINY, 0), ctx=64).generate([6, 99, 2], 5)
    assert logos_run.main(["--model", "tiny", "--max-new-tokens", "2"]) == 1
    assert "has no tokenizer" in capsys.readouterr().err
    assert logos_run.main(["--model", "tiny", "--prompt-ids", "1", "--tp", "3"]) == 1
    assert "does not split over 3 chips" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        logos_run.main(["--max-new-tokens", "-2"])
    assert usage.value.code == 2
