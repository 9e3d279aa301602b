"""The CUDA lane's host runtime: runs the lane's build (the kernels and the host plan) on a GPU, or emulated on the CPU.

A build of the CUDA lane holds `step.mlir` (the lowered module: `gpu.module @kernels` and the host function `@step`
of named buffers, ordered `gpu.launch_func`, `shard.all_reduce` and a split head's `shard.all_gather`) and
`kernels.cu` (the same kernels as CUDA C++). This module reads those artifacts and nothing of the lowering.

* `KernelEmulator` executes each `gpu.func` of `step.mlir` itself, over numpy: every thread of a launch is one
  element of a numpy array (blocks, then threads within a block, along one axis), each op of the kernel body one
  numpy operation over all threads, in lockstep (shuffles are permutations of that axis within groups of 32; a loop
  whose bounds differ between threads runs until its last thread is done, each thread masked off past its bound;
  `scf.if` narrows the mask; loads of masked-off threads read element 0 and their stores are dropped). It fails
  where a GPU would: an access outside a buffer, a misaligned vector load, an index past 32 bits (`EmulatorFault`);
  `math.fma` rounds once. bf16 buffers are held as f32 arrays of bf16-rounded values.
* `HostRuntime` / `HostProgram`: the one host code path (buffers, weights shard by shard, caches, inputs, launches
  or a captured graph, collectives, the head's logits) over a device interface that two devices implement: `Gpu`
  (cupy: one non-blocking work stream for everything, kernels resolved once, the step captured as a CUDA graph with
  its all-reduces) and `Emulator` (the emulator, its stream logged, graphs replayed in lockstep over local ranks).
* Ranks: emulated chips in one process (`LocalRanks`), or one process a chip under `mpiexec` / `srun` (`launcher`),
  all-reducing and all-gathering over MPI (`MpiRanks`, emulator) or NCCL (`NcclRanks`, GPU; the unique id broadcast
  over MPI).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logos_ir.errors import LogosError
from logos_ir.passes.cuda.host_plan import (
    Buffer,
    Gather,
    HostPlan,
    Reduce,
    bf16_bits,
    bf16_rounded,
    read_plan,
    weight_share,
)
from logos_ir.runtime.cuda_tensor_core import COMPILERS as TENSOR_CORE_COMPILERS  # issue 19 (tensor cores)

WARP = 32
Env = list[Any]
Mask = np.ndarray | None
Step = Callable[[Env, Mask], None]


# -- the emulator of one kernel ------------------------------------------------------------------------------


@dataclass
class _Launch:
    """The thread indices of one launch shape, made once and reused by every launch of that shape."""

    threads: int
    thread_x: np.ndarray
    block: tuple[np.ndarray, np.ndarray, np.ndarray]
    lanes: dict[int, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, grid: tuple[int, int, int], block: int) -> _Launch:
        blocks = grid[0] * grid[1] * grid[2]
        index = np.arange(blocks * block, dtype=np.int64)
        which = index // block
        bx, rest = which % grid[0], which // grid[0]
        return cls(blocks * block, index % block, (bx, rest % grid[1], rest // grid[1]))

    def partner(self, offset: int) -> np.ndarray:
        found = self.lanes.get(offset)
        if found is None:
            found = self.lanes[offset] = np.arange(self.threads, dtype=np.int64) ^ offset
        return found


class KernelEmulator:
    """One `gpu.func`, compiled into numpy closures over a value list (see the module docstring)."""

    def __init__(self, kernel: Any):
        self.name = kernel.sym_name.data
        self.slots: dict[Any, int] = {}
        block = kernel.body.block
        self.args = [self._slot(arg) for arg in block.args]
        self.strides = [_strides(arg.type) for arg in block.args]
        self.launch: _Launch | None = None
        self.body = self._block(block)

    def _slot(self, value: Any) -> int:
        slot = self.slots.get(value)
        if slot is None:
            slot = self.slots[value] = len(self.slots)
        return slot

    def run(self, arrays: Sequence[np.ndarray], launch: _Launch) -> None:
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
        compile_op = _COMPILERS.get(op.name)
        if compile_op is None:
            raise LogosError(f"the CUDA emulator does not know '{op.name}' (in kernel {self.name})")
        return compile_op(self, op)


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


def _strides(kind: Any) -> tuple[int, ...]:
    shape = list(kind.get_shape())
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))


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


def _memref_strides(value: Any) -> tuple[int, ...]:
    return _strides(value.type)


def _size(value: Any) -> int:
    return int(np.prod(value.type.get_shape()))


def _role(value: Any) -> str:
    return f"'{value.name_hint}'" if value.name_hint else "a buffer"


# One compiler per op name: each returns the step that executes the op over all threads.


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
        checked = op.results[0].type.name == "index"

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
    ties = np.flatnonzero(low == 0x10000000)
    if ties.size:  # rare: the product again where it is needed
        a64, b64, c64 = (np.broadcast_to(np.asarray(v, np.float64), total.shape) for v in (a, b, c))
        total[ties] = [_off_tie(a64[i] * b64[i], c64[i], total[i]) for i in ties]
    return total.astype(np.float32)


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
    strides = _memref_strides(op.memref)
    out = em._slot(op.res)

    size, role = _size(op.memref), _role(op.memref)

    def step(env: Env, mask: Mask) -> None:
        flat = _flat(env, indices, strides, mask)
        _check_bounds(em, op, flat, size, role)
        env[out] = env[memory][flat]

    return step


def _store(em: KernelEmulator, op: Any) -> Step:
    memory = em._slot(op.memref)
    indices = [em._slot(v) for v in op.indices]
    strides = _memref_strides(op.memref)
    value = em._slot(op.value)

    size, role = _size(op.memref), _role(op.memref)

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        flat = _flat(env, indices, strides, None)
        data = env[value]
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
    strides = _memref_strides(op.base)
    out = em._slot(op.result)

    width = op.result.type.get_shape()[0]
    element = 2 if "bf16" in str(op.base.type.element_type) else 4
    alignment = op.attributes.get("alignment")
    aligned = max(int(alignment.value.data) // element, 1) if alignment is not None else 1

    size, role = _size(op.base), _role(op.base)

    def step(env: Env, mask: Mask) -> None:
        # Buffers start 256-byte aligned, so the flat index must be a multiple of the alignment in elements. The
        # buffer viewed as rows of `width` elements gives every aligned thread's vector in one gather.
        flat = _flat(env, indices, strides, mask)
        _check_bounds(em, op, flat + (width - 1), size, role)
        _check_bounds(em, op, flat, size, role)
        odd = flat % aligned
        if np.any(odd):
            raise _fault(em, op, f"loads {width} elements of {role} from a misaligned index", odd != 0, flat)
        data = env[memory]
        if aligned % width == 0:
            env[out] = data.reshape(-1, width)[flat // width]
        else:
            env[out] = data[np.add.outer(flat, np.arange(width))]  # [threads, width], or [width] for one index

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
        data = env[value]
        env[valid] = np.True_
        if not isinstance(data, np.ndarray) or data.shape != (em.launch.threads,):
            env[out] = data  # the same on every lane
            return
        env[out] = data[em.launch.partner(int(env[offset]))]

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
    strides = _memref_strides(op.memref)
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
        for thread in np.flatnonzero(active):
            before[thread] = data[flat[thread]]
            data[flat[thread]] += adds[thread]
        env[out] = before

    return step


def _nothing(em: KernelEmulator, op: Any) -> Step:
    def step(env: Env, mask: Mask) -> None:
        """The terminator of a kernel or a region: nothing to execute."""

    return step


_COMPILERS: dict[str, Callable[[KernelEmulator, Any], Step]] = {
    "arith.constant": _constant,
    "arith.addi": _index_binary(np.add),
    "arith.subi": _index_binary(np.subtract),
    "arith.muli": _index_binary(np.multiply),
    "arith.divui": _binary(np.floor_divide),
    "arith.remui": _binary(np.remainder),
    "arith.minui": _binary(np.minimum),
    "arith.maxui": _binary(np.maximum),
    "arith.cmpi": _cmpi,
    "arith.andi": _binary(np.logical_and),
    "arith.ori": _binary(np.logical_or),
    "arith.select": _select,
    "arith.addf": _binary(np.add),
    "arith.subf": _binary(np.subtract),
    "arith.mulf": _binary(np.multiply),
    "arith.divf": _binary(np.divide),
    "arith.maximumf": _binary(np.maximum),  # IEEE maximum: a NaN wins
    "arith.maxnumf": _binary(np.fmax),  # fmaxf: a NaN loses to a number
    "arith.truncf": _unary(lambda x: _to_bf16(x)),
    "math.fma": _fma,
    "arith.cmpf": _cmpf,
    "arith.index_cast": _cast("int"),
    "arith.sitofp": _cast("float"),
    "arith.fptosi": _cast("int"),
    "arith.extf": _unary(lambda x: x),  # a bf16 buffer (or loaded vector) already holds its values widened to f32
    "math.exp": _unary(_f32(np.exp)),
    "math.sqrt": _unary(_f32(np.sqrt)),
    "math.tanh": _unary(_f32(np.tanh)),
    "memref.load": _load,
    "memref.store": _store,
    "vector.load": _vector_load,
    "vector.extract": _vector_extract,
    "gpu.shuffle": _gpu_shuffle,
    "gpu.thread_id": _thread_id,
    "gpu.block_id": _block_id,
    "scf.for": _for,
    "scf.if": _if,
    "memref.atomic_rmw": _atomic_rmw,
    "llvm.fence": _nothing,  # threads run in lockstep: every earlier write is already visible
    "nvvm.bar.warp.sync": _nothing,  # and every lane of a warp already meets the others at each op
    "scf.yield": _nothing,
    "gpu.return": _nothing,
}
_COMPILERS.update(TENSOR_CORE_COMPILERS)  # issue 19 (tensor cores): shared memory, cp.async, ldmatrix, mma.sync


# -- the weights as the kernels read them ------------------------------------------------------------------------


def rope_tables(spec: Any, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed sin ([-sin, sin]) per position over a whole head, as the reference builds them."""
    from logos_ir.rope import rope_inv_freq

    inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    return (
        np.concatenate([cos, cos], axis=1).astype(np.float32),
        np.concatenate([-sin, sin], axis=1).astype(np.float32),
    )


def host_table(spec: Any, buffer: Buffer, chip: int) -> np.ndarray:
    """A table the host fills: the rotary cos / signed sin, or `chip` (this chip's index)."""
    if buffer.name == "chip":
        return np.full(buffer.shape, chip, np.int64)
    if buffer.name not in ("rope.cos", "rope.sin"):
        raise LogosError(f"the CUDA runtime fills no table named '{buffer.name}'")
    cos, sin = rope_tables(spec, buffer.shape[0])
    return cos if buffer.name.endswith("cos") else sin


class EmulatedWeights:
    """Where a run's weights come from, one buffer (one chip's shard of one weight) at a time: the weight store
    (each shard cut from the full tensor as the split program states it) or a build's device image files
    (`weights.bin` / `weights.chip<N>.bin`, read through a memory map, bf16 as bit patterns). Nothing is kept on
    the host: a device uploads each shard and keeps only its device copy."""

    def __init__(self, store: Any, image: str, chips: int, folder: Any = None):
        self.store, self.image, self.chips, self.folder = store, image, chips, folder
        self._index: dict[int, dict[str, Any]] = {}

    def share(self, chip: int, buffer: Buffer) -> np.ndarray:
        """This chip's values of `buffer`: f32, or for a bf16 image read from a file its uint16 bit patterns."""
        if self.folder is not None:
            return self._from_image(chip, buffer)
        return np.ascontiguousarray(weight_share(self.store, buffer.name, buffer.shape, chip, self.chips), np.float32)

    def get(self, chip: int, buffer: Buffer) -> np.ndarray:
        """The values a device holds (f32; bf16-rounded f32 for bf16): the emulator's view of the image."""
        values = self.share(chip, buffer)
        if values.dtype == np.uint16:
            return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return bf16_rounded(values) if buffer.element == "bf16" else values

    def _from_image(self, chip: int, buffer: Buffer) -> np.ndarray:
        import json
        from pathlib import Path

        from logos_ir.passes.cuda.build import HEADER_BYTES

        name = "weights.bin" if self.chips == 1 else f"weights.chip{chip}.bin"
        path = Path(self.folder) / name
        if chip not in self._index:
            if not path.is_file():
                raise LogosError(f"{self.folder}: the build holds no weight image {name} (build it --with-weights)")
            data = np.memmap(path, np.uint8, mode="r")
            lines = bytes(data[:HEADER_BYTES]).rstrip(b"\0").split(b"\n", 2)
            if lines[2].startswith(b"index-at-end "):
                at = HEADER_BYTES + int(lines[2].split()[1])
                index = json.loads(bytes(data[at:]).decode())
            else:
                index = json.loads(lines[2].decode())
            self._index[chip] = {"data": data, "buffers": {b["name"]: b for b in index["buffers"]}}
        found = self._index[chip]["buffers"].get(buffer.name)
        if found is None or tuple(found["shape"]) != buffer.shape or found["element"] != buffer.element:
            raise LogosError(f"{path}: holds no {buffer.element} buffer '{buffer.name}' of shape {buffer.shape}")
        count = int(np.prod(buffer.shape))
        start = HEADER_BYTES + int(found["offset"])
        kind = np.uint16 if buffer.element == "bf16" else np.dtype("<f4")
        size = count * np.dtype(kind).itemsize
        return np.frombuffer(self._index[chip]["data"][start : start + size], kind).reshape(buffer.shape)


# -- the devices: the emulator and the GPU behind one interface --------------------------------------------------


class Emulator:
    """The emulator as a device of the host runtime: buffers are numpy arrays (bf16 held as bf16-rounded f32),
    kernels are `KernelEmulator`s of the plan's `gpu.func`s (made once), the work stream is executed in order and
    logged (`stream`: what was enqueued, by kind and buffer), a graph is the list of nodes (launches, collectives)
    recorded between `begin_capture` and `end_capture`, replayed in that order."""

    kind = "emulator"

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.stream: list[tuple[str, str]] = []
        self.kernels: dict[str, KernelEmulator] = {}
        self.launches: dict[tuple[tuple[int, int, int], int], _Launch] = {}
        self.kernel_seconds: dict[str, float] = {}
        self.graph: list[tuple[Any, ...]] | None = None

    def load(self, kernels: dict[str, Any], cuda_source: str) -> None:
        for name, kernel in kernels.items():
            if name not in self.kernels:
                self.kernels[name] = KernelEmulator(kernel)
        self.stream.append(("load", f"{len(kernels)} kernels"))

    def alloc(self, name: str, shape: tuple[int, ...], element: str) -> np.ndarray:
        self.stream.append(("alloc", name))
        return np.zeros(shape, np.int64 if element == "i64" else np.float32)

    def upload(self, name: str, values: np.ndarray, element: str) -> np.ndarray:
        self.stream.append(("upload", name))
        if values.dtype == np.uint16:  # bf16 bit patterns from an image file
            return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if element == "i64":
            return np.array(values, np.int64)
        return bf16_rounded(values) if element == "bf16" else np.array(values, np.float32)

    def write(self, name: str, array: np.ndarray, values: np.ndarray) -> None:
        self.stream.append(("write", name))
        array[...] = values

    def fill(self, name: str, array: np.ndarray) -> None:
        self.stream.append(("fill", name))
        array.fill(0)

    def read(self, name: str, array: np.ndarray) -> np.ndarray:
        self.stream.append(("read", name))
        return array.copy()

    def launch(self, kernel: str, grid: tuple[int, int, int], block: int, arrays: list[np.ndarray]) -> None:
        node = ("launch", kernel, grid, block, arrays)
        if self.graph is not None:
            self.graph.append(node)
            return
        self.stream.append(("launch", kernel))
        self._execute(node)

    def collective(self, name: str, work: Callable[[], None] | None, kind: str = "all_reduce") -> None:
        """A collective on the work stream (None: this rank's part is done by another local rank's node)."""
        node = ("collective", name, work)
        if self.graph is not None:
            self.graph.append(node)
            return
        self.stream.append((kind, name))
        self._execute(node)

    def begin_capture(self) -> None:
        self.synchronize()
        self.stream.append(("begin_capture", ""))
        self.graph = []

    def end_capture(self) -> list[tuple[Any, ...]]:
        graph, self.graph = self.graph, None
        assert graph is not None
        self.stream.append(("end_capture", f"{len(graph)} nodes"))
        return graph

    @staticmethod
    def replay(devices: Sequence[Emulator], graphs: Sequence[list[tuple[Any, ...]]]) -> None:
        """The local ranks' graphs node by node in lockstep, so a collective runs once every rank reached it."""
        for device in devices:
            device.stream.append(("graph_launch", f"{len(graphs[0])} nodes"))
        for nodes in zip(*graphs, strict=True):
            for device, node in zip(devices, nodes, strict=True):
                device._execute(node)

    def synchronize(self) -> None:
        """Everything enqueued has run (the emulator executes in order as it is enqueued)."""

    def _execute(self, node: tuple[Any, ...]) -> None:
        if node[0] == "collective":
            if node[2] is not None:
                node[2]()
            return
        _, kernel, grid, block, arrays = node
        shape = self.launches.get((grid, block))
        if shape is None:
            shape = self.launches[(grid, block)] = _Launch.of(grid, block)
        started = time.perf_counter()
        self.kernels[kernel].run(arrays, shape)
        self.kernel_seconds[kernel] = self.kernel_seconds.get(kernel, 0.0) + time.perf_counter() - started


class Gpu:
    """A GPU (through cupy) as a device of the host runtime: one non-blocking work stream that every allocation,
    fill, copy, launch and collective goes on; `kernels.cu` compiled once per source and each kernel's function
    resolved once; bf16 buffers as uint16 bit patterns; a graph captured from the work stream (after a check that
    nothing before it failed) and replayed on it."""

    kind = "gpu"

    def __init__(self, rank: int = 0, cupy: Any = None):
        if cupy is None:
            import cupy  # type: ignore[import-not-found, no-redef]
        self.cp, self.rank = cupy, rank
        count = max(int(cupy.cuda.runtime.getDeviceCount()), 1)
        cupy.cuda.Device(rank % count).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.modules: dict[str, Any] = {}
        self.functions: dict[str, Any] = {}
        self.capturing = False

    def _type(self, element: str) -> Any:
        return {"f32": self.cp.float32, "bf16": self.cp.uint16, "i64": self.cp.int64}[element]

    def load(self, kernels: dict[str, Any], cuda_source: str) -> None:
        module = self.modules.get(cuda_source)
        if module is None:
            module = self.modules[cuda_source] = _compile_cuda(self.cp, cuda_source)
        for name in kernels:
            if name not in self.functions:
                self.functions[name] = module.get_function(name)

    def alloc(self, name: str, shape: tuple[int, ...], element: str) -> Any:
        with self.stream:  # cupy's pool is stream-ordered; the zero fill is a kernel on the work stream
            return self.cp.zeros(shape, self._type(element))

    def upload(self, name: str, values: np.ndarray, element: str) -> Any:
        host = values if values.dtype == np.uint16 else bf16_bits(values) if element == "bf16" else values
        with self.stream:
            array = self.cp.empty(values.shape, self._type(element))
        array.set(np.ascontiguousarray(host), stream=self.stream)
        return array

    def write(self, name: str, array: Any, values: np.ndarray) -> None:
        array.set(np.ascontiguousarray(values, array.dtype), stream=self.stream)

    def fill(self, name: str, array: Any) -> None:
        with self.stream:
            array.fill(0)

    def read(self, name: str, array: Any) -> np.ndarray:
        return array.get(stream=self.stream)  # waits for the stream

    def launch(self, kernel: str, grid: tuple[int, int, int], block: int, arrays: list[Any]) -> None:
        with self.stream:
            self.functions[kernel](grid, (block, 1, 1), tuple(arrays))

    def collective(self, name: str, work: Callable[[], None] | None, kind: str = "all_reduce") -> None:
        if work is not None:
            work()

    def begin_capture(self) -> None:
        self.synchronize()  # a fault of an eager launch surfaces here, not as a broken capture
        self.stream.begin_capture()
        self.capturing = True

    def end_capture(self) -> Any:
        self.capturing = False
        return self.stream.end_capture()

    @staticmethod
    def replay(devices: Sequence[Gpu], graphs: Sequence[Any]) -> None:
        for device, graph in zip(devices, graphs, strict=True):
            graph.launch(stream=device.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()
        self.cp.cuda.runtime.deviceSynchronize()


# -- collectives: in one process, over MPI, over NCCL ------------------------------------------------------------


class LocalRanks:
    """Every rank in this process (emulated chips): a sum of the ranks' buffers in rank order, as the reference
    sums the chips' partial results, run by rank 0's stream once every rank has reached it."""

    def all_reduce(self, name: str, parts: Sequence[tuple[Any, Any]]) -> None:
        arrays = [array for _, array in parts]

        def total() -> None:
            summed = arrays[0].copy()
            for array in arrays[1:]:
                summed += array
            for array in arrays:
                array[...] = summed

        for index, (device, _) in enumerate(parts):
            device.collective(name, total if index == 0 else None)

    def all_gather(self, name: str, parts: Sequence[tuple[Any, Any, Any]], axis: int) -> None:
        """The ranks' shares (`parts`: device, share, whole) side by side along `axis` in rank order, into every
        rank's whole buffer, by rank 0's stream once every rank has reached it."""

        def gather() -> None:
            whole = np.concatenate([share for _, share, _ in parts], axis=axis)
            for _, _, out in parts:
                out[...] = whole

        for index, (device, _, _) in enumerate(parts):
            device.collective(name, gather if index == 0 else None, "all_gather")


class MpiRanks:
    """One rank a process on the emulator device: MPI's Allreduce (sum) in place on the rank's buffer."""

    def __init__(self, comm: Any):
        self.comm = comm

    def all_reduce(self, name: str, parts: Sequence[tuple[Any, Any]]) -> None:
        from mpi4py import MPI  # type: ignore[import-not-found]

        ((device, array),) = parts
        device.collective(name, lambda: self.comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM))

    def all_gather(self, name: str, parts: Sequence[tuple[Any, Any, Any]], axis: int) -> None:
        """MPI's Allgather: the ranks' shares in rank order (rank-major), then laid side by side along `axis`."""
        ((device, share, out),) = parts
        staged = np.empty((self.comm.Get_size(), *share.shape), share.dtype)

        def gather() -> None:
            self.comm.Allgather(np.ascontiguousarray(share), staged)
            out[...] = np.concatenate(list(staged), axis=axis)

        device.collective(name, gather, "all_gather")


class NcclRanks:
    """One GPU a process: NCCL's all-reduce (sum) in place on the work stream (captured with the step's graph);
    the unique id made by rank 0 and broadcast over MPI (no file, nothing stale, any number of nodes)."""

    def __init__(self, comm: Any, rank: int, world: int):
        from cupy.cuda import nccl  # type: ignore[import-not-found]

        uid = nccl.get_unique_id() if rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl = nccl
        self.world = world
        self.communicator = nccl.NcclCommunicator(world, uid, rank)
        self.staging: dict[str, Any] = {}

    def all_reduce(self, name: str, parts: Sequence[tuple[Any, Any]]) -> None:
        ((device, array),) = parts
        kinds = {"float32": self.nccl.NCCL_FLOAT32}

        def reduce() -> None:
            self.communicator.allReduce(
                array.data.ptr, array.data.ptr, array.size, kinds[str(array.dtype)], self.nccl.NCCL_SUM,
                device.stream.ptr,
            )  # fmt: skip

        device.collective(name, reduce)

    def all_gather(self, name: str, parts: Sequence[tuple[Any, Any, Any]], axis: int) -> None:
        """NCCL's all-gather (NCCL has no gather to every rank along an axis but this: the ranks' shares rank-major)
        on the work stream, captured with the step's graph. A share gathered along its first axis, or one row of
        logits, is rank-major already and lands in the whole buffer itself; else it lands in a staging buffer
        (allocated before any capture) and one copy kernel lays the shares side by side along `axis`."""
        ((device, share, out),) = parts
        direct = all(d == 1 for d in share.shape[:axis])
        target = out
        if not direct:
            key = f"{name}:{share.shape}"
            if key not in self.staging:
                with device.stream:
                    self.staging[key] = device.cp.empty((self.world, *share.shape), share.dtype)
            target = self.staging[key]
        kinds = {"float32": self.nccl.NCCL_FLOAT32}

        def gather() -> None:
            self.communicator.allGather(
                share.data.ptr, target.data.ptr, share.size, kinds[str(share.dtype)], device.stream.ptr
            )
            if not direct:
                with device.stream:
                    moved = device.cp.moveaxis(target, 0, axis)  # a view: [.., world, share, ..]
                    out.reshape(moved.shape)[...] = moved

        device.collective(name, gather, "all_gather")


def launcher() -> tuple[int, int, Any]:
    """(rank, world, MPI communicator) of a process started by an MPI launcher (`mpiexec`, `mpirun`, `srun`),
    else (0, 1, None)."""
    import os

    markers = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "SLURM_PROCID")
    if not any(name in os.environ for name in markers):
        return 0, 1, None
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError:
        raise LogosError(
            "this process was started by an MPI launcher but mpi4py is not installed",
            hint="pip install 'logos-ir[mpi]' (mpi4py and an MPI library)",
        ) from None
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size(), comm


# -- the host runtime: one code path for both devices -------------------------------------------------------------


class HostRuntime:
    """Runs host plans on this process's ranks (`devices`: one device a local rank, ranks `first_rank`...), all
    through the device interface (`Emulator` or `Gpu`): weights uploaded once, shard by shard, from `weights`;
    caches allocated once per cache length and shared by the programs of that length; every allocation, fill and
    copy on the work stream; all-reduces and all-gathers through `ranks` (`LocalRanks`, `MpiRanks`, `NcclRanks`)."""

    def __init__(
        self, spec: Any, weights: EmulatedWeights | None, devices: Sequence[Any], ranks: Any, first_rank: int = 0
    ):
        self.spec, self.weights, self.devices, self.ranks = spec, weights, list(devices), ranks
        self.first_rank = first_rank
        self.device_weights: list[dict[str, Any]] = [{} for _ in self.devices]
        self.caches: list[dict[str, Any]] = [{} for _ in self.devices]

    def buffers(self, local: int, plan: HostPlan) -> dict[str, Any]:
        device, chip = self.devices[local], self.first_rank + local
        arrays: dict[str, Any] = {}
        for buffer in plan.buffers.values():
            if buffer.kind == "weight":
                found = self.device_weights[local].get(buffer.name)
                if found is None:
                    if self.weights is None:
                        raise LogosError("the CUDA runtime was given no weights")
                    if hasattr(self.weights, "on_device"):  # weights made on the device (the benchmark's)
                        found = self.weights.on_device(device, chip, buffer)
                    else:
                        found = device.upload(buffer.name, self.weights.share(chip, buffer), buffer.element)
                    self.device_weights[local][buffer.name] = found
                arrays[buffer.name] = found
            elif buffer.kind == "cache":
                key = f"{buffer.name}:{buffer.shape}"
                if key not in self.caches[local]:
                    self.caches[local][key] = device.alloc(buffer.name, buffer.shape, buffer.element)
                arrays[buffer.name] = self.caches[local][key]
            elif buffer.kind == "table":
                arrays[buffer.name] = device.upload(buffer.name, host_table(self.spec, buffer, chip), buffer.element)
            else:
                arrays[buffer.name] = device.alloc(buffer.name, buffer.shape, buffer.element)
        return arrays

    def reset(self) -> None:
        for device, caches in zip(self.devices, self.caches, strict=True):
            for key, cache in caches.items():
                device.fill(key, cache)

    def program(self, plan: HostPlan, cuda_source: str, graph: bool) -> HostProgram:
        return HostProgram(self, plan, cuda_source, graph)


class HostProgram:
    """One lowered program on the runtime's ranks: `inputs` and `run` as the reference interpreter has them (so the
    reference's greedy loop drives it), `logits` after each run (the head's f32 logits, read back from the first
    local rank's buffer). With `graph`, the step is captured after an eager first run and replayed after."""

    def __init__(self, runtime: HostRuntime, plan: HostPlan, cuda_source: str, graph: bool):
        self.runtime, self.plan, self.graph = runtime, plan, graph
        for device in runtime.devices:
            device.load(plan.kernels, cuda_source)
        self.chips = [runtime.buffers(local, plan) for local in range(len(runtime.devices))]
        self.inputs = {
            b.name: ("token" if b.name.startswith("token") else "position")
            for b in plan.buffers.values()
            if b.kind == "input"
        }
        self.output = next(b.name for b in plan.buffers.values() if b.kind == "output")
        self.graphs: list[Any] | None = None
        self.logits: np.ndarray | None = None

    def launch_all(self) -> None:
        devices = self.runtime.devices
        for step in self.plan.steps:
            if isinstance(step, Reduce):
                parts = [(device, arrays[step.buffer]) for device, arrays in zip(devices, self.chips, strict=True)]
                self.runtime.ranks.all_reduce(step.buffer, parts)
                continue
            if isinstance(step, Gather):
                pairs = zip(devices, self.chips, strict=True)
                gathered = [(device, arrays[step.buffer], arrays[step.result]) for device, arrays in pairs]
                self.runtime.ranks.all_gather(step.result, gathered, step.axis)
                continue
            for device, arrays in zip(devices, self.chips, strict=True):
                device.launch(step.kernel, step.grid, step.block, [arrays[name] for name in step.buffers])

    def step(self) -> None:
        devices = self.runtime.devices
        if not self.graph:
            self.launch_all()
        elif self.graphs is None:
            self.launch_all()  # this step, eager: it loads the kernels and surfaces any fault outside a capture
            for device in devices:
                device.begin_capture()
            self.launch_all()  # recorded, not run: every later step replays it
            self.graphs = [device.end_capture() for device in devices]
        else:
            type(devices[0]).replay(devices, self.graphs)

    def run(self, **inputs: Any) -> np.ndarray:
        for device, arrays in zip(self.runtime.devices, self.chips, strict=True):
            for name, values in inputs.items():
                device.write(name, arrays[name], np.asarray(values, np.int64))
        self.step()
        first, arrays = self.runtime.devices[0], self.chips[0]
        if "logits" in arrays:
            self.logits = first.read("logits", arrays["logits"])[-1].astype(np.float32)
        return first.read(self.output, arrays[self.output])


class EmulatedDevice:
    """The emulator's chips of one process in lockstep, as plans and buffers: `prepare` gives each chip's buffers
    for a plan, `run` one step of it (the host runtime's code path, on `Emulator` devices)."""

    def __init__(self, spec: Any, weights: EmulatedWeights | None, chips: int | None = None):
        count = chips or (weights.chips if weights is not None else 1)
        self.runtime = HostRuntime(spec, weights, [Emulator(r) for r in range(count)], LocalRanks())
        self.programs: dict[int, HostProgram] = {}

    def prepare(self, plan: HostPlan) -> list[dict[str, np.ndarray]]:
        program = self.runtime.program(plan, "", graph=False)
        self.programs[id(program.chips)] = program
        return program.chips

    def run(self, plan: HostPlan, chips: list[dict[str, np.ndarray]]) -> None:
        self.programs[id(chips)].step()

    def reset(self) -> None:
        self.runtime.reset()

    @property
    def kernel_seconds(self) -> dict[str, float]:
        return self.runtime.devices[0].kernel_seconds


# -- the GPU: cupy, NVRTC or nvcc -----------------------------------------------------------------------------


def gpu_count() -> int:
    """How many CUDA GPUs this process sees (0 without cupy or a driver)."""
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, no driver, no device: all mean no GPU here
        return 0


NO_GPU = (
    "the cuda backend found no GPU here (no CUDA device visible through cupy);"
    " add --emulate to run its kernels on the CPU"
)

# The rule the emitted CUDA and the IR share: products the IR keeps apart print as __fmul_rn and fused ones as
# __fmaf_rn, so -fmad cannot change a rounding; -fmad=false says so to nvcc as well.
NVCC_FLAGS = ("-O3", "-fmad=false")


def _compile_cuda(cp: Any, source: str) -> Any:
    """kernels.cu as a loaded module: nvcc to a cubin for the device's architecture when nvcc is here, else NVRTC
    through cupy."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return cp.RawModule(code=source, options=("-std=c++17", "--fmad=false"), backend="nvrtc")
    capability = cp.cuda.Device().compute_capability
    arch = f"sm_{capability}"
    with tempfile.TemporaryDirectory(prefix="logos-cuda-") as folder:
        cu, cubin = Path(folder) / "kernels.cu", Path(folder) / "kernels.cubin"
        cu.write_text(source)
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, "-o", str(cubin), str(cu)], check=True)
        return cp.RawModule(path=str(cubin))


# -- generation ------------------------------------------------------------------------------------------------


class _DeviceState:
    """What the reference's greedy loop resets between prompts: the device's KV caches."""

    def __init__(self, runtime: HostRuntime):
        self.runtime = runtime

    def reset(self) -> None:
        self.runtime.reset()


def build_program(spec: Any, cut: Any, tp: int, weights: str) -> tuple[HostPlan, str, Any]:
    """The lane's build of `cut` (no weights), read back from its artifacts: the host plan, the CUDA source and the
    identity."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.progress import Progress

    options = {"ptxas": "off"}  # the code only: no nvcc run for the build report
    request = BuildRequest(ModelSource("preset", "run", spec), cut, tp, weights, False, Progress.silent(), options)
    built = build_cuda(request)
    files = {a.path: a for a in built.artifacts}
    step = files["step.mlir"]
    return read_plan(step.data.decode("utf-8")), files["kernels.cu"].data.decode("utf-8"), step.identity


def read_build(folder: Any) -> tuple[Any, HostPlan, str, Any]:
    """A CUDA build folder's cut, host plan (from step.mlir), CUDA source and identity, as logos-compile wrote them."""
    from pathlib import Path

    from logos_ir.build import read_manifest
    from logos_ir.program import Cut, Identity

    folder = Path(folder)
    target = read_manifest(folder).get("target") or {}
    cut = Cut.parse(str(target.get("cut")))
    step = (folder / "step.mlir").read_text(encoding="utf-8")
    plan = read_plan(step, str(folder / "step.mlir"))
    identity = Identity.from_line(plan.identity)
    if identity is None:
        raise LogosError(f"{folder}/step.mlir records no identity line of its program")
    return cut, plan, (folder / "kernels.cu").read_text(encoding="utf-8"), identity


def make_runtime(spec: Any, weights: EmulatedWeights, tp: int, emulate: bool) -> HostRuntime:
    """This process's ranks: under an MPI launcher one rank (chip) a process, all-reducing over MPI (emulator) or
    NCCL (GPU, its id broadcast over MPI); else, emulated, every chip in this process (`LocalRanks`), or one GPU."""
    rank, world, comm = launcher()
    if world > 1:
        if world != tp:
            raise LogosError(
                f"{world} processes were started for a program split over {tp} chips: one process a chip",
                hint=f"start it with mpiexec -n {tp} (or srun -n {tp})",
            )
        device = Emulator(rank) if emulate else Gpu(rank)
        ranks = MpiRanks(comm) if emulate else NcclRanks(comm, rank, world)
        return HostRuntime(spec, weights, [device], ranks, first_rank=rank)
    if emulate:
        return HostRuntime(spec, weights, [Emulator(r) for r in range(tp)], LocalRanks())
    if tp > 1:
        raise LogosError(
            f"a program split over {tp} GPUs runs as {tp} processes, one a GPU",
            hint=f"start it with mpiexec -n {tp} logos-run --backend cuda --tp {tp} ...",
        )
    return HostRuntime(spec, weights, [Gpu(0)], LocalRanks())


def cuda_generator(request: Any) -> Any:
    """The `cuda` backend: the lane's kernels on the GPU, or with `emulate` on the CPU (see the module docstring);
    with `request.build`, the step module, kernels and weight image of that build folder."""
    from logos_ir.generate import Compiled, Generator

    if not request.emulate and gpu_count() == 0:
        raise LogosError(NO_GPU)
    if request.weights not in ("bf16", "f32"):
        raise LogosError(f"the cuda backend runs weights bf16 or f32, not {request.weights}")
    store = request.store
    built = read_build(request.build) if request.build is not None else None
    tp = built[1].chips if built is not None else request.tp
    image = EmulatedWeights(store, request.weights, tp, request.build if built and _has_image(request.build) else None)
    runtime = make_runtime(store.spec, image, tp, request.emulate)

    class CudaGenerator(Generator):
        """The reference's greedy loop (prompt checks, prefill chunks, decode steps, stats) over the lane's
        programs."""

        def compile_program(self, cut: Any) -> Compiled:
            if built is not None:
                if cut != built[0]:
                    raise LogosError(f"{request.build}: the build holds '{built[0].option()}', not '{cut.option()}'")
                plan, source, identity = built[1], built[2], built[3]
            else:
                plan, source, identity = build_program(self.spec, cut, self.tp, request.weights)
            return Compiled(runtime.program(plan, source, graph=cut.kind == "decode"), identity)

        def kv_state(self, ctx: int) -> Any:
            return _DeviceState(runtime)

    ctx = built[0].ctx if built is not None else request.ctx
    generator = CudaGenerator(store, ctx=ctx, prefill_rows=request.prefill_rows, tp=tp)
    if built is not None:
        generator.prompt_by_step = True  # the folder holds the decode step alone
    generator.runtime = runtime  # type: ignore[attr-defined]
    return generator


def _has_image(folder: Any) -> bool:
    from pathlib import Path

    return any(Path(folder).glob("weights*.bin"))


# -- agreement with the reference ------------------------------------------------------------------------------


@dataclass
class Agreement:
    """Teacher-forced next-token agreement of the lane with the reference, and the cosine of their logits, per
    step (the prompt's last position, then each step fed the reference's own next token)."""

    matches: list[bool]
    cosines: list[float]
    margins: list[float] = field(default_factory=list)  # the reference's top-1 minus top-2 logit, per step

    @property
    def agreement(self) -> float:
        return sum(self.matches) / len(self.matches)

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)


def _reference_logits(generator: Any, program: Any) -> np.ndarray:
    """The reference's logits of its last run, from its final hidden state and the head's math (the interpreter's
    RMS norm and projection, in f32)."""
    spec, store = generator.spec, generator.weights
    x = program.last_values[f"x{spec.layers}"][-1:].astype(np.float32)
    weight = store.get("model.norm.weight")
    mean_square = np.einsum("ij,ij->i", x, x) * np.float32(1.0 / spec.hidden)
    normed = (x * (1 / np.sqrt(mean_square + np.float32(spec.rms_eps)))[:, None]) * weight
    table = store.get("model.embed_tokens.weight" if spec.tie_embeddings else "lm_head.weight")
    return (normed @ table.T)[0]


def teacher_forced(store: Any, prompt: Sequence[int], steps: int, weights: str, prefill_rows: int = 16) -> Agreement:
    """Run the prompt then `steps` decode steps through the reference and the emulated lane side by side, both fed
    the reference's greedy tokens; compare each step's next token and logits."""
    from logos_ir.generate import Generator, default_ctx, run_program
    from logos_ir.program import Cut
    from logos_ir.runtime import RunRequest

    ctx = default_ctx(len(prompt), steps + 1)
    reference = Generator(store, ctx=ctx, prefill_rows=prefill_rows)
    lane = cuda_generator(RunRequest(store, ctx, prefill_rows, 1, weights, emulate=True))
    matches: list[bool] = []
    cosines: list[float] = []
    margins: list[float] = []

    def compare(cut: Any, tokens: list[int], positions: list[int]) -> int:
        ours, theirs = lane.program(cut), reference.program(cut)
        got = int(run_program(ours, tokens, positions)[0])
        want = int(run_program(theirs, tokens, positions)[0])
        logits, expected = ours.logits, _reference_logits(reference, theirs)
        matches.append(got == want)
        top = np.sort(expected)[-2:]
        margins.append(float(top[1] - top[0]))
        cosines.append(float(logits @ expected / (np.linalg.norm(logits) * np.linalg.norm(expected))))
        return want

    for start in range(0, len(prompt), prefill_rows):
        chunk = [t + 1 for t in prompt[start : start + prefill_rows]]
        positions = list(range(start + 1, start + len(chunk) + 1))
        token = compare(Cut.prefill(len(chunk), ctx), chunk, positions)
        if start + prefill_rows < len(prompt):
            matches.pop(), cosines.pop(), margins.pop()  # only the prompt's last position predicts a new token
    for position in range(len(prompt) + 1, len(prompt) + 1 + steps):
        token = compare(Cut.decode(ctx), [token], [position])
    return Agreement(matches, cosines, margins)
