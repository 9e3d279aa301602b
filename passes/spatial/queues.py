"""The queues of the element program for its target (`bind_queues`): on a WSE-2 a fabric DSD names its colour and
one input queue (2) and one output queue (3) serve every colour, as csl-examples' gemv tutorials use them; a WSE-3
binds each queue to one colour with `@initialize_queue` in a comptime block (csl-examples gemv-checkerboard `pe.csl`,
`topic-16-queue-flush`), so each colour the program receives takes an input queue of its own and each colour it
sends an output queue of its own, from the queues memcpy leaves (2 to 7). A program that needs more is refused by
name, with the count, before anything is written.
"""

from __future__ import annotations

from xdsl.dialects import csl
from xdsl.dialects.builtin import IntegerAttr, IntegerType, StringAttr

from logos_ir.dialects import csl_ext
from logos_ir.errors import PassError
from logos_ir.passes.spatial.element_program import PASS


def bind_queues(program: csl.CslModuleOp, target: csl_ext.Target) -> None:
    """Mark `program` as built for `target` (its `csl_ext.arch` attribute, which the static check reads) and, on a
    target that binds a queue to one colour, give each colour its queues and their `@initialize_queue`s."""
    program.attributes["csl_ext.arch"] = StringAttr(target.name)
    if not target.one_colour_per_queue:
        return
    dsds = [op for op in program.walk() if isinstance(op, csl.GetFabDsdOp)]
    block = program.body.block
    for inbound in (True, False):
        side = "input" if inbound else "output"
        mine = [op for op in dsds if (op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)) == inbound]
        colours = sorted({op.fabric_color.value.data for op in mine})
        free = target.input_queues if inbound else target.output_queues
        if len(colours) > len(free):
            raise PassError(
                f"{PASS}: a {target.name} binds each queue to one colour and gives a program {len(free)} {side} queues "
                f"({free[0]} to {free[-1]}); the element program {'receives' if inbound else 'sends'} on "
                f"{len(colours)} colours ({', '.join(map(str, colours))}): not built for {target.name}",
                hint="build for wse2 (--option arch=wse2); docs/spatial.md says which mapping change would lift this",
            )
        queue_of = dict(zip(colours, free, strict=False))
        for op in mine:
            op.queue_id = IntegerAttr(queue_of[op.fabric_color.value.data], IntegerType(3))
        for colour, queue in queue_of.items():
            block.add_op(csl_ext.InitializeQueueOp(inbound, queue, colour))
