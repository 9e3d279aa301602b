"""The D5005 engine's cost model: the cycles of the engine's loops (`engine_loops.py`, the loops `engine.cl`
prints) for each instruction word of a `d5005.program`, the kernels that run at once and the bursts each bank
serves.

For each loop:

* **trip count**: as `engine_loops` gives it for the word, the step's token and position and the bank;
* **initiation interval (II)**: 1, unless the loop carries a floating-point result from one iteration to a later
  one: at distance d (1 for `acc += ...`, SHIFT_DEPTH for a shift register or an `ivdep safelen(SHIFT_DEPTH)`
  update) the II is ceil(FP_LATENCY / d). A loop that stores to and loads from a memory it does not own with no
  `ivdep` has the II of that memory's store-to-load latency (ONCHIP_DEPENDENCE);
* **cycles**: trips x II, plus for each nested loop its own cycles per outer iteration; a loop's invocation costs
  LOOP_LATENCY cycles of fill and drain when it is outermost or its bounds change between the outer loop's
  iterations (the outer loop is then not pipelined), else INNER_ENTRY cycles per outer iteration.

The bank readers' loops write one 512-bit word (a burst) an iteration; a bank serves them at DDR_EFFICIENCY of
its peak of one burst a cycle. The five kernels run at once, so an instruction takes the longest of the compute
routine's cycles and each reader's cycles / DDR_EFFICIENCY. Bytes per token are the readers' bursts (the weights
as streamed, then K and V of each KV head as the attention's loops read them, once for the group) plus the
compute kernel's writes (cache rows, logits). The sources of the constants are in docs/d5005.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from logos_ir.dialects import d5005
from logos_ir.passes.d5005 import engine_loops
from logos_ir.passes.d5005.engine_loops import Loop, Routine, Step

DDR_EFFICIENCY = 0.90  # sustained / peak of a DDR4 bank for long sequential reads (docs/d5005.md: the sources)
FP_LATENCY = 6  # cycles of a carried floating-point operation: its II when carried at distance 1
ONCHIP_DEPENDENCE = 4  # cycles from a store to a load of the same on-chip memory: the II of a loop that may alias
LOOP_LATENCY = 100  # cycles of fill and drain of a pipelined loop's invocation
INNER_ENTRY = 4  # cycles an inner loop of fixed bounds adds per iteration of its (pipelined) outer loop


def initiation_interval(loop: Loop) -> int:
    """The loop's II by the rules in this module's docstring."""
    ii = 1 if loop.carried is None else math.ceil(FP_LATENCY / loop.carried)
    return max(ii, ONCHIP_DEPENDENCE) if loop.aliased else ii


# -- cycles and bursts -------------------------------------------------------------------------------------------


@dataclass
class LoopCost:
    cycles: float = 0.0
    iterations: int = 0
    by_loop: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, cycles: float) -> None:
        self.by_loop[name] = self.by_loop.get(name, 0) + cycles


def loop_cycles(loop: Loop, out: LoopCost) -> float:
    """Cycles of one invocation of `loop` (fill and drain not included)."""
    own = loop.trips * initiation_interval(loop)
    if (not loop.inner and loop.inner_of is None) or loop.trips == 0:
        out.iterations += loop.trips
        out.add(loop.name, own)
        return own
    total = float(own)
    if loop.inner_of is not None:  # the inner bounds change with the iteration: each invocation fills and drains
        for value in range(loop.trips):
            for inner in loop.inner_of(value):
                total += LOOP_LATENCY + loop_cycles(inner, out)
    else:
        for inner in loop.inner:
            once = LoopCost()
            total += loop.trips * (INNER_ENTRY + loop_cycles(inner, once))
            out.iterations += loop.trips * once.iterations
            for name, cycles in once.by_loop.items():
                out.add(name, loop.trips * cycles)
    out.add(loop.name, own)
    return total


def routine_cycles(loops: list[Loop]) -> LoopCost:
    """Cycles of one call of a routine: each outermost loop's invocation, plus its fill and drain."""
    cost = LoopCost()
    for loop in loops:
        cost.cycles += (LOOP_LATENCY if loop.trips else 0) + loop_cycles(loop, cost)
    return cost


# -- the estimate ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """The engine the model costs: its constants (the `#define`s the emitter prints) and each opcode's routine in
    the compute kernel and in the bank readers (`engine_loops`)."""

    constants: dict[str, int]
    compute: dict[str, Routine] = field(default_factory=lambda: dict(engine_loops.COMPUTE))
    readers: dict[str, Routine] = field(default_factory=lambda: dict(engine_loops.READERS))

    @classmethod
    def of(cls, params: d5005.EngineParams) -> Engine:
        from logos_ir.passes.d5005.emit_opencl import engine_constants

        return cls(engine_constants(params))


def instruction_cost(engine: Engine, word: list[int], token: int, position: int) -> dict[str, Any]:
    """Cycles of one instruction word: the compute routine and each bank reader run at once."""
    opcode = {code: name.split(".")[1] for name, code in d5005.OPCODES.items()}[word[d5005.W_OPCODE]]
    step = Step(engine.constants, word, token, position)
    compute = routine_cycles(engine.compute[opcode](step))
    bursts = [0] * d5005.BANKS
    reader = engine.readers.get(opcode)
    if reader is not None:
        for b in range(d5005.BANKS):
            bursts[b] = routine_cycles(reader(Step(engine.constants, word, token, position, b))).iterations
    streamed = max(bursts) / DDR_EFFICIENCY + (LOOP_LATENCY if any(bursts) else 0)
    burst = engine.constants["BURST_BYTES"]
    written = compute.by_loop.get(f"{opcode}.words", 0) * burst if opcode == "cache_write" else 0
    written += word[d5005.W_ROWS] * 4 if opcode == "argmax" else 0
    return {
        "opcode": opcode,
        "cycles": max(compute.cycles, streamed),
        "compute_cycles": compute.cycles,
        "bursts": bursts,
        "read_bytes": sum(bursts) * burst,
        "written_bytes": written,
        "by_loop": compute.by_loop,
    }


def estimate(program: d5005.ProgramOp, position: int | None = None, engine: Engine | None = None) -> dict[str, Any]:
    """The decode step's estimated cycles, tokens/s and share of the roofline of the bytes the engine reads (at
    `position`, the last position of the cache by default), on `engine` (by default the one the emitter writes
    for the program's parameters)."""
    from logos_ir.passes.d5005.emit_stream import encode_instruction

    params = program.params
    engine = engine or Engine.of(params)
    position = position or program.ctx.value.data
    cycles = 0.0
    read = written = weights = 0
    by_opcode: dict[str, float] = {}
    by_loop: dict[str, float] = {}
    cache: dict[tuple[int, ...], dict[str, Any]] = {}
    for op in program.instructions():
        word = encode_instruction(op, params.burst_bytes)
        key = tuple(word[f] for f in engine_loops.TRIP_FIELDS)  # what the trip counts read of the word
        cost = cache.get(key) or cache.setdefault(key, instruction_cost(engine, word, 1, position))
        cycles += cost["cycles"]
        read += cost["read_bytes"]
        written += cost["written_bytes"]
        weights += cost["read_bytes"] if cost["opcode"] in ("matvec", "embed_row", "rms_norm") else 0
        by_opcode[cost["opcode"]] = by_opcode.get(cost["opcode"], 0) + cost["cycles"]
        for name, value in cost["by_loop"].items():
            by_loop[name] = by_loop.get(name, 0) + value
    peak = d5005.BANKS * d5005.BANK_GBPS * 1e9
    tokens = params.clock_mhz * 1e6 / cycles
    roofline = peak / read
    return {
        "clock_mhz": params.clock_mhz,
        "burst_bytes": params.burst_bytes,
        "vector_width": params.vector_width,
        "banks": d5005.BANKS,
        "peak_gb_per_s": round(peak / 1e9, 1),
        "ddr_efficiency": DDR_EFFICIENCY,
        "fp_latency": FP_LATENCY,
        "loop_latency": LOOP_LATENCY,
        "position": position,
        "cycles_per_token": round(cycles),
        "cycles_by_opcode": {k: round(v) for k, v in sorted(by_opcode.items())},
        "loop_cycles": {k: round(v) for k, v in sorted(by_loop.items())},
        "bytes_read_per_token": read,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": read - weights - _rope_bytes(program, params.burst_bytes),
        "bytes_written_per_token": written,
        "tokens_per_s": round(tokens, 3),
        "roofline_tokens_per_s": round(roofline, 3),
        "fraction_of_roofline": round(tokens / roofline, 4),
    }


def _rope_bytes(program: d5005.ProgramOp, burst: int) -> int:
    return sum(
        d5005.bank_words(op.head_dim.value.data, 4, burst) * burst
        for op in program.instructions()
        if isinstance(op, d5005.RopeOp)
    )


def summary_lines(cost: dict[str, Any]) -> list[str]:
    return [
        f"d5005 cost model (read from the engine's loops): {cost['tokens_per_s']} tokens/s (estimate, not a"
        f" measurement) at position {cost['position']}, {cost['cycles_per_token']} cycles at {cost['clock_mhz']} MHz",
        f"  {cost['bytes_read_per_token'] / 1e9:.3f} GB read from board memory per token; roofline"
        f" {cost['roofline_tokens_per_s']} tokens/s at {cost['peak_gb_per_s']} GB/s;"
        f" {cost['fraction_of_roofline'] * 100:.1f}% of it (DDR4 efficiency assumed {cost['ddr_efficiency']})",
    ]
