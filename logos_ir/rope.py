"""Rotary position embedding's math, in one place: the frequencies every lane and the reference turn positions by,
and the divisors llama.cpp's converter stores for Llama 3 scaling (which a GGUF reader checks).

Both follow Hugging Face: linear scaling (`_compute_linear_scaling_rope_parameters`) divides every frequency by its
factor; Llama 3's (`_compute_llama3_parameters`) keeps wavelengths shorter than old_ctx/high_freq_factor are
kept, those longer than old_ctx/low_freq_factor are divided by `factor`, and those between are blended smoothly.
"""

from __future__ import annotations

import math

import numpy as np

from logos_ir.spec import RopeScaling


def base_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """The unscaled rotary frequencies 1/theta^(2i/head_dim), in float64."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """The rotary frequencies (float64), with `scaling` applied when given: linear (each divided by its factor, as
    Hugging Face's `_compute_linear_scaling_rope_parameters`) or Llama 3's."""
    inv_freq = base_inv_freq(head_dim, theta)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
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
