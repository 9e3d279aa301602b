"""Compile once, run the build folder: `logos-compile --target T -o DIR` then `logos-run DIR` for every target (the
CUDA lane with --emulate), with the reference's tokens; a tampered build, or one whose manifest names a path outside
it, is refused before anything runs; the command logos-compile prints runs what it built; build folders and outputs
get the permissions the umask gives."""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import pytest

from logos_ir.generate import Generator
from logos_ir.tools import logos_author, logos_compile, logos_opt, logos_run
from logos_ir.weights import open_model

PROMPT = [3, 17, 42]
NEW = 4


@pytest.fixture(scope="module")
def expected() -> list[int]:
    return Generator(open_model("tiny"), ctx=64).generate(PROMPT, NEW)


def compile_(folder: Path, target: str, *extra: str) -> list[str]:
    return ["--model", "tiny", "--target", target, "--cut", "decode ctx=64", *extra, "-o", str(folder)]


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    code = logos_run.main([*argv, "--json", "-n", str(NEW), "--prompt-ids", ",".join(map(str, PROMPT))])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("target", "build_flags", "run_flags"),
    [
        ("logos", [], []),
        ("cuda", ["--weights", "f32"], ["--emulate"]),
        ("d5005", ["--weights", "f32", "--with-weights"], []),
        ("spatial", ["--weights", "f32"], []),
    ],
)
def test_compile_then_run_the_folder(tmp_path, capsys, expected, target, build_flags, run_flags) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / target
    assert logos_compile.main(compile_(folder, target, *build_flags)) == 0
    printed = capsys.readouterr().out
    command = next(line.split("run it with: ", 1)[1] for line in printed.splitlines() if "run it with: " in line)
    words = shlex.split(command)
    assert words[:2] == ["logos-run", str(folder)] and words[2:] == run_flags
    report = run_json(capsys, *words[1:])
    assert report["build"] == str(folder) and report["ctx"] == 64
    assert report["new_ids"] == expected


def test_a_d5005_build_without_weights_prints_a_command_that_runs(tmp_path, capsys, expected) -> None:  # type: ignore[no-untyped-def]
    """The D5005 backend runs the folder's weight image, which a build without --with-weights lacks: the printed
    command rebuilds it with the image, then runs it (a bare `logos-run DIR` is refused)."""
    folder = tmp_path / "d5005"
    assert logos_compile.main(compile_(folder, "d5005", "--weights", "f32")) == 0
    printed = capsys.readouterr().out
    command = next(line.split("run it with: ", 1)[1] for line in printed.splitlines() if "run it with: " in line)
    rebuild, run = (shlex.split(part) for part in command.split(" && "))
    assert rebuild[0] == "logos-compile" and "--with-weights" in rebuild and run == ["logos-run", str(folder)]
    assert logos_run.main([*run[1:], "--prompt-ids", "1"]) == 1  # as built: refused, the image missing
    assert "weights.bin" in capsys.readouterr().err
    assert logos_compile.main(rebuild[1:]) == 0
    capsys.readouterr()
    report = run_json(capsys, *run[1:])
    assert report["new_ids"] == expected


def test_a_logos_build_runs_its_own_program(tmp_path, capsys, expected) -> None:  # type: ignore[no-untyped-def]
    """The logos target's run reads program.logos from the folder: a split build runs split (its identity says
    so), and gives the same tokens."""
    folder = tmp_path / "tp2"
    assert logos_compile.main(compile_(folder, "logos", "--tp", "2")) == 0
    capsys.readouterr()
    report = run_json(capsys, str(folder))
    assert report["new_ids"] == expected and report["tp"] == 2
    assert report["programs"] == [f"LOGOS program: decode step, ctx 64 over 2 chips, sha256 {_digest(folder)}"]


def _digest(folder: Path) -> str:
    import hashlib

    return hashlib.sha256((folder / "program.logos").read_bytes()).hexdigest()


def test_a_tampered_build_is_refused_before_it_runs(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "build"
    assert logos_compile.main(compile_(folder, "logos")) == 0
    capsys.readouterr()
    program = folder / "program.logos"
    program.write_text(program.read_text().replace("Return", "Return ", 1))
    assert logos_run.main([str(folder), "--prompt-ids", "1"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "does not match its manifest" in err and "program.logos" in err
    (folder / "extra.txt").write_text("x")
    program.unlink()
    assert logos_run.main([str(folder), "--prompt-ids", "1"]) == 1
    assert "missing: program.logos" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["/etc/hostname", "../outside.logos", "parts/../../outside.logos", "link.logos"])
def test_a_manifest_path_outside_the_folder_is_refused(tmp_path, capsys, path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "build"
    assert logos_compile.main(compile_(folder, "logos")) == 0
    (tmp_path / "outside.logos").write_text("outside\n")
    os.symlink(tmp_path / "outside.logos", folder / "link.logos")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["artifacts"][0]["path"] = path
    (folder / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert logos_compile.main(["--check", str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"'{path}'" in err and ("not a plain relative path" in err or "outside the folder" in err)
    assert logos_run.main([str(folder), "--prompt-ids", "1"]) == 1
    assert f"'{path}'" in capsys.readouterr().err


@pytest.fixture
def umask_022():  # type: ignore[no-untyped-def]
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_outputs_and_build_folders_get_the_umasks_permissions(tmp_path, capsys, umask_022) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "build"
    assert logos_compile.main(compile_(folder, "logos")) == 0
    assert mode(folder) == 0o755 and mode(folder / "parts") == 0o755
    assert mode(folder / "manifest.json") == 0o644 and mode(folder / "parts" / "head.logos") == 0o644
    text = tmp_path / "decode.logos"
    assert logos_author.main(["--model", "tiny", "-o", str(text)]) == 0
    assert mode(text) == 0o644
    assert logos_opt.main([str(text), "-o", str(tmp_path / "decode.mlir")]) == 0
    assert mode(tmp_path / "decode.mlir") == 0o644
    os.umask(0o077)  # a stricter umask is honoured as well
    assert logos_author.main(["--model", "tiny", "-o", str(tmp_path / "private.logos")]) == 0
    assert logos_compile.main(compile_(tmp_path / "private", "logos")) == 0
    assert mode(tmp_path / "private.logos") == 0o600 and mode(tmp_path / "private") == 0o700
    capsys.readouterr()
