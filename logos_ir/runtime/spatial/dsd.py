"""The DSD operations: `@get_dsd` and `@increment_dsd_offset` compiled into the DSDs each element holds (a memory
DSD's array, offset, length and stride; a fabric DSD's colour and extent), and each DSD op (`DSD_OPS`, by op type)
run on its operands, one element of a DSD a cycle: memory DSDs read and written, a fabric input DSD's wavelets
taken from the element's queue (the element waits until they are there), a fabric output DSD's values sent along
the route. `_dsd` runs the op with every check; `_fast_dsd` is a shorter way for the common case of an op with a
fabric operand, with the same effects, cycles and wavelets (`DsdOps`, the part of `elements.Fabric` that runs them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects import arith, csl
from xdsl.ir import SSAValue

from logos_ir.dialects import csl_ext
from logos_ir.runtime.spatial import CYCLES, FabricError
from logos_ir.runtime.spatial.fabric import Blocked, FabDsd
from logos_ir.runtime.spatial.memory import MemDsd
from logos_ir.runtime.spatial.state import FabricState


def _constant(value: SSAValue) -> int | None:
    """The value of an integer constant of the program (None if `value` is computed)."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp):
        data = owner.value.value.data  # type: ignore[attr-defined]
        return int(data) if isinstance(data, int) else None
    return None


def _fabric_source(value: SSAValue) -> csl.GetFabDsdOp:
    """The `@get_dsd` of a fabric DSD, through any `@set_dsd_length`s."""
    owner = value.owner
    while isinstance(owner, csl.SetDsdLengthOp):
        owner = owner.op.owner
    return owner  # type: ignore[return-value]


def _fabric_dsd(value: SSAValue) -> bool:
    """Whether `value` is a fabric DSD (made by `@get_dsd(fab*_dsd)`, its length perhaps set at run time)."""
    return isinstance(_fabric_source(value), csl.GetFabDsdOp)


def _f32(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.float32 else a.astype(np.float32)


def _bits16(a: np.ndarray | int) -> np.ndarray:
    return np.asarray(a, dtype=np.int64) & 0xFFFF


# What each DSD op computes from its source operands' values, by op type.
DSD_OPS: dict[type[csl.BuiltinDsdOp], Callable[..., np.ndarray]] = {
    csl.FmovsOp: lambda a: a,
    csl.FmovhOp: lambda a: a,
    csl.FaddsOp: lambda a, b: _f32(a) + _f32(b),
    csl.FsubsOp: lambda a, b: _f32(a) - _f32(b),
    csl.FmulsOp: lambda a, b: _f32(a) * _f32(b),
    csl.FmaxsOp: lambda a, b: np.maximum(_f32(a), _f32(b)),
    csl.FmacsOp: lambda a, b, s: _f32(a) + _f32(b) * _f32(s),
    # f16 b and s multiplied (exact in f32) and accumulated in f32
    csl.FmachsOp: lambda a, b, s: (
        _f32(a) + b.astype(np.float16).astype(np.float32) * s.astype(np.float16).astype(np.float32)
    ),
    csl.Fs2hOp: lambda a: _f32(a).astype(np.float16),
    csl.Fh2sOp: lambda a: a.astype(np.float16).astype(np.float32),
    # the SDK's 16-bit integer ops on 16-bit words (an array's i16 or u16 numbers, a scalar's bits), the result
    # the low 16 bits; @xp162fs reads its source as a signed i16 (the lane converts i16 arrays only)
    csl.And16Op: lambda a, b: _bits16(a) & _bits16(b),
    csl.Xor16Op: lambda a, b: _bits16(a) ^ _bits16(b),
    csl.Slr16Op: lambda a, b: _bits16(a) >> (_bits16(b) & 15),
    csl.Sub16Op: lambda a, b: (_bits16(a) - _bits16(b)) & 0xFFFF,
    csl.Xp162fsOp: lambda a: ((_bits16(a) ^ 0x8000) - 0x8000).astype(np.float32),
}


class DsdOps(FabricState):
    """The DSD side of `elements.Fabric`: DSDs made and DSD ops run."""

    def _compile_mem_dsd(self, op: csl.GetMemDsdOp) -> None:
        at = len(self.instrs)
        name = self._array_of(op.base_addr)
        access = op.tensor_access.data if op.tensor_access is not None else None
        offset = access.eval([0], [])[0] if access is not None else 0
        stride = (access.eval([1], [])[0] - offset) if access is not None else 1
        size = self._reg(op.sizes[0])
        constant = _constant(op.sizes[0])
        if constant is not None:  # the same for every element: one value each, read-only, no array an element
            static = (int(offset), int(constant), int(stride))
            reg = MemDsd(name, *(np.broadcast_to(np.int64(v), (self.n,)) for v in static), static)  # type: ignore[arg-type]
        else:
            reg = MemDsd(name, np.zeros(self.n, np.int64), np.zeros(self.n, np.int64), np.zeros(self.n, np.int64))
        self.regs[op.result] = reg
        clock, n, cost = self.clock, self.n, CYCLES["dsd_setup"]

        def run(idx: np.ndarray) -> int:
            rows = slice(None) if idx.size == n else idx
            if reg.static is None:
                reg.offset[rows], reg.length[rows], reg.stride[rows] = offset, size[rows], stride
            clock[rows] += cost
            return at + 1

        self._emit("@get_dsd", run)

    def _compile_increment(self, op: csl.IncrementDsdOffsetOp) -> None:
        at = len(self.instrs)
        by = self._reg(op.offset)
        reg = self.regs[op.result] = MemDsd(
            "", np.zeros(self.n, np.int64), np.zeros(self.n, np.int64), np.zeros(self.n, np.int64)
        )
        source_value = op.op

        clock, n, cost = self.clock, self.n, CYCLES["dsd_setup"]

        def run(idx: np.ndarray) -> int:
            source = self.regs[source_value]
            reg.array = source.array
            rows = slice(None) if idx.size == n else idx
            if source.static is not None:
                offset, length, stride = source.static
                reg.offset[rows] = offset + by[rows]
                reg.length[rows], reg.stride[rows] = length, stride
            else:
                reg.offset[rows] = source.offset[rows] + by[rows]
                reg.length[rows], reg.stride[rows] = source.length[rows], source.stride[rows]
            clock[rows] += cost
            return at + 1

        self._emit("@increment_dsd_offset", run)

    def _fab_dsd_constant(self, op: csl.GetFabDsdOp) -> None:
        """A fabric DSD of the program's top level: a compile-time constant (its extent a constant), every
        element's the same; the functions set its length where they use it (`@set_dsd_length`)."""
        constant = _constant(op.sizes[0])
        if constant is None:
            raise FabricError(
                f"a fabric DSD of the program's top level (colour {op.fabric_color.value.data}) needs a constant extent"
            )
        inbound = op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
        colour, queue = op.fabric_color.value.data, csl_ext.queue_id(op)
        extent = np.full(self.n, constant)
        self.regs[op.result] = FabDsd(colour, inbound, extent, int(constant), queue, self._colour_param(op))

    def _compile_fab_dsd(self, op: csl.GetFabDsdOp) -> None:
        at = len(self.instrs)
        inbound = op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
        constant = _constant(op.sizes[0])
        reg = self.regs[op.result] = FabDsd(
            op.fabric_color.value.data,
            inbound,
            np.zeros(self.n, np.int64),
            int(constant) if constant is not None else None,
            csl_ext.queue_id(op),
            self._colour_param(op),
        )
        size = self._reg(op.sizes[0])
        clock, n, cost = self.clock, self.n, CYCLES["dsd_setup"]

        def run(idx: np.ndarray) -> int:
            rows = slice(None) if idx.size == n else idx
            if reg.static is None:
                reg.extent[rows] = size[rows]
            clock[rows] += cost
            return at + 1

        self._emit("@get_dsd", run)

    def _compile_set_length(self, op: csl.SetDsdLengthOp) -> None:
        """`@set_dsd_length(dsd, n)`: the DSD (memory or fabric) with each element's run-time length n."""
        at = len(self.instrs)
        by = self._reg(op.length)
        source_value = op.op
        if _fabric_dsd(source_value):
            owner = _fabric_source(source_value)
            reg: MemDsd | FabDsd = FabDsd(
                owner.fabric_color.value.data,
                owner.result.type == csl.DsdType(csl.DsdKind.fabin_dsd),
                np.zeros(self.n, np.int64),
                queue=csl_ext.queue_id(owner),
                param=self._colour_param(owner),
            )
        else:
            reg = MemDsd("", np.zeros(self.n, np.int64), np.zeros(self.n, np.int64), np.zeros(self.n, np.int64))
        self.regs[op.result] = reg
        clock, n, cost = self.clock, self.n, CYCLES["dsd_setup"]

        def run(idx: np.ndarray) -> int:
            rows = slice(None) if idx.size == n else idx
            source = self.regs[source_value]
            if isinstance(reg, FabDsd):
                reg.extent[rows] = by[rows]
            else:
                reg.array = source.array
                if source.static is not None:
                    offset, _, stride = source.static
                    reg.offset[rows], reg.stride[rows] = offset, stride
                else:
                    reg.offset[rows], reg.stride[rows] = source.offset[rows], source.stride[rows]
                reg.length[rows] = by[rows]
            clock[rows] += cost
            return at + 1

        self._emit("@set_dsd_length", run)

    def _compile_dsd_op(self, op: csl.BuiltinDsdOp) -> None:
        at = len(self.instrs)
        kind = op.name.removeprefix("csl.")
        function = DSD_OPS[type(op)]
        operands = list(op.ops)
        fast = None if self._simple else self._fast_dsd(at, function, operands)

        fabric = [v for v in operands if _fabric_dsd(v)]

        def run(idx: np.ndarray) -> np.ndarray | int:
            for value in fabric:
                self._check_queue(self.regs[value], idx, kind)
            if fast is not None and self.fast:
                done = fast(idx)
                if done is not None:
                    return done
            return self._dsd(idx, at, kind, function, operands)

        if not self._simple:
            self.waits.add(at)
        self._emit(f"@{kind}", run)

    def _colour_param(self, op: csl.GetFabDsdOp) -> np.ndarray | None:
        name = csl_ext.colour_param(op)
        if name is None:
            return None
        if name not in self.param_values:
            raise FabricError(f"a fabric DSD's colour is the parameter '{name}', which the program does not declare")
        return self.param_values[name]

    def _check_queue(self, reg: FabDsd, idx: np.ndarray, kind: str) -> None:
        """With queues bound (a WSE-3), a fabric DSD reads or writes its queue, which each element running the op
        must have bound to the DSD's colour; an element that has not faults, naming it, the queue and both colours."""
        if reg.param is not None and (reg.param[idx] != reg.colour).any():
            e = int(idx[reg.param[idx] != reg.colour][0])
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}) runs @{kind} on a fabric DSD whose colour parameter is "
                f"{int(reg.param[e])} there, where the op's colour is {reg.colour}"
            )
        if not self.queue_binding:
            return
        bound = self.queue_binding.get((reg.inbound, reg.queue))
        side = "input" if reg.inbound else "output"
        if bound is None:
            raise FabricError(f"@{kind} uses {side} queue {reg.queue}, which no @initialize_queue binds")
        wrong = bound[idx] != reg.colour
        if wrong.any():
            e = int(idx[wrong][0])
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}) runs @{kind} on colour {reg.colour} through {side} queue "
                f"{reg.queue}, which it binds to colour {int(bound[e])}"
            )

    def _fast_dsd(self, at: int, function: Callable[..., np.ndarray], operands: list[SSAValue]) -> Any:
        """For a DSD op with a fabric operand (a line reduction's step, a broadcast's receive): a shorter way
        through `_dsd` for the common case (every element of the group can go, with the same length and the same
        addresses, at most one fabric input read from one place in each queue, a fabric result to one receiver
        each). It returns None where the case is not that one (the caller then takes `_dsd`, which makes every
        check); the effects, cycles and wavelets are `_dsd`'s."""
        regs = [self.regs.get(v) for v in operands]
        target = regs[0]
        if not isinstance(target, MemDsd | FabDsd):
            return None
        if isinstance(target, FabDsd) and target.inbound:
            return None
        sources = []  # (kind, ...) per operand after the first
        inbound = None
        for reg in regs[1:]:
            if isinstance(reg, FabDsd):
                if not reg.inbound or inbound is not None:
                    return None
                inbound = reg.colour
                sources.append(("fabric", reg.colour))
            elif isinstance(reg, MemDsd):
                sources.append(("memory", reg))
            elif isinstance(reg, np.ndarray):
                sources.append(("scalar", reg))
            else:
                return None
        if inbound is None and isinstance(target, MemDsd):
            return None  # no fabric operand: not a waiting op
        n = self.n
        first_operand = operands[0]

        def run(idx: np.ndarray) -> int | None:
            if self._retrying:
                return None
            lengths = self._length(first_operand, idx)
            if isinstance(lengths, int):
                length = lengths
            else:
                length = int(lengths[0])
                if not (lengths == length).all():
                    return None
            rows = slice(None) if idx.size == n else idx

            def span_of(reg: MemDsd, words: int) -> slice | None:
                if reg.static is not None:
                    offset, _, stride = reg.static
                    last = offset + stride * (length - 1)
                    if stride <= 0 or offset < 0 or last >= words:
                        return None
                    return slice(offset, last + 1, stride)
                offsets, strides = reg.offset[rows], reg.stride[rows]
                offset, stride = int(offsets[0]), int(strides[0])
                last = offset + stride * (length - 1)
                if stride <= 0 or offset < 0 or last >= words or (offsets != offset).any() or (strides != stride).any():
                    return None
                return slice(offset, last + 1, stride)

            if inbound is not None:
                count = self.queue_len[inbound]
                has = count[rows] >= length
                if not has.all():
                    if has.any():
                        return None
                    self.park_colour[rows] = inbound  # none can go: all wait for wavelets
                    self.park_need[rows] = length
                    self.receiving[rows] = inbound
                    return at
                head = self.queue_head[inbound]
                heads = head[rows]
                first = int(heads[0])
                if first + length > self.capacity[inbound] or not (heads == first).all():
                    return None
            if isinstance(target, FabDsd):
                single = self._single.get(target.colour)
                if single is None or self._shared[target.colour] or not self._route_ok[target.colour][rows].all():
                    return None
                receivers = single[rows]
                out_count, out_head = self.queue_len[target.colour], self.queue_head[target.colour]
                starts = out_head[receivers] + out_count[receivers]
                start = int(starts[0])
                if start + length > self.capacity[target.colour] or not (starts == start).all():
                    return None
                if not self.room(receivers, target.colour, length).all():
                    return None  # a receiver's queue is full: `_dsd` makes the sender wait
            values = []
            arrived = None
            for source, what in sources:
                if source == "fabric":
                    values.append(self.queue[inbound][first : first + length, rows])
                    times = self.queue_time[inbound][first : first + length, rows]
                    arrived = times.max(axis=0).astype(np.float64) + self.epoch
                elif source == "memory":
                    array = self.memory[what.array]
                    span = span_of(what, array.shape[0])
                    if span is None:
                        return None
                    values.append(array[span, rows])
                else:
                    values.append(what[rows][None, :])
            if isinstance(target, MemDsd):
                array = self.memory[target.array]
                span = span_of(target, array.shape[0])
                if span is None:
                    return None
            # every check made: the op runs
            if inbound is not None:
                self.receiving[rows] = -1
                left = count[rows] - length
                count[rows] = left
                head[rows] = np.where(left == 0, 0, (first + length) % self.capacity[inbound])
            result = function(*values)
            clock = self.clock
            ended = clock[rows] + CYCLES["dsd_element"] * length
            if arrived is not None:
                ended = np.maximum(ended, arrived + 1)
            if isinstance(target, FabDsd):  # a message longer than the room: sent as the receiver takes it
                ended = np.maximum(ended, self.streamed_end(receivers, target.colour, length))
            clock[rows] = ended
            size = idx.size
            if isinstance(target, FabDsd):
                colour = target.colour
                self._check_bound(receivers, colour)
                self.queue[colour][start : start + length, receivers] = np.broadcast_to(result, (length, size))
                self.queue_time[colour][start : start + length, receivers] = (
                    ended + self._hops_single[colour][rows] * CYCLES["hop"] - self.epoch
                )[None, :]
                out_count[receivers] += length
                self.wavelets += size * length
                self._wake(receivers, colour)
            else:
                array[span, rows] = np.broadcast_to(result, (length, size))
            return at + 1

        return run

    def _length(self, value: SSAValue, idx: np.ndarray) -> np.ndarray | int:
        reg = self.regs[value]
        if reg.static is not None:
            return reg.static[1] if isinstance(reg, MemDsd) else reg.static
        return reg.length[idx] if isinstance(reg, MemDsd) else reg.extent[idx]

    def _dsd(
        self, idx: np.ndarray, at: int, kind: str, function: Callable[..., np.ndarray], operands: list[SSAValue]
    ) -> np.ndarray:
        lengths = self._length(operands[0], idx)
        if isinstance(lengths, int):
            length = lengths
        elif (lengths != lengths[0]).any():
            out = np.empty(idx.size, dtype=np.int64)
            for length in np.unique(lengths):
                part = lengths == length
                out[part] = self._dsd(idx[part], at, kind, function, operands)
            return out
        else:
            length = int(lengths[0])
        ready = np.ones(idx.size, dtype=bool)
        park = None  # the colour each waiting element waits for (-2: it waits to send)
        for value in operands[1:]:
            reg = self.regs.get(value)
            if isinstance(reg, FabDsd):
                if not reg.inbound:
                    raise FabricError(f"@{kind} reads a fabric output DSD")
                has = self.queue_len[reg.colour][idx] >= length
                if not has.all():
                    self._note_wait(idx[~has], reg.colour, kind, "waits for wavelets that do not come")
                    if park is None:
                        park = np.full(idx.size, -2, dtype=np.int64)
                    park[~has] = reg.colour
                    ready &= has
        if park is not None:  # a receiver waiting for its wavelets takes a longer message as it comes
            self.receiving[idx] = np.where(park >= 0, park, -1)
        if park is not None and not self._retrying and not ready.any():  # none can go: all wait (set aside)
            self.park_colour[idx] = park
            self.park_need[idx] = length
            return at
        target = self.regs[operands[0]]
        sending = isinstance(target, FabDsd)
        if sending:
            if target.inbound:
                raise FabricError(f"@{kind} writes a fabric input DSD")
            ready &= self._can_send(idx, target.colour, length, kind, ready)
        if not ready.all():
            waiting = ~ready
            self.park_colour[idx[waiting]] = park[waiting] if park is not None else -2
            self.park_need[idx[waiting]] = length
            go = idx[ready]
        else:
            go = idx
        if go.size == 0:
            return at
        self.receiving[go] = -1
        # one element per cycle from the element's clock; a fabric operand's wavelets stream in as they arrive (the
        # op ends no earlier than one cycle after its last wavelet), and a fabric result streams out as it is made
        self._arrived = np.full(go.size, -np.inf)
        values = []
        for value in operands[1:]:
            values.append(self._read(value, go, length))
        result = function(*values)
        self.clock[go] = np.maximum(self.clock[go] + CYCLES["dsd_element"] * length, self._arrived + 1)
        if sending:
            self._send(go, target.colour, np.broadcast_to(result, (length, go.size)).astype(np.float32))
        else:
            self._write(operands[0], go, np.broadcast_to(result, (length, go.size)), kind)
        return at + 1 if go is idx else np.where(ready, at + 1, at)

    def _note_wait(self, idx: np.ndarray, colour: int, op: str, why: str) -> None:
        if idx.size:
            e = int(idx[0])
            self.waiting[e] = Blocked(e, colour, op, why)

    def _read(self, value: SSAValue, idx: np.ndarray, length: int) -> np.ndarray:
        """A source operand's values on each element of `idx`: [length, elements] (a scalar as [1, elements])."""
        reg = self.regs.get(value)
        if isinstance(reg, MemDsd):
            return self._read_memory(reg, idx, length)
        if isinstance(reg, FabDsd):
            return self._receive(reg, idx, length)
        return reg[idx][None, :]
