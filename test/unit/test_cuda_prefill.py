"""The CUDA lane's tensor-core products, executed by the emulator from the lowered IR as printed.

* Every tensor-core kernel kind of a tiny model's bf16 prefill chunk (`norm_linear_tc`, `linear_residual_tc`,
  `norm_gate_up_tc`; a batch of 40 rows, so the row tile is partial, and projections narrower than a block tile;
  chunks of more rows take the wgmma kernels, `test_cuda_hopper`) agrees with numpy's product of bf16-rounded
  inputs accumulated in f32 within the stated tolerance; with the RMS norm folded into the product's prologue the
  inputs are numpy's f32 norm of x, rounded to bf16.
* The emulator holds the kernels to the PTX ISA's fragment layouts and copy groups: moving one A-fragment register
  to the wrong row, dropping the wait for the asynchronous copies, dropping a barrier (a race), misaligning an
  ldmatrix row or copying past a buffer changes the numbers or is refused.
* With f32 weights no tensor-core kernel is built (the exact path the token tests stand on).
* Flash attention over the prompt agrees with numpy's attention, fused with the chunk's cache write (the cache then
  holds exactly the rotated, rounded keys and values) and not; reading V without `.trans` does not agree.
* The llama-3.1-8b 512-row prefill's products hold wgmma and TMA, its 64-row batch's and attention mma.sync,
  ldmatrix, cp.async and shared memory, and all compile for sm_90a with no register spill (where nvcc is installed).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest
from xdsl.printer import Printer

from logos_ir.dialects import cuda
from logos_ir.errors import LogosError
from logos_ir.numerics import bf16_rounded
from logos_ir.passes.cuda.host_plan import read_plan
from logos_ir.program import Cut
from logos_ir.runtime.cuda.artifacts import build_program
from logos_ir.runtime.cuda.emulator import KernelEmulator
from logos_ir.runtime.cuda.emulator import LaunchShape as _Launch
from logos_ir.spec import ModelSpec

ROWS = 40  # a batch (at most 64 rows: mma.sync, tiles of 64 rows), its row tile partial
# |emulated - numpy| <= TOLERANCE * sum_k |x_k w_k|: both sum exact bf16 products in f32, in different orders
TOLERANCE = 2.0**-16


@pytest.fixture(scope="module")
def plan() -> Any:
    return build_program(ModelSpec.preset("tiny"), Cut.prefill(ROWS, 128), 1, "bf16")[0]


def _inputs(kernel: Any, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for arg in kernel.body.block.args:
        values = rng.standard_normal(tuple(arg.type.get_shape())).astype(np.float32)
        arrays.append(bf16_rounded(values) if "bf16" in str(arg.type.element_type) else values)
    arrays[-1][...] = 0
    return arrays


def _run(kernel: Any, plan: Any, arrays: list[np.ndarray]) -> np.ndarray:
    launch = next(step for step in plan.launches if step.kernel == kernel.sym_name.data)
    out = [a.copy() for a in arrays]
    KernelEmulator(kernel).run(out, _Launch.of(launch.grid, launch.block))
    return out[-1]


def _product(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's bf16-input, f32-accumulate product and the sum of |terms| that bounds its rounding."""
    xb = bf16_rounded(x)
    return xb @ w.T, np.abs(xb) @ np.abs(w).T


def _kernel(plan: Any, stem: str) -> Any:
    return next(k for name, k in plan.kernels.items() if name.startswith(stem + "_"))


LINEAR = f"linear_residual_tc_{ROWS}x64f32"  # the output projection: a plain product (its residual set to zero)


def _normed(x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's RMS norm in f32 (x * (1/rms) * scale, the reference's order), and the A operand's possible extra
    error per element: the kernel sums the squares in another order, so its 1/rms may differ from numpy's in the
    last f32 bits (well under 2^-16 relative), and only an element that close to a bf16 rounding tie can round the
    other way (one bf16 step, 2^-8 relative); every other element's extra error is zero."""
    eps = np.float32(ModelSpec.preset("tiny").rms_eps)
    inverse = (1.0 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1) + eps)).astype(np.float32)
    normed = (x * inverse[:, None]).astype(np.float32) * scale
    rounded = bf16_rounded(normed)
    near = np.zeros(normed.shape, bool)
    for nudge in (1 + 2.0**-16, 1 - 2.0**-16):
        near |= bf16_rounded((normed * nudge).astype(np.float32)) != rounded
    return normed, np.where(near, 2.0**-8 * np.abs(normed), 0.0)


@pytest.mark.parametrize("stem", ["norm_linear_tc", LINEAR, "norm_gate_up_tc"])
def test_each_tensor_core_kind_agrees_with_numpys_bf16_product(plan: Any, stem: str) -> None:
    kernel = _kernel(plan, stem)
    arrays = _inputs(kernel, seed=len(stem))
    got = _run(kernel, plan, arrays)
    flips = 0.0
    if stem.startswith("norm_"):  # x's norm folded in: the scale is the last input
        normed, step = _normed(arrays[0], arrays[-2])
        weights = arrays[1:-2]
        flips = step @ np.max(np.abs(np.stack(weights)), axis=0).T  # the near-tie elements' terms
        arrays = [normed, *weights, *arrays[-2:]]
    if stem == "norm_gate_up_tc":
        (g, g_bound), (u, u_bound) = _product(arrays[0], arrays[1]), _product(arrays[0], arrays[2])
        want = g / (1 + np.exp(-g)) * u
        # silu's slope is below 1.1, so the product's error is bounded by the operands' errors
        bound = (
            TOLERANCE * (1.1 * g_bound * np.abs(u) + np.abs(g) * u_bound)
            + 1e-6 * np.abs(want)
            + flips * (1.1 * np.abs(u) + np.abs(g))
        )
    else:
        want, bound = _product(arrays[0], arrays[1])
        bound = TOLERANCE * bound + flips
        if stem == LINEAR:
            want = want + arrays[2]
            bound = bound + 1e-7 * np.abs(want)
    assert got.shape == (ROWS, want.shape[1])
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / bound))


def _reparsed(kernel: Any) -> Any:
    """The module holding `kernel`, printed and read back as a build's step.mlir is."""
    module = kernel.parent_op().parent_op()
    text = io.StringIO()
    Printer(stream=text).print_op(module)
    return read_plan(text.getvalue())


def _edited(stem: str, edit: Any) -> tuple[Any, Any]:
    """The build's plan with the kernel of `stem` edited, in a copy of its module (the lane's build is shared by the
    process's runs: `runtime.cuda.artifacts`), printed and read back."""
    plan = build_program(ModelSpec.preset("tiny"), Cut.prefill(ROWS, 128), 1, "bf16")[0]
    name = _kernel(plan, stem).sym_name.data
    copy = _kernel(plan, stem).parent_op().parent_op().clone()
    kernel = next(op for op in copy.walk() if getattr(op, "sym_name", None) is not None and op.sym_name.data == name)
    edit(kernel)
    edited = _reparsed(kernel)
    return edited, edited.kernels[name]


def _ops(kernel: Any, kind: type) -> list[Any]:
    return [op for op in kernel.walk() if isinstance(op, kind)]


def test_one_wrong_fragment_index_changes_the_emulated_product(plan: Any) -> None:
    kernel = _kernel(plan, LINEAR)
    arrays = _inputs(kernel, seed=5)
    arrays[2][...] = 0
    want, bound = _product(arrays[0], arrays[1])
    assert np.all(np.abs(_run(kernel, plan, arrays) - want) <= TOLERANCE * bound)

    def a1_reads_row_g(kernel: Any) -> None:
        # A register 1 holds row g + 8 (PTX ISA, m16n8k16): give it register 0's row g instead
        a0, a1 = _ops(kernel, cuda.LoadBF16x2Op)[:2]
        assert a1.indices[1].owner.name == "arith.addi"
        a1.operands[2] = a0.indices[1]

    edited_plan, edited = _edited(LINEAR, a1_reads_row_g)
    got = _run(edited, edited_plan, arrays)
    wrong = np.abs(got - want) > TOLERANCE * bound
    assert wrong.any()
    # only rows 8-15 of each 16-row m tile of the first k16 step read the wrong row: the error is confined there
    assert not wrong[np.arange(ROWS) % 16 < 8].any()


def test_a_read_before_the_copies_land_gives_wrong_numbers(plan: Any) -> None:
    kernel = _kernel(plan, LINEAR)
    arrays = _inputs(kernel, seed=6)
    arrays[2][...] = 0
    want, bound = _product(arrays[0], arrays[1])

    def no_wait(kernel: Any) -> None:
        for op in _ops(kernel, cuda.CpAsyncWaitOp):
            op.detach()
            op.erase()

    edited_plan, edited = _edited(LINEAR, no_wait)
    assert (np.abs(_run(edited, edited_plan, arrays) - want) > TOLERANCE * bound).any()


@pytest.mark.parametrize(
    ("which", "refusal"),
    [(0, "reads shared memory another thread of its block wrote"), (-1, "writes shared memory another thread")],
)
def test_a_missing_barrier_is_a_race_the_emulator_refuses(which: int, refusal: str) -> None:
    """Without the barrier after the wait, warps read tiles other threads copied; without the one closing a slice,
    the next prefetch overwrites a stage other warps may still read (a 4-slice product: the down projection)."""
    stem = f"linear_residual_tc_{ROWS}x128f32"

    def drop_barrier(kernel: Any) -> None:
        loop = next(op for op in kernel.walk() if op.name == "scf.for" and _ops(op, cuda.MmaSyncOp))
        barriers = [op for op in loop.body.block.ops if op.name == "gpu.barrier"]
        barriers[which].detach()
        barriers[which].erase()

    edited_plan, edited = _edited(stem, drop_barrier)
    with pytest.raises(LogosError, match=refusal):
        _run(edited, edited_plan, _inputs(edited, seed=9))


def test_a_misaligned_ldmatrix_row_is_refused(plan: Any) -> None:
    kernel = _kernel(plan, LINEAR)

    def shifted(kernel: Any) -> None:
        from xdsl.dialects import arith
        from xdsl.dialects.builtin import IndexType, IntegerAttr

        load = _ops(kernel, cuda.LdmatrixOp)[0]
        one = arith.ConstantOp(IntegerAttr(1, IndexType()))
        moved = arith.AddiOp(load.indices[2], one.result)
        load.parent_block().insert_ops_before([one, moved], load)
        load.operands[3] = moved.result

    edited_plan, edited = _edited(LINEAR, shifted)
    with pytest.raises(LogosError, match="ldmatrix.*16-byte aligned"):
        _run(edited, edited_plan, _inputs(kernel, seed=7))


def test_a_copy_past_its_buffer_is_refused(plan: Any) -> None:
    kernel = _kernel(plan, LINEAR)

    def past_the_end(kernel: Any) -> None:
        from xdsl.dialects import arith
        from xdsl.dialects.builtin import IndexType, IntegerAttr

        copy = _ops(kernel, cuda.CpAsyncOp)[0]  # x[row, k]: a row past the chunk, still marked valid
        row = arith.ConstantOp(IntegerAttr(ROWS, IndexType()))
        copy.parent_block().insert_op_before(row, copy)
        copy.operands[5] = row.result  # operands: dst, 3 dst indices, src, src row, src column, valid

    edited_plan, edited = _edited(LINEAR, past_the_end)
    with pytest.raises(LogosError, match="cp_async' reads outside its buffer"):
        _run(edited, edited_plan, _inputs(kernel, seed=8))


def test_f32_images_build_no_tensor_core_kernel() -> None:
    f32 = build_program(ModelSpec.preset("tiny"), Cut.prefill(ROWS, 128), 1, "f32")[0]
    assert not [name for name in f32.kernels if "_tc_" in name]
    norms = [launch.kernel for launch in f32.launches if launch.kernel.startswith(f"rms_norm_{ROWS}x")]
    assert len(norms) == 2 * ModelSpec.preset("tiny").layers  # f32 keeps the norm kernels (nothing folds them)


def test_bf16_prefill_chunks_fold_every_layer_norm_into_the_products(plan: Any) -> None:
    """Only the head's row-picking norm is still a launch; each layer's two norms are the prologues of the
    query, key and value products and of gate/up."""
    launches = [launch.kernel for launch in plan.launches]
    assert [k for k in launches if k.startswith("rms_norm")] == [k for k in launches if k.startswith("rms_norm_row")]
    layers = ModelSpec.preset("tiny").layers
    assert sum(k.startswith("norm_linear_tc_") for k in launches) == 3 * layers
    assert sum(k.startswith("norm_gate_up_tc_") for k in launches) == layers
    decode = build_program(ModelSpec.preset("tiny"), Cut.decode(128), 1, "bf16")[0]
    assert not [name for name in decode.kernels if "_tc_" in name]


# -- flash attention over the prompt ---------------------------------------------------------------------------


def _attention_step(rows: int, heads: int, kv_heads: int, ctx: int, head_dim: int) -> str:
    """A kernel-level host function of one prefill chunk's attention over a bf16 cache."""
    q, cache, splits = f"memref<{rows}x{heads * head_dim}xf32>", f"memref<{kv_heads}x{ctx}x{head_dim}xbf16>", ctx // 32
    scratch = f"memref<{rows}x{heads}x{splits}x{head_dim + 2}xf32>"
    count = f"memref<{rows}x{kv_heads}xi64>"
    return f"""builtin.module attributes {{cuda.identity = "test", cuda.weights = "bf16"}} {{
  func.func @step() {{
    %q = cuda.buffer "query" kind "activation" : {q}
    %k = cuda.buffer "cache.key.0" kind "cache" : {cache}
    %v = cuda.buffer "cache.value.0" kind "cache" : {cache}
    %p = cuda.buffer "positions" kind "input" : memref<{rows}xi64>
    %o = cuda.buffer "attended" kind "activation" : {q}
    %s = cuda.buffer "attention.partial" kind "scratch" : {scratch}
    %c = cuda.buffer "attention.count" kind "scratch" : {count}
    cuda.attention ins(%q, %k, %v, %p : {q}, {cache}, {cache}, memref<{rows}xi64>)
        outs(%o, %s, %c : {q}, {scratch}, {count}) {{split = 32 : i64}}
    func.return
  }}
}}"""


def _fused_step(rows: int, heads: int, kv_heads: int, ctx: int, head_dim: int) -> str:
    """The same chunk as the lane lowers it: the keys rotated into the cache, the queries rotated, then attention."""
    unfused = _attention_step(rows, heads, kv_heads, ctx, head_dim)
    q, kv = f"memref<{rows}x{heads * head_dim}xf32>", f"memref<{rows}x{kv_heads * head_dim}xf32>"
    cache, table = f"memref<{kv_heads}x{ctx}x{head_dim}xbf16>", f"memref<{ctx}x{head_dim}xf32>"
    p = f"memref<{rows}xi64>"
    buffers = f"""    %key = cuda.buffer "key" kind "activation" : {kv}
    %value = cuda.buffer "value" kind "activation" : {kv}
    %turned = cuda.buffer "turned_query" kind "activation" : {q}
    %cos = cuda.buffer "rope.cos" kind "table" : {table}
    %sin = cuda.buffer "rope.sin" kind "table" : {table}
    cuda.rope_cache_write ins(%key, %value, %p, %cos, %sin : {kv}, {kv}, {p}, {table}, {table})
        outs(%k, %v : {cache}, {cache})
    cuda.rope ins(%q, %p, %cos, %sin : {q}, {p}, {table}, {table}) outs(%turned : {q}) {{head_dim = {head_dim} : i64}}
"""
    unfused = unfused.replace("    cuda.attention ins(%q,", buffers + "    cuda.attention ins(%turned,")
    return unfused


def _lowered(text: str) -> Any:
    from xdsl.context import Context
    from xdsl.parser import Parser

    from logos_ir.passes.cuda.convert_kernels_to_gpu import ConvertCudaKernelsToGpu
    from logos_ir.passes.cuda.fuse_prefill_attention import FusePrefillAttention
    from logos_ir.passes.cuda.host_plan import lowered_context

    module = Parser(lowered_context(), text).parse_module()
    module.verify()
    FusePrefillAttention().apply(Context(), module)
    ConvertCudaKernelsToGpu().apply(Context(), module)
    module.verify()
    return module


def _attention_plan(edit: Any = None) -> tuple[Any, Any]:
    from xdsl.context import Context
    from xdsl.parser import Parser

    from logos_ir.passes.cuda.convert_kernels_to_gpu import ConvertCudaKernelsToGpu
    from logos_ir.passes.cuda.host_plan import lowered_context

    module = Parser(lowered_context(), _attention_step(ROWS, 4, 2, 128, 16)).parse_module()
    module.verify()
    ConvertCudaKernelsToGpu().apply(Context(), module)
    (kernel,) = [op for op in module.walk() if op.name == "gpu.func"]
    if edit is not None:
        edit(kernel)
    plan = _reparsed(kernel)
    (name,) = plan.kernels
    assert name.startswith("attention_prefill_tc_")
    return plan, plan.kernels[name]


def _attention_run(plan: Any, kernel: Any, start: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The kernel's output for a chunk at positions start+1 .., and numpy's attention (bf16 queries, exact softmax)."""
    rng = np.random.default_rng(start)
    heads, kv_heads, head_dim = 4, 2, 16
    query = rng.standard_normal((ROWS, heads * head_dim)).astype(np.float32)
    keys, values = (bf16_rounded(rng.standard_normal((kv_heads, 128, head_dim)).astype(np.float32)) for _ in "kv")
    positions = np.arange(start + 1, start + ROWS + 1, dtype=np.int64)
    out = np.zeros_like(query)
    launch = plan.launches[0]
    KernelEmulator(kernel).run([query, keys, values, positions, out], _Launch.of(launch.grid, launch.block))
    want = np.zeros_like(out)
    q = bf16_rounded(query).astype(np.float64).reshape(ROWS, heads, head_dim)
    for row, length in enumerate(positions):
        for head in range(heads):
            k, v = keys[head // 2, :length], values[head // 2, :length]
            score = k @ q[row, head] / np.sqrt(head_dim)
            weight = np.exp(score - score.max())
            want[row, head * head_dim : (head + 1) * head_dim] = weight @ v / weight.sum()
    return out, want, float(np.abs(values).max())


@pytest.mark.parametrize("start", [0, 37])  # the first chunk, and a chunk after 37 cached positions
def test_flash_attention_agrees_with_numpy(start: int) -> None:
    plan, kernel = _attention_plan()
    got, want, largest = _attention_run(plan, kernel, start)
    # P is rounded to bf16 before P V (as FlashAttention-2 does): each weight off by at most 2^-9 of itself
    assert np.abs(got - want).max() <= 2.0**-7 * largest


@pytest.mark.parametrize("start", [0, 37])
def test_the_fused_prefill_attention_writes_the_cache_and_attends(start: int) -> None:
    from logos_ir.runtime.cuda.weights import rope_tables

    heads, kv_heads, ctx, head_dim = 4, 2, 128, 16
    module = _lowered(_fused_step(ROWS, heads, kv_heads, ctx, head_dim))
    text = io.StringIO()
    Printer(stream=text).print_op(module)
    plan = read_plan(text.getvalue())
    assert [step.kernel.split("_tc_")[0] for step in plan.launches] == ["prefill_attention"]  # one launch
    spec = ModelSpec(
        vocab=8, hidden=heads * head_dim, layers=1, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        intermediate=8, rms_eps=1e-5, rope_theta=10000.0, tie_embeddings=False,
    )  # fmt: skip
    cos, sin = rope_tables(spec, ctx)
    arrays = {b.name: np.zeros(b.shape, np.int64 if b.element == "i64" else np.float32) for b in plan.buffers.values()}
    arrays["rope.cos"][...], arrays["rope.sin"][...] = cos, sin
    rng = np.random.default_rng(start)
    for name in ("query", "key", "value"):
        arrays[name][...] = rng.standard_normal(arrays[name].shape)
    earlier = [bf16_rounded(rng.standard_normal(arrays["cache.key.0"].shape).astype(np.float32)) for _ in "kv"]
    arrays["cache.key.0"][...], arrays["cache.value.0"][...] = earlier
    positions = np.arange(start + 1, start + ROWS + 1)
    arrays["positions"][...] = positions
    (launch,) = plan.launches
    KernelEmulator(plan.kernels[launch.kernel]).run(
        [arrays[name] for name in launch.buffers], _Launch.of(launch.grid, launch.block)
    )

    def rotated(x: np.ndarray) -> np.ndarray:  # rotate-half at each row's position, in f32 as the reference does
        x = x.reshape(ROWS, -1, head_dim)
        partner = np.concatenate([x[..., head_dim // 2 :], x[..., : head_dim // 2]], axis=-1)
        return (x * cos[positions - 1][:, None] + partner * sin[positions - 1][:, None]).astype(np.float32)

    keys, values = (e.copy() for e in earlier)
    keys[:, start : start + ROWS] = bf16_rounded(rotated(arrays["key"])).transpose(1, 0, 2)
    values[:, start : start + ROWS] = bf16_rounded(arrays["value"]).reshape(ROWS, kv_heads, head_dim).transpose(1, 0, 2)
    assert np.array_equal(arrays["cache.key.0"], keys) and np.array_equal(arrays["cache.value.0"], values)
    q = bf16_rounded(rotated(arrays["query"])).astype(np.float64)
    want = np.zeros((ROWS, heads, head_dim))
    for row, length in enumerate(positions):
        for head in range(heads):
            score = keys[head // 2, :length] @ q[row, head] / np.sqrt(head_dim)
            weight = np.exp(score - score.max())
            want[row, head] = weight @ values[head // 2, :length] / weight.sum()
    assert np.abs(arrays["attended"] - want.reshape(ROWS, -1)).max() <= 2.0**-7 * np.abs(values).max()


def test_flash_attention_reads_v_transposed() -> None:
    def plain(kernel: Any) -> None:
        for load in _ops(kernel, cuda.LdmatrixOp):
            if load.transpose is not None:
                del load.properties["transpose"]

    plan, kernel = _attention_plan(plain)
    got, want, largest = _attention_run(plan, kernel, 0)
    assert np.abs(got - want).max() > 2.0**-7 * largest


# -- the 8B's 512-row prefill for sm_90 -------------------------------------------------------------------------

NVCC = shutil.which("nvcc")
_KERNEL = re.compile(r'^extern "C" __global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(', re.M)


def _tensor_core_source() -> tuple[str, list[str]]:
    """The tensor-core kernels of the llama-3.1-8b 512-row prefill chunk (bf16: the wgmma products and their bf16
    conversions) and of its 64-row batch (mma.sync), and the flash attention kernels of its shapes, fused with the
    cache write and not (32 heads over 8 KV heads of 128, a bf16 cache of 1024)."""
    import dataclasses

    from xdsl.context import Context
    from xdsl.parser import Parser

    from logos_ir.passes.cuda.convert_kernels_to_gpu import ConvertCudaKernelsToGpu
    from logos_ir.passes.cuda.emit_cuda import PREAMBLE, TENSOR_MAP_PREAMBLE, print_cuda
    from logos_ir.passes.cuda.fuse_prefill_attention import FusePrefillAttention
    from logos_ir.passes.cuda.host_plan import lowered_context

    spec = dataclasses.replace(ModelSpec.preset("llama-3.1-8b"), layers=2)  # every layer's kernels are the same
    sources = [build_program(spec, Cut.prefill(rows, 1024), 1, "bf16")[1] for rows in (512, 64)]
    for step in (_attention_step(512, 32, 8, 1024, 128), _fused_step(512, 32, 8, 1024, 128)):
        module = Parser(lowered_context(), step).parse_module()
        FusePrefillAttention().apply(Context(), module)
        ConvertCudaKernelsToGpu().apply(Context(), module)
        text = io.StringIO()
        print_cuda(module, text)
        sources.append(text.getvalue())
    bodies = []
    for cu in sources:
        starts = [m.start() for m in _KERNEL.finditer(cu)]
        bodies += [cu[a:b] for a, b in zip(starts, [*starts[1:], len(cu)], strict=True)]
    chosen = {}
    for body in bodies:
        name = _KERNEL.match(body).group(1)  # type: ignore[union-attr]
        if re.search(r"_tc_|_wgmma_|to_bf16_", name):
            chosen[name] = body  # the pipeline's fused attention and the hand-built one are the same kernel
    return PREAMBLE + TENSOR_MAP_PREAMBLE + "\n".join(chosen.values()), list(chosen)


_WGMMA_PTX = (
    "wgmma.mma_async.sync.aligned.m64n",
    "wgmma.fence.sync.aligned",
    "wgmma.commit_group.sync.aligned",
    "wgmma.wait_group.sync.aligned",
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
    "mbarrier.arrive.expect_tx",
    "mbarrier.try_wait.parity",
    "__grid_constant__ LogosTensorMap",
)
_MMA_SYNC_PTX = ("mma.sync.aligned.m16n8k16", "ldmatrix.sync.aligned", "cp.async.cg.shared.global", "__shared__")


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA) is not installed here: the sm_90a compile is not checked")
def test_the_8b_prefill_kernels_use_wgmma_and_tma_and_compile_for_sm_90a_without_spills(tmp_path: Any) -> None:
    """The 512-row chunk's products on wgmma fed by TMA (sm_90a: arch-specific, CC 9.0 only), the 64-row batch's on
    mma.sync, attention on mma.sync; ptxas reports no spill in any of them."""
    source, names = _tensor_core_source()
    stems = {re.split(r"_(?:tc|wgmma)_|_\d", name)[0] for name in names}
    assert stems >= {"linear", "linear_residual", "gate_up", "norm_to_bf16", "to_bf16"}
    assert stems >= {"norm_linear", "norm_gate_up", "attention_prefill", "prefill_attention"}
    wgmma = [name for name in names if "_wgmma_512x" in name]
    assert {name.split("_wgmma_")[0] for name in wgmma} == {"linear", "linear_residual", "gate_up"}
    for name, body in zip(names, source.split('extern "C"')[1:], strict=True):
        for needed in _WGMMA_PTX if name in wgmma else _MMA_SYNC_PTX if "_tc_" in name else ():
            assert needed in body, (name, needed)
    cu = tmp_path / "prefill.cu"
    cu.write_text(source)
    command = [NVCC, "-arch=sm_90a", "-cubin", "-O3", "-fmad=false", "-Xptxas", "-v", "-o", str(tmp_path / "p.cubin")]
    done = subprocess.run([*command, str(cu)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = done.stdout + done.stderr
    assert len(re.findall(r"Compiling entry function '(\w+)'", report)) == len(names)
    assert re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report) == [("0", "0")] * len(names)


def test_the_build_report_gives_each_products_hbm_bytes_against_the_minimum() -> None:
    """The 8B's 512-row chunk: row tiles on the grid's x axis (launched side by side, so a weight tile is read from
    HBM once while its 4 row tiles are resident) and the report's entry per distinct product."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.progress import Progress

    spec = ModelSpec.preset("llama-3.1-8b")
    request = BuildRequest(
        ModelSource("preset", "8b", spec), Cut.prefill(512, 1024), 1, "bf16", False, Progress.silent()
    )
    report = build_cuda(request).report
    # every buffer a launch reads through cp.async, TMA or a bf16-pair load counts: the step reads its weights once
    # at least (it read 3.1 GB "against a minimum of 15.6 GB" while those copies were not counted)
    projections = (
        spec.hidden * (spec.heads + 2 * spec.kv_heads) * spec.head_dim + spec.heads * spec.head_dim * spec.hidden
    )
    projections += 3 * spec.hidden * spec.intermediate
    weights = 2 * (spec.layers * projections + spec.vocab * spec.hidden)  # bf16: the layers' products and the head
    assert report["bytes_read"] >= report["bytes_minimum"] >= weights
    products = report["tensor_core_products"]
    assert {p["kernel"].split("_wgmma_")[0] for p in products} == {"linear", "linear_residual", "gate_up"}
    assert sum(p["launches"] for p in products) == 6 * spec.layers  # q, k, v, o, gate/up, down
    for product in products:
        assert product["grid"][0] == 512 // 128  # row tiles fastest
        assert product["minimum_bytes"] <= product["hbm_bytes"] <= 1.5 * product["minimum_bytes"]
        assert product["l2_to_sm_bytes"] > product["hbm_bytes"]
