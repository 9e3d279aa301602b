"""`csl-fuse-products`: the products of a part that the grid reduces together, marked.

Assumes: the parts of a decode step, each a `logos.program` as `extract-parts` makes them. Guarantees: the same
module, where each run of `logos.linear` ops of one input written one after another (only weights and the run's
own biases between them: q, k and v; gate and up) and none feeding the head's arg-max is marked, each of its ops
with the discardable attribute `csl_ext.fused` = the run's index in its function. `convert-logos-to-csl` lowers
the products of one run as one reduction along a line (each element's partial sums side by side in one array, sent
as one message); an unmarked product is reduced alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass

from logos_ir.dialects import logos

FUSED = "csl_ext.fused"


def feeds_argmax(value: SSAValue) -> bool:
    """Whether `value` is read by the head's arg-max, directly or through a soft-cap (Gemma 2's logits: monotonic,
    computed where the logits are)."""
    for use in value.uses:
        if isinstance(use.operation, logos.ArgmaxOp):
            return True
        if isinstance(use.operation, logos.SoftcapOp) and feeds_argmax(use.operation.result):
            return True
    return False


def product_runs(body: Block) -> list[list[logos.LinearOp]]:
    """The runs of `body`'s products that are reduced together (two or more each), in the order they are written."""
    runs: list[list[logos.LinearOp]] = []
    run: list[logos.LinearOp] = []

    def close() -> None:
        if len(run) > 1:
            runs.append(list(run))
        run.clear()

    for op in body.ops:
        if isinstance(op, logos.WeightOp):
            continue
        if isinstance(op, logos.BiasAddOp) and any(op.input == product.result for product in run):
            continue  # a run member's bias, added after the run's reduction: the run goes on
        final = isinstance(op, logos.LinearOp) and feeds_argmax(op.result)
        if isinstance(op, logos.LinearOp) and not final and (not run or run[0].input == op.input):
            run.append(op)
            continue
        close()
        if isinstance(op, logos.LinearOp) and not final:
            run.append(op)
    close()
    return runs


@dataclass(frozen=True)
class CslFuseProducts(ModulePass):
    """`csl-fuse-products`: each run of products of one input marked `csl_ext.fused` (see the module docstring)."""

    name = "csl-fuse-products"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for function in op.walk():
            if isinstance(function, func.FuncOp) and function.body.blocks:
                for index, run in enumerate(product_runs(function.body.block)):
                    for product in run:
                        product.attributes[FUSED] = IntegerAttr(index, i64)
