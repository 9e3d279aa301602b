"""The project's quantizers for the K-quants (Q2_K ... Q6_K) and MXFP4, against llama.cpp's reference quantizers.

gguf-py quantizes MXFP4 but none of the K-quants, so the K-quants are checked against the bytes llama.cpp's
`quantize_row_q{2,3,4,5,6}_K_ref` and `quantize_row_mxfp4_ref` give on one input (`_reference_input`): their SHA-256
digests below were taken from `ggml-quants.c` (the ggml vendored by the ggml-python 0.0.45 sdist) compiled with
`gcc -O1 -ffp-contract=off` on x86-64 and called on that input through ctypes; a build that fuses multiplies and
adds (`-march=native` with FMA) may round a few blocks differently. Then properties that a wrong layout or a wrong
scale encoding breaks: the error within a step of each super-block, the bytes a block, the largest sub-block's
scale at the top code, an input the format represents exactly read back exactly, and gguf-py's dequantizer
reading our bytes to our own dequantization."""

from __future__ import annotations

import hashlib

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from logos_ir import quant

K_QUANTS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
NEW = (*K_QUANTS, "mxfp4")

LLAMA_CPP_SHA256 = {
    "q2_k": "5d867a04740c99552262cfbbe546dcf6dc1527bb0bad1d40c31b2f5a43ec2249",
    "q3_k": "2f58869914324973892831db968c9c773e4a38d5c3fce26a6afc37ec79bdfdf6",
    "q4_k": "5d5f3f1345f863927edc6630df94f37450c90b7450a324be1252069b3034d194",
    "q5_k": "7a8292a119d21a5117466eb5842439c681de7b0bcc8f20531f139bc228a56f37",
    "q6_k": "80a20722d1cf983d040cb9f0f3957c9c7035ca900e0d585e0ffef50a6058b94c",
    "mxfp4": "115cca73b022a7ac796b979d43e954e4aa784299f73b6d35006f970e6c004c30",
}


def _reference_input() -> np.ndarray:
    """24 rows of 512: cubes of a uniform integer hash (made by integer and exact float32 operations only, so the
    same on every machine), with rows of edges: zeros, a constant, alternating signs, a ramp, large, all
    positive, a run of zeros, tiny, and a narrow band away from zero."""
    n = np.arange(24 * 512, dtype=np.uint32)
    state = n * np.uint32(1664525) + np.uint32(1013904223)
    state = (state ^ (state >> np.uint32(13))) * np.uint32(2654435769)
    u = ((state >> np.uint32(8)).astype(np.int64) - (1 << 23)).astype(np.float32) / np.float32(1 << 23)
    x = (u * u * u).reshape(24, 512)
    x[0, :256] = 0
    x[1, :256] = 0.5
    x[2, :256] = np.where(np.arange(256) % 2, 1.0, -1.0)
    x[3, :256] = np.arange(256) / np.float32(64) - 2
    x[4] *= np.float32(4096)
    x[5] = np.abs(x[5])
    x[6, :40] = 0
    x[7] *= np.float32(1 / 65536)
    x[8] = x[8] * np.float32(0.0625) + np.float32(0.25)
    return x


@pytest.mark.parametrize("name", NEW)
def test_the_quantizer_gives_llama_cpps_reference_bytes(name: str) -> None:
    got = quant.quantize(_reference_input(), quant.FORMATS[name])
    assert hashlib.sha256(got.tobytes()).hexdigest() == LLAMA_CPP_SHA256[name]


def test_mxfp4_gives_gguf_pys_bytes() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    x[0, :32], x[1, :32] = 0, 0.75
    x[2] *= np.float32(1e-3)
    x[3, :32] = np.arange(32) - 16
    np.testing.assert_array_equal(quant.quantize(x, quant.FORMATS["mxfp4"]), gguf.quants.quantize(x, QT.MXFP4))


def _samples() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    shapes = (16, 1024)
    return [
        rng.standard_normal(shapes).astype(np.float32),
        (rng.standard_normal(shapes) ** 3).astype(np.float32),
        rng.uniform(0, 1, shapes).astype(np.float32),
        rng.laplace(0, 0.02, shapes).astype(np.float32),
    ]


@pytest.mark.parametrize("name", NEW)
def test_what_it_stores_reads_back_within_a_step_of_each_block(name: str) -> None:
    """A step: the block's range (from zero where it has no minimum) over its codes' 2^bits - 1 gaps; for
    MXFP4, a quarter of the block's largest magnitude (e2m1's gap from 4 to 6 at the block's scale)."""
    fmt = quant.FORMATS[name]
    for x in _samples():
        raw = quant.quantize(x, fmt)
        assert raw.dtype == np.uint8 and raw.shape == (x.shape[0], x.shape[1] // fmt.block * fmt.block_bytes)
        back = quant.dequantize(raw, fmt, x.shape)
        b = x.reshape(-1, fmt.block)
        if name == "mxfp4":
            step = np.abs(b).max(axis=1) / 4
        elif fmt.minimum:
            step = (b.max(axis=1) - np.minimum(b.min(axis=1), 0)) / (2**fmt.bits - 1)
        else:
            step = 2 * np.abs(b).max(axis=1) / (2**fmt.bits - 1)
        err = np.abs(back - x).reshape(-1, fmt.block).max(axis=1)
        assert np.all(err <= step * (1 + 1e-5)), (name, float((err / step).max()))
        # and well inside it on average, as rounding to the nearest code gives
        assert np.sqrt(np.mean((back - x) ** 2)) < 0.5 * np.mean(step)


@pytest.mark.parametrize("name", NEW)
def test_gguf_pys_dequantizer_reads_our_bytes_to_our_values(name: str) -> None:
    fmt = quant.FORMATS[name]
    x = _samples()[1]
    raw = quant.quantize(x, fmt)
    want = gguf.quants.dequantize(raw, QT[name.upper()])
    np.testing.assert_array_equal(quant.dequantize(raw, fmt, x.shape), want)


def test_the_largest_sub_blocks_scale_takes_the_top_code() -> None:
    """Each super-block's sub-block scales are stored against the largest: Q4_K's and Q5_K's at 63 (6 bits),
    Q2_K's at 15 (4 bits), Q3_K's as -32 (stored 0) and Q6_K's as -128, the super-block's own scale its sign."""
    x = _samples()[0]
    q4 = quant.quantize(x, quant.FORMATS["q4_k"]).reshape(-1, 144)
    sc, _ = quant._k_scales_mins(q4[:, 4:16])
    assert np.all(sc.max(axis=1) == 63) and np.all(sc <= 63)
    q5 = quant.quantize(x, quant.FORMATS["q5_k"]).reshape(-1, 176)
    assert np.all(quant._k_scales_mins(q5[:, 4:16])[0].max(axis=1) == 63)
    q2 = quant.quantize(x, quant.FORMATS["q2_k"]).reshape(-1, 84)
    assert np.all((q2[:, :16] & 0x0F).max(axis=1) == 15)
    q3 = quant.quantize(x, quant.FORMATS["q3_k"]).reshape(-1, 110)
    assert np.all(quant._q3_k_scales(q3[:, 96:108]).min(axis=1) == -32)
    q6 = quant.quantize(x, quant.FORMATS["q6_k"]).reshape(-1, 210)
    assert np.all(q6[:, 192:208].view(np.int8).min(axis=1) == -128)


def _exact(name: str, rng: np.random.Generator) -> np.ndarray:
    """Rows each super-block of which the format holds exactly: sub-block scales on a power-of-two grid with the
    largest at the top code, each sub-block's codes spanning the format's range (its ends included)."""
    rows = 4
    if name in ("q4_k", "q5_k", "q2_k"):
        sub, top, nmax = (32, 63, 15) if name == "q4_k" else (32, 63, 31) if name == "q5_k" else (16, 15, 3)
        d = np.float32(2.0**-10)
        sc = rng.integers(1, top + 1, (rows, 256 // sub)).astype(np.float32)
        sc[:, 0] = top
        q = rng.integers(0, nmax + 1, (rows, 256 // sub, sub)).astype(np.float32)
        q[:, :, 0], q[:, :, 1] = 0, nmax
        return (d * sc[:, :, None] * q).reshape(rows, 256)
    if name in ("q6_k", "q3_k"):
        top, nmax = (128, 32) if name == "q6_k" else (32, 4)
        d = np.float32(2.0**-12)
        sc = rng.integers(1, top, (rows, 16)).astype(np.float32)
        sc[:, 0] = top
        q = rng.integers(1 - nmax, nmax, (rows, 16, 16)).astype(np.float32)
        q[:, :, 0] = -nmax
        return (-d * sc[:, :, None] * q).reshape(rows, 256)  # the largest of each sub-block positive, at -d*(-nmax)
    kv = np.array([0, 1, 2, 3, 4, 6, 8, 12, -1, -2, -3, -4, -6, -8, -12], np.float32)
    half = np.float32(2.0**-9)
    codes = kv[rng.integers(0, kv.size, (rows * 8, 32))]
    codes[:, 0] = 12
    return (half * codes).reshape(rows, 256)


@pytest.mark.parametrize("name", NEW)
def test_an_input_the_format_holds_exactly_reads_back_exactly(name: str) -> None:
    fmt = quant.FORMATS[name]
    x = _exact(name, np.random.default_rng(sum(map(ord, name))))
    back = quant.dequantize(quant.quantize(x, fmt), fmt, x.shape)
    np.testing.assert_array_equal(back, x)


def test_a_k_quant_refuses_rows_that_are_not_whole_super_blocks() -> None:
    with pytest.raises(ValueError, match="not whole blocks of 256"):
        quant.quantize(np.zeros((2, 128), np.float32), quant.FORMATS["q4_k"])
