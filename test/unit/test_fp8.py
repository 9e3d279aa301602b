"""fp8 weights (e4m3 with a float32 scale a row, vLLM's and TensorRT-LLM's per-channel fp8): the format's
decoding against the e4m3 definition, the quantizer against a brute-force nearest-number search, the LOGOS
sentence and the identity it changes, and a model stored in it on the reference and the emulated CUDA lane.

The CUDA lane's decode step reads fp8 weights as stored (the codes and each row's scale, dequantized in registers:
`test_cuda_quant.py`), its prefill and the other lanes their float image (`docs/quantization.md`); Hopper's fp8
instructions are not used."""

from __future__ import annotations

import math

import numpy as np
import pytest

from logos_ir import author, quant
from logos_ir.generate import Generator
from logos_ir.parser import parse_program
from logos_ir.printer import print_program
from logos_ir.program import Cut, Identity
from logos_ir.registry import backends
from logos_ir.runtime import RunRequest
from logos_ir.spec import ModelSpec
from logos_ir.testing import quantized_store
from logos_ir.weights.store import RandomWeights

FP8 = quant.FORMATS["fp8"]
PROMPT = [3, 5, 7, 11]


def _e4m3(code: int) -> float:
    """OCP's E4M3FN from its bits: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 subnormal; S.1111.111
    NaN, no infinities."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * math.ldexp(mantissa / 8, -6)
    return sign * math.ldexp(1 + mantissa / 8, exponent - 7)


TABLE = np.array([_e4m3(c) for c in range(256)], np.float64)


def test_every_code_reads_as_the_definition_times_its_rows_scale() -> None:
    scales = np.array([1.0, 0.0078125, 3.3], np.float32)
    codes = np.tile(np.arange(256, dtype=np.uint8), (3, 1))
    raw = np.concatenate([codes, scales[:, None].view(np.uint8)], axis=1)
    got = quant.dequantize(raw, FP8, (3, 256))
    want = (TABLE[None, :] * scales[:, None].astype(np.float64)).astype(np.float32)  # one rounding of an exact product
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
    assert np.nanmax(TABLE) == quant.E4M3_MAX and FP8.stored_bytes((3, 256)) == 3 * (256 + 4)


def test_the_quantizer_takes_each_rows_nearest_e4m3() -> None:
    """The scale is the row's largest magnitude over 448; each number the nearest e4m3 to it over the scale (ties to
    the even code), clamped to ±448; a row of zeros stores zeros with a scale of 1."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((5, 96)) * np.array([[0.02], [1.0], [300.0], [1e-6], [0.0]])).astype(np.float32)
    x[1, :4] = [0.0, -0.0, 1.0 / 1024, -2.5]
    raw = quant.quantize(x, FP8)
    assert raw.shape == (5, 100)
    scales = raw[:, -4:].copy().view("<f4")[:, 0]
    amax = np.abs(x).max(axis=1)
    np.testing.assert_array_equal(scales[:4], (amax[:4] / np.float32(448)).astype(np.float32))
    assert scales[4] == 1.0 and np.all(TABLE[raw[4, :-4]] == 0)  # zeros (a negative number's zero keeps its sign)
    finite = np.flatnonzero(~np.isnan(TABLE))
    for row in range(4):
        scaled = x[row] / scales[row]
        distance = np.abs(TABLE[finite][None, :] - scaled[:, None].astype(np.float64))
        best = distance.min(axis=1)
        code = raw[row, :-4]
        np.testing.assert_array_equal(np.abs(TABLE[code] - scaled), best)  # a nearest one (a tie: either)
        ties = (distance == best[:, None]).sum(axis=1) > 1
        assert np.all(code[ties] % 2 == 0)  # ties to the even mantissa
    back = quant.dequantize(raw, FP8, x.shape)
    assert np.abs(back[:4]).max(axis=1).tolist() == pytest.approx(amax[:4].tolist(), rel=1e-6)  # 448 * scale


def test_the_sentence_says_the_format_and_the_identity_changes_with_it() -> None:
    assert quant.sentence(FP8) == "8-bit floats (e4m3) with a scale a row"
    assert quant.parse_sentence("8-bit floats (e4m3) with a scale a row") is FP8
    store = quantized_store(ModelSpec.preset("tiny"), "fp8")
    stored = dict(store.spec.storage)
    assert "model.embed_tokens.weight" not in stored and stored["lm_head.weight"] == "fp8"  # vLLM's choice
    assert stored["model.layers.0.self_attn.q_proj.weight"] == "fp8"
    assert "model.layers.0.input_layernorm.weight" not in stored
    authored = author.write(store.spec, Cut.decode(16))
    assert 'q_proj.weight" of 64 by 64, stored in 8-bit floats (e4m3) with a scale a row.' in authored.text
    assert print_program(parse_program(authored.text)) == authored.text
    plain = author.write(ModelSpec.preset("tiny"), Cut.decode(16))
    assert Identity.of(Cut.decode(16), authored.text) != Identity.of(Cut.decode(16), plain.text)


def test_a_model_stored_in_fp8_runs_as_its_dequantization_on_the_reference_and_the_cuda_lane() -> None:
    spec = ModelSpec.preset("tiny")
    store = quantized_store(spec, "fp8")
    plain = RandomWeights(spec)
    name = "model.layers.1.mlp.down_proj.weight"
    error = np.abs(store.get(name) - plain.get(name)).max() / np.abs(plain.get(name)).max()
    assert 0 < error <= 1 / 16  # e4m3's 3 mantissa bits: half a step of 1/8 at most, relative to the row's largest
    tokens = Generator(store, ctx=32).generate(PROMPT, 8)
    request = RunRequest(store, ctx=32, prefill_rows=4, weights="f32", emulate=True)
    assert backends()["cuda"].generator()(request).generate(PROMPT, 8) == tokens
