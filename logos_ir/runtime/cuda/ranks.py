"""The ranks of a CUDA host run and their collectives: every emulated chip in this process (`LocalRanks`, the
ranks' buffers summed or gathered in rank order by rank 0's stream once every rank has reached the collective), or
one process a chip under an MPI launcher (`launcher`: `mpiexec`, `mpirun`, `srun`), all-reducing and all-gathering
over MPI (`MpiRanks`, emulator) or NCCL on the work stream (`NcclRanks`, GPU; its unique id broadcast over MPI).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from logos_ir.errors import LogosError


class LocalRanks:
    """Every rank in this process (emulated chips): a sum of the ranks' buffers in rank order, as the reference
    sums the chips' partial results, run by rank 0's stream once every rank has reached it."""

    def all_reduce(self, name: str, parts: Sequence[tuple[Any, Any]]) -> None:
        arrays = [array for _, array in parts]

        def total() -> None:
            summed = arrays[0].copy()
            for array in arrays[1:]:
                summed += array
            for array in arrays:
                array[...] = summed

        for index, (device, _) in enumerate(parts):
            device.collective(name, total if index == 0 else None)

    def all_gather(self, name: str, parts: Sequence[tuple[Any, Any, Any]], axis: int) -> None:
        """The ranks' shares (`parts`: device, share, whole) side by side along `axis` in rank order, into every
        rank's whole buffer, by rank 0's stream once every rank has reached it."""

        def gather() -> None:
            whole = np.concatenate([share for _, share, _ in parts], axis=axis)
            for _, _, out in parts:
                out[...] = whole

        for index, (device, _, _) in enumerate(parts):
            device.collective(name, gather if index == 0 else None, "all_gather")


class MpiRanks:
    """One rank a process on the emulator device: MPI's Allreduce (sum) in place on the rank's buffer."""

    def __init__(self, comm: Any):
        self.comm = comm

    def all_reduce(self, name: str, parts: Sequence[tuple[Any, Any]]) -> None:
        from mpi4py import MPI  # type: ignore[import-not-found]

        ((device, array),) = parts
        device.collective(name, lambda: self.comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM))

    def all_gather(self, name: str, parts: Sequence[tuple[Any, Any, Any]], axis: int) -> None:
        """MPI's Allgather: the ranks' shares in rank order (rank-major), then laid side by side along `axis`."""
        ((device, share, out),) = parts
        staged = np.empty((self.comm.Get_size(), *share.shape), share.dtype)

        def gather() -> None:
            self.comm.Allgather(np.ascontiguousarray(share), staged)
            out[...] = np.concatenate(list(staged), axis=axis)

        device.collective(name, gather, "all_gather")


class NcclRanks:
    """One GPU a process: NCCL's all-reduce (sum) in place on the work stream (captured with the step's graph);
    the unique id made by rank 0 and broadcast over MPI (no file, nothing stale, any number of nodes)."""

    def __init__(self, comm: Any, rank: int, world: int):
        from cupy.cuda import nccl  # type: ignore[import-not-found]

        uid = nccl.get_unique_id() if rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl = nccl
        self.world = world
        self.communicator = nccl.NcclCommunicator(world, uid, rank)
        self.staging: dict[str, Any] = {}

    def all_reduce(self, name: str, parts: Sequence[tuple[Any, Any]]) -> None:
        ((device, array),) = parts
        kinds = {"float32": self.nccl.NCCL_FLOAT32}

        def reduce() -> None:
            self.communicator.allReduce(
                array.data.ptr, array.data.ptr, array.size, kinds[str(array.dtype)], self.nccl.NCCL_SUM,
                device.stream.ptr,
            )  # fmt: skip

        device.collective(name, reduce)

    def all_gather(self, name: str, parts: Sequence[tuple[Any, Any, Any]], axis: int) -> None:
        """NCCL's all-gather (NCCL has no gather to every rank along an axis but this: the ranks' shares rank-major)
        on the work stream, captured with the step's graph. A share gathered along its first axis, or one row of
        logits, is rank-major already and lands in the whole buffer itself; else it lands in a staging buffer
        (allocated before any capture) and one copy kernel lays the shares side by side along `axis`."""
        ((device, share, out),) = parts
        direct = all(d == 1 for d in share.shape[:axis])
        target = out
        if not direct:
            key = f"{name}:{share.shape}"
            if key not in self.staging:
                with device.stream:
                    self.staging[key] = device.cp.empty((self.world, *share.shape), share.dtype)
            target = self.staging[key]
        kinds = {"float32": self.nccl.NCCL_FLOAT32}

        def gather() -> None:
            self.communicator.allGather(
                share.data.ptr, target.data.ptr, share.size, kinds[str(share.dtype)], device.stream.ptr
            )
            if not direct:
                with device.stream:
                    moved = device.cp.moveaxis(target, 0, axis)  # a view: [.., world, share, ..]
                    out.reshape(moved.shape)[...] = moved

        device.collective(name, gather, "all_gather")


def launcher() -> tuple[int, int, Any]:
    """(rank, world, MPI communicator) of a process started by an MPI launcher (`mpiexec`, `mpirun`, `srun`),
    else (0, 1, None)."""
    markers = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "SLURM_PROCID")
    if not any(name in os.environ for name in markers):
        return 0, 1, None
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError:
        raise LogosError(
            "this process was started by an MPI launcher but mpi4py is not installed",
            hint="pip install 'logos-ir[mpi]' (mpi4py and an MPI library)",
        ) from None
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size(), comm
