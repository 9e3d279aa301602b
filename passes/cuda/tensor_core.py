"""The CUDA lane's tensor-core kernels: tiled bf16 matrix products and flash attention for prefill chunks and batches.

A prompt of hundreds of rows makes each projection a matrix product, bound by arithmetic rather than by memory, so
`convert-cuda-kernels-to-gpu` hands `cuda.linear` and `cuda.gate_up` with a bf16 weight and more than one row to
this module (`handles`, `kinds`); f32 images keep the exact CUDA-core kernels, so the token checks stand on no
tensor core. A chunk of more than 64 rows takes Hopper's wgmma fed by TMA (`hopper.py`, built through `kinds`); a
batch or short chunk of 2-64 rows takes the kernel below, the sm80-style multistage GEMM that CUTLASS
(`cutlass/gemm/threadblock/mma_multistage.h`) and FlashAttention-2 build on Hopper's warp-level tensor cores:

* a block of 4 warps owns a `BLOCK_ROWS` x `block_columns` tile of the output; the grid's x axis walks the row
  tiles fastest, so the blocks that share a tile of weight columns run side by side and read it from HBM once (a
  rasterised order: the weights stream once per chunk while the activations, far smaller, stay in L2);
* each `DEPTH` (32) slice of the activations (f32, as the lane keeps them) and of the weight rows (bf16) is staged in
  shared memory by 16-byte `cuda.cp_async` copies, double-buffered (`STAGES`): the copy of slice k+1 is in flight
  while the warps multiply slice k (commit, wait for all but the newest group, barrier);
* a warp owns a 32 x (block_columns/2) tile: two m16 rows of `cuda.mma_sync` m16n8k16 (bf16 in, f32 accumulate);
  its B fragments come from the weight tile through `cuda.ldmatrix` x4 (two n8 tiles a load: weight rows are the
  B matrix's columns, so no transpose), its A fragments from the f32 tile by `cuda.load_bf16x2` (round to nearest
  even, the rounding numpy's bf16-input product uses);
* shared rows are padded by 8 elements (80 bytes of bf16, 160 of f32) so ldmatrix's 8 rows and the fragment loads
  of a quarter warp fall in distinct banks;
* epilogues as in decode: the residual add (`linear_residual_tc`) and SiLU times up (`gate_up_tc`, both weights'
  tiles in one block, so the product is formed in registers).
* the RMS norm before a product as its prologue (`cuda-fold-prefill-norms`; `norm_linear_tc`, `norm_gate_up_tc`):
  the block computes its rows' inverse RMS from global memory as `cuda.rms_norm` does (same bits) while slice 0's
  copies fly, and `cuda.load_norm_bf16x2` scales each A pair by it and by the norm's weight before rounding it.

Where this differs from CUTLASS and cuBLAS on Hopper (for batches; longer chunks take `hopper.py`): `mma.sync`
rather than `wgmma` with TMA (Hopper's warpgroup MMA reaches about twice the throughput); 2 stages rather than 3-5
(static shared memory stops at 48 KB a block and the lane's activations are f32, twice the bytes of a bf16 A tile);
A is rounded to bf16 from an f32 tile in shared memory rather than read as bf16 (the lane's activations are f32; the
folded norm scales them there).
See docs/cuda.md.

Flash attention over a prefill chunk (`_flash_attention`, FlashAttention-2's forward on the same ops) takes
`cuda.attention` over a bf16 cache; `cuda-fuse-prefill-attention`, run before the conversion, folds the chunk's
`cuda.rope_cache_write` and query `cuda.rope` into it (`cuda.prefill_attention`), so the new keys and values are
written to the cache in the attention's own pass. This module builds the kernels' `gpu.func` bodies (part of
`convert-cuda-kernels-to-gpu`); the emitter prints the ops (`emit_cuda`), the build report models each product's HBM
bytes (`build.product_traffic`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdsl.dialects import gpu
from xdsl.dialects.builtin import BFloat16Type, IntegerAttr, MemRefType, bf16, f32, i64
from xdsl.ir import Attribute, SSAValue

from logos_ir.dialects import cuda
from logos_ir.passes.cuda import hopper
from logos_ir.passes.cuda.thread_code import Kind, glu, rotated, vector_width

WARP = cuda.WARP
THREADS = 128  # 4 warps, as every kernel of the lane
BLOCK_ROWS = 64  # rows of the output a block owns (2 warps of 32)
DEPTH = 32  # the K slice staged a step
STAGES = 2  # shared-memory buffers a tile (double-buffered)
PAD = 8  # elements a shared row is padded by
MMA_M, MMA_N, MMA_K = 16, 8, 16
LINEAR_COLUMNS = 64  # output columns a block owns: one weight (128 needs 64 accumulators: spills at 4 blocks an SM)
GATE_UP_COLUMNS = 64  # ... with two weights (gate and up), the same registers of accumulators


def block_columns(weights: int) -> int:
    return LINEAR_COLUMNS if weights == 1 else GATE_UP_COLUMNS


def _shape(kind: Attribute) -> tuple[int, ...]:
    assert isinstance(kind, MemRefType)
    return tuple(kind.get_shape())


def handles(op: cuda.KernelOp) -> bool:
    """Whether `op` runs on tensor cores: a projection (`cuda.linear`, `cuda.gate_up`) of more than one row with
    bf16 weights whose depth is whole slices, or a prefill chunk's attention over a bf16 cache (one sequence,
    head_dim a multiple of 16)."""
    if isinstance(op, cuda.PrefillAttentionOp):
        return True
    if isinstance(op, cuda.AttentionOp):
        return flash_attention_fits(op)
    if not isinstance(op, cuda.LinearOp | cuda.GateUpOp):
        return False
    if getattr(op, "residual_chip", None) is not None:  # a split program's partial sum stays on CUDA cores
        return False
    weight = op.ins[1].type
    assert isinstance(weight, MemRefType)
    rows, depth = _shape(op.ins[0].type)
    return isinstance(weight.element_type, BFloat16Type) and rows > 1 and depth % DEPTH == 0


def grid(rows: int, columns: int, weights: int) -> tuple[int, int, int]:
    """Row tiles on x (fastest: the blocks sharing a weight tile are launched together), column tiles on y."""
    return (-(-rows // BLOCK_ROWS), -(-columns // block_columns(weights)), 1)


def flash_attention_fits(op: cuda.AttentionOp) -> bool:
    """A prefill chunk's attention over a bf16 cache, head_dim a multiple of 16, with no window, scale or soft-cap
    (such a chunk keeps the split kernel, whose range is bounded to each row's window and which scales and caps
    each score)."""
    if op.window is not None or op.scale is not None or op.softcap is not None:
        return False
    keys = op.ins[1].type
    assert isinstance(keys, MemRefType)
    rows = _shape(op.ins[0].type)[0]
    cache = tuple(keys.get_shape())
    return isinstance(keys.element_type, BFloat16Type) and len(cache) == 3 and rows > 1 and cache[-1] % MMA_K == 0


def kinds(op: cuda.KernelOp) -> list[Any]:
    """The one launch of a tensor-core kernel (`thread_code.Kind`)."""

    if isinstance(op, cuda.PrefillAttentionOp):
        fused = lambda s: (-(-s[0][0] // ATTENTION_ROWS), s[0][1] // s[7][-1], 1)  # noqa: E731 (row tiles, heads)
        body = lambda b, a, s: _flash_attention(b, a, s, fused=True)  # noqa: E731
        return [Kind("prefill_attention_tc", tuple(range(9)), fused, body)]
    if isinstance(op, cuda.AttentionOp):
        blocks = lambda s: (-(-s[0][0] // ATTENTION_ROWS), s[0][1] // s[1][-1], 1)  # noqa: E731 (row tiles, heads)
        return [Kind("attention_prefill_tc", (0, 1, 2, 3, 4), blocks, _flash_attention)]
    epsilon = op.epsilon.value.data if op.epsilon is not None else None
    if hopper.handles(op):
        return _hopper_kinds(op, epsilon)
    prefix = "norm_" if epsilon is not None else ""
    operands = tuple(range(len(op.ins) + 1))
    biased = op.biased is not None  # type: ignore[attr-defined]
    bias = "bias_" if biased else ""
    if isinstance(op, cuda.GateUpOp):
        gelu = op.gelu_tanh is not None
        bias = bias + ("gelu_tanh_" if gelu else "")
        body = lambda b, a, s: _gate_up(b, a, s, epsilon, biased, gelu)  # noqa: E731
        return [
            Kind(prefix + "gate_up_" + bias + "tc", operands, lambda s: grid(s[0][0], s[1][0], 2), body, (epsilon,))
        ]
    assert isinstance(op, cuda.LinearOp)
    stem = "linear_" + bias + ("residual_tc" if op.has_residual() else "tc")
    body = lambda b, a, s: _linear(b, a, s, epsilon, biased)  # noqa: E731
    return [Kind(prefix + stem, operands, lambda s: grid(s[0][0], s[1][0], 1), body, (epsilon,))]


def _hopper_kinds(op: cuda.KernelOp, epsilon: float | None) -> list[Any]:
    """The bf16 conversion of A (the norm folded in) into the scratch the lowering appends after the op's
    buffers, then the wgmma product reading it (`hopper`)."""
    count = len(op.ins) + 1  # the scratch's operand index
    convert_threads = hopper.CONVERT_THREADS
    rows_grid = lambda s: (-(-s[0][0] // hopper.CONVERT_ROWS), 1, 1)  # noqa: E731
    ins = (0, len(op.ins) - 1, count) if epsilon is not None else (0, count)
    stem = "norm_to_bf16" if epsilon is not None else "to_bf16"
    convert = Kind(stem, ins, rows_grid, lambda b, a, s: hopper.to_bf16(b, a, s, epsilon), (epsilon,), convert_threads)
    biased = op.biased is not None  # type: ignore[attr-defined]
    if isinstance(op, cuda.GateUpOp):
        grid = lambda s: hopper.grid(s[0][0], s[1][0], 2)  # noqa: E731
        biases = (3, 4) if biased else ()
        gelu = op.gelu_tanh is not None
        stem = "gate_up_" + ("bias_" if biased else "") + ("gelu_tanh_" if gelu else "") + "wgmma"
        body = lambda b, a, s: hopper.gate_up(b, a, s, biased, gelu)  # noqa: E731
        product = Kind(stem, (count, 1, 2, *biases, count - 1), grid, body, (), hopper.THREADS)
        return [convert, product]
    assert isinstance(op, cuda.LinearOp)
    grid = lambda s: hopper.grid(s[0][0], s[1][0], 1)  # noqa: E731
    residual = (2,) if op.has_residual() else ()
    bias = (2 + len(residual),) if biased else ()
    operands = (count, 1, *residual, *bias, count - 1)
    stem = "linear_" + ("bias_" if biased else "") + ("residual_wgmma" if residual else "wgmma")
    body = lambda b, a, s: hopper.linear(b, a, s, biased)  # noqa: E731
    return [convert, Kind(stem, operands, grid, body, (), hopper.THREADS)]


# -- the product ---------------------------------------------------------------------------------------------------


def _shared(b: Any, element: Attribute, rows: int, name: str) -> SSAValue:
    kind = MemRefType(element, [STAGES, rows, DEPTH + PAD], memory_space=IntegerAttr(cuda.SHARED, i64))
    tile = b.op(cuda.SharedMemoryOp(kind))
    tile.name_hint = name
    return tile


class _Product:
    """The tiles, fragments and pipeline of one tensor-core product kernel (see the module docstring)."""

    def __init__(
        self,
        b: Any,
        x: SSAValue,
        weights: list[SSAValue],
        shape: tuple[int, int, int],
        norm: tuple[SSAValue, float] | None = None,
    ):
        self.b, self.x, self.weights, self.norm = b, x, weights, norm
        self.inverses: list[SSAValue] = []
        self.rows, self.columns, self.depth = shape
        self.block_columns = block_columns(len(weights))
        self.warp_columns = self.block_columns // 2
        tid = b.thread()
        self.tid, warp, self.lane = tid, b.div(tid, WARP), b.rem(tid, WARP)
        self.first_row = b.mul(b.block("x"), BLOCK_ROWS)
        self.first_column = b.mul(b.block("y"), self.block_columns)
        self.warp_row = b.mul(b.div(warp, 2), 32)  # warps 2 x 2 over the block tile
        self.warp_column = b.mul(b.rem(warp, 2), self.warp_columns)
        self.group, self.pair = b.div(self.lane, 4), b.rem(self.lane, 4)  # the PTX ISA's groupID, threadID_in_group
        self.a_tile = _shared(b, f32, BLOCK_ROWS, "x_tile")
        names = ["weight_tile"] if len(weights) == 1 else ["gate_tile", "up_tile"]
        self.w_tiles = [_shared(b, bf16, self.block_columns, name) for name in names]

    # staging: 16-byte asynchronous copies, every thread a few chunks of each tile
    def stage(self, stage: SSAValue | int, k: SSAValue | int) -> None:
        self._copy(self.x, self.a_tile, self.first_row, self.rows, BLOCK_ROWS, 4, stage, k)
        for weight, tile in zip(self.weights, self.w_tiles, strict=True):
            self._copy(weight, tile, self.first_column, self.columns, self.block_columns, 8, stage, k)

    def _copy(self, source, tile, first: SSAValue, limit: int, rows: int, vector: int, stage, k) -> None:
        """Thread t copies chunk t of each THREADS chunks: the same column of rows t / per_row + i * row_step."""
        b = self.b
        per_row = DEPTH // vector
        row_step = THREADS // per_row
        top, column = b.div(self.tid, per_row), b.mul(b.rem(self.tid, per_row), vector)
        depth = b.add(column, k) if not isinstance(k, int) or k else column
        for i in range(rows // row_step):
            row = b.add(top, i * row_step) if i else top
            where = b.add(first, row)
            valid = b.cmp("ult", where, limit)
            src = [b.min(where, limit - 1), depth]
            b.op(cuda.CpAsyncOp(tile, [b._ix(stage), row, column], source, src, valid))

    def inverse_rms(self) -> None:
        """The folded norm's prologue: 1/sqrt(mean(x^2) + epsilon) of the 4 rows whose A elements this thread
        loads (rows group, group + 8 of each m16 tile of its warp). A warp walks its 32 rows of the block tile, its
        lanes summing a row's squares from global memory with fma exactly as `cuda.rms_norm` does (the same lane
        split, vector width and shuffle tree, so the same f32 bits), and each thread keeps the rows it owns."""

        assert self.norm is not None
        b, (scale, epsilon) = self.b, self.norm
        del scale
        vector = vector_width(self.depth, f32)
        owned = [b.add(self.group, m * MMA_M + h * 8) if m or h else self.group for m in range(2) for h in range(2)]

        def one(i: SSAValue, held: list[SSAValue]) -> list[SSAValue]:
            row = b.min(b.add(self.first_row, b.add(self.warp_row, i)), self.rows - 1)

            def squares(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
                total = acc[0]
                for value in b.vload(self.x, [row, k], vector):
                    total = b.fma(value, value, total)
                return [total]

            (total,) = b.loop(b.mul(self.lane, vector), self.depth, WARP * vector, [b.fconst(0.0)], squares)
            mean = b.fmul(b.warp_sum(total), b.fconst(1.0 / self.depth))
            inverse = b.fdiv(b.fconst(1.0), b.sqrt(b.fadd(mean, b.fconst(epsilon))))
            return [b.select(b.cmp("eq", i, slot), inverse, kept) for slot, kept in zip(owned, held, strict=True)]

        self.inverses = b.loop(0, 2 * MMA_M, 1, [b.fconst(0.0)] * 4, one)

    # fragments of one k16 step of a stage
    def a_fragments(self, stage: SSAValue, kk: int, k: SSAValue | None = None) -> list[list[SSAValue]]:
        """The A fragments (bf16 pairs) of both m16 tiles; with a folded norm each f32 pair is scaled by its row's
        inverse RMS and the norm's scale at depth k + column (`cuda.load_norm_bf16x2`) as it is rounded."""
        b = self.b
        out = []
        left = b.add(b.mul(self.pair, 2), kk)
        right = b.add(left, 8)
        scales: dict[int, list[SSAValue]] = {}
        if self.norm is not None:
            assert k is not None
            scales = {side: b.vload(self.norm[0], [b.add(k, column)], 2) for side, column in enumerate((left, right))}
        for tile in range(2):
            top = b.add(b.add(self.warp_row, tile * MMA_M), self.group)
            low = b.add(top, 8)
            places = [(top, left, 0, 0), (low, left, 1, 0), (top, right, 0, 1), (low, right, 1, 1)]
            if self.norm is None:
                out.append([b.op(cuda.LoadBF16x2Op(self.a_tile, [stage, r, c])) for r, c, _, _ in places])
                continue
            out.append(
                [
                    b.op(cuda.LoadNormBF16x2Op(self.a_tile, [stage, r, c], self.inverses[tile * 2 + h], *scales[side]))
                    for r, c, h, side in places
                ]
            )
        return out

    def b_fragments(self, tile: SSAValue, stage: SSAValue, kk: int) -> list[list[SSAValue]]:
        """ldmatrix x4: lanes 0-7 address rows n0..n0+7 at k, 8-15 the same rows at k+8, 16-31 rows n0+8.. likewise;
        registers (0, 1) are the B fragment of n tile n0, (2, 3) of n0+8."""
        b = self.b
        row = b.add(b.mul(b.div(self.lane, 16), 8), b.rem(self.lane, 8))
        column = b.add(b.mul(b.rem(b.div(self.lane, 8), 2), 8), kk)
        out = []
        for pair in range(self.warp_columns // 16):
            n = b.add(b.add(self.warp_column, pair * 16), row)
            load = cuda.LdmatrixOp(tile, [stage, n, column], 4)
            b.op(load)
            r = list(load.results)
            out += [r[0:2], r[2:4]]
        return out

    def run(self) -> list[list[SSAValue]]:
        """The pipelined main loop; the accumulators, by weight, of each (m tile, n tile) fragment in order."""
        b = self.b
        slices = self.depth // DEPTH
        n_tiles = self.warp_columns // MMA_N
        count = len(self.weights) * 2 * n_tiles * 4
        self.stage(0, 0)
        b.op(cuda.CpAsyncCommitOp())
        if self.norm is not None:  # while the first slice is in flight
            self.inverse_rms()

        def step(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
            following = b.add(k, 1)
            b.when(
                b.cmp("ult", following, slices),
                lambda: self.stage(b.rem(following, STAGES), b.mul(following, DEPTH)),
            )
            b.op(cuda.CpAsyncCommitOp())  # always a group (empty on the last slice), so the wait's count holds
            b.op(cuda.CpAsyncWaitOp(1))  # slice k has landed (only slice k+1's group may be in flight)
            b.op(gpu.BarrierOp())
            stage = b.rem(k, STAGES)
            start = b.mul(k, DEPTH) if self.norm is not None else None
            acc = list(acc)
            for kk in range(0, DEPTH, MMA_K):
                a = self.a_fragments(stage, kk, start)
                for w, tile in enumerate(self.w_tiles):
                    frags = self.b_fragments(tile, stage, kk)
                    for m in range(2):
                        for n in range(n_tiles):
                            at = ((w * 2 + m) * n_tiles + n) * 4
                            mma = cuda.MmaSyncOp(a[m], frags[n], acc[at : at + 4])
                            b.op(mma)
                            acc[at : at + 4] = list(mma.results)
            b.op(gpu.BarrierOp())  # every warp is done with this stage before it is refilled
            return acc

        zero = b.fconst(0.0)
        acc = b.loop(0, slices, 1, [zero] * count, step)
        per_weight = len(acc) // len(self.weights)
        return [acc[w * per_weight : (w + 1) * per_weight] for w in range(len(self.weights))]

    def epilogue(self, acc: list[list[SSAValue]], write: Callable[[SSAValue, SSAValue, list[SSAValue]], None]) -> None:
        """Each accumulator to its output element (the C fragment layout), through `write` where it lies inside."""
        b = self.b
        n_tiles = self.warp_columns // MMA_N
        for m in range(2):
            top = b.add(b.add(b.add(self.first_row, self.warp_row), m * MMA_M), self.group)
            for n in range(n_tiles):
                left = b.add(b.add(b.add(self.first_column, self.warp_column), n * MMA_N), b.mul(self.pair, 2))
                for register in range(4):
                    row = b.add(top, 8) if register >= 2 else top
                    column = b.add(left, 1) if register % 2 else left
                    values = [per_weight[(m * n_tiles + n) * 4 + register] for per_weight in acc]
                    inside = b.both(b.cmp("ult", row, self.rows), b.cmp("ult", column, self.columns))
                    b.when(inside, lambda row=row, column=column, values=values: write(row, column, values))


def _linear(
    b: Any, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float | None = None, biased: bool = False
) -> None:
    x, weight, *residual, out = args
    norm = (residual.pop(), epsilon) if epsilon is not None else None
    bias = residual.pop() if biased else None
    rows, depth = shapes[0]
    product = _Product(b, x, [weight], (rows, shapes[1][0], depth), norm)

    def write(row: SSAValue, column: SSAValue, values: Sequence[SSAValue]) -> None:
        value = values[0] if bias is None else b.fadd(values[0], b.load(bias, [column]))
        value = value if not residual else b.fadd(b.load(residual[0], [row, column]), value)
        b.store(value, out, [row, column])

    product.epilogue(product.run(), write)


def _gate_up(
    b: Any, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float | None = None, biased: bool = False,
    gelu_tanh: bool = False,
) -> None:  # fmt: skip
    x, gate, up, *rest, out = args
    biases = rest[:2] if biased else []
    rest = rest[2:] if biased else rest
    norm = (rest[0], epsilon) if epsilon is not None else None
    rows, depth = shapes[0]
    product = _Product(b, x, [gate, up], (rows, shapes[1][0], depth), norm)

    def write(row: SSAValue, column: SSAValue, values: Sequence[SSAValue]) -> None:
        g, u = values
        if biases:
            g, u = b.fadd(g, b.load(biases[0], [column])), b.fadd(u, b.load(biases[1], [column]))
        b.store(glu(b, g, u, gelu_tanh), out, [row, column])  # as the decode kernel and the reference

    product.epilogue(product.run(), write)


# -- flash attention over the prompt ------------------------------------------------------------------------------

ATTENTION_ROWS = 64  # query rows a block: 16 a warp, one m16 tile
KV_TILE = 16  # cache positions a step: one k16 step of P V, two n8 tiles of Q K^T
NEG_BIG = -3.0e38  # a finite "minus infinity", as the decode kernels use


def _flash_attention(b: Any, args: list[SSAValue], shapes: list[tuple[int, ...]], fused: bool = False) -> None:
    """FlashAttention-2's forward over a prefill chunk, on mma.sync: a block per (64 query rows, query head), a warp
    per 16 rows. The query fragments are loaded once (rounded to bf16); the cache's keys and values of the head's
    KV head stream through shared memory in tiles of KV_TILE positions, double-buffered by cp.async, up to the
    block's last row's position (causal). Per tile: S = Q K^T on tensor cores (K tile rows are B's columns:
    ldmatrix), scaled, masked past each row's own position, the online softmax on the accumulator fragments (a
    row's 4 values across the 4 lanes of a quad, maxima by 2 shuffles), P rounded to bf16 straight from the
    accumulators into A fragments (FlashAttention-2's register reuse), O += P V with V's fragments by ldmatrix
    .trans. Unfused, the chunk's keys and values are in the cache already (`cuda.rope_cache_write` ran before) and
    the queries rotated (`cuda.rope`); `fused` (`cuda.prefill_attention`), the kernel rotates the queries as it
    stages them, and takes the chunk's own positions of each K/V tile from the key and value rows (rotated, rounded
    to bf16), writing them into the cache in the same pass (the first query head of each KV group, by the block
    whose rows they are); only positions before the chunk are copied from the cache."""
    if fused:
        query, key, value, positions, cos, sin, out, keys, values = args
        chunk = (key, value, (cos, sin))
        cache_shape = shapes[7]
    else:
        query, keys, values, positions, out = args
        chunk = None
        cache_shape = shapes[1]
    rows, width = shapes[0]
    kv_heads, ctx, head_dim = cache_shape
    group = (width // head_dim) // kv_heads
    tid = b.thread()
    warp, lane = b.div(tid, WARP), b.rem(tid, WARP)
    quad, pair = b.div(lane, 4), b.rem(lane, 4)
    head = b.block("y")
    kv_head = b.div(head, group)
    first = b.mul(b.block("x"), ATTENTION_ROWS)
    top = b.add(b.add(first, b.mul(warp, MMA_M)), quad)
    low = b.add(top, 8)
    tops = [b.min(top, rows - 1), b.min(low, rows - 1)]  # rows past the chunk read the last row, write nothing
    lengths = [b.to_index(b.load(positions, [r])) for r in tops]  # keys a row attends: positions 0 .. p - 1
    stop = b.to_index(b.load(positions, [b.min(b.add(first, ATTENTION_ROWS - 1), rows - 1)]))
    tiles = b.div(b.add(stop, KV_TILE - 1), KV_TILE)
    column0 = b.add(b.mul(head, head_dim), b.mul(pair, 2))
    rope = None if chunk is None else (chunk[2], positions)
    q_tile = _query_tile(b, tid, query, first, head, (rows, head_dim), rope)
    k_tile, v_tile = (_kv_tile(b, name, head_dim) for name in ("key_tile", "value_tile"))
    if chunk is not None:
        chunk_start = b.sub(b.to_index(b.load(positions, [0])), 1)  # the cache position of the chunk's row 0
        writer = b.cmp("eq", b.rem(head, group), 0)
        ours = (first, writer)

    def stage(slot: SSAValue | int, start: SSAValue | int) -> None:
        if chunk is None:
            for tile, cache in ((k_tile, keys), (v_tile, values)):
                _copy_positions(b, tid, tile, cache, kv_head, slot, start, (ctx, head_dim))
            return
        sizes = (rows, ctx, head_dim)
        _stage_fused(b, tid, (k_tile, v_tile), (keys, values), chunk, kv_head, slot, start, chunk_start, ours, sizes)

    stage(0, 0)
    b.op(cuda.CpAsyncCommitOp())
    k_row = b.add(b.mul(b.div(lane, 16), 8), b.rem(lane, 8))  # ldmatrix: K rows (positions) are B's columns
    k_col = b.mul(b.rem(b.div(lane, 8), 2), 8)
    v_row = b.add(b.mul(b.rem(b.div(lane, 8), 2), 8), b.rem(lane, 8))  # .trans: V rows are B's k
    v_col = b.mul(b.div(lane, 16), 8)
    q_row = b.add(b.add(b.mul(warp, MMA_M), b.mul(b.rem(b.div(lane, 8), 2), 8)), b.rem(lane, 8))  # A by ldmatrix
    q_col = b.mul(b.div(lane, 16), 8)
    scale = b.fconst(1.0 / head_dim**0.5)
    o_tiles = head_dim // MMA_N

    def tile_step(j: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
        m, total, o = state[0:2], state[2:4], state[4:]
        following = b.add(j, 1)
        b.when(
            b.cmp("ult", following, tiles),
            lambda: stage(b.rem(following, STAGES), b.mul(following, KV_TILE)),
        )
        b.op(cuda.CpAsyncCommitOp())
        b.op(cuda.CpAsyncWaitOp(1))
        b.op(gpu.BarrierOp())
        slot, start = b.rem(j, STAGES), b.mul(j, KV_TILE)
        zero = b.fconst(0.0)
        scores = [zero] * 8  # two n8 tiles of positions x 4 registers
        for step in range(head_dim // MMA_K):
            q_load = cuda.LdmatrixOp(q_tile, [q_row, b.add(q_col, step * MMA_K) if step else q_col], 4)
            b.op(q_load)
            q = list(q_load.results)
            load = cuda.LdmatrixOp(k_tile, [slot, k_row, b.add(k_col, step * MMA_K) if step else k_col], 4)
            b.op(load)
            r = list(load.results)
            for n in range(2):
                mma = cuda.MmaSyncOp(q, r[2 * n : 2 * n + 2], scores[4 * n : 4 * n + 4])
                b.op(mma)
                scores[4 * n : 4 * n + 4] = list(mma.results)
        base = b.add(start, b.mul(pair, 2))
        for n in range(2):
            for register in range(4):
                place = b.add(base, n * MMA_N + register % 2) if n or register % 2 else base
                inside = b.cmp("ult", place, lengths[register // 2])
                scaled = b.fmul(scores[4 * n + register], scale)
                scores[4 * n + register] = b.select(inside, scaled, b.fconst(NEG_BIG))
        new_m, fades = [], []
        for half in range(2):  # row top (registers 0, 1 of each n tile), row low (2, 3)
            mine = [scores[4 * n + 2 * half + i] for n in range(2) for i in range(2)]
            high = mine[0]
            for value in mine[1:]:
                high = b.fmax(high, value)
            for offset in (1, 2):  # the quad's 4 lanes hold the row
                high = b.fmax(high, b.shuffle(high, offset))
            high = b.fmax(m[half], high)
            new_m.append(high)
            fades.append(b.exp(b.fsub(m[half], high)))
        p = [b.exp(b.fsub(scores[i], new_m[(i % 4) // 2])) for i in range(8)]
        totals = []
        for half in range(2):
            mine = [p[4 * n + 2 * half + i] for n in range(2) for i in range(2)]
            partial = b.fadd(b.fadd(mine[0], mine[1]), b.fadd(mine[2], mine[3]))
            totals.append(b.fadd(b.fmul(total[half], fades[half]), partial))
        o = [b.fmul(value, fades[(i % 4) // 2]) for i, value in enumerate(o)]
        a = [b.op(cuda.PackBF16x2Op(p[i], p[i + 1])) for i in (0, 2, 4, 6)]  # C layout of 2 n tiles = A layout
        for pair_index in range(head_dim // 16):
            column = b.add(v_col, pair_index * 16) if pair_index else v_col
            load = cuda.LdmatrixOp(v_tile, [slot, v_row, column], 4, transpose=True)
            b.op(load)
            r = list(load.results)
            for n in range(2):
                at = (2 * pair_index + n) * 4
                mma = cuda.MmaSyncOp(a, r[2 * n : 2 * n + 2], o[at : at + 4])
                b.op(mma)
                o[at : at + 4] = list(mma.results)
        b.op(gpu.BarrierOp())
        return [*new_m, *totals, *o]

    big, zero = b.fconst(NEG_BIG), b.fconst(0.0)
    state = b.loop(0, tiles, 1, [big, big, zero, zero, *[zero] * (o_tiles * 4)], tile_step)
    totals, o = state[2:4], state[4:]
    for half in range(2):
        for offset in (1, 2):
            totals[half] = b.fadd(totals[half], b.shuffle(totals[half], offset))
    for n in range(o_tiles):
        column = b.add(column0, n * MMA_N) if n else column0
        for register in range(4):
            row = (top, low)[register // 2]
            where = b.add(column, 1) if register % 2 else column
            value = b.fdiv(o[4 * n + register], totals[register // 2])
            b.when(b.cmp("ult", row, rows), lambda v=value, r=row, w=where: b.store(v, out, [r, w]))


def _query_tile(b: Any, tid: SSAValue, query: SSAValue, first: SSAValue, head: SSAValue, sizes, rope=None) -> SSAValue:
    """The block's queries of its head rounded to bf16 into shared memory once (the A fragments are then read by
    ldmatrix each step, which keeps 32 registers a thread free at head_dim 128), a bf16 pair a thread a step."""
    rows, head_dim = sizes
    kind = MemRefType(bf16, [ATTENTION_ROWS, head_dim + PAD], memory_space=IntegerAttr(cuda.SHARED, i64))
    tile = b.op(cuda.SharedMemoryOp(kind))
    tile.name_hint = "query_tile"
    pairs = head_dim // 2
    base = b.mul(head, head_dim)

    def one(i: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
        item = b.add(b.mul(i, THREADS), tid)
        row, column = b.div(item, pairs), b.mul(b.rem(item, pairs), 2)
        source = b.min(b.add(first, row), rows - 1)  # rows past the chunk: the last row's values, never written out
        if rope is None:
            pair = b.op(cuda.LoadBF16x2Op(query, [source, b.add(base, column)]))
        else:  # rotated at the row's position, as cuda.rope computes it, then rounded
            tables, positions = rope
            place = b.sub(b.to_index(b.load(positions, [source])), 1)
            at = b.add(base, column)
            low, high = (rotated(b, query, source, c, head_dim, tables, place)[0] for c in (at, b.add(at, 1)))
            pair = b.op(cuda.PackBF16x2Op(low, high))
        b.op(cuda.StoreBF16x2Op(pair, tile, [row, column]))
        return []

    b.loop(0, ATTENTION_ROWS * pairs // THREADS, 1, [], one)
    return tile


def _stage_fused(b: Any, tid, tiles, caches, chunk, kv_head, slot, start, chunk_start, ours, sizes) -> None:
    """One K/V tile of the fused kernel: positions before the chunk by cp.async from the cache, the chunk's own
    from its key and value rows (keys rotated at their position; both rounded to bf16 pairs) into shared memory and,
    by their writer block, into the cache; positions past the chunk zero."""
    rows, ctx, head_dim = sizes
    (k_tile, v_tile), (keys, values), (key, value, tables) = tiles, caches, chunk
    first, writer = ours

    def one(row: SSAValue, column: SSAValue, where: SSAValue) -> None:
        inside = b.both(b.cmp("uge", where, chunk_start), b.cmp("ult", where, b.add(chunk_start, rows)))
        outside = b.either(b.cmp("ult", where, chunk_start), b.cmp("uge", where, b.add(chunk_start, rows)))
        cached = b.both(b.cmp("ult", where, chunk_start), b.cmp("ult", where, ctx))
        source = [kv_head, b.min(where, ctx - 1), column]

        def copy() -> None:  # before the chunk: the cache; past it: zero-filled
            for tile, cache in ((k_tile, keys), (v_tile, values)):
                b.op(cuda.CpAsyncOp(tile, [b._ix(slot), row, column], cache, source, cached))

        def compute() -> None:
            line = b.min(b.sub(where, chunk_start), rows - 1)
            ours_row = b.both(b.cmp("uge", line, first), b.cmp("ult", line, b.add(first, ATTENTION_ROWS)))
            mine = b.both(writer, ours_row)
            base = b.mul(kv_head, head_dim)
            half = head_dim // 2
            partner = b.select(b.cmp("ult", column, half), b.add(column, half), b.sub(column, half))
            cos, sin = tables

            def put(got: list[SSAValue], tile: SSAValue, cache: SSAValue, d: SSAValue) -> None:
                for part in (0, 2):
                    at = b.add(d, part) if part else d
                    packed = b.op(cuda.PackBF16x2Op(got[part], got[part + 1]))
                    b.op(cuda.StoreBF16x2Op(packed, tile, [b._ix(slot), row, at]))
                    b.when(mine, lambda p=packed, at=at: b.op(cuda.StoreBF16x2Op(p, cache, [kv_head, where, at])))

            for quarter in (0, 4):  # 4 elements at a time: 16-byte loads, fewer registers live
                d = b.add(column, quarter) if quarter else column
                x = b.vload(key, [line, b.add(base, d)], 4)
                other = b.vload(key, [line, b.add(base, b.add(partner, quarter) if quarter else partner)], 4)
                turns = zip(x, other, b.vload(cos, [where, d], 4), b.vload(sin, [where, d], 4), strict=True)
                k = [b.fadd(b.fmul(xi, ci), b.fmul(oi, si)) for xi, oi, ci, si in turns]  # as cuda.rope rotates
                put(k, k_tile, keys, d)
                put(b.vload(value, [line, b.add(base, d)], 4), v_tile, values, d)

        b.when(outside, copy)
        b.when(inside, compute)

    _each_tile_chunk(b, tid, head_dim, start, one)


def _kv_tile(b: Any, name: str, head_dim: int) -> SSAValue:
    kind = MemRefType(bf16, [STAGES, KV_TILE, head_dim + PAD], memory_space=IntegerAttr(cuda.SHARED, i64))
    tile = b.op(cuda.SharedMemoryOp(kind))
    tile.name_hint = name
    return tile


def _copy_positions(b: Any, tid: SSAValue, tile: SSAValue, cache: SSAValue, kv_head: SSAValue, slot, start, sizes):
    """KV_TILE cache rows from `start` into `tile[slot]`, 16 bytes a thread a copy (positions past the cache
    zero-filled)."""
    ctx, head_dim = sizes

    def copy(row: SSAValue, column: SSAValue, where: SSAValue) -> None:
        valid = b.cmp("ult", where, ctx)
        source = [kv_head, b.min(where, ctx - 1), column]
        b.op(cuda.CpAsyncOp(tile, [b._ix(slot), row, column], cache, source, valid))

    _each_tile_chunk(b, tid, head_dim, start, copy)


def _each_tile_chunk(
    b: Any, tid: SSAValue, head_dim: int, start: Any, body: Callable[[SSAValue, SSAValue, SSAValue], None]
) -> None:
    """`body(row, column, where)` for each 16-byte chunk (8 bf16) of a KV_TILE x head_dim tile, one a thread a
    round (`where`: the row's cache position, `start` + row); a last round the threads outrun is guarded."""
    per_row = head_dim // 8
    chunks = KV_TILE * per_row
    for i in range(-(-chunks // THREADS)):
        item = b.add(tid, i * THREADS) if i else tid

        def one(item: SSAValue = item) -> None:
            row, column = b.div(item, per_row), b.mul(b.rem(item, per_row), 8)
            where = b.add(row, start) if not isinstance(start, int) or start else row
            body(row, column, where)

        if chunks % THREADS == 0 or (i + 1) * THREADS <= chunks:
            one()
        else:
            b.when(b.cmp("ult", item, chunks), one)
