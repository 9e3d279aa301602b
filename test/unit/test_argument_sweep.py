"""A sweep of wrong arguments over the four tools, as a new user makes them (of every kind: paths,
sizes, numbers too large, options a tool or target does not take): each is one clear message naming what was
wrong, in the tools' one style (`tool: error: ...`, or `file:line:col: error: ...` where there is a source), exit
1 or 2, never an internal error (exit 70) and never a traceback. The processes run together, once per session."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_cli import tool  # the tools as installed beside this Python

from logos_ir.cli import INTERNAL_ERROR

DECODE = ["--model", "tiny", "--target", "logos", "--cut", "decode ctx=64"]
RUN = ["logos-run", "--model", "tiny", "--prompt-ids", "1"]

# name: (command, words the standard error must hold); "{dir}" is the sweep's folder
CASES: dict[str, tuple[list[str], list[str]]] = {
    # logos-opt
    "opt-no-such-file": (["logos-opt", "nofile.logos"], ["nofile.logos", "no such file"]),
    "opt-output-folder-missing": (["logos-opt", "{dir}/decode.logos", "-o", "/nonexist/x.mlir"],
                                  ["cannot write /nonexist/x.mlir", "no such folder"]),
    "opt-output-is-a-folder": (["logos-opt", "{dir}/decode.logos", "-o", "{dir}"], ["is a folder"]),
    "opt-input-is-a-folder": (["logos-opt", "{dir}"], ["{dir}"]),
    "opt-lane-target-on-logos-ir": (["logos-opt", "{dir}/decode.logos", "-t", "cuda"], ["-p logos-to-cuda"]),
    "opt-csl-on-logos-ir": (["logos-opt", "{dir}/decode.logos", "-t", "csl"], ["-p logos-to-spatial"]),
    "opt-unknown-target": (["logos-opt", "{dir}/decode.logos", "-t", "nosuch"], ["nosuch"]),
    "opt-unknown-pass": (["logos-opt", "{dir}/decode.logos", "-p", "nopass"], ["nopass"]),
    "opt-cut-too-large": (["logos-opt", "{dir}/decode.logos", "-p",
                           'cut-extract{cut="decode ctx=99999999999999999999"}'],
                          ["99999999999999999999", "too large"]),
    "opt-pipeline-option": (["logos-opt", "{dir}/decode.logos", "-p", "logos-middle-end{nope=1}"], ["nope"]),
    "opt-unknown-frontend": (["logos-opt", "-f", "nosuch"], ["nosuch"]),
    "opt-bad-mlir-stdin": (["logos-opt"], ["stdin:1:", "error:"]),
    # logos-author
    "author-cut-too-large": (["logos-author", "--cut", "decode ctx=99999999999999999999"], ["'ctx'", "too large"]),
    "author-cut-extra-argument": (["logos-author", "--model", "tiny", "--cut", "decode ctx=64 layer=1"],
                                  ["'layer' is not one of them"]),
    "author-empty-cut": (["logos-author", "--model", "tiny", "--cut", ""], ["empty cut"]),
    "author-unknown-model": (["logos-author", "--model", "nosuch"], ["'nosuch'"]),
    "author-model-not-a-model": (["logos-author", "--model", "{dir}/afile"], ["afile"]),
    "author-tp-zero": (["logos-author", "--model", "tiny", "--tp", "0"], ["--tp", "at least 1"]),
    "author-tp-not-dividing": (["logos-author", "--model", "tiny", "--tp", "3"], ["3"]),
    "author-output-folder-missing": (["logos-author", "--model", "tiny", "-o", "/nonexist/x.logos"],
                                     ["/nonexist/x.logos"]),
    # logos-compile
    "compile-output-through-a-file": (["logos-compile", *DECODE, "-o", "{dir}/afile/sub"], ["afile", "not a folder"]),
    "compile-output-is-a-file": (["logos-compile", *DECODE, "-o", "{dir}/decode.logos"], ["decode.logos"]),
    "compile-cut-too-large": (["logos-compile", "--model", "tiny", "--target", "logos", "--cut",
                               "decode ctx=99999999999999999999", "-o", "{dir}/x"], ["too large"]),
    "compile-option-not-taken": (["logos-compile", *DECODE, "--option", "foo=bar", "-o", "{dir}/x"], ["foo"]),
    "compile-option-not-taken-cuda": (["logos-compile", "--model", "tiny", "--target", "cuda", "--cut", "decode ctx=64",
                                       "--option", "foo=bar", "-o", "{dir}/x"], ["option ptxas", "foo"]),
    "compile-option-malformed": (["logos-compile", *DECODE, "--option", "foo", "-o", "{dir}/x"], ["foo"]),
    "compile-check-with-target": (["logos-compile", "--check", "{dir}/build", "--target", "cuda"], ["--target"]),
    "compile-check-with-output": (["logos-compile", "--check", "{dir}/build", "-o", "{dir}/x"], ["-o"]),
    "compile-check-no-folder": (["logos-compile", "--check", "{dir}/nosuch"], ["nosuch"]),
    "compile-check-a-file": (["logos-compile", "--check", "{dir}/afile"], ["afile: not a folder"]),
    "compile-check-outside-path": (["logos-compile", "--check", "{dir}/outside"], ["/etc/hostname"]),
    "compile-rebuild-check-no-folder": (["logos-compile", "--rebuild-check", "{dir}/nosuch"], ["nosuch"]),
    "compile-cut-the-target-does-not-take": (["logos-compile", "--model", "tiny", "--target", "d5005", "--cut",
                                              "prefill rows=4 ctx=64", "-o", "{dir}/x"], ["prefill"]),
    "compile-missing-cut": (["logos-compile", "--model", "tiny", "--target", "logos"], ["--cut", "-o"]),
    "compile-unknown-target": (["logos-compile", "--target", "nosuch"], ["nosuch"]),
    "compile-tp-not-dividing": (["logos-compile", *DECODE, "--tp", "3", "-o", "{dir}/x"], ["3"]),
    "compile-seed-negative": (["logos-compile", *DECODE, "--model-seed", "-1", "-o", "{dir}/x"], ["-1"]),
    # logos-run
    "run-empty-id": (["logos-run", "--model", "tiny", "--prompt-ids", "1,,2"], ["1,,2"]),
    "run-id-outside-vocab": (["logos-run", "--model", "tiny", "--prompt-ids", "300"], ["0 to 255"]),
    "run-new-tokens-past-ctx": ([*RUN, "--max-new-tokens", "100", "--ctx", "16"], ["--max-new-tokens 100", "16"]),
    "run-ctx-too-large": ([*RUN, "--ctx", "99999999999999999999"], ["--ctx", "too large"]),
    "run-cache-past-memory": ([*RUN, "--max-new-tokens", "100000000000"], ["GiB", "--ctx"]),
    "run-preset-past-memory": (["logos-run", "--model", "llama-3.1-70b", "--prompt-ids", "1"], ["GiB"]),
    "run-temperature-negative": ([*RUN, "--temperature", "-1"], ["--temperature"]),
    "run-temperature-nan": ([*RUN, "--temperature", "nan"], ["nan"]),
    "run-top-p-above-one": ([*RUN, "--top-p", "2"], ["--top-p 2"]),
    "run-count-not-a-number": ([*RUN, "--max-new-tokens", "x"], ["--max-new-tokens", "'x'"]),
    "run-emulate-on-reference": ([*RUN, "--emulate"], ["--emulate"]),
    "run-weights-not-run": ([*RUN, "--weights", "bf16"], ["bf16"]),
    "run-tp-not-dividing": ([*RUN, "--tp", "3"], ["3 chips"]),
    "run-aocx-missing": ([*RUN, "--aocx", "{dir}/nosuch.aocx"], ["nosuch.aocx"]),
    "run-interactive-ids": ([*RUN, "-i"], ["-i"]),
    "run-prompt-file-missing": (["logos-run", "--model", "{dir}/tok.gguf", "--prompt-file", "{dir}/nosuch.txt"],
                                ["nosuch.txt"]),
    "run-system-raw": (["logos-run", "--model", "{dir}/tok.gguf", "--raw", "--system", "be brief"], ["--system"]),
    "run-stop-without-tokenizer": ([*RUN, "--stop", "x"], ["--stop", "no tokenizer"]),
    "run-no-tokenizer": (["logos-run", "--model", "tiny"], ["no tokenizer", "--prompt-ids"]),
    "run-build-missing": (["logos-run", "{dir}/nosuch"], ["nosuch"]),
    "run-build-tampered": (["logos-run", "{dir}/tampered", "--prompt-ids", "1"], ["does not match", "program.logos"]),
    "run-build-outside-path": (["logos-run", "{dir}/outside", "--prompt-ids", "1"], ["/etc/hostname"]),
    "run-build-other-tp": (["logos-run", "{dir}/build", "--prompt-ids", "1", "--tp", "2"], ["--tp"]),
    "run-build-other-backend": (["logos-run", "{dir}/build", "--prompt-ids", "1", "--backend", "spatial"],
                                ["reference"]),
    "run-build-other-model": (["logos-run", "{dir}/build", "--prompt-ids", "1", "--model", "tiny-tp8"],
                              ["not the one the build was made from"]),
    "run-hub-id-not-cached": (["logos-run", "--model", "acme/absent"], ["acme/absent", "{dir}/hub"]),
    "run-a-build-as-model": (["logos-run", "--model", "{dir}/build"], ["is a build folder", "logos-run {dir}/build"]),
    "run-embedded-cache-past-memory": (["logos-run", "--max-new-tokens", "10000000"], ["10000064 positions", "GiB"]),
}  # fmt: skip


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, subprocess.CompletedProcess[str]]]:
    from logos_ir import testing
    from logos_ir.author import write
    from logos_ir.program import Cut
    from logos_ir.spec import ModelSpec
    from logos_ir.tools import logos_compile

    folder = tmp_path_factory.mktemp("sweep")
    (folder / "decode.logos").write_text(write(ModelSpec.preset("tiny"), Cut.decode(64)).text)
    (folder / "afile").write_text("a file\n")
    (folder / "tok.gguf").write_bytes(testing.model_gguf(4, "F32", tokenizer=True))
    (folder / "hub").mkdir()
    assert logos_compile.main([*DECODE, "-o", str(folder / "build")]) == 0
    shutil.copytree(folder / "build", folder / "tampered")
    with (folder / "tampered" / "program.logos").open("a") as stream:
        stream.write("\n")
    shutil.copytree(folder / "build", folder / "outside")
    manifest = json.loads((folder / "outside" / "manifest.json").read_text())
    manifest["artifacts"][0]["path"] = "/etc/hostname"
    (folder / "outside" / "manifest.json").write_text(json.dumps(manifest))
    env = {"HF_HUB_CACHE": str(folder / "hub"), "HF_HUB_OFFLINE": "1"}

    def process(case: str) -> subprocess.CompletedProcess[str]:
        """As a user runs it: the installed tool in a fresh process."""
        command = CASES[case][0]
        argv = [tool(command[0])] + [arg.replace("{dir}", str(folder)) for arg in command[1:]]
        stdin = '%x = "nope"(' if case == "opt-bad-mlir-stdin" else ""
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=180, cwd=folder, env=dict(os.environ) | env
        )

    def in_process(case: str) -> subprocess.CompletedProcess[str]:
        """The tool's `main` in this process (what its entry point runs; an exception escaping it would be a
        traceback): a fraction of a process's start-up each."""
        command = CASES[case][0]
        argv = [arg.replace("{dir}", str(folder)) for arg in command[1:]]
        err = io.StringIO()
        saved = {key: os.environ.get(key) for key in env}
        here, old_stdin = os.getcwd(), sys.stdin
        os.environ.update(env)
        os.chdir(folder)
        sys.stdin = io.StringIO("")
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                try:
                    code = MAINS[command[0]]().main(argv)
                except SystemExit as exit:
                    code = exit.code if isinstance(exit.code, int) else 1
        finally:
            sys.stdin = old_stdin
            os.chdir(here)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return subprocess.CompletedProcess(command, code, "", err.getvalue())

    results = {case: in_process(case) for case in CASES if case not in IN_A_PROCESS}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results |= dict(zip(IN_A_PROCESS, pool.map(process, IN_A_PROCESS), strict=True))
    return folder, results


def _main(name: str):  # type: ignore[no-untyped-def]
    def load():  # type: ignore[no-untyped-def]
        import importlib

        return importlib.import_module(f"logos_ir.tools.{name}")

    return load


MAINS = {tool: _main(tool.replace("-", "_")) for tool in ("logos-opt", "logos-author", "logos-compile", "logos-run")}
# Run as real processes (the rest in this process): one per tool, standard input, an environment variable.
IN_A_PROCESS = ("opt-no-such-file", "opt-bad-mlir-stdin", "author-cut-too-large", "compile-output-through-a-file",
                "run-hub-id-not-cached", "run-embedded-cache-past-memory")  # fmt: skip


STYLE = re.compile(r"(logos-(opt|author|compile|run): error: |[^\s:][^\n]*:\d+:\d+: error: )")


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_argument_is_one_clear_error(sweep, case: str) -> None:  # type: ignore[no-untyped-def]
    folder, results = sweep
    done = results[case]
    err = done.stderr
    assert done.returncode in (1, 2), f"exit {done.returncode}:\n{err}"
    assert done.returncode != INTERNAL_ERROR and "internal error" not in err and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    message = [line for line in lines if not line.startswith(("usage:", " ", "hint:", "\t"))]
    assert message and STYLE.match(message[0]), f"not in the tools' style:\n{err}"
    assert len(message) == 1 or STYLE.match(message[0]) and not STYLE.match(message[1]), err  # one error
    for word in CASES[case][1]:
        word = word.replace("{dir}", str(folder))
        assert word in err, f"{word!r} not in:\n{err}"
    assert "{" not in message[0].replace("{dir}", "") or "cut-extract{" in message[0] or "{nope" in message[0], err
    assert "(the Hugging Face cache)" not in err and "Error)" not in err, err


def test_the_sweep_covers_every_tool() -> None:
    assert {command[0] for command, _ in CASES.values()} == {"logos-opt", "logos-author", "logos-compile", "logos-run"}


if __name__ == "__main__":  # show every message: python3 test/unit/test_argument_sweep.py
    import tempfile

    class _Factory:
        def mktemp(self, name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=name))

    _, shown = sweep.__wrapped__(_Factory())  # type: ignore[attr-defined]
    for name, result in shown.items():
        print(f"== {name} (exit {result.returncode})\n{result.stderr.strip()}")
