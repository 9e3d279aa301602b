"""Upstream MLIR reads the `logos` modules: the generic form `logos-opt --mlir-print-op-generic` prints parses and
verifies in `iree-opt --allow-unregistered-dialect` (from `iree-base-compiler`, the `mlir` extra), the sections'
`func.call`s resolved by upstream's symbol rules (a program's body is a `builtin.module`), and the round trip
upstream -> `logos-opt` -> LOGOS gives back the program's text byte for byte, its identity checked: the values'
names travel as `NameLoc`s (`--mlir-print-debuginfo`), which upstream prints as SSA names under
`--mlir-use-nameloc-as-prefix`. Skipped with its reason where `iree-opt` is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

IREE_OPT = shutil.which("iree-opt")
FAMILIES = Path(__file__).parent / "families"
needs_iree = pytest.mark.skipif(
    IREE_OPT is None, reason="iree-opt is not installed (pip install 'logos-ir[mlir]': iree-base-compiler)"
)


def _run(argv: list[str], stdin: str) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr}"
    return done.stdout


def _author(model: str, cut: str, tp: int = 1) -> str:
    return _run(["logos-author", "--model", model, "--cut", cut, *(["--tp", str(tp)] if tp > 1 else [])], "")


def _upstream(mlir: str, *flags: str) -> str:
    """`mlir` read, verified and printed by upstream MLIR (generic form)."""
    assert IREE_OPT is not None
    return _run([IREE_OPT, "--allow-unregistered-dialect", "--mlir-print-op-generic", *flags, "-"], mlir)


def _generic(logos_text: str, *passes: str) -> str:
    pipeline = ["-p", ",".join(passes)] if passes else []
    return _run(["logos-opt", "-", "-f", "logos", *pipeline, "--mlir-print-op-generic", "--mlir-print-debuginfo"],
                logos_text)  # fmt: skip


PROGRAMS = [
    ("tiny", "decode ctx=64", 1),
    ("tiny", "prefill rows=4 ctx=64", 1),
    ("tiny", "batch rows=2 ctx=64", 2),
    ("tiny", "decode_layer layer=1 ctx=64", 1),
    ("llama-3.2-1b", "decode ctx=64", 2),  # Llama 3 rotary scaling, a chip grid, shard.all_reduce and all_gather
    (str(FAMILIES / "mistral"), "decode ctx=2", 1),  # a sliding window
]


@needs_iree
@pytest.mark.parametrize(("model", "cut", "tp"), PROGRAMS, ids=[f"{Path(m).name}-{c}-tp{t}" for m, c, t in PROGRAMS])
def test_upstream_reads_a_program_and_gives_back_its_text(model: str, cut: str, tp: int) -> None:
    text = _author(model, cut, tp)
    back = _upstream(_generic(text), "--mlir-use-nameloc-as-prefix")
    assert '"builtin.module"' in back and "loc(" not in back  # upstream's own print, names as SSA names
    assert _run(["logos-opt", "-", "-t", "logos", "--verify-identity"], back) == text


@needs_iree
def test_the_calls_resolve_upstream_without_the_names() -> None:
    """Without the debug info upstream still verifies the program (its calls resolve in the program's module); the
    names are lost, so the identity check refuses what comes back, naming the program."""
    text = _author("tiny", "decode ctx=64")
    plain = _run(["logos-opt", "-", "-f", "logos", "--mlir-print-op-generic"], text)
    back = _upstream(plain)
    assert "%0" in back and "%normed" not in back
    done = subprocess.run(["logos-opt", "-", "--verify-identity"], input=back, capture_output=True, text=True)
    assert done.returncode == 1 and "verify-identity: the IR records 'LOGOS program: decode step, ctx 64" in done.stderr


@needs_iree
@pytest.mark.parametrize(
    "passes",
    [('cut-extract{cut="decode_head"}',), ("extract-parts",), ("inline-sections",), ("tp-split{tp=2}",)],
    ids=["cut-extract", "extract-parts", "inline-sections", "tp-split"],
)
def test_upstream_verifies_the_middle_ends_output(passes: tuple[str, ...]) -> None:
    """Every stage of the middle end prints a module upstream verifies (each pass keeps the program's module)."""
    generic = _generic(_author("tiny", "decode ctx=64"), *passes)
    back = _upstream(generic, "--mlir-use-nameloc-as-prefix")
    assert back.count('"logos.program"') == generic.count('"logos.program"') >= 1
