"""How a Llama layer splits over chips, Megatron-style: the one table the author and `tp-split` both follow.

Column-parallel projections (split by the output rows of the [out, in] weight) feed the attention and the SwiGLU
product, so each chip owns whole attention heads, whole KV heads and a slice of the intermediate dimension;
row-parallel projections (split by input columns) produce partial sums that an all-reduce adds up. Norms and the
embedding are replicated. The head's table (`lm_head.weight`, or the embedding's table when the two are tied) is
split by vocabulary rows (`HEAD_SPLIT`, Megatron-LM's and vLLM's `ParallelLMHead`): each chip computes the logits
of its rows and an all-gather puts the whole row of logits on every chip, where the arg-max (or the sampler)
reads it. A vocabulary that is not a multiple of the chips is refused (`head_refusal`), not padded.
"""

from __future__ import annotations

import re

SPLIT_OF_ROLE = {
    "self_attn.q_proj": "rows",
    "self_attn.k_proj": "rows",
    "self_attn.v_proj": "rows",
    "self_attn.o_proj": "columns",
    "mlp.gate_proj": "rows",
    "mlp.up_proj": "rows",
    "mlp.down_proj": "columns",
}

NOT_YET_SPLIT = "a cut other than a decode step, a batch or a layer of either, split over chips"

# Experts are not split yet: expert parallelism (each chip whole experts, tokens sent to them) is to come, and a
# program that held every expert on every chip would hide the memory it costs.
NOT_YET_SPLIT_EXPERTS = "a mixture of experts split over chips (expert parallelism is not built yet)"

# OLMoE's norm of the whole query and key needs every head's numbers, which a head split leaves on other chips (vLLM
# all-gathers Q and K for it, norms, and splits again): not built, so refused.
NOT_YET_SPLIT_PROJECTION_NORMS = (
    "an RMS norm of the whole query and key split over chips (each chip holds some heads; the norm reads all)"
)

HEAD_SPLIT = "rows"  # the head's [vocab, hidden] table: each chip holds vocab / chips rows, in chip order

_LAYER_WEIGHT = re.compile(r"model\.layers\.(?:0|[1-9][0-9]*)\.(?P<role>[a-z_]+\.[a-z_]+)\.(?P<kind>weight|bias)")


def weight_split(tensor: str) -> str | None:
    """How the weight named `tensor` splits over chips: `rows`, `columns`, or None (every chip holds all of it). A
    column-parallel projection's bias splits with its output rows; a row-parallel one's is added whole, after the
    all-reduce (Megatron-LM's `RowParallelLinear` adds its bias once, to the reduced sum)."""
    match = _LAYER_WEIGHT.fullmatch(tensor)
    split = None if match is None else SPLIT_OF_ROLE.get(match["role"])
    if match is not None and match["kind"] == "bias":
        return "rows" if split == "rows" else None
    return split


def head_refusal(vocab: int, tp: int) -> str | None:
    """None when the head's vocabulary divides over `tp` chips, else why the split head cannot be built."""
    if vocab % tp:
        return (
            f"its vocabulary ({vocab}) is not a multiple of {tp}: the head is split by vocabulary rows over the "
            "chips, and a split that would need padded rows is refused"
        )
    return None
