"""The host's side of the simulated grid: a build read as the host reads it (`read_build`: a folder's `grid.mlir` and
`host.json`; `build_in_memory`: the `spatial` compile target's build of a decode step, read the same way), and a
decode step driven as `run.py` drives a CS-2 (`GridMachine`): the weight tiles and rotary tables written once with
memcpy, then for each token its id and position written, `step` launched and the logits read back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from logos_ir.dialects import csl_ext
from logos_ir.errors import LogosError
from logos_ir.passes.spatial.verify_grid import layout_params
from logos_ir.runtime.spatial.elements import Fabric


class GridMachine:
    """A decode step on the simulated grid, driven as `run.py` drives a CS-2: the weight tiles and rotary tables
    written once with `memcpy_h2d`, then for each token its id and position written, `step` launched, and the
    head's logits read back with `memcpy_d2h` from the column the host plan names (where the rows' reductions
    end); the host takes their arg-max."""

    def __init__(
        self, module: ModuleOp, host: dict[str, Any], store: Any, identities: Sequence[Any] = (), layout: Any = None
    ):
        self.module, self.host, self.store = module, host, store
        self.identities = list(identities)
        self.fabric = Fabric(module, layout_params(host), layout=layout)  # layout: read already (`Fabric`)
        self.logits: np.ndarray | None = None
        self.cycles: list[float] = []  # each step's launch, from its issue to its end
        self.memcpy_cycles: list[float] = []  # each step's memcpy copy (the logits out)
        self.timed: list[int] = []  # each step's cycles between the program's <time> stamps on element (column, 0)
        self._weights_loaded = False

    def reset(self) -> None:
        if not self._weights_loaded:
            self._load_weights()
            self._weights_loaded = True
        for name in ("key_cache", "value_cache"):
            if name in self.fabric.memory:
                self.fabric.memory[name][:] = 0
        self.cycles = []
        self.memcpy_cycles = []
        self.timed = []

    def _load_weights(self) -> None:
        from logos_ir.passes.spatial import grid as g
        from logos_ir.rope import rope_inv_freq

        grid = self.host["grid"]
        width, height = grid
        image = self.host["image"]
        for name, fields in self.host["weights"].items():
            weight = g.Weight(**{**fields, "tensors": tuple(fields["tensors"]), "row_map": tuple(fields["row_map"])})
            if weight.format:  # read as stored: the file's codes and scales, tiled (`grid.stored_tiles`)
                tiled = [g.stored_tiles(self.store.blocks(t), weight, grid) for t in weight.tensors]
                self.fabric.memcpy_h2d(name, np.concatenate([t[0] for t in tiled], axis=2))
                self.fabric.memcpy_h2d(f"{name}_scales", np.concatenate([t[1] for t in tiled], axis=2))
                self.fabric.memcpy_h2d(f"{name}_slots", tiled[0][2])
                continue
            parts = []
            for tensor in weight.tensors:
                array = np.asarray(self.store.get(tensor), dtype=np.float32)
                if image == "f16" and weight.kind != "vector":
                    array = array.astype(np.float16).astype(np.float32)
                parts.append(g.tiles(array, weight, grid))
            self.fabric.memcpy_h2d(name, np.concatenate(parts, axis=2))
        spec = self.store.spec.at_context(self.host["ctx"])  # LongRoPE's factors for the cache's context
        inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
        plan = _plan_of(self.host, spec)
        for table, chunk in self.host["rope_tables"].items():
            rows = g.inv_freq_rows(inv_freq, plan, chunk)
            self.fabric.memcpy_h2d(table, np.broadcast_to(rows[:, None, :], (height, width, chunk // 2)).copy())

    def step(self, token: int, position: int) -> int:
        """One decode step: token (from 1) at position (from 1); the next token (from 1)."""
        if not self._weights_loaded:
            self.reset()
        fabric = self.fabric
        copied = fabric.memcpy_cycles
        self.cycles.append(fabric.launch("step", token - 1, position))  # the token and position: launch arguments
        logits = self.host["logits"]
        height = self.host["grid"][1]
        chunks = fabric.memcpy_d2h(logits["array"], logits["column"], 0, 1, height, logits["chunk"])
        self.memcpy_cycles.append(fabric.memcpy_cycles - copied)  # the step's copy: the logits
        self.logits = chunks.reshape(-1)[: logits["length"]].astype(np.float32)
        self.timed.append(self.timestamp("step_end") - self.timestamp("step_start"))
        return int(np.argmax(self.logits)) + 1

    def timestamp(self, name: str, x: int | None = None) -> int:
        """A `<time>` stamp of element (x, 0) (the logits' column if none), read back as run.py reads it: three u16
        words, low first."""
        column = self.host["logits"]["column"] if x is None else x
        words = self.fabric.memcpy_d2h(name, column, 0, 1, 1, 3).reshape(-1).astype(np.int64) & 0xFFFF
        return int(words[0] + (words[1] << 16) + (words[2] << 32))


def logits_read_cycles(host: dict[str, Any], channels: int = 1) -> float:
    """The cycles of a step's read of the logits (`GridMachine.step`'s `memcpy_d2h`: the height's chunks from the
    host plan's column), from a build's host plan alone: for a grid too large to load (bench/spatial_agreement.py)."""
    from logos_ir.runtime.spatial.memory import memcpy_cost

    logits = host["logits"]
    return memcpy_cost(host["grid"][1] * logits["chunk"], logits["column"] + 1, channels)


def _plan_of(host: dict[str, Any], spec: Any) -> Any:
    from logos_ir.dialects import csl_ext
    from logos_ir.passes.spatial.grid import GridPlan

    segmented = csl_ext.TARGETS[host.get("arch", "wse2")].segmented_lines  # the machine the build is for
    return GridPlan.of(spec, host["ctx"], host["image"], host["grid"], host.get("kv_copies", 1), segmented)


def build_in_memory(spec: Any, ctx: int, image: str) -> tuple[ModuleOp, dict[str, Any]]:
    """The lane's build of the decode step over `ctx` positions (the `spatial` compile target, in memory), read as
    a build folder is: its csl-level module and host plan."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.program import Cut
    from logos_ir.progress import Progress
    from logos_ir.registry import compile_targets

    request = BuildRequest(ModelSource("preset", "run", spec), Cut.decode(ctx), 1, image, False, Progress.silent())
    built = compile_targets()["spatial"].build()(request)
    files = {a.path: a.data.decode("utf-8") for a in built.artifacts}
    return read_grid(files["grid.mlir"], "grid.mlir"), json.loads(files["host.json"])


def read_build(folder: Path) -> tuple[ModuleOp, dict[str, Any]]:
    """The csl-level module (`grid.mlir`) and host plan (`host.json`) of a build folder."""
    mlir, plan = folder / "grid.mlir", folder / "host.json"
    if not mlir.is_file() or not plan.is_file():
        raise LogosError(f"{folder} is not a spatial build (no grid.mlir and host.json)")
    return read_grid(mlir.read_text(), str(mlir)), json.loads(plan.read_text())


def read_grid(text: str, name: str) -> ModuleOp:
    """A build's `grid.mlir`: the csl-level module the fabric simulator runs."""
    from xdsl.context import Context
    from xdsl.dialects.arith import Arith
    from xdsl.dialects.builtin import Builtin
    from xdsl.dialects.csl import CSL
    from xdsl.dialects.memref import MemRef
    from xdsl.dialects.scf import Scf
    from xdsl.parser import Parser

    context = Context()
    for dialect in (Builtin, Arith, Scf, MemRef, CSL, csl_ext.CSL_EXT):
        context.load_dialect(dialect)
    return Parser(context, text, name).parse_module()
