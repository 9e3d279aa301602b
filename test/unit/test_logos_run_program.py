"""`logos-run PROGRAM.logos --model M`: a hand-written LOGOS program (a whole decode step) runs on the reference
backend with the model's weights. The author's own program gives the tokens `logos-run --model M` gives; an edited
one is said to differ on standard error and still runs, and is refused with --strict; a program of another cut, or
an option the program fixes given otherwise, is refused with one error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logos_ir.tools import logos_author, logos_run

PROMPT = "3,17,42"
NEW = "4"


def _author(folder: Path, cut: str, *extra: str) -> Path:
    path = folder / "program.logos"
    assert logos_author.main(["--model", "tiny", "--cut", cut, *extra, "-o", str(path)]) == 0
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict | None, str]:  # type: ignore[type-arg]
    code = logos_run.main([*argv, "--model", "tiny", "--json", "-n", NEW, "--prompt-ids", PROMPT])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, json.loads(lines[-1]) if code == 0 and lines else None, err


@pytest.mark.parametrize("tp", [1, 2])
def test_the_authors_program_gives_the_models_tokens(tmp_path, capsys, tp) -> None:  # type: ignore[no-untyped-def]
    code, reference, err = _run(capsys)
    assert code == 0, err
    path = _author(tmp_path, "decode ctx=64", "--tp", str(tp))
    capsys.readouterr()
    code, report, err = _run(capsys, str(path))
    assert code == 0, err
    assert "warning" not in err
    assert report is not None and reference is not None
    assert report["new_ids"] == reference["new_ids"] and report["ctx"] == 64 and report["tp"] == tp
    over = "" if tp == 1 else f" over {tp} chips"
    assert report["programs"][0].startswith(f"LOGOS program: decode step, ctx 64{over}, sha256 ")


def test_an_edited_program_warns_and_runs_and_strict_refuses_it(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _author(tmp_path, "decode ctx=64")
    text = path.read_text(encoding="utf-8")
    assert "The RMS norm epsilon is 1e-05." in text
    path.write_text(text.replace("The RMS norm epsilon is 1e-05.", "The RMS norm epsilon is 100.0."), encoding="utf-8")
    capsys.readouterr()
    code, report, err = _run(capsys, str(path))
    assert code == 0, err
    assert f"logos-run: warning: {path}: not the program the author writes for the model tiny" in err
    assert report is not None and len(report["new_ids"]) == int(NEW)
    code, report, err = _run(capsys, str(path), "--strict")
    assert code == 1 and report is None
    assert f"logos-run: error: {path}: not the program the author writes" in err and "refused (--strict)" in err
    assert "Traceback" not in err


def test_a_program_of_another_cut_is_refused(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _author(tmp_path, "prefill rows=4 ctx=64")
    capsys.readouterr()
    code, report, err = _run(capsys, str(path))
    assert code == 1 and report is None
    errors = [line for line in err.splitlines() if "error:" in line]
    assert errors == [
        f"logos-run: error: {path}: a program of 'prefill rows=4 ctx=64' is not a whole decode step: logos-run runs "
        "a program of 'decode ctx=N'"
    ]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--ctx", "32"], "the program fixes --ctx 64, not 32"),
        (["--tp", "2"], "the program fixes --tp 1, not 2"),
        (["--backend", "cuda"], "a LOGOS program runs on the reference backend, not cuda"),
    ],
)
def test_what_the_program_fixes_is_refused_when_it_differs(tmp_path, capsys, flags, said) -> None:  # type: ignore[no-untyped-def]
    path = _author(tmp_path, "decode ctx=64")
    capsys.readouterr()
    code, _, err = _run(capsys, str(path), *flags)
    assert code == 1 and f"logos-run: error: {path}: {said}" in err
