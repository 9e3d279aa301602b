"""How a Llama layer splits over chips, Megatron-style: the one table the author and `tp-split` both follow.

Column-parallel projections (split by the output rows of the [out, in] weight) feed the attention and the SwiGLU
product, so each chip owns whole attention heads, whole KV heads and a slice of the intermediate dimension;
row-parallel projections (split by input columns) produce partial sums that an all-reduce adds up. Norms and the
embedding are replicated. The head's table (`lm_head.weight`, or the embedding's table when the two are tied) is
split by vocabulary rows (`HEAD_SPLIT`, Megatron-LM's and vLLM's `ParallelLMHead`): each chip computes the logits
of its rows and an all-gather puts the whole row of logits on every chip, where the arg-max (or the sampler)
reads it. A vocabulary that is not a multiple of the chips is refused (`head_refusal`), not padded.

A mixture of experts splits by experts (`EXPERTS_SPLIT`, expert parallelism as vLLM's FusedMoE computes it when
data parallelism is 1): its router is replicated, so every chip computes the same logits and the same choice for
every token (the hidden state is replicated after attention's all-reduce, so every token is on every chip and the
dispatch moves no data); the stacked expert weights `[experts, ...]` are split along their first axis, chip c
holding experts [c * E / chips, (c + 1) * E / chips); each chip sums only its own experts' weighted outputs for
the tokens routed to them, a partial sum an all-reduce adds up, as it adds the down projection's. Each expert is
whole on its chip, so its width need not divide; the expert count must (`split_refusal`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from logos_ir.spec import ModelSpec

SPLIT_OF_ROLE = {
    "self_attn.q_proj": "rows",
    "self_attn.k_proj": "rows",
    "self_attn.v_proj": "rows",
    "self_attn.o_proj": "columns",
    "mlp.gate_proj": "rows",
    "mlp.up_proj": "rows",
    "mlp.down_proj": "columns",
    "mlp.experts.gate_proj": "experts",  # the stacked experts [experts, intermediate, hidden]: whole experts a chip
    "mlp.experts.up_proj": "experts",
    "mlp.experts.down_proj": "experts",
}

NOT_YET_SPLIT = "a cut other than a decode step, a batch or a layer of either, split over chips"

EXPERTS_SPLIT = "experts"  # a stacked expert weight: each chip holds experts / chips whole experts, in chip order

HEAD_SPLIT = "rows"  # the head's [vocab, hidden] table: each chip holds vocab / chips rows, in chip order

_LAYER_WEIGHT = re.compile(
    r"model\.layers\.(?:0|[1-9][0-9]*)\.(?P<role>[a-z_]+\.[a-z_]+(?:\.[a-z_]+)?)\.(?P<kind>weight|bias)"
)


def weight_split(tensor: str) -> str | None:
    """How the weight named `tensor` splits over chips: `rows`, `columns`, or None (every chip holds all of it). A
    column-parallel projection's bias splits with its output rows; a row-parallel one's is added whole, after the
    all-reduce (Megatron-LM's `RowParallelLinear` adds its bias once, to the reduced sum)."""
    match = _LAYER_WEIGHT.fullmatch(tensor)
    split = None if match is None else SPLIT_OF_ROLE.get(match["role"])
    if match is not None and match["kind"] == "bias":
        return "rows" if split == "rows" else None
    return split


def split_axis(split: str, rank: int) -> int:
    """The axis of a weight of `rank` axes that `split` divides: rows and experts the first, columns the last."""
    return rank - 1 if split == "columns" else 0


def split_refusal(spec: ModelSpec, tp: int) -> str | None:
    """None when `spec`'s layers divide over `tp` chips, else why not: the first of its widths that is not a
    multiple of `tp` (the query and key-value heads, and the feed-forward width or, for a mixture, the number of
    experts: each expert is whole on its chip, so its own width need not divide)."""
    widths = ("heads", "kv_heads", "intermediate" if spec.experts is None else "experts")
    for width in widths:
        if getattr(spec, width) % tp:
            return f"{width} ({getattr(spec, width)}) is not a multiple of {tp}"
    return None


def head_refusal(vocab: int, tp: int) -> str | None:
    """None when the head's vocabulary divides over `tp` chips, else why the split head cannot be built."""
    if vocab % tp:
        return (
            f"its vocabulary ({vocab}) is not a multiple of {tp}: the head is split by vocabulary rows over the "
            "chips, and a split that would need padded rows is refused"
        )
    return None
