"""How a Llama layer splits over chips, Megatron-style: the one table the author and `tp-split` both follow.

Column-parallel projections (split by the output rows of the [out, in] weight) feed the attention and the SwiGLU
product, so each chip owns whole attention heads, whole KV heads and a slice of the intermediate dimension;
row-parallel projections (split by input columns) produce partial sums that an all-reduce adds up. Norms, the
embedding and the head are replicated.
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

_LAYER_WEIGHT = re.compile(r"model\.layers\.(?:0|[1-9][0-9]*)\.(?P<role>[a-z_]+\.[a-z_]+)\.weight")


def weight_split(tensor: str) -> str | None:
    """How the weight named `tensor` splits over chips: `rows`, `columns`, or None (every chip holds all of it)."""
    match = _LAYER_WEIGHT.fullmatch(tensor)
    return None if match is None else SPLIT_OF_ROLE.get(match["role"])
