"""Number formats and integer arithmetic shared by the lanes (CUDA, D5005, spatial).

It sits in the core, beside the lanes rather than in one of them, because no lane imports another: the CUDA
lane's weight image and runtime and the D5005 lane's weight image round to bfloat16 through `bf16_bits`, and
every lane's launch and loop sizes use `ceil_div`.

bfloat16 conversion rounds to nearest, ties to even, as torch does (`c10::detail::round_to_nearest_even`): the
upper 16 bits of the float32 after adding 0x7FFF plus the lowest kept bit. Infinities stay infinities and a value
past the largest finite bf16 rounds to infinity. Every NaN becomes the one quiet NaN 0x7FC0 (its sign and payload
dropped), as torch's conversion gives; the bare rounding would turn a NaN whose payload lies in the low 16 bits
into an infinity, and a signalling NaN could carry into the sign bit.
"""

from __future__ import annotations

import numpy as np

BF16_NAN = 0x7FC0  # the quiet NaN every float32 NaN converts to


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns (uint16), rounded to nearest even; every NaN becomes `BF16_NAN`."""
    floats = np.ascontiguousarray(values, dtype=np.float32)
    bits = floats.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(np.isnan(floats), np.uint32(BF16_NAN), rounded).astype(np.uint16)


def bf16_rounded(values: np.ndarray) -> np.ndarray:
    """float32 rounded to the nearest bfloat16 (ties to even), kept as float32: the values a bf16 image holds."""
    return (bf16_bits(values).astype(np.uint32) << np.uint32(16)).view(np.float32)


def ceil_div(a: int, b: int) -> int:
    """The integer ceiling of a / b (b > 0): how many blocks of b cover a."""
    return -(-a // b)
