"""`cuda-fold-prefill-norms`: each RMS norm of several rows folded into the tensor-core products that read it.

    logos-opt step.mlir -p cuda-fold-prefill-norms

Assumes: the kernel level. Guarantees: each `cuda.rms_norm` of several rows (not a row pick) whose result is read
only by projections that run on tensor cores (`cuda.linear`, `cuda.gate_up` with bf16 weights), as their input x
while x and the norm's scale are unchanged, is erased: each of those products takes x and the scale (`epsilon`
set), computes its rows' inverse RMS and scales the A operand as it rounds it to bf16, so the norm's launch goes.
Decode steps keep `cuda-fold-norms`; f32 images (no tensor-core product) keep the norm kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from logos_ir.dialects import cuda
from logos_ir.passes.cuda.kernel_level import drop_unused_buffers, host_function, rebuilt, steps_after
from logos_ir.passes.cuda.tensor_core import handles

NAME = "cuda-fold-prefill-norms"


def _norm_readers(norm: cuda.RMSNormOp) -> list[Operation] | None:
    """The projections reading the norm until its buffer is rewritten, if all of them would run on tensor cores
    with the norm folded and read it only as x while x and the scale are unchanged (else None)."""
    (x, scale), (normed,) = norm.ins, norm.outs
    readers: list[Operation] = []
    changed = False
    for later in steps_after(norm):
        reads = normed in later.operands and (not isinstance(later, cuda.KernelOp) or normed in later.ins)
        if reads:
            if changed or not isinstance(later, cuda.LinearOp | cuda.GateUpOp) or later.epsilon is not None:
                return None
            if later.ins[0] != normed or normed in later.ins[1:] or x in later.outs or not handles(later):
                return None
            readers.append(later)
        if isinstance(later, cuda.KernelOp) and normed in later.outs:
            break
        changed = changed or (isinstance(later, cuda.KernelOp) and (x in later.outs or scale in later.outs))
    return readers or None


class FoldPrefillNorm(RewritePattern):
    """A `cuda.rms_norm` of several rows folded into the tensor-core products that read it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.RMSNormOp, rewriter: PatternRewriter) -> None:
        if op.row.value.data >= 0 or cuda.shape_of(op.ins[0].type)[0] < 2 or op.plus_one is not None:
            return
        readers = _norm_readers(op)
        if not readers:
            return
        x, scale = op.ins
        for reader in readers:
            assert isinstance(reader, cuda.LinearOp | cuda.GateUpOp)
            props = {**reader.properties, "epsilon": op.epsilon}
            rewriter.replace(reader, rebuilt(reader, [x, *reader.ins[1:], scale], list(reader.outs), props))
        rewriter.erase(op)


@dataclass(frozen=True)
class FoldPrefillNorms(ModulePass):
    """Folds each RMS norm of several rows into the tensor-core products that read it (see the module
    docstring)."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        PatternRewriteWalker(FoldPrefillNorm(), apply_recursively=False).rewrite_module(op)
        drop_unused_buffers(host)
