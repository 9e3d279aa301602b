"""The reference interpreter's plan: a `logos.program` compiled into the steps each chip runs.

Every `func.call` from `@main` is inlined, so the program becomes one list of steps a chip. Weights are looked up
once (the store's cached arrays; a split weight's share is a view of it) and bound into the steps that read them,
as are the KV caches (from a `KVState`, which persists between runs) and the rotary tables. Each intermediate value
gets a register slot, and a slot is reused once its value is dead, so a run holds one layer's temporaries at a
time. The steps are cut into segments at each collective (`shard.all_reduce`, `shard.all_gather`), where the
chips meet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects import func
from xdsl.dialects.shard import AllReduceOp, GridOp, ReductionKind
from xdsl.ir import Operation, SSAValue

import logos_ir.interpreter.kernels as kernels
from logos_ir.dialects import logos
from logos_ir.dialects.shard_ext import AllGatherOp, AllSliceOp
from logos_ir.errors import LogosError, WeightError
from logos_ir.interpreter.kernels import Registers, RopeTable, Step
from logos_ir.tensor_parallel import split_axis
from logos_ir.weights import WeightStore

_F32 = np.float32


# -- persistent state ----------------------------------------------------------------------------------------


class KVState:
    """The KV caches that persist between runs, keyed by (chip, layer, kind); kind is "key" or "value".

    The interpreter creates each cache on first use, zero-filled, with the shape of the chip's share that its
    `logos.cache` op states. Programs of one model over the same cache shape share one state: a prefill
    program fills the caches a decode program then reads, when both are given the same `KVState`.
    """

    def __init__(self) -> None:
        self._caches: dict[tuple[int, int, str], np.ndarray] = {}

    def cache(self, chip: int, layer: int, kind: str, shape: tuple[int, ...]) -> np.ndarray:
        """The cache for (chip, layer, kind), created zero-filled if new; LogosError on another shape."""
        key = (chip, layer, kind)
        array = self._caches.get(key)
        if array is None:
            array = np.zeros(shape, dtype=_F32)
            self._caches[key] = array
        elif array.shape != shape:
            raise LogosError(
                f"the KV state holds a {kind} cache of shape {list(array.shape)} for layer {layer} on chip "
                f"{chip}, but this program's is {list(shape)}",
                hint="programs share a KVState only when their caches have the same shape; give this one its own",
            )
        return array

    def get(self, chip: int, layer: int, kind: str) -> np.ndarray | None:
        return self._caches.get((chip, layer, kind))

    def keys(self) -> list[tuple[int, int, str]]:
        return sorted(self._caches)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._caches.values())

    def reset(self) -> None:
        """Zero every cache, in place: compiled programs keep their references to the arrays."""
        for array in self._caches.values():
            array.fill(0)


# -- compiling -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Const:
    """A value known at compile time: a weight (or a chip's share of one)."""

    array: np.ndarray


@dataclass(frozen=True)
class _Cache:
    """A KV cache (this chip's share), bound at compile time."""

    array: np.ndarray


_Ref = int | _Const | _Cache  # an int is a runtime value's id


@dataclass
class _Node:
    """One step before slots are assigned: its kernel, the value ids it reads, the value id it writes."""

    make: Callable[..., Step]
    ins: tuple[int, ...]
    out: int | None
    section: str
    reduce: bool = False  # a shard.all_reduce: a lockstep barrier between chips
    gather: int | None = None  # a shard.all_gather's axis: a lockstep barrier between chips
    nbytes: int = 0


@dataclass(frozen=True)
class Input:
    """A `logos.input`: its name, kind, value id, static shape and placeholder (None for a hidden state)."""

    name: str
    kind: str
    value: int
    shape: tuple[int, ...]
    default: np.ndarray | None


@dataclass(frozen=True)
class Communication:
    """What the chips all-reduce in one run: bytes (float32 tensor sizes summed) per section, and in total."""

    per_section: Mapping[str, int]
    total: int


class ChipCompiler:
    """One chip's list of nodes for a program: calls inlined, this chip's weights and caches bound."""

    def __init__(
        self,
        program: logos.ProgramOp,
        weights: WeightStore,
        state: KVState,
        chip: int,
        chips: int,
        ropes: dict[tuple[Any, ...], RopeTable],
        rope_length: int,
    ):
        self.program, self.weights, self.state = program, weights, state
        self.chip, self.chips = chip, chips
        self.ropes, self.rope_length = ropes, rope_length
        self.nodes: list[_Node] = []
        self.count = 0
        self.inputs: dict[str, Input] = {}
        self.main_values: dict[str, int] = {}
        self.constants: dict[int, np.ndarray] = {}  # weights used as runtime operands, preloaded into slots
        self.cache_positions: set[int] = set()
        self.stack: list[str] = []
        self.result = -1
        self.argmax_inputs: list[int] = []  # what each logos.argmax reads (the head's logits), in program order
        self.handlers: dict[type[Operation], Callable[[Any, dict[SSAValue, _Ref], str], None]] = {
            logos.InputOp: self._input,
            logos.WeightOp: self._weight,
            logos.CacheOp: self._cache,
            logos.EmbedOp: self._embed,
            logos.RMSNormOp: self._rms_norm,
            logos.LinearOp: self._linear,
            logos.RopeOp: self._rope,
            logos.CacheWriteOp: self._cache_write,
            logos.AttentionOp: self._attention,
            logos.SelfAttentionOp: self._self_attention,
            logos.AddOp: self._elementwise,
            logos.MulOp: self._elementwise,
            logos.BiasAddOp: self._bias_add,
            logos.HeadRMSNormOp: self._rms_norm,
            logos.GeluTanhOp: self._gelu_tanh,
            logos.SoftcapOp: self._softcap,
            logos.ScaleOp: self._scale,
            logos.SiluOp: self._silu,
            logos.MixtureOp: self._experts,
            logos.RowOp: self._row,
            logos.ArgmaxOp: self._argmax,
            AllReduceOp: self._all_reduce,
            AllGatherOp: self._all_gather,
            AllSliceOp: self._all_slice,
            func.CallOp: self._call,
        }

    def compile(self) -> ChipCompiler:
        """Compile @main into `nodes`; `result` is the value id of what it returns."""
        main = self.program.function("main")
        if main is None:
            raise LogosError("the program has no @main section")
        self.result = self._value(self._function(main, []), "main", "the result of @main")
        return self

    # -- values ----------------------------------------------------------------------------------------------

    def _new(self) -> int:
        self.count += 1
        return self.count - 1

    def _value(self, ref: _Ref, section: str, what: str) -> int:
        """A runtime value id for `ref`; a weight used as a runtime operand is preloaded into its own slot."""
        if isinstance(ref, int):
            return ref
        if isinstance(ref, _Cache):
            raise LogosError(f"@{section}: {what} is a KV cache, which only attention and cache writes read")
        value = self._new()
        self.constants[value] = ref.array
        return value

    def _emit(self, make: Callable[..., Step], ins: Sequence[int], section: str, **extra: Any) -> int:
        """A step that makes a new value; its value id."""
        value = self._new()
        self.nodes.append(_Node(make, tuple(ins), value, section, **extra))
        return value

    def _emit_effect(self, make: Callable[..., Step], ins: Sequence[int], section: str) -> None:
        """A step that only changes state (a cache write)."""
        self.nodes.append(_Node(make, tuple(ins), None, section))

    # -- sections --------------------------------------------------------------------------------------------

    def _function(self, function: func.FuncOp, args: Sequence[_Ref]) -> _Ref:
        section = function.sym_name.data
        if section in self.stack:
            raise LogosError(f"@{section} calls itself (through {' -> '.join(self.stack)})")
        self.stack.append(section)
        env: dict[SSAValue, _Ref] = dict(zip(function.body.block.args, args, strict=True))
        result: _Ref | None = None
        for op in function.body.block.ops:
            if isinstance(op, func.ReturnOp):
                if len(op.operands) != 1:
                    raise LogosError(f"@{section} must return exactly one value")
                result = env[op.operands[0]]
                break
            handler = self.handlers.get(type(op))
            if handler is None:
                raise LogosError(f"@{section}: the reference interpreter cannot run '{op.name}'")
            handler(op, env, section)
            if len(self.stack) == 1:
                self._note_main_values(op, env)
        self.stack.pop()
        if result is None:
            raise LogosError(f"@{section} returns nothing")
        return result

    def _note_main_values(self, op: Operation, env: dict[SSAValue, _Ref]) -> None:
        for result in op.results:
            ref = env.get(result)
            if isinstance(ref, int):
                self.main_values[result.name_hint or f"v{ref}"] = ref

    def _call(self, op: func.CallOp, env: dict[SSAValue, _Ref], section: str) -> None:
        name = op.callee.root_reference.data
        callee = self.program.function(name)
        if callee is None:
            raise LogosError(f"@{section} calls @{name}, which the program does not define")
        env[op.results[0]] = self._function(callee, [env[a] for a in op.operands])

    # -- inputs, weights and caches --------------------------------------------------------------------------

    def _input(self, op: logos.InputOp, env: dict[SSAValue, _Ref], section: str) -> None:
        value = self._new()
        name = op.result.name_hint or f"input{value}"
        if name in self.inputs:
            raise LogosError(f"@{section}: two inputs are named '{name}'")
        shape = logos.tensor_shape(op.result)
        default = None if op.values is None else np.array(logos.int_values(op.values), dtype=np.int64)
        self.inputs[name] = Input(name, op.kind.data, value, shape, default)
        env[op.result] = value

    def _weight(self, op: logos.WeightOp, env: dict[SSAValue, _Ref], section: str) -> None:
        array = self.weights.get(op.tensor.data)
        if op.split is not None:
            axis = split_axis(op.split.data, array.ndim)
            size = array.shape[axis] // self.chips
            index = [slice(None)] * array.ndim
            index[axis] = slice(self.chip * size, (self.chip + 1) * size)
            array = array[tuple(index)]  # a view of the store's array: this chip's contiguous share
        env[op.result] = _Const(array)

    def _cache(self, op: logos.CacheOp, env: dict[SSAValue, _Ref], section: str) -> None:
        shape = logos.tensor_shape(op.result)  # this chip's share; a cache no split divides, each chip's own
        self.cache_positions.add(shape[-2])
        env[op.result] = _Cache(self.state.cache(self.chip, op.layer.value.data, op.kind.data, shape))

    def _cache_operand(self, ref: _Ref, section: str, op: Operation) -> np.ndarray:
        if not isinstance(ref, _Cache):
            raise LogosError(f"@{section}: '{op.name}' needs a KV cache (a logos.cache value)")
        return ref.array

    # -- the math --------------------------------------------------------------------------------------------

    def _embed(self, op: logos.EmbedOp, env: dict[SSAValue, _Ref], section: str) -> None:
        table = env[op.table]
        if not isinstance(table, _Const):
            raise LogosError(f"@{section}: the reference interpreter embeds from a weight only")
        tokens = self._value(env[op.tokens], section, "the tokens")
        env[op.result] = self._emit(kernels.embed(table.array), [tokens], section)

    def _rms_norm(self, op: logos.ScaledRMSNormOp, env: dict[SSAValue, _Ref], section: str) -> None:
        weight = env[op.weight]
        if not isinstance(weight, _Const):
            raise LogosError(f"@{section}: the reference interpreter scales an RMS norm by a weight only")
        x = self._value(env[op.input], section, "the input")
        norm = kernels.head_rms_norm if isinstance(op, logos.HeadRMSNormOp) else kernels.rms_norm
        scale = weight.array if op.plus_one is None else (np.float32(1) + weight.array).astype(np.float32)
        env[op.result] = self._emit(norm(scale, op.epsilon.value.data), [x], section)

    def _linear(self, op: logos.LinearOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        weight = env[op.weight]
        if isinstance(weight, _Const):
            env[op.result] = self._emit(kernels.linear(weight.array), [x], section)
        else:
            w = self._value(weight, section, "the weight")
            env[op.result] = self._emit(kernels.linear_dynamic, [x, w], section)

    def _rope(self, op: logos.RopeOp, env: dict[SSAValue, _Ref], section: str) -> None:
        head_dim = op.head_dim.value.data
        rotary = head_dim if op.rotary_dim is None else op.rotary_dim.value.data
        scaling = op.rope_scaling
        theta = op.theta.value.data
        key = (rotary, theta, scaling)
        table = self.ropes.get(key)
        if table is None:
            table = self.ropes[key] = RopeTable(rotary, theta, scaling, self.rope_length)
        ins = [
            self._value(env[op.input], section, "the input"),
            self._value(env[op.positions], section, "positions"),
        ]
        env[op.result] = self._emit(kernels.rope(table, head_dim, rotary), ins, section)

    def _cache_write(self, op: logos.CacheWriteOp, env: dict[SSAValue, _Ref], section: str) -> None:
        cache = self._cache_operand(env[op.cache], section, op)
        ins = [
            self._value(env[op.input], section, "the input"),
            self._value(env[op.positions], section, "positions"),
        ]
        self._emit_effect(kernels.cache_write(cache), ins, section)

    def _attention(self, op: logos.AttentionOp, env: dict[SSAValue, _Ref], section: str) -> None:
        keys = self._cache_operand(env[op.keys], section, op)
        values = self._cache_operand(env[op.values], section, op)
        ins = [
            self._value(env[op.query], section, "the query"),
            self._value(env[op.positions], section, "positions"),
        ]
        window = None if op.window is None else op.window.value.data
        scale = None if op.scale is None else op.scale.value.data
        softcap = None if op.softcap is None else op.softcap.value.data
        env[op.result] = self._emit(kernels.attention(keys, values, window, scale, softcap), ins, section)

    def _self_attention(self, op: logos.SelfAttentionOp, env: dict[SSAValue, _Ref], section: str) -> None:
        ins = [self._value(env[v], section, "an operand") for v in (op.query, op.key, op.value)]
        env[op.result] = self._emit(kernels.self_attention(op.head_dim.value.data), ins, section)

    def _elementwise(self, op: logos.ElementwiseBinaryOp, env: dict[SSAValue, _Ref], section: str) -> None:
        ufunc = np.add if isinstance(op, logos.AddOp) else np.multiply
        ins = [
            self._value(env[op.lhs], section, "an operand"),
            self._value(env[op.rhs], section, "an operand"),
        ]
        env[op.result] = self._emit(kernels.binary(ufunc), ins, section)

    def _bias_add(self, op: logos.BiasAddOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        bias = self._value(env[op.bias], section, "the bias")
        env[op.result] = self._emit(kernels.binary(np.add), [x, bias], section)  # the bias broadcast over the rows

    def _gelu_tanh(self, op: logos.GeluTanhOp, env: dict[SSAValue, _Ref], section: str) -> None:
        env[op.result] = self._emit(kernels.gelu_tanh, [self._value(env[op.input], section, "the input")], section)

    def _softcap(self, op: logos.SoftcapOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(kernels.softcap(op.cap.value.data), [x], section)

    def _scale(self, op: logos.ScaleOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(kernels.scale(op.factor.value.data), [x], section)

    def _silu(self, op: logos.SiluOp, env: dict[SSAValue, _Ref], section: str) -> None:
        env[op.result] = self._emit(kernels.silu, [self._value(env[op.input], section, "the input")], section)

    def _experts(self, op: logos.MixtureOp, env: dict[SSAValue, _Ref], section: str) -> None:
        stacked = [env[w] for w in (op.gate, op.up, op.down)]
        if not all(isinstance(w, _Const) for w in stacked):
            raise LogosError(f"@{section}: the reference interpreter runs a mixture of experts of weights only")
        gate, up, down = (w.array for w in stacked)  # type: ignore[union-attr]
        ins = [self._value(env[op.input], section, "the input"), self._value(env[op.logits], section, "the logits")]
        held = gate.shape[0]  # split by experts, this chip's share: experts [chip * held, (chip + 1) * held)
        first = self.chip * held if held < op.experts_routed() else 0
        mixture = kernels.experts(gate, up, down, op.top_k.value.data, op.renormalize is not None, first)
        env[op.result] = self._emit(mixture, ins, section)

    def _row(self, op: logos.RowOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(kernels.row(op.index.value.data), [x], section)

    def _argmax(self, op: logos.ArgmaxOp, env: dict[SSAValue, _Ref], section: str) -> None:
        logits = self._value(env[op.input], section, "the input")
        self.argmax_inputs.append(logits)
        env[op.result] = self._emit(kernels.argmax, [logits], section)

    def _all_reduce(self, op: AllReduceOp, env: dict[SSAValue, _Ref], section: str) -> None:
        if op.reduction.data != ReductionKind.SUM:
            raise LogosError(f"@{section}: the reference interpreter all-reduces by sum only, not {op.reduction.data}")
        x = self._value(env[op.input], section, "the input")
        nbytes = math.prod(logos.tensor_shape(op.input)) * 4
        env[op.result] = self._emit(kernels.copy, [x], section, reduce=True, nbytes=nbytes)

    def _all_gather(self, op: AllGatherOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(kernels.copy, [x], section, gather=op.gather_axis.value.data)

    def _all_slice(self, op: AllSliceOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        make = kernels.share(op.slice_axis.value.data, self.chip, self.chips)
        env[op.result] = self._emit(make, [x], section)


# -- slots ---------------------------------------------------------------------------------------------------


def assign_slots(nodes: Sequence[_Node], count: int, pinned: Sequence[int]) -> tuple[list[int], int]:
    """A register slot for every value: pinned values keep theirs for the whole run; any other value's slot is
    free for reuse after the last step that reads it, so a run holds only the live temporaries."""
    last_use = [-1] * count
    for index, node in enumerate(nodes):
        for value in node.ins:
            last_use[value] = index
    slot = [-1] * count
    for number, value in enumerate(pinned):
        slot[value] = number
    slots = len(pinned)
    keep = set(pinned)
    free: list[int] = []
    for index, node in enumerate(nodes):
        out = node.out
        if out is not None and slot[out] < 0:
            if free:
                slot[out] = free.pop()
            else:
                slot[out] = slots
                slots += 1
        for value in set(node.ins):
            if last_use[value] == index and value not in keep:
                free.append(slot[value])
        if out is not None and last_use[out] < 0 and out not in keep:
            free.append(slot[out])  # written, never read: dead at once
    return slot, slots


@dataclass
class Segment:
    """Steps each chip runs before the next all-reduce (None after the last segment)."""

    steps: list[list[Step]]
    reduce: tuple[int, int] | None = None  # (in slot, out slot)
    gather: int | None = None  # the axis `reduce`'s slots are gathered along, when the collective is an all-gather


@dataclass
class Plan:
    """A compiled program: per-chip registers and the steps between all-reduces."""

    registers: list[Registers]
    segments: list[Segment]
    inputs: dict[str, Input]
    main_values: dict[str, int]
    result: int
    communication: Communication
    slot: list[int]
    logits: int | None = None  # the value the last logos.argmax reads


def _communication(nodes: Sequence[_Node], chips: int) -> Communication:
    per_section: dict[str, int] = {}
    for node in nodes:
        if node.reduce and chips > 1:  # on one chip an all-reduce moves nothing
            per_section[node.section] = per_section.get(node.section, 0) + node.nbytes
    return Communication(per_section, sum(per_section.values()))


# -- the program ---------------------------------------------------------------------------------------------


def grid_chips(program: logos.ProgramOp) -> int:
    chips = 1
    for op in program.block.ops:
        if isinstance(op, GridOp):
            shape = logos.int_values(op.shape)
            if len(shape) != 1:
                raise LogosError(f"the reference interpreter runs one-dimensional chip grids, not {list(shape)}")
            chips = shape[0]
    declared = program.chips.value.data
    if chips > 1 and chips != declared:
        raise LogosError(f"the program says it runs on {declared} chips but its grid has {chips}")
    return chips


def check_weights(program: logos.ProgramOp, weights: WeightStore) -> None:
    """Refuse (WeightError naming the tensor and the store) the first weight the store lacks or holds in
    another shape than the program's `logos.weight` states; nothing is read but the shapes."""
    for op in program.walk():
        if not isinstance(op, logos.WeightOp):
            continue
        name, want = op.tensor.data, op.full_shape
        if name not in weights:
            raise WeightError(f"{weights.source}: tensor '{name}' is missing, but the program reads it")
        got = tuple(weights.shape(name))
        if got != want:
            raise WeightError(
                f"{weights.source}: tensor '{name}' has shape {list(got)}, but the program reads it as {list(want)}"
            )


def initial_rope_length(program: logos.ProgramOp) -> int:
    """How many positions the rotary tables cover at first: the caches' length, else the inputs' reach."""
    length = 1
    for op in program.walk():
        if isinstance(op, logos.CacheOp):
            length = max(length, logos.tensor_shape(op.result)[-2])
        elif isinstance(op, logos.InputOp):
            length = max(length, logos.tensor_shape(op.result)[0])
            if op.kind.data == "position" and op.values is not None:
                length = max(length, *logos.int_values(op.values))
    return length


def compile_plan(
    program: logos.ProgramOp,
    weights: WeightStore,
    state: KVState,
    chips: int,
    ropes: dict[tuple[Any, ...], RopeTable],
    rope_length: int,
) -> tuple[Plan, int | None]:
    """The plan of `program` on `chips` chips, and the length of its caches (None when it has none)."""
    compilers = [
        ChipCompiler(program, weights, state, chip, chips, ropes, rope_length).compile() for chip in range(chips)
    ]
    first = compilers[0]
    pinned = sorted(
        {i.value for i in first.inputs.values()}
        | set(first.main_values.values())
        | set(first.constants)
        | {first.result}
        | set(first.argmax_inputs[-1:])  # the logits the head's arg-max read stay readable after a run
    )
    slot, slots = assign_slots(first.nodes, first.count, pinned)
    registers: list[Registers] = []
    for compiler in compilers:
        regs: Registers = [None] * slots
        for value, array in compiler.constants.items():
            regs[slot[value]] = array
        registers.append(regs)
    plan = Plan(
        registers=registers,
        segments=_segments(compilers, slot, chips),
        inputs=first.inputs,
        main_values=first.main_values,
        result=slot[first.result],
        communication=_communication(first.nodes, chips),
        slot=slot,
        logits=first.argmax_inputs[-1] if first.argmax_inputs else None,
    )
    if len(first.cache_positions) > 1:
        raise LogosError(f"the program's caches disagree on their length: {sorted(first.cache_positions)}")
    cache_length = next(iter(first.cache_positions)) if first.cache_positions else None
    return plan, cache_length


def _segments(compilers: Sequence[ChipCompiler], slot: list[int], chips: int) -> list[Segment]:
    """Each chip's steps, cut at the collectives (where the chips meet)."""
    segments = [Segment([[] for _ in compilers])]
    for index, node in enumerate(compilers[0].nodes):
        ins = [slot[v] for v in node.ins]
        if (node.reduce or node.gather is not None) and chips > 1:
            segments[-1].reduce = (ins[0], slot[node.out])  # type: ignore[index]
            segments[-1].gather = node.gather
            segments.append(Segment([[] for _ in compilers]))
            continue
        for chip, compiler in enumerate(compilers):
            mine = compiler.nodes[index]
            args = ins if mine.out is None else [*ins, slot[mine.out]]
            segments[-1].steps[chip].append(mine.make(*args))
    return segments
