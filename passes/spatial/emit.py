"""The emitter the spatial lane's element code and layout are written with: `Emit` appends (or inserts before a
matched op) the `arith`, `memref`, `scf` and `csl` ops of a block, with the few shapes the code is made of (DSDs over
an array, fabric DSDs on a colour, counted loops, branches), and the two helpers over a line of the grid that the
reductions and their routes share (`segment_bounds`, `route`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import arith, csl, memref, scf
from xdsl.dialects.builtin import AffineMapAttr, FloatAttr, IndexType, IntegerAttr, IntegerType, f32, i16, i32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.ir.affine import AffineMap

from logos_ir.dialects import csl_ext

INDEX = IndexType()
U16 = IntegerType(16, csl.Signedness.UNSIGNED)  # a run-time DSD length (the SDK's `extent` is a u16)


@dataclass(frozen=True)
class RunLength:
    """A DSD length known only at run time (`value`, a u16), at most `bound`: the DSD is built with the bound, known
    at compile time, and `@set_dsd_length` sets the run-time length. With `top` (the program's top level), a fabric
    DSD is built there once per colour and direction (`fabrics`), a compile-time constant as csl-examples declare
    theirs, and each use sets its length."""

    value: SSAValue
    bound: int
    top: Emit | None = None
    fabrics: dict[tuple[int, bool], SSAValue] = field(default_factory=dict)


class Emit:
    """Appends ops to a block, with the small helpers the element code is made of."""

    def __init__(self, block: Block, before: Operation | None = None):
        self.block = block
        self.before = before  # the op the new ops go in front of (a pattern's matched op); None: the block's end

    def op(self, op: Operation) -> Operation:
        if self.before is None:
            self.block.add_op(op)
        else:
            self.block.insert_op_before(op, self.before)
        return op

    def int(self, value: int, type: IntegerType = i32) -> SSAValue:
        return self.op(arith.ConstantOp(IntegerAttr(value, type))).results[0]

    def float(self, value: float) -> SSAValue:
        return self.op(arith.ConstantOp(FloatAttr(value, f32))).results[0]

    def bin(self, kind: type[Operation], a: SSAValue, b: SSAValue) -> SSAValue:
        return self.op(kind(a, b)).results[0]  # type: ignore[call-arg]

    def cmp(self, a: SSAValue, b: SSAValue, predicate: str) -> SSAValue:
        return self.op(arith.CmpiOp(a, b, predicate)).results[0]

    def cast(self, value: SSAValue, type: Any) -> SSAValue:
        return self.op(arith.IndexCastOp(value, type)).results[0]

    def load(self, array: SSAValue, at: SSAValue) -> SSAValue:
        return self.op(memref.LoadOp.get(array, [self.cast(at, INDEX)])).results[0]

    def store(self, value: SSAValue, array: SSAValue, at: SSAValue) -> None:
        self.op(memref.StoreOp.get(value, array, [self.cast(at, INDEX)]))

    def math(self, module: SSAValue, name: str, *args: SSAValue) -> SSAValue:
        return self.op(csl.MemberCallOp(name, f32, module, list(args))).results[0]

    def dsd(self, array: SSAValue, length: int | RunLength, offset: int = 0, stride: int = 1) -> SSAValue:
        """A mem1d DSD over array[offset + stride * i] for i < length: a compile-time length (a literal: the SDK's
        `tensor_access` takes only lengths known at compile time), or, for a length known at run time (`RunLength`),
        a DSD of its bound with `@set_dsd_length` to the run-time u16 length."""
        access = AffineMap.from_callable(lambda i: (i * stride + offset,))
        size = self.int(length.bound if isinstance(length, RunLength) else length, i16)
        dsd = self.op(
            csl.GetMemDsdOp.build(
                operands=[array, [size]],
                result_types=[csl.DsdType(csl.DsdKind.mem1d_dsd)],
                properties={"tensor_access": AffineMapAttr(access)},
            )
        ).results[0]
        return self.set_length(dsd, length)

    def u16(self, value: int) -> SSAValue:
        """`@as(u16, value)`: a length passed to a function whose argument is a DSD's run-time length."""
        return self.op(csl.SignednessCastOp(self.int(value, i16), U16)).results[0]

    def set_length(self, dsd: SSAValue, length: int | RunLength) -> SSAValue:
        if not isinstance(length, RunLength):
            return dsd
        return self.op(csl.SetDsdLengthOp(operands=[dsd, length.value], result_types=[dsd.type])).results[0]

    def moved(self, dsd: SSAValue, by: SSAValue, element: Any = f32) -> SSAValue:
        """The DSD moved on by `by` (an i32 value) elements: `@increment_dsd_offset`."""
        offset = self.op(arith.TruncIOp(by, i16)).results[0]
        return self.op(
            csl.IncrementDsdOffsetOp.build(
                operands=[dsd, offset],
                result_types=[csl.DsdType(csl.DsdKind.mem1d_dsd)],
                properties={"elem_type": element},
            )
        ).results[0]

    def fabric(self, colour: int, extent: int | RunLength, inbound: bool) -> SSAValue:
        """A fabric DSD of `extent` wavelets on `colour` (a compile-time u16 extent; a `RunLength`'s bound with
        `@set_dsd_length`), on input queue 2 or output queue 3 (as csl-examples' gemv tutorials; on WSE-3,
        `queues.bind_queues` gives each colour its own)."""
        if isinstance(extent, RunLength) and extent.top is not None:
            key = (colour, inbound)
            if key not in extent.fabrics:
                extent.fabrics[key] = extent.top.fabric(colour, extent.bound, inbound)
            return self.set_length(extent.fabrics[key], extent)
        kind = csl.DsdKind.fabin_dsd if inbound else csl.DsdKind.fabout_dsd
        size = self.int(extent.bound if isinstance(extent, RunLength) else extent, i16)
        queue = 2 if inbound else 3
        dsd = self.op(
            csl.GetFabDsdOp.build(
                operands=[[size]],
                result_types=[csl.DsdType(kind)],
                properties={
                    "fabric_color": IntegerAttr(colour, IntegerType(5, csl.Signedness.UNSIGNED)),
                    "queue_id": IntegerAttr(queue, IntegerType(3)),
                },
            )
        ).results[0]
        return self.set_length(dsd, extent)

    def dsd_op(self, kind: type[csl.BuiltinDsdOp], *operands: SSAValue) -> None:
        self.op(kind(operands=[list(operands)]))

    @contextmanager
    def loop(
        self, count: int | SSAValue, iters: Sequence[SSAValue] = ()
    ) -> Iterator[tuple[Emit, SSAValue, list[SSAValue], list[SSAValue]]]:
        """`for (@range(i32, 0, count, 1)) |i|`; yields (body emitter, i, the iteration values, the list to fill with
        the values the body yields); the loop's results are set on the list after the block."""
        lower, step = self.int(0), self.int(1)
        upper = count if isinstance(count, SSAValue) else self.int(count)
        block = Block(arg_types=[i32, *(v.type for v in iters)])
        body = Emit(block)
        yielded: list[SSAValue] = []
        yield body, block.args[0], list(block.args[1:]), yielded
        body.op(scf.YieldOp(*yielded))
        loop = self.op(scf.ForOp(lower, upper, step, list(iters), block))
        yielded[:] = list(loop.results)

    @contextmanager
    def loop_i16(self, count: SSAValue) -> Iterator[tuple[Emit, SSAValue]]:
        """`for (@range(i16, 0, count, 1)) |i|` in a layout."""
        lower, upper, step = self.int(0, i16), count, self.int(1, i16)
        block = Block(arg_types=[i16])
        body = Emit(block)
        yield body, block.args[0]
        body.op(scf.YieldOp())
        self.op(scf.ForOp(lower, upper, step, [], block))

    @contextmanager
    def when(self, condition: SSAValue) -> Iterator[Emit]:
        then = Block()
        body = Emit(then)
        yield body
        body.op(scf.YieldOp())
        self.op(scf.IfOp(condition, [], Region(then), Region(Block([scf.YieldOp()]))))

    def branch(self, condition: SSAValue) -> tuple[Emit, Emit, Operation]:
        then, other = Block(), Block()
        return Emit(then), Emit(other), scf.IfOp(condition, [], Region(then), Region(other))

    def end_branch(self, then: Emit, other: Emit, op: Operation) -> None:
        then.op(scf.YieldOp())
        other.op(scf.YieldOp())
        self.op(op)


def route(e: Emit, x: SSAValue, y: SSAValue, colour: int, rx: Sequence[str], tx: Sequence[str]) -> None:
    e.op(csl_ext.SetColorConfigOp(x, y, colour, rx, tx))


def segment_bounds(e: Emit, k: SSAValue, length: int, p: int, type_: IntegerType) -> tuple[SSAValue, ...]:
    """(segment, its first element, its last, its centre) of the element at `k` of a line (grid.segments); constants
    when the line is one segment."""
    if length >= p:
        return e.int(0, type_), e.int(0, type_), e.int(p - 1, type_), e.int((p - 1) // 2, type_)
    q = e.bin(arith.DivSIOp, k, e.int(length, type_))
    first = e.bin(arith.MuliOp, q, e.int(length, type_))
    bound = e.bin(arith.AddiOp, first, e.int(length - 1, type_))
    end = e.int(p - 1, type_)
    last = e.op(arith.SelectOp(e.cmp(bound, end, "slt"), bound, end)).results[0]
    mid = e.bin(arith.DivSIOp, e.bin(arith.AddiOp, first, last), e.int(2, type_))
    return q, first, last, mid
