"""The command-line tools' exit codes and messages: 1 for a user error, 2 for a usage error, no traceback unless
--debug (docs/errors.md). Each case runs the installed tool in a fresh process, as a user would; the processes
run together, once per session, and each test checks one of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from logos_ir.author import write
from logos_ir.cli import INTERNAL_ERROR, USAGE_ERROR, USER_ERROR, run_tool
from logos_ir.errors import SpecError
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec

BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = BIN / name
    if found.exists():
        return str(found)
    which = shutil.which(name)
    if which is None:
        pytest.fail(f"{name} is not installed: the package's console scripts come with `pip install -e .`")
    return which


# name: (command, standard input, expected exit code, words the standard error must hold)
CASES: dict[str, tuple[list[str], bytes, int, list[str]]] = {
    "opt-bad-logos": (["logos-opt", "{dir}/bad.logos"], b"", USER_ERROR,
                      ["bad.logos:2:24: error:", "expected a whole number, got 'many'", "^"]),
    "opt-bad-logos-stdin": (["logos-opt", "-f", "logos"], b"## Program: nonsense\n", USER_ERROR,
                            ["stdin:1:13: error: unknown cut 'nonsense'", "hint:"]),
    "opt-unknown-pass": (["logos-opt", "{dir}/good.logos", "-p", "no-such-pass"], b"", USAGE_ERROR,
                         ["no-such-pass"]),
    "opt-unknown-option": (["logos-opt", "--no-such-option"], b"", USAGE_ERROR, ["unrecognized arguments"]),
    "opt-bad-pass-option": (["logos-opt", "{dir}/good.logos", "-p", "tp-split{tp=3}"], b"", USER_ERROR,
                            ["tp-split", "does not split over 3 chips"]),
    "opt-not-utf8-mlir": (["logos-opt"], b"builtin.module {\n}\n\xff\n", USER_ERROR,
                          ["not UTF-8 text", "0xff"]),
    "opt-bad-mlir": (["logos-opt"], b"builtin.module {\n  %x = \"logos.nope\"() : () -> i32\n}\n", USER_ERROR,
                     ["logos.nope"]),
    "author-bad-cut": (["logos-author", "--cut", "decode_layer layer=1"], b"", USER_ERROR,
                       ["cut 'decode_layer layer=1' needs 2 argument(s)", "hint: write 'decode_layer layer=N ctx=N'"]),
    "author-cut-past-the-model": (["logos-author", "--model", "tiny", "--cut", "decode_layer layer=9 ctx=64"], b"",
                                  USER_ERROR,
                                  ["layer 9"]),
    "author-unknown-option": (["logos-author", "--no-such-option"], b"", USAGE_ERROR, ["unrecognized arguments"]),
    "author-bad-tp": (["logos-author", "--tp", "two"], b"", USAGE_ERROR, ["--tp", "not a whole number: 'two'"]),
    "author-config-missing-field": (["logos-author", "--model", "{dir}/config.json"], b"", USER_ERROR,
                                    ["config.json: required field 'num_attention_heads' is missing"]),
    "run-bad-model": (["logos-run", "--model", "{dir}/no-such-model", "--prompt-ids", "1"], b"", USER_ERROR,
                      ["no-such-model", "hint:"]),
    "run-bad-model-debug": (["logos-run", "--model", "{dir}/no-such-model", "--prompt-ids", "1", "--debug"], b"",
                            USER_ERROR, ["Traceback", "WeightError"]),
    "run-unknown-option": (["logos-run", "--no-such-option"], b"", USAGE_ERROR, ["unrecognized arguments"]),
    "run-bad-count": (["logos-run", "--max-new-tokens", "-3"], b"", USAGE_ERROR, ["must not be negative"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[bytes]]:
    folder = tmp_path_factory.mktemp("cli")
    good = write(ModelSpec.preset("tiny"), Cut.parse("decode ctx=64")).text
    (folder / "good.logos").write_text(good)
    (folder / "bad.logos").write_text(good.replace("has 256 tokens", "has many tokens", 1))
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}\n')

    def run(case: str) -> subprocess.CompletedProcess[bytes]:
        command, stdin, _, _ = CASES[case]
        argv = [tool(command[0])] + [arg.replace("{dir}", str(folder)) for arg in command[1:]]
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=120, cwd=folder)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(CASES, pool.map(run, CASES), strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_exit_code_and_message(results, case):
    _, _, code, words = CASES[case]
    done = results[case]
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == code, f"exit {done.returncode}, not {code}:\n{stderr}"
    for word in words:
        assert word in stderr, f"{word!r} not in:\n{stderr}"
    if "--debug" not in CASES[case][0]:
        assert "Traceback" not in stderr, stderr
        assert "internal error" not in stderr, stderr


def test_a_user_error_prints_one_diagnostic(results):
    stderr = results["opt-bad-logos"].stderr.decode()
    assert stderr.count("error:") == 1
    assert results["opt-bad-logos"].stdout == b""


# -- run_tool, in process --------------------------------------------------------------------------------------------


def raising(error: BaseException):
    def body() -> int:
        raise error

    return body


def test_run_tool_maps_errors_to_exit_codes(capsys):
    assert run_tool("t", lambda: 0, []) == 0
    assert run_tool("t", lambda: None, []) == 0
    assert run_tool("t", raising(SpecError("bad size")), []) == USER_ERROR
    assert capsys.readouterr().err == "t: error: bad size\n"
    assert run_tool("t", raising(RuntimeError("oops")), []) == INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err == "t: internal error: RuntimeError: oops (rerun with --debug for a traceback)\n"
    assert run_tool("t", raising(KeyboardInterrupt()), []) == 130


def test_run_tool_reports_non_utf8_input_as_a_user_error(capsys):
    def body() -> int:
        b"ok \xfe".decode("utf-8")
        return 0

    assert run_tool("t", body, []) == USER_ERROR
    assert capsys.readouterr().err == "t: error: the input is not UTF-8 text (byte 0xfe at offset 3)\n"


def test_run_tool_lets_errors_through_with_debug():
    with pytest.raises(SpecError):
        run_tool("t", raising(SpecError("bad")), ["--debug"])
    with pytest.raises(RuntimeError):
        run_tool("t", raising(RuntimeError("oops")), ["--debug"])


def test_run_tool_passes_system_exit_through():
    with pytest.raises(SystemExit):
        run_tool("t", raising(SystemExit(2)), [])


# -- one set of common arguments in every tool -------------------------------------------------------------------------

TOOLS = ("logos-opt", "logos-author", "logos-compile", "logos-run")


@pytest.mark.parametrize("name", TOOLS)
def test_every_tool_has_version_and_list_models(name):
    version = subprocess.run([tool(name), "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and name in version.stdout and "logos-ir" in version.stdout
    listing = subprocess.run([tool(name), "--list-models"], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    for word in ("tiny", "llama-3.1-8b", "embedded", "Hugging Face cache", ".gguf"):
        assert word in listing.stdout


def test_logos_opt_help_lists_dialects_passes_pipelines_and_targets():
    done = subprocess.run([tool("logos-opt"), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    for word in ("logos-ir dialects: logos, cuda, nvvm, d5005, csl_ext", "logos-ir passes:", "cut-extract",
                 "logos-ir pipelines:", "logos-to-cuda{", "targets: ", "d5005-listing"):  # fmt: skip
        assert word in done.stdout, word


def test_the_model_argument_is_the_same_in_every_tool(tmp_path, capsys):
    """logos-author takes what the others take, with the same default (the embedded model): `embedded`, a
    .gguf file (it read one as UTF-8 text before), a preset, a config.json alone."""
    from logos_ir import testing
    from logos_ir.tools import logos_author, logos_compile, logos_run

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(testing.model_gguf(4, "F32"))

    def identity(*model: str) -> str:
        assert logos_author.main([*model, "--cut", "decode ctx=64", "--identity"]) == 0
        return capsys.readouterr().out

    embedded = identity()
    assert embedded == identity("--model", "embedded")
    assert embedded != identity("--model", "tiny")
    assert identity("--model", str(gguf)).startswith("LOGOS program: decode step, ctx 64")
    for main, argv in (
        (logos_compile.main, ["--target", "logos", "--cut", "decode ctx=64", "-o", str(tmp_path / "b")]),
        (logos_run.main, ["--prompt-ids", "1", "-n", "1"]),
    ):
        assert main(["--model", str(gguf), *argv]) == 0  # the same .gguf file in the other tools
    capsys.readouterr()
    for parser in (logos_author._arguments(), logos_run._arguments()):
        assert parser.parse_args([]).model is None  # None: the embedded model, as logos-compile's default


def test_logos_text_on_standard_input_needs_no_flag(tmp_path):
    text = write(ModelSpec.preset("tiny"), Cut.parse("decode ctx=64")).text
    piped = subprocess.run([tool("logos-opt")], input=text, capture_output=True, text=True, timeout=120)
    (tmp_path / "decode.logos").write_text(text)
    named = subprocess.run([tool("logos-opt"), str(tmp_path / "decode.logos")], capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert piped.returncode == 0 and "{first_char}" not in piped.stderr
    assert piped.stdout == named.stdout and "logos.program" in piped.stdout
