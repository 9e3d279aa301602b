"""The D5005 cost model over the engine's loops (`engine_loops`, the loops `engine.cl` prints): their trip counts
and initiation intervals, the bursts each bank reader serves, and an estimate that follows the engine when the
engine changes.

Each figure is checked against something the model does not compute: the loops against the source the emitter
prints, the bursts against the words the bank readers really send on PoCL (and the spec's own sizes), the
estimate's drop against an edit of the engine that PoCL still runs to the same tokens (so the edited engine is a
real one, only slower on the card).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from logos_ir.author import written
from logos_ir.dialects import d5005
from logos_ir.generate import Generator
from logos_ir.parser import parse_program
from logos_ir.passes.d5005 import cost_model, engine_loops
from logos_ir.passes.d5005.emit_opencl import engine_source
from logos_ir.passes.d5005.engine_loops import Loop, Step
from logos_ir.program import Cut
from logos_ir.runtime.opencl import opencl_available
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_program
from logos_ir.weights import RandomWeights

NO_OPENCL = opencl_available()
needs_opencl = pytest.mark.usefixtures("opencl_device")


@pytest.fixture
def opencl_device() -> None:
    """The OpenCL CPU device the engine runs on: PoCL gives it and is a declared dependency, so a test fails without
    it rather than skipping."""
    if NO_OPENCL is not None:
        pytest.fail(f"no OpenCL CPU device ({NO_OPENCL}): install PoCL, `pip install pocl-binary-distribution`")


# Two edits an engineer could make to the engine's source: the matvec's row sum as one carried floating-point
# add (no shift register), and SiLU*mul one word a cycle instead of a bank word of sixteen; each with the same
# edit of the loops the model costs.
CARRIED_ADD = (
    "                shift[b][SHIFT_DEPTH] = shift[b][0] + sum;\n"
    "                UNROLL(SHIFT_DEPTH)\n"
    "                for (uint d = 0; d < SHIFT_DEPTH; d++) shift[b][d] = shift[b][d + 1];\n",
    "                shift[b][0] += sum;\n",
)
DEVECTORISED = (
    "    for (uint c = 0; c < n; c += OV) {\n        UNROLL(OV)\n        for (uint e = 0; e < OV; e++) {\n"
    "            if (c + e < n) {\n                float g",
    "    for (uint c = 0; c < n; c++) {\n        UNROLL(1)\n        for (uint e = 0; e < 1; e++) {\n"
    "            if (c + e < n) {\n                float g",
)


def carried_matvec(s: Step) -> list[Loop]:
    """The matvec with its row sum carried at distance 1 (CARRIED_ADD)."""
    load, rows = engine_loops.matvec(s)
    return [load, replace(rows, inner=tuple(replace(inner, carried=1) for inner in rows.inner))]


def scalar_silu_mul(s: Step) -> list[Loop]:
    """SiLU*mul one word an iteration (DEVECTORISED)."""
    n = s.field(d5005.W_ROWS)
    return [Loop("silu_mul.words", "for (uint c = 0; c < n; c++)", n)]


def lowered(spec: ModelSpec, ctx: int, weights: str = "bf16") -> d5005.ProgramOp:
    text, _ = written(spec, Cut.decode(ctx))
    return lower_program(parse_program(text.text, "<decode>"), weights)


def edited(source: str, edit: tuple[str, str]) -> str:
    assert source.count(edit[0]) == 1, "the engine's source no longer has the text this test edits"
    return source.replace(*edit)


@pytest.fixture(scope="module")
def one_b() -> d5005.ProgramOp:
    return lowered(ModelSpec.preset("llama-3.2-1b"), 2048)


def _every(loops: list[Loop] | tuple[Loop, ...]) -> list[Loop]:
    found = []
    for loop in loops:
        inner = loop.inner if loop.inner_of is None else loop.inner_of(0)
        found += [loop, *_every(inner)]
    return found


def test_the_loops_are_the_ones_the_source_prints(one_b: d5005.ProgramOp) -> None:
    """Each loop the model costs is printed under its mark with its header, and every mark of the source is one."""
    source = engine_source(one_b.identity.data, one_b.params)
    engine = cost_model.Engine.of(one_b.params)
    step = Step(engine.constants, [1] * d5005.INSTRUCTION_WORDS, 1, 2)
    stated = [loop for r in [*engine.compute.values(), *engine.readers.values()] for loop in _every(r(step))]
    for loop in stated:
        assert re.search(rf"/\* loop {re.escape(loop.name)} \*/\n\s*{re.escape(loop.header)}", source), loop.name
    assert sorted(loop.name for loop in stated) == sorted(re.findall(r"/\* loop ([\w.]+) \*/", source))
    assert engine.constants == {
        name: int(value) for name, value in re.findall(r"^#define (\w+) (\d+)$", source, flags=re.MULTILINE)
    }


def test_the_intervals(one_b: d5005.ProgramOp) -> None:
    engine = cost_model.Engine.of(one_b.params)
    step = Step(engine.constants, [1] * d5005.INSTRUCTION_WORDS, 1, 2)
    every = [loop for r in [*engine.compute.values(), *engine.readers.values()] for loop in _every(r(step))]
    assert [loop.name for loop in every if cost_model.initiation_interval(loop) > 1] == []  # one iteration a cycle
    words = engine_loops.matvec(step)[1].inner[0]
    assert words.name == "matvec.words" and words.carried == engine.constants["SHIFT_DEPTH"]  # a shift register
    assert cost_model.initiation_interval(replace(words, carried=1)) == cost_model.FP_LATENCY
    add = engine_loops.add(step)[0]
    assert cost_model.initiation_interval(replace(add, aliased=True)) == cost_model.ONCHIP_DEPENDENCE


def test_the_estimate_drops_when_a_loop_carries_an_add_or_loses_its_vector(one_b: d5005.ProgramOp) -> None:
    engine = cost_model.Engine.of(one_b.params)
    base = cost_model.estimate(one_b, engine=engine)
    carried = cost_model.estimate(one_b, engine=replace(engine, compute={**engine.compute, "matvec": carried_matvec}))
    slower = {**engine.compute, "silu_mul": scalar_silu_mul}
    scalar = cost_model.estimate(one_b, engine=replace(engine, compute=slower))
    assert base["fraction_of_roofline"] > 0.8
    # the matvec's 4 x 32 weights a cycle now wait FP_LATENCY cycles each: compute-bound, far below the banks
    assert carried["cycles_by_opcode"]["matvec"] > 5 * base["cycles_by_opcode"]["matvec"]
    assert carried["tokens_per_s"] < base["tokens_per_s"] / 4
    # SiLU*mul over 8192 words takes 8192 cycles a layer instead of 512
    assert scalar["cycles_by_opcode"]["silu_mul"] > 10 * base["cycles_by_opcode"]["silu_mul"]
    assert scalar["tokens_per_s"] < base["tokens_per_s"]
    assert carried["bytes_read_per_token"] == scalar["bytes_read_per_token"] == base["bytes_read_per_token"]


@needs_opencl
@pytest.mark.parametrize("edit", [CARRIED_ADD, DEVECTORISED], ids=["carried-add", "devectorised"])
def test_the_edited_engines_still_run_to_the_same_tokens(edit: tuple[str, str]) -> None:
    """The edits the model charges for are real engines: PoCL runs them to the reference's tokens."""
    from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
    from logos_ir.passes.d5005.emit_stream import encode_stream
    from logos_ir.runtime.d5005 import Engine

    spec = ModelSpec.preset("tiny")
    store = RandomWeights(spec, seed=5)
    program = lowered(spec, 64, "f32")
    source = edited(engine_source(program.identity.data, program.params), edit)
    engine = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, spec, store))
    expected = Generator(store).generate([3, 9], 6)
    predicted = [engine.step(t + 1, p) for p, t in enumerate([3, 9], start=1)][-1]
    got = []
    for position in range(3, 9):
        got.append(predicted - 1)
        predicted = engine.step(predicted, position)
    assert got == expected


@needs_opencl
def test_the_bursts_are_what_the_bank_readers_send() -> None:
    """The model's bursts per bank, read from the readers' loops, against the words the readers' kernels count
    as they send them on PoCL, instruction by instruction, at a position that is not a multiple of 4."""
    from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
    from logos_ir.passes.d5005.emit_stream import encode_instruction, encode_stream
    from logos_ir.runtime.d5005 import Engine

    spec = ModelSpec.preset("tiny")
    program = lowered(spec, 64)
    source = engine_source(program.identity.data, program.params)
    engine = Engine(
        source, encode_stream(program, image_bytes(program)), weight_image(program, spec, RandomWeights(spec))
    )
    model = cost_model.Engine.of(program.params)
    for position in range(1, 8):
        engine.step(position + 10, position)
    for index, op in enumerate(program.instructions()):
        word = encode_instruction(op, 64)
        bursts = cost_model.instruction_cost(model, word, 17, 7)["bursts"]
        assert bursts == _sent(engine, index, 17, 7), op.name


def _sent(engine: object, index: int, token: int, position: int) -> list[int]:
    """What the readers send for one instruction: a run of that instruction alone, counted by the kernels."""
    import pyopencl as cl

    sent = []
    for b, reader in enumerate(engine.readers):  # type: ignore[attr-defined]
        head = (engine.program, np.uint32(index), np.uint32(1))  # type: ignore[attr-defined]
        reader(engine.queue, (1,), (1,), *head, engine.banks[b], np.uint32(token), np.uint32(position),  # type: ignore[attr-defined]
               engine.fifos[b], engine.sent[b])  # type: ignore[attr-defined]  # fmt: skip
        count = np.zeros(1, dtype=np.uint32)
        cl.enqueue_copy(engine.queue, count, engine.sent[b])  # type: ignore[attr-defined]
        sent.append(int(count[0]))
    return sent


def test_8b_at_ctx_8192_reads_weights_and_each_kv_head_once_at_over_80_percent() -> None:
    spec = ModelSpec.preset("llama-3.1-8b")
    program = lowered(spec, 8192)
    cost = cost_model.estimate(program)
    # the spec's own sizes: every weight but the embedding (one row of it read) in bf16, and K and V of 8191
    # earlier positions for each of 8 KV heads of 32 layers (the position itself is on chip), 128 bf16 each
    per_layer = 2 * spec.hidden * (spec.heads + spec.kv_heads) * spec.head_dim + 3 * spec.hidden * spec.intermediate
    weights = spec.layers * (per_layer + 2 * spec.hidden) + spec.hidden + spec.vocab * spec.hidden
    assert cost["weight_bytes_per_token"] == 2 * (weights + spec.hidden)
    assert cost["kv_bytes_per_token"] == spec.layers * spec.kv_heads * 8191 * 2 * spec.head_dim * 2
    assert cost["roofline_tokens_per_s"] == pytest.approx(76.8e9 / cost["bytes_read_per_token"], rel=1e-3)
    assert 0.8 <= cost["fraction_of_roofline"] < cost["ddr_efficiency"]
    earlier = cost_model.estimate(program, position=2)  # attention reads one earlier position
    assert earlier["tokens_per_s"] > cost["tokens_per_s"]
