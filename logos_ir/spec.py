"""The model specification: the sizes of a Llama-family transformer, validated once, on construction.

A `ModelSpec` is everything the author needs to write a model's program besides the weights themselves. It is built
from a preset (`ModelSpec.preset("llama-3.1-8b")`), from a Hugging Face `config.json` (`ModelSpec.from_hf_config`), or
from GGUF metadata (`logos_ir.weights`). It is frozen and hashable, so it can key caches of authored programs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from logos_ir.errors import SourceLocation, SpecError

# phi3: a Llama whose checkpoint fuses projections; qwen2: biases on Q, K and V; qwen3: an RMS norm on each head of
# Q and K
# gemma2 and gemma3_text: Gemma's norms, embedding scale, GeGLU, soft-caps and sandwich norms (`LLAMA_FEATURES`)
# mixtral, qwen3_moe and olmoe: every layer's MLP a mixture of experts (Qwen3-MoE with Qwen3's head norms, OLMoE
# with an RMS norm of the whole query and of the whole key)
SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "phi3", "qwen2", "qwen3", "gemma2", "gemma3_text", "mixtral", "qwen3_moe", "olmoe",
)  # fmt: skip
# Families refused by name, with what a LOGOS program cannot say of them yet.
REFUSED_MODEL_TYPES: dict[str, str] = {}
MIXTURES = ("mixtral", "qwen3_moe", "olmoe")
PARTIAL_ROTARY = ("phi3",)  # the families whose rotary embedding may turn part of each head (transformers' own)
GEMMAS = ("gemma2", "gemma3_text")  # gemma3_text: Gemma 2's features with head norms and a rope base per layer kind
# The projections that may add a bias, in model order, with the Hugging Face module each is (`<module>.bias`).
PROJECTIONS = {
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "output": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
# The MLP's gate activations: a Llama's SiLU (SwiGLU), Gemma's GELU with the tanh approximation (GeGLU).
ACTIVATIONS = ("silu", "gelu_tanh")
# Each Gemma feature's value in a Llama (a spec at these values computes as a Llama; `to_dict` leaves them out).
LLAMA_FEATURES: dict[str, Any] = {
    "norm_plus_one": False,
    "embedding_scaled": False,
    "activation": "silu",
    "sandwich_norms": False,
    "query_pre_attn_scalar": None,
    "attention_softcap": None,
    "final_softcap": None,
    "local_rope_theta": None,  # the windowed layers' own rope base (Gemma 3's local layers), else the model's
}
_LAYER_TENSOR = re.compile(r"model\.layers\.(?P<layer>0|[1-9][0-9]*)\.(?P<role>.+)\.(?P<kind>weight|bias)")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: Llama 3.1/3.2's (`rope_type: llama3`: wavelengths longer than the original context
    over `low_freq_factor` divided by `factor`, those shorter than over `high_freq_factor` kept, a smooth blend
    between), linear (`rope_type: linear`: every frequency divided by `factor`, which interpolates positions;
    Gemma 3's global layers, long-context Llama 2s), YaRN's (`rope_type: yarn`: the frequencies that turn fewer than
    `beta_slow` times over the original context divided by `factor`, those that turn more than `beta_fast` times
    kept, a linear ramp over the pairs between; Qwen2.5/Qwen3's long-context configs) or LongRoPE's (`rope_type:
    longrope`: each pair's frequency divided by its own factor; Phi-3/Phi-4-mini). YaRN and LongRoPE scale cos and
    sin by `attention_factor`. A field a kind does not have is None.

    A LongRoPE model has two sets of factors, `factors` (the short ones) and `long_factors` (None where they are the
    short ones): which a computation uses depends on its context (`at_context`), so a program states the one set it
    uses and its scaling has no `long_factors`."""

    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    rope_type: str = "llama3"
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    factors: tuple[float, ...] | None = None
    long_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        kinds = ("llama3", "linear", "yarn", "longrope")
        if self.rope_type not in kinds:
            raise SpecError(
                f"rope scaling of type '{self.rope_type}' is not supported (only {', '.join(repr(k) for k in kinds)})"
            )
        floats = {
            "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
            "linear": ("factor",),
            "yarn": ("factor", "beta_fast", "beta_slow", "attention_factor"),
            "longrope": ("factor", "attention_factor"),
        }[self.rope_type]
        ints = () if self.rope_type == "linear" else ("original_max_position_embeddings",)
        tuples = ("factors",) if self.rope_type == "longrope" else ()
        if self.rope_type == "longrope" and self.long_factors is not None:
            tuples = ("factors", "long_factors")
        for name in floats:
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SpecError(f"rope scaling {name} must be a positive number, not {value!r}")
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
                raise SpecError(f"rope scaling {name} must be a positive integer")
        for name in tuples:
            value = getattr(self, name)
            ok = isinstance(value, tuple) and len(value) >= 1
            if not ok or any(
                isinstance(v, bool) or not (isinstance(v, float) and math.isfinite(v) and v > 0) for v in value
            ):
                raise SpecError(f"rope scaling {name} must be a list of positive numbers, not {value!r}")
        for name in (
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "attention_factor",
            "factors",
            "long_factors",
        ):
            if name not in (*floats, *ints, *tuples) and getattr(self, name) is not None:
                raise SpecError(f"a {self.rope_type} rope scaling has no '{name}'")
        if self.rope_type == "llama3":
            assert self.low_freq_factor is not None and self.high_freq_factor is not None
            if self.high_freq_factor <= self.low_freq_factor:
                raise SpecError("rope scaling high_freq_factor must be greater than low_freq_factor")
        if self.rope_type == "yarn":
            assert self.beta_fast is not None and self.beta_slow is not None
            if self.beta_fast <= self.beta_slow:
                raise SpecError("rope scaling beta_fast must be greater than beta_slow")
        if self.long_factors is not None:
            assert self.factors is not None
            if len(self.long_factors) != len(self.factors):
                raise SpecError(
                    f"a LongRoPE scaling's long factors ({len(self.long_factors)}) and short factors"
                    f" ({len(self.factors)}) are not as many"
                )
            if self.long_factors == self.factors:
                raise SpecError("a LongRoPE scaling whose long factors are its short ones has no long_factors")

    def at_context(self, ctx: int | None) -> RopeScaling:
        """The scaling a computation over a cache of `ctx` positions rotates with: LongRoPE's long factors where
        `ctx` is longer than the original context, its short ones otherwise (llama.cpp's rule, `n_ctx_per_seq >
        n_ctx_orig_yarn`; transformers picks by the sequence's length so far, which is the same wherever a sequence
        stays on one side of the original context; a computation with no cache, an embedding or a head, rotates
        nothing and takes the short ones); every other scaling as it is."""
        if self.long_factors is None:
            return self
        assert self.original_max_position_embeddings is not None
        long = ctx is not None and ctx > self.original_max_position_embeddings
        return replace(self, factors=self.long_factors if long else self.factors, long_factors=None)

    def to_dict(self) -> dict[str, Any]:
        """As a config.json's `rope_scaling` says it (a linear one: its type and factor only; a LongRoPE one: its
        factors as both the short and the long ones, with the factor as `max_position_embeddings` over the original
        context, which the writer of the config says)."""
        out = {key: value for key, value in vars(self).items() if value is not None}
        if self.factors is not None:
            del out["factors"]
            out.pop("long_factors", None)
            out["short_factor"] = list(self.factors)
            out["long_factor"] = list(self.long_factors or self.factors)
        return out


@dataclass(frozen=True)
class ModelSpec:
    """The sizes of a Llama-family decoder-only transformer."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    tie_embeddings: bool
    rope_scaling: RopeScaling | None = field(default=None)
    # Rotary embedding over the first `rotary_dim` numbers of each head only, the rest passed through (Phi-3's
    # `partial_rotary_factor`: Phi-4-mini's 0.75 of 128); None: the whole head.
    rotary_dim: int | None = field(default=None)
    # Each query attends the last `sliding_window` positions only (Mistral, Phi-3), its own included, in every layer
    # but `full_layers` (Gemma 2 and 3's global layers, Qwen2's first `max_window_layers`), which attend the whole
    # cache. A program says both as a fact; its attention says the window where it bites (a longer cache).
    sliding_window: int | None = field(default=None)
    full_layers: tuple[int, ...] = field(default=())
    # The projections (`PROJECTIONS`' names, in its order) that add a bias after their product: Qwen2's query, key
    # and value; a Llama's with `attention_bias` (and the output) or `mlp_bias` (gate, up, down).
    biases: tuple[str, ...] = field(default=())
    # Each head of the query and of the key is RMS-normed (over its head_dim numbers, with a weight of its own, the
    # model's epsilon) before it is rotated: Qwen3's `q_norm` and `k_norm`, Gemma 3's.
    head_norms: bool = field(default=False)
    # The whole query and the whole key are RMS-normed (over all their heads' numbers at once, q_dim and kv_dim, each
    # with a weight of its own, the model's epsilon) after their projections, before they are split into heads and
    # rotated: OLMoE's (and OLMo 2's) `q_norm` and `k_norm`.
    projection_norms: bool = field(default=False)
    # Gemma's features, each at a Llama's value by default (`LLAMA_FEATURES`): every RMS norm scales by one plus its
    # weight; the embedding is scaled by the square root of the hidden size; the MLP's gate is GELU with the tanh
    # approximation (GeGLU); attention's output and the MLP's are normed too, before each is added back (sandwich
    # norms: `post_attention_layernorm` then norms attention's output, `pre_feedforward_layernorm` the MLP's input);
    # attention scores scaled by 1 / sqrt(query_pre_attn_scalar) (else 1 / sqrt(head_dim)); tanh soft-caps of the
    # scores and of the logits.
    norm_plus_one: bool = field(default=False)
    embedding_scaled: bool = field(default=False)
    activation: str = field(default="silu")
    sandwich_norms: bool = field(default=False)
    query_pre_attn_scalar: float | None = field(default=None)
    attention_softcap: float | None = field(default=None)
    final_softcap: float | None = field(default=None)
    local_rope_theta: float | None = field(default=None)
    # A mixture of experts in every layer (Mixtral, Qwen3-MoE): the MLP is `experts` SwiGLU MLPs of `intermediate`
    # numbers each, stacked; a router (a projection of the normed state to one logit an expert) scores them by a
    # softmax, each token takes its `experts_per_token` best, and their outputs are summed weighted by their
    # probabilities, divided by the chosen probabilities' sum where `renormalize` (Mixtral always, Qwen3-MoE's
    # `norm_topk_prob`). None: a dense MLP.
    experts: int | None = field(default=None)
    experts_per_token: int | None = field(default=None)
    renormalize: bool = field(default=False)
    # How the model's file stores its tensors, where not as f32: (tensor, `logos_ir.quant` format name) pairs,
    # sorted. Not a size of the model (left out of equality and `to_dict`): the author writes it into each
    # weight's sentence, so it is the program's, and its identity's.
    storage: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def stored_as(self, tensor: str) -> str | None:
        """The format the file stores `tensor` in (None: f32, or no file)."""
        return dict(self.storage).get(tensor)

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"model size '{name}' must be an integer, not {value!r}")
            if value < 1:
                raise SpecError(f"model size '{name}' must be at least 1, not {value}")
        if self.heads % self.kv_heads:
            raise SpecError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise SpecError(f"head_dim ({self.head_dim}) must be even for rotary position embeddings")
        for name in ("rms_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise SpecError(f"'{name}' must be a positive number, not {value!r}")
        rotary = self.rotary_dim
        if rotary is not None and (
            isinstance(rotary, bool)
            or not isinstance(rotary, int)
            or rotary < 2
            or rotary % 2
            or rotary >= self.head_dim
        ):
            raise SpecError(
                f"'rotary_dim' must be an even number of 2 to {self.head_dim - 2} (part of the head) or absent,"
                f" not {rotary!r}"
            )
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise SpecError(f"'sliding_window' must be a positive integer or absent, not {window!r}")
        full = self.full_layers
        if not isinstance(full, tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in full):
            raise SpecError(f"'full_layers' must be a tuple of layer numbers, not {full!r}")
        if full and (window is None or list(full) != sorted(set(full)) or full[0] < 0 or full[-1] >= self.layers):
            raise SpecError(
                f"'full_layers' {list(full)} must be layers of 0 to {self.layers - 1}, ascending, each once, of a"
                " model with a sliding window"
            )
        if full and len(full) == self.layers:
            raise SpecError("'full_layers' names every layer: a model whose window applies to none has no window")
        if not isinstance(self.biases, tuple) or list(self.biases) != [p for p in PROJECTIONS if p in self.biases]:
            raise SpecError(
                f"'biases' must name projections of {', '.join(PROJECTIONS)} in that order, not {self.biases!r}"
            )
        for name in (
            "tie_embeddings", "head_norms", "projection_norms", "norm_plus_one", "embedding_scaled", "sandwich_norms",
        ):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"'{name}' must be true or false, not {getattr(self, name)!r}")
        if self.head_norms and self.projection_norms:
            raise SpecError("a model norms each head of the query and key, or the whole of each, not both")
        if self.activation not in ACTIVATIONS:
            raise SpecError(f"'activation' must be one of {', '.join(ACTIVATIONS)}, not {self.activation!r}")
        scaling = self.rope_scaling
        if self.local_rope_theta is not None and (
            self.sliding_window is None or (scaling is not None and scaling.rope_type != "linear")
        ):
            raise SpecError("'local_rope_theta' needs a sliding window, and no rope scaling but a linear one")
        pairs = (self.rotary_dim or self.head_dim) // 2
        if scaling is not None and scaling.factors is not None and len(scaling.factors) != pairs:
            raise SpecError(f"a LongRoPE scaling has {len(scaling.factors)} factors, not one for each of {pairs} pairs")
        for name in ("query_pre_attn_scalar", "attention_softcap", "final_softcap", "local_rope_theta"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise SpecError(f"'{name}' must be a positive number or absent, not {value!r}")
            object.__setattr__(self, name, float(value))
        self._check_experts()
        # Floats are kept as floats so that printing them is one rule (`repr`) everywhere.
        object.__setattr__(self, "rms_eps", float(self.rms_eps))
        object.__setattr__(self, "rope_theta", float(self.rope_theta))

    def _check_experts(self) -> None:
        experts, top = self.experts, self.experts_per_token
        if not isinstance(self.renormalize, bool):
            raise SpecError(f"'renormalize' must be true or false, not {self.renormalize!r}")
        if experts is None and top is None:
            if self.renormalize:
                raise SpecError("'renormalize' divides the chosen experts' weights: a model without experts has none")
            return
        for name, value in (("experts", experts), ("experts_per_token", top)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"'{name}' must be a positive integer for a mixture of experts, not {value!r}")
        assert experts is not None and top is not None
        if top > experts:
            raise SpecError(f"'experts_per_token' ({top}) must be at most the number of experts ({experts})")
        if self.activation != "silu":
            raise SpecError("a mixture of experts is of SwiGLU MLPs: another activation is not said yet")
        if any(p in self.biases for p in ("gate", "up", "down")):
            raise SpecError("a mixture of experts whose MLPs add biases is not said yet")
        if self.sandwich_norms:
            raise SpecError("a mixture of experts with sandwich norms is not said yet")

    @property
    def q_dim(self) -> int:
        """Width of the query projection: heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key and value projections: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def weights(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every Hugging Face tensor name of a Llama model of this spec, with its shape, in model order. A
        generator, so a check against a file whose metadata claims a billion layers stops at the first missing."""
        yield "model.embed_tokens.weight", (self.vocab, self.hidden)
        per_layer = self._layer_weight_shapes()
        biases = self._layer_bias_shapes()
        for layer in range(self.layers):
            for role, shape in per_layer.items():
                yield f"model.layers.{layer}.{role}.weight", shape
                if role in biases:
                    yield f"model.layers.{layer}.{role}.bias", biases[role]
        yield "model.norm.weight", (self.hidden,)
        if not self.tie_embeddings:
            yield "lm_head.weight", (self.vocab, self.hidden)

    def weight_shape(self, tensor: str) -> tuple[int, ...] | None:
        """The shape of the tensor named `tensor` (a Hugging Face name), or None when the model has no such tensor."""
        if tensor == "model.embed_tokens.weight" or (tensor == "lm_head.weight" and not self.tie_embeddings):
            return (self.vocab, self.hidden)
        if tensor == "model.norm.weight":
            return (self.hidden,)
        match = _LAYER_TENSOR.fullmatch(tensor)
        if match is None or int(match["layer"]) >= self.layers:
            return None
        if match["kind"] == "bias":
            return self._layer_bias_shapes().get(match["role"])
        return self._layer_weight_shapes().get(match["role"])

    def _layer_bias_shapes(self) -> dict[str, tuple[int, ...]]:
        """The bias of each projection that adds one: as long as the projection's rows."""
        shapes = self._layer_weight_shapes()
        return {PROJECTIONS[p]: shapes[PROJECTIONS[p]][:1] for p in self.biases}

    def _layer_weight_shapes(self) -> dict[str, tuple[int, ...]]:
        hidden, inter = self.hidden, self.intermediate
        head_norms = {"self_attn.q_norm": (self.head_dim,), "self_attn.k_norm": (self.head_dim,)}
        if self.projection_norms:  # OLMoE's: as wide as the whole query and key
            head_norms = {"self_attn.q_norm": (self.q_dim,), "self_attn.k_norm": (self.kv_dim,)}
        mlp = {"mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
        if self.experts is not None:  # the router, then each projection of every expert stacked, expert by expert
            e = self.experts
            mlp = {
                "mlp.gate": (e, hidden),
                "mlp.experts.gate_proj": (e, inter, hidden),
                "mlp.experts.up_proj": (e, inter, hidden),
                "mlp.experts.down_proj": (e, hidden, inter),
            }
        return {
            "input_layernorm": (hidden,),
            "self_attn.q_proj": (self.q_dim, hidden),
            "self_attn.k_proj": (self.kv_dim, hidden),
            "self_attn.v_proj": (self.kv_dim, hidden),
            **(head_norms if self.head_norms or self.projection_norms else {}),
            "self_attn.o_proj": (hidden, self.q_dim),
            "post_attention_layernorm": (hidden,),  # with sandwich norms, attention's output's norm
            **({"pre_feedforward_layernorm": (hidden,)} if self.sandwich_norms else {}),
            **mlp,
            **({"post_feedforward_layernorm": (hidden,)} if self.sandwich_norms else {}),
        }

    def rope_theta_of(self, layer: int) -> float:
        """The rope base layer `layer` rotates with: its own where it is windowed and the model says one."""
        local = self.local_rope_theta is not None and self.window_of(layer) is not None
        return self.local_rope_theta if local else self.rope_theta  # type: ignore[return-value]

    def rope_scaling_of(self, layer: int) -> RopeScaling | None:
        """The rope scaling layer `layer` rotates with: none where it rotates with the windowed layers' own base
        (Gemma 3's local layers, as transformers' `sliding_attention` rope parameters have none)."""
        local = self.local_rope_theta is not None and self.window_of(layer) is not None
        return None if local else self.rope_scaling

    def at_context(self, ctx: int | None) -> ModelSpec:
        """The model as a computation over a cache of `ctx` positions sees it: its rope scaling the one it rotates
        with at that context (`RopeScaling.at_context`)."""
        if self.rope_scaling is None or self.rope_scaling.long_factors is None:
            return self
        return replace(self, rope_scaling=self.rope_scaling.at_context(ctx))

    def window_of(self, layer: int) -> int | None:
        """The sliding window layer `layer` attends over, or None (the whole cache)."""
        return None if layer in self.full_layers else self.sliding_window

    def splits_over(self, tp: int) -> str | None:
        """None when the model splits over `tp` chips, else the name of the first width that does not divide."""
        for name in ("heads", "kv_heads", "intermediate"):
            if getattr(self, name) % tp:
                return name
        return None

    # -- construction -------------------------------------------------------------------------------------------

    @staticmethod
    def presets() -> list[str]:
        """The names of the built-in published configurations."""
        return sorted(_PRESETS)

    @staticmethod
    def preset(name: str) -> ModelSpec:
        """A built-in configuration by name (see `presets()`)."""
        try:
            return _PRESETS[name]
        except KeyError:
            raise SpecError(
                f"unknown model preset '{name}'", hint=f"known presets: {', '.join(ModelSpec.presets())}"
            ) from None

    @staticmethod
    def from_hf_config(source: str | Path | Mapping[str, Any], where: str | None = None) -> ModelSpec:
        """The spec of a Hugging Face `config.json` of the Llama family: a path to the file or to its folder, or the
        parsed mapping (`where` names its file in messages). Reads rope settings both at the top level and under
        `rope_parameters`."""
        config, read_from = read_config(source)
        return _spec_from_config(config, where or read_from)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (for JSON reports and manifests)."""
        optional = (
            "rope_scaling",
            "rotary_dim",
            "sliding_window",
            "full_layers",
            "biases",
            "head_norms",
            "projection_norms",
            *LLAMA_FEATURES,
        )
        optional += ("experts", "experts_per_token", "renormalize", "storage")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in optional}
        out["rope_scaling"] = None if self.rope_scaling is None else self.rope_scaling.to_dict()
        if self.rotary_dim is not None:
            out["rotary_dim"] = self.rotary_dim
        if self.sliding_window is not None:  # absent for a model without one, as the program's facts leave it out
            out["sliding_window"] = self.sliding_window
        if self.full_layers:
            out["full_layers"] = list(self.full_layers)
        if self.biases:
            out["biases"] = list(self.biases)
        if self.head_norms:
            out["head_norms"] = True
        if self.projection_norms:
            out["projection_norms"] = True
        out.update({k: getattr(self, k) for k, llama in LLAMA_FEATURES.items() if getattr(self, k) != llama})
        if self.experts is not None:
            out.update(experts=self.experts, experts_per_token=self.experts_per_token, renormalize=self.renormalize)
        return out


def read_config(source: str | Path | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """A `config.json` (a folder, a file, or an already parsed mapping) as a mapping, with where it came from."""
    if isinstance(source, Mapping):
        return source, "config"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:  # ValueError: a NUL in the path
        raise SpecError(f"{path}: cannot read: {error}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        line = text.split("\n")[error.lineno - 1] if len(text) < 1_000_000 else ""
        where = SourceLocation(str(path), error.lineno, error.colno, line if len(line) <= 200 else "")
        raise SpecError(f"invalid JSON: {error.msg}", where) from None
    except RecursionError:
        raise SpecError(f"{path}: invalid JSON: nested too deeply") from None
    except ValueError:  # Python refuses to read an integer of more than 4300 digits
        raise SpecError(f"{path}: invalid JSON: a number has too many digits") from None
    if not isinstance(config, dict):
        raise SpecError(f"{path}: a config.json must hold a JSON object, not {type(config).__name__}")
    return config, str(path)


def _field(config: Mapping[str, Any], where: str, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    if key not in config or config[key] is None:
        if default is not None:
            return default
        raise SpecError(f"{where}: required field '{key}' is missing")
    value = config[key]
    if isinstance(value, bool) and kind is not bool:
        raise SpecError(f"{where}: field '{key}' must be a number, not {value!r}")
    if not isinstance(value, kind):
        raise SpecError(f"{where}: field '{key}' has the wrong type: {value!r}")
    return value


_SCALING_KEYS_ALL = (
    ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"),
    ("short_factor", "long_factor"),
)
_ROPE_KEYS = frozenset(
    {
        "rope_theta",
        "rope_type",
        "type",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
        *(key for keys in _SCALING_KEYS_ALL for key in keys),
    }
)


def _check_rope_keys(rope: Mapping[str, Any], where: str, partial: bool = False) -> None:
    """Every key of a rope object is one the spec reads (or a rotary factor of 1.0, or any where the family
    rotates part of the head: `partial`), else refused by name."""
    for key, value in rope.items():
        if key == "partial_rotary_factor" and (partial or _is_value(value, 1.0)):
            continue
        if key == "partial_rotary_factor":
            raise SpecError(
                f"{where}: 'partial_rotary_factor' is {json.dumps(value)}, which a LOGOS program cannot say yet"
                " (a Llama has 1.0)"
            )
        if key not in _ROPE_KEYS:
            raise SpecError(f"{where}: key '{key}' is not one logos-ir reads")


def _rope_settings(
    config: Mapping[str, Any], where: str, partial: bool = False
) -> tuple[float, RopeScaling | None, float | None]:
    """rope_theta and rope_scaling, either at the top level (older files) or under `rope_parameters` (newer), and
    the windowed layers' own base where the config gives one (Gemma 3: `rope_parameters` by layer kind, or the
    older `rope_local_base_freq`), else None."""
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise SpecError(f"{where}: field 'rope_parameters' must be an object")
    local = config.get("rope_local_base_freq")
    if isinstance(params, dict) and set(params) & {"full_attention", "sliding_attention"}:  # one a layer kind
        kinds = {kind: params.get(kind) for kind in params}
        for kind, sub in kinds.items():
            if kind not in ("full_attention", "sliding_attention") or not isinstance(sub, dict):
                raise SpecError(f"{where}: rope_parameters: key '{kind}' is not a layer kind logos-ir reads")
        local_params = kinds.get("sliding_attention") or {}
        _check_rope_keys(local_params, f"{where}: rope_parameters sliding_attention")
        if local_params.get("rope_type", "default") != "default":
            raise SpecError(f"{where}: a rope scaling of the windowed layers is not said yet")
        local = local_params.get("rope_theta", local)
        params = kinds.get("full_attention") or {"rope_theta": 1000000.0}  # Gemma 3's global default
    if local is not None and (isinstance(local, bool) or not isinstance(local, (int, float))):
        raise SpecError(f"{where}: the windowed layers' rope_theta must be a number, not {local!r}")
    for key, rope in (("rope_parameters", params), ("rope_scaling", config.get("rope_scaling"))):
        if isinstance(rope, dict):
            _check_rope_keys(rope, f"{where}: {key}", partial)
    if params:
        theta = _field(params, where + " rope_parameters", "rope_theta", (int, float))
        scaling = params if params.get("rope_type", "default") != "default" else None
    else:
        theta = _field(config, where, "rope_theta", (int, float), default=10000.0)
        scaling = config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise SpecError(f"{where}: field 'rope_scaling' must be an object")
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    # the windowed layers' own base is kept where it differs, or where the scaling is the global layers' only
    scaled = rope_type not in (None, "default")
    local = None if local is None or (float(local) == float(theta) and not scaled) else float(local)
    if scaling is None or rope_type in (None, "default"):
        return float(theta), None, local
    sub = where + " rope scaling"
    if rope_type == "linear":
        for key in scaling:
            if key not in ("rope_type", "type", "factor", "rope_theta", "partial_rotary_factor"):
                raise SpecError(f"{where}: key '{key}' of a linear rope scaling is not one logos-ir reads")
        return float(theta), RopeScaling(float(_field(scaling, sub, "factor", (int, float))), rope_type="linear"), local
    if rope_type in ("yarn", "longrope"):
        return float(theta), _long_context_scaling(config, scaling, rope_type, where), local
    if rope_type != "llama3":
        raise SpecError(
            f"{where}: rope scaling of type '{rope_type}' is not supported (only 'llama3', 'linear', 'yarn' and"
            " 'longrope')"
        )
    _check_scaling_keys(scaling, "llama3", where)
    return (
        float(theta),
        RopeScaling(
            factor=float(_field(scaling, sub, "factor", (int, float))),
            low_freq_factor=float(_field(scaling, sub, "low_freq_factor", (int, float))),
            high_freq_factor=float(_field(scaling, sub, "high_freq_factor", (int, float))),
            original_max_position_embeddings=_field(scaling, sub, "original_max_position_embeddings", int),
        ),
        local,
    )


# the keys each kind of rope scaling reads (besides its type, the rope base and a partial rotary factor)
_SCALING_KEYS = {
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
        "mscale_all_dim", "truncate",
    ),
    "longrope": ("factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"),
}  # fmt: skip


def _check_scaling_keys(scaling: Mapping[str, Any], kind: str, where: str) -> None:
    for key in scaling:
        if key not in ("rope_type", "type", "rope_theta", "partial_rotary_factor", *_SCALING_KEYS[kind]):
            raise SpecError(f"{where}: key '{key}' of a {kind} rope scaling is not one logos-ir reads")


def _mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor for a context `scale` times the original (transformers' `get_mscale`)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _long_context_scaling(config: Mapping[str, Any], scaling: Mapping[str, Any], kind: str, where: str) -> RopeScaling:
    """YaRN's or LongRoPE's scaling as transformers 5 computes it from a config (`_compute_yarn_parameters`,
    `_compute_longrope_parameters`). Where the config gives the original context, transformers scales by
    `max_position_embeddings` over it, llama.cpp and vLLM by `factor`: a config where the two differ is refused.
    A LongRoPE config's short and long factors are both kept (`RopeScaling.at_context` chooses)."""
    _check_scaling_keys(scaling, kind, where)
    sub = f"{where} {kind} rope scaling"
    longest = config.get("max_position_embeddings")
    if kind == "longrope" and scaling.get("original_max_position_embeddings") not in (
        None,
        config.get("original_max_position_embeddings"),
    ):
        raise SpecError(
            f"{where}: a longrope rope scaling's original_max_position_embeddings is read at the config's top level"
            " (as transformers reads it), not in the scaling"
        )
    holder = scaling if kind == "yarn" else config  # Phi-3 says LongRoPE's original context at the top level
    original = holder.get("original_max_position_embeddings")
    if original is not None or kind == "longrope":
        original = _field(holder, sub, "original_max_position_embeddings", int)
        if not (isinstance(longest, int) and not isinstance(longest, bool) and longest >= 1):
            raise SpecError(f"{where}: a {kind} rope scaling needs max_position_embeddings (a positive integer)")
        factor = longest / original
    else:  # YaRN without an original context: the longest one is it
        if not (isinstance(longest, int) and not isinstance(longest, bool) and longest >= 1):
            raise SpecError(f"{where}: a {kind} rope scaling needs max_position_embeddings (a positive integer)")
        original = longest
        factor = _field(scaling, sub, "factor", (int, float))
    stated = scaling.get("factor")
    if stated is not None and (isinstance(stated, bool) or not isinstance(stated, (int, float))):
        raise SpecError(f"{sub}: field 'factor' must be a number, not {stated!r}")
    if kind == "yarn" and stated is None:
        raise SpecError(f"{sub}: required field 'factor' is missing")
    if stated is not None and float(stated) != factor:
        raise SpecError(
            f"{where}: the {kind} rope scaling's factor is {stated!r}, but max_position_embeddings over"
            f" original_max_position_embeddings is {longest} / {original} = {factor!r}, by which transformers scales"
            " (llama.cpp and vLLM by the factor): say one factor"
        )
    attention = scaling.get("attention_factor")
    if attention is not None:
        attention = float(_field(scaling, sub, "attention_factor", (int, float)))
    if kind == "longrope":
        short = scaling.get("short_factor")
        long = scaling.get("long_factor")
        for name, value in (("short_factor", short), ("long_factor", long)):
            if not isinstance(value, list) or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) for v in value
            ):
                raise SpecError(f"{sub}: field '{name}' must be a list of numbers")
        if len(short) != len(long):  # type: ignore[arg-type]
            raise SpecError(
                f"{where}: the longrope rope scaling has {len(short)} short factors and {len(long)} long ones"  # type: ignore[arg-type]
            )
        if attention is None:
            attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        return RopeScaling(
            float(factor),
            original_max_position_embeddings=original,
            rope_type="longrope",
            attention_factor=attention,
            factors=tuple(float(v) for v in short),  # type: ignore[union-attr]
            long_factors=None if long == short else tuple(float(v) for v in long),  # type: ignore[union-attr]
        )
    if scaling.get("truncate", True) is not True:
        raise SpecError(f"{where}: a yarn rope scaling with truncate {scaling['truncate']!r} is not said yet")
    if attention is None:
        mscale, all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        for name, value in (("mscale", mscale), ("mscale_all_dim", all_dim)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise SpecError(f"{sub}: field '{name}' must be a number, not {value!r}")
        attention = _mscale(factor, mscale) / _mscale(factor, all_dim) if mscale and all_dim else _mscale(factor)
    betas = []
    for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        value = scaling.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SpecError(f"{sub}: field '{name}' must be a number, not {value!r}")
        betas.append(float(value or default))  # transformers' `or`: a zero is the default too
    return RopeScaling(
        float(factor),
        original_max_position_embeddings=original,
        rope_type="yarn",
        beta_fast=betas[0],
        beta_slow=betas[1],
        attention_factor=float(attention),
    )


# -- every key of a config.json accounted for -----------------------------------------------------------------
# A key is read into the spec (`_READ`), known not to change what the model computes (`_NEUTRAL`: provenance,
# token ids, generation defaults, training-only settings, the longest context trained on),
# or accepted only at the value a Llama computes with (`_LLAMA_VALUE`: anything else is a feature the program does
# not say). Any other key is refused by name: a model computed without what a key says would be silently wrong.

_READ = frozenset(
    {
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "tie_word_embeddings",
        "sliding_window",  # unless use_sliding_window is false (Qwen2's configs carry a window they do not use)
        "use_sliding_window",  # Qwen2's: the window applies (to the layers from max_window_layers on)
        "max_window_layers",  # Qwen2's: the first layers that attend the whole cache, where its window applies
        "layer_types",  # transformers 5's attention kind a layer: "full_attention" or "sliding_attention"
        "hidden_activation",  # Gemma's name for hidden_act
        "query_pre_attn_scalar",  # Gemma's: scores scaled by 1 / sqrt of it
        "attn_logit_softcapping",  # Gemma 2's tanh soft-cap of the scores (null: none)
        "final_logit_softcapping",  # Gemma 2's tanh soft-cap of the logits (null: none)
        "rope_local_base_freq",  # Gemma 3's (older files): the windowed layers' rope base
        "_sliding_window_pattern",  # Gemma 3's: every pattern-th layer global, where layer_types is not given
        "sliding_window_pattern",
        "attention_bias",  # a Llama's: the query, key, value and output projections add biases
        "mlp_bias",  # a Llama's: the gate, up and down projections add biases
    }
)

# Keys a mixture-of-experts family reads (`_experts`), or knows not to change what it computes at inference:
# the router's training-time noise and auxiliary loss, whether the forward returns the router's logits.
_READ_BY: dict[str, frozenset[str]] = {
    "phi3": frozenset({"partial_rotary_factor"}),
    "mixtral": frozenset(
        {"num_local_experts", "num_experts_per_tok", "router_jitter_noise", "router_aux_loss_coef",
         "output_router_logits"}
    ),
    "qwen3_moe": frozenset(
        {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
         "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits",
         # the dense MLP's width, which no layer has where every layer is a mixture (`_experts` checks it is so)
         "intermediate_size"}
    ),
    # OLMoE's intermediate_size is each expert's width; clip_qkv is read (null only: `_olmoe`)
    "olmoe": frozenset(
        {"num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob", "router_aux_loss_coef",
         "output_router_logits", "clip_qkv"}
    ),
}  # fmt: skip

_NEUTRAL = frozenset(
    {
        # provenance and loading
        "architectures", "_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype",
        "_attn_implementation", "_commit_hash", "auto_map", "tokenizer_class", "use_bfloat16", "torchscript",
        "is_llama_config", "transformers.js_config", "tf_legacy_loss",
        # token ids (the tokenizer's and the decode loop's, not the network's)
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
        "forced_bos_token_id", "forced_eos_token_id",
        # what the forward pass returns and caches, not what it computes
        "use_cache", "return_dict", "output_hidden_states", "output_attentions", "output_scores",
        "return_dict_in_generate", "pruned_heads", "chunk_size_feed_forward",
        # generation defaults (the sampler's, set on logos-run's command line)
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
        "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
        # training only: initialisation, dropout, task heads, the tensor-parallel degree of pretraining (HF's
        # slices of each product sum to the same product)
        "initializer_range", "attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop",
        "pretraining_tp", "finetuning_task",
        "id2label", "label2id", "problem_type", "task_specific_params", "prefix",
        # the longest context trained on: how far the model is good, not what it computes (transformers
        # computes past it alike; logos-run warns of a longer cache, as llama.cpp does), but for a yarn or
        # longrope scaling, which reads it (its factor over the original context)
        "max_position_embeddings",
        "original_max_position_embeddings",  # at the top level: read by a "longrope" scaling (Phi-3's)
        # an encoder-decoder's settings, false for every causal LM (a decoder-only model reads none of them)
        "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
        "tie_encoder_decoder",
    }
)  # fmt: skip

# key: the values with which a Llama computes (a key absent means the same)
_LLAMA_VALUE: dict[str, tuple[Any, ...]] = {
    "hidden_act": ("silu",),
    "partial_rotary_factor": (1.0,),
    "rope_interleaved": (False,),
    "use_bidirectional_attention": (None, False),
    "embedding_multiplier": (1.0,),
    "logits_scaling": (1.0,),
    "residual_multiplier": (1.0,),
    "attention_multiplier": (None,),
    "num_experts": (None, 0, 1),
    "num_local_experts": (None, 0, 1),
    "num_experts_per_tok": (None, 0, 1),
    "quantization_config": (None,),
}


def _is_value(value: Any, ok: Any) -> bool:
    """Whether a JSON value is `ok`: null and booleans by identity (JSON's true is not 1), numbers by value."""
    if ok is None or isinstance(ok, bool) or value is None or isinstance(value, bool):
        return value is ok
    if isinstance(ok, str) or isinstance(value, str):
        return value == ok and isinstance(value, str) and isinstance(ok, str)
    return isinstance(value, (int, float)) and value == ok


def _check_every_key(config: Mapping[str, Any], where: str) -> None:
    """Refuse, by name, the first key of `config` whose meaning the spec does not carry."""
    family_keys = _READ_BY.get(str(config.get("model_type")), frozenset())
    for key, value in config.items():
        if key in _READ or key in _NEUTRAL or key in family_keys:
            continue
        if key == "hidden_act" and config.get("model_type") in GEMMAS:  # Gemma computes with hidden_activation
            continue
        allowed = _LLAMA_VALUE.get(key)
        if allowed is None:
            raise SpecError(
                f"{where}: config key '{key}' is not one logos-ir reads",
                hint="the program would be computed without it; a key that does not change the computation "
                "belongs in logos_ir.spec's list of neutral keys",
            )
        if not any(_is_value(value, ok) for ok in allowed):
            said = " or ".join(json.dumps(ok) for ok in allowed)
            raise SpecError(
                f"{where}: config key '{key}' is {json.dumps(value)}, which a LOGOS program cannot say yet"
                f" (a Llama has {said})",
                hint="logos-ir refuses a model it would compute without this feature",
            )


def _rotary_dim(config: Mapping[str, Any], where: str, model_type: Any, head_dim: int) -> int | None:
    """How many numbers of each head rotate, where the family rotates part of it (`PARTIAL_ROTARY`): Phi-3's
    `partial_rotary_factor`, at the top level or (transformers 5) in `rope_parameters`, which wins, as
    `Phi3Config` reads it; the first int(head_dim x factor) rotate (`Phi3RotaryEmbedding`). None: the whole head."""
    if model_type not in PARTIAL_ROTARY:
        return None
    params = config.get("rope_parameters")
    nested = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    factor = nested if nested is not None else config.get("partial_rotary_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise SpecError(f"{where}: 'partial_rotary_factor' must be a number in (0, 1], not {json.dumps(factor)}")
    rotary = int(head_dim * factor)
    if rotary == head_dim:
        return None
    if rotary < 2 or rotary % 2:
        raise SpecError(
            f"{where}: 'partial_rotary_factor' {factor!r} rotates {rotary} of each head's {head_dim} numbers,"
            " which is no whole number of pairs"
        )
    return rotary


def _spec_from_config(config: Mapping[str, Any], where: str) -> ModelSpec:
    model_type = config.get("model_type")
    if model_type is None:
        raise SpecError(f"{where}: required field 'model_type' is missing")
    if isinstance(model_type, str) and model_type in REFUSED_MODEL_TYPES:
        raise SpecError(f"{where}: model_type '{model_type}' is refused: {REFUSED_MODEL_TYPES[model_type]}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SpecError(
            f"{where}: model_type '{model_type}' is not supported",
            hint=f"logos-ir writes programs for the Llama family: {', '.join(SUPPORTED_MODEL_TYPES)}",
        )
    _check_every_key(config, where)
    hidden = _field(config, where, "hidden_size", int)
    heads = _field(config, where, "num_attention_heads", int)
    if heads < 1:
        raise SpecError(f"{where}: field 'num_attention_heads' must be at least 1, not {heads}")
    head_dim = config.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise SpecError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    head_dim = _field({"head_dim": head_dim}, where, "head_dim", int)
    theta, scaling, local_theta = _rope_settings(config, where, partial=model_type in PARTIAL_ROTARY)
    layers = _field(config, where, "num_hidden_layers", int)
    window, full_layers = _windows(config, where, layers, model_type)
    return ModelSpec(
        vocab=_field(config, where, "vocab_size", int),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=_field(config, where, "num_key_value_heads", int, default=heads),
        head_dim=head_dim,
        intermediate=_field(config, where, _INTERMEDIATE.get(model_type, "intermediate_size"), int),
        rms_eps=float(_field(config, where, "rms_norm_eps", (int, float))),
        rope_theta=theta,
        tie_embeddings=bool(_field(config, where, "tie_word_embeddings", bool, default=False)),
        rope_scaling=scaling,
        rotary_dim=_rotary_dim(config, where, model_type, head_dim),
        sliding_window=window,
        full_layers=full_layers,
        biases=_biases(config, where, model_type),
        **{"head_norms": model_type in ("qwen3", "qwen3_moe"), **_gemma(config, where, model_type)},
        **_olmoe(config, where, model_type, hidden, heads, head_dim),
        local_rope_theta=local_theta,
        **_experts(config, where, model_type, layers),
    )


# The key of the MLP's width where a family names it otherwise: Qwen3-MoE's experts' own (its `intermediate_size`
# is a dense layer's, and no layer is dense).
_INTERMEDIATE = {"qwen3_moe": "moe_intermediate_size"}


def _experts(config: Mapping[str, Any], where: str, model_type: str, layers: int) -> dict[str, Any]:
    """A mixture of experts' count, choice and renormalisation, as transformers reads them: Mixtral's
    `num_local_experts`, and its chosen weights always divided by their sum (`MixtralTopKRouter`); Qwen3-MoE's
    `num_experts` (or `num_local_experts`, the name its config maps it to), divided where `norm_topk_prob`, and
    every layer a mixture (`decoder_sparse_step` 1, no `mlp_only_layers`; a dense layer among them is not said
    yet). `num_experts_per_tok` is each token's count. Nothing for other families (their keys refused by
    `_LLAMA_VALUE` above a Llama's values)."""
    if model_type not in MIXTURES:
        return {}
    if model_type == "mixtral":
        experts, renormalize = _field(config, where, "num_local_experts", int), True
    else:  # Qwen3-MoE and OLMoE: num_local_experts is the name their configs map num_experts to
        key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
        experts = _field(config, where, key, int)
        renormalize = config.get("norm_topk_prob", False)
        if not isinstance(renormalize, bool):
            raise SpecError(f"{where}: field 'norm_topk_prob' must be true or false, not {json.dumps(renormalize)}")
    if model_type == "qwen3_moe":
        step = _field(config, where, "decoder_sparse_step", int, default=1)
        only = config.get("mlp_only_layers") or []
        if step != 1 or only:
            raise SpecError(
                f"{where}: config keys 'decoder_sparse_step' {json.dumps(step)} and 'mlp_only_layers'"
                f" {json.dumps(only)} make some layers dense, which a LOGOS program cannot say yet (every layer a"
                " mixture: 1 and [])"
            )
    top = _field(config, where, "num_experts_per_tok", int)
    if experts < 1 or not 1 <= top <= experts:
        raise SpecError(
            f"{where}: a mixture of {experts} experts cannot route each token to {top} of them",
            hint="num_experts_per_tok is between 1 and the number of experts",
        )
    return {"experts": experts, "experts_per_token": top, "renormalize": renormalize}


def _olmoe(config: Mapping[str, Any], where: str, model_type: str, hidden: int, heads: int, head_dim: int) -> dict:
    """OLMoE's norms of the whole query and key (`OlmoeAttention`'s `q_norm` of hidden_size numbers and `k_norm` of
    hidden_size / heads a key-value head), refusing what transformers would compute otherwise: `clip_qkv` (Q, K and
    V clamped: not said yet), a head_dim that makes the query other than hidden_size wide (its q_norm would not fit
    it), a sliding window (its attention is given `sliding_window` where a config carries one)."""
    if model_type != "olmoe":
        return {}
    if config.get("clip_qkv") is not None:
        raise SpecError(
            f"{where}: config key 'clip_qkv' is {json.dumps(config['clip_qkv'])}, which a LOGOS program cannot say"
            " yet (Q, K and V clamped to it; an OLMoE without it has null)",
            hint="logos-ir refuses a model it would compute without this feature",
        )
    if heads * head_dim != hidden:
        raise SpecError(
            f"{where}: an OLMoE's query is hidden_size ({hidden}) wide, which its q_norm norms whole: head_dim"
            f" {head_dim} of {heads} heads is not"
        )
    if config.get("sliding_window") is not None:
        raise SpecError(f"{where}: config key 'sliding_window' is not one an 'olmoe' model reads (null only)")
    return {"projection_norms": True}


def _biases(config: Mapping[str, Any], where: str, model_type: str) -> tuple[str, ...]:
    """The projections that add a bias: Qwen2's query, key and value always (its attention has them, with no key
    saying so); a Llama's attention (query, key, value, output) with `attention_bias`, its MLP with `mlp_bias`."""
    biased = {"query", "key", "value"} if model_type == "qwen2" else set()  # Qwen3's attention has none by default
    for key, projections in (
        ("attention_bias", ("query", "key", "value", "output")),
        ("mlp_bias", ("gate", "up", "down")),
    ):
        value = config.get(key, False)
        if not isinstance(value, bool):
            raise SpecError(f"{where}: field '{key}' must be true or false, not {json.dumps(value)}")
        if value:
            biased |= set(projections)
    return tuple(p for p in PROJECTIONS if p in biased)


def _gemma(config: Mapping[str, Any], where: str, model_type: str) -> dict[str, Any]:
    """Gemma's features from its config (`LLAMA_FEATURES` for every other family): its norms, embedding scale and
    sandwich norms by its model_type, its activation, query scalar and soft-caps by their keys."""
    for key in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "hidden_activation"):
        if model_type not in GEMMAS and config.get(key) is not None:
            raise SpecError(f"{where}: config key '{key}' is not one a '{model_type}' model reads")
    if model_type not in GEMMAS:
        return {}
    activation = config.get("hidden_activation", config.get("hidden_act"))
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise SpecError(
            f"{where}: config key 'hidden_activation' is {json.dumps(activation)}, which a LOGOS program cannot say"
            ' yet (Gemma has "gelu_pytorch_tanh")'
        )
    return {
        "norm_plus_one": True,
        "embedding_scaled": True,
        "activation": "gelu_tanh",
        "sandwich_norms": True,
        "query_pre_attn_scalar": _field(config, where, "query_pre_attn_scalar", (int, float)),
        "attention_softcap": config.get("attn_logit_softcapping"),
        "final_softcap": config.get("final_logit_softcapping"),
        **({"head_norms": True} if model_type == "gemma3_text" else {}),
    }


def _windows(config: Mapping[str, Any], where: str, layers: int, model_type: str) -> tuple[int | None, tuple[int, ...]]:
    """The attention's sliding window and the layers that attend the whole cache instead, as transformers reads
    them: no window where `sliding_window` is absent or null or `use_sliding_window` is false (Qwen2's configs carry
    one they do not use); the layers' kinds from `layer_types` where it is given (transformers 5: Gemma 2 and 3's
    local and global layers), else Qwen2's first `max_window_layers` full where its window is used, else every
    layer windowed (Mistral, Phi-3)."""
    qwen = model_type in ("qwen2", "qwen3", "qwen3_moe")
    use = config.get("use_sliding_window", False if qwen else None)  # Qwen's default
    if use is not None and not isinstance(use, bool):
        raise SpecError(f"{where}: field 'use_sliding_window' must be true or false, not {json.dumps(use)}")
    window = config.get("sliding_window")
    if use is False:
        window = None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise SpecError(f"{where}: field 'sliding_window' must be a positive integer or null, not {window!r}")
    kinds = config.get("layer_types")
    pattern = config.get("_sliding_window_pattern", config.get("sliding_window_pattern"))
    if kinds is None and pattern is not None and window is not None:  # Gemma 3's every pattern-th layer global
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise SpecError(f"{where}: field 'sliding_window_pattern' must be a positive integer, not {pattern!r}")
        kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if kinds is not None:
        allowed = ("full_attention", "sliding_attention") if window is not None else ("full_attention",)
        if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in allowed for kind in kinds):
            raise SpecError(
                f"{where}: config key 'layer_types' is {json.dumps(kinds)}, which a LOGOS program cannot say"
                f" (one of {', '.join(json.dumps(k) for k in allowed)} for each of the {layers} layers)",
                hint="a layer's attention is full, or windowed where the model has a sliding window",
            )
        full = tuple(i for i, kind in enumerate(kinds) if kind == "full_attention")
    elif window is not None and use is True:  # Qwen2 and Qwen3: from max_window_layers on (by default 28)
        first = _field(config, where, "max_window_layers", int, default=28 if qwen else 0)
        full = tuple(range(min(max(first, 0), layers)))
    else:
        full = ()
    if window is None or len(full) == layers:
        return None, ()
    return window, full


_LLAMA3_SCALING = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

_PRESETS: dict[str, ModelSpec] = {
    # Small enough to run anywhere; GQA with 2 KV heads so tp 2 splits it (tests use `tiny-tp8` for wider splits).
    "tiny": ModelSpec(
        vocab=256,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
    ),
    # A tiny GQA model that splits over 2, 4 and 8 chips.
    "tiny-tp8": ModelSpec(
        vocab=256,
        hidden=64,
        layers=2,
        heads=16,
        kv_heads=8,
        head_dim=8,
        intermediate=128,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
    ),
    "smollm2-135m": ModelSpec(
        vocab=49152,
        hidden=576,
        layers=30,
        heads=9,
        kv_heads=3,
        head_dim=64,
        intermediate=1536,
        rms_eps=1e-5,
        rope_theta=100000.0,
        tie_embeddings=True,
    ),
    "llama-3.2-1b": ModelSpec(
        vocab=128256,
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        head_dim=64,
        intermediate=8192,
        rms_eps=1e-5,
        rope_theta=500000.0,
        tie_embeddings=True,
        rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192),
    ),
    "llama-3.1-8b": ModelSpec(
        vocab=128256,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        rms_eps=1e-5,
        rope_theta=500000.0,
        tie_embeddings=False,
        rope_scaling=_LLAMA3_SCALING,
    ),
    "llama-3.1-70b": ModelSpec(
        vocab=128256,
        hidden=8192,
        layers=80,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=28672,
        rms_eps=1e-5,
        rope_theta=500000.0,
        tie_embeddings=False,
        rope_scaling=_LLAMA3_SCALING,
    ),
    # The families' published shapes (each one's config.json on its hub page), for the build and compile-speed
    # checks: Qwen2.5's Q, K and V biases, Qwen3's head norms, Mistral 7B v0.1's and Phi-3-mini-4k's windows,
    # Gemma 2's features with its local (even) and global (odd) layers.
    "qwen2.5-7b": ModelSpec(
        vocab=152064,
        hidden=3584,
        layers=28,
        heads=28,
        kv_heads=4,
        head_dim=128,
        intermediate=18944,
        rms_eps=1e-6,
        rope_theta=1000000.0,
        tie_embeddings=False,
        biases=("query", "key", "value"),
    ),
    "qwen3-8b": ModelSpec(
        vocab=151936,
        hidden=4096,
        layers=36,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=12288,
        rms_eps=1e-6,
        rope_theta=1000000.0,
        tie_embeddings=False,
        head_norms=True,
    ),
    "mistral-7b-v0.1": ModelSpec(
        vocab=32000,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
        sliding_window=4096,
    ),
    "phi-3-mini-4k": ModelSpec(
        vocab=32064,
        hidden=3072,
        layers=32,
        heads=32,
        kv_heads=32,
        head_dim=96,
        intermediate=8192,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
        sliding_window=2047,
    ),
    "gemma-2-9b": ModelSpec(
        vocab=256000,
        hidden=3584,
        layers=42,
        heads=16,
        kv_heads=8,
        head_dim=256,
        intermediate=14336,
        rms_eps=1e-6,
        rope_theta=10000.0,
        tie_embeddings=True,
        sliding_window=4096,
        full_layers=tuple(range(1, 42, 2)),
        norm_plus_one=True,
        embedding_scaled=True,
        activation="gelu_tanh",
        sandwich_norms=True,
        query_pre_attn_scalar=256.0,
        attention_softcap=50.0,
        final_softcap=30.0,
    ),
    # Gemma 3 12B's text model (google/gemma-3-12b-it's text_config): every 6th layer global, rotating with base 1e6
    # scaled linearly by 8, the windowed layers over 1024 positions with base 1e4 unscaled; no soft-caps
    "gemma-3-12b": ModelSpec(
        vocab=262208,
        hidden=3840,
        layers=48,
        heads=16,
        kv_heads=8,
        head_dim=256,
        intermediate=15360,
        rms_eps=1e-6,
        rope_theta=1000000.0,
        tie_embeddings=True,
        rope_scaling=RopeScaling(8.0, rope_type="linear"),
        sliding_window=1024,
        full_layers=tuple(range(5, 48, 6)),
        head_norms=True,
        norm_plus_one=True,
        embedding_scaled=True,
        activation="gelu_tanh",
        sandwich_norms=True,
        query_pre_attn_scalar=256.0,
        local_rope_theta=10000.0,
    ),
    # Mixtures of experts (each one's config.json on its hub page): Mixtral-8x7B-v0.1's 8 experts of 14336, 2 a
    # token, renormalized; Qwen3-30B-A3B's 128 experts of 768 (moe_intermediate_size), 8 a token, renormalized
    # (norm_topk_prob), with Qwen3's head norms.
    "mixtral-8x7b": ModelSpec(
        vocab=32000,
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        rms_eps=1e-5,
        rope_theta=1000000.0,
        tie_embeddings=False,
        experts=8,
        experts_per_token=2,
        renormalize=True,
    ),
    "qwen3-30b-a3b": ModelSpec(
        vocab=151936,
        hidden=2048,
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        intermediate=768,
        rms_eps=1e-6,
        rope_theta=1000000.0,
        tie_embeddings=False,
        head_norms=True,
        experts=128,
        experts_per_token=8,
        renormalize=True,
    ),
}
