"""The CUDA lane's decode kernels: the `gpu.func` bodies `convert-cuda-kernels-to-gpu` builds for each kernel-level op
that does not run on tensor cores.

The kernels are built for decode at batch 1, where the step is bound by memory: every block is 4 warps and a warp
owns one work item (an output column of a projection, a row of a norm, a (head, split) of attention, a chunk of the
arg-max), reducing across its lanes with shuffles, so there is no shared memory and no barrier anywhere. A
projection's warp streams its weight row with 16-byte loads (8 bf16 or 4 f32) and applies each loaded vector to a
tile of up to `ROW_TILE` rows (prefill chunks and batches), so a weight byte is read once per tile of rows.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from xdsl.dialects import arith
from xdsl.dialects.builtin import BFloat16Type, IntegerAttr, IntegerType, f32, i64
from xdsl.ir import Attribute, SSAValue

from logos_ir import quant
from logos_ir.dialects import cuda
from logos_ir.numerics import ceil_div as cdiv
from logos_ir.passes.cuda import blocks
from logos_ir.passes.cuda.thread_code import Body, glu, rotated, vector_width

WARPS = 4  # warps a block: each owns one work item
THREADS = WARPS * cuda.WARP
ROW_TILE = 4  # rows a projection's warp applies each loaded weight vector to
NEG_BIG = -3.0e38  # a finite "minus infinity": exp(NEG_BIG - m) is 0 with no inf - inf


# -- the kernels -------------------------------------------------------------------------------------------------


def _warp_and_lane(b: Body) -> tuple[SSAValue, SSAValue, SSAValue]:
    tid = b.thread()
    return tid, b.div(tid, cuda.WARP), b.rem(tid, cuda.WARP)


def embed(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    table, tokens, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        token = b.sub(b.to_index(b.load(tokens, [row])), 1)
        b.store(b.load(table, [token, column]), out, [row, column])

    b.when(b.cmp("ult", column, width), body)


def rms_norm(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float, source: int, plus_one: bool = False
) -> None:
    x, weight, out = args
    rows, width = shapes[2]
    _, warp, lane = _warp_and_lane(b)
    row = b.add(b.mul(b.block("x"), WARPS), warp)
    vector = vector_width(width, f32)

    def body() -> None:
        src = row if source < 0 else b.const(source)
        start = b.mul(lane, vector)

        def squares(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            total = acc[0]
            for value in b.vload(x, [src, k], vector):
                total = b.fma(value, value, total)
            return [total]

        (total,) = b.loop(start, width, cuda.WARP * vector, [b.fconst(0.0)], squares)
        mean = b.fmul(b.warp_sum(total), b.fconst(1.0 / width))
        inverse = b.fdiv(b.fconst(1.0), b.sqrt(b.fadd(mean, b.fconst(epsilon))))

        def scale(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            values = b.vload(x, [src, k], vector)
            scales = _plus_one(b, b.vload(weight, [k], vector), plus_one)
            for i, (value, factor) in enumerate(zip(values, scales, strict=True)):
                b.store(b.fmul(b.fmul(value, inverse), factor), out, [row, b.add(k, i)])
            return []

        b.loop(start, width, cuda.WARP * vector, [], scale)

    b.when(b.cmp("ult", row, rows), body)


def _plus_one(b: Body, scales: list[SSAValue], plus_one: bool) -> list[SSAValue]:
    """A norm's weights, or one plus each (Gemma's norms, in f32 as the reference adds them)."""
    return [b.fadd(b.fconst(1.0), s) for s in scales] if plus_one else scales


def head_rms_norm(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float, plus_one: bool = False
) -> None:
    """A warp per (head, row) (block x: heads by 4, block y: the row): the head's numbers summed in squares across
    the lanes as `rms_norm` sums a row's (fma, a butterfly), then each scaled by 1/rms and its weight."""
    x, weight, out = args
    rows, width = shapes[0]
    head_dim = shapes[1][0]
    heads = width // head_dim
    _, warp, lane = _warp_and_lane(b)
    head = b.add(b.mul(b.block("x"), WARPS), warp)
    row = b.block("y")
    vector = vector_width(head_dim, f32)

    def body() -> None:
        base = b.mul(head, head_dim)
        start = b.mul(lane, vector)

        def squares(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            total = acc[0]
            for value in b.vload(x, [row, b.add(base, k)], vector):
                total = b.fma(value, value, total)
            return [total]

        (total,) = b.loop(start, head_dim, cuda.WARP * vector, [b.fconst(0.0)], squares)
        mean = b.fmul(b.warp_sum(total), b.fconst(1.0 / head_dim))
        inverse = b.fdiv(b.fconst(1.0), b.sqrt(b.fadd(mean, b.fconst(epsilon))))

        def scale(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            at = b.add(base, k)
            values = b.vload(x, [row, at], vector)
            scales = _plus_one(b, b.vload(weight, [k], vector), plus_one)
            for i, (value, factor) in enumerate(zip(values, scales, strict=True)):
                b.store(b.fmul(b.fmul(value, inverse), factor), out, [row, b.add(at, i)])
            return []

        b.loop(start, head_dim, cuda.WARP * vector, [], scale)

    b.when(b.cmp("ult", head, heads), body)


UNROLL_BYTES = 64  # bytes of weights a lane has in flight per loop step at batch 1 (16-byte loads, unrolled)


def _dots(
    b: Body,
    x: SSAValue,
    streams: list[tuple[SSAValue, SSAValue]],
    rows: list[SSAValue],
    depth: int,
    lane: SSAValue,
    norm: tuple[SSAValue, float] | None = None,
    storage: str | None = None,
) -> tuple[list[list[SSAValue]], list[SSAValue]]:
    """The warp-reduced dot products of each stream (weight, row index) with each of `rows` of x (sums[stream][row]),
    and with `norm` (scale, epsilon) x scaled elementwise and each row's 1/rms (else an empty list). A lane loads
    16-byte vectors, `unroll` of them a stream per loop step at batch 1 (so UNROLL_BYTES are in flight a stream),
    then a remainder loop takes the last whole vectors; f32 accumulation with fma."""
    sums = _dot_sums(b, x, streams, rows, depth, lane, norm, storage=storage)
    tile = len(rows)
    dots = [[sums[s_index * tile + t] for t in range(tile)] for s_index in range(len(streams))]
    inverse = []
    if norm:
        for t in range(tile):
            inverse.append(_inverse_rms(b, sums[len(streams) * tile + t], depth, norm[1]))
    return dots, inverse


def _inverse_rms(b: Body, squares: SSAValue, depth: int, epsilon: float) -> SSAValue:
    mean = b.fmul(squares, b.fconst(1.0 / depth))
    return b.fdiv(b.fconst(1.0), b.sqrt(b.fadd(mean, b.fconst(epsilon))))


def _multiply_into(
    b: Body,
    out: list[SSAValue],
    t: int,
    tile: int,
    values: list[SSAValue],
    weights: list[list[SSAValue]],
    factors: list[SSAValue] | None,
) -> None:
    """Row `t`'s numbers of x (`values`) multiplied into the sums `out` (stream-major, a sum a row of the `tile`,
    then each row's sum of squares): with the norm's `factors`, each value's square summed and the value scaled by
    its factor first; then each stream's `weights` fma'd into its sum, in order."""
    if factors is not None:
        square = len(weights) * tile + t
        for v in values:
            out[square] = b.fma(v, v, out[square])
        values = [b.fmul(v, g) for v, g in zip(values, factors, strict=True)]
    for s_index, stream in enumerate(weights):
        total = out[s_index * tile + t]
        for wi, xi in zip(stream, values, strict=True):
            total = b.fma(wi, xi, total)
        out[s_index * tile + t] = total


def _dot_sums(
    b: Body,
    x: SSAValue,
    streams: list[tuple[SSAValue, SSAValue]],
    rows: list[SSAValue],
    depth: int,
    lane: SSAValue,
    norm: tuple[SSAValue, float] | None = None,
    part: tuple[SSAValue, int] | None = None,
    storage: str | None = None,
) -> list[SSAValue]:
    """`_dots`' warp-reduced sums (stream-major, then each row's sum of squares with `norm`), over the `part`
    (start, length) of the depth when given (split-K), else all of it; weights held as stored in `storage` are
    read block by block (`_stored_dot_sums`), or fp8's 16 codes a load with the row's scale (`_channel_dot_sums`)."""
    if storage is not None:
        assert part is None
        stored = _channel_dot_sums if storage in blocks.CHANNELS else _stored_dot_sums
        return stored(b, x, streams, rows, depth, lane, norm, storage)
    weight0 = streams[0][0]
    vector = vector_width(depth, weight0.type.element_type)  # type: ignore[attr-defined]
    size = 2 if isinstance(weight0.type.element_type, BFloat16Type) else 4  # type: ignore[attr-defined]
    start, length = part if part is not None else (None, depth)
    x_vector = min(vector, 4)
    unroll = max(1, UNROLL_BYTES // (vector * size) // len(streams)) if len(rows) == 1 else 1
    unroll = max(1, min(unroll, length // (cuda.WARP * vector)))  # a main loop step no longer than the row
    tile = len(rows)

    def step_of(count: int) -> Callable[[SSAValue, list[SSAValue]], list[SSAValue]]:
        def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            ks = [b.add(k, u * cuda.WARP * vector) if u else k for u in range(count)]
            loaded = [[b.vload(w, [*_at(r), kk], vector) for kk in ks] for w, r in streams]  # all loads first
            scales: list[list[SSAValue]] = []
            for kk in ks:  # the norm's scale is f32: its vectors are x's width
                parts = range(0, vector, x_vector) if norm else range(0)
                where = [b.add(kk, part) if part else kk for part in parts]
                scales.append([v for at in where for v in b.vload(norm[0], [at], x_vector)])  # type: ignore[index]
            out = list(acc)
            for t, row in enumerate(rows):
                for u, kk in enumerate(ks):
                    values: list[SSAValue] = []
                    for part in range(0, vector, x_vector):
                        values += b.vload(x, [row, b.add(kk, part) if part else kk], x_vector)
                    weights = [per[u] for per in loaded]
                    _multiply_into(b, out, t, tile, values, weights, scales[u] if norm else None)
            return out

        return step

    zeros = [b.fconst(0.0) for _ in range(len(streams) * tile + (tile if norm else 0))]
    chunk = cuda.WARP * vector * unroll
    main = length - length % chunk
    first = b.mul(lane, vector) if start is None else b.add(start, b.mul(lane, vector))

    def at(offset: int) -> SSAValue | int:  # start + offset
        return offset if start is None else b.add(start, offset) if offset else start

    sums = zeros
    if main:
        sums = b.loop(first, at(main), chunk, sums, step_of(unroll))
    if main < length:
        sums = b.loop(b.add(first, main) if main else first, at(length), cuda.WARP * vector, sums, step_of(1))
    return [b.warp_sum(v) for v in sums]


def _at(row: SSAValue | list[SSAValue]) -> list[SSAValue]:
    """A stream's row as indices: a weight's row, or (a stacked expert's) the expert and its row."""
    return list(row) if isinstance(row, list | tuple) else [row]


def _stored_dot_sums(
    b: Body,
    x: SSAValue,
    streams: list[tuple[SSAValue, SSAValue]],
    rows: list[SSAValue],
    depth: int,
    lane: SSAValue,
    norm: tuple[SSAValue, float] | None,
    fmt: str,
) -> list[SSAValue]:
    """`_dot_sums` over weights held as stored in `fmt` (`blocks`): a lane takes whole blocks, each number
    dequantized in registers to the reference's value and multiplied into an f32 fma chain with x (scaled by the
    norm's weight, its square summed, with `norm`). Where the row's bytes allow (a multiple of 16), a lane loads a
    group of `blocks.group` blocks in 16-byte loads a loop step; the blocks past the last whole group (all of a row
    whose bytes are not a multiple of 16) come a block at a time in units, `unroll` blocks a lane a step so that
    about UNROLL_BYTES are in flight a stream, all of a step's loads issued before the first is used. A K-quant's
    super-block is taken a run of numbers at a time (`blocks.pieces`), its units loaded where a run first needs
    them, the runs split over `blocks.passes` loops over the lane's blocks (a pass's units within
    `blocks.PASS_BYTES`)."""
    layout = quant.FORMATS[fmt]
    size, unit = layout.block_bytes, blocks.UNIT_BYTES[fmt]
    per_block = size // unit
    count = depth // layout.block
    tile = len(rows)
    super_block = fmt in blocks.SUPER_BLOCKS

    def accumulate(
        acc: list[SSAValue], spans: list[blocks.Units], placed: list[tuple[int, SSAValue]], pieces: list[range]
    ) -> list[SSAValue]:
        out = list(acc)
        for start, block in placed:  # (the block's byte in the span, its index in the row)
            base = b.mul(block, layout.block)
            for numbers in pieces:
                out = multiply(out, spans, start, base, numbers)
        return out

    def multiply(
        acc: list[SSAValue], spans: list[blocks.Units], start: int, base: SSAValue, numbers: range
    ) -> list[SSAValue]:
        """The block's `numbers` (of the block at byte `start` of each span, number 0 at `base` of x) dequantized
        and multiplied into the sums."""
        out = list(acc)
        where = [b.add(base, v) if v else base for v in range(numbers.start, numbers.stop, 4)]
        scales = [g for at in where for g in b.vload(norm[0], [at], 4)] if norm else []
        weights = [blocks.dequantize(b, fmt, span, start, numbers) for span in spans]
        for t, row in enumerate(rows):
            values = [v for at in where for v in b.vload(x, [row, at], 4)]
            _multiply_into(b, out, t, tile, values, weights, scales if norm else None)
        return out

    def span_of(weight: SSAValue, row: SSAValue, first: SSAValue, count: int, vectors: bool) -> blocks.Units:
        if super_block:
            return blocks.lazy_units(b, weight, row, first, count, vectors)
        return blocks.Units(b, blocks.load_units(b, weight, row, first, count, vectors), unit)

    grouped = blocks.group(fmt)
    in_registers = grouped * size * len(streams) <= blocks.MAX_GROUP_BYTES  # (Q8_0's two streams spill)
    groups = count // grouped if blocks.row_vectors(fmt, depth) and in_registers else 0
    done = groups * grouped
    left = count - done
    unroll = max(1, UNROLL_BYTES // size // len(streams)) if tile == 1 else 1
    unroll = max(1, min(unroll, left // cuda.WARP))

    def run(pieces: list[range], sums: list[SSAValue]) -> list[SSAValue]:
        """The loops over the lane's blocks that take `pieces` of each."""
        if groups:
            span_units = grouped * per_block

            def by_group(g: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
                first = b.mul(g, span_units)
                spans = [span_of(w, r, first, span_units, True) for w, r in streams]
                base = b.mul(g, grouped)
                placed = [(j * size, b.add(base, j) if j else base) for j in range(grouped)]
                return accumulate(acc, spans, placed, pieces)

            sums = b.loop(lane, groups, cuda.WARP, sums, by_group)
        if not left:
            return sums

        def step_of(n: int) -> Callable[[SSAValue, list[SSAValue]], list[SSAValue]]:
            def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
                ks = [b.add(k, u * cuda.WARP) if u else k for u in range(n)]
                loaded = [  # every load of the step issued first (a super-block's where its sub-block needs it)
                    [span_of(w, r, b.mul(kk, per_block), per_block, False) for w, r in streams] for kk in ks
                ]
                out = acc
                for kk, spans in zip(ks, loaded, strict=True):
                    out = accumulate(out, spans, [(0, kk)], pieces)
                return out

            return step

        chunk = cuda.WARP * unroll
        main = left - left % chunk
        first = b.add(lane, done) if done else lane
        if main:
            sums = b.loop(first, done + main, chunk, sums, step_of(unroll))
        if main < left:
            sums = b.loop(b.add(first, main) if main else first, count, cuda.WARP, sums, step_of(1))
        return sums

    sums = [b.fconst(0.0) for _ in range(len(streams) * tile + (tile if norm else 0))]
    for pieces in blocks.passes(fmt, len(streams)):  # a super-block's units in registers a pass at a time
        sums = run(pieces, sums)
    return [b.warp_sum(v) for v in sums]


def _channel_dot_sums(
    b: Body,
    x: SSAValue,
    streams: list[tuple[SSAValue, SSAValue]],
    rows: list[SSAValue],
    depth: int,
    lane: SSAValue,
    norm: tuple[SSAValue, float] | None,
    fmt: str,
) -> list[SSAValue]:
    """`_dot_sums` over weights held as stored in a format with a scale a row (fp8, `blocks.CHANNELS`): each
    stream's row scale loaded once, before the loop; a lane loads its row's codes 16 a 16-byte load (four 32-bit
    units), `unroll` loads a stream a loop step at batch 1 so that UNROLL_BYTES are in flight a stream, all of a
    step's loads issued first, then a remainder loop takes the last whole loads; each code dequantized in registers
    to the reference's value (`blocks.channel_numbers`) and multiplied into the f32 fma chain with x (scaled by the
    norm's weight, its square summed, with `norm`), as `_dot_sums` multiplies an image's."""
    codes = blocks.VECTOR_BYTES  # a load's codes, one byte each
    units = codes // blocks.UNIT_BYTES[fmt]
    tile = len(rows)
    scales = [blocks.channel_scale(b, w, r, depth) for w, r in streams]
    unroll = max(1, UNROLL_BYTES // codes // len(streams)) if tile == 1 else 1
    unroll = max(1, min(unroll, depth // (cuda.WARP * codes)))  # a main loop step no longer than the row

    def step_of(count: int) -> Callable[[SSAValue, list[SSAValue]], list[SSAValue]]:
        def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:  # k: the lane's first unit of the step
            ks = [b.add(k, u * cuda.WARP * units) if u else k for u in range(count)]
            loaded = [[b.vload_raw(w, [r, kk], units) for kk in ks] for w, r in streams]  # every load issued first
            weights = [
                [blocks.channel_numbers(b, words, scale) for words in per]
                for per, scale in zip(loaded, scales, strict=True)
            ]
            out = list(acc)
            for u, kk in enumerate(ks):
                at = b.mul(kk, codes // units)  # x's number of the unit's first code
                where = [b.add(at, v) if v else at for v in range(0, codes, 4)]
                factors = [g for place in where for g in b.vload(norm[0], [place], 4)] if norm else []
                for t, row in enumerate(rows):
                    values = [v for place in where for v in b.vload(x, [row, place], 4)]
                    _multiply_into(b, out, t, tile, values, [per[u] for per in weights], factors if norm else None)
            return out

        return step

    sums = [b.fconst(0.0) for _ in range(len(streams) * tile + (tile if norm else 0))]
    length = depth // (codes // units)  # the row's units of codes
    chunk = cuda.WARP * units * unroll
    main = length - length % chunk
    first = b.mul(lane, units)
    if main:
        sums = b.loop(first, main, chunk, sums, step_of(unroll))
    if main < length:
        sums = b.loop(b.add(first, main) if main else first, length, cuda.WARP * units, sums, step_of(1))
    return [b.warp_sum(v) for v in sums]


def embed_channels(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], fmt: str) -> None:
    """The embedding of a table held as stored in a format with a scale a row (fp8): a block of threads a token,
    each thread the row's scale once, then 16 codes a 16-byte load, dequantized (`blocks.channel_numbers`) and
    written."""
    table, tokens, out = args
    width = shapes[0][1]
    units = blocks.VECTOR_BYTES // blocks.UNIT_BYTES[fmt]
    row = b.block("y")
    token = b.sub(b.to_index(b.load(tokens, [row])), 1)
    scale = blocks.channel_scale(b, table, token, width)

    def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
        base = b.mul(k, blocks.UNIT_BYTES[fmt])
        for i, value in enumerate(blocks.channel_numbers(b, b.vload_raw(table, [token, k], units), scale)):
            b.store(value, out, [row, b.add(base, i) if i else base])
        return []

    b.loop(b.mul(b.thread(), units), width // blocks.UNIT_BYTES[fmt], THREADS * units, [], step)


def embed_stored(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], fmt: str) -> None:
    """The embedding of a table held as stored in `fmt`: a thread a block of the token's row (a block of threads a
    token), its units loaded, its 32 numbers dequantized (`blocks.dequantize`) and written."""
    table, tokens, out = args
    layout = quant.FORMATS[fmt]
    unit = blocks.UNIT_BYTES[fmt]
    per_block = layout.block_bytes // unit
    count = shapes[0][1] // layout.block
    row = b.block("y")

    def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
        token = b.sub(b.to_index(b.load(tokens, [row])), 1)
        units = blocks.load_units(b, table, token, b.mul(k, per_block), per_block, False)
        base = b.mul(k, layout.block)
        for i, value in enumerate(blocks.dequantize(b, fmt, blocks.Units(b, units, unit), 0)):
            b.store(value, out, [row, b.add(base, i) if i else base])
        return []

    b.loop(b.thread(), count, THREADS, [], step)


def _projection(
    b: Body,
    x: SSAValue,
    weights: list[SSAValue],
    shape: tuple[int, int, int],
    epilogue: Callable[[SSAValue, list[SSAValue]], None],
    norm: tuple[SSAValue, float] | None = None,
    storage: str | None = None,
) -> None:
    """A warp per output column n: row n of each weight against a tile of rows of x (`_dots`), and lane 0 of a
    valid column writes each row through `epilogue` (the folded norm's 1/rms applied first)."""
    rows, columns, depth = shape
    tile = min(rows, ROW_TILE)
    _, warp, lane = _warp_and_lane(b)
    column = b.add(b.mul(b.block("x"), WARPS), warp)
    valid = b.cmp("ult", column, columns)
    clamped = b.min(column, columns - 1)  # an idle warp reads a real row and writes nothing
    first = b.mul(b.block("y"), tile)
    tile_rows = [b.min(b.add(first, t), rows - 1) for t in range(tile)]
    dots, inverse = _dots(b, x, [(w, clamped) for w in weights], tile_rows, depth, lane, norm, storage)
    lane0 = b.cmp("eq", lane, 0)
    for t in range(tile):
        row = b.add(first, t)
        ok = b.both(b.both(lane0, valid), b.cmp("ult", row, rows))
        sums = [dots[w][t] for w in range(len(weights))]
        if inverse:
            sums = [b.fmul(v, inverse[t]) for v in sums]
        b.when(ok, partial(epilogue, row, sums))


def linear(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float | None = None,
    residual_chip: int | None = None, biased: bool = False, storage: str | None = None,
) -> None:  # fmt: skip
    """A warp an output column (`_projection`); lane 0's epilogue adds the bias (`biased`: bias[column] to the
    sums, before the residual) and the residual, both on chip `residual_chip` alone in a split step's partial
    sum (the all-reduce after it completes the sum)."""
    x, weight, *rest, out = args
    scale = rest.pop() if epsilon is not None else None
    bias = rest.pop() if biased else None
    chip = rest.pop() if residual_chip is not None else None
    residual = rest
    rows, depth = shapes[0]
    columns = shapes[1][0]
    _, warp, _ = _warp_and_lane(b)

    def on_chip() -> SSAValue:  # whether this is the chip that adds the residual and the bias
        assert chip is not None and residual_chip is not None
        return b.op(arith.CmpiOp(b.load(chip, [0]), b.op(arith.ConstantOp(IntegerAttr(residual_chip, i64))), "eq"))

    def write(row: SSAValue, sums: list[SSAValue]) -> None:
        column = b.add(b.mul(b.block("x"), WARPS), warp)
        total, here = sums[0], None
        if bias is not None:
            added = b.load(bias, [column])
            if chip is not None:
                here = on_chip()
                added = b.select(here, added, b.fconst(0.0))
            total = b.fadd(total, added)
        if not residual:
            b.store(total, out, [row, column])
            return
        added = b.load(residual[0], [row, column])
        if chip is not None:  # a partial sum: the residual on one chip, the rest by the all-reduce
            added = b.select(here if here is not None else on_chip(), added, b.fconst(0.0))
        b.store(b.fadd(added, total), out, [row, column])

    norm = (scale, epsilon) if scale is not None and epsilon is not None else None
    _projection(b, x, [weight], (rows, columns, depth), write, norm, storage)


def gate_up(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float | None = None, biased: bool = False,
    gelu_tanh: bool = False, storage: str | None = None,
) -> None:  # fmt: skip
    """A warp a column of gate and of up (`_projection`); lane 0 adds each product's bias (`biased`) and writes
    silu(g) * u."""
    x, gate, up, *rest, out = args
    biases = rest[:2] if biased else []
    rest = rest[2:] if biased else rest
    rows, depth = shapes[0]
    columns = shapes[1][0]
    _, warp, _ = _warp_and_lane(b)

    def write(row: SSAValue, sums: list[SSAValue]) -> None:
        column = b.add(b.mul(b.block("x"), WARPS), warp)
        g, u = sums
        if biases:
            g, u = b.fadd(g, b.load(biases[0], [column])), b.fadd(u, b.load(biases[1], [column]))
        b.store(glu(b, g, u, gelu_tanh), out, [row, column])

    norm = (rest[0], epsilon) if rest and epsilon is not None else None
    _projection(b, x, [gate, up], (rows, columns, depth), write, norm, storage)


TARGET_WARPS = 132 * 16  # a GEMV launch's warps: 16 an SM of 132 keep ~29 KB of weights in flight at 64 B a lane
MAX_SPLITS = 8


def qkv_splits(pairs: int, depth: int, element: Attribute) -> int:
    """The parts the QKV launch splits each rotation pair's depth into (split-K): doubled while the launch has
    fewer than TARGET_WARPS warps, each part still at least one whole unrolled loop step of 16-byte loads (a
    shorter part would cut the bytes a lane has in flight by as much as the split adds warps), at most
    MAX_SPLITS. 1 where the pairs alone fill the SMs (the 8B: 3,072 pairs) or the rows are short (SmolLM2's 576
    in bf16), and for weights read as stored (integer units: their blocks are not split)."""
    if isinstance(element, IntegerType):
        return 1
    vector = vector_width(depth, element)
    size = 2 if isinstance(element, BFloat16Type) else 4
    step = cuda.WARP * vector * max(1, UNROLL_BYTES // (vector * size) // 2)  # _dot_sums' main step, 2 streams
    splits = 1
    while pairs * splits < TARGET_WARPS and splits < MAX_SPLITS:
        span = depth // (2 * splits)
        if depth % (2 * splits) or span % vector or span < step:
            break
        splits *= 2
    return splits


def qkv(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float, storage: str | None = None
) -> None:
    """A warp per rotation pair (d, d + head_dim/2) of one head of the concatenated [Q; K; V] weight: the folded
    norm, both dot products, then lane 0 rotates a query or key pair at the row's position and writes it (queries
    to `query`, keys rounded into the key cache), or writes a value pair into the value cache.

    Split-K (`partial` [pairs, splits, 3] and `count` [pairs] given): `splits` consecutive warps share a pair, each
    summing one part of the depth; lane 0 of each writes its part's two dot products and sum of squares, makes
    them visible device-wide (`llvm.fence`) and counts itself done; the last of a pair adds the parts in split
    order (the same order whichever warp is last), resets the count and runs the epilogue."""
    x, weight, scale, positions, cos, sin, query, keys, values, *split_k = args
    depth = shapes[0][1]
    q_width = shapes[6][1]
    kv_heads, _, head_dim = shapes[7]
    half = head_dim // 2
    q_heads = q_width // head_dim
    pairs = (q_heads + 2 * kv_heads) * half
    splits = shapes[9][1] if split_k else 1
    _, warp, lane = _warp_and_lane(b)
    item = b.add(b.mul(b.block("x"), WARPS), warp)
    part = b.rem(item, splits) if splits > 1 else None
    item = b.div(item, splits) if splits > 1 else item
    valid = b.cmp("ult", item, pairs)
    item = b.min(item, pairs - 1)
    head, d = b.div(item, half), b.rem(item, half)
    first = b.add(b.mul(head, head_dim), d)
    second = b.add(first, half)
    row = b.const(0)
    rounded = isinstance(keys.type.element_type, BFloat16Type)  # type: ignore[attr-defined]

    def epilogue(low: SSAValue, high: SSAValue) -> None:
        place = b.sub(b.to_index(b.load(positions, [row])), 1)
        d2 = b.add(d, half)

        def rotated() -> tuple[SSAValue, SSAValue]:
            turned_low = b.fadd(b.fmul(low, b.load(cos, [place, d])), b.fmul(high, b.load(sin, [place, d])))
            turned_high = b.fadd(b.fmul(high, b.load(cos, [place, d2])), b.fmul(low, b.load(sin, [place, d2])))
            return turned_low, turned_high

        def write_query() -> None:
            a, c = rotated()
            b.store(a, query, [row, b.add(b.mul(head, head_dim), d)])
            b.store(c, query, [row, b.add(b.mul(head, head_dim), d2)])

        def write_cache(cache: SSAValue, pair: tuple[SSAValue, SSAValue], first_head: int) -> None:
            kv = b.sub(head, first_head)
            for value, where in zip(pair, (d, d2), strict=True):
                b.store(b.to_bf16(value) if rounded else value, cache, [kv, place, where])

        is_query = b.cmp("ult", head, q_heads)
        is_key = b.both(b.cmp("uge", head, q_heads), b.cmp("ult", head, q_heads + kv_heads))
        b.when(is_query, write_query)
        b.when(is_key, lambda: write_cache(keys, rotated(), q_heads))
        b.when(b.cmp("uge", head, q_heads + kv_heads), lambda: write_cache(values, (low, high), q_heads + kv_heads))

    streams = [(weight, first), (weight, second)]
    if splits == 1:
        dots, inverse = _dots(b, x, streams, [row], depth, lane, (scale, epsilon), storage)
        low, high = (b.fmul(dots[s][0], inverse[0]) for s in range(2))
        b.when(b.both(valid, b.cmp("eq", lane, 0)), lambda: epilogue(low, high))
        return
    assert part is not None
    partial_sums, count = split_k
    span = depth // splits
    sums = _dot_sums(b, x, streams, [row], depth, lane, (scale, epsilon), (b.mul(part, span), span))
    lane0 = b.both(valid, b.cmp("eq", lane, 0))

    def finish() -> None:
        for index, value in enumerate(sums):
            b.store(value, partial_sums, [item, part, index])
        b.op(cuda.FenceOp("device"))  # this lane's partials visible before it counts (lane 0 alone: no warp sync)
        one = b.op(arith.ConstantOp(IntegerAttr(1, i64)))
        before = b.atomic_add(one, count, [item])
        last = b.op(arith.CmpiOp(before, b.op(arith.ConstantOp(IntegerAttr(splits - 1, i64))), "eq"))

        def combine() -> None:
            b.op(cuda.FenceOp("device"))  # the acquire side: no load of the others' partials moves above the count
            b.store(b.op(arith.ConstantOp(IntegerAttr(0, i64))), count, [item])
            totals = [b.load(partial_sums, [item, 0, index]) for index in range(3)]
            for other in range(1, splits):
                totals = [b.fadd(t, b.load(partial_sums, [item, other, index])) for index, t in enumerate(totals)]
            inverse = _inverse_rms(b, totals[2], depth, epsilon)
            epilogue(b.fmul(totals[0], inverse), b.fmul(totals[1], inverse))

        b.when(last, combine)

    b.when(lane0, finish)


def rope(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], head_dim: int, rotary: int | None = None
) -> None:
    x, positions, cos, sin, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        place = b.sub(b.to_index(b.load(positions, [row])), 1)
        value, _, _ = rotated(b, x, row, column, head_dim, (cos, sin), place, rotary)
        b.store(value, out, [row, column])

    b.when(b.cmp("ult", column, width), body)


def rope_cache_write(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], rotary: int | None = None) -> None:
    key, value, positions, cos, sin, keys, values = args
    width = shapes[0][1]
    head_dim = shapes[5][-1]
    per_sequence = len(shapes[5]) == 4
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        place = b.sub(b.to_index(b.load(positions, [row])), 1)
        turned, head, d = rotated(b, key, row, column, head_dim, (cos, sin), place, rotary)
        where = [row, head, place, d] if per_sequence else [head, place, d]
        stored = b.load(value, [row, column])
        if isinstance(keys.type.element_type, BFloat16Type):  # type: ignore[attr-defined]
            turned, stored = b.to_bf16(turned), b.to_bf16(stored)
        b.store(turned, keys, where)
        b.store(stored, values, where)

    b.when(b.cmp("ult", column, width), body)


def _cache_width(head_dim: int, element: Attribute, group: int) -> int:
    """The elements of a cache row a lane loads at once: 16 bytes where the lane's share of the group's queries
    and sums stays within 32 registers each (group x width <= 32), narrower otherwise."""
    width = vector_width(head_dim, element)
    while width > 1 and group * width > 32:
        width //= 2
    return width


def _attention_layout(head_dim: int, element: Attribute, group: int) -> tuple[int, int, int, int]:
    """(width, lanes a position, vectors a lane, positions a warp step): a position's key row is spread over
    `lanes` lanes (a power of two) loading `width` elements each, so a warp attends 32 / lanes positions at once."""
    width = _cache_width(head_dim, element, group)
    vectors = head_dim // width
    lanes = 1
    while lanes < min(vectors, cuda.WARP):
        lanes *= 2
    return width, lanes, cdiv(vectors, lanes), cuda.WARP // lanes


ATTENTION_UNROLL = 2  # warp steps a loop iteration of attention issues the loads of before it uses the first


def attention_min_span(head_dim: int, element: Attribute, group: int) -> int:
    """The fewest positions a split attends: one whole loop iteration (`ATTENTION_UNROLL` warp steps), so a short
    cache uses fewer splits, each with all its loads in flight at once."""
    return _attention_layout(head_dim, element, group)[3] * ATTENTION_UNROLL


def _span(b: Body, length: SSAValue, splits: int, least: int) -> SSAValue:
    """The positions each split attends at this live length: the length shared by all splits, at least `least`."""
    return b.op(arith.MaxUIOp(b.div(b.add(length, splits - 1), splits), b.const(least)))


def _live(b: Body, length: SSAValue, window: int | None) -> tuple[SSAValue, SSAValue | None]:
    """(the positions a row attends, the first of them or None for 0): the whole live length, or with a sliding
    `window` of W its last min(length, W) positions alone (the cache before them is never read)."""
    if window is None:
        return length, None
    live = b.min(length, window)
    return live, b.sub(length, live)


def attention(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], window: int | None = None,
    scale: float | None = None, softcap: float | None = None,
) -> None:  # fmt: skip
    """A warp per (row, KV head, split) writes its split's partial softmax state (flash-decoding's first stage;
    `attention_merge` is the second): the keys and values of its positions are read once for all the query heads
    of the KV head's group. A position's row is spread over `lanes` lanes with 16-byte loads, so a warp step covers
    32 / lanes positions; a loop iteration issues the key and value loads of `ATTENTION_UNROLL` warp steps before
    it uses the first (independent loads in flight, as FlashInfer's cp.async stages keep them), then updates each
    lane group's online softmax per query head position by position; the lane groups merge their states with
    shuffles at the end. The split's positions are the live length shared out over the splits (at least one whole
    iteration each), so the work follows the length, not the cache size; with a sliding `window` the live length
    is the window's positions before the row's own (`_live`), so a windowed layer reads only its window."""
    query, keys, values, positions, scratch = args
    rows, width = shapes[0]
    cache = shapes[1]
    per_sequence = len(cache) == 4
    kv_heads, ctx, head_dim = cache[-3], cache[-2], cache[-1]
    heads = width // head_dim
    group = heads // kv_heads
    splits = shapes[4][2]
    element = keys.type.element_type  # type: ignore[attr-defined]
    vec, lanes, per_lane, steps = _attention_layout(head_dim, element, group)
    least = steps * ATTENTION_UNROLL
    vectors = head_dim // vec
    _, warp, lane = _warp_and_lane(b)
    item = b.add(b.mul(b.block("x"), WARPS), warp)
    row = b.block("y")
    valid = b.cmp("ult", item, kv_heads * splits)
    item = b.min(item, kv_heads * splits - 1)
    kv_head, part = b.div(item, splits), b.rem(item, splits)
    sub, slot = b.div(lane, lanes), b.rem(lane, lanes)
    zero = b.fconst(0.0)
    # the vectors this lane holds: slot + c * lanes, those past the row clamped and masked
    starts, inside = [], []
    for c in range(per_lane):
        index = b.add(slot, c * lanes) if c else slot
        inside.append(b.cmp("ult", index, vectors) if (c + 1) * lanes > vectors else None)
        starts.append(b.mul(b.min(index, vectors - 1), vec))
    x_vec = min(vec, 4)

    def query_part(h: int, c: int) -> list[SSAValue]:
        head = b.add(b.mul(kv_head, group), h) if h else b.mul(kv_head, group)
        base = b.add(b.mul(head, head_dim), starts[c])
        got: list[SSAValue] = []
        for piece in range(0, vec, x_vec):
            got += b.vload(query, [row, b.add(base, piece) if piece else base], x_vec)
        keep = inside[c]
        if keep is not None:
            got = [b.select(keep, g, zero) for g in got]
        return got

    factor = b.fconst(1.0 / head_dim**0.5 if scale is None else scale)
    q = [[b.fmul(v, factor) for c in range(per_lane) for v in query_part(h, c)] for h in range(group)]
    length = b.to_index(b.load(positions, [row]))
    live, first = _live(b, length, window)
    span = _span(b, live, splits, least)
    start = b.min(b.mul(part, span) if first is None else b.add(first, b.mul(part, span)), length)
    stop = b.min(b.add(start, span), length)

    def cache_at(j: SSAValue, c: int) -> list[SSAValue]:
        return [row, kv_head, j, starts[c]] if per_sequence else [kv_head, j, starts[c]]

    def update(state: list[SSAValue], live: SSAValue, k: list[SSAValue], v_row: list[SSAValue]) -> list[SSAValue]:
        new: list[SSAValue] = []
        for h in range(group):
            m, total, *acc = state[h * stride : (h + 1) * stride]
            dot = zero
            for qi, ki in zip(q[h], k, strict=True):
                dot = b.fma(qi, ki, dot)
            offset = lanes // 2
            while offset:  # the position's lanes sum their parts
                dot = b.fadd(dot, b.shuffle(dot, offset))
                offset //= 2
            if softcap is not None:  # the scaled score soft-capped before the softmax (Gemma 2)
                dot = _softcap(b, dot, softcap)
            high = b.fmax(m, dot)
            fade, weight = b.exp(b.fsub(m, high)), b.exp(b.fsub(dot, high))
            updated = [high, b.fma(total, fade, weight)]
            updated += [b.fma(weight, vi, b.fmul(a, fade)) for a, vi in zip(acc, v_row, strict=True)]
            new += [b.select(live, u, o) for u, o in zip(updated, [m, total, *acc], strict=True)]
        return new

    def iteration(first: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
        loaded = []
        for u in range(ATTENTION_UNROLL):  # every load of the iteration issued before the first is used
            j = b.add(first, sub) if not u else b.add(b.add(first, u * steps), sub)
            live = b.cmp("ult", j, stop)
            j = b.min(j, ctx - 1)
            k = [v for c in range(per_lane) for v in b.vload(keys, cache_at(j, c), vec)]
            v_row = [v for c in range(per_lane) for v in b.vload(values, cache_at(j, c), vec)]
            loaded.append((live, k, v_row))
        for live, k, v_row in loaded:
            state = update(state, live, k, v_row)
        return state

    stride = 2 + per_lane * vec
    inits = [b.fconst(NEG_BIG), zero, *[zero] * (per_lane * vec)] * group
    state = b.loop(start, stop, steps * ATTENTION_UNROLL, inits, iteration)
    # merge the lane groups' states (each attended every `steps`-th position of the split)
    offset = lanes
    while offset < cuda.WARP:
        merged: list[SSAValue] = []
        for h in range(group):
            m, total, *acc = state[h * stride : (h + 1) * stride]
            m_o, total_o = b.shuffle(m, offset), b.shuffle(total, offset)
            high = b.fmax(m, m_o)
            fade, fade_o = b.exp(b.fsub(m, high)), b.exp(b.fsub(m_o, high))
            merged += [high, b.fma(total, fade, b.fmul(total_o, fade_o))]
            merged += [b.fma(a, fade, b.fmul(b.shuffle(a, offset), fade_o)) for a in acc]
        state = merged
        offset *= 2

    def write() -> None:
        for h in range(group):
            head = b.add(b.mul(kv_head, group), h) if h else b.mul(kv_head, group)
            m, total, *acc = state[h * stride : (h + 1) * stride]
            for c in range(per_lane):

                def store(c: int = c, acc: list[SSAValue] = acc, head: SSAValue = head) -> None:
                    for e in range(vec):
                        where = b.add(starts[c], e) if e else starts[c]
                        b.store(acc[c * vec + e], scratch, [row, head, part, where])

                keep = inside[c]
                b.when(keep, store) if keep is not None else store()

            def ends(m: SSAValue = m, total: SSAValue = total, head: SSAValue = head) -> None:
                b.store(m, scratch, [row, head, part, head_dim])
                b.store(total, scratch, [row, head, part, head_dim + 1])

            b.when(b.cmp("eq", slot, 0), ends)

    b.when(b.both(valid, b.cmp("eq", sub, 0)), write)


MERGE_DIMS = 4  # dimensions of a head a merge warp owns
MERGE_UNROLL = 4  # splits a merge lane reads a round before it merges the first (128 a warp a round)


def attention_merge(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], least: int, window: int | None = None
) -> None:
    """Flash-decoding's second stage, a launch of its own (FlashInfer's `MergeStates`): a warp per (row, query head,
    `MERGE_DIMS` dimensions); its lanes take the splits that attended anything 128 at a time (lane l the splits
    l, l + 32, l + 64, l + 96 a round: 128 splits' partial states read at once, from L2), each lane merging its
    splits in order, then
    the lanes' states merge by a butterfly of shuffles (a fixed order: the result does not depend on timing), and
    lane 0 writes the dimensions' outputs."""
    positions, scratch, out = args
    rows, heads, splits, padded = shapes[1]
    head_dim = padded - 2
    chunks = cdiv(head_dim, MERGE_DIMS)
    _, warp, lane = _warp_and_lane(b)
    item = b.add(b.mul(b.block("x"), WARPS), warp)
    row = b.block("y")
    valid = b.cmp("ult", item, heads * chunks)
    item = b.min(item, heads * chunks - 1)
    head, chunk = b.div(item, chunks), b.rem(item, chunks)
    dims = []
    for e in range(MERGE_DIMS):
        d = b.add(b.mul(chunk, MERGE_DIMS), e)
        dims.append((b.cmp("ult", d, head_dim) if head_dim % MERGE_DIMS else None, b.min(d, head_dim - 1)))
    length, _ = _live(b, b.to_index(b.load(positions, [row])), window)  # the positions the splits shared
    span = _span(b, length, splits, least)
    used = b.div(b.add(length, b.sub(span, 1)), span)
    zero = b.fconst(0.0)

    def merge(state: list[SSAValue], m_o: SSAValue, total_o: SSAValue, acc_o: list[SSAValue]) -> list[SSAValue]:
        m, total, *acc = state
        high = b.fmax(m, m_o)
        fade, fade_o = b.exp(b.fsub(m, high)), b.exp(b.fsub(m_o, high))
        return [high, b.fma(total, fade, b.fmul(total_o, fade_o))] + [
            b.fma(a, fade, b.fmul(a_o, fade_o)) for a, a_o in zip(acc, acc_o, strict=True)
        ]

    def split_state(first: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
        loaded = []
        for u in range(MERGE_UNROLL):  # every load of the round issued before the first merge
            s = b.add(first, u * cuda.WARP) if u else first
            live = b.cmp("ult", s, used)
            s = b.min(s, splits - 1)
            m_s = b.load(scratch, [row, head, s, head_dim])
            total_s = b.load(scratch, [row, head, s, head_dim + 1])
            loaded.append((live, m_s, total_s, [b.load(scratch, [row, head, s, d]) for _, d in dims]))
        for live, m_s, total_s, acc_s in loaded:  # lane l's splits in order: l, l + 32, ...
            state = [b.select(live, n, o) for n, o in zip(merge(state, m_s, total_s, acc_s), state, strict=True)]
        return state

    rounds = cuda.WARP * MERGE_UNROLL
    state = b.loop(lane, used, rounds, [b.fconst(NEG_BIG), zero, *[zero] * MERGE_DIMS], split_state)
    for offset in (1, 2, 4, 8, 16):  # lane l's splits before lane l + offset's: the order the splits lie in
        others = [b.shuffle(v, offset) for v in state]
        state = merge(state, others[0], others[1], others[2:])
    _, total, *acc = state

    def write() -> None:
        for (keep, d), a in zip(dims, acc, strict=True):
            where = [row, b.add(b.mul(head, head_dim), d)]
            if keep is None:
                b.store(b.fdiv(a, total), out, where)
            else:
                b.when(keep, lambda a=a, where=where: b.store(b.fdiv(a, total), out, where))

    b.when(b.both(valid, b.cmp("eq", lane, 0)), write)


def _better(b: Body, value: SSAValue, index: SSAValue, best: SSAValue, best_index: SSAValue) -> SSAValue:
    """Whether (value, index) beats (best, best_index): greater, or equal at a lower index (the first maximum)."""
    tie = b.both(b.fcmp("oeq", value, best), b.cmp("ult", index, best_index))
    return b.either(b.fcmp("ogt", value, best), tie)


def _warp_argmax(b: Body, best: SSAValue, index: SSAValue) -> tuple[SSAValue, SSAValue]:
    for offset in (16, 8, 4, 2, 1):
        other, other_index = b.shuffle(best, offset), b.shuffle(index, offset)
        take = _better(b, other, other_index, best, index)
        best, index = b.select(take, other, best), b.select(take, other_index, index)
    return best, index


def argmax_chunks(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], chunk: int) -> None:
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


def argmax_final(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
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


def _softcap(b: Body, value: SSAValue, cap: float) -> SSAValue:
    """tanh(value / cap) * cap, as the reference computes it."""
    limit = b.fconst(cap)
    return b.fmul(b.tanh(b.fdiv(value, limit)), limit)


softcap = _softcap


def elementwise(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], fn: Callable[[SSAValue], SSAValue]
) -> None:
    """out[row, column] = fn(x[row, column]): a thread a column, a block row of them a row."""
    x, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")
    b.when(b.cmp("ult", column, width), lambda: b.store(fn(b.load(x, [row, column])), out, [row, column]))


def add(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    """out = lhs + rhs, elementwise."""
    _sum_by_columns(b, args, shapes, broadcast=False)


def bias_add(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    """out[row, column] = x[row, column] + bias[column]."""
    _sum_by_columns(b, args, shapes, broadcast=True)


def _sum_by_columns(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], broadcast: bool) -> None:
    """A thread a column, a block row of them a row: out = lhs + rhs, the rhs one row for every row (`broadcast`)."""
    lhs, rhs, out = args
    width = shapes[0][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")
    at = [column] if broadcast else [row, column]
    b.when(
        b.cmp("ult", column, width),
        lambda: b.store(b.fadd(b.load(lhs, [row, column]), b.load(rhs, at)), out, [row, column]),
    )


# -- a mixture of experts (`cuda.experts`) ----------------------------------------------------------------------
#
# Decode reads only the chosen experts' weights: the router's launch writes each row's chosen experts and weights
# to two small device buffers, and every expert GEMV's warp reads its expert's index from there (no host round
# trip) and streams that expert's row of the stacked weight. A chunk or batch groups its rows by expert first, so
# each expert's warps stream its weights once a tile of its own rows.


def _pairwise(b: Body, values: list[SSAValue]) -> SSAValue:
    """The sum of a few f32s in numpy's order (`pairwise_sum` for fewer than 128: one after the other under 8,
    else 8 running sums combined as a tree, then the rest one after the other), so a renormalized weight divides
    by the reference's bits."""
    if len(values) < 8:
        total = values[0]
        for v in values[1:]:
            total = b.fadd(total, v)
        return total
    whole = len(values) - len(values) % 8
    sums = list(values[:8])
    for i in range(8, whole, 8):
        sums = [b.fadd(sums[j], values[i + j]) for j in range(8)]
    pairs = [b.fadd(sums[j], sums[j + 1]) for j in range(0, 8, 2)]
    total = b.fadd(b.fadd(pairs[0], pairs[1]), b.fadd(pairs[2], pairs[3]))
    for v in values[whole:]:
        total = b.fadd(total, v)
    return total


def experts_route(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], top_k: int, renormalize: bool, held: int
) -> None:
    """A warp a row of the router's logits (lane l holds experts l, l + 32, ...): the softmax over every expert in
    f32 (the maximum and the sum of the exponentials by butterflies), then `top_k` rounds each taking the most
    probable expert after the last one taken (lower probability, or equal at a higher index: the lowest index
    first on a tie, as torch.topk), the chosen weights divided by their sum in the order chosen with
    `renormalize`; lane 0 writes each chosen expert and weight at its rank by expert index (so the experts are
    summed in ascending index), as this chip's expert (chip * held is its first, read from the `chip` table in a
    split step) or `held` where another chip holds it."""
    logits, *chip, chosen, weights = args
    rows, experts = shapes[0]
    _, warp, lane = _warp_and_lane(b)
    row = b.add(b.mul(b.block("x"), WARPS), warp)

    def body() -> None:
        slots = cdiv(experts, cuda.WARP)
        index = [b.add(lane, m * cuda.WARP) if m else lane for m in range(slots)]
        valid = [b.cmp("ult", i, experts) for i in index]
        scores = [
            b.select(ok, b.load(logits, [row, b.min(i, experts - 1)]), b.fconst(NEG_BIG))
            for i, ok in zip(index, valid, strict=True)
        ]
        top = scores[0]
        for v in scores[1:]:
            top = b.fmax(top, v)
        for offset in (16, 8, 4, 2, 1):
            top = b.fmax(top, b.shuffle(top, offset))
        exps = [b.select(ok, b.exp(b.fsub(v, top)), b.fconst(0.0)) for v, ok in zip(scores, valid, strict=True)]
        total = exps[0]
        for v in exps[1:]:
            total = b.fadd(total, v)
        total = b.warp_sum(total)
        probs = [b.fdiv(v, total) for v in exps]
        picks: list[tuple[SSAValue, SSAValue]] = []
        for _ in range(top_k):
            best, best_index = b.fconst(-1.0), b.const(experts)
            for p, i, ok in zip(probs, index, valid, strict=True):
                if picks:  # after the last pick: lower, or equal at a higher index
                    last, last_index = picks[-1]
                    later = b.both(b.fcmp("oeq", p, last), b.cmp("ult", last_index, i))
                    ok = b.both(ok, b.either(b.fcmp("olt", p, last), later))
                take = b.both(ok, _better(b, p, i, best, best_index))
                best, best_index = b.select(take, p, best), b.select(take, i, best_index)
            picks.append(_warp_argmax(b, best, best_index))
        chosen_weights = [p for p, _ in picks]
        if renormalize:
            total = _pairwise(b, chosen_weights)
            chosen_weights = [b.fdiv(w, total) for w in chosen_weights]
        first = b.mul(b.to_index(b.load(chip[0], [0])), held) if chip else None

        def write() -> None:
            for j, (_, expert) in enumerate(picks):
                rank = b.const(0)
                for m, (_, other) in enumerate(picks):
                    if m != j:
                        rank = b.add(rank, b.select(b.cmp("ult", other, expert), b.const(1), b.const(0)))
                local = expert
                if first is not None:
                    here = b.both(b.cmp("uge", expert, first), b.cmp("ult", expert, b.add(first, held)))
                    local = b.select(here, b.sub(expert, first), b.const(held))
                b.store(b.to_i64(local), chosen, [row, rank])
                b.store(chosen_weights[j], weights, [row, rank])

        b.when(b.cmp("eq", lane, 0), write)

    b.when(b.cmp("ult", row, rows), body)


def experts_group(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    """A thread an expert of this chip: the assignments (row * top_k + slot) routed to it, in row order, into
    `assigned` [held, rows], and their number into `count` (a chunk's or batch's rows grouped by expert)."""
    chosen, count, assigned = args
    rows, top_k = shapes[0]
    held = shapes[1][0]
    expert = b.add(b.mul(b.block("x"), THREADS), b.thread())

    def body() -> None:
        def scan(a: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
            hit = b.cmp("eq", b.to_index(b.load(chosen, [b.div(a, top_k), b.rem(a, top_k)])), expert)
            b.when(hit, lambda: b.store(b.to_i64(a), assigned, [expert, state[0]]))
            return [b.select(hit, b.add(state[0], 1), state[0])]

        (found,) = b.loop(0, rows * top_k, 1, [b.const(0)], scan)
        b.store(b.to_i64(found), count, [expert])

    b.when(b.cmp("ult", expert, held), body)


def _expert_products(
    b: Body,
    x: SSAValue,
    chosen: SSAValue,
    stacked: list[SSAValue],
    groups: list[SSAValue],
    shape: tuple[int, int, int, int],
    epilogue: Callable[[SSAValue, SSAValue, list[SSAValue]], None],
    norm: tuple[SSAValue, float] | None = None,
) -> None:
    """A warp an output column of the experts' products: of the assignment `block.y` (row * top_k + slot; x's row
    the assignment's row, or with `by_assignment` in `shape` the assignment itself) and its expert as the router
    wrote it, skipped where another chip holds it; or, grouped (`groups`: count, assigned), of the expert
    `block.y`, a tile of ROW_TILE of its assignments at a time, each loaded weight vector serving the tile. Lane
    0 writes each valid (column, assignment) through `epilogue(assignment, column, sums)`; with `norm` (scale,
    epsilon) x's row is normed in the prologue as `_projection`'s (its 1/rms times the sums)."""
    columns, depth, top_k, by_assignment = shape
    held = shapes_of(stacked[0])[0]
    _, warp, lane = _warp_and_lane(b)
    column = b.add(b.mul(b.block("x"), WARPS), warp)
    valid = b.both(b.cmp("ult", column, columns), b.cmp("eq", lane, 0))
    clamped = b.min(column, columns - 1)  # an idle warp reads a real row and writes nothing

    def x_row(a: SSAValue) -> SSAValue:
        return a if by_assignment else b.div(a, top_k)

    if not groups:
        a = b.block("y")
        expert = b.to_index(b.load(chosen, [b.div(a, top_k), b.rem(a, top_k)]))

        def product() -> None:
            dots, inverse = _dots(b, x, [(w, [expert, clamped]) for w in stacked], [x_row(a)], depth, lane, norm)
            sums = [b.fmul(d[0], inverse[0]) if inverse else d[0] for d in dots]
            b.when(valid, lambda: epilogue(a, column, sums))

        b.when(b.cmp("ult", expert, held), product)
        return
    count, assigned = groups
    expert = b.block("y")
    found = b.to_index(b.load(count, [expert]))

    def tile(i: SSAValue, _: list[SSAValue]) -> list[SSAValue]:
        last = b.sub(found, 1)
        picked = [b.to_index(b.load(assigned, [expert, b.min(b.add(i, t) if t else i, last)])) for t in range(ROW_TILE)]
        rows = [x_row(a) for a in picked]
        dots, inverse = _dots(b, x, [(w, [expert, clamped]) for w in stacked], rows, depth, lane, norm)
        for t, a in enumerate(picked):
            ok = b.both(valid, b.cmp("ult", b.add(i, t) if t else i, found))
            sums = [b.fmul(d[t], inverse[t]) if inverse else d[t] for d in dots]
            b.when(ok, partial(epilogue, a, column, sums))
        return []

    b.loop(0, found, ROW_TILE, [], tile)


def shapes_of(value: SSAValue) -> tuple[int, ...]:
    return tuple(value.type.get_shape())  # type: ignore[attr-defined]


def experts_gate_up(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float | None = None) -> None:
    """silu(gate_e x) * up_e x of each chosen expert e, a warp a column of both (`_expert_products`), into `act`
    [rows * top_k, intermediate] at the assignment's row; with `epsilon` x's RMS norm folded into the prologue (the
    norm's scale after up)."""
    x, chosen, gate, up, *rest = args
    scale = rest.pop(0) if epsilon is not None else None
    act, *groups = rest
    _, hidden = shapes[0]
    top_k = shapes[1][1]
    inter = shapes[2][1]

    def write(a: SSAValue, column: SSAValue, sums: list[SSAValue]) -> None:
        b.store(glu(b, sums[0], sums[1]), act, [a, column])

    norm = (scale, epsilon) if scale is not None and epsilon is not None else None
    _expert_products(b, x, chosen, [gate, up], groups, (inter, hidden, top_k, False), write, norm)


def experts_down(b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]]) -> None:
    """down_e of each assignment's gated product (`act`'s row), times its weight, into `partial` [rows * top_k,
    hidden] (`_expert_products`, a warp a column of down)."""
    act, chosen, weights, down, partial_sums, *groups = args
    top_k = shapes[1][1]
    hidden, inter = shapes[3][1], shapes[3][2]

    def write(a: SSAValue, column: SSAValue, sums: list[SSAValue]) -> None:
        weight = b.load(weights, [b.div(a, top_k), b.rem(a, top_k)])
        b.store(b.fmul(sums[0], weight), partial_sums, [a, column])

    _expert_products(b, act, chosen, [down], groups, (hidden, inter, top_k, True), write)


def experts_sum(
    b: Body, args: list[SSAValue], shapes: list[tuple[int, ...]], held: int, residual: bool = False,
    residual_chip: int | None = None,
) -> None:  # fmt: skip
    """A thread a column of a row: the sum from zero of the row's chosen experts' weighted products in ascending
    expert index (the router wrote them in that order), those another chip holds left out (a partial sum); with
    `residual`, the residual plus that sum (on chip `residual_chip` alone in a split step: the all-reduce after it
    completes the residual stream, as `linear`'s)."""
    partial_sums, chosen, *rest, out = args
    added = rest[0] if residual else None
    chip = rest[-1] if residual_chip is not None else None
    rows, hidden = shapes[-1]
    top_k = shapes[1][1]
    column = b.add(b.mul(b.block("x"), THREADS), b.thread())
    row = b.block("y")

    def body() -> None:
        total = b.fconst(0.0)
        for slot in range(top_k):
            here = b.cmp("ult", b.to_index(b.load(chosen, [row, slot])), held)
            value = b.load(partial_sums, [b.add(b.mul(row, top_k), slot), column])
            total = b.select(here, b.fadd(total, value), total)
        if added is not None:
            extra = b.load(added, [row, column])
            if chip is not None:
                ours = b.op(
                    arith.CmpiOp(b.load(chip, [0]), b.op(arith.ConstantOp(IntegerAttr(residual_chip, i64))), "eq")
                )
                extra = b.select(ours, extra, b.fconst(0.0))
            total = b.fadd(extra, total)
        b.store(total, out, [row, column])

    b.when(b.cmp("ult", column, hidden), body)
