"""The author: writes a model's computation as a LOGOS program, deterministically.

For a spec and a cut the author builds the program's `logos` IR section by section (the main section, the
embedding, each layer, the head) and prints it with the one LOGOS printer, so the same spec and cut always give the
same bytes. The text holds every fact a backend needs: the spec's sizes, each weight by its tensor name and shape,
the inputs (placeholders a run replaces), each layer's KV cache, and every step of the math. Each program comes with
its weight manifest. Split programs (`tp` chips, Megatron-style) are written here too, for the cuts that split.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import TensorType, f32, i64
from xdsl.ir import SSAValue

from logos_ir import builder
from logos_ir.builder import SectionBuilder
from logos_ir.dialects import logos
from logos_ir.errors import CutError, NotYet, SpecError
from logos_ir.printer import print_program
from logos_ir.program import Cut, Identity
from logos_ir.spec import ModelSpec
from logos_ir.tensor_parallel import (
    HEAD_SPLIT,
    NOT_YET_SPLIT,
    head_refusal,
    split_refusal,
    weight_split,
)

# The file a weight is read from, under the model's directory (a sharded model's index refines it).
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class WeightEntry:
    """One weight a program reads: its tensor name, the file it is read from, dtype (its storage: f32 or a block
    format of `logos_ir.quant`) and full shape; for a split
    program, how it is split over the chips (`rows`, `columns`, or None when every chip holds all of it)."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    split: str | None = None


@dataclass(frozen=True)
class Authored:
    """A program as the author wrote it: its LOGOS text and its weight manifest."""

    text: str
    manifest: tuple[WeightEntry, ...]
    cut: Cut
    chips: int = 1


def write(
    spec: ModelSpec,
    cut: Cut,
    dir: str = "",
    *,
    tp: int | None = None,
    tokens: Sequence[int] | None = None,
    pos0: int = 1,
) -> Authored:
    """The program for `cut` of `spec`, its manifest under `dir`; split over `tp` chips when `tp` is given; inputs
    at `tokens` and positions from `pos0` (ids and positions from 1) instead of the placeholders."""
    if tp is not None:
        _check_split(spec, cut, tp)
    if cut.layer is not None:
        _check_layer(spec, cut.layer)
    spec = spec.at_context(cut.ctx)  # LongRoPE's factors for this context: the program states the ones it uses
    plan = _Plan(spec, cut, chips=tp or 1, split=tp is not None, tokens=tokens, pos0=pos0)
    program_op = plan.program()
    text = print_program(program_op)
    return Authored(text=text, manifest=manifest_of(program_op, dir), cut=cut, chips=tp or 1)


def manifest_of(program_op: logos.ProgramOp, dir: str) -> tuple[WeightEntry, ...]:
    """Every weight a program reads, once each, in the order the text first names it."""
    entries: dict[str, WeightEntry] = {}
    for op in program_op.walk():
        if isinstance(op, logos.WeightOp) and op.tensor.data not in entries:
            split = None if op.split is None else op.split.data
            name = op.tensor.data
            dtype = "f32" if op.storage is None else op.storage.format_name.data
            entries[name] = WeightEntry(name, os.path.join(dir, WEIGHTS_FILE), dtype, op.full_shape, split)
    return tuple(entries.values())


# -- the program API: a cut's text with its identity ---------------------------------------------------------


def written(spec: ModelSpec, cut: Cut) -> tuple[Authored, Identity]:
    """The cut `cut` of `spec`'s program, with its identity."""
    return written_in(spec, cut, "")


def written_in(spec: ModelSpec, cut: Cut, dir: str) -> tuple[Authored, Identity]:
    """The cut `cut` of `spec`'s program with its weight manifest under `dir`, and its identity."""
    authored = write(spec, cut, dir)
    return authored, Identity.of(cut, authored.text)


def written_split(spec: ModelSpec, cut: Cut, dir: str, tp: int) -> tuple[Authored, Identity]:
    """The cut `cut` of `spec`'s program split over `tp` chips with its manifest under `dir`, and its identity."""
    authored = write(spec, cut, dir, tp=tp)
    return authored, Identity.of_split(cut, tp, authored.text)


def prefill_at(spec: ModelSpec, dir: str, ctx: int, toks: list[int], pos0: int) -> Authored:
    """A prefill chunk at a run's own inputs: tokens `toks` (ids from 1) at positions from `pos0` (from 1), its
    manifest under `dir`: the text a run executes. Its identity is the cut's (`written`), whose inputs are the
    placeholders."""
    return write(spec, Cut.prefill(len(toks), ctx), dir, tokens=list(toks), pos0=pos0)


def decode_at(spec: ModelSpec, dir: str, ctx: int, tok: int, pos: int) -> Authored:
    """A decode step at a run's own inputs: token `tok` (from 1) at position `pos` (from 1), its manifest under
    `dir`."""
    return write(spec, Cut.decode(ctx), dir, tokens=[tok], pos0=pos)


def _check_split(spec: ModelSpec, cut: Cut, tp: int) -> None:
    if cut.kind not in Cut.SPLITTABLE:
        raise NotYet(NOT_YET_SPLIT)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise SpecError(f"a program is split over at least 1 chip, not {tp!r}")
    width = split_refusal(spec, tp)
    if width is not None:
        raise SpecError(f"the model does not split over {tp} chips: {width}")
    refusal = head_refusal(spec.vocab, tp) if cut.kind.partition("_")[2] in ("", "head") else None
    if refusal is not None:
        raise SpecError(f"the model does not split over {tp} chips: {refusal}")


def _check_layer(spec: ModelSpec, layer: int) -> None:
    if layer >= spec.layers:
        raise CutError(f"layer {layer} does not exist: the model has layers 0 to {spec.layers - 1}")


def layer_weights(layer: int) -> dict[str, str]:
    """Hugging Face tensor names of one layer, by role."""
    p = f"model.layers.{layer}."
    return {
        "attention_norm": p + "input_layernorm.weight",
        "query": p + "self_attn.q_proj.weight",
        "key": p + "self_attn.k_proj.weight",
        "value": p + "self_attn.v_proj.weight",
        "query_norm": p + "self_attn.q_norm.weight",  # a model with head norms only (Qwen3)
        "key_norm": p + "self_attn.k_norm.weight",
        "output": p + "self_attn.o_proj.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",  # with sandwich norms: attention's output's (Gemma)
        "pre_mlp_norm": p + "pre_feedforward_layernorm.weight",  # sandwich norms only
        "post_mlp_norm": p + "post_feedforward_layernorm.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
        "router": p + "mlp.gate.weight",  # a mixture of experts only: the router, then the experts stacked
        "expert_gates": p + "mlp.experts.gate_proj.weight",
        "expert_ups": p + "mlp.experts.up_proj.weight",
        "expert_downs": p + "mlp.experts.down_proj.weight",
    }


EMBEDDING = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


class _Plan:
    """What one program is made of, derived from its cut: rows, inputs, which sections, and how state is held."""

    def __init__(self, spec: ModelSpec, cut: Cut, chips: int, split: bool, tokens: Sequence[int] | None, pos0: int):
        self.spec, self.cut, self.chips, self.split = spec, cut, chips, split
        self.family = cut.kind.split("_")[0]
        self.rows = cut.rows or 1
        self.ctx = cut.ctx
        self.tokens = list(tokens) if tokens is not None else [1] * self.rows
        self.positions = self._positions(pos0)
        self._check_inputs()

    def _positions(self, pos0: int) -> list[int]:
        if self.family == "prefill":
            return list(range(pos0, pos0 + self.rows))
        return [pos0] * self.rows

    def _check_inputs(self) -> None:
        if len(self.tokens) != self.rows:
            raise CutError(f"{self.cut} takes {self.rows} token(s), got {len(self.tokens)}")
        for token in self.tokens:
            if not 1 <= token <= self.spec.vocab:
                raise CutError(f"token {token} is outside the vocabulary (ids 1 to {self.spec.vocab}, from 1)")
        limit = self.ctx or 1  # a forward has no history: its one token sits at position 1
        if self.cut.kind.endswith(("_embed", "_head")):
            return  # these parts take no positions
        for position in self.positions:
            if not 1 <= position <= limit:
                raise CutError(f"position {position} is outside the cache (positions 1 to {limit})")

    # -- names --------------------------------------------------------------------------------------------------

    @property
    def token_name(self) -> str:
        return "token" if self.rows == 1 else "tokens"

    @property
    def position_name(self) -> str:
        return "position" if self.rows == 1 else "positions"

    @property
    def returns_logits(self) -> bool:
        return self.family == "forward"

    # -- the program --------------------------------------------------------------------------------------------

    def program(self):
        main = self._main()
        sections = [main]
        part = self.cut.kind.partition("_")[2]
        if part in ("", "embed"):
            sections.append(self._embedding())
        if part in ("", "layer"):
            layers = [self.cut.layer] if part == "layer" else range(self.spec.layers)
            sections += [self._layer(i) for i in layers if i is not None]
        if part in ("", "head"):
            sections.append(self._head())
        return builder.program(self.cut.option(), self.spec, sections, self.chips, self.split)

    def _section(self, sym: str, args: Sequence[tuple[str, object]]) -> SectionBuilder:
        return SectionBuilder(sym, args, self.spec, self.chips)  # type: ignore[arg-type]

    def _hidden_type(self, rows: int | None = None) -> TensorType:
        return TensorType(f32, [rows or self.rows, self.spec.hidden])

    def _head_type(self) -> TensorType:
        if self.returns_logits:
            return TensorType(f32, [self.rows, self.spec.vocab])
        return TensorType(i64, [self.rows])

    def _main(self) -> func.FuncOp:
        main = self._section("main", [])
        part = self.cut.kind.partition("_")[2]
        layers = self.spec.layers
        if part == "layer":
            return self._main_layer(main)
        if part == "head":
            x = main.hidden_input(f"x{layers}", self.rows, self.spec.hidden)
            return main.ret(main.call(self._head_name(), "head", [x], self._head_type()))
        token = main.input(self.token_name, "token", self.tokens)
        if part == "embed":
            return main.ret(main.call("x0", "embedding", [token], self._hidden_type()))
        position = main.input(self.position_name, "position", self.positions)
        x = main.call("x0", "embedding", [token], self._hidden_type())
        for layer in range(layers):
            x = main.call(f"x{layer + 1}", f"layer_{layer}", [x, position], self._hidden_type())
        return main.ret(main.call(self._head_name(), "head", [x], self._head_type()))

    def _main_layer(self, main: SectionBuilder) -> func.FuncOp:
        layer = self.cut.layer or 0
        position = main.input(self.position_name, "position", self.positions)
        x = main.hidden_input(f"x{layer}", self.rows, self.spec.hidden)
        return main.ret(main.call(f"x{layer + 1}", f"layer_{layer}", [x, position], self._hidden_type()))

    def _head_name(self) -> str:
        return "logits" if self.returns_logits else "next"

    def _embedding(self) -> func.FuncOp:
        section = self._section("embedding", [(self.token_name, TensorType(i64, [self.rows]))])
        table = self._weight(section, "table", EMBEDDING, (self.spec.vocab, self.spec.hidden))
        if not self.spec.embedding_scaled:
            return section.ret(section.embed("hidden", table, section.args[0]))
        rows = section.embed("rows", table, section.args[0])  # Gemma: times the square root of the width
        return section.ret(section.scale("hidden", rows, self.spec.hidden**0.5))

    def _head(self) -> func.FuncOp:
        spec = self.spec
        section = self._section("head", [("x", self._hidden_type())])
        x = section.args[0]
        if self.family == "prefill":
            x = section.row("last", x, self.rows)
        norm = self._weight(section, "final_norm", FINAL_NORM, (spec.hidden,))
        normed = section.rms_norm("normed", x, norm, spec.norm_plus_one)
        tensor = EMBEDDING if spec.tie_embeddings else LM_HEAD
        split = HEAD_SPLIT if self.split else None  # each chip the logits of its vocabulary rows, then gathered
        table = section.weight("head_table", tensor, (spec.vocab, spec.hidden), split, spec.stored_as(tensor))
        capped = spec.final_softcap is not None  # Gemma 2: tanh(logits / cap) * cap, of the raw logits
        raw = "raw_logits" if capped else "logits"
        logits = section.linear(_part(raw, self.split), table, normed)
        if self.split:
            logits = section.all_gather(raw, logits)
        if spec.final_softcap is not None:
            logits = section.softcap("logits", logits, spec.final_softcap)
        if self.returns_logits:
            return section.ret(logits)
        return section.ret(section.argmax("next", logits))

    def _layer(self, layer: int) -> func.FuncOp:
        spec, names = self.spec, layer_weights(layer)
        section = self._section(
            f"layer_{layer}", [("x", self._hidden_type()), (self.position_name, TensorType(i64, [self.rows]))]
        )
        x, position = section.args
        split = self.split
        w = self._weight
        one = spec.norm_plus_one  # Gemma's norms scale by one plus their weight
        attention_norm = w(section, "attention_norm", names["attention_norm"], (spec.hidden,))
        normed = section.rms_norm("normed", x, attention_norm, one)
        b = functools.partial(self._biased, section, names)
        query_weight = w(section, "query_weight", names["query"], (spec.q_dim, spec.hidden))
        query = b("query", "query", lambda name: section.linear(name, query_weight, normed))
        key_weight = w(section, "key_weight", names["key"], (spec.kv_dim, spec.hidden))
        key = b("key", "key", lambda name: section.linear(name, key_weight, normed))
        value_weight = w(section, "value_weight", names["value"], (spec.kv_dim, spec.hidden))
        value = b("value", "value", lambda name: section.linear(name, value_weight, normed))
        if spec.head_norms:  # each head of the query and of the key normed before it is rotated (Qwen3)
            query_norm = w(section, "query_norm", names["query_norm"], (spec.head_dim,))
            query = section.head_rms_norm("normed_query", query, query_norm, one)
            key_norm = w(section, "key_norm", names["key_norm"], (spec.head_dim,))
            key = section.head_rms_norm("normed_key", key, key_norm, one)
        if spec.projection_norms:  # the whole query and the whole key normed before they are split into heads (OLMoE)
            query_norm = w(section, "query_norm", names["query_norm"], (spec.q_dim,))
            query = section.rms_norm("normed_query", self._whole(section, query), query_norm, one)
            query = self._own_share(section, query)
            key_norm = w(section, "key_norm", names["key_norm"], (spec.kv_dim,))
            key = section.rms_norm("normed_key", self._whole(section, key), key_norm, one)
            key = self._own_share(section, key)
        theta = spec.rope_theta_of(layer)  # Gemma 3's windowed layers rotate with a base of their own
        turned_query = section.rope("turned_query", query, position, theta, layer)
        turned_key = section.rope("turned_key", key, position, theta, layer)
        attended = self._attend(section, layer, turned_query, turned_key, value, position)
        output = w(section, "output_weight", names["output"], (spec.hidden, spec.q_dim))
        projected = b(
            "output",
            "projected",
            lambda name: self._reduced(section, name, section.linear(_part(name, split), output, attended)),
        )
        sandwich = spec.sandwich_norms  # Gemma: attention's output normed before it is added, the MLP's too
        if sandwich:
            output_norm = w(section, "output_norm", names["mlp_norm"], (spec.hidden,))
            projected = section.rms_norm("normed_projected", projected, output_norm, one)
        mixed = section.add("mixed", x, projected)
        mlp_norm = w(section, "mlp_norm", names["pre_mlp_norm" if sandwich else "mlp_norm"], (spec.hidden,))
        normed_mixed = section.rms_norm("normed_mixed", mixed, mlp_norm, one)
        if spec.experts is not None:
            return section.ret(section.add("result", mixed, self._mixture(section, names, normed_mixed)))
        gate_weight = w(section, "gate_weight", names["gate"], (spec.intermediate, spec.hidden))
        gate = b("gate", "gate", lambda name: section.linear(name, gate_weight, normed_mixed))
        up_weight = w(section, "up_weight", names["up"], (spec.intermediate, spec.hidden))
        up = b("up", "up", lambda name: section.linear(name, up_weight, normed_mixed))
        gelu = spec.activation == "gelu_tanh"  # Gemma's GeGLU; else SwiGLU
        activated = section.gelu_tanh("activated", gate) if gelu else section.silu("activated", gate)
        product = section.mul("product", activated, up)
        down_weight = w(section, "down_weight", names["down"], (spec.hidden, spec.intermediate))
        down = b(
            "down",
            "down",
            lambda name: self._reduced(section, name, section.linear(_part(name, split), down_weight, product)),
        )
        if sandwich:
            down_norm = w(section, "down_norm", names["post_mlp_norm"], (spec.hidden,))
            down = section.rms_norm("normed_down", down, down_norm, one)
        return section.ret(section.add("result", mixed, down))

    def _mixture(self, section: SectionBuilder, names: dict[str, str], x: SSAValue) -> SSAValue:
        """A mixture of experts' MLP of `x`: the router's logits (a projection, one an expert), then the stacked
        experts routed by them. Split, the router is whole on every chip and each chip holds whole experts: its
        mixture is the partial sum of its own experts' outputs, which an all-reduce adds up."""
        spec, w = self.spec, self._weight
        experts = spec.experts
        assert experts is not None
        router = w(section, "router_weight", names["router"], (experts, spec.hidden))
        logits = section.linear("router_logits", router, x)
        stacked = (experts, spec.intermediate, spec.hidden)
        gates = w(section, "gate_weights", names["expert_gates"], stacked)
        ups = w(section, "up_weights", names["expert_ups"], stacked)
        downs = w(section, "down_weights", names["expert_downs"], (experts, spec.hidden, spec.intermediate))
        routed = section.experts(_part("routed", self.split), x, logits, gates, ups, downs)
        return self._reduced(section, "routed", routed)

    def _attend(
        self,
        section: SectionBuilder,
        layer: int,
        query: SSAValue,
        key: SSAValue,
        value: SSAValue,
        position: SSAValue,
    ) -> SSAValue:
        if self.family == "forward":
            return section.self_attention("attended", query, key, value)
        spec = self.spec
        shape = [spec.kv_heads, self.ctx or 1, spec.head_dim]
        if self.family == "batch":
            shape.insert(0, self.rows)
        keys = section.cache("keys", "key", layer, shape, self.split)
        values = section.cache("values", "value", layer, shape, self.split)
        section.cache_write(key, keys, position)
        section.cache_write(value, values, position)
        window = spec.window_of(layer)
        bites = window is not None and (self.ctx or 1) > window  # within the window, every position is the window's
        scale = None if spec.query_pre_attn_scalar is None else spec.query_pre_attn_scalar**-0.5
        return section.attention(
            "attended", query, keys, values, position, window if bites else None, scale, spec.attention_softcap
        )

    def _reduced(self, section: SectionBuilder, name: str, partial: SSAValue) -> SSAValue:
        return section.all_reduce(name, partial) if self.split else partial

    def _biased(
        self,
        section: SectionBuilder,
        names: dict[str, str],
        projection: str,
        name: str,
        product: Callable[[str], SSAValue],
    ) -> SSAValue:
        """The projection's result named `name`: its product, then its bias added where the model has one (the
        product is then `unbiased_<name>`, the bias `<projection>_bias`, a vector as long as the product's rows)."""
        if projection not in self.spec.biases:
            return product(name)
        unbiased = product(f"unbiased_{name}")
        tensor = names[projection].removesuffix(".weight") + ".bias"
        shape = self.spec.weight_shape(tensor)
        assert shape is not None  # the spec has the bias of each projection in `biases`
        bias = self._weight(section, f"{projection}_bias", tensor, shape)
        return section.bias_add(name, unbiased, bias)

    def _whole(self, section: SectionBuilder, share: SSAValue) -> SSAValue:
        """Split, the chips' shares of a projection side by side, under its name (the share becomes `<name>_part`),
        for a norm that reads all its heads (vLLM's all-gather of Q and K for OLMoE's norms); else `share`."""
        if not self.split:
            return share
        name = share.name_hint
        assert name is not None
        share.name_hint = f"{name}_part"
        return section.all_gather(name, share)

    def _own_share(self, section: SectionBuilder, whole: SSAValue) -> SSAValue:
        """Split, this chip's heads of a value every chip holds whole, `<name>_part`; else `whole`."""
        return section.all_slice(f"{whole.name_hint}_part", whole) if self.split else whole

    def _weight(self, section: SectionBuilder, name: str, tensor: str, shape: tuple[int, ...]) -> SSAValue:
        split = weight_split(tensor) if self.split else None
        return section.weight(name, tensor, shape, split, self.spec.stored_as(tensor))


def _part(name: str, split: bool) -> str:
    """The name of a partial sum before its all-reduce: the reduced value keeps the plain name."""
    return f"{name}_part" if split else name
