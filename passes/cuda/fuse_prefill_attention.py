"""`cuda-fuse-prefill-attention`: a prefill chunk's cache write and query rotation folded into its attention.

    logos-opt step.mlir -p cuda-fuse-prefill-attention

Assumes: the kernel level. Guarantees: each `cuda.attention` that the tensor-core flash attention takes (a chunk of
several rows over one sequence's bf16 cache, head_dim a multiple of 16) and that directly follows the
`cuda.rope_cache_write` filling its caches and the `cuda.rope` rotating its queries, at the same positions and
tables, with the rotated queries read by nothing else, becomes one `cuda.prefill_attention`: the chunk's keys and
values are written to the cache in the attention's own pass. The buffers only those steps used go (the rotated
queries, the attention's split-K scratch).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern

from logos_ir.dialects import cuda
from logos_ir.passes.cuda.kernel_level import drop_unused_buffers, host_function, previous_step
from logos_ir.passes.cuda.tensor_core import flash_attention_fits

NAME = "cuda-fuse-prefill-attention"


class FoldIntoPrefillAttention(RewritePattern):
    """`attention(rope(q), rope_cache_write(k, v))` of a prefill chunk as one `cuda.prefill_attention`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.AttentionOp, rewriter: PatternRewriter) -> None:
        if not flash_attention_fits(op):
            return
        last = previous_step(op)
        first = previous_step(last) if last is not None else None
        before = {type(first): first, type(last): last}
        write, rope = before.get(cuda.RopeCacheWriteOp), before.get(cuda.RopeOp)
        if not isinstance(write, cuda.RopeCacheWriteOp) or not isinstance(rope, cuda.RopeOp):
            return
        if write.rotary_dim is not None or rope.rotary_dim is not None:  # the flash kernel rotates whole heads
            return
        query, keys, values, positions = op.ins
        if rope.outs[0] != query or list(write.outs) != [keys, values]:
            return
        if rope.ins[1] != positions or write.ins[2] != positions or list(rope.ins[2:]) != list(write.ins[3:]):
            return
        if any(not isinstance(use.operation, cuda.RopeOp | cuda.AttentionOp) for use in query.uses):
            return
        fused = cuda.PrefillAttentionOp(
            [rope.ins[0], write.ins[0], write.ins[1], positions, write.ins[3], write.ins[4]],
            [op.outs[0], keys, values],
        )
        rewriter.insert(fused, rewriter.insertion_point)
        for old in (op, rope, write):
            rewriter.erase(old)


@dataclass(frozen=True)
class FusePrefillAttention(ModulePass):
    """Folds each prefill chunk's cache write and query rotation into its attention (see the module docstring)."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        PatternRewriteWalker(FoldIntoPrefillAttention(), apply_recursively=False).rewrite_module(op)
        drop_unused_buffers(host)
