"""The spatial lane's cycles as a band (`bench/spatial_agreement.py`): a W x H grid's cycles a token composed from
smaller grids of its tiles and a one-word model of its own lines agree with the grid simulated directly; the
simulator's cycle costs can be set for a run (`cycle_costs`) and put back, and the band's ends order the simulated
cycles; the logits' read the bench adds to a step is what the simulated host counts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from logos_ir.errors import LogosError
from logos_ir.runtime.spatial import CYCLES, cycle_costs
from logos_ir.runtime.spatial.host import GridMachine, logits_read_cycles
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_decode
from logos_ir.weights import RandomWeights

BENCH = Path(__file__).resolve().parents[2] / "bench" / "spatial_agreement.py"

# A GQA model whose 16 x 24 grid keeps the KV heads narrow (a KV head's cache spans 8 rows: three column segments,
# attention's scores reduced within them, as the 8B's 683 x 994 grid does) and cuts each row into two segments.
SPEC = replace(
    ModelSpec.preset("tiny"), heads=8, kv_heads=2, head_dim=16, hidden=48, intermediate=64, vocab=64, layers=2
)
GRID, CTX = (16, 24), 32


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("spatial_agreement", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> Any:
    return _bench()


@pytest.fixture(scope="module")
def plan() -> Any:
    return lower_decode(SPEC, CTX, "f32", GRID, memory=1 << 30, copies=1).plan


def test_a_rectangle_composed_from_smaller_grids_matches_the_rectangle_simulated(bench: Any, plan: Any) -> None:
    """The 16 x 24 grid's cycles a token from two smaller grids of its proportions and tiles plus what the one-word
    model gains on its own lines (`full_lines`, as the 8B's figure is made) are within 1% of the 16 x 24 grid
    simulated directly with its tiles; a small grid alone is more than 5% off, so the composition carries them."""
    assert plan.width != plan.height and plan.scores_local and plan.line("row")[1] == 2 and plan.line("col")[1] == 3
    grids = [grid for grid in bench.rectangle_grids(SPEC, plan, 20) if grid[1] < plan.height]
    assert all(abs(w / h - plan.width / plan.height) < 0.1 for w, h in grids)
    rows = bench.small_grids(SPEC, plan, "f32", [grids[0], grids[-1]])
    composed = bench.full_lines(SPEC, plan, "f32", rows)["cycles_per_token"]
    layer, ends = bench.layer_and_ends(SPEC, CTX, "f32", plan.grid, plan.kv_copies)
    direct = ends + SPEC.layers * layer
    assert abs(composed - direct) <= 0.01 * direct, (composed, direct)
    for row in rows:
        alone = row["embedding_and_head_cycles"] + SPEC.layers * row["layer_cycles"]
        assert abs(alone - direct) > 0.05 * direct, (row["grid"], alone, direct)


TINY = ModelSpec.preset("tiny")


@pytest.fixture(scope="module")
def tiny() -> Any:
    return lower_decode(TINY, 16, "f32")


def _step(tiny: Any, costs: dict[str, float]) -> tuple[float, float]:
    """A step's cycles and its logits' read under `costs`, on the tiny model's own grid (the program loaded under
    them: the simulator compiles some costs into its instructions)."""
    with cycle_costs(costs):
        machine = GridMachine(tiny.module, tiny.host, RandomWeights(TINY, seed=3))
        machine.reset()
        machine.step(4, 7)
        return machine.cycles[-1], machine.memcpy_cycles[-1]


def test_the_band_orders_the_cycles_and_each_cost_moves_them(bench: Any, tiny: Any) -> None:
    """The band's low end (every cost pessimistic) costs a step more than its high end (every cost optimistic), and
    more than the simulator's defaults; a dearer hop or f32 division alone makes a dearer step; the defaults are
    back after each run."""
    defaults = dict(CYCLES)
    low, high, default = (_step(tiny, bench.cost_set(name))[0] for name in ("low", "high", "default"))
    assert high < low and default < low
    assert _step(tiny, {"hop": 2})[0] > default
    assert _step(tiny, {"divf": 50})[0] > default
    assert CYCLES == defaults
    assert bench.clock_of("low") <= bench.clock_of("default") <= bench.clock_of("high")


def test_the_logits_read_the_bench_adds_is_the_simulated_hosts(tiny: Any) -> None:
    """`logits_read_cycles`, which the bench adds to a composed step from the build's host plan alone, equals the
    cycles the simulated host counts for the step's `memcpy_d2h` of the logits, at the default and a dearer
    memcpy; a second memcpy channel would halve the wavelets' part."""
    for costs in ({}, {"memcpy_wavelet": 3}):
        _, counted = _step(tiny, costs)
        with cycle_costs(costs):
            assert logits_read_cycles(tiny.host) == counted
    with cycle_costs({"hop": 0}):
        assert logits_read_cycles(tiny.host, channels=2) == logits_read_cycles(tiny.host) / 2


def test_an_unknown_cost_is_refused_and_the_costs_come_back_after_an_error() -> None:
    defaults = dict(CYCLES)
    with pytest.raises(LogosError, match="no such cycle cost: hops"):
        with cycle_costs({"hops": 2}):
            pass
    with pytest.raises(RuntimeError):
        with cycle_costs({"hop": 5}):
            assert CYCLES["hop"] == 5
            raise RuntimeError
    assert CYCLES == defaults
