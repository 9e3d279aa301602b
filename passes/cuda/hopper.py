"""The CUDA lane's Hopper (sm_90a) prefill products: wgmma fed by a TMA ring, warp-specialised.

A prefill chunk of more than `BATCH_ROWS` rows makes each projection a matrix product big enough for Hopper's
warpgroup MMA. `convert-cuda-kernels-to-gpu` hands such a `cuda.linear` / `cuda.gate_up` (bf16 weights, depth whole
`DEPTH` slices) to this module, which builds two launches:

* `to_bf16` / `norm_to_bf16`: the A operand in bf16 (a scratch `[rows, depth]` buffer), a warp a row; with the
  RMS norm folded, each element is round_bf16((x * inverse) * scale) with the inverse RMS summed exactly as
  `cuda.rms_norm` sums it (the same lane split and shuffle tree, so the same f32 bits as the mma.sync path's
  `cuda.load_norm_bf16x2`);
* the product (`linear_wgmma`, `linear_residual_wgmma`, `gate_up_wgmma`), CUTLASS 3's warp-specialised TMA
  pipeline (`KernelTmaWarpSpecialized`) on a 128 x 128 tile of the output (gate/up: 64 columns of each weight):
  - one producer thread (thread 0 of warp 8) walks the depth in `DEPTH` (64-element, 128-byte) slices: it waits
    for the ring slot's `empty` mbarrier, arms its `full` mbarrier with the slot's bytes (`arrive.expect_tx`) and
    issues `cp.async.bulk.tensor.2d` (TMA) copies of the A box (128 rows) and the weight box(es), 128B-swizzled,
    into the `STAGES`-deep ring; rows or columns past the tensor's edge are zero-filled by TMA;
  - two consumer warpgroups (warps 0-7), each owning 64 rows of the tile, wait for the slot's `full` phase, issue
    4 `wgmma.mma_async m64n128k16` (gate/up: 2 x m64n64k16) a slice from shared-memory descriptors (K-major,
    128B swizzle, stride 1024 bytes), commit, wait for the group and release the slot (`empty`, every consumer
    thread one arrival);
  - the epilogue writes each accumulator from the wgmma fragment layout (the residual add, SiLU times up).

Where this differs from CUTLASS: the consumers wait for each slice's wgmma group before releasing its slot
(`wgmma.wait_group 0`; CUTLASS keeps one group in flight and releases the slot before), and no `setmaxnreg`
(ptxas allocates 90-130 registers without it at one block an SM). See docs/cuda.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdsl.dialects import gpu
from xdsl.dialects.builtin import BFloat16Type, IntegerAttr, MemRefType, bf16, f32, i64
from xdsl.ir import Attribute, SSAValue

from logos_ir.dialects import cuda
from logos_ir.passes.cuda.thread_code import glu, vector_width

WARP = cuda.WARP
WARPGROUP = cuda.WARPGROUP
CONSUMERS = 2  # consumer warpgroups a block
CONSUMER_THREADS = CONSUMERS * WARPGROUP
THREADS = CONSUMER_THREADS + WARP  # + the producer warp
TILE_ROWS = CONSUMERS * 64  # m64 a warpgroup
TILE_COLUMNS = 128  # weight rows a block reads a slice (gate/up: 64 of each)
DEPTH = 64  # a slice: 64 bf16, one 128-byte swizzle row
STAGES = 4
SWIZZLE = 128
SWIZZLE_STRIDE = 1024  # 8 rows of 128 bytes: the descriptor's stride between 8-row core matrices
WGMMA_K = 16
BATCH_ROWS = 64  # chunks of at most this many rows stay on mma.sync (tiles sized to their rows)
CONVERT_ROWS = 4  # rows a block of the bf16 conversion (a warp a row)
CONVERT_THREADS = CONVERT_ROWS * WARP


def handles(op: Any) -> bool:
    """Whether a projection the tensor-core module took runs here: more rows than a batch, depth whole slices."""
    if not isinstance(op, cuda.LinearOp | cuda.GateUpOp):
        return False
    if getattr(op, "residual_chip", None) is not None:  # a split program's partial sum stays on CUDA cores
        return False
    weight = op.ins[1].type
    assert isinstance(weight, MemRefType)
    rows, depth = tuple(op.ins[0].type.get_shape())  # type: ignore[attr-defined]
    return isinstance(weight.element_type, BFloat16Type) and rows > BATCH_ROWS and depth % DEPTH == 0


def grid(rows: int, columns: int, weights: int) -> tuple[int, int, int]:
    """Row tiles on x (fastest: the blocks that share a weight tile run together), column tiles on y."""
    return (-(-rows // TILE_ROWS), -(-columns // (TILE_COLUMNS // weights)), 1)


def _shared(b: Any, element: Attribute, shape: list[int], name: str) -> SSAValue:
    tile = b.op(cuda.SharedMemoryOp(MemRefType(element, shape, memory_space=IntegerAttr(cuda.SHARED, i64))))
    tile.name_hint = name
    return tile


# -- the bf16 A operand ---------------------------------------------------------------------------------------


def to_bf16(b: Any, args: list[SSAValue], shapes: list[tuple[int, ...]], epsilon: float | None) -> None:
    """x (f32) to its bf16 image, a warp a row; with a folded norm, scaled by the row's inverse RMS and the norm's
    weight first (`cuda.load_norm_bf16x2`), the inverse summed as `cuda.rms_norm` sums it."""
    if epsilon is None:
        x, out = args
        scale = None
    else:
        x, scale, out = args
    rows, depth = shapes[0]
    tid = b.thread()
    lane = b.rem(tid, WARP)
    row = b.add(b.mul(b.block("x"), CONVERT_ROWS), b.div(tid, WARP))

    def convert() -> None:
        inverse = None if scale is None else _inverse_rms(b, x, row, lane, depth, epsilon)

        def pair(k: SSAValue, state: list[SSAValue]) -> list[SSAValue]:
            if inverse is None:
                value = b.op(cuda.LoadBF16x2Op(x, [row, k]))
            else:
                low, high = b.vload(scale, [k], 2)
                value = b.op(cuda.LoadNormBF16x2Op(x, [row, k], inverse, low, high))
            b.op(cuda.StoreBF16x2Op(value, out, [row, k]))
            return []

        b.loop(b.mul(lane, 2), depth, 2 * WARP, [], pair)

    b.when(b.cmp("ult", row, rows), convert)


def _inverse_rms(b: Any, x: SSAValue, row: SSAValue, lane: SSAValue, depth: int, epsilon: float) -> SSAValue:
    vector = vector_width(depth, f32)

    def squares(k: SSAValue, acc: list[SSAValue]) -> list[SSAValue]:
        total = acc[0]
        for value in b.vload(x, [row, k], vector):
            total = b.fma(value, value, total)
        return [total]

    (total,) = b.loop(b.mul(lane, vector), depth, WARP * vector, [b.fconst(0.0)], squares)
    mean = b.fmul(b.warp_sum(total), b.fconst(1.0 / depth))
    return b.fdiv(b.fconst(1.0), b.sqrt(b.fadd(mean, b.fconst(epsilon))))


# -- the product ----------------------------------------------------------------------------------------------


class _Pipeline:
    """The ring, barriers and roles of one wgmma product kernel (see the module docstring)."""

    def __init__(self, b: Any, a: SSAValue, weights: list[SSAValue], shape: tuple[int, int, int]):
        self.b, self.a, self.weights = b, a, weights
        self.rows, self.columns, self.depth = shape
        self.per_weight = TILE_COLUMNS // len(weights)
        self.tid = b.thread()
        self.warp, lane = b.div(self.tid, WARP), b.rem(self.tid, WARP)
        self.group, self.pair = b.div(lane, 4), b.rem(lane, 4)
        self.warpgroup = b.div(self.tid, WARPGROUP)
        self.first_row = b.mul(b.block("x"), TILE_ROWS)
        self.first_column = b.mul(b.block("y"), self.per_weight)
        self.a_ring = _shared(b, bf16, [STAGES, TILE_ROWS, DEPTH], "a_ring")
        self.b_ring = _shared(b, bf16, [STAGES, TILE_COLUMNS, DEPTH], "b_ring")
        self.full = _shared(b, i64, [STAGES], "full")
        self.empty = _shared(b, i64, [STAGES], "empty")
        self.consumer = b.cmp("ult", self.tid, CONSUMER_THREADS)
        self.producer = b.cmp("eq", self.tid, CONSUMER_THREADS)  # thread 0 of warp 8

    def init_barriers(self) -> None:
        b = self.b

        def init() -> None:
            for stage in range(STAGES):
                b.op(cuda.MbarrierInitOp(self.full, [b.const(stage)], 1))  # the producer's arrive.expect_tx
                b.op(cuda.MbarrierInitOp(self.empty, [b.const(stage)], CONSUMER_THREADS))
            b.op(cuda.FenceBarrierInitOp())

        b.when(b.cmp("eq", self.tid, 0), init)
        b.op(gpu.BarrierOp())

    def produce(self, k: SSAValue, stage: SSAValue, parity: SSAValue) -> None:
        """Slice k into ring slot `stage`: wait for the consumers to free it (the first round passes: parity 1 of
        a fresh barrier is complete), arm `full` with the slot's bytes, issue the TMA copies."""
        b = self.b
        b.op(cuda.MbarrierWaitOp(self.empty, [stage], b.sub(b.const(1), parity)))
        slot_bytes = (TILE_ROWS + TILE_COLUMNS) * DEPTH * 2
        b.op(cuda.MbarrierArriveOp(self.full, [stage], slot_bytes))
        column = b.mul(k, DEPTH)
        zero = b.const(0)
        box = (TILE_ROWS, DEPTH)
        b.op(
            cuda.TmaLoadOp(
                self.a_ring, [stage, zero, zero], self.full, [stage], self.a, [self.first_row, column], box, SWIZZLE
            )
        )
        for w, weight in enumerate(self.weights):
            at = [stage, b.const(w * self.per_weight), zero]
            box = (self.per_weight, DEPTH)
            b.op(cuda.TmaLoadOp(self.b_ring, at, self.full, [stage], weight, [self.first_column, column], box, SWIZZLE))

    def consume(self, stage: SSAValue, parity: SSAValue, acc: list[list[SSAValue]]) -> list[list[SSAValue]]:
        """The slot's wgmma ops once its copies have landed; the slot released when their group is done."""
        b = self.b
        b.op(cuda.MbarrierWaitOp(self.full, [stage], parity))
        b.op(cuda.WgmmaFenceOp())
        top = b.mul(self.warpgroup, 64)
        acc = [list(part) for part in acc]
        for kk in range(0, DEPTH, WGMMA_K):
            a = b.op(cuda.WgmmaDescriptorOp(self.a_ring, [stage, top, b.const(kk)], 16, SWIZZLE_STRIDE, SWIZZLE))
            for w in range(len(self.weights)):
                at = [stage, b.const(w * self.per_weight), b.const(kk)]
                desc = b.op(cuda.WgmmaDescriptorOp(self.b_ring, at, 16, SWIZZLE_STRIDE, SWIZZLE))
                mma = cuda.WgmmaOp(a, desc, acc[w], self.per_weight)
                b.op(mma)
                acc[w] = list(mma.results)
        b.op(cuda.WgmmaCommitOp())
        b.op(cuda.WgmmaWaitOp(0))
        b.op(cuda.MbarrierArriveOp(self.empty, [stage]))
        return acc

    def run(self) -> list[list[SSAValue]]:
        b = self.b
        self.init_barriers()
        width = self.per_weight // 2
        count = len(self.weights) * width

        def step(k: SSAValue, flat: list[SSAValue]) -> list[SSAValue]:
            stage, parity = b.rem(k, STAGES), b.rem(b.div(k, STAGES), 2)
            b.when(self.producer, lambda: self.produce(k, stage, parity))
            parts = [flat[w * width : (w + 1) * width] for w in range(len(self.weights))]

            def consumed() -> list[SSAValue]:
                return [v for part in self.consume(stage, parity, parts) for v in part]

            return b.choose(self.consumer, consumed, lambda: list(flat))

        flat = b.loop(0, self.depth // DEPTH, 1, [b.fconst(0.0)] * count, step)
        return [flat[w * width : (w + 1) * width] for w in range(len(self.weights))]

    def epilogue(self, acc: list[list[SSAValue]], write: Callable[[SSAValue, SSAValue, list[SSAValue]], None]) -> None:
        """Each accumulator to its output element by the wgmma D layout (warp w of the warpgroup: rows 16w + g and
        16w + g + 8; register 4i + j: column 8i + 2t + j % 2), through `write` where it lies inside."""
        b = self.b

        def out() -> None:
            top = b.add(b.add(self.first_row, b.mul(self.warpgroup, 64)), b.mul(b.rem(self.warp, 4), 16))
            top = b.add(top, self.group)
            for i in range(self.per_weight // 8):
                left = b.add(b.add(self.first_column, 8 * i), b.mul(self.pair, 2))
                for j in range(4):
                    row = b.add(top, 8) if j >= 2 else top
                    column = b.add(left, 1) if j % 2 else left
                    values = [part[4 * i + j] for part in acc]
                    inside = b.both(b.cmp("ult", row, self.rows), b.cmp("ult", column, self.columns))
                    b.when(inside, lambda row=row, column=column, values=values: write(row, column, values))

        b.when(self.consumer, out)


def linear(b: Any, args: list[SSAValue], shapes: list[tuple[int, ...]], biased: bool = False) -> None:
    a, weight, *residual, out = args
    bias = residual.pop() if biased else None
    rows, depth = shapes[0]
    pipeline = _Pipeline(b, a, [weight], (rows, shapes[1][0], depth))

    def write(row: SSAValue, column: SSAValue, values: Sequence[SSAValue]) -> None:
        value = values[0] if bias is None else b.fadd(values[0], b.load(bias, [column]))
        value = value if not residual else b.fadd(b.load(residual[0], [row, column]), value)
        b.store(value, out, [row, column])

    pipeline.epilogue(pipeline.run(), write)


def gate_up(
    b: Any, args: list[SSAValue], shapes: list[tuple[int, ...]], biased: bool = False, gelu_tanh: bool = False
) -> None:
    a, gate, up, *biases, out = args
    rows, depth = shapes[0]
    pipeline = _Pipeline(b, a, [gate, up], (rows, shapes[1][0], depth))

    def write(row: SSAValue, column: SSAValue, values: Sequence[SSAValue]) -> None:
        g, u = values
        if biases:
            g, u = b.fadd(g, b.load(biases[0], [column])), b.fadd(u, b.load(biases[1], [column]))
        b.store(glu(b, g, u, gelu_tanh), out, [row, column])  # as the decode kernel and the reference

    pipeline.epilogue(pipeline.run(), write)
