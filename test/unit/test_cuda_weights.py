"""A rank's weights as the CUDA host runtime loads them: each buffer is this chip's share, read from the model's
files through their memory map (bf16 bit patterns straight from a bf16 checkpoint), never the whole model, nor any
whole tensor, as f32 on the host. The peak of what the host allocates while one rank of a 2-chip split loads its
shares is bounded by tracemalloc (numpy's allocations are traced; the file's mapped pages are the page cache's)."""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from logos_ir.numerics import bf16_rounded
from logos_ir.passes.cuda.host_plan import weight_share
from logos_ir.program import Cut
from logos_ir.runtime.cuda.artifacts import build_program
from logos_ir.runtime.cuda.host import HostRuntime
from logos_ir.runtime.cuda.ranks import LocalRanks
from logos_ir.runtime.cuda.weights import EmulatedWeights
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights
from logos_ir.weights.safetensors import SafetensorsStore, save_model


class Uploads:
    """A device that keeps nothing on the host: each upload is counted and dropped (a GPU's copy is on the GPU)."""

    def __init__(self) -> None:
        self.uploaded: dict[str, int] = {}

    def upload(self, name: str, values: np.ndarray, element: str) -> str:
        self.uploaded[name] = values.nbytes
        return name

    def alloc(self, name: str, shape: tuple[int, ...], element: str) -> str:
        return name


def test_a_rank_reads_only_its_shares_through_the_memory_map(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        ModelSpec.preset("tiny"), vocab=2048, hidden=256, layers=2, heads=8, kv_heads=2, head_dim=32, intermediate=768
    )
    random = RandomWeights(spec, seed=3)
    save_model(random, tmp_path, dtype="bfloat16")
    store = SafetensorsStore(tmp_path)
    plan = build_program(spec, Cut.decode(64), 2, "bf16").plan
    weights = [b for b in plan.buffers.values() if b.kind == "weight"]
    device: Any = Uploads()
    runtime = HostRuntime(spec, EmulatedWeights(store, "bf16", 2), [device], LocalRanks(), first_rank=1)

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        runtime.buffers(0, plan)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()

    whole_f32 = sum(4 * int(np.prod(shape)) for _, shape in spec.weights())
    largest = max(device.uploaded[b.name] for b in weights)
    assert set(device.uploaded) >= {b.name for b in weights}
    # at most the largest share twice (the fused Q/K/V's parts and their concatenation) and small change; the old
    # path, every tensor cached whole as f32, held whole_f32 (10.5 MB here) at its peak
    assert peak <= 2 * largest + (256 << 10), (peak, largest)
    assert peak * 8 < whole_f32
    assert not store._cache  # no tensor kept, whole or cut
    # the shares are exactly the checkpoint's: the same cut of the generated weights, rounded as the file rounded them
    for buffer in weights:
        mapped = EmulatedWeights(store, "bf16", 2).share(1, buffer)
        made = weight_share(random, buffer.name, buffer.shape, 1, 2, "bf16" if buffer.element == "bf16" else "f32")
        assert mapped.dtype == made.dtype and mapped.shape == buffer.shape, buffer.name
        if buffer.element == "bf16":
            assert np.array_equal(mapped, made), buffer.name
        else:  # norm scales stay f32 on the device: the file's bf16 values, widened
            assert np.array_equal(mapped, bf16_rounded(made)), buffer.name
