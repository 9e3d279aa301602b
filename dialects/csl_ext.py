"""`csl_ext`: the CSL builtins the spatial lane prints that xDSL 0.74's `csl` dialect lacks.

xDSL's `csl` dialect has tasks, `@activate`, DSDs and their operations, `@set_rectangle` and `@set_tile_code`, but no
route configuration, no `@block`/`@unblock` and no way to put a comment in the printed text. These ops are printed by
the lane's CSL print context (`passes/spatial/emit_csl.py`) and executed by the fabric simulator
(`logos_ir/runtime/spatial/`), exactly as the other `csl` ops are:

- `csl_ext.set_color_config`: `@set_color_config(x, y, @get_color(c), .{ .routes = .{ .rx = .{ WEST }, .tx = .{ RAMP,
  EAST } } })` in a layout: the router of element (x, y) takes colour c's wavelets from the `rx` directions and
  forwards each to every `tx` direction (RAMP: into the element's own input queue for colour c).
- `csl_ext.block` / `csl_ext.unblock`: `@block(@get_local_task_id(n))` / `@unblock(...)`: a blocked task that is
  activated runs only once unblocked.
- `csl_ext.comment`: a `// text` line (the identity line of the LOGOS program a function was lowered from).

The module also holds the facts of the machine the lane targets (a WSE-2, as the Cerebras SDK documents it), once for
the lowering that plans for them and the simulator that checks them: an element's memory, its colours, the bytes of
each element type and the estimate of a program's code size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import csl
from xdsl.dialects.builtin import ArrayAttr, IntAttr, StringAttr, i16
from xdsl.ir import Attribute, Dialect, Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, opt_operand_def, opt_prop_def, prop_def
from xdsl.utils.exceptions import VerifyException

DIRECTIONS = ("RAMP", "NORTH", "SOUTH", "EAST", "WEST")

# -- the WSE-2 ---------------------------------------------------------------------------------------------------

MEMORY = 48 * 1024  # bytes of memory per processing element
COLOURS = 24  # routable colours
RESERVED_COLOURS = (21, 22, 23)  # memcpy's colours on WSE-2: a program routes 0..20
WSE2_FABRIC = (757, 996)  # the machine's fabric (width, height), cslc's --fabric-dims (WaferLLM's compile.py)


@dataclass(frozen=True)
class Target:
    """The facts of one Cerebras machine the lane builds for (`--option arch=wse2|wse3`), each with its source:

    - `fabric`, `offsets`: the machine's `--fabric-dims` and `--fabric-offsets` (WaferLLM compiles for a WSE-2 with
      757,996 and 4,1, `Decode/WSE-2/compile.py`; for a WSE-3 with 762,1172 and 4,1, `Decode/WSE-3/compile.py`).
    - `usable`: the program's rectangle at most: memcpy takes three columns west and two east of it and a row above
      and below (the SDK's examples: `--fabric-dims=w+7,h+2 --fabric-offsets=4,1`), so 750 x 994 of a WSE-2.
    - `input_queues`, `output_queues`: the queue ids a fabric DSD may name, memcpy's taken out (csl-examples
      gemv-checkerboard `pe.csl`: "memcpy reserves input queue 0 and output queue 0" on WSE-2;
      `pipeline-03-multiple/memcpy_edge.csl`: "On WSE-3, memcpy module reserves queues 0 and 1"; 8 queues, ids 0 to
      7, `topic-15-wse3-microthreads`).
    - `one_colour_per_queue`: WSE-3 binds each queue to one colour with `@initialize_queue` in a comptime block
      (gemv-checkerboard `pe.csl`, `topic-16-queue-flush`: "On WSE-3, each output queue can only bind to a single
      color"); WSE-2 takes the colour from the DSD, so one queue may serve several.
    - `segmented_lines`: whether a line's reductions take WaferLLM's two phases (segments, then their centres: 19
      colours, and a segment's centre receives on four of a direction's); on a WSE-3 a line is one segment, two
      chains toward its centre and a broadcast (10 colours, at most two received a direction on any element), so
      each colour class gets one of its 6 input queues (`queues.bind_queues`).
    - `local_tasks`: the ids a local task may bind (`topic-05-sentinels`: 0 to 30 on WSE-2, 8 to 30 on WSE-3), less
      `reserved_tasks` (the gemv-checkerboard layout's task map: 21-23, 27, 28, 30 memcpy's, 29 and 31 reserved).
    """

    name: str
    fabric: tuple[int, int]
    offsets: tuple[int, int]
    input_queues: tuple[int, ...]
    output_queues: tuple[int, ...]
    one_colour_per_queue: bool
    local_tasks: tuple[int, int]  # the lowest and highest id
    segmented_lines: bool = True

    @property
    def usable(self) -> tuple[int, int]:
        return (self.fabric[0] - 7, self.fabric[1] - 2)

    def task_ok(self, task: int) -> bool:
        return self.local_tasks[0] <= task <= self.local_tasks[1] and task not in RESERVED_TASKS


RESERVED_TASKS = (21, 22, 23, 27, 28, 29, 30, 31)  # memcpy's ids and the reserved ones (gemv-checkerboard layout.csl)
TARGETS = {
    "wse2": Target("wse2", WSE2_FABRIC, (4, 1), tuple(range(1, 8)), tuple(range(1, 8)), False, (0, 30)),
    "wse3": Target("wse3", (762, 1172), (4, 1), tuple(range(2, 8)), tuple(range(2, 8)), True, (8, 30), False),
}
ELEMENT_BYTES = {"f16": 2, "i16": 2, "ui16": 2, "f32": 4, "i32": 4}  # bytes of an array element of each type
# Ops that print as no instruction (constants fold into their uses, a global's name is an address, a yield closes a
# block); every other op of a function or task counts CODE_BYTES_PER_OP of code (an estimate: the SDK publishes no
# code size per builtin).
NO_CODE = frozenset(
    {"arith.constant", "memref.get_global", "csl_ext.comment", "scf.yield", "csl.return", "csl.mlir.signedness_cast"}
)  # (a signedness cast is of a literal: `@as(u16, 91)`, folded)
CODE_BYTES_PER_OP = 4


@dataclass(frozen=True)
class Band:
    """A constant known only within a range, with where the range comes from."""

    low: int
    high: int
    source: str


# An element's memory beyond its arrays, as a band (`memory_band`): the SDK publishes no code size per builtin, nor
# the size of its libraries, memcpy's component or the stack; Cerebras's own examples keep their arrays under 46 KiB
# of the 48 (csl-examples' benchmarks), which bounds what the rest may take.
MEMORY_TERMS = {
    "code_per_op": Band(4, 6, "assumption: a DSD op's instruction and its DSR loads, 2 to 3 16-bit words"),
    "math_routine": Band(128, 512, "assumption: each <math> routine the program calls (exp, sqrt, sin, cos)"),
    "f32_division": Band(64, 256, "assumption: f32 division in software, if the program divides"),
    "memcpy": Band(1024, 2560, "memcpy's component on every element: the 2 KiB the SDK's examples leave, and more"),
    "stack": Band(256, 1024, "assumption: call frames of the step's functions and tasks"),
}
FOLDED = frozenset({"arith.index_cast", "arith.extsi", "arith.trunci"})  # cslc folds these into their uses


def memory_band(program: Operation, arrays: int) -> dict[str, int]:
    """An element's bytes as a band: `arrays` plus its code (each op of its functions and tasks that prints as an
    instruction, at MEMORY_TERMS' bytes an op; the low end leaves out the casts cslc folds), the `<math>` routines it
    calls, software f32 division if it divides, memcpy's component and a stack."""
    ops = [o for top in program.regions[0].block.ops if top.name in ("csl.func", "csl.task") for o in top.walk()]
    counted = [o for o in ops if o.name not in NO_CODE]
    folded = sum(1 for o in counted if o.name in FOLDED)
    routines = {o.properties["field"].data for o in ops if o.name == "csl.member_call" and not _reads_the_clock(o)}
    divides = any(o.name == "arith.divf" for o in ops)
    terms = MEMORY_TERMS

    def end(side: str) -> int:
        pick = (lambda b: b.low) if side == "low" else (lambda b: b.high)
        code = pick(terms["code_per_op"]) * (len(counted) - (folded if side == "low" else 0))
        extra = pick(terms["math_routine"]) * len(routines) + (pick(terms["f32_division"]) if divides else 0)
        return arrays + code + extra + pick(terms["memcpy"]) + pick(terms["stack"])

    return {"low": end("low"), "high": end("high")}


def _reads_the_clock(call: Operation) -> bool:
    """A call of `<time>` (enable_tsc, get_timestamp): it reads the cycle counter in a few instructions, counted as
    its op, not as a library routine."""
    module = call.operands[0].owner
    return getattr(module, "name", "") == "csl.import_module" and module.properties["module"].data == "<time>"  # type: ignore[union-attr]


def element_bytes(element: Attribute | str) -> int:
    """The bytes one array element of type `element` (`f16`, `i16`, `f32`, `i32`) takes in an element's memory."""
    name = str(element)
    if name not in ELEMENT_BYTES:
        raise VerifyException(f"csl_ext: an array element is one of {', '.join(ELEMENT_BYTES)}, not {name}")
    return ELEMENT_BYTES[name]


def code_bytes(program: Operation) -> int:
    """The estimated code bytes of an element program (a `csl.module`): CODE_BYTES_PER_OP for each op of its
    functions and tasks that prints as an instruction (not in NO_CODE)."""
    ops = [o for top in program.regions[0].block.ops if top.name in ("csl.func", "csl.task") for o in top.walk()]
    return CODE_BYTES_PER_OP * sum(1 for o in ops if o.name not in NO_CODE)


def queue_id(dsd: Operation) -> int:
    """A fabric DSD's queue (0 to 7): xDSL keeps it as a signless i3, which reads 4 to 7 back as -4 to -1."""
    return dsd.properties["queue_id"].value.data % 8  # type: ignore[attr-defined]


COLOUR_PARAM = "csl_ext.colour_param"  # a fabric DSD's attribute: the tile-code parameter its colour prints as


def colour_param(dsd: Operation) -> str | None:
    """The `color` parameter of the tile code a fabric DSD's colour prints as (`.fabric_color = row_west_in`, as
    gemv-checkerboard's `recv`), or None (a literal colour). Its `fabric_color` is the colour it uses on every
    element that runs it, which the parameter holds there (the static check and the simulator hold it to that)."""
    found = dsd.attributes.get(COLOUR_PARAM)
    return found.data if isinstance(found, StringAttr) else None


def _directions(names: Sequence[str]) -> ArrayAttr[StringAttr]:
    return ArrayAttr([StringAttr(n) for n in names])


@irdl_op_definition
class SetColorConfigOp(IRDLOperation):
    """A router's configuration for one colour at one element (x, y) of the layout (i16 coordinates):

    ```mlir
    %x = arith.constant 1 : i16
    %y = arith.constant 0 : i16
    csl_ext.set_color_config %x, %y colour #builtin.int<3> rx ["WEST"] tx ["RAMP", "EAST"]
    ```

    prints as `@set_color_config(x, y, @get_color(3), .{ .routes = .{ .rx = .{ WEST }, .tx = .{ RAMP, EAST } } });`.
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
    """A local task held back: activated, it runs only once unblocked. Prints as `@block(@get_local_task_id(10));`.

    ```mlir
    csl_ext.block #builtin.int<10>
    ```
    """

    name = "csl_ext.block"


@irdl_op_definition
class UnblockOp(_TaskControl):
    """A blocked local task released. Prints as `@unblock(@get_local_task_id(10));`.

    ```mlir
    csl_ext.unblock #builtin.int<10>
    ```
    """

    name = "csl_ext.unblock"


@irdl_op_definition
class CommentOp(IRDLOperation):
    """A `// text` line in the printed CSL (a function's identity line).

    ```mlir
    csl_ext.comment "LOGOS program: decode step's head, sha256 0123"
    ```
    """

    name = "csl_ext.comment"
    text = prop_def(StringAttr)
    assembly_format = "$text attr-dict"

    def __init__(self, text: str):
        super().__init__(properties={"text": StringAttr(text)})


@irdl_op_definition
class InitializeQueueOp(IRDLOperation):
    """A queue bound to one colour, as a WSE-3 needs for every queue a program's fabric DSDs use: a literal colour,
    or a `color` parameter of the element's tile code (each element its own, as csl-examples' gemv-checkerboard
    binds `recv` and `send`, swapped by the column's parity). Prints, in a top-level comptime block, as
    `@initialize_queue(@get_input_queue(2), .{ .color = @get_color(9) });` or `... .{ .color = row_west_in });`.

    ```mlir
    csl_ext.initialize_queue "input" #builtin.int<4> colour #builtin.int<8>
    csl_ext.initialize_queue "input" #builtin.int<2> param %row_west_in : !csl.color
    ```
    """

    name = "csl_ext.initialize_queue"
    side = prop_def(StringAttr)
    queue = prop_def(IntAttr)
    colour = opt_prop_def(IntAttr)
    colour_param = opt_operand_def(csl.ColorType)

    assembly_format = "$side $queue (`colour` $colour^)? (`param` $colour_param^ `:` type($colour_param))? attr-dict"

    def __init__(self, inbound: bool, queue: int, colour: int | SSAValue):
        side = StringAttr("input" if inbound else "output")
        if isinstance(colour, int):
            properties = {"side": side, "queue": IntAttr(queue), "colour": IntAttr(colour)}
            super().__init__(operands=[[]], properties=properties)
        else:
            super().__init__(operands=[[colour]], properties={"side": side, "queue": IntAttr(queue)})

    @property
    def inbound(self) -> bool:
        return self.side.data == "input"

    @property
    def param_name(self) -> str | None:
        """The tile-code parameter the colour is, or None for a literal colour."""
        if self.colour_param is None:
            return None
        owner = self.colour_param.owner
        return owner.param_name.data if isinstance(owner, csl.ParamOp) else None

    def verify_(self) -> None:
        if self.side.data not in ("input", "output"):
            raise VerifyException(f"{self.name}: a queue is an input or an output queue, not '{self.side.data}'")
        if not 0 <= self.queue.data < 8:
            raise VerifyException(f"{self.name}: queue {self.queue.data} is outside 0..7")
        if (self.colour is None) == (self.colour_param is None):
            raise VerifyException(f"{self.name}: a queue is bound to a literal colour or to a colour parameter")
        if self.colour_param is not None and self.param_name is None:
            raise VerifyException(f"{self.name}: a queue's colour operand is a parameter of the tile code (csl.param)")
        if self.colour is not None and not 0 <= self.colour.data < COLOURS:
            raise VerifyException(f"{self.name}: colour {self.colour.data} is outside 0..{COLOURS - 1}")


CSL_EXT = Dialect("csl_ext", [SetColorConfigOp, BlockOp, UnblockOp, CommentOp, InitializeQueueOp], [])

__all__ = [
    "CODE_BYTES_PER_OP",
    "COLOURS",
    "CSL_EXT",
    "DIRECTIONS",
    "ELEMENT_BYTES",
    "MEMORY",
    "NO_CODE",
    "RESERVED_COLOURS",
    "RESERVED_TASKS",
    "TARGETS",
    "WSE2_FABRIC",
    "BlockOp",
    "CommentOp",
    "InitializeQueueOp",
    "SetColorConfigOp",
    "Band",
    "FOLDED",
    "MEMORY_TERMS",
    "Target",
    "UnblockOp",
    "memory_band",
    "COLOUR_PARAM",
    "colour_param",
    "queue_id",
    "code_bytes",
    "element_bytes",
]
