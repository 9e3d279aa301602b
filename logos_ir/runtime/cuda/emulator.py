"""The CUDA emulator: executes the lowered `gpu.func` bodies of a build (the kernels `step.mlir` holds and
`kernels.cu` prints) on the CPU, with the target's semantics. Every thread of a launch is one element of a numpy
array (blocks, then threads within a block, along one axis) and each op of a kernel body one numpy operation over
all threads, in lockstep: shuffles are permutations of that axis within groups of 32; a loop whose bounds differ
between threads runs until its last thread is done, each thread masked off past its bound; `scf.if` narrows the
mask; loads of masked-off threads read element 0 and their stores are dropped. It fails where a GPU would: an
access outside a buffer, a misaligned vector load, an index past the 32 bits the emitted C computes in
(`EmulatorFault`); `math.fma` rounds once. bf16 buffers are held as f32 arrays of bf16-rounded values. Each op is
compiled by a handler looked up by its type (`COMPILERS`, the tensor-core ops' from `tensor_core`, the Hopper ops'
from `hopper`); an op without one is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects import arith, gpu, math, memref, scf, vector
from xdsl.dialects.builtin import Float16Type, Float32Type, IndexType, IntegerType
from xdsl.ir import Operation

from logos_ir.dialects import cuda
from logos_ir.dialects.cuda import WARP
from logos_ir.errors import LogosError
from logos_ir.numerics import bf16_rounded
from logos_ir.runtime.cuda.hopper import HOPPER_COMPILERS
from logos_ir.runtime.cuda.lockstep import Env, Mask, Step, row_major_strides
from logos_ir.runtime.cuda.tensor_core import TENSOR_CORE_COMPILERS


@dataclass
class LaunchShape:
    """The thread indices of one launch shape, made once and reused by every launch of that shape."""

    threads: int
    thread_x: np.ndarray
    block: tuple[np.ndarray, np.ndarray, np.ndarray]
    lanes: dict[int, np.ndarray] = field(default_factory=dict)
    ids: np.ndarray | None = None  # each thread's index in the whole launch (None: 0, 1, ... threads - 1)
    total: int = 0  # the whole launch's threads (a part of it, run alone, has fewer)

    @classmethod
    def of(cls, grid: tuple[int, int, int], block: int, ids: np.ndarray | None = None) -> LaunchShape:
        blocks = grid[0] * grid[1] * grid[2]
        index = np.arange(blocks * block, dtype=np.int64) if ids is None else ids
        which = index // block
        bx, rest = which % grid[0], which // grid[0]
        return cls(len(index), index % block, (bx, rest % grid[1], rest // grid[1]), ids=ids, total=blocks * block)

    @property
    def global_ids(self) -> np.ndarray:
        return np.arange(self.threads, dtype=np.int64) if self.ids is None else self.ids

    def partner(self, offset: int) -> np.ndarray:
        found = self.lanes.get(offset)
        if found is None:
            found = self.lanes[offset] = np.arange(self.threads, dtype=np.int64) ^ offset
        return found


class KernelEmulator:
    """One `gpu.func`, compiled into numpy closures over a value list (see the module docstring)."""

    def __init__(self, kernel: Any, seed: int | None = None):
        self.name = kernel.sym_name.data
        self.slots: dict[Any, int] = {}
        block = kernel.body.block
        self.args = [self._slot(arg) for arg in block.args]
        self.launch: LaunchShape | None = None
        # A kernel whose warps hand work to one another (an atomic count: attention's combine, split-K QKV) has its
        # cross-warp reads checked against the fences and atomics that order them (`Ordering`), and with `seed`
        # its warps run in a seeded order of separate parts (`run`). Kernels without an atomic share nothing
        # between warps within a launch, and block-wide barriers (tensor-core kernels) keep their blocks whole.
        names = {op.name for op in kernel.walk()}
        self.ordered = "memref.atomic_rmw" in names
        self.interleavable = self.ordered and "gpu.barrier" not in names
        self.written = {self._slot(op.operands[1]) for op in kernel.walk() if op.name == "memref.store"}
        self.seed = seed
        self.order: Ordering | None = None
        _check_programmatic(kernel)  # a programmatic kernel touches no memory before its wait
        self.body = self._block(block)

    def _slot(self, value: Any) -> int:
        slot = self.slots.get(value)
        if slot is None:
            slot = self.slots[value] = len(self.slots)
        return slot

    def run(self, arrays: Sequence[np.ndarray], launch: LaunchShape) -> None:
        """One launch. In lockstep (no seed): every thread at every op together. With a seed, a kernel that hands
        work between warps runs as up to `PARTS` parts, each a seeded random set of whole warps run to its end
        before the next starts, and each atomic serves its threads in a seeded order: any warp may be the last to
        count, and a warp may read before another has written (as on a GPU, where blocks and warps are scheduled
        in no promised order)."""
        self.order = Ordering(launch.total or launch.threads) if self.ordered else None
        if self.seed is None or not self.interleavable or launch.ids is not None:
            self._run(arrays, launch)
            return
        rng = np.random.default_rng([self.seed, launch.threads])
        warps = rng.permutation(launch.threads // WARP)
        cuts = np.sort(rng.choice(np.arange(1, len(warps)), min(PARTS, len(warps)) - 1, replace=False))
        grid = (int(launch.block[0].max()) + 1, int(launch.block[1].max()) + 1, int(launch.block[2].max()) + 1)
        size = int(launch.thread_x.max()) + 1
        self.order.rng = rng
        for part in np.split(warps, cuts):
            ids = (np.sort(part)[:, None] * WARP + np.arange(WARP)[None, :]).reshape(-1)
            self._run(arrays, LaunchShape.of(grid, size, ids))

    def _run(self, arrays: Sequence[np.ndarray], launch: LaunchShape) -> None:
        env: Env = [None] * (len(self.slots) + 1)
        for slot, array in zip(self.args, arrays, strict=True):
            env[slot] = array.reshape(-1)
        self.launch = launch
        with np.errstate(all="ignore"):  # masked-off threads may compute garbage that is never stored
            for step in self.body:
                step(env, None)

    # -- compiling --------------------------------------------------------------------------------------------

    def _block(self, block: Any) -> list[Step]:
        # A value defined here is dropped after the last op that reads it, so a launch over a million threads holds
        # only its live arrays; what the terminator yields stays for the loop that reads it.
        ops = list(block.ops)
        defined = {id(op) for op in ops}
        last_use: dict[Any, int] = {}
        for index, op in enumerate(ops):
            for value in _uses(op):
                last_use[value] = index
        kept = set(ops[-1].operands) if ops else set()
        dying: dict[int, list[int]] = {}
        for value, at in last_use.items():
            if id(value.owner) in defined and value not in kept:
                dying.setdefault(at, []).append(self._slot(value))
        steps: list[Step] = []
        for index, op in enumerate(ops):
            step = self._op(op)
            dead = dying.get(index, []) + [self._slot(v) for v in op.results if v not in last_use and v not in kept]
            steps.append(_then_free(step, dead) if dead else step)
        return steps

    def _op(self, op: Any) -> Step:
        compile_op = COMPILERS.get(type(op))
        if compile_op is None:
            raise LogosError(f"the CUDA emulator does not know '{op.name}' (in kernel {self.name})")
        return compile_op(self, op)


PARTS = 4  # the parts a seeded launch of a kernel with an atomic count is run as, one after the other


class Ordering:
    """What orders one warp's global writes before another warp's reads within a launch, as CUDA's memory model
    has it for the lane's hand-off (write the partials; `__threadfence()`; count with an atomic; the warp that
    counts last fences again and reads them): each thread's last fence, each warp's atomic (its place in the
    order its address served atomics, and each of its threads' last fence then: the writes that atomic
    releases), and, for each buffer the kernel writes, each element's writer and when it wrote. A load of an
    element another warp wrote in this launch is a fault unless the writer fenced after writing and before its
    warp's atomic, the reader's warp counted after it on the same address, and the reader fenced after that."""

    def __init__(self, threads: int):
        self.clock = 0
        self.fence = np.full(threads, -1, np.int64)
        self.released = np.full(threads, -1, np.int64)
        warps = -(-threads // WARP)
        self.counted = np.full(warps, -1, np.int64)  # the clock of the warp's atomic
        self.serial = np.full(warps, -1, np.int64)  # its place among its address's atomics
        self.address = np.full(warps, -1, np.int64)
        self.served: dict[tuple[int, int], int] = {}
        self.writer: dict[int, np.ndarray] = {}
        self.written_at: dict[int, np.ndarray] = {}
        self.rng: np.random.Generator | None = None

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def store(self, slot: int, size: int, flat: np.ndarray, ids: np.ndarray) -> None:
        if slot not in self.writer:
            self.writer[slot] = np.full(size, -1, np.int64)
            self.written_at[slot] = np.full(size, -1, np.int64)
        self.writer[slot][flat] = ids
        self.written_at[slot][flat] = self.tick()

    def check_load(self, em: KernelEmulator, op: Any, slot: int, flat: Any, ids: np.ndarray, role: str) -> None:
        writers = self.writer.get(slot)
        if writers is None:
            return
        flat = np.broadcast_to(np.asarray(flat), ids.shape[:1] + np.shape(flat)[1:])
        who = writers[flat]
        readers = np.broadcast_to(ids.reshape((-1,) + (1,) * (who.ndim - 1)), who.shape)
        other = (who >= 0) & (who // WARP != readers // WARP)
        if not other.any():
            return
        w, r, at = who[other], readers[other], self.written_at[slot][flat[other]]
        wr, rd = w // WARP, r // WARP
        released = self.released[w] >= at
        counted_after = (self.address[wr] == self.address[rd]) & (self.serial[wr] < self.serial[rd])
        acquired = (self.counted[rd] >= 0) & (self.fence[r] > self.counted[rd])
        bad = ~(released & counted_after & acquired)
        if not bad.any():
            return
        first = int(np.flatnonzero(bad)[0])
        writer, reader = int(w[first]), int(r[first])
        why = (
            "with no fence between that write and its warp's atomic count"
            if not released[first]
            else "before its warp counted after the writer's"
            if not counted_after[first]
            else "with no fence between its warp's atomic count and the read"
        )
        assert em.launch is not None
        size = int(em.launch.thread_x.max()) + 1
        raise EmulatorFault(
            f"the CUDA emulator: kernel {em.name}: '{op.name}' reads {role} written by another warp (thread "
            f"{writer % size} of block {writer // size}) {why} (reader: thread {reader % size} of block "
            f"{reader // size})"
        )


def _uses(op: Any) -> list[Any]:
    """The values `op` reads, including those its regions read from outside them."""
    found = list(op.operands)
    for region in op.regions:
        for inner in region.walk():
            found += [v for v in inner.operands]
    return found


def _then_free(step: Step, dead: list[int]) -> Step:
    def run(env: Env, mask: Mask) -> None:
        step(env, mask)
        for slot in dead:
            env[slot] = None

    return run


def _flat(env: Env, slots: list[int], strides: tuple[int, ...], mask: Mask) -> Any:
    total: Any = 0
    for slot, stride in zip(slots, strides, strict=True):
        total = total + env[slot] * stride
    if mask is not None and isinstance(total, np.ndarray):
        total = np.where(mask, total, 0)
    return total


INT32 = 2**31  # the emitted C holds an index in an `int`


class EmulatorFault(LogosError):
    """What a GPU would raise (or silently get wrong) at one op of a kernel: an access outside its buffer, a
    misaligned vector load, an index past 32 bits."""


def _fault(em: KernelEmulator, op: Any, what: str, bad: np.ndarray | None, values: Any) -> EmulatorFault:
    """A fault of the first offending thread, naming the kernel, the op and the thread."""
    assert em.launch is not None
    if isinstance(values, np.ndarray) and values.shape == (em.launch.threads,) and bad is not None:
        thread = int(np.flatnonzero(bad)[0])
        block = tuple(int(axis[thread]) for axis in em.launch.block)
        where = f" (block {block}, thread {int(em.launch.thread_x[thread])}: {int(values[thread])})"
    else:
        where = f" ({int(np.asarray(values).reshape(-1)[0])})"
    return EmulatorFault(f"the CUDA emulator: kernel {em.name}: '{op.name}' {what}{where}")


def _check_bounds(em: KernelEmulator, op: Any, flat: Any, size: int, role: str) -> None:
    """A GPU faults (or reads another buffer) where a flat index leaves its buffer: refuse it by name."""
    low, high = (flat.min(), flat.max()) if isinstance(flat, np.ndarray) else (flat, flat)
    if low < 0 or high >= size:
        bad = (flat < 0) | (flat >= size) if isinstance(flat, np.ndarray) else None
        raise _fault(em, op, f"accesses {role} outside its {size} elements", bad, flat)


def _size(value: Any) -> int:
    return int(np.prod(value.type.get_shape()))


def _role(value: Any) -> str:
    return f"'{value.name_hint}'" if value.name_hint else "a buffer"


# One compiler per op type: each returns the step that executes the op over all threads.


def _constant(em: KernelEmulator, op: Any) -> Step:
    out = em._slot(op.result)
    data = op.value.value.data
    value = np.float32(data) if isinstance(data, float) else np.int64(data)

    def step(env: Env, mask: Mask) -> None:
        env[out] = value

    return step


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[KernelEmulator, Any], Step]:
    def compile_op(em: KernelEmulator, op: Any) -> Step:
        a, b, out = em._slot(op.operands[0]), em._slot(op.operands[1]), em._slot(op.results[0])

        def step(env: Env, mask: Mask) -> None:
            env[out] = fn(env[a], env[b])

        return step

    return compile_op


def _index_binary(fn: Callable[[Any, Any], Any]) -> Callable[[KernelEmulator, Any], Step]:
    """Index arithmetic, refused where a thread that runs it leaves 32 bits: the emitted C computes it in `int`."""

    def compile_op(em: KernelEmulator, op: Any) -> Step:
        a, b, out = em._slot(op.operands[0]), em._slot(op.operands[1]), em._slot(op.results[0])
        checked = isinstance(op.results[0].type, IndexType)

        def step(env: Env, mask: Mask) -> None:
            value = env[out] = fn(env[a], env[b])
            if not checked:
                return
            if isinstance(value, np.ndarray):
                if value.size and (value.max() >= INT32 or value.min() < -INT32):
                    bad = (value >= INT32) | (value < -INT32)
                    if mask is not None:
                        bad &= np.broadcast_to(mask, bad.shape)
                    if bad.any():
                        raise _fault(em, op, "overflows the 32-bit index the emitted C computes", bad, value)
            elif value >= INT32 or value < -INT32:
                raise _fault(em, op, "overflows the 32-bit index the emitted C computes", None, value)

        return step

    return compile_op


def _fma(em: KernelEmulator, op: Any) -> Step:
    """`math.fma` rounded once, as `__fmaf_rn`: a*b is exact in f64, the sum a*b+c is formed in f64 rounded to odd
    (its error found by TwoSum), and rounding that to f32 is then the correctly rounded fused result."""
    a, b, c, out = (em._slot(v) for v in (*op.operands, op.result))

    def step(env: Env, mask: Mask) -> None:
        env[out] = fma_f32(env[a], env[b], env[c])

    return step


def _to_bf16(x: Any) -> Any:
    """arith.truncf f32 -> bf16 (round to nearest even), held as the f32 value a bf16 buffer keeps."""
    if isinstance(x, np.ndarray):
        return bf16_rounded(x)
    return np.float32(bf16_rounded(np.array([x], np.float32))[0])


def fma_f32(a: Any, b: Any, c: Any) -> Any:
    """fmaf(a, b, c) over numpy float32 values, rounded once. The f64 sum of the exact f64 product rounds to the
    f32 result except where it lands exactly halfway between two f32 values (then its own rounding may have made
    the tie): only there is the sum's error found (TwoSum) and the sum moved off the tie towards it."""
    product = np.multiply(a, b, dtype=np.float64)  # exact: 24 + 24 bits
    if not isinstance(product, np.ndarray) or product.ndim == 0:
        return np.float32(_off_tie(np.float64(product), np.float64(c), np.float64(product) + np.float64(c)))
    total = np.add(product, c, out=product, dtype=np.float64)
    low = np.bitwise_and(total.view(np.int64), 0x1FFFFFFF)
    ties = np.nonzero(low == 0x10000000)
    if ties[0].size:  # the product again where it is needed, as arrays (a decode step meets thousands of ties)
        a64, b64, c64 = (_at_ties(v, total.shape, ties) for v in (a, b, c))
        total[ties] = _off_ties(a64 * b64, c64, total[ties])
    return total.astype(np.float32)


def _at_ties(value: Any, shape: tuple[int, ...], ties: tuple[np.ndarray, ...]) -> Any:
    """An operand of `fma_f32` in f64 at the tie positions of its (broadcast) result."""
    if isinstance(value, np.ndarray) and value.shape == shape:
        return value[ties].astype(np.float64)
    if np.ndim(value) == 0:
        return np.float64(value)
    return np.broadcast_to(value, shape)[ties].astype(np.float64)


def _off_ties(product: np.ndarray, addend: np.ndarray, total: np.ndarray) -> np.ndarray:
    """`_off_tie` over arrays of sums that each sit on an f32 tie."""
    back = total - product
    with np.errstate(invalid="ignore"):  # an infinite sum's error is NaN: it stays where it is
        error = (product - (total - back)) + (addend - back)
    moved = np.nextafter(total, np.where(error > 0, np.inf, -np.inf))
    return np.where(np.isfinite(total) & (error != 0) & ~np.isnan(error), moved, total)


def _off_tie(product: np.float64, addend: np.float64, total: np.float64) -> np.float64:
    """`total` (= product + addend rounded to f64) moved one f64 step towards the exact sum where it is not exact
    and sits on an f32 tie, so that rounding it to f32 rounds the exact sum."""
    if (int(np.asarray(total).view(np.int64)) & 0x1FFFFFFF) != 0x10000000 or not np.isfinite(total):
        return total
    back = total - product
    error = (product - (total - back)) + (addend - back)
    return np.nextafter(total, np.inf if error > 0 else -np.inf) if error != 0 else total


def _unary(fn: Callable[[Any], Any]) -> Callable[[KernelEmulator, Any], Step]:
    def compile_op(em: KernelEmulator, op: Any) -> Step:
        a, out = em._slot(op.operands[0]), em._slot(op.results[0])

        def step(env: Env, mask: Mask) -> None:
            env[out] = fn(env[a])

        return step

    return compile_op


_CMPI = {"ult": np.less, "slt": np.less, "eq": np.equal, "ne": np.not_equal, "uge": np.greater_equal}
_CMPF = {"oeq": np.equal, "ogt": np.greater, "olt": np.less}


def _cmpi(em: KernelEmulator, op: Any) -> Step:
    names = {0: "eq", 1: "ne", 2: "slt", 6: "ult", 9: "uge"}
    return _binary(_CMPI[names[op.predicate.value.data]])(em, op)


def _cmpf(em: KernelEmulator, op: Any) -> Step:
    names = {1: "oeq", 2: "ogt", 4: "olt"}
    return _binary(_CMPF[names[op.predicate.value.data]])(em, op)


def _select(em: KernelEmulator, op: Any) -> Step:
    c, a, b, out = (em._slot(v) for v in (*op.operands, op.result))

    def step(env: Env, mask: Mask) -> None:
        cond = env[c]
        env[out] = (env[a] if cond else env[b]) if isinstance(cond, bool | np.bool_) else np.where(cond, env[a], env[b])

    return step


def _f32(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda x: fn(np.float32(x) if not isinstance(x, np.ndarray) else x)


def _cast(kind: str) -> Callable[[KernelEmulator, Any], Step]:
    def convert(x: Any) -> Any:
        if kind == "float":
            return x.astype(np.float32) if isinstance(x, np.ndarray) else np.float32(x)
        if isinstance(x, np.ndarray):
            return x.astype(np.int64)
        return np.int64(x)

    return _unary(convert)


# Integers narrower than an index (a weight's stored units and the fields taken out of them) are held as their
# bit patterns, non-negative, in int64 arrays (or the uint16 / uint32 arrays a stored buffer holds): C's unsigned
# types, as the emitter prints them; `arith.sitofp` reads the pattern as signed.


def _width(kind: Any) -> int | None:
    """The bits of an integer type narrower than 64 (None for an index, i64 or a float)."""
    return kind.width.data if isinstance(kind, IntegerType) and kind.width.data < 64 else None


def _bitwise(logical: Callable[[Any, Any], Any], bitwise: Callable[[Any, Any], Any]) -> Compiler:
    """`arith.andi` / `arith.ori`: logical on i1 (conditions), bitwise on wider integers."""

    def compile_op(em: KernelEmulator, op: Any) -> Step:
        wide = _width(op.results[0].type) not in (None, 1) or isinstance(op.results[0].type, IndexType)
        return _binary(bitwise if wide else logical)(em, op)

    return compile_op


def _wrapped(fn: Callable[[Any, Any], Any]) -> Compiler:
    """Integer arithmetic of a narrow type: its bit pattern, modulo 2^width (C's unsigned arithmetic); an index's
    or i64's as `_index_binary`."""

    def compile_op(em: KernelEmulator, op: Any) -> Step:
        width = _width(op.results[0].type)
        if width is None:
            return _index_binary(fn)(em, op)
        mask = np.int64((1 << width) - 1)
        return _binary(
            lambda a, b: np.bitwise_and(fn(np.int64(a) if np.ndim(a) == 0 else a.astype(np.int64), b), mask)
        )(em, op)

    return compile_op


def _shift_right(em: KernelEmulator, op: Any) -> Step:
    return _binary(lambda a, b: np.right_shift(np.asarray(a).astype(np.int64), b))(em, op)


def _extui(em: KernelEmulator, op: Any) -> Step:
    return _unary(lambda x: np.asarray(x).astype(np.int64))(em, op)


def _trunci(em: KernelEmulator, op: Any) -> Step:
    mask = np.int64((1 << op.results[0].type.width.data) - 1)
    return _unary(lambda x: np.bitwise_and(np.asarray(x).astype(np.int64), mask))(em, op)


def _bitcast(em: KernelEmulator, op: Any) -> Step:
    """`arith.bitcast` i16 -> f16: the half's value, held widened to f32 (exact), as a bf16 value is held; i32 -> f32:
    the float of the bit pattern."""
    if isinstance(op.results[0].type, Float32Type) and _width(op.operands[0].type) == 32:
        return _unary(lambda x: np.asarray(x).astype(np.uint32).view(np.float32))(em, op)
    if not (isinstance(op.results[0].type, Float16Type) and _width(op.operands[0].type) == 16):
        raise LogosError(
            f"the CUDA emulator runs arith.bitcast from i16 to f16 and from i32 to f32 only (in {em.name})"
        )
    return _unary(lambda x: np.asarray(x).astype(np.uint16).view(np.float16).astype(np.float32))(em, op)


def _sitofp(em: KernelEmulator, op: Any) -> Step:
    """A signed integer to f32: a narrow type's pattern read as two's complement."""
    width = _width(op.operands[0].type)
    if width is None:
        return _cast("float")(em, op)
    half, whole = np.int64(1 << (width - 1)), np.int64(1 << width)

    def convert(x: Any) -> Any:
        x = np.asarray(x).astype(np.int64)
        return np.where(x >= half, x - whole, x).astype(np.float32)

    return _unary(convert)(em, op)


def _uitofp(em: KernelEmulator, op: Any) -> Step:
    return _unary(lambda x: np.asarray(x).astype(np.float32))(em, op)


def _thread_id(em: KernelEmulator, op: Any) -> Step:
    out = em._slot(op.result)

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        env[out] = em.launch.thread_x

    return step


def _block_id(em: KernelEmulator, op: Any) -> Step:
    out = em._slot(op.result)
    axis = "xyz".index(op.dimension.data.value)

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        env[out] = em.launch.block[axis]

    return step


def _load(em: KernelEmulator, op: Any) -> Step:
    memory = em._slot(op.memref)
    indices = [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.memref.type)
    out = em._slot(op.res)

    size, role = _size(op.memref), _role(op.memref)

    def step(env: Env, mask: Mask) -> None:
        flat = _flat(env, indices, strides, mask)
        _check_bounds(em, op, flat, size, role)
        env[out] = env[memory][flat]
        if em.order is not None and memory in em.written:
            _check_ordered(em, op, memory, flat, mask, role)

    return step


def _check_ordered(em: KernelEmulator, op: Any, memory: int, flat: Any, mask: Mask, role: str) -> None:
    """A load's cross-warp reads checked against `Ordering` (the threads that run it)."""
    assert em.launch is not None and em.order is not None
    ids = em.launch.global_ids
    flat = np.broadcast_to(np.asarray(flat), (em.launch.threads,) + np.shape(flat)[1:])
    if mask is not None:
        ids, flat = ids[mask], flat[mask]
    em.order.check_load(em, op, memory, flat, ids, role)


def _track_store(em: KernelEmulator, memory: int, size: int, flat: Any, mask: Mask) -> None:
    assert em.launch is not None and em.order is not None
    ids = em.launch.global_ids
    flat = np.broadcast_to(np.asarray(flat), (em.launch.threads,))
    if mask is not None:
        ids, flat = ids[mask], flat[mask]
    em.order.store(memory, size, flat, ids)


def _store(em: KernelEmulator, op: Any) -> Step:
    memory = em._slot(op.memref)
    indices = [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.memref.type)
    value = em._slot(op.value)

    size, role = _size(op.memref), _role(op.memref)

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        flat = _flat(env, indices, strides, None)
        data = env[value]
        if em.order is not None:
            _track_store(em, memory, size, flat, mask)
        if mask is None:
            _check_bounds(em, op, flat, size, role)
            env[memory][flat] = data
            return
        threads = em.launch.threads
        flat = np.broadcast_to(flat, (threads,))[mask]
        if flat.size:
            _check_bounds(em, op, flat, size, role)
        env[memory][flat] = np.broadcast_to(data, (threads,))[mask]

    return step


def _vector_load(em: KernelEmulator, op: Any) -> Step:
    """`vector.load`: `width` consecutive elements, one vector a thread (an array [threads, width]). Its address
    must be a multiple of its `alignment` (the lane gives every vector load its own size: a GPU faults on a
    misaligned 16-byte load), else of its element."""
    memory = em._slot(op.base)
    indices = [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.base.type)
    out = em._slot(op.result)

    width = op.result.type.get_shape()[0]
    kind = op.base.type.element_type
    element = kind.width.data // 8 if isinstance(kind, IntegerType) else 2 if "bf16" in str(kind) else 4
    alignment = op.attributes.get("alignment")
    aligned = max(int(alignment.value.data) // element, 1) if alignment is not None else 1

    size, role = _size(op.base), _role(op.base)
    # widths and alignments are powers of two: a mask and a shift then stand for % and // (3-4x faster in numpy)
    odd_bits = aligned - 1 if aligned & (aligned - 1) == 0 else None
    shift = width.bit_length() - 1 if width & (width - 1) == 0 else None

    def step(env: Env, mask: Mask) -> None:
        # Buffers start 256-byte aligned, so the flat index must be a multiple of the alignment in elements. The
        # buffer viewed as rows of `width` elements gives every aligned thread's vector in one gather (np.take:
        # several times faster than fancy indexing over a decode step's million threads).
        flat = _flat(env, indices, strides, mask)
        low, high = (flat.min(), flat.max()) if isinstance(flat, np.ndarray) else (flat, flat)
        if low < 0 or high + (width - 1) >= size:
            _check_bounds(em, op, flat + (width - 1), size, role)
            _check_bounds(em, op, flat, size, role)
        if aligned > 1:
            odd = flat & odd_bits if odd_bits is not None else flat % aligned
            if np.any(odd):
                raise _fault(em, op, f"loads {width} elements of {role} from a misaligned index", odd != 0, flat)
        data = env[memory]
        if aligned % width == 0:
            rows = flat >> shift if shift is not None else flat // width
            env[out] = np.take(data.reshape(-1, width), rows, axis=0)
        else:
            env[out] = data[np.add.outer(flat, np.arange(width))]  # [threads, width], or [width] for one index
        if em.order is not None and memory in em.written:
            _check_ordered(em, op, memory, np.add.outer(flat, np.arange(width)), mask, role)

    return step


def _vector_extract(em: KernelEmulator, op: Any) -> Step:
    """`vector.extract` of one static position: a column of the threads' vectors."""
    (position,) = op.static_position.get_values()
    if op.dynamic_position:
        raise LogosError(f"the CUDA emulator runs vector.extract at static positions only (in kernel {em.name})")
    return _unary(lambda v: v[..., position])(em, op)


def _gpu_shuffle(em: KernelEmulator, op: Any) -> Step:
    """`gpu.shuffle xor` over a whole warp: a permutation of the threads' axis within groups of 32 (all valid)."""
    if op.mode.data.value != "xor":
        raise LogosError(f"the CUDA emulator runs gpu.shuffle xor only (in kernel {em.name})")
    value, offset, width = em._slot(op.value), em._slot(op.offset), em._slot(op.width)
    out, valid = em._slot(op.results[0]), em._slot(op.results[1])

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        if int(env[width]) != WARP:
            raise _fault(em, op, f"shuffles over {int(env[width])} lanes, not a warp's {WARP}", None, env[width])
        _whole_warps(em, op, mask, "__shfl_xor_sync(0xffffffff)")
        data = env[value]
        env[valid] = np.True_
        if not isinstance(data, np.ndarray) or data.shape != (em.launch.threads,):
            env[out] = data  # the same on every lane
            return
        env[out] = data[em.launch.partner(int(env[offset]))]

    return step


def _whole_warps(em: KernelEmulator, op: Any, mask: Mask, what: str) -> None:
    """A warp-synchronous op with the full mask (every shuffle and warp barrier the lane prints) must be reached
    by all 32 lanes of each warp that reaches it: under divergence a GPU's result is undefined (or it hangs)."""
    if mask is None:
        return
    assert em.launch is not None
    lanes = np.asarray(mask).reshape(-1, WARP).sum(axis=1)
    split = (lanes > 0) & (lanes < WARP)
    if split.any():
        warp = int(np.flatnonzero(split)[0])
        thread = int(em.launch.global_ids[warp * WARP])
        size = int(em.launch.thread_x.max()) + 1
        raise EmulatorFault(
            f"the CUDA emulator: kernel {em.name}: '{op.name}' ({what}) is reached by {int(lanes[warp])} of the "
            f"{WARP} lanes of the warp from thread {thread % size} of block {thread // size} (divergent)"
        )


def _warp_sync(em: KernelEmulator, op: Any) -> Step:
    def step(env: Env, mask: Mask) -> None:
        _whole_warps(em, op, mask, "__syncwarp(0xffffffff)")

    return step


def _fence(em: KernelEmulator, op: Any) -> Step:
    """`__threadfence()`: the threads that run it have every earlier write of theirs ordered before their later
    accesses (recorded where the kernel hands work between warps, `Ordering`)."""

    def step(env: Env, mask: Mask) -> None:
        if em.order is None:
            return
        assert em.launch is not None
        ids = em.launch.global_ids if mask is None else em.launch.global_ids[mask]
        em.order.fence[ids] = em.order.tick()

    return step


def _for(em: KernelEmulator, op: Any) -> Step:
    lower, upper, stride = em._slot(op.lb), em._slot(op.ub), em._slot(op.step)
    inits = [em._slot(v) for v in op.iter_args]
    block = op.body.block
    induction = em._slot(block.args[0])
    carried = [em._slot(a) for a in block.args[1:]]
    body = em._block(block)
    yield_op = block.last_op
    yielded = [em._slot(v) for v in yield_op.operands]
    results = [em._slot(v) for v in op.res]

    def run_body(env: Env, mask: Mask) -> list[Any]:
        for inner in body:
            inner(env, mask)
        return [env[y] for y in yielded]

    def step(env: Env, mask: Mask) -> None:
        lb, ub, st = env[lower], env[upper], env[stride]
        state = [env[i] for i in inits]
        if not any(isinstance(v, np.ndarray) for v in (lb, ub, st)):
            for index in range(int(lb), int(ub), int(st)):
                env[induction] = np.int64(index)
                for slot, value in zip(carried, state, strict=True):
                    env[slot] = value
                state = run_body(env, mask)
        else:
            assert em.launch is not None
            iv: np.ndarray = np.broadcast_to(lb, (em.launch.threads,)).copy()
            while True:
                active = iv < ub if mask is None else mask & (iv < ub)
                if not active.any():
                    break
                env[induction] = iv
                for slot, value in zip(carried, state, strict=True):
                    env[slot] = value
                new = run_body(env, active)
                state = [np.where(active, n, s) for n, s in zip(new, state, strict=True)]
                iv = iv + st
        for slot, value in zip(results, state, strict=True):
            env[slot] = value

    return step


def _if(em: KernelEmulator, op: Any) -> Step:
    cond = em._slot(op.cond)
    then = em._block(op.true_region.block)
    otherwise = em._block(op.false_region.block) if op.false_region.blocks else []
    results = [em._slot(v) for v in op.results]
    regions = (op.true_region, op.false_region) if results else ()
    yields = [[em._slot(v) for v in region.block.last_op.operands] for region in regions]

    def step(env: Env, mask: Mask) -> None:
        c = env[cond]
        if not isinstance(c, np.ndarray):
            for inner in then if c else otherwise:
                inner(env, mask)
            for slot, value in zip(results, yields[0 if c else 1] if results else [], strict=True):
                env[slot] = env[value]
            return
        got: list[list[Any]] = []
        for index, (region, taken) in enumerate(((then, c), (otherwise, ~c))):
            narrowed = taken if mask is None else mask & taken
            ran = bool(narrowed.any())
            if region and ran:
                for inner in region:
                    inner(env, narrowed)
            if results:  # a branch no thread took yields nothing anyone reads
                got.append([env[v] if ran else 0 for v in yields[index]])
        for slot, a, b in zip(results, *got, strict=True) if results else []:
            env[slot] = np.where(c, a, b)

    return step


def _atomic_rmw(em: KernelEmulator, op: Any) -> Step:
    """memref.atomic_rmw addi: the threads that run it, in thread order, each add and get what was there."""
    if op.kind.value.data != 1:
        raise LogosError(f"the CUDA emulator runs memref.atomic_rmw addi only (in kernel {em.name})")
    memory, value, out = em._slot(op.memref), em._slot(op.value), em._slot(op.result)
    indices = [em._slot(v) for v in op.indices]
    strides = row_major_strides(op.memref.type)
    size, role = _size(op.memref), _role(op.memref)

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        threads = em.launch.threads
        flat = np.broadcast_to(_flat(env, indices, strides, None), (threads,))
        adds = np.broadcast_to(env[value], (threads,))
        active = np.ones(threads, bool) if mask is None else mask
        _check_bounds(em, op, flat[active], size, role)
        before = np.zeros(threads, np.int64)
        data = env[memory]
        order = em.order
        served = np.flatnonzero(active)
        if order is not None and order.rng is not None:
            served = order.rng.permutation(served)  # a seeded launch: the threads' atomics in any order
        ids = em.launch.global_ids
        for thread in served:
            before[thread] = data[flat[thread]]
            data[flat[thread]] += adds[thread]
            if order is not None:  # the atomic releases its warp's fenced writes, in its address's order
                warp = int(ids[thread]) // WARP
                key = (memory, int(flat[thread]))
                order.serial[warp] = order.served[key] = order.served.get(key, -1) + 1
                order.address[warp] = memory * (1 << 40) + int(flat[thread])
                order.counted[warp] = order.tick()
                lanes = np.arange(warp * WARP, min((warp + 1) * WARP, len(order.fence)))
                order.released[lanes] = order.fence[lanes]
        env[out] = before

    return step


# The ops of a kernel that touch memory (global or shared): none of them may run before a programmatic wait.
_MEMORY_OPS = frozenset(
    {
        "memref.load",
        "memref.store",
        "memref.atomic_rmw",
        "vector.load",
        "cuda.cp_async",
        "cuda.ldmatrix",
        "cuda.load_bf16x2",
        "cuda.load_norm_bf16x2",
        "cuda.store_bf16x2",
    }
)


def _check_programmatic(kernel: Any) -> None:
    """A kernel that waits for the launch before it (`nvvm.griddepcontrol wait`, so the host launches it
    programmatically) is refused (`EmulatorFault`) where the wait is not an op of the kernel's top level or where an
    op before it touches memory: launched so, a kernel runs while the one before it is still writing, and what it
    reads or writes before its wait races with those writes (a GPU gives no error, only, some of the time, wrong
    values; the emulator runs launches one after another and could not show the race)."""
    waits = [op for op in kernel.walk() if isinstance(op, cuda.GridDepControlOp) and op.waits]
    if not waits:
        return
    name = kernel.sym_name.data
    top = list(kernel.body.block.ops)
    if len(waits) > 1 or waits[0] not in top:
        raise EmulatorFault(f"kernel {name}: its griddepcontrol.wait must be one op of its top level, before the rest")
    for op in top[: top.index(waits[0])]:
        for inner in op.walk():
            if inner.name in _MEMORY_OPS:
                raise EmulatorFault(
                    f"kernel {name}: {inner.name} before griddepcontrol.wait: launched programmatically, the kernel "
                    "may run while the launch before it is still writing, so this access races with those writes"
                )


def _nothing(em: KernelEmulator, op: Any) -> Step:
    def step(env: Env, mask: Mask) -> None:
        """The terminator of a kernel or a region: nothing to execute."""

    return step


Compiler = Callable[[KernelEmulator, Any], Step]

COMPILERS: dict[type[Operation], Compiler] = {
    arith.ConstantOp: _constant,
    arith.AddiOp: _index_binary(np.add),
    arith.SubiOp: _wrapped(np.subtract),
    arith.MuliOp: _index_binary(np.multiply),
    arith.DivUIOp: _binary(np.floor_divide),
    arith.RemUIOp: _binary(np.remainder),
    arith.MinUIOp: _binary(np.minimum),
    arith.MaxUIOp: _binary(np.maximum),
    arith.CmpiOp: _cmpi,
    arith.AndIOp: _bitwise(np.logical_and, np.bitwise_and),
    arith.OrIOp: _bitwise(np.logical_or, np.bitwise_or),
    arith.ShRUIOp: _shift_right,
    arith.ShLIOp: _wrapped(np.left_shift),
    arith.ExtUIOp: _extui,
    arith.TruncIOp: _trunci,
    arith.BitcastOp: _bitcast,
    arith.UIToFPOp: _uitofp,
    arith.SelectOp: _select,
    arith.AddfOp: _binary(np.add),
    arith.SubfOp: _binary(np.subtract),
    arith.MulfOp: _binary(np.multiply),
    arith.DivfOp: _binary(np.divide),
    arith.MaximumfOp: _binary(np.maximum),  # IEEE maximum: a NaN wins
    arith.MaxnumfOp: _binary(np.fmax),  # fmaxf: a NaN loses to a number
    arith.TruncFOp: _unary(lambda x: _to_bf16(x)),
    math.FmaOp: _fma,
    arith.CmpfOp: _cmpf,
    arith.IndexCastOp: _cast("int"),
    arith.SIToFPOp: _sitofp,
    arith.FPToSIOp: _cast("int"),
    arith.ExtFOp: _unary(lambda x: x),  # a bf16 buffer (or loaded vector) already holds its values widened to f32
    math.ExpOp: _unary(_f32(np.exp)),
    math.SqrtOp: _unary(_f32(np.sqrt)),
    math.TanhOp: _unary(_f32(np.tanh)),
    memref.LoadOp: _load,
    memref.StoreOp: _store,
    vector.LoadOp: _vector_load,
    vector.ExtractOp: _vector_extract,
    cuda.GpuShuffleOp: _gpu_shuffle,
    gpu.ThreadIdOp: _thread_id,
    gpu.BlockIdOp: _block_id,
    scf.ForOp: _for,
    scf.IfOp: _if,
    memref.AtomicRMWOp: _atomic_rmw,
    cuda.FenceOp: _fence,
    cuda.WarpSyncOp: _warp_sync,
    cuda.GridDepControlOp: _nothing,  # launches run one after another here: the wait is met, the trigger moot
    scf.YieldOp: _nothing,
    gpu.ReturnOp: _nothing,
    **TENSOR_CORE_COMPILERS,
    **HOPPER_COMPILERS,  # after the tensor-core table: shared memory with addresses and mbarriers
}
