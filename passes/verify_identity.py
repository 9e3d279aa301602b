"""`verify-identity`: refuse IR whose recorded identity no longer matches its own LOGOS text.

Assumes: a module holding `logos.program` ops. Guarantees: the IR is unchanged; each program's digest is the SHA-256
of its LOGOS print, else a diagnostic naming the recorded identity and the actual digest.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from logos_ir import identity
from logos_ir.errors import PassError


@dataclass(frozen=True)
class VerifyIdentity(ModulePass):
    """Checks that every program's digest is the SHA-256 of its own LOGOS print."""

    name = "verify-identity"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        found = identity.programs(op)
        if not found:
            raise PassError("verify-identity: the module holds no logos.program")
        for program in found:
            identity.check(program)
