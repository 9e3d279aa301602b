"""The `spatial` backend of `logos-run`: greedy generation on the simulated grid, the prompt and each new token going
one at a time through the decode step (`SpatialGenerator`), from a build folder or from the lane's build made in
memory for each cache length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from logos_ir.errors import LogosError
from logos_ir.generate import StepGenerator
from logos_ir.runtime.spatial.host import GridMachine, build_in_memory, read_build


class SpatialGenerator(StepGenerator):
    """Greedy generation on the simulated grid: the prompt and each new token go one at a time through the decode
    step, run by the fabric simulator from the `csl` modules (lowered anew, or read from a build folder)."""

    def __init__(self, weights: Any, ctx: int | None = None, image: str = "f16", build: Path | None = None):
        super().__init__(weights, ctx=ctx)
        if image not in ("f16", "f32"):
            raise LogosError(f"the spatial backend holds f16 or f32 weights, not {image}")
        self.image, self.build = image, build

    def machine(self, ctx: int) -> GridMachine:
        if self.build is not None:
            module, host = read_build(self.build)
            if host["ctx"] < ctx:
                raise LogosError(
                    f"the build in {self.build} holds a cache of {host['ctx']} positions; this run needs {ctx}"
                )
        else:
            module, host = build_in_memory(self.spec, ctx, self.image)
        return GridMachine(module, host, self.weights, host.get("identities", []))


def spatial_generator(request: Any) -> SpatialGenerator:
    """The `spatial` backend's generator for a `logos_ir.runtime.RunRequest`."""
    if request.emulate:
        raise LogosError("the spatial backend has no --emulate mode: it is a simulator already")
    if request.tp != 1:
        raise LogosError(f"the spatial backend places the model on one grid; --tp {request.tp} is not for it")
    return SpatialGenerator(request.store, ctx=request.ctx, image=request.weights, build=request.build)
