"""What runs a lane's output: one module a lane (`cuda.py`, `d5005.py`, `spatial.py`), each giving `logos-run` a
generator through the registry's `backends`. This module holds what they share: the request `logos-run` makes,
and the reference backend, which runs the LOGOS programs themselves on the numpy interpreter.

A generator is any object with `generate(prompt_ids, max_new_tokens, eos_id=None, on_token=None) -> list[int]`
(ids from 0, greedy), `stats` (a `logos_ir.generate.GenerationStats`) and `identities` (the identities of the
programs it ran), as `logos_ir.generate.Generator` has; the lanes' runtimes keep that shape so `logos-run` and the
tests drive every backend alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from logos_ir.errors import LogosError

if TYPE_CHECKING:
    from logos_ir.generate import Generator
    from logos_ir.weights import WeightStore


@dataclass(frozen=True)
class RunRequest:
    """What `logos-run` asks a backend for: the weights, a cache of `ctx` positions (None: sized per call), the
    prompt fed `prefill_rows` tokens at a time, split over `tp` chips when tp > 1, the weight image `weights`
    (f32, bf16, f16), and `emulate` (run the lowered kernels on the CPU, for a backend that has such a mode)."""

    store: WeightStore
    ctx: int | None = None
    prefill_rows: int = 16
    tp: int = 1
    weights: str = "f32"
    emulate: bool = False


def reference_generator(request: RunRequest) -> Generator:
    """The reference backend: the numpy interpreter, in float32."""
    from logos_ir.generate import Generator

    if request.emulate:
        raise LogosError("the reference backend has no --emulate mode: it runs on the CPU already")
    return Generator(request.store, ctx=request.ctx, prefill_rows=request.prefill_rows, tp=request.tp)
