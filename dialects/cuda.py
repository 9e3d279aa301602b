"""The `cuda` dialect: what the CUDA lane needs that xDSL's `gpu`, `arith`, `memref`, `scf`, `math` and `vector` lack.

Two levels live here. The kernel level (the first lowering of a `logos` program): named device buffers
(`cuda.buffer`) and one op per fused kernel (`cuda.linear`, `cuda.gate_up`, `cuda.rope_cache_write`,
`cuda.attention` ...), each reading and writing whole buffers, in the order the host launches them. The thread
level (inside the `gpu.func` bodies the next pass writes) is upstream MLIR's ops; where xDSL 0.74 lacks one, it is
defined under its upstream name and generic form: `gpu.shuffle` (a warp's butterfly, CUDA's `__shfl_xor_sync`) and
`llvm.fence` (`__threadfence()`) in `gpu_ext`, which adds them to xDSL's `gpu` and `llvm` dialects so they parse by
their prefix; `nvvm.bar.warp.sync` (`__syncwarp()`) and `nvvm.griddepcontrol` (programmatic dependent launch) here,
in the `nvvm` dialect xDSL lacks. A 16-byte load is
upstream's `vector.load` (xDSL's op, carrying upstream's `alignment` as an attribute: xDSL 0.74's op lacks the
property, and upstream reads an inherent attribute from the attribute dictionary of a generic op), widened by
`arith.extf` and taken apart by `vector.extract`. The tensor-core ops (prefill chunks' products and attention)
close the file.

```mlir
%w = cuda.buffer "model.layers.0.self_attn.q_proj.weight" kind "weight" : memref<576x576xbf16>
cuda.linear ins(%normed, %w : memref<1x576xf32>, memref<576x576xbf16>) outs(%query : memref<1x576xf32>)
%r, %ok = "gpu.shuffle"(%partial, %c16, %c32) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
```
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    BFloat16Type,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    StringAttr,
    UnitAttr,
    VectorType,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, Dialect, Operation, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

# upstream's gpu.shuffle and llvm.fence live in xDSL's gpu and llvm dialects (gpu_ext); the lane names them here
from logos_ir.dialects.gpu_ext import FenceOp as FenceOp
from logos_ir.dialects.gpu_ext import GpuShuffleOp as GpuShuffleOp

BUFFER_KINDS = ("weight", "cache", "activation", "input", "output", "table", "scratch")
WARP = 32

# The device weight image (`weights.bin`, one a chip) the build writes and the runtime reads: this magic and the
# program's identity line, then the index of its buffers, in a header of HEADER_BYTES; each buffer ALIGN-aligned.
IMAGE_MAGIC = b"LOGOS-CUDA-WEIGHTS 1\n"
HEADER_BYTES = 4096
ALIGN = 256


def _fail(op: Operation, message: str) -> VerifyException:
    return VerifyException(f"'{op.name}' op {message}")


def shape_of(kind: Attribute) -> tuple[int, ...]:
    assert isinstance(kind, MemRefType)
    return tuple(kind.get_shape())


STORAGE = "cuda.storage"  # on a weight's `cuda.buffer`: it holds the tensor's blocks as stored, in this format
# A row of a format with a scale a row (fp8, `quant` family "channels") held as stored: its codes and its f32 scale
# as the file holds them, then 12 zero bytes, so that every row starts 16-byte aligned (its codes read in 16-byte
# loads; the file's rows of n + 4 bytes start 4-byte aligned): a row of n numbers is n + CHANNEL_ROW_TAIL bytes.
CHANNEL_ROW_TAIL = 16


def numbers_shape(value: SSAValue) -> tuple[int, ...]:
    """A buffer's shape in numbers: that of its memref, but for a weight holding its blocks as stored (`STORAGE`),
    whose rows of 16- or 32-bit units hold the numbers of whole blocks."""
    shape = shape_of(value.type)
    owner = value.owner
    stored = owner.attributes.get(STORAGE) if isinstance(owner, BufferOp) else None
    if not isinstance(stored, StringAttr):
        return shape
    from logos_ir import quant

    fmt = quant.FORMATS[stored.data]
    unit = value.type.element_type.width.data // 8  # type: ignore[attr-defined]
    if fmt.family == "channels":  # a row's codes, its scale and the pad to 16 bytes
        return (*shape[:-1], shape[-1] * unit - CHANNEL_ROW_TAIL)
    return (*shape[:-1], shape[-1] * unit // fmt.block_bytes * fmt.block)


def rope_table_names(theta: float | None = None, rotary: int | None = None, unscaled: bool = False) -> tuple[str, str]:
    """The names of the host's rotary tables (cos, signed sin): `rope.cos` / `rope.sin` for the model's own
    rotation, `rope.cos.theta<base>` / `.rotary<R>` / `.unscaled` for a layer's own base, a partial rotary or a
    layer rotating without the model's rope scaling (`rope_table_of` reads them back)."""
    suffix = (f".theta{theta!r}" if theta is not None else "") + (f".rotary{rotary}" if rotary is not None else "")
    suffix += ".unscaled" if unscaled else ""
    return f"rope.cos{suffix}", f"rope.sin{suffix}"


def rope_table_of(name: str) -> tuple[str, float | None, int | None, bool] | None:
    """(cos or sin, base or None for the model's, rotary numbers or None for the whole head, unscaled) of a rotary
    table's name (`rope_table_names`), or None for a name that is not one."""
    found = re.fullmatch(r"rope\.(cos|sin)(?:\.theta([0-9.e+-]+))?(?:\.rotary(\d+))?(\.unscaled)?", name)
    if found is None:
        return None
    which, theta, rotary, unscaled = found.groups()
    return (
        which,
        float(theta) if theta is not None else None,
        int(rotary) if rotary is not None else None,
        unscaled is not None,
    )


# -- buffers --------------------------------------------------------------------------------------------------


@irdl_op_definition
class BufferOp(IRDLOperation):
    """A named device buffer of the host plan: a weight (its Hugging Face name), a KV cache, an activation, an
    input, the output, a table the host fills (rotary cos/sin) or a kernel's scratch.

    ```mlir
    %keys = cuda.buffer "cache.key.0" kind "cache" : memref<3x64x64xf32>
    ```
    """

    name = "cuda.buffer"

    buffer = prop_def(StringAttr)
    kind = prop_def(StringAttr)
    result = result_def(MemRefType)

    traits = traits_def(Pure())

    assembly_format = "$buffer `kind` $kind attr-dict `:` type($result)"

    def __init__(self, buffer: str, kind: str, result_type: MemRefType):
        super().__init__(
            properties={"buffer": StringAttr(buffer), "kind": StringAttr(kind)}, result_types=[result_type]
        )

    def verify_(self) -> None:
        if self.kind.data not in BUFFER_KINDS:
            raise _fail(self, f"has unknown buffer kind '{self.kind.data}' (expected one of {', '.join(BUFFER_KINDS)})")
        if not self.buffer.data:
            raise _fail(self, "needs a buffer name")


# -- the kernel level: one op per fused kernel ------------------------------------------------------------------


class KernelOp(IRDLOperation):
    """Base of the kernel-level ops: the buffers a kernel reads (`ins`) and writes (`outs`), in a fixed order each
    leaf names; `ARITY` is (ins, outs). A leaf's `check_` checks the shapes its kernel assumes."""

    ARITY: ClassVar[tuple[int, int]] = (0, 0)

    ins = var_operand_def(MemRefType)
    outs = var_operand_def(MemRefType)

    irdl_options = (AttrSizedOperandSegments(as_property=True), ParsePropInAttrDict())

    assembly_format = "`ins` `(` $ins `:` type($ins) `)` `outs` `(` $outs `:` type($outs) `)` attr-dict"

    def __init__(self, ins: Sequence[SSAValue], outs: Sequence[SSAValue], properties: Mapping[str, Attribute] = {}):
        super().__init__(operands=[ins, outs], properties=dict(properties))

    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = ((), ())

    def roles(self) -> list[str]:
        """The name of each buffer the kernel takes, ins then outs (the emitted kernel's parameter names)."""
        ins, outs = self.ROLES
        return [*ins[: len(self.ins)], *outs]

    def shapes(self) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        return [numbers_shape(v) for v in self.ins], [numbers_shape(v) for v in self.outs]

    def verify_(self) -> None:
        want_ins, want_outs = self.ARITY
        if len(self.ins) != want_ins or len(self.outs) != want_outs:
            raise _fail(
                self, f"takes {want_ins} inputs and {want_outs} outputs, got {len(self.ins)} and {len(self.outs)}"
            )
        self.check_()

    def check_(self) -> None:
        """The shapes the kernel assumes (each leaf that has any overrides this)."""


def _expect(op: Operation, what: str, got: object, want: object) -> None:
    if got != want:
        raise _fail(op, f"{what} mismatch: got {got}, expected {want}")


@irdl_op_definition
class EmbedOp(KernelOp):
    """out[r] = table[tokens[r] - 1] (token ids from 1), widened to f32. ins (table, tokens), outs (out).

    ```mlir
    cuda.embed ins(%table, %token : memref<256x64xbf16>, memref<1xi64>) outs(%hidden : memref<1x64xf32>)
    ```
    """

    name = "cuda.embed"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("table", "tokens"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (2, 1)

    def check_(self) -> None:
        (table, tokens), (out,) = self.shapes()
        _expect(self, "result shape", out, (tokens[0], table[1]))


@irdl_op_definition
class RMSNormOp(KernelOp):
    """out = x / sqrt(mean(x^2) + epsilon) * weight per row, one warp a row; `row` >= 0 normalises only that row
    of x (the prefill head's last row, fused here instead of a copy). ins (x, weight), outs (out).

    ```mlir
    cuda.rms_norm ins(%hidden, %norm_weight : memref<1x64xf32>, memref<64xf32>) outs(%normed : memref<1x64xf32>)
        {epsilon = 1.000000e-05 : f32, row = -1 : i64}
    ```
    """

    name = "cuda.rms_norm"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("x", "weight"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (2, 1)

    epsilon = prop_def(FloatAttr)
    row = prop_def(IntegerAttr[I64])
    plus_one = opt_prop_def(UnitAttr)  # scaled by one plus the weight (Gemma's norms): never folded

    def check_(self) -> None:
        (x, weight), (out,) = self.shapes()
        _expect(self, "weight shape", weight, (x[1],))
        rows = 1 if self.row.value.data >= 0 else x[0]
        _expect(self, "result shape", out, (rows, x[1]))


@irdl_op_definition
class HeadRMSNormOp(KernelOp):
    """out = x / sqrt(mean(x^2) + epsilon) * weight over each head of each row (the row cut into heads of the
    weight's length: Qwen3's query and key norms), one warp a (row, head). ins (x, weight), outs (out).

    ```mlir
    cuda.head_rms_norm ins(%query, %q_norm : memref<1x64xf32>, memref<16xf32>) outs(%normed_query : memref<1x64xf32>)
        {epsilon = 1.000000e-05 : f32}
    ```
    """

    name = "cuda.head_rms_norm"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("x", "weight"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (2, 1)

    epsilon = prop_def(FloatAttr)
    plus_one = opt_prop_def(UnitAttr)  # scaled by one plus the weight (Gemma 3's query and key norms)

    def check_(self) -> None:
        (x, weight), (out,) = self.shapes()
        if len(weight) != 1 or not weight[0] or x[1] % weight[0]:
            raise _fail(self, f"norms whole heads: rows of {x[1]} are not heads of {weight}")
        _expect(self, "result shape", out, x)


class _NormPrologue:
    """A projection that may fold the RMS norm of its input into its prologue: with `epsilon` set, its last input
    is the norm's scale and it computes (x * scale) @ weight^T / sqrt(mean(x^2) + epsilon) per row (one pass over x
    gives both the dot products and the sum of squares)."""

    def normed(self) -> bool:
        return self.epsilon is not None  # type: ignore[attr-defined]

    def roles(self) -> list[str]:
        ins, outs = self.ROLES  # type: ignore[attr-defined]
        count = len(self.ins) - (1 if self.normed() else 0)  # type: ignore[attr-defined]
        return [*ins[:count], *(["scale"] if self.normed() else []), *outs]

    def _check_norm(self, x: tuple[int, ...]) -> None:
        if self.normed():
            scale = shape_of(self.ins[-1].type)  # type: ignore[attr-defined]
            _expect(self, "norm scale shape", scale, (x[1],))  # type: ignore[arg-type]


@irdl_op_definition
class LinearOp(_NormPrologue, KernelOp):
    """out = x @ weight^T (+ bias) (+ residual when given), f32 accumulation, weight [out, in] read once with
    16-byte loads, a warp per output column, each weight vector reused across a tile of rows. ins (x, weight[,
    residual[, chip]][, bias][, scale]) (bias with `biased`: the projection's bias [out], added to each row's sums
    in the epilogue; scale with `epsilon`: the folded RMS norm; chip with `residual_chip`: a partial sum of a split
    program that the all-reduce after it completes, the residual (and the bias) added on that chip alone, `chip`
    holding this chip's index).

    ```mlir
    cuda.linear ins(%attended, %o_proj_weight, %hidden : memref<1x64xf32>, memref<64x64xbf16>, memref<1x64xf32>)
        outs(%mixed : memref<1x64xf32>)
    ```
    """

    name = "cuda.linear"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("x", "weight", "residual", "chip"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (2, 1)

    epsilon = opt_prop_def(FloatAttr)
    residual_chip = opt_prop_def(IntegerAttr[I64])
    biased = opt_prop_def(UnitAttr)

    def _extra(self) -> int:
        """The inputs after x, the weight and the residual: the chip, the bias, the norm scale."""
        return sum((self.normed(), self.residual_chip is not None, self.biased is not None))

    def has_residual(self) -> bool:
        return len(self.ins) - self._extra() == 3

    def bias(self) -> SSAValue | None:
        """The bias buffer (`biased`), else None."""
        if self.biased is None:
            return None
        return self.ins[len(self.ins) - 1 - (1 if self.normed() else 0)]

    def roles(self) -> list[str]:
        names = ["x", "weight", *(["residual"] if self.has_residual() else [])]
        names += ["chip"] if self.residual_chip is not None else []
        names += ["bias"] if self.biased is not None else []
        return [*names, *(["scale"] if self.normed() else []), "out"]

    def verify_(self) -> None:
        extra = self._extra()
        if len(self.ins) - extra not in (2, 3) or len(self.outs) != 1:
            got = f"got {len(self.ins)} and {len(self.outs)}"
            bias = ", a bias" if self.biased is not None else ""
            raise _fail(self, f"takes 2 or 3 inputs (and a chip{bias}, a norm scale) and 1 output, {got}")
        if self.residual_chip is not None and len(self.ins) - extra != 3:
            raise _fail(self, "adds its residual on one chip: it needs a residual")
        ins, (out,) = self.shapes()
        x, weight, *residual = ins[: len(ins) - extra]
        _expect(self, "input width", x[1], weight[1])
        _expect(self, "result shape", out, (x[0], weight[0]))
        if residual:
            _expect(self, "residual shape", residual[0], out)
        bias = self.bias()
        if bias is not None:
            _expect(self, "bias shape", shape_of(bias.type), (weight[0],))
        self._check_norm(x)


@irdl_op_definition
class GateUpOp(_NormPrologue, KernelOp):
    """out = silu(x @ gate^T + gate_bias) * (x @ up^T + up_bias): SwiGLU's two projections and its product in one
    pass over x, the biases (with `biased`) added to the sums in the epilogue. ins (x, gate, up[, gate_bias,
    up_bias][, scale]), outs (out) (scale with `epsilon`: the folded RMS norm).

    ```mlir
    cuda.gate_up ins(%mixed, %gate_weight, %up_weight, %norm_weight : memref<1x64xf32>, memref<128x64xbf16>,
        memref<128x64xbf16>, memref<64xf32>) outs(%product : memref<1x128xf32>) {epsilon = 1.000000e-05 : f32}
    ```
    """

    name = "cuda.gate_up"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("x", "gate", "up"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (3, 1)

    epsilon = opt_prop_def(FloatAttr)
    biased = opt_prop_def(UnitAttr)
    gelu_tanh = opt_prop_def(UnitAttr)  # GeGLU: gelu_tanh(g) * u in place of silu(g) * u (Gemma)

    def roles(self) -> list[str]:
        biases = ["gate_bias", "up_bias"] if self.biased is not None else []
        return ["x", "gate", "up", *biases, *(["scale"] if self.normed() else []), "out"]

    def verify_(self) -> None:
        extra = (1 if self.normed() else 0) + (2 if self.biased is not None else 0)
        if len(self.ins) != 3 + extra or len(self.outs) != 1:
            got = f"got {len(self.ins)} and {len(self.outs)}"
            raise _fail(
                self, f"takes {3 + extra - (1 if self.normed() else 0)} inputs (and a norm scale) and 1 output, {got}"
            )
        (x, gate, up, *rest), (out,) = self.shapes()
        _expect(self, "up shape", up, gate)
        _expect(self, "result shape", out, (x[0], gate[0]))
        if self.biased is not None:
            _expect(self, "bias shape", rest[0], (gate[0],))
            _expect(self, "bias shape", rest[1], (gate[0],))
        self._check_norm(x)


@irdl_op_definition
class QKVOp(KernelOp):
    """A decode layer's attention input in one launch: the RMS norm of x folded into the prologue, the query, key
    and value projections from one weight [q rows + k rows + v rows, in] (the three weights laid one after the
    other), then in the epilogue the rotation of queries and keys at the row's position, the rotated queries to
    `query`, and the keys and values into the caches at that position. A warp owns a rotation pair of columns
    (d, d + head_dim/2) of one head. ins (x, weight, scale, positions, cos, sin), outs (query, key cache, value
    cache).

    ```mlir
    cuda.qkv ins(%hidden, %qkv_weight, %norm_weight, %position, %rope_cos, %rope_sin : memref<1x64xf32>,
        memref<128x64xbf16>, memref<64xf32>, memref<1xi64>, memref<16x16xf32>, memref<16x16xf32>)
        outs(%turned_query, %cache_key, %cache_value : memref<1x64xf32>, memref<2x16x16xbf16>, memref<2x16x16xbf16>)
        {epsilon = 1.000000e-05 : f32}
    ```
    """

    name = "cuda.qkv"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
        ("x", "weight", "scale", "positions", "cos", "sin"),
        ("query", "keys", "values"),
    )
    ARITY: ClassVar[tuple[int, int]] = (6, 3)

    epsilon = prop_def(FloatAttr)

    def check_(self) -> None:
        (x, weight, scale, _, cos, _), (query, keys, values) = self.shapes()
        _expect(self, "value cache shape", values, keys)
        head_dim = keys[-1]
        _expect(self, "table width", cos[1], head_dim)
        _expect(self, "weight shape", weight, (query[1] + 2 * keys[-3] * head_dim, x[1]))
        _expect(self, "norm scale shape", scale, (x[1],))
        _expect(self, "query shape", query, (x[0], query[1]))
        if x[0] != 1 or len(keys) != 3:
            raise _fail(self, "fuses a decode step's row (one row, one cache per layer)")


@irdl_op_definition
class RopeOp(KernelOp):
    """Rotary embedding of each head of each row at its position, from the host's cos/sin tables
    ([positions, head_dim], sin signed [-sin, sin]); with `rotary_dim` R (partial rotary) the pairs are (d, d + R/2)
    of the head's first R numbers, and the tables hold cos 1 and sin 0 past R, so the rest pass through. ins (x,
    positions, cos, sin), outs (out).

    ```mlir
    cuda.rope ins(%query, %position, %rope_cos, %rope_sin : memref<1x64xf32>, memref<1xi64>, memref<16x16xf32>,
        memref<16x16xf32>) outs(%turned_query : memref<1x64xf32>) {head_dim = 16 : i64}
    ```
    """

    name = "cuda.rope"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("x", "positions", "cos", "sin"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (4, 1)

    head_dim = prop_def(IntegerAttr[I64])
    rotary_dim = opt_prop_def(IntegerAttr[I64])  # partial rotary: pairs (d, d + rotary/2) of the first `rotary`

    def check_(self) -> None:
        (x, _, cos, _), (out,) = self.shapes()
        _expect(self, "result shape", out, x)
        _expect(self, "table width", cos[1], self.head_dim.value.data)


@irdl_op_definition
class RopeCacheWriteOp(KernelOp):
    """Rotate each row's keys and write them, with its values, into the caches at the row's position (row r into
    sequence r's cache for a batch). ins (key, value, positions, cos, sin), outs (key cache, value cache).

    ```mlir
    cuda.rope_cache_write ins(%key, %value, %position, %rope_cos, %rope_sin : memref<1x32xf32>, memref<1x32xf32>,
        memref<1xi64>, memref<16x16xf32>, memref<16x16xf32>) outs(%cache_key, %cache_value : memref<2x16x16xbf16>,
        memref<2x16x16xbf16>)
    ```
    """

    name = "cuda.rope_cache_write"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
        ("key", "value", "positions", "cos", "sin"),
        ("keys", "values"),
    )
    ARITY: ClassVar[tuple[int, int]] = (5, 2)

    rotary_dim = opt_prop_def(IntegerAttr[I64])  # partial rotary, as `cuda.rope`'s

    def check_(self) -> None:
        (key, value, _, _, _), (keys, values) = self.shapes()
        _expect(self, "value shape", value, key)
        _expect(self, "value cache shape", values, keys)
        _expect(self, "row width", key[1], keys[-3] * keys[-1])


@irdl_op_definition
class AttentionOp(KernelOp):
    """Causal grouped-query attention of each row over the cache up to its position, split across warps
    (flash-decoding): a warp per (row, KV head, split) reads its positions' keys and values once for the group's
    query heads; `split` is the most positions a split attends at a full cache (the live length is shared over
    the ctx / split splits); with a `window` of W (a sliding window), a row at position p attends positions
    p - W + 1 to p alone: the live length is min(p, W), starting at p - min(p, W), over W / split splits;
    partial softmax sums into `scratch`; the last warp of a (row, KV head) to finish, as counted in `count` (zero
    between steps), combines them. ins (query, key cache, value cache, positions), outs
    (out, scratch [rows, heads, splits, head_dim + 2], count [rows, kv_heads] i64).

    ```mlir
    cuda.attention ins(%turned_query, %cache_key, %cache_value, %position : memref<1x64xf32>, memref<2x16x16xbf16>,
        memref<2x16x16xbf16>, memref<1xi64>) outs(%attended, %attention_partial, %attention_count : memref<1x64xf32>,
        memref<1x4x1x18xf32>, memref<1x2xi64>) {split = 16 : i64}
    ```
    """

    name = "cuda.attention"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
        ("query", "keys", "values", "positions"),
        ("out", "partial", "count"),
    )
    ARITY: ClassVar[tuple[int, int]] = (4, 3)

    split = prop_def(IntegerAttr[I64])
    window = opt_prop_def(IntegerAttr[I64])
    scale = opt_prop_def(FloatAttr)  # the scores' scale (absent: 1 / sqrt(head_dim))
    softcap = opt_prop_def(FloatAttr)  # scores soft-capped, tanh(s / cap) * cap, before the softmax (Gemma 2)

    def attended(self) -> int:
        """The most positions a row attends: its window where it has one (shorter than the cache), else the
        cache's length."""
        ctx = shape_of(self.ins[1].type)[-2]
        return min(ctx, self.window.value.data) if self.window is not None else ctx

    def check_(self) -> None:
        (query, keys, values, _), (out, scratch, count) = self.shapes()
        _expect(self, "value cache shape", values, keys)
        _expect(self, "result shape", out, query)
        split = self.split.value.data
        heads = query[1] // keys[-1]
        if self.window is not None and not 1 <= self.window.value.data < keys[-2]:
            raise _fail(self, f"has a window of {self.window.value.data}, not 1 to {keys[-2] - 1}")
        _expect(self, "scratch shape", scratch, (query[0], heads, -(-self.attended() // split), keys[-1] + 2))
        _expect(self, "count shape", count, (query[0], keys[-3]))


@irdl_op_definition
class ExpertsOp(KernelOp):
    """A mixture of experts of each row of x (`logos.experts`): the router's logits [rows, experts] to a softmax over
    every expert (f32), the `top_k` most probable chosen (the lowest index first on a tie), their weights divided by
    their sum with `renormalize`; each chosen expert's SwiGLU MLP of the row, down_e(silu(gate_e x) * up_e x), times its
    weight, summed in ascending expert index. The stacked weights are the experts this chip holds (`chip` given: a
    split step's share, experts [chip * held, (chip + 1) * held) of the logits' experts; the sum is then this chip's
    partial sum, which an all-reduce after it completes). ins (x, logits, gate [held, I, H], up [held, I, H], down
    [held, H, I][, chip][, residual][, scale]) (residual with `residual`: added to the sum, on chip `residual_chip`
    alone in a split step's partial sum, as `cuda.linear`'s; scale with `epsilon`: the RMS norm of x folded into the
    gate/up products' prologue, as `cuda.gate_up`'s), outs (out [rows, H], chosen [rows, top_k] i64 (each row's
    chosen experts in ascending index, as this chip's index, `held` where another chip holds it), weights [rows,
    top_k], act [rows * top_k, I], partial [rows * top_k, H][, count [held] i64, assigned [held, rows] i64]): the
    last two, of a chunk or batch (several rows), are each expert's rows (as assignments row * top_k + slot, in row
    order), so each expert's weights are read for its own rows alone.

    ```mlir
    cuda.experts ins(%normed_mixed, %router_logits, %gate_weights, %up_weights, %down_weights : memref<1x64xf32>,
        memref<1x4xf32>, memref<4x32x64xbf16>, memref<4x32x64xbf16>, memref<4x64x32xbf16>) outs(%routed,
        %route_chosen, %route_weights, %experts_act, %experts_partial : memref<1x64xf32>, memref<1x2xi64>,
        memref<1x2xf32>, memref<2x32xf32>, memref<2x64xf32>) {top_k = 2 : i64, renormalize}
    ```
    """

    name = "cuda.experts"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
        ("x", "logits", "gate", "up", "down", "chip", "residual", "scale"),
        ("out", "chosen", "weights", "act", "partial", "count", "assigned"),
    )

    top_k = prop_def(IntegerAttr[I64])
    renormalize = opt_prop_def(UnitAttr)
    epsilon = opt_prop_def(FloatAttr)  # the RMS norm of x folded into the gate/up products (`cuda-fold-norms`)
    residual = opt_prop_def(UnitAttr)  # a residual input, added to the sum (`cuda-fold-residual-adds`)
    residual_chip = opt_prop_def(IntegerAttr[I64])  # a split step's residual, added on this chip alone

    def normed(self) -> bool:
        return self.epsilon is not None

    def has_residual(self) -> bool:
        return self.residual is not None

    def residual_input(self) -> SSAValue | None:
        """The residual buffer (after the weights and the chip table), else None."""
        return self.ins[5 + self.split()] if self.has_residual() else None

    def roles(self) -> list[str]:
        ins, outs = self.ROLES
        names = [*ins[:5], *(["chip"] if self.split() else []), *(["residual"] if self.has_residual() else [])]
        return [*names, *(["scale"] if self.normed() else []), *outs[: len(self.outs)]]

    def split(self) -> bool:
        """Whether this is a chip's share of the experts (its `chip` table given: it holds fewer than it routes)."""
        return shape_of(self.ins[2].type)[0] != shape_of(self.ins[1].type)[1]

    def grouped(self) -> bool:
        """Whether the rows are grouped by expert (several rows: a chunk or a batch)."""
        return len(self.outs) == 7

    def held(self) -> int:
        return shape_of(self.ins[2].type)[0]

    def routed(self) -> int:
        return shape_of(self.ins[1].type)[1]

    def verify_(self) -> None:
        want = 5 + self.split() + self.has_residual() + self.normed()
        if len(self.ins) != want or len(self.outs) not in (5, 7):
            raise _fail(self, f"takes {want} inputs and 5 or 7 outputs, got {len(self.ins)} and {len(self.outs)}")
        (x, logits, gate, up, down, *_), (out, chosen, weights, act, partial, *groups) = self.shapes()
        if self.normed():
            _expect(self, "norm scale shape", shape_of(self.ins[-1].type), (x[1],))
        rows, hidden = x
        held, inter = gate[0], gate[1]
        k = self.top_k.value.data
        _expect(self, "gate shape", gate, (held, inter, hidden))
        _expect(self, "up shape", up, gate)
        _expect(self, "down shape", down, (held, hidden, inter))
        _expect(self, "router logits rows", logits[0], rows)
        if not 1 <= k <= logits[1]:
            raise _fail(self, f"routes each row to {k} experts, not 1 to its {logits[1]}")
        if self.split() and shape_of(self.ins[5].type) != (1,):
            raise _fail(self, f"holds {held} of {logits[1]} experts: a share reads the chip table after its weights")
        if self.residual_chip is not None and not (self.split() and self.has_residual()):
            raise _fail(self, "adds its residual on one chip: it needs a split step's chip table and a residual")
        residual = self.residual_input()
        if residual is not None:
            _expect(self, "residual shape", shape_of(residual.type), x)
        _expect(self, "result shape", out, x)
        _expect(self, "chosen shape", chosen, (rows, k))
        _expect(self, "weights shape", weights, (rows, k))
        _expect(self, "act shape", act, (rows * k, inter))
        _expect(self, "partial shape", partial, (rows * k, hidden))
        if groups:
            _expect(self, "count shape", groups[0], (held,))
            _expect(self, "assigned shape", groups[1], (held, rows))


@irdl_op_definition
class AddOp(KernelOp):
    """out = lhs + rhs, elementwise: a residual add (`cuda-fold-residual-adds` folds it into the projection or
    all-reduce before it where it can).

    ```mlir
    cuda.add ins(%hidden, %projected : memref<1x64xf32>, memref<1x64xf32>) outs(%mixed : memref<1x64xf32>)
    ```
    """

    name = "cuda.add"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("lhs", "rhs"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (2, 1)

    def check_(self) -> None:
        (lhs, rhs), (out,) = self.shapes()
        _expect(self, "operand shapes", rhs, lhs)
        _expect(self, "result shape", out, lhs)


@irdl_op_definition
class BiasAddOp(KernelOp):
    """out = input + bias on each row: a projection's bias (Qwen2's query, key and value), one thread a column.

    ```mlir
    cuda.bias_add ins(%query, %query_bias : memref<1x64xf32>, memref<64xbf16>) outs(%query_biased : memref<1x64xf32>)
    ```
    """

    name = "cuda.bias_add"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("input", "bias"), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (2, 1)

    def check_(self) -> None:
        (rows, bias), (out,) = self.shapes()
        _expect(self, "bias shape", bias, rows[1:])
        _expect(self, "result shape", out, rows)


class _Elementwise(KernelOp):
    """An elementwise kernel of one input, a thread a column of a row."""

    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("x",), ("out",))
    ARITY: ClassVar[tuple[int, int]] = (1, 1)

    def check_(self) -> None:
        (x,), (out,) = self.shapes()
        _expect(self, "result shape", out, x)


@irdl_op_definition
class ScaleOp(_Elementwise):
    """out = x * factor (f32), elementwise: Gemma's embedding times the square root of the width.

    ```mlir
    cuda.scale ins(%rows : memref<1x64xf32>) outs(%hidden : memref<1x64xf32>) {factor = 8.000000e+00 : f32}
    ```
    """

    name = "cuda.scale"
    factor = prop_def(FloatAttr)


@irdl_op_definition
class SoftcapOp(_Elementwise):
    """out = tanh(x / cap) * cap, elementwise: Gemma 2's soft-capped logits.

    ```mlir
    cuda.softcap ins(%raw_logits : memref<1x256xf32>) outs(%logits : memref<1x256xf32>) {cap = 3.000000e+01 : f32}
    ```
    """

    name = "cuda.softcap"
    cap = prop_def(FloatAttr)


@irdl_op_definition
class ArgmaxOp(KernelOp):
    """The index (from 1) of each row's greatest value, the first on a tie, as a two-stage reduction: warps reduce
    `chunk` values each into `scratch` (value, index), then a warp a row reduces those. ins (x), outs (out, scratch
    [rows, chunks, 2]).

    ```mlir
    cuda.argmax ins(%logits : memref<1x256xf32>) outs(%next, %argmax_partial : memref<1xi64>, memref<1x1x2xf32>)
        {chunk = 1024 : i64}
    ```
    """

    name = "cuda.argmax"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (("logits",), ("next", "partial"))
    ARITY: ClassVar[tuple[int, int]] = (1, 2)

    chunk = prop_def(IntegerAttr[I64])

    def check_(self) -> None:
        (x,), (out, scratch) = self.shapes()
        _expect(self, "result shape", out, (x[0],))
        _expect(self, "scratch shape", scratch, (x[0], -(-x[1] // self.chunk.value.data), 2))


# -- the thread level: what xDSL lacks (upstream gpu and llvm ops in gpu_ext; nvvm here) ---------------------


@irdl_op_definition
class WarpSyncOp(IRDLOperation):
    """Upstream MLIR's `nvvm.bar.warp.sync` (xDSL 0.74 has no `nvvm`): the lanes of `mask` meet (CUDA's
    `__syncwarp(mask)`; the lane uses the whole warp, mask -1).

    ```mlir
    "nvvm.bar.warp.sync"(%mask) : (i32) -> ()
    ```
    """

    name = "nvvm.bar.warp.sync"

    mask = operand_def(IntegerType(32))

    def __init__(self, mask: SSAValue):
        super().__init__(operands=[mask])


class GridDepAction(StrEnum):
    WAIT = "wait"
    LAUNCH_DEPENDENTS = "launch_dependents"


@irdl_attr_definition
class GridDepActionAttr(EnumAttribute[GridDepAction]):
    """Upstream NVVM's `#nvvm.grid_dep_action<wait>` / `<launch_dependents>`, the kind of `nvvm.griddepcontrol`."""

    name = "nvvm.grid_dep_action"

    def print_parameter(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_string(self.data.value)

    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> GridDepAction:
        with parser.in_angle_brackets():
            return parser.parse_str_enum(GridDepAction)


@irdl_op_definition
class GridDepControlOp(IRDLOperation):
    """Upstream MLIR's `nvvm.griddepcontrol` (xDSL 0.74 has no `nvvm`): Hopper's programmatic dependent launch, PTX
    `griddepcontrol.wait` (this thread waits until every grid it depends on has completed and its writes are
    visible: what a kernel launched programmatically does before it reads what the launch before it wrote) and
    `griddepcontrol.launch_dependents` (the grid after this one may be launched once every block of this one has
    said so or exited; the dependent still waits for this grid's completion before it reads anything). A kernel
    launched without the programmatic attribute passes both at once.

    ```mlir
    "nvvm.griddepcontrol"() <{kind = #nvvm.grid_dep_action<wait>}> : () -> ()
    ```
    """

    name = "nvvm.griddepcontrol"

    kind = prop_def(GridDepActionAttr)

    def __init__(self, kind: GridDepAction):
        super().__init__(properties={"kind": GridDepActionAttr(kind)})

    @property
    def waits(self) -> bool:
        return self.kind.data == GridDepAction.WAIT


KERNEL_OPS: tuple[type[KernelOp], ...] = (
    EmbedOp,
    RMSNormOp,
    LinearOp,
    GateUpOp,
    QKVOp,
    RopeOp,
    RopeCacheWriteOp,
    AttentionOp,
    ExpertsOp,
    AddOp,
    BiasAddOp,
    HeadRMSNormOp,
    ScaleOp,
    SoftcapOp,
    ArgmaxOp,
)


# -- tensor cores: shared memory, asynchronous copies, ldmatrix, mma.sync ---------------------------------------
#
# The ops a tiled matrix product on Hopper's (and Ampere's) warp-level tensor cores needs beyond xDSL's `gpu`
# (which has `gpu.barrier`, used as `__syncthreads`): a block's shared memory, the asynchronous global-to-shared
# copy with its commit and wait groups, `ldmatrix` and `mma.sync.m16n8k16` with bf16 inputs and f32 accumulators.
# They follow upstream MLIR's `nvgpu` dialect (`nvgpu.device_async_copy`, `nvgpu.ldmatrix`, `nvgpu.mma.sync`), one
# PTX register an SSA value: a b32 register holding two bf16 is a `vector<2xbf16>`, an accumulator an `f32`, so the
# operands of `cuda.mma_sync` are exactly the PTX instruction's. Shared memrefs carry memory space 3 (NVVM's
# shared address space, as upstream spells it).


BF16X2 = VectorType(BFloat16Type(), [2])  # a b32 register of two bf16
SHARED = 3  # NVVM's address space of shared memory


def _is_shared(kind: Attribute) -> bool:
    return (
        isinstance(kind, MemRefType)
        and isinstance(kind.memory_space, IntegerAttr)
        and kind.memory_space.value.data == SHARED
    )


def _check_address(op: Operation, memory: SSAValue, indices: Sequence[SSAValue], shared: bool, what: str) -> None:
    kind = memory.type
    if not isinstance(kind, MemRefType):
        raise _fail(op, f"{what} must be a memref")
    if _is_shared(kind) != shared:
        raise _fail(op, f"{what} must be in {'shared' if shared else 'global'} memory")
    if len(indices) != len(kind.get_shape()):
        raise _fail(op, f"{what} needs {len(kind.get_shape())} indices, got {len(indices)}")


@irdl_op_definition
class SharedMemoryOp(IRDLOperation):
    """A block's statically sized shared memory (CUDA `__shared__ __align__(16)`), zero when the block starts in
    the emulator and undefined on a GPU (every kernel writes before it reads).

    ```mlir
    %a = cuda.shared_memory : memref<2x64x40xf32, 3>
    ```
    """

    name = "cuda.shared_memory"

    result = result_def(MemRefType)

    assembly_format = "attr-dict `:` type($result)"

    def __init__(self, result_type: MemRefType):
        super().__init__(result_types=[result_type])

    def verify_(self) -> None:
        if not _is_shared(self.result.type):
            raise _fail(self, f"allocates in shared memory (memory space {SHARED}), not {self.result.type}")


@irdl_op_definition
class CpAsyncOp(IRDLOperation):
    """PTX `cp.async.cg.shared.global` of 16 bytes from global to shared memory, completing only at a
    `cuda.cp_async_wait` that covers its group; when `valid` is false the 16 bytes are zero-filled (source size 0)
    and nothing is read. Both addresses must be 16-byte aligned.

    ```mlir
    cuda.cp_async %tile[%s, %r, %c], %x[%row, %k], %valid : memref<2x64x40xf32, 3>, memref<16x576xf32>
    ```
    """

    name = "cuda.cp_async"

    dst = operand_def(MemRefType)
    dst_indices = var_operand_def(IndexType)
    src = operand_def(MemRefType)
    src_indices = var_operand_def(IndexType)
    valid = operand_def(IntegerType(1))

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$dst `[` $dst_indices `]` `,` $src `[` $src_indices `]` `,` $valid attr-dict `:` type($dst) `,` type($src)"
    )

    def __init__(self, dst: SSAValue, dst_indices: Sequence[SSAValue], src: SSAValue, src_indices, valid: SSAValue):
        super().__init__(operands=[dst, dst_indices, src, src_indices, valid])

    def elements(self) -> int:
        """Elements a copy moves (16 bytes of the source's element type)."""
        kind = self.src.type
        assert isinstance(kind, MemRefType)
        return 8 if isinstance(kind.element_type, BFloat16Type) else 4

    def verify_(self) -> None:
        _check_address(self, self.dst, self.dst_indices, True, "destination")
        _check_address(self, self.src, self.src_indices, False, "source")
        dst, src = self.dst.type, self.src.type
        assert isinstance(dst, MemRefType) and isinstance(src, MemRefType)
        if dst.element_type != src.element_type:
            between = f"{src.element_type} to {dst.element_type}"
            raise _fail(self, f"copies bytes between memrefs of one element type, not {between}")
        if not isinstance(src.element_type, Float32Type | BFloat16Type):
            raise _fail(self, f"copies f32 or bf16 elements, not {src.element_type}")
        for kind, where in ((dst, "destination"), (src, "source")):
            if kind.get_shape()[-1] % self.elements():
                raise _fail(self, f"{where} rows of {kind.get_shape()[-1]} are not whole 16-byte chunks")


@irdl_op_definition
class CpAsyncCommitOp(IRDLOperation):
    """PTX `cp.async.commit_group`: this thread's copies issued since the last commit form one group.

    ```mlir
    cuda.cp_async_commit
    ```
    """

    name = "cuda.cp_async_commit"

    assembly_format = "attr-dict"


class WaitGroupOp(IRDLOperation):
    """A PTX `*.wait_group N`: wait until at most `pending` (0 to 7) of the groups committed before are in flight."""

    pending = prop_def(IntegerAttr[I64])

    assembly_format = "$pending attr-dict"

    def __init__(self, pending: int):
        super().__init__(properties={"pending": IntegerAttr(pending, 64)})

    def verify_(self) -> None:
        if not 0 <= self.pending.value.data <= 7:
            raise _fail(self, f"waits with 0 to 7 groups pending, not {self.pending.value.data}")


@irdl_op_definition
class CpAsyncWaitOp(WaitGroupOp):
    """PTX `cp.async.wait_group N`: wait until at most `pending` of this thread's committed groups are still in
    flight (the older ones have landed in shared memory).

    ```mlir
    cuda.cp_async_wait 1
    ```
    """

    name = "cuda.cp_async_wait"


@irdl_op_definition
class LdmatrixOp(IRDLOperation):
    """PTX `ldmatrix.sync.aligned.m8n8.x{1,2,4}.shared.b16`: `tiles` 8x8 matrices of 16-bit elements from shared
    memory. Lane 8*i + r gives the address of row r of matrix i (16 bytes, 16-byte aligned); lane 4*r + w receives,
    in its register i, the two elements 2w and 2w+1 of row r of matrix i; with `transpose` (`.trans`), elements
    (2w, r) and (2w+1, r) of matrix i, i.e. its column r. Every lane of the warp takes part.

    ```mlir
    %r0, %r1, %r2, %r3 = cuda.ldmatrix %tile[%s, %n, %k] : memref<2x128x40xbf16, 3> -> vector<2xbf16>, vector<2xbf16>,
        vector<2xbf16>, vector<2xbf16>
    ```
    """

    name = "cuda.ldmatrix"

    memref = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    registers = var_result_def(VectorType)
    transpose = opt_prop_def(UnitAttr)

    assembly_format = (
        "$memref `[` $indices `]` (`transpose` $transpose^)? attr-dict `:` type($memref) `->` type($registers)"
    )

    def __init__(self, memref: SSAValue, indices: Sequence[SSAValue], tiles: int, transpose: bool = False):
        properties = {"transpose": UnitAttr()} if transpose else {}
        super().__init__(operands=[memref, indices], result_types=[[BF16X2] * tiles], properties=properties)

    def verify_(self) -> None:
        _check_address(self, self.memref, self.indices, True, "source")
        kind = self.memref.type
        assert isinstance(kind, MemRefType)
        if not isinstance(kind.element_type, BFloat16Type):
            raise _fail(self, f"loads bf16 matrices, not {kind.element_type}")
        if len(self.registers) not in (1, 2, 4):
            raise _fail(self, f"loads 1, 2 or 4 matrices, not {len(self.registers)}")
        if any(r.type != BF16X2 for r in self.registers):
            raise _fail(self, "gives one vector<2xbf16> register a matrix")
        if kind.get_shape()[-1] % 8:
            raise _fail(self, f"rows of {kind.get_shape()[-1]} bf16 are not whole 16-byte rows")


@irdl_op_definition
class LoadBF16x2Op(IRDLOperation):
    """Two consecutive f32 of shared (or global) memory rounded to nearest even into one bf16 pair, the first in
    the low half: a b32 register of an mma fragment built from f32 values (CUDA: a `float2` load,
    `__floats2bfloat162_rn`). The index of the last axis must be even.

    ```mlir
    %a0 = cuda.load_bf16x2 %tile[%s, %row, %k] : memref<2x64x40xf32, 3>
    ```
    """

    name = "cuda.load_bf16x2"

    memref = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    result = result_def(BF16X2)

    assembly_format = "$memref `[` $indices `]` attr-dict `:` type($memref)"

    def __init__(self, memref: SSAValue, indices: Sequence[SSAValue]):
        super().__init__(operands=[memref, indices], result_types=[BF16X2])

    def verify_(self) -> None:
        kind = self.memref.type
        assert isinstance(kind, MemRefType)
        _check_address(self, self.memref, self.indices, _is_shared(kind), "source")
        if not isinstance(kind.element_type, Float32Type):
            raise _fail(self, f"rounds f32 pairs, not {kind.element_type}")
        if self.result.type != BF16X2:
            raise _fail(self, "gives a vector<2xbf16>")


@irdl_op_definition
class PackBF16x2Op(IRDLOperation):
    """Two f32 values rounded to nearest even into one bf16 pair, `low` in the low half (PTX `cvt.rn.bf16x2.f32`,
    CUDA `__floats2bfloat162_rn`): an accumulator fragment turned into an A fragment (flash attention's P).

    ```mlir
    %p = cuda.pack_bf16x2 %low, %high
    ```
    """

    name = "cuda.pack_bf16x2"

    low = operand_def(Float32Type())
    high = operand_def(Float32Type())
    result = result_def(BF16X2)

    assembly_format = "$low `,` $high attr-dict"

    def __init__(self, low: SSAValue, high: SSAValue):
        super().__init__(operands=[low, high], result_types=[BF16X2])


@irdl_op_definition
class StoreBF16x2Op(IRDLOperation):
    """A bf16 pair (one b32 register) stored to two consecutive bf16 of shared (or global) memory, the low half
    first (PTX `st.shared.b32` / `st.global.b32`). The index of the last axis must be even.

    ```mlir
    cuda.store_bf16x2 %pair, %tile[%r, %c] : memref<64x136xbf16, 3>
    ```
    """

    name = "cuda.store_bf16x2"

    value = operand_def(BF16X2)
    memref = operand_def(MemRefType)
    indices = var_operand_def(IndexType)

    assembly_format = "$value `,` $memref `[` $indices `]` attr-dict `:` type($memref)"

    def __init__(self, value: SSAValue, memref: SSAValue, indices: Sequence[SSAValue]):
        super().__init__(operands=[value, memref, indices])

    def verify_(self) -> None:
        kind = self.memref.type
        assert isinstance(kind, MemRefType)
        _check_address(self, self.memref, self.indices, _is_shared(kind), "destination")
        if not isinstance(kind.element_type, BFloat16Type) or kind.get_shape()[-1] % 2:
            raise _fail(self, f"stores into rows of whole bf16 pairs, not {kind}")


@irdl_op_definition
class MmaSyncOp(IRDLOperation):
    """PTX `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: D = A B + C over a warp, A 16x16 and B 16x8 of
    bf16, C and D 16x8 of f32, each lane holding its fragments in the PTX ISA's layout (g = lane / 4, t = lane % 4):
    A registers 0-3 hold A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]; B registers 0-1 hold
    B[2t..2t+1][g], B[2t+8..2t+9][g]; C and D 0-3 hold C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].

    ```mlir
    %d0, %d1, %d2, %d3 = cuda.mma_sync (%a0, %a1, %a2, %a3), (%b0, %b1), (%c0, %c1, %c2, %c3) : f32, f32, f32, f32
    ```
    """

    name = "cuda.mma_sync"

    a = var_operand_def(BF16X2)
    b = var_operand_def(BF16X2)
    c = var_operand_def(Float32Type())
    d = var_result_def(Float32Type())

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = "`(` $a `)` `,` `(` $b `)` `,` `(` $c `)` attr-dict `:` type($d)"

    def __init__(self, a: Sequence[SSAValue], b: Sequence[SSAValue], c: Sequence[SSAValue]):
        super().__init__(operands=[a, b, c], result_types=[[Float32Type()] * 4])

    def verify_(self) -> None:
        counts = (len(self.a), len(self.b), len(self.c), len(self.d))
        if counts != (4, 2, 4, 4):
            raise _fail(self, f"m16n8k16 takes 4 A, 2 B and 4 C registers and gives 4, not {counts}")
        if any(v.type != BF16X2 for v in (*self.a, *self.b)):
            raise _fail(self, "takes A and B registers of two bf16 (vector<2xbf16>)")


@irdl_op_definition
class PrefillAttentionOp(KernelOp):
    """A prefill chunk's attention in one pass (flash attention): rotate each row's query and the chunk's keys at
    their positions (consecutive, from `positions[0]`), write the chunk's keys and values into the caches, and
    attend each row causally over the cache before the chunk and the chunk up to itself. ins (query, key, value,
    positions, cos, sin), outs (out, key cache, value cache [kv_heads, ctx, head_dim]).

    ```mlir
    cuda.prefill_attention ins(%q, %k, %v, %p, %cos, %sin : memref<4x64xf32>, memref<4x32xf32>, memref<4x32xf32>,
        memref<4xi64>, memref<64x16xf32>, memref<64x16xf32>)
        outs(%o, %keys, %values : memref<4x64xf32>, memref<2x64x16xbf16>, memref<2x64x16xbf16>)
    ```
    """

    name = "cuda.prefill_attention"
    ROLES: ClassVar[tuple[tuple[str, ...], tuple[str, ...]]] = (
        ("query", "key", "value", "positions", "cos", "sin"),
        ("out", "keys", "values"),
    )
    ARITY: ClassVar[tuple[int, int]] = (6, 3)

    def check_(self) -> None:
        (query, key, value, positions, cos, _), (out, keys, values) = self.shapes()
        _expect(self, "value shape", value, key)
        _expect(self, "value cache shape", values, keys)
        _expect(self, "result shape", out, query)
        _expect(self, "positions shape", positions, (query[0],))
        _expect(self, "key width", key[1], keys[0] * keys[-1])
        _expect(self, "table width", cos[1], keys[-1])
        if len(keys) != 3 or query[1] % (keys[0] * keys[-1]):
            raise _fail(self, "attends one sequence's cache with whole groups of query heads")


@irdl_op_definition
class LoadNormBF16x2Op(IRDLOperation):
    """`cuda.load_bf16x2` with an RMS norm applied before the rounding (the norm folded into a prefill
    product's prologue): element i of the pair is round_bf16((x_i * inverse) * scale_i), each product rounded to
    f32 as `cuda.rms_norm` computes it (CUDA: `__fmul_rn` twice, then `__floats2bfloat162_rn`), so the operand is
    the bf16 rounding of exactly what the separate norm kernel would have written.

    ```mlir
    %a0 = cuda.load_norm_bf16x2 %tile[%s, %row, %k] * %inv, %g0, %g1 : memref<2x64x40xf32, 3>
    ```
    """

    name = "cuda.load_norm_bf16x2"

    memref = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    inverse = operand_def(Float32Type)
    low_scale = operand_def(Float32Type)
    high_scale = operand_def(Float32Type)
    result = result_def(BF16X2)

    assembly_format = "$memref `[` $indices `]` `*` $inverse `,` $low_scale `,` $high_scale attr-dict `:` type($memref)"

    def __init__(self, memref: SSAValue, indices: Sequence[SSAValue], inverse: SSAValue, low: SSAValue, high: SSAValue):
        super().__init__(operands=[memref, indices, inverse, low, high], result_types=[BF16X2])

    def verify_(self) -> None:
        kind = self.memref.type
        assert isinstance(kind, MemRefType)
        _check_address(self, self.memref, self.indices, _is_shared(kind), "source")
        if not isinstance(kind.element_type, Float32Type):
            raise _fail(self, f"rounds f32 pairs, not {kind.element_type}")


# -- Hopper's asynchronous ops: mbarriers, TMA, wgmma (sm_90a) ----------------------------------------------------

SWIZZLES = {0: 0, 128: 1, 64: 2, 32: 3}  # swizzle width in bytes -> the wgmma descriptor's 2-bit mode (PTX ISA)
SHARED_ALIGN = 1024  # every shared buffer of a kernel starts 1024-byte aligned (a 128B swizzle's 8-row pattern)
WARPGROUP = 128


def _element_bytes(kind: MemRefType) -> int:
    element = kind.element_type
    if isinstance(element, BFloat16Type):
        return 2
    if isinstance(element, IntegerType) and element.width.data == 64:
        return 8
    return 4


def shared_layout(kernel: Operation) -> tuple[dict[SSAValue, int], int]:
    """The byte offset of each `cuda.shared_memory` of a kernel in its shared memory, in program order, each
    SHARED_ALIGN-aligned, and the total: what the emitter carves out of the dynamic shared memory of a kernel that
    uses TMA, and the addresses the emulator decodes from a wgmma descriptor."""
    offsets: dict[SSAValue, int] = {}
    at = 0
    for op in kernel.walk():
        if not isinstance(op, SharedMemoryOp):
            continue
        kind = op.result.type
        assert isinstance(kind, MemRefType)
        at = -(-at // SHARED_ALIGN) * SHARED_ALIGN
        offsets[op.result] = at
        at += _element_bytes(kind) * _count(kind)
    return offsets, at


def _count(kind: MemRefType) -> int:
    total = 1
    for extent in kind.get_shape():
        total *= extent
    return total


def tensor_maps(kernel: Operation) -> list[tuple[SSAValue, tuple[int, int], int]]:
    """The CUtensorMaps a kernel's TMA copies read, in order of first use: (the global tensor, its box (rows,
    columns), the swizzle in bytes). The emitter declares one `__grid_constant__` parameter each after the
    kernel's pointers; the host encodes them (`runtime/cuda/tensor_maps.py`)."""
    found: list[tuple[SSAValue, tuple[int, int], int]] = []
    for op in kernel.walk():
        if isinstance(op, TmaLoadOp):
            key = (op.src, op.box_shape(), op.swizzle.value.data)
            if key not in found:
                found.append(key)
    return found


def _check_barrier(op: Operation, bars: SSAValue, indices: Sequence[SSAValue]) -> None:
    _check_address(op, bars, indices, True, "barrier")
    kind = bars.type
    assert isinstance(kind, MemRefType)
    if kind.element_type != IntegerType(64):
        raise _fail(op, f"takes mbarriers of i64 (a .b64 each), not {kind.element_type}")


@irdl_op_definition
class MbarrierInitOp(IRDLOperation):
    """PTX `mbarrier.init.shared::cta.b64`: the barrier expects `count` arrivals a phase (phase 0, no pending
    transaction bytes).

    ```mlir
    cuda.mbarrier_init %full[%s], 1 : memref<4xi64, 3>
    ```
    """

    name = "cuda.mbarrier_init"

    bars = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    count = prop_def(IntegerAttr[I64])

    assembly_format = "$bars `[` $indices `]` `,` $count attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue, indices: Sequence[SSAValue], count: int):
        super().__init__(operands=[bars, indices], properties={"count": IntegerAttr(count, 64)})

    def verify_(self) -> None:
        _check_barrier(self, self.bars, self.indices)
        if not 1 <= self.count.value.data < 2**20:
            raise _fail(self, f"expects 1 to 2^20 - 1 arrivals, not {self.count.value.data}")


@irdl_op_definition
class FenceBarrierInitOp(IRDLOperation):
    """PTX `fence.mbarrier_init.release.cluster`: the barriers this thread initialised are visible to the async
    proxy (TMA's complete_tx) and to the other threads after the next block barrier.

    ```mlir
    cuda.fence_barrier_init
    ```
    """

    name = "cuda.fence_barrier_init"

    assembly_format = "attr-dict"


@irdl_op_definition
class MbarrierArriveOp(IRDLOperation):
    """PTX `mbarrier.arrive.shared::cta.b64` (each executing thread one arrival) or, with `expect_tx`,
    `mbarrier.arrive.expect_tx.shared::cta.b64`: the thread arrives and adds `expect_tx` bytes to the phase's
    pending transaction count (what the TMA copies signalling this barrier will complete).

    ```mlir
    cuda.mbarrier_arrive %full[%s] expect_tx 32768 : memref<4xi64, 3>
    ```
    """

    name = "cuda.mbarrier_arrive"

    bars = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    expect_tx = opt_prop_def(IntegerAttr[I64])

    assembly_format = "$bars `[` $indices `]` (`expect_tx` $expect_tx^)? attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue, indices: Sequence[SSAValue], expect_tx: int | None = None):
        properties = {} if expect_tx is None else {"expect_tx": IntegerAttr(expect_tx, 64)}
        super().__init__(operands=[bars, indices], properties=properties)

    def verify_(self) -> None:
        _check_barrier(self, self.bars, self.indices)
        if self.expect_tx is not None and not 0 < self.expect_tx.value.data < 2**20:
            raise _fail(self, f"expects 1 to 2^20 - 1 transaction bytes, not {self.expect_tx.value.data}")


@irdl_op_definition
class MbarrierWaitOp(IRDLOperation):
    """PTX `mbarrier.try_wait.parity.shared::cta.b64` in a loop until it succeeds: the thread waits until the
    barrier's phase of parity `parity` (0 or 1) has completed (all its arrivals and transaction bytes), and then
    sees what the copies completing it wrote.

    ```mlir
    cuda.mbarrier_wait %full[%s], %parity : memref<4xi64, 3>
    ```
    """

    name = "cuda.mbarrier_wait"

    bars = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    parity = operand_def(IndexType)

    assembly_format = "$bars `[` $indices `]` `,` $parity attr-dict `:` type($bars)"

    def __init__(self, bars: SSAValue, indices: Sequence[SSAValue], parity: SSAValue):
        super().__init__(operands=[bars, indices, parity])

    def verify_(self) -> None:
        _check_barrier(self, self.bars, self.indices)


@irdl_op_definition
class TmaLoadOp(IRDLOperation):
    """PTX `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes`: a box of `box` (rows,
    columns) of the 2-d global tensor `src` from (row, column) into shared memory at `dst[...]`, through a
    CUtensorMap the host encodes for (src, box, swizzle) and passes as a `__grid_constant__` parameter. Elements
    past the tensor's edge are zero-filled; the whole box's bytes complete the barrier's transaction count. With
    `swizzle` (128 bytes) 16-byte chunk c of box row r lands at chunk c ^ (r % 8) of its 128-byte row (the box's
    row must be the swizzle width, its destination 1024-byte aligned).

    ```mlir
    cuda.tma_load %ring[%s, %c0, %c0], %full[%s], %x[%row, %k] box 128 x 64 swizzle 128
        : memref<4x128x64xbf16, 3>, memref<4xi64, 3>, memref<512x4096xbf16>
    ```
    """

    name = "cuda.tma_load"

    dst = operand_def(MemRefType)
    dst_indices = var_operand_def(IndexType)
    bars = operand_def(MemRefType)
    bar_indices = var_operand_def(IndexType)
    src = operand_def(MemRefType)
    src_indices = var_operand_def(IndexType)
    box_rows = prop_def(IntegerAttr[I64])
    box_columns = prop_def(IntegerAttr[I64])
    swizzle = prop_def(IntegerAttr[I64])

    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$dst `[` $dst_indices `]` `,` $bars `[` $bar_indices `]` `,` $src `[` $src_indices `]` `box` $box_rows"
        " `x` $box_columns `swizzle` $swizzle attr-dict `:` type($dst) `,` type($bars) `,` type($src)"
    )

    def __init__(self, dst, dst_indices, bars, bar_indices, src, src_indices, box: tuple[int, int], swizzle: int):
        super().__init__(
            operands=[dst, dst_indices, bars, bar_indices, src, src_indices],
            properties={
                "box_rows": IntegerAttr(box[0], 64),
                "box_columns": IntegerAttr(box[1], 64),
                "swizzle": IntegerAttr(swizzle, 64),
            },
        )

    def box_shape(self) -> tuple[int, int]:
        return self.box_rows.value.data, self.box_columns.value.data

    def box_bytes(self) -> int:
        rows, columns = self.box_shape()
        kind = self.src.type
        assert isinstance(kind, MemRefType)
        return rows * columns * _element_bytes(kind)

    def verify_(self) -> None:
        _check_address(self, self.dst, self.dst_indices, True, "destination")
        _check_address(self, self.src, self.src_indices, False, "source")
        _check_barrier(self, self.bars, self.bar_indices)
        src, dst = self.src.type, self.dst.type
        assert isinstance(src, MemRefType) and isinstance(dst, MemRefType)
        if len(src.get_shape()) != 2 or src.element_type != dst.element_type:
            raise _fail(self, f"copies a box of a 2-d tensor into shared memory of its element type, not {src}")
        rows, columns = self.box_shape()
        swizzle = self.swizzle.value.data
        if swizzle not in SWIZZLES:
            raise _fail(self, f"swizzles 0, 32, 64 or 128 bytes, not {swizzle}")
        if swizzle and columns * _element_bytes(src) != swizzle:
            raise _fail(self, f"needs a box row of {swizzle} bytes to swizzle, not {columns} elements")
        if not (0 < rows <= 256 and 0 < columns <= 256):
            raise _fail(self, f"copies a box of at most 256 x 256, not {rows} x {columns}")


@irdl_op_definition
class WgmmaDescriptorOp(IRDLOperation):
    """A wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"), a 64-bit value: bits 0-13 the
    start address of `memref[indices]` >> 4, 16-29 the leading dimension byte offset >> 4, 32-45 the stride
    dimension byte offset >> 4, 62-63 the swizzle mode (1: 128B, 2: 64B, 3: 32B). For a K-major 128B-swizzled tile
    (what the TMA ring holds) the stride offset is 1024 (8 rows of 128 bytes) and the leading one unused (1).

    ```mlir
    %d = cuda.wgmma_descriptor %ring[%s, %r, %k] leading 16 stride 1024 swizzle 128 : memref<4x128x64xbf16, 3>
    ```
    """

    name = "cuda.wgmma_descriptor"

    memref = operand_def(MemRefType)
    indices = var_operand_def(IndexType)
    leading = prop_def(IntegerAttr[I64])
    stride = prop_def(IntegerAttr[I64])
    swizzle = prop_def(IntegerAttr[I64])
    result = result_def(IntegerType(64))

    assembly_format = (
        "$memref `[` $indices `]` `leading` $leading `stride` $stride `swizzle` $swizzle attr-dict `:` type($memref)"
    )

    def __init__(self, memref: SSAValue, indices: Sequence[SSAValue], leading: int, stride: int, swizzle: int):
        properties = {
            "leading": IntegerAttr(leading, 64),
            "stride": IntegerAttr(stride, 64),
            "swizzle": IntegerAttr(swizzle, 64),
        }
        super().__init__(operands=[memref, indices], result_types=[IntegerType(64)], properties=properties)

    def bits(self, address: int) -> int:
        """The descriptor of a matrix starting at shared address `address` (bytes)."""
        encode = lambda value: (value & 0x3FFFF) >> 4  # noqa: E731 (the ISA's matrix-descriptor-encode)
        mode = SWIZZLES[self.swizzle.value.data]
        return (
            encode(address) | encode(self.leading.value.data) << 16 | encode(self.stride.value.data) << 32 | mode << 62
        )

    def verify_(self) -> None:
        _check_address(self, self.memref, self.indices, True, "matrix")
        if self.swizzle.value.data not in SWIZZLES:
            raise _fail(self, f"swizzles 0, 32, 64 or 128 bytes, not {self.swizzle.value.data}")
        for name in ("leading", "stride"):
            value = getattr(self, name).value.data
            if value % 16 or not 0 <= value < 2**18:
                raise _fail(self, f"needs a {name} byte offset of whole 16 bytes below 2^18, not {value}")


@irdl_op_definition
class WgmmaOp(IRDLOperation):
    """PTX `wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16` (scale-d 1, both operands K-major): D = A B + C
    over a warpgroup (4 warps, warpgroup-aligned), A 64x16 and B 16xN of bf16 read from shared memory through
    their descriptors, C and D 64xN of f32 in registers: warp w of the warpgroup holds rows 16w .. 16w + 15, lane
    (g = lane / 4, t = lane % 4) in registers 4i .. 4i + 3 the elements (16w + g, 8i + 2t), (16w + g, 8i + 2t + 1),
    (16w + g + 8, 8i + 2t), (16w + g + 8, 8i + 2t + 1). Asynchronous: D may be read (other than as the C of a
    following wgmma) only after a `cuda.wgmma_wait` that retires its group.

    ```mlir
    %d0, %d1, %d2, %d3 = cuda.wgmma %a, %b, (%c0, %c1, %c2, %c3) n 8 : f32, f32, f32, f32
    ```
    """

    name = "cuda.wgmma"

    a = operand_def(IntegerType(64))
    b = operand_def(IntegerType(64))
    c = var_operand_def(Float32Type())
    n = prop_def(IntegerAttr[I64])
    d = var_result_def(Float32Type())

    assembly_format = "$a `,` $b `,` `(` $c `)` `n` $n attr-dict `:` type($d)"

    def __init__(self, a: SSAValue, b: SSAValue, c: Sequence[SSAValue], n: int):
        super().__init__(
            operands=[a, b, c], result_types=[[Float32Type()] * (n // 2)], properties={"n": IntegerAttr(n, 64)}
        )

    def verify_(self) -> None:
        n = self.n.value.data
        if n % 8 or not 8 <= n <= 256:
            raise _fail(self, f"takes N a multiple of 8 from 8 to 256, not {n}")
        if len(self.c) != n // 2 or len(self.d) != n // 2:
            raise _fail(self, f"m64n{n}k16 takes and gives {n // 2} f32 registers, not {len(self.c)}, {len(self.d)}")


@irdl_op_definition
class WgmmaFenceOp(IRDLOperation):
    """PTX `wgmma.fence.sync.aligned`: orders the warpgroup's register and shared-memory accesses before the
    wgmma ops that follow.

    ```mlir
    cuda.wgmma_fence
    ```
    """

    name = "cuda.wgmma_fence"

    assembly_format = "attr-dict"


@irdl_op_definition
class WgmmaCommitOp(IRDLOperation):
    """PTX `wgmma.commit_group.sync.aligned`: the warpgroup's wgmma ops since the last commit form one group.

    ```mlir
    cuda.wgmma_commit
    ```
    """

    name = "cuda.wgmma_commit"

    assembly_format = "attr-dict"


@irdl_op_definition
class WgmmaWaitOp(WaitGroupOp):
    """PTX `wgmma.wait_group.sync.aligned N`: waits until at most `pending` of the warpgroup's groups are in
    flight; the older groups' results may then be read.

    ```mlir
    cuda.wgmma_wait 0
    ```
    """

    name = "cuda.wgmma_wait"


HOPPER_OPS = (
    MbarrierInitOp,
    FenceBarrierInitOp,
    MbarrierArriveOp,
    MbarrierWaitOp,
    TmaLoadOp,
    WgmmaDescriptorOp,
    WgmmaOp,
    WgmmaFenceOp,
    WgmmaCommitOp,
    WgmmaWaitOp,
)

TENSOR_CORE_OPS = (
    PrefillAttentionOp,
    SharedMemoryOp,
    CpAsyncOp,
    CpAsyncCommitOp,
    CpAsyncWaitOp,
    LdmatrixOp,
    LoadBF16x2Op,
    LoadNormBF16x2Op,
    PackBF16x2Op,
    StoreBF16x2Op,
    MmaSyncOp,
    *HOPPER_OPS,
)

CUDA = Dialect(
    "cuda",
    [
        BufferOp,
        *KERNEL_OPS,
        *TENSOR_CORE_OPS,
    ],
)


def waits_first(kernel: Operation) -> bool:
    """Whether a `gpu.func` kernel's body begins with `nvvm.griddepcontrol wait` (what makes its launch
    programmatic: `cuda-programmatic-launch` puts it there, the host plan reads it)."""
    first = kernel.regions[0].block.first_op
    return isinstance(first, GridDepControlOp) and first.waits


# Upstream NVVM's ops the kernels use, under their own dialect name so that a parser finds them by their prefix.
NVVM = Dialect("nvvm", [WarpSyncOp, GridDepControlOp], [GridDepActionAttr])
