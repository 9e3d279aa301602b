"""The CUDA emulator's tensor-core ops: shared memory, cp.async groups, barriers, ldmatrix, mma.sync.

`logos_ir.runtime.cuda.emulator.KernelEmulator` runs every thread of a launch as one element of a numpy array, in
lockstep; these are the compilers of the ops the tensor-core kernels add (`TENSOR_CORE_COMPILERS`, by op type,
merged into its table).
Each executes what the PTX ISA says the instruction does, so a kernel that puts a wrong element in a fragment, reads
a copy before waiting for it, misaligns an address or reaches past a buffer gets wrong numbers or an error here, not
only on a GPU:

* `cuda.shared_memory`: an array per block (zero at the start of each launch), indexed by the thread's block;
* `cuda.cp_async`: the 16 bytes are read at issue and land in shared memory only when a `cuda.cp_async_wait`
  retires their group (`cuda.cp_async_commit` closes a group; `wait N` retires all but the newest N), so a read
  before the wait sees the old contents; both addresses must be 16-byte aligned;
* `gpu.barrier`: threads are in lockstep, so it only counts, per block, the barriers passed; each shared element
  remembers the count and the thread of its last write and read, and a read of what another thread of the block
  wrote, or a write over what another thread used, with no barrier between them is refused (a race on a GPU: a
  missing barrier fails here, not only there); a barrier reached by only part of a block (inside a branch that
  differs between its threads) is refused, as it would hang a GPU;
* `cuda.ldmatrix`: lane 8i + r supplies row r of matrix i, lane 4r + w receives elements 2w, 2w+1 of row r in its
  register i (16-byte aligned rows); transposed, elements r of rows 2w and 2w+1;
* `cuda.mma_sync` m16n8k16: each warp's A, B and C matrices gathered from its lanes' registers by the ISA's fragment
  layout (g = lane / 4, t = lane % 4), D = A B + C in f32, scattered back by the same layout;
* `cuda.load_bf16x2`, `cuda.pack_bf16x2`: two f32 (of memory, or values) rounded to a bf16 pair (nearest even);
  `cuda.load_norm_bf16x2` first multiplies each by the row's inverse RMS, then by its scale (f32 products);
  `cuda.store_bf16x2` a pair into shared or global memory.

A bf16 pair register is an array (threads, 2) of f32 values that bf16 holds exactly. The f32 product of bf16 inputs
is exact; a GPU's tensor core sums the 16 products of each k step in an order (and with an internal precision) the
ISA leaves open, numpy's matmul in another, so emulated and GPU accumulators may differ in the last bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects import gpu
from xdsl.ir import Operation

from logos_ir.dialects import cuda
from logos_ir.dialects.cuda import SHARED, WARP
from logos_ir.errors import LogosError
from logos_ir.numerics import bf16_rounded
from logos_ir.runtime.cuda.lockstep import Env, Mask, Step, row_major_strides

_LANE = np.arange(WARP)
_GROUP, _PAIR = _LANE // 4, _LANE % 4  # the PTX ISA's groupID and threadID_in_group
# (row, column) of the first element of each register of an m16n8k16 fragment, per lane
_A_PLACES = [(_GROUP, 2 * _PAIR), (_GROUP + 8, 2 * _PAIR), (_GROUP, 2 * _PAIR + 8), (_GROUP + 8, 2 * _PAIR + 8)]
_B_PLACES = [(2 * _PAIR, _GROUP), (2 * _PAIR + 8, _GROUP)]  # (k, n) of the first of a pair along k
_C_PLACES = [(_GROUP, 2 * _PAIR), (_GROUP, 2 * _PAIR + 1), (_GROUP + 8, 2 * _PAIR), (_GROUP + 8, 2 * _PAIR + 1)]


def _in_shared(kind: Any) -> bool:
    space = kind.memory_space
    return hasattr(space, "value") and space.value.data == SHARED


def _kernel_of(op: Any) -> Any:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, gpu.FuncOp):
        parent = parent.parent_op()
    return parent


def _block_size(op: Any) -> int:
    kernel = _kernel_of(op)
    size = None if kernel is None else kernel.known_block_size
    if size is None:
        raise LogosError(f"the CUDA emulator needs a known block size for '{op.name}'")
    return int(size.get_values()[0])


class _Threads:
    """Per launch: each thread's block and the flat index of an address, cached by launch."""

    def __init__(self, em: Any, op: Any):
        self.em, self.block_size, self.kernel = em, _block_size(op), em.name
        self._blocks: dict[int, np.ndarray] = {}

    @property
    def count(self) -> int:
        return int(self.em.launch.threads)

    def blocks(self) -> np.ndarray:
        key = id(self.em.launch)
        found = self._blocks.get(key)
        if found is None:
            found = self._blocks[key] = np.arange(self.count, dtype=np.int64) // self.block_size
        return found

    def flat(self, env: Env, slots: list[int], strides: tuple[int, ...]) -> np.ndarray:
        total: Any = np.zeros(self.count, np.int64)
        for slot, stride in zip(slots, strides, strict=True):
            total = total + np.asarray(env[slot], dtype=np.int64) * stride
        return np.broadcast_to(total, (self.count,))

    def refuse(self, op: Any, message: str) -> LogosError:
        return LogosError(f"kernel {self.kernel}: '{op.name}' {message}")

    def inside(self, op: Any, flat: np.ndarray, width: int, size: int, what: str) -> None:
        """Refuse an access of `width` elements from `flat` past a buffer of `size` (a GPU would fault or corrupt)."""
        if flat.size and (flat.min() < 0 or flat.max() + width > size):
            raise self.refuse(op, f"{what} outside its buffer of {size} elements")


class _Shared:
    """A shared memref of one launch: its values per block, and for each element the barrier epoch and thread of
    its last write and last read, against which each access is checked (a data race between threads of a block is
    refused, as `compute-sanitizer --tool racecheck` reports it on a GPU)."""

    def __init__(self, blocks: int, size: int, epochs: np.ndarray):
        self.data = np.zeros((blocks, size), np.float32)
        self.epochs = epochs  # the barriers each block has passed
        self.written, self.writer = np.full((blocks, size), -1, np.int64), np.full((blocks, size), -1, np.int64)
        self.read, self.reader = np.full((blocks, size), -1, np.int64), np.full((blocks, size), -1, np.int64)

    @staticmethod
    def _where(block: np.ndarray, flat: np.ndarray, thread: np.ndarray) -> tuple[np.ndarray, ...]:
        flat = flat.reshape(len(block), -1)
        return block[:, None], flat, thread[:, None]

    def write(self, threads: _Threads, op: Any, block: np.ndarray, flat: np.ndarray, thread: np.ndarray) -> None:
        """A write by `thread` (one a row) of the elements `flat` of its block: refused when another thread of the
        block read or wrote one of them since the block's last barrier."""
        b, f, t = self._where(block, flat, thread)
        now = self.epochs[b]
        other = ((self.read[b, f] == now) & (self.reader[b, f] != t)) | (
            (self.written[b, f] == now) & (self.writer[b, f] != t)
        )
        if other.any():
            raise threads.refuse(op, "writes shared memory another thread of its block used since their last barrier")

    def wrote(self, block: np.ndarray, flat: np.ndarray, thread: np.ndarray) -> None:
        b, f, t = self._where(block, flat, thread)
        self.written[b, f], self.writer[b, f] = self.epochs[b], t

    def reads(self, threads: _Threads, op: Any, block: np.ndarray, flat: np.ndarray, thread: np.ndarray) -> None:
        """A read by `thread` of `flat`: refused when another thread of the block wrote it since their last barrier."""
        b, f, t = self._where(block, flat, thread)
        if ((self.written[b, f] == self.epochs[b]) & (self.writer[b, f] != t)).any():
            raise threads.refuse(op, "reads shared memory another thread of its block wrote since their last barrier")
        self.read[b, f], self.reader[b, f] = self.epochs[b], t


def _epochs(em: Any) -> int:
    """The slot of a launch's barrier count per block."""
    return em._slot(("barriers passed", id(em)))


def _block_epochs(env: Env, slot: int, threads: _Threads) -> np.ndarray:
    if env[slot] is None:
        env[slot] = np.zeros(threads.count // threads.block_size, np.int64)
    return env[slot]


def _shared_memory(em: Any, op: Any) -> Step:
    out, epochs = em._slot(op.result), _epochs(em)
    threads = _Threads(em, op)
    size = int(np.prod(op.result.type.get_shape()))

    def step(env: Env, mask: Mask) -> None:
        env[out] = _Shared(threads.count // threads.block_size, size, _block_epochs(env, epochs, threads))

    return step


def _queue(em: Any) -> int:
    """The slot of this kernel's cp.async state: the open group and the committed groups, per launch."""
    return em._slot(("cp.async groups", id(em)))


def _state(env: Env, slot: int) -> dict[str, list]:
    if env[slot] is None:
        env[slot] = {"open": [], "groups": []}
    return env[slot]


def _cp_async(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    dst, src, valid = em._slot(op.dst), em._slot(op.src), em._slot(op.valid)
    dst_at, src_at = [em._slot(v) for v in op.dst_indices], [em._slot(v) for v in op.src_indices]
    dst_strides, src_strides = row_major_strides(op.dst.type), row_major_strides(op.src.type)
    width = op.elements()
    queue = _queue(em)
    span = np.arange(width)

    def step(env: Env, mask: Mask) -> None:
        live = np.ones(threads.count, bool) if mask is None else mask
        to, frm = threads.flat(env, dst_at, dst_strides)[live], threads.flat(env, src_at, src_strides)[live]
        if (to % width).any() or (frm % width).any():
            raise threads.refuse(op, "copies from or to an address that is not 16-byte aligned")
        ok = np.broadcast_to(np.asarray(env[valid], bool), (threads.count,))[live]
        source = env[src].reshape(-1)
        threads.inside(op, frm[ok], width, source.size, "reads")
        shared: _Shared = env[dst]
        threads.inside(op, to, width, shared.data.shape[1], "writes")
        data = np.where(ok[:, None], source[np.where(ok, frm, 0)[:, None] + span], np.float32(0))
        block, thread = threads.blocks()[live], np.flatnonzero(live)
        shared.write(threads, op, block, to[:, None] + span, thread)  # in flight from here to its wait
        _state(env, queue)["open"].append((shared, block, to[:, None] + span, data, thread))

    return step


def _commit(em: Any, op: Any) -> Step:
    queue = _queue(em)

    def step(env: Env, mask: Mask) -> None:
        state = _state(env, queue)
        state["groups"].append(state["open"])
        state["open"] = []

    return step


def _wait(em: Any, op: Any) -> Step:
    queue = _queue(em)
    pending = op.pending.value.data
    threads = _Threads(em, op)

    def step(env: Env, mask: Mask) -> None:
        groups = _state(env, queue)["groups"]
        while len(groups) > pending:
            for shared, block, where, data, thread in groups.pop(0):
                shared.write(threads, op, block, where, thread)
                shared.data[block[:, None], where] = data
                shared.wrote(block, where, thread)

    return step


def _barrier(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    epochs = _epochs(em)

    def step(env: Env, mask: Mask) -> None:
        passed = _block_epochs(env, epochs, threads)
        if mask is None:
            passed += 1
            return
        per_block = mask.reshape(-1, threads.block_size)
        if (per_block.any(axis=1) & ~per_block.all(axis=1)).any():
            raise threads.refuse(op, "is reached by only some threads of a block (a GPU would hang)")
        passed += per_block.any(axis=1)

    return step


def _ldmatrix(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    memory, at = em._slot(op.memref), [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.memref.type)
    outs = [em._slot(r) for r in op.registers]
    transpose = op.transpose is not None
    # the lane whose row address each lane reads from, by matrix, and the elements of that row it takes: row l / 4,
    # elements 2(l % 4) and 2(l % 4) + 1; transposed, rows 2(l % 4) and 2(l % 4) + 1, element l / 4
    if transpose:
        providers = [[8 * i + 2 * _PAIR, 8 * i + 2 * _PAIR + 1] for i in range(len(outs))]
        columns = [_GROUP, _GROUP]
    else:
        providers = [[8 * i + _GROUP, 8 * i + _GROUP] for i in range(len(outs))]
        columns = [2 * _PAIR, 2 * _PAIR + 1]

    def step(env: Env, mask: Mask) -> None:
        warps = threads.count // WARP
        flat = threads.flat(env, at, strides).reshape(warps, WARP)
        if (flat[:, : 8 * len(outs)] % 8).any():
            raise threads.refuse(op, "reads a matrix row that is not 16-byte aligned")
        block = threads.blocks().reshape(warps, WARP)
        shared: _Shared = env[memory]
        threads.inside(op, flat[:, : 8 * len(outs)], 8, shared.data.shape[1], "reads a matrix row")
        live = np.ones(threads.count, bool) if mask is None else mask
        receiver = np.arange(threads.count)[live]
        for out, pair in zip(outs, providers, strict=True):
            places = [flat[:, lane] + column for lane, column in zip(pair, columns, strict=True)]
            halves = [shared.data[block[:, lane], at] for lane, at in zip(pair, places, strict=True)]
            env[out] = np.stack(halves, axis=-1).reshape(-1, 2)
            read = np.stack(places, axis=-1).reshape(-1, 2)[live]
            shared.reads(threads, op, block.reshape(-1)[live], read, receiver)

    return step


def _load_bf16x2(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    memory, at = em._slot(op.memref), [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.memref.type)
    out = em._slot(op.result)
    shared = _in_shared(op.memref.type)
    norm = None
    if isinstance(op, cuda.LoadNormBF16x2Op):
        norm = [em._slot(v) for v in (op.inverse, op.low_scale, op.high_scale)]

    def step(env: Env, mask: Mask) -> None:
        flat = threads.flat(env, at, strides)
        if mask is not None:
            flat = np.where(mask, flat, 0)
        if (flat % 2).any():
            raise threads.refuse(op, "loads an f32 pair at an odd index (not 8-byte aligned)")
        if shared:
            tile: _Shared = env[memory]
            block = threads.blocks()
            threads.inside(op, flat, 2, tile.data.shape[1], "reads")
            pair = [tile.data[block, flat], tile.data[block, flat + 1]]
            live = np.ones(threads.count, bool) if mask is None else mask
            both = np.stack([flat, flat + 1], axis=-1)[live]
            tile.reads(threads, op, block[live], both, np.flatnonzero(live))
        else:
            memory_ = env[memory].reshape(-1)
            threads.inside(op, flat, 2, memory_.size, "reads")
            pair = [memory_[flat], memory_[flat + 1]]
        if norm is not None:  # (x * inverse) * scale, each product rounded to f32, as cuda.rms_norm computes it
            inverse, low, high = (np.broadcast_to(np.asarray(env[v], np.float32), (threads.count,)) for v in norm)
            values = [np.asarray(v, np.float32) for v in pair]
            pair = [(values[0] * inverse) * low, (values[1] * inverse) * high]
        env[out] = bf16_rounded(np.stack(pair, axis=-1))

    return step


def _pack_bf16x2(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    low, high, out = em._slot(op.low), em._slot(op.high), em._slot(op.result)

    def step(env: Env, mask: Mask) -> None:
        count = threads.count
        pair = [np.broadcast_to(np.asarray(env[v], np.float32), (count,)) for v in (low, high)]
        env[out] = bf16_rounded(np.stack(pair, axis=-1))

    return step


def _store_bf16x2(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    value, memory, at = em._slot(op.value), em._slot(op.memref), [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.memref.type)

    shared = _in_shared(op.memref.type)

    def step(env: Env, mask: Mask) -> None:
        live = np.ones(threads.count, bool) if mask is None else mask
        flat = threads.flat(env, at, strides)[live]
        if (flat % 2).any():
            raise threads.refuse(op, "stores a bf16 pair at an odd index (not 4-byte aligned)")
        pair = np.broadcast_to(env[value], (threads.count, 2))[live]
        if shared:
            tile: _Shared = env[memory]
            block, thread = threads.blocks()[live], np.flatnonzero(live)
            threads.inside(op, flat, 2, tile.data.shape[1], "writes")
            both = np.stack([flat, flat + 1], axis=-1)
            tile.write(threads, op, block, both, thread)
            tile.data[block, flat], tile.data[block, flat + 1] = pair[:, 0], pair[:, 1]
            tile.wrote(block, both, thread)
            return
        target = env[memory].reshape(-1)
        threads.inside(op, flat, 2, target.size, "writes")
        target[flat], target[flat + 1] = pair[:, 0], pair[:, 1]

    return step


def _mma_sync(em: Any, op: Any) -> Step:
    threads = _Threads(em, op)
    a, b, c = [em._slot(v) for v in op.a], [em._slot(v) for v in op.b], [em._slot(v) for v in op.c]
    d = [em._slot(v) for v in op.d]

    def step(env: Env, mask: Mask) -> None:
        warps = threads.count // WARP
        A = np.zeros((warps, 16, 16), np.float32)
        B = np.zeros((warps, 16, 8), np.float32)
        C = np.zeros((warps, 16, 8), np.float32)
        for slot, (row, column) in zip(a, _A_PLACES, strict=True):
            pair = np.broadcast_to(env[slot], (threads.count, 2)).reshape(warps, WARP, 2)
            A[:, row, column], A[:, row, column + 1] = pair[..., 0], pair[..., 1]
        for slot, (k, n) in zip(b, _B_PLACES, strict=True):
            pair = np.broadcast_to(env[slot], (threads.count, 2)).reshape(warps, WARP, 2)
            B[:, k, n], B[:, k + 1, n] = pair[..., 0], pair[..., 1]
        for slot, (row, column) in zip(c, _C_PLACES, strict=True):
            C[:, row, column] = np.broadcast_to(env[slot], (threads.count,)).reshape(warps, WARP)
        D = np.matmul(A, B) + C
        for slot, (row, column) in zip(d, _C_PLACES, strict=True):
            env[slot] = D[:, row, column].reshape(-1)

    return step


TENSOR_CORE_COMPILERS: dict[type[Operation], Callable[[Any, Any], Step]] = {
    cuda.SharedMemoryOp: _shared_memory,
    cuda.CpAsyncOp: _cp_async,
    cuda.CpAsyncCommitOp: _commit,
    cuda.CpAsyncWaitOp: _wait,
    gpu.BarrierOp: _barrier,
    cuda.LdmatrixOp: _ldmatrix,
    cuda.LoadBF16x2Op: _load_bf16x2,
    cuda.LoadNormBF16x2Op: _load_bf16x2,
    cuda.PackBF16x2Op: _pack_bf16x2,
    cuda.StoreBF16x2Op: _store_bf16x2,
    cuda.MmaSyncOp: _mma_sync,
}
