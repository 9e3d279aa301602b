"""The reference interpreter: runs a LOGOS program with numpy, in float32.

An `Interpreter` compiles a `logos.program` once into a plan (`plan`), then runs it as many times as asked:

* compile: every `func.call` from `@main` is inlined, so the program becomes one list of steps. Weights are
  looked up once (the store's cached arrays; a split weight's share is a view of it) and bound into the steps
  that read them, as are the KV caches (from a `KVState`) and the rotary tables. Each intermediate value gets
  a register slot, and a slot is reused once its value is dead, so a run holds one layer's temporaries at a
  time.
* run: each step is a small closure `step(registers)` made by a kernel (`kernels`, the numpy math of each op);
  running is `for step in steps: step(registers)`, with no IR, no dispatch on op types and no dictionary lookups
  on the hot path.

A program split over chips (a `shard.grid @chips`) runs as that many chips, each with its own registers, its
own share of every split weight and its own share of every cache. They execute in lockstep, segment by
segment, and meet only at `shard.all_reduce`, which sums the chips' partial results (in chip order) and hands
each chip a copy, and at `shard.all_gather` (the split head's logits), which puts the chips' shares side by side
along the gather axis in chip order and hands each chip a copy: no chip ever reads another chip's share but
through a collective.

Token ids and positions are counted from 1, as in LOGOS; `run` returns what `@main` returns (token ids from 1,
logits, or a hidden state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from logos_ir.dialects import logos
from logos_ir.errors import LogosError
from logos_ir.interpreter.kernels import RopeTable
from logos_ir.interpreter.plan import (
    Communication,
    Input,
    KVState,
    Plan,
    check_weights,
    compile_plan,
    grid_chips,
    initial_rope_length,
)
from logos_ir.weights import WeightStore

__all__ = ["Communication", "Interpreter", "KVState", "run_text"]

_F32 = np.float32


# -- the interpreter -----------------------------------------------------------------------------------------


class Interpreter:
    """Runs one LOGOS program on numpy (see the module docstring). Construction checks the weights and
    compiles; `run` executes @main with inputs bound by their value names."""

    def __init__(self, program: logos.ProgramOp, weights: WeightStore, state: KVState | None = None):
        check_weights(program, weights)
        self.program = program
        self.weights = weights
        self.state = state if state is not None else KVState()
        self.spec = program.spec
        self.chips = grid_chips(program)
        self._ropes: dict[tuple[Any, ...], RopeTable] = {}
        self._plan, self._cache_length = compile_plan(
            program, weights, self.state, self.chips, self._ropes, initial_rope_length(program)
        )
        self._fast = self._plan.segments[0].steps[0] if self.chips == 1 and len(self._plan.segments) == 1 else None
        self._ran = False

    # -- running ---------------------------------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, str]:
        """The names `run` binds inputs by, in program order, each with its kind (token, position or
        hidden)."""
        return {name: spec.kind for name, spec in self._plan.inputs.items()}

    def run(self, **inputs: Any) -> np.ndarray:
        """Run @main. Keyword arguments replace the placeholder of the `logos.input` of that name (token ids
        and positions from 1, hidden states as float arrays); returns @main's result."""
        plan = self._plan
        bound = self._bind(inputs)
        for regs in plan.registers:
            for slot, array in bound:
                regs[slot] = array
        if self._fast is not None:
            regs = plan.registers[0]
            for step in self._fast:
                step(regs)
        else:
            self._run_lockstep(plan)
        self._ran = True
        return plan.registers[0][plan.result]

    def _run_lockstep(self, plan: Plan) -> None:
        registers = plan.registers
        for segment in plan.segments:
            for regs, steps in zip(registers, segment.steps, strict=True):
                for step in steps:
                    step(regs)
            if segment.reduce is not None:
                source, target = segment.reduce
                if segment.gather is not None:  # the chips' shares side by side, in chip order
                    total = np.concatenate([regs[source] for regs in registers], axis=segment.gather)
                    for chip, regs in enumerate(registers):
                        regs[target] = total if chip == 0 else total.copy()
                    continue
                total = registers[0][source].copy()
                for regs in registers[1:]:
                    total += regs[source]
                for chip, regs in enumerate(registers):
                    regs[target] = total if chip == 0 else total.copy()  # each chip gets its own copy

    def _bind(self, given: Mapping[str, Any]) -> list[tuple[int, np.ndarray]]:
        inputs = self._plan.inputs
        unknown = [name for name in given if name not in inputs]
        if unknown:
            raise LogosError(
                f"the program has no input named {', '.join(repr(n) for n in unknown)}",
                hint=f"its inputs are: {', '.join(inputs) or 'none'}",
            )
        slot = self._plan.slot
        bound = []
        for name, spec in inputs.items():
            value = given.get(name)
            bound.append((slot[spec.value], self._check_input(spec, value)))
        return bound

    def _check_input(self, spec: Input, value: Any) -> np.ndarray:
        if value is None:
            if spec.default is None:
                raise LogosError(f"input '{spec.name}' is a hidden state: give its value, run({spec.name}=...)")
            value = spec.default
        array = np.asarray(value)
        if array.size != math.prod(spec.shape):
            raise LogosError(f"input '{spec.name}' takes {list(spec.shape)} values, got shape {list(array.shape)}")
        if spec.kind == "hidden":
            return np.ascontiguousarray(array, dtype=_F32).reshape(spec.shape)
        if array.dtype.kind not in "iu":
            raise LogosError(f"input '{spec.name}': {spec.kind}s are whole numbers, got {array.dtype}")
        array = array.astype(np.int64, copy=False).reshape(spec.shape)
        self._check_range(spec, array)
        return array

    def _check_range(self, spec: Input, array: np.ndarray) -> None:
        low, high = int(array.min()), int(array.max())
        if spec.kind == "token":
            if low < 1 or high > self.spec.vocab:
                raise LogosError(
                    f"input '{spec.name}': token ids run from 1 to {self.spec.vocab}, got {array.tolist()}"
                )
            return
        if low < 1:
            raise LogosError(f"input '{spec.name}': positions count from 1, got {array.tolist()}")
        limit = self._cache_length
        if limit is not None:
            if high > limit:
                raise LogosError(f"input '{spec.name}': position {high} is outside the cache (positions 1 to {limit})")
        else:
            for table in self._ropes.values():
                table.ensure(high)

    # -- what a run did --------------------------------------------------------------------------------------

    @property
    def last_values(self) -> dict[str, np.ndarray]:
        """Every value @main names (its inputs, x0, x1, ..., the result) from the last run, chip 0's on a
        split program (they are replicated); empty before the first run."""
        if not self._ran:
            return {}
        regs, slot = self._plan.registers[0], self._plan.slot
        return {name: regs[slot[value]] for name, value in self._plan.main_values.items()}

    @property
    def logits(self) -> np.ndarray | None:
        """The float32 logits `[vocab]` of the last row the head's arg-max read in the last run (chip 0's on a
        split program, where every chip holds them whole); None before the first run or for a program with no
        arg-max. A copy: the next run does not change it."""
        if not self._ran or self._plan.logits is None:
            return None
        value = self._plan.registers[0][self._plan.slot[self._plan.logits]]
        value = np.asarray(value, dtype=_F32)
        return value.reshape(-1, value.shape[-1])[-1].copy()

    def communication_bytes_per_run(self) -> Communication:
        """The bytes the chips all-reduce in one run (sum of the all-reduced float32 tensors' sizes; the
        traffic of a ring all-reduce is 2(n-1)/n times that per chip), per section and in total; zero on one
        chip."""
        return self._plan.communication


def run_text(text: str, weights: WeightStore, state: KVState | None = None, filename: str = "<logos>") -> np.ndarray:
    """Parse LOGOS text and run it once with the inputs it carries (its placeholders)."""
    from logos_ir.parser import parse_program

    return Interpreter(parse_program(text, filename), weights, state).run()
