"""The shared sampler (logos_ir.sampling) and the loops that use it (logos_ir.generate): each step of llama.cpp's
chain does what it says on logits whose probabilities are known beforehand, a seed repeats its tokens, temperature 0
is the backend's own arg-max, and the loops continue from the cache as a fresh run would."""

from __future__ import annotations

import numpy as np
import pytest

from logos_ir.errors import LogosError
from logos_ir.generate import Generator, run_program
from logos_ir.program import Cut
from logos_ir.sampling import Sampler, SamplingSettings
from logos_ir.weights import open_model

PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBS).astype(np.float32) + 3.0  # softmax(LOGITS) == PROBS; the shift changes nothing


def draws(settings: SamplingSettings, n: int = 4000, logits: np.ndarray = LOGITS) -> np.ndarray:
    sampler = Sampler(settings)
    counts = np.zeros(logits.size)
    for _ in range(n):
        counts[sampler.choose(0, logits)] += 1
    return counts / n


def plain(**changes: float) -> SamplingSettings:
    """Temperature 1 with every truncation off, then `changes`."""
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7}
    return SamplingSettings(**(base | changes))  # type: ignore[arg-type]


def test_temperature_zero_is_the_backends_own_choice() -> None:
    sampler = Sampler()
    assert sampler.greedy
    assert sampler.choose(3, None) == 3  # no logits needed, and none read
    assert sampler.choose(3, LOGITS) == 3  # the backend's arg-max stands, whatever the logits


def test_sampling_without_logits_names_the_backend() -> None:
    with pytest.raises(LogosError, match="the spatial backend gives no logits"):
        Sampler(SamplingSettings(temperature=0.7), backend="spatial").choose(0, None)


def test_draws_follow_the_softmax() -> None:
    assert np.abs(draws(plain()) - PROBS).max() < 0.03


def test_temperature_sharpens() -> None:
    expected = PROBS**2 / (PROBS**2).sum()  # temperature 0.5 squares each probability, renormalised
    assert np.abs(draws(plain(temperature=0.5)) - expected).max() < 0.03


def test_top_k_keeps_the_k_likeliest() -> None:
    freq = draws(plain(top_k=2))
    assert freq[2] == freq[3] == 0
    assert abs(freq[0] - 0.5 / 0.8) < 0.03


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    assert draws(plain(top_p=0.5))[0] == 1.0  # 0.5 alone reaches 0.5
    freq = draws(plain(top_p=0.79))  # 0.5 + 0.3 is the first to reach 0.79
    assert freq[2] == freq[3] == 0 and freq[1] > 0


def test_min_p_drops_the_unlikely() -> None:
    freq = draws(plain(min_p=0.2))  # below 0.2 * 0.5 = 0.1: the 0.05 token
    assert freq[3] == 0 and freq[2] > 0


def test_repeat_penalty_divides_a_positive_logit_and_multiplies_a_negative_one() -> None:
    logits = np.array([2.0, 1.5, -1.0, -1.2], dtype=np.float32)
    sampler = Sampler(SamplingSettings(repeat_penalty=2.0))
    assert not sampler.greedy
    sampler.accept([0])
    assert sampler.choose(0, logits) == 1  # 2.0 / 2 = 1.0 < 1.5
    logits = np.array([-1.0, -1.5, -1.2, -5.0], dtype=np.float32)
    assert sampler.choose(0, logits) == 2  # token 0: -1.0 * 2 = -2.0, now below -1.2
    window = Sampler(SamplingSettings(repeat_penalty=2.0, repeat_last_n=1))
    window.accept([0, 3])  # token 0 has left the window of 1
    assert window.choose(0, logits) == 0


def test_a_seed_repeats_its_draws_and_another_seed_does_not() -> None:
    def tokens(seed: int) -> list[int]:
        sampler = Sampler(plain(seed=seed))
        return [sampler.choose(0, LOGITS) for _ in range(64)]

    assert tokens(1) == tokens(1)
    assert tokens(1) != tokens(2)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("temperature", -0.1, "--temperature -0.1: must be from 0"),
        ("temperature", float("nan"), "--temperature nan"),
        ("top_p", 0.0, "--top-p 0.0"),
        ("min_p", 1.5, "--min-p 1.5"),
        ("top_k", -1, "--top-k -1"),
        ("repeat_penalty", 0.0, "--repeat-penalty 0.0"),
        ("seed", 2**64, "--seed"),
    ],
)
def test_settings_out_of_range_are_one_error(field: str, value: float, words: str) -> None:
    with pytest.raises(LogosError, match=words.replace(".", r"\.").replace("-", r"\-")):
        SamplingSettings(**{field: value})  # type: ignore[arg-type]


# -- the loops ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    return open_model("tiny")


PROMPT = [5, 17, 3, 99, 42]
SAMPLED = SamplingSettings(temperature=0.7, top_p=0.9, seed=1)


def test_the_interpreter_gives_the_logits_its_head_read(tiny) -> None:  # type: ignore[no-untyped-def]
    for tp in (1, 2):
        program = Generator(tiny, ctx=64, tp=tp).program(Cut.decode(64))
        assert program.logits is None  # nothing ran yet
        token = int(run_program(program, [6], [1])[0])
        assert program.logits.shape == (tiny.spec.vocab,) and program.logits.dtype == np.float32
        assert int(np.argmax(program.logits)) + 1 == token


def test_sampled_generation_repeats_and_agrees_split_and_whole(tiny) -> None:  # type: ignore[no-untyped-def]
    first = Generator(tiny, ctx=64).generate(PROMPT, 12, sampler=Sampler(SAMPLED))
    assert first == Generator(tiny, ctx=64).generate(PROMPT, 12, sampler=Sampler(SAMPLED))
    assert first != Generator(tiny, ctx=64).generate(PROMPT, 12)  # it did sample (greedy differs here)
    split = Generator(tiny, ctx=64, tp=2).generate(PROMPT, 12, sampler=Sampler(SAMPLED))  # two chips' logits
    assert split == first


def test_continuing_from_the_cache_is_a_fresh_run(tiny) -> None:  # type: ignore[no-untyped-def]
    generator = Generator(tiny, ctx=64, prefill_rows=4)
    answer = generator.generate(PROMPT, 6)
    assert generator.cached_tokens == PROMPT + answer[:-1]  # the last token is not fed yet
    turn = PROMPT + answer + [7, 8, 9]
    again = generator.generate(turn, 6, keep_cache=True)
    assert generator.stats.cached_tokens == len(PROMPT) + 5 and generator.stats.prompt_tokens == 4
    assert again == Generator(tiny, ctx=64, prefill_rows=4).generate(turn, 6)
    other = [1, 2] + turn[2:]  # differs from the cache at its first token: nothing is kept
    generator.generate(other, 2, keep_cache=True)
    assert generator.stats.cached_tokens == 0


def test_on_token_stops_the_loop(tiny) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    generator = Generator(tiny, ctx=64)
    out = generator.generate(PROMPT, 10, on_token=lambda t: seen.append(t) or len(seen) == 3)
    assert out == seen and len(out) == 3 and generator.stats.stop == "stop"
    generator.generate(PROMPT, 10)
    assert generator.stats.stop == "length" and generator.stats.first_token_s > 0
