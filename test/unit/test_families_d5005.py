"""The families of `test/unit/families/` on the D5005 lane: each family the engine now computes gives transformers'
greedy tokens (`goldens.json`) through the engine on PoCL, with f32 weights, on its one card (the D5005 lane does
not split a program over chips: tp=2 is refused, as `test_d5005_lowering.py` pins); and what each feature adds
to the engine (an instruction word's field, a routine's loops, an on-chip array) is costed as printed.

The engine's optional parts (`emit_opencl.FEATURES`) are printed only in the engine of a program that uses them,
so a plain Llama's engine is the one printed before them (`tools/golden_builds.py --check`).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import replace

import numpy as np
import pytest
from test_d5005_cost_model import _sent, edited  # the suite's rootdir-relative imports, as test_d5005_engine's
from test_families import FAMILIES, GOLDENS, _lane

from logos_ir.author import written
from logos_ir.dialects import d5005
from logos_ir.parser import parse_program
from logos_ir.passes.d5005 import aoc_report, cost_model
from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
from logos_ir.passes.d5005.emit_opencl import engine_features, engine_source
from logos_ir.passes.d5005.emit_stream import HEADER, encode_instruction, encode_stream
from logos_ir.passes.d5005.engine_loops import Loop, Step
from logos_ir.program import Cut
from logos_ir.runtime.d5005 import Engine, StreamError, read_stream
from logos_ir.testing import lower_program
from logos_ir.weights import open_model

pytestmark = pytest.mark.usefixtures("opencl_device")


def _lowered(family: str, ctx: int = 32, weights: str = "f32") -> d5005.ProgramOp:
    store = open_model(str(FAMILIES / family))
    text, _ = written(store.spec, Cut.decode(ctx))
    return lower_program(parse_program(text.text, "<decode>"), weights)


def _every(loops: list[Loop] | tuple[Loop, ...]) -> list[Loop]:
    found = []
    for loop in loops:
        found += [loop, *_every(loop.inner if loop.inner_of is None else loop.inner_of(0))]
    return found


def printed_loops(program: d5005.ProgramOp) -> tuple[str, cost_model.Engine, list[Loop]]:
    """The engine's source `program` prints, the cost model's reading of it, and the loops the model costs at a step:
    each one printed under its mark (`/* loop NAME */` right above its header), every marked loop one it costs."""
    source = engine_source(program.identity.data, program.params, engine_features(program))
    engine = cost_model.Engine.read(source)
    step = Step(engine.constants, [1] * d5005.INSTRUCTION_WORDS, 1, 2)
    stated = [loop for r in [*engine.compute.values(), *engine.readers.values()] for loop in _every(r(step))]
    for loop in stated:
        assert re.search(rf"/\* loop {re.escape(loop.name)} \*/\n\s*{re.escape(loop.header)}", source), loop.name
    assert sorted(loop.name for loop in stated) == sorted(re.findall(r"/\* loop ([\w.]+) \*/", source))
    return source, engine, stated


# -- biases: the matvec's epilogue ------------------------------------------------------------------------------

BIASED = ("qwen2", "llama-biases")


@pytest.mark.parametrize("family", BIASED)
def test_a_biased_family_gives_transformers_tokens_on_the_engine(family: str) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def test_each_bias_is_a_field_of_its_matvecs_word() -> None:
    """Every bias of Llama's seven projections is its matvec's (none left as an op of its own), its word carrying
    the bias's length and where it starts; the engine printed for the program has the bias epilogue."""
    program = _lowered("llama-biases")
    matvecs = [op for op in program.instructions() if isinstance(op, d5005.MatvecOp)]
    biased = [op for op in matvecs if op.bias is not None]
    assert len(biased) == 7 * 2 and len(matvecs) == len(biased) + 1  # the head adds none
    for op in biased:
        assert op.bias is not None and op.bias.tensor.data == op.weight.tensor.data.replace(".weight", ".bias")
        word = encode_instruction(op, 64)
        assert word[d5005.W_BIAS] == op.weight.rows.data
        assert word[d5005.W_BIAS_OFFSET] * 64 == op.bias.offset.data
    assert engine_features(program) == {"bias"}
    assert engine_features(_lowered("llama")) == frozenset()


def test_the_bias_engine_prints_the_loops_it_costs() -> None:
    """The loops the model costs for an engine with biases (and windows: Qwen2's windowed family has both) are the
    ones it prints under their marks (with the bias loops of the matvec and of its bank reader), its on-chip copy of
    a bias is banked, not arbitrated, and no loop divides by a run-time value."""
    program = _lowered("qwen2-window")
    source, engine, stated = printed_loops(program)
    assert {"matvec.bias", "read_matvec.bias"} <= {loop.name for loop in stated}
    assert engine.analysis.banks["biases"] == 64 // 4
    assert not any(engine.analysis.arbitrated.values())
    assert [name for name, report in engine.analysis.loops.items() if report.dividers] == []


def test_the_cost_model_reads_each_bias_once() -> None:
    """A biased step reads its plain weights and each bias once more, a bank word of it a burst (the spec's sizes),
    and the engine's bank readers send those words: the model's bursts against the readers' counts on PoCL."""
    store = open_model(str(FAMILIES / "llama-biases"))
    spec = store.spec
    program = _lowered("llama-biases")
    low = cost_model.band(program)["low"]
    plain = cost_model.band(_lowered("llama"))["low"]
    per_layer = 2 * spec.hidden + spec.heads * spec.head_dim + 2 * spec.kv_heads * spec.head_dim
    per_layer += 2 * spec.intermediate  # o, gate, up, down: hidden, intermediate, intermediate, hidden
    bias_bytes = spec.layers * per_layer * 4
    assert low["weight_bytes_per_token"] == plain["weight_bytes_per_token"] + bias_bytes
    assert low["tokens_per_s"] < plain["tokens_per_s"]
    source = engine_source(program.identity.data, program.params, engine_features(program))
    engine = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, spec, store))
    model = cost_model.Engine.read(source)
    for position in range(1, 4):
        engine.step(position + 10, position)
    for index, op in enumerate(program.instructions()):
        if isinstance(op, d5005.MatvecOp):
            bursts = cost_model.instruction_cost(model, encode_instruction(op, 64), 17, 3, cost_model.LOW)["bursts"]
            assert bursts == _sent(engine, index, 17, 3), op.weight.tensor.data


def test_an_engine_without_biases_refuses_a_biased_stream() -> None:
    """A stream whose matvecs add biases, on the engine printed without them: the host refuses it before anything
    runs, and the cost model will not cost it as if the bias were free."""
    program = _lowered("qwen2")
    stream = encode_stream(program, image_bytes(program))
    plain = engine_source(program.identity.data, program.params)
    store = open_model(str(FAMILIES / "qwen2"))
    with pytest.raises(StreamError, match="adds a bias in a matvec, and this engine has no ENGINE_BIAS"):
        Engine(plain, stream, weight_image(program, store.spec, store))
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(aoc_report.ReportError, match="adds a bias, and the engine has no ENGINE_BIAS"):
        cost_model.band(engine=cost_model.Engine.read(plain), words=words, ctx=32)


def test_a_bias_past_its_rows_is_refused_by_the_reader() -> None:
    program = _lowered("qwen2")
    """A word whose bias is longer than its rows (its CRC made right, so the reader sees the word itself)."""
    program = _lowered("qwen2")
    stream = _rewritten(
        encode_stream(program, image_bytes(program)), d5005.OPCODES["d5005.matvec"], d5005.W_BIAS, 65, True
    )
    with pytest.raises(StreamError, match="adds a bias of 65 words to 64 rows"):
        read_stream(stream)


def test_the_bias_epilogue_edited_out_changes_the_tokens() -> None:
    """The bias the epilogue adds is what the tokens depend on: the engine with its add edited out (and nothing
    else) runs the same stream to other tokens than transformers'."""
    program = _lowered("qwen2")
    source = engine_source(program.identity.data, program.params, engine_features(program))
    stream = encode_stream(program, image_bytes(program))
    unbiased = edited(source, (" + SELECT(biased, biases[k], 0.0f)", ""))
    _edit_changes_the_tokens("qwen2", source, stream, unbiased, stream)


def _greedy(engine: Engine, run: dict) -> list[int]:
    """The engine's greedy tokens after a golden run's prompt, as many as the run has, one decode step each (the
    engine's tokens count from 1, the goldens' from 0)."""
    tokens: list[int] = []
    for position, token in enumerate(run["prompt"], start=1):
        predicted = engine.step(token + 1, position)
    position = len(run["prompt"]) + 1
    while len(tokens) < len(run["tokens"]):
        tokens.append(predicted - 1)
        if len(tokens) < len(run["tokens"]):
            predicted = engine.step(predicted, position)
            position += 1
    return tokens


def _edit_changes_the_tokens(family: str, source: str, stream: bytes, edited_source: str, edited_stream: bytes) -> None:
    """The engine as printed, stepped by `_greedy`, gives transformers' tokens; with one edit (its source's or its
    stream's) it gives others: the goldens pin what the edit took out."""
    program = _lowered(family)
    store = open_model(str(FAMILIES / family))
    image = weight_image(program, store.spec, store)
    run = GOLDENS[family]["runs"][0]
    assert _greedy(Engine(source, stream, image), run) == run["tokens"]
    assert _greedy(Engine(edited_source, edited_stream, image), run) != run["tokens"]


# -- sliding windows: the attention's pass bounded to the window -------------------------------------------------

WINDOWED = ("mistral-window", "qwen2-window")


@pytest.mark.parametrize("family", WINDOWED)
def test_a_windowed_family_gives_transformers_tokens_on_the_engine(family: str) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def test_a_window_is_a_field_of_its_layers_attention() -> None:
    """Qwen2's windowed layer (its layer 1; layer 0 attends every position) carries its window in its attention's
    word; the engine printed for the program has the window's parts."""
    program = _lowered("qwen2-window")
    attentions = [op for op in program.instructions() if isinstance(op, d5005.AttentionOp)]
    assert [op.window.value.data if op.window is not None else None for op in attentions] == [None, 4]
    assert [encode_instruction(op, 64)[d5005.W_WINDOW] for op in attentions] == [0, 4]
    assert engine_features(program) == {"bias", "window"}


def test_a_windowed_layer_streams_only_its_window() -> None:
    """At the cache's last position each windowed layer reads the K and V of the window's earlier positions (3 of
    a window of 4) and no more, and the bank readers send the model's bursts, at positions inside and past the
    window, not multiples of 4 (the readers' counts on PoCL)."""
    store = open_model(str(FAMILIES / "mistral-window"))
    spec = store.spec
    program = _lowered("mistral-window")
    window = spec.sliding_window
    assert window is not None
    low = cost_model.band(program)["low"]
    row_bytes = -(-spec.head_dim * 4 // 64) * 64
    assert low["kv_bytes_per_token"] == spec.layers * spec.kv_heads * (window - 1) * 2 * row_bytes
    source = engine_source(program.identity.data, program.params, engine_features(program))
    engine = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, spec, store))
    model = cost_model.Engine.read(source)
    engine.step(5, 1)
    for index, op in enumerate(program.instructions()):
        if not isinstance(op, d5005.AttentionOp):
            continue
        for position in (3, 6, 11, 30):
            bursts = cost_model.instruction_cost(model, encode_instruction(op, 64), 17, position, cost_model.LOW)
            sent = _sent(engine, index, 17, position)
            assert bursts["bursts"] == sent, position
            rows = min(position - 1, window - 1)
            assert sum(sent) == spec.kv_heads * rows * 2 * (row_bytes // 64)


def test_the_window_is_what_the_tokens_depend_on() -> None:
    """The same stream with each attention's window field cleared (every earlier position attended, the engine
    unchanged) gives other tokens than transformers': the goldens pin the bound."""
    program = _lowered("mistral-window")
    source = engine_source(program.identity.data, program.params, engine_features(program))
    stream = encode_stream(program, image_bytes(program))
    unbounded = _rewritten(stream, d5005.OPCODES["d5005.attention"], d5005.W_WINDOW, 0)
    _edit_changes_the_tokens("mistral-window", source, stream, source, unbounded)


def _rewritten(stream: bytes, opcode: int, field: int, value: int, first_only: bool = False) -> bytes:
    """`stream` with one field of its words of `opcode` (of the first alone, with `first_only`) set to `value`, and
    its header's CRC of the words made right again, so the reader sees the words themselves."""
    data = bytearray(stream)
    count = read_stream(stream).words.shape[0]
    for index in range(count):
        at = d5005.HEADER_BYTES + index * d5005.INSTRUCTION_BYTES
        if int(np.frombuffer(data, "<u4", 1, at)[0]) != opcode:
            continue
        data[at + 4 * field : at + 4 * field + 4] = np.uint32(value).tobytes()
        if first_only:
            break
    body = bytes(data[d5005.HEADER_BYTES : d5005.HEADER_BYTES + count * d5005.INSTRUCTION_BYTES])
    fields = list(HEADER.unpack_from(data))
    fields[13] = zlib.crc32(body)  # the magic, then version, header bytes, ..., clock: the words' CRC is 13th
    HEADER.pack_into(data, 0, *fields)
    return bytes(data)


def test_an_engine_without_windows_refuses_a_windowed_stream() -> None:
    program = _lowered("mistral-window")
    stream = encode_stream(program, image_bytes(program))
    plain = engine_source(program.identity.data, program.params)
    store = open_model(str(FAMILIES / "mistral-window"))
    with pytest.raises(StreamError, match="attends over a sliding window, and this engine has no ENGINE_WINDOW"):
        Engine(plain, stream, weight_image(program, store.spec, store))
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(aoc_report.ReportError, match="slides over a window, and the engine has no ENGINE_WINDOW"):
        cost_model.band(engine=cost_model.Engine.read(plain), words=words, ctx=32)


# -- per-head RMS norms of the query and key: in the rope, before the rotation ----------------------------------


def test_qwen3s_head_norms_give_transformers_tokens_on_the_engine() -> None:
    run = GOLDENS["qwen3"]["runs"][0]
    assert _lane("qwen3", "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def test_each_head_norm_is_a_field_of_its_rope() -> None:
    """Qwen3's query and key norms are their ropes' (no head norm left as an op), each word carrying the flag, the
    norm's offset and its epsilon; the engine printed for the program norms heads, prints the loops it costs, and
    no on-chip array is arbitrated."""
    program = _lowered("qwen3")
    ropes = [op for op in program.instructions() if isinstance(op, d5005.RopeOp)]
    assert len(ropes) == 2 * 2 and all(op.norm is not None for op in ropes)
    assert [op.norm.tensor.data.rsplit(".", 2)[1] for op in ropes if op.norm is not None] == ["q_norm", "k_norm"] * 2
    for op in ropes:
        word = encode_instruction(op, 64)
        assert op.norm is not None and word[d5005.W_HEAD_NORM] == 1
        assert word[d5005.W_NORM_OFFSET] * 64 == op.norm.offset.data
        assert np.uint32(word[d5005.W_FLOAT]).view(np.float32) == np.float32(1e-5)
    assert engine_features(program) == {"head_norm"}
    source, engine, stated = printed_loops(program)
    assert {"rope.norm", "rope.squares", "read_rope.norm"} <= {loop.name for loop in stated}
    assert not any(engine.analysis.arbitrated.values())
    assert [name for name, report in engine.analysis.loops.items() if report.dividers] == []


def test_the_head_norms_are_read_once_and_what_the_readers_send() -> None:
    """Each rope reads its norm's weight once more (a bank word of it, in bank 0), and the readers send the
    model's bursts (their counts on PoCL)."""
    store = open_model(str(FAMILIES / "qwen3"))
    spec = store.spec
    program = _lowered("qwen3")
    low = cost_model.band(program)["low"]
    plain = cost_model.band(_lowered("llama"))["low"]
    norm_bursts = spec.layers * 2 * -(-spec.head_dim * 4 // 64)
    assert low["bytes_read_per_token"] == plain["bytes_read_per_token"] + norm_bursts * 64
    source = engine_source(program.identity.data, program.params, engine_features(program))
    engine = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, spec, store))
    model = cost_model.Engine.read(source)
    engine.step(5, 1)
    for index, op in enumerate(program.instructions()):
        if isinstance(op, d5005.RopeOp):
            for position in (1, 6):
                bursts = cost_model.instruction_cost(model, encode_instruction(op, 64), 17, position, cost_model.LOW)
                assert bursts["bursts"] == _sent(engine, index, 17, position), position


def test_the_head_norms_are_what_the_tokens_depend_on() -> None:
    """The same stream with each rope's norm flag cleared (the heads rotated unnormed, the engine unchanged) gives
    other tokens than transformers'."""
    program = _lowered("qwen3")
    source = engine_source(program.identity.data, program.params, engine_features(program))
    stream = encode_stream(program, image_bytes(program))
    unnormed = _rewritten(stream, d5005.OPCODES["d5005.rope"], d5005.W_HEAD_NORM, 0)
    _edit_changes_the_tokens("qwen3", source, stream, source, unnormed)


def test_an_engine_without_head_norms_refuses_a_normed_stream() -> None:
    program = _lowered("qwen3")
    stream = encode_stream(program, image_bytes(program))
    plain = engine_source(program.identity.data, program.params)
    store = open_model(str(FAMILIES / "qwen3"))
    with pytest.raises(StreamError, match="norms heads in a rope, and this engine has no ENGINE_HEAD_NORM"):
        Engine(plain, stream, weight_image(program, store.spec, store))
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(aoc_report.ReportError, match="norms its heads, and the engine has no ENGINE_HEAD_NORM"):
        cost_model.band(engine=cost_model.Engine.read(plain), words=words, ctx=32)


# -- a rope base per layer: a rotary table of the windowed layers' own ------------------------------------------


def test_a_layers_own_rope_base_turns_by_a_table_of_its_own() -> None:
    """Gemma 3's local layers rotate with a base of their own (here tiny's layer 0, windowed by a window that never
    bites, with base 5000): the engine turns that layer's ropes by a second rotary table (`rope.local`, placed
    after the model's, its rows the local base's), and its logits are the reference's at every step, while those
    of the same weights all turned by the model's base are not."""
    from test_families import _Recording

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import RandomWeights

    spec = replace(ModelSpec.preset("tiny"), sliding_window=64, full_layers=(1,), local_rope_theta=5000.0)

    def run(backend: str, model: ModelSpec) -> tuple[list[int], np.ndarray]:
        request = RunRequest(RandomWeights(model), ctx=32, prefill_rows=4, weights="f32")
        sampler = _Recording()
        tokens = backends()[backend].generator()(request).generate([1, 2, 3], 8, sampler=sampler)
        return tokens, np.array(sampler.logits)

    (expected, reference), (tokens, engine) = run("reference", spec), run("d5005", spec)
    assert tokens == expected and engine.shape == reference.shape
    np.testing.assert_allclose(engine, reference, atol=1e-4)
    _, unlocal = run("reference", replace(spec, local_rope_theta=None))
    assert np.abs(unlocal - reference).max() > 1e-2
    text, _ = written(spec, Cut.decode(32))
    program = lower_program(parse_program(text.text, "<decode>"), "f32")
    ropes = [op for op in program.instructions() if isinstance(op, d5005.RopeOp)]
    assert [op.table.tensor.data for op in ropes] == ["rope.local", "rope.local", "rope", "rope"]


# -- partial rotary: a part of each head rotated, the rest passed through -----------------------------------------


@pytest.mark.parametrize("family", ["phi3-gguf-partial", "phi3-gguf"])
def test_phi3s_gguf_shaped_families_give_transformers_tokens_on_the_engine(family: str) -> None:
    """Phi-3's GGUF-shaped families on the engine: with partial rotary (8 of each head's 16 numbers rotate), and
    without (the whole head, the plain rope: the engine printed without the partial part)."""
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.parametrize("weights", ["f32", "bf16"])
def test_a_partial_rope_is_a_field_of_its_word_and_costed_as_printed(weights: str) -> None:
    """Each rope carries the numbers it rotates, its table's rows are over those (4 frequencies, not 8); the engine
    printed for the program passes the rest through (`rope.pass`), prints the loops it costs, arbitrates no
    on-chip array in either precision, and its readers send the model's bursts (their counts on PoCL)."""
    store = open_model(str(FAMILIES / "phi3-gguf-partial"))
    program = _lowered("phi3-gguf-partial", weights=weights)
    ropes = [op for op in program.instructions() if isinstance(op, d5005.RopeOp)]
    assert ropes and all(op.rotary == 8 and encode_instruction(op, 64)[d5005.W_ROTARY] == 8 for op in ropes)
    assert all(op.table.cols.data == d5005.rope_row_floats(8, 64) for op in ropes)
    assert engine_features(program) == {"partial_rotary"}
    source, engine, stated = printed_loops(program)
    assert "rope.pass" in {loop.name for loop in stated}
    assert not any(engine.analysis.arbitrated.values())
    assert [name for name, report in engine.analysis.loops.items() if report.dividers] == []
    if weights != "f32":
        return
    host = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, store.spec, store))
    host.step(5, 1)
    for index, op in enumerate(program.instructions()):
        if isinstance(op, d5005.RopeOp):
            for position in (1, 6):
                bursts = cost_model.instruction_cost(engine, encode_instruction(op, 64), 17, position, cost_model.LOW)
                assert bursts["bursts"] == _sent(host, index, 17, position), position


def test_an_engine_without_partial_rotary_refuses_a_partial_stream() -> None:
    program = _lowered("phi3-gguf-partial")
    stream = encode_stream(program, image_bytes(program))
    plain = engine_source(program.identity.data, program.params)
    store = open_model(str(FAMILIES / "phi3-gguf-partial"))
    with pytest.raises(StreamError, match="rotates a part of each head, and this engine has no ENGINE_PARTIAL_ROTARY"):
        Engine(plain, stream, weight_image(program, store.spec, store))
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(aoc_report.ReportError, match="and the engine has no ENGINE_PARTIAL_ROTARY"):
        cost_model.band(engine=cost_model.Engine.read(plain), words=words, ctx=32)


# -- an attention's own scale (Gemma's query_pre_attn_scalar): the word's float ---------------------------------


def test_an_attentions_own_scale_is_its_words_float() -> None:
    """An attention whose scores are scaled by a constant of the model's (1 / sqrt(4) here, not 1 / sqrt(16))
    carries it in its word's float, the engine unchanged: the logits are the reference's at every step, not
    those of the head size's scale; the stream reads back to the same op."""
    from test_families import _Recording

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest
    from logos_ir.runtime.d5005 import decode_ops
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import RandomWeights

    spec = replace(ModelSpec.preset("tiny"), query_pre_attn_scalar=4.0)

    def run(backend: str, model: ModelSpec) -> tuple[list[int], np.ndarray]:
        sampler = _Recording()
        request = RunRequest(RandomWeights(model), ctx=32, weights="f32")
        tokens = backends()[backend].generator()(request).generate([1, 2, 3], 8, sampler=sampler)
        return tokens, np.array(sampler.logits)

    (expected, reference), (tokens, engine) = run("reference", spec), run("d5005", spec)
    assert tokens == expected
    np.testing.assert_allclose(engine, reference, atol=1e-4)
    _, unscaled = run("reference", replace(spec, query_pre_attn_scalar=None))
    assert np.abs(unscaled - reference).max() > 1e-2
    text, _ = written(spec, Cut.decode(32))
    program = lower_program(parse_program(text.text, "<decode>"), "f32")
    attentions = [op for op in program.instructions() if isinstance(op, d5005.AttentionOp)]
    assert [np.uint32(encode_instruction(op, 64)[d5005.W_FLOAT]).view(np.float32) for op in attentions] == [0.5] * 2
    assert engine_features(program) == frozenset()
    read = decode_ops(read_stream(encode_stream(program, image_bytes(program))))
    assert [op.scale.value.data for op in read if isinstance(op, d5005.AttentionOp) and op.scale] == [0.5, 0.5]
