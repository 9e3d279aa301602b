"""The layout of the grid: a P x P rectangle, each element's program with its coordinates and memcpy parameters, and
every router's colour configuration for the reductions the element program runs (`reductions.py`): each segment's
halves toward its centre, the segments' centres toward the line's centre, the line centre's broadcast both ways, and
(a column, `scores_local`) each segment centre's broadcast to its segment.

These are plain functions, not rewrite patterns: the layout is not the image of any logos op. It follows from the
grid plan alone (its P, its segments), one configuration per element and colour, the same for every program lowered
onto the grid.
"""

from __future__ import annotations

from xdsl.dialects import arith, csl
from xdsl.dialects.builtin import StringAttr, i16
from xdsl.ir import Block, Region, SSAValue

from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.emit import Emit, route, segment_bounds
from logos_ir.passes.spatial.queues import chain_params


def _line_routes(e: Emit, k: SSAValue, x: SSAValue, y: SSAValue, plan: g.GridPlan, along: str) -> None:
    """The routes of a row (`along="row"`, k = x) or a column (k = y), as `PartLowering.reduce` uses them: each
    segment's halves toward its centre, the segments' centres toward the line's centre (the elements between two
    centres passing their wavelets on), the line centre's broadcast both ways, and (a column, `scores_local`) each
    segment centre's broadcast to its segment."""
    p = plan.line_length(along)
    if along == "row":
        near, far, bcast, towards, away = g.ROW_WEST_CHAIN, g.ROW_EAST_CHAIN, g.ROW_BCAST, "EAST", "WEST"
        west, east = g.ROW_WEST_CENTRES, g.ROW_EAST_CENTRES
    else:
        near, far, bcast, towards, away = g.COL_NORTH_CHAIN, g.COL_SOUTH_CHAIN, g.COL_BCAST, "SOUTH", "NORTH"
        west, east = g.COL_NORTH_CENTRES, g.COL_SOUTH_CENTRES
    length, count, middle = plan.line(along)
    centre, last_element = g.segment_centre(middle, length, p), p - 1
    one, two, zero = e.int(1, i16), e.int(2, i16), e.int(0, i16)
    q, first, last, mid = segment_bounds(e, k, length, p, i16)
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
            route(line_centre, x, y, west[(middle - 1) % 2], [away], ["RAMP"])
        if middle < count - 1:
            route(line_centre, x, y, east[(count - 2 - middle) % 2], [towards], ["RAMP"])
        rest.end_branch(ea, line_centre, op3)
        centres.end_branch(w, rest, op2)
        # between two centres: k > mid lies between centres q and q + 1, k < mid between q - 1 and q
        above, below, op4 = between.branch(between.cmp(k, mid, "sgt"))
        _pass_routes(above, x, y, q, above.bin(arith.AddiOp, q, one), west, east, count, middle, towards, away)
        _pass_routes(below, x, y, below.bin(arith.SubiOp, q, one), q, west, east, count, middle, towards, away)
        between.end_branch(above, below, op4)
        e.end_branch(centres, between, op)
    here2, other, op5 = e.branch(e.cmp(k, e.int(centre, i16), "eq"))
    route(here2, x, y, bcast, ["RAMP"], [d for d, ok in ((away, centre > 0), (towards, centre < last_element)) if ok])
    before, after, op6 = other.branch(other.cmp(k, other.int(centre, i16), "slt"))
    first_one, inner, op7 = before.branch(before.cmp(k, before.int(0, i16), "eq"))
    route(first_one, x, y, bcast, [towards], ["RAMP"])
    route(inner, x, y, bcast, [towards], [away, "RAMP"])
    before.end_branch(first_one, inner, op7)
    end, inner2, op8 = after.branch(after.cmp(k, after.int(last_element, i16), "eq"))
    route(end, x, y, bcast, [away], ["RAMP"])
    route(inner2, x, y, bcast, [away], [towards, "RAMP"])
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
            route(inner, x, y, colour, ["RAMP"], [away, towards])
    with here.when(here.cmp(mid, first, "sgt")) as up:
        with up.when(up.cmp(mid, last, "eq")) as inner:
            route(inner, x, y, colour, ["RAMP"], [away])
    with here.when(here.cmp(mid, first, "eq")) as down:
        with down.when(down.cmp(mid, last, "slt")) as inner:
            route(inner, x, y, colour, ["RAMP"], [towards])
    before, after, op2 = other.branch(other.cmp(k, mid, "slt"))
    end, inner_b, op3 = before.branch(before.cmp(k, first, "eq"))
    route(end, x, y, colour, [towards], ["RAMP"])
    route(inner_b, x, y, colour, [towards], ["RAMP", away])
    before.end_branch(end, inner_b, op3)
    end2, inner_a, op4 = after.branch(after.cmp(k, last, "eq"))
    route(end2, x, y, colour, [away], ["RAMP"])
    route(inner_a, x, y, colour, [away], ["RAMP", towards])
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
        route(odd, x, y, chain[0], [back], ["RAMP"])
        route(even, x, y, chain[1], [back], ["RAMP"])
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
        route(odd_w, x, y, west[1], [away], [towards])
        route(even_w, x, y, west[0], [away], [towards])
        west_side.end_branch(odd_w, even_w, op2)
        j = east_side.bin(arith.SubiOp, east_side.int(count - 1, i16), right)
        odd_e = east_side.cmp(east_side.bin(arith.RemSIOp, j, east_side.int(2, i16)), east_side.int(1, i16), "eq")
        odd_x, even_x, op3 = east_side.branch(odd_e)
        route(odd_x, x, y, east[1], [towards], [away])
        route(even_x, x, y, east[0], [towards], [away])
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
    route(odd_me, x, y, chain[1], ["RAMP"], [forward])
    route(even_me, x, y, chain[0], ["RAMP"], [forward])
    e.end_branch(odd_me, even_me, op)
    with e.when(e.cmp(distance, zero, "sgt")) as receiver:
        odd_r, even_r, op2 = receiver.branch(odd)
        route(odd_r, x, y, chain[0], [back], ["RAMP"])
        route(even_r, x, y, chain[1], [back], ["RAMP"])
        receiver.end_branch(odd_r, even_r, op2)


def _chain_colours(e: Emit, x: SSAValue, y: SSAValue, width: SSAValue, height: SSAValue) -> list[tuple[str, SSAValue]]:
    """A one-segment line's chain colours at element (x, y), as its tile code's `color` parameters (`queues`'
    `<chain>_in`, `<chain>_out`; gemv-checkerboard's `recv` and `send`): the element at distance d from a chain's end
    sends chain[d % 2] and receives chain[(d + 1) % 2] (the colour its neighbour at d - 1 sends). On a WSE-3 its
    queues are bound to them."""
    one, two = e.int(1, i16), e.int(2, i16)
    distances = {
        "row_west": x,
        "row_east": e.bin(arith.SubiOp, e.bin(arith.SubiOp, width, one), x),
        "col_north": y,
        "col_south": e.bin(arith.SubiOp, e.bin(arith.SubiOp, height, one), y),
    }
    first = {"row_west": g.ROW_WEST_CHAIN, "row_east": g.ROW_EAST_CHAIN}
    first |= {"col_north": g.COL_NORTH_CHAIN, "col_south": g.COL_SOUTH_CHAIN}
    fields: list[tuple[str, SSAValue]] = []
    for name in chain_params():
        chain, side = name.rsplit("_", 1)
        pair = first[chain]
        assert pair[1] == pair[0] + 1  # the parity picks one of two consecutive colours
        d = distances[chain] if side == "out" else e.bin(arith.AddiOp, distances[chain], one)
        colour = e.bin(arith.AddiOp, e.int(pair[0], i16), e.bin(arith.RemSIOp, d, two))
        fields.append((name, e.op(csl.GetColorOp(colour)).results[0]))  # type: ignore[arg-type]
    return fields


def layout_module(plan: g.GridPlan) -> csl.CslModuleOp:
    """The layout: a width x height rectangle (the `cslc --params`, equal to the program's P), each element's
    program with its coordinates and memcpy parameters (and, a line of one segment, its chains' colours), and every
    router's colour configuration."""
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
            fields = [("memcpy_params", tile_params), ("px", x), ("py", y)]
            if not plan.segmented:
                fields += _chain_colours(cell, x, y, width, height)
            struct = cell.op(csl.ConstStructOp(*fields)).results[0]
            cell.op(csl.SetTileCodeOp("pe_program.csl", x, y, struct))
            _line_routes(cell, x, x, y, plan, "row")
            _line_routes(cell, y, x, y, plan, "col")
    top.op(csl.LayoutOp(Region(block)))
    return csl.CslModuleOp(
        regions=[Region(outer)],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.LAYOUT), "sym_name": StringAttr("layout")},
    )
