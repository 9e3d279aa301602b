"""The CUDA lane's host runtime: runs the lane's build (the kernels and the host plan) on a GPU, or emulated on the CPU.

A build of the CUDA lane holds `step.mlir` (the lowered module: `gpu.module @kernels` and the host function `@step`
of named buffers, ordered `gpu.launch_func` and `shard.all_reduce`) and `kernels.cu` (the same kernels as CUDA C++).
This module reads those artifacts and nothing of the lowering.

* `--emulate`: `KernelEmulator` executes each `gpu.func` of `step.mlir` itself, over numpy: every thread of a launch
  is one element of a numpy array (blocks, then threads within a block, along one axis), each op of the kernel body
  one numpy operation over all threads. Threads run in lockstep, so a warp's `cuda.shuffle_xor` is a permutation of
  that axis within groups of 32; a loop whose bounds differ between threads runs until its last thread is done, each
  thread masked off once its own bound is reached; an `scf.if` narrows the mask; loads of masked-off threads read
  element 0 and their stores are dropped. bf16 weights are held as f32 arrays of bf16-rounded values (widening
  bf16 to f32 is exact, so loading them gives the GPU's values). A split program runs as that many emulated chips
  in lockstep, meeting at each `shard.all_reduce`, which sums the chips' buffers in chip order.
* the GPU (`cupy`): `kernels.cu` compiled once with NVRTC, weights uploaded once, caches allocated on the device, the
  host plan launched in order; the decode step is captured as a CUDA graph after its first run and replayed. A split
  program runs one process per GPU (`torchrun`-style: `LOGOS_RANK`, `LOGOS_WORLD`), all-reducing with NCCL from the
  `nvidia-nccl-cu13` wheel through `cupy.cuda.nccl`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logos_ir.errors import LogosError
from logos_ir.runtime.cuda_tensor_core import COMPILERS as TENSOR_CORE_COMPILERS  # issue 19 (tensor cores)
from logos_ir.passes.cuda.host_plan import (
    Buffer,
    HostPlan,
    Reduce,
    bf16_bits,
    bf16_rounded,
    read_plan,
    weight_share,
)

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
    """fmaf(a, b, c) over numpy float32 values, rounded once."""
    product = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    addend = np.asarray(c, np.float64)
    total = product + addend
    back = total - product
    error = (product - (total - back)) + (addend - back)
    bits = np.asarray(total).view(np.int64)
    odd_needed = (error != 0) & ((bits & 1) == 0) & np.isfinite(total)
    if np.any(odd_needed):
        total = np.where(odd_needed, np.nextafter(total, np.where(error > 0, np.inf, -np.inf)), total)
    result = np.asarray(total).astype(np.float32)
    return result if result.ndim else np.float32(result)


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
    memory = em._slot(op.memref)
    indices = [em._slot(v) for v in op.indices]
    strides = _memref_strides(op.memref)
    outs = [em._slot(v) for v in op.results]

    width = len(outs)

    size, role = _size(op.memref), _role(op.memref)

    def step(env: Env, mask: Mask) -> None:
        # A 16-byte load faults on a GPU unless its address is a multiple of its size: the flat index must be a
        # multiple of the width (buffers start 256-byte aligned). Then the buffer viewed as rows of `width`
        # elements gives every thread's vector in one gather.
        flat = _flat(env, indices, strides, mask)
        _check_bounds(em, op, flat + (width - 1), size, role)
        _check_bounds(em, op, flat, size, role)
        odd = flat % width
        if np.any(odd):
            raise _fault(em, op, f"loads {width} elements of {role} from a misaligned index", odd != 0, flat)
        vectors = env[memory].reshape(-1, width)[flat // width]
        for offset, out in enumerate(outs):
            env[out] = vectors[..., offset]

    return step


def _shuffle_xor(em: KernelEmulator, op: Any) -> Step:
    value, out = em._slot(op.value), em._slot(op.result)
    offset = op.offset.value.data

    def step(env: Env, mask: Mask) -> None:
        assert em.launch is not None
        data = env[value]
        if not isinstance(data, np.ndarray) or data.shape != (em.launch.threads,):
            env[out] = data  # the same on every lane
            return
        env[out] = data[em.launch.partner(offset)]

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
    yields = [[em._slot(v) for v in region.block.last_op.operands] for region in (op.true_region, op.false_region)] if results else []

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
    "arith.extf": _unary(lambda x: x),  # a bf16 buffer already holds its values widened to f32
    "math.exp": _unary(_f32(np.exp)),
    "math.sqrt": _unary(_f32(np.sqrt)),
    "math.tanh": _unary(_f32(np.tanh)),
    "memref.load": _load,
    "memref.store": _store,
    "cuda.vector_load": _vector_load,
    "cuda.shuffle_xor": _shuffle_xor,
    "gpu.thread_id": _thread_id,
    "gpu.block_id": _block_id,
    "scf.for": _for,
    "scf.if": _if,
    "memref.atomic_rmw": _atomic_rmw,
    "cuda.thread_fence": _nothing,  # threads run in lockstep: every earlier write is already visible
    "scf.yield": _nothing,
    "gpu.return": _nothing,
}
_COMPILERS.update(TENSOR_CORE_COMPILERS)  # issue 19 (tensor cores): shared memory, cp.async, ldmatrix, mma.sync


# -- device images: the weights as the kernels read them ------------------------------------------------------


def rope_tables(spec: Any, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed sin ([-sin, sin]) per position over a whole head, as the reference builds them."""
    from logos_ir.interpreter import rope_inv_freq

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
    """The device image of every chip's weights, converted once (bf16-rounded f32 arrays for bf16) and shared by
    every program of a run."""

    def __init__(self, store: Any, image: str, chips: int):
        self.store, self.image, self.chips = store, image, chips
        self._arrays: dict[tuple[int, str], np.ndarray] = {}

    def get(self, chip: int, buffer: Buffer) -> np.ndarray:
        key = (chip, buffer.name)
        found = self._arrays.get(key)
        if found is None:
            share = np.ascontiguousarray(
                weight_share(self.store, buffer.name, buffer.shape, chip, self.chips), np.float32
            )
            found = self._arrays[key] = bf16_rounded(share) if buffer.element == "bf16" else share
        return found


class EmulatedDevice:
    """Runs host plans on emulated chips: every buffer a numpy array per chip; caches shared between the plans of
    one cache length (a prefill chunk fills what a decode step then reads)."""

    def __init__(self, spec: Any, weights: EmulatedWeights):
        self.spec, self.weights = spec, weights
        self.caches: dict[tuple[int, str], np.ndarray] = {}
        self.kernels: dict[str, KernelEmulator] = {}
        self.launches: dict[tuple[tuple[int, int, int], int], _Launch] = {}
        self.kernel_seconds: dict[str, float] = {}

    def prepare(self, plan: HostPlan) -> list[dict[str, np.ndarray]]:
        """Every chip's buffers for `plan` (weights from the image, caches shared, the rest fresh)."""
        for name, kernel in plan.kernels.items():
            if name not in self.kernels:
                self.kernels[name] = KernelEmulator(kernel)
        chips = []
        for chip in range(plan.chips):
            arrays: dict[str, np.ndarray] = {}
            for buffer in plan.buffers.values():
                arrays[buffer.name] = self._array(chip, buffer)
            chips.append(arrays)
        return chips

    def _array(self, chip: int, buffer: Buffer) -> np.ndarray:
        if buffer.kind == "weight":
            return self.weights.get(chip, buffer)
        if buffer.kind == "cache":
            key = (chip, f"{buffer.name}:{buffer.shape}")
            found = self.caches.get(key)
            if found is None:
                found = self.caches[key] = np.zeros(buffer.shape, np.float32)
            return found
        if buffer.kind == "table":
            return host_table(self.spec, buffer, chip)
        return np.zeros(buffer.shape, np.int64 if buffer.element == "i64" else np.float32)

    def reset(self) -> None:
        for cache in self.caches.values():
            cache.fill(0)

    def run(self, plan: HostPlan, chips: list[dict[str, np.ndarray]]) -> None:
        """One step of the plan on every chip, in lockstep, meeting at each all-reduce."""
        for step in plan.steps:
            if isinstance(step, Reduce):
                total = chips[0][step.buffer].copy()
                for arrays in chips[1:]:
                    total += arrays[step.buffer]
                for arrays in chips:
                    arrays[step.buffer][...] = total
                continue
            kernel = self.kernels[step.kernel]
            launch = self._launch(step.grid, step.block)
            started = time.perf_counter()
            for arrays in chips:
                kernel.run([arrays[name] for name in step.buffers], launch)
            self.kernel_seconds[step.kernel] = self.kernel_seconds.get(step.kernel, 0.0) + time.perf_counter() - started

    def _launch(self, grid: tuple[int, int, int], block: int) -> _Launch:
        key = (grid, block)
        found = self.launches.get(key)
        if found is None:
            found = self.launches[key] = _Launch.of(grid, block)
        return found


# -- the GPU: cupy, NVRTC or nvcc, CUDA graphs, NCCL -----------------------------------------------------------


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


class GpuDevice:
    """Runs host plans on one GPU (this process's rank of a split program): `kernels.cu` compiled once per
    program, weights uploaded once from the device image, caches on the device shared by the plans of one cache
    length, the decode step captured as a CUDA graph after its first run. Ranks of a split program all-reduce
    with NCCL (`cupy.cuda.nccl`, the `nvidia-nccl-cu13` wheel): `LOGOS_RANK` and `LOGOS_WORLD` name this
    process's rank, `LOGOS_NCCL_ID` a file through which rank 0 hands the others NCCL's unique id."""

    def __init__(self, spec: Any, weights: EmulatedWeights, rank: int = 0, world: int = 1):
        import cupy  # type: ignore[import-not-found]

        self.cp, self.spec, self.weights = cupy, spec, weights
        self.rank, self.world = rank, world
        cupy.cuda.Device(rank % max(gpu_count(), 1)).use()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.device_weights: dict[str, Any] = {}
        self.caches: dict[str, Any] = {}
        self.modules: dict[str, Any] = {}
        self.graphs: dict[int, Any] = {}
        self.nccl = self._communicator() if world > 1 else None

    def _communicator(self) -> Any:
        import os
        from pathlib import Path

        from cupy.cuda import nccl  # type: ignore[import-not-found]

        path = Path(os.environ.get("LOGOS_NCCL_ID", "/tmp/logos-nccl-id"))
        if self.rank == 0:
            uid = nccl.get_unique_id()
            path.write_bytes(bytes(b % 256 for b in uid))
        else:
            while not path.exists() or path.stat().st_size < 128:
                time.sleep(0.01)
            uid = tuple(b if b < 128 else b - 256 for b in path.read_bytes())
        return nccl.NcclCommunicator(self.world, uid, self.rank)

    def module(self, cuda_source: str) -> Any:
        found = self.modules.get(cuda_source)
        if found is None:
            found = self.modules[cuda_source] = _compile_cuda(self.cp, cuda_source)
        return found

    def prepare(self, plan: HostPlan) -> dict[str, Any]:
        cp = self.cp
        arrays: dict[str, Any] = {}
        for buffer in plan.buffers.values():
            if buffer.kind == "weight":
                arrays[buffer.name] = self._weight(buffer)
            elif buffer.kind == "cache":
                key = f"{buffer.name}:{buffer.shape}"
                if key not in self.caches:
                    self.caches[key] = cp.zeros(buffer.shape, cp.float32)
                arrays[buffer.name] = self.caches[key]
            elif buffer.kind == "table":
                arrays[buffer.name] = cp.asarray(host_table(self.spec, buffer, self.rank))
            else:
                arrays[buffer.name] = cp.zeros(buffer.shape, cp.int64 if buffer.element == "i64" else cp.float32)
        return arrays

    def _weight(self, buffer: Buffer) -> Any:
        found = self.device_weights.get(buffer.name)
        if found is None:
            values = self.weights.get(self.rank, buffer)
            host = bf16_bits(values) if buffer.element == "bf16" else values
            found = self.device_weights[buffer.name] = self.cp.asarray(host)
        return found

    def reset(self) -> None:
        for cache in self.caches.values():
            cache.fill(0)

    def launch_all(self, plan: HostPlan, module: Any, arrays: dict[str, Any]) -> None:
        with self.stream:  # cupy launches a raw kernel on the current stream
            for step in plan.steps:
                if isinstance(step, Reduce):
                    self._all_reduce(arrays[step.buffer])
                    continue
                kernel = module.get_function(step.kernel)
                kernel(step.grid, (step.block, 1, 1), tuple(arrays[name] for name in step.buffers))

    def _all_reduce(self, array: Any) -> None:
        if self.nccl is None:
            return
        from cupy.cuda import nccl  # type: ignore[import-not-found]

        self.nccl.allReduce(
            array.data.ptr, array.data.ptr, array.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, self.stream.ptr
        )

    def run(self, plan: HostPlan, module: Any, arrays: dict[str, Any], graph: bool) -> None:
        """One step; with `graph`, the step's launches are captured once as a CUDA graph and replayed after."""
        key = id(arrays)
        if not graph or self.nccl is not None:  # NCCL calls are kept out of graphs
            self.launch_all(plan, module, arrays)
            return
        captured = self.graphs.get(key)
        if captured is None:
            self.launch_all(plan, module, arrays)  # a first, eager run loads the kernels
            self.stream.begin_capture()
            self.launch_all(plan, module, arrays)
            captured = self.graphs[key] = self.stream.end_capture()
            return  # the capture did not execute: the eager run above was this step
        captured.launch(stream=self.stream)


def _compile_cuda(cp: Any, source: str) -> Any:
    """kernels.cu as a loaded module: nvcc to a cubin for sm_90 when nvcc is here, else NVRTC through cupy."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return cp.RawModule(code=source, options=("-std=c++17",), backend="nvrtc")
    major, minor = cp.cuda.Device().compute_capability[:1], cp.cuda.Device().compute_capability[1:]
    arch = f"sm_{major}{minor}"
    with tempfile.TemporaryDirectory(prefix="logos-cuda-") as folder:
        cu, cubin = Path(folder) / "kernels.cu", Path(folder) / "kernels.cubin"
        cu.write_text(source)
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", "-o", str(cubin), str(cu)], check=True)
        return cp.RawModule(path=str(cubin))


# -- generation ------------------------------------------------------------------------------------------------


class _Program:
    """One lowered program bound to a device: `inputs` and `run` as the reference interpreter has them, so the
    reference's greedy loop drives it."""

    def __init__(self, plan: HostPlan, cuda_source: str, device: EmulatedDevice | GpuDevice, graph: bool):
        self.plan, self.device, self.graph = plan, device, graph
        if isinstance(device, GpuDevice):
            self.module = device.module(cuda_source)
            self.arrays: Any = device.prepare(plan)
        else:
            self.chips = device.prepare(plan)
        self.inputs = {
            b.name: ("token" if b.name.startswith("token") else "position")
            for b in plan.buffers.values()
            if b.kind == "input"
        }
        self.output = next(b.name for b in plan.buffers.values() if b.kind == "output")

    def run(self, **inputs: Any) -> np.ndarray:
        if isinstance(self.device, GpuDevice):
            for name, values in inputs.items():
                self.arrays[name].set(np.asarray(values, np.int64), stream=self.device.stream)
            self.device.run(self.plan, self.module, self.arrays, self.graph)
            return self.arrays[self.output].get(stream=self.device.stream)
        for arrays in self.chips:
            for name, values in inputs.items():
                arrays[name][...] = np.asarray(values, np.int64)
        self.device.run(self.plan, self.chips)
        return self.chips[0][self.output].copy()


class _DeviceState:
    """What the reference's greedy loop resets between prompts: the device's KV caches."""

    def __init__(self, device: EmulatedDevice | GpuDevice):
        self.device = device

    def reset(self) -> None:
        self.device.reset()


def build_program(spec: Any, cut: Any, tp: int, weights: str) -> tuple[HostPlan, str, Any]:
    """The lane's build of `cut` (no weights), read back from its artifacts: the host plan, the CUDA source and the
    identity."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.progress import Progress

    request = BuildRequest(ModelSource("preset", "run", spec), cut, tp, weights, False, Progress.silent())
    built = build_cuda(request)
    files = {a.path: a for a in built.artifacts}
    step = files["step.mlir"]
    return read_plan(step.data.decode("utf-8")), files["kernels.cu"].data.decode("utf-8"), step.identity


def cuda_generator(request: Any) -> Any:
    """The `cuda` backend: the lane's kernels on the GPU, or with `emulate` on the CPU (see the module docstring)."""
    import os

    from logos_ir.generate import Compiled, Generator

    if not request.emulate and gpu_count() == 0:
        raise LogosError(NO_GPU)
    if request.weights not in ("bf16", "f32"):
        raise LogosError(f"the cuda backend runs weights bf16 or f32, not {request.weights}")
    rank, world = int(os.environ.get("LOGOS_RANK", "0")), int(os.environ.get("LOGOS_WORLD", "1"))
    if not request.emulate and request.tp > 1 and world != request.tp:
        raise LogosError(
            f"a program split over {request.tp} GPUs runs as {request.tp} processes, one a GPU",
            hint=f"launch one logos-run a rank with LOGOS_RANK=0..{request.tp - 1} and LOGOS_WORLD={request.tp}",
        )
    store = request.store
    image = EmulatedWeights(store, request.weights, request.tp)
    device: EmulatedDevice | GpuDevice = (
        EmulatedDevice(store.spec, image) if request.emulate else GpuDevice(store.spec, image, rank, world)
    )

    class CudaGenerator(Generator):
        """The reference's greedy loop (prompt checks, prefill chunks, decode steps, stats) over the lane's
        programs."""

        def compile_program(self, cut: Any) -> Compiled:
            plan, source, identity = build_program(self.spec, cut, self.tp, request.weights)
            return Compiled(_Program(plan, source, device, graph=cut.kind == "decode"), identity)

        def kv_state(self, ctx: int) -> Any:
            return _DeviceState(device)

    generator = CudaGenerator(store, ctx=request.ctx, prefill_rows=request.prefill_rows, tp=request.tp)
    generator.device = device  # type: ignore[attr-defined]
    return generator


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
        logits, expected = ours.chips[0]["logits"][0], _reference_logits(reference, theirs)
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
