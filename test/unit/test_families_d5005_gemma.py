"""Gemma 2 and Gemma 3 on the D5005 engine: each tiny family of `test/unit/families/` gives transformers' greedy
tokens (`goldens.json`) through the engine on PoCL with f32 weights, on its one card (the lane does not split a
program over chips: `test_d5005_lowering.py` pins the refusal of tp=2).

Each of Gemma's operations is a field of an instruction word and an optional part of `engine.cl`
(`emit_opencl.FEATURES`): the embedding row's scale (`embed_scale`), norms by one plus the weight (`plus_one`, the
head norms' too), GeGLU's gate (`gelu_tanh`), the sandwich norms of a matvec's output (`sandwich`), the logits'
soft-cap (`logit_softcap`) and the attention scores' (`softcap`). Each is what the tokens or the logits depend on
(the field cleared gives others), each is refused by an engine printed without it (the host and the cost model), and
the parts' loads and stores are costed from the printed source.
"""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from test_d5005_cost_model import _sent
from test_families import FAMILIES, GOLDENS, _lane, _Recording
from test_families_d5005 import _every, _greedy, _lowered, _rewritten

from logos_ir.dialects import d5005
from logos_ir.passes.d5005 import aoc_report, cost_model
from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
from logos_ir.passes.d5005.emit_opencl import engine_features, engine_source
from logos_ir.passes.d5005.emit_stream import HEADER, encode_instruction, encode_stream
from logos_ir.passes.d5005.engine_loops import Step
from logos_ir.runtime.d5005 import Engine, StreamError, decode_ops, read_stream
from logos_ir.weights import open_model

pytestmark = pytest.mark.usefixtures("opencl_device")


GEMMAS = ("gemma2", "gemma2-gguf", "gemma3_text", "gemma3_text-linear", "gemma3_text-gguf", "gemma3_text-gguf-linear")
GEMMA2_PARTS = {"embed_scale", "plus_one", "gelu_tanh", "sandwich", "logit_softcap", "softcap", "window"}


@pytest.mark.parametrize("family", GEMMAS)
def test_a_gemma_family_gives_transformers_tokens_on_the_engine(family: str) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


def _engine(family: str, stream: bytes | None = None, source: str | None = None) -> Engine:
    program = _lowered(family)
    store = open_model(str(FAMILIES / family))
    source = source or engine_source(program.identity.data, program.params, engine_features(program))
    stream = stream or encode_stream(program, image_bytes(program))
    return Engine(source, stream, weight_image(program, store.spec, store))


def test_each_gemma_operation_is_a_field_of_its_word() -> None:
    """Gemma 2's step: the embedding row scaled by sqrt(64) = 8 in its word's float; every RMS norm by one plus its
    weight (the flag in its ctx), the post-attention and post-feed-forward norms reading a matvec's output in
    `outputs` into `inputs`, where the residual add reads its rhs; GeGLU's flag in each gated product's heads; the
    logits' cap (5) in the arg-max's float; each attention's cap (2), split over the high halves of its head
    counts, which still say 4 heads over 2. The stream gives the ops back as they were lowered."""
    program = _lowered("gemma2")
    assert engine_features(program) == GEMMA2_PARTS
    ops = program.instructions()
    words = {op: encode_instruction(op, 64) for op in ops}
    (embed,) = [op for op in ops if isinstance(op, d5005.EmbedRowOp)]
    assert np.uint32(words[embed][d5005.W_EMBED_SCALE]).view(np.float32) == 8.0
    norms = [op for op in ops if isinstance(op, d5005.RMSNormOp)]
    assert len(norms) == 2 * 4 + 1 and all(words[op][d5005.W_PLUS_ONE] == 1 for op in norms)
    sandwich = [op.weight.tensor.data.split(".")[-2] for op in norms if op.src.owner.array_name == "outputs"]
    assert sandwich == ["post_attention_layernorm", "post_feedforward_layernorm"] * 2
    normed = {op.dst for op in norms if op.src.owner.array_name == "outputs"}
    assert all(op.dst.owner.array_name == "inputs" for op in norms)
    adds = [op for op in ops if isinstance(op, d5005.AddOp)]
    assert len(adds) == 4 and all(op.rhs in normed and op.rhs.owner.array_name == "inputs" for op in adds)
    gated = [op for op in ops if isinstance(op, d5005.SiluMulOp)]
    assert len(gated) == 2 and all(words[op][d5005.W_GELU] == 1 for op in gated)
    (argmax,) = [op for op in ops if isinstance(op, d5005.ArgmaxOp)]
    assert np.uint32(words[argmax][d5005.W_CAP]).view(np.float32) == 5.0
    for op in [op for op in ops if isinstance(op, d5005.AttentionOp)]:
        heads, kv, cap = d5005.attention_counts(words[op])
        assert (heads, kv, np.uint32(cap).view(np.float32)) == (4, 2, 2.0)
        assert words[op][d5005.W_HEADS] != 4  # the cap's half is there
    stream = read_stream(encode_stream(program, image_bytes(program)))
    back = [op for op in decode_ops(stream) if isinstance(op, d5005.InstructionOp)]
    assert [str(op) for op in back] == [str(op) for op in ops]


def test_gemma3s_head_norms_are_by_one_plus_their_weight() -> None:
    """Gemma 3's query and key norms are its ropes' head norms, each with the one-plus flag; its step has no
    soft-cap, so its engine has neither soft-cap part."""
    program = _lowered("gemma3_text")
    ropes = [op for op in program.instructions() if isinstance(op, d5005.RopeOp)]
    assert len(ropes) == 4 and all(op.norm is not None and op.plus_one is not None for op in ropes)
    assert all(encode_instruction(op, 64)[d5005.W_PLUS_ONE] == 1 for op in ropes)
    assert engine_features(program) == GEMMA2_PARTS - {"logit_softcap", "softcap"} | {"head_norm"}


def test_gemma2s_logits_are_transformers_soft_capped_ones() -> None:
    """A soft-cap is monotonic, so the tokens alone cannot tell whether the engine applied it: the logits the
    engine's arg-max wrote are the reference's (capped at 5) at every step, and bounded by the cap."""
    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    run = GOLDENS["gemma2"]["runs"][0]

    def logits(backend: str) -> np.ndarray:
        request = RunRequest(open_model(str(FAMILIES / "gemma2")), ctx=32, prefill_rows=4, weights="f32")
        sampler = _Recording()
        backends()[backend].generator()(request).generate(run["prompt"], 6, sampler=sampler)
        return np.array(sampler.logits)

    reference, engine = logits("reference"), logits("d5005")
    assert engine.shape == reference.shape
    np.testing.assert_allclose(engine, reference, atol=1e-5)
    assert np.abs(engine).max() < 5.0


@pytest.mark.parametrize(
    ("opcode", "field", "value", "family"),
    [
        ("rms_norm", d5005.W_PLUS_ONE, 0, "gemma2"),
        ("silu_mul", d5005.W_GELU, 0, "gemma3_text-gguf"),
        ("embed_row", d5005.W_EMBED_SCALE, 0, "gemma2"),
        ("rope", d5005.W_PLUS_ONE, 0, "gemma3_text"),
    ],
    ids=["plus-one", "gelu", "embed-scale", "head-norm-plus-one"],
)
def test_each_gemma_field_is_what_the_tokens_depend_on(opcode: str, field: int, value: int, family: str) -> None:
    """The stream gives transformers' tokens step by step on the engine; the same stream with one of Gemma's fields
    cleared in every word of its opcode (the engine unchanged) gives others. (SiLU for GELU leaves the tiny Gemma 2's
    and Gemma 3's tokens as they are: GeGLU's field is checked on gemma3_text-gguf's, which it changes.)"""
    program = _lowered(family)
    stream = encode_stream(program, image_bytes(program))
    run = GOLDENS[family]["runs"][0]
    assert _greedy(_engine(family, stream), run) == run["tokens"]
    cleared = _rewritten(stream, d5005.OPCODES[f"d5005.{opcode}"], field, value)
    assert _greedy(_engine(family, cleared), run) != run["tokens"]


def test_the_attention_soft_cap_is_what_the_logits_depend_on() -> None:
    """Gemma 2's attention soft-cap (2) bites: with its halves cleared from each attention's word (the head counts
    kept), the engine's logits differ from the capped step's."""
    program = _lowered("gemma2")
    stream = encode_stream(program, image_bytes(program))
    uncapped = _rewritten(stream, d5005.OPCODES["d5005.attention"], d5005.W_HEADS, 4)
    uncapped = _rewritten(uncapped, d5005.OPCODES["d5005.attention"], d5005.W_KV_HEADS, 2)
    steps = []
    for data in (stream, uncapped):
        engine = _engine("gemma2", data)
        for position, token in enumerate(GOLDENS["gemma2"]["runs"][0]["prompt"], start=1):
            engine.step(token + 1, position)  # the engine's tokens count from 1
        steps.append(np.array(engine.logits))
    assert np.abs(steps[0] - steps[1]).max() > 1e-3


_NEEDS = {
    "embed_scale": "scales an embedding row, and this engine has no ENGINE_EMBED_SCALE",
    "plus_one": "norms by one plus the weight, and this engine has no ENGINE_PLUS_ONE",
    "gelu_tanh": "gates by GELU's tanh approximation, and this engine has no ENGINE_GELU_TANH",
    "sandwich": "RMS-norms a buffer of 'outputs', and this engine has no ENGINE_SANDWICH",
    "logit_softcap": "soft-caps the logits, and this engine has no ENGINE_LOGIT_SOFTCAP",
    "softcap": "soft-caps attention scores, and this engine has no ENGINE_SOFTCAP",
}


@pytest.mark.parametrize("part", sorted(_NEEDS))
def test_an_engine_without_a_gemma_part_refuses_the_stream(part: str) -> None:
    """Gemma 2's stream on the engine printed with every part it uses but one: the host refuses it before anything
    runs, naming the part, and the cost model will not cost it as if the part were free."""
    program = _lowered("gemma2")
    stream = encode_stream(program, image_bytes(program))
    source = engine_source(program.identity.data, program.params, engine_features(program) - {part})
    with pytest.raises(StreamError, match=re.escape(_NEEDS[part])):
        _engine("gemma2", stream, source)
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(aoc_report.ReportError, match=f"and the engine has no ENGINE_{part.upper()}"):
        cost_model.band(engine=cost_model.Engine.read(source), words=words, ctx=32)


def test_the_gemma_engine_is_costed_as_printed() -> None:
    """The Gemma engine's parts change expressions inside the plain engine's loops, not its loops: the loops the
    model states are the ones printed under their marks, none divides by a run-time value and no on-chip array is
    arbitrated; the sandwich norm's reads of `outputs` are more load sites a bank there, and the add's read of
    `inputs` one more there (read from the printed source), served by more copies; and the readers send the
    model's bursts (their counts on PoCL)."""
    program = _lowered("gemma2")
    source = engine_source(program.identity.data, program.params, engine_features(program))
    model = cost_model.Engine.read(source)
    step = Step(model.constants, [1] * d5005.INSTRUCTION_WORDS, 1, 2)
    stated = [loop for r in [*model.compute.values(), *model.readers.values()] for loop in _every(r(step))]
    for loop in stated:
        assert re.search(rf"/\* loop {re.escape(loop.name)} \*/\n\s*{re.escape(loop.header)}", source), loop.name
    assert sorted(loop.name for loop in stated) == sorted(re.findall(r"/\* loop ([\w.]+) \*/", source))
    assert not any(model.analysis.arbitrated.values())
    assert [name for name, report in model.analysis.loops.items() if report.dividers] == []
    plain = cost_model.Engine.read(engine_source(program.identity.data, program.params))
    # f32: a bank word of the source in each of the norm's two loops, the add's one word of its rhs
    assert model.analysis.ports["outputs"] == (plain.analysis.ports["outputs"][0] + 2, 1)
    assert model.analysis.ports["inputs"] == (plain.analysis.ports["inputs"][0] + 1, plain.analysis.ports["inputs"][1])
    assert {s.array for s in model.analysis.loops["rms_norm.scale"].sites if not s.store} >= {"outputs", "residual"}
    assert model.analysis.copies["outputs"][0] > plain.analysis.copies["outputs"][0]
    engine = _engine("gemma2")
    for position in range(1, 4):
        engine.step(position + 10, position)
    for index, op in enumerate(program.instructions()):
        bursts = cost_model.instruction_cost(model, encode_instruction(op, 64), 13, 3, cost_model.LOW)["bursts"]
        assert bursts == _sent(engine, index, 13, 3), op.name


# -- a matvec's input longer than the engine's copy of it: the columns in parts ----------------------------------

# tiny, one layer, with a feed-forward network 64 numbers longer than the engine's 16384-word copy of a matvec's input
# (Qwen2.5-7B's down projection reads 18944): its down projection streams in two parts
WIDE = {"intermediate": d5005.VECTOR_WORDS + 64, "layers": 1}


def _with_field(stream: bytes, index: int, field: int, value: int) -> bytes:
    """`stream` with one field of its instruction `index` set to `value`, the header's CRC of the words made right."""
    data = bytearray(stream)
    at = d5005.HEADER_BYTES + index * d5005.INSTRUCTION_BYTES + 4 * field
    data[at : at + 4] = np.uint32(value).tobytes()
    count = HEADER.unpack_from(data)[3]
    fields = list(HEADER.unpack_from(data))
    fields[13] = zlib.crc32(bytes(data[d5005.HEADER_BYTES : d5005.HEADER_BYTES + count * d5005.INSTRUCTION_BYTES]))
    HEADER.pack_into(data, 0, *fields)
    return bytes(data)


def _wide() -> tuple[object, d5005.ProgramOp]:
    from dataclasses import replace

    from logos_ir.author import written
    from logos_ir.parser import parse_program
    from logos_ir.program import Cut
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import lower_program

    spec = replace(ModelSpec.preset("tiny"), **WIDE)
    text, _ = written(spec, Cut.decode(32))
    return spec, lower_program(parse_program(text.text, "<decode>"), "f32")


def test_a_matvec_input_over_the_copy_streams_in_parts_and_gives_the_references_logits() -> None:
    """The down projection over 16448 numbers is two matvecs, columns 0 to 16383 and 16384 to 16447 (the second
    adding to what the first wrote); the engine's tokens and logits are the reference's at every step, and the
    same stream with the second part writing instead of adding (its first column cleared) gives other logits."""
    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest
    from logos_ir.testing import RandomWeights

    spec, program = _wide()
    parts = [op.part for op in program.instructions() if isinstance(op, d5005.MatvecOp) and op.columns is not None]
    assert parts == [(0, d5005.VECTOR_WORDS), (d5005.VECTOR_WORDS, 64)]
    assert "columns" in engine_features(program)

    def run(backend: str) -> tuple[list[int], np.ndarray]:
        request = RunRequest(RandomWeights(spec), ctx=32, prefill_rows=4, weights="f32")
        sampler = _Recording()
        tokens = backends()[backend].generator()(request).generate([1, 2, 3], 5, sampler=sampler)
        return tokens, np.array(sampler.logits)

    (expected, reference), (tokens, logits) = run("reference"), run("d5005")
    assert tokens == expected and logits.shape == reference.shape
    np.testing.assert_allclose(logits, reference, atol=1e-4)
    (second,) = [i for i, op in enumerate(program.instructions()) if isinstance(op, d5005.MatvecOp) and op.part[0]]
    rewritten = _with_field(encode_stream(program, image_bytes(program)), second, d5005.W_FIRST, 0)
    source = engine_source(program.identity.data, program.params, engine_features(program))
    store = RandomWeights(spec)
    for data, same in ((encode_stream(program, image_bytes(program)), True), (rewritten, False)):
        engine = Engine(source, data, weight_image(program, spec, store))
        for position, token in enumerate([1, 2, 3], start=1):
            engine.step(token + 1, position)  # the engine's tokens count from 1
        close = np.allclose(engine.logits, reference[0], atol=1e-4)  # after the prompt
        assert close == same


def test_the_parts_read_each_weight_once_as_printed() -> None:
    """The two parts stream the down projection's rows once between them (each row's bursts of its 16448 f32
    numbers), and the readers send the model's bursts (their counts on PoCL); the parts' loops (the second's copy
    of what the first wrote, `matvec.prior`, a bank word of the 64 rows a cycle) are the printed ones, nothing
    arbitrated; an engine printed without the part refuses the stream (the host and the cost model)."""
    from logos_ir.testing import RandomWeights

    spec, program = _wide()
    source = engine_source(program.identity.data, program.params, engine_features(program))
    model = cost_model.Engine.read(source)
    ops = program.instructions()
    down = [op for op in ops if isinstance(op, d5005.MatvecOp) and "down_proj" in op.weight.tensor.data]
    costs = [cost_model.instruction_cost(model, encode_instruction(op, 64), 7, 2, cost_model.LOW) for op in down]
    row_bursts = -(-WIDE["intermediate"] * 4 // 64)
    assert sum(sum(c["bursts"]) for c in costs) == spec.hidden * row_bursts
    prior = [loop for op in down for loop in _every(model.compute["matvec"](Step(model.constants,
             encode_instruction(op, 64), 7, 2))) if loop.name == "matvec.prior"]  # fmt: skip
    assert [loop.trips for loop in prior] == [0, spec.hidden // 16]
    assert re.search(r"/\* loop matvec.prior \*/\n\s*" + re.escape(prior[0].header), source)
    assert not any(model.analysis.arbitrated.values())
    image = weight_image(program, spec, RandomWeights(spec))
    engine = Engine(source, encode_stream(program, image_bytes(program)), image)
    engine.step(4, 1)
    for op, cost in zip(down, costs, strict=True):
        assert cost["bursts"] == _sent(engine, ops.index(op), 7, 2)
    stream = encode_stream(program, image_bytes(program))
    plain = engine_source(program.identity.data, program.params)
    with pytest.raises(StreamError, match="streams a matvec's columns in parts, and this engine has no ENGINE_COLUMNS"):
        Engine(plain, stream, image)
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(aoc_report.ReportError, match="and the engine has no ENGINE_COLUMNS"):
        cost_model.band(engine=cost_model.Engine.read(plain), words=words, ctx=32)


def test_qwen2_5_7b_builds_at_ctx_8192_in_bf16_with_its_down_projections_in_parts() -> None:
    """Qwen2.5-7B's down projections read 18944 numbers: each is two parts (16384, then 2560), and the step costs
    within 73% of its roofline at the band's low end, nothing arbitrated (code only, no weight read)."""
    from logos_ir.author import written
    from logos_ir.parser import parse_program
    from logos_ir.program import Cut
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import lower_program

    text, _ = written(ModelSpec.preset("qwen2.5-7b"), Cut.decode(8192))
    program = lower_program(parse_program(text.text, "<decode>"), "bf16")
    down = [op.part for op in program.instructions() if isinstance(op, d5005.MatvecOp)
            and "down_proj" in op.weight.tensor.data]  # fmt: skip
    assert down == [(0, 16384), (16384, 2560)] * 28
    low = cost_model.band(program)["low"]
    assert low["tokens_per_s"] > 0.7 * low["roofline_tokens_per_s"]
