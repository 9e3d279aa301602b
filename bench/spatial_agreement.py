"""The spatial lane on the embedded SmolLM2-135M: f16 teacher-forced next-token agreement with the reference over 64
steps, f32 greedy tokens, simulator speed and the cycle model's figures (a script, not a test: it runs the embedded
model more than the suite's one embedded-model run allows).

Teacher forcing: the reference generates its greedy continuation of each prompt; both the reference's decode step and
the simulated grid are then fed those same tokens one position at a time, and at each position the grid's next token
is compared with the reference's. Figures go to docs/benchmarks.md (the spatial lane's section).

    python3 bench/spatial_agreement.py [--steps 64] [--ctx 128]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from logos_ir.generate import Generator
from logos_ir.program import Cut
from logos_ir.runtime.spatial import SpatialGenerator
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import WeightStore, open_model

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]


def teacher_forced(store: WeightStore, image: str, tokens: list[int], ctx: int) -> tuple[int, int, dict]:
    """(agreeing positions, positions, the grid's counters) over `tokens` (ids from 0)."""
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    machine = SpatialGenerator(store, image=image).machine(ctx)
    machine.reset()
    agree = 0
    for position, token in enumerate(tokens[:-1], start=1):
        expected = int(
            reference.run(**{names["token"]: np.array([token + 1]), names["position"]: np.array([position])})[0]
        )
        agree += machine.step(token + 1, position) == expected
    counters = machine.counters
    per_token = {
        "cycles": counters.cycles / counters.tokens,
        "words_between_regions": counters.words_between / counters.tokens,
        "word_hops_inside_regions": counters.word_hops_inside / counters.tokens,
    }
    return agree, len(tokens) - 1, per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64, help="teacher-forced steps per prompt")
    parser.add_argument("--ctx", type=int, default=128)
    args = parser.parse_args()
    store = open_model(None)
    spec = store.spec
    results: dict = {"machine": platform.processor() or platform.machine(), "steps": args.steps, "prompts": {}}
    total_agree = total = 0
    tokenizer = Tokenizer.from_store(store)
    assert tokenizer is not None
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        continuation = Generator(store, ctx=args.ctx).generate(prompt, args.steps)
        tokens = prompt + continuation
        started = time.perf_counter()
        agree, count, per_token = teacher_forced(store, "f16", tokens, args.ctx)
        seconds = time.perf_counter() - started
        total_agree, total = total_agree + agree, total + count
        f32 = SpatialGenerator(store, ctx=args.ctx, image="f32")
        same = f32.generate(prompt, 16) == continuation[:16]
        results["prompts"][text] = {
            "f16_agreement": f"{agree}/{count}",
            "f32_greedy_16_same": same,
            "f16_seconds": round(seconds, 2),
            "f16_per_token": {k: round(v, 1) for k, v in per_token.items()},
        }
    results["f16_agreement"] = round(total_agree / total, 4)
    minimum = spec.hidden * (spec.layers + 1) + spec.layers + 2
    results["words_between_regions_minimum"] = minimum
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
