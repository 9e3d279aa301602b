"""`spatial-place`: the regions of a model's parts placed side by side on the grid, or refused when they do not fit.

Assumes: a module holding one `spatial.grid` and `spatial.region` ops (from `convert-logos-to-spatial`; one per part,
or every part of a decode step when a build places them together with `place_regions`). Guarantees: each region's
`origin` is set so that no two regions overlap and each lies inside the grid (shelves in model order, so a token's
activations flow from each region to its neighbour), or a diagnostic naming the pass and giving the sizes: the
regions' elements and the grid's. Every region verifies afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from logos_ir.dialects import spatial as sp
from logos_ir.errors import PassError

PASS = "spatial-place"


def shelf_origins(sizes: Sequence[tuple[int, int]], width: int) -> tuple[list[tuple[int, int]], int]:
    """Origins of rectangles of `sizes` on shelves of `width` elements, in order, and the height they reach."""
    origins: list[tuple[int, int]] = []
    x = y = shelf = 0
    for w, h in sizes:
        if x + w > width and x > 0:
            y, x, shelf = y + shelf, 0, 0
        origins.append((x, y))
        x += w
        shelf = max(shelf, h)
    return origins, y + shelf


def place_regions(regions: Sequence[sp.RegionOp], grid: sp.GridOp) -> None:
    """Set every region's origin on `grid` (see the module docstring); PassError with the sizes if they do not fit."""
    width, height = grid.width.value.data, grid.height.value.data
    sizes = [(r.width, r.height) for r in regions]
    origins, reach = shelf_origins(sizes, width)
    widest = max((w for w, _ in sizes), default=0)
    if widest > width or reach > height:
        used = sum(w * h for w, h in sizes)
        raise PassError(
            f"{PASS}: {len(regions)} region(s) of {used} elements in all (the widest {widest}, on shelves reaching "
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
