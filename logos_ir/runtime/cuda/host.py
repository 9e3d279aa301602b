"""The CUDA host runtime: what the host plan of a build (`step.mlir`'s `@step`) says to do, done on this process's
ranks through the device interface (`devices`), one code path for the emulator and the GPU: the plan's buffers
allocated (weights uploaded once, shard by shard; caches once per cache length, shared by the programs of that
length; the host's tables), its inputs written, its launches and collectives issued in order, or after an eager
first run captured as a graph and replayed, and the head's logits read back (`HostRuntime`, `HostProgram`).
`make_runtime` chooses the ranks and devices of a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from logos_ir.errors import LogosError
from logos_ir.passes.cuda.host_plan import Gather, HostPlan, Reduce
from logos_ir.runtime.cuda.devices import Emulator, Gpu
from logos_ir.runtime.cuda.ranks import LocalRanks, MpiRanks, NcclRanks, launcher
from logos_ir.runtime.cuda.weights import EmulatedWeights, host_table


class HostRuntime:
    """Runs host plans on this process's ranks (`devices`: one device a local rank, ranks `first_rank`...), all
    through the device interface (`Emulator` or `Gpu`): weights uploaded once, shard by shard, from `weights`;
    caches allocated once per cache length and shared by the programs of that length; every allocation, fill and
    copy on the work stream; all-reduces and all-gathers through `ranks` (`LocalRanks`, `MpiRanks`, `NcclRanks`)."""

    def __init__(
        self, spec: Any, weights: EmulatedWeights | None, devices: Sequence[Any], ranks: Any, first_rank: int = 0
    ):
        self.spec, self.weights, self.devices, self.ranks = spec, weights, list(devices), ranks
        self.first_rank = first_rank
        self.device_weights: list[dict[str, Any]] = [{} for _ in self.devices]
        self.caches: list[dict[str, Any]] = [{} for _ in self.devices]

    def buffers(self, local: int, plan: HostPlan) -> dict[str, Any]:
        device, chip = self.devices[local], self.first_rank + local
        arrays: dict[str, Any] = {}
        for buffer in plan.buffers.values():
            if buffer.kind == "weight":
                key = f"{buffer.name}:{buffer.element}:{buffer.shape}"  # a decode step's blocks beside an image
                found = self.device_weights[local].get(key)
                if found is None:
                    if self.weights is None:
                        raise LogosError("the CUDA runtime was given no weights")
                    if hasattr(self.weights, "on_device"):  # weights made on the device (the benchmark's)
                        found = self.weights.on_device(device, chip, buffer)
                    else:
                        found = device.upload(buffer.name, self.weights.share(chip, buffer), buffer.element)
                    self.device_weights[local][key] = found
                arrays[buffer.name] = found
            elif buffer.kind == "cache":
                key = f"{buffer.name}:{buffer.shape}"
                if key not in self.caches[local]:
                    self.caches[local][key] = device.alloc(buffer.name, buffer.shape, buffer.element)
                arrays[buffer.name] = self.caches[local][key]
            elif buffer.kind == "table":
                arrays[buffer.name] = device.upload(buffer.name, host_table(self.spec, buffer, chip), buffer.element)
            else:
                arrays[buffer.name] = device.alloc(buffer.name, buffer.shape, buffer.element)
        return arrays

    def reset(self) -> None:
        for device, caches in zip(self.devices, self.caches, strict=True):
            for key, cache in caches.items():
                device.fill(key, cache)

    def program(self, plan: HostPlan, cuda_source: str, graph: bool) -> HostProgram:
        return HostProgram(self, plan, cuda_source, graph)


class HostProgram:
    """One lowered program on the runtime's ranks: `inputs` and `run` as the reference interpreter has them (so the
    reference's greedy loop drives it), `logits` after each run (the head's f32 logits of the last row, read back
    from the first local rank's buffer when asked for: a greedy run, whose token is the device's arg-max, reads
    back the token alone). With `graph`, the step is captured after an eager first run and replayed after."""

    def __init__(self, runtime: HostRuntime, plan: HostPlan, cuda_source: str, graph: bool):
        self.runtime, self.plan, self.graph = runtime, plan, graph
        for device in runtime.devices:
            device.load(plan.kernels, cuda_source)
        self.chips = [runtime.buffers(local, plan) for local in range(len(runtime.devices))]
        self.inputs = {
            b.name: ("token" if b.name.startswith("token") else "position")
            for b in plan.buffers.values()
            if b.kind == "input"
        }
        self.output = next(b.name for b in plan.buffers.values() if b.kind == "output")
        self.graphs: list[Any] | None = None
        self._logits: np.ndarray | None = None
        self._ran = False

    def launch_all(self) -> None:
        devices = self.runtime.devices
        for step in self.plan.steps:
            if isinstance(step, Reduce):
                parts = [(device, arrays[step.buffer]) for device, arrays in zip(devices, self.chips, strict=True)]
                self.runtime.ranks.all_reduce(step.buffer, parts)
                continue
            if isinstance(step, Gather):
                pairs = zip(devices, self.chips, strict=True)
                gathered = [(device, arrays[step.buffer], arrays[step.result]) for device, arrays in pairs]
                self.runtime.ranks.all_gather(step.result, gathered, step.axis)
                continue
            for device, arrays in zip(devices, self.chips, strict=True):
                device.launch(
                    step.kernel, step.grid, step.block, [arrays[name] for name in step.buffers], step.programmatic
                )

    def step(self) -> None:
        devices = self.runtime.devices
        if not self.graph:
            self.launch_all()
        elif self.graphs is None:
            self.launch_all()  # this step, eager: it loads the kernels and surfaces any fault outside a capture
            for device in devices:
                device.begin_capture()
            self.launch_all()  # recorded, not run: every later step replays it
            self.graphs = [device.end_capture() for device in devices]
        else:
            type(devices[0]).replay(devices, self.graphs)

    def run(self, **inputs: Any) -> np.ndarray:
        for device, arrays in zip(self.runtime.devices, self.chips, strict=True):
            for name, values in inputs.items():
                device.write(name, arrays[name], np.asarray(values, np.int64))
        self.step()
        self._ran, self._logits = True, None
        return self.runtime.devices[0].read(self.output, self.chips[0][self.output])

    @property
    def logits(self) -> np.ndarray | None:
        """The last run's f32 logits of its last row (None before a run, or for a program without a head), read
        back from the device on the first call after that run."""
        arrays = self.chips[0]
        if not self._ran or "logits" not in arrays:
            return None
        if self._logits is None:
            self._logits = self.runtime.devices[0].read("logits", arrays["logits"])[-1].astype(np.float32)
        return self._logits


class EmulatedDevice:
    """The emulator's chips of one process in lockstep, as plans and buffers: `prepare` gives each chip's buffers
    for a plan, `run` one step of it (the host runtime's code path, on `Emulator` devices)."""

    def __init__(self, spec: Any, weights: EmulatedWeights | None, chips: int | None = None):
        count = chips or (weights.chips if weights is not None else 1)
        self.runtime = HostRuntime(spec, weights, [Emulator(r) for r in range(count)], LocalRanks())
        self.programs: dict[int, HostProgram] = {}

    def prepare(self, plan: HostPlan) -> list[dict[str, np.ndarray]]:
        program = self.runtime.program(plan, "", graph=False)
        self.programs[id(program.chips)] = program
        return program.chips

    def run(self, plan: HostPlan, chips: list[dict[str, np.ndarray]]) -> None:
        self.programs[id(chips)].step()

    def reset(self) -> None:
        self.runtime.reset()

    @property
    def kernel_seconds(self) -> dict[str, float]:
        return self.runtime.devices[0].kernel_seconds


def make_runtime(spec: Any, weights: EmulatedWeights, tp: int, emulate: bool) -> HostRuntime:
    """This process's ranks: under an MPI launcher one rank (chip) a process, all-reducing over MPI (emulator) or
    NCCL (GPU, its id broadcast over MPI); else, emulated, every chip in this process (`LocalRanks`), or one GPU."""
    rank, world, comm = launcher()
    if world > 1:
        if world != tp:
            raise LogosError(
                f"{world} processes were started for a program split over {tp} chips: one process a chip",
                hint=f"start it with mpiexec -n {tp} (or srun -n {tp})",
            )
        device = Emulator(rank) if emulate else Gpu(rank)
        ranks = MpiRanks(comm) if emulate else NcclRanks(comm, rank, world)
        return HostRuntime(spec, weights, [device], ranks, first_rank=rank)
    if emulate:
        return HostRuntime(spec, weights, [Emulator(r) for r in range(tp)], LocalRanks())
    if tp > 1:
        raise LogosError(
            f"a program split over {tp} GPUs runs as {tp} processes, one a GPU",
            hint=f"start it with mpiexec -n {tp} logos-run --backend cuda --tp {tp} ...",
        )
    return HostRuntime(spec, weights, [Gpu(0)], LocalRanks())
