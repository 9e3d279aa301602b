"""The element code of a reduction along a row or a column of the grid (WaferLLM's two phases): each segment of the
line toward its centre from both ends, the segments' centres toward the line's centre, the total broadcast back;
one function per kind of reduction, called with the message's length, keeps the element's code small. The routes
these sends and receives take are the layout's (`layout.py`).

`LineReductions` is the part of a part's lowering (`part.PartLowering`) that emits them: the per-op patterns call it
for a product's partial sums, a norm's sum of squares, attention's scores, maxima and weighted values.
"""

from __future__ import annotations

from xdsl.dialects import arith, csl
from xdsl.dialects.builtin import FunctionType, SymbolRefAttr, i32
from xdsl.ir import Block, Region, SSAValue

from logos_ir.errors import PassError
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.element_program import PASS, Program
from logos_ir.passes.spatial.emit import U16, Emit, RunLength, segment_bounds


class LineReductions:
    """Reductions along the lines of `plan`'s grid, their functions kept in `program.reducers`."""

    plan: g.GridPlan
    program: Program

    def coordinate(self, layout: str, e: Emit | None = None) -> SSAValue:
        raise NotImplementedError

    def arr(self, name: str) -> SSAValue:
        raise NotImplementedError

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
            self.reduce_body(e, array, n, along, combine, broadcast)
            return
        words = self.program.arrays[f"line_{along}"][0]
        if n > words and self.plan.compact and along == "row":  # the compact layout's logits: piece by piece
            name = self.reducer(along, combine, broadcast, segment_only)
            line = self.arr(f"line_{along}")
            with e.loop(n // words) as (body, i, _, _y):  # the whole pieces, in a loop (the code stays small)
                at = body.bin(arith.MuliOp, i, body.int(words))
                body.dsd_op(csl.FmovsOp, body.dsd(line, words), body.moved(body.dsd(array, words), at))
                body.op(csl.CallOp(SymbolRefAttr(name), [body.u16(words)]))
                body.dsd_op(csl.FmovsOp, body.moved(body.dsd(array, words), at), body.dsd(line, words))
            if n % words:
                self.reduce_piece(e, array, n - n % words, n % words, along, combine, broadcast, segment_only)
            return
        if n > words:
            raise PassError(f"{PASS}: a reduction of {n} words along a {along} exceeds its line buffer ({words})")
        self.reduce_piece(e, array, 0, n, along, combine, broadcast, segment_only)

    def reduce_piece(
        self,
        e: Emit,
        array: SSAValue,
        start: int,
        n: int,
        along: str,
        combine: type[csl.BuiltinDsdOp],
        broadcast: bool,
        segment_only: bool,
    ) -> None:
        """`array[start:start + n]` reduced by the line's function of its kind (`reduce`), through the line buffer."""
        name = self.reducer(along, combine, broadcast, segment_only)
        line = self.arr(f"line_{along}")
        e.dsd_op(csl.FmovsOp, e.dsd(line, n), e.dsd(array, n, start))
        e.op(csl.CallOp(SymbolRefAttr(name), [e.u16(n)]))
        e.dsd_op(csl.FmovsOp, e.dsd(array, n, start), e.dsd(line, n))

    def reducer(self, along: str, combine: type[csl.BuiltinDsdOp], broadcast: bool, segment_only: bool) -> str:
        """The name of the line's reduction function of this kind, built the first time it is asked for."""
        words = self.program.arrays[f"line_{along}"][0]
        kind = "_local" if segment_only else ("" if broadcast else "_to_centre")
        name = f"reduce_{along}_{combine.name.removeprefix('csl.')}" + kind
        if name not in self.program.reducers:
            # the length is the function's u16 argument: its DSDs are the line buffer's, compile-time, with
            # @set_dsd_length (the SDK's tensor_access lengths and extents are known at compile time)
            block = Block(arg_types=[U16])
            body = Emit(block)
            line = self.program.get(body, f"line_{along}")
            self.reduce_body(
                body, line, RunLength(block.args[0], words, self.program.top), along, combine, broadcast, segment_only
            )
            body.op(csl.ReturnOp())
            self.program.reducers[name] = csl.FuncOp(name, FunctionType.from_lists([U16], []), Region(block))
        return name

    def reduce_body(
        self,
        e: Emit,
        array: SSAValue,
        n: int | RunLength,
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
        q, first, last, mid = segment_bounds(e, k, length, plan.line_length(along), i32)
        before, rest, op = e.branch(e.cmp(k, mid, "slt"))
        self.half_line(before, before.bin(arith.SubiOp, k, first), local, n, near, combine, before.cmp(k, first, "eq"))
        after, here, op2 = rest.branch(rest.cmp(k, mid, "sgt"))
        distance = after.bin(arith.SubiOp, last, k)
        self.half_line(after, distance, local, n, far, combine, after.cmp(k, last, "eq"))
        self.receive_last(here, here.bin(arith.SubiOp, mid, first), local, n, near, combine)
        self.receive_last(here, here.bin(arith.SubiOp, last, mid), local, n, far, combine)
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
                self.half_line(westward, q, local, n, west, combine, westward.cmp(q, westward.int(0), "eq"))
                eastward, line_centre, op5 = other.branch(other.cmp(q, other.int(middle), "sgt"))
                j = eastward.bin(arith.SubiOp, eastward.int(count - 1), q)
                self.half_line(eastward, j, local, n, east, combine, eastward.cmp(j, eastward.int(0), "eq"))
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

    def receive_last(
        self,
        e: Emit,
        distance: SSAValue,
        local: SSAValue,
        n: int | RunLength,
        chain: tuple[int, int],
        combine: type[csl.BuiltinDsdOp],
    ) -> None:
        """A segment's centre adds what its half at `distance` elements (if any) sends: chain[(distance - 1) % 2]."""
        with e.when(e.cmp(distance, e.int(0), "sgt")) as some:
            odd, even, op = some.branch(some.cmp(some.bin(arith.RemSIOp, distance, some.int(2)), some.int(1), "eq"))
            odd.dsd_op(combine, local, local, odd.fabric(chain[0], n, True))
            even.dsd_op(combine, local, local, even.fabric(chain[1], n, True))
            some.end_branch(odd, even, op)

    def half_line(
        self,
        e: Emit,
        distance: SSAValue,
        local: SSAValue,
        n: int | RunLength,
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
