"""The spatial lane's fabric simulator: runs the `csl`-level module the lane prints as CSL (`layout.csl`,
`pe_program.csl`), with the semantics of a Cerebras WSE-2 as its SDK documents them, and the host program that
drives it (`run.py`'s steps, as `memcpy_h2d`, `launch`, `memcpy_d2h`).

- **The layout** is executed first (`verify_grid.read_layout`): `@set_rectangle`, each element's `@set_tile_code` parameters, and every router's
  colour configuration (`@set_color_config`: the directions a colour's wavelets are taken from and sent to).
  From these the simulator follows each sender's wavelets from router to router; a router with no configuration
  for a colour arriving from a direction stops them there.
- **Elements** have their own memory: the program's arrays, allocated for every element (all run the same
  program), and an estimate of its code; an element over 48 KiB is refused when the program is loaded. A DSD
  reaching outside its array stops the run naming the element and the op.
- **Execution** is SIMT over elements: each element has its own program counter, call stack, activated and blocked
  local tasks, and clock; elements at the same instruction execute it together (numpy over those elements), so
  the P x P elements of a grid that run the same code move as one until their data makes them wait. A DSD
  operation does what the SDK documents for it (`@fmovs` copies, `@fadds`/`@fmuls`/`@fmaxs` are elementwise,
  `@fmacs(d, a, b, s)` is d = a + b * s, `@fmachs` the same with f16 b and s accumulated in f32, `@fs2h`/`@fh2s`
  convert); an operand that is a fabric input DSD reads wavelets from the element's queue for its colour (the
  element waits until they are there); a fabric output DSD sends one 32-bit wavelet per value along the route.
- **Tasks**: `@activate` marks a local task; when an element is idle it runs its activated, unblocked task of the
  lowest id; `@block`/`@unblock` hold a task back and release it. The host's `launch` runs an exported function on
  every element; the launch ends when each element has called memcpy's `unblock_cmd_stream`.
- **A step that cannot finish** (a receive with no wavelets coming, a send whose route is broken or whose
  receiver's queue stays full, a launch whose tasks never run) stops with an error naming an element, the colour
  and the op, never a hang.
- **What it runs** is a build's: `grid.mlir` and `host.json`, from a build folder or from the `spatial` compile
  target's build in memory, which the grid's static check (`passes/spatial/verify_grid.py`) has passed.
- **Cycles** are counted by the simulator as it runs, per element, from the per-op costs of `CYCLES` (see
  docs/spatial.md for their sources and assumptions): an element's clock advances by each op it runs; a receive
  waits for the wavelets' arrival (sender's clock + hops + one cycle per wavelet). A step's cycles are the latest
  element clock when the launch ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from xdsl.dialects import arith, csl, memref, scf
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue

from logos_ir.dialects import csl_ext
from logos_ir.dialects.csl_ext import MEMORY, NO_CODE
from logos_ir.errors import LogosError
from logos_ir.generate import StepGenerator
from logos_ir.passes.spatial.verify_grid import Layout, layout_params, read_layout, split_modules

# Cycles per op (docs/spatial.md, "Cycles", gives the sources and which are assumptions).
CYCLES = {
    "scalar": 1,  # an integer or float op, a load, a store, a branch
    "dsd_setup": 1,  # @get_dsd, @increment_dsd_offset
    "dsd_element": 1,  # each element a DSD op processes (one per cycle)
    "math": 20,  # a <math> library call (exp, sqrt, sin, cos): an assumption
    "hop": 1,  # a wavelet crossing one router
    "call": 2,  # a call or a return
    "task_switch": 4,  # an idle element picking its next task: an assumption
}

_STEP = {"EAST": (1, 0), "WEST": (-1, 0), "NORTH": (0, -1), "SOUTH": (0, 1)}
_OPPOSITE = {"EAST": "WEST", "WEST": "EAST", "NORTH": "SOUTH", "SOUTH": "NORTH"}


class FabricError(LogosError):
    """A step that cannot finish, or a module the static check refuses."""


def _cmp(a: Any, b: Any, op: Any) -> Any:
    predicate = op.predicate.value.data
    return [a == b, a != b, a < b, a <= b, a > b, a >= b, a < b, a <= b, a > b, a >= b][predicate]


def _int_div(a: Any, b: Any, op: Any) -> Any:
    return np.trunc(np.asarray(a) / b).astype(np.int64) if isinstance(a, np.ndarray) else int(a / b)


def _int_rem(a: Any, b: Any, op: Any) -> Any:
    return np.fmod(a, b)


def _select(c: Any, a: Any, b: Any, op: Any) -> Any:
    return np.where(c, a, b)


_SCALAR: dict[str, Callable[..., Any]] = {
    "arith.addi": lambda a, b, op: a + b,
    "arith.subi": lambda a, b, op: a - b,
    "arith.muli": lambda a, b, op: a * b,
    "arith.divsi": _int_div,
    "arith.remsi": _int_rem,
    "arith.cmpi": _cmp,
    "arith.andi": lambda a, b, op: np.logical_and(a, b),
    "arith.select": _select,
    "arith.addf": lambda a, b, op: np.float32(a) + np.float32(b),
    "arith.subf": lambda a, b, op: np.float32(a) - np.float32(b),
    "arith.mulf": lambda a, b, op: np.float32(a) * np.float32(b),
    "arith.divf": lambda a, b, op: np.float32(a) / np.float32(b),
    "arith.extsi": lambda a, op: a,
    "arith.trunci": lambda a, op: a,
    "arith.index_cast": lambda a, op: a,
    "arith.sitofp": lambda a, op: np.asarray(a).astype(np.float32),
    "arith.extf": lambda a, op: np.asarray(a).astype(np.float32),
    "arith.truncf": lambda a, op: np.asarray(a).astype(np.float16),
}


# -- routes ------------------------------------------------------------------------------------------------------


@dataclass
class Routes:
    """Where each element's wavelets on each colour arrive: for colour c, `dest[c]` is [elements, fan-out] of
    element indices (-1: none) with `hops[c]` the routers crossed; `broken[c][e]` says where a sender's wavelets
    stop."""

    dest: dict[int, np.ndarray]
    hops: dict[int, np.ndarray]
    broken: dict[int, dict[int, str]]
    stuck: dict[int, np.ndarray] = field(default_factory=dict)  # [elements]: the sender's wavelets stop somewhere


def trace_routes(layout: Layout, colours: Sequence[int]) -> Routes:
    width, height = layout.width, layout.height
    n = width * height
    dest, hops, broken = {}, {}, {}
    for c in colours:
        found: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        stops: dict[int, str] = {}
        for sx in range(width):
            for sy in range(height):
                s = sy * width + sx
                if (sx, sy, c) not in layout.routes:
                    continue
                rx, _ = layout.routes[(sx, sy, c)]
                if "RAMP" not in rx:
                    continue
                stop = _follow(layout, c, sx, sy, found[s])
                if stop:
                    stops[s] = stop
        fan = max((len(f) for f in found), default=0) or 1
        d = np.full((n, fan), -1, dtype=np.int64)
        h = np.zeros((n, fan), dtype=np.int64)
        for s, targets in enumerate(found):
            for k, (t, hop) in enumerate(targets):
                d[s, k], h[s, k] = t, hop
        dest[c], hops[c], broken[c] = d, h, stops
    stuck = {}
    for c in colours:
        mask = np.zeros(n, dtype=bool)
        mask[list(broken[c])] = True
        stuck[c] = mask
    return Routes(dest, hops, broken, stuck)


def _follow(layout: Layout, colour: int, sx: int, sy: int, out: list[tuple[int, int]]) -> str:
    """Follow colour's wavelets from element (sx, sy)'s ramp; append (element, hops) for each delivery; return
    where they stop ('' if nowhere)."""
    width = layout.width
    frontier = [(sx, sy, "RAMP", 0)]
    seen = set()
    while frontier:
        x, y, came, hop = frontier.pop()
        if (x, y, came) in seen:
            return f"colour {colour} loops at element ({x}, {y})"
        seen.add((x, y, came))
        config = layout.routes.get((x, y, colour))
        if config is None or came not in config[0]:
            return f"element ({x}, {y}) has no route for colour {colour} from {came}"
        for direction in config[1]:
            if direction == "RAMP":
                if (x, y) != (sx, sy) or came != "RAMP":
                    out.append((y * width + x, hop))
                continue
            dx, dy = _STEP[direction]
            nx, ny = x + dx, y + dy
            if not (0 <= nx < layout.width and 0 <= ny < layout.height):
                return f"colour {colour} leaves the grid at element ({x}, {y}) going {direction}"
            frontier.append((nx, ny, _OPPOSITE[direction], hop + 1))
    return ""


# -- the elements --------------------------------------------------------------------------------------------------


@dataclass
class MemDsd:
    """A memory DSD held by each element: array[offset + stride * i] for i < length."""

    array: str
    offset: np.ndarray
    length: np.ndarray
    stride: np.ndarray
    # (offset, length, stride) when they are constants of the program (the same for every element): the arrays are
    # then not used
    static: tuple[int, int, int] | None = None


@dataclass
class FabDsd:
    """A fabric DSD: `extent` wavelets on `colour`, into (`inbound`) or out of the element."""

    colour: int
    inbound: bool
    extent: np.ndarray
    static: int | None = None  # the extent when it is a constant of the program


def _constant(value: SSAValue) -> int | None:
    """The value of an integer constant of the program (None if `value` is computed)."""
    owner = value.owner
    if isinstance(owner, arith.ConstantOp):
        data = owner.value.value.data  # type: ignore[attr-defined]
        return int(data) if isinstance(data, int) else None
    return None


_DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int64, "i16": np.int64}


def _dtype(type_: Any) -> Any:
    text = str(type_)
    if text in ("f32", "f16"):
        return _DTYPES[text]
    if text == "i1":
        return np.bool_
    return np.int64


@dataclass
class Blocked:
    element: int
    colour: int | None
    op: str
    why: str


class Fabric:
    """The grid of elements running one program (see the module docstring)."""

    # Which waiting instruction's elements run next: "lowest" (the default) or "highest" (a test runs both: the
    # cycles, wavelets and results must not depend on it)
    schedule = "lowest"
    # Whether DSD ops with a fabric operand may take the shorter way (`_fast_dsd`); a test runs without it and
    # compares
    fast = True

    def __init__(self, module: ModuleOp, params: dict[str, int], memory: int = MEMORY, queue_words: int | None = None):
        program, layout_module = split_modules(module)
        self.program = program
        self.layout = read_layout(layout_module, params)
        self.width, self.height = self.layout.width, self.layout.height
        n = self.n = self.width * self.height
        self.xs = np.arange(n) % self.width
        self.ys = np.arange(n) // self.width
        self.regs: dict[SSAValue, Any] = {}
        self.memory: dict[str, np.ndarray] = {}
        self.exports: dict[str, str] = {}
        self.instrs: list[Callable[[np.ndarray], np.ndarray]] = []
        self.names: list[str] = []
        self.entries: dict[str, int] = {}
        self.tasks: dict[int, int] = {}
        self.fixups: list[tuple[int, str]] = []
        self.pending: list[tuple[str, Callable[[np.ndarray], Any]]] = []
        self.jumps: dict[int, Callable[[], int]] = {}  # instructions that only jump: their targets
        self.waits: set[int] = set()  # instructions where elements can wait (a DSD op with a fabric operand)
        self._simple = False
        self.clock = np.zeros(n)
        self.pc = np.full(n, -1, dtype=np.int64)
        self.stack = np.zeros((n, 16), dtype=np.int64)
        self.depth = np.zeros(n, dtype=np.int64)
        self.activated = np.zeros((n, 32), dtype=bool)
        self.blocked = np.zeros((n, 32), dtype=bool)
        self.ended = np.zeros(n, dtype=bool)
        self.waiting: dict[int, Blocked] = {}
        self._load(memory)
        colours = sorted({c for (_, _, c) in self.layout.routes} | self._colours_used())
        self.routes = trace_routes(self.layout, colours)
        self._shared = {}  # whether some receiver is reached by two senders on the colour
        self._route_ok = {  # whether the element's wavelets on the colour reach a receiver (and stop nowhere)
            c: (self.routes.dest[c] >= 0).any(axis=1) & ~self.routes.stuck[c] for c in colours
        }
        self._single = {c: self.routes.dest[c][:, 0] if self.routes.dest[c].shape[1] == 1 else None for c in colours}
        self._hops_single = {c: self.routes.hops[c][:, 0] for c in colours}
        for c in colours:
            reached = self.routes.dest[c][self.routes.dest[c] >= 0]
            self._shared[c] = bool(reached.size) and np.unique(reached).size != reached.size
        cap = queue_words or max(64, 2 * self._longest_message())
        self.queue = {c: np.zeros((cap, n), dtype=np.float32) for c in colours}  # [slot, element]: rings
        self.queue_len = {c: np.zeros(n, dtype=np.int64) for c in colours}
        self.queue_head = {c: np.zeros(n, dtype=np.int64) for c in colours}  # a ring: where the oldest wavelet is
        # each wavelet's arrival (the cycle its message's last wavelet reaches the receiver's router)
        self.queue_time = {c: np.zeros((cap, n)) for c in colours}
        self._lane = np.arange(cap)
        self.park_colour = np.full(n, -1, dtype=np.int64)  # an element waiting at a DSD op: the colour (-2: to send)
        self.park_need = np.zeros(n, dtype=np.int64)
        self.groups: dict[int, list[np.ndarray]] = {}  # the elements ready to run, by instruction
        self.capacity = cap
        self.wavelets = 0

    # -- loading --

    def _colours_used(self) -> set[int]:
        return {op.fabric_color.value.data for op in self.program.walk() if isinstance(op, csl.GetFabDsdOp)}

    def _longest_message(self) -> int:
        """The most wavelets one fabric DSD moves: its constant extent, or, for an extent known only at run time (a
        reduction function's argument), the size of the arrays whose memory DSDs take the same extent."""
        longest = 1
        runtime_extents: set[SSAValue] = set()
        for op in self.program.walk():
            if isinstance(op, csl.GetFabDsdOp):
                size = op.sizes[0].owner
                if isinstance(size, arith.ConstantOp):
                    longest = max(longest, size.value.value.data)  # type: ignore[attr-defined]
                else:
                    runtime_extents.add(op.sizes[0])
        for op in self.program.walk():
            if isinstance(op, csl.GetMemDsdOp) and op.sizes[0] in runtime_extents:
                longest = max(longest, self.memory[self._array_of(op.base_addr)].shape[0])
        return longest

    def element_bytes(self) -> tuple[int, int]:
        """(array bytes, code bytes) of every element: the program's arrays, and 4 bytes per op of its functions
        and tasks (an estimate: the SDK publishes no code size per builtin)."""
        arrays = sum(a.shape[0] * (2 if a.dtype == np.float16 else 4) for a in self.memory.values())
        code = 0
        for op in self.program.body.block.ops:
            if isinstance(op, csl.FuncOp | csl.TaskOp):
                code += 4 * sum(1 for o in op.walk() if o.name not in NO_CODE)
        return arrays, code

    def _load(self, memory: int) -> None:
        params = {op.param_name.data: op.res for op in self.program.body.block.ops if isinstance(op, csl.ParamOp)}
        for name, value in params.items():
            array = np.zeros(self.n, dtype=np.int64)
            for (x, y), given in self.layout.params.items():
                if name in given and isinstance(given[name], int):
                    array[y * self.width + x] = given[name]
            self.regs[value] = array
        missing = [(x, y) for x in range(self.width) for y in range(self.height) if (x, y) not in self.layout.params]
        if missing:
            raise FabricError(f"element {missing[0]} has no tile code (@set_tile_code)")
        for op in self.program.body.block.ops:
            match op:
                case memref.GlobalOp():
                    shape = op.type.get_shape()  # type: ignore[union-attr]
                    element = _DTYPES.get(str(op.type.get_element_type()), np.float32)  # type: ignore[union-attr]
                    # [words, elements]: word i of every element together (a DSD over all elements reads one
                    # contiguous block)
                    self.memory[op.sym_name.data] = np.zeros((int(np.prod(shape)), self.n), dtype=element)
                case csl.FuncOp() | csl.TaskOp():
                    self._compile_function(op)
                case csl.SymbolExportOp():
                    name = op.get_name()
                    if op.value is not None:
                        self.exports[name] = self._array_of(op.value)
                    else:
                        self.exports[name] = name
                case _:
                    self._static(op)
        for _, callee in self.fixups:
            if callee not in self.entries:
                raise FabricError(f"the program calls '{callee}', which it does not define")
        arrays, code = self.element_bytes()
        if arrays + code > memory:
            raise FabricError(
                f"element (0, 0) (and every element: they run one program) needs {arrays} bytes of arrays and "
                f"{code} of code, over its {memory} bytes"
            )

    def _array_of(self, value: SSAValue) -> str:
        op = value.owner
        if isinstance(op, csl.AddressOfOp):
            return self._array_of(op.value)
        if isinstance(op, memref.GetGlobalOp):
            return op.name_.root_reference.data
        raise FabricError(f"the fabric simulator cannot tell which array '{value}' is")

    def _static(self, op: Operation) -> None:
        """Ops with no run-time effect: constants, module imports, globals' addresses."""
        match op:
            case arith.ConstantOp():
                value = op.value.value.data  # type: ignore[attr-defined]
                self.regs[op.result] = np.full(self.n, value, dtype=_dtype(op.result.type))
            case memref.GetGlobalOp() | csl.ImportModuleConstOp() | csl.AddressOfOp() | csl.ParamOp():
                pass
            case csl_ext.CommentOp():
                pass
            case _:
                raise FabricError(f"the fabric simulator does not run '{op.name}' at the program's top level")

    # -- compiling into instructions --

    def _emit(self, name: str, run: Callable[[np.ndarray], np.ndarray]) -> int:
        if self._simple:
            self.pending.append((name, run))
            return len(self.instrs)
        self._flush()
        self.instrs.append(run)
        self.names.append(name)
        return len(self.instrs) - 1

    def _flush(self) -> None:
        """Fuse the pending straight-line ops (none of which can wait) into one instruction: the elements at it run
        them all, in order, each op adding its own cycles."""
        if not self.pending:
            return
        runs = [run for _, run in self.pending]
        names = ", ".join(dict.fromkeys(name for name, _ in self.pending))
        self.pending = []
        at = len(self.instrs)
        following = at + 1

        def fused(idx: np.ndarray) -> int:
            for run in runs:
                run(idx)
            return following

        self.instrs.append(fused)
        self.names.append(names)
        del at

    def _is_simple(self, op: Operation) -> bool:
        """An op that never waits and never leaves its function: a DSD op with no fabric operand, a scalar op, and
        a loop or branch whose every op is simple (it can be fused with its neighbours, the loop or branch run within
        the fused instruction)."""
        if isinstance(op, csl.BuiltinDsdOp):
            return not any(isinstance(v.owner, csl.GetFabDsdOp) for v in op.ops)
        if isinstance(op, scf.ForOp | scf.IfOp):
            return all(self._is_simple(inner) for region in op.regions for b in region.blocks for inner in b.ops)
        return not isinstance(op, csl.CallOp | csl.ReturnOp)

    def _compile_function(self, fn: csl.FuncOp | csl.TaskOp) -> None:
        name = fn.sym_name.data
        if isinstance(fn, csl.TaskOp) and fn.kind.data != csl.TaskKind.LOCAL:
            raise FabricError(f"the fabric simulator runs local tasks only; '{name}' is a {fn.kind.data.value} task")
        self.entries[name] = len(self.instrs)
        if isinstance(fn, csl.TaskOp) and fn.id is not None:
            self.tasks[fn.id.value.data] = len(self.instrs)
        for arg in fn.body.block.args:
            self.regs[arg] = np.zeros(self.n, dtype=_dtype(arg.type))
        self._compile_block(fn.body.block)

    def _compile_block(self, block: Block) -> None:
        for op in block.ops:
            self._compile_op(op)

    def _reg(self, value: SSAValue) -> np.ndarray:
        reg = self.regs.get(value)
        if reg is None:
            reg = self.regs[value] = np.zeros(self.n, dtype=_dtype(value.type))
        return reg

    def _next(self, idx: np.ndarray, at: int) -> int:
        return at + 1

    def _compile_op(self, op: Operation) -> None:  # noqa: C901
        self._simple = self._is_simple(op)
        if not self._simple:
            self._flush()
        at = len(self.instrs)
        self._compile_one(op, at)
        self._simple = False

    def _compile_one(self, op: Operation, at: int) -> None:  # noqa: C901
        match op:
            case arith.ConstantOp() | memref.GetGlobalOp() | csl_ext.CommentOp():
                self._static(op)
            case _ if op.name in _SCALAR:
                self._compile_scalar(op)
            case memref.LoadOp():
                self._compile_load(op)
            case memref.StoreOp():
                self._compile_store(op)
            case csl.GetMemDsdOp():
                self._compile_mem_dsd(op)
            case csl.IncrementDsdOffsetOp():
                self._compile_increment(op)
            case csl.GetFabDsdOp():
                self._compile_fab_dsd(op)
            case csl.BuiltinDsdOp():
                self._compile_dsd_op(op)
            case csl.MemberCallOp():
                self._compile_member_call(op)
            case csl.ActivateOp():
                task = op.id.value.data

                def activate(idx: np.ndarray) -> np.ndarray:
                    self.activated[idx, task] = True
                    self.clock[idx] += CYCLES["scalar"]
                    return self._next(idx, at)

                self._emit("@activate", activate)
            case csl_ext.BlockOp() | csl_ext.UnblockOp():
                task, value = op.task.data, isinstance(op, csl_ext.BlockOp)

                def block(idx: np.ndarray) -> np.ndarray:
                    self.blocked[idx, task] = value
                    self.clock[idx] += CYCLES["scalar"]
                    return self._next(idx, at)

                self._emit("@block" if value else "@unblock", block)
            case csl.CallOp():
                self._compile_call(op)
            case csl.ReturnOp():
                self._flush()
                self._emit("return", self._return)
            case scf.ForOp() if self._simple:
                self._compile_simple_for(op)
            case scf.IfOp() if self._simple:
                self._compile_simple_if(op)
            case scf.ForOp():
                self._compile_for(op)
            case scf.IfOp():
                self._compile_if(op)
            case _:
                raise FabricError(f"the fabric simulator does not run '{op.name}'")

    def _compile_scalar(self, op: Operation) -> None:
        at = len(self.instrs)
        function = _SCALAR[op.name]
        inputs = [self._reg(v) for v in op.operands]
        out = self._reg(op.results[0])

        clock, n, cost = self.clock, self.n, CYCLES["scalar"]

        def run(idx: np.ndarray) -> int:
            rows = slice(None) if idx.size == n else idx  # every element (in order): no gather
            out[rows] = function(*(r[rows] for r in inputs), op)
            clock[rows] += cost
            return at + 1

        self._emit(op.name, run)

    def _compile_load(self, op: memref.LoadOp) -> None:
        at = len(self.instrs)
        name = self._array_of(op.memref)
        index = self._reg(op.indices[0])
        out = self._reg(op.res)

        clock, n, cost = self.clock, self.n, CYCLES["scalar"]

        def run(idx: np.ndarray) -> int:
            array = self.memory[name]
            rows = slice(None) if idx.size == n else idx
            where = index[rows]
            first = int(where[0])
            if 0 <= first < array.shape[0] and (where == first).all():
                out[rows] = array[first, rows]
            else:
                self._bounds(idx, where, array.shape[0], name, "a load")
                out[rows] = array[where, idx]
            clock[rows] += cost
            return at + 1

        self._emit("load", run)

    def _compile_store(self, op: memref.StoreOp) -> None:
        at = len(self.instrs)
        name = self._array_of(op.memref)
        index, value = self._reg(op.indices[0]), self._reg(op.value)

        clock, n, cost = self.clock, self.n, CYCLES["scalar"]

        def run(idx: np.ndarray) -> int:
            array = self.memory[name]
            rows = slice(None) if idx.size == n else idx
            where = index[rows]
            first = int(where[0])
            if 0 <= first < array.shape[0] and (where == first).all():
                array[first, rows] = value[rows]
            else:
                self._bounds(idx, where, array.shape[0], name, "a store")
                array[where, idx] = value[rows]
            clock[rows] += cost
            return at + 1

        self._emit("store", run)

    def _bounds(self, idx: np.ndarray, where: np.ndarray, words: int, name: str, what: str) -> None:
        bad = (where < 0) | (where >= words)
        if bad.any():
            e = int(idx[np.argmax(bad.any(axis=0) if bad.ndim == 2 else bad)])  # where: [words, elements] or [elements]
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}): {what} reaches outside the array '{name}' of {words} words"
            )

    def _compile_mem_dsd(self, op: csl.GetMemDsdOp) -> None:
        at = len(self.instrs)
        name = self._array_of(op.base_addr)
        access = op.tensor_access.data if op.tensor_access is not None else None
        offset = access.eval([0], [])[0] if access is not None else 0
        stride = (access.eval([1], [])[0] - offset) if access is not None else 1
        size = self._reg(op.sizes[0])
        constant = _constant(op.sizes[0])
        reg = self.regs[op.result] = MemDsd(
            name,
            np.zeros(self.n, np.int64),
            np.zeros(self.n, np.int64),
            np.zeros(self.n, np.int64),
            (int(offset), int(constant), int(stride)) if constant is not None else None,
        )
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

    def _compile_fab_dsd(self, op: csl.GetFabDsdOp) -> None:
        at = len(self.instrs)
        inbound = op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
        constant = _constant(op.sizes[0])
        reg = self.regs[op.result] = FabDsd(
            op.fabric_color.value.data,
            inbound,
            np.zeros(self.n, np.int64),
            int(constant) if constant is not None else None,
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

    def _compile_call(self, op: csl.CallOp) -> None:
        at = len(self.instrs)
        callee = op.callee.string_value()
        self.fixups.append((at, callee))
        args = [self._reg(a) for a in op.args]
        fn = next(
            (f for f in self.program.body.block.ops if isinstance(f, csl.FuncOp) and f.sym_name.data == callee), None
        )
        if fn is None:
            raise FabricError(f"the program calls '{callee}', which it does not define")
        params = [self._reg(a) for a in fn.body.block.args]

        def run(idx: np.ndarray) -> np.ndarray:
            for source, target in zip(args, params, strict=True):
                target[idx] = source[idx]
            if (self.depth[idx] >= self.stack.shape[1]).any():
                raise FabricError(f"calls nest deeper than {self.stack.shape[1]} at '{callee}'")
            self.stack[idx, self.depth[idx]] = at + 1
            self.depth[idx] += 1
            self.clock[idx] += CYCLES["call"]
            return self.entries[callee]

        self._emit(f"call {callee}", run)

    def _return(self, idx: np.ndarray) -> np.ndarray:
        self.clock[idx] += CYCLES["call"]
        out = np.full(idx.size, -1, dtype=np.int64)
        inner = self.depth[idx] > 0
        if inner.any():
            callers = idx[inner]
            self.depth[callers] -= 1
            out[inner] = self.stack[callers, self.depth[callers]]
        return out

    def _compile_for(self, op: scf.ForOp) -> None:
        lower, upper, step = self._reg(op.lb), self._reg(op.ub), self._reg(op.step)
        iv, *carried = (self._reg(a) for a in op.body.block.args)
        initial = [self._reg(v) for v in op.iter_args]
        start = len(self.instrs)

        def init(idx: np.ndarray) -> np.ndarray:
            iv[idx] = lower[idx]
            for source, target in zip(initial, carried, strict=True):
                target[idx] = source[idx]
            self.clock[idx] += CYCLES["scalar"]
            return self._next(idx, start)

        self._emit("for", init)
        test_at = len(self.instrs)
        exit_at: list[int] = []

        def test(idx: np.ndarray) -> np.ndarray:
            self.clock[idx] += CYCLES["scalar"]
            return np.where(iv[idx] < upper[idx], test_at + 1, exit_at[0]).astype(np.int64)

        self._emit("for (test)", test)
        body = list(op.body.block.ops)
        for inner in body[:-1]:
            self._compile_op(inner)
        self._flush()
        yielded = [self._reg(v) for v in body[-1].operands]
        back_at = len(self.instrs)

        def back(idx: np.ndarray) -> np.ndarray:
            values = [v[idx].copy() for v in yielded]
            for value, target in zip(values, carried, strict=True):
                target[idx] = value
            iv[idx] += step[idx]
            self.clock[idx] += CYCLES["scalar"]
            return test_at

        self._emit("for (next)", back)
        results = [self._reg(r) for r in op.results]
        exit_at.append(len(self.instrs))
        end = exit_at[0]

        def finish(idx: np.ndarray) -> np.ndarray:
            for source, target in zip(carried, results, strict=True):
                target[idx] = source[idx]
            return self._next(idx, end)

        self._emit("for (end)", finish)
        del back_at

    def _compile_if(self, op: scf.IfOp) -> None:
        condition = self._reg(op.cond)
        at = len(self.instrs)
        targets: list[int] = []

        def branch(idx: np.ndarray) -> np.ndarray:
            self.clock[idx] += CYCLES["scalar"]
            return np.where(condition[idx], at + 1, targets[0]).astype(np.int64)

        self._emit("if", branch)
        results = [self._reg(r) for r in op.results]
        self._compile_branch(op.true_region.block, results)
        jump_at = len(self.instrs)
        self.jumps[len(self.instrs)] = lambda: targets[1]
        self._emit("if (end of then)", lambda idx: targets[1])
        targets.append(len(self.instrs))
        if op.false_region.blocks:
            self._compile_branch(op.false_region.block, results)
        targets.append(len(self.instrs))
        self.jumps[len(self.instrs)] = lambda: targets[1] + 1
        self._emit("if (end)", lambda idx: targets[1] + 1)
        del jump_at

    def _simple_body(self, ops: Sequence[Operation]) -> list[Callable[[np.ndarray], Any]]:
        """The closures of simple ops (run in order, within one instruction)."""
        saved, self.pending = self.pending, []
        for inner in ops:
            self._simple = True
            self._compile_one(inner, len(self.instrs))
        runs = [run for _, run in self.pending]
        self.pending = saved
        self._simple = True
        return runs

    def _compile_simple_for(self, op: scf.ForOp) -> None:
        """A loop whose body never waits, run within one instruction: the same steps and cycles as the loop's
        instructions (the start, each test, each step back), for each element its own trip count."""
        lower, upper, step = self._reg(op.lb), self._reg(op.ub), self._reg(op.step)
        iv, *carried = (self._reg(a) for a in op.body.block.args)
        initial = [self._reg(v) for v in op.iter_args]
        ops = list(op.body.block.ops)
        body = self._simple_body(ops[:-1])
        yielded = [self._reg(v) for v in ops[-1].operands]
        results = [self._reg(r) for r in op.results]
        scalar = CYCLES["scalar"]
        clock = self.clock

        def run(idx: np.ndarray) -> None:
            iv[idx] = lower[idx]
            for source, target in zip(initial, carried, strict=True):
                target[idx] = source[idx]
            clock[idx] += scalar
            active = idx
            while True:
                clock[active] += scalar  # the test
                going = iv[active] < upper[active]
                if not going.all():
                    active = active[going]
                    if active.size == 0:
                        break
                for inner in body:
                    inner(active)
                values = [v[active].copy() for v in yielded]
                for value, target in zip(values, carried, strict=True):
                    target[active] = value
                iv[active] += step[active]
                clock[active] += scalar  # the step back
            for source, target in zip(carried, results, strict=True):
                target[idx] = source[idx]

        self._emit("for", run)

    def _compile_simple_if(self, op: scf.IfOp) -> None:
        """A branch whose arms never wait, run within one instruction (each element its arm)."""
        condition = self._reg(op.cond)
        results = [self._reg(r) for r in op.results]
        arms = []
        for region in (op.true_region, op.false_region):
            ops = list(region.block.ops) if region.blocks else []
            runs = self._simple_body(ops[:-1] if ops else [])
            yielded = [self._reg(v) for v in ops[-1].operands] if ops else []
            arms.append((runs, yielded))
        scalar = CYCLES["scalar"]
        clock = self.clock

        def run(idx: np.ndarray) -> None:
            clock[idx] += scalar
            taken = condition[idx].astype(bool)
            for (runs, yielded), part in ((arms[0], taken), (arms[1], ~taken)):
                if part.all():
                    sub = idx
                elif part.any():
                    sub = idx[part]
                else:
                    continue
                for inner in runs:
                    inner(sub)
                if results:
                    values = [v[sub].copy() for v in yielded]
                    for value, target in zip(values, results, strict=True):
                        target[sub] = value

        self._emit("if", run)

    def _compile_branch(self, block: Block, results: list[np.ndarray]) -> None:
        ops = list(block.ops)
        for inner in ops[:-1]:
            self._compile_op(inner)
        yielded = [self._reg(v) for v in ops[-1].operands] if ops else []
        if results:
            self._simple = True
            at = len(self.instrs)

            def assign(idx: np.ndarray) -> np.ndarray:
                for source, target in zip(yielded, results, strict=True):
                    target[idx] = source[idx]
                return self._next(idx, at)

            self._emit("yield", assign)
            self._simple = False
        self._flush()

    def _compile_member_call(self, op: csl.MemberCallOp) -> None:
        at = len(self.instrs)
        name = op.field.data
        module = op.struct.owner
        library = module.module.data if isinstance(module, csl.ImportModuleConstOp) else ""
        if library == "<memcpy/memcpy>" and name == "unblock_cmd_stream":

            def end(idx: np.ndarray) -> np.ndarray:
                self.ended[idx] = True
                self.clock[idx] += CYCLES["scalar"]
                return self._next(idx, at)

            self._emit("unblock_cmd_stream", end)
            return
        functions = {"exp_f32": np.exp, "sqrt_f32": np.sqrt, "cos_f32": np.cos, "sin_f32": np.sin}
        if library != "<math>" or name not in functions:
            raise FabricError(f"the fabric simulator does not run {library}'s '{name}'")
        function = functions[name]
        args = [self._reg(a) for a in op.args]
        out = self._reg(op.result)  # type: ignore[arg-type]

        def call(idx: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", under="ignore"):
                out[idx] = function(args[0][idx].astype(np.float64)).astype(np.float32)
            self.clock[idx] += CYCLES["math"]
            return self._next(idx, at)

        self._emit(f"math.{name}", call)

    # -- DSD operations --

    def _compile_dsd_op(self, op: csl.BuiltinDsdOp) -> None:
        at = len(self.instrs)
        kind = op.name.removeprefix("csl.")
        function = _DSD_OPS.get(kind)
        if function is None:
            raise FabricError(f"the fabric simulator does not run @{kind}")
        operands = list(op.ops)
        fast = None if self._simple else self._fast_dsd(at, function, operands)

        def run(idx: np.ndarray) -> np.ndarray | int:
            if fast is not None and self.fast:
                done = fast(idx)
                if done is not None:
                    return done
            return self._dsd(idx, at, kind, function, operands)

        if not self._simple:
            self.waits.add(at)
        self._emit(f"@{kind}", run)

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
            cap = self.capacity
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
                    return at
                head = self.queue_head[inbound]
                heads = head[rows]
                first = int(heads[0])
                if first + length > cap or not (heads == first).all():
                    return None
            if isinstance(target, FabDsd):
                single = self._single.get(target.colour)
                if single is None or self._shared[target.colour] or not self._route_ok[target.colour][rows].all():
                    return None
                receivers = single[rows]
                out_count, out_head = self.queue_len[target.colour], self.queue_head[target.colour]
                starts = out_head[receivers] + out_count[receivers]
                start = int(starts[0])
                if start + length > cap or not (starts == start).all():
                    return None
            values = []
            arrived = None
            for source, what in sources:
                if source == "fabric":
                    values.append(self.queue[inbound][first : first + length, rows])
                    arrived = self.queue_time[inbound][first : first + length, rows].max(axis=0)
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
                left = count[rows] - length
                count[rows] = left
                head[rows] = np.where(left == 0, 0, (first + length) % cap)
            result = function(*values)
            clock = self.clock
            ended = clock[rows] + CYCLES["dsd_element"] * length
            if arrived is not None:
                ended = np.maximum(ended, arrived + 1)
            clock[rows] = ended
            size = idx.size
            if isinstance(target, FabDsd):
                colour = target.colour
                self.queue[colour][start : start + length, receivers] = np.broadcast_to(result, (length, size))
                self.queue_time[colour][start : start + length, receivers] = (
                    ended + self._hops_single[colour][rows] * CYCLES["hop"]
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

    def _uniform(self, reg: MemDsd, idx: np.ndarray, length: int, words: int, what: str) -> slice | None:
        """The DSD as one slice when every element of `idx` has the same offset and stride (the common case: the
        elements of a group run the same code on the same addresses), checked against the array's bounds."""
        if reg.static is not None:
            first, _, stride = reg.static
        else:
            offsets, strides = reg.offset[idx], reg.stride[idx]
            first, stride = int(offsets[0]), int(strides[0])
            if stride <= 0 or (offsets != first).any() or (strides != stride).any():
                return None
        if stride <= 0:
            return None
        last = first + stride * (length - 1)
        if first < 0 or last >= words:
            e = int(idx[0])
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}): {what} reaches outside the array '{reg.array}' of {words} words"
            )
        return slice(first, last + 1, stride)

    def _rows(self, idx: np.ndarray) -> slice | np.ndarray:
        """All elements as a slice (no copy) when `idx` is every element in order."""
        if idx.size == self.n and idx[0] == 0 and idx[-1] == self.n - 1:
            return slice(None)
        return idx

    def _read(self, value: SSAValue, idx: np.ndarray, length: int) -> np.ndarray:
        reg = self.regs.get(value)
        if isinstance(reg, MemDsd):
            array = self.memory[reg.array]
            span = self._uniform(reg, idx, length, array.shape[0], "a DSD")
            if span is not None:
                return array[span, self._rows(idx)]
            where = reg.offset[None, idx] + reg.stride[None, idx] * self._lane[:length, None]
            self._bounds(idx, where, array.shape[0], reg.array, "a DSD")
            return array[where, idx[None, :]]
        if isinstance(reg, FabDsd):
            c = reg.colour
            queue, head, count = self.queue[c], self.queue_head[c], self.queue_len[c]
            heads = head[idx]
            first = int(heads[0])
            if first + length <= self.capacity and (heads == first).all():
                data = queue[first : first + length, idx]
                arrived = self.queue_time[c][first : first + length, idx].max(axis=0)
            else:
                at = (heads[None, :] + self._lane[:length, None]) % self.capacity
                data = queue[at, idx[None, :]]
                arrived = self.queue_time[c][at, idx[None, :]].max(axis=0)
            left = count[idx] - length
            count[idx] = left
            head[idx] = np.where(left == 0, 0, (heads + length) % self.capacity)  # an emptied queue starts at 0
            self._arrived = np.maximum(self._arrived, arrived)
            return data
        return reg[idx][None, :]

    def _write(self, value: SSAValue, idx: np.ndarray, data: np.ndarray, kind: str) -> None:
        reg = self.regs[value]
        array = self.memory[reg.array]
        length = data.shape[0]
        span = self._uniform(reg, idx, length, array.shape[0], f"@{kind}'s destination")
        if span is not None:
            array[span, self._rows(idx)] = data
            return
        where = reg.offset[None, idx] + reg.stride[None, idx] * self._lane[:length, None]
        self._bounds(idx, where, array.shape[0], reg.array, f"@{kind}'s destination")
        array[where, idx[None, :]] = data.astype(array.dtype)

    def _can_send(self, idx: np.ndarray, colour: int, length: int, kind: str, ready: np.ndarray) -> np.ndarray:
        """Which of the senders `idx` can send `length` wavelets on `colour` now: their route reaches a receiver
        (else they wait for ever: the deadlock names where the wavelets stop), every receiver's queue has room,
        and no other sender of this step delivers to the same receiver (that one goes next time)."""
        dest = self.routes.dest.get(colour)
        if dest is None:
            self._note_send(idx, colour, kind, f"colour {colour} has no route at all")
            return np.zeros(idx.size, dtype=bool)
        single = self._single[colour]
        if single is not None and not self._shared[colour] and self._route_ok[colour][idx].all():
            # the common case, in fewer steps: one receiver each, no two senders to one, every route whole
            room = self.queue_len[colour][single[idx]] + length <= self.capacity
            if room.all():
                return np.ones(idx.size, dtype=bool)
        targets = dest[idx]
        valid = targets >= 0
        ok = valid.any(axis=1) & ~self.routes.stuck[colour][idx]
        if (~ok).any():
            e = int(idx[~ok][0])
            why = (
                self.routes.broken[colour].get(e)
                or f"element ({self.xs[e]}, {self.ys[e]}) has no route for colour {colour} from RAMP"
            )
            self._note_send(np.array([e]), colour, kind, why)
        room = np.where(valid, self.queue_len[colour][np.maximum(targets, 0)] + length <= self.capacity, True).all(
            axis=1
        )
        if (~room & ok).any():
            self._note_send(idx[~room & ok], colour, kind, f"the receiver's queue for colour {colour} stays full")
        ok &= room
        going = ok & ready
        if not self._shared[colour]:  # no two senders' routes reach one receiver on this colour
            return ok
        flat = np.where(valid & going[:, None], targets, -1).reshape(-1)
        real = flat[flat >= 0]
        if real.size and np.unique(real).size != real.size:  # two senders to one receiver: the first goes now
            seen: set[int] = set()
            for k in np.flatnonzero(going):
                mine = {int(t) for t in targets[k][valid[k]]}
                if mine & seen:
                    ok[k] = False
                seen |= mine
        return ok

    def _note_send(self, idx: np.ndarray, colour: int, op: str, why: str) -> None:
        if idx.size:
            e = int(idx[0])
            self.waiting[e] = Blocked(e, colour, op, "cannot send: " + why)

    def _send(self, idx: np.ndarray, colour: int, data: np.ndarray) -> None:
        """Senders `idx` each send their row of `data` on `colour`: every receiver its route reaches gets the
        wavelets at the end of its queue, each arriving at the sender's clock plus the routers crossed."""
        dest, hops = self.routes.dest[colour][idx], self.routes.hops[colour][idx]
        length = data.shape[0]
        if dest.shape[1] == 1:
            valid = dest[:, 0] >= 0
            if valid.all():
                targets, rows, hop, senders = dest[:, 0], data, hops[:, 0], idx
            else:
                targets, rows, hop, senders = dest[valid, 0], data[:, valid], hops[valid, 0], idx[valid]
        else:
            which, k = np.nonzero(dest >= 0)
            targets, rows, hop, senders = dest[which, k], data[:, which], hops[which, k], idx[which]
        if targets.size == 0:
            return
        queue, times, head, count = (
            self.queue[colour],
            self.queue_time[colour],
            self.queue_head[colour],
            self.queue_len[colour],
        )
        start = head[targets] + count[targets]
        arrival = self.clock[senders] + hop * CYCLES["hop"]  # the last wavelet, sent at the op's end
        first = int(start[0])
        if first + length <= self.capacity and (start == first).all():
            queue[first : first + length, targets] = rows
            times[first : first + length, targets] = arrival[None, :]
        else:
            at = (start[None, :] + self._lane[:length, None]) % self.capacity
            queue[at, targets[None, :]] = rows
            times[at, targets[None, :]] = arrival[None, :]
        count[targets] += length
        self.wavelets += targets.size * length
        self._wake(targets, colour)

    # -- running --

    def launch(self, function: str, limit: int = 50_000_000) -> float:
        """Run exported `function` on every element (the host's `launch`) until every element has ended the launch
        (memcpy's `unblock_cmd_stream`) and is idle; the cycles it took (the latest clock, from a common start).

        Scheduling (which elements the simulator advances next; it changes no element's clock, which counts its own
        ops and its wavelets' arrivals): the elements at the lowest instruction go first, all together, so elements
        that took different branches meet again where the branches join; an element waiting at a DSD op for
        wavelets is set aside until a send delivers to it; when nothing else can run, every waiting element tries
        again, and if none moves, the step is deadlocked."""
        if function not in self.exports or function not in self.entries:
            raise FabricError(f"the host launches '{function}', which the program does not export")
        pick = min if self.schedule == "lowest" else max
        start = float(self.clock.max())
        self.clock[:] = start
        self.pc[:] = self.entries[function]
        self.depth[:] = 0
        self.ended[:] = False
        self.park_colour[:] = -1
        self.waiting.clear()
        self._thread()
        self._retrying = False
        groups = self.groups
        groups.clear()
        groups[self.entries[function]] = [np.arange(self.n)]
        instrs, waits, thread = self.instrs, self.waits, self._threaded
        runs = 0
        progressed = True
        retried = False
        while True:
            while groups:
                at = pick(groups)
                idx = self._take(at)
                following = instrs[at](idx)
                runs += 1
                if isinstance(following, int):
                    if following == at and at in waits:  # none could go: they wait (set aside)
                        continue
                    progressed = True
                    self._retrying = False
                    if following < 0:
                        self.pc[idx] = -1
                        self._start_tasks(idx)
                    else:
                        self._add(thread[following], idx)
                else:
                    self._distribute(at, idx, following)
                    if (following != at).any():
                        progressed, self._retrying = True, False
                if runs > limit:
                    raise FabricError(f"the launch of '{function}' did not finish in {limit} instructions")
            parked = np.flatnonzero(self.park_colour != -1)
            if parked.size == 0:
                break
            if retried and not progressed:
                raise self._deadlock()
            # nothing can run: every waiting element tries again (a send that found a full queue, or a receive
            # whose wavelets came while it was not looking)
            self.waiting.clear()
            self.park_colour[parked] = -1
            self._add_many(parked)
            retried, progressed = True, False
            self._retrying = True  # (every check made, so that a deadlock names what each element waits for)
        if not self.ended.all():
            e = int(np.flatnonzero(~self.ended)[0])
            pending = [t for t in range(32) if self.activated[e, t]]
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}) is idle but never ended the launch (memcpy's "
                f"unblock_cmd_stream): activated tasks {pending} are blocked or none was activated"
            )
        return float(self.clock.max()) - start

    def _thread(self) -> None:
        """Where each instruction's successor really is: an instruction that only jumps is passed through."""
        if getattr(self, "_threaded", None) is not None and len(self._threaded) == len(self.instrs):
            return
        target = list(range(len(self.instrs) + 1))
        for at in range(len(self.instrs)):
            seen = set()
            t = at
            while t in self.jumps and t not in seen:
                seen.add(t)
                t = self.jumps[t]()
            target[at] = t
        self._threaded = target
        self._threaded_array = np.array(target, dtype=np.int64)

    def _add(self, at: int, idx: np.ndarray) -> None:
        """Elements `idx` (sorted) ready to run instruction `at` (joined, in order, when it runs)."""
        self.pc[idx] = at
        have = self.groups.get(at)
        if have is None:
            self.groups[at] = [idx]
        else:
            have.append(idx)

    def _take(self, at: int) -> np.ndarray:
        """The elements ready at instruction `at`, in order, taken off the ready list."""
        parts = self.groups.pop(at)
        if len(parts) == 1:
            return parts[0]
        joined = np.concatenate(parts)
        if all(a[-1] < b[0] for a, b in zip(parts, parts[1:], strict=False)):
            return joined
        joined.sort()
        return joined

    def _add_many(self, idx: np.ndarray) -> None:
        """Elements `idx` (sorted) ready to run, each at its own instruction (`pc`)."""
        pcs = self.pc[idx]
        if (pcs == pcs[0]).all():
            self._add(int(pcs[0]), idx)
            return
        for at in np.unique(pcs):
            self._add(int(at), idx[pcs == at])

    def _distribute(self, at: int, idx: np.ndarray, following: np.ndarray) -> None:
        """After instruction `at` ran for `idx`: each element to its next instruction (or set aside to wait, or
        idle)."""
        first = following[0]
        if (following == first).all():
            values = [first]
            parts = [idx]
        else:
            values = list(np.unique(following))
            parts = [idx[following == v] for v in values]
        for value, part in zip(values, parts, strict=True):
            value = int(value)
            if value == at and at in self.waits:
                continue
            if value < 0:
                self.pc[part] = -1
                self._start_tasks(part)
            else:
                self._add(self._threaded[value], part)

    def _wake(self, targets: np.ndarray, colour: int) -> None:
        """Receivers waiting for wavelets on `colour` that now have them go back to run."""
        waiting = self.park_colour[targets] == colour
        if not waiting.any():
            return
        some = targets[waiting]
        some = some[self.queue_len[colour][some] >= self.park_need[some]]
        if some.size:
            some = np.sort(some)
            self.park_colour[some] = -1
            self._add_many(some)

    def _start_tasks(self, idle: np.ndarray) -> None:
        """Idle elements `idle` start their activated, unblocked task of the lowest id (if any)."""
        runnable = self.activated[idle] & ~self.blocked[idle]
        has = runnable.any(axis=1)
        if not has.any():
            return
        starting = idle[has]
        task = runnable[has].argmax(axis=1)
        for t in np.unique(task):
            if int(t) not in self.tasks:
                e = int(starting[task == t][0])
                raise FabricError(
                    f"element ({self.xs[e]}, {self.ys[e]}) activates task {int(t)}, which no task is bound to"
                )
            chosen = starting[task == t]
            self.activated[chosen, t] = False
            self.clock[chosen] += CYCLES["task_switch"]
            self._add(self._threaded[self.tasks[int(t)]], chosen)

    def _deadlock(self) -> FabricError:
        records = sorted(self.waiting.values(), key=lambda b: (not b.why.startswith("cannot send"), b.element))
        lines = []
        for record in records[:3]:
            x, y = self.xs[record.element], self.ys[record.element]
            lines.append(f"element ({x}, {y}) in @{record.op.lstrip('@')} on colour {record.colour}: {record.why}")
        if not lines:
            e = int(np.flatnonzero(self.pc >= 0)[0])
            lines.append(f"element ({self.xs[e]}, {self.ys[e]}) at {self.names[self.pc[e]]}")
        return FabricError("deadlock: the step cannot finish; " + "; ".join(lines))

    # -- the host's memcpy --

    def memcpy_h2d(self, symbol: str, data: np.ndarray) -> None:
        """Write `data` ([height, width, words], or [words] for every element) into each element's exported array."""
        array = self._exported(symbol)
        values = np.asarray(data)
        if values.ndim == 1:
            array[: values.size, :] = values.astype(array.dtype)[:, None]
            return
        flat = values.reshape(self.n, -1)
        if flat.shape[1] > array.shape[0]:
            raise FabricError(f"memcpy_h2d: {flat.shape[1]} words for '{symbol}' of {array.shape[0]} per element")
        array[: flat.shape[1], :] = flat.T.astype(array.dtype)

    def memcpy_d2h(self, symbol: str, x: int, y: int, width: int, height: int, words: int) -> np.ndarray:
        """[height, width, words] read from the exported array of the elements of a rectangle."""
        array = self._exported(symbol)
        rows = []
        for j in range(y, y + height):
            rows.append(array[:words, j * self.width + x : j * self.width + x + width].T)
        return np.stack(rows).astype(np.float32)

    def _exported(self, symbol: str) -> np.ndarray:
        name = self.exports.get(symbol)
        if name is None or name not in self.memory:
            raise FabricError(f"memcpy: the program exports no array '{symbol}'")
        return self.memory[name]


def _f32(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.float32 else a.astype(np.float32)


_DSD_OPS: dict[str, Callable[..., np.ndarray]] = {
    "fmovs": lambda a: a,
    "fmovh": lambda a: a,
    "fadds": lambda a, b: _f32(a) + _f32(b),
    "fsubs": lambda a, b: _f32(a) - _f32(b),
    "fmuls": lambda a, b: _f32(a) * _f32(b),
    "fmaxs": lambda a, b: np.maximum(_f32(a), _f32(b)),
    "fmacs": lambda a, b, s: _f32(a) + _f32(b) * _f32(s),
    # f16 b and s multiplied (exact in f32) and accumulated in f32
    "fmachs": lambda a, b, s: (
        _f32(a) + b.astype(np.float16).astype(np.float32) * s.astype(np.float16).astype(np.float32)
    ),
    "fs2h": lambda a: _f32(a).astype(np.float16),
    "fh2s": lambda a: a.astype(np.float16).astype(np.float32),
}


# -- the host: what run.py does, on the simulated fabric ---------------------------------------------------------


class GridMachine:
    """A decode step on the simulated grid, driven as `run.py` drives a CS-2: the weight tiles and rotary tables
    written once with `memcpy_h2d`, then for each token its id and position written, `step` launched, and the
    head's logits read back from the last column with `memcpy_d2h`; the host takes their arg-max."""

    def __init__(self, module: ModuleOp, host: dict[str, Any], store: Any, identities: Sequence[Any] = ()):
        self.module, self.host, self.store = module, host, store
        self.identities = list(identities)
        self.fabric = Fabric(module, layout_params(host))
        self.logits: np.ndarray | None = None
        self.cycles: list[float] = []
        self._weights_loaded = False

    def reset(self) -> None:
        if not self._weights_loaded:
            self._load_weights()
            self._weights_loaded = True
        for name in ("key_cache", "value_cache"):
            if name in self.fabric.memory:
                self.fabric.memory[name][:] = 0
        self.cycles = []

    def _load_weights(self) -> None:
        from logos_ir.passes.spatial import grid as g
        from logos_ir.rope import rope_inv_freq

        p = self.host["grid"]
        image = self.host["image"]
        for name, fields in self.host["weights"].items():
            weight = g.Weight(**{**fields, "tensors": tuple(fields["tensors"]), "row_map": tuple(fields["row_map"])})
            parts = []
            for tensor in weight.tensors:
                array = np.asarray(self.store.get(tensor), dtype=np.float32)
                if image == "f16" and weight.kind != "vector":
                    array = array.astype(np.float16).astype(np.float32)
                parts.append(g.tiles(array, weight, p))
            self.fabric.memcpy_h2d(name, np.concatenate(parts, axis=2))
        spec = self.store.spec
        inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
        plan = _plan_of(self.host, spec)
        for table, chunk in self.host["rope_tables"].items():
            rows = np.stack([g.inv_freq_chunk(inv_freq, plan, y, chunk) for y in range(p)])
            self.fabric.memcpy_h2d(table, np.broadcast_to(rows[:, None, :], (p, p, chunk // 2)).copy())

    def step(self, token: int, position: int) -> int:
        """One decode step: token (from 1) at position (from 1); the next token (from 1)."""
        if not self._weights_loaded:
            self.reset()
        fabric = self.fabric
        fabric.memcpy_h2d("token_in", np.array([token - 1]))
        fabric.memcpy_h2d("position_in", np.array([position]))
        self.cycles.append(fabric.launch("step"))
        logits = self.host["logits"]
        p = self.host["grid"]
        chunks = fabric.memcpy_d2h(logits["array"], logits["column"], 0, 1, p, logits["chunk"])
        self.logits = chunks.reshape(-1)[: logits["length"]].astype(np.float32)
        return int(np.argmax(self.logits)) + 1


def _plan_of(host: dict[str, Any], spec: Any) -> Any:
    from logos_ir.passes.spatial.convert_logos_to_csl import plan_for

    return plan_for(spec, host["ctx"], host["image"], host["grid"], host.get("kv_copies", 1))


class SpatialGenerator(StepGenerator):
    """Greedy generation on the simulated grid: the prompt and each new token go one at a time through the decode
    step, run by the fabric simulator from the `csl` modules (lowered anew, or read from a build folder)."""

    def __init__(self, weights: Any, ctx: int | None = None, image: str = "f16", build: Path | None = None):
        super().__init__(weights, ctx=ctx)
        if image not in ("f16", "f32"):
            raise LogosError(f"the spatial backend holds f16 or f32 weights, not {image}")
        self.image, self.build = image, build

    def machine(self, ctx: int) -> GridMachine:
        if self.build is not None:
            module, host = read_build(self.build)
            if host["ctx"] < ctx:
                raise LogosError(
                    f"the build in {self.build} holds a cache of {host['ctx']} positions; this run needs {ctx}"
                )
        else:
            module, host = build_in_memory(self.spec, ctx, self.image)
        return GridMachine(module, host, self.weights, host.get("identities", []))


def build_in_memory(spec: Any, ctx: int, image: str) -> tuple[ModuleOp, dict[str, Any]]:
    """The lane's build of the decode step over `ctx` positions (the `spatial` compile target, in memory), read as
    a build folder is: its csl-level module and host plan."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.program import Cut
    from logos_ir.progress import Progress
    from logos_ir.registry import compile_targets

    request = BuildRequest(ModelSource("preset", "run", spec), Cut.decode(ctx), 1, image, False, Progress.silent())
    built = compile_targets()["spatial"].build()(request)
    files = {a.path: a.data.decode("utf-8") for a in built.artifacts}
    return read_grid(files["grid.mlir"], "grid.mlir"), json.loads(files["host.json"])


def read_build(folder: Path) -> tuple[ModuleOp, dict[str, Any]]:
    """The csl-level module (`grid.mlir`) and host plan (`host.json`) of a build folder."""
    mlir, plan = folder / "grid.mlir", folder / "host.json"
    if not mlir.is_file() or not plan.is_file():
        raise LogosError(f"{folder} is not a spatial build (no grid.mlir and host.json)")
    return read_grid(mlir.read_text(), str(mlir)), json.loads(plan.read_text())


def read_grid(text: str, name: str) -> ModuleOp:
    """A build's `grid.mlir`: the csl-level module the fabric simulator runs."""
    from xdsl.context import Context
    from xdsl.dialects.arith import Arith
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.csl import CSL
    from xdsl.dialects.memref import MemRef
    from xdsl.dialects.scf import Scf
    from xdsl.parser import Parser

    context = Context()
    for dialect in (Builtin, Arith, Scf, MemRef, CSL, csl_ext.CSL_EXT):
        context.load_dialect(dialect)
    return Parser(context, text, name).parse_module()


def spatial_generator(request: Any) -> SpatialGenerator:
    """The `spatial` backend's generator for a `logos_ir.runtime.RunRequest`."""
    if request.emulate:
        raise LogosError("the spatial backend has no --emulate mode: it is a simulator already")
    if request.tp != 1:
        raise LogosError(f"the spatial backend places the model on one grid; --tp {request.tp} is not for it")
    return SpatialGenerator(request.store, ctx=request.ctx, image=request.weights, build=request.build)
