"""A small builder of thread code for the CUDA lane's kernels: `Body` appends thread-level ops (`arith`, `memref`,
`scf`, `math`, `vector`, `gpu` and the upstream ops `dialects/cuda.py` adds) to a `gpu.func`'s block, with regions
nested by callbacks; `Kind` says how one launch of a kernel-level op is built. Shared by the decode kernels
(`decode_kernels`) and the tensor-core kernels (`tensor_core`), which is why it is a module of its own: neither of
those imports the other's builders.
"""

from __future__ import annotations

import math as _math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith, gpu, math, memref, scf, vector
from xdsl.dialects.builtin import (
    BFloat16Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    VectorType,
    f32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue

from logos_ir.dialects import cuda

INDEX = IndexType()
ATOMIC_ADDI = 1  # upstream's AtomicRMWKind::addi


# -- the builder --------------------------------------------------------------------------


class Body:
    """Appends thread-level ops to the current block; regions (loops, ifs) nest by callbacks."""

    def __init__(self, block: Block):
        self.blocks = [block]
        self._constants: dict[tuple[str, object], SSAValue] = {}

    def op(self, operation: Operation) -> SSAValue:
        self.blocks[-1].add_op(operation)
        return operation.results[0] if operation.results else None  # type: ignore[return-value]

    def const(self, value: int) -> SSAValue:
        return self.op(arith.ConstantOp(IntegerAttr(value, INDEX)))

    def fconst(self, value: float) -> SSAValue:
        return self.op(arith.ConstantOp(FloatAttr(value, f32)))

    # index arithmetic
    def add(self, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.AddiOp(a, self._ix(b)))

    def sub(self, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.SubiOp(a, self._ix(b)))

    def mul(self, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.MuliOp(a, self._ix(b)))

    def div(self, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.DivUIOp(a, self._ix(b)))

    def rem(self, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.RemUIOp(a, self._ix(b)))

    def min(self, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.MinUIOp(a, self._ix(b)))

    def cmp(self, predicate: str, a: SSAValue, b: SSAValue | int) -> SSAValue:
        return self.op(arith.CmpiOp(a, self._ix(b), predicate))

    def both(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.AndIOp(a, b))

    def either(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.OrIOp(a, b))

    def select(self, cond: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.SelectOp(cond, a, b))

    def _ix(self, value: SSAValue | int) -> SSAValue:
        return self.const(value) if isinstance(value, int) else value

    # f32 arithmetic
    def fadd(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.AddfOp(a, b))

    def fsub(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.SubfOp(a, b))

    def fmul(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.MulfOp(a, b))

    def fdiv(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.DivfOp(a, b))

    def fmax(self, a: SSAValue, b: SSAValue) -> SSAValue:
        """fmaxf's rule (a NaN loses to a number): arith.maxnumf."""
        return self.op(arith.MaxnumfOp(a, b))

    def fma(self, a: SSAValue, b: SSAValue, c: SSAValue) -> SSAValue:
        """a*b + c rounded once (`__fmaf_rn`)."""
        return self.op(math.FmaOp(a, b, c))

    def to_bf16(self, value: SSAValue) -> SSAValue:
        return self.op(arith.TruncFOp(value, BFloat16Type()))

    def fcmp(self, predicate: str, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(arith.CmpfOp(a, b, predicate))

    def exp(self, a: SSAValue) -> SSAValue:
        return self.op(math.ExpOp(a))

    def sqrt(self, a: SSAValue) -> SSAValue:
        return self.op(math.SqrtOp(a))

    def tanh(self, a: SSAValue) -> SSAValue:
        return self.op(math.TanhOp(a))

    # conversions
    def to_index(self, value: SSAValue) -> SSAValue:
        return self.op(arith.IndexCastOp(value, INDEX))

    def to_i64(self, value: SSAValue) -> SSAValue:
        return self.op(arith.IndexCastOp(value, i64))

    def to_float(self, index: SSAValue) -> SSAValue:
        return self.op(arith.SIToFPOp(self.to_i64(index), f32))

    def float_to_index(self, value: SSAValue) -> SSAValue:
        return self.to_index(self.op(arith.FPToSIOp(value, i64)))

    # threads and memory
    def thread(self) -> SSAValue:
        return self.op(gpu.ThreadIdOp(gpu.DimensionAttr(gpu.DimensionEnum.X)))

    def block(self, dim: str) -> SSAValue:
        return self.op(gpu.BlockIdOp(gpu.DimensionAttr(gpu.DimensionEnum(dim))))

    def load(self, mem: SSAValue, indices: Sequence[SSAValue | int]) -> SSAValue:
        value = self.op(memref.LoadOp.get(mem, [self._ix(i) for i in indices]))
        if isinstance(value.type, BFloat16Type):
            value = self.op(arith.ExtFOp(value, f32))
        return value

    def store(self, value: SSAValue, mem: SSAValue, indices: Sequence[SSAValue | int]) -> None:
        self.op(memref.StoreOp.get(value, mem, [self._ix(i) for i in indices]))

    def vload(self, mem: SSAValue, indices: Sequence[SSAValue | int], width: int) -> list[SSAValue]:
        """`width` consecutive elements along the last axis in one load of their size (16 bytes at most), widened
        to f32: upstream's `vector.load` aligned to its size (a GPU faults on a misaligned 16-byte load; the
        emulator refuses it), `arith.extf` of the vector for bf16, one `vector.extract` an element."""
        kind = mem.type
        assert isinstance(kind, MemRefType)
        element = kind.element_type
        size = 2 if isinstance(element, BFloat16Type) else 4
        if width < 1 or width & (width - 1) or width * size > 16 or kind.get_shape()[-1] % width:
            raise ValueError(f"vload: {width} elements of {element} are not a whole vector of at most 16 bytes")
        load = vector.LoadOp(mem, [self._ix(i) for i in indices], VectorType(element, [width]))
        load.attributes["alignment"] = IntegerAttr(width * size, i64)
        loaded = self.op(load)
        if isinstance(element, BFloat16Type):
            loaded = self.op(arith.ExtFOp(loaded, VectorType(f32, [width])))
        return [self.op(vector.ExtractOp(loaded, [i], f32)) for i in range(width)]

    def load_raw(self, mem: SSAValue, indices: Sequence[SSAValue | int]) -> SSAValue:
        """One element as stored (an integer unit of a weight held in blocks), not widened."""
        return self.op(memref.LoadOp.get(mem, [self._ix(i) for i in indices]))

    def vload_raw(self, mem: SSAValue, indices: Sequence[SSAValue | int], width: int) -> list[SSAValue]:
        """`width` integer units in one load of 16 bytes (`vector.load` aligned to 16), one `vector.extract` a
        unit, not widened."""
        kind = mem.type
        assert isinstance(kind, MemRefType) and isinstance(kind.element_type, IntegerType)
        element = kind.element_type
        if width * element.width.data != 128:
            raise ValueError(f"vload_raw: {width} units of {element} are not 16 bytes")
        load = vector.LoadOp(mem, [self._ix(i) for i in indices], VectorType(element, [width]))
        load.attributes["alignment"] = IntegerAttr(16, i64)
        loaded = self.op(load)
        return [self.op(vector.ExtractOp(loaded, [i], element)) for i in range(width)]

    def warp_sum(self, value: SSAValue) -> SSAValue:
        for offset in (16, 8, 4, 2, 1):
            value = self.fadd(value, self.shuffle(value, offset))
        return value

    def shuffle(self, value: SSAValue, offset: int) -> SSAValue:
        """The value of lane (this lane xor offset): upstream's `gpu.shuffle xor` over the whole warp (an index is
        shuffled as an i64)."""
        index = isinstance(value.type, IndexType)
        if index:
            value = self.to_i64(value)
        i32 = IntegerType(32)
        shift = self.op(arith.ConstantOp(IntegerAttr(offset, i32)))
        width = self.op(arith.ConstantOp(IntegerAttr(cuda.WARP, i32)))
        got = self.op(cuda.GpuShuffleOp(value, shift, width))
        return self.to_index(got) if index else got

    # structure
    def loop(
        self,
        lower: SSAValue | int,
        upper: SSAValue | int,
        step: SSAValue | int,
        inits: Sequence[SSAValue],
        body: Callable[[SSAValue, list[SSAValue]], Sequence[SSAValue]],
    ) -> list[SSAValue]:
        block = Block(arg_types=[INDEX, *(v.type for v in inits)])
        self.blocks.append(block)
        yielded = body(block.args[0], list(block.args[1:]))
        self.op(scf.YieldOp(*yielded))
        self.blocks.pop()
        loop = scf.ForOp(self._ix(lower), self._ix(upper), self._ix(step), list(inits), block)
        self.op(loop)
        return list(loop.results)

    def when(self, cond: SSAValue, then: Callable[[], None]) -> None:
        block = Block()
        self.blocks.append(block)
        then()
        self.op(scf.YieldOp())
        self.blocks.pop()
        self.op(scf.IfOp(cond, [], [block]))

    def choose(
        self, cond: SSAValue, then: Callable[[], list[SSAValue]], otherwise: Callable[[], list[SSAValue]]
    ) -> list[SSAValue]:
        """An `scf.if` with results: `then`'s values where cond holds, `otherwise`'s elsewhere."""
        regions = []
        types: list[Attribute] = []
        for branch in (then, otherwise):
            block = Block()
            self.blocks.append(block)
            values = branch()
            types = [v.type for v in values]
            self.op(scf.YieldOp(*values))
            self.blocks.pop()
            regions.append(block)
        op = scf.IfOp(cond, types, [regions[0]], [regions[1]])
        self.op(op)
        return list(op.results)

    def thread_fence(self) -> None:
        """Every lane's earlier writes visible device-wide, then the warp meets (`__threadfence(); __syncwarp()`):
        upstream's `llvm.fence syncscope("device") seq_cst` and `nvvm.bar.warp.sync` over the whole warp."""
        self.op(cuda.FenceOp("device"))
        self.op(cuda.WarpSyncOp(self.op(arith.ConstantOp(IntegerAttr(-1, IntegerType(32))))))

    def atomic_add(self, value: SSAValue, mem: SSAValue, indices: Sequence[SSAValue | int]) -> SSAValue:
        """memref.atomic_rmw addi: adds `value` at the element and returns what it held before."""
        return self.op(
            memref.AtomicRMWOp.build(
                operands=[value, mem, [self._ix(i) for i in indices]],
                result_types=[value.type],
                properties={"kind": IntegerAttr(ATOMIC_ADDI, i64)},
            )
        )


def vector_width(row: int, element: Attribute) -> int:
    """The widest vector of at most 16 bytes that divides a row."""
    width = 8 if isinstance(element, BFloat16Type) else 4
    while row % width:
        width //= 2
    return width


def rotated(
    b: Body, x: SSAValue, row: SSAValue, column: SSAValue, head_dim: int, tables: tuple, place: SSAValue,
    rotary: int | None = None,
):  # fmt: skip
    """x[row, column] rotated at table row `place`: x*cos + x[partner]*sin (sin signed, rotate-half); with a
    partial `rotary` R the partner is half of R away (the tables' cos 1 and sin 0 past R pass the rest through)."""
    cos, sin = tables
    half = (rotary if rotary is not None else head_dim) // 2
    head, d = b.div(column, head_dim), b.rem(column, head_dim)
    partner = b.select(b.cmp("ult", d, half), b.add(d, half), b.sub(d, half))
    other = b.add(b.mul(head, head_dim), partner)
    turned = b.fmul(b.load(x, [row, column]), b.load(cos, [place, d]))
    return b.fadd(turned, b.fmul(b.load(x, [row, other]), b.load(sin, [place, d]))), head, d


def glu(b: Body, g: SSAValue, u: SSAValue, gelu_tanh: bool = False) -> SSAValue:
    """The gated product of a gate and an up sum: silu(g) * u (SwiGLU; sigmoid(g) = (1 + tanh(g/2)) / 2 never
    overflows, as the reference computes it), or with `gelu_tanh` GeGLU's 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715
    g^3))) * u in the reference's order."""
    half = b.fconst(0.5)
    if not gelu_tanh:
        sigmoid = b.fadd(b.fmul(b.tanh(b.fmul(g, half)), half), half)
        return b.fmul(b.fmul(g, sigmoid), u)
    cubic = b.fmul(b.fmul(b.fmul(b.fconst(0.044715), g), g), g)
    inner = b.fmul(b.fconst(_math.sqrt(2 / _math.pi)), b.fadd(g, cubic))
    return b.fmul(b.fmul(b.fmul(half, g), b.fadd(b.fconst(1.0), b.tanh(inner))), u)


@dataclass(frozen=True)
class Kind:
    """How one launch of a kernel-level op is built: a name stem, the op's buffers it takes, its grid, its body, and
    the values beyond the shapes its body is built from (`params`: a norm's epsilon ...); two launches share one
    kernel only when their names and their params agree."""

    stem: str
    operands: tuple[int, ...]
    grid: Callable[[list[tuple[int, ...]]], tuple[int, int, int]]
    body: Callable[[Body, list[SSAValue], list[tuple[int, ...]]], None]
    params: tuple[object, ...] = ()
    threads: int = 128  # the block size (a Hopper product: two consumer warpgroups and a producer warp)
