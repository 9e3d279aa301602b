"""How a weight is stored: GGUF's block formats, their LOGOS sentences, and the project's own dequantizer and
quantizer, written from the formats' definitions (llama.cpp's `ggml-common.h` layouts and `ggml-quants.c`'s
`dequantize_row_*` and `quantize_row_*_ref`).

A format stores a row of a weight (its last axis, the one a linear contracts) in blocks of `block` numbers, each
number in `bits` bits, with a scale per block (legacy formats), or in super-blocks of 256 with a scale (and a
minimum) per sub-block of `sub` numbers, the sub-block's scales themselves quantized to `scale_bits` bits against
the super-block's float16 scale (the K-quants), or with a power-of-two (e8m0) scale per block of 4-bit floats
(MXFP4). Float formats (f32, f16, bf16) are blocks of one. `fp8` is no GGUF type: each row of 8-bit floats (e4m3,
OCP's E4M3FN: no infinities, ±448 the largest) with one float32 scale (a scale per output channel, as vLLM's and
TensorRT-LLM's fp8 weights on Hopper), the row's codes then its scale's four bytes.

Each format family has one LOGOS sentence form (`sentence`, `parse_sentence`); the `logos.storage` attribute names
the format and `logos.weight` carries it. The reference reads the dequantized image (f32 activations); the CUDA
lane's decode and the D5005 engine read some formats as stored and the rest as their image (docs/quantization.md,
"What each lane reads"); `stored_bytes` is what the file holds, so a lane's report can say the gap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

QK_K = 256
CHANNEL_SCALE_BYTES = 4  # a row's float32 scale, after its codes (the "channels" family)
E4M3_MAX = 448.0  # the largest e4m3 (E4M3FN) number


@dataclass(frozen=True)
class BlockFormat:
    """One storage format: `name` (GGUF's type name in lower case), `bits` a number, `block` numbers a block of
    `block_bytes` bytes; `scale` how a block's (or sub-block's) scale is encoded ("f16", "e8m0", or None for a
    float format), `minimum` whether an offset is added; the K-quants' `sub` numbers a sub-block and
    `scale_bits` bits each sub-block's scale and minimum."""

    name: str
    family: str  # "float", "blocks", "super-blocks", "float-blocks", "channels" (one scale a whole row)
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
        if self.family == "channels":  # each row its codes, then its float32 scale
            return numbers * self.block_bytes + numbers // max(shape[-1], 1) * CHANNEL_SCALE_BYTES
        return numbers // self.block * self.block_bytes

    def row_fits(self, width: int) -> bool:
        return width >= 1 if self.family == "channels" else width % self.block == 0


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
        BlockFormat("fp8", "channels", 8, 1, 1, "f32"),
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
    if fmt.family == "channels":
        return "8-bit floats (e4m3) with a scale a row"
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
    ("channels", re.compile(r"8-bit floats \(e4m3\) with a scale a row")),
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
        elif family == "channels":
            fields = {}
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


def _fp8(rows: np.ndarray) -> np.ndarray:
    """Rows of e4m3 codes each followed by its float32 scale: each code's value (exact in f32) times the scale, one
    f32 rounding (as a kernel multiplies the widened code by the row's scale)."""
    codes = np.ascontiguousarray(rows[:, :-CHANNEL_SCALE_BYTES]).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    scales = np.ascontiguousarray(rows[:, -CHANNEL_SCALE_BYTES:]).view("<f4").astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return codes * scales


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
    if fmt.family == "channels":
        return _fp8(data.reshape(-1, shape[-1] + CHANNEL_SCALE_BYTES)).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):  # a corrupt scale gives inf or NaN, which the store refuses
        values = _DEQUANTIZE[fmt.name](data.reshape(-1, fmt.block_bytes))
    return np.asarray(values, np.float32).reshape(shape)


# -- quantization: llama.cpp's reference quantizers (`quantize_row_*_ref`), every block format --------------------


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


# -- the K-quants' and MXFP4's reference quantizers (`quantize_row_q{2..6}_K_ref`, `quantize_row_mxfp4_ref`) --
#
# Written from llama.cpp's reference quantizers without an importance matrix, as `llama-quantize` runs them: each
# operation in float32 in the order C evaluates it (a sum over a sub-block added number by number, `a*b*c` as
# `(a*b)*c`, no fused multiply-add), vectorised over the sub-blocks.

_F = np.float32


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """llama.cpp's `nearest_int`: the float's integer by adding 1.5 * 2^23 and reading the mantissa (halves to
    even; a number past 2^22, inf or NaN gives what the bits give, as the C does with its assert compiled out)."""
    with np.errstate(invalid="ignore", over="ignore"):
        bits = (np.asarray(v, _F) + _F(12582912.0)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def _sum(a: np.ndarray) -> np.ndarray:
    """C's `float s = 0; for (...) s += a[i];` over the last axis, number by number."""
    zero = np.zeros(a.shape[:-1] + (1,), _F)
    return np.cumsum(np.concatenate([zero, a.astype(_F)], axis=-1), axis=-1, dtype=_F)[..., -1]


def _signed_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's largest magnitude and its number with its sign (the first of equal magnitudes)."""
    at = np.abs(x).argmax(axis=-1)[..., None]
    value = np.take_along_axis(x, at, axis=-1)[..., 0]
    return np.abs(value), value


def _clip(v: np.ndarray, low: int, high: int) -> np.ndarray:
    return np.minimum(np.maximum(v, low), high)


def _make_qkx2_quants(
    x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """llama.cpp's `make_qkx2_quants` on each row of `x` (a sub-block): the scale, the minimum subtracted (>= 0)
    and the codes 0..nmax, the scale and minimum fitted by weighted least squares over `nstep` + 1 trial scales."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        low = np.minimum(x.min(axis=-1), _F(0))
        high = x.max(axis=-1)
        sum_w = np.cumsum(weights, axis=-1, dtype=_F)[..., -1]
        sum_x = np.cumsum(weights * x, axis=-1, dtype=_F)[..., -1]
        flat = high == low
        iscale = _F(nmax) / (high - low)
        scale = _F(1) / iscale
        codes = _clip(_nearest_int(iscale[:, None] * (x - low[:, None])), 0, nmax)

        def error(s: np.ndarray, m: np.ndarray, q: np.ndarray) -> np.ndarray:
            diff = (s[:, None] * q.astype(_F) + m[:, None]) - x
            return _sum(weights * (np.abs(diff) if use_mad else diff * diff))

        best = error(scale, low, codes)
        for step in range(nstep + 1):
            iscale = (_F(rmin) + _F(rdelta) * _F(step) + _F(nmax)) / (high - low)
            trial = _clip(_nearest_int(iscale[:, None] * (x - low[:, None])), 0, nmax)
            wl = weights * trial.astype(_F)
            sum_l, sum_l2, sum_xl = _sum(wl), _sum(wl * trial.astype(_F)), _sum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            this_min = np.where(positive, _F(0), this_min)
            current = error(this_scale, this_min, trial)
            better = (det > 0) & (current < best)
            codes = np.where(better[:, None], trial, codes)
            best = np.where(better, current, best)
            scale = np.where(better, this_scale, scale)
            low = np.where(better, this_min, low)
    codes = np.where(flat[:, None], 0, codes)
    return np.where(flat, _F(0), scale).astype(_F), (-low).astype(_F), codes.astype(np.uint8)


def _make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's `make_qx_quants` with `rmse_type` 1 and no importance (Q6_K's sub-blocks): the scale and the
    codes 0..2 nmax - 1, the best of 19 trial scales by the weighted (x^2) fit."""
    amax, signed = _signed_absmax(x)
    zero = amax < _F(1e-15)
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):

        def trial(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            q = _clip(_nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            qf = q.astype(_F)
            return q, _sum(w * x * qf), _sum(w * qf * qf)

        codes, sumlx, suml2 = trial(_F(-nmax) / signed)
        scale = np.where(suml2 != 0, sumlx / suml2, _F(0)).astype(_F)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            q, sumlx, suml2 = trial(-(_F(nmax) + _F(0.1) * _F(step)) / signed)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            codes = np.where(better[:, None], q, codes)
            scale = np.where(better, sumlx / suml2, scale).astype(_F)
            best = np.where(better, scale * sumlx, best).astype(_F)
    return np.where(zero, _F(0), scale), np.where(zero[:, None], 0, codes + nmax).astype(np.int32)


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's `make_q3_quants` with `do_rmse` (Q3_K's sub-blocks): codes from the largest magnitude's scale,
    then up to five passes moving one code at a time where the weighted (x^2) fit improves; the codes 0..2 nmax-1."""
    amax, signed = _signed_absmax(x)
    zero = amax < _F(1e-15)
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        codes = _clip(_nearest_int((_F(-nmax) / signed)[:, None] * x), -nmax, nmax - 1)
        qf = codes.astype(_F)
        sumlx, suml2 = _sum(w * x * qf), _sum(w * qf * qf)
        active = ~zero
        for _ in range(5):
            changed = np.zeros(x.shape[0], bool)
            for i in range(x.shape[1]):
                xi, wi, li = x[:, i], w[:, i], codes[:, i].astype(_F)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new = _clip(_nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                newf = new.astype(_F)
                slx2 = slx + wi * xi * newf
                sl22 = sl2 + wi * newf * newf
                take = active & (slx > 0) & (new != codes[:, i])
                take &= (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                codes[:, i] = np.where(take, new, codes[:, i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
                changed |= take
            active &= changed
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, _F(0)).astype(_F)
    return np.where(zero, _F(0), scale), np.where(zero[:, None], 0, codes + nmax).astype(np.int32)


def _f16_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float32 stored as float16 (rounded to nearest even): its two bytes and the float32 it reads back as."""
    half = np.asarray(x, _F).astype(np.float16)
    return half.reshape(-1, 1).view(np.uint8), half.astype(_F)


def _pack_crumbs(q: np.ndarray) -> np.ndarray:
    """256 codes 0..3 a super-block to 64 bytes: byte 32h + l holds codes 128h + 32j + l at bits 2j."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)


def _pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 6-bit scales and 8 6-bit minimums to Q4_K's and Q5_K's 12 bytes (the inverse of `_k_scales_mins`)."""
    s = np.zeros((ls.shape[0], 12), np.uint8)
    s[:, 0:4], s[:, 4:8] = ls[:, :4], lm[:, :4]
    s[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    s[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    s[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    return s


def _requantize(x: np.ndarray, d: np.ndarray, dm: np.ndarray, codes: np.ndarray, low: int, high: int, offset: int):
    """The codes of each sub-block against its stored scale `d` (and minimum `dm`): round((x + dm) / d) within
    low..high plus `offset`; a sub-block whose scale is zero keeps the codes its search gave (as the C skips it)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = _clip(_nearest_int((x + dm[..., None]) / d[..., None]), low, high) + offset
    return np.where((d != 0)[..., None], q, codes)


def _quantize_qk_min(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Q4_K's and Q5_K's scales, minimums and codes (`quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`): each
    sub-block of 32 fitted by `make_qkx2_quants` with weights sqrt(mean x^2) + |x|, its scale and minimum then
    stored in 6 bits against the super-block's largest, the codes taken again against those."""
    sub = x.reshape(-1, 32)
    av_x = np.sqrt(_sum(sub * sub) / _F(32))
    scales, mins, codes = _make_qkx2_quants(sub, av_x[:, None] + np.abs(sub), nmax, rmin, rdelta, nstep, False)
    scales, mins, codes = scales.reshape(-1, 8), mins.reshape(-1, 8), codes.reshape(-1, 8, 32).astype(np.int32)
    max_scale = np.maximum(scales.max(axis=1), _F(0))
    max_min = np.maximum(mins.max(axis=1), _F(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _F(63) / max_scale, _F(0))
        inv_min = np.where(max_min > 0, _F(63) / max_min, _F(0))
    ls = np.minimum(_nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(_nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    d_bytes, d = _f16_round(max_scale / _F(63))
    m_bytes, dmin = _f16_round(max_min / _F(63))
    sub_d = d[:, None] * ls.astype(_F)
    sub_m = dmin[:, None] * lm.astype(_F)
    q = _requantize(x.reshape(-1, 8, 32), sub_d, sub_m, codes, 0, nmax, 0)
    return np.concatenate([d_bytes, m_bytes, _pack_k_scales(ls, lm)], axis=1), q.astype(np.uint8)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    head, q = _quantize_qk_min(x, 15, -1.0, 0.1, 20)
    q = q.reshape(-1, 4, 2, 32)
    return np.concatenate([head, (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def _quantize_q5_k(x: np.ndarray) -> np.ndarray:
    head, q = _quantize_qk_min(x, 31, -0.5, 0.1, 15)
    high = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)  # bit s: sub-block s
    low = (q & 0x0F).reshape(-1, 4, 2, 32)
    return np.concatenate([head, high, (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def _quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """`quantize_row_q2_K_ref`: sub-blocks of 16 fitted by `make_qkx2_quants` on |x| with the absolute error,
    scales and minimums in 4 bits against the super-block's largest."""
    sub = x.reshape(-1, 16)
    scales, mins, codes = _make_qkx2_quants(sub, np.abs(sub), 3, -0.5, 0.1, 15, True)
    scales, mins, codes = scales.reshape(-1, 16), mins.reshape(-1, 16), codes.reshape(-1, 16, 16).astype(np.int32)
    max_scale = np.maximum(scales.max(axis=1), _F(0))
    max_min = np.maximum(mins.max(axis=1), _F(0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.where(max_scale[:, None] > 0, _nearest_int((_F(15) / max_scale)[:, None] * scales) & 0xFF, 0)
        lm = np.where(max_min[:, None] > 0, (_nearest_int((_F(15) / max_min)[:, None] * mins) << 4) & 0xFF, 0)
    packed = (ls | lm).astype(np.uint8)
    d_bytes, d = _f16_round(np.where(max_scale > 0, max_scale / _F(15), _F(0)))
    m_bytes, dmin = _f16_round(np.where(max_min > 0, max_min / _F(15), _F(0)))
    sub_d = d[:, None] * (packed & 0x0F).astype(_F)
    sub_m = dmin[:, None] * (packed >> 4).astype(_F)
    q = _requantize(x.reshape(-1, 16, 16), sub_d, sub_m, codes, 0, 3, 0)
    return np.concatenate([packed, _pack_crumbs(q), d_bytes, m_bytes], axis=1)


def _quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """`quantize_row_q3_K_ref`: sub-blocks of 16 by `make_q3_quants`, their signed scales in 6 bits against the
    one of largest magnitude, the codes -4..3 taken again; the high bit of each code in `hmask`."""
    scales, codes = _make_q3_quants(x.reshape(-1, 16), 4)
    scales, codes = scales.reshape(-1, 16), codes.reshape(-1, 16, 16)
    _, max_scale = _signed_absmax(scales)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F(-32) / max_scale
        l8 = ((_nearest_int(iscale[:, None] * scales) + 128) & 0xFF) - 128  # stored in an int8_t
    l6 = np.where(max_scale[:, None] != 0, _clip(l8, -32, 31) + 32, 0).astype(np.uint8)
    s = np.zeros((x.shape[0], 12), np.uint8)
    s[:, :8] = (l6[:, :8] & 0x0F) | ((l6[:, 8:] & 0x0F) << 4)
    j = np.arange(16)
    for k in range(4):
        s[:, 8 + k] = ((l6[:, j[j % 4 == k]] >> 4) << (2 * (j[j % 4 == k] // 4)).astype(np.uint8)).sum(
            axis=1, dtype=np.uint8
        )
    with np.errstate(divide="ignore"):
        d_bytes, d = _f16_round(np.where(max_scale != 0, _F(1) / iscale, _F(0)))
    sub_d = d[:, None] * (l6.astype(np.int32) - 32).astype(_F)
    q = _requantize(x.reshape(-1, 16, 16), sub_d, np.zeros_like(sub_d), codes, -4, 3, 4).reshape(-1, 256)
    high = (q > 3).reshape(-1, 8, 32).astype(np.uint8)  # code 32k + l: bit k of hmask[l]
    hmask = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    q = np.where(q > 3, q - 4, q)
    return np.concatenate([hmask, _pack_crumbs(q), s, d_bytes], axis=1)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """`quantize_row_q6_K_ref`: sub-blocks of 16 by `make_qx_quants`, their signed scales in 8 bits against the one
    of largest magnitude (as -128), the codes -32..31 taken again; a super-block of zeros all zero bytes."""
    scales, codes = _make_qx_quants(x.reshape(-1, 16), 32)
    scales, codes = scales.reshape(-1, 16), codes.reshape(-1, 16, 16)
    max_abs, max_scale = _signed_absmax(scales)
    zero = max_abs < _F(1e-15)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F(-128) / max_scale
        sc = ((np.minimum(_nearest_int(iscale[:, None] * scales), 127) + 128) & 0xFF) - 128
        d_bytes, d = _f16_round(_F(1) / iscale)
    sub_d = d[:, None] * sc.astype(_F)
    q = _requantize(x.reshape(-1, 16, 16), sub_d, np.zeros_like(sub_d), codes, -32, 31, 32)
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)  # half h, quarter k, number l: code 128h + 32k + l
    ql = ((q[:, :, [0, 1]] & 0x0F) | ((q[:, :, [2, 3]] & 0x0F) << 4)).reshape(-1, 128)
    qh = ((q >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(axis=2, dtype=np.uint8)
    out = np.concatenate([ql, qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), d_bytes], axis=1)
    return np.where(zero[:, None], np.uint8(0), out)


# e2m1's 16 codes, doubled, as llama.cpp's `kvalues_mxfp4`
_KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


def _quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    """`quantize_row_mxfp4_ref`: the block's exponent floor(log2 max|x|) - 2 (so its largest number is at most
    6 times the scale), each number the nearest e2m1 code (the first of equal errors)."""
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - _F(2) + _F(127), _F(0)).astype(np.uint8)
    half_scale = np.ldexp(_F(1), e.astype(np.int32) - 128).astype(_F)
    err = np.abs(half_scale[:, None, None] * _KVALUES_MXFP4.astype(_F) - x[:, :, None])
    codes = err.argmin(axis=2).astype(np.uint8)
    return np.concatenate([e[:, None], codes[:, :16] | (codes[:, 16:] << 4)], axis=1)


_QUANTIZE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q8_0": _quantize_q8_0,
    "q4_0": _quantize_q4_0,
    "q4_1": _quantize_q4_1,
    "q5_0": _quantize_q5_0,
    "q5_1": _quantize_q5_1,
    "q2_k": _quantize_q2_k,
    "q3_k": _quantize_q3_k,
    "q4_k": _quantize_q4_k,
    "q5_k": _quantize_q5_k,
    "q6_k": _quantize_q6_k,
    "mxfp4": _quantize_mxfp4,
}


def _quantize_fp8(x: np.ndarray) -> np.ndarray:
    """vLLM's per-channel fp8 of a weight (`scaled_fp8_quant` over each output channel): the scale the row's largest
    magnitude over 448 (1 for a row of zeros), each number divided by it in f32, clamped to ±448 and rounded to the
    nearest e4m3 (ties to even, as torch's cast); the codes, then the scale's bytes."""
    amax = np.abs(x).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
    q = np.clip(x / scale[:, None], -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return np.concatenate([q.view(np.uint8), scale.astype("<f4")[:, None].view(np.uint8)], axis=1)


QUANTIZERS = (*_QUANTIZE, "fp8")


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
    if fmt.family == "channels":
        return _quantize_fp8(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
    blocks = _QUANTIZE[fmt.name](x.reshape(-1, fmt.block))
    return blocks.reshape(*x.shape[:-1], -1)


# -- which format each tensor is stored in: a pure format, or Q4_K_M's mix ----------------------------------------

MIXES = ("q4_k_m",)
WEIGHT_CHOICES = (*QUANTIZERS, *MIXES)  # what `logos-compile --weights` stores a preset in

# llama.cpp's `tensor_type_fallback`: a format for rows that are not whole super-blocks
_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def _use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third one between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    """llama.cpp's `tensor_allows_quantization` on a Hugging Face name: matrices (and stacks of experts) named
    `weight`, not the norms, not a mixture's router (`ffn_gate_inp`)."""
    matrix = len(shape) >= 2 and name.endswith(".weight")
    return matrix and not name.endswith("norm.weight") and ".mlp.gate." not in name


def _q4_k_m(name: str, width: int, layers: int, experts: int, tied: bool) -> str:
    """llama.cpp's `llama_tensor_get_type_impl` for LLAMA_FTYPE_MOSTLY_Q4_K_M, before the fallback."""
    output = name == "lm_head.weight" or (tied and name == "model.embed_tokens.weight")
    if output:
        return "q8_0" if width % QK_K else "q6_k"
    match = re.match(r"model\.layers\.(\d+)\.", name)
    layer = int(match[1]) if match else 0
    if name.endswith("self_attn.v_proj.weight"):
        kind = "q6_k" if _use_more_bits(layer, layers) else "q4_k"
        if layers == 80 and kind == "q4_k":  # llama.cpp's LLM_TYPE_70B: attn_v has 8x fewer rows than attn_q
            kind = "q5_k"
        return "q8_0" if experts == 8 else kind
    if name.endswith("self_attn.k_proj.weight") and experts == 8:
        return "q8_0"
    if name.endswith("down_proj.weight") and _use_more_bits(layer, layers):
        return "q6_k"
    if name.endswith("self_attn.o_proj.weight") and experts == 8:
        return "q5_k"
    return "q4_k"


def storage_plan(
    choice: str, tensors: dict[str, tuple[int, ...]], layers: int, experts: int | None, tied: bool
) -> dict[str, str]:
    """The format each tensor is stored in for `--weights choice` (a format of `QUANTIZERS`, or a mix of `MIXES`),
    as `llama-quantize` chooses it (`--pure` for a single format): the tensors it quantizes (`_quantized`), each in
    the mix's format for its role and layer, a row that is not whole blocks of it in llama.cpp's fallback (Q4_K to
    Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, Q2_K and Q3_K to Q4_0; f16 where the fallback's blocks do not fit either).
    A tensor left out stays f32; so does one whose rows a format without a fallback (Q8_0 ... Q5_1, MXFP4) does
    not fit, where llama.cpp refuses the model. `fp8` (no llama.cpp type) quantizes the same matrices but an untied
    embedding, as vLLM's fp8 checkpoints do."""
    if choice not in WEIGHT_CHOICES:
        raise KeyError(choice)
    plan: dict[str, str] = {}
    for name, shape in tensors.items():
        if not _quantized(name, shape):
            continue
        if choice == "fp8" and name == "model.embed_tokens.weight" and not tied:
            continue  # vLLM's fp8 leaves the embedding in the model's floats (a lookup reads one row); the head is fp8
        width = shape[-1]
        kind = _q4_k_m(name, width, layers, experts or 1, tied) if choice in MIXES else choice
        if not FORMATS[kind].row_fits(width) and kind in _FALLBACK:
            kind = _FALLBACK[kind] if FORMATS[_FALLBACK[kind]].row_fits(width) else "f16"
        if FORMATS[kind].row_fits(width):
            plan[name] = kind
    return plan
