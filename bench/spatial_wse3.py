"""The embedded model (SmolLM2) built for a WSE-3 and for a WSE-2, a few greedy decode steps of each on the fabric
simulator (a script, not a test: 144 x 144 elements, some seconds a simulated step here).

    python3 bench/spatial_wse3.py [--new 3] [--image f16]

Prints, as JSON: each build's grid and memory band, the tokens each gives against the reference interpreter's, and
each step's simulated cycles. On a WSE-3 a line is one segment (its queues bind one colour each: docs/spatial.md,
"Queues"), so its reductions are chains of a whole line where the WSE-2's take WaferLLM's two phases.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from logos_ir.author import written
from logos_ir.generate import Generator
from logos_ir.parser import parse_program
from logos_ir.passes.extract_parts import ExtractParts
from logos_ir.passes.spatial.convert_logos_to_csl import lower_module, memory_use
from logos_ir.passes.spatial.fuse_products import CslFuseProducts
from logos_ir.passes.spatial.verify_grid import layout_params, static_check
from logos_ir.passes.verify_identity import VerifyIdentity
from logos_ir.program import Cut
from logos_ir.runtime.spatial.host import GridMachine
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import open_model

PROMPT = "The capital of France is"


def lowered_for(spec: Any, ctx: int, image: str, arch: str) -> Any:
    authored, _ = written(spec, Cut.decode(ctx))
    module = ModuleOp([parse_program(authored.text, f"<decode ctx={ctx}>")])
    for stage in (VerifyIdentity(), ExtractParts(), CslFuseProducts()):
        stage.apply(Context(), module)
    lowered = lower_module(module, image, arch=arch)
    static_check(lowered.module, params=layout_params(lowered.host))
    return lowered


def run(arch: str, image: str, new: int) -> dict[str, Any]:
    store = open_model(None)
    prompt = Tokenizer.from_store(store).encode(PROMPT)  # type: ignore[attr-defined]
    expected = Generator(store).generate(prompt, new)
    ctx = len(prompt) + new
    started = time.perf_counter()
    lowered = lowered_for(store.spec, ctx, image, arch)
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    sequence, out, seconds = list(prompt), [], []
    for position in range(1, len(prompt) + new):
        token = sequence[position - 1] if position <= len(prompt) else out[-1]
        before = time.perf_counter()
        predicted = machine.step(token + 1, position) - 1
        seconds.append(round(time.perf_counter() - before, 2))
        if position >= len(prompt):
            out.append(predicted)
        print(f"{arch} step {position}: {predicted}, {seconds[-1]} s, {machine.cycles[-1]:.0f} cycles", file=sys.stderr)
    return {
        "arch": arch,
        "image": image,
        "grid": list(lowered.plan.grid),
        "line_segments": {"row": lowered.plan.line("row")[1], "col": lowered.plan.line("col")[1]},
        "memory_band": memory_use(lowered)["band"],
        "queue_bindings": len(machine.fabric.queue_binding),
        "tokens": out,
        "reference": expected,
        "equal": out == expected,
        "cycles_per_step": [round(c) for c in machine.cycles],
        "seconds_per_step": seconds,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new", type=int, default=3)
    parser.add_argument("--image", default="f16")
    parser.add_argument("--arch", nargs="+", default=["wse3", "wse2"])
    args = parser.parse_args()
    results = [run(arch, args.image, args.new) for arch in args.arch]
    print(json.dumps({"machine": platform.processor() or platform.machine(), "runs": results}, indent=1))


if __name__ == "__main__":
    main()
