"""The spatial lane's levels run over every part of a decode step: each part (embedding, layers, head) extracted from
the one program by `cut-extract`, lowered by `convert-logos-to-spatial` to its own module (a grid and a region), and
all regions placed together on the grid by `spatial-place`'s `place_regions`. The build and the simulator both start
here, so both see the same placement. No weight value is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp

from logos_ir.dialects import spatial as sp
from logos_ir.passes.spatial.convert_logos_to_spatial import Grid, lower_part
from logos_ir.passes.spatial.place import place_regions, verify_regions
from logos_ir.program import Cut, Identity
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec


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
    """Every part of the decode step over a cache of `ctx` positions as a placed spatial program, in model order."""
    from logos_ir.author import written
    from logos_ir.build import extracted_parts, part_cuts
    from logos_ir.identity import identity
    from logos_ir.parser import parse_program

    grid = grid or Grid()
    progress = progress or Progress.silent()
    whole = Cut.decode(ctx)
    authored, _ = written(spec, whole)
    module = ModuleOp([parse_program(authored.text, f"<{whole.option()}>")])
    parts: list[SpatialPart] = []
    for cut, extracted in extracted_parts(module, part_cuts(spec, whole), progress):
        program = extracted.ops.first
        region = lower_part(program, weights, tile, grid)  # type: ignore[arg-type]
        parts.append(SpatialPart(cut, identity(program), ModuleOp([grid.op(), region])))  # type: ignore[arg-type]
    place_regions([p.region for p in parts], parts[0].grid)
    verify_regions([p.region for p in parts])
    return parts
