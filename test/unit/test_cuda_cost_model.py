"""The decode step's latency model (`passes/cuda/cost_model.py`, the build report's `latency_model`) on the 8B's
decode step at ctx 8192 (two layers: attention's figures do not depend on the layer count): attention's bytes in
flight an SM follow from its kernel's structure, counted here by hand; the figures move when the kernel does."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest

from logos_ir.program import Cut
from logos_ir.runtime.cuda.artifacts import build_program
from logos_ir.spec import ModelSpec


@pytest.fixture(scope="module")
def plan():
    spec = dataclasses.replace(ModelSpec.preset("llama-3.1-8b"), layers=2)
    return build_program(spec, Cut.decode(8192), 1, "bf16").plan


def test_attention_keeps_29_kb_in_flight_an_sm_from_1024_to_8192_and_all_of_it_at_256(plan) -> None:
    """By hand: a lane of the 8B's attention (head_dim 128, 16 lanes a position, 16-byte bf16 loads) issues 2 warp
    steps' key and value loads a loop iteration, 2 x 2 x 16 = 64 bytes, 2 KB a warp. 8 KV heads x 256 splits (32
    positions at a full cache, at least 4: one iteration) give 2048 warps, 15.5 an SM, under the 16 the launch bound
    keeps resident: 31,775 bytes an SM at 1024 and 8192 (both use every split). At 256, 64 splits of 4 positions:
    every warp's whole share in flight at once, the layer's whole live cache over the SMs."""
    from logos_ir.passes.cuda.cost_model import step_estimate

    def attention(live: int) -> dict:
        launches = step_estimate(plan, live)["launches"]
        return next(e for e in launches if e["kernel"].startswith("attention_1x"))

    for live in (1024, 8192):
        found = attention(live)
        assert found["active_warps"] == 2048
        assert found["bytes_in_flight_per_sm"] == round(2048 / 132 * 2048) == 31775 >= 29 * 1024
    short = attention(256)
    assert short["active_warps"] == 8 * 64
    # keys and values of 256 positions (one layer), the f32 query row and the position
    assert short["hbm_bytes"] == 256 * 8 * 128 * 2 * 2 + 4096 * 4 + 8
    assert 512 * 2048 == 256 * 8 * 128 * 2 * 2  # each warp's 2 KB in flight is its whole share of the cache
    assert short["bytes_in_flight_per_sm"] == round(512 / 132 * 2048) == 7944


def test_the_step_estimate_and_its_constants(plan) -> None:
    """Every constant is a range with its source; the step's band holds the minimum's time at the peak, and more
    live positions take longer."""
    from logos_ir.passes.cuda.cost_model import CONSTANTS, latency_report

    report = latency_report(plan)
    assert all(lo <= hi and len(source) > 20 for lo, hi, source in CONSTANTS.values())
    assert set(report["steps"]) == {"256", "1024", "8192"}
    times = [report["steps"][live]["ms"] for live in ("256", "1024", "8192")]
    assert times[0][0] < times[1][0] < times[2][0] and all(lo < hi for lo, hi in times)
    for step in report["steps"].values():
        low, high = step["hbm_fraction"]
        assert 0 < low < high < 1
        assert step["ms"][0] >= step["minimum_mb"] * 1e6 / 4.8e12 * 1e3  # no faster than the datasheet's peak
    merge = next(k for name, k in report["kernels"].items() if name.startswith("attention_merge"))
    assert merge["launches"] == 2


def test_the_8b_step_reaches_80_percent_of_hbm_with_programmatic_launch() -> None:
    """The whole 8B decode step (32 layers) at ctx 8192: every launch after the first is programmatic (each kernel
    waits at its top), so it pays the programmatic gap, not a graph node's; the band's low end (every constant at
    its worst) is at least 80% of HBM at live lengths 256, 1024 and 8192, and the same plan with every launch plain
    (the baseline) is below it at each: the figure moves with the launches, not with a constant of the test."""
    from logos_ir.passes.cuda.cost_model import latency_report, launch_gaps

    plan = build_program(ModelSpec.preset("llama-3.1-8b"), Cut.decode(8192), 1, "bf16").plan
    gaps = launch_gaps(plan)
    assert gaps[0] == "launch_gap_s" and set(gaps[1:]) == {"programmatic_gap_s"}
    assert all(launch.programmatic for launch in plan.launches)
    report = latency_report(plan)
    for live in ("256", "1024", "8192"):
        step = report["steps"][live]
        assert step["programmatic_launches"] == len(plan.launches) - 1 == 6 * 32 + 3
        low, _ = step["hbm_fraction"]
        plain, _ = step["hbm_fraction_without_programmatic_launch"]
        assert low >= 0.80 > plain, (live, low, plain)


def test_a_launch_after_a_collective_pays_a_graph_nodes_gap() -> None:
    """Over 2 chips the all-reduces (and the head's all-gather) sit between launches: the launch after one is not a
    programmatic edge (NCCL's kernels do not trigger their dependents), so it pays the full gap."""
    from logos_ir.passes.cuda.cost_model import launch_gaps
    from logos_ir.passes.cuda.host_plan import Gather, Launch, Reduce

    plan = build_program(ModelSpec.preset("tiny"), Cut.decode(64), 2, "bf16").plan
    gaps = iter(launch_gaps(plan))
    previous = None
    for step in plan.steps:
        if isinstance(step, Launch):
            after_collective = previous is None or isinstance(previous, (Reduce, Gather))
            expected = "launch_gap_s" if after_collective else "programmatic_gap_s"
            assert next(gaps) == expected
        previous = step
    assert sum(isinstance(s, Reduce) for s in plan.steps) == 2 * 2  # two a layer
    assert launch_gaps(plan).count("launch_gap_s") == 1 + 2 * 2 + 1  # the first, after each all-reduce and the gather


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA) is not installed here: ptxas's spills unseen")
def test_the_8b_decode_kernels_at_ctx_8192_compile_without_spills(plan, tmp_path) -> None:
    """The kernels the figures above are of, as printed (two layers: every distinct kernel of the 32), through
    ptxas with the runtime's flags: no kernel spills, so the bytes in flight the model counts are registers."""
    from logos_ir.passes.cuda.build import PTXAS_FLAGS, parse_ptxas

    spec = dataclasses.replace(ModelSpec.preset("llama-3.1-8b"), layers=2)
    source = build_program(spec, Cut.decode(8192), 1, "bf16").source
    cu = tmp_path / "kernels.cu"
    cu.write_text(source)
    command = ["nvcc", "-arch=sm_90", "-cubin", *PTXAS_FLAGS, "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"), str(cu)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    kernels = parse_ptxas(run.stderr + run.stdout)
    assert set(kernels) == set(plan.kernels)
    spilled = {
        name: (k["spill_stores"], k["spill_loads"])
        for name, k in kernels.items()
        if k["spill_stores"] or k["spill_loads"]
    }
    assert not spilled, spilled
