"""The CUDA lane's Hopper prefill products (wgmma fed by TMA), executed by the emulator from the lowered IR.

* A small model shaped for the wgmma path (hidden 128, intermediate 384: the down projection's 6 slices wrap the
  4-stage ring, so the mbarrier parities turn) in a 200-row chunk (a full 128-row tile and a partial one; the
  64-column K/V projections leave half the 128-column tile past the weight's edge, zero-filled by TMA): each
  product kind agrees with numpy's product of the bf16 operands accumulated in f32, and the conversion gives the
  bf16 rounding of numpy's RMS norm.
* The emulator holds the kernels to the PTX ISA: a TMA box written unswizzled while the descriptors read 128B
  swizzled, a wrong descriptor stride, the consumers' read before their mbarrier wait, a missing wgmma wait each
  give wrong numbers; a descriptor of another swizzle mode and a barrier armed with the wrong byte count are
  refused.
* One block of the llama-3.1-8b 512-row chunk's own q projection, run alone, gives numpy's product.
* Teacher-forced, the model's bf16 build (its prefill products on wgmma) agrees with the reference's tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from xdsl.dialects.builtin import IntegerAttr

from logos_ir.dialects import cuda
from logos_ir.errors import LogosError
from logos_ir.numerics import bf16_rounded
from logos_ir.program import Cut
from logos_ir.runtime.cuda.artifacts import build_program
from logos_ir.runtime.cuda.emulator import KernelEmulator, LaunchShape
from logos_ir.spec import ModelSpec

ROWS = 200
SPEC = dataclasses.replace(ModelSpec.preset("tiny"), hidden=128, intermediate=384, head_dim=32)
# |emulated - numpy| <= TOLERANCE * sum_k |a_k w_k|: both sum exact bf16 products in f32, in different orders
TOLERANCE = 2.0**-16
DOWN = f"linear_residual_wgmma_{ROWS}x384bf16"  # 6 slices over 4 stages


def _build() -> Any:
    return build_program(SPEC, Cut.prefill(ROWS, 256), 1, "bf16")[0]


@pytest.fixture(scope="module")
def plan() -> Any:
    return _build()


def _kernel(plan: Any, stem: str) -> Any:
    return next(k for name, k in plan.kernels.items() if name.startswith(stem))


def _inputs(kernel: Any, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(tuple(a.type.get_shape())).astype(np.float32) for a in kernel.body.block.args]
    arrays = [bf16_rounded(a) if "bf16" in str(arg.type.element_type) else a
              for a, arg in zip(arrays, kernel.body.block.args, strict=True)]  # fmt: skip
    arrays[-1][...] = 0
    return arrays


def _run(plan: Any, kernel: Any, arrays: list[np.ndarray]) -> np.ndarray:
    launch = next(step for step in plan.launches if step.kernel == kernel.sym_name.data)
    assert launch.block == 288  # two consumer warpgroups and the producer warp
    out = [a.copy() for a in arrays]
    KernelEmulator(kernel).run(out, LaunchShape.of(launch.grid, launch.block))
    return out[-1]


def _want(stem: str, arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    a, *rest = arrays
    if stem.startswith("gate_up"):
        g, u = a @ rest[0].T, a @ rest[1].T
        bound = TOLERANCE * (
            1.1 * (np.abs(a) @ np.abs(rest[0]).T) * np.abs(u) + np.abs(g) * (np.abs(a) @ np.abs(rest[1]).T)
        )
        want = g / (1 + np.exp(-g)) * u
        return want, bound + 1e-6 * np.abs(want)
    want, bound = a @ rest[0].T, TOLERANCE * (np.abs(a) @ np.abs(rest[0]).T)
    if len(rest) == 3:  # the residual
        want = want + rest[1]
        bound = bound + 1e-7 * np.abs(want)
    return want, bound


@pytest.mark.parametrize("stem", [f"linear_wgmma_{ROWS}x128bf16_64x", f"gate_up_wgmma_{ROWS}", DOWN])
def test_each_wgmma_product_agrees_with_numpys_bf16_product(plan: Any, stem: str) -> None:
    kernel = _kernel(plan, stem)
    arrays = _inputs(kernel, seed=len(stem))
    want, bound = _want(stem, arrays)
    got = _run(plan, kernel, arrays)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / bound))


def test_the_conversion_rounds_the_folded_norm_to_bf16(plan: Any) -> None:
    kernel = _kernel(plan, f"norm_to_bf16_{ROWS}x128f32")
    launch = next(step for step in plan.launches if step.kernel == kernel.sym_name.data)
    x, scale, out = _inputs(kernel, seed=3)
    arrays = [x, scale, out]
    KernelEmulator(kernel).run(arrays, LaunchShape.of(launch.grid, launch.block))
    inverse = (1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + SPEC.rms_eps)).astype(np.float32)
    want = bf16_rounded((x * inverse[:, None]).astype(np.float32) * scale)
    # the kernel sums the squares in another order than numpy: an element at a rounding tie may round the other way
    assert np.mean(arrays[2] == want) > 0.999
    assert np.all(np.abs(arrays[2] - want) <= 2.0**-7 * np.abs(want))


# -- the emulator holds the kernels to the ISA ---------------------------------------------------------------------


def _edited(plan: Any, stem: str, edit: Any) -> Any:
    """A copy of the kernel of `stem` (the plan is read back from the build's printed step.mlir), edited."""
    kernel = _kernel(plan, stem).clone()
    edit(kernel)
    kernel.verify()
    return kernel


def _ops(kernel: Any, kind: type) -> list[Any]:
    return [op for op in kernel.walk() if isinstance(op, kind)]


def _unswizzled_boxes(kernel: Any) -> None:
    for op in _ops(kernel, cuda.TmaLoadOp):
        op.properties["swizzle"] = IntegerAttr(0, 64)


def _wrong_a_stride(kernel: Any) -> None:
    for op in _ops(kernel, cuda.WgmmaDescriptorOp)[::2]:  # each k step's A descriptor (then B's)
        op.properties["stride"] = IntegerAttr(512, 64)


def _read_before_the_wait(kernel: Any) -> None:
    full_wait = next(op for op in _ops(kernel, cuda.MbarrierWaitOp) if op.bars.name_hint == "full")
    after = _ops(kernel, cuda.WgmmaWaitOp)[0]
    full_wait.detach()
    after.parent_block().insert_op_after(full_wait, after)


def _no_wgmma_wait(kernel: Any) -> None:
    for op in _ops(kernel, cuda.WgmmaWaitOp):
        op.detach()
        op.erase()


@pytest.mark.parametrize("edit", [_unswizzled_boxes, _wrong_a_stride, _read_before_the_wait, _no_wgmma_wait])
def test_a_kernel_that_breaks_the_isa_gives_wrong_numbers(plan: Any, edit: Any) -> None:
    arrays = _inputs(_kernel(plan, DOWN), seed=11)
    want, bound = _want(DOWN, arrays)
    got = _run(plan, _edited(plan, DOWN, edit), arrays)
    assert not np.all(np.abs(got - want) <= bound)  # NaN (a result read before its wait) compares false too


def _swizzle_64(kernel: Any) -> None:
    for op in _ops(kernel, cuda.WgmmaDescriptorOp):
        op.properties["swizzle"] = IntegerAttr(64, 64)


def _short_expect_tx(kernel: Any) -> None:
    arm = next(op for op in _ops(kernel, cuda.MbarrierArriveOp) if op.expect_tx is not None)
    arm.properties["expect_tx"] = IntegerAttr(arm.expect_tx.value.data + 16, 64)


@pytest.mark.parametrize(
    ("edit", "refusal"),
    [(_swizzle_64, "swizzle mode \\[2\\]"), (_short_expect_tx, "phase that has not completed")],
)
def test_a_wrong_descriptor_mode_or_byte_count_is_refused(plan: Any, edit: Any, refusal: str) -> None:
    edited = _edited(plan, DOWN, edit)
    with pytest.raises(LogosError, match=refusal):
        _run(plan, edited, _inputs(edited, seed=12))


# -- tokens ---------------------------------------------------------------------------------------------------


def test_the_wgmma_prefill_agrees_teacher_forced_with_the_reference() -> None:
    """The tiny preset (hidden 64, intermediate 128: depths of whole slices), a 72-token prompt in one chunk (its
    products on wgmma), then 2 decode steps; bf16 weights, so the lane's
    logits follow the reference's within bf16's rounding: the next tokens agree at every step and the logits'
    cosine stays above 0.999."""
    from logos_ir.runtime.cuda.agreement import teacher_forced
    from logos_ir.weights import RandomWeights

    spec = ModelSpec.preset("tiny")
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, spec.vocab - 1, 72)]
    result = teacher_forced(RandomWeights(spec, seed=3), prompt, 2, "bf16", prefill_rows=72)
    print(f"wgmma prefill: agreement {result.agreement}, min cosine {result.min_cosine:.6f}")
    assert result.agreement == 1.0, result
    assert result.min_cosine > 0.999, result


def test_one_block_of_the_8bs_query_projection_as_printed_agrees_with_numpy() -> None:
    """The llama-3.1-8b 512-row chunk's q projection (depth 4096: 64 slices, the 4-stage ring turned 16 times), one
    block run alone (the last row tile, a middle column tile): its 128 x 128 tile is numpy's bf16 product and it
    writes nothing else."""
    spec = dataclasses.replace(ModelSpec.preset("llama-3.1-8b"), layers=1)  # the layer's kernels, once
    plan = build_program(spec, Cut.prefill(512, 1024), 1, "bf16")[0]
    name = next(n for n in plan.kernels if n.startswith("linear_wgmma_512x4096bf16_4096x4096bf16_"))
    kernel, launch = plan.kernels[name], next(step for step in plan.launches if step.kernel == name)
    assert launch.grid == (4, 32, 1)
    rng = np.random.default_rng(2)
    a, weight, out = (np.zeros(tuple(arg.type.get_shape()), np.float32) for arg in kernel.body.block.args)
    rows, columns = slice(384, 512), slice(17 * 128, 18 * 128)
    a[rows] = bf16_rounded(rng.standard_normal((128, 4096)).astype(np.float32))
    weight[columns] = bf16_rounded(rng.standard_normal((128, 4096)).astype(np.float32))
    block = 3 + 17 * launch.grid[0]
    ids = block * launch.block + np.arange(launch.block)
    KernelEmulator(kernel).run([a, weight, out], LaunchShape.of(launch.grid, launch.block, ids))
    want, bound = a[rows] @ weight[columns].T, TOLERANCE * (np.abs(a[rows]) @ np.abs(weight[columns]).T)
    assert np.all(np.abs(out[rows, columns] - want) <= bound)
    assert np.count_nonzero(out) == np.count_nonzero(out[rows, columns]) > 0
