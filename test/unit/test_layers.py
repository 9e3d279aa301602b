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
