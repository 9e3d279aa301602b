"""`convert-logos-to-d5005`: a decode step's `logos` IR to the D5005 engine's instructions.

    logos-author --model tiny --cut 'decode ctx=64' | logos-opt -f logos -p 'logos-to-d5005{weights=bf16}'

Assumes: a module holding one `logos.program` whose cut is a whole decode step (`decode ctx=N`) on one chip, its
sections inlined into @main (`inline-sections`, which the `logos-to-d5005` pipeline runs first): @main reads the
token and position inputs, then runs the step's ops in order.

Guarantees: the program is replaced by one `d5005.program` carrying its identity line, whose block holds the on-chip
buffers and then the decode step's instructions in execution order. One rewrite pattern per `logos` op: each writes
its result into a new `d5005.buffer` and replaces the op's value by it, so the next op's pattern reads that buffer
(SiLU and the product that reads it select one instruction, `silu_mul`: the engine has no SiLU instruction of its
own, so this is instruction selection, not a fusion of two engine instructions; weights and caches become the
board-memory regions of `placement.py`: weights striped over the four banks, the rotary table, the KV caches). Then
the buffers are shared: a value goes into the buffer of its name once the previous value there is dead, so a layer's
buffers serve every layer. Each buffer lies in the on-chip array of its kind (`d5005.OPERANDS`: the array every
routine that writes or reads it reaches), each array a fixed share of the on-chip budget
(`EngineParams.onchip_words`) that holds its buffers, and no instruction writes a buffer it reads. A model whose
weights and caches overflow the 32 GiB is refused with the sizes; other cuts, split programs and ops the engine has
no instruction for are refused naming them. Nothing changes when it refuses: a copy of the program is lowered and
verified, then swapped in. No weight value is read; the cost is one walk over the program.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.utils.exceptions import VerifyException

from logos_ir import identity
from logos_ir.dialects import d5005, logos
from logos_ir.errors import CutError, PassError
from logos_ir.passes.d5005.placement import ROUTES, Placement, cache_name, fit_error, rope_table
from logos_ir.program import Cut

NAME = "convert-logos-to-d5005"
VECTOR_ALIGN = 16  # buffers start on a 64-byte boundary of on-chip memory


@dataclass(frozen=True)
class ConvertLogosToD5005(ModulePass):
    """Lowers a decode step to the D5005 engine's instructions over placed regions and on-chip buffers, with the
    weights in `weights` precision (bf16 or f32). The module's docstring says what it assumes and guarantees."""

    name = NAME

    weights: str = "bf16"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        old = identity.the_program(op, NAME)
        lowered = convert_program(old, self.weights)
        op.body.block.insert_op_before(lowered, old)
        old.detach()
        old.erase()


def convert_program(program: Operation, weights: str, params: d5005.EngineParams | None = None) -> d5005.ProgramOp:
    """The `d5005.program` of a decode step whose sections are inlined into @main (PassError when it cannot be
    lowered); `program` itself is left as it is."""
    assert isinstance(program, logos.ProgramOp)
    if weights not in d5005.WEIGHT_BYTES:
        raise PassError(f"{NAME}: weights are bf16 or f32, not '{weights}'")
    params = params or d5005.EngineParams(weights=weights)
    cut = _decode_cut(program)
    assert cut.ctx is not None
    _check_main(program)
    placement = Placement.of(program, weights, params.burst_bytes, cut.ctx)
    refusal = fit_error(placement, NAME, weights, cut.ctx)
    if refusal is not None:
        raise refusal
    work = ModuleOp([program.clone()])
    patterns = [
        EmbedToRow(placement),
        ScaleIntoEmbedRow(placement),
        RMSNormToInstruction(placement),
        LinearToMatvec(placement),
        BiasAddToMatvec(placement),
        HeadNormIntoRope(),
        RopeToInstruction(placement),
        CacheWriteToInstruction(placement),
        AttentionToInstruction(placement),
        SiluIntoProduct(),
        MulToSiluMul(),
        MixtureToExperts(placement),
        AddToInstruction(),
        SoftcapIntoArgmax(),
        ArgmaxToInstruction(),
        ProgramToEngine(identity.identity(program).line(), params, cut.ctx),
    ]
    walker = PatternRewriteWalker(
        GreedyRewritePatternApplier(patterns), walk_regions_first=True, apply_recursively=False
    )
    walker.rewrite_module(work)
    lowered = next(iter(work.ops))
    assert isinstance(lowered, d5005.ProgramOp)
    try:
        lowered.verify()
    except VerifyException as error:
        raise PassError(f"{NAME}: the lowered program does not verify: {error}") from None
    lowered.detach()
    return lowered


def _check_main(program: logos.ProgramOp) -> None:
    """Refuse, before anything is rewritten, a @main the engine does not run: calls, an op with no instruction."""
    main = program.function("main")
    assert main is not None  # the program op's verifier requires it
    call = next((op for op in main.body.block.ops if isinstance(op, func.CallOp)), None)
    if call is not None:
        raise PassError(
            f"{NAME}: @main calls @{call.callee.root_reference.data}: the pass lowers one straight-line @main",
            hint="run inline-sections first (the logos-to-d5005 pipeline does)",
        )
    unlowered = next((op for op in main.body.block.ops if not isinstance(op, (*_LOWERED, *_READS))), None)
    if unlowered is not None:  # refused by name before any rewrite (its users would fail first, less clearly)
        raise _refuse(unlowered, "has no instruction on the D5005 engine")
    for op in main.body.block.ops:  # an op the engine lowers in its plain form only: a variant is refused
        said = _variant(op)
        if said is not None:
            raise _refuse(op, f"{said}, which the engine does not compute")


def _variant(op: Operation) -> str | None:
    """What `op` says beyond what the engine computes (`logos.variant`'s words), less an attention's window (the
    engine bounds its attention's pass to the window) and scale (its word's float), and a rotation's own base where
    the model has a table of it (the windowed layers' base: `placement.rope_table`)."""
    spec = logos.program_spec(op)
    if isinstance(op, logos.RopeOp) and spec is not None and rope_table(op, spec) is not None:
        return None  # a table of its base and scaling, over the numbers it rotates
    return logos.variant(op, computed=("window", "scale", "softcap", "plus_one"))


# the ops a pattern below lowers to instructions (a SiLU goes into its product's silu_mul)
_LOWERED = (
    logos.EmbedOp,
    logos.ScaleOp,
    logos.RMSNormOp,
    logos.LinearOp,
    logos.BiasAddOp,
    logos.HeadRMSNormOp,
    logos.RopeOp,
    logos.CacheWriteOp,
    logos.AttentionOp,
    logos.SiluOp,
    logos.GeluTanhOp,
    logos.MulOp,
    logos.AddOp,
    logos.SoftcapOp,
    logos.ArgmaxOp,
    logos.MixtureOp,
)


def _decode_cut(program: logos.ProgramOp) -> Cut:
    try:
        cut = Cut.parse(program.cut.data)
    except CutError as error:
        raise PassError(f"{NAME}: the program's cut cannot be read: {error.message}") from None
    if cut.kind != "decode":
        raise PassError(
            f"{NAME}: the D5005 engine runs whole decode steps, not '{cut}' (logos.program '{cut.option()}')",
            hint="give it 'decode ctx=N'; the prompt runs through decode steps",
        )
    if program.chips.value.data != 1:
        raise PassError(f"{NAME}: the D5005 is one card: a program split over {program.chips.value.data} chips")
    return cut


# -- what the patterns share -------------------------------------------------------------------------------------


def _refuse(op: Operation, why: str) -> PassError:
    name = op.results[0].name_hint if op.results else None
    what = f"'{op.name}' %{name}" if name else f"'{op.name}'"
    return PassError(f"{NAME}: {what} {why}")


def _words(value: SSAValue) -> int:
    count = 1
    for d in logos.tensor_shape(value):
        count *= d
    return count


def _buffer(value: SSAValue, op: Operation) -> SSAValue:
    """The on-chip buffer an earlier pattern wrote `value` into."""
    if not isinstance(value.owner, d5005.BufferOp):
        raise _refuse(op, "reads a value that is not an on-chip vector")
    return value


def _array_of(value: SSAValue) -> str | None:
    """Where a buffer's writer puts it, before the buffers are shared: `inputs` for an RMS norm's output."""
    writer = next((use.operation for use in value.uses if isinstance(use.operation, d5005.RMSNormOp)), None)
    return "inputs" if writer is not None and writer.dst == value else None


def _input(value: SSAValue, kind: str) -> bool:
    return isinstance(value.owner, logos.InputOp) and value.owner.kind.data == kind


def _lower(op: Operation, rewriter: PatternRewriter, make: type[d5005.InstructionOp], *args: object) -> None:
    """Replace `op` by a new buffer for its result and the instruction `make(buffer, *args)` that writes it."""
    result = op.results[0]
    buffer = d5005.BufferOp(result.name_hint or "t", _words(result), 0)
    rewriter.replace(op, [buffer, make(buffer.buffer, *args)], [buffer.buffer])


@dataclass
class _Placed(RewritePattern):
    """A pattern that reads weights and caches as their regions in the placement."""

    placement: Placement

    def region(self, value: SSAValue, op: Operation) -> d5005.RegionAttr:
        owner = value.owner
        if isinstance(owner, logos.WeightOp):
            return self.placement.region(owner.tensor.data)
        if isinstance(owner, logos.CacheOp):
            return self.placement.region(cache_name(owner.layer.value.data, owner.kind.data))
        raise _refuse(op, "reads a weight or cache that is not in board memory")


# -- one pattern per `logos` op ----------------------------------------------------------------------------------


class EmbedToRow(_Placed):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.EmbedOp, rewriter: PatternRewriter) -> None:
        table = self.region(op.table, op)
        if not _input(op.tokens, "token") or logos.tensor_shape(op.result)[0] != 1:
            raise _refuse(op, "does not embed the decode step's one token")
        if _scale_of(op) is not None:
            return
        _lower(op, rewriter, d5005.EmbedRowOp, table)


def _scale_of(op: logos.EmbedOp) -> logos.ScaleOp | None:
    """The scale that is the embedding's one reader (Gemma's square root of the width), if there is one."""
    uses = list(op.result.uses)
    return uses[0].operation if len(uses) == 1 and isinstance(uses[0].operation, logos.ScaleOp) else None


class ScaleIntoEmbedRow(_Placed):
    """The embedding's row scaled by a constant selects the embed_row that scales it as it stores it, erasing the
    embedding it reads: the engine scales nowhere else."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ScaleOp, rewriter: PatternRewriter) -> None:
        embed = op.input.owner
        if not isinstance(embed, logos.EmbedOp) or _scale_of(embed) is not op:
            raise _refuse(op, "scales something other than an embedding's row: the engine scales only in embed_row")
        if not _input(embed.tokens, "token") or logos.tensor_shape(embed.result)[0] != 1:
            raise _refuse(embed, "does not embed the decode step's one token")
        _lower(op, rewriter, d5005.EmbedRowOp, self.region(embed.table, op), op.factor.value.data)
        rewriter.erase(embed)


class RMSNormToInstruction(_Placed):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.RMSNormOp, rewriter: PatternRewriter) -> None:
        weight = self.region(op.weight, op)
        plus_one = op.plus_one is not None
        _lower(op, rewriter, d5005.RMSNormOp, _buffer(op.input, op), weight, op.epsilon.value.data, plus_one)


def _bias_of(op: logos.LinearOp) -> logos.BiasAddOp | None:
    """The bias_add that is the projection's one reader, adding its bias to the product, if there is one."""
    uses = list(op.result.uses)
    if len(uses) != 1 or not isinstance(uses[0].operation, logos.BiasAddOp) or uses[0].index != 0:
        return None
    return uses[0].operation


def _lower_matvec(
    op: Operation,
    rewriter: PatternRewriter,
    src: SSAValue,
    weight: d5005.RegionAttr,
    bias: d5005.RegionAttr | None = None,
) -> None:
    """Replace `op` by the matvec of `weight` over `src` (+ `bias`): one, or where its input is longer than the
    engine's copy of it (`d5005.VECTOR_WORDS`), one a part of the columns, each as long as the copy but the last,
    the parts after the first adding to what the first wrote (the first adds the bias)."""
    cols = weight.cols.data
    if cols <= d5005.VECTOR_WORDS:
        _lower(op, rewriter, d5005.MatvecOp, src, weight, bias)
        return
    result = op.results[0]
    buffer = d5005.BufferOp(result.name_hint or "t", _words(result), 0)
    parts = [(first, min(d5005.VECTOR_WORDS, cols - first)) for first in range(0, cols, d5005.VECTOR_WORDS)]
    matvecs = [
        d5005.MatvecOp(buffer.buffer, src, weight, bias if first == 0 else None, (first, count))
        for first, count in parts
    ]
    rewriter.replace(op, [buffer, *matvecs], [buffer.buffer])


class LinearToMatvec(_Placed):
    """A projection is a matvec; one whose product only a bias_add reads is left for that bias_add's pattern,
    which lowers both to one matvec adding the bias in its epilogue."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.LinearOp, rewriter: PatternRewriter) -> None:
        weight = self.region(op.weight, op)
        if logos.tensor_shape(op.result)[0] != 1:
            raise _refuse(op, "is not a matrix-vector product (a decode step has one row)")
        if _bias_of(op) is not None:
            return
        _lower_matvec(op, rewriter, _buffer(op.input, op), weight)


class BiasAddToMatvec(_Placed):
    """A bias added to a projection's product selects the matvec with a bias (added in its epilogue, streamed
    from bank 0 before the rows), erasing the projection it reads: the engine adds biases nowhere else."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.BiasAddOp, rewriter: PatternRewriter) -> None:
        linear = op.input.owner
        if not isinstance(linear, logos.LinearOp) or _bias_of(linear) is not op:
            why = "adds a bias to something other than one projection: the engine adds a bias only in a matvec"
            raise _refuse(op, why)
        weight, bias = self.region(linear.weight, op), self.region(op.bias, op)
        _lower_matvec(op, rewriter, _buffer(linear.input, op), weight, bias)
        rewriter.erase(linear)


class HeadNormIntoRope(RewritePattern):
    """A per-head RMS norm stays until the rotation that reads it selects the rope that norms its heads first: the
    engine norms heads only there (Qwen3's query and key norms come before their rotation)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.HeadRMSNormOp, rewriter: PatternRewriter) -> None:
        uses = list(op.result.uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, logos.RopeOp) or uses[0].index != 0:
            raise _refuse(op, "is read by something other than one rotation: the engine norms heads only in rope")
        _buffer(op.input, op)


class RopeToInstruction(_Placed):
    """A rotation is a rope; one of a per-head RMS norm's output norms the heads first, erasing the norm."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.RopeOp, rewriter: PatternRewriter) -> None:
        normed = op.input.owner if isinstance(op.input.owner, logos.HeadRMSNormOp) else None
        src = _buffer(normed.input if normed is not None else op.input, op)
        if not _input(op.positions, "position"):
            raise _refuse(op, "does not rotate to the decode step's position")
        spec = logos.program_spec(op)
        name = rope_table(op, spec) if spec is not None else None
        if name is None:
            raise _refuse(op, "rotates by a base and scaling the program has no rotary table of")
        table, head_dim = self.placement.region(name), op.head_dim.value.data
        rotary = op.rotary_dim.value.data if op.rotary_dim is not None else None
        if table.cols.data != d5005.rope_row_floats(rotary or head_dim, self.placement.burst):
            why = f"rotates {rotary or head_dim} of each head, but the program's rotary table has {table.cols}"
            raise _refuse(op, why)
        if _array_of(src) == "inputs" and (normed is not None or rotary is not None):
            raise _refuse(op, "rotates a normed projection in part or norms its heads: the engine does neither then")
        norm = None
        if normed is not None:
            if rotary is not None:
                raise _refuse(op, "rotates only a part of each head it norms: the engine does one or the other")
            norm = (self.region(normed.weight, op), normed.epsilon.value.data)
        plus_one = normed is not None and normed.plus_one is not None
        _lower(op, rewriter, d5005.RopeOp, src, table, _words(op.result), head_dim, norm, rotary, plus_one)
        if normed is not None:
            rewriter.erase(normed)


class CacheWriteToInstruction(_Placed):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.CacheWriteOp, rewriter: PatternRewriter) -> None:
        cache, src = self.region(op.cache, op), _buffer(op.input, op)
        rewriter.replace(op, d5005.CacheWriteOp(src, cache, logos.tensor_shape(op.cache)[0]))


def _stored(op: Operation, cache: d5005.RegionAttr) -> SSAValue | None:
    """The buffer the step's `d5005.cache_write` into `cache` before `op` stores."""
    at = op.prev_op
    while at is not None:
        if isinstance(at, d5005.CacheWriteOp) and at.cache == cache:
            return at.src
        at = at.prev_op
    return None


class AttentionToInstruction(_Placed):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.AttentionOp, rewriter: PatternRewriter) -> None:
        keys, values = self.region(op.keys, op), self.region(op.values, op)
        query = _buffer(op.query, op)
        kv_heads, _, head_dim = logos.tensor_shape(op.keys)
        heads = logos.tensor_shape(op.result)[1] // head_dim
        key, value = _stored(op, keys), _stored(op, values)
        if key is None or value is None:
            why = "reads a cache the step does not write first (the engine keeps the position's key and value on chip)"
            raise _refuse(op, why)
        current = (key, value)
        window = op.window.value.data if op.window is not None else None
        scale = op.scale.value.data if op.scale is not None else None
        cap = op.softcap.value.data if op.softcap is not None else None
        _lower(op, rewriter, d5005.AttentionOp, query, keys, values, current, heads, kv_heads, window, scale, cap)


class SiluIntoProduct(RewritePattern):
    """A SiLU (or GELU's tanh approximation, GeGLU's gate) stays until the product that reads it selects
    `silu_mul`: the engine has no activation instruction of its own."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.SiluOp | logos.GeluTanhOp, rewriter: PatternRewriter) -> None:
        uses = list(op.result.uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, logos.MulOp):
            what = "SiLU" if isinstance(op, logos.SiluOp) else "GELU"
            raise _refuse(op, f"is read by something other than one product: the engine has {what} only in silu_mul")
        _buffer(op.input, op)


_GATES = (logos.SiluOp, logos.GeluTanhOp)


class MulToSiluMul(RewritePattern):
    """SiLU(gate) (or GELU's, tanh-approximated) times up selects the one instruction `silu_mul` (SwiGLU, GeGLU
    with its `gelu_tanh`), erasing the activation it reads."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.MulOp, rewriter: PatternRewriter) -> None:
        silu, up = op.lhs.owner, op.rhs
        if not isinstance(silu, _GATES):
            silu, up = op.rhs.owner, op.lhs
        if not isinstance(silu, _GATES):
            raise _refuse(op, "is a product without a SiLU: the engine multiplies only in silu_mul")
        gate = silu.input
        gelu = isinstance(silu, logos.GeluTanhOp)
        _lower(op, rewriter, d5005.SiluMulOp, gate, _buffer(up, op), _words(op.result), gelu)
        rewriter.erase(silu)


class MixtureToExperts(_Placed):
    """A mixture of experts becomes its route (over the router matvec's logits, the buffer the router's projection
    wrote) and, for each of the route's `top_k` slots in turn (the chosen experts in ascending index), the chosen
    expert's gate and up matvecs, their silu_mul, its down matvec and the expert_sum that adds its weighted output
    into the result: each expert matvec streams only the rows of the expert the route chose for its slot, the bank
    readers computing where from the stacked weight's region and the ids the route wrote."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.MixtureOp, rewriter: PatternRewriter) -> None:
        x, logits = _buffer(op.input, op), _buffer(op.logits, op)
        experts, top_k = op.experts_routed(), op.top_k.value.data
        gate, up, down = (self.region(w, op) for w in (op.gate, op.up, op.down))
        _check_experts(op, experts, top_k, [gate, up, down])
        routes = self.placement.region(ROUTES)
        inter, hidden = gate.rows.data // experts, down.rows.data // experts
        route = d5005.RouteOp(logits, routes, experts, top_k, op.renormalize is not None)
        result = op.result
        routed = d5005.BufferOp(result.name_hint or "routed", _words(result), 0)
        made: list[Operation] = [route, routed]
        for slot in range(top_k):
            expert = (slot, experts, routes)
            buffers = [d5005.BufferOp(f"expert_{n}", w, 0) for n, w in (("gate", inter), ("up", inter))]
            product = d5005.BufferOp("expert_product", inter, 0)
            output = d5005.BufferOp("expert_down", hidden, 0)
            made += [
                *buffers,
                d5005.MatvecOp(buffers[0].buffer, x, gate, expert=expert),
                d5005.MatvecOp(buffers[1].buffer, x, up, expert=expert),
                product,
                d5005.SiluMulOp(product.buffer, buffers[0].buffer, buffers[1].buffer, inter),
                output,
                d5005.MatvecOp(output.buffer, product.buffer, down, expert=expert),
                d5005.ExpertSumOp(routed.buffer, output.buffer, slot, hidden),
            ]
        rewriter.replace(op, made, [routed.buffer])


def _check_experts(op: logos.MixtureOp, experts: int, top_k: int, stacks: list[d5005.RegionAttr]) -> None:
    """Refuse, by name, a mixture the engine's route and expert matvecs do not take."""
    if experts > d5005.EXPERTS_MAX or top_k > d5005.TOP_K_MAX:
        why = f"routes to {top_k} of {experts} experts, over the engine's {d5005.TOP_K_MAX} of {d5005.EXPERTS_MAX}"
        raise _refuse(op, why)
    if logos.tensor_shape(op.result)[0] != 1:
        raise _refuse(op, "routes more than the decode step's one row")
    for stack in stacks:
        rows = stack.rows.data // experts
        if rows % d5005.BANKS or stack.cols.data > d5005.VECTOR_WORDS:
            raise _refuse(
                op,
                f"stacks experts of {rows} rows of {stack.cols.data} in '{stack.tensor.data}': the engine streams an"
                f" expert's rows from bank 0 (a whole number of rows of {d5005.BANKS}) over at most"
                f" {d5005.VECTOR_WORDS} columns",
            )


class AddToInstruction(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.AddOp, rewriter: PatternRewriter) -> None:
        lhs, rhs = _buffer(op.lhs, op), _buffer(op.rhs, op)
        _lower(op, rewriter, d5005.AddOp, lhs, rhs, _words(op.result))


class SoftcapIntoArgmax(RewritePattern):
    """A soft-cap (Gemma 2's logits) stays until the arg-max that reads it selects the arg-max that caps each word
    first: the engine soft-caps nowhere else."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.SoftcapOp, rewriter: PatternRewriter) -> None:
        uses = list(op.result.uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, logos.ArgmaxOp):
            raise _refuse(op, "is read by something other than the arg-max: the engine soft-caps only in argmax")
        _buffer(op.input, op)


class ArgmaxToInstruction(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ArgmaxOp, rewriter: PatternRewriter) -> None:
        capped = op.input.owner if isinstance(op.input.owner, logos.SoftcapOp) else None
        src = _buffer(capped.input if capped is not None else op.input, op)
        cap = capped.cap.value.data if capped is not None else None
        # the token is the engine's result register: @main's return of it goes with the program
        rewriter.replace(op, d5005.ArgmaxOp(src, _words_of(src), cap), [None], safe_erase=False)
        if capped is not None:
            rewriter.erase(capped)


# -- the program: its instructions, over shared buffers ----------------------------------------------------------

# what the instructions read (or return), dropped with the program
_READS = (logos.InputOp, logos.WeightOp, logos.CacheOp, func.ReturnOp, d5005.BufferOp, d5005.InstructionOp)


@dataclass
class ProgramToEngine(RewritePattern):
    """The `logos.program`, once every op of @main is an instruction, becomes the `d5005.program` of them, over
    buffers shared by name (`share_buffers`)."""

    identity: str
    params: d5005.EngineParams
    ctx: int

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ProgramOp, rewriter: PatternRewriter) -> None:
        main = op.function("main")
        assert main is not None  # the program op's verifier requires it
        for inner in main.body.block.ops:
            if not isinstance(inner, _READS):
                raise _refuse(inner, "has no instruction on the D5005 engine")
        instructions = [inner for inner in main.body.block.ops if isinstance(inner, d5005.InstructionOp)]
        buffers = share_buffers(instructions, self.params)
        for inner in instructions:
            inner.detach()
        rewriter.replace(op, d5005.ProgramOp(self.identity, self.params, self.ctx, [*buffers, *instructions]), [])


def share_buffers(instructions: list[d5005.InstructionOp], params: d5005.EngineParams) -> list[d5005.BufferOp]:
    """The buffers of the instructions, each value in the buffer of its name once that buffer's previous value is
    dead, each buffer in the one on-chip array that every routine writing or reading it reaches
    (`d5005.OPERANDS`), from a bank word's first bank: the instructions' operands are redirected to them."""
    written = [w for op in instructions if (w := op.written()) is not None]
    chosen = _choose(instructions)
    sizes: dict[str, int] = {}
    for value in written:
        sizes[chosen[value]] = max(sizes.get(chosen[value], 0), _words_of(value))
    arrays = _arrays(instructions, chosen)
    align = max(VECTOR_ALIGN, params.burst_bytes // 4)
    buffers: dict[str, d5005.BufferOp] = {}
    cursor = dict.fromkeys(d5005.ARRAYS, 0)
    for name, words in sizes.items():
        array = arrays[name]
        buffers[name] = d5005.BufferOp(name, words, cursor[array], array)
        cursor[array] += -(-words // align) * align
    for array, used in cursor.items():
        size = d5005.array_words(params.onchip_words, array)
        if used > size:
            raise PassError(
                f"{NAME}: the decode step's buffers in the on-chip array '{array}' need {used} words"
                f" ({used * 4} bytes), over its {size} words of the engine's budget of {params.onchip_words}",
                hint="the logits of a large vocabulary are the largest buffer (in 'outputs')",
            )
    for value, name in chosen.items():
        old = value.owner
        value.replace_all_uses_with(buffers[name].buffer)
        if isinstance(old, d5005.BufferOp) and old.parent is not None:
            old.detach()
            old.erase()
    return list(buffers.values())


def _arrays(instructions: list[d5005.InstructionOp], chosen: dict[SSAValue, str]) -> dict[str, str]:
    """Each buffer's array: the one its writers' and readers' routines all reach (refused where there is none)."""
    reach: dict[str, set[str]] = {}
    first_use: dict[str, str] = {}
    for op in instructions:
        for operand, (_, arrays) in d5005.OPERANDS[op.name].items():
            value = getattr(op, operand)
            name = chosen.get(value)
            if name is None:
                continue
            seen = reach.setdefault(name, set(arrays))
            first_use.setdefault(name, f"'{op.name}' {operand}")
            if not seen & set(arrays):
                raise PassError(
                    f"{NAME}: buffer '{name}' is {first_use[name]}, in array {' or '.join(sorted(seen))}, and"
                    f" '{op.name}' reaches its {operand} only in {' or '.join(arrays)}: no on-chip array serves both"
                )
            seen &= set(arrays)
    return {name: next(a for a in d5005.ARRAYS if a in arrays) for name, arrays in reach.items()}


def _words_of(buffer: SSAValue) -> int:
    owner = buffer.owner
    assert isinstance(owner, d5005.BufferOp)
    return owner.words.value.data


def _choose(instructions: list[d5005.InstructionOp]) -> dict[SSAValue, str]:
    """Each written value's buffer name: its own, or its own with a suffix while that buffer's value is live."""
    last_read: dict[SSAValue, int] = {}
    for index, op in enumerate(instructions):
        for value in op.read():
            last_read[value] = index
    chosen: dict[SSAValue, str] = {}
    holder: dict[str, SSAValue] = {}  # buffer -> the value it holds
    for index, op in enumerate(instructions):
        value = op.written()
        if value is None or value in chosen:  # a matvec's later part adds to the buffer its first part wrote
            continue
        base = d5005.label(value)
        name, suffix = base, 1
        while name in holder and last_read.get(holder[name], -1) >= index:  # still to be read: take another buffer
            suffix += 1
            name = f"{base}_{suffix}"
        chosen[value], holder[name] = name, value
    return chosen
