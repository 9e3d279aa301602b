"""The CUDA lane's decode steps as built, for SmolLM2-135M (ctx 1024), Llama-3.1-8B (ctx 1024) and Llama-3.1-70B
over 8 chips (ctx 8192): launches a token and a layer, all-reduces, bytes read a step against the minimum (every
weight once, the embedding's one row, the live cache: here the whole cache), and for every kernel the registers
and spills `nvcc -arch=sm_90 -Xptxas -v` reports, the blocks an SM holds at those registers, and for each
projection the weight bytes a thread keeps in flight and so an SM (against the ~29 KB an H200 SM needs to reach
4.8 TB/s at ~800 ns latency), at its occupancy and at the blocks its grid gives each of 132 SMs. Every figure is the
build report's (`logos-compile --target cuda` measures ptxas's where nvcc is on PATH). No GPU is needed.

    python3 bench/cuda_report.py            # a markdown table on stdout, the figures as JSON with --json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any

BUILDS = [
    ("smollm2-135m", "decode ctx=1024", 1),
    ("llama-3.1-8b", "decode ctx=1024", 1),
    ("llama-3.1-8b", "decode ctx=8192", 1),
    ("llama-3.1-70b", "decode ctx=8192", 8),
]


def report(model: str, cut: str, tp: int) -> dict[str, Any]:
    """One build's figures, as `logos-compile --target cuda` reports them (ptxas's among them where nvcc is here)."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.program import Cut
    from logos_ir.progress import Progress
    from logos_ir.spec import ModelSpec

    started = time.perf_counter()
    spec = ModelSpec.preset(model)
    request = BuildRequest(ModelSource("preset", model, spec), Cut.parse(cut), tp, "bf16", False, Progress.silent())
    plan_report = build_cuda(request).report
    ptxas = plan_report["ptxas"]
    return {
        "model": model, "cut": cut, "chips": tp, "launches": plan_report["launches"],
        "launches_per_layer": plan_report["launches_per_layer"], "all_reduces": plan_report["all_reduces"],
        "all_gathers": plan_report.get("all_gathers", 0),
        "bytes_read": plan_report["bytes_read"], "bytes_minimum": plan_report["bytes_minimum"],
        "read_over_minimum": round(plan_report["bytes_read"] / plan_report["bytes_minimum"], 4),
        "nvcc": ptxas if isinstance(ptxas, str) else ptxas["nvcc"],
        "kernels": {} if isinstance(ptxas, str) else ptxas["kernels"],
        "latency_model": plan_report.get("latency_model"),
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def markdown(reports: list[dict[str, Any]]) -> str:
    lines = [
        "| model | launches a token (a layer) | all-reduces (all-gathers) | MB read a step (a chip) | minimum MB"
        " | read / minimum |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r['model']} {r['cut']} x{r['chips']} | {r['launches']} ({r['launches_per_layer']})"
            f" | {r['all_reduces']} ({r['all_gathers']})"
            f" | {r['bytes_read'] / 1e6:.1f} | {r['bytes_minimum'] / 1e6:.1f} | {r['read_over_minimum']:.4f} |"
        )
    lines += [
        "",
        f"ptxas: {reports[0]['nvcc'] if reports else ''}",
        "",
        "| model | kernel | registers | spills (st/ld bytes) | blocks/SM | in flight: a thread / an SM at occupancy"
        " (of 29 KB) | grid blocks: an SM at the grid |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        for name, k in r["kernels"].items():
            flight = (
                f"{k['bytes_in_flight_per_thread']} / {k['bytes_in_flight_per_sm'] / 1024:.0f} KB ({k['of_needed']}x)"
                f" | {k['grid_blocks']}: {k['bytes_in_flight_per_sm_at_grid'] / 1024:.0f} KB"
                if "bytes_in_flight_per_sm" in k
                else " |"
            )
            spill = f"{k.get('spill_stores', '?')}/{k.get('spill_loads', '?')}"
            lines.append(
                f"| {r['model']} | `{name}` | {k.get('registers', '?')} | {spill} | {k.get('blocks_per_sm', '?')}"
                f" | {flight} |"
            )
    lines += [
        "",
        "Latency model (passes/cuda/cost_model.py; bands from each constant's range; occupancy from ptxas where"
        " measured):",
        "",
        "| model | live length | estimated step (ms) | minimum MB | est. fraction of HBM | the same, plain launches"
        " | attention in flight an SM |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        model = r.get("latency_model") or {"steps": {}}
        for live, step in model["steps"].items():
            flight, plain = step["attention_bytes_in_flight_per_sm"], step["hbm_fraction_without_programmatic_launch"]
            lines.append(
                f"| {r['model']} {r['cut']} x{r['chips']} | {live} | {step['ms'][0]:.2f}-{step['ms'][1]:.2f}"
                f" | {step['minimum_mb']:.1f} | {step['hbm_fraction'][0]:.0%}-{step['hbm_fraction'][1]:.0%}"
                f" | {plain[0]:.0%}-{plain[1]:.0%} | {flight / 1024:.1f} KB |"
            )
    lines += ["", "| model | kernel | launches | in flight an SM (full cache) | estimated us (all launches) |"]
    lines += ["|---|---|---|---|---|"]
    for r in reports:
        for name, k in ((r.get("latency_model") or {}).get("kernels") or {}).items():
            lines.append(
                f"| {r['model']} {r['cut']} | `{name[:48]}` | {k['launches']}"
                f" | {k['bytes_in_flight_per_sm'] / 1024:.1f} KB | {k['us'][0]:.1f}-{k['us'][1]:.1f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args(argv)
    if shutil.which("nvcc") is None:
        print("cuda_report: nvcc not found: registers not measured", file=sys.stderr)
    reports = [report(*build) for build in BUILDS]
    print(json.dumps(reports, indent=2) if args.json else markdown(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
