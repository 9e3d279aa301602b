"""`extract-parts`: a whole program replaced by its parts (its embedding, each layer, its head), for a lane that
lowers a program part by part.

    logos-opt decode.logos -p 'verify-identity,extract-parts' -t logos

Assumes: a module holding exactly one `logos.program` of a whole cut (`decode`, `batch`, `prefill`, `forward`) in the
author's form, as `cut-extract` assumes. Guarantees: the program is replaced by its parts in model order, each a
sibling `logos.program` exactly as `cut-extract` makes it (only the sections the part needs, its @main as the author
writes it for the part, its identity stamped: the part's cut, the program's chips, the digest of its own LOGOS
print); a prefill chunk and a forward have no embedding part. Every refusal (a part of a program, a program that
`cut-extract` refuses to cut) is a `PassError` raised before the module is changed: every part is made beside the
whole and swapped in only when all are.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from logos_ir import identity
from logos_ir.dialects import logos
from logos_ir.errors import CutError, PassError
from logos_ir.passes.cut_extract import NAME as CUT_EXTRACT
from logos_ir.passes.cut_extract import extract
from logos_ir.program import Cut

NAME = "extract-parts"


@dataclass(frozen=True)
class ExtractParts(ModulePass):
    """Replaces the module's whole program by its parts, each a `logos.program` with its own identity. The module's
    docstring says what it assumes and guarantees."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        program = identity.the_program(op, NAME)
        try:
            whole = Cut.parse(program.cut.data)
        except CutError as error:
            raise PassError(f"{NAME}: the program's cut '{program.cut.data}' cannot be read: {error.message}") from None
        if whole.kind not in Cut.WHOLE:
            raise PassError(
                f"{NAME}: the program is the {whole} ('{whole.option()}'), a part already, not a whole program",
                hint="give the whole program (logos-author --cut 'decode ctx=N')",
            )
        parts = [_extracted(program, cut) for cut in whole.parts(program.spec.layers)]
        block = program.parent_block()
        assert block is not None
        for part in parts:
            block.insert_op_before(part, program)
        block.erase_op(program)


def _extracted(program: logos.ProgramOp, cut: Cut) -> logos.ProgramOp:
    """The part `cut` of `program`, as `cut-extract` makes it; its refusal restated as this pass's."""
    try:
        return extract(program, cut)
    except PassError as error:
        reason = error.message.removeprefix(f"{CUT_EXTRACT}: ")
        raise PassError(f"{NAME}: {reason}", hint=error.hint) from None
