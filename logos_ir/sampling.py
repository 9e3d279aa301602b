"""Choosing the next token from a backend's logits: one sampler for every backend, as llama.cpp's default chain.

A backend runs the head and gives two things after each program run or machine step: the token its own arg-max
chose, and the float32 logits `[vocab]` that arg-max read (its `logits` attribute; see `logos_ir.runtime`). The
`Sampler` turns them into the next token:

* temperature 0 (the default) with no repetition penalty: **greedy**, the backend's own arg-max token, untouched
  (the logits are not even read, so a backend that cannot give them still runs greedily);
* otherwise the chain llama.cpp runs by default, in its order: the repetition penalty over the last
  `repeat_last_n` tokens (prompt included; a logit above 0 divided by the penalty, one below multiplied, once per
  distinct token), then top-k, top-p (the smallest set of most likely tokens whose probabilities reach p),
  min-p (tokens at least `min_p` times as likely as the likeliest), the temperature, and a draw from what is
  left with a seeded `numpy.random.Generator` (PCG64). With temperature 0 and a penalty, the arg-max of the
  penalised logits.

The same seed and the same logits give the same tokens on every backend: the draw depends on nothing else. Token
ids here count from 0, as the tokenizer's do.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from logos_ir.errors import LogosError

__all__ = ["SamplingSettings", "Sampler", "new_seed"]

SEED_LIMIT = 2**63  # numpy's SeedSequence takes any whole number from 0; the tools keep seeds below this


def new_seed() -> int:
    """A fresh seed (when the user gives none), from the operating system's entropy, reported so a run can be
    repeated."""
    return secrets.randbelow(2**32)


@dataclass(frozen=True)
class SamplingSettings:
    """What `logos-run` takes, with llama.cpp's defaults but for the temperature, which is 0 (greedy) here:
    `top_k` 0 and `top_p` 1 and `min_p` 0 switch their step off, `repeat_penalty` 1 switches the penalty off."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature, math.isfinite(self.temperature) and self.temperature >= 0, "from 0"),
            ("top-k", self.top_k, self.top_k >= 0, "a whole number from 0 (0: off)"),
            ("top-p", self.top_p, 0 < self.top_p <= 1, "above 0 and at most 1 (1: off)"),
            ("min-p", self.min_p, 0 <= self.min_p <= 1, "from 0 to 1 (0: off)"),
            ("repeat-penalty", self.repeat_penalty, math.isfinite(self.repeat_penalty) and self.repeat_penalty > 0,
             "above 0 (1: off)"),
            ("repeat-last-n", self.repeat_last_n, self.repeat_last_n >= 0, "a whole number from 0"),
            ("seed", self.seed, 0 <= self.seed < SEED_LIMIT, f"from 0 to {SEED_LIMIT - 1}"),
        ]  # fmt: skip
        for name, value, ok, want in checks:
            if not ok:
                raise LogosError(f"--{name} {value}: must be {want}")

    @property
    def greedy(self) -> bool:
        """The backend's own arg-max token is the answer: no logits needed."""
        return self.temperature == 0 and (self.repeat_penalty == 1 or self.repeat_last_n == 0)

    def describe(self) -> dict[str, float | int]:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
            "repeat_last_n": self.repeat_last_n,
            "seed": self.seed,
        }


class Sampler:
    """The next token from a backend's arg-max token and logits, with the history the penalty reads. `reset`
    starts a new sequence (the random stream continues: a chat's turns are one stream); `accept` records a token
    (the prompt's and each chosen one)."""

    def __init__(self, settings: SamplingSettings | None = None, backend: str = "this backend"):
        self.settings = settings or SamplingSettings()
        self.backend = backend
        self.rng = np.random.Generator(np.random.PCG64(self.settings.seed))
        self.history: deque[int] = deque(maxlen=max(self.settings.repeat_last_n, 1))

    @property
    def greedy(self) -> bool:
        return self.settings.greedy

    def reset(self) -> None:
        self.history.clear()

    def accept(self, tokens: Iterable[int]) -> None:
        """Record tokens (ids from 0) for the repetition penalty."""
        if self.settings.repeat_last_n > 0:
            self.history.extend(int(t) for t in tokens)

    def choose(self, argmax: int, logits: np.ndarray | None) -> int:
        """The next token (from 0): `argmax`, the backend's own choice (from 0), when greedy; else drawn from
        `logits`, which the backend must give."""
        if self.greedy:
            return argmax
        if logits is None:
            raise LogosError(
                f"the {self.backend} backend gives no logits, so it cannot sample",
                hint="run it greedily (--temperature 0, --repeat-penalty 1)",
            )
        return self.pick(np.asarray(logits, dtype=np.float32).reshape(-1))

    def pick(self, logits: np.ndarray) -> int:
        """Run the chain on one row of logits `[vocab]`; the chosen id, from 0."""
        s = self.settings
        x = logits.astype(np.float64, copy=True)
        if s.repeat_penalty != 1 and self.history:
            seen = np.fromiter(set(self.history), dtype=np.int64)
            seen = seen[(seen >= 0) & (seen < x.size)]
            x[seen] = np.where(x[seen] > 0, x[seen] / s.repeat_penalty, x[seen] * s.repeat_penalty)
        if s.temperature == 0:
            return int(np.argmax(x))
        order = np.argsort(-x, kind="stable")  # most likely first; ties keep the lower id first
        if 0 < s.top_k < order.size:
            order = order[: s.top_k]
        kept = x[order]
        if s.top_p < 1:
            probs = _softmax(kept)
            reach = int(np.searchsorted(np.cumsum(probs), s.top_p, side="left")) + 1  # the smallest set reaching p
            reach = min(reach, probs.size)
            order, kept = order[:reach], kept[:reach]
        if s.min_p > 0:
            probs = _softmax(kept)
            keep = probs >= s.min_p * probs[0]
            keep[0] = True
            order, kept = order[keep], kept[keep]
        probs = _softmax(kept / s.temperature)
        return int(order[self.rng.choice(probs.size, p=probs)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
