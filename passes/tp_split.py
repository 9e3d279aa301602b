"""`tp-split`: split a decode step, a batch, or one layer of either over `tp` chips, Megatron-style.

Assumes: a module holding one unsplit `logos.program` (chips 1, no `shard.grid`, no split weight or cache, no
collective) whose cut is a decode step, a batch, or a layer of either (`Cut.SPLITTABLE`), of a model whose
query heads, key-value heads and feed-forward width (for a mixture of experts, the number of experts) are
multiples of `tp`, and whose layers are Llama-shaped: the Q/K/V and gate/up projections read the replicated
hidden state, their results go only through rotations, SiLU, elementwise products, cache writes and attention,
and the attention and SwiGLU products are consumed only by the o_proj and down_proj projections; a mixture of
experts (`logos.experts`) reads the replicated hidden state and router logits.

Guarantees: the program computes the same tokens on `tp` chips. In each layer section the Q/K/V/gate/up
weights are split by rows and the o_proj/down_proj weights by columns over `@chips` (each chip holds its
share, which the result types state), the KV caches by heads; every shape that follows from a split is
propagated to its users; each o_proj and down_proj linear result becomes a partial sum `<name>_part`, followed
by a `shard.all_reduce` that takes the old name and all of its uses. A mixture of experts is split by experts
(expert parallelism, `logos_ir.tensor_parallel`): its router stays replicated, its stacked expert weights are split
along their first axis (`split "experts"`: chip c holds experts [c * E / tp, (c + 1) * E / tp), each whole), and
its result becomes this chip's partial sum `<name>_part`, all-reduced as a down projection's is. In the head
section the table (`lm_head`, or the embedding's table when tied) is split by vocabulary rows: its linear makes
this chip's logits `<name>_part`, followed by a `shard.all_gather` over the chips' axis (gather_axis: the logits'
last) that takes the old name and all of its uses, so the arg-max reads the whole row of logits on every chip; a
vocabulary that is not a multiple of `tp` is refused. In a model whose norms are of the whole query and key
(OLMoE's `projection_norms`), each such norm reads its split projection gathered whole (`shard.all_gather`, which
takes the share's name; the share becomes `<name>_part`), norms it by the whole weight, and gives its users this
chip's heads (`shard.all_slice`, `<normed>_part`), as vLLM does. The program body starts with a chip grid,
`shard.grid @chips` of shape [tp]; the embedding and the norms stay replicated, and the program is restamped: its
LOGOS print is byte for byte the text the author writes for the same cut split over `tp` chips (`written_split`),
and its identity is `Identity.of_split(cut, tp, text)`. Everything is checked before anything is changed: a refusal (a
PassError naming the pass and the program or op) leaves the IR as it was.

`communication_report(program)` says what a split program all-reduces in one step (one run), per layer and in
all.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import IndexType, IntegerAttr, MemRefType, ModuleOp, TensorType
from xdsl.dialects.shard import AllReduceOp, GridOp
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from logos_ir import builder, identity
from logos_ir.dialects import logos
from logos_ir.dialects.shard_ext import AllGatherOp, AllSliceOp
from logos_ir.errors import CutError, LogosError, PassError
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.tensor_parallel import (
    EXPERTS_SPLIT,
    HEAD_SPLIT,
    NOT_YET_SPLIT,
    head_refusal,
    split_axis,
    split_refusal,
    weight_split,
)

PASS = "tp-split"


@dataclass(frozen=True)
class TpSplit(ModulePass):
    """Splits the module's one unsplit program over `tp` chips (see the module docstring)."""

    name = "tp-split"

    tp: int

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        program = identity.the_program(op, PASS)
        plan = _plan(program, self.tp)
        _rewrite(program, plan)
        identity.stamp(program, plan.cut, self.tp)


# -- checking: everything is decided here, before the IR is touched ------------------------------------------


@dataclass
class _Plan:
    cut: Cut
    tp: int
    shares: list[tuple[logos.WeightOp | logos.CacheOp, str, tuple[int, ...]]] = field(default_factory=list)
    retyped: list[tuple[Operation, Attribute]] = field(default_factory=list)  # math ops now making shares
    reduced: list[logos.LinearOp | logos.MixtureOp] = field(default_factory=list)  # partial sums to all-reduce
    gathered: list[logos.LinearOp] = field(default_factory=list)  # the head's logits shares to all-gather
    whole_norms: list[logos.RMSNormOp] = field(default_factory=list)  # norms of a split projection: gather, slice


def _where(program: logos.ProgramOp) -> str:
    return f"logos.program '{program.cut.data}'"


def _op_where(op: Operation, function: func.FuncOp) -> str:
    result = f" %{op.results[0].name_hint}" if op.results and op.results[0].name_hint else ""
    return f"'{op.name}'{result} in @{function.sym_name.data}"


def _plan(program: logos.ProgramOp, tp: int) -> _Plan:
    where = _where(program)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise PassError(
            f"{PASS}: {where}: a program is split over at least 1 chip, not {tp!r}",
            hint="give tp=N with N >= 1",
        )
    try:
        cut = Cut.parse(program.cut.data)
    except CutError as error:
        raise PassError(f"{PASS}: {where} names no cut: {error.message}") from None
    if cut.kind not in Cut.SPLITTABLE:
        raise PassError(
            f"{PASS}: {where}: not yet: {NOT_YET_SPLIT}",
            hint=f"tp-split splits the cuts {', '.join(Cut.SPLITTABLE)}",
        )
    _refuse_split(program, where)
    try:
        spec = program.spec
    except Exception as error:  # VerifyException: the model attribute holds no spec
        raise PassError(f"{PASS}: {where}: {error}") from None
    width = split_refusal(spec, tp)
    if width is not None:
        raise PassError(f"{PASS}: {where}: the model does not split over {tp} chips: {width}")
    refusal = head_refusal(spec.vocab, tp) if cut.kind.partition("_")[2] in ("", "head") else None
    if refusal is not None:
        raise PassError(f"{PASS}: {where}: the model does not split over {tp} chips: {refusal}")
    try:
        from logos_ir.printer import print_program

        print_program(program)  # the restamp prints the result: refuse now what cannot be printed
    except LogosError as error:
        raise PassError(f"{PASS}: {where} has no LOGOS print: {error.message}") from None
    plan = _Plan(cut, tp)
    for function in program.block.ops:
        if isinstance(function, func.FuncOp):
            _plan_function(plan, spec, function)
    return plan


def _refuse_split(program: logos.ProgramOp, where: str) -> None:
    chips = program.chips.value.data
    hint = "tp-split takes the unsplit program (as the author writes it without tp)"
    if chips != 1:
        raise PassError(f"{PASS}: {where} is already split over {chips} chips", hint=hint)
    for op in program.walk():
        if isinstance(op, GridOp):
            grid = op.sym_name.data
            raise PassError(f"{PASS}: {where} is already split: it has a 'shard.grid' @{grid}", hint=hint)
        if op.dialect_name() == "shard":
            raise PassError(f"{PASS}: {where} is already split: it has a '{op.name}'", hint=hint)
        if isinstance(op, logos.WeightOp | logos.CacheOp) and (op.split is not None or op.grid is not None):
            if isinstance(op, logos.WeightOp):
                what = f"'{op.tensor.data}'"
            else:
                what = f"the {op.kind.data} cache of layer {op.layer.value.data}"
            raise PassError(f"{PASS}: {where} is already split: '{op.name}' of {what} is split", hint=hint)


# The state of a value in the split program: absent from `shares`, it is replicated (every chip holds all of
# it); present, it is this chip's share of a split tensor (a weight's rows or columns, a projection's heads, a
# cache's heads), with that share's shape.


def _plan_function(plan: _Plan, spec: ModelSpec, function: func.FuncOp) -> None:
    tp = plan.tp
    shares: dict[SSAValue, tuple[int, ...]] = {}
    columns: set[SSAValue] = set()  # column-split weights: their linears make partial sums
    stacks: set[SSAValue] = set()  # stacked experts split by experts: their mixture makes partial sums
    head_tables: set[SSAValue] = set()  # the head's table split by vocabulary rows: its logits are gathered
    head = function.sym_name.data == "head"
    names = {v.name_hint for v in _values(function) if v.name_hint is not None}

    def refuse(op: Operation, message: str) -> PassError:
        return PassError(f"{PASS}: {_op_where(op, function)} {message}")

    def share(value: SSAValue) -> tuple[int, ...] | None:
        return shares.get(value)

    def retype(op: Operation, shape: tuple[int, ...]) -> None:
        kind = op.results[0].type
        assert isinstance(kind, TensorType)
        shares[op.results[0]] = shape
        plan.retyped.append((op, builder.f32_tensor(shape)))

    for op in function.body.block.ops:
        if isinstance(op, logos.WeightOp):
            split = weight_split(op.tensor.data)
            full = op.full_shape
            if head and len(full) == 2:  # the head's one table: lm_head, or the embedding's when tied
                split = HEAD_SPLIT
                head_tables.add(op.result)
            if split is None:
                continue
            axis = split_axis(split, len(full))
            rank = 3 if split == EXPERTS_SPLIT else 1 if op.tensor.data.endswith(".bias") else 2
            if len(full) != rank or full[axis] % tp:
                what = f"of '{op.tensor.data}' {list(full)}"
                raise refuse(op, f"{what}: its {split} do not divide over {tp} chips")
            new = tuple(builder.share(full, axis, tp))
            plan.shares.append((op, split, new))
            shares[op.result] = new
            if split == "columns":
                columns.add(op.result)
            if split == EXPERTS_SPLIT:
                stacks.add(op.result)
        elif isinstance(op, logos.CacheOp):
            full = op.full_shape
            axis = len(full) - 3
            if full[axis] % tp:
                raise refuse(op, f"has {full[axis]} heads, which do not divide over {tp} chips")
            new = tuple(builder.share(full, axis, tp))
            plan.shares.append((op, "heads", new))
            shares[op.result] = new
        elif isinstance(op, logos.LinearOp):
            weight, x = share(op.weight), share(op.input)
            rows = logos.tensor_shape(op.input)[0]
            if op.weight in columns:
                if x is None or x[-1] != weight[-1]:  # type: ignore[index]
                    raise refuse(op, "applies a weight split by columns to rows not split the same way")
                part = f"{op.result.name_hint}_part" if op.result.name_hint else None
                if part is not None and part in names:
                    raise refuse(op, f"would name its partial sum '{part}', a name the section already uses")
                plan.reduced.append(op)  # the partial sum's all-reduce is replicated again
            elif weight is not None:
                if x is not None:
                    raise refuse(op, "applies a weight split by rows to rows that are already split")
                retype(op, (rows, weight[0]))
                if op.weight in head_tables:
                    part = f"{op.result.name_hint}_part" if op.result.name_hint else None
                    if part is not None and part in names:
                        raise refuse(op, f"would name its logits' share '{part}', a name the section already uses")
                    del shares[op.result]  # the all-gather after it gives every chip the whole row
                    plan.gathered.append(op)
            elif x is not None:
                raise refuse(op, "applies a replicated weight to split rows")
        elif isinstance(op, logos.MixtureOp):  # expert parallel: every chip routes every row, to whole experts
            if share(op.input) is not None or share(op.logits) is not None:
                raise refuse(op, "routes rows or router logits that are split: each chip must route every row")
            if not {op.gate, op.up, op.down} <= stacks:
                raise refuse(op, "mixes stacked experts that are not all split by experts")
            part = f"{op.result.name_hint}_part" if op.result.name_hint else None
            if part is not None and part in names:
                raise refuse(op, f"would name its partial sum '{part}', a name the section already uses")
            plan.reduced.append(op)  # this chip's experts' outputs, all-reduced into the whole mixture
        elif isinstance(op, logos.RopeOp | logos.SiluOp | logos.GeluTanhOp | logos.SoftcapOp | logos.ScaleOp):
            x = share(op.operands[0])
            if x is not None:
                if isinstance(op, logos.RopeOp) and x[-1] % op.head_dim.value.data:
                    raise refuse(op, f"rotates a share of {x[-1]} numbers, not whole heads")
                retype(op, x)
        elif isinstance(op, logos.AddOp | logos.MulOp):
            lhs, rhs = share(op.lhs), share(op.rhs)
            if lhs != rhs:
                raise refuse(op, "combines a split value with a value that is not split the same way")
            if lhs is not None:
                retype(op, lhs)
        elif isinstance(op, logos.BiasAddOp):  # a column-parallel product's bias splits with it; else whole
            x, bias = share(op.input), share(op.bias)
            if (x is None) != (bias is None) or (x is not None and bias is not None and x[-1:] != bias):
                raise refuse(op, "adds a bias that is not split as the rows it is added to")
            if x is not None:
                retype(op, x)
        elif isinstance(op, logos.RMSNormOp) and share(op.input) is not None and spec.projection_norms:
            # OLMoE's norm of the whole query or key, on a projection split by heads: its input gathered whole on
            # every chip, normed whole by the whole weight, and each chip's heads sliced back out (vLLM's)
            if share(op.weight) is not None or logos.tensor_shape(op.weight)[-1] != logos.tensor_shape(op.input)[-1]:
                raise refuse(op, "norms a split value by a weight that is not its whole width, replicated")
            for name in (op.input.name_hint, op.result.name_hint):
                if name is not None and f"{name}_part" in names:
                    raise refuse(op, f"would name a share '{name}_part', a name the section already uses")
            shares[op.result] = share(op.input)  # its users read this chip's share of it
            plan.whole_norms.append(op)
        elif isinstance(op, logos.HeadRMSNormOp):  # whole heads on each chip: each normed alone, by the whole weight
            x = share(op.input)
            if share(op.weight) is not None:
                raise refuse(op, "norms heads by a weight that is split")
            if x is not None:
                if x[-1] % logos.tensor_shape(op.weight)[0]:
                    raise refuse(op, f"norms a share of {x[-1]} numbers, not whole heads")
                retype(op, x)
        elif isinstance(op, logos.CacheWriteOp):
            x, cache = share(op.input), share(op.cache)
            if x is None or cache is None or x[-1] != cache[-3] * cache[-1]:
                raise refuse(op, "writes rows that are not split by heads as its cache is")
        elif isinstance(op, logos.AttentionOp):
            query, keys, values = share(op.query), share(op.keys), share(op.values)
            if query is None or keys is None or values is None:
                raise refuse(op, "attends with a query or caches that are not split by heads")
            if (query[-1] // spec.head_dim) % keys[-3]:
                raise refuse(op, "would group a chip's query heads unevenly over its key-value heads")
            retype(op, query)
        else:
            for operand in op.operands:
                if operand in shares:
                    raise refuse(op, f"reads the split value %{operand.name_hint}, which tp-split cannot combine there")


def _values(function: func.FuncOp) -> Iterator[SSAValue]:
    yield from function.body.block.args
    for op in function.body.block.ops:
        yield from op.results


# -- rewriting: nothing here can fail ------------------------------------------------------------------------


def _rewrite(program: logos.ProgramOp, plan: _Plan) -> None:
    for op, split, shape in plan.shares:
        op.properties.update(builder.split_props(split))
        new = builder.f32_memref(shape) if isinstance(op, logos.CacheOp) else builder.f32_tensor(shape)
        Rewriter.replace_value_with_new_type(op.results[0], new)
    for op, kind in plan.retyped:
        Rewriter.replace_value_with_new_type(op.results[0], kind)
    for summand in plan.reduced:
        partial = summand.results[0]
        name = partial.name_hint
        reduce = AllReduceOp.create(
            operands=[partial], properties={"grid": builder.grid_ref()}, result_types=[partial.type]
        )
        Rewriter.insert_op(reduce, InsertPoint.after(summand))
        summed = reduce.results[0]
        partial.replace_uses_with_if(summed, lambda use, reduce=reduce: use.operation is not reduce)
        partial.name_hint = None if name is None else f"{name}_part"
        summed.name_hint = name
    for linear in plan.gathered:
        part = linear.results[0]
        name = part.name_hint
        gather = AllGatherOp.create(
            operands=[part],
            properties={
                "grid": builder.grid_ref(),
                "grid_axes": builder.grid_axes(),
                "gather_axis": IntegerAttr(len(logos.tensor_shape(part)) - 1, IndexType()),
            },
            result_types=[builder.f32_tensor(_whole(part, plan.tp))],
        )
        Rewriter.insert_op(gather, InsertPoint.after(linear))
        whole = gather.results[0]
        part.replace_uses_with_if(whole, lambda use, gather=gather: use.operation is not gather)
        part.name_hint = None if name is None else f"{name}_part"
        whole.name_hint = name
    for norm in plan.whole_norms:
        _gather_whole(norm, plan.tp)
    block = program.block
    grid = builder.grid_op(plan.tp)
    if block.first_op is None:
        block.add_op(grid)
    else:
        block.insert_op_before(grid, block.first_op)


def _gather_whole(norm: logos.RMSNormOp, tp: int) -> None:
    """`norm` of a split projection: the share all-gathered before it (the gather takes the share's name, the
    share becomes `<name>_part`), the norm whole, and this chip's share all-sliced after it for its users
    (`<normed>_part`), as the author writes it split."""
    part = norm.input
    name = part.name_hint
    props = {"grid": builder.grid_ref(), "grid_axes": builder.grid_axes()}
    gather = AllGatherOp.create(
        operands=[part],
        properties={**props, "gather_axis": IntegerAttr(len(logos.tensor_shape(part)) - 1, IndexType())},
        result_types=[builder.f32_tensor(_whole(part, tp))],
    )
    Rewriter.insert_op(gather, InsertPoint.before(norm))
    norm.operands[0] = gather.results[0]
    part.name_hint = None if name is None else f"{name}_part"
    gather.results[0].name_hint = name
    normed = norm.results[0]
    own = AllSliceOp.create(
        operands=[normed],
        properties={**props, "slice_axis": IntegerAttr(len(logos.tensor_shape(normed)) - 1, IndexType())},
        result_types=[builder.f32_tensor(logos.tensor_shape(part))],
    )
    Rewriter.insert_op(own, InsertPoint.after(norm))
    normed.replace_uses_with_if(own.results[0], lambda use: use.operation is not own)
    own.results[0].name_hint = None if normed.name_hint is None else f"{normed.name_hint}_part"


def _whole(part: SSAValue, tp: int) -> tuple[int, ...]:
    shape = logos.tensor_shape(part)
    return (*shape[:-1], shape[-1] * tp)


# -- what a split program communicates -----------------------------------------------------------------------


def communication_report(program: logos.ProgramOp) -> dict[str, object]:
    """What `program` all-reduces in one run (one decode step, one batch step, or that step's one layer).

    Each `shard.all_reduce` sums a tensor over the chips; its payload is the tensor's size (rows x hidden x 4
    bytes of float32 for each of a Megatron layer's two). `bytes_per_step` is the payload summed over the run,
    `bytes_per_layer` the same per section; `megatron_bytes` is 2 x rows x hidden x 4 x layers, the figure to
    compare it with, and `ring_bytes_per_chip` what each chip sends in a ring all-reduce, 2(n-1)/n times the
    payload (0 on one chip). `all_gathers` and `gathered_bytes_per_step` count the all-gathers apart: the split
    head's of the logits, and a split OLMoE's of each layer's query and key for their norms (the whole tensor each
    chip ends with; a ring all-gather sends (n-1)/n of it from each chip; the all-slices after them move nothing).
    `expert_all_reduces` counts the all-reduces (among `all_reduces`) that add a mixture of experts' partial sums,
    one a layer split by experts, where a dense layer has its down projection's."""
    spec = program.spec
    chips = program.chips.value.data
    per_section: dict[str, int] = {}
    count = experts = 0
    gathers = gathered = 0  # the split head's logits, OLMoE's query and key: each chip receives the whole tensor
    layers = 0
    for function in program.block.ops:
        if not isinstance(function, func.FuncOp):
            continue
        sym = function.sym_name.data
        if sym.startswith("layer_"):
            layers += 1
        for op in function.body.block.ops:
            if isinstance(op, AllReduceOp):
                count += 1
                experts += isinstance(op.input.owner, logos.MixtureOp)
                per_section[sym] = per_section.get(sym, 0) + _nbytes(op.result.type)
            elif isinstance(op, AllGatherOp):
                gathers += 1
                gathered += _nbytes(op.result.type)
    total = sum(per_section.values())
    rows = Cut.parse(program.cut.data).rows or 1
    return {
        "program": identity.identity(program).line(),
        "chips": chips,
        "rows": rows,
        "hidden": spec.hidden,
        "layers": layers,
        "all_reduces": count,
        "expert_all_reduces": experts,
        "bytes_per_step": total,
        "bytes_per_layer": per_section,
        "megatron_bytes": 2 * rows * spec.hidden * 4 * layers,
        "ring_bytes_per_chip": total * 2 * (chips - 1) // chips,
        "all_gathers": gathers,
        "gathered_bytes_per_step": gathered,
    }


def _nbytes(kind: Attribute) -> int:
    assert isinstance(kind, TensorType | MemRefType)
    width = getattr(kind.element_type, "bitwidth", 32)
    return math.prod(kind.get_shape()) * width // 8
