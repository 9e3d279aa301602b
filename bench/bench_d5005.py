"""The D5005 lane's figures: the cost model's estimates (a model, not a measurement) and what the engine does here.

    python bench/bench_d5005.py [--steps 128] [--skip-engine] [--write-golden]

Prints, for each model: the build of code's time (lowering and emitters, no weight read), the instruction count,
bytes the engine reads from board memory per token and the cost model's tokens/s (read from the engine's loops)
against the roofline of those bytes at the card's 76.8 GB/s, at the last position of the cache; Llama 3.1 70B's
refusal with the sizes; then, on PoCL's CPU device, the embedded SmolLM2's decode speed through the engine (an
emulation's speed, nothing to do with the card's) and its bf16 teacher-forced next-token agreement with the
reference over `--steps` steps.

`--write-golden` runs the reference interpreter's decode step over 128 positions of the embedded model, fed its
prompt then its own greedy continuation, and writes the tokens it was fed and predicted to
`test/unit/golden/smollm2_reference_128.json` (with the decode program's identity line), which the engine's
embedded-model test compares with (the reference takes minutes for 128 steps; the engine's run is the test).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from logos_ir.build import BuildRequest
from logos_ir.errors import LogosError
from logos_ir.models import ModelSource
from logos_ir.passes.d5005.build import build_d5005
from logos_ir.program import Cut
from logos_ir.progress import Progress

MODELS = [("smollm2-135m", 2048), ("llama-3.2-1b", 8192), ("llama-3.1-8b", 2048), ("llama-3.1-8b", 8192)]
PROMPT = [1, 4093, 314, 260, 3575, 282, 4649, 47]  # a short English prompt, ids from 0
GOLDEN = Path(__file__).resolve().parent.parent / "test" / "unit" / "golden" / "smollm2_reference_128.json"
GOLDEN_STEPS = 128


def cost_table() -> None:
    print("model            ctx   build s  instr  GB read/token  band tok/s (low, high)  roofline  low of roofline")
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
        low, high = cost["band_tokens_per_s"]
        print(
            f"{name:<15} {ctx:>5} {time.perf_counter() - started:>8.2f} {lane.report['instructions']:>6}"
            f" {cost['low']['bytes_read_per_token'] / 1e9:>14.3f} {low:>10.3f} {high:>10.3f}"
            f" {cost['roofline_tokens_per_s']:>10.3f} {low / cost['roofline_tokens_per_s'] * 100:>15.1f}%"
        )
        if (name, ctx) == ("llama-3.1-8b", 8192):
            for end in ("low", "high"):
                print(f"    ms by opcode ({end}): {cost[end]['ms_by_opcode']}")
            print(f"    arbitrated: {cost['arbitrated']}, banks: {cost['banks']}")


def reference_run(steps: int) -> dict[str, object]:
    """The reference's decode step over `steps` positions, fed the prompt then its own greedy continuation."""
    import numpy as np

    from logos_ir.author import written
    from logos_ir.generate import Generator
    from logos_ir.weights import open_model

    store = open_model(None)
    ctx = -(-steps // 64) * 64
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    fed, predicted = list(PROMPT), []
    for position in range(1, steps + 1):
        run = {names["token"]: np.array([fed[position - 1] + 1]), names["position"]: np.array([position])}
        predicted.append(int(reference.run(**run)[0]) - 1)
        if position == len(fed):
            fed.append(predicted[-1])
    _, identity = written(store.spec, Cut.decode(ctx))
    return {
        "about": "the reference interpreter's decode step on the embedded SmolLM2-135M (f32), fed the prompt then"
        " its own greedy continuation; predicted[p-1] is its next token at position p (ids from 0)",
        "made_by": "python bench/bench_d5005.py --write-golden",
        "identity": identity.line(),
        "ctx": ctx,
        "prompt": PROMPT,
        "fed": fed[:steps],
        "predicted": predicted,
    }


def engine_figures(steps: int) -> None:
    from logos_ir.runtime.d5005 import D5005Generator
    from logos_ir.weights import open_model

    store = open_model(None)
    for weights in ("f32", "bf16"):
        engine = D5005Generator(store, weights=weights)
        engine.generate(PROMPT, 32)
        print(f"engine on PoCL, {weights}: {engine.stats.decode_tokens_per_s:.1f} decode steps/s (CPU emulation)")
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() and steps <= GOLDEN_STEPS else reference_run(steps)
    ctx = -(-steps // 64) * 64
    engine = D5005Generator(store, weights="bf16").engine(ctx)
    engine.reset()
    fed, predicted = golden["fed"], golden["predicted"]
    same = sum(engine.step(fed[p] + 1, p + 1) - 1 == predicted[p] for p in range(steps))  # type: ignore[index]
    print(f"bf16 teacher-forced next-token agreement over {steps} steps: {same}/{steps} = {same / steps:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=GOLDEN_STEPS, help="teacher-forced steps of the embedded model")
    parser.add_argument("--skip-engine", action="store_true", help="only the cost model")
    parser.add_argument("--write-golden", action="store_true", help=f"write {GOLDEN.name} (the reference's run)")
    args = parser.parse_args()
    if args.write_golden:
        started = time.perf_counter()
        GOLDEN.write_text(json.dumps(reference_run(GOLDEN_STEPS), indent=1) + "\n")
        print(f"wrote {GOLDEN} in {time.perf_counter() - started:.0f} s")
        return
    cost_table()
    if not args.skip_engine:
        engine_figures(args.steps)


if __name__ == "__main__":
    main()
