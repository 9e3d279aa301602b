"""The CUDA emulator fails where a GPU would: a 16-byte load off its alignment, an access outside a buffer and an
index past the 32 bits the emitted C computes in are errors naming the kernel and the op; `math.fma` rounds once
(as `__fmaf_rn`), `arith.maxnumf` keeps fmaxf's NaN rule. Each kernel here is built with the lane's own builder."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from xdsl.dialects import gpu, math
from xdsl.dialects.builtin import Float32Type, MemRefType

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
