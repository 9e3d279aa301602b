"""The spatial lane's levels run over every part of a decode step: each part (embedding, layers, head) extracted from
the one program by `cut-extract`, lowered by `convert-logos-to-spatial` to its own module (a grid and a region), and
all regions placed together on the grid by `spatial-place`'s `place_regions`. The build and the simulator both start
here, so both see the same placement. No weight value is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import ModuleOp

from logos_ir.dialects import spatial as sp
from logos_ir.passes.spatial.convert_logos_to_spatial import ConvertLogosToSpatial, Grid
from logos_ir.passes.spatial.place import SpatialPlace
from logos_ir.program import Cut, Identity
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec

if TYPE_CHECKING:
    from xdsl.context import Context


@dataclass
class SpatialPart:
    """One part's spatial program: its cut, the identity of the LOGOS program it came from, its module."""

    cut: Cut
    identity: Identity
    module: ModuleOp

    @property
    def region(self) -> sp.RegionOp:
        return next(op for op in self.module.ops if isinstance(op, sp.RegionOp))

    @property
    def grid(self) -> sp.GridOp:
        return next(op for op in self.module.ops if isinstance(op, sp.GridOp))


def lower_decode_step(
    spec: ModelSpec,
    ctx: int,
    weights: str = "f16",
    tile: int = 0,
    grid: Grid | None = None,
    progress: Progress | None = None,
) -> list[SpatialPart]:
    """Every part of the decode step over a cache of `ctx` positions as a placed spatial program, in model order:
    each extracted part through `convert-logos-to-spatial`, then all regions together through `spatial-place`."""
    from xdsl.context import Context

    from logos_ir.author import written
    from logos_ir.build import extracted_parts, part_cuts
    from logos_ir.identity import identity, the_program
    from logos_ir.parser import parse_program

    grid = grid or Grid()
    progress = progress or Progress.silent()
    context = Context()
    whole = Cut.decode(ctx)
    authored, _ = written(spec, whole)
    module = ModuleOp([parse_program(authored.text, f"<{whole.option()}>")])
    lowering = ConvertLogosToSpatial(weights, tile, grid.width, grid.height, grid.memory, grid.colours)
    parts: list[SpatialPart] = []
    for cut, extracted in extracted_parts(module, part_cuts(spec, whole), progress):
        part_identity = identity(the_program(extracted, lowering.name))
        lowering.apply(context, extracted)
        parts.append(SpatialPart(cut, part_identity, extracted))
    _place(context, parts, grid)
    return parts


def _place(context: Context, parts: list[SpatialPart], grid: Grid) -> None:
    """`spatial-place` over the regions of every part at once (moved into one module for it, then back)."""
    regions = [part.region for part in parts]
    for region in regions:
        region.detach()
    together = ModuleOp([grid.op(), *regions])
    SpatialPlace().apply(context, together)
    for part, region in zip(parts, regions, strict=True):
        region.detach()
        part.module.body.block.add_op(region)
