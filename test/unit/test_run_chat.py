"""`logos-run` as people who use llama.cpp expect it: the prompt from text, standard input or a file, the
chat template by default (--raw to opt out, --system), sampling reproducible by --seed and the same on two backends,
--stop ending the answer at the string, the answer streamed once to standard output, the timing line, -i holding a
conversation through standard input with the cache kept. A small chat model (chat_model.py) stands in for a real
one; one embedded-model run answers the France question."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_model import TEMPLATE, write_chat_gguf

from logos_ir.tokenizer import Tokenizer
from logos_ir.tools import logos_run
from logos_ir.tools.logos_run import chat_text
from logos_ir.weights import open_model

SAMPLED = ["--temperature", "0.7", "--top-p", "0.9", "--seed", "1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_gguf(tmp_path_factory.mktemp("chat") / "chat.gguf")


@pytest.fixture(scope="module")
def tokenizer(model: Path) -> Tokenizer:
    found = Tokenizer.from_store(open_model(str(model)))
    assert found is not None
    return found


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        old, sys.stdin = sys.stdin, io.StringIO(stdin)
    try:
        code = logos_run.main(list(argv))
    finally:
        if stdin is not None:
            sys.stdin = old
    out, err = capsys.readouterr()
    return code, out, err


def report(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None) -> dict:  # type: ignore[type-arg]
    code, out, err = run(capsys, *argv, "--json", stdin=stdin)
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_the_chat_template_is_the_default_and_raw_opts_out(capsys, model, tokenizer) -> None:  # type: ignore[no-untyped-def]
    chat = report(capsys, "--model", str(model), "--prompt", "hello world", "-n", "2")
    rendered = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert chat_text(TEMPLATE, [{"role": "user", "content": "hello world"}]) == rendered
    assert chat["prompt_ids"] == tokenizer.encode(rendered)
    raw = report(capsys, "--model", str(model), "--prompt", "hello world", "-n", "2", "--raw")
    assert raw["prompt_ids"] == tokenizer.encode("hello world")
    system = report(capsys, "--model", str(model), "--prompt", "hello world", "-n", "2", "--system", "be brief")
    assert system["prompt_ids"] == tokenizer.encode("<|im_start|>system\nbe brief<|im_end|>\n" + rendered)


def test_the_prompt_from_standard_input_or_a_file(capsys, model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    given = report(capsys, "--model", str(model), "--prompt", "hello\nworld", "-n", "3")
    piped = report(capsys, "--model", str(model), "--prompt", "-", "-n", "3", stdin="hello\nworld")
    (tmp_path / "prompt.txt").write_text("hello\nworld")
    filed = report(capsys, "--model", str(model), "--prompt-file", str(tmp_path / "prompt.txt"), "-n", "3")
    assert given["prompt_ids"] == piped["prompt_ids"] == filed["prompt_ids"]
    assert given["new_ids"] == piped["new_ids"] == filed["new_ids"]


def test_the_answer_streams_once_to_standard_output(capsys, model) -> None:  # type: ignore[no-untyped-def]
    text = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "8", "--raw")["text"]
    code, out, err = run(capsys, "--model", str(model), "--prompt", "hello", "-n", "8", "--raw")
    assert code == 0 and out == text + "\n"  # once, on standard output (captured: not a terminal)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("logos-run: prompt ") and "first token after" in lines[0]
    assert "decode" in lines[0] and "tokens/s" in lines[0]


def test_the_timing_is_in_the_json(capsys, model) -> None:  # type: ignore[no-untyped-def]
    timing = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "4")
    assert timing["ttft_s"] > 0 and timing["prompt_tokens_per_s"] > 0 and timing["decode_tokens_per_s"] > 0
    assert timing["prompt_tokens"] == len(timing["prompt_ids"]) and timing["stop_reason"] == "length"


def test_stop_ends_the_answer_at_the_string(capsys, model) -> None:  # type: ignore[no-untyped-def]
    full = report(capsys, "--model", str(model), "--prompt", "abc", "-n", "24", "--raw")
    text = full["text"]
    # two printable characters the answer reaches (here across two tokens: "hel" then "n")
    start = next(i for i in range(1, len(text) - 1) if text[i : i + 2].isascii() and text[i : i + 2].isalnum())
    stop = text[start : start + 2]
    cut = text.index(stop)
    argv = ["--model", str(model), "--prompt", "abc", "-n", "24", "--raw", "--stop", "never", "--stop", stop]
    stopped = report(capsys, *argv)
    assert stopped["text"] == text[:cut] and stopped["stop_reason"] == "stop"
    assert stopped["new_ids"] == full["new_ids"][: len(stopped["new_ids"])] and len(stopped["new_ids"]) < 24
    code, out, _ = run(capsys, *argv)
    assert out == text[:cut] + "\n"  # what streamed stops before the string too: none of it was shown


def test_a_seed_repeats_the_sampled_tokens(capsys, model) -> None:  # type: ignore[no-untyped-def]
    first = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "12", *SAMPLED)
    again = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "12", *SAMPLED)
    greedy = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "12")
    other = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "12", *SAMPLED[:-1], "2")
    assert first["new_ids"] == again["new_ids"] and first["sampling"]["seed"] == 1
    assert first["new_ids"] != greedy["new_ids"] and first["new_ids"] != other["new_ids"]
    unseeded = report(capsys, "--model", str(model), "--prompt", "hello", "-n", "2", "--temperature", "0.7")
    assert isinstance(unseeded["sampling"]["seed"], int)  # a fresh seed, reported so the run can be repeated


@pytest.mark.parametrize(
    "other",
    [
        ["--tp", "2"],  # the decode step split over two chips: their logits summed over the all-reduce
        ["--backend", "spatial", "--weights", "f32"],  # the grid simulator's logits
        ["--backend", "cuda", "--emulate", "--weights", "f32"],  # the lowered kernels' logits
        ["--backend", "d5005", "--weights", "f32"],  # the engine's logits buffer, read back from the device
    ],
)
def test_sampling_gives_the_same_tokens_on_two_backends(capsys, other) -> None:  # type: ignore[no-untyped-def]
    argv = ["--model", "tiny", "--prompt-ids", "3,17", "-n", "6", *SAMPLED]
    reference = report(capsys, *argv)
    code, out, err = run(capsys, *argv, *other, "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["new_ids"] == reference["new_ids"]


def test_interactive_chat_through_standard_input_keeps_the_cache(model) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        [sys.executable, "-m", "logos_ir.tools.logos_run", "--model", str(model), "-i", "-n", "6", "--json"],
        input="hello\n\nworld\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    turns = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(turns) == 2  # the empty line is no turn
    first, second = turns
    assert second["prompt_ids"][: len(first["prompt_ids"])] == first["prompt_ids"]  # the conversation so far
    assert second["cached_tokens"] >= len(first["prompt_ids"])  # ... kept in the cache, not fed again
    assert second["prompt_tokens"] == len(second["prompt_ids"]) - second["cached_tokens"]
    tokenizer = Tokenizer.from_store(open_model(str(model)))
    assert tokenizer is not None
    assert tokenizer.decode(second["prompt_ids"]).endswith("<|im_start|>user\nworld<|im_end|>\n<|im_start|>assistant\n")
    # the second answer is the one a fresh run on the whole conversation gives (same cache length)
    fresh = subprocess.run(
        [sys.executable, "-m", "logos_ir.tools.logos_run", "--model", str(model), "--json", "-n", "6", "--ctx",
         str(second["ctx"]), "--prompt-ids", ",".join(map(str, second["prompt_ids"]))],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout.strip().splitlines()[-1])["new_ids"] == second["new_ids"]


def test_the_france_question_is_answered_once() -> None:
    """EMBEDDED-MODEL RUN (the tools' one): a user's question gets the chat template without --chat, and the
    answer is printed once, on standard output, through a pipe."""
    done = subprocess.run(
        [sys.executable, "-m", "logos_ir.tools.logos_run", "--prompt", "What is the capital of France?", "-n", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Paris") == 1 and "Paris" not in done.stderr
    assert done.stdout.startswith("The capital of France is Paris")


class _Letters:
    """A tokenizer whose token i is the i-th letter; 9 is end-of-sequence."""

    eos_id = 9

    def decode(self, ids: list[int]) -> str:
        return "".join("abcdefghi"[i] for i in ids)


def test_the_answer_streams_as_it_grows(capsys) -> None:  # type: ignore[no-untyped-def]
    """Each token's text is written (and flushed) as it comes, to standard output whatever it is, except what may
    be the start of a stop string, which waits until it is known not to be."""
    stream = logos_run.Stream(_Letters(), ["cde"], live=True)
    seen = []
    for token in (0, 1, 2, 3, 1, 2, 3, 4):
        stopped = stream(token)
        seen.append(capsys.readouterr().out)
        if stopped:
            break
    stream.finish()
    assert seen == ["a", "b", "", "", "cdb", "", "", ""] and stopped and stream.text == "abcdb"
    assert capsys.readouterr().out == "\n"
