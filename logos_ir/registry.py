"""The one place where logos-ir's dialects, passes, pipelines and targets are registered.

Everything is imported lazily (each entry is a function returning the class), so `logos-opt --help` and the other
tools start without importing every pass. `logos-opt` reads this registry; so do the lanes that add their passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.ir import Dialect
from xdsl.passes import ModulePass


def _logos_dialect() -> Dialect:
    from logos_ir.dialects.logos import LOGOS

    return LOGOS


def dialects() -> dict[str, Callable[[], Dialect]]:
    """The project's own dialects (xDSL's are registered by `logos-opt` from xDSL's universe)."""
    return {"logos": _logos_dialect}


def _cut_extract() -> type[ModulePass]:
    from logos_ir.passes.cut_extract import CutExtract

    return CutExtract


def _tp_split() -> type[ModulePass]:
    from logos_ir.passes.tp_split import TpSplit

    return TpSplit


def _verify_identity() -> type[ModulePass]:
    from logos_ir.passes.verify_identity import VerifyIdentity

    return VerifyIdentity


def passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """logos-ir's passes by their kebab-case names."""
    return {
        "cut-extract": _cut_extract,
        "tp-split": _tp_split,
        "verify-identity": _verify_identity,
    }


@dataclass(frozen=True)
class Pipeline:
    """A named pipeline: a list of passes, each given some of the pipeline's options. `stages` maps the pipeline's
    options to the pass specs (`name{opt=value}`) it runs, so `logos-opt -p name{...}` runs a whole stage."""

    name: str
    description: str
    options: tuple[str, ...]
    stages: Callable[[dict[str, str]], list[str]]  # the options' plain values -> pass specs


def quoted(value: str) -> str:
    """An option value in xDSL's pipeline syntax: a string in double quotes."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _middle_end(options: dict[str, str]) -> list[str]:
    stages = []
    if "cut" in options:
        stages.append(f"cut-extract{{cut={quoted(options['cut'])}}}")
    if "tp" in options:
        stages.append(f"tp-split{{tp={options['tp']}}}")
    stages.append("verify-identity")
    return stages


def pipelines() -> dict[str, Pipeline]:
    """Named pipelines. The lanes (`logos-to-cuda`, `logos-to-d5005`, `logos-to-spatial`) add theirs here."""
    return {
        "logos-middle-end": Pipeline(
            "logos-middle-end",
            'cut extraction (option cut="..."), then tensor-parallel splitting (option tp=N), then the identity check',
            ("cut", "tp"),
            _middle_end,
        ),
    }
