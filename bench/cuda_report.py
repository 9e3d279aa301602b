"""The CUDA lane's decode steps as built, for SmolLM2-135M (ctx 1024), Llama-3.1-8B (ctx 1024) and Llama-3.1-70B
over 8 chips (ctx 8192): launches a token and a layer, all-reduces, bytes read a step against the minimum (every
weight once, the embedding's one row, the live cache: here the whole cache), and for every kernel the registers
and spills `nvcc -arch=sm_90 -Xptxas -v` reports, the blocks an SM holds at those registers, and for each
projection the weight bytes a thread keeps in flight and so an SM (against the ~29 KB an H200 SM needs to reach
4.8 TB/s at ~800 ns latency). No GPU is needed (nvcc compiles only).

    python3 bench/cuda_report.py            # a markdown table on stdout, the figures as JSON with --json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BUILDS = [
    ("smollm2-135m", "decode ctx=1024", 1),
    ("llama-3.1-8b", "decode ctx=1024", 1),
    ("llama-3.1-70b", "decode ctx=8192", 8),
]
_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas(source: str) -> dict[str, dict[str, int]]:
    """Registers and spill bytes of each kernel of a kernels.cu, from ptxas -v (the lane's nvcc flags)."""
    from logos_ir.runtime.cuda import NVCC_FLAGS

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return {}
    with tempfile.TemporaryDirectory() as folder:
        cu = Path(folder) / "kernels.cu"
        cu.write_text(source)
        done = subprocess.run(
            [nvcc, "-arch=sm_90", "-cubin", *NVCC_FLAGS, "-Xptxas", "-v", "-o", str(Path(folder) / "k.cubin"), str(cu)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    found: dict[str, dict[str, int]] = {}
    current = None
    for line in (done.stderr + done.stdout).splitlines():
        if m := _FUNCTION.search(line):
            current = m.group(1)
            found[current] = {"registers": 0, "spill_stores": 0, "spill_loads": 0}
        elif current and (m := _SPILL.search(line)):
            found[current]["spill_stores"], found[current]["spill_loads"] = int(m.group(1)), int(m.group(2))
        elif current and (m := _REGISTERS.search(line)):
            found[current]["registers"] = int(m.group(1))
    return found


def report(model: str, cut: str, tp: int) -> dict[str, Any]:
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.passes.cuda.build import NEEDED_IN_FLIGHT, build_cuda, occupancy
    from logos_ir.program import Cut
    from logos_ir.progress import Progress
    from logos_ir.spec import ModelSpec

    started = time.perf_counter()
    spec = ModelSpec.preset(model)
    request = BuildRequest(ModelSource("preset", model, spec), Cut.parse(cut), tp, "bf16", False, Progress.silent())
    built = build_cuda(request)
    plan_report = built.report
    source = next(a for a in built.artifacts if a.path == "kernels.cu").data.decode()
    registers = ptxas(source)
    kernels = {}
    for name in plan_report["kernel_names"]:
        entry: dict[str, Any] = dict(registers.get(name, {}))
        if entry:
            entry["blocks_per_sm"] = occupancy(entry["registers"])
        in_flight = plan_report["loads_in_flight"].get(name)
        if in_flight and entry:
            entry["bytes_in_flight_per_thread"] = in_flight
            entry["bytes_in_flight_per_sm"] = in_flight * 128 * entry["blocks_per_sm"]
            entry["of_needed"] = round(entry["bytes_in_flight_per_sm"] / NEEDED_IN_FLIGHT, 2)
        kernels[name] = entry
    return {
        "model": model, "cut": cut, "chips": tp, "launches": plan_report["launches"],
        "launches_per_layer": plan_report["launches_per_layer"], "all_reduces": plan_report["all_reduces"],
        "bytes_read": plan_report["bytes_read"], "bytes_minimum": plan_report["bytes_minimum"],
        "read_over_minimum": round(plan_report["bytes_read"] / plan_report["bytes_minimum"], 4),
        "kernels": kernels, "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def markdown(reports: list[dict[str, Any]]) -> str:
    lines = [
        "| model | launches a token (a layer) | all-reduces | MB read a step (a chip) | minimum MB | read / minimum |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r['model']} {r['cut']} x{r['chips']} | {r['launches']} ({r['launches_per_layer']})"
            f" | {r['all_reduces']}"
            f" | {r['bytes_read'] / 1e6:.1f} | {r['bytes_minimum'] / 1e6:.1f} | {r['read_over_minimum']:.4f} |"
        )
    lines += [
        "",
        "| model | kernel | registers | spills (st/ld bytes) | blocks/SM | in flight: a thread / an SM (of 29 KB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        for name, k in r["kernels"].items():
            flight = (
                f"{k['bytes_in_flight_per_thread']} / {k['bytes_in_flight_per_sm'] / 1024:.0f} KB ({k['of_needed']}x)"
                if "bytes_in_flight_per_sm" in k
                else ""
            )
            spill = f"{k.get('spill_stores', '?')}/{k.get('spill_loads', '?')}"
            lines.append(
                f"| {r['model']} | `{name}` | {k.get('registers', '?')} | {spill} | {k.get('blocks_per_sm', '?')}"
                f" | {flight} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args(argv)
    if shutil.which("nvcc") is None:
        print("cuda_report: nvcc is not installed: registers and spills are not reported", file=sys.stderr)
    reports = [report(*build) for build in BUILDS]
    print(json.dumps(reports, indent=2) if args.json else markdown(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
