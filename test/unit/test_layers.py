"""The layers of logos-ir import one way: spec -> program -> author/printer -> parser -> passes -> lanes -> tools.

Every import of a logos-ir module by another counts, at the top of a file or inside a function, so a lazy import
cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "logos_ir": "logos_ir",
    "logos_ir.dialects": "dialects",
    "logos_ir.passes": "passes",
    "logos_ir.tools": "tools",
}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for file in (ROOT / folder).rglob("*.py"):
            parts = [p for p in file.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = file
    return found


def imports() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, file in known.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("logos_ir"):
                out |= {m for m in [node.module, *(f"{node.module}.{a.name}" for a in node.names)] if m in known}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in known}
        graph[name] = out - {name}
    return graph


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_module_imports_itself_through_others() -> None:
    graph = imports()
    cycles = sorted(name for name in graph if name in reach(graph, name))
    assert cycles == []


def test_each_layer_imports_only_those_below_it() -> None:
    graph = imports()
    assert reach(graph, "logos_ir.program") <= {"logos_ir.errors"}
    assert "logos_ir.parser" not in reach(graph, "logos_ir.author")
    assert not {"logos_ir.author", "logos_ir.parser"} & reach(graph, "logos_ir.printer")
    below_tools = [name for name in graph if not name.startswith("logos_ir.tools")]
    assert [name for name in below_tools if any(m.startswith("logos_ir.tools") for m in graph[name])] == []


# -- the arrows CONVENTIONS.md draws -------------------------------------------------------------------------

LANES = ("cuda", "d5005", "spatial")
FRONT_END = {"logos_ir.author", "logos_ir.parser", "logos_ir.build"}


def lane_of(name: str) -> str | None:
    """The lane a module belongs to (its passes, its runtime or its dialect), or None for the shared layers."""
    parts = name.split(".")
    if parts[1:2] in (["passes"], ["runtime"]) and len(parts) > 2 and parts[2] in LANES:
        return parts[2]
    dialect_of = {"cuda": "cuda", "d5005": "d5005", "csl_ext": "spatial", "spatial": "spatial"}
    if parts[1:2] == ["dialects"] and len(parts) > 2:
        return dialect_of.get(parts[2])
    return None


def is_lane_build(name: str) -> bool:
    """A lane's `build` module: the entry `logos-compile` calls, which writes the program it lowers."""
    parts = name.split(".")
    return parts[1:2] == ["passes"] and len(parts) == 4 and parts[2] in LANES and parts[3] == "build"


def test_passes_never_import_the_author_the_parser_or_the_build() -> None:
    graph = imports()
    passes = [n for n in graph if n.startswith("logos_ir.passes") and not is_lane_build(n)]
    found = {n: sorted(graph[n] & FRONT_END) for n in passes if graph[n] & FRONT_END}
    assert found == {}, f"passes that reach back to the front end: {found}"


def test_no_lane_imports_another() -> None:
    graph = imports()
    found = {
        name: sorted(m for m in out if lane_of(m) not in (None, lane_of(name)))
        for name, out in graph.items()
        if lane_of(name) is not None
    }
    assert {n: m for n, m in found.items() if m} == {}


# What a runtime may import from the passes: the lane's build entry (to build in memory, as `logos-compile` would),
# and the readers of what a build folder holds, each named with the artifact it reads.
BUILD_READERS = {
    "logos_ir.passes.cuda.host_plan": "step.mlir's host function, read into the plan of buffers and launches",
    "logos_ir.passes.spatial.verify_grid": "layout.csl's meaning (read_layout): each element's routes and colours",
    "logos_ir.passes.spatial.grid": "host.json's plan (GridPlan.of) and how the weights are tiled over the grid",
}


def test_runtimes_never_import_a_lowering() -> None:
    """A runtime runs its build's artifacts: from the passes it imports only the lane's build entry and the readers of
    a build's artifacts (`BUILD_READERS`), never a level of the lowering."""
    graph = imports()
    runtimes = [n for n in graph if n.startswith("logos_ir.runtime")]
    found = {}
    for name in runtimes:
        reached = sorted(
            m
            for m in graph[name]
            if m.startswith("logos_ir.passes")
            and not is_lane_build(m)
            and m not in BUILD_READERS
            and m not in ("logos_ir.passes", "logos_ir.passes.cuda", "logos_ir.passes.spatial", "logos_ir.passes.d5005")
        )
        if reached:
            found[name] = reached
    assert found == {}, f"runtimes that import a level of the lowering: {found}"


def test_the_build_readers_read_no_lowering() -> None:
    """The readers a runtime may import reach no level of the lowering themselves (an emitter, which prints what
    the build holds, is no level)."""
    graph = imports()
    for reader in BUILD_READERS:
        lowering = {
            m
            for m in reach(graph, reader)
            if m.startswith("logos_ir.passes") and m not in BUILD_READERS and not m.split(".")[-1].startswith("emit")
        }
        lowering -= {"logos_ir.passes", "logos_ir.passes.cuda", "logos_ir.passes.spatial"}
        assert lowering == set(), f"{reader} reaches {sorted(lowering)}"
