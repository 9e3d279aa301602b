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
from pathlib import Path

import numpy as np
import pytest

from logos_ir.author import written
from logos_ir.dialects import d5005
from logos_ir.generate import Generator
from logos_ir.parser import parse_program
from logos_ir.passes.d5005 import cost_model
from logos_ir.passes.d5005.emit_opencl import engine_source
from logos_ir.passes.d5005.engine_loops import Loop, Step
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_program
from logos_ir.weights import RandomWeights

needs_opencl = pytest.mark.usefixtures("opencl_device")


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


# The four edits, each of which the card would pay for: the matvec's 32-term sum left a loop (a carried
# add of 32 steps), its bank loop left a loop (a channel index known only at run time), channels of depth 1, and the
# attention's accumulators (updated through memory SLOT_DISTANCE iterations apart) told they have no dependence.
SERIAL_SUM = (
    "UNROLL(VECTOR_WIDTH)\n                    for (uint e = 0; e < VECTOR_WIDTH; e++) sum +=",
    "for (uint e = 0; e < VECTOR_WIDTH; e++) sum +=",
)
SERIAL_BANKS = (
    "        /* loop matvec.words */\n        for (uint c = 0; c < words; c++) {\n            UNROLL(BANKS)\n",
    "        /* loop matvec.words */\n        for (uint c = 0; c < words; c++) {\n",
)
SHALLOW_CHANNELS = ("#define CHANNEL_DEPTH 512", "#define CHANNEL_DEPTH 1")
BARE_IVDEP = ("IVDEP_SAFELEN(SLOT_DISTANCE)\n", "IVDEP\n")
FOUR_EDITS = [SERIAL_SUM, SERIAL_BANKS, SHALLOW_CHANNELS, BARE_IVDEP]


def lowered(spec: ModelSpec, ctx: int, weights: str = "bf16") -> d5005.ProgramOp:
    text, _ = written(spec, Cut.decode(ctx))
    return lower_program(parse_program(text.text, "<decode>"), weights)


def edited(source: str, edit: tuple[str, str]) -> str:
    assert source.count(edit[0]) == 1, "the engine's source no longer has the text this test edits"
    return source.replace(*edit)


@pytest.fixture(scope="module")
def one_b() -> d5005.ProgramOp:
    return lowered(ModelSpec.preset("llama-3.2-1b"), 2048)


@pytest.fixture(scope="module")
def printed(one_b: d5005.ProgramOp) -> tuple[str, cost_model.Engine, dict]:
    """The engine as the emitter prints it for the 1B, read once, and its band."""
    source = engine_source(one_b.identity.data, one_b.params)
    engine = cost_model.Engine.read(source)
    return source, engine, cost_model.band(one_b, engine)


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


def test_what_aoc_would_report_of_the_printed_engine(printed: tuple[str, cost_model.Engine, dict]) -> None:
    """The reader's view of the engine as printed, against counts taken from the constants alone."""
    _, engine, _ = printed
    c, loops = engine.constants, engine.analysis.loops
    words = loops["matvec.words"]
    assert words.carried_fp == [c["SHIFT_DEPTH"]] and words.channels == set(range(c["BANKS"]))  # a shift register
    assert len([s for s in words.sites if s.array == "vector"]) == c["BANKS"] * c["VECTOR_WIDTH"]
    rows = loops["attention.rows"]  # one pass: each key row's scores, then its values, the four banks a cycle
    assert rows.carried_memory == [c["SLOT_DISTANCE"]]  # the accumulators, under ivdep safelen(SLOT_DISTANCE)
    assert rows.carried_fp == [c["SHIFT_DEPTH"]] * 2 and rows.channels == set(range(c["BANKS"]))  # max and sum
    assert {s.array for s in rows.sites} == {"queries", "acc"}  # the pass touches only its own two arrays
    assert engine.analysis.source.channel_depth == c["CHANNEL_DEPTH"]
    assert engine.analysis.banks["vector"] == c["BURST_BYTES"] // 4  # known modulo a bank word of floats
    assert engine.analysis.arbitrated["vector"] == set()  # its copies fit the M20K budget
    for array in d5005.ARRAYS:  # each kind's array banked a word a bank over a bank word, every site's bank known
        assert engine.analysis.banks[array] == c["BURST_BYTES"] // 4 and engine.analysis.arbitrated[array] == set()
    ii = {name: engine.iteration(name, cost_model.LOW) for name in loops}
    assert ii["matvec.words"] == 1 and ii["read_matvec.words"] == 1
    assert ii["attention.rows"] == 1  # each of its sites has its port: the pass streams a word of each bank a cycle
    assert set(ii.values()) == {1}  # no loop waits on a port: every routine streams a bank word a cycle
    assert cost_model.hazards(engine.analysis) == [] and engine.analysis.warnings == []


def test_the_attention_arrays_give_each_site_its_port(printed: tuple[str, cost_model.Engine, dict]) -> None:
    """The attention's arrays as the reader banks them, against counts from the routine's text: `queries` (laid out
    word, head, lane) has one store (the copy) and one load (the pass) on each of its GROUP_MAX x CPW banks; `acc`
    one load and one store in the pass and SHIFT_DEPTH loads in the merge; neither is arbitrated."""
    _, engine, cost = printed
    c = engine.constants
    lanes = d5005.GROUP_MAX * c["BURST_BYTES"] // c["CACHE_BYTES"]
    assert engine.analysis.banks["queries"] == engine.analysis.banks["acc"] == lanes
    assert engine.analysis.ports["queries"] == (1, 1)
    assert engine.analysis.ports["acc"] == (1 + c["SHIFT_DEPTH"], 1)
    assert not engine.analysis.arbitrated["queries"] and not engine.analysis.arbitrated["acc"]
    assert cost["ports"]["acc"]["copies"] == -(-(1 + c["SHIFT_DEPTH"]) // 3)  # 3 read ports a copy beside the store


# An edit that reads a buffer field as a word offset rather than bank words: the embedding row's stores land at a
# bank known only at run time, so the residual stream's array reaches every bank through an arbiter.
RAW_OFFSET = (
    "if (k < cols) residual[dst + k] = WEIGHT_AT(word, e);",
    "if (k < cols) residual[w.s1 + k] = WEIGHT_AT(word, e);",
)


def test_a_site_at_a_run_time_bank_arbitrates_its_array(
    one_b: d5005.ProgramOp, printed: tuple[str, cost_model.Engine, dict]
) -> None:
    source, engine, cost = printed
    raw = cost_model.Engine.read(edited(source, RAW_OFFSET))
    lanes = one_b.params.burst_bytes // 4
    assert {a: b for a, b in raw.analysis.arbitrated.items() if b} == {"residual": set(range(lanes))}
    row = "embed_row.words"  # its VECTOR_WIDTH stores each reach every bank: 4 a cycle through the arbiter
    assert raw.iteration(row, cost_model.LOW) == one_b.params.vector_width // 4 > engine.iteration(row, cost_model.LOW)
    assert cost_model.band(one_b, raw)["band_tokens_per_s"][0] < cost["band_tokens_per_s"][0]


@pytest.mark.parametrize("edit", FOUR_EDITS, ids=["serial-sum", "serial-banks", "channel-depth-1", "bare-ivdep"])
def test_each_edit_of_the_printed_engine_lowers_the_band(
    one_b: d5005.ProgramOp, printed: tuple[str, cost_model.Engine, dict], edit: tuple[str, str]
) -> None:
    source, _, base = printed
    changed = cost_model.band(one_b, cost_model.Engine.read(edited(source, edit)))
    (low, high), (new_low, new_high) = base["band_tokens_per_s"], changed["band_tokens_per_s"]
    assert new_low < low and new_high <= high
    assert changed["low"]["bytes_read_per_token"] == base["low"]["bytes_read_per_token"]  # the same bytes
    if edit is SERIAL_SUM:  # 32 dependent adds a word of each bank: the matvec two orders of magnitude slower
        assert changed["low"]["ms_by_opcode"]["matvec"] > 100 * base["low"]["ms_by_opcode"]["matvec"]
    if edit is SERIAL_BANKS:
        assert "channel is a run-time value" in changed["warnings"][0]
    if edit is SHALLOW_CHANNELS:  # the four banks' gaps no longer absorbed: the streams slow, the compute does not
        assert changed["low"]["ms_by_opcode"]["matvec"] > 1.2 * base["low"]["ms_by_opcode"]["matvec"]
    if edit is BARE_IVDEP:
        assert new_low == 0.0 and "attention.rows" in changed["hazards"][0]


def test_the_carried_add_and_the_devectorised_loop_lower_the_band(
    one_b: d5005.ProgramOp, printed: tuple[str, cost_model.Engine, dict]
) -> None:
    source, _, base = printed
    carried = cost_model.band(one_b, cost_model.Engine.read(edited(source, CARRIED_ADD)))
    scalar = cost_model.band(one_b, cost_model.Engine.read(edited(source, DEVECTORISED)))
    # the matvec's 4 x 32 weights a cycle now wait FP_LATENCY cycles each: compute-bound, far below the banks
    assert carried["low"]["ms_by_opcode"]["matvec"] > 4 * base["low"]["ms_by_opcode"]["matvec"]
    assert carried["band_tokens_per_s"][1] < base["band_tokens_per_s"][1] / 3
    # SiLU*mul over 8192 words takes 8192 iterations a layer instead of 512 (of II 12: 48 sites of the shared
    # array, arbitrated, so it loses less than 16 times)
    assert scalar["low"]["ms_by_opcode"]["silu_mul"] > base["low"]["ms_by_opcode"]["silu_mul"]
    assert scalar["band_tokens_per_s"][0] < base["band_tokens_per_s"][0]


@pytest.mark.parametrize("edit", FOUR_EDITS, ids=["serial-sum", "serial-banks", "channel-depth-1", "bare-ivdep"])
def test_a_build_folder_is_re_costed_as_it_is_edited(tmp_path: Path, edit: tuple[str, str]) -> None:
    """`logos-compile --cost` reads the folder's engine.cl afresh: each of the four edits gives the edited engine's
    band, below the band of the folder as built (the 1B at ctx 2048: large enough that the banks' gaps count)."""
    from logos_ir.passes.d5005.build import cost_folder
    from logos_ir.tools.logos_compile import main

    folder = tmp_path / "1b"
    assert main(["--model", "llama-3.2-1b", "--target", "d5005", "--cut", "decode ctx=2048", "-o", str(folder)]) == 0
    program = lowered(ModelSpec.preset("llama-3.2-1b"), 2048)
    built = cost_folder(folder)
    assert built["band_tokens_per_s"] == cost_model.band(program)["band_tokens_per_s"]
    engine = folder / "engine.cl"
    engine.write_text(edited(engine.read_text(), edit))
    again = cost_folder(folder)
    expected = cost_model.band(program, cost_model.Engine.read(engine.read_text()))
    assert again["band_tokens_per_s"] == expected["band_tokens_per_s"]
    (low, high), (new_low, new_high) = built["band_tokens_per_s"], again["band_tokens_per_s"]
    assert new_low < low and new_high <= high
    if edit is SERIAL_SUM:
        assert new_high < low
    assert main(["--cost", str(folder)]) == 0


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
        bursts = cost_model.instruction_cost(model, word, 17, 7, cost_model.LOW)["bursts"]
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


def test_8b_at_ctx_8192_reads_weights_and_each_kv_head_once() -> None:
    spec = ModelSpec.preset("llama-3.1-8b")
    program = lowered(spec, 8192)
    cost = cost_model.band(program)
    low, high = cost["low"], cost["high"]
    # the spec's own sizes: every weight but the embedding (one row of it read) in bf16, and K and V of 8191
    # earlier positions for each of 8 KV heads of 32 layers (the position itself is on chip), 128 bf16 each
    per_layer = 2 * spec.hidden * (spec.heads + spec.kv_heads) * spec.head_dim + 3 * spec.hidden * spec.intermediate
    weights = spec.layers * (per_layer + 2 * spec.hidden) + spec.hidden + spec.vocab * spec.hidden
    assert low["weight_bytes_per_token"] == 2 * (weights + spec.hidden)
    assert low["kv_bytes_per_token"] == spec.layers * spec.kv_heads * 8191 * 2 * spec.head_dim * 2
    assert cost["roofline_tokens_per_s"] == pytest.approx(76.8e9 / low["bytes_read_per_token"], rel=1e-3)
    # no end of the band passes what the banks could give at their sustained share, nor the datapath at its clock
    for corner in (low, high):
        banks = corner["ddr_efficiency"] * 76.8e9 / corner["bytes_read_per_token"]
        datapath = 4 * 64 * corner["fmax_mhz"] * 1e6 / corner["bytes_read_per_token"]
        assert 0 < corner["tokens_per_s"] < min(banks, datapath)
    assert cost["band_tokens_per_s"] == [low["tokens_per_s"], high["tokens_per_s"]]
    earlier = cost_model.estimate(program, position=2)  # attention reads one earlier position
    assert earlier["tokens_per_s"] > low["tokens_per_s"]


def test_the_8b_build_folder_costs_at_least_70_percent_of_its_roofline(tmp_path: Path) -> None:
    """The 8B in bf16 at ctx 8192 as `logos-compile` builds it, costed from the folder's engine.cl: the band's low
    end at least 70% of the roofline, and the one-pass attention within 15% of streaming the cache
    once at the low corner's bank rate or datapath, whichever is slower."""
    from logos_ir.passes.d5005.build import cost_folder
    from logos_ir.tools.logos_compile import main

    folder = tmp_path / "8b"
    assert main(["--model", "llama-3.1-8b", "--target", "d5005", "--cut", "decode ctx=8192", "-o", str(folder)]) == 0
    cost = cost_folder(folder)
    low = cost["low"]
    assert cost["band_tokens_per_s"][0] >= 0.7 * cost["roofline_tokens_per_s"] > 3.3
    assert not any(cost["arbitrated"].values())  # every on-chip array's sites within its ports (docs/d5005.md)
    assert {array: cost["ports"][array]["stores"] for array in d5005.ARRAYS} == {  # the routines' store sites a bank
        "residual": 3,  # embed_row's bf16 word (2 bank words of floats), add
        "inputs": 3,  # rms_norm's bf16 word (2), silu_mul
        "attended": 2,  # the attention's output, a bf16 cache word's CPW elements in 2 runs of a bank word
        "outputs": 1,  # the matvec's bank word of results
        "rotated": 2,  # rope's two halves
    }
    spec = ModelSpec.preset("llama-3.1-8b")
    kv = spec.layers * spec.kv_heads * 8191 * 2 * spec.head_dim * 2  # K and V of the earlier positions, bf16
    rate = min(low["ddr_efficiency"] * 76.8e9, 4 * low["burst_bytes"] * low["fmax_mhz"] * 1e6)
    assert low["ms_by_opcode"]["attention"] < 1.15 * kv / rate * 1e3


def test_the_aoc_form_renders_the_attributes_aoc_reads(one_b: d5005.ProgramOp) -> None:
    """The source as aoc compiles it (INTELFPGA_CL defined): the pragmas as the #pragma lines aoc sees, the
    channels with their depth, the on-chip arrays as __local, and nothing of the PoCL build's ordered buffers."""
    from logos_ir.passes.d5005 import aoc_report

    source = engine_source(one_b.identity.data, one_b.params)
    text = aoc_report.expand(aoc_report.aoc_form(source))
    width, depth = one_b.params.vector_width, 8
    matvec = text[text.index("/* loop matvec.words */") :]
    assert re.search(r"#pragma unroll BANKS\n\s*for \(uint b = 0; b < BANKS; b\+\+\)", matvec)
    assert re.search(r"#pragma unroll VECTOR_WIDTH\n\s*for \(uint e = 0; e < VECTOR_WIDTH; e\+\+\) sum \+=", matvec)
    assert re.search(r"#pragma ivdep safelen\(SLOT_DISTANCE\)\n\s*/\* loop attention.rows \*/", text)
    assert "channel bank_word_t bank_words[BANKS] __attribute__((depth(CHANNEL_DEPTH)));" in text
    assert "onchip" not in text and "fifo" not in text and "UNROLL(" not in text
    for array in d5005.ARRAYS:
        declared = f"__local float {array}[{array.upper()}_WORDS] __attribute__((numbanks(OV), bankwidth(4)));"
        assert declared in text, array
    banked = "__attribute__((numbanks(GROUP_MAX * CPW), bankwidth(4)));"
    assert f"__local float queries[ROW_WORDS_MAX * GROUP_MAX * CPW] {banked}" in text
    read = aoc_report.read_source(source)
    assert (read.numbers["VECTOR_WIDTH"], read.numbers["SHIFT_DEPTH"]) == (width, depth)
    assert read.channel_depth == 512 and read.arrays["vector"].words == d5005.VECTOR_WORDS
    assert read.arrays["vector"].numbanks == one_b.params.burst_bytes // 4
    assert read.arrays["queries"].numbanks == d5005.GROUP_MAX * one_b.params.burst_bytes // 2  # a lane per (g, e)


# What the engine no longer has and the reader finds when it comes back: a divider by a run-time value in an
# inner loop (rope's head and offset by k / mid, k % mid) and a bank pointer chosen at run time.
DIVIDED = (
    "float cosine = cosines[c + l], sine = sines[c + l];",
    "float cosine = cosines[(c + l) % mid], sine = sines[(c + l) % mid];",
)
POINTER_ARRAY = (
    "    channels_t ch;\n",
    "    __global bank_word_t *banks[BANKS] = {bank0, bank1, bank2, bank3};\n    channels_t ch;\n",
)


def test_no_divider_in_a_loop_and_no_pointer_chosen_at_run_time(
    one_b: d5005.ProgramOp, printed: tuple[str, cost_model.Engine, dict]
) -> None:
    source, engine, _ = printed
    loops = engine.analysis.loops
    assert [name for name, report in loops.items() if report.dividers] == []
    divided = cost_model.Engine.read(edited(source, DIVIDED)).analysis
    assert divided.loops["rope.rotate"].dividers == 2 * one_b.params.burst_bytes // 4  # two in each unrolled lane
    assert "rope.rotate: 32 integer dividers" in divided.warnings[0]
    pointers = cost_model.Engine.read(edited(source, POINTER_ARRAY)).analysis
    assert any("global pointer chosen at run time" in warning for warning in pointers.warnings)
