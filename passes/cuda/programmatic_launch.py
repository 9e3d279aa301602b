"""`cuda-programmatic-launch`: every kernel of the step waits for the launch before it at its top and lets the
launch after it start early (Hopper's programmatic dependent launch, PDL).

    logos-opt step.mlir -p cuda-programmatic-launch

Assumes: the gpu level (`convert-cuda-kernels-to-gpu`' output: a `gpu.module @kernels` of `gpu.func` kernels).
Guarantees: each kernel's body begins with `nvvm.griddepcontrol wait` then `nvvm.griddepcontrol launch_dependents`,
before any of its ops (so before any access to memory). The host plan (`host_plan.plan_of`) launches a kernel that
begins so with the programmatic-stream-serialization attribute (`cuLaunchKernelEx`, captured into the step's graph as
a programmatic edge): its grid may be launched, and its blocks made resident, while the kernel before it is still
running; each block then holds at the wait until that kernel has completed and its writes are visible. What this
hides is the launch gap between two kernels of the graph (the latency model's `programmatic_gap_s` against
`launch_gap_s`); what it cannot hide is the wait itself and each kernel's first loads, since nothing is read before
the wait.

Where the wait and the trigger go follows XLA's first PDL pass (the wait at every kernel's entry) and the trigger
right after the wait (SGLang and llama.cpp trigger later, after their main loops; here the dependent's blocks then
only take the places the last wave of this kernel frees, and a trigger after the wait means at most two grids are
in flight: the kernel after next cannot launch before this one has passed its own wait). A kernel that reads
nothing of the launch before it (a GEMV's weights) could issue its first weight loads before the wait, as
TensorRT-LLM's and FlashInfer's kernels do: not done (every kernel reads an activation or a cache in its first loop
round). The emulator refuses a kernel that touches memory before its wait (`EmulatorFault`), as a GPU would let it
read what its predecessor has not yet written.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import gpu
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from logos_ir.dialects import cuda
from logos_ir.errors import PassError

NAME = "cuda-programmatic-launch"


class WaitAtEntry(RewritePattern):
    """A kernel without the wait at its top gets the wait and the trigger as its first two ops."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: gpu.FuncOp, rewriter: PatternRewriter) -> None:
        if "kernel" not in op.properties or cuda.waits_first(op):
            return
        block = op.body.block
        for found in block.walk():
            if isinstance(found, cuda.GridDepControlOp):
                raise PassError(f"{NAME}: kernel '{op.sym_name.data}' controls its dependent launch elsewhere")
        rewriter.insert(
            [
                cuda.GridDepControlOp(cuda.GridDepAction.WAIT),
                cuda.GridDepControlOp(cuda.GridDepAction.LAUNCH_DEPENDENTS),
            ],
            InsertPoint.at_start(block),
        )


@dataclass(frozen=True)
class ProgrammaticLaunch(ModulePass):
    """Makes every kernel of a lowered step one that is launched programmatically (the module docstring)."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        modules = [found for found in op.walk() if isinstance(found, gpu.ModuleOp)]
        if not modules:
            raise PassError(f"{NAME}: expects the gpu level (a gpu.module of kernels); run convert-cuda-kernels-to-gpu")
        PatternRewriteWalker(WaitAtEntry(), apply_recursively=False).rewrite_module(op)
