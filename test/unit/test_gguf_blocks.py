"""Every GGUF block format the reader takes, decoded here by hand from llama.cpp's layouts (the `block_*` structs of
`ggml-common.h`, the `dequantize_row_*` loops of `ggml-quants.c`) and compared with what the reader gives (gguf-py's
dequantizers underneath): random blocks of each type, their scales set to finite values a file could hold, read
through a GGUF file; then a small model stored in each K-quant (256-wide rows, as llama.cpp's K-quants need) reads
back, tensor by tensor, as gguf-py dequantizes it, and generates the tokens of the same model written in f32.
Last, Llama 3 rope scaling, which a GGUF holds as divisors (`rope_freqs`), is recovered at any original context."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from logos_ir.errors import WeightError
from logos_ir.testing import save_gguf
from logos_ir.weights import GGUFFile, open_model

QK_K = 256


def _f16(data: bytes, at: int) -> float:
    return struct.unpack_from("<e", data, at)[0]


def _q5_0(b: bytes) -> list[float]:
    d, qh, qs = _f16(b, 0), struct.unpack_from("<I", b, 2)[0], b[6:22]
    low = [((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16 for j in range(16)]
    high = [((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16 for j in range(16)]
    return [d * q for q in low + high]


def _q5_1(b: bytes) -> list[float]:
    d, m, qh, qs = _f16(b, 0), _f16(b, 2), struct.unpack_from("<I", b, 4)[0], b[8:24]
    low = [(qs[j] & 0xF) | ((qh >> j) & 1) << 4 for j in range(16)]
    high = [(qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4 for j in range(16)]
    return [d * q + m for q in low + high]


def _mxfp4(b: bytes) -> list[float]:
    # E8M0 scale halved (ggml's GGML_E8M0_TO_FP32_HALF) times e2m1 codes doubled (kvalues_mxfp4)
    values = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    d = 2.0 ** (b[0] - 127) / 2
    return [d * values[q & 0xF] for q in b[1:17]] + [d * values[q >> 4] for q in b[1:17]]


def _q2_k(b: bytes) -> list[float]:
    scales, qs, d, dmin = b[0:16], b[16:80], _f16(b, 80), _f16(b, 82)
    out, s = [], 0
    for n in range(2):  # two halves of 128, each from 32 bytes of 2-bit codes at four shifts
        q = qs[32 * n : 32 * n + 32]
        for shift in (0, 2, 4, 6):
            for half in (0, 16):
                dl, ml = d * (scales[s] & 0xF), dmin * (scales[s] >> 4)
                out += [dl * ((q[half + i] >> shift) & 3) - ml for i in range(16)]
                s += 1
    return out


def _q3_k_scales(packed: bytes) -> list[int]:
    """Sixteen 6-bit scales, offset by 32: the low 4 bits of scale j in byte j % 8 (high nibble from 8 on), its
    two high bits in byte 8 + j % 4 at bit 2 (j // 4)."""
    out = []
    for j in range(16):
        low = (packed[j % 8] >> (4 * (j // 8))) & 0xF
        high = (packed[8 + j % 4] >> (2 * (j // 4))) & 3
        out.append((low | high << 4) - 32)
    return out


def _q3_k(b: bytes) -> list[float]:
    hmask, qs, scales, d = b[0:32], b[32:96], _q3_k_scales(b[96:108]), _f16(b, 108)
    out, s, bit = [], 0, 1
    for n in range(2):
        q = qs[32 * n : 32 * n + 32]
        for shift in (0, 2, 4, 6):
            for half in (0, 16):
                dl = d * scales[s]
                out += [dl * (((q[half + i] >> shift) & 3) - (0 if hmask[half + i] & bit else 4)) for i in range(16)]
                s += 1
            bit <<= 1
    return out


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    """ggml's get_scale_min_k4: 6-bit scale and minimum of sub-block j of 8 from 12 packed bytes."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def _q4_k(b: bytes) -> list[float]:
    d, dmin, packed, qs = _f16(b, 0), _f16(b, 2), b[4:16], b[16:144]
    out = []
    for n in range(4):  # 64 values a step: 32 low nibbles (sub-block 2n), 32 high ones (2n + 1)
        q = qs[32 * n : 32 * n + 32]
        (s1, m1), (s2, m2) = _scale_min_k4(2 * n, packed), _scale_min_k4(2 * n + 1, packed)
        out += [d * s1 * (x & 0xF) - dmin * m1 for x in q]
        out += [d * s2 * (x >> 4) - dmin * m2 for x in q]
    return out


def _q5_k(b: bytes) -> list[float]:
    d, dmin, packed, qh, qs = _f16(b, 0), _f16(b, 2), b[4:16], b[16:48], b[48:176]
    out = []
    for n in range(4):
        q = qs[32 * n : 32 * n + 32]
        (s1, m1), (s2, m2) = _scale_min_k4(2 * n, packed), _scale_min_k4(2 * n + 1, packed)
        out += [d * s1 * ((x & 0xF) + 16 * ((qh[i] >> (2 * n)) & 1)) - dmin * m1 for i, x in enumerate(q)]
        out += [d * s2 * ((x >> 4) + 16 * ((qh[i] >> (2 * n + 1)) & 1)) - dmin * m2 for i, x in enumerate(q)]
    return out


def _q6_k(b: bytes) -> list[float]:
    ql, qh, scales, d = b[0:128], b[128:192], struct.unpack_from("<16b", b, 192), _f16(b, 208)
    out = [0.0] * QK_K
    for n in range(2):  # 128 values from 64 bytes of low nibbles and 32 of high bit pairs
        low, high, sc = ql[64 * n : 64 * n + 64], qh[32 * n : 32 * n + 32], scales[8 * n : 8 * n + 8]
        for i in range(32):
            codes = (
                (low[i] & 0xF) | ((high[i] >> 0) & 3) << 4,
                (low[i + 32] & 0xF) | ((high[i] >> 2) & 3) << 4,
                (low[i] >> 4) | ((high[i] >> 4) & 3) << 4,
                (low[i + 32] >> 4) | ((high[i] >> 6) & 3) << 4,
            )
            for k, code in enumerate(codes):
                out[128 * n + 32 * k + i] = d * sc[i // 16 + 2 * k] * (code - 32)
    return out


# each format: its hand decoder, and where its float16 scales sit in a block (set to finite values)
FORMATS: dict[QT, tuple[Callable[[bytes], list[float]], tuple[int, ...]]] = {
    QT.Q5_0: (_q5_0, (0,)),
    QT.Q5_1: (_q5_1, (0, 2)),
    QT.MXFP4: (_mxfp4, ()),
    QT.Q2_K: (_q2_k, (80, 82)),
    QT.Q3_K: (_q3_k, (108,)),
    QT.Q4_K: (_q4_k, (0, 2)),
    QT.Q5_K: (_q5_k, (0, 2)),
    QT.Q6_K: (_q6_k, (208,)),
}


def random_blocks(kind: QT, count: int, seed: int = 7) -> bytes:
    """`count` blocks of random bytes, each float16 scale a finite value of a weight's size (0.5e-3 to 2e-2) and an
    MXFP4 block's exponent byte between 2^-8 and 2^-2."""
    _, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    blocks = bytearray(rng.integers(0, 256, count * size, dtype=np.uint8).tobytes())
    for block in range(count):
        for at in FORMATS[kind][1]:
            struct.pack_into("<e", blocks, block * size + at, rng.uniform(0.5e-3, 2e-2))
        if kind == QT.MXFP4:
            blocks[block * size] = int(rng.integers(119, 126))
    return bytes(blocks)


@pytest.mark.parametrize("kind", list(FORMATS), ids=lambda kind: kind.name)
def test_each_block_format_reads_as_its_layout_decodes_by_hand(tmp_path: Path, kind: QT) -> None:
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rows, columns = 3, 2 * max(block, 32)
    data = random_blocks(kind, rows * columns // block)
    writer = gguf.GGUFWriter(str(tmp_path / "probe.gguf"), "llama")
    writer.add_tensor("probe.weight", np.frombuffer(data, np.uint8).reshape(rows, -1), raw_dtype=kind)
    save_gguf(writer)
    got = GGUFFile(tmp_path / "probe.gguf").read("probe.weight")
    assert got.shape == (rows, columns) and got.dtype == np.float32
    decode = FORMATS[kind][0]
    want = [value for at in range(0, len(data), size) for value in decode(data[at : at + size])]
    np.testing.assert_allclose(got.reshape(-1), np.array(want, np.float32), rtol=1e-6, atol=1e-9)


def _copy_metadata(file: GGUFFile, writer: gguf.GGUFWriter) -> None:
    kinds = {int: gguf.GGUFValueType.UINT32, float: gguf.GGUFValueType.FLOAT32}
    for key, value in file.metadata.items():
        if not key.startswith(("GGUF.", "general.architecture")) and type(value) in kinds:
            writer.add_key_value(key, value, kinds[type(value)])


def _k_quant_model(tmp_path: Path, kind: QT) -> tuple[Path, Path]:
    """A two-layer model 256 wide with random weights, its matrices stored in `kind` (random blocks, so the file
    holds what no quantizer of ours chose), and the same model in f32 with gguf-py's dequantization of each."""
    from test_weights import write_gguf

    from logos_ir.spec import ModelSpec
    from logos_ir.weights import RandomWeights

    spec = ModelSpec(
        vocab=64, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512, rms_eps=1e-5,
        rope_theta=10000.0, tie_embeddings=False,
    )  # fmt: skip
    file = GGUFFile(write_gguf(tmp_path / "f32.gguf", RandomWeights(spec, seed=3), QT.F32))
    quantized = gguf.GGUFWriter(str(tmp_path / f"{kind.name}.gguf"), "llama")
    dequantized = gguf.GGUFWriter(str(tmp_path / "dequantized.gguf"), "llama")
    for writer in (quantized, dequantized):
        _copy_metadata(file, writer)
    block, _ = gguf.GGML_QUANT_SIZES[kind]
    for index, (name, tensor) in enumerate(sorted(file.tensors.items())):
        if len(tensor.shape) == 1:
            quantized.add_tensor(name, file.read(name))
            dequantized.add_tensor(name, file.read(name))
            continue
        rows, columns = tensor.shape
        raw = np.frombuffer(random_blocks(kind, rows * columns // block, seed=index), np.uint8).reshape(rows, -1)
        quantized.add_tensor(name, raw, raw_dtype=kind)
        dequantized.add_tensor(name, gguf.quants.dequantize(raw, kind).astype(np.float32))
    save_gguf(quantized)
    save_gguf(dequantized)
    return tmp_path / f"{kind.name}.gguf", tmp_path / "dequantized.gguf"


@pytest.mark.parametrize("kind", [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda kind: kind.name)
def test_a_k_quant_model_reads_as_gguf_py_dequantizes_it_and_gives_its_tokens(tmp_path: Path, kind: QT) -> None:
    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    quantized, dequantized = _k_quant_model(tmp_path, kind)
    stored, plain = open_model(str(quantized)), open_model(str(dequantized))
    assert stored.spec == plain.spec and stored.names() == plain.names()
    for name in plain.names():
        np.testing.assert_array_equal(stored.get(name), plain.get(name), err_msg=name)
    generate = backends()["reference"].generator()
    prompt = [1, 5, 9]
    tokens = generate(RunRequest(stored)).generate(prompt, 6)
    assert tokens == generate(RunRequest(plain)).generate(prompt, 6)


def test_a_k_quant_row_that_does_not_fill_its_superblocks_is_refused(tmp_path: Path) -> None:
    from logos_ir.testing import STRING, gguf_bytes

    tensor = ("probe.weight", (2, 128), int(QT.Q4_K), random_blocks(QT.Q4_K, 1))
    (tmp_path / "short.gguf").write_bytes(gguf_bytes([("general.architecture", STRING, "llama")], [tensor]))
    with pytest.raises(WeightError, match="its rows of 128 do not fill whole Q4_K blocks of 256"):
        GGUFFile(tmp_path / "short.gguf")


# -- Llama 3 rope scaling at any original context ---------------------------------------------------------------


@pytest.mark.parametrize(
    "scaling, stated",
    [
        ((32.0, 1.0, 4.0, 8192), False),  # Llama 3.2's
        ((8.0, 1.0, 4.0, 32768), False),  # a longer original context, nothing stated beside the divisors
        ((16.0, 1.0, 4.0, 2048), False),
        ((8.0, 2.0, 8.0, 8192), True),  # other frequency factors: the file's original context fixes them
    ],
)
def test_llama3_rope_scaling_is_recovered_from_its_divisors_at_any_original_context(
    tmp_path: Path, scaling: tuple[float, float, float, int], stated: bool
) -> None:
    import dataclasses

    from test_weights import TINY, write_gguf

    from logos_ir.rope import llama3_rope_divisors
    from logos_ir.spec import RopeScaling
    from logos_ir.weights import GGUFStore, RandomWeights

    spec = dataclasses.replace(TINY, head_dim=64, hidden=128, rope_theta=500000.0)
    want = RopeScaling(*scaling)
    divisors = llama3_rope_divisors(want, spec.head_dim, spec.rope_theta).astype(np.float32)
    assert ((divisors > 1.001) & (divisors < want.factor * 0.999)).sum() >= 2, "the test needs divisors in the blend"

    def extra(writer: gguf.GGUFWriter) -> None:
        writer.add_tensor("rope_freqs.weight", divisors)
        if stated:
            writer.add_rope_scaling_orig_ctx_len(want.original_max_position_embeddings)

    store = GGUFStore(write_gguf(tmp_path / "l3.gguf", RandomWeights(spec), extra=extra))
    got = store.spec.rope_scaling
    assert got is not None and got.original_max_position_embeddings == want.original_max_position_embeddings
    assert (got.factor, got.low_freq_factor, got.high_freq_factor) == pytest.approx(scaling[:3], rel=1e-4)
