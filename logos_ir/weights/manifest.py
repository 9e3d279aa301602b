"""The weight manifest: how a family's checkpoint names the tensors a LOGOS program reads, where they differ from
Llama's. The program is the same for every family that computes alike (Phi-3 is a Llama whose checkpoint fuses
each layer's Q, K and V projections into one `qkv_proj`, and its gate and up projections into one
`gate_up_proj`); the difference lives here, in the file's reading, never in the program or below it.

A fused tensor is split by rows, in the order its family's modelling code splits its product (transformers'
`Phi3Attention`: the query's rows, then the key's, then the value's; `Phi3MLP`: `chunk(2)`, the gate's rows
first). Row ranges of a row-major tensor are byte ranges of its file, so each part is read in place, as any
other tensor is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from logos_ir.spec import ModelSpec

# model_type -> {a fused tensor's role in a layer: [(each part's role, its rows for a spec), ...]}
_Rows = Callable[[ModelSpec], int]
FUSED: Mapping[str, Mapping[str, tuple[tuple[str, _Rows], ...]]] = {
    "phi3": {
        "self_attn.qkv_proj": (
            ("self_attn.q_proj", lambda s: s.q_dim),
            ("self_attn.k_proj", lambda s: s.kv_dim),
            ("self_attn.v_proj", lambda s: s.kv_dim),
        ),
        "mlp.gate_up_proj": (
            ("mlp.gate_proj", lambda s: s.intermediate),
            ("mlp.up_proj", lambda s: s.intermediate),
        ),
    },
}


def fused_parts(model_type: str, spec: ModelSpec, name: str) -> list[tuple[str, int, int]] | None:
    """The parts of the file tensor `name` (a Hugging Face name) of a `model_type` checkpoint, as (the program's
    tensor name, first row, end row), or None where the tensor is not fused."""
    roles = FUSED.get(model_type, {})
    prefix, _, rest = name.partition(".layers.")
    layer, _, role = rest.partition(".")
    if not prefix or not layer.isdigit() or not role.endswith(".weight") or role[: -len(".weight")] not in roles:
        return None
    parts, row = [], 0
    for part, rows in roles[role[: -len(".weight")]]:
        parts.append((f"{prefix}.layers.{layer}.{part}.weight", row, row + rows(spec)))
        row += rows(spec)
    return parts
