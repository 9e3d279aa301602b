"""Rotary position embedding's math, in one place: the frequencies every lane and the reference turn positions by,
and the divisors llama.cpp's converter stores for Llama 3 scaling (which a GGUF reader checks).

Both follow Hugging Face: linear scaling (`_compute_linear_scaling_rope_parameters`) divides every frequency by its
factor; Llama 3's (`_compute_llama3_parameters`) keeps wavelengths shorter than old_ctx/high_freq_factor are
kept, those longer than old_ctx/low_freq_factor are divided by `factor`, and those between are blended smoothly;
YaRN's (`_compute_yarn_parameters`) ramps linearly over the pairs between `beta_fast` and `beta_slow` turns in
the original context from kept to divided; LongRoPE's (`_compute_longrope_parameters`) divides each pair's by
its own factor. YaRN and LongRoPE scale cos and sin by an attention factor (`rope_attention_factor`).
"""

from __future__ import annotations

import math

import numpy as np

from logos_ir.errors import SpecError
from logos_ir.spec import RopeScaling


def base_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """The unscaled rotary frequencies 1/theta^(2i/head_dim), in float64."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """The rotary frequencies (float64), with `scaling` applied when given: linear (each divided by its factor, as
    Hugging Face's `_compute_linear_scaling_rope_parameters`), Llama 3's, YaRN's (`yarn_inv_freq`) or LongRoPE's
    (each pair's divided by its own factor)."""
    inv_freq = base_inv_freq(head_dim, theta)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "yarn":
        return yarn_inv_freq(scaling, head_dim, theta)
    if scaling.rope_type == "longrope":
        assert scaling.factors is not None
        if scaling.long_factors is not None:
            raise SpecError(
                "a LongRoPE scaling with short and long factors rotates with one set, chosen by the context"
                " (RopeScaling.at_context)"
            )
        if len(scaling.factors) != head_dim // 2:
            raise SpecError(f"a LongRoPE scaling of {len(scaling.factors)} factors cannot scale {head_dim // 2} pairs")
        return inv_freq / np.asarray(scaling.factors, dtype=np.float64)
    assert scaling.low_freq_factor is not None and scaling.high_freq_factor is not None
    assert scaling.original_max_position_embeddings is not None
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def llama3_rope_divisors(scaling: RopeScaling, head_dim: int, theta: float) -> np.ndarray:
    """What llama.cpp's converter stores as `rope_freqs`: by how much Llama 3 scaling divides each rotary
    frequency (1 for high frequencies, `factor` for low ones, a smooth blend between)."""
    assert scaling.low_freq_factor is not None and scaling.high_freq_factor is not None
    assert scaling.original_max_position_embeddings is not None
    wavelen = 2 * math.pi / base_inv_freq(head_dim, theta)
    old = scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    smooth = (old / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / scaling.factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, scaling.factor, blended))


def yarn_ramp(scaling: RopeScaling, dim: int, theta: float) -> tuple[int, int]:
    """YaRN's correction range over a head of `dim` rotating numbers: the pairs below the first turn more than
    `beta_fast` times over the original context (kept), those from the second on fewer than `beta_slow` times
    (divided by the factor), each bound rounded outwards and clipped to the head (transformers' `truncate`)."""
    assert scaling.beta_fast is not None and scaling.beta_slow is not None
    old = scaling.original_max_position_embeddings

    def pair(turns: float) -> float:  # the pair index whose wavelength fits `turns` times into the original context
        return dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(theta))

    return max(math.floor(pair(scaling.beta_fast)), 0), min(math.ceil(pair(scaling.beta_slow)), dim - 1)


def yarn_inv_freq(scaling: RopeScaling, dim: int, theta: float) -> np.ndarray:
    """YaRN's frequencies: each pair blends the unscaled frequency and the one divided by `factor` by a linear ramp
    over the correction range (`yarn_ramp`: 0 below it, all interpolated from its end on)."""
    low, high = yarn_ramp(scaling, dim, theta)
    if low == high:
        high += 0.001  # a ramp of no width: a step at `low`
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv_freq = base_inv_freq(dim, theta)
    return inv_freq / scaling.factor * ramp + inv_freq * (1.0 - ramp)


def rope_attention_factor(scaling: RopeScaling | None) -> float:
    """By how much a rotation scales cos and sin: YaRN's and LongRoPE's attention factor, else 1."""
    return 1.0 if scaling is None or scaling.attention_factor is None else scaling.attention_factor
