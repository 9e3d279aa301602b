"""The D5005 binaries: the instruction stream round trips (written, read back, the same ops), and a malformed or
truncated stream or weight image is refused by the reader with a clear error before anything runs."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

from logos_ir.author import written
from logos_ir.dialects import d5005
from logos_ir.parser import parse_program
from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
from logos_ir.passes.d5005.emit_opencl import engine_source
from logos_ir.passes.d5005.emit_stream import encode_stream
from logos_ir.program import Cut
from logos_ir.runtime.d5005 import StreamError, decode_ops, read_image, read_stream
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_program
from logos_ir.weights import RandomWeights

SPEC = ModelSpec.preset("tiny")


def lowered(weights: str = "bf16", spec: ModelSpec = SPEC) -> d5005.ProgramOp:
    text, _ = written(spec, Cut.decode(64))
    return lower_program(parse_program(text.text, "<tiny>"), weights)


@pytest.fixture(scope="module")
def program() -> d5005.ProgramOp:
    return lowered()


@pytest.fixture(scope="module")
def stream(program: d5005.ProgramOp) -> bytes:
    return encode_stream(program, image_bytes(program))


@pytest.mark.parametrize("weights", ["bf16", "f32"])
def test_the_stream_round_trips_to_the_same_ops(weights: str) -> None:
    program = lowered(weights, ModelSpec.preset("tiny-tp8"))
    data = encode_stream(program, image_bytes(program))
    read = read_stream(data)
    assert read.identity == program.identity.data and read.weights == weights and read.ctx == 64
    assert len(read.words) == len(program.instructions())
    decoded = decode_ops(read)
    assert [str(op) for op in decoded] == [str(op) for op in program.body.block.ops]
    rebuilt = d5005.ProgramOp(read.identity, program.params, read.ctx, decoded)
    rebuilt.verify()
    assert encode_stream(rebuilt, image_bytes(rebuilt)) == data


def test_the_header_carries_the_identity_in_its_first_4_kib(program: d5005.ProgramOp, stream: bytes) -> None:
    assert stream.startswith(d5005.STREAM_MAGIC)
    assert program.identity.data.encode() in stream[: d5005.HEADER_BYTES]
    assert (len(stream) - d5005.HEADER_BYTES) >= 64 * len(program.instructions())


def _restamp(data: bytearray) -> bytes:
    """Fix the CRC-32 of the instruction words, so a bad word reaches the word checks."""
    count = struct.unpack_from("<I", data, 16)[0]
    body = bytes(data[d5005.HEADER_BYTES : d5005.HEADER_BYTES + 64 * count])
    struct.pack_into("<I", data, 8 + 4 * 12, zlib.crc32(body))
    return bytes(data)


def _field(array: str, bank_word: int) -> int:
    """A buffer field: the array's id in the top byte, the offset in bank words below."""
    return d5005.ARRAY_IDS[array] << 24 | bank_word


def _word(data: bytes, index: int, field: int, value: int) -> bytes:
    edited = bytearray(data)
    struct.pack_into("<I", edited, d5005.HEADER_BYTES + 64 * index + 4 * field, value)
    return _restamp(edited)


def _symbols(data: bytes, names: bytes) -> bytes:
    """The stream with another symbol section, its size and CRC-32 restamped."""
    count = struct.unpack_from("<I", data, 16)[0]
    end = d5005.HEADER_BYTES + 64 * count
    edited = bytearray(data[:end] + names)
    struct.pack_into("<I", edited, 8 + 4 * 13, len(names))
    struct.pack_into("<I", edited, 8 + 4 * 14, zlib.crc32(names))
    return bytes(edited)


MALFORMED = {
    "empty": (lambda s: b"", "truncated"),
    "header cut short": (lambda s: s[:1000], "truncated"),
    "last word cut short": (lambda s: s[: d5005.HEADER_BYTES + 64 * 3 + 10], "truncated"),
    "trailing bytes": (lambda s: s + b"\0", "longer than its header says"),
    "wrong magic": (lambda s: b"NOTANENG" + s[8:], "not a D5005 instruction stream"),
    "future version": (
        lambda s: s[:8] + struct.pack("<I", d5005.FORMAT_VERSION + 1) + s[12:],
        f"format version {d5005.FORMAT_VERSION + 1}",
    ),
    "flipped bit": (lambda s: s[:-1] + bytes([s[-1] ^ 1]), "corrupt"),
    "flipped word bit": (
        lambda s: s[: d5005.HEADER_BYTES + 5] + bytes([s[d5005.HEADER_BYTES + 5] ^ 4]) + s[d5005.HEADER_BYTES + 6 :],
        "corrupt",
    ),
    "unknown opcode": (lambda s: _word(s, 2, d5005.W_OPCODE, 77), "opcode 77"),
    "reserved word set": (lambda s: _word(s, 1, d5005.W_RESERVED, 1), "reserved"),
    "buffer past its on-chip array": (
        lambda s: _word(s, 1, d5005.W_DST, _field("inputs", 1 << 20)),
        "reaches past the 131072 words of on-chip array 'inputs' with its dst",
    ),
    "buffer in an array its routine has no port on": (
        lambda s: _word(s, 1, d5005.W_DST, _field("outputs", 0)),
        r"\(d5005.rms_norm\) names array 'outputs' for its dst, which it reaches only in inputs",
    ),
    "buffer in an array the engine lacks": (lambda s: _word(s, 1, d5005.W_DST, 7 << 24), "array id 7"),
    "region past the program's memory": (lambda s: _word(s, 2, d5005.W_OFFSET, 1 << 24), "past the"),
    "more query heads to a KV head than the engine has": (lambda s: _word(s, 9, d5005.W_HEADS, 18), "at most 8"),
    "attention with a head size of 0": (lambda s: _word(s, 9, d5005.W_HEAD_DIM, 0), "head size 0"),
    "a row wider than its stride": (lambda s: _word(s, 2, d5005.W_COLS, 1000), "not a region of the engine"),
    "a rotary table shorter than the cache": (lambda s: _word(s, 5, d5005.W_ROWS, 8), "by a table of 8 rows"),
    "symbols that are not JSON": (lambda s: _symbols(s, b"{not json"), "not JSON"),
    "symbols of the wrong shape": (lambda s: _symbols(s, b'{"buffers": [["x", -1, 0]]}'), "malformed 'buffers'"),
    "identity erased": (
        lambda s: s[: d5005.IDENTITY_AT] + bytes(40) + s[d5005.IDENTITY_AT + 40 :],
        "no identity line",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_stream_is_refused(stream: bytes, case: str) -> None:
    corrupt, message = MALFORMED[case]
    with pytest.raises(StreamError, match=message) as refusal:
        read_stream(corrupt(stream))
    assert str(refusal.value).startswith("error: ")


def test_an_engine_never_runs_a_malformed_stream(stream: bytes, program: d5005.ProgramOp) -> None:
    from logos_ir.runtime.d5005 import Engine

    image = weight_image(program, SPEC, RandomWeights(SPEC))
    with pytest.raises(StreamError, match="truncated"):
        Engine("this source is never built", stream[:-64], image)
    with pytest.raises(StreamError, match="truncated or padded"):
        Engine("this source is never built", stream, image[:-1])
    f32_engine = engine_source(program.identity.data, d5005.EngineParams(weights="f32"))
    with pytest.raises(StreamError, match="for an engine with WEIGHT_BYTES 2, this engine's is 4"):
        Engine(f32_engine, stream, image)


def test_the_weight_image_stripes_rows_over_the_banks(program: d5005.ProgramOp) -> None:
    store = RandomWeights(SPEC, seed=2)
    image = read_image(weight_image(program, SPEC, store))
    assert image.identity == program.identity.data and image.element_bytes == 2
    region = next(op.weight for op in program.instructions() if isinstance(op, d5005.MatvecOp))
    expected = store.get(region.tensor.data)
    for row in (0, 1, 2, 3, 5, region.rows.data - 1):
        bank = image.banks[row % d5005.BANKS]
        at = region.offset.data + (row // d5005.BANKS) * region.stride.data
        bits = np.frombuffer(bank[at : at + 2 * region.cols.data], dtype=np.uint16).astype(np.uint32) << 16
        np.testing.assert_allclose(bits.view(np.float32), expected[row], rtol=2**-8)


def test_a_module_round_trips_through_mlir_text(program: d5005.ProgramOp) -> None:
    from xdsl.context import Context
    from xdsl.dialects.builtin import Builtin
    from xdsl.parser import Parser

    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(d5005.D5005)
    module = ModuleOp([program.clone()])
    assert str(Parser(ctx, str(module)).parse_module()) == str(module)
