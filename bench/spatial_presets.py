"""The published presets' decode steps at ctx 8192, f16, on the wafer: for each, the lane's own grid search
(`lower_module`, as `logos-compile --target spatial --option arch=...` runs it) on a WSE-2, and on a WSE-3 where a
WSE-2 does not hold it; the grid it takes, whether it needed the compact layout, each element's bytes as the
build's memory band reports them, and the seconds the search and the grid's static check took (a script, not a
test: each search lowers the step some ten to twenty times).

    python3 bench/spatial_presets.py [--only gemma-2-9b] [--arch wse3]

Prints one JSON line a preset and machine; `test/unit/test_spatial_presets.py` checks the grids it reports.
"""

from __future__ import annotations

import argparse
import json
import time

from logos_ir.errors import PassError
from logos_ir.passes.spatial.convert_logos_to_csl import memory_use
from logos_ir.passes.spatial.verify_grid import layout_params, static_check
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_decode

PRESETS = ("mistral-7b-v0.1", "qwen2.5-7b", "phi-3-mini-4k", "qwen3-8b", "gemma-2-9b", "gemma-3-12b")


def search(preset: str, arch: str, ctx: int) -> dict:
    started = time.perf_counter()
    try:
        lowered = lower_decode(ModelSpec.preset(preset), ctx, "f16", arch=arch)
    except PassError as error:
        return {"preset": preset, "arch": arch, "refused": error.message, "seconds": time.perf_counter() - started}
    searched = time.perf_counter() - started
    static_check(lowered.module, params=layout_params(lowered.host))
    use = memory_use(lowered)
    largest = sorted(((w * (2 if "f16" in e else 4), n) for n, (w, e) in lowered.host["arrays"].items()), reverse=True)
    return {
        "preset": preset,
        "arch": arch,
        "grid": lowered.host["grid"],
        "kv_copies": lowered.plan.kv_copies,
        "compact": lowered.plan.compact,
        "band": use["band"],
        "arrays": use["arrays"],
        "code": use["code"],
        "largest_arrays": largest[:8],
        "search_s": round(searched, 1),
        "with_static_check_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a preset (repeatable; default: every one)")
    parser.add_argument("--arch", choices=("wse2", "wse3"), help="only this machine")
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args()
    for preset in args.only or PRESETS:
        for arch in [args.arch] if args.arch else ["wse2", "wse3"]:
            result = search(preset, arch, args.ctx)
            print(json.dumps(result), flush=True)
            if "grid" in result and not args.arch:
                break  # a WSE-2 holds it: no WSE-3 needed


if __name__ == "__main__":
    main()
