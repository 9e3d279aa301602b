"""The weight manifest: how a family's checkpoint names the tensors a LOGOS program reads, where they differ from
Llama's. The program is the same for every family that computes alike (Phi-3 is a Llama whose checkpoint fuses
each layer's Q, K and V projections into one `qkv_proj`, and its gate and up projections into one
`gate_up_proj`); the difference lives here, in the file's reading, never in the program or below it.

A fused tensor is split by rows, in the order its family's modelling code splits its product (transformers'
`Phi3Attention`: the query's rows, then the key's, then the value's; `Phi3MLP`: `chunk(2)`, the gate's rows
first). Row ranges of a row-major tensor are byte ranges of its file, so each part is read in place, as any
other tensor is.

A mixture of experts' program reads each projection of a layer's experts as one stacked tensor, expert by expert
along its first axis (`model.layers.0.mlp.experts.gate_proj.weight` of experts by intermediate by hidden), and its
router as `mlp.gate`; the checkpoints store one tensor an expert (Mixtral: `block_sparse_moe.experts.{e}.w1`, the
gate, `w3` the up and `w2` the down projection, its router `block_sparse_moe.gate`, as transformers'
`conversion_mapping` reads them; Qwen3-MoE: `mlp.experts.{e}.gate_proj`, `up_proj`, `down_proj`, router
`mlp.gate`). The store stacks them on read (`expert_part` says where each file tensor goes).
"""

from __future__ import annotations

import re
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


# model_type -> {a layer tensor's role in the checkpoint ({e}: the expert's index): the program's role}
EXPERTS: Mapping[str, Mapping[str, str]] = {
    "mixtral": {
        "block_sparse_moe.gate": "mlp.gate",
        "block_sparse_moe.experts.{e}.w1": "mlp.experts.gate_proj",
        "block_sparse_moe.experts.{e}.w3": "mlp.experts.up_proj",
        "block_sparse_moe.experts.{e}.w2": "mlp.experts.down_proj",
    },
    "qwen3_moe": {
        "mlp.experts.{e}.gate_proj": "mlp.experts.gate_proj",
        "mlp.experts.{e}.up_proj": "mlp.experts.up_proj",
        "mlp.experts.{e}.down_proj": "mlp.experts.down_proj",
    },
}
EXPERTS["olmoe"] = EXPERTS["qwen3_moe"]  # OLMoE's checkpoints name its router and experts as Qwen3-MoE's do
_INDEX = "(0|[1-9][0-9]*)"
_LAYER = re.compile(rf"(?P<prefix>[^.]+)\.layers\.(?P<layer>{_INDEX[1:-1]})\.(?P<role>.+)\.weight")


def expert_part(model_type: str, name: str) -> tuple[str, int | None, str] | None:
    """Where the file tensor `name` of a `model_type` checkpoint goes: (the program's tensor, the expert's index
    along its first axis or None where the tensor is the program's whole tensor under another name, the file's
    name of that tensor with `{e}` for the index); None where the family's manifest leaves it as it is."""
    roles = EXPERTS.get(model_type)
    match = _LAYER.fullmatch(name) if roles else None
    if roles is None or match is None:
        return None
    for file_role, program_role in roles.items():
        found = re.fullmatch(re.escape(file_role).replace(re.escape("{e}"), _INDEX), match["role"])
        if found is None:
            continue
        layer = f"{match['prefix']}.layers.{match['layer']}."
        expert = int(found[1]) if found.re.groups else None
        return f"{layer}{program_role}.weight", expert, f"{layer}{file_role}.weight"
    return None


def checkpoint_tensors(model_type: str, name: str, experts: int) -> list[tuple[str, int | None]]:
    """The file tensors a `model_type` checkpoint stores the program tensor `name` as (`expert_part`'s inverse):
    one tensor an expert of a stack of `experts` (each with its index), or the tensor under the family's name
    (None), or `name` itself where the manifest leaves it as it is."""
    match = _LAYER.fullmatch(name)
    for file_role, program_role in EXPERTS.get(model_type, {}).items():
        if match is None or match["role"] != program_role:
            continue
        file_name = f"{match['prefix']}.layers.{match['layer']}.{file_role}.weight"
        if "{e}" not in file_role:
            return [(file_name, None)]
        return [(file_name.format(e=index), index) for index in range(experts)]
    return [(name, None)]
