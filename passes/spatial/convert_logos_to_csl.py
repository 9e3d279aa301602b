"""`convert-logos-to-csl`: a decode step's parts (the embedding, each layer, the head), as their LOGOS programs say,
lowered to one CSL program for a P x P grid (the whole-grid mapping of `passes/spatial/grid.py`) and its layout.

Assumes: the parts of one decode step on one chip, each extracted by `cut-extract` (so each is exactly what the
author wrote for it). Guarantees: a module of two `csl.module`s, the layout (`@set_rectangle`, `@set_tile_code` for
each element with its coordinates and memcpy parameters, every router's colour configuration) and the element
program (its arrays, one function per part: `embedding`, `layer` (every layer runs the one function, the layer's
arrays found by its index), `head`; the local tasks that run them in turn; the exported `step` the host launches),
printable by xDSL's CSL printer and executable by the fabric simulator (`logos_ir/runtime/spatial.py`). Each logos op
becomes the element code of its part: `logos.linear` a tile's multiply-accumulate (`@fmacs`, `@fmachs` for f16
weights) and a reduction on the fabric; `logos.rms_norm` a sum of squares reduced along the row; `logos.rope` the
rotation of the element's pairs; `logos.cache_write` a store on the position's column; `logos.attention` scores,
softmax and weighted values over the element's positions, reduced on the fabric; `logos.embed` a row of the table's
tile on its owner row, summed down the column; `logos.argmax` is the host's, over the logits it reads back.
The layers' programs must lower to the same code (they do: the author writes them alike); a part the lane does not
lower is refused with the op's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xdsl.context import Context
from xdsl.dialects import arith, csl, func, memref, scf
from xdsl.dialects.builtin import (
    AffineMapAttr,
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    f16,
    f32,
    i16,
    i32,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.ir.affine import AffineMap
from xdsl.passes import ModulePass

from logos_ir.dialects import csl_ext, logos
from logos_ir.errors import CutError, PassError
from logos_ir.identity import identity
from logos_ir.passes.extract_parts import ExtractParts
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.verify_identity import VerifyIdentity
from logos_ir.program import Cut, Identity

PASS = "convert-logos-to-csl"
INDEX = IndexType()


# -- emitting ops ------------------------------------------------------------------------------------------------


class Emit:
    """Appends ops to a block, with the small helpers the element code is made of."""

    def __init__(self, block: Block):
        self.block = block

    def op(self, op: Operation) -> Operation:
        self.block.add_op(op)
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

    def dsd(self, array: SSAValue, length: int | SSAValue, offset: int = 0, stride: int = 1) -> SSAValue:
        """A mem1d DSD over array[offset + stride * i] for i < length."""
        access = AffineMap.from_callable(lambda i: (i * stride + offset,))
        size = length if isinstance(length, SSAValue) else self.int(length, i16)
        return self.op(
            csl.GetMemDsdOp.build(
                operands=[array, [size]],
                result_types=[csl.DsdType(csl.DsdKind.mem1d_dsd)],
                properties={"tensor_access": AffineMapAttr(access)},
            )
        ).results[0]

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

    def fabric(self, colour: int, extent: int | SSAValue, inbound: bool) -> SSAValue:
        kind = csl.DsdKind.fabin_dsd if inbound else csl.DsdKind.fabout_dsd
        size = extent if isinstance(extent, SSAValue) else self.int(extent, i16)
        queue = 2 if inbound else 3
        return self.op(
            csl.GetFabDsdOp.build(
                operands=[[size]],
                result_types=[csl.DsdType(kind)],
                properties={
                    "fabric_color": IntegerAttr(colour, IntegerType(5, csl.Signedness.UNSIGNED)),
                    "queue_id": IntegerAttr(queue, IntegerType(3)),
                },
            )
        ).results[0]

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


# -- values on the grid ------------------------------------------------------------------------------------------


@dataclass
class Vec:
    """A vector on the grid: its layout (`col`: element (x, y) holds chunk x; `row`: chunk y), its true length,
    its chunk and the array that holds the element's chunk."""

    layout: str
    length: int
    chunk: int
    array: str
    order: tuple[int, ...] = ()  # the source index of each padded position (a product taking it maps its columns)


@dataclass
class Program:
    """The element program being built: its top block, the arrays declared (name -> (words, element type)), the
    weights the host loads, the imported modules and the parameters."""

    plan: g.GridPlan
    top: Emit
    arrays: dict[str, tuple[int, Any]] = field(default_factory=dict)
    handles: dict[str, SSAValue] = field(default_factory=dict)
    px: SSAValue | None = None
    py: SSAValue | None = None
    math: SSAValue | None = None
    memcpy: SSAValue | None = None
    functions: list[Operation] = field(default_factory=list)
    reducers: dict[str, Operation] = field(default_factory=dict)
    layer_tensors: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a layer weight's tensor in each layer

    def array(self, name: str, words: int, element: Any = f32) -> None:
        known = self.arrays.get(name)
        if known is not None:
            if known != (words, element):
                raise PassError(f"{PASS}: the array '{name}' is declared twice with different sizes")
            return
        self.arrays[name] = (words, element)

    def get(self, e: Emit, name: str) -> SSAValue:
        words, element = self.arrays[name]
        return e.op(memref.GetGlobalOp(name, MemRefType(element, [words]))).results[0]


# -- one part's element code ---------------------------------------------------------------------------------------


class PartLowering:
    """Lowers the ops of one part's function into element code appended to `e` (see the module docstring)."""

    def __init__(self, program: Program, e: Emit, layer: SSAValue | None, feeds: dict[SSAValue, set[str]]):
        self.program, self.plan, self.e, self.layer = program, program.plan, e, layer
        self.values: dict[SSAValue, Any] = {}
        self.feeds = feeds

    # -- helpers over the grid --

    def coordinate(self, layout: str, e: Emit | None = None) -> SSAValue:
        """px for a reduction along a row, py along a column (as i32, emitted by `e`, the part's emitter if none)."""
        value = self.program.px if layout == "row" else self.program.py
        assert value is not None
        return (e or self.e).op(arith.ExtSIOp(value, i32)).results[0]

    def reduce(
        self,
        e: Emit,
        array: SSAValue,
        n: int,
        along: str,
        combine: type[csl.BuiltinDsdOp],
        broadcast: bool = True,
        segment_only: bool = False,
    ) -> None:
        """Combine each element's `array[0:n]` along its row or column (`reduce_body`; `segment_only`: within its column
        segment only): copied into the line's buffer, reduced by the one function of that kind
        (`reduce_<row|col>_<op>[_to_centre|_local]`), copied back; one function a kind keeps the element's code small
        (with grid.SEGMENTED; inline otherwise)."""
        if not g.SEGMENTED:  # inline: no copies, no call (the code of one segment a line is small)
            assert not segment_only
            self.reduce_body(e, array, e.int(n, i16), along, combine, broadcast)
            return
        words = self.program.arrays[f"line_{along}"][0]
        if n > words:
            raise PassError(f"{PASS}: a reduction of {n} words along a {along} exceeds its line buffer ({words})")
        kind = "_local" if segment_only else ("" if broadcast else "_to_centre")
        name = f"reduce_{along}_{combine.name.removeprefix('csl.')}" + kind
        if name not in self.program.reducers:
            block = Block(arg_types=[i16])
            body = Emit(block)
            line = self.program.get(body, f"line_{along}")
            self.reduce_body(body, line, block.args[0], along, combine, broadcast, segment_only)
            body.op(csl.ReturnOp())
            self.program.reducers[name] = csl.FuncOp(name, FunctionType.from_lists([i16], []), Region(block))
        line = self.arr(f"line_{along}")
        e.dsd_op(csl.FmovsOp, e.dsd(line, n), e.dsd(array, n))
        e.op(csl.CallOp(SymbolRefAttr(name), [e.int(n, i16)]))
        e.dsd_op(csl.FmovsOp, e.dsd(array, n), e.dsd(line, n))

    def reduce_body(
        self,
        e: Emit,
        array: SSAValue,
        n: SSAValue,
        along: str,
        combine: type[csl.BuiltinDsdOp],
        broadcast: bool = True,
        segment_only: bool = False,
    ) -> None:
        """Combine each element's `array[0:n]` along its row (`along="row"`) or column: each segment of the line
        toward its centre from both ends (the end element sends its own; each next one adds what arrives and passes
        it on in one DSD op, the wavelets streaming through: @fadds(out, in, mine); the centre adds both halves);
        then the segments' centres toward the line's centre the same way (the elements between them passing the
        wavelets on); then (`broadcast`) the line's centre sends the total both ways (grid.segments). `segment_only`: a
        column's segments only, each segment's centre then sending its total to its segment (a KV head's rows)."""
        plan = self.plan
        if along == "row":
            near, far, bcast = g.ROW_WEST_CHAIN, g.ROW_EAST_CHAIN, g.ROW_BCAST
            west, east = g.ROW_WEST_CENTRES, g.ROW_EAST_CENTRES
        else:
            near, far, bcast = g.COL_NORTH_CHAIN, g.COL_SOUTH_CHAIN, g.COL_BCAST
            west, east = g.COL_NORTH_CENTRES, g.COL_SOUTH_CENTRES
        length, count, middle = plan.line(along)
        centre = plan.line_centre(along)
        k = self.coordinate(along, e)
        local = e.dsd(array, n)
        q, first, last, mid = _segment(e, k, length, plan.p, i32)
        before, rest, op = e.branch(e.cmp(k, mid, "slt"))
        self._half(before, before.bin(arith.SubiOp, k, first), local, n, near, combine, before.cmp(k, first, "eq"))
        after, here, op2 = rest.branch(rest.cmp(k, mid, "sgt"))
        distance = after.bin(arith.SubiOp, last, k)
        self._half(after, distance, local, n, far, combine, after.cmp(k, last, "eq"))
        self._receive_last(here, here.bin(arith.SubiOp, mid, first), local, n, near, combine)
        self._receive_last(here, here.bin(arith.SubiOp, last, mid), local, n, far, combine)
        rest.end_branch(after, here, op2)
        e.end_branch(before, rest, op)
        if segment_only:
            assert along == "col" and broadcast
            others, source, op3 = e.branch(e.cmp(k, mid, "ne"))
            others.dsd_op(csl.FmovsOp, local, others.fabric(g.COL_SEGMENT_BCAST, n, True))
            with source.when(source.cmp(first, last, "ne")) as sends:  # a segment of one element keeps its own
                sends.dsd_op(csl.FmovsOp, sends.fabric(g.COL_SEGMENT_BCAST, n, False), local)
            e.end_branch(others, source, op3)
            return
        if count > 1:
            with e.when(e.cmp(k, mid, "eq")) as centres:
                westward, other, op4 = centres.branch(centres.cmp(q, centres.int(middle), "slt"))
                self._half(westward, q, local, n, west, combine, westward.cmp(q, westward.int(0), "eq"))
                eastward, line_centre, op5 = other.branch(other.cmp(q, other.int(middle), "sgt"))
                j = eastward.bin(arith.SubiOp, eastward.int(count - 1), q)
                self._half(eastward, j, local, n, east, combine, eastward.cmp(j, eastward.int(0), "eq"))
                if middle > 0:
                    line_centre.dsd_op(combine, local, local, line_centre.fabric(west[(middle - 1) % 2], n, True))
                if middle < count - 1:
                    line_centre.dsd_op(
                        combine, local, local, line_centre.fabric(east[(count - 2 - middle) % 2], n, True)
                    )
                other.end_branch(eastward, line_centre, op5)
                centres.end_branch(westward, other, op4)
        if broadcast:
            others, source, op3 = e.branch(e.cmp(k, e.int(centre), "ne"))
            others.dsd_op(csl.FmovsOp, local, others.fabric(bcast, n, True))
            source.dsd_op(csl.FmovsOp, source.fabric(bcast, n, False), local)
            e.end_branch(others, source, op3)

    def _receive_last(
        self,
        e: Emit,
        distance: SSAValue,
        local: SSAValue,
        n: int | SSAValue,
        chain: tuple[int, int],
        combine: type[csl.BuiltinDsdOp],
    ) -> None:
        """A segment's centre adds what its half at `distance` elements (if any) sends: chain[(distance - 1) % 2]."""
        with e.when(e.cmp(distance, e.int(0), "sgt")) as some:
            odd, even, op = some.branch(some.cmp(some.bin(arith.RemSIOp, distance, some.int(2)), some.int(1), "eq"))
            odd.dsd_op(combine, local, local, odd.fabric(chain[0], n, True))
            even.dsd_op(combine, local, local, even.fabric(chain[1], n, True))
            some.end_branch(odd, even, op)

    def _half(
        self,
        e: Emit,
        distance: SSAValue,
        local: SSAValue,
        n: int | SSAValue,
        chain: tuple[int, int],
        combine: type[csl.BuiltinDsdOp],
        at_end: SSAValue,
    ) -> None:
        """One half-line's chain: `distance` from its end; the end sends on chain[0], the element at distance d > 0
        receives chain[(d - 1) % 2] and sends chain[d % 2]."""
        end, inner, op = e.branch(at_end)
        end.dsd_op(csl.FmovsOp, end.fabric(chain[0], n, False), local)
        odd, even, parity = inner.branch(
            inner.cmp(inner.bin(arith.RemSIOp, distance, inner.int(2)), inner.int(1), "eq")
        )
        odd.dsd_op(combine, odd.fabric(chain[1], n, False), odd.fabric(chain[0], n, True), local)
        even.dsd_op(combine, even.fabric(chain[0], n, False), even.fabric(chain[1], n, True), local)
        inner.end_branch(odd, even, parity)
        e.end_branch(end, inner, op)

    def vec(self, name: str, layout: str, length: int, even: bool = False) -> Vec:
        chunk = self.plan.chunk(length, even)
        self.program.array(name, chunk)
        return Vec(layout, length, chunk, name)

    def arr(self, name: str) -> SSAValue:
        return self.program.get(self.e, name)

    def weight_offset(self, weight: g.Weight) -> SSAValue:
        """Where this layer's tile starts in the weight's array (the layer index times the tile)."""
        size = self.e.int(weight.tile_rows * weight.tile_columns)
        if len(weight.tensors) == 1 or self.layer is None:
            return self.e.int(0)
        return self.e.bin(arith.MuliOp, self.layer, size)

    # -- the ops --

    def lower(self, body: Block) -> Any:
        """The ops of a part's function; its hidden-state argument and result live in the `residual` array (the
        state each part leaves for the next), its position argument in `position_in`."""
        residual = self.vec("residual", "col", self.plan.hidden)
        self.fused, self.fused_later = fused_products(body)
        for op in body.ops:  # weights are names and shapes: known before any product that a group lowers early
            if isinstance(op, logos.WeightOp):
                self.values[op.result] = op
        for arg in body.args:
            shape = arg.type.get_shape()  # type: ignore[attr-defined]
            self.values[arg] = residual if len(shape) == 2 else "position"
        for op in body.ops:
            method = getattr(self, "_" + op.name.removeprefix("logos.").replace("func.", "func_"), None)
            if method is None:
                raise PassError(f"{PASS}: the spatial grid does not lower '{op.name}'")
            result = method(op)
            if result is not None:
                return result
        return None

    def _func_return(self, op: Operation) -> Any:
        result = self.values.get(op.operands[0]) if op.operands else None
        if isinstance(result, Vec) and result.array != "residual":
            e = self.e
            e.dsd_op(
                csl.FmovsOp, e.dsd(self.arr("residual"), result.chunk), e.dsd(self.arr(result.array), result.chunk)
            )
        return result

    def _input(self, op: logos.InputOp) -> None:
        self.values[op.result] = op.kind.data

    def _weight(self, op: logos.WeightOp) -> None:
        self.values[op.result] = op

    def _cache(self, op: logos.CacheOp) -> None:
        self.values[op.result] = op

    def _embed(self, op: logos.EmbedOp) -> None:
        plan, e = self.plan, self.e
        table = self.program_weight(self.values[op.table], "col")
        out = self.vec(_name(op.result), "col", plan.hidden)
        tile_rows = table.tile_rows
        token = e.load(self.arr("token_in"), e.int(0))
        owner = e.bin(arith.DivSIOp, token, e.int(tile_rows))
        row = e.bin(arith.RemSIOp, token, e.int(tile_rows))
        buffer = self.arr(out.array)
        e.dsd_op(csl.FmovsOp, e.dsd(buffer, out.chunk), e.float(0.0))
        py = self.coordinate("col")
        with e.when(e.cmp(py, owner, "eq")) as inner:
            source = inner.moved(inner.dsd(self.arr(table.name), out.chunk, 0, tile_rows), row, self.element_type)
            convert = csl.Fh2sOp if plan.image == "f16" else csl.FmovsOp
            inner.dsd_op(convert, inner.dsd(buffer, out.chunk), source)
        self.reduce(e, buffer, out.chunk, "col", csl.FaddsOp)
        self.values[op.result] = out

    @property
    def element_type(self) -> Any:
        return f16 if self.plan.image == "f16" else f32

    def program_weight(
        self,
        op: logos.WeightOp,
        orient: str,
        row_map: Sequence[int] = (),
        in_chunk: int = 0,
        column_map: Sequence[int] = (),
    ) -> g.Weight:
        """The weight array this op's tensor lives in (shared by every layer's tensor of the same role)."""
        plan = self.plan
        name = _name(op.result)
        tensor = op.tensor.data
        shape = list(op.shape.get_values())
        if len(shape) == 1:
            chunk = plan.chunk(shape[0])
            weight = g.Weight(name, (tensor,), "vector", "col", 1, shape[0], 1, chunk)
            return self.declare(weight, plan_layers=self.layer is not None)
        rows, columns = shape
        padded_rows = len(row_map) if row_map else rows
        kind = "table" if self.layer is None else "matrix"
        tr = plan.chunk(padded_rows, even=bool(row_map))
        tc = in_chunk or plan.chunk(columns)  # a product's tile is as wide as its input's chunk
        weight = g.Weight(name, (tensor,), kind, orient, rows, columns, tr, tc, tuple(row_map), tuple(column_map))
        return self.declare(weight, plan_layers=self.layer is not None)

    def declare(self, weight: g.Weight, plan_layers: bool) -> g.Weight:
        plan = self.plan
        known = plan.weights.get(weight.name)
        if known is None:
            tensors = weight.tensors
            if plan_layers:  # the tensor each layer's program names for this weight
                tensors = self.program.layer_tensors[weight.name]
            weight = g.Weight(**{**weight.__dict__, "tensors": tensors})
            plan.weights[weight.name] = weight
            element = self.element_type if weight.kind != "vector" else f32
            self.program.array(weight.name, weight.words, element)
            return weight
        # the same role (another layer) or the same tensor (a tied head): the same tile
        same = (known.tile_rows, known.tile_columns, known.orient, known.column_map) == (
            weight.tile_rows,
            weight.tile_columns,
            weight.orient,
            weight.column_map,
        )
        if not same:
            raise PassError(f"{PASS}: the weight '{weight.name}' is tiled two ways")
        return known

    def _rms_norm(self, op: logos.RMSNormOp) -> None:
        e = self.e
        x: Vec = self.values[op.input]
        weight = self.program_weight(self.values[op.weight], "col")
        out = self.vec(_name(op.result), x.layout, x.length)
        source, target = self.arr(x.array), self.arr(out.array)
        with e.loop(x.chunk, [e.float(0.0)]) as (body, j, (total,), yielded):
            v = body.load(source, j)
            yielded.append(body.op(arith.AddfOp(total, body.op(arith.MulfOp(v, v)).results[0])).results[0])
        squares = self.arr("norm_sum")
        e.store(yielded[0], squares, e.int(0))
        self.reduce(e, squares, 1, "row" if x.layout == "col" else "col", csl.FaddsOp)
        mean = e.op(arith.MulfOp(e.load(squares, e.int(0)), e.float(1.0 / x.length))).results[0]
        root = e.math(
            self.program.math, "sqrt_f32", e.op(arith.AddfOp(mean, e.float(op.epsilon.value.data))).results[0]
        )
        scale = e.op(arith.DivfOp(e.float(1.0), root)).results[0]
        e.dsd_op(csl.FmulsOp, e.dsd(target, x.chunk), e.dsd(source, x.chunk), scale)
        w = e.moved(e.dsd(self.arr(weight.name), x.chunk), self.weight_offset(weight))
        e.dsd_op(csl.FmulsOp, e.dsd(target, x.chunk), e.dsd(target, x.chunk), w)
        self.values[op.result] = out

    def _linear(self, op: logos.LinearOp) -> None:
        """A product: each element multiplies its tile by its input chunk, then the partial sums are reduced along
        the line. Products of one input written one after another (q, k and v; gate and up) are reduced together,
        as one message: each element's partial sums side by side in one array, then copied to each product's."""
        if op in self.fused_later:
            return
        group = self.fused.get(op, [op])
        e = self.e
        x: Vec = self.values[op.input]
        along = "row" if x.layout == "col" else "col"
        if len(group) == 1:
            out, acc = self._product(op, None, 0)
            final = any(isinstance(use.operation, logos.ArgmaxOp) for use in op.result.uses)
            self.reduce(e, acc, out.chunk, along, csl.FaddsOp, broadcast=not final)
            return
        chunks = [self._product_plan(member)[1].tile_rows for member in group]
        name = "sums_" + "_".join(_name(member.result) for member in group)
        self.program.array(name, sum(chunks))
        fused = self.arr(name)
        offsets = [sum(chunks[:i]) for i in range(len(group))]
        outs = [self._product(member, fused, at)[0] for member, at in zip(group, offsets, strict=True)]
        self.reduce(e, fused, sum(chunks), along, csl.FaddsOp)
        for out, at in zip(outs, offsets, strict=True):
            e.dsd_op(csl.FmovsOp, e.dsd(self.arr(out.array), out.chunk), e.dsd(fused, out.chunk, at))

    def _product_plan(self, op: logos.LinearOp) -> tuple[list[int], g.Weight]:
        plan = self.plan
        x: Vec = self.values[op.input]
        roles = self.feeds.get(op.result, set())
        out_rows = op.weight.type.get_shape()[0]  # type: ignore[attr-defined]
        row_map: list[int] = []
        if "query" in roles:  # laid out to meet the narrow cache: the group's query heads at the row's KV features
            row_map = g.query_rows(plan)
        elif "cache" in roles:  # KV heads kept narrow, rotary pairs adjacent
            if out_rows != plan.kv_heads * plan.head_dim:
                raise PassError(f"{PASS}: a cached projection of {out_rows} rows, not KV heads x head_dim")
            row_map = g.kv_rows(plan)
        elif "rope" in roles:
            raise PassError(f"{PASS}: the grid rotates only attention's query and the cached keys")
        weight = self.program_weight(self.values[op.weight], x.layout, row_map, x.chunk, x.order)
        return row_map, weight

    def _product(self, op: logos.LinearOp, into: SSAValue | None, at: int) -> tuple[Vec, SSAValue]:
        """The element's tile times its input chunk, accumulated into `into[at:]` (or the product's own array)."""
        plan, e = self.plan, self.e
        x: Vec = self.values[op.input]
        row_map, weight = self._product_plan(op)
        out_layout = "row" if x.layout == "col" else "col"
        length = len(row_map) if row_map else op.weight.type.get_shape()[0]  # type: ignore[attr-defined]
        out = Vec(out_layout, length, weight.tile_rows, _name(op.result), tuple(row_map))
        self.program.array(out.array, out.chunk)
        tile_rows = weight.tile_rows
        acc, source = (into, at) if into is not None else (self.arr(out.array), 0)
        e.dsd_op(csl.FmovsOp, e.dsd(acc, tile_rows, source), e.float(0.0))
        source_array = self.arr(x.array)
        base = self.weight_offset(weight)
        w = self.arr(weight.name)
        if plan.image == "f16":
            half = self.arr(f"{x.array}_f16") if self._declare_half(x) else source_array
            e.dsd_op(csl.Fs2hOp, e.dsd(half, x.chunk), e.dsd(source_array, x.chunk))
            source_array = half
        with e.loop(x.chunk) as (body, j, _, _y):
            scalar = body.load(source_array, j)
            offset = body.bin(arith.AddiOp, base, body.bin(arith.MuliOp, j, body.int(tile_rows)))
            column = body.moved(body.dsd(w, tile_rows), offset, self.element_type)
            mac = csl.FmachsOp if plan.image == "f16" else csl.FmacsOp
            body.dsd_op(mac, body.dsd(acc, tile_rows, source), body.dsd(acc, tile_rows, source), column, scalar)
        self.values[op.result] = out
        return out, acc

    def _declare_half(self, x: Vec) -> bool:
        self.program.array(f"{x.array}_f16", x.chunk, f16)
        return True

    def _rope(self, op: logos.RopeOp) -> None:
        e = self.e
        x: Vec = self.values[op.input]
        table = f"inv_freq_{x.chunk}"
        self.program.array(table, x.chunk // 2)
        self.program.handles.setdefault("rope_tables", {})[table] = x.chunk  # type: ignore[index]
        position = e.bin(arith.SubiOp, e.load(self.arr("position_in"), e.int(0)), e.int(1))
        angle_base = e.op(arith.SIToFPOp(position, f32)).results[0]
        data, freq = self.arr(x.array), self.arr(table)
        pairs = x.chunk // 2
        if self.layer is not None:  # the angles are the position's in every layer: layer 0 turns them into cos, sin
            self.program.array(f"rope_cos_{x.chunk}", pairs)
            self.program.array(f"rope_sin_{x.chunk}", pairs)
            cosines, sines = self.arr(f"rope_cos_{x.chunk}"), self.arr(f"rope_sin_{x.chunk}")
            with e.when(e.cmp(self.layer, e.int(0), "eq")) as first_layer:
                with first_layer.loop(pairs) as (body, i, _, _y):
                    angle = body.op(arith.MulfOp(angle_base, body.load(freq, i))).results[0]
                    body.store(body.math(self.program.math, "cos_f32", angle), cosines, i)
                    body.store(body.math(self.program.math, "sin_f32", angle), sines, i)
        with e.loop(pairs) as (body, i, _, _y):
            if self.layer is not None:
                cos, sin = body.load(cosines, i), body.load(sines, i)
            else:
                angle = body.op(arith.MulfOp(angle_base, body.load(freq, i))).results[0]
                cos = body.math(self.program.math, "cos_f32", angle)
                sin = body.math(self.program.math, "sin_f32", angle)
            even = body.bin(arith.MuliOp, i, body.int(2))
            odd = body.bin(arith.AddiOp, even, body.int(1))
            a, b = body.load(data, even), body.load(data, odd)
            first = body.op(
                arith.SubfOp(body.op(arith.MulfOp(a, cos)).results[0], body.op(arith.MulfOp(b, sin)).results[0])
            ).results[0]
            second = body.op(
                arith.AddfOp(body.op(arith.MulfOp(a, sin)).results[0], body.op(arith.MulfOp(b, cos)).results[0])
            ).results[0]
            body.store(first, data, even)
            body.store(second, data, odd)
        self.values[op.result] = x  # rotated in place

    def cache_array(self, cache: logos.CacheOp, chunk: int) -> str:
        name = f"{cache.kind.data}_cache"
        words = self.plan.layers * self.plan.slots * chunk
        self.program.array(name, words, self.element_type)
        return name

    def _cache_write(self, op: logos.CacheWriteOp) -> None:
        plan, e = self.plan, self.e
        x: Vec = self.values[op.input]
        name = self.cache_array(self.values[op.cache], x.chunk)
        position = e.bin(arith.SubiOp, e.load(self.arr("position_in"), e.int(0)), e.int(1))
        column = e.bin(arith.RemSIOp, position, e.int(plan.p))
        slot = e.bin(arith.DivSIOp, position, e.int(plan.p))
        px = self.coordinate("row")
        with e.when(e.cmp(px, column, "eq")) as inner:
            layer = self.layer if self.layer is not None else inner.int(0)
            at = inner.bin(
                arith.MuliOp,
                inner.bin(arith.AddiOp, inner.bin(arith.MuliOp, layer, inner.int(plan.slots)), slot),
                inner.int(x.chunk),
            )
            target = inner.moved(inner.dsd(self.arr(name), x.chunk), at, self.element_type)
            convert = csl.Fs2hOp if plan.image == "f16" else csl.FmovsOp
            inner.dsd_op(convert, target, inner.dsd(self.arr(x.array), x.chunk))

    def _attention(self, op: logos.AttentionOp) -> None:
        """Attention over the element's positions with KV heads kept narrow: row y caches KV features
        [y * kv_chunk, (y + 1) * kv_chunk) and holds the query features of every head of their group at those
        dimensions (`grid.query_rows`), so each query head of a group reads the same cached K/V tile."""
        plan, e = self.plan, self.e
        q: Vec = self.values[op.query]
        c, group = plan.kv_chunk, plan.group
        keys = self.arr(self.cache_array(self.values[op.keys], c))
        values = self.arr(self.cache_array(self.values[op.values], c))
        heads, slots, chunk, p = plan.heads, plan.slots, q.chunk, plan.p
        window = plan.window  # the heads whose queries the element holds
        # the scores the element keeps: its window's heads (reduced within its KV head's column segment) or every
        # head's (reduced down the whole column) when a row's features straddle KV heads
        kept = window if plan.scores_local else heads
        self.program.array("scores", kept * slots)
        self.program.array("head_max", window)
        scores, high = self.arr("scores"), self.arr("head_max")
        out = Vec("row", q.length, chunk, _name(op.result), q.order)
        self.program.array(out.array, chunk)
        attended, query = self.arr(out.array), self.arr(q.array)
        position = e.bin(arith.SubiOp, e.load(self.arr("position_in"), e.int(0)), e.int(1))
        px, py = self.coordinate("row"), self.coordinate("col")
        layer = self.layer if self.layer is not None else e.int(0)
        base = e.bin(arith.MuliOp, layer, e.int(slots * c))
        first_kv = e.bin(arith.MuliOp, py, e.int(c))
        h0 = e.bin(arith.MuliOp, e.bin(arith.DivSIOp, first_kv, e.int(plan.head_dim)), e.int(group))
        highest = e.int(heads - window)
        h0 = e.op(arith.SelectOp(e.cmp(h0, highest, "slt"), h0, highest)).results[0]
        kept_from = h0 if plan.scores_local else e.int(0)  # the head of the scores' first row
        e.dsd_op(csl.FmovsOp, e.dsd(scores, kept * slots), e.float(0.0))
        # partial scores: each of my query features r (head m of the group, KV feature t) adds q[r] * k[., t] over my
        # positions to its head's scores
        with e.loop(chunk) as (body, r, _, _y):
            head = body.bin(arith.SubiOp, self._head_of(body, first_kv, r), kept_from)
            row = body.moved(body.dsd(scores, slots), body.bin(arith.MuliOp, head, body.int(slots)))
            t = body.bin(arith.RemSIOp, r, body.int(c))
            column = body.moved(body.dsd(keys, slots, 0, c), body.bin(arith.AddiOp, base, t), self.element_type)
            value = body.load(query, r)
            if self.plan.image == "f16":
                body.dsd_op(csl.FmachsOp, row, row, column, body.op(arith.TruncFOp(value, f16)).results[0])
            else:
                body.dsd_op(csl.FmacsOp, row, row, column, value)
        self.reduce(e, scores, kept * slots, "col", csl.FaddsOp, segment_only=plan.scores_local)
        e.dsd_op(
            csl.FmulsOp,
            e.dsd(scores, kept * slots),
            e.dsd(scores, kept * slots),
            e.float(1.0 / math.sqrt(plan.head_dim)),
        )
        # softmax for my heads (a window of `window` heads from h0; my row's elements share it): my positions after
        # the current one masked, each head's maximum over mine, then along the row
        rows_from = e.bin(arith.MuliOp, e.bin(arith.SubiOp, h0, kept_from), e.int(slots))
        e.dsd_op(csl.FmovsOp, e.dsd(high, window), e.float(-3.0e38))
        with e.loop(slots) as (outer, s, _, _y):
            t = outer.bin(arith.AddiOp, outer.bin(arith.MuliOp, s, outer.int(p)), px)
            later = outer.cmp(t, position, "sgt")
            with outer.when(later) as masked:
                masked.dsd_op(csl.FmovsOp, masked.moved(masked.dsd(scores, kept, 0, slots), s), masked.float(-3.0e38))
            mine = outer.moved(outer.dsd(scores, window, 0, slots), outer.bin(arith.AddiOp, rows_from, s))
            outer.dsd_op(csl.FmaxsOp, outer.dsd(high, window), outer.dsd(high, window), mine)
        self.reduce(e, high, window, "row", csl.FmaxsOp)
        # exp(score - max); my features' weighted values and each head's sum of weights, side by side in one array,
        # summed along the row as one message; then each value divided by its head's sum
        self.program.array("attention_sums", chunk + window)
        sums = self.arr("attention_sums")
        e.dsd_op(csl.FmovsOp, e.dsd(sums, chunk + window), e.float(0.0))
        if plan.scores_local:
            self._shared_exponentials(scores, high, sums, chunk)
        else:
            self._exponentials(h0, kept_from, scores, high, sums, chunk)
        self.program.array("weights_by_feature", slots * chunk)
        spread = self.arr("weights_by_feature")
        with e.loop(chunk) as (body, r, _, _y):
            head = body.bin(arith.SubiOp, self._head_of(body, first_kv, r), kept_from)
            row = body.moved(body.dsd(scores, slots), body.bin(arith.MuliOp, head, body.int(slots)))
            body.dsd_op(csl.FmovsOp, body.moved(body.dsd(spread, slots, 0, chunk), r), row)
        self.program.array("weighted", c)
        scratch = self.arr("weighted")
        if self.plan.image == "f16":
            self.program.array("cached_value", c)
        with e.loop(slots) as (body, s, _, _y):
            cached = body.moved(
                body.dsd(values, c), body.bin(arith.AddiOp, base, body.bin(arith.MuliOp, s, body.int(c))),
                self.element_type,
            )  # fmt: skip
            if self.plan.image == "f16":
                widened = self.program.get(body, "cached_value")
                body.dsd_op(csl.Fh2sOp, body.dsd(widened, c), cached)
                cached = body.dsd(widened, c)
            at = body.bin(arith.MuliOp, s, body.int(chunk))
            with body.loop(group) as (inner, m, _, _y2):  # each head of the group reads the same cached values
                offset = inner.bin(arith.MuliOp, m, inner.int(c))
                weights = inner.moved(inner.dsd(spread, c), inner.bin(arith.AddiOp, at, offset))
                inner.dsd_op(csl.FmulsOp, inner.dsd(scratch, c), cached, weights)
                into = inner.moved(inner.dsd(sums, c), offset)
                inner.dsd_op(csl.FaddsOp, into, into, inner.dsd(scratch, c))
        self.reduce(e, sums, chunk + window, "row", csl.FaddsOp)
        with e.loop(chunk) as (body, r, _, _y):
            head = body.bin(arith.SubiOp, self._head_of(body, first_kv, r), h0)
            total = body.load(sums, body.bin(arith.AddiOp, head, body.int(chunk)))
            body.store(body.op(arith.DivfOp(body.load(sums, r), total)).results[0], attended, r)
        self.values[op.result] = out

    def _exponentials(
        self, h0: SSAValue, kept_from: SSAValue, scores: SSAValue, high: SSAValue, sums: SSAValue, chunk: int
    ) -> None:
        """exp(score - max) of the element's window of heads over its positions, in place, and each head's sum of
        them into sums[chunk + head]."""
        e, window, slots = self.e, self.plan.window, self.plan.slots
        with e.loop(window) as (outer, j, _, _y):
            m = outer.load(high, j)
            h = outer.bin(arith.SubiOp, outer.bin(arith.AddiOp, h0, j), kept_from)  # its row of the scores
            total_at = outer.bin(arith.AddiOp, j, outer.int(chunk))
            with outer.loop(slots) as (body, s, _, _y2):
                at = body.bin(arith.AddiOp, body.bin(arith.MuliOp, h, body.int(slots)), s)
                weight = body.math(
                    self.program.math, "exp_f32", body.op(arith.SubfOp(body.load(scores, at), m)).results[0]
                )
                body.store(weight, scores, at)
                body.store(body.op(arith.AddfOp(body.load(sums, total_at), weight)).results[0], sums, total_at)

    def _shared_exponentials(self, scores: SSAValue, high: SSAValue, sums: SSAValue, chunk: int) -> None:
        """The elements of a KV head's column segment hold the same scores: each computes exp(score - max) for every
        segment-length-th of them (from its rank in the segment), zeros elsewhere, with its part of each head's sum of
        weights; the segment's reduction (`segment_only`) gives every element all of them."""
        plan, e = self.plan, self.e
        window, slots, p = plan.window, plan.slots, plan.p
        length, count, _ = plan.line("col")
        shortest = min(length, p - (count - 1) * length)
        items = window * slots
        self.program.array("exponentials", items + window)
        shared = self.arr("exponentials")
        e.dsd_op(csl.FmovsOp, e.dsd(shared, items + window), e.float(0.0))
        py = self.coordinate("col")
        first = e.bin(arith.MuliOp, e.bin(arith.DivSIOp, py, e.int(length)), e.int(length))
        bound = e.bin(arith.AddiOp, first, e.int(length))
        end = e.int(p)
        size = e.bin(arith.SubiOp, e.op(arith.SelectOp(e.cmp(bound, end, "slt"), bound, end)).results[0], first)
        rank = e.bin(arith.SubiOp, py, first)
        with e.loop(-(-items // shortest)) as (body, t, _, _y):
            i = body.bin(arith.AddiOp, rank, body.bin(arith.MuliOp, t, size))
            with body.when(body.cmp(i, body.int(items), "slt")) as mine:
                j = mine.bin(arith.DivSIOp, i, mine.int(slots))
                difference = mine.op(arith.SubfOp(mine.load(scores, i), mine.load(high, j))).results[0]
                weight = mine.math(self.program.math, "exp_f32", difference)
                mine.store(weight, shared, i)
                total_at = mine.bin(arith.AddiOp, j, mine.int(items))
                mine.store(mine.op(arith.AddfOp(mine.load(shared, total_at), weight)).results[0], shared, total_at)
        self.reduce(e, shared, items + window, "col", csl.FaddsOp, segment_only=True)
        e.dsd_op(csl.FmovsOp, e.dsd(scores, items), e.dsd(shared, items))
        e.dsd_op(csl.FmovsOp, e.dsd(sums, window, chunk), e.dsd(shared, window, items))

    def _head_of(self, e: Emit, first_kv: SSAValue, r: SSAValue) -> SSAValue:
        """The query head of feature r of a row whose KV features start at `first_kv` (`grid.query_rows`)."""
        c = self.plan.kv_chunk
        kv_head = e.bin(
            arith.DivSIOp, e.bin(arith.AddiOp, first_kv, e.bin(arith.RemSIOp, r, e.int(c))), e.int(self.plan.head_dim)
        )
        head = e.bin(
            arith.AddiOp, e.bin(arith.MuliOp, kv_head, e.int(self.plan.group)), e.bin(arith.DivSIOp, r, e.int(c))
        )
        last = e.int(self.plan.heads - 1)
        return e.op(arith.SelectOp(e.cmp(head, last, "slt"), head, last)).results[0]

    def _load_cached(self, e: Emit, array: SSAValue, at: SSAValue) -> SSAValue:
        value = e.load(array, at)
        if self.plan.image == "f16":
            return e.op(arith.ExtFOp(value, f32)).results[0]
        return value

    def _elementwise(self, op: Operation, kind: type[csl.BuiltinDsdOp]) -> None:
        a: Vec = self.values[op.operands[0]]
        b: Vec = self.values[op.operands[1]]
        if (a.layout, a.chunk) != (b.layout, b.chunk):
            raise PassError(f"{PASS}: '{op.name}' of vectors laid out differently ({a.layout}, {b.layout})")
        out = self.vec(_name(op.results[0]), a.layout, a.length)
        e = self.e
        e.dsd_op(
            kind,
            e.dsd(self.arr(out.array), a.chunk),
            e.dsd(self.arr(a.array), a.chunk),
            e.dsd(self.arr(b.array), a.chunk),
        )
        self.values[op.results[0]] = out

    def _add(self, op: logos.AddOp) -> None:
        self._elementwise(op, csl.FaddsOp)

    def _mul(self, op: logos.MulOp) -> None:
        self._elementwise(op, csl.FmulsOp)

    def _silu(self, op: logos.SiluOp) -> None:
        e = self.e
        x: Vec = self.values[op.input]
        out = self.vec(_name(op.result), x.layout, x.length)
        source, target = self.arr(x.array), self.arr(out.array)
        with e.loop(x.chunk) as (body, j, _, _y):
            v = body.load(source, j)
            negative = body.op(arith.SubfOp(body.float(0.0), v)).results[0]
            denominator = body.op(
                arith.AddfOp(body.float(1.0), body.math(self.program.math, "exp_f32", negative))
            ).results[0]
            body.store(body.op(arith.DivfOp(v, denominator)).results[0], target, j)
        self.values[op.result] = out

    def _argmax(self, op: logos.ArgmaxOp) -> None:
        logits: Vec = self.values[op.input]
        self.program.handles["logits"] = logits  # type: ignore[assignment]
        self.values[op.result] = "argmax"

    def _func_call(self, op: Operation) -> None:
        raise PassError(f"{PASS}: expects a part's function body, found a call")


def _name(value: SSAValue) -> str:
    """The array a value lives in: its LOGOS name (every value the author writes has one)."""
    if not value.name_hint:
        raise PassError(f"{PASS}: a value of '{value.owner.name}' has no name to give its array")  # type: ignore[union-attr]
    return value.name_hint


def fused_products(body: Block) -> tuple[dict[Operation, list[logos.LinearOp]], set[Operation]]:
    """Products of one input written one after another (only weights between them) and none feeding the head's
    arg-max: {first: the group}, and the rest of each group (lowered with its first)."""
    groups: dict[Operation, list[logos.LinearOp]] = {}
    later: set[Operation] = set()
    run: list[logos.LinearOp] = []

    def close() -> None:
        if len(run) > 1:
            groups[run[0]] = list(run)
            later.update(run[1:])
        run.clear()

    for op in body.ops:
        if isinstance(op, logos.WeightOp):
            continue
        final = isinstance(op, logos.LinearOp) and any(isinstance(u.operation, logos.ArgmaxOp) for u in op.result.uses)
        if isinstance(op, logos.LinearOp) and not final and (not run or run[0].input == op.input):
            run.append(op)
            continue
        close()
        if isinstance(op, logos.LinearOp) and not final:
            run.append(op)
    close()
    return groups, later


def feeds_of(body: Block) -> dict[SSAValue, set[str]]:
    """What each linear's result feeds: a rotation (`rope`), a cache (`cache`, directly or through its rotation)."""
    feeds: dict[SSAValue, set[str]] = {}
    for op in body.ops:
        if isinstance(op, logos.RopeOp):
            feeds.setdefault(op.input, set()).add("rope")
        if isinstance(op, logos.CacheWriteOp):
            source = op.input
            owner = source.owner
            if isinstance(owner, logos.RopeOp):
                source = owner.input
            feeds.setdefault(source, set()).add("cache")
        if isinstance(op, logos.AttentionOp):
            owner = op.query.owner
            source = owner.input if isinstance(owner, logos.RopeOp) else op.query
            feeds.setdefault(source, set()).add("query")
    return feeds


# -- the element program and the layout ------------------------------------------------------------------------


@dataclass
class GridProgram:
    """The lowered decode step: the module of `csl.module`s (program and layout) and what the host needs to run
    it (`host`: the grid, each weight array's tensors and tiling, the rotary tables, the logits' array)."""

    module: ModuleOp
    plan: g.GridPlan
    host: dict[str, Any]


def _function(name: str, program: Program, comment: str, args: Sequence[Any] = ()) -> tuple[Emit, csl.FuncOp]:
    block = Block(arg_types=list(args))
    e = Emit(block)
    e.op(csl_ext.CommentOp(comment))
    return e, csl.FuncOp(name, FunctionType.from_lists(list(args), []), Region(block))


def _part_body(program: logos.ProgramOp) -> Block:
    functions = [op for op in program.body.block.ops if isinstance(op, func.FuncOp) and op.sym_name.data != "main"]
    if len(functions) != 1:
        raise PassError(f"{PASS}: a part holds one function besides main, found {len(functions)}")
    return functions[0].body.block


def lower_parts(parts: Sequence[tuple[Cut, Identity, logos.ProgramOp]], plan: g.GridPlan) -> GridProgram:
    """The decode step's parts ((cut, identity, program) in model order: embedding, layers, head) as one
    element program and its layout for `plan`'s grid."""
    top = Block()
    program = Program(plan, Emit(top))
    t = program.top
    program.memcpy = None
    memcpy_params = t.op(csl.ParamOp("memcpy_params", csl.ComptimeStructType())).results[0]
    program.px = t.op(csl.ParamOp("px", i16)).results[0]
    program.py = t.op(csl.ParamOp("py", i16)).results[0]
    program.memcpy = t.op(csl.ImportModuleConstOp("<memcpy/memcpy>", memcpy_params)).results[0]
    program.math = t.op(csl.ImportModuleConstOp("<math>")).results[0]
    for name in ("token_in", "position_in", "layer_at"):
        program.array(name, 1, i32)
    program.array("norm_sum", 1)
    if g.SEGMENTED:  # the reduction functions' buffers: the longest message along a row, along a column
        queries, keys, hidden = plan.query_chunk, plan.kv_chunk, plan.chunk(plan.hidden)
        scores = (plan.window if plan.scores_local else plan.heads) * plan.slots + plan.window
        program.array(
            "line_row",
            max(plan.chunk(plan.vocab), queries + 2 * keys, 2 * plan.chunk(plan.intermediate), queries + plan.window,
                hidden, 1),
        )  # fmt: skip
        program.array("line_col", max(hidden, scores))
    functions: list[Operation] = []
    identities: list[str] = []
    embed_cut, *layer_parts, head_cut = parts
    program.layer_tensors = _layer_tensors([_part_body(part) for _, _, part in layer_parts])
    # the embedding
    body = _part_body(embed_cut[2])
    e, fn = _function("embedding", program, embed_cut[1].line())
    PartLowering(program, e, None, feeds_of(body)).lower(body)
    e.op(csl.ReturnOp())
    functions.append(fn)
    identities.append(embed_cut[1].line())
    # the layers: one function, every layer's program lowered to the same code
    layer_fn = None
    first_text = ""
    for cut, ident, part in layer_parts:
        body = _part_body(part)
        text = _layer_key(body)
        if layer_fn is None:
            e, layer_fn = _function("layer", program, "layers: " + ident.line(), [i32])
            PartLowering(program, e, layer_fn.body.block.args[0], feeds_of(body)).lower(body)
            e.op(csl.ReturnOp())
            first_text = text
        elif text != first_text:
            raise PassError(f"{PASS}: {cut.option()} is not written as layer 0 is; every layer must run one function")
        identities.append(ident.line())
    assert layer_fn is not None
    functions.append(layer_fn)
    # the head
    body = _part_body(head_cut[2])
    e, fn = _function("head", program, head_cut[1].line())
    lowering = PartLowering(program, e, None, feeds_of(body))
    lowering.lower(body)
    e.op(csl.ReturnOp())
    functions.append(fn)
    identities.append(head_cut[1].line())
    logits: Vec = program.handles["logits"]  # type: ignore[assignment]
    # declarations first, then functions, tasks, the entry and the exports
    for name, (words, element) in program.arrays.items():
        t.op(memref.GlobalOp.get(StringAttr(name), MemRefType(element, [words]), UnitAttr(), StringAttr("public")))
    for fn in [*program.reducers.values(), *functions]:
        t.op(fn)
    _tasks(program, plan.layers)
    exports = [*plan.weights, *program.handles.get("rope_tables", {}), "token_in", "position_in", logits.array]  # type: ignore[arg-type]
    for name in exports:
        words, element = program.arrays[name]
        array = program.get(t, name)
        pointer = csl.PtrType(element, csl.PtrKindAttr(csl.PtrKind.MANY), csl.PtrConstAttr(csl.PtrConst.VAR))
        address = t.op(csl.AddressOfOp(array, pointer)).results[0]
        t.op(csl.SymbolExportOp(name, address))
    t.op(csl.SymbolExportOp("step", FunctionType.from_lists([], [])))
    program_module = csl.CslModuleOp(
        regions=[Region(top)],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.PROGRAM), "sym_name": StringAttr("pe_program")},
    )
    layout_module = _layout(plan)
    host = {
        "grid": plan.p,
        "kv_copies": plan.kv_copies,
        "ctx": plan.ctx,
        "image": plan.image,
        "weights": {
            name: {**w.__dict__, "tensors": list(w.tensors), "row_map": list(w.row_map)}
            for name, w in plan.weights.items()
        },
        "rope_tables": dict(program.handles.get("rope_tables", {})),  # type: ignore[arg-type]
        "logits": {"array": logits.array, "chunk": logits.chunk, "column": plan.centre, "length": logits.length},
        "argmax": "host",
        "identities": identities,
        "arrays": {name: [words, str(element)] for name, (words, element) in program.arrays.items()},
    }
    return GridProgram(ModuleOp([program_module, layout_module]), plan, host)


def _layer_key(body: Block) -> str:
    """A layer's function as its LOGOS program writes it, its layer number and its weights' tensor names left out:
    layers with the same key lower to the same code (the lowering reads the ops, their shapes and properties; a
    weight's tensor is only what the host loads into its array, `_layer_tensors`)."""
    text = "\n".join(str(op) for op in body.ops)
    text = re.sub(r'logos.weight "[^"]*"', 'logos.weight ""', text)
    return re.sub(r"(layers\.|layer )\d+", r"\1N", text)


def _layer_tensors(bodies: Sequence[Block]) -> dict[str, tuple[str, ...]]:
    """Each layer weight's tensor in each layer's program, by the weight's name (the array it is loaded into)."""
    tensors: dict[str, list[str]] = {}
    for body in bodies:
        for op in body.ops:
            if isinstance(op, logos.WeightOp):
                tensors.setdefault(_name(op.result), []).append(op.tensor.data)
    return {name: tuple(found) for name, found in tensors.items()}


def _tasks(program: Program, layers: int) -> None:
    t = program.top
    assert program.memcpy is not None
    # embed_task: the embedding, then the first layer
    block = Block()
    e = Emit(block)
    e.op(csl.CallOp(SymbolRefAttr("embedding"), []))
    e.store(e.int(0), program.get(e, "layer_at"), e.int(0))
    e.op(csl.ActivateOp(g.LAYER_TASK, csl.TaskKind.LOCAL))
    e.op(csl.ReturnOp())
    t.op(csl.TaskOp("embed_task", ([], None), Region(block), task_kind=csl.TaskKind.LOCAL, id=g.EMBED_TASK))
    # layer_task: one layer, then the next (activating itself) or, after the last, unblocking the head
    block = Block()
    e = Emit(block)
    at = program.get(e, "layer_at")
    layer = e.load(at, e.int(0))
    e.op(csl.CallOp(SymbolRefAttr("layer"), [layer]))
    following = e.bin(arith.AddiOp, layer, e.int(1))
    e.store(following, at, e.int(0))
    more, done, op = e.branch(e.cmp(following, e.int(layers), "slt"))
    more.op(csl.ActivateOp(g.LAYER_TASK, csl.TaskKind.LOCAL))
    done.op(csl_ext.UnblockOp(g.HEAD_TASK))
    e.end_branch(more, done, op)
    e.op(csl.ReturnOp())
    t.op(csl.TaskOp("layer_task", ([], None), Region(block), task_kind=csl.TaskKind.LOCAL, id=g.LAYER_TASK))
    # head_task: the head, then the host's command stream goes on (the launch is over)
    block = Block()
    e = Emit(block)
    e.op(csl.CallOp(SymbolRefAttr("head"), []))
    e.op(csl.MemberCallOp("unblock_cmd_stream", None, program.memcpy, []))
    e.op(csl.ReturnOp())
    t.op(csl.TaskOp("head_task", ([], None), Region(block), task_kind=csl.TaskKind.LOCAL, id=g.HEAD_TASK))
    # step: launched by the host; the head waits (blocked) for the last layer
    block = Block()
    e = Emit(block)
    e.op(csl_ext.BlockOp(g.HEAD_TASK))
    e.op(csl.ActivateOp(g.HEAD_TASK, csl.TaskKind.LOCAL))
    e.op(csl.ActivateOp(g.EMBED_TASK, csl.TaskKind.LOCAL))
    e.op(csl.ReturnOp())
    t.op(csl.FuncOp("step", FunctionType.from_lists([], []), Region(block)))


def _route(e: Emit, x: SSAValue, y: SSAValue, colour: int, rx: Sequence[str], tx: Sequence[str]) -> None:
    e.op(csl_ext.SetColorConfigOp(x, y, colour, rx, tx))


def _segment(e: Emit, k: SSAValue, length: int, p: int, type_: IntegerType) -> tuple[SSAValue, ...]:
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


def _line_routes(e: Emit, k: SSAValue, x: SSAValue, y: SSAValue, plan: g.GridPlan, along: str) -> None:
    """The routes of a row (`along="row"`, k = x) or a column (k = y), as `PartLowering.reduce` uses them: each
    segment's halves toward its centre, the segments' centres toward the line's centre (the elements between two
    centres passing their wavelets on), the line centre's broadcast both ways, and (a column, `scores_local`) each
    segment centre's broadcast to its segment."""
    p = plan.p
    if along == "row":
        near, far, bcast, towards, away = g.ROW_WEST_CHAIN, g.ROW_EAST_CHAIN, g.ROW_BCAST, "EAST", "WEST"
        west, east = g.ROW_WEST_CENTRES, g.ROW_EAST_CENTRES
    else:
        near, far, bcast, towards, away = g.COL_NORTH_CHAIN, g.COL_SOUTH_CHAIN, g.COL_BCAST, "SOUTH", "NORTH"
        west, east = g.COL_NORTH_CENTRES, g.COL_SOUTH_CENTRES
    length, count, middle = plan.line(along)
    centre, last_element = g.segment_centre(middle, length, p), p - 1
    one, two, zero = e.int(1, i16), e.int(2, i16), e.int(0, i16)
    q, first, last, mid = _segment(e, k, length, p, i16)
    if along == "col" and plan.scores_local:
        _segment_broadcast_routes(e, k, x, y, first, last, mid, towards, away)
    with e.when(e.cmp(k, mid, "slt")) as half:
        _half_routes(half, x, y, half.bin(arith.SubiOp, k, first), near, towards, away, zero, one, two)
    with e.when(e.cmp(k, mid, "sgt")) as half:
        _half_routes(half, x, y, half.bin(arith.SubiOp, last, k), far, away, towards, zero, one, two)
    with e.when(e.cmp(k, mid, "eq")) as here:
        _receive_routes(here, x, y, here.bin(arith.SubiOp, mid, first), near, away, zero, one, two)
        _receive_routes(here, x, y, here.bin(arith.SubiOp, last, mid), far, towards, zero, one, two)
    if count > 1:
        mq = e.int(middle, i16)
        centres, between, op = e.branch(e.cmp(k, mid, "eq"))
        w, rest, op2 = centres.branch(centres.cmp(q, mq, "slt"))
        _half_routes(w, x, y, q, west, towards, away, zero, one, two)
        ea, line_centre, op3 = rest.branch(rest.cmp(q, mq, "sgt"))
        _half_routes(ea, x, y, ea.bin(arith.SubiOp, ea.int(count - 1, i16), q), east, away, towards, zero, one, two)
        if middle > 0:
            _route(line_centre, x, y, west[(middle - 1) % 2], [away], ["RAMP"])
        if middle < count - 1:
            _route(line_centre, x, y, east[(count - 2 - middle) % 2], [towards], ["RAMP"])
        rest.end_branch(ea, line_centre, op3)
        centres.end_branch(w, rest, op2)
        # between two centres: k > mid lies between centres q and q + 1, k < mid between q - 1 and q
        above, below, op4 = between.branch(between.cmp(k, mid, "sgt"))
        _pass_routes(above, x, y, q, above.bin(arith.AddiOp, q, one), west, east, count, middle, towards, away)
        _pass_routes(below, x, y, below.bin(arith.SubiOp, q, one), q, west, east, count, middle, towards, away)
        between.end_branch(above, below, op4)
        e.end_branch(centres, between, op)
    here2, other, op5 = e.branch(e.cmp(k, e.int(centre, i16), "eq"))
    _route(here2, x, y, bcast, ["RAMP"], [d for d, ok in ((away, centre > 0), (towards, centre < last_element)) if ok])
    before, after, op6 = other.branch(other.cmp(k, other.int(centre, i16), "slt"))
    first_one, inner, op7 = before.branch(before.cmp(k, before.int(0, i16), "eq"))
    _route(first_one, x, y, bcast, [towards], ["RAMP"])
    _route(inner, x, y, bcast, [towards], [away, "RAMP"])
    before.end_branch(first_one, inner, op7)
    end, inner2, op8 = after.branch(after.cmp(k, after.int(last_element, i16), "eq"))
    _route(end, x, y, bcast, [away], ["RAMP"])
    _route(inner2, x, y, bcast, [away], [towards, "RAMP"])
    after.end_branch(end, inner2, op8)
    other.end_branch(before, after, op6)
    e.end_branch(here2, other, op5)


def _segment_broadcast_routes(
    e: Emit, k: SSAValue, x: SSAValue, y: SSAValue, first: SSAValue, last: SSAValue, mid: SSAValue, towards: str,
    away: str,
) -> None:  # fmt: skip
    """A segment's centre sends its total (grid.COL_SEGMENT_BCAST) both ways to the ends of its segment; the
    elements between take it and pass it on."""
    colour = g.COL_SEGMENT_BCAST
    here, other, op = e.branch(e.cmp(k, mid, "eq"))
    with here.when(here.cmp(mid, first, "sgt")) as both:
        with both.when(both.cmp(mid, last, "slt")) as inner:
            _route(inner, x, y, colour, ["RAMP"], [away, towards])
    with here.when(here.cmp(mid, first, "sgt")) as up:
        with up.when(up.cmp(mid, last, "eq")) as inner:
            _route(inner, x, y, colour, ["RAMP"], [away])
    with here.when(here.cmp(mid, first, "eq")) as down:
        with down.when(down.cmp(mid, last, "slt")) as inner:
            _route(inner, x, y, colour, ["RAMP"], [towards])
    before, after, op2 = other.branch(other.cmp(k, mid, "slt"))
    end, inner_b, op3 = before.branch(before.cmp(k, first, "eq"))
    _route(end, x, y, colour, [towards], ["RAMP"])
    _route(inner_b, x, y, colour, [towards], ["RAMP", away])
    before.end_branch(end, inner_b, op3)
    end2, inner_a, op4 = after.branch(after.cmp(k, last, "eq"))
    _route(end2, x, y, colour, [away], ["RAMP"])
    _route(inner_a, x, y, colour, [away], ["RAMP", towards])
    after.end_branch(end2, inner_a, op4)
    other.end_branch(before, after, op2)
    e.end_branch(here, other, op)


def _receive_routes(
    e: Emit, x: SSAValue, y: SSAValue, distance: SSAValue, chain: tuple[int, int], back: str, zero: SSAValue,
    one: SSAValue, two: SSAValue,
) -> None:  # fmt: skip
    """A segment's centre takes its half's last wavelets (if the half has elements): chain[(d - 1) % 2] from `back`."""
    with e.when(e.cmp(distance, zero, "sgt")) as some:
        odd, even, op = some.branch(some.cmp(some.bin(arith.RemSIOp, distance, two), one, "eq"))
        _route(odd, x, y, chain[0], [back], ["RAMP"])
        _route(even, x, y, chain[1], [back], ["RAMP"])
        some.end_branch(odd, even, op)


def _pass_routes(
    e: Emit, x: SSAValue, y: SSAValue, left: SSAValue, right: SSAValue, west: tuple[int, int], east: tuple[int, int],
    count: int, middle: int, towards: str, away: str,
) -> None:  # fmt: skip
    """An element between the centres of segments `left` and `left + 1` (= `right`) passes their chain's wavelets on:
    west of the line's centre the chain from centre `left` (colour west[left % 2]) toward it, east of it the chain
    from centre `right` (colour east[(count - 1 - right) % 2]) toward it."""
    mq = e.int(middle, i16)
    valid = e.op(arith.AndIOp(e.cmp(left, e.int(0, i16), "sge"), e.cmp(right, e.int(count - 1, i16), "sle"))).results[0]
    with e.when(valid) as inside:
        west_side, east_side, op = inside.branch(inside.cmp(right, mq, "sle"))
        odd = west_side.cmp(west_side.bin(arith.RemSIOp, left, west_side.int(2, i16)), west_side.int(1, i16), "eq")
        odd_w, even_w, op2 = west_side.branch(odd)
        _route(odd_w, x, y, west[1], [away], [towards])
        _route(even_w, x, y, west[0], [away], [towards])
        west_side.end_branch(odd_w, even_w, op2)
        j = east_side.bin(arith.SubiOp, east_side.int(count - 1, i16), right)
        odd_e = east_side.cmp(east_side.bin(arith.RemSIOp, j, east_side.int(2, i16)), east_side.int(1, i16), "eq")
        odd_x, even_x, op3 = east_side.branch(odd_e)
        _route(odd_x, x, y, east[1], [towards], [away])
        _route(even_x, x, y, east[0], [towards], [away])
        east_side.end_branch(odd_x, even_x, op3)
        inside.end_branch(west_side, east_side, op)


def _half_routes(
    e: Emit,
    x: SSAValue,
    y: SSAValue,
    distance: SSAValue,
    chain: tuple[int, int],
    forward: str,
    back: str,
    zero: SSAValue,
    one: SSAValue,
    two: SSAValue,
) -> None:
    """An element of a half-line at `distance` from its end: it sends chain[d % 2] `forward` and (d > 0) receives
    chain[(d - 1) % 2] from `back`."""
    odd = e.cmp(e.bin(arith.RemSIOp, distance, two), one, "eq")
    odd_me, even_me, op = e.branch(odd)
    _route(odd_me, x, y, chain[1], ["RAMP"], [forward])
    _route(even_me, x, y, chain[0], ["RAMP"], [forward])
    e.end_branch(odd_me, even_me, op)
    with e.when(e.cmp(distance, zero, "sgt")) as receiver:
        odd_r, even_r, op2 = receiver.branch(odd)
        _route(odd_r, x, y, chain[0], [back], ["RAMP"])
        _route(even_r, x, y, chain[1], [back], ["RAMP"])
        receiver.end_branch(odd_r, even_r, op2)


def _layout(plan: g.GridPlan) -> csl.CslModuleOp:
    """The layout: a width x height rectangle (the `cslc --params`, equal to the program's P), each element's
    program with its coordinates and memcpy parameters, and every router's colour configuration."""
    outer = Block()
    top = Emit(outer)
    width = top.op(csl.ParamOp("width", i16)).results[0]
    height = top.op(csl.ParamOp("height", i16)).results[0]
    params = top.op(csl.ConstStructOp(("width", width), ("height", height))).results[0]
    memcpy = top.op(csl.ImportModuleConstOp("<memcpy/get_params>", params)).results[0]
    block = Block()
    e = Emit(block)
    e.op(csl.SetRectangleOp(operands=[width, height]))
    with e.loop_i16(width) as (column, x):
        with column.loop_i16(height) as (cell, y):
            tile_params = cell.op(csl.MemberCallOp("get_params", csl.ComptimeStructType(), memcpy, [x])).results[0]
            struct = cell.op(csl.ConstStructOp(("memcpy_params", tile_params), ("px", x), ("py", y))).results[0]
            cell.op(csl.SetTileCodeOp("pe_program.csl", x, y, struct))
            _line_routes(cell, x, x, y, plan, "row")
            _line_routes(cell, y, x, y, plan, "col")
    top.op(csl.LayoutOp(Region(block)))
    return csl.CslModuleOp(
        regions=[Region(outer)],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.LAYOUT), "sym_name": StringAttr("layout")},
    )


def plan_for(spec: Any, ctx: int, image: str, p: int, kv_copies: int = 1) -> g.GridPlan:
    return g.GridPlan(
        p,
        ctx,
        image,
        spec.hidden,
        spec.heads,
        spec.kv_heads,
        spec.head_dim,
        spec.intermediate,
        spec.vocab,
        spec.layers,
        kv_copies,
    )


def element_bytes(program: GridProgram) -> dict[str, int]:
    """An element's memory: its arrays (every element declares the same) and its code (`csl_ext.code_bytes`, an
    estimate: the SDK publishes no code-size figure per builtin)."""
    arrays = sum(words * csl_ext.element_bytes(element) for words, element in program.host["arrays"].values())
    module = next(
        op for op in program.module.ops if isinstance(op, csl.CslModuleOp) and op.kind.data == csl.ModuleKind.PROGRAM
    )
    code = csl_ext.code_bytes(module)
    return {"arrays": arrays, "code": code, "total": arrays + code}


def lower_module(
    module: ModuleOp, image: str = "f16", p: int = 0, memory: int = csl_ext.MEMORY, copies: int | None = None
) -> GridProgram:
    """The decode step whose parts `module` holds (`parts_of`) lowered for the smallest square grid whose elements
    hold it (or for P x P when `p` is given), with the most copies of each KV head (up to its group: the widened
    cache) that fit, or `copies` (1: KV heads kept narrow). `module` is left as it is."""
    if image not in ("f16", "f32"):
        raise PassError(f"{PASS}: the grid holds f16 or f32 weights, not {image}")
    parts = parts_of(module)
    spec = parts[0][2].spec
    ctx = parts[1][0].ctx or 1  # the first layer's cache
    if spec.heads % spec.kv_heads or spec.head_dim % 2:
        raise PassError(f"{PASS}: heads must be a multiple of KV heads and head_dim even")
    group = spec.heads // spec.kv_heads
    choices = [c for c in range(group if copies is None else copies, 0, -1) if group % c == 0]
    if copies is not None and copies not in choices:
        raise PassError(f"{PASS}: {copies} copies of each KV head do not divide its {group} query heads")
    if copies is not None:
        choices = [copies]

    def lowered_at(size: int, c: int) -> tuple[GridProgram, int]:
        program = lower_parts(parts, plan_for(spec, ctx, image, size, c))
        return program, element_bytes(program)["total"]

    if p:
        if p < 2:
            raise PassError(f"{PASS}: a grid of {p} x {p} elements has no rows to reduce along (P >= 2)")
        needed = 0
        for c in choices:  # the most KV copies that fit: the most rows working on attention
            lowered, needed = lowered_at(p, c)
            if needed <= memory:
                return lowered
        raise PassError(
            f"{PASS}: the model does not fit a {p} x {p} grid of {memory}-byte elements ({needed} bytes per element)",
            hint="give a larger grid (logos-compile --option grid=P; convert-logos-to-csl{grid=P} in logos-opt) "
            "or none, to have the smallest that fits chosen",
        )
    largest = csl_ext.WSE2_FABRIC[0]
    needed = 0
    for c in choices:  # the most KV copies that fit some grid (KV heads widened keep more rows working)
        lowered, needed = lowered_at(largest, c)
        if needed > memory:
            continue
        low, high = 1, largest  # the smallest P that fits (an element's bytes fall as P grows)
        while high - low > 1:
            middle = (low + high) // 2
            if lowered_at(middle, c)[1] <= memory:
                high = middle
            else:
                low = middle
        best = g.best_grid(spec, high, largest, c)
        return lowered_at(best, c)[0]
    raise PassError(
        f"{PASS}: the model does not fit a {largest} x {largest} grid of {memory}-byte elements "
        f"({needed} bytes per element)"
    )


def parts_of(module: ModuleOp) -> list[tuple[Cut, Identity, logos.ProgramOp]]:
    """The parts of one decode step on one chip that `module` holds, each (cut, identity, program), in model order:
    `decode_embed`, `decode_layer` 0 to L - 1 (one ctx), `decode_head`, all of one model; else a diagnostic."""
    programs = [op for op in module.ops if isinstance(op, logos.ProgramOp)]
    if len(programs) != len(list(module.ops)) or not programs:
        raise PassError(f"{PASS}: expects a module of logos.program ops (a decode step's parts)")
    parts = [(_cut_of(program), identity(program), program) for program in programs]
    whole = [cut for cut, _, _ in parts if cut.kind in Cut.WHOLE]
    if whole:
        raise PassError(
            f"{PASS}: lowers a decode step's parts (embedding, layers, head), not the whole '{whole[0].option()}'",
            hint="extract its parts first: -p 'extract-parts,convert-logos-to-csl' (the logos-to-spatial pipeline)",
        )
    for cut, _, program in parts:
        if not cut.kind.startswith("decode_") or program.chips.value.data != 1:
            raise PassError(
                f"{PASS}: lowers the parts of a decode step on one chip (every part on one grid), not "
                f"'{cut.option()}' over {program.chips.value.data} chip(s)"
            )
    spec = programs[0].spec
    ctx = next((cut.ctx for cut, _, _ in parts if cut.kind == "decode_layer"), None) or 1
    expected = [Cut.decode_embed(), *(Cut.decode_layer(i, ctx) for i in range(spec.layers)), Cut.decode_head()]
    found = [cut for cut, _, _ in parts]
    if found != expected:
        raise PassError(
            f"{PASS}: lowers every part of a decode step (embedding, {spec.layers} layers, head) in model order, "
            f"not {', '.join(repr(cut.option()) for cut in found)}"
        )
    for cut, _, program in parts:
        if program.spec != spec:
            raise PassError(f"{PASS}: the part '{cut.option()}' is of another model than '{found[0].option()}'")
    return parts


def _cut_of(program: logos.ProgramOp) -> Cut:
    try:
        return Cut.parse(program.cut.data)
    except CutError as error:
        raise PassError(f"{PASS}: the program's cut '{program.cut.data}' cannot be read: {error.message}") from None


def lower_decode(
    spec: Any, ctx: int, image: str = "f16", p: int = 0, memory: int = csl_ext.MEMORY, copies: int | None = None
) -> GridProgram:
    """The decode step of `spec` over a cache of `ctx` positions as the author writes it, through the lane's
    pipeline (`verify-identity`, `extract-parts`, this pass's `lower_module`): for tests and benchmarks that start
    from a model rather than a module."""
    from logos_ir.author import written
    from logos_ir.parser import parse_program

    whole = Cut.decode(ctx)
    authored, _ = written(spec, whole)
    module = ModuleOp([parse_program(authored.text, f"<{whole.option()}>")])
    for stage in (VerifyIdentity(), ExtractParts()):
        stage.apply(Context(), module)
    return lower_module(module, image, p, memory, copies)


@dataclass(frozen=True)
class ConvertLogosToCsl(ModulePass):
    """`convert-logos-to-csl{weights=f16 grid=0}`: a module holding the parts of one decode step (`logos.program`s
    of cuts `decode_embed`, `decode_layer` 0 to L - 1, `decode_head` on one chip, as `extract-parts` makes them)
    replaced by its two `csl.module`s (program and layout) for the grid (see the module docstring); `grid=0` picks
    P as the build does. Refuses anything else, naming the pass, before changing the module."""

    name = "convert-logos-to-csl"

    weights: str = "f16"
    grid: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lowered = lower_module(op, self.weights, self.grid)
        for old in list(op.ops):
            op.body.block.erase_op(old)
        for new in list(lowered.module.ops):
            new.detach()
            op.body.block.add_op(new)
