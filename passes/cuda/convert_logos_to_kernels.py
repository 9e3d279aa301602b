"""`convert-logos-to-cuda-kernels`: a `logos` program -> the CUDA lane's kernel level (host plan of kernels).

    logos-opt decode.logos -p 'inline-sections,convert-logos-to-cuda-kernels{weights=bf16}'

Assumes: a module holding one `logos.program` of a whole decode step, prefill chunk or batch (split over chips or
not) whose @main is inlined (`inline-sections`), in the author's form: each layer computes its projections, rotates
queries and keys, writes keys and values into its caches, attends, projects back with a residual add, and runs
SwiGLU with a residual add.

Guarantees: the program is replaced by one host function `@step` (and, when split, the program's `shard.grid`):
`cuda.buffer` ops naming every device buffer (each weight by its tensor name in the `weights` image, norm scales in f32
whatever the image, each layer's caches, the inputs, the output, the activations named by the value names the author
gave them, so that every layer reuses the same activation buffers, and the rotary cos/sin tables), in the order they
were first needed, then one kernel-level op per kernel in launch order, with `shard.all_reduce` kept between kernels
where the program has it, and a split head's `shard.all_gather` (this chip's logits into the whole row, a new buffer
named by the op's `cuda.buffer` attribute, the arg-max's input). Each add is one `cuda.add`. What an op's pattern folds
into the kernel it lowers to: SiLU and the product into one gate/up kernel, the key rotation and both cache writes into
one kernel, the prefill head's row pick into its RMS norm; the fusions across kernels are passes of their own (`cuda-
fold-norms`, `cuda-fuse-qkv`, `cuda-fold-residual-adds`, `cuda-fuse-prefill-attention`, `cuda-fold-prefill-norms`). The
module records the program's identity line (`cuda.identity`) and the weight image (`cuda.weights`).

One rewrite pattern a logos op (`Lower<Op>`), driven by one walker over @main: each names the buffers it needs (a
name already given is the same buffer) and stands for its result with an `unrealized_conversion_cast` of its
buffer, which the patterns of its readers read; a rotation, SiLU or row pick waits for the pattern of the op that
reads it. Any other cut, or a program not in the author's form, is refused with a `PassError` naming the pass and
the op, and the module is left as it was (the program is rewritten as a copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    BytesAttr,
    DenseArrayBase,
    FlatSymbolRefAttr,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    TensorType,
    UnitAttr,
    UnrealizedConversionCastOp,
    f32,
    i16,
    i64,
)
from xdsl.dialects.shard import AllReduceOp, GridOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from logos_ir import identity
from logos_ir.dialects import cuda, logos
from logos_ir.dialects.shard_ext import AllGatherOp
from logos_ir.errors import PassError
from logos_ir.passes.cuda import blocks
from logos_ir.passes.cuda.decode_kernels import attention_min_span
from logos_ir.passes.cuda.kernel_level import value_name, writes
from logos_ir.program import Cut

NAME = "convert-logos-to-cuda-kernels"
LOWERED = ("decode", "prefill", "batch")
ATTENTION_WARPS = 16 * 132  # warps attention aims at: 16 an SM (4 blocks of 4) over an H200's 132 SMs
ARGMAX_CHUNK = 1024  # values one warp reduces in the first stage of the arg-max
LAZY = (logos.RopeOp, logos.SiluOp, logos.GeluTanhOp, logos.RowOp)  # folded into the kernel that reads them


def attention_split(kv_items: int, ctx: int, least: int) -> int:
    """The most positions a split attends at a full cache (flash-decoding): enough splits that the (row, KV head,
    split) warps fill the SMs (`ATTENTION_WARPS`), none shorter than `least` (the kernel's one loop iteration,
    `decode_kernels.attention_min_span`). The kernel shares the live length over the same number of splits, so a
    short cache uses fewer positions a split."""
    splits = max(1, min(-(-ATTENTION_WARPS // kv_items), -(-ctx // least)))
    return -(-ctx // splits)


@dataclass
class _Lowering:
    """What the patterns share: the weight image's element, the buffers named so far (a buffer is named once, where
    it is first needed, so that every layer reuses its activation buffers), the caches' length (the rotary tables'),
    the key a rotation waits to write with its value, the chips' grid, and the first refusal."""

    spec: Any  # the program's ModelSpec
    element: Attribute
    grid: GridOp | None
    decode: bool = False  # a decode step: its weights stored in blocks are read as stored
    buffers: dict[str, SSAValue] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    ctx: int = 1
    # (rotated key source, cache, positions, its rotation)
    pending_key: tuple[SSAValue, SSAValue, SSAValue, logos.RopeOp] | None = None
    refusal: PassError | None = None
    stacked_storage: dict[str, str] = field(default_factory=dict)  # a stacked experts' weight's stored format

    def buffer(self, rewriter: PatternRewriter, name: str, kind: str, kind_type: MemRefType) -> SSAValue:
        """The buffer `name` (named `<name>.<shape>` when `name` holds another type), added before the op being
        rewritten when it is new."""
        known = self.buffers.get(name)
        if known is not None and known.type != kind_type:
            return self.buffer(rewriter, f"{name}.{'x'.join(str(d) for d in kind_type.get_shape())}", kind, kind_type)
        if known is not None:
            return known
        op = cuda.BufferOp(name, kind, kind_type)
        op.result.name_hint = value_name(name)
        rewriter.insert(op, rewriter.insertion_point)
        self.buffers[name] = op.result
        return op.result

    def activation(self, rewriter: PatternRewriter, value: SSAValue, kind: str = "activation") -> SSAValue:
        shape = logos.tensor_shape(value)
        element = i64 if isinstance(cast(TensorType, value.type).element_type, IntegerType) else f32
        return self.buffer(rewriter, value.name_hint or "value", kind, MemRefType(element, list(shape)))

    def rope_tables(
        self, rewriter: PatternRewriter, head_dim: int, rope: logos.RopeOp | None = None
    ) -> tuple[SSAValue, SSAValue]:
        """The host's cos / signed sin tables of `rope`'s rotation: the model's (`rope.cos`, `rope.sin`), or a
        pair of its own for a layer's own base or a partial rotary (`cuda.rope_table_names`)."""
        kind_type = MemRefType(f32, [self.ctx, head_dim])
        theta, rotary, unscaled = None, None, False
        if rope is not None:
            own = rope.theta.value.data
            theta = own if own != self.spec.rope_theta else None  # type: ignore[attr-defined]
            rotary = rope.rotary_dim.value.data if rope.rotary_dim is not None else None
            unscaled = rope.rope_scaling is None and self.spec.rope_scaling is not None  # type: ignore[attr-defined]
        cos, sin = cuda.rope_table_names(theta, rotary, unscaled)
        return self.buffer(rewriter, cos, "table", kind_type), self.buffer(rewriter, sin, "table", kind_type)

    def refuse(self, message: str) -> None:
        if self.refusal is None:
            self.refusal = PassError(f"{NAME}: {message}")


def _buffer_of(value: SSAValue) -> SSAValue | None:
    """The buffer a lowered value lives in (the input of the cast that stands for it), or None for a value that is
    not in a buffer (a rotation, a SiLU, a row pick waiting for the kernel that reads it)."""
    owner = value.owner
    if isinstance(owner, UnrealizedConversionCastOp) and isinstance(owner.inputs[0].type, MemRefType):
        return owner.inputs[0]
    return None


def _stands_for(rewriter: PatternRewriter, op: Operation, buffer: SSAValue) -> None:
    """`op`'s one result replaced by a cast of `buffer` (what later patterns read its buffer from), `op` erased."""
    stand_in = UnrealizedConversionCastOp.get([buffer], [op.results[0].type])
    rewriter.insert(stand_in, rewriter.insertion_point)
    rewriter.replace(op, [], [stand_in.results[0]])


def _last_step(op: Operation) -> Operation | None:
    """The kernel or collective launched last before `op`."""
    earlier = op.prev_op
    while earlier is not None and not _is_step(earlier):
        earlier = earlier.prev_op
    return earlier


def _is_step(op: Operation) -> bool:
    memref_collective = isinstance(op, AllReduceOp | AllGatherOp) and isinstance(op.results[0].type, MemRefType)
    return isinstance(op, cuda.KernelOp) or memref_collective


class _LoweringPattern(RewritePattern):
    """A pattern of this pass: it reads and names buffers through the shared `_Lowering`, and does nothing once a
    pattern has refused the program."""

    def __init__(self, lowering: _Lowering):
        self.lowering = lowering

    def of(self, value: SSAValue, op: Operation) -> SSAValue:
        buffer = _buffer_of(value)
        if buffer is None:
            owner = value.owner
            what = owner.name if isinstance(owner, Operation) else "an argument"
            self.lowering.refuse(f"'{op.name}' reads a value the CUDA lane cannot hold in a buffer ({what})")
            return value
        return buffer


class LowerInput(_LoweringPattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.InputOp, rewriter: PatternRewriter) -> None:
        _stands_for(rewriter, op, self.lowering.activation(rewriter, op.result, "input"))


class LowerWeight(_LoweringPattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.WeightOp, rewriter: PatternRewriter) -> None:
        shape = logos.tensor_shape(op.result)
        # Norm scales (the only 1-D weights) stay f32 in a bf16 image: a rounding of them would scale every channel
        # of every row, and they are some 0.03% of a model's bytes.
        element = self.lowering.element if len(shape) > 1 else f32
        stored = self._stored(op, shape)
        kind_type = blocks.stored_type(stored, shape) if stored else MemRefType(element, list(shape))
        weight = self.lowering.buffer(rewriter, op.tensor.data, "weight", kind_type)
        if len(shape) == 3 and op.storage is not None:  # a mixture's stacked experts: read from the image alone
            self.lowering.stacked_storage[op.tensor.data] = op.storage.format.name
        if stored:
            blocks.mark(cast(Operation, weight.owner), stored)
        _stands_for(rewriter, op, weight)

    def _stored(self, op: logos.WeightOp, shape: tuple[int, ...]) -> str | None:
        """The format a decode step reads this weight's blocks in as stored (`blocks.READ_AS_STORED`), or None for
        its float image (a vector, a float storage, an fp8 row that is not whole 16-byte loads of codes, or a prefill
        chunk's or batch's weight). A share is whole blocks: `logos.weight` refuses a split along the rows that cuts
        one."""
        fmt = op.storage.format.name if op.storage is not None else None
        if not self.lowering.decode or len(shape) != 2 or fmt is None or not blocks.reads_as_stored(fmt, shape[-1]):
            return None
        return fmt


class LowerCache(_LoweringPattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.CacheOp, rewriter: PatternRewriter) -> None:
        shape = logos.tensor_shape(op.result)
        self.lowering.ctx = shape[-2]
        name = f"cache.{op.kind.data}.{op.layer.value.data}"
        # the cache holds the weight image's element: bf16 beside bf16 weights (half attention's bytes), f32 beside
        # f32 weights (the exact path)
        kind_type = MemRefType(self.lowering.element, list(shape))
        _stands_for(rewriter, op, self.lowering.buffer(rewriter, name, "cache", kind_type))


class LowerEmbed(_LoweringPattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.EmbedOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        rewriter.insert(cuda.EmbedOp([self.of(op.table, op), self.of(op.tokens, op)], [out]))
        _stands_for(rewriter, op, out)


class LowerRMSNorm(_LoweringPattern):
    """An RMS norm as `cuda.rms_norm`; of a row pick (the prefill head's last row), that row alone (`row`)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.RMSNormOp, rewriter: PatternRewriter) -> None:
        row, source = -1, op.input
        picked = op.input.owner
        if isinstance(picked, logos.RowOp):
            source, row = picked.input, picked.index.value.data - 1
        out = self.lowering.activation(rewriter, op.result)
        props = {"epsilon": FloatAttr(op.epsilon.value.data, f32), "row": IntegerAttr(row, i64), **_plus_one(op)}
        rewriter.insert(cuda.RMSNormOp([self.of(source, op), self.of(op.weight, op)], [out], props))
        _stands_for(rewriter, op, out)


def _plus_one(op: logos.ScaledRMSNormOp) -> dict[str, Attribute]:
    """A norm by one plus its weight keeps saying so (Gemma's norms)."""
    return {"plus_one": UnitAttr()} if op.plus_one is not None else {}


class LowerScale(_LoweringPattern):
    """Each number times a constant (Gemma's embedding by the square root of the width), one `cuda.scale`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ScaleOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        props = {"factor": FloatAttr(op.factor.value.data, f32)}
        rewriter.insert(cuda.ScaleOp([self.of(op.input, op)], [out], props))
        _stands_for(rewriter, op, out)


class LowerSoftcap(_LoweringPattern):
    """A tanh soft-cap of each number (Gemma 2's logits), one `cuda.softcap`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.SoftcapOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        props = {"cap": FloatAttr(op.cap.value.data, f32)}
        rewriter.insert(cuda.SoftcapOp([self.of(op.input, op)], [out], props))
        _stands_for(rewriter, op, out)


class LowerHeadRMSNorm(_LoweringPattern):
    """An RMS norm of each head (Qwen3's query and key norms) as `cuda.head_rms_norm`, a kernel of its own before
    the rotation that reads it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.HeadRMSNormOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        props = {"epsilon": FloatAttr(op.epsilon.value.data, f32), **_plus_one(op)}
        rewriter.insert(cuda.HeadRMSNormOp([self.of(op.input, op), self.of(op.weight, op)], [out], props))
        _stands_for(rewriter, op, out)


class LowerLinear(_LoweringPattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.LinearOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        rewriter.insert(cuda.LinearOp([self.of(op.input, op), self.of(op.weight, op)], [out]))
        _stands_for(rewriter, op, out)


class LowerSwiGLU(_LoweringPattern):
    """silu(x @ gate^T) * (x @ up^T) (SwiGLU) or gelu_tanh(x @ gate^T) * (x @ up^T) (GeGLU): the two projections
    already lowered become one `cuda.gate_up` (`gelu_tanh` for GeGLU)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.MulOp, rewriter: PatternRewriter) -> None:
        activated = op.lhs.owner
        if not isinstance(activated, logos.SiluOp | logos.GeluTanhOp):
            self.lowering.refuse(
                "'logos.mul' is lowered only as SwiGLU's silu(gate) or GeGLU's gelu_tanh(gate) times up"
            )
            return
        gate = self._linear_of(self.of(activated.input, op), op)
        up = self._linear_of(self.of(op.rhs, op), op)
        if gate is None or up is None:
            return
        if gate.ins[0] != up.ins[0]:
            self.lowering.refuse("'logos.mul' multiplies projections of two different inputs")
            return
        if (gate.biased is None) != (up.biased is None):
            self.lowering.refuse("SwiGLU's fused kernel (cuda.gate_up) adds biases to both its products or to none")
            return
        rewriter.erase(gate)
        rewriter.erase(up)
        out = self.lowering.activation(rewriter, op.result)
        ins = [gate.ins[0], gate.ins[1], up.ins[1]]
        biases = [gate.bias(), up.bias()] if gate.biased is not None else []
        props = {"biased": UnitAttr()} if biases else {}
        if isinstance(activated, logos.GeluTanhOp):
            props["gelu_tanh"] = UnitAttr()
        rewriter.insert(cuda.GateUpOp([*ins, *cast(list[SSAValue], biases)], [out], props))
        _stands_for(rewriter, op, out)

    def _linear_of(self, buffer: SSAValue, op: Operation) -> cuda.LinearOp | None:
        """The projection that last wrote `buffer`, when it is one writing only that (its bias, if any, folded into
        it by `LowerBiasAdd`)."""
        step = _last_step(op)
        while step is not None and buffer not in writes(step):
            step = _last_step(step)
        if isinstance(step, cuda.BiasAddOp):
            self.lowering.refuse("SwiGLU's fused kernel (cuda.gate_up) adds a bias only in its epilogue, not after")
            return None
        if not isinstance(step, cuda.LinearOp) or list(step.outs) != [buffer]:
            self.lowering.refuse(f"'{op.name}' expects a projection feeding it, found none")
            return None
        return step


class LowerExperts(_LoweringPattern):
    """A mixture of experts as one `cuda.experts` (the router's softmax and top-k, the chosen experts' gate/up and
    down products, their weighted sum): its small buffers of each row's chosen experts and weights and the
    chosen experts' products are scratch of its own; a chunk's or batch's rows are grouped by expert (each
    expert's assignments, `experts.count` / `experts.assigned`); a split step's share of the experts reads the
    host's `chip` table (its first expert is chip * held). Stacked weights held in a block or fp8 format are
    refused in a decode step: the experts' GEMVs read float images alone."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.MixtureOp, rewriter: PatternRewriter) -> None:
        lowering = self.lowering
        x, logits = self.of(op.input, op), self.of(op.logits, op)
        weights = [self.of(w, op) for w in (op.gate, op.up, op.down)]
        for weight in weights:
            fmt = lowering.stacked_storage.get(_name_of(weight))
            if lowering.decode and fmt is not None and fmt in blocks.READ_AS_STORED:
                lowering.refuse(
                    f"'logos.experts' %{op.result.name_hint} reads stacked experts stored as {fmt} "
                    f"('{_name_of(weight)}'): the CUDA lane's expert GEMVs read f32 and bf16 images only"
                )
                return
        rows, hidden = logos.tensor_shape(op.input)
        held, inter, _ = logos.tensor_shape(op.gate)
        k = op.top_k.value.data
        ins = [x, logits, *weights]
        if held != logos.tensor_shape(op.logits)[1]:  # a chip's share of the experts
            ins.append(lowering.buffer(rewriter, "chip", "table", MemRefType(i64, [1])))
        out = lowering.activation(rewriter, op.result)

        def scratch(name: str, element: Attribute, shape: list[int]) -> SSAValue:
            return lowering.buffer(rewriter, name, "scratch", MemRefType(element, shape))

        outs = [
            out,
            scratch("route.chosen", i64, [rows, k]),
            scratch("route.weights", f32, [rows, k]),
            scratch("experts.act", f32, [rows * k, inter]),
            scratch("experts.partial", f32, [rows * k, hidden]),
        ]
        if rows > 1:  # grouped by expert
            outs += [scratch("experts.count", i64, [held]), scratch("experts.assigned", i64, [held, rows])]
        props: dict[str, Attribute] = {"top_k": IntegerAttr(k, i64)}
        if op.renormalize is not None:
            props["renormalize"] = UnitAttr()
        rewriter.insert(cuda.ExpertsOp(ins, outs, props))
        _stands_for(rewriter, op, out)


class LowerAdd(_LoweringPattern):
    """An elementwise add, one `cuda.add` (`cuda-fold-residual-adds` folds a residual add into its projection)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.AddOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        rewriter.insert(cuda.AddOp([self.of(op.lhs, op), self.of(op.rhs, op)], [out]))
        _stands_for(rewriter, op, out)


class LowerBiasAdd(_LoweringPattern):
    """A projection's bias added to each row: folded into the epilogue of the projection launched right before it
    (`cuda.linear` with `biased`, the bias its input after the weight) when that projection's result is read by
    the bias add alone; else one `cuda.bias_add` (a split program's row-parallel projection, whose bias follows
    its all-reduce)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.BiasAddOp, rewriter: PatternRewriter) -> None:
        out = self.lowering.activation(rewriter, op.result)
        source, bias = self.of(op.input, op), self.of(op.bias, op)
        last = _last_step(op)
        unread = len(list(op.input.uses)) == 1
        if isinstance(last, cuda.LinearOp) and len(last.ins) == 2 and list(last.outs) == [source] and unread:
            ins = [*last.ins, bias]
            rewriter.erase(last)  # launched here instead, after the bias's and the result's buffers
            rewriter.insert(cuda.LinearOp(ins, [out], {"biased": UnitAttr()}))
        else:
            rewriter.insert(cuda.BiasAddOp([source, bias], [out]))
        _stands_for(rewriter, op, out)


class CheckRope(_LoweringPattern):
    """A rotation is folded into the kernel that reads it (the key's cache write, the attention's query)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.RopeOp, rewriter: PatternRewriter) -> None:
        head_dim = self.lowering.spec.head_dim  # type: ignore[attr-defined]
        if op.head_dim.value.data != head_dim:
            self.lowering.refuse(f"'logos.rope' rotates heads of {op.head_dim.value.data}, not the model's")


class LowerCacheWrite(_LoweringPattern):
    """A rotated key's cache write waits for the value's; the two become one `cuda.rope_cache_write`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.CacheWriteOp, rewriter: PatternRewriter) -> None:
        lowering = self.lowering
        rotated = op.input.owner
        cache, positions = self.of(op.cache, op), self.of(op.positions, op)
        if isinstance(rotated, logos.RopeOp):
            if lowering.pending_key is not None:
                lowering.refuse("'logos.cache_write' writes two rotated keys with no value between")
            lowering.pending_key = (self.of(rotated.input, op), cache, positions, rotated)
            rewriter.erase(op)
            return
        if lowering.pending_key is None:
            lowering.refuse("'logos.cache_write' writes values before their rotated keys")
            return
        key, keys, _, rope = lowering.pending_key
        lowering.pending_key = None
        cos, sin = lowering.rope_tables(rewriter, lowering.spec.head_dim, rope)  # type: ignore[attr-defined]
        ins = [key, self.of(op.input, op), positions, cos, sin]
        rewriter.insert(cuda.RopeCacheWriteOp(ins, [keys, cache], _rotary(rope)))
        rewriter.erase(op)


class LowerAttention(_LoweringPattern):
    """Attention (flash-decoding's split over the cache) as `cuda.attention`, its rotated queries by a `cuda.rope`
    launched before it."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.AttentionOp, rewriter: PatternRewriter) -> None:
        lowering = self.lowering
        query = self._rotated_query(op, rewriter)
        keys, values, positions = self.of(op.keys, op), self.of(op.values, op), self.of(op.positions, op)
        rows, width = logos.tensor_shape(op.query)
        cache_shape = logos.tensor_shape(op.keys)
        heads = width // cache_shape[-1]
        least = attention_min_span(cache_shape[-1], lowering.element, heads // cache_shape[-3])
        window = op.window.value.data if op.window is not None else None
        attended = min(cache_shape[-2], window) if window is not None else cache_shape[-2]  # a row's most positions
        split = attention_split(cache_shape[-3] * rows, attended, least)
        splits = -(-attended // split)
        partial_type = MemRefType(f32, [rows, heads, splits, cache_shape[-1] + 2])
        scratch = lowering.buffer(rewriter, "attention.partial", "scratch", partial_type)
        count = lowering.buffer(rewriter, "attention.count", "scratch", MemRefType(i64, [rows, cache_shape[-3]]))
        out = lowering.activation(rewriter, op.result)
        props = {"split": IntegerAttr(split, i64)}
        if window is not None:  # the kernel bounds each row's range to its window
            props["window"] = IntegerAttr(window, i64)
        if op.scale is not None:
            props["scale"] = FloatAttr(op.scale.value.data, f32)
        if op.softcap is not None:
            props["softcap"] = FloatAttr(op.softcap.value.data, f32)
        rewriter.insert(cuda.AttentionOp([query, keys, values, positions], [out, scratch, count], props))
        _stands_for(rewriter, op, out)

    def _rotated_query(self, op: logos.AttentionOp, rewriter: PatternRewriter) -> SSAValue:
        rotated = op.query.owner
        if not isinstance(rotated, logos.RopeOp):
            return self.of(op.query, op)
        head_dim = self.lowering.spec.head_dim  # type: ignore[attr-defined]
        cos, sin = self.lowering.rope_tables(rewriter, head_dim, rotated)
        x = self.of(rotated.input, op)
        out = self.lowering.buffer(rewriter, rotated.result.name_hint or "turned", "activation", x.type)  # type: ignore[arg-type]
        props = {"head_dim": IntegerAttr(head_dim, i64), **_rotary(rotated)}
        rewriter.insert(cuda.RopeOp([x, self.of(op.positions, op), cos, sin], [out], props))
        return out


def _rotary(rope: logos.RopeOp) -> dict[str, Attribute]:
    """A partial rotary's `rotary_dim` for the kernel that rotates (none for the whole head)."""
    return {"rotary_dim": IntegerAttr(rope.rotary_dim.value.data, i64)} if rope.rotary_dim is not None else {}


class LowerArgmax(_LoweringPattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ArgmaxOp, rewriter: PatternRewriter) -> None:
        rows, width = logos.tensor_shape(op.input)
        chunks = -(-width // ARGMAX_CHUNK)
        scratch = self.lowering.buffer(rewriter, "argmax.partial", "scratch", MemRefType(f32, [rows, chunks, 2]))
        out = self.lowering.activation(rewriter, op.result, "output")
        props = {"chunk": IntegerAttr(ARGMAX_CHUNK, i64)}
        rewriter.insert(cuda.ArgmaxOp([self.of(op.input, op)], [out, scratch], props))
        _stands_for(rewriter, op, out)


class LowerAllReduce(_LoweringPattern):
    """A chips' all-reduce of a value as one of its buffer, in place; later kernels read the reduced buffer."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceOp, rewriter: PatternRewriter) -> None:
        if not isinstance(op.input.type, TensorType):
            return
        grid = self.lowering.grid
        assert grid is not None
        source = self.of(op.input, op)
        reduce = AllReduceOp.build(
            operands=[source],
            result_types=[source.type],
            properties={"grid": FlatSymbolRefAttr(grid.sym_name.data), "grid_axes": _grid_axes(grid)},
        )
        reduce.result.name_hint = value_name(_name_of(source)) + "_reduced"
        rewriter.insert(reduce)
        _stands_for(rewriter, op, reduce.result)


class LowerAllGather(_LoweringPattern):
    """A split head's all-gather (this chip's logits into the whole row) as one of its buffer into a new buffer,
    named by the op's `cuda.buffer` attribute."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllGatherOp, rewriter: PatternRewriter) -> None:
        if not isinstance(op.input.type, TensorType):
            return
        if op.grid_axes.get_values() != (0,):
            self.lowering.refuse("'shard.all_gather' gathers over the chips' one grid axis, [0]")
            return
        grid = self.lowering.grid
        assert grid is not None
        source = self.of(op.input, op)
        name = _name_of(source)
        result = op.result.name_hint or f"{name}@gathered"
        if result in self.lowering.buffers:
            result = f"{name}@gathered"
        kind = cast(MemRefType, source.type)
        axis = op.gather_axis.value.data
        shape = list(kind.get_shape())
        shape[axis] *= grid.shape.get_values()[0]
        gather = AllGatherOp.build(
            operands=[source],
            result_types=[MemRefType(kind.element_type, shape)],
            properties={
                "grid": FlatSymbolRefAttr(grid.sym_name.data),
                "grid_axes": _grid_axes(grid),
                "gather_axis": IntegerAttr(axis, IndexType()),
            },
            attributes={"cuda.buffer": StringAttr(result)},  # the new buffer's name, for the host plan
        )
        gather.result.name_hint = value_name(result)
        rewriter.insert(gather)
        _stands_for(rewriter, op, gather.result)


def _name_of(buffer: SSAValue) -> str:
    """The name of a buffer (a reduced buffer's is its source's with `@reduced`, as the host plan reads it)."""
    owner = buffer.owner
    if isinstance(owner, cuda.BufferOp):
        return owner.buffer.data
    if isinstance(owner, AllReduceOp):
        return f"{_name_of(owner.input)}@reduced"
    attribute = owner.attributes.get("cuda.buffer") if isinstance(owner, Operation) else None
    assert isinstance(attribute, StringAttr)
    return attribute.data


def _grid_axes(grid: GridOp) -> Attribute:
    """Every axis of the chips' grid (a 1-D grid: axis 0): upstream reads empty `grid_axes` as "each device alone",
    so an all-reduce without them would be a no-op its canonicalizer erases."""
    axes = list(range(len(grid.shape.get_values())))
    return DenseArrayBase(i16, BytesAttr(i16.pack(axes)))


PATTERNS: tuple[type[_LoweringPattern], ...] = (
    LowerInput,
    LowerWeight,
    LowerCache,
    LowerEmbed,
    LowerRMSNorm,
    LowerHeadRMSNorm,
    LowerScale,
    LowerSoftcap,
    LowerLinear,
    LowerSwiGLU,
    LowerExperts,
    LowerAdd,
    LowerBiasAdd,
    CheckRope,
    LowerCacheWrite,
    LowerAttention,
    LowerArgmax,
    LowerAllReduce,
    LowerAllGather,
)
LOWERED_OPS = (
    logos.InputOp,
    logos.WeightOp,
    logos.CacheOp,
    logos.EmbedOp,
    logos.RMSNormOp,
    logos.HeadRMSNormOp,
    logos.ScaleOp,
    logos.SoftcapOp,
    logos.LinearOp,
    logos.SiluOp,
    logos.GeluTanhOp,
    logos.MulOp,
    logos.MixtureOp,
    logos.AddOp,
    logos.BiasAddOp,
    logos.RopeOp,
    logos.RowOp,
    logos.CacheWriteOp,
    logos.AttentionOp,
    logos.ArgmaxOp,
    AllReduceOp,
    AllGatherOp,
)


def check_cut(program: logos.ProgramOp) -> Cut:
    """The program's cut, refused unless the lane lowers it."""
    cut = Cut.parse(program.cut.data)
    if cut.kind not in LOWERED:
        raise PassError(
            f"{NAME}: the CUDA lane lowers whole decode steps, prefill chunks and batches, not the cut '{cut}' "
            f"('logos.program' cut \"{program.cut.data}\")",
            hint="give the whole program's cut (decode ctx=N, prefill rows=R ctx=N or batch rows=R ctx=N)",
        )
    return cut


def _check_main(main: func.FuncOp) -> None:
    """Refuse, before anything is rewritten, a @main the lane does not lower."""
    for op in main.body.block.ops:
        if isinstance(op, func.CallOp):
            raise PassError(
                f"{NAME}: @main calls @{op.callee.root_reference.data}: the lane lowers an inlined @main",
                hint="run inline-sections first (logos-to-cuda does)",
            )
        if not isinstance(op, (*LOWERED_OPS, func.ReturnOp)):
            raise PassError(f"{NAME}: @main holds '{op.name}', which the CUDA lane does not lower")
        said = _unlowered_variant(op)
        if said is not None:  # an op the lane lowers in its plain form only: a variant is refused, not run as plain
            raise PassError(f"{NAME}: @main's '{op.name}' {said}, which the CUDA lane does not compute")


def _unlowered_variant(op: Operation) -> str | None:
    """What `op` says beyond what the lane lowers (`logos.variant`'s words), or None: attention's window (its range
    bounded to the window), scale and soft-cap, a norm by one plus its weight, a rotation's own base and partial
    rotary and a layer rotating unscaled beside the model's scaling (tables of their own) are lowered; a rope
    scaling of a layer's own is not."""
    if isinstance(op, logos.RopeOp):  # its own base and a partial rotary are lowered (tables of its own)
        spec = logos.program_spec(op)
        if spec is not None and op.rope_scaling not in (None, spec.rope_scaling):  # unscaled: tables of its own
            return f"rotates with rope scaling {op.rope_scaling}, not its model's {spec.rope_scaling}"
        return None
    if isinstance(op, logos.AttentionOp | logos.ScaledRMSNormOp):  # window, scale, soft-cap, plus_one: lowered
        return None
    return logos.variant(op)


def _host_function(main: func.FuncOp) -> func.FuncOp:
    """@main's lowered body as the host function: the buffers first (in the order they were named, those a kernel
    or collective uses), then the kernels and collectives; the casts that stood for values, and the rotations,
    SiLUs and row picks folded into their readers, are gone."""
    block = main.body.block
    ops = list(block.ops)
    for op in reversed(ops):
        if isinstance(op, (func.ReturnOp, UnrealizedConversionCastOp, *LAZY)):
            if any(result.uses for result in op.results):
                raise PassError(f"{NAME}: '{op.name}' is read by an op the lane does not fold it into")
            block.erase_op(op)
    host = Block()
    buffers = [op for op in block.ops if isinstance(op, cuda.BufferOp)]
    for op in buffers:
        op.detach()
        if op.result.uses:
            host.add_op(op)
    for op in list(block.ops):
        if isinstance(op, cuda.KernelOp):
            _check_no_alias(op)
        op.detach()
        host.add_op(op)
    host.add_op(func.ReturnOp())
    return func.FuncOp("step", ((), ()), Region(host))


def _check_no_alias(step: cuda.KernelOp) -> None:
    both = {_name_of(v) for v in step.ins} & {_name_of(v) for v in step.outs}
    if both:
        raise PassError(f"{NAME}: the {step.name} kernel would read and write buffer '{sorted(both)[0]}'")


@dataclass(frozen=True)
class ConvertLogosToCudaKernels(ModulePass):
    """Lowers the module's `logos.program` to the CUDA lane's kernel level; `weights` (bf16 or f32) is the weight
    image the kernels read. One rewrite pattern a logos op, driven by one walker over @main; the module's docstring
    says what it assumes and guarantees."""

    name = NAME

    weights: str = "bf16"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.weights not in ("bf16", "f32"):
            raise PassError(f"{NAME}: weights are bf16 or f32, not '{self.weights}'")
        program = identity.the_program(op, NAME)
        cut = check_cut(program)
        line = identity.identity(program).line()
        main = program.function("main")
        assert main is not None
        _check_main(main)
        work = cast(logos.ProgramOp, program.clone())  # rewritten apart: a refusal leaves the module as it was
        grids = [g for g in work.block.ops if isinstance(g, GridOp)]
        element = BFloat16Type() if self.weights == "bf16" else Float32Type()
        lowering = _Lowering(work.spec, element, grids[-1] if grids else None, cut.kind == "decode")
        patterns = GreedyRewritePatternApplier([pattern(lowering) for pattern in PATTERNS])
        work_main = work.function("main")
        assert work_main is not None
        PatternRewriteWalker(patterns, apply_recursively=False).rewrite_region(work_main.body)
        if lowering.refusal is None and lowering.pending_key is not None:
            lowering.refuse("a rotated key is written into a cache with no value written after it")
        if lowering.refusal is not None:
            raise lowering.refusal
        host = _host_function(work_main)
        block = op.body.block
        if grids:
            block.insert_op_before(grids[-1].clone(), program)
        block.insert_op_before(host, program)
        block.erase_op(program)
        op.attributes["cuda.identity"] = StringAttr(line)
        op.attributes["cuda.weights"] = StringAttr(self.weights)
