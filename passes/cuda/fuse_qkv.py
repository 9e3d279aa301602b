"""`cuda-fuse-qkv`: at batch 1, a layer's query, key and value projections, both rotations and the cache writes in
one launch.

    logos-opt step.mlir -p cuda-fold-norms,cuda-fuse-qkv

Assumes: the kernel level with the norms folded (`cuda-fold-norms`). Guarantees: each run of five steps that is a
decode layer's attention input, the query, key and value `cuda.linear` of one row with one folded norm, the
`cuda.rope_cache_write` of that key and value into one cache per layer, and the `cuda.rope` of that query at the
same positions, becomes one `cuda.qkv` on one weight buffer holding the three weights one after the other (named
"<q>+<k>+<v>", added after the other buffers); the buffers only those steps used go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from xdsl.context import Context
from xdsl.dialects.builtin import MemRefType, ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from logos_ir.dialects import cuda
from logos_ir.passes.cuda import blocks
from logos_ir.passes.cuda.kernel_level import buffer, buffer_name, drop_unused_buffers, host_function, next_steps

NAME = "cuda-fuse-qkv"


def _is_qkv(window: list[Operation]) -> bool:
    if len(window) != 5 or not all(isinstance(s, cuda.KernelOp) for s in window):
        return False
    q, k, v, cache_write, rope = cast(list[cuda.KernelOp], window)
    projections = all(isinstance(s, cuda.LinearOp) and len(s.ins) == 3 and s.epsilon is not None for s in (q, k, v))
    if not projections or not isinstance(cache_write, cuda.RopeCacheWriteOp) or not isinstance(rope, cuda.RopeOp):
        return False
    same_input = q.ins[0] == k.ins[0] == v.ins[0] and q.ins[2] == k.ins[2] == v.ins[2]
    wired = list(cache_write.ins[:2]) == [k.outs[0], v.outs[0]] and rope.ins[0] == q.outs[0]
    tables = list(rope.ins[1:]) == list(cache_write.ins[2:])
    one_cache = len(cuda.shape_of(cache_write.outs[0].type)) == 3  # a decode step's, not a batch's
    if cache_write.rotary_dim is not None or rope.rotary_dim is not None:  # type: ignore[attr-defined]
        return False  # a partial rotary's pairs are not the (d, d + head_dim/2) a warp owns
    return same_input and wired and tables and one_cache and cuda.shape_of(q.ins[0].type)[0] == 1


class FuseAttentionInput(RewritePattern):
    """A query projection and the four steps after it that make a decode layer's attention input, as one
    `cuda.qkv`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.LinearOp, rewriter: PatternRewriter) -> None:
        window: list[Operation] = [op, *next_steps(op, 4)]
        if not _is_qkv(window):
            return
        q, k, v, cache_write, rope = cast(list[cuda.KernelOp], window)
        host = op.parent_op()
        weights = [q.ins[1], k.ins[1], v.ins[1]]
        stored = {blocks.storage_of(w) for w in weights}
        if len(stored) > 1:  # one buffer holds one format: the three stay apart
            return
        kinds = [cast(MemRefType, w.type) for w in weights]
        rows = sum(kind.get_shape()[0] for kind in kinds)
        fused_type = MemRefType(kinds[0].element_type, [rows, kinds[0].get_shape()[1]])
        name = "+".join(buffer_name(w) for w in weights)
        fused = buffer(rewriter, host, name, "weight", fused_type)  # type: ignore[arg-type]
        fmt = stored.pop()
        if fmt is not None:  # the three weights' rows of blocks, one after the other
            blocks.mark(cast(Operation, fused.owner), fmt)
        x, scale = q.ins[0], q.ins[-1]
        _, _, positions, cos, sin = cache_write.ins
        kernel = cuda.QKVOp(
            [x, fused, scale, positions, cos, sin], [rope.outs[0], *cache_write.outs], {"epsilon": q.epsilon}
        )  # type: ignore[dict-item]
        rewriter.insert(kernel, rewriter.insertion_point)
        for step in window:
            rewriter.erase(step)


@dataclass(frozen=True)
class FuseQKV(ModulePass):
    """Fuses each decode layer's query, key and value projections, rotations and cache writes (see the module
    docstring)."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        PatternRewriteWalker(FuseAttentionInput(), apply_recursively=False).rewrite_module(op)
        drop_unused_buffers(host)
