"""The `logos` dialect: a Llama-family model's computation at the tensor level, as the LOGOS author writes it.

A LOGOS program is one `logos.program` op. Its body holds `func.func` definitions, one per `##` section of the text
(`@main`, `@embedding`, `@layer_<n>`, `@head`), and, for a program split over chips, a `shard.grid @chips`. Inside a
function every value is a tensor with a static shape: runtime inputs (`logos.input`, which backends turn into kernel
arguments), named weights (`logos.weight`, the Hugging Face tensor name and full shape as attributes), KV caches as
explicit state (`logos.cache`, a memref whose layout is heads x positions x head size), and the math. Collectives
are xDSL's `shard.all_reduce`.

Token ids and positions carried by `logos.input` count from 1, as LOGOS indices do; `logos.argmax` yields ids from 1.

```mlir
logos.program cut "decode ctx=64" chips 1 digest "0000000000000000000000000000000000000000000000000000000000000000"
    model <vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 128,
           rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false> {
  func.func @layer_0(%x : tensor<1x64xf32>, %position : tensor<1xi64>) -> tensor<1x64xf32> {
    %keys = logos.cache "key" layer 0 shape [2, 64, 16] : memref<2x64x16xf32>
    %norm_weight = logos.weight "model.layers.0.input_layernorm.weight" shape [64] : tensor<64xf32>
    %normed = logos.rms_norm %x, %norm_weight epsilon 1.0e-05 : f64
                : (tensor<1x64xf32>, tensor<64xf32>) -> tensor<1x64xf32>
    %query_weight = logos.weight "model.layers.0.self_attn.q_proj.weight" shape [64, 64] : tensor<64x64xf32>
    %query = logos.linear %normed, %query_weight : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    ...
    func.return %result : tensor<1x64xf32>
  }
  ...
}
```
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import lru_cache
from typing import ClassVar, cast

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    BoolAttr,
    DenseArrayBase,
    DictionaryAttr,
    FlatSymbolRefAttr,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    NoneAttr,
    StringAttr,
    TensorType,
    UnitAttr,
    f64,
    i64,
)
from xdsl.dialects.shard import GridOp
from xdsl.ir import Attribute, Block, Dialect, Operation, ParametrizedAttribute, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import IsolatedFromAbove, NoTerminator, Pure, SymbolTable
from xdsl.utils.exceptions import VerifyException

from logos_ir import quant
from logos_ir.errors import SpecError
from logos_ir.spec import LLAMA_FEATURES, ModelSpec, RopeScaling

INPUT_KINDS = ("token", "position", "hidden")
CACHE_KINDS = ("key", "value")


# -- helpers ----------------------------------------------------------------------------------------------------


def tensor_shape(value: SSAValue | Attribute) -> tuple[int, ...]:
    """The static shape of a tensor or memref value (or type)."""
    return _shape_of(value.type if isinstance(value, SSAValue) else value)


# Attributes are immutable and hashable: unpacking each distinct one once keeps verifying and printing an 80-layer
# program from redoing the same work thousands of times.
@lru_cache(maxsize=8192)
def _shape_of(kind: Attribute) -> tuple[int, ...]:
    assert isinstance(kind, TensorType | MemRefType)
    return tuple(kind.get_shape())


def i64_array(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, list(values))


@lru_cache(maxsize=8192)
def int_values(attr: DenseArrayBase) -> tuple[int, ...]:
    return cast(tuple[int, ...], cast(DenseArrayBase[IntegerType], attr).get_values())


def _fail(op: Operation, message: str) -> VerifyException:
    return VerifyException(f"'{op.name}' op {message}")


def _expect_rank(op: Operation, what: str, shape: tuple[int, ...], rank: int) -> None:
    if len(shape) != rank:
        raise _fail(op, f"expects {what} of rank {rank}, got shape {list(shape)}")


def _expect_same(op: Operation, what: str, got: object, expected: object) -> None:
    if got != expected:
        raise _fail(op, f"{what} mismatch: got {got}, expected {expected}")


def grid_size(op: Operation, grid: FlatSymbolRefAttr) -> int:
    """The number of chips of the `shard.grid` that `grid` names, looked up from `op`."""
    found = SymbolTable.lookup_symbol(op, grid)
    if not isinstance(found, GridOp):
        raise _fail(op, f"refers to {grid}, which is not a shard.grid")
    shape = int_values(found.shape)
    if len(shape) != 1:
        raise _fail(op, f"expects a one-dimensional chip grid, got shape {list(shape)}")
    return shape[0]


class LogosOp(IRDLOperation):
    """Base of the `logos` ops: `check_` holds an op's own checks (shapes, attributes), callable on an op that is not
    yet inside a program (the parser checks each op as it reads its line); `verify_` runs them in xDSL's verifier."""

    def check_(self) -> None:
        """The op's own checks (each op that has any overrides this); an op without them has nothing to check."""

    def verify_(self) -> None:
        self.check_()


# -- the program ------------------------------------------------------------------------------------------------

MODEL_INT_KEYS = ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate")
MODEL_FLOAT_KEYS = ("rms_eps", "rope_theta")
SCALING_FLOAT_KEYS = ("factor", "low_freq_factor", "high_freq_factor")


def _float_text(value: float) -> str:
    """A float as MLIR's float literals spell it (a `.` always), exactly: repr's digits, which read back the same."""
    text = repr(value)
    if "." in text:
        return text
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0{e}{exponent}"


def _parse_entry(parser: AttrParser, key: str, first: bool) -> None:
    if not first:
        parser.parse_punctuation(",")
    parser.parse_keyword(key)
    parser.parse_punctuation("=")


def _parse_float(parser: AttrParser) -> FloatAttr:
    return FloatAttr(float(parser.parse_number()), f64)


@irdl_attr_definition
class StorageAttr(ParametrizedAttribute):
    """How a weight is stored: a GGUF block format (`logos_ir.quant.FORMATS`: its bits a number, numbers a block,
    how a block's scale and minimum are encoded), in the spirit of MLIR's `quant` types. A weight without one is
    stored as its f32 type says.

    ```mlir
    #logos.storage<q4_1>
    ```
    """

    name = "logos.storage"

    format_name: StringAttr

    def __init__(self, format_name: str):
        super().__init__(StringAttr(format_name))

    @property
    def format(self) -> quant.BlockFormat:
        return quant.FORMATS[self.format_name.data]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            pos = parser.pos
            word = parser.parse_identifier("a storage format")
            if word not in quant.FORMATS:
                parser.raise_error(
                    f"unknown storage format '{word}' (expected one of {', '.join(quant.FORMATS)})", pos, parser.pos
                )
        return [StringAttr(word)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.format_name.data}>")

    def verify(self) -> None:
        if self.format_name.data not in quant.FORMATS:
            raise VerifyException(f"unknown storage format '{self.format_name.data}'")


@irdl_attr_definition
class RopeScalingAttr(ParametrizedAttribute):
    """Llama 3's rotary frequency scaling, as the spec's `RopeScaling` holds it.

    ```mlir
    #logos.rope_scaling<factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
                        original_max_position_embeddings = 8192>
    ```
    """

    name = "logos.rope_scaling"

    factor: FloatAttr[Float64Type]
    low_freq_factor: FloatAttr[Float64Type]
    high_freq_factor: FloatAttr[Float64Type]
    original_max_position_embeddings: IntegerAttr[I64]

    @staticmethod
    def of(scaling: RopeScaling) -> RopeScalingAttr:
        return RopeScalingAttr(
            *(FloatAttr(getattr(scaling, key), f64) for key in SCALING_FLOAT_KEYS),
            IntegerAttr(scaling.original_max_position_embeddings, i64),
        )

    @property
    def scaling(self) -> RopeScaling:
        return RopeScaling(
            factor=self.factor.value.data,
            low_freq_factor=self.low_freq_factor.value.data,
            high_freq_factor=self.high_freq_factor.value.data,
            original_max_position_embeddings=self.original_max_position_embeddings.value.data,
        )

    def print_parameters(self, printer: Printer) -> None:
        floats = ", ".join(f"{key} = {_float_text(getattr(self, key).value.data)}" for key in SCALING_FLOAT_KEYS)
        size = self.original_max_position_embeddings.value.data
        printer.print_string(f"<{floats}, original_max_position_embeddings = {size}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            values: list[Attribute] = []
            for index, key in enumerate(SCALING_FLOAT_KEYS):
                _parse_entry(parser, key, index == 0)
                values.append(_parse_float(parser))
            _parse_entry(parser, "original_max_position_embeddings", False)
            values.append(IntegerAttr(parser.parse_integer(allow_boolean=False), i64))
        return values


@irdl_attr_definition
class LinearRopeScalingAttr(ParametrizedAttribute):
    """Linear rotary frequency scaling (every frequency divided by `factor`), as the spec's `RopeScaling` of type
    `linear` holds it.

    ```mlir
    #logos.linear_rope_scaling<factor = 8.0>
    ```
    """

    name = "logos.linear_rope_scaling"

    factor: FloatAttr[Float64Type]

    @property
    def scaling(self) -> RopeScaling:
        return RopeScaling(self.factor.value.data, rope_type="linear")

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<factor = {_float_text(self.factor.value.data)}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            _parse_entry(parser, "factor", True)
            return [_parse_float(parser)]


YARN_FLOAT_KEYS = ("beta_fast", "beta_slow", "attention_factor")


def _factor_and_context_text(attr: YarnRopeScalingAttr | LongRopeScalingAttr) -> str:
    """The first two entries YaRN's and LongRoPE's attributes print: the factor and the original context."""
    size = attr.original_max_position_embeddings.value.data
    return f"factor = {_float_text(attr.factor.value.data)}, original_max_position_embeddings = {size}"


def _parse_factor_and_context(parser: AttrParser) -> list[Attribute]:
    """`_factor_and_context_text`'s entries, parsed."""
    _parse_entry(parser, "factor", True)
    values: list[Attribute] = [_parse_float(parser)]
    _parse_entry(parser, "original_max_position_embeddings", False)
    values.append(IntegerAttr(parser.parse_integer(allow_boolean=False), i64))
    return values


@irdl_attr_definition
class YarnRopeScalingAttr(ParametrizedAttribute):
    """YaRN's rotary frequency scaling (`logos_ir.rope.yarn_inv_freq`), with the attention factor that scales cos
    and sin, as the spec's `RopeScaling` of type `yarn` holds it.

    ```mlir
    #logos.yarn_rope_scaling<factor = 4.0, original_max_position_embeddings = 32768, beta_fast = 32.0,
                             beta_slow = 1.0, attention_factor = 1.1386294361119891>
    ```
    """

    name = "logos.yarn_rope_scaling"

    factor: FloatAttr[Float64Type]
    original_max_position_embeddings: IntegerAttr[I64]
    beta_fast: FloatAttr[Float64Type]
    beta_slow: FloatAttr[Float64Type]
    attention_factor: FloatAttr[Float64Type]

    @staticmethod
    def of(scaling: RopeScaling) -> YarnRopeScalingAttr:
        return YarnRopeScalingAttr(
            FloatAttr(scaling.factor, f64),
            IntegerAttr(scaling.original_max_position_embeddings, i64),
            *(FloatAttr(getattr(scaling, key), f64) for key in YARN_FLOAT_KEYS),
        )

    @property
    def scaling(self) -> RopeScaling:
        return RopeScaling(
            self.factor.value.data,
            original_max_position_embeddings=self.original_max_position_embeddings.value.data,
            rope_type="yarn",
            **{key: getattr(self, key).value.data for key in YARN_FLOAT_KEYS},
        )

    def print_parameters(self, printer: Printer) -> None:
        rest = ", ".join(f"{key} = {_float_text(getattr(self, key).value.data)}" for key in YARN_FLOAT_KEYS)
        printer.print_string(f"<{_factor_and_context_text(self)}, {rest}>")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            values = _parse_factor_and_context(parser)
            for key in YARN_FLOAT_KEYS:
                _parse_entry(parser, key, False)
                values.append(_parse_float(parser))
        return values


@irdl_attr_definition
class LongRopeScalingAttr(ParametrizedAttribute):
    """LongRoPE's rotary frequency scaling: each pair's frequency divided by its own factor (the ones the program
    uses for its context), cos and sin scaled by the attention factor, as the spec's `RopeScaling` of type
    `longrope` holds it (`factor` and the original context say where the attention factor comes from).

    ```mlir
    #logos.longrope_scaling<factor = 32.0, original_max_position_embeddings = 4096,
                            attention_factor = 1.1902380714238083, factors = array<f64: 1.0, 1.5, 2.0>>
    ```
    """

    name = "logos.longrope_scaling"

    factor: FloatAttr[Float64Type]
    original_max_position_embeddings: IntegerAttr[I64]
    attention_factor: FloatAttr[Float64Type]
    factors: DenseArrayBase[Float64Type]

    @staticmethod
    def of(scaling: RopeScaling) -> LongRopeScalingAttr:
        assert scaling.factors is not None
        return LongRopeScalingAttr(
            FloatAttr(scaling.factor, f64),
            IntegerAttr(scaling.original_max_position_embeddings, i64),
            FloatAttr(scaling.attention_factor, f64),
            DenseArrayBase.from_list(f64, scaling.factors),
        )

    @property
    def scaling(self) -> RopeScaling:
        return RopeScaling(
            self.factor.value.data,
            original_max_position_embeddings=self.original_max_position_embeddings.value.data,
            rope_type="longrope",
            attention_factor=self.attention_factor.value.data,
            factors=tuple(float(v) for v in self.factors.get_values()),
        )

    def print_parameters(self, printer: Printer) -> None:
        factors = ", ".join(_float_text(float(v)) for v in self.factors.get_values())
        printer.print_string(
            f"<{_factor_and_context_text(self)}, attention_factor = {_float_text(self.attention_factor.value.data)}, "
            f"factors = array<f64: {factors}>>"
        )

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            values = _parse_factor_and_context(parser)
            _parse_entry(parser, "attention_factor", False)
            values.append(_parse_float(parser))
            _parse_entry(parser, "factors", False)
            factors = parser.parse_attribute()
            if not isinstance(factors, DenseArrayBase) or factors.elt_type != f64:
                parser.raise_error("expected the factors as array<f64: ...>")
            values.append(factors)
        return values


ScalingAttr = RopeScalingAttr | LinearRopeScalingAttr | YarnRopeScalingAttr | LongRopeScalingAttr
# the rotation's property that holds each kind of scaling
SCALING_PROPS = {
    "llama3": "scaling",
    "linear": "linear_scaling",
    "yarn": "yarn_scaling",
    "longrope": "longrope_scaling",
}


def scaling_attr(scaling: RopeScaling) -> ScalingAttr:
    """The attribute that says `scaling`, of its kind."""
    if scaling.rope_type == "yarn":
        return YarnRopeScalingAttr.of(scaling)
    if scaling.rope_type == "longrope":
        return LongRopeScalingAttr.of(scaling)
    if scaling.rope_type == "linear":
        return LinearRopeScalingAttr(FloatAttr(scaling.factor, f64))
    return RopeScalingAttr.of(scaling)


def _feature_attr(value: bool | str | float) -> Attribute:
    if isinstance(value, bool):
        return BoolAttr.from_bool(value)
    return StringAttr(value) if isinstance(value, str) else FloatAttr(value, f64)


def _feature_value(attr: Attribute) -> bool | str | float:
    if isinstance(attr, StringAttr):
        return attr.data
    if isinstance(attr, FloatAttr):
        return attr.value.data
    if isinstance(attr, IntegerAttr) and attr.type == IntegerType(1):
        return bool(attr.value.data)
    raise SpecError(f"a model feature is a boolean, a string or an f64 number, not {attr}")


@irdl_attr_definition
class ModelAttr(ParametrizedAttribute):
    """A model's spec, the `model` of a `logos.program`: its sizes, its norm's epsilon, its rotary base and scaling,
    and whether its head reads the embedding's table. It verifies as the spec does, so IR cannot hold a model the
    author could not have written.

    ```mlir
    #logos.model<vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 128,
                 rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false>
    ```
    """

    name = "logos.model"

    vocab: IntegerAttr[I64]
    hidden: IntegerAttr[I64]
    layers: IntegerAttr[I64]
    heads: IntegerAttr[I64]
    kv_heads: IntegerAttr[I64]
    head_dim: IntegerAttr[I64]
    intermediate: IntegerAttr[I64]
    rms_eps: FloatAttr[Float64Type]
    rope_theta: FloatAttr[Float64Type]
    tie_embeddings: BoolAttr
    rope_scaling: RopeScalingAttr | LinearRopeScalingAttr | YarnRopeScalingAttr | LongRopeScalingAttr | NoneAttr
    rotary_dim: IntegerAttr[I64] | NoneAttr  # the numbers of each head that rotate (none: all of them)
    sliding_window: IntegerAttr[I64] | NoneAttr
    full_layers: DenseArrayBase[I64]  # the layers that attend the whole cache despite the window (empty: not printed)
    biases: ArrayAttr[StringAttr]  # the projections that add a bias (empty: none, and not printed)
    head_norms: BoolAttr  # each head of the query and of the key RMS-normed (false: not printed)
    projection_norms: BoolAttr  # the whole query and the whole key RMS-normed (false: not printed)
    features: DictionaryAttr  # Gemma's features where they differ from a Llama's (`LLAMA_FEATURES`; empty: not printed)
    experts: IntegerAttr[I64] | NoneAttr  # a mixture of experts in every layer: their number (none: a dense MLP)
    experts_per_token: IntegerAttr[I64] | NoneAttr  # how many experts each token is routed to
    renormalize: BoolAttr  # the chosen experts' weights divided by their sum (false: not printed)

    @staticmethod
    def of(spec: ModelSpec) -> ModelAttr:
        scaling = NoneAttr() if spec.rope_scaling is None else scaling_attr(spec.rope_scaling)
        window = NoneAttr() if spec.sliding_window is None else IntegerAttr(spec.sliding_window, i64)
        return ModelAttr(
            *(IntegerAttr(getattr(spec, key), i64) for key in MODEL_INT_KEYS),
            *(FloatAttr(getattr(spec, key), f64) for key in MODEL_FLOAT_KEYS),
            BoolAttr.from_bool(spec.tie_embeddings),
            scaling,
            NoneAttr() if spec.rotary_dim is None else IntegerAttr(spec.rotary_dim, i64),
            window,
            DenseArrayBase.from_list(i64, spec.full_layers),
            ArrayAttr([StringAttr(p) for p in spec.biases]),
            BoolAttr.from_bool(spec.head_norms),
            BoolAttr.from_bool(spec.projection_norms),
            DictionaryAttr(
                {  # in key order, as MLIR prints a dictionary
                    key: _feature_attr(getattr(spec, key))
                    for key, llama in sorted(LLAMA_FEATURES.items())
                    if getattr(spec, key) != llama
                }
            ),
            NoneAttr() if spec.experts is None else IntegerAttr(spec.experts, i64),
            NoneAttr() if spec.experts_per_token is None else IntegerAttr(spec.experts_per_token, i64),
            BoolAttr.from_bool(spec.renormalize),
        )

    @property
    def spec(self) -> ModelSpec:
        """The spec this attribute holds (SpecError when its values are no valid spec: the program op that holds it
        reports that as its verifier's error, at the op's location)."""
        scaling = self.rope_scaling
        return ModelSpec(
            **{key: getattr(self, key).value.data for key in MODEL_INT_KEYS},
            **{key: getattr(self, key).value.data for key in MODEL_FLOAT_KEYS},
            tie_embeddings=bool(self.tie_embeddings.value.data),
            rope_scaling=None if isinstance(scaling, NoneAttr) else scaling.scaling,
            rotary_dim=self.rotary_dim.value.data if isinstance(self.rotary_dim, IntegerAttr) else None,
            sliding_window=self.sliding_window.value.data if isinstance(self.sliding_window, IntegerAttr) else None,
            full_layers=tuple(self.full_layers.get_values()),
            biases=tuple(p.data for p in self.biases.data),
            head_norms=bool(self.head_norms.value.data),
            projection_norms=bool(self.projection_norms.value.data),
            **{key: _feature_value(value) for key, value in self.features.data.items()},
            experts=self.experts.value.data if isinstance(self.experts, IntegerAttr) else None,
            experts_per_token=(
                self.experts_per_token.value.data if isinstance(self.experts_per_token, IntegerAttr) else None
            ),
            renormalize=bool(self.renormalize.value.data),
        )

    def print_parameters(self, printer: Printer) -> None:
        entries = [f"{key} = {getattr(self, key).value.data}" for key in MODEL_INT_KEYS]
        entries += [f"{key} = {_float_text(getattr(self, key).value.data)}" for key in MODEL_FLOAT_KEYS]
        entries.append(f"tie_embeddings = {'true' if self.tie_embeddings.value.data else 'false'}")
        printer.print_string("<" + ", ".join(entries))
        if not isinstance(self.rope_scaling, NoneAttr):
            printer.print_string(", rope_scaling = ")
            printer.print_attribute(self.rope_scaling)
        if isinstance(self.rotary_dim, IntegerAttr):
            printer.print_string(f", rotary_dim = {self.rotary_dim.value.data}")
        if isinstance(self.sliding_window, IntegerAttr):
            printer.print_string(f", sliding_window = {self.sliding_window.value.data}")
        if self.full_layers.get_values():
            printer.print_string(", full_layers = ")
            printer.print_attribute(self.full_layers)
        if self.biases.data:
            printer.print_string(", biases = ")
            printer.print_attribute(self.biases)
        if self.head_norms.value.data:
            printer.print_string(", head_norms = true")
        if self.projection_norms.value.data:
            printer.print_string(", projection_norms = true")
        if self.features.data:
            printer.print_string(", features = ")
            printer.print_attribute(self.features)
        for key in ("experts", "experts_per_token"):
            value = getattr(self, key)
            if isinstance(value, IntegerAttr):
                printer.print_string(f", {key} = {value.value.data}")
        if self.renormalize.value.data:
            printer.print_string(", renormalize = true")
        printer.print_string(">")

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            values: list[Attribute] = []
            for index, key in enumerate(MODEL_INT_KEYS):
                _parse_entry(parser, key, index == 0)
                values.append(IntegerAttr(parser.parse_integer(allow_boolean=False), i64))
            for key in MODEL_FLOAT_KEYS:
                _parse_entry(parser, key, False)
                values.append(_parse_float(parser))
            _parse_entry(parser, "tie_embeddings", False)
            values.append(BoolAttr.from_bool(parser.parse_boolean()))
            optional: dict[str, Attribute] = {"rope_scaling": NoneAttr(), "rotary_dim": NoneAttr()}
            optional["sliding_window"] = NoneAttr()
            optional["full_layers"] = DenseArrayBase.from_list(i64, ())
            optional["biases"] = ArrayAttr([])
            optional["head_norms"] = BoolAttr.from_bool(False)
            optional["projection_norms"] = BoolAttr.from_bool(False)
            optional["features"] = DictionaryAttr({})
            optional["experts"] = NoneAttr()
            optional["experts_per_token"] = NoneAttr()
            optional["renormalize"] = BoolAttr.from_bool(False)
            keys = list(optional)  # each at most once, in this order
            while parser.parse_optional_punctuation(",") is not None:
                key = next((k for k in keys if parser.parse_optional_keyword(k) is not None), None)
                if key is None:
                    parser.raise_error(f"expected one of {', '.join(keys)}")
                keys = keys[keys.index(key) + 1 :]
                parser.parse_punctuation("=")
                if key in ("rotary_dim", "sliding_window", "experts", "experts_per_token"):
                    optional[key] = IntegerAttr(parser.parse_integer(allow_boolean=False), i64)
                elif key in ("head_norms", "projection_norms", "renormalize"):
                    optional[key] = BoolAttr.from_bool(parser.parse_boolean())
                else:
                    optional[key] = parser.parse_attribute()
            values += optional.values()
        return values


@irdl_op_definition
class ProgramOp(LogosOp):
    """One LOGOS program: one cut of one model, with the identity of the text it was written as.

    `cut` is the cut's option form (`decode ctx=64`), `chips` the number of chips it is split over (1 when it is
    not), `digest` the SHA-256 (64 hex digits) of its LOGOS text, `model` the spec. The body holds one
    `builtin.module`, the program's symbol table, which holds its `func.func` sections and, when split, its
    `shard.grid` (`block` is that module's block). The module makes the sections' calls resolve by upstream MLIR's
    symbol rules too: upstream knows no `logos` op, so it takes none for a symbol table (an unregistered op of one
    region may be one it cannot see into: `SymbolTable::getNearestSymbolTable` stops there), and a `func.call`
    finds its callee in the nearest enclosing module, as in a `gpu.module`.

    ```mlir
    logos.program cut "decode_embed" chips 1 digest "0000000000000000000000000000000000000000000000000000000000000000"
        model <vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, intermediate = 128,
               rms_eps = 1.0e-05, rope_theta = 10000.0, tie_embeddings = false> {
      builtin.module {
        func.func @main() -> tensor<1x64xf32> {
          %token = logos.input "token" values [1] : tensor<1xi64>
          %x0 = func.call @embedding(%token) : (tensor<1xi64>) -> tensor<1x64xf32>
          func.return %x0 : tensor<1x64xf32>
        }
        func.func @embedding(%token : tensor<1xi64>) -> tensor<1x64xf32> {
          ...
        }
      }
    }
    ```
    """

    name = "logos.program"

    cut = prop_def(StringAttr)
    chips = prop_def(IntegerAttr[I64])
    digest = prop_def(StringAttr)
    model = prop_def(ModelAttr)
    body = region_def("single_block")  # one builtin.module: the program's symbol table

    traits = traits_def(NoTerminator(), IsolatedFromAbove())

    assembly_format = "`cut` $cut `chips` $chips `digest` $digest `model` $model $body attr-dict"

    def __init__(self, cut: str, chips: int, digest: str, spec: ModelSpec, contents: Sequence[Operation] = ()):
        properties: dict[str, Attribute] = {"cut": StringAttr(cut), "chips": IntegerAttr(chips, i64)}
        properties |= {"digest": StringAttr(digest), "model": ModelAttr.of(spec)}
        super().__init__(properties=properties, regions=[program_body(contents)])

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec

    @property
    def module(self) -> ModuleOp:
        """The module the body holds: the program's symbol table."""
        module = self.body.block.first_op
        if not isinstance(module, ModuleOp) or module.next_op is not None:
            raise _fail(self, "expects its body to hold one builtin.module, the program's sections and chip grid")
        return module

    @property
    def block(self) -> Block:
        """The program's sections (and, when split, its `shard.grid`), in order: the block of its module."""
        return self.module.body.block

    def function(self, name: str) -> func.FuncOp | None:
        """The section `@name` of this program, or None."""
        for op in self.block.ops:
            if isinstance(op, func.FuncOp) and op.sym_name.data == name:
                return op
        return None

    def check_(self) -> None:
        try:
            _ = self.model.spec
        except SpecError as error:
            raise _fail(self, f"has a model attribute that is not a valid spec: {error.message}") from None
        if self.chips.value.data < 1:
            raise _fail(self, f"expects at least 1 chip, got {self.chips.value.data}")
        digest = self.digest.data
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise _fail(self, f"expects a digest of 64 lowercase hex digits, got '{digest}'")
        if self.function("main") is None:  # (`function` reads the module: a body of no module is refused there)
            raise _fail(self, "has no @main section")
        self._check_against_model()

    def _check_against_model(self) -> None:
        """Each attention says its layer's sliding window exactly where the window bites (a cache longer than it),
        and nowhere else: a program cannot attend past the window its model has, nor window a full layer; its norms,
        scores' scale and soft-cap are its model's (Gemma's)."""
        spec = self.model.spec
        scale = None if spec.query_pre_attn_scalar is None else spec.query_pre_attn_scalar**-0.5
        for op in self.walk():
            if isinstance(op, MixtureOp):
                said = (op.experts_routed(), op.top_k.value.data, op.renormalize is not None)
                if said != (spec.experts, spec.experts_per_token, spec.renormalize):
                    raise _fail(
                        self,
                        f"has a mixture of (experts, experts a token, renormalized) {said}, not its model's"
                        f" {(spec.experts, spec.experts_per_token, spec.renormalize)}",
                    )
            if (
                isinstance(op, RopeOp)
                and (None if op.rotary_dim is None else op.rotary_dim.value.data) != spec.rotary_dim
            ):
                said = "the whole head" if op.rotary_dim is None else f"{op.rotary_dim.value.data} numbers of each head"
                raise _fail(self, f"has a rotation of {said}, not its model's rotary_dim {spec.rotary_dim}")
            if isinstance(op, ScaledRMSNormOp) and (op.plus_one is not None) != spec.norm_plus_one:
                raise _fail(self, f"has an RMS norm {'without' if spec.norm_plus_one else 'with'} its model's one plus")
            if isinstance(op, AttentionOp):
                said = (
                    None if op.scale is None else op.scale.value.data,
                    None if op.softcap is None else op.softcap.value.data,
                )
                if said != (scale, spec.attention_softcap):
                    raise _fail(
                        self,
                        f"has an attention whose scale and soft-cap {said} are not its model's"
                        f" {(scale, spec.attention_softcap)}",
                    )
            if isinstance(op, SelfAttentionOp) and spec.sliding_window is not None:
                rows = tensor_shape(op.query)[0]
                if rows > spec.sliding_window:
                    raise _fail(self, f"attends {rows} rows with no history, more than the sliding window")
            if not isinstance(op, AttentionOp):
                continue
            cache = op.keys.owner
            if not isinstance(cache, CacheOp):
                continue
            window = spec.window_of(cache.layer.value.data)
            bites = window is not None and tensor_shape(op.keys)[-2] > window
            said = None if op.window is None else op.window.value.data
            if said != (window if bites else None):
                raise _fail(
                    self, f"has an attention of layer {cache.layer.value.data} {window_mismatch(said, window, bites)}"
                )


def window_mismatch(said: int | None, window: int | None, bites: bool) -> str:
    """What is wrong with an attention that says window `said` where its layer's is `window` (`bites`: the cache is
    longer than it), for the verifier's and the parser's messages."""
    what = "over every cached position" if said is None else f"within the last {said} positions"
    if not bites:
        return f"{what}, but its layer's attention has no window that bites here (a cache the window covers, or none)"
    return f"{what}, but its layer's attention slides over a window of {window} positions"


def program_body(contents: Sequence[Operation]) -> Region:
    """A `logos.program`'s body: one module holding `contents` (its sections and chip grid), detached first."""
    for op in contents:
        if op.parent is not None:
            op.detach()
    return Region(Block([ModuleOp(list(contents))]))


# -- values that enter a function -------------------------------------------------------------------------------


@irdl_op_definition
class InputOp(LogosOp):
    """A runtime input: token ids or positions (from 1, placeholder values that a run replaces), or a hidden state.

    ```mlir
    %token = logos.input "token" values [1] : tensor<1xi64>
    %x3 = logos.input "hidden" : tensor<1x64xf32>
    ```
    """

    name = "logos.input"

    kind = prop_def(StringAttr)
    values = opt_prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$kind (`values` $values^)? attr-dict `:` type($result)"

    def __init__(self, kind: str, result_type: TensorType, values: Sequence[int] | None = None):
        super().__init__(
            properties={"kind": StringAttr(kind), "values": None if values is None else i64_array(values)},
            result_types=[result_type],
        )

    def check_(self) -> None:
        kind = self.kind.data
        shape = tensor_shape(self.result)
        if kind not in INPUT_KINDS:
            raise _fail(self, f"has unknown input kind '{kind}' (expected one of {', '.join(INPUT_KINDS)})")
        if kind == "hidden":
            _expect_rank(self, "a hidden state", shape, 2)
            if self.values is not None:
                raise _fail(self, "a hidden-state input carries no values")
            return
        _expect_rank(self, f"{kind}s", shape, 1)
        element = cast(TensorType, self.result.type).element_type
        if not isinstance(element, IntegerType) or element.width.data != 64:
            raise _fail(self, f"expects {kind}s of type i64, got {element}")
        if self.values is None:
            raise _fail(self, f"a {kind} input needs its values")
        values = int_values(self.values)
        _expect_same(self, "number of values", len(values), shape[0])
        if any(v < 1 for v in values):
            raise _fail(self, f"{kind}s count from 1, got {list(values)}")


class _Sharded:
    """Shared by weights and caches: the full shape, and optionally how chips split it over a grid."""

    def split_share(
        self,
        op: Operation,
        full: tuple[int, ...],
        split: StringAttr | None,
        grid: FlatSymbolRefAttr | None,
        axis_of: dict[str, int],
    ) -> tuple[int, ...]:
        if split is None:
            if grid is not None:
                raise _fail(op, "names a grid but no split")
            return full
        if grid is None:
            raise _fail(op, "is split but names no grid")
        if split.data not in axis_of:
            raise _fail(op, f"cannot be split by {split.data} (expected one of {', '.join(axis_of)})")
        axis = axis_of[split.data]
        chips = grid_size(op, grid)
        if full[axis] % chips:
            raise _fail(op, f"{split.data} ({full[axis]}) do not divide over {chips} chips")
        share = list(full)
        share[axis] //= chips
        return tuple(share)


@irdl_op_definition
class WeightOp(LogosOp, _Sharded):
    """A named weight (its Hugging Face tensor name) with its full shape; when split over chips, this chip's share.

    ```mlir
    %w = logos.weight "model.layers.0.self_attn.q_proj.weight" shape [64, 64] : tensor<64x64xf32>
    %w_share = logos.weight "model.layers.0.self_attn.q_proj.weight" shape [64, 64] split "rows" over @chips
           : tensor<32x64xf32>
    %w_q4 = logos.weight "model.layers.0.mlp.down_proj.weight" shape [64, 128] stored <q4_1>
           : tensor<64x128xf32>
    %gates = logos.weight "model.layers.0.mlp.experts.gate_proj.weight" shape [4, 32, 64] split "experts"
           over @chips : tensor<2x32x64xf32>
    ```

    Stacked experts (three axes, experts first) split only by experts: chip c holds experts
    [c * E / chips, (c + 1) * E / chips), each whole.

    A weight `stored` in a block format holds its rows (the last axis) in whole blocks; its value is the
    dequantized tensor (f32). A split by columns must leave each chip whole blocks.
    """

    name = "logos.weight"

    tensor = prop_def(StringAttr)
    shape = prop_def(DenseArrayBase[I64])
    split = opt_prop_def(StringAttr)
    grid = opt_prop_def(FlatSymbolRefAttr)
    storage = opt_prop_def(StorageAttr)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = (
        "$tensor `shape` $shape (`split` $split^)? (`over` $grid^)? (`stored` $storage^)? attr-dict `:` type($result)"
    )

    @property
    def full_shape(self) -> tuple[int, ...]:
        return int_values(self.shape)

    def check_(self) -> None:
        full = self.full_shape
        if not full or any(d < 1 for d in full):
            raise _fail(self, f"of '{self.tensor.data}' has an invalid shape {list(full)}")
        axes = {"rows": 0, "columns": len(full) - 1}
        if len(full) == 3:  # stacked experts [experts, ...]: a chip holds whole experts
            axes = {"experts": 0}
        share = self.split_share(self, full, self.split, self.grid, axes)
        _expect_same(self, f"shape of '{self.tensor.data}'", tensor_shape(self.result), share)
        if self.storage is not None:
            fmt = self.storage.format
            if not fmt.row_fits(full[-1]):
                raise _fail(
                    self, f"of '{self.tensor.data}': rows of {full[-1]} are not whole {fmt.name} blocks of {fmt.block}"
                )
            if self.split is not None and self.split.data == "columns" and not fmt.row_fits(share[-1]):
                raise _fail(
                    self,
                    f"of '{self.tensor.data}' splits its {fmt.name} blocks of {fmt.block}: "
                    f"a chip's {share[-1]} columns are not whole blocks",
                )


@irdl_op_definition
class CacheOp(LogosOp, _Sharded):
    """A layer's key or value cache: state that persists between steps, laid out [sequences x] heads x positions x
    head size (the leading sequences axis only for a batch, where each sequence has its own cache).

    ```mlir
    %keys = logos.cache "key" layer 0 shape [2, 64, 16] : memref<2x64x16xf32>
    ```
    """

    name = "logos.cache"

    kind = prop_def(StringAttr)
    layer = prop_def(IntegerAttr[I64])
    shape = prop_def(DenseArrayBase[I64])
    split = opt_prop_def(StringAttr)
    grid = opt_prop_def(FlatSymbolRefAttr)
    result = result_def(MemRefType)

    assembly_format = (
        "$kind `layer` $layer `shape` $shape (`split` $split^)? (`over` $grid^)? attr-dict `:` type($result)"
    )

    @property
    def full_shape(self) -> tuple[int, ...]:
        return int_values(self.shape)

    @property
    def per_sequence(self) -> bool:
        """True for a batch's caches: one per sequence (a leading sequences axis)."""
        return len(self.full_shape) == 4

    def check_(self) -> None:
        if self.kind.data not in CACHE_KINDS:
            raise _fail(self, f"has unknown cache kind '{self.kind.data}' (expected key or value)")
        full = self.full_shape
        if len(full) not in (3, 4) or any(d < 1 for d in full):
            raise _fail(self, f"expects a shape [sequences,] heads, positions, head size; got {list(full)}")
        share = self.split_share(self, full, self.split, self.grid, {"heads": len(full) - 3})
        _expect_same(self, "cache shape", tensor_shape(self.result), share)


# -- the math ---------------------------------------------------------------------------------------------------


@irdl_op_definition
class EmbedOp(LogosOp):
    """The rows of an embedding table at token ids (from 1).

    ```mlir
    %hidden = logos.embed %table, %token : (tensor<256x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.embed"

    table = operand_def(TensorType)
    tokens = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$table `,` $tokens attr-dict `:` functional-type(operands, results)"

    def check_(self) -> None:
        table, tokens, out = tensor_shape(self.table), tensor_shape(self.tokens), tensor_shape(self.result)
        _expect_rank(self, "a table", table, 2)
        _expect_rank(self, "tokens", tokens, 1)
        _expect_same(self, "result shape", out, (tokens[0], table[1]))


class ScaledRMSNormOp(LogosOp):
    """Base of the RMS norms: an input, a weight that scales it (or one plus it), the model's epsilon. Neither norm
    is the other's subclass, so a lane that lowers one never takes the other for it."""

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    epsilon = prop_def(FloatAttr)
    plus_one = opt_prop_def(UnitAttr)  # scaled by one plus the weight (Gemma's norms)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $weight `epsilon` $epsilon (`plus_one` $plus_one^)? attr-dict "
        "`:` functional-type(operands, results)"
    )


@irdl_op_definition
class RMSNormOp(ScaledRMSNormOp):
    """RMS normalisation of each row, scaled by a weight: x / sqrt(mean(x^2) + epsilon) * weight.

    ```mlir
    %normed = logos.rms_norm %x, %w epsilon 1.0e-05 : f64 : (tensor<1x64xf32>, tensor<64xf32>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.rms_norm"

    def check_(self) -> None:
        x, weight = tensor_shape(self.input), tensor_shape(self.weight)
        _expect_rank(self, "input", x, 2)
        _expect_same(self, "weight shape", weight, (x[1],))
        _expect_same(self, "result shape", tensor_shape(self.result), x)


@irdl_op_definition
class HeadRMSNormOp(ScaledRMSNormOp):
    """RMS normalisation of each head of each row, scaled by a weight as long as a head: the row is cut into heads of
    the weight's length and each is normed alone (Qwen3's and Gemma 3's `q_norm` and `k_norm`).

    ```mlir
    %q = logos.head_rms_norm %query, %w epsilon 1.0e-05 : f64 : (tensor<1x64xf32>, tensor<16xf32>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.head_rms_norm"

    def check_(self) -> None:
        x, weight = tensor_shape(self.input), tensor_shape(self.weight)
        _expect_rank(self, "input", x, 2)
        _expect_rank(self, "weight", weight, 1)
        if weight[0] == 0 or x[1] % weight[0]:
            raise _fail(self, f"expects rows of whole heads: {x[1]} numbers are not heads of {weight[0]}")
        _expect_same(self, "result shape", tensor_shape(self.result), x)


@irdl_op_definition
class LinearOp(LogosOp):
    """A linear projection by a weight in Hugging Face layout [out, in]: result = input @ weight^T.

    ```mlir
    %q = logos.linear %normed, %w : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.linear"

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $weight attr-dict `:` functional-type(operands, results)"

    def check_(self) -> None:
        x, weight = tensor_shape(self.input), tensor_shape(self.weight)
        _expect_rank(self, "input", x, 2)
        _expect_rank(self, "weight", weight, 2)
        if x[1] != weight[1]:
            raise _fail(self, f"cannot apply a {weight[0]} by {weight[1]} weight to rows of {x[1]}")
        _expect_same(self, "result shape", tensor_shape(self.result), (x[0], weight[0]))


@irdl_op_definition
class RopeOp(LogosOp):
    """Rotary position embedding of each head of each row at that row's position (from 1), rotating the two halves
    of each head (the Hugging Face Llama convention), or of its first `rotary_dim` numbers only, the rest passed
    through (Phi-3's partial rotary). `scaling` holds Llama 3's frequency scaling, `linear_scaling` a linear one,
    `yarn_scaling` YaRN's, `longrope_scaling` LongRoPE's, where the rotation has one (`rope_scaling` reads it).

    ```mlir
    %turned = logos.rope %q, %position head_dim 16 theta 1.0e+04 : f64
                : (tensor<1x64xf32>, tensor<1xi64>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.rope"

    input = operand_def(TensorType)
    positions = operand_def(TensorType)
    head_dim = prop_def(IntegerAttr[I64])
    rotary_dim = opt_prop_def(IntegerAttr[I64])
    theta = prop_def(FloatAttr)
    scaling = opt_prop_def(RopeScalingAttr)
    linear_scaling = opt_prop_def(LinearRopeScalingAttr)
    yarn_scaling = opt_prop_def(YarnRopeScalingAttr)
    longrope_scaling = opt_prop_def(LongRopeScalingAttr)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $positions `head_dim` $head_dim (`rotary_dim` $rotary_dim^)? `theta` $theta (`scaling` $scaling^)? "
        "(`linear_scaling` $linear_scaling^)? (`yarn_scaling` $yarn_scaling^)? "
        "(`longrope_scaling` $longrope_scaling^)? attr-dict `:` functional-type(operands, results)"
    )

    @property
    def rope_scaling(self) -> RopeScaling | None:
        """The scaling this rotation applies, of either kind, or None."""
        said = [
            s for s in (self.scaling, self.linear_scaling, self.yarn_scaling, self.longrope_scaling) if s is not None
        ]
        return None if not said else said[0].scaling

    def check_(self) -> None:
        x, positions = tensor_shape(self.input), tensor_shape(self.positions)
        head_dim = self.head_dim.value.data
        _expect_rank(self, "input", x, 2)
        _expect_same(self, "number of positions", positions, (x[0],))
        if head_dim < 2 or head_dim % 2 or x[1] % head_dim:
            raise _fail(self, f"cannot rotate rows of {x[1]} in heads of {head_dim}")
        rotary = self.rotary_dim
        if rotary is not None and not (2 <= rotary.value.data < head_dim and rotary.value.data % 2 == 0):
            raise _fail(self, f"cannot rotate {rotary.value.data} numbers of each head of {head_dim}")
        kinds = ("Llama 3's scaling", "a linear one", "YaRN's", "LongRoPE's")
        props = (self.scaling, self.linear_scaling, self.yarn_scaling, self.longrope_scaling)
        said = [kind for kind, prop in zip(kinds, props, strict=True) if prop is not None]
        if len(said) > 1:
            times = "twice" if len(said) == 2 else f"{len(said)} times"
            raise _fail(self, f"scales its frequencies {times}: {', '.join(said[:-1])} and {said[-1]}")
        _expect_same(self, "result shape", tensor_shape(self.result), x)


@irdl_op_definition
class CacheWriteOp(LogosOp):
    """Write each row's keys (or values) into a cache at the row's position (from 1); for a per-sequence cache, row
    r goes into sequence r's cache.

    ```mlir
    logos.cache_write %turned_key, %keys, %position : tensor<1x32xf32>, memref<2x64x16xf32>, tensor<1xi64>
    ```
    """

    name = "logos.cache_write"

    input = operand_def(TensorType)
    cache = operand_def(MemRefType)
    positions = operand_def(TensorType)

    assembly_format = (
        "$input `,` $cache `,` $positions attr-dict `:` type($input) `,` type($cache) `,` type($positions)"
    )

    def check_(self) -> None:
        x, cache, positions = tensor_shape(self.input), tensor_shape(self.cache), tensor_shape(self.positions)
        _expect_rank(self, "input", x, 2)
        _expect_same(self, "number of positions", positions, (x[0],))
        if len(cache) == 4 and cache[0] != x[0]:
            raise _fail(self, f"writes {x[0]} rows into caches of {cache[0]} sequences")
        heads, head_dim = cache[-3], cache[-1]
        _expect_same(self, "row width", x[1], heads * head_dim)


@irdl_op_definition
class AttentionOp(LogosOp):
    """Grouped-query attention of each row's query heads over the cached keys and values at positions 1 up to the
    row's own position (causal); query head h reads KV head h // (query heads / KV heads). With a `window` of W, a
    row at position p attends positions p - W + 1 to p only (a sliding window; present only where it bites, a
    cache of more than W positions).

    ```mlir
    %attended = logos.attention %q, %keys, %values, %position
                  : (tensor<1x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, tensor<1xi64>) -> tensor<1x64xf32>
    %windowed = logos.attention %q, %keys, %values, %position window 16
                  : (tensor<1x64xf32>, memref<2x64x16xf32>, memref<2x64x16xf32>, tensor<1xi64>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.attention"

    query = operand_def(TensorType)
    keys = operand_def(MemRefType)
    values = operand_def(MemRefType)
    positions = operand_def(TensorType)
    window = opt_prop_def(IntegerAttr[I64])
    scale = opt_prop_def(FloatAttr)  # the scores' scale (absent: 1 / sqrt(head_dim)); Gemma's 1 / sqrt(scalar)
    softcap = opt_prop_def(FloatAttr)  # scores soft-capped, tanh(s / cap) * cap, before the mask (Gemma 2)
    result = result_def(TensorType)

    assembly_format = (
        "$query `,` $keys `,` $values `,` $positions (`window` $window^)? (`scale` $scale^)? (`softcap` $softcap^)? "
        "attr-dict `:` functional-type(operands, results)"
    )

    def check_(self) -> None:
        q, keys, values = tensor_shape(self.query), tensor_shape(self.keys), tensor_shape(self.values)
        _expect_rank(self, "query", q, 2)
        _expect_same(self, "value cache shape", values, keys)
        _expect_same(self, "number of positions", tensor_shape(self.positions), (q[0],))
        if len(keys) == 4 and keys[0] != q[0]:
            raise _fail(self, f"attends {q[0]} rows over caches of {keys[0]} sequences")
        _check_heads(self, q[1], keys[-3], keys[-1])
        _expect_same(self, "result shape", tensor_shape(self.result), q)
        if self.window is not None and not 1 <= self.window.value.data < keys[-2]:
            window, length = self.window.value.data, keys[-2]
            raise _fail(self, f"has a window of {window}, not 1 to {length - 1} (shorter than its cache)")


@irdl_op_definition
class SelfAttentionOp(LogosOp):
    """Grouped-query attention of each row over the keys and values of the rows up to itself, with no cache (the
    forward of a token with no history).

    ```mlir
    %attended = logos.self_attention %q, %k, %v head_dim 16
                  : (tensor<1x64xf32>, tensor<1x32xf32>, tensor<1x32xf32>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.self_attention"

    query = operand_def(TensorType)
    key = operand_def(TensorType)
    value = operand_def(TensorType)
    head_dim = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$query `,` $key `,` $value `head_dim` $head_dim attr-dict `:` functional-type(operands, results)"

    def check_(self) -> None:
        q, k, v = tensor_shape(self.query), tensor_shape(self.key), tensor_shape(self.value)
        head_dim = self.head_dim.value.data
        _expect_rank(self, "query", q, 2)
        _expect_same(self, "value shape", v, k)
        _expect_same(self, "number of key rows", k[0], q[0])
        if head_dim < 1 or k[1] % head_dim:
            raise _fail(self, f"cannot read keys of {k[1]} in heads of {head_dim}")
        _check_heads(self, q[1], k[1] // head_dim, head_dim)
        _expect_same(self, "result shape", tensor_shape(self.result), q)


def _check_heads(op: Operation, query_width: int, kv_heads: int, head_dim: int) -> None:
    if query_width % head_dim:
        raise _fail(op, f"query rows of {query_width} are not whole heads of {head_dim}")
    heads = query_width // head_dim
    if heads % kv_heads:
        raise _fail(op, f"{heads} query heads do not share {kv_heads} key-value heads evenly")


class ElementwiseBinaryOp(LogosOp):
    """Base of the elementwise ops of two same-shaped tensors."""

    T: ClassVar = VarConstraint("T", base(TensorType))

    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($result)"

    def check_(self) -> None:
        _expect_same(self, "operand shapes", tensor_shape(self.rhs), tensor_shape(self.lhs))
        _expect_same(self, "result shape", tensor_shape(self.result), tensor_shape(self.lhs))


@irdl_op_definition
class AddOp(ElementwiseBinaryOp):
    """Elementwise sum (the residual connections).

    ```mlir
    %mixed = logos.add %x, %projected : tensor<1x64xf32>
    ```
    """

    name = "logos.add"


@irdl_op_definition
class MulOp(ElementwiseBinaryOp):
    """Elementwise product (SwiGLU's gate times up).

    ```mlir
    %product = logos.mul %activated, %up : tensor<1x128xf32>
    ```
    """

    name = "logos.mul"


@irdl_op_definition
class BiasAddOp(LogosOp):
    """A bias added to each row: a projection's bias (Qwen2's query, key and value; a Llama's with
    `attention_bias` or `mlp_bias`), a vector as long as the rows.

    ```mlir
    %query = logos.bias_add %unbiased_query, %query_bias : (tensor<1x64xf32>, tensor<64xf32>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.bias_add"

    input = operand_def(TensorType)
    bias = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $bias attr-dict `:` `(` type($input) `,` type($bias) `)` `->` type($result)"

    def check_(self) -> None:
        rows = tensor_shape(self.input)
        _expect_rank(self, "an input", rows, 2)
        _expect_same(self, "bias shape", tensor_shape(self.bias), rows[1:])
        _expect_same(self, "result shape", tensor_shape(self.result), rows)


@irdl_op_definition
class GeluTanhOp(LogosOp):
    """GELU with the tanh approximation, elementwise: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Gemma's
    GeGLU gate, PyTorch's `gelu(approximate="tanh")`).

    ```mlir
    %activated = logos.gelu_tanh %gate : tensor<1x128xf32>
    ```
    """

    name = "logos.gelu_tanh"

    T: ClassVar = VarConstraint("T", base(TensorType))

    input = operand_def(T)
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($result)"


@irdl_op_definition
class SoftcapOp(LogosOp):
    """A tanh soft-cap, elementwise: tanh(x / cap) * cap (Gemma 2's logits).

    ```mlir
    %logits = logos.softcap %raw_logits cap 3.000000e+01 : f64 : tensor<1x256xf32>
    ```
    """

    name = "logos.softcap"

    T: ClassVar = VarConstraint("T", base(TensorType))

    input = operand_def(T)
    cap = prop_def(FloatAttr)
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$input `cap` $cap attr-dict `:` type($result)"

    def check_(self) -> None:
        if not self.cap.value.data > 0:
            raise _fail(self, f"expects a positive cap, got {self.cap.value.data}")


@irdl_op_definition
class ScaleOp(LogosOp):
    """Each number times a constant, rounded to f32 first (Gemma's embedding times the square root of the width).

    ```mlir
    %scaled = logos.scale %hidden by 8.000000e+00 : f64 : tensor<1x64xf32>
    ```
    """

    name = "logos.scale"

    T: ClassVar = VarConstraint("T", base(TensorType))

    input = operand_def(T)
    factor = prop_def(FloatAttr)
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$input `by` $factor attr-dict `:` type($result)"


def program_spec(op: Operation) -> ModelSpec | None:
    """The spec of the `logos.program` that holds `op`, or None when it is in none."""
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, ProgramOp):
        parent = parent.parent_op()
    return None if parent is None else parent.model.spec


def variant(op: Operation, computed: Collection[str] = ()) -> str | None:
    """What `op` says beyond the plain form of its kind, in words (a lane refuses an op it would otherwise lower
    when this is not None and it does not lower the variant), or None. `computed` names the variants the asking lane
    computes, which are then not said: `plus_one` (a norm's), `theta`, `rotary_dim`, `rope_scaling` (a rotation's),
    `window`, `scale`, `softcap` (an attention's)."""
    unknown = set(computed) - VARIANTS
    assert not unknown, f"no such variant: {sorted(unknown)}"
    if isinstance(op, ScaledRMSNormOp) and op.plus_one is not None and "plus_one" not in computed:
        return "scales by one plus its weight"
    if isinstance(op, RopeOp):
        spec = program_spec(op)
        if spec is not None and op.theta.value.data != spec.rope_theta and "theta" not in computed:
            return f"rotates with base {op.theta.value.data!r}, not its model's {spec.rope_theta!r}"
        if op.rotary_dim is not None and "rotary_dim" not in computed:
            return f"rotates only the first {op.rotary_dim.value.data} of each head's {op.head_dim.value.data} numbers"
        said = op.rope_scaling
        if spec is not None and said != spec.rope_scaling and "rope_scaling" not in computed:
            return f"rotates with rope scaling {said}, not its model's {spec.rope_scaling}"
    if isinstance(op, AttentionOp):
        if op.window is not None and "window" not in computed:
            return f"slides over a window of {op.window.value.data} positions"
        if op.scale is not None and "scale" not in computed:
            return f"scales its scores by {op.scale.value.data!r}"
        if op.softcap is not None and "softcap" not in computed:
            return f"soft-caps its scores at {op.softcap.value.data!r}"
    return None


VARIANTS = frozenset({"plus_one", "theta", "rotary_dim", "rope_scaling", "window", "scale", "softcap"})


@irdl_op_definition
class SiluOp(LogosOp):
    """x * sigmoid(x), elementwise.

    ```mlir
    %activated = logos.silu %gate : tensor<1x128xf32>
    ```
    """

    name = "logos.silu"

    T: ClassVar = VarConstraint("T", base(TensorType))

    input = operand_def(T)
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($result)"

    def check_(self) -> None:
        _expect_same(self, "result shape", tensor_shape(self.result), tensor_shape(self.input))


@irdl_op_definition
class MixtureOp(LogosOp):
    """A mixture of experts applied to each row: the router's logits (one an expert) are turned into probabilities
    by a softmax over every expert (in f32), the row takes the `top_k` most probable (the lowest index first on a
    tie, as `torch.topk`), their probabilities divided by their sum where `renormalize` is set, and the result is
    the sum, over the chosen experts in ascending expert index, of each one's probability times its SwiGLU MLP of
    the row: down_e(silu(gate_e x) * up_e x). The experts' weights are stacked along a first axis, each expert's
    in Hugging Face layout: gate and up [experts, intermediate, hidden], down [experts, hidden, intermediate].

    Split over chips by experts (its stacked weights `logos.weight`s split "experts"), the router's logits are
    still every expert's and every row is still routed among all of them, but the sum runs only over the chosen
    experts this chip holds (chip c: experts [c * E / chips, (c + 1) * E / chips)): the result is this chip's
    partial sum, which a `shard.all_reduce` adds up.

    ```mlir
    %routed = logos.experts %normed, %router_logits, %gate, %up, %down top_k 2 renormalize
                : (tensor<1x64xf32>, tensor<1x4xf32>, tensor<4x32x64xf32>, tensor<4x32x64xf32>, tensor<4x64x32xf32>)
                  -> tensor<1x64xf32>
    ```
    """

    name = "logos.experts"

    input = operand_def(TensorType)
    logits = operand_def(TensorType)  # the router's: rows by experts
    gate = operand_def(TensorType)
    up = operand_def(TensorType)
    down = operand_def(TensorType)
    top_k = prop_def(IntegerAttr[I64])
    renormalize = opt_prop_def(UnitAttr)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $logits `,` $gate `,` $up `,` $down `top_k` $top_k (`renormalize` $renormalize^)? attr-dict "
        "`:` functional-type(operands, results)"
    )

    def check_(self) -> None:
        x, logits = tensor_shape(self.input), tensor_shape(self.logits)
        gate, up, down = tensor_shape(self.gate), tensor_shape(self.up), tensor_shape(self.down)
        _expect_rank(self, "input", x, 2)
        _expect_rank(self, "router logits", logits, 2)
        for what, shape in (("gate weights", gate), ("up weights", up), ("down weights", down)):
            _expect_rank(self, what, shape, 3)
        held, inter = gate[0], gate[1]
        _expect_same(self, "gate weights shape", gate, (held, inter, x[1]))
        _expect_same(self, "up weights shape", up, gate)
        _expect_same(self, "down weights shape", down, (held, x[1], inter))
        experts = self.experts_routed()
        _expect_same(self, "router logits shape", logits, (x[0], experts))
        top_k = self.top_k.value.data
        if not 1 <= top_k <= experts:
            raise _fail(self, f"routes each row to {top_k} experts, not 1 to its {experts}")
        _expect_same(self, "result shape", tensor_shape(self.result), x)

    def experts_routed(self) -> int:
        """How many experts the rows are routed among: the stacked weights' full count (a chip's share of them,
        split by experts, holds fewer)."""
        weights = [w.owner for w in (self.gate, self.up, self.down)]
        split = [isinstance(w, WeightOp) and w.split is not None and w.split.data == "experts" for w in weights]
        if any(split) and not all(split):
            raise _fail(self, "has stacked weights split by experts beside weights that are not")
        owner = weights[0]
        if isinstance(owner, WeightOp) and split[0]:
            return owner.full_shape[0]
        return tensor_shape(self.gate)[0]


@irdl_op_definition
class RowOp(LogosOp):
    """One row (from 1) of a stack of rows, kept as a stack of one.

    ```mlir
    %last = logos.row %x index 4 : (tensor<4x64xf32>) -> tensor<1x64xf32>
    ```
    """

    name = "logos.row"

    input = operand_def(TensorType)
    index = prop_def(IntegerAttr[I64])
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$input `index` $index attr-dict `:` functional-type(operands, results)"

    def check_(self) -> None:
        x = tensor_shape(self.input)
        _expect_rank(self, "input", x, 2)
        index = self.index.value.data
        if not 1 <= index <= x[0]:
            raise _fail(self, f"row {index} does not exist in {x[0]} rows (rows count from 1)")
        _expect_same(self, "result shape", tensor_shape(self.result), (1, x[1]))


@irdl_op_definition
class ArgmaxOp(LogosOp):
    """The index (from 1) of each row's greatest value, the first on a tie: greedy decoding's next token.

    ```mlir
    %next = logos.argmax %logits : (tensor<1x256xf32>) -> tensor<1xi64>
    ```
    """

    name = "logos.argmax"

    input = operand_def(TensorType)
    result = result_def(TensorType)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` functional-type(operands, results)"

    def check_(self) -> None:
        x = tensor_shape(self.input)
        _expect_rank(self, "input", x, 2)
        _expect_same(self, "result shape", tensor_shape(self.result), (x[0],))


LOGOS = Dialect(
    "logos",
    [
        ProgramOp,
        InputOp,
        WeightOp,
        CacheOp,
        EmbedOp,
        RMSNormOp,
        HeadRMSNormOp,
        LinearOp,
        RopeOp,
        CacheWriteOp,
        AttentionOp,
        SelfAttentionOp,
        AddOp,
        MulOp,
        BiasAddOp,
        SiluOp,
        GeluTanhOp,
        SoftcapOp,
        ScaleOp,
        MixtureOp,
        RowOp,
        ArgmaxOp,
    ],
    [ModelAttr, RopeScalingAttr, LinearRopeScalingAttr, YarnRopeScalingAttr, LongRopeScalingAttr, StorageAttr],
)
