"""How closely the emulated CUDA lane follows the reference: teacher-forced next-token agreement and the cosine of
the two sides' logits, step by step (`teacher_forced`, which `bench/gpu_decode.py --cpu-agreement` runs per
prompt): both are fed the reference's own greedy tokens, so one miss does not change every later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logos_ir.generate import Generator, default_ctx, run_program
from logos_ir.program import Cut
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda.generator import cuda_generator


@dataclass
class Agreement:
    """Teacher-forced next-token agreement of the lane with the reference, and the cosine of their logits, per
    step (the prompt's last position, then each step fed the reference's own next token)."""

    matches: list[bool]
    cosines: list[float]
    margins: list[float] = field(default_factory=list)  # the reference's top-1 minus top-2 logit, per step

    @property
    def agreement(self) -> float:
        return sum(self.matches) / len(self.matches)

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)


def _reference_logits(generator: Any, program: Any) -> np.ndarray:
    """The reference's logits of its last run, from its final hidden state and the head's math (the interpreter's
    RMS norm and projection, in f32)."""
    spec, store = generator.spec, generator.weights
    x = program.last_values[f"x{spec.layers}"][-1:].astype(np.float32)
    weight = store.get("model.norm.weight")
    mean_square = np.einsum("ij,ij->i", x, x) * np.float32(1.0 / spec.hidden)
    normed = (x * (1 / np.sqrt(mean_square + np.float32(spec.rms_eps)))[:, None]) * weight
    table = store.get("model.embed_tokens.weight" if spec.tie_embeddings else "lm_head.weight")
    return (normed @ table.T)[0]


def teacher_forced(store: Any, prompt: Sequence[int], steps: int, weights: str, prefill_rows: int = 16) -> Agreement:
    """Run the prompt then `steps` decode steps through the reference and the emulated lane side by side, both fed
    the reference's greedy tokens; compare each step's next token and logits."""
    ctx = default_ctx(len(prompt), steps + 1)
    reference = Generator(store, ctx=ctx, prefill_rows=prefill_rows)
    lane = cuda_generator(RunRequest(store, ctx, prefill_rows, 1, weights, emulate=True))
    matches: list[bool] = []
    cosines: list[float] = []
    margins: list[float] = []

    def compare(cut: Any, tokens: list[int], positions: list[int]) -> int:
        ours, theirs = lane.program(cut), reference.program(cut)
        got = int(run_program(ours, tokens, positions)[0])
        want = int(run_program(theirs, tokens, positions)[0])
        logits, expected = ours.logits, _reference_logits(reference, theirs)
        matches.append(got == want)
        top = np.sort(expected)[-2:]
        margins.append(float(top[1] - top[0]))
        cosines.append(float(logits @ expected / (np.linalg.norm(logits) * np.linalg.norm(expected))))
        return want

    for start in range(0, len(prompt), prefill_rows):
        chunk = [t + 1 for t in prompt[start : start + prefill_rows]]
        positions = list(range(start + 1, start + len(chunk) + 1))
        token = compare(Cut.prefill(len(chunk), ctx), chunk, positions)
        if start + prefill_rows < len(prompt):
            matches.pop(), cosines.pop(), margins.pop()  # only the prompt's last position predicts a new token
    for position in range(len(prompt) + 1, len(prompt) + 1 + steps):
        token = compare(Cut.decode(ctx), [token], [position])
    return Agreement(matches, cosines, margins)
