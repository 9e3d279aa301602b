"""What runs a lane's output: one module a lane (`cuda.py`, `d5005.py`, `spatial.py`), each giving `logos-run` a
generator through the registry's `backends`. This module holds what they share: the request `logos-run` makes,
and the reference backend, which runs the LOGOS programs themselves on the numpy interpreter.

A generator is any object with `generate(prompt_ids, max_new_tokens, eos_id=None, on_token=None) -> list[int]`
(ids from 0, greedy), `stats` (a `logos_ir.generate.GenerationStats`) and `identities` (the identities of the
programs it ran), as `logos_ir.generate.Generator` has; the lanes' runtimes keep that shape so `logos-run` and the
tests drive every backend alike.

Two parts of the contract serve `logos-run`'s shared flow (sampling, and running a build folder):
- **Logits.** Sampling (`logos_ir.sampling`) is one module applied to the logits each backend returns. After each
  run of a program (`Compiled.program.run`) or step of a machine (`StepMachine.step`), its `logits` attribute holds
  the float32 logits (shape `[vocab]`) of the last row that the head's arg-max read, as the backend computed them
  (read back from the backend's own buffer, never recomputed); `None` where a backend cannot give them.
- **Build folders.** `RunRequest.build` names a build folder that `logos-compile` wrote (already checked against its
  manifest by `logos-run`). A backend given one runs the artifacts in that folder (the CUDA lane its step module,
  the D5005 engine its source and stream, the spatial grid its `csl` modules) instead of lowering anew.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from logos_ir.errors import LogosError

if TYPE_CHECKING:
    from logos_ir.generate import Generator
    from logos_ir.weights import WeightStore


@dataclass(frozen=True)
class RunRequest:
    """What `logos-run` asks a backend for: the weights, a cache of `ctx` positions (None: sized per call), the
    prompt fed `prefill_rows` tokens at a time, split over `tp` chips when tp > 1, the weight image `weights`
    (f32, bf16, f16), `emulate` (run the lowered kernels on the CPU, for a backend that has such a mode), and
    `build` (a checked build folder whose artifacts the backend runs; None: lower the model's programs anew), and
    `aocx` (an engine compiled ahead of time, for a backend that loads program binaries: the D5005 engine)."""

    store: WeightStore
    ctx: int | None = None
    prefill_rows: int = 16
    tp: int = 1
    weights: str = "f32"
    emulate: bool = False
    build: Path | None = None
    aocx: Path | None = None


def reference_generator(request: RunRequest) -> Generator:
    """The reference backend: the numpy interpreter, in float32."""
    from logos_ir.generate import BuildGenerator, Generator

    if request.emulate:
        raise LogosError("the reference backend has no --emulate mode: it runs on the CPU already")
    if request.build is not None:  # a `logos` build: its program.logos, read from the folder
        return BuildGenerator(request.store, request.build, ctx=request.ctx)
    return Generator(request.store, ctx=request.ctx, prefill_rows=request.prefill_rows, tp=request.tp)
