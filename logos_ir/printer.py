"""The LOGOS printer: `logos` IR back to LOGOS text, one sentence an op.

The printer is the only place that knows how each op reads as English; the author builds IR and prints it here, and
the parser (`logos_ir.parser`) reads exactly these sentences back. For every program the author writes, parsing and
printing gives the same bytes, so the identity (the SHA-256 of the text) is computable from IR at any stage.
Values print by their name hints; the grammar is documented in `docs/logos.md`.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import func
from xdsl.dialects.shard import AllReduceOp, GridOp
from xdsl.ir import Operation, SSAValue

from logos_ir import quant
from logos_ir.dialects import logos
from logos_ir.dialects.shard_ext import AllGatherOp, AllSliceOp
from logos_ir.errors import PassError
from logos_ir.program import Cut
from logos_ir.spec import LLAMA_FEATURES, ModelSpec

INDENT = "    "


def count(n: int, noun: str) -> str:
    """`1 layer`, `2 layers`: a number and its noun, in the plural unless it is one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def shape_text(shape: tuple[int, ...] | list[int]) -> str:
    """`64 by 128`."""
    return " by ".join(str(d) for d in shape)


def number_list(values: tuple[int, ...] | list[int]) -> str:
    return ", ".join(str(v) for v in values)


def word_list(words: tuple[str, ...] | list[str]) -> str:
    """`query`, `query and key`, `query, key and value`."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


HEAD_NORMS = "Each head of the query and of the key is RMS-normed."
PROJECTION_NORMS = "The whole query and the whole key are RMS-normed, across their heads."
RENORMALIZED = ", their weights divided by their sum"  # the chosen experts' probabilities, renormalized


def mixture_fact(experts: int, top_k: int, renormalize: bool) -> str:
    """The fact of a mixture of experts in every layer (each of `intermediate` numbers)."""
    chosen = f"each token routed to the best {top_k} of them{RENORMALIZED if renormalize else ''}"
    return f"Each layer's feed-forward network is a mixture of {count(experts, 'expert')}, {chosen}."


# Gemma's facts, in their fixed order after the head norms: the spec's field and its sentence ({} its number, by
# repr), each said only where the spec differs from a Llama (`LLAMA_FEATURES`).
FEATURE_FACTS: dict[str, str] = {
    "norm_plus_one": "Each RMS norm scales by one plus its weight.",
    "embedding_scaled": "The embedding is scaled by the square root of the hidden size.",
    "activation": "The feed-forward network's gate is GELU with the tanh approximation.",
    "sandwich_norms": "The outputs of attention and of the feed-forward network are RMS-normed too.",
    "query_pre_attn_scalar": "Attention scores are scaled by one over the square root of {}.",
    "attention_softcap": "Attention scores are soft-capped at {}.",
    "final_softcap": "The logits are soft-capped at {}.",
    "local_rope_theta": "The layers with a sliding window rotate with base {}.",
}


def scaling_fact(spec: ModelSpec) -> str:
    """The sentence of the model's rotary scaling: Llama 3's, YaRN's, LongRoPE's (the factors the program uses), or a
    linear one (not in the windowed layers where
    those rotate with a base of their own, Gemma 3's)."""
    s = spec.rope_scaling
    assert s is not None
    if s.rope_type == "linear":
        where = "" if spec.local_rope_theta is None else ", except in the layers with a sliding window"
        return f"The rotary frequencies are divided by {s.factor!r} (linear scaling){where}."
    if s.rope_type == "yarn":
        return (
            f"The rotary frequencies are scaled by YaRN by {s.factor!r} over original context "
            f"{s.original_max_position_embeddings}, ramped between {s.beta_slow!r} and {s.beta_fast!r} turns, with cos "
            f"and sin scaled by {s.attention_factor!r}."
        )
    if s.rope_type == "longrope":
        assert s.factors is not None
        return (
            f"The rotary frequencies are divided by LongRoPE's factors {', '.join(repr(f) for f in s.factors)} for "
            f"{s.factor!r} times original context {s.original_max_position_embeddings}, with cos and sin scaled by "
            f"{s.attention_factor!r}."
        )
    return (
        f"The rotary frequencies are scaled as in Llama 3 by {s.factor!r}, with low frequency factor "
        f"{s.low_freq_factor!r}, high frequency factor {s.high_freq_factor!r} and original context "
        f"{s.original_max_position_embeddings}."
    )


def fact_lines(spec: ModelSpec, chips: int | None) -> list[str]:
    """The model's facts, one sentence each, in their fixed order (the grammar's `facts`)."""
    lines = [
        f"The vocabulary has {count(spec.vocab, 'token')}.",
        f"The hidden state has {count(spec.hidden, 'number')}.",
        f"The model has {count(spec.layers, 'layer')}.",
        f"Each layer has {count(spec.heads, 'attention head')} and {count(spec.kv_heads, 'key-value head')} "
        f"of {count(spec.head_dim, 'number')}.",
        f"The feed-forward network has {count(spec.intermediate, 'number')}.",
        f"The RMS norm epsilon is {spec.rms_eps!r}.",
        f"The rotary base is {spec.rope_theta!r}.",
    ]
    if spec.rope_scaling is not None:
        lines.append(scaling_fact(spec))
    if spec.rotary_dim is not None:
        lines.append(f"The rotary embedding turns the first {spec.rotary_dim} of each head's {spec.head_dim} numbers.")
    if spec.sliding_window is not None:
        full = spec.full_layers
        layers = ""
        if full:
            layers = f", except in {'layer' if len(full) == 1 else 'layers'} {word_list([str(i) for i in full])}"
        lines.append(f"Attention looks back over a sliding window of {count(spec.sliding_window, 'position')}{layers}.")
    if spec.biases:
        lines.append(f"The {word_list(spec.biases)} projections add biases.")
    if spec.head_norms:
        lines.append(HEAD_NORMS)
    if spec.projection_norms:
        lines.append(PROJECTION_NORMS)
    if spec.experts is not None:
        lines.append(mixture_fact(spec.experts, spec.experts_per_token or 0, spec.renormalize))
    for key, fact in FEATURE_FACTS.items():
        value = getattr(spec, key)
        if value != LLAMA_FEATURES[key]:
            lines.append(fact.format(repr(value)))
    lines.append("The head reads the embedding table." if spec.tie_embeddings else "The head has its own table.")
    if chips is not None:
        lines.append(f"The program runs on {count(chips, 'chip')}.")
    return lines


class _Names:
    """Names of values as LOGOS prints them: their name hints, or a deterministic stand-in for unnamed values."""

    def __init__(self) -> None:
        self._given: dict[SSAValue, str] = {}

    def __call__(self, value: SSAValue) -> str:
        if value.name_hint is not None:
            return value.name_hint
        if value not in self._given:
            self._given[value] = f"value{len(self._given) + 1}"
        return self._given[value]


def print_program(program: logos.ProgramOp) -> str:
    """The LOGOS text of a `logos.program`."""
    cut = Cut.parse(program.cut.data)
    grid = any(isinstance(op, GridOp) for op in program.block.ops)
    chips = program.chips.value.data if grid else None
    lines = [f"## Program: {cut}"]
    lines += [INDENT + line for line in fact_lines(program.spec, chips)]
    names = _Names()
    for op in program.block.ops:
        if isinstance(op, func.FuncOp):
            lines.append("")
            lines += _section(op, names, program.spec)
        elif not isinstance(op, GridOp):
            raise PassError(f"LOGOS printer: '{op.name}' cannot stand at the top of a program")
    return "\n".join(lines) + "\n"


def section_header(function: func.FuncOp, names: Callable[[SSAValue], str]) -> str:
    args = [names(a) for a in function.body.block.args]
    sym = function.sym_name.data
    if sym == "main" and not args:
        return "## Main"
    if sym == "embedding" and len(args) == 1:
        return f"## Embedding of {args[0]}"
    if sym == "head" and len(args) == 1:
        return f"## Head of {args[0]}"
    layer = _layer_index(sym)
    if layer is not None and len(args) == 2:
        return f"## Layer {layer} of {args[0]} at {args[1]}"
    raise PassError(f"LOGOS printer: function @{sym} is not a LOGOS section")


def _layer_index(sym: str) -> int | None:
    prefix, _, number = sym.partition("_")
    if prefix == "layer" and number.isdigit() and str(int(number)) == number:
        return int(number)
    return None


def _section(function: func.FuncOp, names: _Names, spec: ModelSpec) -> list[str]:
    lines = [section_header(function, names)]
    for op in function.body.block.ops:
        lines.append(INDENT + sentence(op, names, spec))
    return lines


def sentence(op: Operation, names: Callable[[SSAValue], str], spec: ModelSpec | None = None) -> str:
    """The one sentence that `op` reads as, in a program of the model `spec` (else the one that holds it)."""
    if isinstance(op, logos.RopeOp):  # the one sentence that says what differs from the model's facts
        spec = spec if spec is not None else logos.program_spec(op)
        theta = op.theta.value.data
        base = "" if spec is None or theta == spec.rope_theta else f", with base {theta!r}"
        return _let(op, names, f"{names(op.input)} rotated to {names(op.positions)}{base}")
    printer = _SENTENCES.get(type(op))
    if printer is None:
        raise PassError(f"LOGOS printer: '{op.name}' has no LOGOS sentence")
    return printer(op, names)


def _let(op: Operation, names: Callable[[SSAValue], str], expression: str) -> str:
    return f"Let {names(op.results[0])} be {expression}."


def _input(op: logos.InputOp, n: Callable[[SSAValue], str]) -> str:
    kind = op.kind.data
    if kind == "hidden":
        return _let(op, n, f"the input hidden state of {shape_text(logos.tensor_shape(op.result))}")
    values = logos.int_values(op.values) if op.values is not None else ()
    noun = kind if len(values) == 1 else kind + "s"
    return _let(op, n, f"the input {noun} {number_list(values)}")


def _split_clause(op: logos.WeightOp | logos.CacheOp) -> str:
    return "" if op.split is None else f", split by {op.split.data} over the chips"


def _storage_clause(op: logos.WeightOp) -> str:
    return "" if op.storage is None else f", stored in {quant.sentence(op.storage.format)}"


def _weight(op: logos.WeightOp, n: Callable[[SSAValue], str]) -> str:
    clauses = f"{_split_clause(op)}{_storage_clause(op)}"
    return _let(op, n, f'the weight "{op.tensor.data}" of {shape_text(op.full_shape)}{clauses}')


def _cache(op: logos.CacheOp, n: Callable[[SSAValue], str]) -> str:
    full = op.full_shape
    parts = [count(full[-3], "head"), count(full[-2], "position"), count(full[-1], "number")]
    if len(full) == 4:
        parts.insert(0, count(full[0], "sequence"))
    layout = " by ".join(parts)
    return _let(op, n, f"the {op.kind.data} cache of layer {op.layer.value.data}, with {layout}{_split_clause(op)}")


def _call(op: func.CallOp, n: Callable[[SSAValue], str]) -> str:
    callee = op.callee.root_reference.data
    args = [n(a) for a in op.arguments]
    if callee == "embedding" and len(args) == 1:
        return _let(op, n, f"the embedding of {args[0]}")
    if callee == "head" and len(args) == 1:
        return _let(op, n, f"the head of {args[0]}")
    layer = _layer_index(callee)
    if layer is not None and len(args) == 2:
        return _let(op, n, f"layer {layer} of {args[0]} at {args[1]}")
    raise PassError(f"LOGOS printer: a call of @{callee} is not a LOGOS sentence")


def _return(op: func.ReturnOp, n: Callable[[SSAValue], str]) -> str:
    if len(op.arguments) != 1:
        raise PassError("LOGOS printer: a section returns exactly one value")
    return f"Return {n(op.arguments[0])}."


def _write(op: logos.CacheWriteOp, n: Callable[[SSAValue], str]) -> str:
    return f"Write {n(op.input)} into {n(op.cache)} at {n(op.positions)}."


def _norm_weight(op: logos.ScaledRMSNormOp, n: Callable[[SSAValue], str]) -> str:
    return f"one plus {n(op.weight)}" if op.plus_one is not None else n(op.weight)


def _attention(op: logos.AttentionOp, n: Callable[[SSAValue], str]) -> str:
    window = "" if op.window is None else f", within the last {op.window.value.data} positions"
    if op.scale is not None:
        window += f", scaling its scores by {op.scale.value.data!r}"
    if op.softcap is not None:
        window += f", soft-capping its scores at {op.softcap.value.data!r}"
    return _let(
        op, n, f"the attention of {n(op.query)} over {n(op.keys)} and {n(op.values)} up to {n(op.positions)}{window}"
    )


def _experts(op: logos.MixtureOp, n: Callable[[SSAValue], str]) -> str:
    weights = f"{n(op.gate)}, {n(op.up)} and {n(op.down)}"
    routed = f"routed by {n(op.logits)} to the best {op.top_k.value.data}"
    renormalized = RENORMALIZED if op.renormalize is not None else ""
    return _let(op, n, f"the mixture of the experts {weights} applied to {n(op.input)}, {routed}{renormalized}")


def _self_attention(op: logos.SelfAttentionOp, n: Callable[[SSAValue], str]) -> str:
    return _let(op, n, f"the attention of {n(op.query)} over {n(op.key)} and {n(op.value)}, with no history")


_SENTENCES: dict[type[Operation], Callable[..., str]] = {
    logos.InputOp: _input,
    logos.WeightOp: _weight,
    logos.CacheOp: _cache,
    func.CallOp: _call,
    func.ReturnOp: _return,
    logos.CacheWriteOp: _write,
    logos.AttentionOp: _attention,
    logos.SelfAttentionOp: _self_attention,
    logos.MixtureOp: _experts,
    logos.EmbedOp: lambda op, n: _let(op, n, f"the rows of {n(op.table)} at {n(op.tokens)}"),
    logos.RMSNormOp: lambda op, n: _let(op, n, f"the RMS norm of {n(op.input)} with {_norm_weight(op, n)}"),
    logos.HeadRMSNormOp: lambda op, n: _let(
        op, n, f"the RMS norm of each head of {n(op.input)} with {_norm_weight(op, n)}"
    ),
    logos.GeluTanhOp: lambda op, n: _let(op, n, f"the tanh-approximated GELU of {n(op.input)}"),
    logos.SoftcapOp: lambda op, n: _let(op, n, f"{n(op.input)} soft-capped at {op.cap.value.data!r}"),
    logos.ScaleOp: lambda op, n: _let(op, n, f"{n(op.input)} scaled by {op.factor.value.data!r}"),
    logos.LinearOp: lambda op, n: _let(op, n, f"{n(op.weight)} applied to {n(op.input)}"),
    logos.AddOp: lambda op, n: _let(op, n, f"{n(op.lhs)} plus {n(op.rhs)}"),
    logos.MulOp: lambda op, n: _let(op, n, f"{n(op.lhs)} times {n(op.rhs)}"),
    logos.BiasAddOp: lambda op, n: _let(op, n, f"{n(op.input)} with {n(op.bias)} added to each row"),
    logos.SiluOp: lambda op, n: _let(op, n, f"the SiLU of {n(op.input)}"),
    logos.RowOp: lambda op, n: _let(op, n, f"row {op.index.value.data} of {n(op.input)}"),
    logos.ArgmaxOp: lambda op, n: _let(op, n, f"the arg-max of {n(op.input)}"),
    AllReduceOp: lambda op, n: _let(op, n, f"the sum over the chips of {n(op.input)}"),
    AllGatherOp: lambda op, n: _let(op, n, f"the concatenation over the chips of {n(op.input)}"),
    AllSliceOp: lambda op, n: _let(op, n, f"the share on this chip of {n(op.input)}"),
}
