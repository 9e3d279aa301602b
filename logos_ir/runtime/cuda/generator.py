"""The `cuda` backend of `logos-run` (`cuda_generator`, which the registry loads): the reference's greedy loop
(prompt checks, prefill chunks, decode steps, stats) over the lane's programs, each a build's host plan and kernels
run by the host runtime on a GPU, or with `emulate` on the CPU; given a build folder, that folder's step module,
kernels and weight image.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from logos_ir.errors import LogosError
from logos_ir.generate import Compiled, Generator
from logos_ir.program import Cut
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda.artifacts import build_program, read_build
from logos_ir.runtime.cuda.devices import NO_GPU, gpu_count
from logos_ir.runtime.cuda.host import HostRuntime, make_runtime
from logos_ir.runtime.cuda.weights import EmulatedWeights


class _DeviceState:
    """What the reference's greedy loop resets between prompts: the device's KV caches."""

    def __init__(self, runtime: HostRuntime):
        self.runtime = runtime

    def reset(self) -> None:
        self.runtime.reset()


def cuda_generator(request: RunRequest) -> Generator:
    """The `cuda` backend: the lane's kernels on the GPU, or with `emulate` on the CPU (see the module docstring);
    with `request.build`, the step module, kernels and weight image of that build folder."""
    if not request.emulate and gpu_count() == 0:
        raise LogosError(NO_GPU)
    if request.weights not in ("bf16", "f32"):
        raise LogosError(f"the cuda backend runs weights bf16 or f32, not {request.weights}")
    store = request.store
    folder = read_build(request.build) if request.build is not None else None
    tp = folder[1].plan.chips if folder is not None else request.tp
    image = request.build if folder is not None and _has_image(request.build) else None
    runtime = make_runtime(store.spec, EmulatedWeights(store, request.weights, tp, image), tp, request.emulate)

    class CudaGenerator(Generator):
        """The reference's greedy loop (prompt checks, prefill chunks, decode steps, stats) over the lane's
        programs."""

        def compile_program(self, cut: Cut) -> Compiled:
            if folder is None:
                build = build_program(self.spec, cut, self.tp, request.weights)
            elif cut != folder[0]:
                raise LogosError(f"{request.build}: the build holds '{folder[0].option()}', not '{cut.option()}'")
            else:
                build = folder[1]
            program = runtime.program(build.plan, build.source, graph=cut.kind == "decode")
            return Compiled(program, build.identity)

        def kv_state(self, ctx: int) -> Any:
            return _DeviceState(runtime)

    ctx = folder[0].ctx if folder is not None else request.ctx
    generator = CudaGenerator(store, ctx=ctx, prefill_rows=request.prefill_rows, tp=tp)
    if folder is not None:
        generator.prompt_by_step = True  # the folder holds the decode step alone
    generator.runtime = runtime  # type: ignore[attr-defined]
    return generator


def _has_image(folder: Any) -> bool:
    return any(Path(folder).glob("weights*.bin"))
