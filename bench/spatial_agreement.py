"""The spatial lane's figures, from the fabric simulator running the csl-level module (a script, not a test: the
embedded model's grid is 144 x 144 elements, about 9 s a simulated step here, so its runs take 3 to 20 minutes).

    python3 bench/spatial_agreement.py tokens [--new 16] [--image f32]    # greedy tokens against the reference
    python3 bench/spatial_agreement.py agreement [--steps 64]             # f16 teacher-forced next-token agreement
    python3 bench/spatial_agreement.py placement [--only 8b-8192] [--full-lines] [--costs low --costs high]
    python3 bench/spatial_agreement.py band RUN.json        # a low and a high --full-lines run: the band
    python3 bench/spatial_agreement.py sensitivity          # each cost alone on the 8B's largest small grid

`placement` gives each build's grid, memory per element, the share of elements working on each layer, and cycles
per token from layers simulated in full. The large grids (20,736 and 466,489 elements, 48 KiB each) cannot be
simulated with their tiles here, so: (1) up to nine smaller grids (at most 72 x 72) whose elements hold exactly the
tiles the large grid's hold and do its local work (`scaled`: same chunks of every vector, same softmax window,
same exponentials per element; only P and the lines differ) are simulated, one layer and two; (2) with
`--full-lines`, the large grid itself is simulated with a model of one-word chunks and the large model's attention
(`one_word_chunks`: its lines, segments, colours and attention's messages are the large grid's), and each small
grid's one-word model likewise; a layer at the large P is each small grid's layer plus what the one-word model's
layer gains from that grid to the large one (the reductions' latency on the large grid's own lines), the spread
over the small grids reported. Without `--full-lines` only a regression over the small grids (a + b hops + c
steps) is given, as a diagnostic: their few hops cannot carry it to the large grid. Figures go to
docs/benchmarks.md (the spatial lane's section), with the date and machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from logos_ir.errors import PassError
from logos_ir.generate import Generator
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.convert_logos_to_csl import memory_use
from logos_ir.program import Cut
from logos_ir.runtime.spatial import CYCLES, cycle_costs
from logos_ir.runtime.spatial.host import GridMachine, logits_read_cycles
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_decode
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import RandomWeights, WeightStore, open_model

PROMPT = "The capital of France is"
GRID_LIMIT = 72  # the largest grid simulated for the extrapolation (5,184 elements)
GRIDS = 9  # how many grids the fit uses (at most)
CLOCK_HZ = 1.1e9  # docs/spatial.md, "Cycles"
WAFERLLM_TOKENS_PER_S = 2700  # WaferLLM (OSDI 2025), Llama-3-8B decode on a WSE-2, as its paper reports it

# The band: each of the simulator's cycle costs (logos_ir.runtime.spatial.CYCLES) at its pessimistic value (the
# band's low end) and its optimistic one (the high end); docs/spatial.md ("Cycles") gives each one's source. A cost
# absent here is the same at both ends (its range is said there).
COSTS: dict[str, tuple[float, float]] = {
    "hop": (2, 1),
    "math": (150, 20),
    "divf": (60, 40),
    "launch": (1000, 100),
    "call": (4, 2),
    "task_switch": (10, 4),
    "dsd_setup": (2, 1),
}
CLOCKS_HZ = (0.85e9, 1.1e9)  # csl-examples' benchmarks (850 MHz); WaferLLM's launch_wse2.py (freq_ghz = 1.1)
# The host round trip beyond the wafer: memcpy's bandwidth a channel ("around 7Gbps" at most: csl-examples'
# bandwidth-test; 5 an assumption) gives memcpy's cycles a wavelet at the set's clock; each blocking command the
# host issues a token (run.py: the launch and the logits' memcpy_d2h) costs a TCP transaction ("about 200 us":
# the same), two a token at the low end, one at the high (the two issued nonblocking, which the runtime aggregates).
CHANNEL_GBPS = (5.0, 7.0)
TCP_TRANSACTION_S = 200e-6
TRANSACTIONS = (2, 1)


def cost_set(name: str) -> dict[str, float]:
    """The cycle costs of a named set: `default` (the simulator's), `low` (every cost in COSTS at its pessimistic
    value, memcpy's wavelet at the low channel bandwidth and clock) or `high` (the optimistic ones)."""
    if name == "default":
        return dict(CYCLES)
    end = {"low": 0, "high": 1}[name]
    memcpy = CLOCKS_HZ[end] * 32 / (CHANNEL_GBPS[end] * 1e9)  # a 32-bit wavelet's cycles on one channel
    return {**CYCLES, **{cost: values[end] for cost, values in COSTS.items()}, "memcpy_wavelet": memcpy}


def clock_of(name: str) -> float:
    return {"default": CLOCK_HZ, "low": CLOCKS_HZ[0], "high": CLOCKS_HZ[1]}[name]


def host_seconds(name: str) -> float:
    """The host's TCP transactions a token (none in the simulator's `default` set: it counts the wafer's cycles)."""
    return 0.0 if name == "default" else TRANSACTIONS[{"low": 0, "high": 1}[name]] * TCP_TRANSACTION_S


def prompt_ids(store: WeightStore) -> list[int]:
    return Tokenizer.from_store(store).encode(PROMPT)  # type: ignore[attr-defined]


def tokens(image: str, new: int) -> dict[str, Any]:
    store = open_model(None)
    prompt = prompt_ids(store)
    expected = Generator(store).generate(prompt, new)
    started = time.perf_counter()
    ctx = len(prompt) + new
    lowered = lower_decode(store.spec, ctx, image)
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    sequence, out = list(prompt), []
    for position in range(1, len(prompt) + new):
        token = sequence[position - 1] if position <= len(prompt) else out[-1]
        before = time.perf_counter()
        predicted = machine.step(token + 1, position) - 1
        if position >= len(prompt):
            out.append(predicted)
        _progress(position, predicted, None, time.perf_counter() - before, machine.cycles[-1])
    steps = len(prompt) + new - 1
    return {
        "image": image,
        "prompt_tokens": len(prompt),
        "new": new,
        "equal": out == expected,
        "tokens": out,
        "reference": expected,
        "grid": list(lowered.plan.grid),
        "cycles_per_step": machine.cycles,
        "steps": steps,
        "seconds": round(time.perf_counter() - started, 1),
        "seconds_per_step": round((time.perf_counter() - started) / steps, 2),
    }


def _progress(position: int, got: int, expected: int | None, seconds: float, cycles: float) -> None:
    """One line a step on stderr (a long run's log shows how far it is and how fast it goes)."""
    mark = "" if expected is None else (" agree" if got == expected else f" differs (reference {expected})")
    print(f"step {position}: token {got}{mark}, {seconds:.2f} s, {cycles:.0f} cycles", file=sys.stderr, flush=True)


def agreement(steps: int) -> dict[str, Any]:
    store = open_model(None)
    prompt = prompt_ids(store)
    continuation = Generator(store).generate(prompt, steps)
    sequence = prompt + continuation
    ctx = len(sequence)
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    lowered = lower_decode(store.spec, ctx, "f16")
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    agree = positions = 0
    started = time.perf_counter()
    simulated = 0.0
    disagreements = []
    for position, token in enumerate(sequence[:-1], start=1):
        run = {names["token"]: np.array([token + 1]), names["position"]: np.array([position])}
        expected = int(reference.run(**run)[0])
        before = time.perf_counter()
        got = machine.step(token + 1, position)
        simulated += time.perf_counter() - before
        if position >= len(prompt):
            agree += got == expected
            positions += 1
            if got != expected:
                disagreements.append({"position": position, "spatial": got - 1, "reference": expected - 1})
        _progress(position, got - 1, expected - 1, time.perf_counter() - before, machine.cycles[-1])
    steps = len(sequence) - 1
    return {"agree": agree, "positions": positions, "share": agree / positions, "grid": list(lowered.plan.grid),
            "ctx": ctx, "steps_simulated": steps, "disagreements": disagreements,
            "seconds": round(time.perf_counter() - started, 1),
            "simulator_seconds_per_step": round(simulated / steps, 2)}  # fmt: skip


def scaled(spec: ModelSpec, plan: g.GridPlan, grid: int | tuple[int, int]) -> tuple[ModelSpec, int] | None:
    """A model (and its KV copies) whose W x H grid (P x P for a whole number) holds exactly the tiles `plan`'s
    elements hold, and does the same local work (None if no such model on that grid): the same chunk of every vector
    (hidden over the width; intermediate, vocabulary, the cached KV features and so the queries over the height),
    the same softmax window and, where attention's scores are reduced within a KV head's column segment
    (`scores_local`), the same exponentials per element. With `scores_local` the small model has one KV head (so its
    column is one segment, as long as the large grid's segments are) read by the `group` query heads the large
    grid's elements hold; otherwise its heads and KV heads are the large model's."""
    width, height = (grid, grid) if isinstance(grid, int) else grid
    hc, kc = plan.chunk(plan.hidden, "col"), plan.kv_chunk
    common = dict(
        hidden=hc * width,
        intermediate=plan.chunk(plan.intermediate, "row") * height,
        vocab=plan.chunk(plan.vocab, "row") * height,
    )
    if plan.scores_local:
        model, copies = replace(spec, heads=plan.group, kv_heads=1, head_dim=kc * height, **common), 1
    else:
        head_dim = kc * height / (spec.kv_heads * plan.kv_copies)
        if head_dim != int(head_dim) or int(head_dim) % 2:
            return None
        model, copies = replace(spec, head_dim=int(head_dim), **common), plan.kv_copies
    small = plan_like(model, plan, (width, height), copies)
    mine = (small.kv_chunk, small.query_chunk, small.window, small.scores_local, exponentials(small))
    if mine != (plan.kv_chunk, plan.query_chunk, plan.window, plan.scores_local, exponentials(plan)):
        return None
    return model, copies


def exponentials(plan: g.GridPlan) -> int:
    """The exponentials an element computes a layer: its window's over its positions, or (`scores_local`) its
    share of its KV head's segment's, the shortest segment's share."""
    items = plan.window * plan.slots
    if not plan.scores_local:
        return items
    length, count, _ = plan.line("col")
    return -(-items // min(length, plan.height - (count - 1) * length))


def plan_like(spec: ModelSpec, plan: g.GridPlan, grid: int | tuple[int, int], copies: int) -> g.GridPlan:
    """The plan of `spec` on `grid` with as many KV slots an element as `plan`'s (its cache over slots x width)."""
    from logos_ir.passes.spatial.grid import GridPlan

    width = grid if isinstance(grid, int) else grid[0]
    return GridPlan.of(spec, plan.slots * width, plan.image, grid, copies)


def step_cycles(spec: ModelSpec, ctx: int, image: str, p: int | tuple[int, int], layers: int, copies: int) -> float:
    """One decode step's cycles (from the launch's issue to its end) of `spec` cut to `layers` layers, on a grid of
    `p`, lowered and simulated in full at the last position (a full cache)."""
    model = replace(spec, layers=layers)
    before = time.perf_counter()
    lowered = lower_decode(model, ctx, image, p, memory=1 << 30, copies=copies)
    machine = GridMachine(lowered.module, lowered.host, RandomWeights(model, seed=1), layout=_layout(lowered))
    machine.reset()
    loaded = time.perf_counter()
    machine.step(5, ctx)  # the last position: a full cache
    cycles = machine.cycles[-1]
    del machine, lowered
    gc.collect()  # a large grid's machine (its elements' queues and arrays) gone before the next is built
    print(f"  {grid_name(p)}, {layers} layer(s): {cycles:.0f} cycles "
          f"(lowered and loaded {loaded - before:.0f} s, step {time.perf_counter() - loaded:.0f} s)",
          file=sys.stderr, flush=True)  # fmt: skip
    return cycles


def grid_name(grid: int | tuple[int, int]) -> str:
    width, height = (grid, grid) if isinstance(grid, int) else grid
    return f"{width} x {height}"


_LAYOUTS: dict[str, Any] = {}  # each grid's layout, read once: the same for one layer and two, for every cost


def _layout(lowered: Any) -> Any:
    """The lowered module's layout as the simulator reads it, read once for each distinct layout module (reading
    runs the layout's loops for every element: most of a large grid's load)."""
    from logos_ir.passes.spatial.verify_grid import layout_params, read_layout, split_modules

    _, layout_module = split_modules(lowered.module)
    key = str(layout_module) + json.dumps(layout_params(lowered.host), sort_keys=True)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = read_layout(layout_module, layout_params(lowered.host))
    return _LAYOUTS[key]


def layer_and_ends(
    spec: ModelSpec, ctx: int, image: str, grid: int | tuple[int, int], copies: int
) -> tuple[float, float]:
    """(a layer, the embedding and head with the launch) of a step: one layer's and two layers' steps simulated."""
    one = step_cycles(spec, ctx, image, grid, 1, copies)
    two = step_cycles(spec, ctx, image, grid, 2, copies)
    return two - one, 2 * one - two


def line_terms(p: int, shape: tuple[int, int, int], centre: int, broadcast: bool = True) -> tuple[int, int]:
    """(hops, steps) of one reduction along a line of P in segments `shape` (grid.segments), from the mapping's
    description: its phase-one chains take the longest half-segment's element steps (a hop and an op each), its
    phase two the most centres on one side (an op each) and the hops from the farthest centre to the line's centre,
    its broadcast the hops from there to the line's farthest element."""
    length, count, middle = shape
    far = max(centre, p - 1 - centre)
    steps = length // 2 + max(middle, count - 1 - middle)
    return (2 * far if broadcast else far), steps


def reduction_terms(plan: g.GridPlan) -> dict[str, tuple[int, int]]:
    """(hops, steps) summed over a layer's reductions (six along a row: both norms' sums, q/k/v, softmax's maximum,
    its sums with the weighted values, gate/up; two down a column: the output projection, down; attention's scores
    within a KV head's column segment, or down the whole column) and over the embedding's (a column) and head's (a
    row, no broadcast)."""
    row = line_terms(plan.p, plan.line("row"), plan.line_centre("row"))
    col = line_terms(plan.p, plan.line("col"), plan.line_centre("col"))
    if plan.scores_local:
        half = plan.line("col")[0] // 2
        scores = (half, half)
    else:
        scores = col
    layer = tuple(6 * r + 2 * c + s for r, c, s in zip(row, col, scores, strict=True))
    head = line_terms(plan.p, plan.line("row"), plan.line_centre("row"), broadcast=False)
    ends = tuple(c + h for c, h in zip(col, head, strict=True))
    return {"layer": layer, "ends": ends}  # type: ignore[dict-item]


def _fit(terms: list[tuple[int, int]], cycles: list[float]) -> np.ndarray:
    """Least squares: cycles = a + b hops + c steps."""
    design = np.array([[1.0, h, s] for h, s in terms])
    solution, *_ = np.linalg.lstsq(design, np.array(cycles, dtype=float), rcond=None)
    return solution


def _at(fit: np.ndarray, terms: tuple[int, int]) -> float:
    return float(fit[0] + fit[1] * terms[0] + fit[2] * terms[1])


def extrapolated(spec: ModelSpec, plan: g.GridPlan, image: str) -> dict[str, Any]:
    """Cycles per token at plan.p from layers simulated in full on smaller grids of the same tiles (`scaled`): a
    layer's cycles fitted as a + b hops + c steps over the grids (`reduction_terms`: its local work does not depend
    on P; its reductions' latency is their hops and element steps), evaluated at plan.p; the embedding's and head's
    likewise. Only grids whose attention reduces its scores as the large grid's does (`scores_local`) are used."""
    candidates = [p for p in range(4, GRID_LIMIT + 1) if scaled(spec, plan, p) is not None]
    if len(candidates) > GRIDS:  # spread over the range: the fit's slope is read from the widest span
        candidates = [candidates[round(i * (len(candidates) - 1) / (GRIDS - 1))] for i in range(GRIDS)]
    if len(candidates) < 4:
        return {"extrapolated": None, "why": "fewer than four grids up to GRID_LIMIT hold exactly this grid's tiles"}
    rows: list[tuple[int, float, float]] = []
    shapes: list[dict[str, Any]] = []
    for p in candidates:
        found = scaled(spec, plan, p)
        assert found is not None
        model, copies = found
        ctx = plan.slots * p
        one = step_cycles(model, ctx, image, p, 1, copies)
        two = step_cycles(model, ctx, image, p, 2, copies)
        rows.append((p, two - one, one - (two - one)))  # (P, a layer, the embedding and head)
        small = plan_like(model, plan, p, copies)
        shapes.append({"row": small.line("row"), "col": small.line("col"), "terms": reduction_terms(small)})
    layer_terms = [shape["terms"]["layer"] for shape in shapes]
    end_terms = [shape["terms"]["ends"] for shape in shapes]
    layer_fit = _fit(layer_terms, [r[1] for r in rows])
    ends_fit = _fit(end_terms, [r[2] for r in rows])
    residual = max(abs(_at(layer_fit, t) - r[1]) for t, r in zip(layer_terms, rows, strict=True))
    big = reduction_terms(plan)
    # the fit's error where it matters: each grid left out in turn, the others' fit evaluated at the large P
    spread = []
    for i in range(len(rows)):
        keep = [j for j in range(len(rows)) if j != i]
        fit = _fit([layer_terms[j] for j in keep], [rows[j][1] for j in keep])
        spread.append(_at(fit, big["layer"]))
    layer = _at(layer_fit, big["layer"])
    ends = _at(ends_fit, big["ends"])
    total = ends + spec.layers * layer
    low, high = ends + spec.layers * min(spread), ends + spec.layers * max(spread)
    return {
        "simulated_grids": [
            {
                "p": p,
                "grid": [p, p],
                "layer_cycles": c,
                "embedding_and_head_cycles": e,
                "row_segments": shape["row"],
                "col_segments": shape["col"],
                "layer_hops_steps": shape["terms"]["layer"],
            }
            for (p, c, e), shape in zip(rows, shapes, strict=True)
        ],  # fmt: skip
        "row_segments": plan.line("row"),
        "col_segments": plan.line("col"),
        "layer_hops_steps": big["layer"],
        # a diagnostic only: the small grids span too few hops to carry a fit to the large grid (see the leave-one-out
        # spread); the estimate is `full_lines`'
        "regression": {
            "layer_fit_a_hops_steps": [round(float(v), 3) for v in layer_fit],
            "fit_max_error_cycles": round(residual, 1),
            "layer_cycles_leave_one_out": [round(v) for v in spread],
            "layer_cycles": round(layer),
            "tokens_per_s": round(CLOCK_HZ / total, 1),
            "tokens_per_s_leave_one_out_range": [round(CLOCK_HZ / high, 1), round(CLOCK_HZ / low, 1)],
        },
    }


def one_word_chunks(spec: ModelSpec, grid: int | tuple[int, int]) -> ModelSpec:
    """The model with one word a chunk on a W x H grid (P x P for a whole number: its hidden size W, its
    intermediate and vocabulary sizes H) and its attention as it is: on the large grid, the same reductions (lines,
    segments, colours, messages of attention) with tiles small enough to simulate 679,000 elements here."""
    width, height = (grid, grid) if isinstance(grid, int) else grid
    return replace(spec, hidden=width, intermediate=height, vocab=height)


def full_lines(spec: ModelSpec, plan: g.GridPlan, image: str, grids: list[dict[str, Any]]) -> dict[str, Any]:
    """The large grid's reductions simulated in full: a model with one-word chunks (`one_word_chunks`) on the
    large grid itself (W x H, the build's), one layer and two; the same on each small grid (its model's attention,
    one-word chunks). A layer's cycles on the large grid are then, for each small grid, the small grid's simulated
    layer (the large grid's tiles and local work) plus what the one-word model's layer gains from the small grid to
    the large one (the reductions' latency on the large grid's own lines): the figure and its spread over the small
    grids. The embedding and head (with the launch) likewise."""
    big = one_word_chunks(spec, plan.grid)
    big_layer, big_ends = layer_and_ends(big, plan.ctx, image, plan.grid, plan.kv_copies)
    layers, ends = [], []
    for row in grids:
        grid = tuple(row["grid"])
        found = scaled(spec, plan, grid)  # type: ignore[arg-type]
        assert found is not None
        model, copies = found
        small = one_word_chunks(model, grid)  # type: ignore[arg-type]
        layer, end = layer_and_ends(small, plan.slots * grid[0], image, grid, copies)  # type: ignore[arg-type]
        layers.append(row["layer_cycles"] + big_layer - layer)
        ends.append(row["embedding_and_head_cycles"] + big_ends - end)
    per_token = [e + spec.layers * c for e, c in zip(ends, layers, strict=True)]
    mean = float(np.mean(per_token))
    return {
        "one_word_model_on_the_large_grid": {"layer_cycles": big_layer, "embedding_and_head_cycles": big_ends},
        "layer_cycles_by_small_grid": [round(v) for v in layers],
        "layer_cycles": round(float(np.mean(layers))),
        "cycles_per_token": round(mean),
        "cycles_per_token_range": [round(min(per_token)), round(max(per_token))],
    }


def rectangle_grids(spec: ModelSpec, plan: g.GridPlan, most: int = GRIDS) -> list[tuple[int, int]]:
    """The small grids for a W x H plan, chosen as `extrapolated` chooses squares: each height up to GRID_LIMIT with
    the width that keeps the plan's proportions (so a small grid's rows and columns stand to each other as the large
    grid's do) and whose elements hold exactly the plan's tiles (`scaled`), at most `most` spread over the range."""
    found = []
    for height in range(4, GRID_LIMIT + 1):
        width = max(2, round(height * plan.width / plan.height))
        if scaled(spec, plan, (width, height)) is not None:
            found.append((width, height))
    if len(found) > most:
        found = [found[round(i * (len(found) - 1) / (most - 1))] for i in range(most)] if most > 1 else found[:1]
    return found


def small_grids(spec: ModelSpec, plan: g.GridPlan, image: str, grids: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Each small grid's layer and ends, its model holding the large grid's tiles (`scaled`), simulated in full."""
    rows = []
    for grid in grids:
        found = scaled(spec, plan, grid)
        assert found is not None
        model, copies = found
        layer, ends = layer_and_ends(model, plan.slots * grid[0], image, grid, copies)
        small = plan_like(model, plan, grid, copies)
        rows.append({"grid": list(grid), "layer_cycles": layer, "embedding_and_head_cycles": ends,
                     "row_segments": small.line("row"), "col_segments": small.line("col")})  # fmt: skip
    return rows


def rectangle(spec: ModelSpec, plan: g.GridPlan, image: str, most: int = GRIDS) -> dict[str, Any]:
    """A W x H build's cycles a token: `full_lines` over the small grids `rectangle_grids` chooses."""
    grids = rectangle_grids(spec, plan, most)
    if len(grids) < 2:
        return {"full_lines": None, "why": "fewer than two grids up to GRID_LIMIT hold exactly this grid's tiles"}
    rows = small_grids(spec, plan, image, grids)
    return {"simulated_grids": rows, "row_segments": plan.line("row"), "col_segments": plan.line("col"),
            "full_lines": full_lines(spec, plan, image, rows)}  # fmt: skip


def placement(
    name: str | None, ctx: int, image: str = "f16", full: bool = False, costs: str = "default", most: int = GRIDS
) -> dict[str, Any]:
    """One build's figures with the simulator's cycle costs at `costs` (`COSTS`: `default`, or a band's `low` end
    with every constant at its pessimistic value, `high` at its optimistic one)."""
    with cycle_costs(cost_set(costs)):
        report = _placement(name, ctx, image, full, most)
        report["costs"] = {"set": costs, **cost_set(costs), "clock_hz": clock_of(costs), "host_s": host_seconds(costs)}
        round_trip(report, costs)
    return report


def _placement(name: str | None, ctx: int, image: str, full: bool, most: int) -> dict[str, Any]:
    from logos_ir.models import ModelSource
    from logos_ir.passes.spatial.build import working_share

    spec = ModelSource.resolve(name).spec
    try:
        lowered = lower_decode(spec, ctx, image)
    except PassError as error:  # the build refused (the 8B: the high end of its memory band, docs/spatial.md)
        return {"model": name or "smollm2-135m (embedded)", "ctx": ctx, "image": image, "refused": error.message}
    plan = lowered.plan
    started = time.perf_counter()
    shares = {n: round(working_share(w, plan.grid), 4) for n, w in plan.weights.items() if w.kind == "matrix"}
    report = {
        "model": name or "smollm2-135m (embedded)",
        "ctx": ctx,
        "image": image,
        "grid": f"{plan.width} x {plan.height}",
        "elements": plan.width * plan.height,
        "share_of_wse2": round(plan.width * plan.height / (757 * 996), 4),
        "working_share_per_layer": min(shares.values()),
        "working_share_by_projection": shares,
        "working_share_weighted_by_parameters": round(weighted_share(spec, shares), 4),
        "kv_copies": plan.kv_copies,
        "kv_slots_per_element": plan.slots,
        "exponentials_per_element_per_layer": exponentials(plan),
        "memory_per_element": memory_use(lowered),
        "logits_read_cycles": logits_read_cycles(lowered.host),
    }
    if plan.width != plan.height:  # a rectangle: small grids of its proportions, the large grid's one-word model
        if full:
            report.update(rectangle(spec, plan, image, most))
        report["seconds"] = round(time.perf_counter() - started, 1)
        return report
    report.update(extrapolated(spec, plan, image))
    if full and report.get("simulated_grids"):
        report["full_lines"] = full_lines(spec, plan, image, report["simulated_grids"])
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def round_trip(report: dict[str, Any], costs: str) -> None:
    """Tokens/s of the composed step three ways, at the cost set's clock: the wafer's step alone (from the launch's
    issue to its end: the launch's cost within it), with the logits' read (`logits_read_cycles`, memcpy's: the
    simulator's host round trip) and with the host's TCP transactions (`host_seconds`)."""
    if "logits_read_cycles" not in report:
        return
    clock, read, host = clock_of(costs), report["logits_read_cycles"], host_seconds(costs)
    # whatever the step costs, a token takes at least the logits' read and the host's transactions
    report["host_round_trip"] = {"logits_read_s": read / clock, "host_s": host,
                                 "tokens_per_s_at_most": round(1.0 / (read / clock + host), 1)}  # fmt: skip
    composed = report.get("full_lines")
    if not composed:
        return
    cycles, (fewest, most) = composed["cycles_per_token"], composed["cycles_per_token_range"]

    def rate(step: float, extra: float = 0.0, seconds: float = 0.0) -> float:
        return round(1.0 / ((step + extra) / clock + seconds), 1)

    report["tokens_per_s"] = {
        "wafer_step": rate(cycles),
        "with_the_logits_read": rate(cycles, read),
        "with_the_host_transactions": rate(cycles, read, host),
        "spread_over_small_grids_with_the_host_transactions": [rate(most, read, host), rate(fewest, read, host)],
    }
    report["seconds_a_token"] = {"wafer_step": cycles / clock, "logits_read": read / clock, "host": host}


def sensitivity(name: str | None, ctx: int, image: str = "f16") -> dict[str, Any]:
    """Which cost moves the wafer's step most: the largest small grid of the build's tiles (`rectangle_grids` or the
    squares `extrapolated` takes), simulated in full with every cost at the high end and then each cost of COSTS
    alone at its low-end value; a token's cycles (every layer as that grid's, its ends) for each. The large grid's
    lines come on top (`full_lines`); this is the part of the step its tiles' local work and short lines take."""
    from logos_ir.models import ModelSource

    spec = ModelSource.resolve(name).spec
    plan = lower_decode(spec, ctx, image).plan
    grids = rectangle_grids(spec, plan) if plan.width != plan.height else [(p, p) for p in range(72, 3, -1)
                                                                           if scaled(spec, plan, p)][:1]  # fmt: skip
    grid = grids[-1]
    found = scaled(spec, plan, grid)
    assert found is not None
    model, copies = found

    def token(costs: dict[str, float]) -> float:
        with cycle_costs(costs):
            layer, ends = layer_and_ends(model, plan.slots * grid[0], image, grid, copies)
        return ends + spec.layers * layer

    base = token(cost_set("high"))
    moved = {cost: round(token({**cost_set("high"), cost: values[0]}) - base) for cost, values in COSTS.items()}
    return {"model": name, "ctx": ctx, "grid": list(grid), "cycles_a_token_at_the_high_end": round(base),
            "added_by_each_cost_at_its_low_end": moved,
            "all_at_the_low_end": round(token(cost_set("low")))}  # fmt: skip


def band(files: list[str]) -> dict[str, Any]:
    """The band from a `low` and a `high` placement run (their JSON, `placement --costs low|high --full-lines`): the
    simulated step of each as it ran (its costs checked against COSTS), the host round trip recomputed with the
    host constants above from the build's own host plan (lowered again: the logits' column and chunk)."""
    runs = {}
    for path in files:
        with open(path) as handle:
            data = json.load(handle)
        for report in data["result"]:
            if "costs" in report and report.get("full_lines"):
                runs[report["costs"]["set"]] = (report, data)
    if set(runs) != {"low", "high"}:
        raise SystemExit(f"band: needs a low and a high placement run with --full-lines, got {sorted(runs)}")
    ends = {}
    for name, (report, data) in runs.items():
        simulated = {cost: report["costs"][cost] for cost in COSTS}
        if simulated != {cost: cost_set(name)[cost] for cost in COSTS}:
            raise SystemExit(f"band: the {name} run simulated {simulated}, not COSTS' {name} end")
        from logos_ir.models import ModelSource

        lowered = lower_decode(ModelSource.resolve(report["model"]).spec, report["ctx"], report["image"])
        with cycle_costs(cost_set(name)):
            report["logits_read_cycles"] = logits_read_cycles(lowered.host)
        report["costs"] = {"set": name, **cost_set(name), "clock_hz": clock_of(name), "host_s": host_seconds(name)}
        round_trip(report, name)
        ends[name] = {key: report[key] for key in ("grid", "costs", "logits_read_cycles", "full_lines",
                                                   "tokens_per_s", "seconds_a_token", "seconds")}  # fmt: skip
        ends[name]["run"] = {"seconds": data["seconds"], "load_average_at_end": data["load_average_at_end"]}
    return {"model": runs["low"][0]["model"], "ctx": runs["low"][0]["ctx"], "low": ends["low"], "high": ends["high"],
            "waferllm_tokens_per_s": WAFERLLM_TOKENS_PER_S}  # fmt: skip


def weighted_share(spec: ModelSpec, shares: dict[str, float]) -> float:
    """The projections' working shares weighted by their parameters (a layer's multiply-accumulates)."""
    features, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    inter = spec.intermediate
    sizes = {"query_weight": features, "key_weight": kv, "value_weight": kv, "output_weight": features,
             "gate_weight": inter, "up_weight": inter, "down_weight": inter}  # fmt: skip
    total = sum(sizes[n] for n in shares if n in sizes)
    return sum(shares[n] * sizes[n] for n in shares if n in sizes) / total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["tokens", "agreement", "placement", "band", "sensitivity"])
    parser.add_argument("runs", nargs="*", help="band: the low and high placement runs' JSON")
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--image", default="f32")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--full-lines", action="store_true",
                        help="placement: also the large grid itself, one-word chunks (minutes)")  # fmt: skip
    parser.add_argument(
        "--only", action="append", choices=["smollm2", "8b-2048", "8b-8192"], help="placement: one build"
    )
    parser.add_argument("--costs", choices=["default", "low", "high"], action="append",
                        help="placement: the cycle costs (COSTS: a band end; each one given is run)")  # fmt: skip
    parser.add_argument("--grids", type=int, default=GRIDS, help="placement: at most this many small grids")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.what == "tokens":
        result: Any = tokens(args.image, args.new)
    elif args.what == "agreement":
        result = agreement(args.steps)
    elif args.what == "band":
        result = band(args.runs)
    elif args.what == "sensitivity":
        result = sensitivity("llama-3.1-8b", 8192)
    else:
        which = {"smollm2": (None, 2048), "8b-2048": ("llama-3.1-8b", 2048), "8b-8192": ("llama-3.1-8b", 8192)}
        result = [placement(*which[w], full=args.full_lines, costs=costs, most=args.grids)
                  for w in (args.only or list(which)) for costs in (args.costs or ["default"])]  # fmt: skip
        result.append({"waferllm_tokens_per_s": WAFERLLM_TOKENS_PER_S})
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "load_average_at_end": [round(v, 2) for v in os.getloadavg()], "result": result,
                      "seconds": round(time.perf_counter() - started, 1)}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
