"""The fabric simulator as strict as the fabric: a colour's queue holds `QUEUE_DEPTH` wavelets, so a longer
message goes only while its receiver waits at the receive (its sender stalls until then, and a receiver that never
takes it deadlocks the step, named); the hardware's queues change no logit and cost no fewer cycles than unbounded
ones; the launch is costed (each element starts as it reaches it) and memcpy's copies are counted per step.
"""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects import csl

from logos_ir.passes.spatial.grid import ROW_BCAST
from logos_ir.passes.spatial.verify_grid import split_modules
from logos_ir.runtime.spatial import CYCLES, QUEUE_DEPTH, FabricError
from logos_ir.runtime.spatial.host import GridMachine
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights

SPEC = ModelSpec.preset("tiny")


@pytest.fixture(scope="module")
def lowered():  # type: ignore[no-untyped-def]
    from logos_ir.testing import lower_decode

    return lower_decode(SPEC, 16, "f32")


def _machine(module, host):  # type: ignore[no-untyped-def]
    machine = GridMachine(module, host, RandomWeights(SPEC, seed=7))
    machine.reset()
    return machine


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the broadcast never taken: a norm of what is there
def test_a_message_longer_than_the_queue_waits_for_its_receiver(lowered) -> None:  # type: ignore[no-untyped-def]
    """The row broadcast's receive removed: its wavelets are never taken, and once they are more than a queue holds
    the centre's send stalls for ever, named (an unbounded queue took them and the step ran on)."""
    module = lowered.module.clone()
    program, _ = split_modules(module)
    reduce = next(op for op in program.walk() if isinstance(op, csl.FuncOp) and op.sym_name.data == "reduce_row_fadds")
    taken = next(
        op
        for op in reduce.walk()
        if isinstance(op, csl.FmovsOp)
        and isinstance(op.ops[1].owner, csl.SetDsdLengthOp)
        and isinstance(op.ops[1].owner.op.owner, csl.GetFabDsdOp)
        and op.ops[1].owner.op.owner.fabric_color.value.data == ROW_BCAST
    )
    taken.detach()
    taken.erase()
    machine = _machine(module, lowered.host)
    with pytest.raises(
        FabricError, match=rf"colour {ROW_BCAST} holds {QUEUE_DEPTH} wavelets, not \d+, and the receiver"
    ):
        machine.step(4, 1)


def test_hardware_queues_change_no_logit_and_cost_no_fewer_cycles(lowered) -> None:  # type: ignore[no-untyped-def]
    strict = _machine(lowered.module, lowered.host)
    strict.step(4, 1)
    unbounded = _machine(lowered.module, lowered.host)
    unbounded.fabric.queue_depth = 1 << 30
    unbounded.step(4, 1)
    np.testing.assert_array_equal(strict.logits, unbounded.logits)
    assert strict.cycles[0] >= unbounded.cycles[0]


def test_the_launch_and_memcpy_are_costed(lowered, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    machine = _machine(lowered.module, lowered.host)
    machine.step(4, 1)
    monkeypatch.setitem(CYCLES, "launch", CYCLES["launch"] + 1000)
    machine.step(4, 1)  # the same step again (the cache's slot rewritten alike): only the launch dearer
    assert machine.cycles[1] == machine.cycles[0] + 1000
    (width, height), chunk = lowered.host["grid"], lowered.host["logits"]["chunk"]
    moved = height * chunk  # the head's logits from one column (the token and position ride in the launch)
    assert moved <= machine.memcpy_cycles[0] < moved + width * height  # no copy to every element a step
    machine.fabric.channels = 2
    machine.step(4, 1)
    assert machine.memcpy_cycles[2] < machine.memcpy_cycles[0]
    # the program's <time> stamps (step's start, the head task's end) time the step on the element, not the launch's
    # delivery: the dearer launch left them as they were, and they lie within the launch's cycles
    assert machine.timed[0] == machine.timed[1] == machine.timed[2]
    assert 0 < machine.timed[0] < machine.cycles[0]


def test_arrival_times_stay_exact_far_from_the_first_launch(lowered, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The queues keep each wavelet's arrival in f32 counted from its launch's start: a step that begins 2**25
    cycles in (where f32 holds only even numbers) costs what the first step cost, and a launch that spans 2**24
    cycles or more, past what f32 holds exactly, is refused by name rather than counted approximately."""
    machine = _machine(lowered.module, lowered.host)
    machine.step(4, 1)
    later = _machine(lowered.module, lowered.host)
    later.fabric.clock += float(1 << 25) + 1.0
    later.step(4, 1)
    assert later.cycles[0] == machine.cycles[0]
    np.testing.assert_array_equal(later.logits, machine.logits)
    monkeypatch.setitem(CYCLES, "launch", 1 << 24)
    with pytest.raises(FabricError, match="arrival in f32 from the launch's start, exact only under 16777216"):
        machine.step(4, 1)
