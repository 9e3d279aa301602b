"""`cuda-fold-norms`: at batch 1, each RMS norm whose result only feeds projections is folded into their prologue.

    logos-opt step.mlir -p cuda-fold-norms

Assumes: the kernel level (`convert-logos-to-cuda-kernels`' output). Guarantees: each `cuda.rms_norm` of one row
(not a row pick) whose result is read only by `cuda.linear`, `cuda.gate_up` and `cuda.experts` ops (a mixture's
router projection and its experts' gate/up products) as their input x, while x and the norm's scale are not
rewritten, is erased; each of those reads x and the scale itself (`epsilon` set, the scale its last input): one
pass over x gives its dot products and the sum of squares, so the norm's launch and its buffer go. Norms of several
rows (prefill chunks, batches) and the prefill head's row pick stay kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from logos_ir.dialects import cuda
from logos_ir.passes.cuda.kernel_level import drop_unused_buffers, host_function, reads, rebuilt, steps_after, writes

NAME = "cuda-fold-norms"


_FOLDING = (cuda.LinearOp, cuda.GateUpOp, cuda.ExpertsOp)  # the kernels whose prologue may norm their x


def norm_readers(norm: cuda.RMSNormOp) -> list[cuda.LinearOp | cuda.GateUpOp | cuda.ExpertsOp] | None:
    """The projections that read the norm's result while its input and scale are unchanged, if they are its only
    readers (else None)."""
    if norm.row.value.data >= 0 or norm.plus_one is not None:  # a prologue scales by the weight itself
        return None
    x, scale = norm.ins
    (normed,) = norm.outs
    if cuda.shape_of(normed.type)[0] != 1:
        return None
    readers: list[cuda.LinearOp | cuda.GateUpOp | cuda.ExpertsOp] = []
    changed = False  # x or the scale rewritten since the norm
    for later in steps_after(norm):
        if normed in reads(later):
            if changed or not _plain_projection(later):
                return None
            assert isinstance(later, _FOLDING)
            if later.ins[0] != normed or normed in later.ins[1:] or x in later.outs:
                return None
            readers.append(later)
        if normed in writes(later):
            break
        changed = changed or x in writes(later) or scale in writes(later)
    return readers or None


def _plain_projection(op: Operation) -> bool:
    return isinstance(op, _FOLDING) and op.epsilon is None


class FoldNorm(RewritePattern):
    """A one-row `cuda.rms_norm` folded into the projections that read it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.RMSNormOp, rewriter: PatternRewriter) -> None:
        readers = norm_readers(op)
        if readers is None:
            return
        x, scale = op.ins
        for reader in readers:
            props = {**reader.properties, "epsilon": op.epsilon}
            rewriter.replace(reader, rebuilt(reader, [x, *reader.ins[1:], scale], list(reader.outs), props))
        rewriter.erase(op)


@dataclass(frozen=True)
class FoldNorms(ModulePass):
    """Folds each one-row RMS norm into the projections that read it (see the module docstring)."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        PatternRewriteWalker(FoldNorm(), apply_recursively=False).rewrite_module(op)
        drop_unused_buffers(host)
