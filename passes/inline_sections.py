"""`inline-sections`: every section `@main` calls, inlined into `@main`; the lanes lower one straight-line body.

Assumes: a module holding `logos.program` ops whose `@main` calls its sections (`@embedding`, `@layer_<n>`,
`@head`) with `func.call`, as the author writes them. Guarantees: in each program, every `func.call` in `@main` is
replaced by a copy of the called section's body (its arguments replaced by the call's operands, the call's results
by the values the section returns), and the sections no call names any more are erased. The program op keeps its
cut, chips, digest and model: its identity is still that of the text it was written as (checked by
`verify-identity`, which runs first), though it no longer prints back to that text, as with any lowering. A call
to a section the program does not have is refused, naming the pass and the callee, and the IR is left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from logos_ir.dialects import logos
from logos_ir.errors import PassError

PASS = "inline-sections"


def _program_of(call: func.CallOp) -> logos.ProgramOp | None:
    """The program whose `@main` holds `call`, or None when the call is elsewhere."""
    caller = call.parent_op()
    module = caller.parent_op() if caller is not None else None
    program = module.parent_op() if module is not None else None
    if not isinstance(caller, func.FuncOp) or caller.sym_name.data != "main":
        return None
    return program if isinstance(program, logos.ProgramOp) and program.module is module else None


class InlineSectionCall(RewritePattern):
    """A `func.call` in `@main` replaced by a copy of the section it calls."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: func.CallOp, rewriter: PatternRewriter) -> None:
        program = _program_of(op)
        if program is None:
            return
        section = program.function(op.callee.root_reference.data)
        assert section is not None  # checked by the pass before any rewrite
        body = section.body.clone().block
        ret = body.last_op
        assert isinstance(ret, func.ReturnOp)
        returned = list(ret.arguments)
        rewriter.erase(ret, safe_erase=False)
        rewriter.inline_block(body, InsertPoint.before(op), op.arguments)
        rewriter.replace(op, [], returned)


def _check_calls(program: logos.ProgramOp) -> None:
    main = program.function("main")
    assert main is not None  # the program op's verifier requires it
    for op in main.body.block.ops:
        if isinstance(op, func.CallOp) and program.function(op.callee.root_reference.data) is None:
            raise PassError(f"{PASS}: @main calls @{op.callee.root_reference.data}, which the program does not have")


def _erase_uncalled_sections(program: logos.ProgramOp) -> None:
    called = {op.callee.root_reference.data for op in program.walk() if isinstance(op, func.CallOp)}
    for op in list(program.block.ops):
        if isinstance(op, func.FuncOp) and op.sym_name.data != "main" and op.sym_name.data not in called:
            program.block.erase_op(op)


@dataclass(frozen=True)
class InlineSections(ModulePass):
    """Inlines the sections `@main` calls into `@main`, in every program of the module."""

    name = PASS

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        programs = [p for p in op.ops if isinstance(p, logos.ProgramOp)]
        if not programs:
            raise PassError(f"{PASS}: the module holds no logos.program")
        for program in programs:
            _check_calls(program)
        PatternRewriteWalker(InlineSectionCall(), apply_recursively=False).rewrite_module(op)
        for program in programs:
            _erase_uncalled_sections(program)
