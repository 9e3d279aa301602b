"""The D5005 lane's figures: the cost model's estimates (a model, not a measurement) and what the engine does here.

    python bench/bench_d5005.py [--steps 64] [--skip-engine]

Prints, for each model: the build of code's time (lowering and emitters, no weight read), the instruction count,
bytes of board memory per token and the cost model's tokens/s against the card's 76.8 GB/s roofline, at the last
position of the cache; Llama 3.1 70B's refusal with the sizes; then, on PoCL's CPU device, the embedded SmolLM2's
decode speed through the engine (an emulation's speed, nothing to do with the card's) and its bf16 teacher-forced
next-token agreement with the reference over `--steps` steps.
"""

from __future__ import annotations

import argparse
import time

from logos_ir.build import BuildRequest
from logos_ir.errors import LogosError
from logos_ir.models import ModelSource
from logos_ir.passes.d5005.build import build_d5005
from logos_ir.program import Cut
from logos_ir.progress import Progress

MODELS = [("smollm2-135m", 2048), ("llama-3.2-1b", 8192), ("llama-3.1-8b", 2048), ("llama-3.1-8b", 8192)]


def cost_table() -> None:
    print("model            ctx   build s  instr  GB/token  est tok/s  roofline  of bandwidth")
    for name, ctx in [*MODELS, ("llama-3.1-70b", 8192)]:
        source = ModelSource.resolve(name)
        request = BuildRequest(source, Cut.decode(ctx), 1, "bf16", False, Progress.silent())
        started = time.perf_counter()
        try:
            lane = build_d5005(request)
        except LogosError as error:
            print(f"{name:<15} {ctx:>5}  refused: {error.message}")
            continue
        cost = lane.report["cost_model"]
        print(
            f"{name:<15} {ctx:>5} {time.perf_counter() - started:>8.2f} {lane.report['instructions']:>6}"
            f" {cost['bytes_per_token'] / 1e9:>9.3f} {cost['tokens_per_s']:>10.3f}"
            f" {cost['roofline_tokens_per_s']:>9.3f}"
            f" {cost['fraction_of_bandwidth'] * 100:>11.1f}%"
        )


def engine_figures(steps: int) -> None:
    import numpy as np

    from logos_ir.generate import Generator
    from logos_ir.runtime.d5005 import D5005Generator
    from logos_ir.weights import open_model

    store = open_model(None)
    prompt = [1, 4093, 314, 260, 3575, 282, 4649, 47]
    for weights in ("f32", "bf16"):
        engine = D5005Generator(store, weights=weights)
        engine.generate(prompt, 32)
        print(f"engine on PoCL, {weights}: {engine.stats.decode_tokens_per_s:.1f} decode steps/s (CPU emulation)")
    ctx = -(-steps // 64) * 64
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    engine = D5005Generator(store, weights="bf16").engine(ctx)
    engine.reset()
    fed, same = list(prompt), 0
    for position in range(1, steps + 1):
        token = fed[position - 1]
        run = {names["token"]: np.array([token + 1]), names["position"]: np.array([position])}
        expected = int(reference.run(**run)[0])
        same += engine.step(token + 1, position) == expected
        if position == len(fed):
            fed.append(expected - 1)
    print(f"bf16 teacher-forced next-token agreement over {steps} steps: {same}/{steps} = {same / steps:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64, help="teacher-forced steps of the embedded model")
    parser.add_argument("--skip-engine", action="store_true", help="only the cost model")
    args = parser.parse_args()
    cost_table()
    if not args.skip_engine:
        engine_figures(args.steps)


if __name__ == "__main__":
    main()
