"""Determinism: the author, the printers and the passes give byte-identical output run to run and machine to
machine. The same runs are made in two fresh processes that differ in everything a machine may differ in
(PYTHONHASHSEED, locale, time zone, working folder, output folder) and their outputs compared byte for byte;
the author-to-optimizer pipeline also runs as a real shell pipe, `logos-author ... | logos-opt -f logos -p ...`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CUT = 'cut-extract{cut="decode_layer layer=1 ctx=64"}'
# (output file, tool, arguments); {out} is the output folder, which differs between the two processes.
RUNS: list[tuple[str, str, list[str]]] = [
    ("decode.logos", "author", ["--model", "tiny", "--cut", "decode ctx=64"]),
    ("decode-tp2.logos", "author", ["--model", "tiny", "--cut", "decode ctx=64", "--tp", "2"]),
    ("prefill.logos", "author", ["--model", "tiny", "--cut", "prefill rows=4 ctx=64"]),
    ("batch-layer-tp4.logos", "author", ["--model", "tiny-tp8", "--cut", "batch_layer layer=1 rows=2 ctx=16",
                                         "--tp", "4"]),
    ("llama-layer.logos", "author", ["--model", "llama-3.2-1b", "--cut", "decode_layer layer=3 ctx=128"]),
    ("smollm-head.logos", "author", ["--model", "smollm2-135m", "--cut", "forward_head"]),
    ("manifest.json", "author", ["--model", "tiny", "--cut", "decode ctx=64", "--manifest", "--dir", "weights"]),
    ("identity.txt", "author", ["--model", "tiny", "--cut", "decode ctx=64", "--tp", "2", "--identity"]),
    ("decode.mlir", "opt", ["{out}/decode.logos"]),
    ("decode-generic.mlir", "opt", ["{out}/decode.logos", "--print-op-generic"]),
    ("decode-again.logos", "opt", ["{out}/decode.mlir", "-t", "logos"]),
    ("cut.mlir", "opt", ["{out}/decode.logos", "-p", CUT]),
    ("cut.logos", "opt", ["{out}/decode.logos", "-p", CUT, "-t", "logos"]),
    ("tp2.mlir", "opt", ["{out}/decode.logos", "-p", "tp-split{tp=2}"]),
    ("tp2.logos", "opt", ["{out}/decode.logos", "-p", "tp-split{tp=2},verify-identity", "-t", "logos"]),
    ("tp2-from-mlir.mlir", "opt", ["{out}/tp2.mlir", "-p", "verify-identity"]),
    ("middle-end.logos", "opt", ["{out}/prefill.logos", "-p",
                                 'logos-middle-end{cut="prefill_layer layer=0 rows=4 ctx=64"}', "-t", "logos"]),
    ("cut-tp2.mlir", "opt", ["{out}/decode.logos", "-p", CUT + ",tp-split{tp=2}"]),
]  # fmt: skip

CHILD = """
import json, sys
from logos_ir.tools import logos_author, logos_opt
out, runs = sys.argv[1], json.loads(sys.argv[2])
for name, tool, argv in runs:
    main = logos_author.main if tool == "author" else logos_opt.main
    code = main([a.replace("{out}", out) for a in argv] + ["-o", out + "/" + name])
    if code:
        sys.exit(f"{name}: exit {code}")
"""

PIPE = "logos-author --model tiny --cut 'decode ctx=64' | logos-opt -f logos -p '%s' %s"

MACHINES = [
    {"PYTHONHASHSEED": "1", "LC_ALL": "C", "LANG": "C", "TZ": "UTC"},
    {"PYTHONHASHSEED": "4242", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "TZ": "Asia/Kolkata"},
]


def environment(machine: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "LC_ALL", "LANG", "TZ")}
    env.update(machine)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, bytes]]:
    """Each machine's outputs by name: the runs in one fresh process, and the shell pipes."""
    children = []
    for i, machine in enumerate(MACHINES):
        home = tmp_path_factory.mktemp(f"machine{i}") / ("deeper/" * i) / "work"
        out = home / "out"
        out.mkdir(parents=True)
        env = environment(machine)
        runs = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(out), json.dumps(RUNS)],
            cwd=home,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        pipes = {
            "pipe-cut.mlir": subprocess.Popen(
                ["bash", "-o", "pipefail", "-c", PIPE % (CUT, "")],
                cwd=home,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
            "pipe-tp2.logos": subprocess.Popen(
                ["bash", "-o", "pipefail", "-c", PIPE % ("tp-split{tp=2}", "-t logos")],
                cwd=home,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
        }
        children.append((out, runs, pipes))
    found = []
    for out, runs, pipes in children:
        _, err = runs.communicate(timeout=300)
        assert runs.returncode == 0, err.decode()[-3000:]
        files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
        for name, pipe in pipes.items():
            text, err = pipe.communicate(timeout=300)
            assert pipe.returncode == 0, err.decode()[-3000:]
            files[name] = text
        found.append(files)
    return found


def test_every_run_made_its_output(outputs):
    for files in outputs:
        assert sorted(files) == sorted([name for name, _, _ in RUNS] + ["pipe-cut.mlir", "pipe-tp2.logos"])
        assert all(files.values()), [name for name, data in files.items() if not data]


@pytest.mark.parametrize("name", [name for name, _, _ in RUNS] + ["pipe-cut.mlir", "pipe-tp2.logos"])
def test_output_is_byte_identical_across_processes(outputs, name):
    first, second = (files[name] for files in outputs)
    assert first == second, f"{name} differs between two runs"


def test_the_pipe_and_the_tools_in_process_agree(outputs):
    files = outputs[0]
    assert files["pipe-cut.mlir"] == files["cut.mlir"]
    assert files["pipe-tp2.logos"] == files["tp2.logos"]


def test_outputs_name_no_machine(outputs):
    """No output carries a path, a user or a host name: nothing of the machine it was made on."""
    for files in outputs:
        for name, data in files.items():
            host = os.uname().nodename.encode()
            for word in (b"/tmp", b"/home", b"/root", *([host] if len(host) >= 6 else [])):
                assert word not in data, f"{name} holds {word!r}"


def test_printing_and_parsing_round_trip(outputs):
    files = outputs[0]
    assert files["decode-again.logos"] == files["decode.logos"]
    assert files["tp2-from-mlir.mlir"] == files["tp2.mlir"]


def test_the_author_writes_what_it_wrote_on_another_machine(outputs):
    """Machine to machine: the program matches the golden file written elsewhere and kept in the repository."""
    golden = Path(__file__).parent / "golden" / "tiny_decode_ctx64.logos"
    assert golden.exists(), f"the golden program {golden} is missing: it is part of the repository"
    assert outputs[0]["decode.logos"] == golden.read_bytes()
