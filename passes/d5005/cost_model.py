"""The D5005 engine's cost model: cycles per instruction from the engine's parameters and the card's memory.

Assumptions (docs/d5005.md gives their sources):
* The engine runs at `clock_mhz` (300 MHz: the DDR4-2400 controllers' quarter-rate user clock, 2400 MT/s / 8).
* Each of the four DDR4-2400 banks (64-bit, 19.2 GB/s peak; 76.8 GB/s for the card) delivers one 64-byte burst
  per cycle at peak, at an efficiency of `EFFICIENCY` for long sequential reads (refresh, row activations and the
  controller's scheduling take the rest).
* A matvec streams its weight region from the four banks at once, one burst per bank per cycle (`vector_width`
  weights each, `mac_lanes` MACs per cycle), so it is memory-bound: bytes per bank / (burst x efficiency) cycles.
* On-chip work (norms, RoPE, SiLU*mul, add, arg-max, softmax) handles 16 float32 words per cycle per pass.
* Attention reads the key and value rows of positions 1..p, striped over the banks; the estimate is for the step
  at the last position of the cache (p = ctx), the slowest; `LATENCY` cycles of pipeline fill per instruction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from logos_ir.dialects import d5005

EFFICIENCY = 0.90  # sustained / peak for long sequential DDR4 reads (docs/d5005.md: the sources)
LATENCY = 200  # cycles of pipeline fill and drain per instruction
ONCHIP_WORDS_PER_CYCLE = 16


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Cost:
    cycles: int = 0
    board_bytes: int = 0
    by_opcode: dict[str, int] | None = None


def _streamed(bank_bytes_each: int, burst: int) -> int:
    return int(_ceil(bank_bytes_each, burst) / EFFICIENCY)


def instruction_cost(op: d5005.InstructionOp, params: d5005.EngineParams, position: int) -> tuple[int, int]:
    """(cycles, board-memory bytes) of one instruction at `position`."""
    burst = params.burst_bytes
    onchip = lambda n: _ceil(n, ONCHIP_WORDS_PER_CYCLE)  # noqa: E731
    if isinstance(op, d5005.MatvecOp):
        region = op.weight
        return LATENCY + _streamed(region.bank_bytes, burst), d5005.BANKS * region.bank_bytes
    if isinstance(op, d5005.EmbedRowOp):
        return LATENCY + _streamed(op.table.stride.data, burst), op.table.stride.data
    if isinstance(op, d5005.RMSNormOp):
        n = op.weight.cols.data
        return LATENCY + 2 * onchip(n) + _streamed(op.weight.stride.data, burst), op.weight.stride.data
    if isinstance(op, d5005.RopeOp):
        return LATENCY + onchip(op.width.value.data), op.table.stride.data
    if isinstance(op, d5005.CacheWriteOp):
        written = op.kv_heads.value.data * op.cache.stride.data
        return LATENCY + _streamed(_ceil(written, d5005.BANKS), burst), written
    if isinstance(op, d5005.AttentionOp):
        kv, stride, heads = op.kv_heads.value.data, op.keys.stride.data, op.heads.value.data
        read = 2 * kv * position * stride
        softmax = 3 * heads * onchip(position)
        return LATENCY + _streamed(_ceil(read, d5005.BANKS), burst) + softmax, read
    if isinstance(op, d5005.ElementwiseOp | d5005.ArgmaxOp):
        return LATENCY + onchip(op.size.value.data), 0
    raise ValueError(f"the cost model has no figure for '{op.name}'")


def estimate(program: d5005.ProgramOp, position: int | None = None) -> dict[str, Any]:
    """The decode step's estimated cycles, tokens/s and share of the board's bandwidth (at `position`, the last
    position of the cache by default)."""
    params = program.params
    position = position or program.ctx.value.data
    cycles = board = weight_bytes = 0
    by_opcode: dict[str, int] = {}
    for op in program.instructions():
        c, b = instruction_cost(op, params, position)
        cycles += c
        board += b
        if isinstance(op, d5005.MatvecOp):
            weight_bytes += b
        key = op.name.split(".")[1]
        by_opcode[key] = by_opcode.get(key, 0) + c
    peak = d5005.BANKS * d5005.BANK_GBPS * 1e9
    seconds = cycles / (params.clock_mhz * 1e6)
    tokens = 1 / seconds
    roofline = peak / board
    return {
        "clock_mhz": params.clock_mhz,
        "burst_bytes": params.burst_bytes,
        "vector_width": params.vector_width,
        "mac_lanes": params.mac_lanes,
        "banks": d5005.BANKS,
        "peak_gb_per_s": round(peak / 1e9, 1),
        "efficiency": EFFICIENCY,
        "position": position,
        "cycles_per_token": cycles,
        "cycles_by_opcode": dict(sorted(by_opcode.items())),
        "bytes_per_token": board,
        "matvec_bytes_per_token": weight_bytes,
        "tokens_per_s": round(tokens, 3),
        "roofline_tokens_per_s": round(roofline, 3),
        "fraction_of_roofline": round(tokens / roofline, 4),
        "fraction_of_bandwidth": round(board * tokens / peak, 4),
    }


def summary_lines(cost: dict[str, Any]) -> list[str]:
    return [
        f"d5005 cost model: {cost['tokens_per_s']} tokens/s (estimate, not a measurement) at position"
        f" {cost['position']}, {cost['cycles_per_token']} cycles at {cost['clock_mhz']} MHz",
        f"  {cost['bytes_per_token'] / 1e9:.3f} GB of board memory per token; roofline {cost['roofline_tokens_per_s']}"
        f" tokens/s at {cost['peak_gb_per_s']} GB/s; {cost['fraction_of_bandwidth'] * 100:.1f}% of the bandwidth"
        f" (DDR4 efficiency assumed {cost['efficiency']})",
    ]
