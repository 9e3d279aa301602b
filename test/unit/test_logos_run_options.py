"""`logos-run` speaks llama-cli: its short options mean what they mean there, beside logos-run's long names; `-n -1`
runs to the end of the text or of the cache; `-ngl` is llama-cli's option, not `-n gl`; `-t` sets the BLAS threads;
Ctrl-C during an answer of `-i` stops the answer and returns to the prompt (through a pseudo-terminal, as a user
presses it); the load time is reported apart from the time to the first token; and an option a build folder fixes
is refused when it differs. The model is the tests' small chat model (chat_model.py), or the tiny preset."""

from __future__ import annotations

import json
import os
import select
import sys
import time
from pathlib import Path

import pytest
from chat_model import write_chat_gguf

from logos_ir.cli import USER_ERROR
from logos_ir.tools import logos_compile, logos_run

# llama-cli's spelling -> logos-run's long one; each pair must parse to the same arguments
SPELLINGS: dict[str, tuple[list[str], list[str]]] = {
    "-m": (["-m", "tiny"], ["--model", "tiny"]),
    "-p": (["-p", "hello"], ["--prompt", "hello"]),
    "-f": (["-f", "q.txt"], ["--prompt-file", "q.txt"]),
    "-n": (["-n", "7"], ["--max-new-tokens", "7"]),
    "--n-predict": (["--n-predict", "7"], ["--max-new-tokens", "7"]),
    "-n -1": (["-n", "-1"], ["--max-new-tokens", "-1"]),
    "-c": (["-c", "128"], ["--ctx", "128"]),
    "--ctx-size": (["--ctx-size", "128"], ["--ctx", "128"]),
    "-t": (["-t", "2"], ["--threads", "2"]),
    "-s": (["-s", "9"], ["--seed", "9"]),
    "-sys": (["-sys", "be brief"], ["--system", "be brief"]),
    "-cnv": (["-cnv"], ["--interactive"]),
    "--conversation": (["--conversation"], ["-i"]),
    "--temp": (["--temp", "0.7"], ["--temperature", "0.7"]),
    "--top-k": (["--top-k", "5"], ["--top-k", "5"]),
    "--top-p": (["--top-p", "0.5"], ["--top-p", "0.5"]),
    "--min-p": (["--min-p", "0.1"], ["--min-p", "0.1"]),
    "--repeat-penalty": (["--repeat-penalty", "1.1"], ["--repeat-penalty", "1.1"]),
    "--repeat-last-n": (["--repeat-last-n", "32"], ["--repeat-last-n", "32"]),
    "--chat-template": (["--chat-template", "chatml"], ["--chat-template", "chatml"]),
    "-ngl": (["-ngl", "99"], ["--n-gpu-layers", "99"]),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_llama_cli_spellings(name: str) -> None:
    short, long = SPELLINGS[name]
    parser = logos_run._arguments()
    assert vars(parser.parse_args(short)) == vars(parser.parse_args(long)) != vars(parser.parse_args([]))


def test_ngl_is_not_n_gl() -> None:
    args = logos_run._arguments().parse_args(["-ngl", "0"])
    assert args.gpu_layers == 0 and args.max_new_tokens == 32


def test_threads_reach_the_blas_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in logos_run._THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "numpy", raising=False)  # as when logos-run starts: numpy not yet loaded
    logos_run.limit_threads(1)
    assert all(os.environ[name] == "1" for name in logos_run._THREAD_VARIABLES)


def test_the_default_threads_are_the_cores_not_already_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert logos_run.default_threads(cores=2, load=0.1) == 2  # idle: a thread a core, BLAS's own default
    assert logos_run.default_threads(cores=2, load=1.2) == 1
    assert logos_run.default_threads(cores=2, load=3.7) == 1  # never fewer than one
    assert logos_run.default_threads(cores=16, load=3.6) == 12
    for name in logos_run._THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "numpy", raising=False)
    monkeypatch.setattr(logos_run, "default_threads", lambda: 3)
    logos_run.limit_threads(None)
    assert all(os.environ[name] == "3" for name in logos_run._THREAD_VARIABLES)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "5")  # the user's own setting is kept
    monkeypatch.setattr(logos_run, "default_threads", lambda: 1)
    logos_run.limit_threads(None)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "5"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_gguf(tmp_path_factory.mktemp("chat") / "chat.gguf")


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert logos_run.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_n_minus_one_runs_to_the_end_of_the_cache(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(capsys, "-m", "tiny", "--prompt-ids", "1,2,3", "-n", "-1", "-c", "12")
    if report["stop_reason"] != "eos":  # the end of the text, else the cache is full: every position used
        assert len(report["new_ids"]) == 12 - 3 + 1


def test_the_load_time_is_apart_from_the_first_token(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    report = _report(capsys, "-m", str(model), "-p", "hi", "-n", "2", "--chat-template", "chatml")
    assert report["load_s"] > 0 and 0 < report["ttft_s"] <= report["prefill_s"] + report["decode_s"] + 0.05


def test_the_timing_line_says_the_load_time(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    assert logos_run.main(["-m", str(model), "-p", "hi", "-n", "2"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "first token after" in line and "loading and compiling" in line


def test_a_chat_template_that_is_no_template_is_refused(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    assert logos_run.main(["-m", str(model), "-p", "hi", "--chat-template", "vicuna-9"]) == USER_ERROR
    assert "not a template logos-run knows" in capsys.readouterr().err


def test_a_build_refuses_another_model_seed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    build = tmp_path / "build"
    assert logos_compile.main(["-m", "tiny", "--target", "logos", "--cut", "decode ctx=16", "-o", str(build)]) == 0
    capsys.readouterr()
    assert logos_run.main([str(build), "--prompt-ids", "1", "-n", "1", "--model-seed", "5"]) == USER_ERROR
    assert "--model-seed 0, not 5" in capsys.readouterr().err


def _read_until(fd: int, wanted: bytes, seen: bytearray, timeout: float, after: int = 0) -> bool:
    """Read the terminal into `seen` until `wanted` appears past `after`, or `timeout` seconds pass."""
    end = time.monotonic() + timeout
    while wanted not in seen[after:]:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return False
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child has gone
            return False
        if not chunk:
            return False
        seen += chunk
    return True


def test_ctrl_c_in_a_conversation_returns_to_the_prompt(model: Path) -> None:
    """Through a pseudo-terminal: a turn, Ctrl-C while the answer runs, the prompt again, then end of input."""
    import pty

    tool = Path(sys.executable).parent / "logos-run"
    argv = [str(tool), "-m", str(model), "-cnv", "-n", "-1", "-c", "4096", "--ignore-eos", "--chat-template", "chatml"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: logos-run on the terminal
        os.execv(argv[0], argv)
    seen = bytearray()
    try:
        assert _read_until(fd, b"> ", seen, 120), seen.decode(errors="replace")
        os.write(fd, b"hello\n")
        assert _read_until(fd, b"hello\r\n", seen, 30)
        answer = len(seen)
        streaming = time.monotonic() + 60
        while len(seen) < answer + 8 and time.monotonic() < streaming:  # some of the answer is out
            _read_until(fd, b"\x00", seen, 0.2, after=len(seen))
        os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT to logos-run
        assert _read_until(fd, b"interrupted: the answer stops here", seen, 60), seen.decode(errors="replace")
        stopped = seen.find(b"interrupted: the answer stops here")
        assert _read_until(fd, b"> ", seen, 30, after=stopped), seen.decode(errors="replace")
        os.write(fd, b"\x04")  # end of input at the prompt ends the conversation
        _read_until(fd, b"\x00", seen, 10, after=len(seen))
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, seen.decode(errors="replace")


class _Terminal:
    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_progress_on_a_terminal_for_a_step_slower_than_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with logos_run.Progress("compiling"):
        time.sleep(0.2)
    assert terminal.text == ""  # a quick step says nothing
    with logos_run.Progress("compiling"):
        time.sleep(1.3)
    assert terminal.text.startswith("\rlogos-run: compiling (1 s)") and terminal.text.endswith("\r\x1b[K")
