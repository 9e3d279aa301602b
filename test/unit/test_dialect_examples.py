"""Every ```mlir example in the docstrings of the modules in dialects/ (the module's docstring and each class's)
parses with logos-opt's context: the project's dialects and every dialect xDSL registers.

The rule an example follows, so that a short one can still be checked:
- An example that starts with `#` or `!` is one attribute or type, and nothing else.
- Any other example is a sequence of operations, as they would sit in one block. A value it uses without defining
  it is a value from around the example: it becomes an argument of that block, of the type the use gives it (the
  ops' own syntax types every operand). So `%q = logos.linear %normed, %w : (...) -> ...` checks on its own.
- A line that is only `...` stands for operations left out and is dropped. Nothing else is elided: `{...}`,
  `"5a1e..."` or a region left open do not parse, and each name is defined once per example.
The examples are parsed, not verified: a lone instruction outside the op that holds it is a fine example, but it
would not verify there.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.ir import Attribute, Block, Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError

DIALECTS = Path(__file__).resolve().parents[2] / "dialects"
EXAMPLE = re.compile(r"^\s*```mlir\n(.*?)^\s*```", re.S | re.M)


def examples(path: Path) -> list[tuple[str, str]]:
    """(where, text) for each ```mlir example in the docstrings of the module at `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owners: list[tuple[str, ast.Module | ast.ClassDef]] = [(path.stem, tree)]
    owners += [(f"{path.stem}.{node.name}", node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    found = []
    for where, node in owners:
        docstring = ast.get_docstring(node) or ""
        found += [(where, match.group(1)) for match in EXAMPLE.finditer(docstring)]
    return found


ALL = [example for path in sorted(DIALECTS.glob("*.py")) for example in examples(path)]


@cache
def context() -> Context:
    from logos_ir.tools.logos_opt import LogosOptMain

    return LogosOptMain(args=[]).ctx


def without_elisions(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.strip() != "...")


def parse_example(text: str) -> Attribute | list[Operation]:
    """The attribute, type or operations `text` holds, by the rule in this module's docstring."""
    source = without_elisions(text)
    parser = Parser(context(), source, "example")
    parsed: Attribute | list[Operation]
    if source.lstrip().startswith("#"):
        parsed = parser.parse_attribute()
    elif source.lstrip().startswith("!"):
        parsed = parser.parse_type()
    else:
        parsed = []
        while (op := parser.parse_optional_operation()) is not None:
            parsed.append(op)
        around_the_example(parser, parsed)
    if parser.pos != len(source):
        parser.raise_error("expected an operation or the end of the example")
    return parsed


def around_the_example(parser: Parser, ops: list[Operation]) -> Block:
    """A block holding `ops` whose arguments are the values they use and do not define."""
    around = Block()
    for references in parser.forward_ssa_references.values():
        for value in references.values():
            value.replace_all_uses_with(around.insert_arg(value.type, len(around.args)))
    around.add_ops(ops)
    return around


def test_the_examples_are_found() -> None:
    # The dialects with examples today; a module that loses all of its examples should say so here.
    assert {where.split(".")[0] for where, _ in ALL} >= {"logos", "d5005", "cuda"}
    assert sum(1 for where, _ in ALL if where.startswith("logos.")) >= 10


def test_the_rule_fills_in_values_from_around_the_example() -> None:
    [linear] = parse_example(
        "%q = logos.linear %normed, %w : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>"
    )  # type: ignore[misc]
    assert [str(operand.type) for operand in linear.operands] == ["tensor<1x64xf32>", "tensor<64x64xf32>"]
    with pytest.raises(ParseError):
        parse_example('logos.program cut "decode ctx=64" chips 1 digest "..." model {...} {\n  ...\n}')


@pytest.mark.parametrize(("where", "text"), ALL, ids=[f"{where}#{i}" for i, (where, _) in enumerate(ALL)])
def test_the_example_parses(where: str, text: str) -> None:
    try:
        parse_example(text)
    except ParseError as error:
        pytest.fail(f"the example in {where}'s docstring does not parse:\n{text}\n{error}")


def ops_of(path: Path) -> list[tuple[str, ast.ClassDef]]:
    """The op classes a dialect module defines: each class that sets `name` to an op's dotted name."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.ClassDef) or not node.name.endswith("Op"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "name" for target in statement.targets
            ):
                found.append((f"{path.stem}.{node.name}", node))
    return found


def test_every_op_has_an_example() -> None:
    """Each op's docstring shows its textual form (a dialect of one op may show it in the module's docstring)."""
    missing = []
    for path in sorted(DIALECTS.glob("*.py")):
        ops = ops_of(path)
        module_has_one = len(ops) == 1 and bool(EXAMPLE.search(ast.get_docstring(ast.parse(path.read_text())) or ""))
        missing += [w for w, node in ops if not EXAMPLE.search(ast.get_docstring(node) or "") and not module_has_one]
    assert missing == []
