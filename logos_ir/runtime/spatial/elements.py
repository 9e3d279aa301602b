"""The grid of elements running one program (`Fabric`): each element's program counter, call stack, activated and
blocked tasks and clock, and a launch run to its end. The elements at one instruction run it together, the lowest
instruction first, so elements that took different branches meet again where the branches join; an element waiting
for wavelets is set aside until a send delivers to it; an idle element starts its activated, unblocked task of the
lowest id; a step that cannot finish is named as a deadlock. Its other parts are mixed in: `compiler.Compiler`,
`dsd.DsdOps`, `fabric.Wavelets`, `memory.Memory`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue

from logos_ir.dialects.csl_ext import MEMORY
from logos_ir.passes.spatial.verify_grid import Layout, read_layout, split_modules
from logos_ir.runtime.spatial import CYCLES, MEMCPY_WEST, FabricError
from logos_ir.runtime.spatial.compiler import Compiler
from logos_ir.runtime.spatial.dsd import DsdOps
from logos_ir.runtime.spatial.fabric import Blocked, Wavelets
from logos_ir.runtime.spatial.memory import Memory


class Fabric(Compiler, DsdOps, Wavelets, Memory):
    """The grid of elements running one program (see the package docstring)."""

    # Which waiting instruction's elements run next: "lowest" (the default) or "highest" (a test runs both: the
    # cycles, wavelets and results must not depend on it)
    schedule = "lowest"
    # Whether DSD ops with a fabric operand may take the shorter way (`_fast_dsd`); a test runs without it and
    # compares
    fast = True

    def __init__(
        self,
        module: ModuleOp,
        params: dict[str, int],
        memory: int = MEMORY,
        queue_words: int | None = None,
        layout: Layout | None = None,
    ):
        """`layout`: the module's layout as `read_layout` reads it, when the caller has read it already (a bench
        loading one large grid several times: reading a layout runs its loops for every element)."""
        program, layout_module = split_modules(module)
        self.program = program
        self.layout = layout if layout is not None else read_layout(layout_module, params)
        self.width, self.height = self.layout.width, self.layout.height
        n = self.n = self.width * self.height
        self.xs = np.arange(n) % self.width
        self.ys = np.arange(n) // self.width
        self.regs: dict[SSAValue, Any] = {}
        self.memory: dict[str, np.ndarray] = {}
        self.array_types: dict[str, str] = {}  # each array's element type (f16, f32, i16, i32)
        self.exports: dict[str, str] = {}
        self.instrs: list[Callable[[np.ndarray], np.ndarray]] = []
        self.names: list[str] = []
        self.entries: dict[str, int] = {}
        self.parameters: dict[str, list[np.ndarray]] = {}  # each function's parameters' registers
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
        self.queue_binding = {}
        self.param_values: dict[str, np.ndarray] = {}  # each parameter of the tile code, over the elements
        self._load(memory)
        self._connect(queue_words)
        self.park_colour = np.full(n, -1, dtype=np.int64)  # an element waiting at a DSD op: the colour (-2: to send)
        self.receiving = np.full(n, -1, dtype=np.int64)  # an element at a receive: its colour (kept over retries)
        self.memcpy_cycles = 0.0  # memcpy's copies so far (Memory.memcpy_h2d, memcpy_d2h)
        self.channels = 1  # memcpy's channels, as commands.sh compiles it
        self.park_need = np.zeros(n, dtype=np.int64)
        self.groups: dict[int, list[np.ndarray]] = {}  # the elements ready to run, by instruction
        self.wavelets = 0

    def launch(self, function: str, *args: int | float, limit: int = 50_000_000) -> float:
        """Run exported `function` on every element with the launch's arguments `args` (the host's `launch`; the
        SDK's memcpy carries them in the launch's command) until every element has ended the launch
        (memcpy's `unblock_cmd_stream`) and is idle; the cycles it took (the latest clock, from a common start).

        Scheduling (which elements the simulator advances next; it changes no element's clock, which counts its own
        ops and its wavelets' arrivals): the elements at the lowest instruction go first, all together, so elements
        that took different branches meet again where the branches join; an element waiting at a DSD op for
        wavelets is set aside until a send delivers to it; when nothing else can run, every waiting element tries
        again, and if none moves, the step is deadlocked."""
        if function not in self.exports or function not in self.entries:
            raise FabricError(f"the host launches '{function}', which the program does not export")
        parameters = self.parameters.get(function, [])
        if len(args) != len(parameters):
            raise FabricError(f"'{function}' takes {len(parameters)} launch arguments, not {len(args)}")
        for register, value in zip(parameters, args, strict=True):
            register[:] = value
        pick = min if self.schedule == "lowest" else max
        start = float(self.clock.max())
        self.rebase(start)
        # each element starts as the launch reaches it: memcpy's command, then eastward from its west columns
        self.clock[:] = start + CYCLES["launch"] + (self.xs + MEMCPY_WEST) * CYCLES["hop"]
        self.pc[:] = self.entries[function]
        self.depth[:] = 0
        self.ended[:] = False
        self.park_colour[:] = -1
        self.receiving[:] = -1
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
        self.check_span(float(self.clock.max()))
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
