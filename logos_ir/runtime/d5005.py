"""Runs the D5005 lane's output: the engine's OpenCL C on an OpenCL device, fed the weight image and the
instruction stream exactly as the host program on the card does.

`read_stream` and `read_image` check the binaries before anything runs (magic, version, sizes, CRC-32s, every
instruction word's opcode and fields against the engine's limits): a malformed or truncated stream is refused
with a `StreamError` naming what is wrong, never run. `Engine` is the host program: it builds the engine source
(here on PoCL's CPU device, `logos_ir.runtime.opencl`), allocates the four banks, copies each bank's part of the
image, zeroes the caches after it, and launches the engine once per decode step (token and position from 1).
`D5005Generator` is `logos-run --backend d5005`: it builds the decode step for the ctx a call needs with the
registry's `d5005` compile target (in memory, or reads a build folder), and feeds the prompt, then each new token,
through decode steps.
"""

from __future__ import annotations

import json
import re
import struct
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from logos_ir.dialects import d5005
from logos_ir.errors import LogosError
from logos_ir.generate import StepGenerator
from logos_ir.program import Cut, Identity

BUILD_FILES = ("engine.cl", "instructions.bin", "weights.bin")
_HEADER = struct.Struct("<8s" + "I" * 17 + "QQ")


class StreamError(LogosError):
    """An instruction stream or weight image is malformed or truncated: it is refused, never run."""


# -- reading the binaries ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """An instruction stream, read and checked: its header fields, its words [count, 16] and its symbols."""

    identity: str
    burst: int
    vector_width: int
    mac_lanes: int
    onchip_words: int
    element_bytes: int
    ctx: int
    clock_mhz: int
    bank_bytes: int
    image_bytes: int
    words: np.ndarray
    symbols: dict[str, Any] = field(repr=False)

    @property
    def weights(self) -> str:
        return {2: "bf16", 4: "f32"}[self.element_bytes]

    @property
    def embed_rows(self) -> int:
        """The tokens the program's embedding has (the rows its embed_row instructions read)."""
        embed = d5005.OPCODES["d5005.embed_row"]
        return min((int(w[d5005.W_ROWS]) for w in self.words if w[0] == embed), default=0)


def _fields(data: bytes, magic: bytes, what: str) -> tuple[Any, ...]:
    if len(data) < d5005.HEADER_BYTES:
        raise StreamError(f"the {what} is truncated: {len(data)} bytes, less than its {d5005.HEADER_BYTES}-byte header")
    fields = _HEADER.unpack_from(data)
    if fields[0] != magic:
        raise StreamError(f"not a D5005 {what}: it starts with {fields[0]!r}, not {magic!r}")
    if fields[1] != d5005.FORMAT_VERSION or fields[2] != d5005.HEADER_BYTES:
        raise StreamError(
            f"the {what} has format version {fields[1]}, header {fields[2]} bytes;"
            f" this reader knows {d5005.FORMAT_VERSION}"
        )
    return fields


def _identity(data: bytes, length: int, what: str) -> str:
    raw = data[d5005.IDENTITY_AT : d5005.IDENTITY_AT + length]
    if d5005.IDENTITY_AT + length > d5005.HEADER_BYTES or Identity.from_line(raw.decode("utf-8", "replace")) is None:
        raise StreamError(f"the {what}'s header carries no identity line of a LOGOS program")
    return raw.decode("utf-8")


def read_stream(data: bytes) -> Stream:
    """The stream in `data`, checked through (StreamError on anything malformed or truncated)."""
    f = _fields(data, d5005.STREAM_MAGIC, "instruction stream")
    count, word_bytes, burst, vector, lanes, onchip, banks, element, ctx, clock = f[3:13]
    crc_words, symbol_bytes, crc_symbols, identity_bytes = f[13:17]
    bank_bytes, image_bytes = f[18:20]
    if word_bytes != d5005.INSTRUCTION_BYTES or banks != d5005.BANKS or element not in (2, 4):
        raise StreamError(f"the stream is for another engine: {word_bytes}-byte words, {banks} banks, {element}-byte")
    expected = d5005.HEADER_BYTES + count * word_bytes + symbol_bytes
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "longer than its header says"
        raise StreamError(f"the instruction stream is {state}: {len(data)} bytes, its header says {expected}")
    body = data[d5005.HEADER_BYTES : d5005.HEADER_BYTES + count * word_bytes]
    names = data[d5005.HEADER_BYTES + count * word_bytes :]
    if zlib.crc32(body) != crc_words or zlib.crc32(names) != crc_symbols:
        raise StreamError("the instruction stream is corrupt: a CRC-32 of its sections does not match its header")
    if bank_bytes > d5005.BANK_BYTES or image_bytes > bank_bytes or burst < 4 or burst & (burst - 1):
        raise StreamError(f"the stream's sizes are impossible: {bank_bytes} bytes of a bank, burst {burst}")
    words = np.frombuffer(body, dtype="<u4").reshape(count, d5005.INSTRUCTION_WORDS)
    stream = Stream(
        _identity(data, identity_bytes, "instruction stream"),
        burst, vector, lanes, onchip, element, ctx, clock, bank_bytes, image_bytes, words,
        _symbols(names),
    )  # fmt: skip
    for index in range(count):
        _check_word(stream, index)
    return stream


_OPCODE_NAMES = {code: name for name, code in d5005.OPCODES.items()}


def _symbols(names: bytes) -> dict[str, Any]:
    """The symbol section: {"buffers": [[name, words, offset, array]], "regions": [[name, offset, stride, rows,
    cols, element bytes (, the format a stored region's rows are in)]]}, checked for those shapes (the engine
    never reads it; `decode_ops` names ops with it)."""
    try:
        found = json.loads(names.decode("utf-8")) if names else {}
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise StreamError("the instruction stream's symbol section is not JSON") from None
    if not isinstance(found, dict):
        raise StreamError("the instruction stream's symbol section is not a JSON object")
    shapes = {"buffers": [(str, int, int, str)], "regions": [(str, int, int, int, int, int), (str, *[int] * 5, str)]}
    for key, accepted in shapes.items():
        entries = found.get(key, [])
        if not isinstance(entries, list) or not all(any(_is_entry(e, s) for s in accepted) for e in entries):
            raise StreamError(f"the instruction stream's symbol section has malformed '{key}'")
    return found


def _is_entry(entry: object, shape: tuple[type, ...]) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) == len(shape)
        and all(isinstance(v, t) and not isinstance(v, bool) for v, t in zip(entry, shape, strict=True))
        and all(v >= 0 for v in entry[1:] if isinstance(v, int))
    )


def _check_word(stream: Stream, index: int) -> None:
    """Refuse a word the engine could not run safely: every on-chip word and every byte of board memory it would
    touch lies inside the engine's memories, and every shape the routines divide by or unroll over is in range."""
    w = [int(v) for v in stream.words[index]]
    name = _OPCODE_NAMES.get(w[d5005.W_OPCODE])
    where = f"instruction {index}"
    if name is None:
        raise StreamError(f"{where} has opcode {w[0]}, which the engine does not have")
    if w[d5005.W_RESERVED] and name != "d5005.attention":
        raise StreamError(f"{where} ({name}) sets its reserved word")
    shape = _shape_error(stream, name, w)
    if shape:
        raise StreamError(f"{where} ({name}) {shape}")
    for field_index, words in _buffer_extents(name, w, stream):
        _check_buffer_field(stream, f"{where} ({name})", name, field_index, w[field_index], words)
    for offset_field in _region_fields(name):
        per_bank = -(-w[d5005.W_ROWS] // d5005.BANKS)
        end = w[offset_field] * stream.burst + per_bank * w[d5005.W_STRIDE]
        if end > stream.bank_bytes:
            raise StreamError(
                f"{where} ({name}) reads board memory past the {stream.bank_bytes} bytes the program uses"
            )


_ARRAY_NAMES = {code: array for array, code in d5005.ARRAY_IDS.items()}
_OFFSET_MASK = (1 << d5005.OFFSET_BITS) - 1


def _check_buffer_field(stream: Stream, where: str, name: str, index: int, value: int, words: int) -> None:
    """A buffer field names an array the routine reaches that operand in, and the buffer lies inside it."""
    operand, arrays = next((o, a) for o, (f, a) in d5005.OPERANDS[name].items() if f == index)
    array = _ARRAY_NAMES.get(value >> d5005.OFFSET_BITS)
    if array not in arrays:
        found = f"array '{array}'" if array else f"array id {value >> d5005.OFFSET_BITS}, which the engine lacks"
        raise StreamError(f"{where} names {found} for its {operand}, which it reaches only in {' or '.join(arrays)}")
    size = d5005.array_words(stream.onchip_words, array)
    if (value & _OFFSET_MASK) * (stream.burst // 4) + words > size:
        raise StreamError(f"{where} reaches past the {size} words of on-chip array '{array}' with its {operand}")


_STORED_NAMES = {code: fmt for fmt, code in d5005.STORED_FORMATS.items()}


def stored_format(name: str, w: list[int]) -> str:
    """The block format an embedding row's or a matvec's weight streams in (`d5005.STORED_FORMATS`), or ""."""
    return _STORED_NAMES.get(int(w[d5005.W_FORMAT]), "") if name in ("d5005.embed_row", "d5005.matvec") else ""


def row_words(name: str, w: list[int], stream: Stream) -> int:
    """Bank words of one row of the weight an embedding row or a matvec streams: as stored, or of floats."""
    fmt, cols = stored_format(name, w), int(w[d5005.W_COLS])
    return (
        d5005.stored_row_words(cols, fmt, stream.burst)
        if fmt
        else d5005.bank_words(cols, stream.element_bytes, stream.burst)
    )


def _stored_error(name: str, w: list[int], stream: Stream) -> str | None:
    code, cols = w[d5005.W_FORMAT], w[d5005.W_COLS]
    if name not in ("d5005.embed_row", "d5005.matvec") or code == 0:
        return None
    fmt = _STORED_NAMES.get(code)
    if fmt is None:
        return f"has weight format {code} in word {d5005.W_FORMAT}, not 0 or one of {sorted(_STORED_NAMES)}"
    first = w[d5005.W_FIRST] if name == "d5005.matvec" else 0
    if cols % d5005.BLOCK or first:
        return f"streams {fmt} rows of {cols} numbers from column {w[d5005.W_FIRST]}: not whole rows of blocks"
    if d5005.stored_row_words(cols, fmt, stream.burst) * stream.burst > w[d5005.W_STRIDE]:
        return f"has {fmt} rows of {cols} numbers, over its stride of {w[d5005.W_STRIDE]} bytes"
    return None


def _shape_error(stream: Stream, name: str, w: list[int]) -> str | None:
    rows, cols, stride = w[d5005.W_ROWS], w[d5005.W_COLS], w[d5005.W_STRIDE]
    element = 4 if name in ("d5005.rope", "d5005.route") else stream.element_bytes  # a table's, a route's ids
    stored = _stored_error(name, w, stream)
    if stored is not None:
        return stored
    if stored_format(name, w):
        element = 0  # a stored row's bytes: checked above
    if _region_fields(name) and (stride % stream.burst or cols * element > stride or rows == 0):
        return f"has rows of {cols} elements in a stride of {stride} bytes, {rows} rows: not a region of the engine"
    if name == "d5005.matvec" and cols > d5005.VECTOR_WORDS:
        return f"reads a vector of {cols} words, over the engine's {d5005.VECTOR_WORDS}"
    first = w[d5005.W_FIRST] if name == "d5005.matvec" else 0
    if first and rows > d5005.PRIOR_WORDS:
        return f"adds a part of its columns to {rows} rows, over the engine's {d5005.PRIOR_WORDS}-word copy of them"
    if first % d5005.VECTOR_WORDS or (first + cols) * element > stride or (first and w[d5005.W_BIAS]):
        return f"streams columns from {first}, {cols} of them, in a stride of {stride} bytes: not a part of its rows"
    expert = _expert_error(stream, name, w)
    if expert is not None:
        return expert
    if name == "d5005.matvec" and w[d5005.W_BIAS]:
        bias = w[d5005.W_BIAS]
        end = w[d5005.W_BIAS_OFFSET] * stream.burst + d5005.bank_words(bias, element, stream.burst) * stream.burst
        if bias != rows or bias > d5005.BIAS_WORDS or end > stream.bank_bytes:
            return f"adds a bias of {bias} words to {rows} rows, or reads it past the memory the program uses"
    flags = {"d5005.rms_norm": d5005.W_PLUS_ONE, "d5005.rope": d5005.W_PLUS_ONE, "d5005.silu_mul": d5005.W_GELU}
    if name in flags and w[flags[name]] > 1:
        return f"has flag {w[flags[name]]} in word {flags[name]}, not 0 or 1"
    if name == "d5005.rope" and w[d5005.W_PLUS_ONE] and not w[d5005.W_HEAD_NORM]:
        return "scales by one plus a head norm's weight, and norms no heads"
    if name == "d5005.argmax" and w[d5005.W_CAP] and not _f32(w[d5005.W_CAP]) > 0:
        return f"soft-caps at {_f32(w[d5005.W_CAP])}, not a positive cap"
    if name == "d5005.rope":
        head_dim, width = w[d5005.W_HEAD_DIM], w[d5005.W_WIDTH]
        if (
            head_dim < 2
            or head_dim % 2
            or width % head_dim
            or w[d5005.W_ROTARY] % 2
            or w[d5005.W_ROTARY] >= head_dim
            or cols != d5005.rope_row_floats(w[d5005.W_ROTARY] or head_dim, stream.burst)
            or rows < stream.ctx
        ):
            return f"rotates {width} words in heads of {head_dim} by a table of {rows} rows of {cols}"
        if d5005.bank_words(head_dim, 4, stream.burst) > d5005.ROW_WORDS_MAX * 2:
            return f"has heads of {head_dim}, over the engine's row registers"
        norm_end = (
            w[d5005.W_NORM_OFFSET] + d5005.bank_words(head_dim, stream.element_bytes, stream.burst)
        ) * stream.burst
        if w[d5005.W_HEAD_NORM] > 1 or (w[d5005.W_HEAD_NORM] and norm_end > stream.bank_bytes):
            return f"norms its heads with flag {w[d5005.W_HEAD_NORM]}, or by a weight past the memory the program uses"
    if name in ("d5005.cache_write", "d5005.attention"):
        kv = w[d5005.W_KV_HEADS] if name == "d5005.cache_write" else d5005.attention_counts(w)[1]
        if kv == 0 or rows % kv or rows // kv < stream.ctx or cols == 0:
            return f"has a cache of {rows} rows that is not {kv} heads of the stream's {stream.ctx} positions"
        if d5005.bank_words(cols, element, stream.burst) > d5005.ROW_WORDS_MAX:
            return f"has cache rows of {cols} elements, over the engine's {d5005.ROW_WORDS_MAX} bank words"
    if name == "d5005.attention":
        heads, kv, cap = d5005.attention_counts(w)
        if cap and not _f32(cap) > 0:
            return f"soft-caps its scores at {_f32(cap)}, not a positive cap"
        if heads == 0 or heads % kv or heads // kv > d5005.GROUP_MAX:
            return f"has {heads} heads over {kv} kv heads (at most {d5005.GROUP_MAX} to a group)"
        if w[d5005.W_HEAD_DIM] != cols or w[d5005.W_CTX] * kv != rows:
            return f"has head size {w[d5005.W_HEAD_DIM]} and ctx {w[d5005.W_CTX]}, not its cache's"
        if w[d5005.W_WINDOW] >= w[d5005.W_CTX]:
            return f"has a window of {w[d5005.W_WINDOW]}, not shorter than its cache of {w[d5005.W_CTX]}"
    return None


def _expert_error(stream: Stream, name: str, w: list[int]) -> str | None:
    """A route's and an expert's matvec's fields: every expert of the stack and the route's ids inside the memory
    the program uses, the slot one of the route registers, the counts in the engine's range."""
    if name == "d5005.route":
        experts, top_k = w[d5005.W_ROUTE_EXPERTS], w[d5005.W_COLS]
        if not 1 <= top_k <= min(experts, d5005.TOP_K_MAX) or experts > d5005.EXPERTS_MAX or w[d5005.W_ROWS] != 4:
            return f"chooses {top_k} of {experts} experts into {w[d5005.W_ROWS]} rows: not a route of the engine"
        if w[d5005.W_RENORMALIZE] > 1:
            return f"has flag {w[d5005.W_RENORMALIZE]} in word {d5005.W_RENORMALIZE}, not 0 or 1"
        return None
    if name == "d5005.expert_sum":
        return None if w[d5005.W_SUM_SLOT] < d5005.TOP_K_MAX else f"takes route register {w[d5005.W_SUM_SLOT]}"
    if name != "d5005.matvec" or not w[d5005.W_SLOT]:
        return None
    slot, experts, apart = w[d5005.W_SLOT] - 1, w[d5005.W_EXPERTS], w[d5005.W_EXPERT_STRIDE] * stream.burst
    per_bank = -(-w[d5005.W_ROWS] // d5005.BANKS) * w[d5005.W_STRIDE]
    end = w[d5005.W_OFFSET] * stream.burst + (experts - 1) * apart + per_bank
    routes = (w[d5005.W_ROUTES] + slot // (stream.burst // 4) + 1) * stream.burst
    if slot >= d5005.TOP_K_MAX or not 1 <= experts <= d5005.EXPERTS_MAX or apart < per_bank:
        return f"streams slot {slot} of {experts} experts {apart} bytes apart: not an expert's matvec of the engine"
    if end > stream.bank_bytes or routes > stream.bank_bytes or w[d5005.W_BIAS] or w[d5005.W_FIRST]:
        return "streams its experts or reads its route past the memory the program uses, or with a bias or in parts"
    return None


def _f32(bits: int) -> float:
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def _buffer_extents(name: str, w: list[int], stream: Stream) -> list[tuple[int, int]]:
    rows, cols = w[d5005.W_ROWS], w[d5005.W_COLS]
    if name == "d5005.embed_row":
        return [(d5005.W_DST, cols)]
    if name == "d5005.matvec":
        return [(d5005.W_DST, rows), (d5005.W_A, w[d5005.W_FIRST] + cols)]
    if name == "d5005.rms_norm":
        return [(d5005.W_DST, cols), (d5005.W_A, cols)]
    if name == "d5005.rope":
        return [(d5005.W_DST, w[d5005.W_WIDTH]), (d5005.W_A, w[d5005.W_WIDTH])]
    if name == "d5005.cache_write":
        return [(d5005.W_A, w[d5005.W_KV_HEADS] * cols)]
    if name == "d5005.attention":
        (heads, kv, _), head_dim = d5005.attention_counts(w), w[d5005.W_HEAD_DIM]
        current = kv * head_dim
        return [(d5005.W_DST, heads * head_dim), (d5005.W_A, heads * head_dim),
                (d5005.W_KEY, current), (d5005.W_VALUE, current)]  # fmt: skip
    if name == "d5005.argmax":
        return [(d5005.W_A, rows)]
    if name == "d5005.route":
        return [(d5005.W_A, w[d5005.W_ROUTE_EXPERTS])]
    if name == "d5005.expert_sum":
        return [(d5005.W_DST, rows), (d5005.W_A, rows)]
    return [(d5005.W_DST, rows), (d5005.W_A, rows), (d5005.W_B, rows)]


def _region_fields(name: str) -> list[int]:
    if name == "d5005.attention":
        return [d5005.W_OFFSET, d5005.W_OFFSET2]
    if name in ("d5005.silu_mul", "d5005.add", "d5005.argmax", "d5005.expert_sum"):
        return []
    return [d5005.W_OFFSET]


@dataclass(frozen=True)
class Image:
    identity: str
    element_bytes: int
    bank_size: int
    banks: list[memoryview]


def read_image(data: bytes) -> Image:
    """The weight image in `data`, checked (StreamError when malformed or truncated)."""
    f = _fields(data, d5005.IMAGE_MAGIC, "weight image")
    banks, element, identity_bytes = f[3], f[4], f[5]
    size = f[18]
    if banks != d5005.BANKS or element not in (2, 4):
        raise StreamError(f"the weight image is for another engine: {banks} banks of {element}-byte weights")
    expected = d5005.HEADER_BYTES + banks * size
    if len(data) != expected:
        raise StreamError(f"the weight image is {len(data)} bytes, its header says {expected}: truncated or padded")
    view = memoryview(data)
    start = d5005.HEADER_BYTES
    parts = [view[start + b * size : start + (b + 1) * size] for b in range(banks)]
    return Image(_identity(data, identity_bytes, "weight image"), element, size, parts)


def decode_ops(stream: Stream) -> list[Any]:
    """The stream's buffers (from its symbol section), then its instructions, as `d5005` ops over them: the
    inverse of the emitter."""
    from xdsl.utils.exceptions import VerifyException

    try:
        buffers = [d5005.BufferOp(*entry) for entry in stream.symbols.get("buffers", [])]
        bank_word = stream.burst // 4
        at = {
            d5005.ARRAY_IDS.get(op.array_name or "", 0) << d5005.OFFSET_BITS
            | op.offset.value.data // bank_word: op.buffer
            for op in buffers
        }
        regions = {r[1]: r for r in stream.symbols.get("regions", [])}
        return [*buffers, *(_decode(stream, [int(v) for v in row], at, regions) for row in stream.words)]
    except VerifyException as error:
        raise StreamError(f"the stream's symbols give an op that does not verify: {error}") from None


@dataclass
class _Word:
    """One instruction word being read back: its fields, and the buffers and regions the symbols name."""

    stream: Stream
    w: list[int]
    buffers: dict[int, Any]
    regions: dict[int, list[Any]]

    def region(self, offset_field: int = d5005.W_OFFSET) -> d5005.RegionAttr:
        offset = self.w[offset_field] * self.stream.burst
        found = self.regions.get(offset)
        if found is None:
            raise StreamError(f"the stream's symbols name no region at byte {offset}")
        return d5005.RegionAttr(*found)

    def buffer(self, index: int) -> Any:
        if self.w[index] not in self.buffers:
            array, offset = self.w[index] >> d5005.OFFSET_BITS, self.w[index] & _OFFSET_MASK
            raise StreamError(f"the stream's symbols name no buffer at bank word {offset} of array id {array}")
        return self.buffers[self.w[index]]

    def float(self) -> float:
        return float(np.array(self.w[d5005.W_FLOAT], dtype=np.uint32).view(np.float32))


def _embed_row(x: _Word) -> Any:
    return d5005.EmbedRowOp(x.buffer(d5005.W_DST), x.region(), x.float() if x.w[d5005.W_EMBED_SCALE] else None)


def _matvec(x: _Word) -> Any:
    bias = x.region(d5005.W_BIAS_OFFSET) if x.w[d5005.W_BIAS] else None
    weight = x.region()
    part = (x.w[d5005.W_FIRST], x.w[d5005.W_COLS])
    whole = part == (0, weight.cols.data)
    expert = (x.w[d5005.W_SLOT] - 1, x.w[d5005.W_EXPERTS], x.region(d5005.W_ROUTES)) if x.w[d5005.W_SLOT] else None
    dst, src = x.buffer(d5005.W_DST), x.buffer(d5005.W_A)
    return d5005.MatvecOp(dst, src, weight, bias, None if whole else part, expert)


def _route(x: _Word) -> Any:
    experts, top_k = x.w[d5005.W_ROUTE_EXPERTS], x.w[d5005.W_COLS]
    return d5005.RouteOp(x.buffer(d5005.W_A), x.region(), experts, top_k, bool(x.w[d5005.W_RENORMALIZE]))


def _expert_sum(x: _Word) -> Any:
    return d5005.ExpertSumOp(x.buffer(d5005.W_DST), x.buffer(d5005.W_A), x.w[d5005.W_SUM_SLOT], x.w[d5005.W_ROWS])


def _rms_norm(x: _Word) -> Any:
    plus_one = bool(x.w[d5005.W_PLUS_ONE])
    return d5005.RMSNormOp(x.buffer(d5005.W_DST), x.buffer(d5005.W_A), x.region(), x.float(), plus_one)


def _rope(x: _Word) -> Any:
    w = x.w
    norm = (x.region(d5005.W_NORM_OFFSET), x.float()) if w[d5005.W_HEAD_NORM] else None
    dst, src = x.buffer(d5005.W_DST), x.buffer(d5005.W_A)
    rotary = w[d5005.W_ROTARY] or None
    plus_one = bool(w[d5005.W_PLUS_ONE])
    return d5005.RopeOp(dst, src, x.region(), w[d5005.W_WIDTH], w[d5005.W_HEAD_DIM], norm, rotary, plus_one)


def _cache_write(x: _Word) -> Any:
    return d5005.CacheWriteOp(x.buffer(d5005.W_A), x.region(), x.w[d5005.W_KV_HEADS])


def _attention(x: _Word) -> Any:
    current = (x.buffer(d5005.W_KEY), x.buffer(d5005.W_VALUE))
    keys, values = x.region(), x.region(d5005.W_OFFSET2)
    dst, query = x.buffer(d5005.W_DST), x.buffer(d5005.W_A)
    window = x.w[d5005.W_WINDOW] or None
    plain = int(np.array(1 / np.sqrt(keys.cols.data), dtype=np.float32).view(np.uint32))
    scale = x.float() if x.w[d5005.W_FLOAT] != plain else None  # a scale of its own, not 1 / sqrt(head_dim)
    heads, kv, cap = d5005.attention_counts(x.w)
    softcap = _f32(cap) if cap else None
    return d5005.AttentionOp(dst, query, keys, values, current, heads, kv, window, scale, softcap)


def _elementwise(kind: type[d5005.ElementwiseOp]) -> Any:
    def make(x: _Word) -> Any:
        operands = (x.buffer(d5005.W_DST), x.buffer(d5005.W_A), x.buffer(d5005.W_B), x.w[d5005.W_ROWS])
        if kind is d5005.SiluMulOp:
            return d5005.SiluMulOp(*operands, gelu_tanh=bool(x.w[d5005.W_GELU]))
        return kind(*operands)

    return make


def _argmax(x: _Word) -> Any:
    return d5005.ArgmaxOp(x.buffer(d5005.W_A), x.w[d5005.W_ROWS], x.float() if x.w[d5005.W_CAP] else None)


_OPS = {
    "d5005.embed_row": _embed_row,
    "d5005.matvec": _matvec,
    "d5005.rms_norm": _rms_norm,
    "d5005.rope": _rope,
    "d5005.cache_write": _cache_write,
    "d5005.attention": _attention,
    "d5005.silu_mul": _elementwise(d5005.SiluMulOp),
    "d5005.add": _elementwise(d5005.AddOp),
    "d5005.argmax": _argmax,
    "d5005.route": _route,
    "d5005.expert_sum": _expert_sum,
}


def _decode(stream: Stream, w: list[int], buffers: dict[int, Any], regions: dict[int, list[Any]]) -> Any:
    return _OPS[_OPCODE_NAMES[w[0]]](_Word(stream, w, buffers, regions))


# -- the host program ------------------------------------------------------------------------------------------


class Engine:
    """The host program: the engine built from its source (or loaded from a compiled binary), the banks loaded
    from the image, the stream resident in board memory; `step(token, position)` runs one decode step (ids and
    positions from 1) and leaves the logits the engine wrote in `logits`.

    On an OpenCL device without Intel's channels (PoCL's CPU device here) each channel is an ordered buffer: the
    step runs as runs of whole instructions, each run one launch of the four bank readers (each filling its
    buffer in channel order; the host checks the words each sent against what the instruction words say) then
    one launch of the compute kernel over the same run (draining them in that order)."""

    def __init__(
        self, source: str, stream_bytes: bytes, image_bytes: bytes, binary: bytes | None = None, rings: bool = False
    ):
        import pyopencl as cl

        from logos_ir.runtime.opencl import cpu_context, cpu_runtime, intel_fpga_context

        self.stream = read_stream(stream_bytes)
        image = read_image(image_bytes)
        if image.identity != self.stream.identity or image.element_bytes != self.stream.element_bytes:
            raise StreamError("the weight image is not the one of this instruction stream (identity or precision)")
        if image.bank_size != self.stream.image_bytes:
            raise StreamError(
                f"the weight image fills {image.bank_size} bytes a bank, the stream expects {self.stream.image_bytes}"
            )
        _check_engine(source, self.stream)
        self.context = (intel_fpga_context() if binary is not None else None) or cpu_context()
        device = self.context.devices[0]
        self.rings = rings and binary is None
        if self.rings and device.max_compute_units < 1 + d5005.BANKS:
            on_pocl = cpu_runtime() == "pocl"
            raise LogosError(
                f"the channel path runs the engine's five kernels at once, and the OpenCL device"
                f" '{device.name.strip()}' runs {device.max_compute_units} at a time",
                hint=f"on PoCL, set POCL_MAX_PTHREAD_COUNT={1 + d5005.BANKS} (or more) before the process starts"
                if on_pocl
                else "Intel's CPU runtime runs as many kernels at once as the CPU has cores; PoCL's pthread device runs"
                f" {1 + d5005.BANKS} with POCL_MAX_PTHREAD_COUNT={1 + d5005.BANKS}, where its compiler knows the CPU",
            )
        self.fifo_words = _channel_depth(source) if self.rings else _fifo_words(self.stream)
        largest = max(self.stream.bank_bytes, self.fifo_words * self.stream.burst)
        if largest > device.max_mem_alloc_size:
            raise LogosError(
                f"the program needs buffers of {largest} bytes, more than the OpenCL device"
                f" '{device.name.strip()}' allocates at once ({device.max_mem_alloc_size} bytes)",
                hint="run a smaller model or a shorter ctx on this device; the card's banks hold 8 GiB each",
            )
        self.queue = cl.CommandQueue(self.context)
        self.program_cl = _built(self.context, source, binary, ["-D", "D5005_RINGS"] if self.rings else [])
        self.compute, self.readers = _kernels(self.program_cl)
        self.channels = self.compute.num_args == _COMPUTE_ARGS_ON_CHANNELS  # built by aoc: no ordered buffers
        concurrent = self.channels or self.rings
        self.queues = [cl.CommandQueue(self.context) for _ in range(1 + d5005.BANKS)] if concurrent else []
        flags = cl.mem_flags
        size = max(self.stream.bank_bytes, 4)
        self.banks = [
            cl.Buffer(self.context, flags.READ_WRITE | (_bank_flag(b) if self.channels else 0), size)
            for b in range(d5005.BANKS)
        ]
        self.fifos = [
            cl.Buffer(self.context, flags.READ_WRITE, max(self.fifo_words, 1) * self.stream.burst)
            for _ in range(d5005.BANKS)
        ]
        self.sent = [cl.Buffer(self.context, flags.READ_WRITE, 4) for _ in range(d5005.BANKS)]
        # the words the compute kernel took from each ring, then (a mixture's) the pc + 1 of the last route it ran
        self.taken = [cl.Buffer(self.context, flags.READ_WRITE, 8) for _ in range(d5005.BANKS)]
        self._image = image
        self.program = cl.Buffer(self.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=self.stream.words)
        self.scratch = cl.Buffer(self.context, flags.READ_WRITE, self.stream.onchip_words * 4)
        self.result = cl.Buffer(self.context, flags.READ_WRITE, 4)
        self.vocab = max((int(w[d5005.W_ROWS]) for w in self.stream.words if w[0] == _ARGMAX), default=0)
        self.logits_buffer = cl.Buffer(self.context, flags.READ_WRITE, max(self.vocab, 1) * 4)
        self.logits: np.ndarray | None = None
        self.reset()

    @classmethod
    def from_build(cls, folder: Path, aocx: Path | None = None) -> Engine:
        """The engine of a `logos-compile --target d5005 --with-weights` build folder, from its files (the engine
        from `aocx`, a compiled binary of its `engine.cl`, when given)."""
        missing = [name for name in BUILD_FILES if not (folder / name).is_file()]
        if missing:
            raise StreamError(
                f"{folder}: not a d5005 build with weights (missing {', '.join(missing)})",
                hint="build it with logos-compile --target d5005 --with-weights",
            )
        engine, stream, image = ((folder / name).read_bytes() for name in BUILD_FILES)
        return cls(engine.decode("utf-8"), stream, image, read_binary(aocx) if aocx is not None else None)

    def reset(self) -> None:
        """Load every bank's part of the image and zero the caches after it, as the host does before a sequence."""
        import pyopencl as cl

        for bank, part in zip(self.banks, self._image.banks, strict=True):
            cl.enqueue_fill_buffer(self.queue, bank, np.zeros(1, np.uint8), 0, max(self.stream.bank_bytes, 4))
            if len(part):
                cl.enqueue_copy(self.queue, bank, np.frombuffer(part, dtype=np.uint8))
        self.queue.finish()

    def check_step(self, token: int, position: int) -> None:
        if not 1 <= position <= self.stream.ctx:
            raise LogosError(f"position {position} is outside the engine's cache (positions 1 to {self.stream.ctx})")
        rows = self.stream.embed_rows
        if not 1 <= token <= rows:
            raise LogosError(f"token {token} is outside the engine's embedding (tokens 1 to {rows})")

    def step(self, token: int, position: int) -> int:
        """One decode step: the next token (from 1); `logits` then holds what the engine's arg-max read."""
        import pyopencl as cl

        self.check_step(token, position)
        if self.channels:
            return self._step_on_channels(token, position)
        if self.rings:
            return self._step_on_rings(token, position)
        scalars = (np.uint32(token), np.uint32(position))
        expected, sent = [], []
        for first, count, words in self._runs(token, position):
            head = (self.program, np.uint32(first), np.uint32(count))
            for b, reader in enumerate(self.readers):
                reader(self.queue, (1,), (1,), *head, self.banks[b], *scalars, self.fifos[b], self.sent[b])
                got = np.zeros(1, dtype=np.uint32)
                cl.enqueue_copy(self.queue, got, self.sent[b], is_blocking=False)
                sent.append(got)
            expected.extend(words)
            self.compute(
                self.queue, (1,), (1,), *head, *self.banks, self.scratch, *scalars, self.result, self.logits_buffer,
                *self.fifos,
            )  # fmt: skip
        out = np.zeros(1, dtype=np.uint32)
        cl.enqueue_copy(self.queue, out, self.result)
        logits = np.empty(self.vocab, dtype=np.float32)
        cl.enqueue_copy(self.queue, logits, self.logits_buffer)
        if [int(s[0]) for s in sent] != expected:
            raise LogosError("the engine's bank readers sent other words than the instruction words say")
        self.logits = logits
        return int(out[0])

    def _step_on_channels(self, token: int, position: int) -> int:
        """An engine built by `aoc` (its kernels joined by Intel channels): the four readers and the compute
        kernel launched at once over the whole step, each on its own queue, as Intel's runtime expects. (Written
        for the card; no Intel FPGA platform was at hand to run it.)"""
        import pyopencl as cl

        scalars = (np.uint32(token), np.uint32(position))
        head = (self.program, np.uint32(0), np.uint32(len(self.stream.words)))
        events = [
            reader(queue, (1,), (1,), *head, self.banks[b], *scalars)
            for b, (reader, queue) in enumerate(zip(self.readers, self.queues[1:], strict=True))
        ]
        done = self.compute(self.queues[0], (1,), (1,), *head, *self.banks, *scalars, self.result, self.logits_buffer)
        cl.wait_for_events([*events, done])
        out = np.zeros(1, dtype=np.uint32)
        cl.enqueue_copy(self.queue, out, self.result)
        logits = np.empty(self.vocab, dtype=np.float32)
        cl.enqueue_copy(self.queue, logits, self.logits_buffer)
        self.logits = logits
        return int(out[0])

    def _step_on_rings(self, token: int, position: int) -> int:
        """The channel path on a device without Intel's channels: the engine built with D5005_RINGS, the compute
        kernel and the four readers launched at once over the whole step, each on its own queue, the words moving
        through rings of the channels' depth; the host then checks the words each reader sent."""
        import pyopencl as cl

        for counter in self.sent:
            cl.enqueue_fill_buffer(self.queue, counter, np.zeros(1, np.uint32), 0, 4)
        for counter in self.taken:
            cl.enqueue_fill_buffer(self.queue, counter, np.zeros(1, np.uint32), 0, 8)
        self.queue.finish()
        scalars = (np.uint32(token), np.uint32(position))
        head = (self.program, np.uint32(0), np.uint32(len(self.stream.words)))
        done = self.compute(
            self.queues[0], (1,), (1,), *head, *self.banks, self.scratch, *scalars, self.result, self.logits_buffer,
            *self.fifos, *self.sent, *self.taken,
        )  # fmt: skip
        self.queues[0].flush()
        events = [done]
        for b, (reader, queue) in enumerate(zip(self.readers, self.queues[1:], strict=True)):
            events.append(reader(queue, (1,), (1,), *head, self.banks[b], *scalars, self.fifos[b], self.sent[b],
                                 self.taken[b]))  # fmt: skip
            queue.flush()
        cl.wait_for_events(events)
        expected = [0] * d5005.BANKS
        for w in self.stream.words:
            sent = bank_words_sent([int(v) for v in w], token, position, self.stream)
            expected = [e + n for e, n in zip(expected, sent, strict=True)]
        counts = []
        for counter in [*self.sent, *self.taken]:
            got = np.zeros(1, dtype=np.uint32)
            cl.enqueue_copy(self.queue, got, counter)
            counts.append(int(got[0]))
        if counts != expected + expected:
            raise LogosError("the engine's bank readers sent (or its compute kernel took) other words than the"
                             " instruction words say")  # fmt: skip
        out = np.zeros(1, dtype=np.uint32)
        cl.enqueue_copy(self.queue, out, self.result)
        logits = np.empty(self.vocab, dtype=np.float32)
        cl.enqueue_copy(self.queue, logits, self.logits_buffer)
        self.logits = logits
        return int(out[0])

    def _runs(self, token: int, position: int) -> list[tuple[int, int, list[int]]]:
        """The step as runs of whole instructions whose words fit each bank's ordered buffer: (first, count,
        words sent by each bank). A run ends at each route: its compute launch writes the chosen experts' ids
        that the next run's readers stream the experts by."""
        runs: list[tuple[int, int, list[int]]] = []
        first, totals = 0, [0] * d5005.BANKS
        for pc, w in enumerate(self.stream.words):
            words = bank_words_sent([int(v) for v in w], token, position, self.stream)
            routed = pc > 0 and int(self.stream.words[pc - 1][0]) == _ROUTE
            if pc > first and (routed or any(t + n > self.fifo_words for t, n in zip(totals, words, strict=True))):
                runs.append((first, pc - first, totals))
                first, totals = pc, [0] * d5005.BANKS
            totals = [t + n for t, n in zip(totals, words, strict=True)]
        runs.append((first, len(self.stream.words) - first, totals))
        return runs

    def onchip(self, array: str, words: int) -> np.ndarray:
        """The first `words` of one on-chip array after the last step: on a device without aoc the arrays are
        slices of one scratch buffer, in `d5005.ARRAYS` order, at the `*_AT` offsets the engine's source states."""
        import pyopencl as cl

        before = d5005.ARRAYS[: d5005.ARRAYS.index(array)]
        at = sum(d5005.array_words(self.stream.onchip_words, a) for a in before)
        out = np.empty(words, dtype=np.float32)
        cl.enqueue_copy(self.queue, out, self.scratch, src_offset=at * 4)
        return out


def _check_engine(source: str, stream: Stream) -> None:
    """The stream was lowered for this engine: the same burst, on-chip words and weight precision as the
    `#define`s of its source (a stream for another engine would run out of its bounds)."""
    wanted = {"BURST_BYTES": stream.burst, "ONCHIP_WORDS": stream.onchip_words, "WEIGHT_BYTES": stream.element_bytes}
    for name, value in wanted.items():
        found = re.search(rf"^#define {name} (\d+)$", source, flags=re.MULTILINE)
        if found is None or int(found.group(1)) != value:
            have = found.group(1) if found else "none"
            raise StreamError(f"the instruction stream is for an engine with {name} {value}, this engine's is {have}")
    for feature, what in stream_features(stream).items():
        if re.search(rf"^#define {feature} 1$", source, flags=re.MULTILINE) is None:
            raise StreamError(f"the instruction stream {what}, and this engine has no {feature}")


def stream_features(stream: Stream) -> dict[str, str]:
    """The engine's optional parts the stream's words use (each a `#define NAME 1` of an engine built with it),
    with what the stream does that needs it."""
    matvec = d5005.OPCODES["d5005.matvec"]
    needs = {}
    if any(int(w[d5005.W_OPCODE]) == matvec and int(w[d5005.W_BIAS]) for w in stream.words):
        needs["ENGINE_BIAS"] = "adds a bias in a matvec"
    rope = d5005.OPCODES["d5005.rope"]
    if any(int(w[d5005.W_OPCODE]) == rope and int(w[d5005.W_HEAD_NORM]) for w in stream.words):
        needs["ENGINE_HEAD_NORM"] = "norms heads in a rope"
    if any(int(w[d5005.W_OPCODE]) == rope and int(w[d5005.W_ROTARY]) for w in stream.words):
        needs["ENGINE_PARTIAL_ROTARY"] = "rotates a part of each head"
    attention = d5005.OPCODES["d5005.attention"]
    if any(int(w[d5005.W_OPCODE]) == attention and int(w[d5005.W_WINDOW]) for w in stream.words):
        needs["ENGINE_WINDOW"] = "attends over a sliding window"
    expert_ops = (_ROUTE, d5005.OPCODES["d5005.expert_sum"])
    add, attended = d5005.OPCODES["d5005.add"], d5005.ARRAY_IDS["attended"]
    if any(
        int(w[0]) in expert_ops
        or int(w[0]) == matvec
        and int(w[d5005.W_SLOT])
        or int(w[0]) == add
        and int(w[d5005.W_B]) >> d5005.OFFSET_BITS == attended
        for w in stream.words
    ):
        needs["ENGINE_EXPERTS"] = "routes a mixture of experts"
    return needs | gemma_features(stream.words) | stored_features(stream.words)


def stored_features(words: Any) -> dict[str, str]:
    """The part weights as stored need: an embedding row or a matvec streaming a block format."""
    for row in words:
        w = [int(v) for v in row]
        name = _OPCODE_NAMES.get(w[d5005.W_OPCODE], "")
        if stored_format(name, w):
            return {"ENGINE_STORED": f"streams {stored_format(name, w)} weights as stored"}
    return {}


def gemma_features(words: Any) -> dict[str, str]:
    """The parts Gemma's operations need: a scaled embedding row, norms by one plus the weight, GeGLU's gate, an
    RMS norm of a matvec's output into a buffer an add reads (the sandwich norms), soft-capped logits."""
    code = {name.split(".")[1]: value for name, value in d5005.OPCODES.items()}
    outputs = d5005.ARRAY_IDS["outputs"]
    needs = {}
    for row in words:
        w = [int(v) for v in row]
        op = w[d5005.W_OPCODE]
        if op == code["embed_row"] and w[d5005.W_EMBED_SCALE]:
            needs["ENGINE_EMBED_SCALE"] = "scales an embedding row"
        if op in (code["rms_norm"], code["rope"]) and w[d5005.W_PLUS_ONE]:
            needs["ENGINE_PLUS_ONE"] = "norms by one plus the weight"
        if op == code["silu_mul"] and w[d5005.W_GELU]:
            needs["ENGINE_GELU_TANH"] = "gates by GELU's tanh approximation"
        if op == code["rms_norm"] and w[d5005.W_A] >> d5005.OFFSET_BITS == outputs:
            needs.setdefault("ENGINE_SANDWICH", "RMS-norms a buffer of 'outputs'")
        if op == code["rope"] and w[d5005.W_A] >> d5005.OFFSET_BITS == d5005.ARRAY_IDS["inputs"]:
            needs["ENGINE_PROJECTION_NORMS"] = "rotates a buffer of 'inputs' (a normed projection)"
        if op == code["add"] and w[d5005.W_B] >> d5005.OFFSET_BITS == d5005.ARRAY_IDS["inputs"]:
            needs.setdefault("ENGINE_SANDWICH", "adds a buffer of 'inputs'")
        if op == code["argmax"] and w[d5005.W_CAP]:
            needs["ENGINE_LOGIT_SOFTCAP"] = "soft-caps the logits"
        if op == code["matvec"] and w[d5005.W_FIRST]:
            needs["ENGINE_COLUMNS"] = "streams a matvec's columns in parts"
        if op == code["attention"] and d5005.attention_counts(w)[2]:
            needs["ENGINE_SOFTCAP"] = "soft-caps attention scores"
    return needs


_ARGMAX = d5005.OPCODES["d5005.argmax"]
_ROUTE = d5005.OPCODES["d5005.route"]
_COMPUTE_ARGS_ON_CHANNELS = 12  # instructions, first, count, 4 banks, token, position, result, logits


def _kernels(program: Any) -> tuple[Any, list[Any]]:
    """The compute kernel and the four readers of a built engine, refused when the program is not this engine's
    (another kernel set, or kernels of other arguments: a binary of another source)."""
    import pyopencl as cl

    try:
        compute = cl.Kernel(program, d5005.COMPUTE_KERNEL)
        readers = [cl.Kernel(program, name) for name in d5005.READER_KERNELS]
    except cl.Error as error:
        raise LogosError(f"the compiled engine is not the D5005 engine: {error}") from None
    shapes = {(_COMPUTE_ARGS_ON_CHANNELS, 6), (_COMPUTE_ARGS_ON_CHANNELS + 4, 8), (_COMPUTE_ARGS_ON_CHANNELS + 12, 9)}
    if (compute.num_args, readers[0].num_args) not in shapes:
        raise LogosError(
            f"the compiled engine's kernels take {compute.num_args} and {readers[0].num_args} arguments, not the"
            " D5005 engine's"
        )
    return compute, readers


def _bank_flag(bank: int) -> int:
    """Intel's CL_CHANNEL_<n>_INTELFPGA flag (`cl_ext_intelfpga.h`: n << 16) for bank `bank`, n = bank + 1: the
    buffer lies in that DDR4 bank alone (the engine is compiled with -no-interleaving=DDR)."""
    return (bank + 1) << 16


_FIFO_WORDS_MIN = 1 << 16  # 4 MiB a bank at 64-byte words: tiny models run a whole step in one run


def bank_words_sent(w: list[int], token: int, position: int, stream: Stream) -> list[int]:
    """The words each bank reader sends the compute kernel for instruction word `w` (what `read_bank` in the
    engine's source streams, counted the same way)."""
    name = _OPCODE_NAMES[w[0]]
    burst, element = stream.burst, stream.element_bytes
    rows, cols = w[d5005.W_ROWS], w[d5005.W_COLS]
    sent = [0] * d5005.BANKS
    if name == "d5005.embed_row":
        sent[(token - 1) % d5005.BANKS] = row_words(name, w, stream)
    elif name == "d5005.matvec":
        words = row_words(name, w, stream)
        sent = [(rows + d5005.BANKS - 1 - b) // d5005.BANKS * words for b in range(d5005.BANKS)]
        sent[0] += d5005.bank_words(w[d5005.W_BIAS], element, burst)  # the bias, before bank 0's rows
    elif name == "d5005.rms_norm":
        sent[0] = d5005.bank_words(cols, element, burst)
    elif name == "d5005.rope":
        rotary = w[d5005.W_ROTARY] or w[d5005.W_HEAD_DIM]
        sent[(position - 1) % d5005.BANKS] = d5005.rope_row_floats(rotary, burst) * 4 // burst
        if w[d5005.W_HEAD_NORM]:  # the head norm's weight, after the table's row
            sent[0] += d5005.bank_words(w[d5005.W_HEAD_DIM], element, burst)
    elif name == "d5005.attention":
        ctx, past, low = w[d5005.W_CTX], position - 1, window_start(position, w[d5005.W_WINDOW])
        words = d5005.bank_words(w[d5005.W_HEAD_DIM], element, burst)
        for h in range(d5005.attention_counts(w)[1]):
            for b in range(d5005.BANKS):
                first = low + (b - h * ctx - low) % d5005.BANKS
                sent[b] += 2 * words * (-(-(past - first) // d5005.BANKS) if past > first else 0)
    return sent


def window_start(position: int, window: int) -> int:
    """The first cache row (from 0) an attention at `position` (from 1) reads: position - window, the window's
    first earlier position less one, or 0 with no window (0) or one longer than the positions so far."""
    return position - window if window and position > window else 0


def _fifo_words(stream: Stream) -> int:
    """Each ordered buffer holds the largest instruction's words (at the last position), and at least 4 MiB."""
    largest = _FIFO_WORDS_MIN
    for w in stream.words:
        word = [int(v) for v in w]
        for token in range(1, d5005.BANKS + 1):
            largest = max(largest, *bank_words_sent(word, token, stream.ctx, stream))
    return largest


def read_binary(path: Path) -> bytes:
    """A compiled engine (an `aoc`-built `.aocx`, or any program binary of the device), refused when unreadable."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise LogosError(f"cannot read the compiled engine {path}: {error.strerror}") from None
    if not data:
        raise LogosError(f"the compiled engine {path} is empty")
    return data


def _channel_depth(source: str) -> int:
    """The depth of the engine's channels, as its source states it."""
    found = re.search(r"^#define CHANNEL_DEPTH (\d+)$", source, flags=re.MULTILINE)
    if found is None or int(found.group(1)) < 1:
        raise StreamError("the engine's source states no CHANNEL_DEPTH of at least 1")
    return int(found.group(1))


def _built(context: Any, source: str, binary: bytes | None, options: list[str] | None = None) -> Any:
    """The engine's program: built from its source, or loaded from a binary with clCreateProgramWithBinary (as
    Intel's runtime loads an `.aocx`), then built (a no-op for an FPGA image)."""
    import pyopencl as cl

    with warnings.catch_warnings():  # PoCL notes the ABI of by-value uint16 arguments; nothing to act on
        warnings.simplefilter("ignore", cl.CompilerWarning)
        if binary is None:
            try:
                return cl.Program(context, source).build(options=options or [])
            except cl.Error as error:  # the device's compiler refused the source: its own words, no traceback
                said = next((line.strip() for line in str(error).splitlines() if "error:" in line), str(error))
                raise LogosError(
                    f"the OpenCL device '{context.devices[0].name.strip()}' does not build the engine's source: {said}",
                    hint="PoCL's CPU device needs a CPU its LLVM knows; PYOPENCL_COMPILER_OUTPUT=1 shows the whole log",
                ) from None
        try:
            return cl.Program(context, context.devices, [binary]).build()
        except cl.Error as error:
            raise LogosError(
                f"the compiled engine does not load on '{context.devices[0].name.strip()}': {error}",
                hint="an .aocx loads on the card's Intel FPGA platform; here only this device's own binaries load",
            ) from None


# -- logos-run --backend d5005 --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedBuild:
    """An engine loaded with a decode step's build, and the identity of that step: the machine a
    `StepGenerator` runs. `logits` after a step: what the engine's arg-max read, as the engine wrote them."""

    engine: Engine
    identity: Identity

    @property
    def identities(self) -> list[Identity]:
        return [self.identity]

    @property
    def logits(self) -> np.ndarray | None:
        return self.engine.logits

    def reset(self) -> None:
        self.engine.reset()

    def step(self, token: int, position: int) -> int:
        return self.engine.step(token, position)


def engine_for(store: Any, ctx: int, weights: str, binary: bytes | None = None, rings: bool = False) -> LoadedBuild:
    """Build the decode step of `ctx` with the registry's `d5005` compile target (in memory), then load its
    artifacts as the host loads a build folder (the engine from `binary`, a compiled program of its source, when
    given; through the channel path's rings with `rings`)."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.progress import Progress
    from logos_ir.registry import compile_targets

    source = ModelSource("preset", str(store.source), store.spec, _store=store)
    request = BuildRequest(source, Cut.decode(ctx), 1, weights, True, Progress.silent())
    artifacts = {a.role: a for a in compile_targets()["d5005"].build()(request).artifacts}
    engine = Engine(
        artifacts["engine"].data.decode("utf-8"), artifacts["instructions"].data, artifacts["weights"].data, binary,
        rings,
    )  # fmt: skip
    return LoadedBuild(engine, artifacts["instructions"].identity)


def build_engine(folder: Path, aocx: Path | None = None) -> LoadedBuild:
    """The engine of a build folder, as its files say (its identity from the stream's header)."""
    engine = Engine.from_build(folder, aocx)
    identity = Identity.from_line(engine.stream.identity)
    if identity is None:
        raise StreamError(f"{folder}: the instruction stream carries no identity line of a LOGOS program")
    return LoadedBuild(engine, identity)


class D5005Generator(StepGenerator):
    """Greedy generation on the engine: the prompt and each new token go through one decode step each (the engine
    runs the decode step alone). With `build`, the engine, stream and image of that build folder run (its cache
    length and precision), else the decode step is lowered anew for each cache length; with `aocx`, the engine
    is that compiled binary instead of its source; with `rings`, the engine runs its five kernels at once through
    rings of the channels' depth (the channel path; on PoCL it needs POCL_MAX_PTHREAD_COUNT of 5 or more)."""

    def __init__(
        self,
        store: Any,
        ctx: int | None = None,
        weights: str = "bf16",
        build: Path | None = None,
        aocx: Path | None = None,
        rings: bool = False,
    ):
        if weights not in d5005.WEIGHT_BYTES:
            raise LogosError(f"the d5005 backend runs bf16 or f32 weights, not {weights}")
        self.built = build_engine(build, aocx) if build is not None else None
        if self.built is not None:
            ctx = self.built.engine.stream.ctx
        super().__init__(store, ctx=ctx)
        self.store, self.image = store, weights
        self.binary = read_binary(aocx) if aocx is not None and build is None else None
        self.rings = rings

    def machine(self, ctx: int) -> LoadedBuild:
        if self.built is not None:
            return self.built
        return engine_for(self.store, ctx, self.image, self.binary, self.rings)

    def engine(self, ctx: int) -> Engine:
        """The engine loaded for a cache of `ctx` positions (made on first use)."""
        return self._machine_for(ctx).engine  # type: ignore[attr-defined]


def d5005_generator(request: Any) -> D5005Generator:
    """The `d5005` backend of `logos-run`."""
    if request.emulate:
        raise LogosError("the d5005 backend has no --emulate mode: it always runs the engine on an OpenCL device")
    if request.tp != 1:
        raise LogosError(f"the D5005 is one card: the d5005 backend runs on 1 chip, not {request.tp}")
    build, aocx = getattr(request, "build", None), getattr(request, "aocx", None)
    return D5005Generator(request.store, ctx=request.ctx, weights=request.weights, build=build, aocx=aocx)
