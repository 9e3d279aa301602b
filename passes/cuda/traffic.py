"""What a CUDA step reads from HBM, launch by launch, as its host plan says (the build report's byte figures and
the latency model's, `cost_model.py`, both read it here): each buffer a kernel loads from, once a launch."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from logos_ir.passes.cuda.host_plan import UNIT_BYTES

SIZES = {"bf16": 2, "f32": 4, "i64": 8, **UNIT_BYTES}  # a weight held as stored: its units' bytes


def buffer_bytes(buffer: Any) -> int:
    return int(np.prod(buffer.shape)) * SIZES[buffer.element]


# the operand each reading op reads global memory through: loads, atomics, the tensor-core kernels' asynchronous
# copies (cp.async, TMA) and bf16-pair loads
_READ_OPERAND = {
    "memref.load": "memref",
    "vector.load": "base",
    "memref.atomic_rmw": "memref",
    "cuda.cp_async": "src",
    "cuda.tma_load": "src",
    "cuda.load_bf16x2": "memref",
    "cuda.load_norm_bf16x2": "memref",
}


def kernel_reads(kernel: Any) -> list[bool]:
    """Which arguments of a `gpu.func` the kernel reads."""
    read = {getattr(op, _READ_OPERAND[op.name]) for op in kernel.walk() if op.name in _READ_OPERAND}
    return [arg in read for arg in kernel.body.block.args]


def step_bytes(plan: Any, live: int | None = None) -> tuple[int, int]:
    """(bytes the step reads, the least any step must read) with `live` cached positions (None: the whole cache):
    each launch reads each buffer it loads from once (a warp's re-reads of its input vector hit L1/L2 and are not
    counted), the embedding and the rotary tables one row per token, attention the live positions of its caches
    (a windowed layer's `attention_window<W>` the last W of them),
    scratch not at all (the partial sums a launch writes and reads back stay in L2); the minimum is every weight
    once (the embedding's rows) and the live positions of every cache."""
    read = 0
    for launch in plan.launches:
        for name, loaded in zip(launch.buffers, plan.fact(launch.kernel, kernel_reads), strict=True):
            if loaded:
                read += launch_bytes(plan, launch, name, live)
    minimum = 0
    for buffer in plan.buffers.values():
        if buffer.kind == "weight":
            if "embed_tokens" in buffer.name and _embeds(plan, buffer):
                minimum += _embedding_rows(plan, buffer)
            elif _stacked(buffer):  # a mixture's experts: those its rows choose, at most
                minimum += buffer_bytes(buffer) * experts_touched(plan, buffer) // buffer.shape[0]
            else:
                minimum += buffer_bytes(buffer)
        elif buffer.kind == "cache":
            minimum += _live(buffer, live, _window(plan, buffer.name))
    return read, minimum


def _stacked(buffer: Any) -> bool:
    """Whether a weight is a mixture's stacked experts (the only 3-D weights: experts, rows, depth)."""
    return len(buffer.shape) == 3


def experts_touched(plan: Any, buffer: Any) -> int:
    """The most experts of a stacked weight a step reads: each row reads its `top_k` chosen experts (the router's
    `route.chosen` [rows, top_k]), at most every expert this chip holds; a chip of a split step may hold them all
    of a row's choices, so its figure is the same bound."""
    assignments = int(np.prod(plan.buffers["route.chosen"].shape))
    return min(assignments, buffer.shape[0])


def expert_bytes(plan: Any) -> tuple[int, int]:
    """(the bytes of the stacked experts' weights a step reads at most, their whole bytes)."""
    stacked = [b for b in plan.buffers.values() if b.kind == "weight" and _stacked(b)]
    read = sum(buffer_bytes(b) * experts_touched(plan, b) // b.shape[0] for b in stacked)
    return read, sum(buffer_bytes(b) for b in stacked)


def _window(plan: Any, name: str) -> int | None:
    """The sliding window of the attention launches that read cache `name` (`attention_window<W>`, each layer's
    own), or None where they attend the whole live length."""
    windows = {_launch_window(launch.kernel) for launch in plan.launches if name in launch.buffers}
    windows.discard(-1)  # the cache writes
    return windows.pop() if len(windows) == 1 else None


def _launch_window(kernel: str) -> int | None:
    found = re.match(r"attention(?:_merge)?_window(\d+)_", kernel)
    if found:
        return int(found.group(1))
    return None if kernel.startswith("attention") else -1


def _embeds(plan: Any, buffer: Any) -> bool:
    """Whether the table is read by the embedding alone (a tied head reads it whole)."""
    return all(launch.kernel.startswith("embed") for launch in plan.launches if buffer.name in launch.buffers)


def _embedding_rows(plan: Any, buffer: Any) -> int:
    tokens = next(b for b in plan.buffers.values() if b.kind == "input" and b.name.startswith("token"))
    return int(np.prod(tokens.shape)) * buffer.shape[1] * SIZES[buffer.element]


def _live(buffer: Any, live: int | None, window: int | None = None) -> int:
    """A cache's bytes at `live` positions (None: full), of which a windowed layer reads its window's alone."""
    ctx = buffer.shape[-2]
    positions = min(live or ctx, ctx)
    return buffer_bytes(buffer) * (positions if window is None else min(positions, window)) // ctx


def launch_bytes(plan: Any, launch: Any, name: str, live: int | None) -> int:
    buffer = plan.buffers[name]
    if launch.kernel.startswith("embed") and buffer.kind == "weight":
        return _embedding_rows(plan, buffer)
    if buffer.kind == "cache":
        window = _launch_window(launch.kernel)
        return _live(buffer, live, window if window and window > 0 else None)
    if buffer.kind == "table" and name.startswith("rope."):  # a row per token: its position's
        return _embedding_rows(plan, buffer)
    if buffer.kind == "scratch":  # written and read back by the same launch or the next: L2, not HBM
        return 0
    if buffer.kind == "weight" and _stacked(buffer):  # an expert GEMV streams its chosen experts' rows alone
        return buffer_bytes(buffer) * experts_touched(plan, buffer) // buffer.shape[0]
    return buffer_bytes(buffer)
