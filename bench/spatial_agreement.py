"""The spatial lane's figures, from the fabric simulator running the csl-level module (a script, not a test: the
embedded model's grid is about 100 x 100 elements, slow to simulate here).

    python3 bench/spatial_agreement.py tokens [--new 16] [--image f32]    # greedy tokens against the reference
    python3 bench/spatial_agreement.py agreement [--steps 64]             # f16 teacher-forced next-token agreement
    python3 bench/spatial_agreement.py placement                          # SmolLM2 and llama-3.1-8b on a WSE-2

`placement` gives each build's grid, memory per element, the share of elements working on each layer, and cycles
per token: simulated in full where the grid is small enough, else extrapolated from layers simulated in full on
smaller grids whose elements hold exactly the tiles the large grid's hold (same chunks of every vector, same heads,
same positions per element: only P differs). A layer's cycles are then a + b x with x = P + the segment
length + the segments (`line_steps`: its local work does not depend on P; its reductions take the line's steps),
fitted on up to five such grids of at most 64 x 64 (the fit's largest error reported; with two grids it is 0 by
construction), and evaluated at the large P. Figures go to
docs/benchmarks.md (the spatial lane's section), with the date and machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from typing import Any

import numpy as np

from logos_ir.generate import Generator
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.convert_logos_to_csl import element_bytes, lower_decode
from logos_ir.program import Cut
from logos_ir.runtime.spatial import GridMachine
from logos_ir.spec import ModelSpec
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import RandomWeights, WeightStore, open_model

PROMPT = "The capital of France is"
CLOCK_HZ = 1.1e9  # docs/spatial.md, "Cycles"
WAFERLLM_TOKENS_PER_S = 2700  # WaferLLM (OSDI 2025), Llama-3-8B decode on a WSE-2, as issue 17 cites it


def prompt_ids(store: WeightStore) -> list[int]:
    return Tokenizer.from_store(store).encode(PROMPT)  # type: ignore[attr-defined]


def tokens(image: str, new: int) -> dict[str, Any]:
    store = open_model(None)
    prompt = prompt_ids(store)
    expected = Generator(store).generate(prompt, new)
    started = time.perf_counter()
    ctx = len(prompt) + new
    lowered = lower_decode(store.spec, ctx, image)
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    sequence, out = list(prompt), []
    for position in range(1, len(prompt) + new):
        token = sequence[position - 1] if position <= len(prompt) else out[-1]
        predicted = machine.step(token + 1, position) - 1
        if position >= len(prompt):
            out.append(predicted)
    return {
        "image": image,
        "prompt_tokens": len(prompt),
        "new": new,
        "equal": out == expected,
        "tokens": out,
        "reference": expected,
        "grid": lowered.plan.p,
        "cycles_per_step": machine.cycles,
        "seconds": round(time.perf_counter() - started, 1),
    }


def agreement(steps: int) -> dict[str, Any]:
    store = open_model(None)
    prompt = prompt_ids(store)
    continuation = Generator(store).generate(prompt, steps)
    sequence = prompt + continuation
    ctx = len(sequence)
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    lowered = lower_decode(store.spec, ctx, "f16")
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    agree = positions = 0
    started = time.perf_counter()
    for position, token in enumerate(sequence[:-1], start=1):
        run = {names["token"]: np.array([token + 1]), names["position"]: np.array([position])}
        expected = int(reference.run(**run)[0])
        got = machine.step(token + 1, position)
        if position >= len(prompt):
            agree += got == expected
            positions += 1
    return {"agree": agree, "positions": positions, "share": agree / positions, "grid": lowered.plan.p,
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def scaled(spec: ModelSpec, plan: g.GridPlan, p: int) -> ModelSpec | None:
    """A model whose P x P grid holds exactly the tiles `plan`'s elements hold (None if no such model at p)."""
    hc, fc = plan.chunk(plan.hidden), plan.chunk(plan.features, even=True)
    head_dim = fc * p / spec.heads
    if head_dim != int(head_dim) or int(head_dim) % 2:
        return None
    return replace(
        spec,
        hidden=hc * p,
        head_dim=int(head_dim),
        intermediate=plan.chunk(plan.intermediate) * p,
        vocab=plan.chunk(plan.vocab) * p,
    )


def step_cycles(spec: ModelSpec, ctx: int, image: str, p: int, layers: int) -> float:
    model = replace(spec, layers=layers)
    lowered = lower_decode(model, ctx, image, p)
    machine = GridMachine(lowered.module, lowered.host, RandomWeights(model, seed=1))
    machine.reset()
    machine.step(5, ctx)  # the last position: a full cache
    return machine.cycles[-1]


def line_steps(p: int) -> int:
    """A line reduction's steps on a grid of P (grid.segments): P + its segment length + its segments."""
    length, count, _ = g.segments(p)
    return p + length + count


def extrapolated(spec: ModelSpec, plan: g.GridPlan, image: str) -> dict[str, Any]:
    """Cycles per token at plan.p from layers simulated in full on smaller grids of the same tiles: a layer's cycles
    fitted as a + b x, x = line_steps(P) (its local work does not depend on P; its reductions take the line's
    steps), the embedding's and head's likewise."""
    candidates = [p for p in range(4, 65) if scaled(spec, plan, p) is not None][:5]
    rows = []
    for p in candidates:
        model = scaled(spec, plan, p)
        assert model is not None
        ctx = plan.slots * p
        one, two = step_cycles(model, ctx, image, p, 1), step_cycles(model, ctx, image, p, 2)
        rows.append((p, two - one, one - (two - one)))  # (P, a layer, the embedding and head)
    xs = np.array([line_steps(r[0]) for r in rows], dtype=float)
    layer_fit = np.polyfit(xs, [r[1] for r in rows], 1)
    ends_fit = np.polyfit(xs, [r[2] for r in rows], 1)
    residual = float(np.max(np.abs(np.polyval(layer_fit, xs) - [r[1] for r in rows])))
    x = line_steps(plan.p)
    layer = float(np.polyval(layer_fit, x))
    ends = float(np.polyval(ends_fit, x))
    total = ends + spec.layers * layer
    return {
        "simulated_grids": [
            {"p": p, "line_steps": line_steps(p), "layer_cycles": c, "embedding_and_head_cycles": e} for p, c, e in rows
        ],  # fmt: skip
        "line_steps": x,
        "layer_fit": [float(v) for v in layer_fit],
        "fit_max_error_cycles": residual,
        "layer_cycles": round(layer),
        "cycles_per_token": round(total),
        "tokens_per_s": round(CLOCK_HZ / total, 1),
    }


def placement(name: str | None, ctx: int, image: str = "f16") -> dict[str, Any]:
    from logos_ir.models import ModelSource
    from logos_ir.passes.spatial.build import working_share

    spec = ModelSource.resolve(name).spec
    lowered = lower_decode(spec, ctx, image)
    plan = lowered.plan
    shares = {n: round(working_share(w, plan.p), 4) for n, w in plan.weights.items() if w.kind == "matrix"}
    report = {
        "model": name or "smollm2-135m (embedded)",
        "ctx": ctx,
        "image": image,
        "grid": f"{plan.p} x {plan.p}",
        "elements": plan.p * plan.p,
        "share_of_wse2": round(plan.p * plan.p / (757 * 996), 4),
        "working_share_per_layer": min(shares.values()),
        "memory_per_element": element_bytes(lowered),
    }
    report.update(extrapolated(spec, plan, image))
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["tokens", "agreement", "placement"])
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--image", default="f32")
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.what == "tokens":
        result: Any = tokens(args.image, args.new)
    elif args.what == "agreement":
        result = agreement(args.steps)
    else:
        result = [placement(None, 2048), placement("llama-3.1-8b", 2048)]  # SmolLM2 at 8192: as at 2048, P = 288
        result.append({"waferllm_tokens_per_s": WAFERLLM_TOKENS_PER_S})
    print(json.dumps({"machine": platform.processor() or platform.machine(), "result": result,
                      "seconds": round(time.perf_counter() - started, 1)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
