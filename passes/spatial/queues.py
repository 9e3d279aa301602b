"""The queues of the element program for its target (`bind_queues`). On a WSE-2 a fabric DSD names its colour and
one input queue (2) and one output queue (3) serve every colour, as csl-examples' gemv tutorials use them. A WSE-3
binds each queue to one colour with `@initialize_queue` in a comptime block (csl-examples gemv-checkerboard `pe.csl`)
and gives a program 6 input and 6 output queues (2 to 7; memcpy takes 0 and 1), so the program's colours go to
queues by class (`WSE3_QUEUES`), as WaferLLM's WSE-3 decode gives each of its reduction colours a queue of its own
(`Decode/WSE-3/src/comm_lib/comm_pe.csl`): on a WSE-3 a line is one segment (`csl_ext.Target.segmented_lines`),
reduced by two chains toward its centre, each on two colours alternating by the distance from its end, and the
centre's broadcast. Each chain takes one input and one output queue, bound on each element to the colour that
element receives and sends on it (the layout's `color` parameters `<chain>_in`, `<chain>_out`: gemv-checkerboard's
`recv` and `send`, swapped by parity); each broadcast takes one queue, bound to its colour everywhere. A program
using a colour outside these classes (a segmented line's centres, a column segment's broadcast) is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import csl
from xdsl.dialects.builtin import IntegerAttr, IntegerType, StringAttr

from logos_ir.dialects import csl_ext
from logos_ir.errors import PassError
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.element_program import PASS


@dataclass(frozen=True)
class QueueClass:
    """One queue of a WSE-3 element program, in and out: its id, the colours it serves (one on any element: a chain's
    pair alternate by the element's distance from the chain's end) and, for a chain, the name of its parameters."""

    queue: int
    colours: tuple[int, ...]
    chain: str = ""  # "" for a broadcast: bound to its one colour on every element


WSE3_QUEUES = (
    QueueClass(2, g.ROW_WEST_CHAIN, "row_west"),
    QueueClass(3, g.ROW_EAST_CHAIN, "row_east"),
    QueueClass(4, (g.ROW_BCAST,)),
    QueueClass(5, g.COL_NORTH_CHAIN, "col_north"),
    QueueClass(6, g.COL_SOUTH_CHAIN, "col_south"),
    QueueClass(7, (g.COL_BCAST,)),
)
QUEUE_OF = {colour: q for q in WSE3_QUEUES for colour in q.colours}


def chain_params() -> list[str]:
    """The tile code's colour parameters of a WSE-3 program, in the order the layout gives them."""
    return [f"{q.chain}_{side}" for q in WSE3_QUEUES if q.chain for side in ("in", "out")]


def bind_queues(program: csl.CslModuleOp, target: csl_ext.Target) -> None:
    """Mark `program` as built for `target` (its `csl_ext.arch` attribute, which the static check reads) and, on a
    target that binds a queue to one colour, give each fabric DSD its class's queue, declare the chains' colour
    parameters and bind each queue with `@initialize_queue`."""
    program.attributes["csl_ext.arch"] = StringAttr(target.name)
    if not target.one_colour_per_queue:
        return
    dsds = [op for op in program.walk() if isinstance(op, csl.GetFabDsdOp)]
    colours = sorted({op.fabric_color.value.data for op in dsds})
    outside = [c for c in colours if c not in QUEUE_OF]
    if outside:
        raise PassError(
            f"{PASS}: a {target.name} binds each queue to one colour and gives a program 6 input queues (2 to 7): the "
            f"element program uses colours {', '.join(map(str, outside))}, outside the one-segment line's chains and "
            f"broadcasts that get them ({', '.join(map(str, sorted(QUEUE_OF)))}): not built for {target.name}",
            hint="build for wse2 (--option arch=wse2); docs/spatial.md says what a WSE-3 takes",
        )
    for op in dsds:
        q = QUEUE_OF[op.fabric_color.value.data]
        op.queue_id = IntegerAttr(q.queue, IntegerType(3))
        if q.chain:  # the element's own colour of the chain's pair, as its queue is bound
            inbound = op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
            op.attributes[csl_ext.COLOUR_PARAM] = StringAttr(f"{q.chain}_{'in' if inbound else 'out'}")
    block = program.body.block
    params = [op for op in block.ops if isinstance(op, csl.ParamOp)]
    declared: dict[str, csl.ParamOp] = {}
    for name in chain_params():  # after the program's own parameters (first, if none), in the layout's order
        param = declared[name] = csl.ParamOp(name, csl.ColorType())
        if params:
            block.insert_op_after(param, params[-1])
        elif block.first_op is not None:
            block.insert_op_before(param, block.first_op)
        else:
            block.add_op(param)
        params.append(param)
    used = {QUEUE_OF[c].queue for c in colours}
    for q in WSE3_QUEUES:
        if q.queue not in used:
            continue
        for inbound in (True, False):
            if q.chain:
                colour = declared[f"{q.chain}_{'in' if inbound else 'out'}"].res
                block.add_op(csl_ext.InitializeQueueOp(inbound, q.queue, colour))
            else:
                block.add_op(csl_ext.InitializeQueueOp(inbound, q.queue, q.colours[0]))
