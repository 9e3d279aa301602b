"""Builds `logos` IR one named value at a time, inferring each result's type from its operands.

The author writes programs through it and the parser reads text into it, so both make the same IR for the same
sentence. A `SectionBuilder` builds one `func.func` section; `program()` puts sections into a `logos.program`.
Shapes are inferred, not checked: the ops' verifiers check them (the parser runs them and reports by line).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BytesAttr,
    DenseArrayBase,
    FlatSymbolRefAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    StringAttr,
    TensorType,
    UnitAttr,
    f32,
    f64,
    i16,
    i64,
)
from xdsl.dialects.shard import AllReduceOp, GridOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from logos_ir import quant
from logos_ir.dialects import logos
from logos_ir.dialects.shard_ext import AllGatherOp, AllSliceOp
from logos_ir.errors import SpecError
from logos_ir.spec import ModelSpec
from logos_ir.tensor_parallel import split_axis

GRID = "chips"


# Attributes are immutable values: a program of 80 layers names the same few types and shapes thousands of times,
# so each is made once (building and verifying an xDSL attribute costs more than the rest of a statement).
@lru_cache(maxsize=4096)
def f32_tensor(shape: tuple[int, ...]) -> TensorType:
    return TensorType(f32, shape)


@lru_cache(maxsize=4096)
def i64_tensor(rows: int) -> TensorType:
    return TensorType(i64, [rows])


@lru_cache(maxsize=1024)
def f32_memref(shape: tuple[int, ...]) -> MemRefType:
    return MemRefType(f32, shape)


@lru_cache(maxsize=4096)
def i64_array(values: tuple[int, ...]):
    return logos.i64_array(values)


@lru_cache(maxsize=4096)
def string(text: str) -> StringAttr:
    return StringAttr(text)


@lru_cache(maxsize=1024)
def integer(value: int) -> IntegerAttr:
    return IntegerAttr(value, i64)


@lru_cache(maxsize=64)
def real(value: float) -> FloatAttr:
    return FloatAttr(value, f64)


@lru_cache(maxsize=1)
def grid_ref() -> FlatSymbolRefAttr:
    return FlatSymbolRefAttr(GRID)


@lru_cache(maxsize=1)
def grid_axes() -> Attribute:
    """The chips' grid's one axis, 0, as upstream's `grid_axes` (empty axes would mean each device alone)."""
    return DenseArrayBase(i16, BytesAttr(i16.pack([0])))


def _shape(value: SSAValue) -> tuple[int, ...]:
    return logos.tensor_shape(value)


def _named(op: Operation, name: str | None) -> SSAValue:
    result = op.results[0]
    result.name_hint = name
    return result


def grid_op(chips: int) -> GridOp:
    return GridOp.create(properties={"sym_name": string(GRID), "shape": i64_array((chips,))})


def split_props(split: str | None) -> dict[str, Attribute]:
    if split is None:
        return {}
    return {"split": string(split), "grid": grid_ref()}


def share(full: Sequence[int], axis: int, parts: int) -> list[int]:
    out = list(full)
    out[axis] //= parts
    return out


class SectionBuilder:
    """One section (`func.func`) under construction: its arguments, then one op per sentence."""

    def __init__(self, sym: str, args: Sequence[tuple[str, Attribute]], spec: ModelSpec, chips: int = 1):
        self.sym = sym
        self.spec = spec
        self.chips = chips
        self.block = Block(arg_types=[t for _, t in args])
        for arg, (name, _) in zip(self.block.args, args, strict=True):
            arg.name_hint = name
        self.function: func.FuncOp | None = None

    @property
    def args(self) -> tuple[SSAValue, ...]:
        return tuple(self.block.args)

    def _let(self, op: Operation, name: str) -> SSAValue:
        self.block.add_op(op)
        return _named(op, name)

    # -- inputs and state -------------------------------------------------------------------------------------

    def input(self, name: str, kind: str, values: Sequence[int]) -> SSAValue:
        op = logos.InputOp.create(
            properties={"kind": string(kind), "values": i64_array(tuple(values))},
            result_types=[i64_tensor(len(values))],
        )
        return self._let(op, name)

    def hidden_input(self, name: str, rows: int, width: int) -> SSAValue:
        op = logos.InputOp.create(properties={"kind": string("hidden")}, result_types=[f32_tensor((rows, width))])
        return self._let(op, name)

    def weight(
        self, name: str, tensor: str, shape: Sequence[int], split: str | None = None, storage: str | None = None
    ) -> SSAValue:
        result = list(shape)
        if split is not None:
            result = share(shape, split_axis(split, len(shape)), self.chips)
        stored = {} if storage is None else {"storage": logos.StorageAttr(storage)}
        fmt = None if storage is None else quant.FORMATS[storage]
        if fmt is not None and not fmt.row_fits(result[-1]):
            raise SpecError(
                f"weight '{tensor}' splits its {fmt.name} blocks of {fmt.block}: "
                f"a chip's {result[-1]} columns are not whole blocks",
                hint="split over fewer chips, or store the weight in smaller blocks",
            )
        op = logos.WeightOp.create(
            properties={"tensor": string(tensor), "shape": i64_array(tuple(shape)), **split_props(split), **stored},
            result_types=[f32_tensor(tuple(result))],
        )
        return self._let(op, name)

    def cache(self, name: str, kind: str, layer: int, shape: Sequence[int], split: bool = False) -> SSAValue:
        result = share(shape, len(shape) - 3, self.chips) if split else list(shape)
        op = logos.CacheOp.create(
            properties={
                "kind": string(kind),
                "layer": integer(layer),
                "shape": i64_array(tuple(shape)),
                **split_props("heads" if split else None),
            },
            result_types=[f32_memref(tuple(result))],
        )
        return self._let(op, name)

    # -- the math ---------------------------------------------------------------------------------------------

    def embed(self, name: str, table: SSAValue, tokens: SSAValue) -> SSAValue:
        rows, width = _shape(tokens)[0], _shape(table)[-1]
        op = logos.EmbedOp.create(operands=[table, tokens], result_types=[f32_tensor((rows, width))])
        return self._let(op, name)

    def rms_norm(self, name: str, x: SSAValue, weight: SSAValue, plus_one: bool = False) -> SSAValue:
        op = logos.RMSNormOp.create(
            operands=[x, weight],
            properties={"epsilon": real(self.spec.rms_eps), **({"plus_one": UnitAttr()} if plus_one else {})},
            result_types=[x.type],
        )
        return self._let(op, name)

    def head_rms_norm(self, name: str, x: SSAValue, weight: SSAValue, plus_one: bool = False) -> SSAValue:
        op = logos.HeadRMSNormOp.create(
            operands=[x, weight],
            properties={"epsilon": real(self.spec.rms_eps), **({"plus_one": UnitAttr()} if plus_one else {})},
            result_types=[x.type],
        )
        return self._let(op, name)

    def gelu_tanh(self, name: str, x: SSAValue) -> SSAValue:
        return self._let(logos.GeluTanhOp.create(operands=[x], result_types=[x.type]), name)

    def softcap(self, name: str, x: SSAValue, cap: float) -> SSAValue:
        op = logos.SoftcapOp.create(operands=[x], properties={"cap": real(cap)}, result_types=[x.type])
        return self._let(op, name)

    def scale(self, name: str, x: SSAValue, factor: float) -> SSAValue:
        op = logos.ScaleOp.create(operands=[x], properties={"factor": real(factor)}, result_types=[x.type])
        return self._let(op, name)

    def linear(self, name: str, weight: SSAValue, x: SSAValue) -> SSAValue:
        rows, out = _shape(x)[0], _shape(weight)[0]
        op = logos.LinearOp.create(operands=[x, weight], result_types=[f32_tensor((rows, out))])
        return self._let(op, name)

    def rope(
        self, name: str, x: SSAValue, positions: SSAValue, theta: float | None = None, layer: int | None = None
    ) -> SSAValue:
        """A rotation by the model's rope base, or by `theta` (a windowed layer's own, Gemma 3's local layers), with
        the scaling of layer `layer` (`ModelSpec.rope_scaling_of`; the model's where no layer is given)."""
        props: dict[str, Attribute] = {
            "head_dim": integer(self.spec.head_dim),
            "theta": real(self.spec.rope_theta if theta is None else theta),
        }
        if self.spec.rotary_dim is not None:  # Phi-3's partial rotary: the head's first rotary_dim numbers
            props["rotary_dim"] = integer(self.spec.rotary_dim)
        scaling = self.spec.rope_scaling if layer is None else self.spec.rope_scaling_of(layer)
        if scaling is not None:
            props[logos.SCALING_PROPS[scaling.rope_type]] = logos.scaling_attr(scaling)
        op = logos.RopeOp.create(operands=[x, positions], properties=props, result_types=[x.type])
        return self._let(op, name)

    def cache_write(self, x: SSAValue, cache: SSAValue, positions: SSAValue) -> None:
        self.block.add_op(logos.CacheWriteOp.create(operands=[x, cache, positions]))

    def attention(
        self,
        name: str,
        query: SSAValue,
        keys: SSAValue,
        values: SSAValue,
        positions: SSAValue,
        window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> SSAValue:
        properties: dict[str, Attribute] = {} if window is None else {"window": integer(window)}
        if scale is not None:
            properties["scale"] = real(scale)
        if softcap is not None:
            properties["softcap"] = real(softcap)
        op = logos.AttentionOp.create(
            operands=[query, keys, values, positions], properties=properties, result_types=[query.type]
        )
        return self._let(op, name)

    def self_attention(self, name: str, query: SSAValue, key: SSAValue, value: SSAValue) -> SSAValue:
        op = logos.SelfAttentionOp.create(
            operands=[query, key, value],
            properties={"head_dim": integer(self.spec.head_dim)},
            result_types=[query.type],
        )
        return self._let(op, name)

    def add(self, name: str, lhs: SSAValue, rhs: SSAValue) -> SSAValue:
        return self._let(logos.AddOp.create(operands=[lhs, rhs], result_types=[lhs.type]), name)

    def mul(self, name: str, lhs: SSAValue, rhs: SSAValue) -> SSAValue:
        return self._let(logos.MulOp.create(operands=[lhs, rhs], result_types=[lhs.type]), name)

    def bias_add(self, name: str, x: SSAValue, bias: SSAValue) -> SSAValue:
        return self._let(logos.BiasAddOp.create(operands=[x, bias], result_types=[x.type]), name)

    def silu(self, name: str, x: SSAValue) -> SSAValue:
        return self._let(logos.SiluOp.create(operands=[x], result_types=[x.type]), name)

    def experts(
        self, name: str, x: SSAValue, logits: SSAValue, gate: SSAValue, up: SSAValue, down: SSAValue
    ) -> SSAValue:
        """The mixture of the stacked experts `gate`, `up`, `down` applied to `x`, routed by `logits` to the
        model's `experts_per_token` best, renormalized where the model's mixture is."""
        properties: dict[str, Attribute] = {"top_k": integer(self.spec.experts_per_token or 0)}
        if self.spec.renormalize:
            properties["renormalize"] = UnitAttr()
        op = logos.MixtureOp.create(operands=[x, logits, gate, up, down], properties=properties, result_types=[x.type])
        return self._let(op, name)

    def row(self, name: str, x: SSAValue, index: int) -> SSAValue:
        op = logos.RowOp.create(
            operands=[x], properties={"index": integer(index)}, result_types=[f32_tensor((1, _shape(x)[1]))]
        )
        return self._let(op, name)

    def argmax(self, name: str, x: SSAValue) -> SSAValue:
        op = logos.ArgmaxOp.create(operands=[x], result_types=[i64_tensor(_shape(x)[0])])
        return self._let(op, name)

    def all_reduce(self, name: str, x: SSAValue) -> SSAValue:
        op = AllReduceOp.create(operands=[x], properties={"grid": grid_ref()}, result_types=[x.type])
        return self._let(op, name)

    def all_gather(self, name: str, x: SSAValue) -> SSAValue:
        """The chips' shares of `x` side by side along its last axis, in chip order, on every chip (a split head's
        logits): upstream's `shard.all_gather` over the grid's one axis."""
        shape = _shape(x)
        whole = (*shape[:-1], shape[-1] * self.chips)
        op = AllGatherOp.create(
            operands=[x],
            properties={
                "grid": grid_ref(),
                "grid_axes": grid_axes(),
                "gather_axis": IntegerAttr(len(shape) - 1, IndexType()),
            },
            result_types=[f32_tensor(whole)],
        )
        return self._let(op, name)

    def all_slice(self, name: str, x: SSAValue) -> SSAValue:
        """This chip's share of the whole `x` along its last axis (all-gather's inverse; no data moves): upstream's
        `shard.all_slice` over the grid's one axis."""
        shape = _shape(x)
        op = AllSliceOp.create(
            operands=[x],
            properties={
                "grid": grid_ref(),
                "grid_axes": grid_axes(),
                "slice_axis": IntegerAttr(len(shape) - 1, IndexType()),
            },
            result_types=[f32_tensor((*shape[:-1], shape[-1] // self.chips))],
        )
        return self._let(op, name)

    def call(self, name: str, callee: str, args: Sequence[SSAValue], result_type: Attribute) -> SSAValue:
        op = func.CallOp(callee, list(args), [result_type])
        return self._let(op, name)

    def ret(self, value: SSAValue) -> func.FuncOp:
        """Return `value` and close the section into its `func.func`."""
        self.block.add_op(func.ReturnOp(value))
        inputs = [a.type for a in self.block.args]
        self.function = func.FuncOp(self.sym, (inputs, [value.type]), Region(self.block))
        return self.function


def program(
    cut: str,
    spec: ModelSpec,
    sections: Sequence[func.FuncOp],
    chips: int = 1,
    split: bool = False,
    digest: str = "",
) -> logos.ProgramOp:
    """A `logos.program` of `sections` (and a chip grid when `split`); `digest` may be filled in later."""
    return logos.ProgramOp(cut, chips, digest or "0" * 64, spec, ([grid_op(chips)] if split else []) + list(sections))


def set_digest(program_op: logos.ProgramOp, digest: str) -> None:
    program_op.digest = StringAttr(digest)
