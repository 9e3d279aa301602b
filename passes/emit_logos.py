"""The `logos` target (`logos-opt -t logos`): each `logos.program` of the module printed as its LOGOS text, which
is byte for byte the author's text for its cut (so it needs no identity comment: its digest is its identity)."""

from __future__ import annotations

import dataclasses
from typing import IO, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException
from xdsl.utils.target import Target


@dataclasses.dataclass(frozen=True)
class LogosTarget(Target):
    """Prints each `logos.program` in the module as its LOGOS text."""

    name: ClassVar[str] = "logos"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        from logos_ir.identity import programs
        from logos_ir.printer import print_program

        found = programs(module)
        if not found:
            raise DiagnosticException("logos target: the module holds no logos.program")
        output.write("\n".join(print_program(p) for p in found))
