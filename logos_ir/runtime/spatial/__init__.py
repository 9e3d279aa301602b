"""The spatial lane's fabric simulator: it runs a build's `csl`-level module (`grid.mlir`, the module `layout.csl`
and `pe_program.csl` print) with the semantics of a Cerebras WSE-2 as its SDK documents them, and the host program
that drives it (`run.py`'s steps, as `memcpy_h2d`, `launch`, `memcpy_d2h`). This module holds the one error type
and the cycle costs every part counts; the parts are `state` (what they share), `fabric` (routes, colours, queues,
wavelets), `memory` (each element's arrays, memory DSDs, loads and stores, memcpy), `dsd` (the DSD operations),
`compiler` (the element program compiled into instructions), `elements` (the grid of elements and a launch run to
its end), `host` (a build read, and a decode step driven as run.py drives a CS-2) and `generator` (the `spatial`
backend's greedy generation).

- **The layout** is executed first (`passes/spatial/verify_grid.read_layout`): `@set_rectangle`, each element's
  `@set_tile_code` parameters, and every router's colour configuration (`@set_color_config`: the directions a
  colour's wavelets are taken from and sent to). From these the simulator follows each sender's wavelets from router
  to router; a router with no configuration for a colour arriving from a direction stops them there.
- **Elements** have their own memory: the program's arrays, allocated for every element (all run the same
  program), and an estimate of its code; an element over 48 KiB is refused when the program is loaded. A DSD
  reaching outside its array stops the run naming the element and the op.
- **Execution** is SIMT over elements: each element has its own program counter, call stack, activated and blocked
  local tasks, and clock; elements at the same instruction execute it together (numpy over those elements), so
  the P x P elements of a grid that run the same code move as one until their data makes them wait. A DSD
  operation does what the SDK documents for it (`@fmovs` copies, `@fadds`/`@fmuls`/`@fmaxs` are elementwise,
  `@fmacs(d, a, b, s)` is d = a + b * s, `@fmachs` the same with f16 b and s accumulated in f32, `@fs2h`/`@fh2s`
  convert); an operand that is a fabric input DSD reads wavelets from the element's queue for its colour (the
  element waits until they are there); a fabric output DSD sends one 32-bit wavelet per value along the route.
- **Tasks**: `@activate` marks a local task; when an element is idle it runs its activated, unblocked task of the
  lowest id; `@block`/`@unblock` hold a task back and release it. The host's `launch` runs an exported function on
  every element; the launch ends when each element has called memcpy's `unblock_cmd_stream`.
- **A step that cannot finish** (a receive with no wavelets coming, a send whose route is broken or whose
  receiver's queue stays full, a launch whose tasks never run) stops with an error naming an element, the colour
  and the op, never a hang.
- **What it runs** is a build's: `grid.mlir` and `host.json`, from a build folder or from the `spatial` compile
  target's build in memory, which the grid's static check (`passes/spatial/verify_grid.py`) has passed.
- **Cycles** are counted by the simulator as it runs, per element, from the per-op costs of `CYCLES` (see
  docs/spatial.md for their sources and assumptions): an element's clock advances by each op it runs; a receive
  waits for the wavelets' arrival (sender's clock + hops + one cycle per wavelet). A launch reaches element (x, y)
  after `CYCLES["launch"]` and the x + 3 hops from memcpy's west columns, where the element starts; a step's cycles
  are the latest element clock when the launch ends, from the launch's issue. A queue holds `QUEUE_DEPTH` wavelets:
  a longer message goes only while its receiver waits at the receive, its sender stalling until it is taken.
  memcpy's copies are counted apart (`memcpy_cycles`): one wavelet a cycle per channel, plus the hops across.
  `cycle_costs` sets some costs for the simulations loaded and run within it (a band's ends; the defaults after).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from logos_ir.errors import LogosError

CYCLES = {
    "scalar": 1,  # an integer or float op, a load, a store, a branch
    "divf": 1,  # an f32 division (arith.divf): counted as a scalar op by default, an assumption
    "dsd_setup": 1,  # @get_dsd, @increment_dsd_offset
    "dsd_element": 1,  # each element a DSD op processes (one per cycle)
    "math": 20,  # a <math> library call (exp, sqrt, sin, cos): an assumption
    "hop": 1,  # a wavelet crossing one router
    "call": 2,  # a call or a return
    "task_switch": 4,  # an idle element picking its next task: an assumption
    "launch": 100,  # the host's launch command decoded by memcpy before it leaves the west edge: an assumption
    "memcpy_wavelet": 1,  # memcpy moves one wavelet a cycle on each of its channels (--channels=1): an assumption
}

# memcpy's columns west of the program (the SDK examples' --fabric-offsets=4,1 with three of the four columns
# memcpy's): the hops a launch or a memcpy_h2d crosses before the program's column 0.
MEMCPY_WEST = 3

# The wavelets a colour's queue at an element holds before its sender stalls: the one published figure, csl-examples'
# pipeline-01-basic README ("The program stalls when size exceeds 14": the queues between memcpy's H2D and a PE).
# A message longer than the room left goes only when its receiver is at the receive and takes the wavelets as they
# come: the sender's op then ends no earlier than the receiver's start plus the wavelets the queue could not hold.
QUEUE_DEPTH = 14


class FabricError(LogosError):
    """A step that cannot finish, or a module the simulator cannot load."""


@contextmanager
def cycle_costs(costs: Mapping[str, float]) -> Iterator[None]:
    """The simulations loaded and run within it count `costs` in place of those `CYCLES` names (a band's low or
    high end: `bench/spatial_agreement.py`); the defaults are back when it ends. A name `CYCLES` lacks is refused."""
    unknown = sorted(set(costs) - set(CYCLES))
    if unknown:
        raise LogosError(f"no such cycle cost: {', '.join(unknown)} (the costs are {', '.join(CYCLES)})")
    saved = dict(CYCLES)
    CYCLES.update(costs)
    try:
        yield
    finally:
        CYCLES.clear()
        CYCLES.update(saved)
