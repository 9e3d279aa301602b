"""The decode step's latency model (the build report's `latency_model`): for every launch of a plan, the bytes it
moves, the bytes its warps keep in flight an SM, and an estimated time; for the step, the time the HBM bytes it
must read would take at the datasheet bandwidth against the sum of the launches' estimates (the step's fraction of
HBM). A model computed from the plan and its kernels' IR, not a measurement; each constant is a range with its
source, and every figure is a band (the low end from each range's optimistic end).

A launch's estimate: one launch gap, one latency for its first loads, then its bytes at the bandwidth Little's law
allows (`SMS` x bytes in flight an SM / latency, at most the peak):

    t = gap + latency + bytes / min(peak, SMS * in_flight_per_sm / latency)

HBM bytes are the launch's reads as `step_bytes` counts them (weights once, the live cache, one embedding row);
scratch (partial sums a launch writes and the next reads back) is served by L2, each loop round of its reader a
dependent L2 round trip. Bytes in flight an SM: the global loads a thread issues in its kernel's main loop body
before it uses them (every load of a loop iteration: the lane's kernels issue all of an iteration's loads first),
times 32 a warp, times the warps an SM holds at once: the occupancy ptxas's registers allow where measured, else
the launch bound's (4 blocks of 4 warps), at most the launch's active warps over the SMs, and at most the bytes a
warp has to read at all. Writes are not counted (a decode step writes kilobytes). Attention at a live length L
runs the warps of the splits that attend anything (`ceil(L / span)` a KV head), as the kernel shares L out.
"""

from __future__ import annotations

import math
from typing import Any

from logos_ir.numerics import ceil_div

SMS = 132  # H200 SXM (and H100 SXM): 132 SMs
WARP = 32

# (low, high) of each constant, and where it comes from. No GPU was lent to this lane: none is measured here.
CONSTANTS: dict[str, tuple[float, float, str]] = {
    "hbm_bytes_per_s": (4.8e12, 4.8e12, "H200 SXM datasheet peak (NVIDIA H200 product brief): 4.8 TB/s"),
    "dram_latency_s": (
        600e-9,
        900e-9,
        "assumed: published Hopper pointer-chase microbenchmarks put HBM latency at roughly 500-700 ns unloaded; "
        "loaded streaming is higher (the lane's 29 KB an SM uses ~800 ns)",
    ),
    "l2_latency_s": (
        200e-9,
        300e-9,
        "assumed: published Hopper microbenchmarks give an L2 hit about 150-270 ns (more from the far partition)",
    ),
    "l2_bytes_per_s": (
        5.5e12,
        10e12,
        "assumed: published H100 L2 read-bandwidth measurements of about 5.5-10 TB/s (no H200 figure was found)",
    ),
    "launch_gap_s": (
        1.5e-6,
        3.0e-6,
        "assumed: a kernel node of a CUDA graph on Hopper costs about 1.5-3 us from one kernel's end to the next's "
        "full occupancy (published figures; this lane's docs/cuda.md uses the same range)",
    ),
    "programmatic_gap_s": (
        0.5e-6,
        1.5e-6,
        "assumed: with programmatic dependent launch the next kernel's grid is launched and its blocks resident "
        "while this one runs (Nsight Systems timelines in llama.cpp's and XLA's PDL pull requests show dependent "
        "kernels abutting or overlapping); what is left is this grid's completion reaching the waiting blocks and "
        "their first instructions: taken as a third to a half of a graph node's gap, unmeasured",
    ),
}
LAUNCH_BOUND_WARPS = 16  # the emitter's __launch_bounds__(128, 4): at least 4 blocks of 4 warps an SM


def _value(name: str, end: int) -> float:
    return CONSTANTS[name][end]


def thread_flight(kernel: Any) -> int:
    """The bytes of global loads a thread of `kernel` issues in its main loop's body (the first `scf.for` with a
    global load in it) before using them, or at its top level where it has no such loop; scratch included (what
    reads it is served by L2)."""
    args = set(kernel.body.block.args)

    def loads(block: Any) -> int:
        total = 0
        for op in block.ops:
            if op.name == "vector.load" and op.operands[0] in args:
                total += op.results[0].type.get_shape()[0] * _element_bytes(op.operands[0])
            elif op.name == "memref.load" and op.operands[0] in args:
                total += _element_bytes(op.operands[0])
        return total

    for op in kernel.walk():
        if op.name == "scf.for":
            found = loads(op.body.block)
            if found:
                return found
    return loads(kernel.body.block)


def _element_bytes(value: Any) -> int:
    text = str(value.type.element_type)
    return 2 if "bf16" in text else 8 if "i64" in text else 4


def _active_warps(plan: Any, launch: Any, live: int) -> int:
    """The warps of a launch that do work at live length `live`: attention's the splits that attend anything."""
    blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
    warps = blocks * 4
    if launch.kernel.startswith("attention_") and not launch.kernel.startswith(("attention_merge", "attention_pre")):
        from logos_ir.passes.cuda.decode_kernels import attention_min_span

        keys = plan.buffers[launch.buffers[1]]
        scratch = plan.buffers[launch.buffers[4]]
        kv_heads, head_dim, splits, rows = keys.shape[-3], keys.shape[-1], scratch.shape[2], scratch.shape[0]
        group = scratch.shape[1] // kv_heads
        least = attention_min_span(head_dim, _element_type(keys), group)
        span = max(ceil_div(live, splits), least)
        warps = min(warps, rows * kv_heads * ceil_div(live, span))
    return warps


def _element_type(buffer: Any) -> Any:
    from xdsl.dialects.builtin import BFloat16Type, Float32Type

    return BFloat16Type() if buffer.element == "bf16" else Float32Type()


def launch_estimate(
    plan: Any, launch: Any, live: int, occupancy_warps: int, gap: str = "launch_gap_s"
) -> dict[str, Any]:
    """One launch at live length `live`: HBM and L2 bytes, bytes in flight an SM, and its time (low, high) in s;
    `gap`: the constant of the gap before it (`programmatic_gap_s` for a programmatic launch after a kernel)."""
    from logos_ir.passes.cuda.traffic import kernel_reads, launch_bytes

    hbm = l2 = 0
    for name, loaded in zip(launch.buffers, plan.fact(launch.kernel, kernel_reads), strict=True):
        if not loaded:
            continue
        if plan.buffers[name].kind == "scratch":
            l2 += _scratch_bytes(plan, launch, name, live)
        else:
            hbm += launch_bytes(plan, launch, name, live)
    active = max(_active_warps(plan, launch, live), 1)
    per_warp = min(plan.fact(launch.kernel, thread_flight) * WARP, math.ceil((hbm + l2) / active))
    resident = min(occupancy_warps, active / SMS)
    in_flight = per_warp * resident
    times = []
    for end in (0, 1):
        latency = _value("dram_latency_s", end)
        peak = _value("hbm_bytes_per_s", end)
        rate = min(peak, SMS * in_flight / latency) if in_flight else peak
        t = _value(gap, end)
        if hbm:
            t += latency + hbm / rate
        if l2:
            rounds = _scratch_rounds(plan, launch, live)
            t += rounds * _value("l2_latency_s", end) + l2 / _value("l2_bytes_per_s", 1 - end)
        times.append(t)
    return {
        "kernel": launch.kernel,
        "hbm_bytes": hbm,
        "l2_bytes": l2,
        "active_warps": active,
        "bytes_in_flight_per_sm": round(in_flight),
        "gap": gap,
        "seconds": (times[0], times[1]),
    }


def _scratch_bytes(plan: Any, launch: Any, name: str, live: int) -> int:
    """The scratch a launch reads: attention's merge the partial states of the splits that attended anything."""
    buffer = plan.buffers[name]
    from logos_ir.passes.cuda.traffic import buffer_bytes

    if launch.kernel.startswith("attention_merge") and len(buffer.shape) == 4:
        used = _merge_splits(plan, launch, live)
        return buffer_bytes(buffer) * used // buffer.shape[2]
    return buffer_bytes(buffer)


def _merge_splits(plan: Any, launch: Any, live: int) -> int:
    from logos_ir.passes.cuda.decode_kernels import attention_min_span

    partial = plan.buffers[launch.buffers[1]]
    attention = next(
        other for other in plan.launches if other.kernel.startswith("attention_") and launch.buffers[1] in other.buffers
    )
    keys = plan.buffers[attention.buffers[1]]
    group = partial.shape[1] // keys.shape[-3]
    least = attention_min_span(keys.shape[-1], _element_type(keys), group)
    span = max(ceil_div(live, partial.shape[2]), least)
    return ceil_div(live, span)


def _scratch_rounds(plan: Any, launch: Any, live: int) -> int:
    """Dependent L2 round trips of a scratch reader: the merge's warp reads 32 x MERGE_UNROLL splits a round."""
    from logos_ir.passes.cuda.decode_kernels import MERGE_UNROLL

    if launch.kernel.startswith("attention_merge"):
        return ceil_div(_merge_splits(plan, launch, live), WARP * MERGE_UNROLL)
    return 1


def launch_gaps(plan: Any, programmatic: bool = True) -> list[str]:
    """The gap constant before each launch of the plan: a programmatic launch (its kernel waits at its top) right
    after another kernel pays `programmatic_gap_s`; the first launch, one after a collective (NCCL's kernels do not
    trigger their dependents early) and, with `programmatic` off, every launch pays a graph node's `launch_gap_s`."""
    from logos_ir.passes.cuda.host_plan import Launch

    gaps, previous = [], None
    for step in plan.steps:
        if isinstance(step, Launch):
            early = programmatic and step.programmatic and isinstance(previous, Launch)
            gaps.append("programmatic_gap_s" if early else "launch_gap_s")
        previous = step
    return gaps


def step_estimate(
    plan: Any, live: int, occupancy: dict[str, int] | None = None, programmatic: bool = True
) -> dict[str, Any]:
    """The step at live length `live`: each launch's estimate, their sum, the least HBM bytes a step reads and the
    fraction of HBM that is (low, high: the band of the constants). `occupancy`: warps an SM per kernel (ptxas's);
    else the launch bound's. `programmatic` off: every launch a plain graph node (the baseline PDL is measured
    against)."""
    from logos_ir.passes.cuda.traffic import step_bytes

    occupancy = occupancy or {}
    launches = [
        launch_estimate(plan, launch, live, occupancy.get(launch.kernel, LAUNCH_BOUND_WARPS), gap)
        for launch, gap in zip(plan.launches, launch_gaps(plan, programmatic), strict=True)
    ]
    _, minimum = step_bytes(plan, live)
    low = sum(e["seconds"][0] for e in launches)
    high = sum(e["seconds"][1] for e in launches)
    peak = _value("hbm_bytes_per_s", 0)
    floor = minimum / peak
    return {
        "live": live,
        "minimum_bytes": minimum,
        "seconds": (low, high),
        "hbm_fraction": (round(floor / high, 3), round(floor / low, 3)),
        "launches": launches,
    }


def latency_report(plan: Any, occupancy: dict[str, int] | None = None) -> dict[str, Any]:
    """The build report's `latency_model`: the constants with their sources; per kernel, at the full cache, its
    bytes in flight an SM (the least over its launches) and its estimated time (summed over its launches, us);
    and the step's fraction of HBM at live lengths 256, 1024 and 8192 (those the cache holds)."""
    ctx = max((b.shape[-2] for b in plan.buffers.values() if b.kind == "cache"), default=0)
    full = step_estimate(plan, ctx, occupancy) if ctx else None
    kernels: dict[str, dict[str, Any]] = {}
    for entry in full["launches"] if full else []:
        found = kernels.setdefault(
            entry["kernel"], {"launches": 0, "bytes_in_flight_per_sm": entry["bytes_in_flight_per_sm"], "us": [0, 0]}
        )
        found["launches"] += 1
        found["bytes_in_flight_per_sm"] = min(found["bytes_in_flight_per_sm"], entry["bytes_in_flight_per_sm"])
        found["us"] = [found["us"][i] + entry["seconds"][i] * 1e6 for i in (0, 1)]
    for found in kernels.values():
        found["us"] = [round(u, 2) for u in found["us"]]
    steps = {}
    for live in (256, 1024, 8192):
        if live <= ctx:
            estimate = step_estimate(plan, live, occupancy)
            plain = step_estimate(plan, live, occupancy, programmatic=False)
            steps[str(live)] = {
                "hbm_fraction": list(estimate["hbm_fraction"]),
                "hbm_fraction_without_programmatic_launch": list(plain["hbm_fraction"]),
                "programmatic_launches": sum(e["gap"] == "programmatic_gap_s" for e in estimate["launches"]),
                "ms": [round(s * 1e3, 3) for s in estimate["seconds"]],
                "minimum_mb": round(estimate["minimum_bytes"] / 1e6, 1),
                "attention_bytes_in_flight_per_sm": min(
                    (e["bytes_in_flight_per_sm"] for e in estimate["launches"] if _is_split_attention(e["kernel"])),
                    default=None,
                ),
            }
    return {
        "constants": {name: {"range": [lo, hi], "source": source} for name, (lo, hi, source) in CONSTANTS.items()},
        "occupancy": "ptxas's registers" if occupancy else "the launch bound's (4 blocks of 4 warps an SM)",
        "kernels": kernels,
        "steps": steps,
    }


def _is_split_attention(kernel: str) -> bool:
    return kernel.startswith("attention_") and not kernel.startswith(("attention_merge", "attention_pre"))
