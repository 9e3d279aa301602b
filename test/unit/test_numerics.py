"""bfloat16 rounding and ceil_div of `logos_ir.numerics`, the one definition the lanes share."""

from __future__ import annotations

import numpy as np

from logos_ir.numerics import BF16_NAN, bf16_bits, bf16_rounded, ceil_div


def _bits(*words: int) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.float32)


def test_plain_values_keep_their_upper_bits():
    assert bf16_bits(np.array([1.0, -2.0, 0.0, -0.0], dtype=np.float32)).tolist() == [0x3F80, 0xC000, 0x0000, 0x8000]


def test_ties_round_to_even():
    # 0x3F80_8000 lies halfway between 0x3F80 and 0x3F81: the even one wins; 0x3F81_8000 rounds up to 0x3F82.
    assert bf16_bits(_bits(0x3F808000, 0x3F818000)).tolist() == [0x3F80, 0x3F82]
    # just past half rounds up, just under rounds down
    assert bf16_bits(_bits(0x3F808001, 0x3F807FFF)).tolist() == [0x3F81, 0x3F80]


def test_infinities_stay_and_overflow_rounds_to_infinity():
    assert bf16_bits(np.array([np.inf, -np.inf], dtype=np.float32)).tolist() == [0x7F80, 0xFF80]
    assert bf16_bits(np.array([np.finfo(np.float32).max], dtype=np.float32)).tolist() == [0x7F80]


def test_every_nan_becomes_the_quiet_nan():
    # a quiet NaN, a negative one, one whose payload is only in the low bits (bare rounding would give infinity),
    # and a negative signalling NaN with a full payload (bare rounding would carry past the sign)
    nans = _bits(0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF)
    assert bf16_bits(nans).tolist() == [BF16_NAN] * 4
    assert np.isnan(bf16_rounded(nans)).all()


def test_rounded_values_are_the_bf16_values_as_float32():
    values = np.array([1.0, 3.14159, -1e-3, 65504.0], dtype=np.float32)
    rounded = bf16_rounded(values)
    assert rounded.dtype == np.float32
    assert (rounded.view(np.uint32) & 0xFFFF).tolist() == [0, 0, 0, 0]
    assert bf16_bits(rounded).tolist() == bf16_bits(values).tolist()


def test_ceil_div():
    assert [ceil_div(a, 4) for a in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
