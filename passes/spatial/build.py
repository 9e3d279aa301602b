"""`logos-compile --target spatial`: every part of a decode step (or one part) placed on the grid and emitted as CSL.

For each part, in the build folder under `parts/<region>/`: `placement.mlir` (the part's placed `spatial` program:
where every weight tile lives, what each element computes, what travels on which colour), `layout.csl` and
`pe_program.csl` (its CSL, printed by xDSL's CSL printer), each headed by the identity line of the part's LOGOS
program. The report gives the grid, the elements each region uses, the memory per element (max and mean over the
elements used), the words moved per token (between regions, against the minimum the placement allows, and inside
regions) and the cycle model's estimate of tokens per second at a full cache. A build of code reads no weight value.

Options: `tile=N` (the tile edge; 0, the default, chooses it), `width`, `height`, `memory`, `colours` (the grid; a
WSE-2's by default).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from logos_ir.build import Artifact, BuildError, BuildRequest, LaneBuild
from logos_ir.dialects import spatial as sp
from logos_ir.passes.spatial.convert_logos_to_spatial import PARTS, Grid
from logos_ir.passes.spatial.cost import CycleModel, op_cost
from logos_ir.passes.spatial.decode_step import SpatialPart, lower_decode_step
from logos_ir.passes.spatial.emit_csl import LAYOUT, PROGRAM, CslEmitter
from logos_ir.program import Cut

_OPTIONS = ("tile", "width", "height", "memory", "colours")


def _options(request: BuildRequest) -> tuple[int, Grid]:
    unknown = sorted(set(request.options) - set(_OPTIONS))
    if unknown:
        raise BuildError(
            f"target spatial has no option {', '.join(unknown)}", hint=f"its options: {', '.join(_OPTIONS)}"
        )
    try:
        values = {k: int(v) for k, v in request.options.items()}
    except ValueError:
        raise BuildError("target spatial's options are whole numbers") from None
    base = Grid()
    grid = Grid(
        values.get("width", base.width),
        values.get("height", base.height),
        values.get("memory", base.memory),
        values.get("colours", base.colours),
    )
    return values.get("tile", 0), grid


def build_spatial(request: BuildRequest) -> LaneBuild:
    """The spatial lane's build (see the module docstring)."""
    cut = request.cut
    if cut.kind != "decode" and cut.kind not in PARTS:
        raise BuildError(f"target spatial lowers a decode step or its parts, not '{cut.option()}'")
    if request.tp != 1:
        raise BuildError(f"target spatial places a model on one grid, not over {request.tp} chips")
    if request.weights not in sp.WEIGHT_BYTES:
        raise BuildError(f"target spatial holds f16 or f32 weights, not {request.weights}")
    if request.with_weights:
        raise BuildError("target spatial writes no weight image yet: build without --with-weights")
    tile, grid = _options(request)
    ctx = cut.ctx or 1
    parts = lower_decode_step(request.spec, ctx, request.weights, tile, grid, request.progress)
    if cut.kind != "decode":
        parts = [p for p in parts if p.cut == cut]
    return _lane_build(parts, request, grid)


def _lane_build(parts: list[SpatialPart], request: BuildRequest, grid: Grid) -> LaneBuild:
    emitter = CslEmitter()
    artifacts: list[Artifact] = []
    for part in request.progress.over(parts, "emitting CSL"):
        region = part.region
        folder = f"parts/{region.sym_name.data}"
        line = part.identity.line()
        artifacts.append(
            Artifact.text(f"{folder}/placement.mlir", f"// {line}\n{part.module}\n", part.identity, "layout")
        )
        for name, text in emitter.emit(region).items():
            role = "layout" if name == LAYOUT else "program"
            assert name in (LAYOUT, PROGRAM)
            artifacts.append(Artifact.text(f"{folder}/{name}", text, part.identity, role))
    report = spatial_report(parts, request.spec, grid)
    report["element_programs"] = emitter.distinct
    return LaneBuild(artifacts, report, summary_lines(report))


def spatial_report(parts: list[SpatialPart], spec: Any, grid: Grid) -> dict[str, Any]:
    """The figures of a placement: elements, memory, words per token, the cycle model's tokens per second."""
    model = CycleModel()
    regions, used_memory, cycles, inside, between = [], [], 0, 0, 0
    for part in parts:
        region = part.region
        memory = region.memory_map()
        used = _used(region)
        used_memory.append(memory[used])
        region_cycles = region_inside = 0
        for op in region.body.block.ops:
            c, h = op_cost(op, model, region.weights.data)
            region_cycles, region_inside = region_cycles + c, region_inside + h
            if isinstance(op, sp.ReceiveOp):
                between += sp.shape_of(op.result)[-1]
        cycles, inside = cycles + region_cycles, inside + region_inside
        regions.append(
            {
                "region": region.sym_name.data,
                "origin": list(sp.int_values(region.origin)),
                "size": [region.width, region.height],
                "elements_used": int(used.sum()),
                "memory_max": int(memory[used].max()),
                "memory_mean": round(float(memory[used].mean()), 1),
                "cycles_per_token": region_cycles,
            }
        )
    memory_all = np.concatenate(used_memory)
    whole = len(parts) == spec.layers + 2
    minimum = spec.hidden * (spec.layers + 1) + spec.layers + 2 if whole else None
    if whole:
        between += 1  # the next token, back to the host and the embedding
    elements = int(sum(r["elements_used"] for r in regions))
    return {
        "grid": {
            "name": grid.name,
            "width": grid.width,
            "height": grid.height,
            "memory": grid.memory,
            "colours": grid.colours,
        },
        "tile": _tile(parts),
        "weights": parts[0].region.weights.data,
        "regions": regions,
        "elements_used": elements,
        "grid_share": round(elements / grid.elements, 4),
        "memory_per_element_max": int(memory_all.max()),
        "memory_per_element_mean": round(float(memory_all.mean()), 1),
        "words_between_regions_per_token": between,
        "words_between_regions_minimum": minimum,
        "word_hops_inside_regions_per_token": inside,
        "cycles_per_token": cycles,
        "cycle_model": {
            "clock_hz": model.clock_hz,
            "macs_f16": model.macs_f16,
            "macs_f32": model.macs_f32,
            "hop": model.hop,
        },
        "tokens_per_s": round(model.clock_hz / cycles, 1) if whole and cycles else None,
    }


def _used(region: sp.RegionOp) -> np.ndarray:
    """[height, width]: the elements of the region that hold or compute anything."""
    used = np.zeros((region.height, region.width), dtype=bool)
    for op in region.body.block.ops:
        if isinstance(op, sp.SpatialOp):
            for rect in op.touches():
                used[rect.y : rect.y + rect.h, rect.x : rect.x + rect.w] = True
    return used


def _tile(parts: list[SpatialPart]) -> list[int]:
    """[rows, columns] of the first product's tiles in the first layer (the embedding's table may be taller)."""
    region = parts[1].region if len(parts) > 1 else parts[0].region
    for op in region.body.block.ops:
        if isinstance(op, sp.MatvecOp | sp.EmbedOp):
            place = op.place if isinstance(op, sp.MatvecOp) else op.table.owner
            assert isinstance(place, sp.PlaceOp)
            return list(sp.int_values(place.tile))
    return [0, 0]


def summary_lines(report: dict[str, Any]) -> list[str]:
    grid = report["grid"]
    lines = [
        f"grid {grid['name']} {grid['width']} x {grid['height']}, {grid['memory']} bytes per element; "
        f"tiles of {report['tile'][0]} x {report['tile'][1]}, {report['weights']} weights",
        f"elements used: {report['elements_used']} ({100 * report['grid_share']:.2f}% of the grid) in "
        f"{len(report['regions'])} regions",
    ]
    lines += [
        f"  {r['region']}: {r['size'][0]} x {r['size'][1]} at {tuple(r['origin'])}, {r['elements_used']} used"
        for r in report["regions"][:3]
    ]
    if len(report["regions"]) > 3:
        lines.append(f"  ... and {len(report['regions']) - 3} more")
    lines.append(
        f"memory per element: max {report['memory_per_element_max']} bytes, mean {report['memory_per_element_mean']}"
    )
    minimum = report["words_between_regions_minimum"]
    ratio = f" (minimum {minimum}, {report['words_between_regions_per_token'] / minimum:.2f}x)" if minimum else ""
    lines.append(
        f"words moved per token: {report['words_between_regions_per_token']} between regions{ratio}, "
        f"{report['word_hops_inside_regions_per_token']} word-hops inside regions"
    )
    if report["tokens_per_s"]:
        lines.append(
            f"estimated {report['tokens_per_s']} tokens/s ({report['cycles_per_token']} cycles per token at "
            f"{report['cycle_model']['clock_hz'] / 1e9:g} GHz, full cache)"
        )
    lines.append(f"{report['element_programs']} distinct element programs")
    return lines


__all__ = ["Cut", "build_spatial"]
