"""The D5005 engine's cost model: `engine.cl` as printed, read as aoc's reports would read it (`aoc_report`:
unrolls, carried results, banks and ports, channels), over the trip counts of its marked loops for each
instruction word (`engine_loops`), at both ends of the stated ranges of fmax, DDR4 efficiency and the cycles of an
update through on-chip memory: a band (low, high) of tokens/s, never a point.

An iteration of a pipelined loop costs its II (1; ceil(FP_LATENCY / d) for a float carried at distance d;
ceil(update / d) for an update through memory at distance d; its accesses / PORTS on an arbitrated bank) plus the
loops left serial in it. A loop's invocation costs LOOP_LATENCY of fill and drain when it is outermost or its
bounds change with its parent's iteration, else INNER_ENTRY per parent iteration. The five kernels run at once: an
instruction takes the longest of the compute routine's cycles / fmax and each bank's stream (a bank word a cycle
at most, at most the bank's sustained share of 19.2 GB/s; less where the channels are too shallow to absorb the
banks' gaps). Bytes per token are the readers' bursts plus the compute kernel's writes. The sources of the
constants are in docs/d5005.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

from logos_ir.dialects import d5005
from logos_ir.passes.d5005 import aoc_report, engine_loops
from logos_ir.passes.d5005.engine_loops import Loop, Routine, Step


@dataclass(frozen=True)
class Corner:
    """One end of the band: the clock aoc closes, the banks' sustained share of their peak, the cycles of an update
    through on-chip memory (an M20K read, a floating-point add, the write back)."""

    fmax_mhz: float
    ddr_efficiency: float
    memory_update: int


# The ranges (docs/d5005.md gives each source): fmax from HPCC_FPGA's aoc builds on Stratix 10 (GEMM on a PAC
# D5005 at 225 MHz; STREAM on a 520N with 4 DDR4-2400 banks at 316.67 MHz); DDR efficiency from the same STREAM
# runs (65.63 to 68.90 GB/s of 76.8: 0.855 to 0.897); an update through M20K from the 8 to 12 cycles.
LOW = Corner(fmax_mhz=225.0, ddr_efficiency=0.855, memory_update=12)
HIGH = Corner(fmax_mhz=316.67, ddr_efficiency=0.897, memory_update=8)
FP_LATENCY = 6  # cycles of a carried floating-point operation: its II when carried at distance 1
LOOP_LATENCY = 100  # cycles of fill and drain of a pipelined loop's invocation
INNER_ENTRY = 4  # cycles an inner loop of fixed bounds adds per iteration of its (pipelined) outer loop
REFRESH_NS = 350  # a DDR4 8 Gb device's refresh (tRFC, JEDEC JESD79-4): the longest gap a channel must absorb


def iteration_cycles(analysis: aoc_report.Analysis, report: aoc_report.LoopReport, corner: Corner) -> float:
    """Cycles of one iteration of a pipelined loop: its II (carried results, updates through memory, ports), plus
    the loops left serial inside it, each copy in turn."""
    ii = max(
        [
            1,
            aoc_report.port_ii(analysis, report),
            *(math.ceil(FP_LATENCY / d) for d in report.carried_fp),
            *(math.ceil(corner.memory_update / d) for d in report.carried_memory if d is not None),
        ]
    )
    serial = sum(
        copies * (trips * iteration_cycles(analysis, sub, corner) + INNER_ENTRY) for copies, trips, sub in report.serial
    )
    return ii + serial


def hazards(analysis: aoc_report.Analysis) -> list[str]:
    """Loops whose results aoc would not guarantee: an update through memory under a bare ivdep."""
    return [
        f"loop {name}: an update of on-chip memory at an index that repeats, under ivdep with no safelen: aoc is"
        " told there is no dependence, and the sums are wrong once an update takes longer than its real distance"
        for name, report in analysis.loops.items()
        if any(d is None for r in aoc_report.every_report(report) for d in r.carried_memory)
    ]


# -- cycles and bursts -------------------------------------------------------------------------------------------


@dataclass
class LoopCost:
    cycles: float = 0.0
    iterations: int = 0
    by_loop: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, cycles: float) -> None:
        self.by_loop[name] = self.by_loop.get(name, 0) + cycles


@dataclass(frozen=True)
class Engine:
    """The engine the model costs: its source as aoc reads it (`aoc_report`), the constants its `#define`s state,
    and each opcode's trip counts (`engine_loops`, checked against the printed headers)."""

    source: str
    analysis: aoc_report.Analysis = field(compare=False)
    constants: dict[str, int] = field(compare=False)
    compute: dict[str, Routine] = field(default_factory=lambda: dict(engine_loops.COMPUTE), compare=False)
    readers: dict[str, Routine] = field(default_factory=lambda: dict(engine_loops.READERS), compare=False)
    _iterations: dict[tuple[str, Corner], float] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, params: d5005.EngineParams, features: frozenset[str] = frozenset()) -> Engine:
        from logos_ir.passes.d5005.emit_opencl import engine_source

        return cls.read(engine_source("", params, features))

    @classmethod
    def for_program(cls, program: d5005.ProgramOp) -> Engine:
        """The engine the emitter writes for `program`: its parameters, with the optional parts it uses."""
        from logos_ir.passes.d5005.emit_opencl import engine_features

        return cls.of(program.params, engine_features(program))

    @classmethod
    def read(cls, source: str) -> Engine:
        """The engine `source` is (an `engine.cl`, edited or not): refused where a loop the model costs is not
        marked in it."""
        analysis = aoc_report.analyse(source)
        stated = re.findall(r"^#define (\w+) (\d+)$", source, flags=re.MULTILINE)
        engine = cls(source, analysis, {name: int(value) for name, value in stated})
        step = Step(engine.constants, [1] * d5005.INSTRUCTION_WORDS, 1, 2)
        for routine in [*engine.compute.values(), *engine.readers.values()]:
            for loop in _every(routine(step)):
                if loop.name not in analysis.loops:
                    raise aoc_report.ReportError(f"the engine's source has no loop marked '{loop.name}'")
        return engine

    def iteration(self, name: str, corner: Corner) -> float:
        """Cycles of one iteration of the loop marked `name` (computed once for each corner)."""
        known = self._iterations.get((name, corner))
        if known is not None:
            return known
        report = self.analysis.loops[name]
        return self._iterations.setdefault((name, corner), iteration_cycles(self.analysis, report, corner))

    def channels_read_at_once(self, opcode: str) -> int:
        """The most channels one iteration of the opcode's compute loops reads."""
        found = [
            len(r.channels) + r.dynamic_channels
            for n, top in self.analysis.loops.items()
            if n.split(".")[0] == opcode
            for r in aoc_report.every_report(top)
        ]
        return max([1, *found])


def printed_trips(engine: Engine, loop: Loop) -> int:
    """The loop's trip count as printed: `engine_loops` states it for the header the emitter prints; a header
    edited to another step scales it; any other change of the header is refused, not guessed."""
    printed = engine.analysis.loops[loop.name]
    if printed.header == loop.header:
        return loop.trips
    stated = re.fullmatch(r"for \(uint (\w+) = 0; \1 <=? ([^;]+); \1(?:\+\+| \+= (.+))\)", loop.header)
    same = stated and printed.header.split(";")[:2] == loop.header.split(";")[:2]
    if not same:
        raise aoc_report.ReportError(f"loop {loop.name}: its header is now '{printed.header}', not '{loop.header}'")
    step = aoc_report.evaluate(stated.group(3) or "1", engine.analysis.source.numbers) or 1  # type: ignore[union-attr]
    return math.ceil(loop.trips * step / printed.step)


def _every(loops: list[Loop] | tuple[Loop, ...]) -> list[Loop]:
    return [x for loop in loops for x in [loop, *_every(loop.inner if loop.inner_of is None else loop.inner_of(0))]]


def loop_cycles(engine: Engine, loop: Loop, corner: Corner, out: LoopCost) -> float:
    """Cycles of one invocation of `loop` (fill and drain not included)."""
    loop = replace(loop, trips=printed_trips(engine, loop)) if loop.trips else loop
    own = loop.trips * engine.iteration(loop.name, corner)
    if (not loop.inner and loop.inner_of is None) or loop.trips == 0:
        out.iterations += loop.trips
        out.add(loop.name, own)
        return own
    total = float(own)
    if loop.inner_of is not None:  # the inner bounds change with the iteration: each invocation fills and drains
        for value in range(loop.trips):
            for inner in loop.inner_of(value):
                total += LOOP_LATENCY + loop_cycles(engine, inner, corner, out)
    else:
        for inner in loop.inner:
            once = LoopCost()
            total += loop.trips * (INNER_ENTRY + loop_cycles(engine, inner, corner, once))
            out.iterations += loop.trips * once.iterations
            for name, cycles in once.by_loop.items():
                out.add(name, loop.trips * cycles)
    out.add(loop.name, own)
    return total


def routine_cycles(engine: Engine, loops: list[Loop], corner: Corner) -> LoopCost:
    """Cycles of one call of a routine: each outermost loop's invocation, plus its fill and drain."""
    cost = LoopCost()
    for loop in loops:
        cost.cycles += (LOOP_LATENCY if loop.trips else 0) + loop_cycles(engine, loop, corner, cost)
    return cost


def joint_efficiency(engine: Engine, opcode: str, corner: Corner) -> float:
    """The share of its peak each bank sustains for the opcode's compute loops: its own efficiency where the
    channels are deep enough to absorb a refresh of any one bank; where they are not, an iteration that takes a
    word from k channels at once waits on each bank's gaps in turn, eff ** k (scaled between the two by the share
    of a refresh the depth covers)."""
    depth = engine.analysis.source.channel_depth or 0
    gap = REFRESH_NS * 1e-9 * corner.fmax_mhz * 1e6
    k = engine.channels_read_at_once(opcode)
    uncovered = max(0.0, 1.0 - depth / gap)
    return corner.ddr_efficiency ** (1 + (k - 1) * uncovered)


def _check_parts(engine: Engine, words: list[list[int]]) -> None:
    """Refuse words that use a part of Gemma's (a scaled embedding, a norm by one plus its weight, GeGLU, a
    sandwich norm, a soft-cap) that the engine was printed without."""
    from logos_ir.runtime.d5005 import gemma_features

    for feature, what in gemma_features(words).items():
        if engine.constants.get(feature) != 1:
            raise aoc_report.ReportError(f"the stream {what}, and the engine has no {feature}")


def instruction_cost(engine: Engine, word: list[int], token: int, position: int, corner: Corner) -> dict[str, Any]:
    """Seconds of one instruction word: the compute routine and each bank reader run at once; a reader delivers one
    bank word a cycle at most, and its bank at most its sustained share of 19.2 GB/s."""
    opcode = {code: name.split(".")[1] for name, code in d5005.OPCODES.items()}[word[d5005.W_OPCODE]]
    if opcode == "matvec" and word[d5005.W_BIAS] and engine.constants.get("ENGINE_BIAS") != 1:
        raise aoc_report.ReportError("a matvec of the stream adds a bias, and the engine has no ENGINE_BIAS")
    if opcode == "rope" and word[d5005.W_HEAD_NORM] and engine.constants.get("ENGINE_HEAD_NORM") != 1:
        raise aoc_report.ReportError("a rope of the stream norms its heads, and the engine has no ENGINE_HEAD_NORM")
    if opcode == "rope" and word[d5005.W_ROTARY] and engine.constants.get("ENGINE_PARTIAL_ROTARY") != 1:
        why = "a rope of the stream rotates a part of each head, and the engine has no ENGINE_PARTIAL_ROTARY"
        raise aoc_report.ReportError(why)
    if opcode == "attention" and word[d5005.W_WINDOW] and engine.constants.get("ENGINE_WINDOW") != 1:
        raise aoc_report.ReportError(
            "an attention of the stream slides over a window, and the engine has no ENGINE_WINDOW"
        )
    expert = opcode in ("route", "expert_sum") or opcode == "matvec" and word[d5005.W_SLOT]
    if expert and engine.constants.get("ENGINE_EXPERTS") != 1:
        raise aoc_report.ReportError("the stream routes a mixture of experts, and the engine has no ENGINE_EXPERTS")
    _check_parts(engine, [word])
    step = Step(engine.constants, word, token, position)
    compute = routine_cycles(engine, engine.compute[opcode](step), corner)
    bursts = [0] * d5005.BANKS
    reader = engine.readers.get(opcode)
    if reader is not None:
        for b in range(d5005.BANKS):
            loops = reader(Step(engine.constants, word, token, position, b))
            bursts[b] = routine_cycles(engine, loops, corner).iterations
    burst = engine.constants["BURST_BYTES"]
    clock = corner.fmax_mhz * 1e6
    bank_rate = d5005.BANK_GBPS * 1e9 * joint_efficiency(engine, opcode, corner)
    streamed = max(max(bursts) / clock, max(bursts) * burst / bank_rate) + (LOOP_LATENCY / clock if any(bursts) else 0)
    written = compute.by_loop.get(f"{opcode}.words", 0) * burst if opcode == "cache_write" else 0
    written += word[d5005.W_ROWS] * 4 if opcode == "argmax" else 0
    ids = d5005.bank_words(word[d5005.W_COLS], 4, burst) * burst  # the route's ids: a row of them in each bank
    written += d5005.BANKS * ids if opcode == "route" else 0
    routed = opcode == "matvec" and word[d5005.W_SLOT]
    route_reads = d5005.BANKS * burst if routed else 0  # each reader's load of the chosen id, from its own bank
    return {
        "opcode": opcode,
        "seconds": max(compute.cycles / clock, streamed),
        "compute_cycles": compute.cycles,
        "bursts": bursts,
        "read_bytes": sum(bursts) * burst + route_reads,
        "route_bytes": route_reads,
        "written_bytes": written,
        "by_loop": compute.by_loop,
    }


def program_words(program: d5005.ProgramOp) -> list[list[int]]:
    from logos_ir.passes.d5005.emit_stream import encode_instruction

    return [encode_instruction(op, program.params.burst_bytes) for op in program.instructions()]


def estimate(
    program: d5005.ProgramOp, position: int | None = None, engine: Engine | None = None, corner: Corner = LOW
) -> dict[str, Any]:
    """The decode step's estimate at one corner of the band (the low one by default), at `position` (the last of
    the cache by default), on `engine` (by default the one the emitter writes for the program's parameters)."""
    engine = engine or Engine.for_program(program)
    return estimate_words(program_words(program), program.ctx.value.data, engine, position, corner, program)


def estimate_words(
    words: list[list[int]],
    ctx: int,
    engine: Engine,
    position: int | None = None,
    corner: Corner = LOW,
    program: d5005.ProgramOp | None = None,
) -> dict[str, Any]:
    """The estimate of a stream's instruction words on `engine` at one corner."""
    position = position or ctx
    seconds = 0.0
    read = written = weights = kv = routes = 0
    by_opcode: dict[str, float] = {}
    by_loop: dict[str, float] = {}
    cache: dict[tuple[int, ...], dict[str, Any]] = {}
    _check_parts(engine, words)  # before the cache: words that cost the same may differ in the parts they need
    for word in words:
        key = tuple(word[f] for f in engine_loops.TRIP_FIELDS)  # what the trip counts read of the word
        cost = cache.get(key) or cache.setdefault(key, instruction_cost(engine, word, 1, position, corner))
        seconds += cost["seconds"]
        read += cost["read_bytes"]
        written += cost["written_bytes"]
        routes += cost["route_bytes"]  # an expert matvec's readers' loads of the chosen id: not weights
        weights += (
            cost["read_bytes"] - cost["route_bytes"] if cost["opcode"] in ("matvec", "embed_row", "rms_norm") else 0
        )
        kv += cost["read_bytes"] if cost["opcode"] == "attention" else 0
        by_opcode[cost["opcode"]] = by_opcode.get(cost["opcode"], 0) + cost["seconds"]
        for name, value in cost["by_loop"].items():
            by_loop[name] = by_loop.get(name, 0) + value
    peak = d5005.BANKS * d5005.BANK_GBPS * 1e9
    tokens = 1 / seconds
    roofline = peak / read
    return {
        "fmax_mhz": corner.fmax_mhz,
        "ddr_efficiency": corner.ddr_efficiency,
        "memory_update_cycles": corner.memory_update,
        "burst_bytes": engine.constants["BURST_BYTES"],
        "vector_width": engine.constants["VECTOR_WIDTH"],
        "banks": d5005.BANKS,
        "peak_gb_per_s": round(peak / 1e9, 1),
        "position": position,
        "cycles_per_token": round(seconds * corner.fmax_mhz * 1e6),
        "ms_by_opcode": {k: round(v * 1e3, 3) for k, v in sorted(by_opcode.items())},
        "loop_cycles": {k: round(v) for k, v in sorted(by_loop.items())},
        "bytes_read_per_token": read,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": kv,
        "route_bytes_per_token": routes,
        "bytes_written_per_token": written,
        "tokens_per_s": round(tokens, 3),
        "roofline_tokens_per_s": round(roofline, 3),
        "fraction_of_roofline": round(tokens / roofline, 4),
    }


def band(
    program: d5005.ProgramOp | None = None,
    engine: Engine | None = None,
    words: list[list[int]] | None = None,
    ctx: int | None = None,
) -> dict[str, Any]:
    """The estimate at both ends of the stated ranges: (low, high) tokens/s, with what aoc's reports would flag.
    A hazard (a loop whose results aoc would not keep) puts the low end at 0: that engine's tokens are not sure."""
    if program is not None:
        engine = engine or Engine.for_program(program)
        words, ctx = program_words(program), program.ctx.value.data
    assert engine is not None and words is not None and ctx is not None
    low, high = (estimate_words(words, ctx, engine, corner=c) for c in (LOW, HIGH))
    unsafe = hazards(engine.analysis)
    return {
        "band_tokens_per_s": [0.0 if unsafe else low["tokens_per_s"], high["tokens_per_s"]],
        "roofline_tokens_per_s": low["roofline_tokens_per_s"],
        "low": low,
        "high": high,
        "arbitrated": {a: len(b) for a, b in engine.analysis.arbitrated.items() if b},
        "banks": engine.analysis.banks,
        "ports": {
            name: {"loads": loads, "stores": stores, "copies": max(engine.analysis.copies[name], default=0)}
            for name, (loads, stores) in engine.analysis.ports.items()
        },
        "hazards": unsafe,
        "warnings": engine.analysis.warnings,
    }


def _rope_bytes(program: d5005.ProgramOp, burst: int) -> int:
    return sum(
        d5005.rope_row_floats(op.head_dim.value.data, burst) * 4
        for op in program.instructions()
        if isinstance(op, d5005.RopeOp)
    )


def summary_lines(cost: dict[str, Any]) -> list[str]:
    low, high = cost["band_tokens_per_s"]
    lines = [
        f"d5005 cost model (read from engine.cl as aoc would): {low} to {high} tokens/s (estimate, not a measurement)"
        f" at position {cost['low']['position']}, at {cost['low']['fmax_mhz']} to {cost['high']['fmax_mhz']} MHz and"
        f" DDR4 efficiency {cost['low']['ddr_efficiency']} to {cost['high']['ddr_efficiency']}",
        f"  {cost['low']['bytes_read_per_token'] / 1e9:.3f} GB read from board memory per token; roofline"
        f" {cost['roofline_tokens_per_s']} tokens/s at {cost['low']['peak_gb_per_s']} GB/s",
    ]
    sites = [
        f"{name} {cost['banks'][name]} banks, {p['loads']} loads + {p['stores']} stores a bank, {p['copies']} copies"
        for name, p in sorted(cost["ports"].items())
    ]
    lines.append(
        f"  on-chip arrays (sites on the busiest bank against {aoc_report.PORTS} ports a copy): " + "; ".join(sites)
    )
    if cost["arbitrated"]:
        lines.append("  arbitrated on-chip memory (sites over ports): " + ", ".join(sorted(cost["arbitrated"])))
    return lines + [f"  {line}" for line in [*cost["hazards"], *cost["warnings"]]]
