"""The reference interpreter: runs a LOGOS program with numpy, in float32.

An `Interpreter` compiles a `logos.program` once into a flat plan, then runs it as many times as asked:

* compile: every `func.call` from `@main` is inlined, so the program becomes one list of steps. Weights are
  looked up once (the store's cached arrays; a split weight's share is a view of it) and bound into the steps
  that read them, as are the KV caches (from a `KVState`) and the rotary tables. Each intermediate value gets
  a register slot, and a slot is reused once its value is dead, so a run holds one layer's temporaries at a
  time.
* run: each step is a small closure `step(registers)`; running is `for step in steps: step(registers)`, with
  no IR, no dispatch on op types and no dictionary lookups on the hot path.

A program split over chips (a `shard.grid @chips`) runs as that many chips, each with its own registers, its
own share of every split weight and its own share of every cache. They execute in lockstep, segment by
segment, and meet only at `shard.all_reduce`, which sums the chips' partial results (in chip order) and hands
each chip a copy, and at `shard.all_gather` (the split head's logits), which puts the chips' shares side by side
along the gather axis in chip order and hands each chip a copy: no chip ever reads another chip's share but
through a collective.

Token ids and positions are counted from 1, as in LOGOS; `run` returns what `@main` returns (token ids from 1,
logits, or a hidden state).
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

from logos_ir.dialects import logos
from logos_ir.dialects.shard_ext import AllGatherOp
from logos_ir.errors import LogosError, WeightError
from logos_ir.rope import rope_inv_freq
from logos_ir.spec import RopeScaling
from logos_ir.weights import WeightStore

__all__ = ["Communication", "Interpreter", "KVState", "run_text"]

Registers = list[Any]
Step = Callable[[Registers], None]

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


# -- rotary tables -------------------------------------------------------------------------------------------


class _RopeTable:
    """cos and signed sin per position (row p-1 for LOGOS position p, rotary angle (p-1)*inv_freq), laid out
    over a whole head so that rotate-half is one multiply-add: out = x*cos + swap_halves(x)*sin with sin
    laid out as [-sin, sin]."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None, length: int):
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self.cos = self.sin = np.zeros((0, head_dim), dtype=_F32)
        self.ensure(length)

    def ensure(self, length: int) -> None:
        """Make the tables cover positions 1..length (only cacheless programs ever grow them)."""
        if length <= self.cos.shape[0]:
            return
        angles = np.arange(length, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angles), np.sin(angles)
        self.cos = np.concatenate([cos, cos], axis=1).astype(_F32)
        self.sin = np.concatenate([-sin, sin], axis=1).astype(_F32)


# -- the kernels: each builds one step over register slots ---------------------------------------------------
#
# A kernel's `make(*in_slots, out_slot)` returns the step closure. Constants (weights, caches, tables) are
# bound when the kernel is chosen, so a step only indexes the register list.


def _embed(table: np.ndarray) -> Callable[..., Step]:
    def make(tokens: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = table[r[tokens] - 1]

        return step

    return make


def _rms_norm(weight: np.ndarray, epsilon: float) -> Callable[..., Step]:
    eps = _F32(epsilon)
    inv_n = _F32(1.0 / weight.shape[0])
    einsum, sqrt = np.einsum, np.sqrt

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x]
            mean_square = einsum("ij,ij->i", v, v) * inv_n
            r[out] = (v * (1 / sqrt(mean_square + eps))[:, None]) * weight

        return step

    return make


def _linear(weight: np.ndarray) -> Callable[..., Step]:
    transposed = weight.T  # a view: x @ W^T is one BLAS call on the [out, in] array, no copy
    matmul = np.matmul

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = matmul(r[x], transposed)

        return step

    return make


def _linear_dynamic(x: int, weight: int, out: int) -> Step:
    def step(r: Registers) -> None:
        r[out] = r[x] @ r[weight].T

    return step


def _rope(table: _RopeTable, head_dim: int) -> Callable[..., Step]:
    half = head_dim // 2
    concatenate = np.concatenate

    def make(x: int, positions: int, out: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x]
            rows = v.shape[0]
            heads = v.reshape(rows, -1, head_dim)
            index = r[positions] - 1
            cos = table.cos[index][:, None, :]
            sin = table.sin[index][:, None, :]
            swapped = concatenate((heads[..., half:], heads[..., :half]), axis=-1)
            r[out] = (heads * cos + swapped * sin).reshape(rows, -1)

        return step

    return make


def _cache_write(cache: np.ndarray) -> Callable[..., Step]:
    kv_heads, head_dim = cache.shape[-3], cache.shape[-1]
    if cache.ndim == 4:
        sequences = np.arange(cache.shape[0])

        def make4(x: int, positions: int) -> Step:
            def step(r: Registers) -> None:
                v = r[x]
                cache[sequences, :, r[positions] - 1, :] = v.reshape(v.shape[0], kv_heads, head_dim)

            return step

        return make4

    def make(x: int, positions: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x]
            index = r[positions] - 1
            if v.shape[0] == 1:  # a decode step: basic indexing, no fancy-index machinery
                cache[:, index[0], :] = v.reshape(kv_heads, head_dim)
            else:
                cache[:, index, :] = v.reshape(v.shape[0], kv_heads, head_dim).transpose(1, 0, 2)

        return step

    return make


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _causal_bias(positions: np.ndarray, length: int) -> np.ndarray:
    """[rows, length]: 0 where a row at position p (from 1) may attend column c (c < p), else -inf."""
    allowed = np.arange(length)[None, :] < positions[:, None]
    return np.where(allowed, _F32(0), _F32(-np.inf)).astype(_F32)


def _attention(keys: np.ndarray, values: np.ndarray) -> Callable[..., Step]:
    if keys.ndim == 4:
        return _attention_per_sequence(keys, values)
    kv_heads, head_dim = keys.shape[0], keys.shape[2]
    scale = _F32(1 / math.sqrt(head_dim))
    matmul = np.matmul

    def make(query: int, positions: int, out: int) -> Step:
        def step(r: Registers) -> None:
            q = r[query]
            pos = r[positions]
            rows = q.shape[0]
            group = q.shape[1] // (kv_heads * head_dim)
            length = int(pos.max())
            k = keys[:, :length]
            v = values[:, :length]
            # Query head h = kv * group + g reads KV head kv: gather each KV head's queries of all rows.
            qh = q.reshape(rows, kv_heads, group, head_dim).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)
            scores = matmul(qh, k.transpose(0, 2, 1))
            scores *= scale
            if rows > 1:  # a decode row attends every cached position up to its own: nothing to mask
                scores.reshape(kv_heads, rows, group, length)[...] += _causal_bias(pos, length)[None, :, None, :]
            attended = matmul(_softmax_rows(scores), v)
            r[out] = attended.reshape(kv_heads, rows, group, head_dim).transpose(1, 0, 2, 3).reshape(rows, -1)

        return step

    return make


def _attention_per_sequence(keys: np.ndarray, values: np.ndarray) -> Callable[..., Step]:
    kv_heads, head_dim = keys.shape[1], keys.shape[3]
    scale = _F32(1 / math.sqrt(head_dim))
    matmul = np.matmul

    def make(query: int, positions: int, out: int) -> Step:
        def step(r: Registers) -> None:
            q = r[query]
            pos = r[positions]
            rows = q.shape[0]
            length = int(pos.max())
            qh = q.reshape(rows, kv_heads, -1, head_dim)
            scores = matmul(qh, keys[:, :, :length].transpose(0, 1, 3, 2))
            scores *= scale
            scores += _causal_bias(pos, length)[:, None, None, :]
            r[out] = matmul(_softmax_rows(scores), values[:, :, :length]).reshape(rows, -1)

        return step

    return make


def _self_attention(head_dim: int) -> Callable[..., Step]:
    scale = _F32(1 / math.sqrt(head_dim))
    matmul = np.matmul

    def make(query: int, key: int, value: int, out: int) -> Step:
        def step(r: Registers) -> None:
            q, k, v = r[query], r[key], r[value]
            rows = q.shape[0]
            kv_heads = k.shape[1] // head_dim
            group = q.shape[1] // k.shape[1]
            qh = q.reshape(rows, kv_heads, group, head_dim).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)
            kh = k.reshape(rows, kv_heads, head_dim).transpose(1, 2, 0)
            vh = v.reshape(rows, kv_heads, head_dim).transpose(1, 0, 2)
            scores = matmul(qh, kh)
            scores *= scale
            bias = _causal_bias(np.arange(1, rows + 1), rows)
            scores.reshape(kv_heads, rows, group, rows)[...] += bias[None, :, None, :]
            attended = matmul(_softmax_rows(scores), vh)
            r[out] = attended.reshape(kv_heads, rows, group, head_dim).transpose(1, 0, 2, 3).reshape(rows, -1)

        return step

    return make


def _binary(ufunc: np.ufunc) -> Callable[..., Step]:
    def make(lhs: int, rhs: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = ufunc(r[lhs], r[rhs])

        return step

    return make


def _silu(x: int, out: int) -> Step:
    tanh = np.tanh

    def step(r: Registers) -> None:
        v = r[x]
        # sigmoid(v) = (1 + tanh(v/2)) / 2 never overflows, unlike 1 / (1 + exp(-v)) for v below about -88.
        r[out] = v * (tanh(v * _F32(0.5)) * _F32(0.5) + _F32(0.5))

    return step


def _row(index: int) -> Callable[..., Step]:
    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = r[x][index - 1 : index]

        return step

    return make


def _argmax(x: int, out: int) -> Step:
    argmax = np.argmax

    def step(r: Registers) -> None:
        r[out] = argmax(r[x], axis=-1) + 1  # numpy takes the first maximum on ties, as logos.argmax does

    return step


def _copy(x: int, out: int) -> Step:
    def step(r: Registers) -> None:
        r[out] = r[x]

    return step


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
class _Input:
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


class _ChipCompiler:
    """One chip's list of nodes for a program: calls inlined, this chip's weights and caches bound."""

    def __init__(
        self,
        program: logos.ProgramOp,
        weights: WeightStore,
        state: KVState,
        chip: int,
        chips: int,
        ropes: dict[tuple[Any, ...], _RopeTable],
        rope_length: int,
    ):
        self.program, self.weights, self.state = program, weights, state
        self.chip, self.chips = chip, chips
        self.ropes, self.rope_length = ropes, rope_length
        self.nodes: list[_Node] = []
        self.count = 0
        self.inputs: dict[str, _Input] = {}
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
            logos.SiluOp: self._silu,
            logos.RowOp: self._row,
            logos.ArgmaxOp: self._argmax,
            AllReduceOp: self._all_reduce,
            AllGatherOp: self._all_gather,
            func.CallOp: self._call,
        }

    def compile(self) -> _ChipCompiler:
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
        self.inputs[name] = _Input(name, op.kind.data, value, shape, default)
        env[op.result] = value

    def _weight(self, op: logos.WeightOp, env: dict[SSAValue, _Ref], section: str) -> None:
        array = self.weights.get(op.tensor.data)
        if op.split is not None:
            axis = 0 if op.split.data == "rows" else array.ndim - 1
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
        env[op.result] = self._emit(_embed(table.array), [tokens], section)

    def _rms_norm(self, op: logos.RMSNormOp, env: dict[SSAValue, _Ref], section: str) -> None:
        weight = env[op.weight]
        if not isinstance(weight, _Const):
            raise LogosError(f"@{section}: the reference interpreter scales an RMS norm by a weight only")
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(_rms_norm(weight.array, op.epsilon.value.data), [x], section)

    def _linear(self, op: logos.LinearOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        weight = env[op.weight]
        if isinstance(weight, _Const):
            env[op.result] = self._emit(_linear(weight.array), [x], section)
        else:
            w = self._value(weight, section, "the weight")
            env[op.result] = self._emit(_linear_dynamic, [x, w], section)

    def _rope(self, op: logos.RopeOp, env: dict[SSAValue, _Ref], section: str) -> None:
        head_dim = op.head_dim.value.data
        scaling = None if op.scaling is None else logos.scaling_from_attr(op.scaling)
        theta = op.theta.value.data
        key = (head_dim, theta, scaling)
        table = self.ropes.get(key)
        if table is None:
            table = self.ropes[key] = _RopeTable(head_dim, theta, scaling, self.rope_length)
        ins = [
            self._value(env[op.input], section, "the input"),
            self._value(env[op.positions], section, "positions"),
        ]
        env[op.result] = self._emit(_rope(table, head_dim), ins, section)

    def _cache_write(self, op: logos.CacheWriteOp, env: dict[SSAValue, _Ref], section: str) -> None:
        cache = self._cache_operand(env[op.cache], section, op)
        ins = [
            self._value(env[op.input], section, "the input"),
            self._value(env[op.positions], section, "positions"),
        ]
        self._emit_effect(_cache_write(cache), ins, section)

    def _attention(self, op: logos.AttentionOp, env: dict[SSAValue, _Ref], section: str) -> None:
        keys = self._cache_operand(env[op.keys], section, op)
        values = self._cache_operand(env[op.values], section, op)
        ins = [
            self._value(env[op.query], section, "the query"),
            self._value(env[op.positions], section, "positions"),
        ]
        env[op.result] = self._emit(_attention(keys, values), ins, section)

    def _self_attention(self, op: logos.SelfAttentionOp, env: dict[SSAValue, _Ref], section: str) -> None:
        ins = [self._value(env[v], section, "an operand") for v in (op.query, op.key, op.value)]
        env[op.result] = self._emit(_self_attention(op.head_dim.value.data), ins, section)

    def _elementwise(self, op: logos.ElementwiseBinaryOp, env: dict[SSAValue, _Ref], section: str) -> None:
        ufunc = np.add if isinstance(op, logos.AddOp) else np.multiply
        ins = [
            self._value(env[op.lhs], section, "an operand"),
            self._value(env[op.rhs], section, "an operand"),
        ]
        env[op.result] = self._emit(_binary(ufunc), ins, section)

    def _silu(self, op: logos.SiluOp, env: dict[SSAValue, _Ref], section: str) -> None:
        env[op.result] = self._emit(_silu, [self._value(env[op.input], section, "the input")], section)

    def _row(self, op: logos.RowOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(_row(op.index.value.data), [x], section)

    def _argmax(self, op: logos.ArgmaxOp, env: dict[SSAValue, _Ref], section: str) -> None:
        logits = self._value(env[op.input], section, "the input")
        self.argmax_inputs.append(logits)
        env[op.result] = self._emit(_argmax, [logits], section)

    def _all_reduce(self, op: AllReduceOp, env: dict[SSAValue, _Ref], section: str) -> None:
        if op.reduction.data != ReductionKind.SUM:
            raise LogosError(f"@{section}: the reference interpreter all-reduces by sum only, not {op.reduction.data}")
        x = self._value(env[op.input], section, "the input")
        nbytes = math.prod(logos.tensor_shape(op.input)) * 4
        env[op.result] = self._emit(_copy, [x], section, reduce=True, nbytes=nbytes)

    def _all_gather(self, op: AllGatherOp, env: dict[SSAValue, _Ref], section: str) -> None:
        x = self._value(env[op.input], section, "the input")
        env[op.result] = self._emit(_copy, [x], section, gather=op.gather_axis.value.data)


# -- slots ---------------------------------------------------------------------------------------------------


def _assign_slots(nodes: Sequence[_Node], count: int, pinned: Sequence[int]) -> tuple[list[int], int]:
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
class _Segment:
    """Steps each chip runs before the next all-reduce (None after the last segment)."""

    steps: list[list[Step]]
    reduce: tuple[int, int] | None = None  # (in slot, out slot)
    gather: int | None = None  # the axis `reduce`'s slots are gathered along, when the collective is an all-gather


@dataclass
class _Plan:
    """A compiled program: per-chip registers and the steps between all-reduces."""

    registers: list[Registers]
    segments: list[_Segment]
    inputs: dict[str, _Input]
    main_values: dict[str, int]
    result: int
    communication: Communication
    slot: list[int]
    logits: int | None = None  # the value the last logos.argmax reads


# -- the interpreter -----------------------------------------------------------------------------------------


def _grid_chips(program: logos.ProgramOp) -> int:
    chips = 1
    for op in program.body.block.ops:
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


def _rope_length(program: logos.ProgramOp) -> int:
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


class Interpreter:
    """Runs one LOGOS program on numpy (see the module docstring). Construction checks the weights and
    compiles; `run` executes @main with inputs bound by their value names."""

    def __init__(self, program: logos.ProgramOp, weights: WeightStore, state: KVState | None = None):
        check_weights(program, weights)
        self.program = program
        self.weights = weights
        self.state = state if state is not None else KVState()
        self.spec = program.spec
        self.chips = _grid_chips(program)
        self._ropes: dict[tuple[Any, ...], _RopeTable] = {}
        self._plan, self._cache_length = self._compile(_rope_length(program))
        self._fast = self._plan.segments[0].steps[0] if self.chips == 1 and len(self._plan.segments) == 1 else None
        self._ran = False

    # -- compiling -------------------------------------------------------------------------------------------

    def _compile(self, rope_length: int) -> tuple[_Plan, int | None]:
        compilers = []
        for chip in range(self.chips):
            compiler = _ChipCompiler(self.program, self.weights, self.state, chip, self.chips, self._ropes, rope_length)
            compilers.append(compiler.compile())
        first = compilers[0]
        pinned = sorted(
            {i.value for i in first.inputs.values()}
            | set(first.main_values.values())
            | set(first.constants)
            | {first.result}
            | set(first.argmax_inputs[-1:])  # the logits the head's arg-max read stay readable after a run
        )
        slot, slots = _assign_slots(first.nodes, first.count, pinned)
        registers: list[Registers] = []
        for compiler in compilers:
            regs: Registers = [None] * slots
            for value, array in compiler.constants.items():
                regs[slot[value]] = array
            registers.append(regs)
        plan = _Plan(
            registers=registers,
            segments=self._segments(compilers, slot),
            inputs=first.inputs,
            main_values=first.main_values,
            result=slot[first.result],
            communication=_communication(first.nodes, self.chips),
            slot=slot,
            logits=first.argmax_inputs[-1] if first.argmax_inputs else None,
        )
        if len(first.cache_positions) > 1:
            raise LogosError(f"the program's caches disagree on their length: {sorted(first.cache_positions)}")
        cache_length = next(iter(first.cache_positions)) if first.cache_positions else None
        return plan, cache_length

    def _segments(self, compilers: Sequence[_ChipCompiler], slot: list[int]) -> list[_Segment]:
        segments = [_Segment([[] for _ in compilers])]
        for index, node in enumerate(compilers[0].nodes):
            ins = [slot[v] for v in node.ins]
            if (node.reduce or node.gather is not None) and self.chips > 1:
                segments[-1].reduce = (ins[0], slot[node.out])  # type: ignore[index]
                segments[-1].gather = node.gather
                segments.append(_Segment([[] for _ in compilers]))
                continue
            for chip, compiler in enumerate(compilers):
                mine = compiler.nodes[index]
                args = ins if mine.out is None else [*ins, slot[mine.out]]
                segments[-1].steps[chip].append(mine.make(*args))
        return segments

    # -- running ---------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, str]:
        """The names `run` binds inputs by, in program order, each with its kind (token, position or
        hidden)."""
        return {name: spec.kind for name, spec in self._plan.inputs.items()}

    def run(self, **inputs: Any) -> np.ndarray:
        """Run @main. Keyword arguments replace the placeholder of the `logos.input` of that name (token ids
        and positions from 1, hidden states as float arrays); returns @main's result."""
        plan = self._plan
        bound = self._bind(inputs)
        for regs in plan.registers:
            for slot, array in bound:
                regs[slot] = array
        if self._fast is not None:
            regs = plan.registers[0]
            for step in self._fast:
                step(regs)
        else:
            self._run_lockstep(plan)
        self._ran = True
        return plan.registers[0][plan.result]

    def _run_lockstep(self, plan: _Plan) -> None:
        registers = plan.registers
        for segment in plan.segments:
            for regs, steps in zip(registers, segment.steps, strict=True):
                for step in steps:
                    step(regs)
            if segment.reduce is not None:
                source, target = segment.reduce
                if segment.gather is not None:  # the chips' shares side by side, in chip order
                    total = np.concatenate([regs[source] for regs in registers], axis=segment.gather)
                    for chip, regs in enumerate(registers):
                        regs[target] = total if chip == 0 else total.copy()
                    continue
                total = registers[0][source].copy()
                for regs in registers[1:]:
                    total += regs[source]
                for chip, regs in enumerate(registers):
                    regs[target] = total if chip == 0 else total.copy()  # each chip gets its own copy

    def _bind(self, given: Mapping[str, Any]) -> list[tuple[int, np.ndarray]]:
        inputs = self._plan.inputs
        unknown = [name for name in given if name not in inputs]
        if unknown:
            raise LogosError(
                f"the program has no input named {', '.join(repr(n) for n in unknown)}",
                hint=f"its inputs are: {', '.join(inputs) or 'none'}",
            )
        slot = self._plan.slot
        bound = []
        for name, spec in inputs.items():
            value = given.get(name)
            bound.append((slot[spec.value], self._check_input(spec, value)))
        return bound

    def _check_input(self, spec: _Input, value: Any) -> np.ndarray:
        if value is None:
            if spec.default is None:
                raise LogosError(f"input '{spec.name}' is a hidden state: give its value, run({spec.name}=...)")
            value = spec.default
        array = np.asarray(value)
        if array.size != math.prod(spec.shape):
            raise LogosError(f"input '{spec.name}' takes {list(spec.shape)} values, got shape {list(array.shape)}")
        if spec.kind == "hidden":
            return np.ascontiguousarray(array, dtype=_F32).reshape(spec.shape)
        if array.dtype.kind not in "iu":
            raise LogosError(f"input '{spec.name}': {spec.kind}s are whole numbers, got {array.dtype}")
        array = array.astype(np.int64, copy=False).reshape(spec.shape)
        self._check_range(spec, array)
        return array

    def _check_range(self, spec: _Input, array: np.ndarray) -> None:
        low, high = int(array.min()), int(array.max())
        if spec.kind == "token":
            if low < 1 or high > self.spec.vocab:
                raise LogosError(
                    f"input '{spec.name}': token ids run from 1 to {self.spec.vocab}, got {array.tolist()}"
                )
            return
        if low < 1:
            raise LogosError(f"input '{spec.name}': positions count from 1, got {array.tolist()}")
        limit = self._cache_length
        if limit is not None:
            if high > limit:
                raise LogosError(f"input '{spec.name}': position {high} is outside the cache (positions 1 to {limit})")
        else:
            for table in self._ropes.values():
                table.ensure(high)

    # -- what a run did --------------------------------------------------------------------------------------

    @property
    def last_values(self) -> dict[str, np.ndarray]:
        """Every value @main names (its inputs, x0, x1, ..., the result) from the last run, chip 0's on a
        split program (they are replicated); empty before the first run."""
        if not self._ran:
            return {}
        regs, slot = self._plan.registers[0], self._plan.slot
        return {name: regs[slot[value]] for name, value in self._plan.main_values.items()}

    @property
    def logits(self) -> np.ndarray | None:
        """The float32 logits `[vocab]` of the last row the head's arg-max read in the last run (chip 0's on a
        split program, where every chip holds them whole); None before the first run or for a program with no
        arg-max. A copy: the next run does not change it."""
        if not self._ran or self._plan.logits is None:
            return None
        value = self._plan.registers[0][self._plan.slot[self._plan.logits]]
        value = np.asarray(value, dtype=_F32)
        return value.reshape(-1, value.shape[-1])[-1].copy()

    def communication_bytes_per_run(self) -> Communication:
        """The bytes the chips all-reduce in one run (sum of the all-reduced float32 tensors' sizes; the
        traffic of a ring all-reduce is 2(n-1)/n times that per chip), per section and in total; zero on one
        chip."""
        return self._plan.communication


def _communication(nodes: Sequence[_Node], chips: int) -> Communication:
    per_section: dict[str, int] = {}
    for node in nodes:
        if node.reduce and chips > 1:  # on one chip an all-reduce moves nothing
            per_section[node.section] = per_section.get(node.section, 0) + node.nbytes
    return Communication(per_section, sum(per_section.values()))


def run_text(text: str, weights: WeightStore, state: KVState | None = None, filename: str = "<logos>") -> np.ndarray:
    """Parse LOGOS text and run it once with the inputs it carries (its placeholders)."""
    from logos_ir.parser import parse_program

    return Interpreter(parse_program(text, filename), weights, state).run()
