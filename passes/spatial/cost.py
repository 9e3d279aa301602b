"""The spatial lane's cycle model: what one op of a region costs a grid like a WSE-2 for one token, in cycles and in
word-hops (words times the links they cross). The build's report and the simulator's counters both use it, so the
estimate a build prints and the cycles a run counts come from one model.

An element does `macs_f16` (f16 weights) or `macs_f32` multiply-accumulates per cycle, a link carries one 32-bit word
per cycle, a hop costs `hop` cycles, at `clock_hz`. A product costs its broadcast down the columns, its tile's MACs and
its reduction along the rows; a route its longest path plus the words one element receives; the others likewise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from xdsl.ir import Operation

from logos_ir.dialects import spatial as sp


@dataclass(frozen=True)
class CycleModel:
    """Cycles of a grid like a WSE-2's: `macs_f16`/`macs_f32` multiply-accumulates per element per cycle, one word per
    link per cycle, `hop` cycles per hop, at `clock_hz`."""

    clock_hz: float = 1.1e9
    macs_f16: int = 4
    macs_f32: int = 1
    hop: int = 1

    def macs(self, weights: str) -> int:
        return self.macs_f16 if weights == "f16" else self.macs_f32


def manhattan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).sum(axis=-1)


def route_cost(source: sp.Layout, target: sp.Layout, width: int, hop: int) -> tuple[int, int]:
    """(cycles, word-hops) of moving `width` values from one layout to another, each word along the shortest path."""
    words = np.arange(width)
    hops = manhattan(source.elements()[words // source.tile], target.elements()[words // target.tile])
    if not hops.any():
        return 0, 0
    return int(hops.max()) * hop + target.tile, int(hops.sum())


def op_cost(
    op: Operation, model: CycleModel, weights: str, position: int | None = None, row: int = 0
) -> tuple[int, int]:
    """(cycles, word-hops inside the region) of one op for one token, by the cycle model. `position` (from 1) is the
    token's, None for the worst case (a full cache); `row` is the table row of elements that holds an embedding's
    token (0, the farthest from the bottom row, for the worst case)."""
    macs, hop = model.macs(weights), model.hop
    if isinstance(op, sp.RouteOp):
        return route_cost(sp.layout_of(op.input), op.layout, sp.shape_of(op.input)[-1], hop)
    if isinstance(op, sp.MatvecOp):
        rect, (rows, columns) = op.place.rect, sp.int_values(op.place.tile)
        cycles = (rect.h - 1) * hop + columns + math.ceil(rows * columns / macs) + 2 * (rect.w - 1) * hop + rows
        return cycles, rect.w * columns * (rect.h - 1) + rect.h * rows * (rect.w - 1)
    if isinstance(op, sp.NormOp):
        n, tile = op.layout.n, op.layout.tile
        return math.ceil(3 * tile / macs) + 3 * (n - 1) * hop, 2 * (n - 1)
    if isinstance(op, sp.RopeOp):
        n, tile = op.layout.n, op.layout.tile
        return (n - 1) * hop + math.ceil(2 * tile / macs) + op.head_dim.value.data, n - 1
    if isinstance(op, sp.CacheWriteOp):
        return _cache_write_cost(op, hop, position)
    if isinstance(op, sp.AttendOp):
        return _attend_cost(op, hop, macs, position)
    if isinstance(op, sp.MapOp):
        return math.ceil(2 * op.layout.tile / macs), 0
    if isinstance(op, sp.EmbedOp):
        place = op.table.owner
        assert isinstance(place, sp.PlaceOp)
        rect, columns = place.rect, sp.int_values(place.tile)[1]
        down = rect.h - 1 - row
        return (rect.w + rect.h - 2 + down) * hop + columns, rect.w * rect.h - 1 + rect.w * columns * down
    if isinstance(op, sp.ArgmaxOp):
        source = sp.layout_of(op.input)
        return source.tile + 2 * (source.n - 1) * hop, 2 * (source.n - 1)
    return 0, 0


def _cache_write_cost(op: sp.CacheWriteOp, hop: int, position: int | None) -> tuple[int, int]:
    cache = op.cache.owner
    assert isinstance(cache, sp.CacheOp)
    kv_heads, length, head_dim = sp.int_values(cache.shape)
    owner = (length if position is None else position) - 1
    owner //= cache.block.value.data
    return owner * hop + head_dim, owner * kv_heads * head_dim


def _attend_cost(op: sp.AttendOp, hop: int, macs: int, position: int | None) -> tuple[int, int]:
    cache = op.cache
    kv_heads, length, head_dim = sp.int_values(cache.shape)
    block, blocks, tile = cache.block.value.data, cache.rect.w, op.layout.tile
    group = tile // head_dim
    active = -(-(length if position is None else position) // block)
    compute = math.ceil(2 * group * block * head_dim / macs) + group * block
    cycles = (blocks - 1) * hop + tile + compute + 2 * (active - 1) * hop + tile
    return cycles, kv_heads * ((blocks - 1) * tile + (active - 1) * (tile + 2 * group))
