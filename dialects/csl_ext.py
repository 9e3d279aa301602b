"""`csl_ext`: the CSL builtins the spatial lane prints that xDSL 0.74's `csl` dialect lacks.

xDSL's `csl` dialect has tasks, `@activate`, DSDs and their operations, `@set_rectangle` and `@set_tile_code`, but no
route configuration, no `@block`/`@unblock` and no way to put a comment in the printed text. These ops are printed by
the lane's CSL print context (`passes/spatial/emit_csl.py`) and executed by the fabric simulator
(`logos_ir/runtime/spatial.py`), exactly as the other `csl` ops are:

- `csl_ext.set_color_config`: `@set_color_config(x, y, @get_color(c), .{ .routes = .{ .rx = .{ WEST }, .tx = .{ RAMP,
  EAST } } })` in a layout: the router of element (x, y) takes colour c's wavelets from the `rx` directions and
  forwards each to every `tx` direction (RAMP: into the element's own input queue for colour c).
- `csl_ext.block` / `csl_ext.unblock`: `@block(@get_local_task_id(n))` / `@unblock(...)`: a blocked task that is
  activated runs only once unblocked.
- `csl_ext.comment`: a `// text` line (the identity line of the LOGOS program a function was lowered from).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ArrayAttr, IntAttr, StringAttr, i16
from xdsl.ir import Dialect, Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, prop_def
from xdsl.utils.exceptions import VerifyException

DIRECTIONS = ("RAMP", "NORTH", "SOUTH", "EAST", "WEST")


def _directions(names: Sequence[str]) -> ArrayAttr[StringAttr]:
    return ArrayAttr([StringAttr(n) for n in names])


@irdl_op_definition
class SetColorConfigOp(IRDLOperation):
    """A router's configuration for one colour at one element of the layout:

    `csl_ext.set_color_config %x, %y colour 3 rx ["WEST"] tx ["RAMP", "EAST"]`
    """

    name = "csl_ext.set_color_config"

    x = operand_def(i16)
    y = operand_def(i16)
    colour = prop_def(IntAttr)
    rx = prop_def(ArrayAttr[StringAttr])
    tx = prop_def(ArrayAttr[StringAttr])

    assembly_format = "$x `,` $y `colour` $colour `rx` $rx `tx` $tx attr-dict"

    def __init__(
        self, x: SSAValue | Operation, y: SSAValue | Operation, colour: int, rx: Sequence[str], tx: Sequence[str]
    ):
        super().__init__(
            operands=[x, y],
            properties={"colour": IntAttr(colour), "rx": _directions(rx), "tx": _directions(tx)},
        )

    @property
    def receives(self) -> tuple[str, ...]:
        return tuple(a.data for a in self.rx.data)

    @property
    def transmits(self) -> tuple[str, ...]:
        return tuple(a.data for a in self.tx.data)

    def verify_(self) -> None:
        for name in (*self.receives, *self.transmits):
            if name not in DIRECTIONS:
                raise VerifyException(f"{self.name}: '{name}' is not a direction (one of {', '.join(DIRECTIONS)})")
        if not self.receives or not self.transmits:
            raise VerifyException(f"{self.name}: colour {self.colour.data} needs at least one rx and one tx direction")
        if not 0 <= self.colour.data < 32:
            raise VerifyException(f"{self.name}: colour {self.colour.data} is outside 0..31")


class _TaskControl(IRDLOperation):
    task = prop_def(IntAttr)
    assembly_format = "$task attr-dict"

    def __init__(self, task: int):
        super().__init__(properties={"task": IntAttr(task)})


@irdl_op_definition
class BlockOp(_TaskControl):
    """`csl_ext.block 10`: `@block(@get_local_task_id(10));`"""

    name = "csl_ext.block"


@irdl_op_definition
class UnblockOp(_TaskControl):
    """`csl_ext.unblock 10`: `@unblock(@get_local_task_id(10));`"""

    name = "csl_ext.unblock"


@irdl_op_definition
class CommentOp(IRDLOperation):
    """`csl_ext.comment "text"`: a `// text` line in the printed CSL."""

    name = "csl_ext.comment"
    text = prop_def(StringAttr)
    assembly_format = "$text attr-dict"

    def __init__(self, text: str):
        super().__init__(properties={"text": StringAttr(text)})


CSL_EXT = Dialect("csl_ext", [SetColorConfigOp, BlockOp, UnblockOp, CommentOp], [])

__all__ = ["CSL_EXT", "DIRECTIONS", "BlockOp", "CommentOp", "SetColorConfigOp", "UnblockOp", "i16"]
