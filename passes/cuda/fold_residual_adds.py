"""`cuda-fold-residual-adds`: each residual add folded into the projection whose result it adds.

    logos-opt step.mlir -p cuda-fold-residual-adds

Assumes: the kernel level (`convert-logos-to-cuda-kernels`' output), split over chips or not. Guarantees:
- each `cuda.add(h, p)` right after the plain `cuda.linear` writing p, where no later step reads p before it is
  written again, is erased: the projection adds h (its third input) and writes the add's result itself, so the
  add's launch and p's buffer go;
- each `cuda.add` of a residual h and an all-reduce of p that directly follows the plain `cuda.linear` writing p
  (`add(h, all_reduce(p))`) is erased: the projection adds h on chip 0 alone (`residual_chip = 0`, reading the
  host's `chip` table, added after the other buffers), so the all-reduce itself completes the residual stream; a
  row-parallel projection's bias added after the all-reduce (`add(h, bias_add(all_reduce(p), b))`, the biased sum
  read by the add alone) goes with h: both added on chip 0 in the partial sum, and the bias add's launch goes. Later
  kernels that read the add's result read the reduced buffer instead, where that is safe (p not rewritten while
  they read it, and no all-reduce of the result).
A mixture of experts (`cuda.experts`) takes the same two folds into its sum: `add(h, experts(...))` adds h in the
sum kernel; `add(h, all_reduce(experts(...)))` adds h on chip 0 in a split step's partial sum.
A plain projection is one with no residual and no norm folded into it yet; its bias (`biased`), if any, stays in its
epilogue, added before the residual (on chip 0 alone in a partial sum, as the residual is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, MemRefType, ModuleOp, UnitAttr, i64
from xdsl.dialects.shard import AllReduceOp
from xdsl.ir import Attribute, Operation, SSAValue, Use
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from logos_ir.dialects import cuda
from logos_ir.passes.cuda.kernel_level import (
    buffer,
    drop_unused_buffers,
    host_function,
    previous_step,
    reads,
    steps_after,
    writes,
)

NAME = "cuda-fold-residual-adds"


def _readers_until_rewritten(add: cuda.AddOp, summed: SSAValue) -> list[Operation] | None:
    """The steps after `add` up to the last that may read `summed` before it is written again; None when an
    all-reduce reads it (its readers must stay on the buffer)."""
    steps: list[Operation] = []
    end = 0
    for step in steps_after(add):
        steps.append(step)
        if isinstance(step, AllReduceOp) and step.input == summed:
            return None
        if summed in reads(step):
            end = len(steps)
        if summed in writes(step):
            break
    return steps[:end]


def _read_again(add: cuda.AddOp, value: SSAValue) -> bool:
    """Whether a step after `add` reads `value` before a step writes it again."""
    for step in steps_after(add):
        if value in reads(step):
            return True
        if value in writes(step):
            return False
    return False


class FoldResidualAdd(RewritePattern):
    """`add(h, linear(x, w))` as `linear(x, w, h)`, and `add(h, all_reduce(linear(x, w)))` as
    `all_reduce(linear(x, w, h, chip))`, h added on chip 0."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.AddOp, rewriter: PatternRewriter) -> None:
        last = previous_step(op)
        if _plain_linear(last):
            self._into_projection(op, cast(cuda.LinearOp, last), rewriter)
        elif _plain_experts(last):
            self._into_mixture(op, cast(cuda.ExpertsOp, last), rewriter)
        elif _plain_experts(previous_step(last) if isinstance(last, AllReduceOp) else None):
            self._into_mixtures_partial_sum(op, rewriter)
        else:
            self._into_partial_sum(op, rewriter)

    @staticmethod
    def _into_mixture(op: cuda.AddOp, experts: cuda.ExpertsOp, rewriter: PatternRewriter) -> None:
        """`add(h, experts(...))` as the mixture's sum adding h (`residual`), writing the add's result."""
        residual, mixed = op.ins
        result = experts.outs[0]
        if mixed != result or residual == result or _read_again(op, result) or residual in experts.outs:
            return
        rewriter.replace(experts, _with_residual(experts, residual, [op.outs[0], *experts.outs[1:]], None))
        rewriter.erase(op)

    @staticmethod
    def _into_mixtures_partial_sum(op: cuda.AddOp, rewriter: PatternRewriter) -> None:
        """`add(h, all_reduce(experts(...)))` as `all_reduce(experts(..., h))`, h added on chip 0 in the partial
        sum, as a row-parallel projection's (`_into_partial_sum`)."""
        reduce = previous_step(op)
        experts = previous_step(reduce) if reduce is not None else None
        assert isinstance(reduce, AllReduceOp) and isinstance(experts, cuda.ExpertsOp)
        partial_sum = experts.outs[0]
        if reduce.input != partial_sum or reduce.result not in op.ins or not experts.split():
            return
        residual = op.ins[0] if op.ins[1] == reduce.result else op.ins[1]
        (summed,) = op.outs
        readers = _readers_until_rewritten(op, summed)
        if readers is None or any(partial_sum in writes(s) for s in readers) or residual in experts.outs:
            return
        rewriter.replace(experts, _with_residual(experts, residual, list(experts.outs), 0))
        kernels = {id(s) for s in readers if isinstance(s, cuda.KernelOp)}
        rewriter.replace_uses_with_if(summed, reduce.result, lambda use: _reads_as_input(use, kernels))
        rewriter.erase(op)

    @staticmethod
    def _into_projection(op: cuda.AddOp, linear: cuda.LinearOp, rewriter: PatternRewriter) -> None:
        residual, projected = op.ins
        (result,) = linear.outs
        if projected != result or residual == result or _read_again(op, result):
            return
        x, weight, *bias = linear.ins
        rewriter.replace(linear, cuda.LinearOp([x, weight, residual, *bias], list(op.outs), _biased(linear)))
        rewriter.erase(op)

    @staticmethod
    def _into_partial_sum(op: cuda.AddOp, rewriter: PatternRewriter) -> None:
        reduce = previous_step(op)
        bias_add = None
        if isinstance(reduce, cuda.BiasAddOp):  # add(h, bias_add(all_reduce(p), b)): the bias joins the residual
            bias_add, reduce = reduce, previous_step(reduce)
        linear = previous_step(reduce) if reduce is not None else None
        if not isinstance(reduce, AllReduceOp) or not _plain_linear(linear):
            return
        assert isinstance(linear, cuda.LinearOp)
        (partial_sum,) = linear.outs
        summand = reduce.result if bias_add is None else bias_add.outs[0]
        if reduce.input != partial_sum or summand not in op.ins:
            return
        if bias_add is not None and (
            linear.biased is not None or bias_add.ins[0] != reduce.result or _read_again(op, summand)
        ):
            return
        residual = op.ins[0] if op.ins[1] == summand else op.ins[1]
        (summed,) = op.outs
        readers = _readers_until_rewritten(op, summed)
        if readers is None or any(partial_sum in writes(s) for s in readers):
            return
        host = op.parent_op()
        chip = buffer(rewriter, host, "chip", "table", MemRefType(i64, [1]))  # type: ignore[arg-type]
        props = {"residual_chip": IntegerAttr(0, i64), **_biased(linear)}
        x, weight, *bias = linear.ins
        if bias_add is not None:
            props["biased"] = UnitAttr()
            bias = [bias_add.ins[1]]
        rewriter.replace(linear, cuda.LinearOp([x, weight, residual, chip, *bias], list(linear.outs), props))
        kernels = {id(s) for s in readers if isinstance(s, cuda.KernelOp)}
        rewriter.replace_uses_with_if(summed, reduce.result, lambda use: _reads_as_input(use, kernels))
        rewriter.erase(op)
        if bias_add is not None:
            rewriter.erase(bias_add)


def _plain_linear(op: Operation | None) -> bool:
    """A projection with no residual and no norm folded into it yet (its bias, if any, in its epilogue)."""
    if not isinstance(op, cuda.LinearOp) or op.epsilon is not None or op.residual_chip is not None:
        return False
    return len(op.ins) == (3 if op.biased is not None else 2)


def _plain_experts(op: Operation | None) -> bool:
    """A mixture with no residual folded into its sum yet."""
    return isinstance(op, cuda.ExpertsOp) and not op.has_residual()


def _with_residual(
    experts: cuda.ExpertsOp, residual: SSAValue, outs: list[SSAValue], on_chip: int | None
) -> cuda.ExpertsOp:
    """`experts` adding `residual` to its sum (after its weights and chip table, before a folded norm's scale), on
    chip `on_chip` alone where given."""
    held = 5 + experts.split()
    ins = [*experts.ins[:held], residual, *experts.ins[held:]]
    props = {k: v for k, v in experts.properties.items() if k != "operandSegmentSizes"}
    props["residual"] = UnitAttr()
    if on_chip is not None:
        props["residual_chip"] = IntegerAttr(on_chip, i64)
    return cuda.ExpertsOp(ins, outs, props)


def _biased(linear: cuda.LinearOp) -> dict[str, Attribute]:
    return {"biased": linear.biased} if linear.biased is not None else {}


def _reads_as_input(use: Use, kernels: set[int]) -> bool:
    op = use.operation
    return id(op) in kernels and isinstance(op, cuda.KernelOp) and use.index < len(op.ins)


@dataclass(frozen=True)
class FoldResidualAdds(ModulePass):
    """Folds each residual add into the projection before it, or after an all-reduce into the partial sum before it
    (see the module docstring)."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        PatternRewriteWalker(FoldResidualAdd(), apply_recursively=False).rewrite_module(op)
        drop_unused_buffers(host)
