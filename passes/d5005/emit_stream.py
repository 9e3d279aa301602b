"""The D5005 instruction stream: a `d5005.program` as the binary the engine reads (format in docs/d5005.md).

A 4 KiB header (magic `D5005ENG`, version, counts, the engine parameters, the bank bytes the program uses, CRC-32s
of the sections, and the identity line of the decode step at byte 128), then one 64-byte instruction word (16
little-endian uint32) per instruction, then a symbol section (UTF-8 JSON: the buffers' names and the regions'
names and shapes) that the engine never reads and the reader uses to give the instructions back as `d5005` ops.
`encode_instruction` is the one place an op becomes a word; `logos_ir.runtime.d5005.read_stream` is its inverse.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable

import numpy as np
from xdsl.ir import SSAValue

from logos_ir.dialects import d5005
from logos_ir.errors import PassError

HEADER_FIELDS = 17  # uint32 fields after the magic, then two uint64 (bank bytes used, image bytes per bank)
HEADER = struct.Struct("<8s" + "I" * HEADER_FIELDS + "QQ")  # the fixed fields before the identity line


def _burst_offset(region: d5005.RegionAttr, burst: int) -> int:
    return region.offset.data // burst


def _f32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def buffer_field(buffer: SSAValue, burst: int) -> int:
    """The field that names an instruction's buffer operand: its array's id above `d5005.OFFSET_BITS`, its offset
    into that array in bank words below (a buffer starts on a bank word: the verifier checks it)."""
    owner = buffer.owner
    assert isinstance(owner, d5005.BufferOp) and owner.array_name is not None
    return d5005.ARRAY_IDS[owner.array_name] << d5005.OFFSET_BITS | owner.offset.value.data // (burst // 4)


class _Word:
    """One instruction word being filled: its 16 fields and the burst its region offsets count in."""

    def __init__(self, op: d5005.InstructionOp, burst: int):
        self.w = [0] * d5005.INSTRUCTION_WORDS
        self.w[d5005.W_OPCODE] = d5005.OPCODES[op.name]
        self.burst = burst

    def region(self, r: d5005.RegionAttr, offset_field: int = d5005.W_OFFSET) -> None:
        self.w[d5005.W_ROWS], self.w[d5005.W_COLS] = r.rows.data, r.cols.data
        self.w[offset_field], self.w[d5005.W_STRIDE] = _burst_offset(r, self.burst), r.stride.data

    def buffers(self, *fields: tuple[int, SSAValue]) -> None:
        for index, buffer in fields:
            self.w[index] = buffer_field(buffer, self.burst)


def _embed_row(op: d5005.EmbedRowOp, word: _Word) -> None:
    word.buffers((d5005.W_DST, op.dst))
    word.region(op.table)
    word.w[d5005.W_FORMAT] = d5005.STORED_FORMATS.get(op.table.stored, 0)  # the table's rows as stored (0: floats)
    if op.scale is not None:  # each number times it (0: none)
        word.w[d5005.W_EMBED_SCALE] = _f32_bits(op.scale.value.data)


def _matvec(op: d5005.MatvecOp, word: _Word) -> None:
    word.buffers((d5005.W_DST, op.dst), (d5005.W_A, op.src))
    word.region(op.weight)
    word.w[d5005.W_FORMAT] = d5005.STORED_FORMATS.get(op.weight.stored, 0)  # the rows as stored (0: floats)
    word.w[d5005.W_FIRST], word.w[d5005.W_COLS] = op.part  # a part of the columns (the first, its count)
    if op.slot is not None and op.experts is not None and op.routes is not None:  # one of the stacked experts
        word.w[d5005.W_ROWS] = op.expert_rows
        word.w[d5005.W_SLOT] = op.slot.value.data + 1
        word.w[d5005.W_ROUTES] = _burst_offset(op.routes, word.burst)
        word.w[d5005.W_EXPERT_STRIDE] = op.expert_stride // word.burst
        word.w[d5005.W_EXPERTS] = op.experts.value.data
    if op.bias is not None:  # its length (0: none) and where it starts in bank 0
        word.w[d5005.W_BIAS] = op.bias.cols.data
        word.w[d5005.W_BIAS_OFFSET] = _burst_offset(op.bias, word.burst)


def _rms_norm(op: d5005.RMSNormOp, word: _Word) -> None:
    word.buffers((d5005.W_DST, op.dst), (d5005.W_A, op.src))
    word.region(op.weight)
    word.w[d5005.W_FLOAT] = _f32_bits(op.epsilon.value.data)
    word.w[d5005.W_PLUS_ONE] = int(op.plus_one is not None)


def _rope(op: d5005.RopeOp, word: _Word) -> None:
    word.buffers((d5005.W_DST, op.dst), (d5005.W_A, op.src))
    word.region(op.table)
    word.w[d5005.W_WIDTH], word.w[d5005.W_HEAD_DIM] = op.width.value.data, op.head_dim.value.data
    if op.rotary_dim is not None:  # only the first rotary_dim numbers of each head rotate
        word.w[d5005.W_ROTARY] = op.rotary_dim.value.data
    if op.norm is not None and op.epsilon is not None:  # each head RMS-normed first: the flag, the weight, epsilon
        word.w[d5005.W_HEAD_NORM] = 1
        word.w[d5005.W_NORM_OFFSET] = _burst_offset(op.norm, word.burst)
        word.w[d5005.W_FLOAT] = _f32_bits(op.epsilon.value.data)
        word.w[d5005.W_PLUS_ONE] = int(op.plus_one is not None)


def _cache_write(op: d5005.CacheWriteOp, word: _Word) -> None:
    word.buffers((d5005.W_A, op.src))
    word.w[d5005.W_KV_HEADS] = op.kv_heads.value.data
    word.region(op.cache)


def _attention(op: d5005.AttentionOp, word: _Word) -> None:
    w = word.w
    word.buffers((d5005.W_DST, op.dst), (d5005.W_A, op.query))
    word.region(op.keys)
    w[d5005.W_OFFSET2] = _burst_offset(op.values, word.burst)
    w[d5005.W_HEADS], w[d5005.W_KV_HEADS] = op.heads.value.data, op.kv_heads.value.data
    word.buffers((d5005.W_KEY, op.key), (d5005.W_VALUE, op.value))
    w[d5005.W_HEAD_DIM], w[d5005.W_CTX] = op.keys.cols.data, op.ctx
    scale = op.scale.value.data if op.scale is not None else 1 / np.sqrt(op.keys.cols.data)
    w[d5005.W_FLOAT] = _f32_bits(scale)  # as the reference scales, in float32
    if op.softcap is not None:  # the cap's bits in the high halves of the two head counts
        bits = _f32_bits(op.softcap.value.data)
        w[d5005.W_SOFTCAP_HIGH] |= bits & ~d5005.COUNT_MASK & 0xFFFFFFFF
        w[d5005.W_SOFTCAP_LOW] |= (bits & d5005.COUNT_MASK) << 16
    w[d5005.W_WINDOW] = op.window.value.data if op.window is not None else 0


def _elementwise(op: d5005.ElementwiseOp, word: _Word) -> None:
    word.buffers((d5005.W_DST, op.dst), (d5005.W_A, op.lhs), (d5005.W_B, op.rhs))
    word.w[d5005.W_ROWS] = op.size.value.data
    if isinstance(op, d5005.SiluMulOp) and op.gelu_tanh is not None:
        word.w[d5005.W_GELU] = 1


def _argmax(op: d5005.ArgmaxOp, word: _Word) -> None:
    word.buffers((d5005.W_A, op.src))
    word.w[d5005.W_ROWS] = op.size.value.data
    if op.cap is not None:  # the logits soft-capped first (0: none)
        word.w[d5005.W_CAP] = _f32_bits(op.cap.value.data)


def _route(op: d5005.RouteOp, word: _Word) -> None:
    word.buffers((d5005.W_A, op.src))
    word.region(op.routes)  # rows: a row of ids in each bank; cols: top_k
    word.w[d5005.W_ROUTE_EXPERTS] = op.experts.value.data
    word.w[d5005.W_RENORMALIZE] = int(op.renormalize is not None)


def _expert_sum(op: d5005.ExpertSumOp, word: _Word) -> None:
    word.buffers((d5005.W_DST, op.dst), (d5005.W_A, op.src))
    word.w[d5005.W_ROWS] = op.size.value.data
    word.w[d5005.W_SUM_SLOT] = op.slot.value.data


_FIELDS: dict[type[d5005.InstructionOp], Callable[..., None]] = {
    d5005.EmbedRowOp: _embed_row,
    d5005.MatvecOp: _matvec,
    d5005.RMSNormOp: _rms_norm,
    d5005.RopeOp: _rope,
    d5005.CacheWriteOp: _cache_write,
    d5005.AttentionOp: _attention,
    d5005.SiluMulOp: _elementwise,
    d5005.AddOp: _elementwise,
    d5005.ArgmaxOp: _argmax,
    d5005.RouteOp: _route,
    d5005.ExpertSumOp: _expert_sum,
}


def encode_instruction(op: d5005.InstructionOp, burst: int) -> list[int]:
    """The 16 words of one instruction."""
    fill = _FIELDS.get(type(op))
    if fill is None:
        raise PassError(f"d5005 stream: '{op.name}' has no instruction word")
    word = _Word(op, burst)
    fill(op, word)
    return word.w


def symbols(program: d5005.ProgramOp) -> dict[str, list[list[object]]]:
    """Names the engine does not need: each buffer (name, words, offset, array) and region (name, offset, stride,
    rows, cols, element bytes), in program order."""
    regions: dict[str, d5005.RegionAttr] = {}
    for op in program.instructions():
        for region in op.regions_read():
            regions.setdefault(region.tensor.data, region)
    return {
        "buffers": [[b.label.data, b.words.value.data, b.offset.value.data, b.array_name] for b in program.buffers()],
        "regions": [
            [name, r.offset.data, r.stride.data, r.rows.data, r.cols.data, r.element_bytes.data]
            + ([r.stored] if r.stored else [])  # a stored region's format, after its element bytes
            for name, r in regions.items()
        ],
    }


def bank_end(program: d5005.ProgramOp) -> int:
    """The bytes of each bank the program's regions reach."""
    return max((r.end for op in program.instructions() for r in op.regions_read()), default=0)


def header(
    magic: bytes, identity: str, fields: tuple[int, ...], sizes: tuple[int, int]
) -> bytes:  # fields: 17 uint32 after the magic, sizes: 2 uint64
    line = identity.encode("utf-8")
    if d5005.IDENTITY_AT + len(line) > d5005.HEADER_BYTES:
        raise PassError("d5005 stream: the identity line does not fit the header")
    fixed = HEADER.pack(magic, *fields, *sizes)
    block = fixed + bytes(d5005.IDENTITY_AT - len(fixed)) + line
    return block + bytes(d5005.HEADER_BYTES - len(block))


def encode_stream(program: d5005.ProgramOp, image_bytes: int) -> bytes:
    """The whole stream: header, instruction words, symbols. `image_bytes` is what the weight image fills of each
    bank (the host loads that much, then zeroes the caches after it)."""
    params = program.params
    words = [encode_instruction(op, params.burst_bytes) for op in program.instructions()]
    body = np.array(words, dtype="<u4").tobytes()
    names = json.dumps(symbols(program), separators=(",", ":")).encode("utf-8")
    identity = program.identity.data
    fields = (
        d5005.FORMAT_VERSION,
        d5005.HEADER_BYTES,
        len(words),
        d5005.INSTRUCTION_BYTES,
        params.burst_bytes,
        params.vector_width,
        params.mac_lanes,
        params.onchip_words,
        d5005.BANKS,
        d5005.WEIGHT_BYTES[params.weights],
        program.ctx.value.data,
        params.clock_mhz,
        zlib.crc32(body),
        len(names),
        zlib.crc32(names),
        len(identity.encode("utf-8")),
        0,
    )
    return header(d5005.STREAM_MAGIC, identity, fields, (bank_end(program), image_bytes)) + body + names
