"""How a weight is stored: GGUF's block formats, their LOGOS sentences, and the project's own dequantizer and
quantizer, written from the formats' definitions (llama.cpp's `ggml-common.h` layouts and `ggml-quants.c`'s
`dequantize_row_*` and `quantize_row_*_ref`).

A format stores a row of a weight (its last axis, the one a linear contracts) in blocks of `block` numbers, each
number in `bits` bits, with a scale per block (legacy formats), or in super-blocks of 256 with a scale (and a
minimum) per sub-block of `sub` numbers, the sub-block's scales themselves quantized to `scale_bits` bits against
the super-block's float16 scale (the K-quants), or with a power-of-two (e8m0) scale per block of 4-bit floats
(MXFP4). Float formats (f32, f16, bf16) are blocks of one.

Each format family has one LOGOS sentence form (`sentence`, `parse_sentence`); the `logos.storage` attribute names
the format and `logos.weight` carries it. Every lane reads today the dequantized image (f32 activations in the
reference); `stored_bytes` is what the file holds, so a lane's report can say the gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

QK_K = 256


@dataclass(frozen=True)
class BlockFormat:
    """One storage format: `name` (GGUF's type name in lower case), `bits` a number, `block` numbers a block of
    `block_bytes` bytes; `scale` how a block's (or sub-block's) scale is encoded ("f16", "e8m0", or None for a
    float format), `minimum` whether an offset is added; the K-quants' `sub` numbers a sub-block and
    `scale_bits` bits each sub-block's scale and minimum."""

    name: str
    family: str  # "float", "blocks", "super-blocks", "float-blocks"
    bits: int
    block: int
    block_bytes: int
    scale: str | None = None
    minimum: bool = False
    sub: int | None = None
    scale_bits: int | None = None

    def stored_bytes(self, shape: tuple[int, ...]) -> int:
        """The bytes a tensor of `shape` takes in this format (its rows a whole number of blocks)."""
        numbers = int(np.prod(shape, dtype=np.int64))
        return numbers // self.block * self.block_bytes

    def row_fits(self, width: int) -> bool:
        return width % self.block == 0


FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat("f32", "float", 32, 1, 4),
        BlockFormat("f16", "float", 16, 1, 2),
        BlockFormat("bf16", "float", 16, 1, 2),
        BlockFormat("q8_0", "blocks", 8, 32, 34, "f16"),
        BlockFormat("q4_0", "blocks", 4, 32, 18, "f16"),
        BlockFormat("q4_1", "blocks", 4, 32, 20, "f16", minimum=True),
        BlockFormat("q5_0", "blocks", 5, 32, 22, "f16"),
        BlockFormat("q5_1", "blocks", 5, 32, 24, "f16", minimum=True),
        BlockFormat("q2_k", "super-blocks", 2, QK_K, 84, "f16", minimum=True, sub=16, scale_bits=4),
        BlockFormat("q3_k", "super-blocks", 3, QK_K, 110, "f16", sub=16, scale_bits=6),
        BlockFormat("q4_k", "super-blocks", 4, QK_K, 144, "f16", minimum=True, sub=32, scale_bits=6),
        BlockFormat("q5_k", "super-blocks", 5, QK_K, 176, "f16", minimum=True, sub=32, scale_bits=6),
        BlockFormat("q6_k", "super-blocks", 6, QK_K, 210, "f16", sub=16, scale_bits=8),
        BlockFormat("mxfp4", "float-blocks", 4, 32, 17, "e8m0"),
    )
}


def format_named(name: str) -> BlockFormat | None:
    return FORMATS.get(name.lower())


# -- the LOGOS sentence of a format ------------------------------------------------------------------------------

_FLOAT_WORDS = {"f32": "32-bit floats", "f16": "16-bit floats", "bf16": "bfloat16 numbers"}
_MINIMUM = " and a minimum"


def sentence(fmt: BlockFormat) -> str:
    """The words after "stored in" that say `fmt`: one form per family, its fields in words."""
    if fmt.family == "float":
        return _FLOAT_WORDS[fmt.name]
    if fmt.family == "blocks":
        return f"{fmt.bits}-bit blocks of {fmt.block} with a scale{_MINIMUM if fmt.minimum else ''}"
    if fmt.family == "super-blocks":
        what = "scales and minimums" if fmt.minimum else "scales"
        return f"{fmt.bits}-bit super-blocks of {fmt.block} in sub-blocks of {fmt.sub} with {fmt.scale_bits}-bit {what}"
    return f"{fmt.bits}-bit float blocks of {fmt.block} with a power-of-two scale"


_SENTENCES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("float", re.compile(r"(32-bit floats|16-bit floats|bfloat16 numbers)")),
    ("blocks", re.compile(r"(\d+)-bit blocks of (\d+) with a scale( and a minimum)?")),
    (
        "super-blocks",
        re.compile(
            r"(\d+)-bit super-blocks of (\d+) in sub-blocks of (\d+) with (\d+)-bit (scales and minimums|scales)"
        ),
    ),
    ("float-blocks", re.compile(r"(\d+)-bit float blocks of (\d+) with a power-of-two scale")),
)
SENTENCE_EXAMPLE = "'4-bit blocks of 32 with a scale and a minimum'"


def parse_sentence(words: str) -> BlockFormat | str:
    """The format the words after "stored in" say, or why none does (a message to locate at the words)."""
    for family, pattern in _SENTENCES:
        m = pattern.fullmatch(words)
        if m is None:
            continue
        if family == "float":
            return FORMATS[next(k for k, v in _FLOAT_WORDS.items() if v == m[1])]
        fields: dict[str, object]
        if family == "blocks":
            fields = {"bits": int(m[1]), "block": int(m[2]), "minimum": m[3] is not None}
        elif family == "super-blocks":
            fields = {"bits": int(m[1]), "block": int(m[2]), "sub": int(m[3]), "scale_bits": int(m[4])}
            fields["minimum"] = m[5] == "scales and minimums"
        else:
            fields = {"bits": int(m[1]), "block": int(m[2])}
        for fmt in FORMATS.values():
            if fmt.family == family and all(getattr(fmt, k) == v for k, v in fields.items()):
                return fmt
        return f"no storage format is '{words}'"
    return f"unknown storage '{words}'"


# -- dequantization: each format's definition, vectorised over blocks -------------------------------------------


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block to its 32 nibbles: the low nibbles are the first 16 numbers, the high ones the next 16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes a block (a little-endian u32) to each of its 32 numbers' fifth bit, as 0 or 16."""
    bits = np.ascontiguousarray(qh).view("<u4").astype(np.uint32)
    return (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * (_nibbles(b[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).astype(np.float32) + _f16(b[:, 2:4])


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:]) | _fifth_bits(b[:, 2:6])
    return _f16(b[:, :2]) * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:]) | _fifth_bits(b[:, 4:8])
    return _f16(b[:, :2]) * q.astype(np.float32) + _f16(b[:, 2:4])


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """64 bytes a super-block of 2-bit numbers: two halves of 32 bytes, each byte's 2-bit fields j = 0..3 the
    half's numbers 32j..32j+31; as (blocks, 256)."""
    halves = qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    return (halves & 3).reshape(-1, QK_K)


def _q2_k(b: np.ndarray) -> np.ndarray:
    scales, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0x0F).astype(np.float32)).reshape(-1, 16, 1)
    ml = (dmin * (scales >> 4).astype(np.float32)).reshape(-1, 16, 1)
    q = _crumbs(qs).reshape(-1, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(-1, QK_K)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """12 bytes to 16 6-bit scales: scale i's low 4 bits in byte i % 8 (its high nibble for i >= 8), its high 2
    bits in byte 8 + i % 4 at bit 2 (i // 4)."""
    i = np.arange(16)
    low = (s[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & 0x0F
    high = (s[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & 3
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


def _q3_k(b: np.ndarray) -> np.ndarray:
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    dl = (d * _q3_k_scales(scales).astype(np.float32)).reshape(-1, 16, 1)
    # number 128h + 32j + l: its high bit is bit 4h + j of hmask[l], set meaning "no minus 4"
    high = (hmask.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = _crumbs(qs).astype(np.int8) - ((1 - high.reshape(-1, QK_K)) << 2).astype(np.int8)
    return (dl * q.reshape(-1, 16, 16).astype(np.float32)).reshape(-1, QK_K)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes to 8 6-bit scales and 8 6-bit minimums (llama.cpp's `get_scale_min_k4`)."""
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4], mn[:, :4] = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _k_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes to 256 nibbles: four chunks of 32 bytes, each the low nibbles of sub-block 2c then the high."""
    chunks = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (chunks & 0x0F).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin, (sc, mn) = _f16(b[:, 0:2]), _f16(b[:, 2:4]), _k_scales_mins(b[:, 4:16])
    dl = (d * sc.astype(np.float32)).reshape(-1, 8, 1)
    ml = (dmin * mn.astype(np.float32)).reshape(-1, 8, 1)
    return (dl * _k_nibbles(b[:, 16:]).astype(np.float32) - ml).reshape(-1, QK_K)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin, (sc, mn) = _f16(b[:, 0:2]), _f16(b[:, 2:4]), _k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]
    high = ((qh.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4  # sub-block s: bit s
    q = _k_nibbles(b[:, 48:]) | high
    dl = (d * sc.astype(np.float32)).reshape(-1, 8, 1)
    ml = (dmin * mn.astype(np.float32)).reshape(-1, 8, 1)
    return (dl * q.astype(np.float32) - ml).reshape(-1, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
    # number 128h + 32k + l: low 4 bits from ql[64h + 32 (k % 2) + l] at bit 4 (k // 2), high 2 from
    # qh[32h + l] at bit 2k
    k = np.arange(4)
    low = ql.reshape(-1, 2, 2, 32)[:, :, k % 2, :]
    low = (low >> (4 * (k // 2)).astype(np.uint8).reshape(1, 1, 4, 1)) & 0x0F
    high = (qh.reshape(-1, 2, 1, 32) >> (2 * k).astype(np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    dl = (d * scales.astype(np.float32)).reshape(-1, 16, 1)
    return (dl * q.reshape(-1, 16, 16).astype(np.float32)).reshape(-1, QK_K)


# e2m1's 16 codes, doubled (so the e8m0 scale is taken at half: 2^(e - 128))
_E2M1_TWICE = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    half_scale = np.ldexp(np.float32(1), b[:, :1].astype(np.int32) - 128).astype(np.float32)
    return half_scale * _E2M1_TWICE[_nibbles(b[:, 1:])]


_DEQUANTIZE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q8_0": _q8_0,
    "q4_0": _q4_0,
    "q4_1": _q4_1,
    "q5_0": _q5_0,
    "q5_1": _q5_1,
    "q2_k": _q2_k,
    "q3_k": _q3_k,
    "q4_k": _q4_k,
    "q5_k": _q5_k,
    "q6_k": _q6_k,
    "mxfp4": _mxfp4,
}


def dequantize(raw: np.ndarray, fmt: BlockFormat, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor of `shape` stored in `fmt` (its bytes, row-major, as a GGUF holds them) as float32."""
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if data.size != fmt.stored_bytes(shape):
        raise ValueError(f"{fmt.name}: {data.size} bytes do not hold a tensor of {list(shape)}")
    if fmt.name == "f32":
        return data.view("<f4").astype(np.float32).reshape(shape)
    if fmt.name == "f16":
        return data.view("<f2").astype(np.float32).reshape(shape)
    if fmt.name == "bf16":
        return (data.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):  # a corrupt scale gives inf or NaN, which the store refuses
        values = _DEQUANTIZE[fmt.name](data.reshape(-1, fmt.block_bytes))
    return np.asarray(values, np.float32).reshape(shape)


# -- quantization: llama.cpp's reference quantizers (`quantize_row_*_ref`) ----------------------------------------


def _round_away(x: np.ndarray) -> np.ndarray:
    """C's `roundf`: halves away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)


def _pack_fifth_bits(q: np.ndarray) -> np.ndarray:
    bits = ((q.astype(np.uint32) >> 4) & 1) << np.arange(32, dtype=np.uint32)
    return bits.sum(axis=1, dtype=np.uint32).astype("<u4").reshape(-1, 1).view(np.uint8)


def _signed_max(x: np.ndarray) -> np.ndarray:
    """Each block's number of the largest magnitude, with its sign (the first of equal magnitudes)."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=1, keepdims=True), axis=1)


def _quantize_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_away(x * _inverse(d)).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _quantize_symmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0's and Q5_0's scale (the signed maximum over minus half the levels) and codes."""
    d = _signed_max(x) / np.float32(-levels // 2)
    q = np.trunc(x * _inverse(d) + np.float32(levels // 2 + 0.5)).astype(np.int32)
    return d, np.minimum(q, levels - 1).astype(np.uint8)


def _quantize_offset(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1's and Q5_1's scale ((max - min) over the levels), minimum and codes."""
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (high - low) / np.float32(levels - 1)
    q = np.trunc((x - low) * _inverse(d) + np.float32(0.5)).astype(np.int32)
    return d, low, np.minimum(q, levels - 1).astype(np.uint8)


def _quantize_q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _quantize_symmetric(x, 16)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _quantize_q4_1(x: np.ndarray) -> np.ndarray:
    d, m, q = _quantize_offset(x, 16)
    return np.concatenate([_f16_bytes(d), _f16_bytes(m), _pack_nibbles(q)], axis=1)


def _quantize_q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _quantize_symmetric(x, 32)
    return np.concatenate([_f16_bytes(d), _pack_fifth_bits(q), _pack_nibbles(q)], axis=1)


def _quantize_q5_1(x: np.ndarray) -> np.ndarray:
    d, m, q = _quantize_offset(x, 32)
    return np.concatenate([_f16_bytes(d), _f16_bytes(m), _pack_fifth_bits(q), _pack_nibbles(q)], axis=1)


_QUANTIZE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q8_0": _quantize_q8_0,
    "q4_0": _quantize_q4_0,
    "q4_1": _quantize_q4_1,
    "q5_0": _quantize_q5_0,
    "q5_1": _quantize_q5_1,
}
QUANTIZERS = tuple(_QUANTIZE)


def quantize(values: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    """`values` (float32, rows a whole number of blocks) stored in `fmt`: the bytes, row-major, one row of bytes
    a row of `values`. Formats without a quantizer here raise KeyError (`QUANTIZERS` names those with one)."""
    x = np.ascontiguousarray(values, np.float32)
    if not fmt.row_fits(x.shape[-1]):
        raise ValueError(f"{fmt.name}: rows of {x.shape[-1]} numbers are not whole blocks of {fmt.block}")
    if fmt.name == "f32":
        return x.view(np.uint8).reshape(*x.shape[:-1], -1)
    if fmt.name == "f16":
        return x.astype("<f2").view(np.uint8).reshape(*x.shape[:-1], -1)
    blocks = _QUANTIZE[fmt.name](x.reshape(-1, fmt.block))
    return blocks.reshape(*x.shape[:-1], -1)
