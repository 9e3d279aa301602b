"""Each family's agreement in its lanes' deployment precision: teacher-forced next-token agreement with transformers'
greedy tokens (f32), for every family of `test/unit/families/` a lane runs, on each lane in the precision it
deploys (the CUDA lane emulated in bf16, the D5005 engine on PoCL in bf16, the wafer's fabric simulator in f16).

Both prompts of each family's goldens are run: each lane is fed the prompt and then transformers' own tokens
(a `Sampler` that records the lane's arg-max and returns the golden token), so one miss does not change the later
steps. A random tiny model has near-ties (two logits closer than a rounding of its weights moves them), so each
miss is given with the reference's margin at that step (its top logit less the second, f32), from the reference
interpreter fed the same tokens: a miss at a margin under `--near` is a near-tie, and the agreement is given both
ways (all steps; the steps whose margin is at least `--near`).

    python3 bench/family_agreement.py [--lane cuda|d5005|spatial] [--family NAME] [--near 0.01]

It prints one JSON document (with the machine, the date and the seconds each lane took); docs/models.md keeps the
figures. A lane that refuses a family says so in the document (the wafer refuses the mixtures of experts,
`logos.experts`, by name).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from logos_ir.errors import LogosError
from logos_ir.registry import backends
from logos_ir.runtime import RunRequest
from logos_ir.sampling import Sampler
from logos_ir.weights import open_model

FAMILIES = Path(__file__).resolve().parent.parent / "test" / "unit" / "families"
LANES = {"cuda": ("bf16", True), "d5005": ("bf16", False), "spatial": ("f16", False)}


class Forced(Sampler):
    """Asks the backend for its logits, keeps its arg-max and each step's logits, and feeds the golden tokens (None:
    its own arg-max, greedy)."""

    def __init__(self, tokens: list[int] | None = None) -> None:
        super().__init__()
        self.tokens = tokens
        self.argmax: list[int] = []
        self.logits: list[np.ndarray] = []

    @property
    def greedy(self) -> bool:
        return False

    def choose(self, argmax: int, logits: np.ndarray | None) -> int:
        assert logits is not None
        self.logits.append(np.asarray(logits, np.float64).reshape(-1))
        self.argmax.append(argmax)
        return argmax if self.tokens is None else self.tokens[len(self.argmax) - 1]


def forced(family: str, backend: str, weights: str, emulate: bool, prompt: list[int], tokens: list[int]) -> Forced:
    # a cache of 32, or the next power of two past a longer run (phi3-longrope-two's long prompt: 128, past the
    # original context of 64, where its long factors apply as in transformers' run)
    ctx = max(32, 1 << (len(prompt) + len(tokens) - 1).bit_length())
    request = RunRequest(open_model(str(FAMILIES / family)), ctx=ctx, prefill_rows=4, weights=weights, emulate=emulate)
    sampler = Forced(tokens)
    backends()[backend].generator()(request).generate(prompt, len(tokens), sampler=sampler)
    return sampler


def margins(family: str, prompt: list[int], tokens: list[int]) -> list[float]:
    """The reference's (f32) top logit less its second, at each step, fed the same tokens."""
    reference = forced(family, "reference", "f32", False, prompt, tokens)
    if reference.argmax != tokens:  # the golden tokens are transformers'; the reference must give them in f32
        raise SystemExit(f"{family}: the reference's f32 tokens are not transformers' ({reference.argmax} != {tokens})")
    return [float(np.diff(np.sort(logits)[-2:])[0]) for logits in reference.logits]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lane", action="append", choices=sorted(LANES))
    parser.add_argument("--family", action="append")
    parser.add_argument("--near", type=float, default=0.01, help="a margin under this is a near-tie")
    args = parser.parse_args()
    goldens = json.loads((FAMILIES / "goldens.json").read_text())["families"]
    families = args.family or sorted(goldens)
    started = time.perf_counter()
    result: dict[str, Any] = {}
    for family in families:
        runs = [(run["prompt"], run["tokens"]) for run in goldens[family]["runs"]]
        gaps = [margins(family, prompt, tokens) for prompt, tokens in runs]
        for lane in args.lane or list(LANES):
            weights, emulate = LANES[lane]
            began = time.perf_counter()
            steps = misses = clear = clear_hits = 0
            missed = []
            try:
                for (prompt, tokens), gap in zip(runs, gaps, strict=True):
                    got = forced(family, lane, weights, emulate, prompt, tokens).argmax
                    for step, (ours, theirs, margin) in enumerate(zip(got, tokens, gap, strict=True)):
                        steps += 1
                        clear += margin >= args.near
                        clear_hits += margin >= args.near and ours == theirs
                        if ours != theirs:
                            misses += 1
                            missed.append({"prompt": prompt, "step": step, "lane": ours, "transformers": theirs,
                                           "reference_margin": round(margin, 5)})  # fmt: skip
            except LogosError as error:  # the lane refuses the family by name
                result.setdefault(family, {})[lane] = {"refused": error.message}
                print(f"{family} on {lane}: refused", file=sys.stderr, flush=True)
                continue
            row = {"weights": weights, "steps": steps, "agree": steps - misses, "share": round(1 - misses / steps, 4),
                   "steps_at_a_margin_of_at_least_near": clear,
                   "share_at_a_margin_of_at_least_near": round(clear_hits / clear, 4) if clear else None,
                   "misses": missed, "seconds": round(time.perf_counter() - began, 1)}  # fmt: skip
            result.setdefault(family, {})[lane] = row
            print(f"{family} on {lane} ({weights}): {steps - misses}/{steps}", file=sys.stderr, flush=True)
    print(json.dumps({"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
                      "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "near": args.near, "families": result,
                      "seconds": round(time.perf_counter() - started, 1)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
