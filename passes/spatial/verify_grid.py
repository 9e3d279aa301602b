"""`verify-csl-grid{grid=P}`: the static check of the spatial lane's csl-level module, and the layout it reads.

Assumes: a module holding the lane's two `csl.module`s, the element program and the layout (what
`convert-logos-to-csl` gives). Guarantees: the IR is unchanged; a module is refused, naming the pass and the op, when
it uses a colour memcpy reserves on WSE-2 (21, 22, 23) or one outside a WSE-2's 24, receives a colour no element
sends, binds a local task id twice or to a colour the program routes, declares a symbol twice in the program's top
scope, or, as CSL text, declares a name twice in one scope or shadows a name of an enclosing scope (CSL, as Zig, allows
neither); and the target's DSD-length, queue and task-id rules (`_check_dsd_lengths`, `_check_queues`,
`_check_top_scope`). With `grid` (the layout's width and height, as `cslc --params` gives them) a receive nothing sends
names the first element that reaches it, and a WSE-3's queue bindings are checked on every element.

The layout's meaning is here too (`read_layout`): its loops, branches and builtins executed into the rectangle, each
element's tile parameters and each router's colour configurations, refusing a colour configured twice at one router.
The check runs it to name an element; the fabric simulator reads a build's layout with it. It runs the layout's IR
as one Python function made from its ops, a statement an op and each value a local (a WSE-3 rectangle of 800,000
elements runs its loops in seconds); what it computes is what walking the ops gives.
"""

from __future__ import annotations

import gc
import itertools
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects import arith, csl, memref, scf
from xdsl.dialects.builtin import IntegerType, ModuleOp, Signedness, StringAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from logos_ir.dialects import csl_ext
from logos_ir.errors import PassError

PASS = "verify-csl-grid"


@dataclass(frozen=True)
class VerifyCslGrid(ModulePass):
    """`verify-csl-grid{grid=P}`: the static check (see the module docstring); `grid=0` reads the program alone."""

    name = "verify-csl-grid"

    grid: int = 0
    arch: str = ""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from logos_ir.passes.spatial.emit_csl import print_csl

        params = {"width": self.grid, "height": self.grid} if self.grid else None
        static_check(op, "\n// FILE:".join(["", *print_csl(op).values()]), params, self.arch or None)


def layout_params(host: dict[str, Any]) -> dict[str, int]:
    """The layout's parameters (as commands.sh passes them to cslc) for a build's host plan: the grid's width and
    height."""
    width, height = host["grid"]
    return {"width": width, "height": height}


def split_modules(module: ModuleOp) -> tuple[csl.CslModuleOp, csl.CslModuleOp]:
    """The element program and the layout `csl.module` of a csl-level module."""
    program = layout = None
    for op in module.ops:
        if isinstance(op, csl.CslModuleOp):
            if op.kind.data == csl.ModuleKind.LAYOUT:
                layout = op
            else:
                program = op
    if program is None or layout is None:
        raise PassError(f"{PASS}: the grid needs a program csl.module and a layout csl.module")
    return program, layout


# -- the static check ------------------------------------------------------------------------------------------


def target_of(module: ModuleOp, arch: str | None = None) -> csl_ext.Target:
    """The machine a module is built for: `arch` if given, else the program's `csl_ext.arch` attribute (the
    lowering's `--option arch`), else a WSE-2."""
    if arch is None:
        program, _ = split_modules(module)
        found = program.attributes.get("csl_ext.arch")
        arch = found.data if isinstance(found, StringAttr) else "wse2"
    if arch not in csl_ext.TARGETS:
        raise PassError(f"{PASS}: no target '{arch}' (the targets: {', '.join(csl_ext.TARGETS)})")
    return csl_ext.TARGETS[arch]


def static_check(
    module: ModuleOp, printed: str | None = None, params: dict[str, int] | None = None, arch: str | None = None
) -> None:
    """Refuse (PassError) what the module docstring lists; `printed` is the module's CSL text (files split by
    `// FILE:` lines), `params` the layout's parameters (None: the layout is not run), `arch` the target (None: the
    module's, `target_of`)."""
    program, layout = split_modules(module)
    target = target_of(module, arch)
    _check_dsd_lengths(program)
    layout_run = read_layout(layout, params) if params is not None and target.one_colour_per_queue else None
    _check_queues(program, target, layout_run)
    sent, received = _fabric_colours(program)
    for op in layout.walk():
        if isinstance(op, csl_ext.SetColorConfigOp):
            _check_colour(op.colour.data, op)
    for colour, op in received:
        if colour not in sent:
            elements = _elements_reaching(op, program, layout, params)
            raise PassError(
                f"{PASS}: colour {colour} is received (@get_dsd(fabin_dsd) in {_function_of(op)}, on element "
                f"{elements}) but no element sends it"
            )
    _check_top_scope(program, sent | {c for c, _ in received}, target)
    if printed is not None:
        check_scopes(printed)


def _fabric_colours(program: csl.CslModuleOp) -> tuple[set[int], list[tuple[int, Operation]]]:
    """The colours the program sends, and each fabric input DSD with its colour."""
    sent: set[int] = set()
    received: list[tuple[int, Operation]] = []
    for op in program.walk():
        if isinstance(op, csl.GetFabDsdOp):
            colour = op.fabric_color.value.data
            _check_colour(colour, op)
            if op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd):
                # a DSD of the program's top level is named where a function uses it (its @set_dsd_length)
                uses = [u.operation for u in op.result.uses] if op.parent_op() is program else []
                received.extend((colour, use) for use in (uses or [op]))
            else:
                sent.add(colour)
    return sent, received


def _check_top_scope(program: csl.CslModuleOp, routed: set[int], target: csl_ext.Target) -> None:
    names: set[str] = set()
    tasks: dict[int, str] = {}
    for op in program.body.block.ops:
        if isinstance(op, memref.GlobalOp | csl.FuncOp | csl.TaskOp):
            name = op.sym_name.data
            if name in names:
                raise PassError(f"{PASS}: '{name}' is declared twice in the program's top scope")
            names.add(name)
        if isinstance(op, csl.TaskOp) and op.id is not None:
            task_id = op.id.value.data
            if task_id in tasks:
                raise PassError(f"{PASS}: task id {task_id} is bound to {tasks[task_id]} and {op.sym_name.data}")
            if task_id in routed:
                raise PassError(f"{PASS}: local task id {task_id} is also a colour the program routes")
            if not target.task_ok(task_id):
                low, high = target.local_tasks
                raise PassError(
                    f"{PASS}: local task id {task_id} ({op.sym_name.data}) is not one a {target.name} gives: "
                    f"{low} to {high}, less memcpy's and the reserved ({', '.join(map(str, csl_ext.RESERVED_TASKS))})"
                )
            tasks[task_id] = op.sym_name.data


U16 = IntegerType(16, Signedness.UNSIGNED)
_DSD_NAMES = {
    csl.DsdKind.mem1d_dsd: "mem1d_dsd",
    csl.DsdKind.mem4d_dsd: "mem4d_dsd",
    csl.DsdKind.fabin_dsd: "fabin_dsd",
    csl.DsdKind.fabout_dsd: "fabout_dsd",
}


def _dsd_where(op: csl.GetMemDsdOp | csl.GetFabDsdOp | csl.SetDsdLengthOp) -> str:
    if isinstance(op, csl.GetMemDsdOp):
        what = f"@get_dsd(mem1d_dsd) over {_array_name(op.base_addr)}"
    elif isinstance(op, csl.GetFabDsdOp):
        what = f"@get_dsd({_DSD_NAMES[op.result.type.data]}) on colour {op.fabric_color.value.data}"
    else:
        source = op.op.owner
        what = _dsd_where(source).split(" in ")[0] if isinstance(source, csl.GetFabDsdOp) else "@set_dsd_length"
    return f"{what} in {_function_of(op)}"


def _array_name(value: SSAValue) -> str:
    owner = value.owner
    if isinstance(owner, csl.AddressOfOp):
        return _array_name(owner.value)
    if isinstance(owner, memref.GetGlobalOp):
        return owner.name_.root_reference.data
    return "an array"


def _check_dsd_lengths(program: csl.CslModuleOp) -> None:
    """What cslc takes of a DSD's length (the SDK's DSD documentation, sdk.cerebras.ai/csl/language/dsds): a
    `tensor_access` length and a fabric DSD's `extent` known at compile time (a constant or a parameter of the
    program: printed as a literal, CSL's comptime_int, as csl-examples' `.extent = 1`), from 0 to 65535 (a u16);
    a length known only at run time is `@set_dsd_length`'s, whose argument is a u16 (a signed i16 is refused)."""
    for op in program.walk():
        if isinstance(op, csl.GetMemDsdOp | csl.GetFabDsdOp):
            for size in op.sizes:
                owner = size.owner
                if not isinstance(owner, arith.ConstantOp | csl.ParamOp):
                    raise PassError(
                        f"{PASS}: {_dsd_where(op)} has a length known only at run time: cslc takes a DSD's length "
                        "known at compile time (give the DSD its longest length and @set_dsd_length the run-time one)"
                    )
                if isinstance(owner, arith.ConstantOp):
                    value = owner.value.value.data  # type: ignore[attr-defined]
                    if not 0 <= value < 1 << 16:
                        raise PassError(f"{PASS}: {_dsd_where(op)} has length {value}: a u16 holds 0 to 65535")
        if isinstance(op, csl.SetDsdLengthOp) and op.length.type != U16:
            raise PassError(f"{PASS}: {_dsd_where(op)} sets a length of type {op.length.type}: it takes a u16")


def _check_queues(program: csl.CslModuleOp, target: csl_ext.Target, layout: Layout | None) -> None:
    """Each fabric DSD's queue is one the target gives the program (memcpy's left out); on a target that binds each
    queue to one colour (WSE-3), each queue a DSD uses is bound once, by `@initialize_queue`, to a colour or to a
    `color` parameter of the tile code, and with the layout run (`layout`), on every element: each DSD that element
    can reach (its branches on the element's parameters) uses a queue bound there to the DSD's colour, and each
    colour its router delivers to it (or takes from it) has an input (output) queue bound to that colour there."""
    bound: dict[tuple[bool, int], csl_ext.InitializeQueueOp] = {}
    used: list[tuple[csl.GetFabDsdOp, bool, int]] = []
    for op in program.walk():
        if isinstance(op, csl_ext.InitializeQueueOp):
            key = (op.inbound, op.queue.data)
            if key in bound:
                raise PassError(
                    f"{PASS}: {op.side.data} queue {op.queue.data} is initialized twice (with "
                    f"{_binding(bound[key])} and {_binding(op)})"
                )
            bound[key] = op
        if isinstance(op, csl.GetFabDsdOp):
            inbound = op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
            queue = csl_ext.queue_id(op)
            side = "input" if inbound else "output"
            free = target.input_queues if inbound else target.output_queues
            if queue not in free:
                raise PassError(
                    f"{PASS}: {_dsd_where(op)} uses {side} queue {queue}: a {target.name} program has {side} queues "
                    f"{free[0]} to {free[-1]} (memcpy takes the others)"
                )
            used.append((op, inbound, queue))
    if not target.one_colour_per_queue:
        return
    for op, inbound, queue in used:
        side = "input" if inbound else "output"
        binding = bound.get((inbound, queue))
        colour = op.fabric_color.value.data
        if binding is None or (binding.colour is not None and binding.colour.data != colour):
            raise PassError(
                f"{PASS}: {_dsd_where(op)} uses {side} queue {queue}, which no @initialize_queue binds to colour "
                f"{colour} (a {target.name} needs it)"
            )
    if layout is not None:
        _check_queues_per_element(program, layout, bound, used)


def _binding(op: csl_ext.InitializeQueueOp) -> str:
    return f"colour {op.colour.data}" if op.colour is not None else f"the parameter {op.param_name}"


class _ParamColumns:
    """The layout's tile parameters a name at a time, each read once from the elements' dictionaries (the layout
    gives hundreds of thousands): its values as an array over the elements in the order of `Layout.params`, 0
    where a value is not an integer (a struct such as memcpy's), and where it is given."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.index = np.array([y * layout.width + x for x, y in layout.params], dtype=np.int64)  # y * width + x
        self._read: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self._read:
            given = [g.get(name) for g in self.layout.params.values()]  # a layout's values are never None
            values = np.array(given)  # integers (a colour, a coordinate): one conversion
            if values.dtype.kind not in "biu":  # a struct (memcpy's), or an element without it
                values = np.array([v if isinstance(v, int) else 0 for v in given], dtype=np.int64)
            present = np.ones(len(given), dtype=bool)
            if None in given:  # an element given no such parameter
                present = np.array([v is not None for v in given], dtype=bool)
            self._read[name] = values.astype(np.int64), present
        return self._read[name]

    def over_elements(self, name: str, absent: int) -> np.ndarray:
        """The parameter on every element (index y * width + x), `absent` on an element the layout gives none."""
        out = np.full(self.layout.width * self.layout.height, absent, dtype=np.int64)
        out[self.index] = self.column(name)[0]
        return out

    def first_without(self, name: str) -> tuple[int, int] | None:
        """The first element (in the layout's order) whose tile parameters do not give `name`."""
        missing = np.flatnonzero(~self.column(name)[1])
        return next(itertools.islice(self.layout.params, int(missing[0]), None)) if missing.size else None


def _bound_colours(
    columns: _ParamColumns, bound: dict[tuple[bool, int], csl_ext.InitializeQueueOp]
) -> dict[tuple[bool, int], np.ndarray]:
    """Each queue's colour on every element (element index y * width + x), from its literal or its parameter."""
    n = columns.layout.width * columns.layout.height
    out: dict[tuple[bool, int], np.ndarray] = {}
    for key, op in bound.items():
        if op.colour is not None:
            out[key] = np.full(n, op.colour.data, dtype=np.int64)
            continue
        name = op.param_name
        lacking = columns.first_without(name)
        if lacking is not None:
            x, y = lacking
            raise PassError(f"{PASS}: element ({x}, {y}) is given no '{name}' (the colour of {_binding(op)})")
        out[key] = columns.over_elements(name, -1)
    return out


def _check_queues_per_element(
    program: csl.CslModuleOp,
    layout: Layout,
    bound: dict[tuple[bool, int], csl_ext.InitializeQueueOp],
    used: list[tuple[csl.GetFabDsdOp, bool, int]],
) -> None:
    width = layout.width
    columns = _ParamColumns(layout)
    colours = _bound_colours(columns, bound)
    known = _element_values(program, columns)
    by_name = {op.param_name.data: known[op.res] for op in program.body.block.ops if isinstance(op, csl.ParamOp)}
    for op, inbound, queue in used:
        colour = op.fabric_color.value.data
        here = colours[(inbound, queue)]
        param = csl_ext.colour_param(op)
        if param is not None and param not in by_name:
            raise PassError(
                f"{PASS}: {_dsd_where(op)} prints its colour as '{param}', which the program does not declare"
            )
        uses = [u.operation for u in op.result.uses] if op.parent_op() is program else [op]
        for use in uses:
            reach = _reaching(use, known)
            named = reach & (by_name[param] != colour) if param is not None else reach & False
            if named.any():
                e = int(np.flatnonzero(named)[0])
                raise PassError(
                    f"{PASS}: {_dsd_where(op)} on element ({e % width}, {e // width}) names its colour as the "
                    f"parameter {param}, which is {int(by_name[param][e])} there, not {colour}"
                )
            wrong = reach & (here != colour)
            if wrong.any():
                e = int(np.flatnonzero(wrong)[0])
                raise PassError(
                    f"{PASS}: {_dsd_where(op)} on element ({e % width}, {e // width}) uses "
                    f"{'input' if inbound else 'output'} queue {queue}, which that element binds to colour "
                    f"{int(here[e])}, not {colour}"
                )
    _check_ramps(layout, colours)


def _check_ramps(layout: Layout, colours: dict[tuple[bool, int], np.ndarray]) -> None:
    """Each colour a router delivers to its element (its ramp among the directions it sends to, and not only
    from the ramp) has an input queue bound to it there, and each colour it takes from its element an output
    queue; the first route that has none (in the order of (x, y, colour)) is refused. Over every route at once."""
    if not layout.routes:
        return
    keys = np.fromiter(itertools.chain.from_iterable(layout.routes), dtype=np.int64, count=3 * len(layout.routes))
    keys = keys.reshape(-1, 3)
    elements = keys[:, 1] * layout.width + keys[:, 0]
    kinds: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
    kind = np.array([kinds.setdefault(route, len(kinds)) for route in layout.routes.values()], dtype=np.int64)
    delivers = np.array([("RAMP" in tx and rx != ("RAMP",)) for rx, tx in kinds], dtype=bool)[kind]
    takes = np.array(["RAMP" in rx for rx, _ in kinds], dtype=bool)[kind]
    missing = []
    for inbound, flows in ((True, delivers), (False, takes)):
        has = np.zeros(len(keys), dtype=bool)
        for (side, _), bound in colours.items():
            if side == inbound:
                has |= bound[elements] == keys[:, 2]
        missing.append(flows & ~has)
    wrong = np.flatnonzero(missing[0] | missing[1])
    if wrong.size:
        first = wrong[np.lexsort((keys[wrong, 2], keys[wrong, 1], keys[wrong, 0]))[0]]
        x, y, colour = (int(k) for k in keys[first])
        inbound = bool(missing[0][first])
        raise PassError(
            f"{PASS}: the router of element ({x}, {y}) {'delivers' if inbound else 'takes'} colour {colour} "
            f"{'to' if inbound else 'from'} it, and it binds no {'input' if inbound else 'output'} queue to "
            "that colour"
        )


def _element_values(program: csl.CslModuleOp, columns: _ParamColumns) -> dict[SSAValue, np.ndarray]:
    """Each parameter of the program as an array over the elements (index y * width + x; 0 where it is not an
    integer or not given)."""
    return {
        op.res: columns.over_elements(op.param_name.data, 0)
        for op in program.body.block.ops
        if isinstance(op, csl.ParamOp)
    }


def _reaching(op: Operation, known: dict[SSAValue, np.ndarray]) -> np.ndarray:
    """Which elements may run `op`: those whose values of the branches around it (computed from the parameters and
    constants; a branch on anything else may go either way) take it."""
    n = next(iter(known.values())).size if known else 1
    reach = np.ones(n, dtype=bool)
    cache: dict[SSAValue, Any] = {}
    child: Operation = op
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, csl.FuncOp | csl.TaskOp):
        if isinstance(parent, scf.IfOp):
            value = _element_value(parent.cond, known, cache)
            if value is not None:
                taken = child.parent_region() is parent.true_region
                reach &= np.asarray(value, dtype=bool) == taken
        child, parent = parent, parent.parent_op()
    return reach


def _element_value(value: SSAValue, known: dict[SSAValue, np.ndarray], cache: dict[SSAValue, Any]) -> Any:
    """An integer computed from the parameters and constants, over every element (None if it depends on more)."""
    if value in known:
        return known[value]
    if value in cache:
        return cache[value]
    op = value.owner
    result: Any = None
    if isinstance(op, arith.ConstantOp):
        result = op.value.value.data  # type: ignore[attr-defined]
    elif isinstance(op, Operation) and type(op) in _ELEMENT_OPS:
        args = [_element_value(o, known, cache) for o in op.operands]
        if all(a is not None for a in args):
            result = _ELEMENT_OPS[type(op)](op, *args)
    cache[value] = result
    return result


def _check_colour(colour: int, op: Operation) -> None:
    if colour in csl_ext.RESERVED_COLOURS:
        reserved = ", ".join(map(str, csl_ext.RESERVED_COLOURS))
        raise PassError(f"{PASS}: colour {colour} ({op.name}) is reserved by memcpy on WSE-2 ({reserved})")
    if not 0 <= colour < csl_ext.COLOURS:
        raise PassError(f"{PASS}: colour {colour} ({op.name}) is outside a WSE-2's {csl_ext.COLOURS} colours")


def _function_of(op: Operation) -> str:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, csl.FuncOp | csl.TaskOp):
        parent = parent.parent_op()
    return parent.sym_name.data if parent is not None else "the program"


def _elements_reaching(
    op: Operation, program: csl.CslModuleOp, layout_module: csl.CslModuleOp, params: dict[str, int] | None
) -> str:
    """The first element (x, y) whose parameters take every branch around `op` (branches on the element's
    parameters and constants only); '(unknown: no grid given)' without the layout's parameters."""
    if params is None:
        return "(unknown: no grid given)"
    layout = read_layout(layout_module, params)
    conditions: list[tuple[SSAValue, bool]] = []
    child: Operation = op
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, csl.FuncOp | csl.TaskOp):
        if isinstance(parent, scf.IfOp):
            conditions.append((parent.cond, child.parent_region() is parent.true_region))
        child, parent = parent, parent.parent_op()
    declared = {o.param_name.data: o.res for o in program.body.block.ops if isinstance(o, csl.ParamOp)}
    for (x, y), values in sorted(layout.params.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        known = {declared[k]: v for k, v in values.items() if k in declared}
        if all(_static_value(c, known) in (taken, None) for c, taken in conditions):
            return f"({x}, {y})"
    return "(none)"


def _static_value(value: SSAValue, known: dict[SSAValue, Any]) -> Any:
    """The value of an integer computed from the element's parameters and constants (None if it depends on more)."""
    if value in known:
        return known[value]
    op = value.owner
    if isinstance(op, arith.ConstantOp):
        return op.value.value.data  # type: ignore[attr-defined]
    integer = INTEGER_OPS.get(type(op)) if isinstance(op, Operation) else None
    if integer is None:
        return None
    args = [_static_value(o, known) for o in op.operands]  # type: ignore[union-attr]
    if any(a is None for a in args):
        return None
    return integer(op, *args)


_DECLARATION = re.compile(r"^\s*(?:const|var|param)\s+([A-Za-z_][A-Za-z0-9_]*)")
_CAPTURE = re.compile(r"\|\s*([A-Za-z_][A-Za-z0-9_]*)\s*\|\s*\{\s*$")


def check_scopes(printed: str) -> None:
    """Refuse CSL text (one file or several, split by `// FILE:` lines) that declares a name twice in one scope or
    shadows a name of an enclosing scope."""
    for chunk in printed.split("// FILE:"):
        scopes: list[set[str]] = [set()]
        for number, line in enumerate(chunk.splitlines(), 1):
            code = line.split("//", 1)[0]
            match = _DECLARATION.match(code)
            names = [match.group(1)] if match else []
            capture = _CAPTURE.search(code)
            if capture and "for" in code:
                names.append(capture.group(1))
            opening = code.count("{") - code.count("}")
            for name in names:
                if any(name in scope for scope in scopes):
                    head = chunk.splitlines()[0].strip() if chunk.strip() else "?"
                    raise PassError(f"{PASS}: '{name}' is declared twice in one scope ({head}, line {number})")
                if not (capture and name == capture.group(1)):
                    scopes[-1].add(name)
            for _ in range(max(opening, 0)):
                scopes.append(set())
            if capture and "for" in code:
                scopes[-1].add(capture.group(1))
            for _ in range(max(-opening, 0)):
                if len(scopes) > 1:
                    scopes.pop()


# -- the layout ------------------------------------------------------------------------------------------------


def _compare(op: arith.CmpiOp, a: int, b: int) -> bool:
    predicate = op.predicate.value.data
    return [a == b, a != b, a < b, a <= b, a > b, a >= b, a < b, a <= b, a > b, a >= b][predicate]


# The integer arithmetic a layout (and an element's choice of branch) computes with, by op type.
INTEGER_OPS: dict[type[Operation], Callable[..., Any]] = {
    arith.AddiOp: lambda op, a, b: a + b,
    arith.SubiOp: lambda op, a, b: a - b,
    arith.MuliOp: lambda op, a, b: a * b,
    arith.DivSIOp: lambda op, a, b: int(a / b),
    arith.RemSIOp: lambda op, a, b: int(math.fmod(a, b)),
    arith.CmpiOp: _compare,
    arith.AndIOp: lambda op, a, b: bool(a) and bool(b),
    arith.SelectOp: lambda op, c, a, b: a if c else b,
    arith.ExtSIOp: lambda op, a: a,
    arith.TruncIOp: lambda op, a: a,
    arith.IndexCastOp: lambda op, a: a,
}


# INTEGER_OPS over arrays of every element's values (`_element_value`)
_ELEMENT_OPS: dict[type[Operation], Callable[..., Any]] = {
    **{k: INTEGER_OPS[k] for k in (arith.AddiOp, arith.SubiOp, arith.MuliOp, arith.CmpiOp, arith.ExtSIOp)},
    **{k: INTEGER_OPS[k] for k in (arith.TruncIOp, arith.IndexCastOp)},
    arith.DivSIOp: lambda op, a, b: np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b)),
    arith.RemSIOp: lambda op, a, b: np.fmod(a, b),
    arith.AndIOp: lambda op, a, b: np.logical_and(a, b),
    arith.SelectOp: lambda op, c, a, b: np.where(c, a, b),
}


@dataclass
class Layout:
    """What the layout module sets: the rectangle, each element's tile parameters and program file, and each
    router's colour configurations ((x, y, colour): (the directions taken from, the directions sent to))."""

    width: int
    height: int
    params: dict[tuple[int, int], dict[str, Any]]
    routes: dict[tuple[int, int, int], tuple[tuple[str, ...], tuple[str, ...]]]
    files: dict[tuple[int, int], str]


@dataclass
class _Loop:
    """A `for` of the layout's function: its indentation, and the statements hoisted out of it (run once, just
    before it)."""

    depth: int
    hoisted: list[str]


class _LayoutSource:
    """The layout module as one Python function: each SSA value a local variable, each op one statement, each
    `scf.for` a Python `for`, each `scf.if` an `if` (a layout's branches yield nothing), each builtin a statement
    on the outputs (`size`, `params`, `files`, `routes`). Compiled once and run once, it is the op-by-op walk
    without an interpreter's dispatch. An op the layout cannot run becomes a statement that refuses it by name
    where it runs, as walking the ops would.

    An integer op whose operands do not change in a loop runs once, before the outermost loop they do not change
    in (loop-invariant code motion): most of a layout's arithmetic is a column's, the same for each of its
    elements, or a constant's. Those ops have no effect but their value and cannot fail (a division or remainder
    moves only by a constant other than 0), so moving them, out of a branch too, computes what the walk does."""

    def __init__(self) -> None:
        self.names: dict[SSAValue, str] = {}
        self.consts: dict[str, Any] = {}  # the function's free values: integers, routes, file names
        self.lines: list[str | list[str]] = []  # a list: the statements hoisted out of the `for` that follows it
        self.loops: list[_Loop] = []  # the loops around the op being turned, outermost first
        self.levels: dict[SSAValue, int] = {}  # how many of the loops around a value's definition (0: none)
        self.constants: dict[SSAValue, Any] = {}  # the values of arith.constant ops

    def name(self, value: SSAValue) -> str:
        known = self.names.get(value)
        if known is None:
            known = self.names[value] = f"v{len(self.names)}"
        return known

    def const(self, value: Any) -> str:
        key = f"c{len(self.consts)}"
        self.consts[key] = value
        return key

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def assign(self, depth: int, result: SSAValue, expression: str, operands: Sequence[SSAValue], pure: bool) -> None:
        """`result = expression`, where the op stands or, `pure` (no effect, cannot fail), before the outermost loop
        none of its operands changes in."""
        level = max((self.levels.get(o, 0) for o in operands), default=0) if pure else len(self.loops)
        self.levels[result] = level
        line = f"{self.name(result)} = {expression}"
        if level == len(self.loops):
            self.emit(depth, line)
            return
        loop = self.loops[level]
        loop.hoisted.append("    " * loop.depth + line)

    def text(self, signature: str) -> str:
        """The function's source, each loop's hoisted statements just before it."""
        lines = [signature]
        for line in self.lines:
            lines.extend(line if isinstance(line, list) else [line])
        return "\n".join(lines) + "\n"

    def block(self, block: Block, depth: int) -> None:
        start = len(self.lines)
        for op in block.ops:
            self.op(op, depth)
        if len(self.lines) == start:
            self.emit(depth, "pass")

    def op(self, op: Operation, depth: int) -> None:
        n, emit = self.name, self.emit
        if isinstance(op, scf.YieldOp | csl.ParamOp):
            return
        if isinstance(op, csl.LayoutOp):
            self.block(op.body.block, depth)
        elif isinstance(op, scf.ForOp):
            loop = _Loop(depth, [])
            self.lines.append(loop.hoisted)
            emit(depth, f"for {n(op.body.block.args[0])} in range({n(op.lb)}, {n(op.ub)}, {n(op.step)}):")
            self.loops.append(loop)
            self.levels[op.body.block.args[0]] = len(self.loops)
            self.block(op.body.block, depth + 1)
            self.loops.pop()
        elif isinstance(op, scf.IfOp):
            emit(depth, f"if {n(op.cond)}:")
            if op.true_region.blocks:
                self.block(op.true_region.block, depth + 1)
            else:
                emit(depth + 1, "pass")
            if op.false_region.blocks:
                emit(depth, "else:")
                self.block(op.false_region.block, depth + 1)
        elif isinstance(op, arith.ConstantOp):
            value = self.constants[op.result] = op.value.value.data  # type: ignore[attr-defined]
            self.assign(depth, op.result, self.const(value), (), pure=True)
        elif type(op) in _SOURCE_OPS:
            expression = _SOURCE_OPS[type(op)](op, *(n(o) for o in op.operands))
            self.assign(depth, op.results[0], expression, op.operands, pure=self._cannot_fail(op))
        elif isinstance(op, csl.ImportModuleConstOp):
            self.assign(depth, op.result, f"{{'module': {self.const(op.module.data)}}}", (), pure=False)
        elif isinstance(op, csl.MemberCallOp):
            call = f"{{'memcpy_column': {n(op.args[0])}}}" if op.args else "{}"
            self.assign(depth, op.result, call, op.args, pure=False)  # a dictionary: each element its own
        elif isinstance(op, csl.ConstStructOp):
            fields = zip(op.ssa_fields.data, op.ssa_values, strict=True)  # type: ignore[union-attr]
            struct = "{" + ", ".join(f"{self.const(f.data)}: {n(v)}" for f, v in fields) + "}"
            self.assign(depth, op.res, struct, op.ssa_values, pure=False)
        elif isinstance(op, csl.ConcatStructOp):
            struct = f"{{**{n(op.this_struct)}, **{n(op.another_struct)}}}"
            self.assign(depth, op.result, struct, op.operands, pure=False)
        elif isinstance(op, csl.SetRectangleOp):
            emit(depth, f"size[0] = ({n(op.x_dim)}, {n(op.y_dim)})")
        elif isinstance(op, csl.SetTileCodeOp):
            emit(depth, f"tile = ({n(op.x_coord)}, {n(op.y_coord)})")
            emit(depth, f"params[tile] = {self._tile_params(op.params)}")
            emit(depth, f"files[tile] = {self.const(op.file.data)}")
        elif isinstance(op, csl_ext.SetColorConfigOp):
            emit(depth, f"key = ({n(op.x)}, {n(op.y)}, {self.const(op.colour.data)})")
            emit(depth, "if key in routes:")
            emit(depth + 1, "twice(*key)")
            emit(depth, f"routes[key] = {self.const((op.receives, op.transmits))}")
        elif isinstance(op, csl.GetColorOp):
            self.assign(depth, op.res, n(op.id), (op.id,), pure=True)
        else:
            emit(depth, f"refuse({self.const(op.name)})")
            self.levels.update((result, len(self.loops)) for result in op.results)  # what uses them stays after

    def _tile_params(self, struct: SSAValue | None) -> str:
        """An element's parameters: a copy of the struct, or the struct itself where it is made afresh for this
        element alone (in the same loop, by a struct op, and given to no other op)."""
        if struct is None:
            return "{}"
        made_here = isinstance(struct.owner, csl.ConstStructOp | csl.ConcatStructOp)
        if made_here and struct.has_one_use() and self.levels.get(struct) == len(self.loops):
            return self.name(struct)
        return f"dict({self.name(struct)})"

    def _cannot_fail(self, op: Operation) -> bool:
        """An integer op that cannot raise: all but a division or remainder by what may be 0."""
        if not isinstance(op, arith.DivSIOp | arith.RemSIOp):
            return True
        return self.constants.get(op.operands[1]) not in (0, None)


def _twice(x: int, y: int, colour: int) -> None:
    raise PassError(f"{PASS}: the layout configures colour {colour} twice at element ({x}, {y})")


def _refuse(name: str) -> None:
    raise PassError(f"{PASS}: a layout does not run '{name}'")


_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=", "<", "<=", ">", ">=")  # arith.cmpi's predicates, in order

# INTEGER_OPS as Python expressions over their operands' names: the same values (`int(a / b)` and `fmod` as
# INTEGER_OPS computes C's truncating division and remainder; `%` where the dividend is not negative and the divisor
# positive, as in a layout's parities: the same remainder without a call)
_SOURCE_OPS: dict[type[Operation], Callable[..., str]] = {
    arith.AddiOp: lambda op, a, b: f"{a} + {b}",
    arith.SubiOp: lambda op, a, b: f"{a} - {b}",
    arith.MuliOp: lambda op, a, b: f"{a} * {b}",
    arith.DivSIOp: lambda op, a, b: f"int({a} / {b})",
    arith.RemSIOp: lambda op, a, b: f"{a} % {b} if {a} >= 0 and {b} > 0 else int(fmod({a}, {b}))",
    arith.CmpiOp: lambda op, a, b: f"{a} {_COMPARISONS[op.predicate.value.data]} {b}",
    arith.AndIOp: lambda op, a, b: f"bool({a}) and bool({b})",
    arith.SelectOp: lambda op, c, a, b: f"{a} if {c} else {b}",
    arith.ExtSIOp: lambda op, a: a,
    arith.TruncIOp: lambda op, a: a,
    arith.IndexCastOp: lambda op, a: a,
}


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused: a layout's run makes millions of dictionaries and tuples that live
    on (an entry an element and a router's colour), none of them garbage, and the collector's passes over them as
    they pile up cost as much as a third of the run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_layout(module: csl.CslModuleOp, params: dict[str, int]) -> Layout:
    """Execute a layout `csl.module` (its loops, branches and builtins), given its parameters (`cslc --params`),
    into a `Layout`."""
    source = _LayoutSource()
    given: dict[str, int] = {}
    for op in module.body.block.ops:
        if isinstance(op, csl.ParamOp):
            name = op.param_name.data
            if name not in params:
                raise PassError(f"{PASS}: the layout's parameter '{name}' is not given (cslc --params)")
            given[source.name(op.res)] = params[name]
    source.block(module.body.block, 1)
    inputs = ["size", "params", "files", "routes", "twice", "refuse", "fmod", *source.consts, *given]
    text = source.text(f"def layout({', '.join(inputs)}):")
    scope: dict[str, Any] = {}
    exec(compile(text, "<layout.csl>", "exec"), scope)  # the layout's own ops, one Python statement each
    size: list[tuple[int, int] | None] = [None]
    tiles: dict[tuple[int, int], dict[str, Any]] = {}
    files: dict[tuple[int, int], str] = {}
    routes: dict[tuple[int, int, int], tuple[tuple[str, ...], tuple[str, ...]]] = {}
    arguments = (size, tiles, files, routes, _twice, _refuse, math.fmod, *source.consts.values(), *given.values())
    with _collector_paused():
        scope["layout"](*arguments)
    if size[0] is None:
        raise PassError(f"{PASS}: the layout sets no rectangle (@set_rectangle)")
    width, height = size[0]
    return Layout(width, height, tiles, routes, files)
