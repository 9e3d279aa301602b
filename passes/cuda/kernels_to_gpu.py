"""`convert-cuda-kernels-to-gpu`: the CUDA lane's kernel level -> xDSL's `gpu` dialect (thread code and launches).

    logos-opt step.mlir -p convert-cuda-kernels-to-gpu

Assumes: the output of `convert-logos-to-cuda-kernels`: a host function `@step` of `cuda.buffer` ops, kernel-level
ops and `shard.all_reduce` ops.

Guarantees: a `gpu.module @kernels` of `gpu.func` kernels, one per distinct kernel shape (kind, sizes, weight
element type): every layer that has the same shapes launches the same kernel, so a 2-layer and an 80-layer model
of one width emit the same set. Each body is `arith`/`memref`/`scf`/`math` with `gpu.thread_id`/`gpu.block_id`
and the lane's `cuda.shuffle_xor` (warp butterflies) and `cuda.vector_load` (16-byte loads). Each kernel-level op
becomes its `gpu.launch_func` (two for the two-stage kernels: attention's split and combine, arg-max's stages) with
constant grid and block sizes, on the same named buffers, in the same order; `shard.all_reduce` stays where it is.

The kernels are built for decode at batch 1, where the step is bound by memory: every block is 4 warps and a warp
owns one work item (an output column of a projection, a row of a norm, a (head, split) of attention, a chunk of the
arg-max), reducing across its lanes with shuffles, so there is no shared memory and no barrier anywhere. A
projection's warp streams its weight row with 16-byte loads (8 bf16 or 4 f32) and applies each loaded vector to a
tile of up to `ROW_TILE` rows (prefill chunks and batches), so a weight byte is read once per tile of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from xdsl.context import Context
from xdsl.dialects import arith, func, gpu, math, memref, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float32Type,
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    f32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from logos_ir.dialects import cuda
from logos_ir.errors import PassError

NAME = "convert-cuda-kernels-to-gpu"
WARPS = 4  # warps a block: each owns one work item
THREADS = WARPS * cuda.WARP
ROW_TILE = 4  # rows a projection's warp applies each loaded weight vector to
NEG_BIG = -3.0e38  # a finite "minus infinity": exp(NEG_BIG - m) is 0 with no inf - inf
INDEX = IndexType()


# -- a small builder of thread code --------------------------------------------------------------------------


class _Body:
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
        return self.op(arith.MaximumfOp(a, b))

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
        load = cuda.VectorLoadOp(mem, [self._ix(i) for i in indices], width)
        self.op(load)
        return list(load.results)

    def warp_sum(self, value: SSAValue) -> SSAValue:
        for offset in (16, 8, 4, 2, 1):
            value = self.fadd(value, self.op(cuda.ShuffleXorOp(value, offset)))
        return value

    def shuffle(self, value: SSAValue, offset: int) -> SSAValue:
        return self.op(cuda.ShuffleXorOp(value, offset))

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


# -- the kernels -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Launch:
    """One launch of a kernel: its name, grid and block sizes, and which of the op's buffers it takes."""

    kernel: str
    grid: tuple[int, int, int]
    operands: tuple[int, ...]  # indices into ins + outs


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _width(row: int, element: Attribute) -> int:
    """The widest vector of at most 16 bytes that divides a row."""
    width = 8 if isinstance(element, BFloat16Type) else 4
    while row % width:
        width //= 2
    return width


def _element_tag(kind: Attribute) -> str:
    assert isinstance(kind, MemRefType)
    return "bf16" if isinstance(kind.element_type, BFloat16Type) else "f32"


def _warp_and_lane(b: _Body) -> tuple[SSAValue, SSAValue, SSAValue]:
    tid = b.thread()
    return tid, b.div(tid, cuda.WARP), b.rem(tid, cuda.WARP)


def _embed(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    table, tokens, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        token = b.sub(b.to_index(b.load(tokens, [row])), 1)
        b.store(b.load(table, [token, column]), out, [row, column])

    b.when(b.cmp("ult", column, width), body)


def _rms_norm(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float, source: int) -> None:
    x, weight, out = args
    rows, width = shapes[2]
    _, warp, lane = _warp_and_lane(b)
    row = b.add(b.mul(b.block("x"), WARPS), warp)
    vector = _width(width, f32)

    def body() -> None:
        src = row if source < 0 else b.const(source)
        start = b.mul(lane, vector)

        def squares(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            total = acc[0]
            for value in b.vload(x, [src, k], vector):
                total = b.fadd(total, b.fmul(value, value))
            return [total]

        (total,) = b.loop(start, width, cuda.WARP * vector, [b.fconst(0.0)], squares)
        mean = b.fmul(b.warp_sum(total), b.fconst(1.0 / width))
        inverse = b.fdiv(b.fconst(1.0), b.sqrt(b.fadd(mean, b.fconst(epsilon))))

        def scale(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            values = b.vload(x, [src, k], vector)
            scales = b.vload(weight, [k], vector)
            for i, (value, factor) in enumerate(zip(values, scales, strict=True)):
                b.store(b.fmul(b.fmul(value, inverse), factor), out, [row, b.add(k, i)])
            return []

        b.loop(start, width, cuda.WARP * vector, [], scale)

    b.when(b.cmp("ult", row, rows), body)


def _projection(
    b: _Body,
    x: SSAValue,
    weights: list[SSAValue],
    shape: tuple[int, int, int],
    epilogue: Callable[[SSAValue, list[SSAValue]], None],
) -> None:
    """A warp per output column n: stream row n of each weight with 16-byte loads, apply each vector to a tile of
    rows, reduce across the lanes, and let lane 0 of a valid column write each row through `epilogue`."""
    rows, columns, depth = shape
    tile = min(rows, ROW_TILE)
    _, warp, lane = _warp_and_lane(b)
    column = b.add(b.mul(b.block("x"), WARPS), warp)
    valid = b.cmp("ult", column, columns)
    clamped = b.min(column, columns - 1)  # an idle warp reads a real row and writes nothing
    first = b.mul(b.block("y"), tile)
    tile_rows = [b.min(b.add(first, t), rows - 1) for t in range(tile)]
    vector = _width(depth, weights[0].type.element_type)  # type: ignore[attr-defined]
    x_vector = min(vector, 4)

    def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
        loaded = [b.vload(w, [clamped, k], vector) for w in weights]
        inputs = []
        for row in tile_rows:
            values: list[SSAValue] = []
            for part in range(0, vector, x_vector):
                values += b.vload(x, [row, b.add(k, part) if part else k], x_vector)
            inputs.append(values)
        out = []
        for w_index, wv in enumerate(loaded):
            for t, xv in enumerate(inputs):
                total = acc[w_index * tile + t]
                for wi, xi in zip(wv, xv, strict=True):
                    total = b.fadd(total, b.fmul(wi, xi))
                out.append(total)
        return out

    zeros = [b.fconst(0.0) for _ in range(len(weights) * tile)]
    sums = b.loop(b.mul(lane, vector), depth, cuda.WARP * vector, zeros, step)
    sums = [b.warp_sum(s) for s in sums]
    lane0 = b.cmp("eq", lane, 0)
    for t in range(tile):
        row = b.add(first, t)
        ok = b.both(b.both(lane0, valid), b.cmp("ult", row, rows))
        b.when(ok, partial(epilogue, row, [sums[w * tile + t] for w in range(len(weights))]))


def _linear(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    x, weight, *residual, out = args
    rows, depth = shapes[0]
    columns = shapes[1][0]
    _, warp, _ = _warp_and_lane(b)

    def write(row: SSAValue, sums: list[SSAValue]) -> None:
        column = b.add(b.mul(b.block("x"), WARPS), warp)
        value = sums[0] if not residual else b.fadd(b.load(residual[0], [row, column]), sums[0])
        b.store(value, out, [row, column])

    _projection(b, x, [weight], (rows, columns, depth), write)


def _gate_up(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    x, gate, up, out = args
    rows, depth = shapes[0]
    columns = shapes[1][0]
    _, warp, _ = _warp_and_lane(b)

    def write(row: SSAValue, sums: list[SSAValue]) -> None:
        column = b.add(b.mul(b.block("x"), WARPS), warp)
        g, u = sums
        half = b.fconst(0.5)
        # sigmoid(g) = (1 + tanh(g/2)) / 2 never overflows, as the reference computes it
        sigmoid = b.fadd(b.fmul(b.tanh(b.fmul(g, half)), half), half)
        b.store(b.fmul(b.fmul(g, sigmoid), u), out, [row, column])

    _projection(b, x, [gate, up], (rows, columns, depth), write)


def _rotated(b: _Body, x: SSAValue, row: SSAValue, column: SSAValue, head_dim: int, tables: tuple, place: SSAValue):
    """x[row, column] rotated at table row `place`: x*cos + x[partner]*sin (sin signed, rotate-half)."""
    cos, sin = tables
    half = head_dim // 2
    head, d = b.div(column, head_dim), b.rem(column, head_dim)
    partner = b.select(b.cmp("ult", d, half), b.add(d, half), b.sub(d, half))
    other = b.add(b.mul(head, head_dim), partner)
    turned = b.fmul(b.load(x, [row, column]), b.load(cos, [place, d]))
    return b.fadd(turned, b.fmul(b.load(x, [row, other]), b.load(sin, [place, d]))), head, d


def _rope(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]], head_dim: int) -> None:
    x, positions, cos, sin, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        place = b.sub(b.to_index(b.load(positions, [row])), 1)
        value, _, _ = _rotated(b, x, row, column, head_dim, (cos, sin), place)
        b.store(value, out, [row, column])

    b.when(b.cmp("ult", column, width), body)


def _rope_cache_write(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    key, value, positions, cos, sin, keys, values = args
    width = shapes[0][1]
    head_dim = shapes[5][-1]
    per_sequence = len(shapes[5]) == 4
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        place = b.sub(b.to_index(b.load(positions, [row])), 1)
        turned, head, d = _rotated(b, key, row, column, head_dim, (cos, sin), place)
        where = [row, head, place, d] if per_sequence else [head, place, d]
        b.store(turned, keys, where)
        b.store(b.load(value, [row, column]), values, where)

    b.when(b.cmp("ult", column, width), body)


def _attention_split(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]], split: int) -> None:
    """A warp per (row, query head, block of `split` positions): an online softmax over those positions up to the
    row's own, each lane holding head_dim/32 (at least 1) of the query and of the running sum."""
    query, keys, values, positions, scratch = args
    rows, width = shapes[0]
    cache = shapes[1]
    per_sequence = len(cache) == 4
    kv_heads, head_dim = cache[-3], cache[-1]
    heads = width // head_dim
    group = heads // kv_heads
    splits = shapes[4][2]
    _, warp, lane = _warp_and_lane(b)
    item = b.add(b.mul(b.block("x"), WARPS), warp)
    row = b.block("y")
    valid = b.cmp("ult", item, heads * splits)
    item = b.min(item, heads * splits - 1)
    head, part = b.div(item, splits), b.rem(item, splits)
    kv_head = b.div(head, group)
    slots = _cdiv(head_dim, cuda.WARP)
    dims = [b.add(lane, s * cuda.WARP) if s else lane for s in range(slots)]
    inside = [b.cmp("ult", d, head_dim) for d in dims] if head_dim % cuda.WARP else [None] * slots
    dims = [b.min(d, head_dim - 1) if head_dim % cuda.WARP else d for d in dims]
    zero = b.fconst(0.0)
    scale = b.fconst(1.0 / head_dim**0.5)
    q = [b.load(query, [row, b.add(b.mul(head, head_dim), d)]) for d in dims]
    q = [qi if ok is None else b.select(ok, qi, zero) for qi, ok in zip(q, inside, strict=True)]
    length = b.to_index(b.load(positions, [row]))
    start = b.mul(part, split)
    stop = b.min(b.add(start, split), length)

    def cache_at(j: SSAValue, d: SSAValue) -> list[SSAValue]:
        return [row, kv_head, j, d] if per_sequence else [kv_head, j, d]

    def position(j: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
        m, total, *acc = state
        dot = zero
        for qi, d in zip(q, dims, strict=True):
            dot = b.fadd(dot, b.fmul(qi, b.load(keys, cache_at(j, d))))
        score = b.fmul(b.warp_sum(dot), scale)
        high = b.fmax(m, score)
        fade, weight = b.exp(b.fsub(m, high)), b.exp(b.fsub(score, high))
        total = b.fadd(b.fmul(total, fade), weight)
        acc = [
            b.fadd(b.fmul(a, fade), b.fmul(weight, b.load(values, cache_at(j, d))))
            for a, d in zip(acc, dims, strict=True)
        ]
        return [high, total, *acc]

    state = b.loop(start, stop, 1, [b.fconst(NEG_BIG), zero, *[zero] * slots], position)
    m, total, *acc = state

    def write() -> None:
        for a, d, ok in zip(acc, dims, inside, strict=True):
            if ok is None:
                b.store(a, scratch, [row, head, part, d])
            else:
                b.when(ok, partial(b.store, a, scratch, [row, head, part, d]))

        def ends() -> None:
            b.store(m, scratch, [row, head, part, head_dim])
            b.store(total, scratch, [row, head, part, head_dim + 1])

        b.when(b.cmp("eq", lane, 0), ends)

    b.when(valid, write)


def _attention_combine(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    """A thread per output element: the splits' partial sums, rescaled to their common maximum."""
    scratch, out = args
    _, heads, splits, stride = shapes[0]
    head_dim = stride - 2
    width = heads * head_dim
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        head, d = b.div(column, head_dim), b.rem(column, head_dim)

        def highest(s: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
            return [b.fmax(state[0], b.load(scratch, [row, head, s, head_dim]))]

        (high,) = b.loop(0, splits, 1, [b.fconst(NEG_BIG)], highest)

        def gather(s: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
            fade = b.exp(b.fsub(b.load(scratch, [row, head, s, head_dim]), high))
            total = b.fadd(state[0], b.fmul(b.load(scratch, [row, head, s, head_dim + 1]), fade))
            return [total, b.fadd(state[1], b.fmul(b.load(scratch, [row, head, s, d]), fade))]

        total, summed = b.loop(0, splits, 1, [b.fconst(0.0), b.fconst(0.0)], gather)
        b.store(b.fdiv(summed, total), out, [row, column])

    b.when(b.cmp("ult", column, width), body)


def _better(b: _Body, value: SSAValue, index: SSAValue, best: SSAValue, best_index: SSAValue) -> SSAValue:
    """Whether (value, index) beats (best, best_index): greater, or equal at a lower index (the first maximum)."""
    tie = b.both(b.fcmp("oeq", value, best), b.cmp("ult", index, best_index))
    return b.either(b.fcmp("ogt", value, best), tie)


def _warp_argmax(b: _Body, best: SSAValue, index: SSAValue) -> tuple[SSAValue, SSAValue]:
    for offset in (16, 8, 4, 2, 1):
        other, other_index = b.shuffle(best, offset), b.shuffle(index, offset)
        take = _better(b, other, other_index, best, index)
        best, index = b.select(take, other, best), b.select(take, other_index, index)
    return best, index


def _argmax_chunks(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]], chunk: int) -> None:
    x, scratch = args
    width = shapes[0][1]
    chunks = shapes[1][1]
    _, warp, lane = _warp_and_lane(b)
    item = b.add(b.mul(b.block("x"), WARPS), warp)
    row = b.block("y")
    start = b.mul(b.min(item, chunks - 1), chunk)
    stop = b.min(b.add(start, chunk), width)

    def scan(i: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
        value = b.load(x, [row, i])
        take = b.fcmp("ogt", value, state[0])  # a lane sees its indices in order: strictly greater keeps the first
        return [b.select(take, value, state[0]), b.select(take, i, state[1])]

    best, index = b.loop(b.add(start, lane), stop, cuda.WARP, [b.fconst(NEG_BIG), b.const(width)], scan)
    best, index = _warp_argmax(b, best, index)

    def write() -> None:
        b.store(best, scratch, [row, item, 0])
        b.store(b.to_float(index), scratch, [row, item, 1])

    b.when(b.both(b.cmp("eq", lane, 0), b.cmp("ult", item, chunks)), write)


def _argmax_final(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    scratch, out = args
    rows, chunks, _ = shapes[0]
    _, warp, lane = _warp_and_lane(b)
    row = b.add(b.mul(b.block("x"), WARPS), warp)

    def body() -> None:
        def scan(i: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
            value, index = b.load(scratch, [row, i, 0]), b.float_to_index(b.load(scratch, [row, i, 1]))
            take = _better(b, value, index, state[0], state[1])
            return [b.select(take, value, state[0]), b.select(take, index, state[1])]

        big = b.const(1 << 30)
        best, index = b.loop(lane, chunks, cuda.WARP, [b.fconst(NEG_BIG), big], scan)
        best, index = _warp_argmax(b, best, index)
        b.when(b.cmp("eq", lane, 0), lambda: b.store(b.to_i64(b.add(index, 1)), out, [row]))

    b.when(b.cmp("ult", row, rows), body)


def _add(b: _Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    lhs, rhs, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")
    b.when(
        b.cmp("ult", column, width),
        lambda: b.store(b.fadd(b.load(lhs, [row, column]), b.load(rhs, [row, column])), out, [row, column]),
    )


# -- kernels by shape --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    """How one launch of a kernel-level op is built: a name stem, the op's buffers it takes, its grid, its body."""

    stem: str
    operands: tuple[int, ...]
    grid: Callable[[list[tuple[int, ...]]], tuple[int, int, int]]
    body: Callable[[_Body, list[SSAValue], list[tuple[int, ...]]], None]


def _kinds(op: cuda.KernelOp) -> list[_Kind]:
    """The launches of `op`, in order (two for the two-stage kernels)."""
    (ins, outs) = op.shapes()
    shapes = [*ins, *outs]
    from logos_ir.passes.cuda import tensor_core  # issue 19 (tensor cores): bf16 prefill/batch products

    if tensor_core.handles(op):  # issue 19 (tensor cores)
        return tensor_core.kinds(op)
    if isinstance(op, cuda.EmbedOp):
        return [_Kind("embed", (0, 1, 2), lambda s: (_cdiv(s[0][1], THREADS), s[1][0], 1), _embed)]
    if isinstance(op, cuda.RMSNormOp):
        epsilon, row = op.epsilon.value.data, op.row.value.data
        return [
            _Kind(
                "rms_norm" if row < 0 else f"rms_norm_row{row}",
                (0, 1, 2),
                lambda s: (_cdiv(s[2][0], WARPS), 1, 1),
                lambda b, a, s: _rms_norm(b, a, s, epsilon, row),
            )
        ]
    if isinstance(op, cuda.LinearOp):
        stem = "linear_residual" if len(op.ins) == 3 else "linear"
        operands = tuple(range(len(shapes)))
        return [_Kind(stem, operands, lambda s: (_cdiv(s[1][0], WARPS), _cdiv(s[0][0], ROW_TILE), 1), _linear)]
    if isinstance(op, cuda.GateUpOp):
        return [
            _Kind("gate_up", (0, 1, 2, 3), lambda s: (_cdiv(s[1][0], WARPS), _cdiv(s[0][0], ROW_TILE), 1), _gate_up)
        ]
    if isinstance(op, cuda.RopeOp):
        head_dim = op.head_dim.value.data
        grid = lambda s: (_cdiv(s[0][1], THREADS), s[0][0], 1)  # noqa: E731
        return [_Kind("rope", (0, 1, 2, 3, 4), grid, lambda b, a, s: _rope(b, a, s, head_dim))]
    if isinstance(op, cuda.RopeCacheWriteOp):
        grid = lambda s: (_cdiv(s[0][1], THREADS), s[0][0], 1)  # noqa: E731
        return [_Kind("rope_cache_write", tuple(range(7)), grid, _rope_cache_write)]
    if isinstance(op, cuda.AttentionOp):
        split = op.split.value.data
        heads_splits = lambda s: (_cdiv(s[4][1] * s[4][2], WARPS), s[0][0], 1)  # noqa: E731
        combine = lambda s: (_cdiv(s[0][1] * (s[0][3] - 2), THREADS), s[0][0], 1)  # noqa: E731
        return [
            _Kind("attention_split", (0, 1, 2, 3, 5), heads_splits, lambda b, a, s: _attention_split(b, a, s, split)),
            _Kind("attention_combine", (5, 4), combine, _attention_combine),
        ]
    if isinstance(op, cuda.AddOp):
        return [_Kind("add", (0, 1, 2), lambda s: (_cdiv(s[0][1], THREADS), s[0][0], 1), _add)]
    if isinstance(op, cuda.ArgmaxOp):
        chunk = op.chunk.value.data
        return [
            _Kind(
                "argmax_chunks",
                (0, 2),
                lambda s: (_cdiv(s[1][1], WARPS), s[0][0], 1),
                lambda b, a, s: _argmax_chunks(b, a, s, chunk),
            ),
            _Kind("argmax_final", (2, 1), lambda s: (_cdiv(s[0][0], WARPS), 1, 1), _argmax_final),
        ]
    raise PassError(f"{NAME}: '{op.name}' has no kernel")


def _signature(stem: str, types: list[Attribute]) -> str:
    """A kernel's name: its stem and the shapes and element types it was built for (two ops of one signature
    share one kernel)."""
    parts = [stem]
    for kind in types:
        assert isinstance(kind, MemRefType)
        shape = "x".join(str(d) for d in kind.get_shape())
        element = kind.element_type
        tag = "bf16" if isinstance(element, BFloat16Type) else "f32" if isinstance(element, Float32Type) else "i64"
        parts.append(f"{shape}{tag}")
    return "_".join(parts)


class _Lowering:
    """Builds each distinct kernel once and the host's launches."""

    def __init__(self, module: ModuleOp):
        self.module = module
        self.kernels: dict[str, gpu.FuncOp] = {}
        self.gpu_block = Block()
        self.constants: dict[int, SSAValue] = {}

    def kernel(self, kind: _Kind, types: list[Attribute], shapes: list[tuple[int, ...]], roles: list[str]) -> str:
        name = _signature(kind.stem, types)
        if name in self.kernels:
            return name
        function = gpu.FuncOp(name, (types, []), kernel=True, known_block_size=[THREADS, 1, 1])
        for arg, role in zip(function.body.block.args, roles, strict=True):
            arg.name_hint = role
        body = _Body(function.body.block)
        kind.body(body, list(function.body.block.args), shapes)
        body.op(gpu.ReturnOp([]))
        self.kernels[name] = function
        self.gpu_block.add_op(function)
        return name

    def lower(self, host: func.FuncOp) -> None:
        for op in list(host.body.block.ops):
            if isinstance(op, cuda.KernelOp):
                self.launch(host, op)

    def launch(self, host: func.FuncOp, op: cuda.KernelOp) -> None:
        block = host.body.block
        operands = [*op.ins, *op.outs]
        ins, outs = op.shapes()
        shapes = [*ins, *outs]
        for kind in _kinds(op):
            chosen = [operands[i] for i in kind.operands]
            picked = [shapes[i] for i in kind.operands]
            roles = [op.roles()[i] for i in kind.operands]
            name = self.kernel(kind, [v.type for v in chosen], picked, roles)
            grid = kind.grid(picked)
            sizes = [self.constant(block, op, n) for n in (*grid, THREADS, 1, 1)]
            call = gpu.LaunchFuncOp(SymbolRefAttr("kernels", [name]), sizes[:3], sizes[3:], kernelOperands=chosen)
            block.insert_op_before(call, op)
        block.erase_op(op)

    def constant(self, block: Block, before: Operation, value: int) -> SSAValue:
        found = self.constants.get(value)
        if found is None:
            constant = arith.ConstantOp(IntegerAttr(value, INDEX))
            first = block.first_op
            assert first is not None
            block.insert_op_before(constant, first)
            found = self.constants[value] = constant.result
        return found


def host_function(module: ModuleOp, pass_name: str) -> func.FuncOp:
    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == "step":
            return op
    raise PassError(f"{pass_name}: the module has no host function @step (run convert-logos-to-cuda-kernels first)")


@dataclass(frozen=True)
class ConvertCudaKernelsToGpu(ModulePass):
    """Expands each kernel-level op into `gpu.launch_func` of a `gpu.func` built once per distinct shape. The
    module's docstring says what it assumes and guarantees."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        lowering = _Lowering(op)
        lowering.lower(host)
        kernels = gpu.ModuleOp(StringAttr("kernels"), Region(lowering.gpu_block))  # type: ignore[arg-type]
        op.body.block.insert_op_before(kernels, host)
        op.attributes["gpu.container_module"] = UnitAttr()


__all__ = ["ConvertCudaKernelsToGpu", "FunctionType", "IntegerType", "host_function"]
