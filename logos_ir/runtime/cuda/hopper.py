"""The CUDA emulator's Hopper ops: mbarriers, TMA copies and wgmma, as the PTX ISA defines them.

Merged into `KernelEmulator`'s table (`HOPPER_COMPILERS`); every thread runs in lockstep, so a warp-specialised
kernel's producer step of a round runs before its consumers' step of that round (the order the kernel's ops are
in). What each op does here:

* shared memory has the addresses `cuda.shared_layout` gives (the emitter carves the same offsets out of the
  dynamic shared memory), so a wgmma descriptor's start address names a buffer and a place in it;
* `cuda.mbarrier_init` sets a barrier's expected arrivals (phase 0); `cuda.fence_barrier_init` makes it usable by
  TMA (a copy signalling an unfenced barrier is refused); `cuda.mbarrier_arrive` counts one arrival a thread and,
  with `expect_tx`, adds the bytes to the phase's transaction count; a phase completes when its arrivals are all in
  and its transaction count is back to zero;
* `cuda.tma_load` reads its box at issue (elements past the tensor's edge zero), counts the box's bytes against
  the barrier, and its data lands in shared memory only when a thread's `cuda.mbarrier_wait` sees that barrier's
  phase complete: a read of the ring before the wait sees the old contents (what a GPU may give), so a missing
  wait gives wrong numbers. The box is written with the tensor map's swizzle: with 128B, 16-byte chunk c of a
  128-byte row r lands at chunk c ^ (r % 8) (address bits 4-6 XOR bits 7-9), the destination 1024-byte aligned;
* `cuda.mbarrier_wait` succeeds when the phase of its parity has completed (completed phases % 2 != parity); one
  that has not is refused: in lockstep nothing after it can complete it (a GPU would spin forever);
* `cuda.wgmma_descriptor` computes the ISA's 64-bit descriptor of the shared address; `cuda.wgmma` decodes each
  warpgroup's descriptors (start address, stride byte offset, swizzle mode: only the 128B K-major layout TMA
  writes is executed, any other mode refused), gathers A (64 x 16) and B (N x 16) through the 128B swizzle, and
  computes D = A B^T + C in f32 into the accumulator fragment layout (warp w of the warpgroup rows 16w + g and
  16w + g + 8, register 4i + j column 8i + 2t + j % 2). Its results are in flight until a `cuda.wgmma_wait`
  retires their group: before that they read as NaN (the ISA leaves them undefined), except as the C of another
  wgmma (which the ISA orders).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects.builtin import BFloat16Type, IntegerType
from xdsl.ir import Operation

from logos_ir.dialects import cuda
from logos_ir.dialects.cuda import WARP, WARPGROUP
from logos_ir.runtime.cuda.lockstep import Env, Mask, Step, row_major_strides
from logos_ir.runtime.cuda.tensor_core import _block_epochs, _epochs, _kernel_of, _Shared, _Threads

_MODES = {mode: width for width, mode in cuda.SWIZZLES.items()}


def swizzled(address: np.ndarray, width: int) -> np.ndarray:
    """A byte address through a `width`-byte swizzle (PTX ISA, "Shared memory swizzling modes"): the 16-byte chunk
    bits (4 and up, log2(width / 16) of them) XOR the bits above the swizzle row (7 and up)."""
    if width == 0:
        return address
    chunks = width // 16 - 1
    return address ^ (((address >> 7) & chunks) << 4)


class _Barriers:
    """A launch's mbarrier array, per block: expected and pending arrivals, transaction count, completed phases,
    and the TMA copies of the current phase (landing when a wait sees the phase complete)."""

    def __init__(self, blocks: int, count: int):
        shape = (blocks, count)
        self.expected = np.zeros(shape, np.int64)
        self.pending = np.zeros(shape, np.int64)
        self.tx = np.zeros(shape, np.int64)
        self.phases = np.zeros(shape, np.int64)
        self.ready = np.zeros(shape, bool)  # initialised
        self.fenced = np.zeros(shape, bool)
        self.copies: dict[tuple[int, int], list[tuple[int, Any]]] = {}  # (block, barrier) -> (phase, landing)

    def complete(self, where: tuple[np.ndarray, np.ndarray]) -> None:
        block, index = where
        done = (self.pending[block, index] == 0) & (self.tx[block, index] == 0) & self.ready[block, index]
        for b, i in zip(block[done], index[done], strict=True):
            if self.pending[b, i] or self.tx[b, i]:  # completed already by an earlier pair of this step
                continue
            self.phases[b, i] += 1
            self.pending[b, i] = self.expected[b, i]


def _barrier_at(em: Any, op: Any, bars: Any, indices: Any) -> Callable[[Env], tuple[_Barriers, np.ndarray]]:
    slot, at = em._slot(bars), [em._slot(v) for v in indices]

    def where(env: Env) -> tuple[_Barriers, np.ndarray]:
        index = np.broadcast_to(np.asarray(env[at[0]], np.int64), (em.launch.threads,))
        return env[slot], index

    return where


def _registry(em: Any) -> int:
    return em._slot(("shared buffers by address", id(em)))


def _shared_memory(em: Any, op: Any) -> Step:
    """A shared buffer (or mbarrier array) of the launch, registered at its `cuda.shared_layout` address."""
    out, epochs, registry = em._slot(op.result), _epochs(em), _registry(em)
    threads = _Threads(em, op)
    kind = op.result.type
    size = int(np.prod(kind.get_shape()))
    base = cuda.shared_layout(_kernel_of(op))[0][op.result]
    barriers = _is_barrier(kind)
    element = 8 if barriers else 2 if isinstance(kind.element_type, BFloat16Type) else 4

    def step(env: Env, mask: Mask) -> None:
        blocks = threads.count // threads.block_size
        if barriers:
            env[out] = _Barriers(blocks, size)
            return
        shared = _Shared(blocks, size, _block_epochs(env, epochs, threads))
        env[out] = shared
        if env[registry] is None:
            env[registry] = []
        env[registry].append((base, base + size * element, element, shared))

    return step


def _live(threads: _Threads, mask: Mask) -> np.ndarray:
    return np.ones(threads.count, bool) if mask is None else mask


def _mbarrier_init(em: Any, op: Any) -> Step:
    threads, where = _Threads(em, op), _barrier_at(em, op, op.bars, op.indices)
    count = op.count.value.data

    def step(env: Env, mask: Mask) -> None:
        bars, index = where(env)
        live = _live(threads, mask)
        block, index = threads.blocks()[live], index[live]
        bars.expected[block, index] = bars.pending[block, index] = count
        bars.tx[block, index] = bars.phases[block, index] = 0
        bars.ready[block, index], bars.fenced[block, index] = True, False

    return step


def _fence_barrier_init(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    arrays = [em._slot(v) for v in _barrier_arrays(op)]

    def step(env: Env, mask: Mask) -> None:
        blocks = np.unique(threads.blocks()[_live(threads, mask)])
        for slot in arrays:
            bars: _Barriers = env[slot]
            if bars is not None:
                bars.fenced[blocks] = bars.ready[blocks]

    return step


def _barrier_arrays(op: Any) -> list[Any]:
    kernel = _kernel_of(op)
    return [s.result for s in kernel.walk() if isinstance(s, cuda.SharedMemoryOp) and _is_barrier(s.result.type)]


def _is_barrier(kind: Any) -> bool:
    return kind.element_type == IntegerType(64)


def _mbarrier_arrive(em: Any, op: Any) -> Step:
    threads, where = _Threads(em, op), _barrier_at(em, op, op.bars, op.indices)
    tx = 0 if op.expect_tx is None else op.expect_tx.value.data

    def step(env: Env, mask: Mask) -> None:
        bars, index = where(env)
        live = _live(threads, mask)
        block, index = threads.blocks()[live], index[live]
        if not bars.ready[block, index].all():
            raise threads.refuse(op, "arrives on an mbarrier that was never initialised")
        np.subtract.at(bars.pending, (block, index), 1)
        if (bars.pending[block, index] < 0).any():
            raise threads.refuse(op, "arrives more often than the barrier's phase expects")
        if tx:
            np.add.at(bars.tx, (block, index), tx)
        bars.complete((block, index))

    return step


def _mbarrier_wait(em: Any, op: Any) -> Step:
    threads, where = _Threads(em, op), _barrier_at(em, op, op.bars, op.indices)
    parity = em._slot(op.parity)

    def step(env: Env, mask: Mask) -> None:
        bars, index = where(env)
        live = _live(threads, mask)
        block, index = threads.blocks()[live], index[live]
        want = np.broadcast_to(np.asarray(env[parity], np.int64), (threads.count,))[live]
        if ((bars.phases[block, index] % 2) == want).any():
            raise threads.refuse(
                op,
                "waits on an mbarrier phase that has not completed (in lockstep nothing after the wait can complete"
                " it: on a GPU it would spin forever)",
            )
        for b, i in set(zip(block.tolist(), index.tolist(), strict=True)):
            kept = []
            for phase, land in bars.copies.pop((b, i), []):
                if phase < bars.phases[b, i]:
                    land()
                else:
                    kept.append((phase, land))
            if kept:
                bars.copies[(b, i)] = kept

    return step


def _tma_load(em: Any, op: Any) -> Step:
    threads, where = _Threads(em, op), _barrier_at(em, op, op.bars, op.bar_indices)
    dst, src = em._slot(op.dst), em._slot(op.src)
    dst_at, src_at = [em._slot(v) for v in op.dst_indices], [em._slot(v) for v in op.src_indices]
    dst_strides = row_major_strides(op.dst.type)
    rows, columns = op.box_shape()
    height, width = op.src.type.get_shape()
    swizzle = op.swizzle.value.data
    base = cuda.shared_layout(_kernel_of(op))[0][op.dst]
    r, c = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
    box_bytes = op.box_bytes()

    def step(env: Env, mask: Mask) -> None:
        bars, index = where(env)
        live = _live(threads, mask)
        block, index = threads.blocks()[live], index[live]
        if not bars.fenced[block, index].all():
            raise threads.refuse(op, "signals an mbarrier not fenced after its init (fence.mbarrier_init)")
        to = threads.flat(env, dst_at, dst_strides)[live]
        top, left = (np.broadcast_to(np.asarray(env[s], np.int64), (threads.count,))[live] for s in src_at)
        start = base + 2 * to
        if swizzle and (start % cuda.SHARED_ALIGN).any():
            raise threads.refuse(op, "writes a swizzled box to shared memory that is not 1024-byte aligned")
        shared: _Shared = env[dst]
        threads.inside(op, to, rows * columns, shared.data.shape[1], "writes")
        source = env[src].reshape(height, width)
        for k in range(len(block)):
            gr, gc = top[k] + r, left[k] + c
            inside = (gr < height) & (gc < width)
            data = np.where(inside, source[np.minimum(gr, height - 1), np.minimum(gc, width - 1)], np.float32(0))
            placed = (swizzled(start[k] + 2 * (r * columns + c), swizzle) - base) // 2
            b, i = int(block[k]), int(index[k])

            def land(b: int = b, placed: np.ndarray = placed, data: np.ndarray = data) -> None:
                shared.data[b, placed.reshape(-1)] = data.reshape(-1)

            bars.copies.setdefault((b, i), []).append((int(bars.phases[b, i]), land))
            bars.tx[b, i] -= box_bytes
        bars.complete((block, index))

    return step


def _descriptor(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    at, strides = [em._slot(v) for v in op.indices], row_major_strides(op.memref.type)
    out = em._slot(op.result)
    base = cuda.shared_layout(_kernel_of(op))[0][op.memref]
    fixed = op.bits(0)

    def step(env: Env, mask: Mask) -> None:
        address = base + 2 * threads.flat(env, at, strides)
        env[out] = np.uint64(fixed) | ((address & 0x3FFFF) >> 4).astype(np.uint64)  # the 64 bits, unsigned

    return step


def _wgmma_state(em: Any) -> int:
    return em._slot(("wgmma groups", id(em)))


def _groups(env: Env, slot: int) -> dict[str, Any]:
    if env[slot] is None:
        env[slot] = {"open": [], "groups": [], "values": {}}
    return env[slot]


_THREAD = np.arange(WARPGROUP)
_WARP_ROW = 16 * (_THREAD // WARP)
_G, _T = (_THREAD % WARP) // 4, (_THREAD % WARP) % 4


def _fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each accumulator register (axis 0) of each thread of a warpgroup (axis 1), m64nNk16."""
    registers = np.arange(n // 2)[:, None]
    i, j = registers // 4, registers % 4
    return _WARP_ROW + _G + 8 * (j >= 2), 8 * i + 2 * _T + j % 2


def _wgmma(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    a, b = em._slot(op.a), em._slot(op.b)
    c, d = [em._slot(v) for v in op.c], [em._slot(v) for v in op.d]
    n = op.n.value.data
    rows, columns = _fragment(n)
    state, registry = _wgmma_state(em), _registry(em)

    def operand(env: Env, desc: np.ndarray, blocks: np.ndarray, height: int) -> np.ndarray:
        field = lambda shift: ((desc >> np.uint64(shift)) & np.uint64(0x3FFF)).astype(np.int64) << 4  # noqa: E731
        start, stride = field(0), field(32)
        mode = (desc >> np.uint64(62)).astype(np.int64)
        if (mode != 1).any():
            raise threads.refuse(
                op,
                f"reads a descriptor of swizzle mode {sorted(set(mode.tolist()))}: the emulator "
                "executes the 128B-swizzled K-major layout (mode 1) TMA writes",
            )
        r, k = np.arange(height)[:, None], np.arange(16)[None, :]
        address = start[:, None, None] + ((r // 8) * stride[:, None, None] + (r % 8) * 128 + 2 * k)
        address = swizzled(address, 128)
        out = np.empty((len(desc), height, 16), np.float32)
        for w in range(len(desc)):
            found = [entry for entry in env[registry] if entry[0] <= start[w] < entry[1]]
            if not found:
                raise threads.refuse(op, f"reads a matrix at shared address {int(start[w])}, in no buffer")
            low, high, size, shared = found[0]
            if address[w].min() < low or address[w].max() + 2 > high:
                raise threads.refuse(op, "reads a matrix past its shared buffer")
            out[w] = shared.data[blocks[w], (address[w] - low) // 2]
        return out

    def step(env: Env, mask: Mask) -> None:
        live = _live(threads, mask)
        chosen = np.flatnonzero(live)
        local = chosen % threads.block_size
        if len(chosen) % WARPGROUP or (local.reshape(-1, WARPGROUP)[:, 0] % WARPGROUP).any():
            raise threads.refuse(op, "is executed by part of a warpgroup (all 128 threads, warpgroup-aligned)")
        first = chosen.reshape(-1, WARPGROUP)
        blocks = threads.blocks()[first[:, 0]]
        descs = []
        for slot in (a, b):
            desc = np.broadcast_to(np.asarray(env[slot], np.uint64), (threads.count,))[first]
            if (desc != desc[:, :1]).any():
                raise threads.refuse(op, "takes a descriptor that differs between the threads of a warpgroup")
            descs.append(desc[:, 0])
        A, B = operand(env, descs[0], blocks, 64), operand(env, descs[1], blocks, n)
        groups = _groups(env, state)
        C = np.zeros((len(first), 64, n), np.float32)
        for register, slot in enumerate(c):
            value = groups["values"].pop(slot, None)
            value = env[slot] if value is None else value
            value = np.broadcast_to(np.asarray(value, np.float32), (threads.count,))[first]
            C[:, rows[register], columns[register]] = value
        D = np.matmul(A, B.transpose(0, 2, 1)) + C
        for register, slot in enumerate(d):
            full = np.full(threads.count, np.nan, np.float32)
            full[first] = D[:, rows[register], columns[register]]
            groups["values"][slot] = full
            env[slot] = np.full(threads.count, np.nan, np.float32)  # in flight: undefined until the wait
            groups["open"].append(slot)

    return step


def _wgmma_fence(em: Any, op: Any) -> Step:
    def step(env: Env, mask: Mask) -> None:
        """Orders registers and shared memory before the wgmma ops: in lockstep they are ordered already."""

    return step


def _wgmma_commit(em: Any, op: Any) -> Step:
    state = _wgmma_state(em)

    def step(env: Env, mask: Mask) -> None:
        groups = _groups(env, state)
        groups["groups"].append(groups["open"])
        groups["open"] = []

    return step


def _wgmma_wait(em: Any, op: Any) -> Step:
    state, pending = _wgmma_state(em), op.pending.value.data

    def step(env: Env, mask: Mask) -> None:
        groups = _groups(env, state)
        while len(groups["groups"]) > pending:
            for slot in groups["groups"].pop(0):
                value = groups["values"].pop(slot, None)
                if value is not None:
                    env[slot] = value

    return step


HOPPER_COMPILERS: dict[type[Operation], Callable[[Any, Any], Step]] = {
    cuda.SharedMemoryOp: _shared_memory,
    cuda.MbarrierInitOp: _mbarrier_init,
    cuda.FenceBarrierInitOp: _fence_barrier_init,
    cuda.MbarrierArriveOp: _mbarrier_arrive,
    cuda.MbarrierWaitOp: _mbarrier_wait,
    cuda.TmaLoadOp: _tma_load,
    cuda.WgmmaDescriptorOp: _descriptor,
    cuda.WgmmaOp: _wgmma,
    cuda.WgmmaFenceOp: _wgmma_fence,
    cuda.WgmmaCommitOp: _wgmma_commit,
    cuda.WgmmaWaitOp: _wgmma_wait,
}
