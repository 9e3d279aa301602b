"""`logos-opt --verify-diagnostics` as mlir-opt's: the `// expected-error {{...}}` comments of an input say which
diagnostics it must produce, and the run fails when one is not produced or one is produced that no comment expects.

A comment is `expected-error`, `expected-warning` or `expected-note`, optionally `@+N`, `@-N`, `@above`, `@below`
or `@N` (the line it is about, relative to the comment's line or absolute), then the text in `{{...}}` that the
diagnostic's message must contain. A diagnostic is matched by its kind, its line and its text; one with no line
(no location in the input) is matched by its kind and text alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_EXPECTED = re.compile(
    r"expected-(?P<kind>error|warning|note|remark)\s*(?:@(?P<where>[+-]\d+|above|below|\d+))?\s*\{\{(?P<text>.*?)\}\}"
)
_PLACED = re.compile(r"(?P<file>[^\n]*?):(?P<line>\d+):(?P<column>\d+): (?P<kind>error|warning|note|remark): ")


@dataclass(frozen=True)
class Expected:
    kind: str
    line: int  # the line the diagnostic must be on
    comment: tuple[int, int]  # the comment's line and column, where a mismatch is reported
    text: str


@dataclass(frozen=True)
class Produced:
    kind: str
    line: int | None
    message: str  # the whole diagnostic as the tool prints it


def expectations(text: str, line_offset: int = 0) -> list[Expected]:
    """The `expected-*` comments of one input (or chunk) whose first line is line `line_offset + 1`."""
    found = []
    for number, line in enumerate(text.split("\n"), start=line_offset + 1):
        if "//" not in line:
            continue
        comment = line.index("//")
        for match in _EXPECTED.finditer(line, comment):
            where = (number, match.start() + 1)
            found.append(Expected(match["kind"], _line(number, match["where"]), where, match["text"]))
    return found


def _line(number: int, where: str | None) -> int:
    if where is None:
        return number
    if where == "above":
        return number - 1
    if where == "below":
        return number + 1
    if where[0] in "+-":
        return number + int(where)
    return int(where)


def produced(diagnostic: str) -> Produced:
    """A diagnostic as the tools print it (`file:line:col: error: ...` or `tool: error: ...`)."""
    placed = _PLACED.match(diagnostic)
    if placed:
        return Produced(placed["kind"], int(placed["line"]), diagnostic)
    return Produced("error", None, diagnostic)


def mismatches(filename: str, expected: list[Expected], diagnostics: list[Produced]) -> list[str]:
    """What does not agree, as mlir-opt words it: each expectation not produced, each diagnostic not expected."""
    left = list(diagnostics)
    problems = []
    for want in expected:
        match = next((got for got in left if _matches(want, got)), None)
        if match is None:
            problems.append(
                f"{filename}:{want.comment[0]}:{want.comment[1]}: error: expected {want.kind} "
                f'"{want.text}" was not produced (on line {want.line})'
            )
        else:
            left.remove(match)
    for got in left:
        first = got.message.split("\n", 1)[0]
        problems.append(f"{first.replace(': error: ', ': error: unexpected error: ', 1)}")
    return problems


def _matches(want: Expected, got: Produced) -> bool:
    first_line = got.message.split("\n", 1)[0]
    return want.kind == got.kind and (got.line is None or got.line == want.line) and want.text in first_line
