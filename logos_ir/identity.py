"""The identity a program's IR records, and the check that it still holds.

A `logos.program` records its cut, its chips and the SHA-256 of its LOGOS text. A pass that makes a new program (a
cut, a split) restamps the digest from the IR's own LOGOS print; a pass that changes nothing the text shows keeps
it. `check` recomputes the digest and refuses IR whose recorded identity no longer matches its print, so IR that
was edited by hand, or by a pass that forgot to restamp, cannot pass for the program it names.
"""

from __future__ import annotations

import hashlib

from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Operation

from logos_ir.dialects import logos
from logos_ir.errors import LogosError, PassError
from logos_ir.program import Cut, Identity


def programs(root: Operation) -> list[logos.ProgramOp]:
    """The `logos.program` ops in `root` (itself, or the top-level ops of a module)."""
    if isinstance(root, logos.ProgramOp):
        return [root]
    if isinstance(root, ModuleOp):
        return [op for op in root.ops if isinstance(op, logos.ProgramOp)]
    return []


def the_program(module: ModuleOp, pass_name: str) -> logos.ProgramOp:
    """The one `logos.program` a pass works on, or a diagnostic naming the pass."""
    found = programs(module)
    if len(found) != 1:
        raise PassError(f"{pass_name}: expects one logos.program in the module, found {len(found)}")
    return found[0]


def digest_of(program: logos.ProgramOp) -> str:
    from logos_ir.printer import print_program

    return hashlib.sha256(print_program(program).encode("utf-8")).hexdigest()


def identity(program: logos.ProgramOp) -> Identity:
    """The identity a program records."""
    return Identity(Cut.parse(program.cut.data), program.chips.value.data, bytes.fromhex(program.digest.data))


def stamp(program: logos.ProgramOp, cut: Cut, chips: int) -> Identity:
    """Record `cut` and `chips` on `program` and the digest of its LOGOS print; return the new identity."""
    program.cut = StringAttr(cut.option())
    program.chips = IntegerAttr(chips, i64)
    program.digest = StringAttr(digest_of(program))
    return identity(program)


def check(program: logos.ProgramOp) -> Identity:
    """The program's identity, after checking that its digest is the SHA-256 of its own LOGOS print."""
    try:
        actual = digest_of(program)
    except LogosError as error:
        raise PassError(f"verify-identity: the program has no LOGOS print: {error.message}") from None
    if actual != program.digest.data:
        recorded = identity(program)
        raise PassError(
            f"verify-identity: the IR records '{recorded.line()}', but its LOGOS text hashes to sha256 {actual}",
            hint="the IR was changed after its identity was recorded; restamp it with the pass that changed it",
        )
    return identity(program)
