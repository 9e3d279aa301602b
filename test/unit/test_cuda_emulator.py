"""The CUDA emulator fails where a GPU would: a 16-byte load off its alignment, an access outside a buffer and an
index past the 32 bits the emitted C computes in are errors naming the kernel and the op; `math.fma` rounds once
(as `__fmaf_rn`), `arith.maxnumf` keeps fmaxf's NaN rule. Each kernel here is built with the lane's own builder.
Nor does it hide what a GPU does not promise: on the lane's split-K QKV kernel (warps handing partial sums to the
last of them through fences and an atomic count), a missing fence is a fault, seeded interleavings keep its bits
and catch a hand-off that assumes warps finish in order; a shuffle or warp barrier under divergence is a fault."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from xdsl.dialects import gpu, math
from xdsl.dialects.builtin import Float32Type, MemRefType
from xdsl.rewriter import InsertPoint

from logos_ir.errors import LogosError
from logos_ir.passes.cuda.thread_code import Body
from logos_ir.runtime.cuda.emulator import EmulatorFault, KernelEmulator, LaunchShape, fma_f32


def _run(body: Callable[[Body, list], None], size: int = 64, threads: int = 16) -> np.ndarray:
    kind = MemRefType(Float32Type(), [size])
    kernel = gpu.FuncOp("probe", ([kind, kind], []), kernel=True)
    x, out = kernel.body.block.args
    x.name_hint, out.name_hint = "x", "out"
    b = Body(kernel.body.block)
    body(b, [x, out])
    b.op(gpu.ReturnOp([]))
    data, result = np.arange(size, dtype=np.float32), np.zeros(size, np.float32)
    KernelEmulator(kernel).run([data, result], LaunchShape.of((1, 1, 1), threads))
    return result


def test_an_aligned_vector_load_runs() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        b.store(b.vload(x, [b.mul(t, 4)], 4)[1], out, [t])

    assert _run(body)[:16].tolist() == [4 * t + 1 for t in range(16)]


def test_a_misaligned_vector_load_is_refused_by_kernel_and_op() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        b.store(b.vload(x, [b.add(b.mul(t, 4), 1)], 4)[0], out, [t])  # one element off: a GPU faults

    with pytest.raises(EmulatorFault, match=r"kernel probe: 'vector.load' loads 4 elements of 'x' from a misal"):
        _run(body, size=80)


def test_an_out_of_bounds_load_is_refused() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        b.store(b.load(x, [b.add(t, 50)]), out, [t])  # threads 14 and 15 read past 64

    fault = r"kernel probe: 'memref.load' accesses 'x' outside its 64 elements \(block \(0, 0, 0\), thread 14: 64\)"
    with pytest.raises(EmulatorFault, match=fault):
        _run(body)


def test_an_out_of_bounds_store_is_refused_but_a_masked_off_thread_is_not() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        where = b.add(t, 56)
        b.when(b.cmp("ult", where, 64), lambda: b.store(b.load(x, [t]), out, [where]))  # guarded: fine

    assert _run(body)[56:].tolist() == list(range(8))

    def unguarded(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        b.store(b.load(x, [t]), out, [b.add(t, 56)])

    with pytest.raises(EmulatorFault, match="'memref.store' accesses 'out' outside its 64 elements"):
        _run(unguarded)


def test_an_index_past_32_bits_is_refused() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        far = b.mul(b.add(t, 1), 1 << 28)  # thread 7 reaches 2^31: an int overflows in the emitted C
        b.store(b.load(x, [b.rem(far, 64)]), out, [t])

    with pytest.raises(EmulatorFault, match=r"'arith.muli' overflows the 32-bit index .* thread 7: 2147483648"):
        _run(body)


def test_fma_rounds_once() -> None:
    a = np.float32(1 + 2**-13)
    product = a * a  # 1 + 2^-12 + 2^-26, rounded to 1 + 2^-12 in f32
    assert product - np.float32(1 + 2**-12) == 0
    assert fma_f32(a, a, np.float32(-(1 + 2**-12))) == np.float32(2**-26)  # fused: the 2^-26 survives
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(10000).astype(np.float32) for _ in range(3))
    exact = x.astype(np.float64) * y + z  # the f64 sum of an exact product: within half an f32 ulp of the fma
    got = fma_f32(x, y, z)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= np.spacing(np.abs(got)) / 2 * (1 + 1e-9))


def test_fma_moves_a_double_rounded_tie_the_way_the_exact_sum_lies() -> None:
    # a*b = 2^-24 (1 - 2^-46), so a*b + c lies just below the f32 midpoint between c and its next value; the f64
    # sum rounds onto that midpoint, and f32 rounding of it (ties to even) would give the wrong neighbour.
    a, b, c = np.float32(1 + 2**-23), np.float32(2**-24 * (1 - 2**-23)), np.float32(1 + 2**-23)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) != c  # the double rounding this avoids
    assert fma_f32(a, b, c) == c
    # the same tie among ordinary values, each direction, in a 2-d array (the vectorised path)
    rng = np.random.default_rng(1)
    x, y, z = (rng.standard_normal((3, 50)).astype(np.float32) for _ in range(3))
    x[1, 7], y[1, 7], z[1, 7] = a, b, c
    x[2, 9], y[2, 9], z[2, 9] = -a, b, -c
    got = fma_f32(x, y, z)
    assert got[1, 7] == c and got[2, 9] == -c
    assert got[0].tolist() == [fma_f32(*v) for v in zip(x[0], y[0], z[0], strict=True)]


def test_maxnumf_keeps_fmaxf_nan_rule() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        nan = b.fdiv(b.fconst(0.0), b.fconst(0.0))
        b.store(b.fmax(nan, b.load(x, [t])), out, [t])

    assert _run(body)[:16].tolist() == list(range(16))  # fmaxf(NaN, v) is v


def test_an_op_without_a_compiler_is_refused_by_name() -> None:
    def body(b: Body, args: list) -> None:
        x, out = args
        t = b.thread()
        b.store(b.op(math.LogOp(b.load(x, [t]))), out, [t])

    with pytest.raises(LogosError, match=r"the CUDA emulator does not know 'math.log' \(in kernel probe\)"):
        _run(body)


# -- what a GPU does not promise: ordering between warps, the order they run in, a warp that diverges ----------


OUTPUTS = ("turned_query", "cache.key.0", "cache.value.0")


def _handoff() -> tuple[Any, Any, list[np.ndarray]]:
    """The lane's split-K QKV kernel as lowered for a model of 384 rotation pairs 512 deep (f32: each pair's depth
    in 2 parts, a warp a part: each writes its part's sums, fences, counts itself with an atomic; the last of a pair
    fences again, adds the parts in order and runs the rope and cache epilogue), with random inputs at position 10
    and a partials buffer of NaN (what a read before the write would see)."""
    from test_cuda_lane import MODELS

    from logos_ir.program import Cut
    from logos_ir.runtime.cuda.artifacts import build_program

    plan, _, _ = build_program(MODELS["qkv-split-k"], Cut.decode(64), 1, "f32")
    launch = next(launch for launch in plan.launches if launch.kernel.startswith("qkv_"))
    rng = np.random.default_rng(4)
    arrays = []
    for name in launch.buffers:
        buffer = plan.buffers[name]
        if name == "position":
            arrays.append(np.array([10], np.int64))
        elif buffer.element == "i64":
            arrays.append(np.zeros(buffer.shape, np.int64))
        elif name == "qkv.partial":
            arrays.append(np.full(buffer.shape, np.nan, np.float32))
        else:
            arrays.append(rng.standard_normal(buffer.shape).astype(np.float32))
    return plan.kernels[launch.kernel], launch, arrays


def _run_handoff(kernel: Any, launch: Any, arrays: list[np.ndarray], seed: int | None = None) -> np.ndarray:
    copies = [a.copy() for a in arrays]
    KernelEmulator(kernel, seed).run(copies, LaunchShape.of(launch.grid, launch.block))
    return np.concatenate([copies[launch.buffers.index(name)].reshape(-1) for name in OUTPUTS])


def _mutated(kernel: Any, edit: Callable[[list[Any]], None]) -> Any:
    clone = kernel.clone()
    edit(list(clone.walk()))
    return clone


def test_removing_a_fence_of_a_hand_off_between_warps_is_a_fault() -> None:
    """Both fences gone (lockstep made every write visible, so the tokens stayed the same), or the last warp's alone
    (its loads could move above its count): the last warp's read of another warp's partial is refused."""
    kernel, launch, arrays = _handoff()
    assert np.isfinite(_run_handoff(kernel, launch, arrays)).all()
    assert len([op for op in kernel.walk() if op.name == "llvm.fence"]) == 2

    def drop(which: list[int]) -> Callable[[list[Any]], None]:
        def edit(ops: list[Any]) -> None:
            found = [op for op in ops if op.name == "llvm.fence"]
            for i in which:
                found[i].detach()
                found[i].erase()

        return edit

    with pytest.raises(EmulatorFault, match=r"reads 'partial' written by another warp .* no fence between that write"):
        _run_handoff(_mutated(kernel, drop([0, 1])), launch, arrays)
    with pytest.raises(EmulatorFault, match=r"no fence between its warp's atomic count and the read"):
        _run_handoff(_mutated(kernel, drop([1])), launch, arrays)


def test_seeded_interleavings_keep_the_hand_off_and_catch_one_that_assumes_an_order() -> None:
    """With a seed the kernel's warps run as separate parts in a seeded order and atomics serve in a seeded order:
    the lane's kernel gives the lockstep bits under every seed (the last warp adds the parts in part order, whoever
    it is). A kernel that takes its part index for its place in the count (the last part's warp finishes the pair,
    as if warps finished in order) gives the right bits in lockstep, where warps count in thread order; seeded, it
    reads partials not yet written (NaN) or before their writers counted, and is caught."""
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import IntegerType
    from xdsl.rewriter import Rewriter

    kernel, launch, arrays = _handoff()
    want = _run_handoff(kernel, launch, arrays)
    for seed in range(2):
        assert np.array_equal(_run_handoff(kernel, launch, arrays, seed), want)

    def in_order(ops: list[Any]) -> None:
        partial = ops[0].body.block.args[launch.buffers.index("qkv.partial")]
        part = next(op for op in ops if op.name == "memref.store" and op.operands[1] is partial).operands[3]
        atomic = next(op for op in ops if op.name == "memref.atomic_rmw")
        place = arith.IndexCastOp(part, IntegerType(64))
        Rewriter.insert_op(place, InsertPoint.before(atomic))
        atomic.result.replace_all_uses_with(place.result)

    ordered = _mutated(kernel, in_order)
    assert np.array_equal(_run_handoff(ordered, launch, arrays), want)  # lockstep hides it
    caught = 0
    for seed in range(2):
        try:
            got = _run_handoff(ordered, launch, arrays, seed)
        except EmulatorFault as fault:
            assert "before its warp counted after the writer's" in str(fault)
            caught += 1
        else:
            caught += int(not np.array_equal(got, want, equal_nan=True))
    assert caught == 2, caught


def test_a_shuffle_or_warp_barrier_under_divergence_is_a_fault() -> None:
    """`__shfl_xor_sync(0xffffffff, ...)` and `__syncwarp()` need all 32 lanes: reached by the first 16 lanes of a
    warp alone they are refused, naming the warp; reached by whole warps (a condition on the warp) they run."""

    def body(split: int, op: str) -> Callable[[Body, list], None]:
        def build(b: Body, args: list) -> None:
            x, out = args
            t = b.thread()

            def then() -> None:
                if op == "shuffle":
                    b.store(b.shuffle(b.load(x, [t]), 1), out, [t])
                else:
                    b.thread_fence()

            b.when(b.cmp("ult", t, split), then)

        return build

    assert _run(body(32, "shuffle"), threads=64)[:4].tolist() == [1, 0, 3, 2]
    _run(body(32, "sync"), threads=64)
    with pytest.raises(EmulatorFault, match=r"'gpu.shuffle' .* is reached by 16 of the 32 lanes of the warp from"):
        _run(body(16, "shuffle"), threads=64)
    with pytest.raises(EmulatorFault, match=r"'nvvm.bar.warp.sync' .* is reached by 16 of the 32 lanes"):
        _run(body(16, "sync"), threads=64)


def test_a_programmatic_kernel_touching_memory_before_its_wait_is_refused() -> None:
    """Launched programmatically, a kernel runs while the one before it still writes: the emulator (which runs
    launches one after another) refuses any access before the wait rather than hiding the race, and a wait nested
    in a branch or loop; with the wait first, the kernel runs and is one the host launches programmatically."""
    from logos_ir.dialects import cuda

    def copy(before_wait: bool, nested: bool = False) -> Callable[[Body, list], None]:
        def body(b: Body, args: list) -> None:
            x, out = args
            t = b.thread()
            if before_wait:
                b.store(b.load(x, [t]), out, [t])
            wait = cuda.GridDepControlOp(cuda.GridDepAction.WAIT)

            def waits(i: Any, carried: list) -> list:
                b.op(wait)
                return []

            if nested:
                b.loop(0, 1, 1, [], waits)
            else:
                b.op(wait)
            b.store(b.load(x, [t]), out, [t])

        return body

    assert _run(copy(False))[:16].tolist() == list(range(16))
    with pytest.raises(EmulatorFault, match=r"kernel probe: memref.load before griddepcontrol.wait: launched"):
        _run(copy(True))
    with pytest.raises(EmulatorFault, match=r"kernel probe: its griddepcontrol.wait must be one op of its top level"):
        _run(copy(False, nested=True))
