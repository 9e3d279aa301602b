"""`spatial-place`: the regions of a model's parts placed side by side on the grid, or refused when they do not fit.

Assumes: a module holding one `spatial.grid` and `spatial.region` ops (from `convert-logos-to-spatial`; one per part,
or every part of a decode step when a build places them together with `place_regions`). Guarantees: each region's
`origin` is set so that no two regions overlap and each lies inside the grid (each at the lowest place left, in model
order so that a token's activations go a short way from region to region, else tallest first), or a diagnostic naming
the pass and giving the sizes: the regions' elements and the grid's. Every region verifies afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from logos_ir.dialects import spatial as sp
from logos_ir.errors import PassError

PASS = "spatial-place"


def skyline_origins(sizes: Sequence[tuple[int, int]], width: int) -> tuple[list[tuple[int, int]], int]:
    """Origins of rectangles of `sizes`, in order, each at the lowest place of the skyline the ones before it left
    (the leftmost of equals), and the height they reach. The first region of a model lands at (0, 0) and each next one
    beside or below its predecessors, so activations go a short way from region to region."""
    skyline = np.zeros(width, dtype=np.int64)
    origins: list[tuple[int, int]] = []
    for w, h in sizes:
        if w > width:
            return origins, -1
        lows = np.lib.stride_tricks.sliding_window_view(skyline, w).max(axis=1)
        x = int(lows.argmin())
        y = int(lows[x])
        origins.append((x, y))
        skyline[x : x + w] = y + h
    return origins, int(skyline.max())


def place_regions(regions: Sequence[sp.RegionOp], grid: sp.GridOp) -> None:
    """Set every region's origin on `grid` (see the module docstring); PassError with the sizes if they do not fit."""
    width, height = grid.width.value.data, grid.height.value.data
    sizes = [(r.width, r.height) for r in regions]
    origins, reach = skyline_origins(sizes, width)
    if reach > height or reach < 0:  # model order does not fit: the tallest regions first, the rest around them
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i][1], i))
        placed, tall_reach = skyline_origins([sizes[i] for i in order], width)
        if 0 <= tall_reach < reach or reach < 0:
            origins = [(0, 0)] * len(sizes)
            for index, origin in zip(order, placed, strict=True):
                origins[index] = origin
            reach = tall_reach
    widest = max((w for w, _ in sizes), default=0)
    if widest > width or reach > height or reach < 0:
        used = sum(w * h for w, h in sizes)
        raise PassError(
            f"{PASS}: {len(regions)} region(s) of {used} elements in all (the widest {widest}, reaching "
            f"{reach} rows) do not fit the grid @{grid.sym_name.data} of {width} x {height} = {width * height} "
            f"elements of {grid.memory.value.data} bytes",
            hint="give a larger tile (--option tile=N) or a larger grid",
        )
    for region, origin in zip(regions, origins, strict=True):
        region.origin = sp.i64_array(origin)


def verify_regions(regions: Sequence[sp.RegionOp]) -> None:
    for region in regions:
        try:
            region.verify()
        except VerifyException as error:
            raise PassError(f"{PASS}: {error}") from None


@dataclass(frozen=True)
class SpatialPlace(ModulePass):
    """Place every region of the module on its grid (see the module docstring)."""

    name = "spatial-place"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        grids = [o for o in op.ops if isinstance(o, sp.GridOp)]
        regions = [o for o in op.ops if isinstance(o, sp.RegionOp)]
        if len(grids) != 1 or not regions:
            raise PassError(
                f"{PASS}: expects one spatial.grid and its regions, found {len(grids)} grid(s), "
                f"{len(regions)} region(s)"
            )
        place_regions(regions, grids[0])
        verify_regions(regions)
