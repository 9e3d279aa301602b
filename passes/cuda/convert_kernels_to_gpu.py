"""`convert-cuda-kernels-to-gpu`: the CUDA lane's kernel level -> xDSL's `gpu` dialect (thread code and launches).

    logos-opt step.mlir -p convert-cuda-kernels-to-gpu

Assumes: the output of `convert-logos-to-cuda-kernels`: a host function `@step` of `cuda.buffer` ops, kernel-level
ops and `shard.all_reduce` ops.

Guarantees: a `gpu.module @kernels` of `gpu.func` kernels, one per distinct kernel shape (kind, sizes, weight
element type): every layer that has the same shapes launches the same kernel, so a 2-layer and an 80-layer model
of one width emit the same set. Each body is upstream MLIR: `arith`/`memref`/`scf`/`math` with `gpu.thread_id`/
`gpu.block_id`, `gpu.shuffle xor` (warp butterflies), `vector.load` (16-byte loads, aligned to their size) with
`vector.extract`, and `llvm.fence` + `nvvm.bar.warp.sync` (attention's combine). Each kernel-level op
becomes its `gpu.launch_func` (two for the two-stage kernels: attention's split and combine, arg-max's stages) with
constant grid and block sizes, on the same named buffers, in the same order; `shard.all_reduce` stays where it is.
One rewrite pattern a kernel-level op (`Launch<Op>`, the kernels it launches); a kernel-level op without one is
refused by name before anything is rewritten. The decode kernels' bodies are `decode_kernels`', the tensor-core
kernels' (a prefill chunk's products and attention) `tensor_core`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.context import Context
from xdsl.dialects import arith, func, gpu
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float32Type,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    bf16,
    f32,
    i64,
)
from xdsl.ir import Attribute, Block, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from logos_ir.dialects import cuda
from logos_ir.errors import PassError
from logos_ir.numerics import ceil_div as cdiv
from logos_ir.passes.cuda import blocks, decode_kernels, hopper, tensor_core
from logos_ir.passes.cuda.decode_kernels import ROW_TILE, THREADS, WARPS, qkv_splits
from logos_ir.passes.cuda.kernel_level import host_function
from logos_ir.passes.cuda.thread_code import INDEX, Body, Kind

NAME = "convert-cuda-kernels-to-gpu"


# -- kernels by shape --------------------------------------------------------------------------------------------


def _columns(s: list[tuple[int, ...]]) -> tuple[int, int, int]:
    """A projection's grid: a warp an output column, a block a tile of ROW_TILE rows."""
    return (cdiv(s[1][0], WARPS), cdiv(s[0][0], ROW_TILE), 1)


def _rows_by_threads(s: list[tuple[int, ...]]) -> tuple[int, int, int]:
    """An elementwise kernel's grid: a thread a column of the first buffer's row, a block row a row."""
    return (cdiv(s[0][1], THREADS), s[0][0], 1)


class _LaunchKernel(RewritePattern):
    """A kernel-level op of type `source` (each subclass's typed `match_and_rewrite`) as the launches of its kernels
    (`kinds`, in order: two for the two-stage kernels), each kernel built once a shape; a prefill chunk's products
    and attention take the tensor-core kernels instead (`tensor_core.handles`)."""

    source: ClassVar[type[cuda.KernelOp]]

    def __init__(self, lowering: _Lowering):
        self.lowering = lowering

    def kinds(self, op: Any) -> list[Kind]:
        raise NotImplementedError

    def launch(self, op: cuda.KernelOp, rewriter: PatternRewriter) -> None:
        kinds = tensor_core.kinds(op) if tensor_core.handles(op) else self.kinds(op)
        self.lowering.launch(op, kinds, rewriter)


class LaunchEmbed(_LaunchKernel):
    source = cuda.EmbedOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.EmbedOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.EmbedOp) -> list[Kind]:
        fmt = blocks.storage_of(op.ins[0])
        if fmt is not None:  # a table held as stored: a thread a block (fp8: a 16-byte load) of the token's row
            embed = decode_kernels.embed_channels if fmt in blocks.CHANNELS else decode_kernels.embed_stored
            body = lambda b, a, s: embed(b, a, s, fmt)  # noqa: E731
            return [Kind(f"embed_{fmt}", (0, 1, 2), lambda s: (1, s[1][0], 1), body, (fmt,))]
        return [Kind("embed", (0, 1, 2), lambda s: (cdiv(s[0][1], THREADS), s[1][0], 1), decode_kernels.embed)]


class LaunchRMSNorm(_LaunchKernel):
    source = cuda.RMSNormOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.RMSNormOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.RMSNormOp) -> list[Kind]:
        epsilon, row = op.epsilon.value.data, op.row.value.data
        plus_one = op.plus_one is not None
        stem = ("rms_norm_plus_one" if plus_one else "rms_norm") + (f"_row{row}" if row >= 0 else "")
        grid = lambda s: (cdiv(s[2][0], WARPS), 1, 1)  # noqa: E731
        body = lambda b, a, s: decode_kernels.rms_norm(b, a, s, epsilon, row, plus_one)  # noqa: E731
        return [Kind(stem, (0, 1, 2), grid, body, (epsilon,))]


class LaunchHeadRMSNorm(_LaunchKernel):
    source = cuda.HeadRMSNormOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.HeadRMSNormOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.HeadRMSNormOp) -> list[Kind]:
        epsilon, plus_one = op.epsilon.value.data, op.plus_one is not None
        grid = lambda s: (cdiv(s[0][1] // s[1][0], WARPS), s[0][0], 1)  # noqa: E731 (heads, rows)
        body = lambda b, a, s: decode_kernels.head_rms_norm(b, a, s, epsilon, plus_one)  # noqa: E731
        return [Kind("head_rms_norm_plus_one" if plus_one else "head_rms_norm", (0, 1, 2), grid, body, (epsilon,))]


class LaunchLinear(_LaunchKernel):
    source = cuda.LinearOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.LinearOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.LinearOp) -> list[Kind]:
        epsilon = op.epsilon.value.data if op.epsilon is not None else None
        on_chip = op.residual_chip.value.data if op.residual_chip is not None else None
        biased = op.biased is not None
        stem = ("norm_" if epsilon is not None else "") + ("linear_bias" if biased else "linear")
        stem += "_residual" if op.has_residual() else ""
        stem += f"_chip{on_chip}" if on_chip is not None else ""
        fmt = blocks.storage_of(op.ins[1])
        stem += f"_{fmt}" if fmt is not None else ""
        operands = tuple(range(len(op.ins) + len(op.outs)))
        body = lambda b, a, s: decode_kernels.linear(b, a, s, epsilon, on_chip, biased, fmt)  # noqa: E731
        return [Kind(stem, operands, _columns, body, (epsilon, on_chip, fmt))]


class LaunchGateUp(_LaunchKernel):
    source = cuda.GateUpOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.GateUpOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.GateUpOp) -> list[Kind]:
        epsilon = op.epsilon.value.data if op.epsilon is not None else None
        biased, gelu = op.biased is not None, op.gelu_tanh is not None
        stem = ("norm_gate_up" if epsilon is not None else "gate_up") + ("_bias" if biased else "")
        stem += "_gelu_tanh" if gelu else ""
        fmt = blocks.storage_of(op.ins[1])
        if fmt != blocks.storage_of(op.ins[2]):
            raise PassError(
                f"{NAME}: gate and up are held as {fmt or 'an image'} and {blocks.storage_of(op.ins[2]) or 'an image'}"
                ": the fused gate/up kernel reads both weights in one format"
            )
        stem += f"_{fmt}" if fmt is not None else ""
        operands = tuple(range(len(op.ins) + len(op.outs)))
        body = lambda b, a, s: decode_kernels.gate_up(b, a, s, epsilon, biased, gelu, fmt)  # noqa: E731
        return [Kind(stem, operands, _columns, body, (epsilon, fmt))]


class LaunchQKV(_LaunchKernel):
    source = cuda.QKVOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.QKVOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.QKVOp) -> list[Kind]:
        epsilon = op.epsilon.value.data
        (ins, _) = op.shapes()
        splits = qkv_splits(ins[1][0] // 2, ins[0][1], op.ins[1].type.element_type)  # type: ignore[attr-defined]
        pairs = lambda s: (cdiv(s[1][0] // 2 * splits, WARPS), 1, 1)  # noqa: E731
        operands = tuple(range(9 if splits == 1 else 11))  # split-K: + partial, count (the lowering's scratch)
        fmt = blocks.storage_of(op.ins[1])
        body = lambda b, a, s: decode_kernels.qkv(b, a, s, epsilon, fmt)  # noqa: E731
        return [Kind("qkv" + (f"_{fmt}" if fmt else ""), operands, pairs, body, (epsilon, fmt))]


class LaunchRope(_LaunchKernel):
    source = cuda.RopeOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.RopeOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.RopeOp) -> list[Kind]:
        head_dim = op.head_dim.value.data
        rotary = op.rotary_dim.value.data if op.rotary_dim is not None else None
        body = lambda b, a, s: decode_kernels.rope(b, a, s, head_dim, rotary)  # noqa: E731
        stem = f"rope_rotary{rotary}" if rotary is not None else "rope"
        return [Kind(stem, (0, 1, 2, 3, 4), _rows_by_threads, body, (head_dim,))]


class LaunchRopeCacheWrite(_LaunchKernel):
    source = cuda.RopeCacheWriteOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.RopeCacheWriteOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.RopeCacheWriteOp) -> list[Kind]:
        rotary = op.rotary_dim.value.data if op.rotary_dim is not None else None
        if rotary is None:
            return [Kind("rope_cache_write", tuple(range(7)), _rows_by_threads, decode_kernels.rope_cache_write)]
        body = lambda b, a, s: decode_kernels.rope_cache_write(b, a, s, rotary)  # noqa: E731
        return [Kind(f"rope_rotary{rotary}_cache_write", tuple(range(7)), _rows_by_threads, body)]


class LaunchAttention(_LaunchKernel):
    source = cuda.AttentionOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.AttentionOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.AttentionOp) -> list[Kind]:
        """The split attention (a warp per row, KV head and split: partial states into the scratch), then the merge
        (a warp per row, query head and `MERGE_DIMS` dimensions); the kernel-level op's count is not used: the
        merge is a launch of its own, so no warp waits on another's."""
        (query, keys, _, _), _ = op.shapes()
        group = query[1] // keys[-1] // keys[-3]
        least = decode_kernels.attention_min_span(keys[-1], op.ins[1].type.element_type, group)  # type: ignore[attr-defined]
        window = op.window.value.data if op.window is not None else None
        scale = op.scale.value.data if op.scale is not None else None
        cap = op.softcap.value.data if op.softcap is not None else None
        kv_splits = lambda s: (cdiv(s[1][-3] * s[4][2], WARPS), s[0][0], 1)  # noqa: E731
        merges = lambda s: (cdiv(s[1][1] * cdiv(s[1][3] - 2, decode_kernels.MERGE_DIMS), WARPS), s[1][0], 1)  # noqa: E731
        suffix = f"_window{window}" if window is not None else ""
        return [
            Kind(
                "attention" + suffix + ("_softcap" if cap is not None else ""),
                (0, 1, 2, 3, 5),
                kv_splits,
                lambda b, a, s: decode_kernels.attention(b, a, s, window, scale, cap),
                (window, scale, cap),
            ),
            Kind(
                "attention_merge" + suffix,
                (3, 5, 4),
                merges,
                lambda b, a, s: decode_kernels.attention_merge(b, a, s, least, window),
                (least, window),
            ),
        ]


class LaunchExperts(_LaunchKernel):
    source = cuda.ExpertsOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.ExpertsOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.ExpertsOp) -> list[Kind]:
        """The router (a warp a row: softmax, top-k, the chosen experts and weights into their buffers), for a
        chunk or batch the grouping of its rows by expert (a thread an expert), the chosen experts' gate/up
        products (a warp a column of an assignment, or of an expert's assignments), their down products times
        their weights, and their sum in ascending expert index (a thread a column of a row)."""
        n = len(op.ins)
        out, chosen, weights, act, partial, count, assigned = range(n, n + 7)
        held, top_k = op.held(), op.top_k.value.data
        renormalize = op.renormalize is not None
        route_ins = (1, 5) if op.split() else (1,)
        epsilon = op.epsilon.value.data if op.epsilon is not None else None
        scale = (n - 1,) if epsilon is not None else ()  # the folded norm's scale, the last input
        residual = (5 + op.split(),) if op.has_residual() else ()  # added to the sum (on `on_chip` alone)
        on_chip = op.residual_chip.value.data if op.residual_chip is not None else None
        groups = (count, assigned) if op.grouped() else ()
        suffix = "_grouped" if groups else ""
        items = (lambda s: held) if groups else (lambda s: s[1][0] * s[1][1])  # noqa: E731 (block.y of a product)
        route = lambda b, a, s: decode_kernels.experts_route(b, a, s, top_k, renormalize, held)  # noqa: E731
        kinds = [
            Kind(
                "experts_route" + ("_renormalize" if renormalize else ""),
                (*route_ins, chosen, weights),
                lambda s: (cdiv(s[0][0], WARPS), 1, 1),
                route,
                (top_k, renormalize, held),
            )
        ]
        if groups:
            grid = lambda s: (cdiv(s[1][0], THREADS), 1, 1)  # noqa: E731
            kinds.append(Kind("experts_group", (chosen, count, assigned), grid, decode_kernels.experts_group))
        kinds += [
            Kind(
                ("experts_norm_gate_up" if epsilon is not None else "experts_gate_up") + suffix,
                (0, chosen, 2, 3, *scale, act, *groups),
                lambda s: (cdiv(s[2][1], WARPS), items(s), 1),
                lambda b, a, s: decode_kernels.experts_gate_up(b, a, s, epsilon),
                (epsilon,),
            ),
            Kind(
                "experts_down" + suffix,
                (act, chosen, weights, 4, partial, *groups),
                lambda s: (cdiv(s[3][1], WARPS), items(s), 1),
                decode_kernels.experts_down,
            ),
            Kind(
                "experts_sum" + ("_residual" if residual else "") + (f"_chip{on_chip}" if on_chip is not None else ""),
                (partial, chosen, *residual, *((5,) if on_chip is not None else ()), out),
                lambda s: (cdiv(s[-1][1], THREADS), s[-1][0], 1),
                lambda b, a, s: decode_kernels.experts_sum(b, a, s, held, bool(residual), on_chip),
                (held, on_chip),
            ),
        ]
        return kinds


class LaunchPrefillAttention(_LaunchKernel):
    source = cuda.PrefillAttentionOp  # always the tensor-core flash attention

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.PrefillAttentionOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)


class LaunchAdd(_LaunchKernel):
    source = cuda.AddOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.AddOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.AddOp) -> list[Kind]:
        return [Kind("add", (0, 1, 2), _rows_by_threads, decode_kernels.add)]


class LaunchBiasAdd(_LaunchKernel):
    source = cuda.BiasAddOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.BiasAddOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.BiasAddOp) -> list[Kind]:
        return [Kind("bias_add", (0, 1, 2), _rows_by_threads, decode_kernels.bias_add)]


class LaunchScale(_LaunchKernel):
    source = cuda.ScaleOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.ScaleOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.ScaleOp) -> list[Kind]:
        factor = op.factor.value.data
        body = lambda b, a, s: decode_kernels.elementwise(b, a, s, lambda v: b.fmul(v, b.fconst(factor)))  # noqa: E731
        return [Kind("scale", (0, 1), _rows_by_threads, body, (factor,))]


class LaunchSoftcap(_LaunchKernel):
    source = cuda.SoftcapOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.SoftcapOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.SoftcapOp) -> list[Kind]:
        cap = op.cap.value.data
        body = lambda b, a, s: decode_kernels.elementwise(b, a, s, lambda v: decode_kernels.softcap(b, v, cap))  # noqa: E731
        return [Kind("softcap", (0, 1), _rows_by_threads, body, (cap,))]


class LaunchArgmax(_LaunchKernel):
    source = cuda.ArgmaxOp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cuda.ArgmaxOp, rewriter: PatternRewriter) -> None:
        self.launch(op, rewriter)

    def kinds(self, op: cuda.ArgmaxOp) -> list[Kind]:
        chunk = op.chunk.value.data
        chunks = lambda s: (cdiv(s[1][1], WARPS), s[0][0], 1)  # noqa: E731
        return [
            Kind(
                "argmax_chunks", (0, 2), chunks, lambda b, a, s: decode_kernels.argmax_chunks(b, a, s, chunk), (chunk,)
            ),
            Kind("argmax_final", (2, 1), lambda s: (cdiv(s[0][0], WARPS), 1, 1), decode_kernels.argmax_final),
        ]


PATTERNS: tuple[type[_LaunchKernel], ...] = (
    LaunchEmbed,
    LaunchRMSNorm,
    LaunchLinear,
    LaunchGateUp,
    LaunchQKV,
    LaunchRope,
    LaunchRopeCacheWrite,
    LaunchAttention,
    LaunchExperts,
    LaunchPrefillAttention,
    LaunchAdd,
    LaunchBiasAdd,
    LaunchHeadRMSNorm,
    LaunchScale,
    LaunchSoftcap,
    LaunchArgmax,
)


def _signature(stem: str, types: list[Attribute]) -> str:
    """A kernel's name: its stem and the shapes and element types it was built for (two ops of one signature
    share one kernel)."""
    parts = [stem]
    for kind in types:
        assert isinstance(kind, MemRefType)
        shape = "x".join(str(d) for d in kind.get_shape())
        element = kind.element_type
        tag = "bf16" if isinstance(element, BFloat16Type) else "f32" if isinstance(element, Float32Type) else "i64"
        if isinstance(element, IntegerType) and element.width.data in (16, 32):  # a weight's stored units
            tag = f"u{element.width.data}"
        parts.append(f"{shape}{tag}")
    return "_".join(parts)


class _Lowering:
    """Builds each distinct kernel once and the host's launches."""

    def __init__(self) -> None:
        self.kernels: dict[str, gpu.FuncOp] = {}
        self.params: dict[str, tuple[object, ...]] = {}
        self.gpu_block = Block()
        self.constants: dict[int, SSAValue] = {}
        # the bf16 image of A the last launched op left in its scratch (its x and norm scale), and what that op
        # wrote: the next Hopper product of the same x and scale reuses it (q, k and v convert their x once)
        self.converted: tuple[tuple[SSAValue, ...], SSAValue, tuple[SSAValue, ...]] | None = None

    def kernel(self, kind: Kind, types: list[Attribute], shapes: list[tuple[int, ...]], roles: list[str]) -> str:
        """The kernel of `kind` for these buffers, built the first time it is needed; a kernel of the same signature
        built from other params (another norm's epsilon) is a variant of its own (`<signature>_v2` ...)."""
        signature = _signature(kind.stem, types)
        name, variant = signature, 1
        while name in self.kernels and self.params[name] != kind.params:
            variant += 1
            name = f"{signature}_v{variant}"
        if name in self.kernels:
            return name
        self.params[name] = kind.params
        function = gpu.FuncOp(name, (types, []), kernel=True, known_block_size=[kind.threads, 1, 1])
        for arg, role in zip(function.body.block.args, roles, strict=True):
            arg.name_hint = role
        body = Body(function.body.block)
        kind.body(body, list(function.body.block.args), shapes)
        body.op(gpu.ReturnOp([]))
        self.kernels[name] = function
        self.gpu_block.add_op(function)
        return name

    def launch(self, op: cuda.KernelOp, kinds: list[Kind], rewriter: PatternRewriter) -> None:
        """`op` replaced by the launches of `kinds` on its buffers (and the scratch this lowering adds)."""
        host = op.parent_op()
        assert isinstance(host, func.FuncOp)
        operands = [*op.ins, *op.outs]
        ins, outs = op.shapes()
        shapes = [*ins, *outs]
        all_roles = op.roles()
        if isinstance(op, cuda.QKVOp):  # split-K's partial sums and counts: scratch the lowering adds
            pairs, depth = shapes[1][0] // 2, shapes[0][1]
            splits = qkv_splits(pairs, depth, op.ins[1].type.element_type)  # type: ignore[attr-defined]
            if splits > 1:
                operands += [
                    self.scratch(host, "qkv.partial", MemRefType(f32, [pairs, splits, 3]), rewriter),
                    self.scratch(host, "qkv.count", MemRefType(i64, [pairs]), rewriter),
                ]
                shapes += [(pairs, splits, 3), (pairs,)]
                all_roles = [*all_roles, "partial", "count"]
        if hopper.handles(op):  # the product's bf16 A operand: scratch the conversion launch writes
            rows, depth = shapes[0]
            operands.append(
                self.scratch(host, f"prefill.a_bf16.{rows}x{depth}", MemRefType(bf16, [rows, depth]), rewriter)
            )
            shapes.append((rows, depth))
            all_roles = [*all_roles, "a_bf16"]
        converted, self.converted = self.converted, None
        if hopper.handles(op):
            source = tuple(operands[i] for i in kinds[0].operands[:-1])  # x (and the norm's scale)
            scratch = operands[kinds[0].operands[-1]]
            same = converted is not None and converted[1] is scratch and len(converted[0]) == len(source)
            same = same and all(a is b for a, b in zip(converted[0], source, strict=False))  # type: ignore[index]
            if same and not any(out is v for out in converted[2] for v in source):  # type: ignore[index]
                kinds = kinds[1:]  # the scratch holds this x's image already
            self.converted = (source, scratch, tuple(op.outs))
        for kind in kinds:
            chosen = [operands[i] for i in kind.operands]
            picked = [shapes[i] for i in kind.operands]
            roles = [all_roles[i] for i in kind.operands]
            name = self.kernel(kind, [v.type for v in chosen], picked, roles)
            grid = kind.grid(picked)
            sizes = [self.constant(host, n, rewriter) for n in (*grid, kind.threads, 1, 1)]
            call = gpu.LaunchFuncOp(SymbolRefAttr("kernels", [name]), sizes[:3], sizes[3:], kernelOperands=chosen)
            rewriter.insert(call, InsertPoint.before(op))
        rewriter.erase(op)

    def scratch(self, host: func.FuncOp, name: str, kind: MemRefType, rewriter: PatternRewriter) -> SSAValue:
        """A scratch buffer of the host plan made by this lowering (zero when allocated; a kernel that counts in it
        returns it to zero), one for all the launches of its shape."""
        block = host.body.block
        for op in block.ops:
            if isinstance(op, cuda.BufferOp) and op.buffer.data == name:
                if op.result.type != kind:
                    raise PassError(f"{NAME}: scratch '{name}' is needed as {kind} and as {op.result.type}")
                return op.result
        buffer = cuda.BufferOp(name, "scratch", kind)
        buffer.result.name_hint = name.replace(".", "_")
        rewriter.insert(buffer, InsertPoint.at_start(block))
        return buffer.result

    def constant(self, host: func.FuncOp, value: int, rewriter: PatternRewriter) -> SSAValue:
        """The host's index constant `value`, one for every launch that uses it."""
        found = self.constants.get(value)
        if found is None:
            constant = arith.ConstantOp(IntegerAttr(value, INDEX))
            rewriter.insert(constant, InsertPoint.at_start(host.body.block))
            found = self.constants[value] = constant.result
        return found


@dataclass(frozen=True)
class ConvertCudaKernelsToGpu(ModulePass):
    """Expands each kernel-level op into `gpu.launch_func` of a `gpu.func` built once per distinct shape. The
    module's docstring says what it assumes and guarantees."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        host = host_function(op, NAME)
        lowered = {pattern.source for pattern in PATTERNS}
        for step in host.body.block.ops:
            if isinstance(step, cuda.KernelOp) and type(step) not in lowered:
                raise PassError(f"{NAME}: '{step.name}' has no kernel")
        lowering = _Lowering()
        patterns = GreedyRewritePatternApplier([pattern(lowering) for pattern in PATTERNS])
        PatternRewriteWalker(patterns, apply_recursively=False).rewrite_module(op)
        for buffer in [b for b in host.body.block.ops if isinstance(b, cuda.BufferOp) and not b.result.uses]:
            host.body.block.erase_op(buffer)  # e.g. a prefill chunk's attention scratch the fused kernel does not use
        kernels = gpu.ModuleOp(StringAttr("kernels"), Region(lowering.gpu_block))  # type: ignore[arg-type]
        op.body.block.insert_op_before(kernels, host)
        op.attributes["gpu.container_module"] = UnitAttr()
