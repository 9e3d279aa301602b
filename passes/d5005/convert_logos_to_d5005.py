"""`convert-logos-to-d5005`: a decode step's `logos` IR to the D5005 engine's instructions.

    logos-author --model tiny --cut 'decode ctx=64' | logos-opt -f logos -p 'convert-logos-to-d5005{weights=bf16}'

Assumes: a module holding one `logos.program` whose cut is a whole decode step (`decode ctx=N`) on one chip, in the
author's form: @main reads the token and position inputs and calls @embedding, each @layer_n and @head in turn.

Guarantees: the program is replaced by one `d5005.program` carrying its identity line, whose block holds the
on-chip buffers and then the decode step's instructions in execution order (each section inlined where @main calls
it): one instruction per `logos` op, but SiLU and the product that reads it become one `silu_mul`, and weights and
caches become board-memory regions (see `placement.py`: weights striped over the four banks, the rotary table, the
KV caches). Buffers are named after the values they hold and reused across layers: a value goes into the buffer of
its name once the previous value there is dead, so a layer's buffers serve every layer. The on-chip budget
(`EngineParams.onchip_words`) holds every buffer, and no instruction writes a buffer it reads. A model whose
weights and caches overflow the 32 GiB is refused with the sizes; other cuts, split programs and ops the engine
has no instruction for are refused naming them. Nothing changes when it refuses: the new program is built and
verified beside the old one, then swapped in. No weight value is read; the cost is one walk over the program.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from logos_ir import identity
from logos_ir.dialects import d5005, logos
from logos_ir.errors import CutError, PassError
from logos_ir.passes.d5005.placement import ROPE, Placement, cache_name, fit_error
from logos_ir.program import Cut

NAME = "convert-logos-to-d5005"
SCORES = "scores"
VECTOR_ALIGN = 16  # buffers start on a 64-byte boundary of on-chip memory


@dataclass(frozen=True)
class ConvertLogosToD5005(ModulePass):
    """Lowers a decode step to the D5005 engine's instructions over placed regions and on-chip buffers, with the
    weights in `weights` precision (bf16 or f32). The module's docstring says what it assumes and guarantees."""

    name = NAME

    weights: str = "bf16"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lowered = lower_program(identity.the_program(op, NAME), self.weights)
        old = next(iter(op.ops))
        op.body.block.insert_op_before(lowered, old)
        old.detach()
        old.erase()


def lower_program(program: logos.ProgramOp, weights: str, params: d5005.EngineParams | None = None) -> d5005.ProgramOp:
    """The `d5005.program` of a decode step (PassError when it cannot be lowered)."""
    if weights not in d5005.WEIGHT_BYTES:
        raise PassError(f"{NAME}: weights are bf16 or f32, not '{weights}'")
    params = params or d5005.EngineParams(weights=weights)
    cut = _decode_cut(program)
    assert cut.ctx is not None
    placement = Placement.of(program, weights, params.burst_bytes, cut.ctx)
    refusal = fit_error(placement, NAME, weights, cut.ctx)
    if refusal is not None:
        raise refusal
    flattener = _Flattener(program, placement)
    pending = flattener.flatten()
    ops = _Allocator(pending, params.onchip_words, flattener.scores_words).ops()
    lowered = d5005.ProgramOp(identity.identity(program).line(), params, cut.ctx, ops)
    try:
        lowered.verify()
    except VerifyException as error:
        raise PassError(f"{NAME}: the lowered program does not verify: {error}") from None
    return lowered


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


# -- flattening: the decode step as one list of instructions over value numbers ----------------------------------


@dataclass(frozen=True)
class _Silu:
    """A SiLU the engine fuses into the product that reads it."""

    value: int


_Value: TypeAlias = "int | d5005.RegionAttr | _Silu | str"  # a value number, a region, a fused SiLU, a register


@dataclass
class _Pending:
    """An instruction before buffers are chosen: `make(reads, write)` builds it from the buffer names."""

    make: Callable[[list[str], str | None], d5005.InstructionOp]
    reads: tuple[int, ...]
    write: int | None


@dataclass
class _Flattener:
    program: logos.ProgramOp
    placement: Placement
    pending: list[_Pending] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # each value number's name
    widths: list[int] = field(default_factory=list)  # and its words
    cached: dict[str, int] = field(default_factory=dict)  # each cache region -> the value its cache_write stores
    scores_words: int = 1  # the attention's scratch buffer, for the largest attention of the step

    def flatten(self) -> tuple[list[_Pending], list[str], list[int]]:
        main = self.program.function("main")
        assert main is not None
        env: dict[SSAValue, _Value] = {}
        for op in main.body.block.ops:
            if isinstance(op, logos.InputOp):
                env[op.result] = op.kind.data  # the engine's token and position registers
            elif isinstance(op, func.CallOp):
                self._inline(op, env)
            elif not isinstance(op, func.ReturnOp):
                raise _refuse(op, "@main", "is not part of a decode step's @main")
        return self.pending, self.names, self.widths

    def _inline(self, call: func.CallOp, outer: dict[SSAValue, _Value]) -> None:
        callee = self.program.function(call.callee.root_reference.data)
        if callee is None:
            raise _refuse(call, "@main", "calls a section the program does not have")
        section = callee.sym_name.data
        env: dict[SSAValue, _Value] = dict(zip(callee.args, (outer[a] for a in call.arguments), strict=True))
        for op in callee.body.block.ops:
            if isinstance(op, func.ReturnOp):
                for result, value in zip(call.results, op.arguments, strict=True):
                    outer[result] = env[value]
                continue
            rule = _RULES.get(type(op))
            if rule is None:
                raise _refuse(op, section, "has no instruction on the D5005 engine")
            rule(self, op, env, section)

    def new_value(self, result: SSAValue) -> int:
        self.names.append(result.name_hint or "t")
        self.widths.append(_words(result))
        return len(self.names) - 1

    def emit(
        self,
        make: Callable[[list[str], str | None], d5005.InstructionOp],
        reads: list[int],
        result: SSAValue | None = None,
    ) -> int | None:
        """Queue an instruction reading value numbers `reads`; the number of the value it writes, if any."""
        write = None if result is None else self.new_value(result)
        self.pending.append(_Pending(make, tuple(reads), write))
        return write


def _words(value: SSAValue) -> int:
    shape = logos.tensor_shape(value)
    count = 1
    for d in shape:
        count *= d
    return count


def _refuse(op: Operation, section: str, why: str) -> PassError:
    name = getattr(op.results[0], "name_hint", None) if op.results else None
    what = f"'{op.name}' %{name}" if name else f"'{op.name}'"
    return PassError(f"{NAME}: {what} in {section} {why}")


def _number(value: _Value, op: Operation, section: str) -> int:
    if not isinstance(value, int):
        raise _refuse(op, section, "reads a value that is not an on-chip vector")
    return value


def _region(value: _Value, op: Operation, section: str) -> d5005.RegionAttr:
    if not isinstance(value, d5005.RegionAttr):
        raise _refuse(op, section, "reads a weight or cache that is not in board memory")
    return value


# -- one rule per `logos` op -------------------------------------------------------------------------------------


def _weight(f: _Flattener, op: logos.WeightOp, env: dict[SSAValue, _Value], section: str) -> None:
    env[op.result] = f.placement.region(op.tensor.data)


def _cache(f: _Flattener, op: logos.CacheOp, env: dict[SSAValue, _Value], section: str) -> None:
    env[op.result] = f.placement.region(cache_name(op.layer.value.data, op.kind.data))


def _embed(f: _Flattener, op: logos.EmbedOp, env: dict[SSAValue, _Value], section: str) -> None:
    table = _region(env[op.table], op, section)
    if env[op.tokens] != "token" or logos.tensor_shape(op.result)[0] != 1:
        raise _refuse(op, section, "does not embed the decode step's one token")
    env[op.result] = f.emit(lambda r, w: d5005.EmbedRowOp(w, table), [], op.result)


def _rms_norm(f: _Flattener, op: logos.RMSNormOp, env: dict[SSAValue, _Value], section: str) -> None:
    weight, src = _region(env[op.weight], op, section), _number(env[op.input], op, section)
    epsilon = op.epsilon.value.data
    env[op.result] = f.emit(lambda r, w: d5005.RMSNormOp(w, r[0], weight, epsilon), [src], op.result)


def _linear(f: _Flattener, op: logos.LinearOp, env: dict[SSAValue, _Value], section: str) -> None:
    weight, src = _region(env[op.weight], op, section), _number(env[op.input], op, section)
    if logos.tensor_shape(op.input)[0] != 1:
        raise _refuse(op, section, "is not a matrix-vector product (a decode step has one row)")
    env[op.result] = f.emit(lambda r, w: d5005.MatvecOp(w, r[0], weight), [src], op.result)


def _rope(f: _Flattener, op: logos.RopeOp, env: dict[SSAValue, _Value], section: str) -> None:
    src = _number(env[op.input], op, section)
    if env[op.positions] != "position":
        raise _refuse(op, section, "does not rotate to the decode step's position")
    table, width, head_dim = f.placement.region(ROPE), _words(op.result), op.head_dim.value.data
    if table.cols.data != head_dim:
        raise _refuse(op, section, f"rotates heads of {head_dim}, but the program's rotary table has {table.cols}")
    env[op.result] = f.emit(lambda r, w: d5005.RopeOp(w, r[0], table, width, head_dim), [src], op.result)


def _cache_write(f: _Flattener, op: logos.CacheWriteOp, env: dict[SSAValue, _Value], section: str) -> None:
    cache, src = _region(env[op.cache], op, section), _number(env[op.input], op, section)
    kv_heads = logos.tensor_shape(op.cache)[0]
    f.cached[cache.tensor.data] = src
    f.emit(lambda r, w: d5005.CacheWriteOp(r[0], cache, kv_heads), [src])


def _attention(f: _Flattener, op: logos.AttentionOp, env: dict[SSAValue, _Value], section: str) -> None:
    keys, values = _region(env[op.keys], op, section), _region(env[op.values], op, section)
    query = _number(env[op.query], op, section)
    kv_heads, _, head_dim = logos.tensor_shape(op.keys)
    heads = logos.tensor_shape(op.query)[1] // head_dim
    current = [f.cached.get(r.tensor.data) for r in (keys, values)]
    if current[0] is None or current[1] is None:
        why = "reads a cache the step does not write first (the engine keeps the position's key and value on chip)"
        raise _refuse(op, section, why)
    ctx = keys.rows.data // kv_heads
    scratch = d5005.attention_scratch_words(heads, kv_heads, head_dim, ctx, keys.element_bytes.data, f.placement.burst)
    f.scores_words = max(f.scores_words, scratch)
    make = lambda r, w: d5005.AttentionOp(w, r[0], keys, values, (r[1], r[2]), SCORES, heads, kv_heads)  # noqa: E731
    env[op.result] = f.emit(make, [query, current[0], current[1]], op.result)


def _silu(f: _Flattener, op: logos.SiluOp, env: dict[SSAValue, _Value], section: str) -> None:
    uses = list(op.result.uses)
    if len(uses) != 1 or not isinstance(uses[0].operation, logos.MulOp):
        raise _refuse(op, section, "is read by something other than one product: the engine fuses SiLU into it")
    env[op.result] = _Silu(_number(env[op.input], op, section))


def _mul(f: _Flattener, op: logos.MulOp, env: dict[SSAValue, _Value], section: str) -> None:
    lhs, rhs = env[op.lhs], env[op.rhs]
    if isinstance(rhs, _Silu):
        lhs, rhs = rhs, lhs
    if not isinstance(lhs, _Silu):
        raise _refuse(op, section, "is a product without a SiLU: the engine multiplies only in silu_mul")
    up, size = _number(rhs, op, section), _words(op.result)
    env[op.result] = f.emit(lambda r, w: d5005.SiluMulOp(w, r[0], r[1], size), [lhs.value, up], op.result)


def _add(f: _Flattener, op: logos.AddOp, env: dict[SSAValue, _Value], section: str) -> None:
    lhs, rhs, size = _number(env[op.lhs], op, section), _number(env[op.rhs], op, section), _words(op.result)
    env[op.result] = f.emit(lambda r, w: d5005.AddOp(w, r[0], r[1], size), [lhs, rhs], op.result)


def _argmax(f: _Flattener, op: logos.ArgmaxOp, env: dict[SSAValue, _Value], section: str) -> None:
    src, size = _number(env[op.input], op, section), _words(op.input)
    f.emit(lambda r, w: d5005.ArgmaxOp(r[0], size), [src])
    env[op.result] = "result"


_RULES: dict[type[Operation], Callable[..., None]] = {
    logos.WeightOp: _weight,
    logos.CacheOp: _cache,
    logos.EmbedOp: _embed,
    logos.RMSNormOp: _rms_norm,
    logos.LinearOp: _linear,
    logos.RopeOp: _rope,
    logos.CacheWriteOp: _cache_write,
    logos.AttentionOp: _attention,
    logos.SiluOp: _silu,
    logos.MulOp: _mul,
    logos.AddOp: _add,
    logos.ArgmaxOp: _argmax,
}


# -- buffers: each value in the buffer of its name, once that buffer's previous value is dead --------------------


class _Allocator:
    def __init__(self, flat: tuple[list[_Pending], list[str], list[int]], budget: int, scores_words: int):
        self.pending, self.names, self.widths = flat
        self.budget, self.scores_words = budget, scores_words

    def ops(self) -> list[d5005.InstructionOp | d5005.BufferOp]:
        chosen = self._choose()
        sizes: dict[str, int] = {SCORES: self.scores_words}
        for value, buffer in enumerate(chosen):
            sizes[buffer] = max(sizes.get(buffer, 0), self.widths[value])
        buffers, offset = [], 0
        for name, words in sizes.items():
            buffers.append(d5005.BufferOp(name, words, offset))
            offset += -(-words // VECTOR_ALIGN) * VECTOR_ALIGN
        if offset > self.budget:
            raise PassError(
                f"{NAME}: the decode step's on-chip buffers need {offset} words ({offset * 4} bytes), over the"
                f" engine's budget of {self.budget} words ({self.budget * 4} bytes)",
                hint="the logits of a large vocabulary are the largest buffer",
            )
        instructions = [
            p.make([chosen[v] for v in p.reads], None if p.write is None else chosen[p.write]) for p in self.pending
        ]
        return [*buffers, *instructions]

    def _choose(self) -> list[str]:
        last_read = [-1] * len(self.names)
        for index, p in enumerate(self.pending):
            for value in p.reads:
                last_read[value] = index
        chosen = [""] * len(self.names)
        holder: dict[str, int] = {}  # buffer -> the value it holds
        for index, p in enumerate(self.pending):
            if p.write is None:
                continue
            base = self.names[p.write]
            name, suffix = base, 1
            while name in holder and last_read[holder[name]] >= index:  # still to be read: take another buffer
                suffix += 1
                name = f"{base}_{suffix}"
            chosen[p.write], holder[name] = name, p.write
        return chosen
