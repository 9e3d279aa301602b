"""The reference interpreter's kernels: the numpy math of each `logos` op, in float32, as a step over register
slots.

A kernel's `make(*in_slots, out_slot)` returns the step closure. Constants (weights, caches, rotary tables) are
bound when the kernel is chosen, so a step only indexes the register list: no IR, no dispatch and no dictionary
lookups on the hot path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from logos_ir.rope import rope_attention_factor, rope_inv_freq
from logos_ir.spec import RopeScaling

Registers = list[Any]
Step = Callable[[Registers], None]

_F32 = np.float32


# -- rotary tables -------------------------------------------------------------------------------------------


class RopeTable:
    """cos and signed sin per position (row p-1 for LOGOS position p, rotary angle (p-1)*inv_freq), laid out
    over the numbers of a head that rotate (`head_dim` here: the whole head, or its rotary part) so that
    rotate-half is one multiply-add: out = x*cos + swap_halves(x)*sin with sin laid out as [-sin, sin]."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None, length: int):
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self.attention_factor = rope_attention_factor(scaling)  # YaRN's and LongRoPE's scale of cos and sin
        self.cos = self.sin = np.zeros((0, head_dim), dtype=_F32)
        self.ensure(length)

    def ensure(self, length: int) -> None:
        """Make the tables cover positions 1..length (only cacheless programs ever grow them)."""
        if length <= self.cos.shape[0]:
            return
        angles = np.arange(length, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = self.attention_factor * np.cos(angles), self.attention_factor * np.sin(angles)
        self.cos = np.concatenate([cos, cos], axis=1).astype(_F32)
        self.sin = np.concatenate([-sin, sin], axis=1).astype(_F32)


# -- the kernels: each builds one step over register slots ---------------------------------------------------


def embed(table: np.ndarray) -> Callable[..., Step]:
    def make(tokens: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = table[r[tokens] - 1]

        return step

    return make


def head_rms_norm(weight: np.ndarray, epsilon: float) -> Callable[..., Step]:
    """RMS norm of each head (the weight's length) of each row, as `rms_norm` computes a row's."""
    eps, head = _F32(epsilon), weight.shape[0]
    inv_n = _F32(1.0 / head)
    einsum, sqrt = np.einsum, np.sqrt

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x].reshape(r[x].shape[0], -1, head)
            mean_square = einsum("ijk,ijk->ij", v, v) * inv_n
            r[out] = ((v * (1 / sqrt(mean_square + eps))[:, :, None]) * weight).reshape(r[x].shape)

        return step

    return make


def rms_norm(weight: np.ndarray, epsilon: float) -> Callable[..., Step]:
    eps = _F32(epsilon)
    inv_n = _F32(1.0 / weight.shape[0])
    einsum, sqrt = np.einsum, np.sqrt

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x]
            mean_square = einsum("ij,ij->i", v, v) * inv_n
            r[out] = (v * (1 / sqrt(mean_square + eps))[:, None]) * weight

        return step

    return make


def linear(weight: np.ndarray) -> Callable[..., Step]:
    transposed = weight.T  # a view: x @ W^T is one BLAS call on the [out, in] array, no copy
    matmul = np.matmul

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = matmul(r[x], transposed)

        return step

    return make


def linear_dynamic(x: int, weight: int, out: int) -> Step:
    def step(r: Registers) -> None:
        r[out] = r[x] @ r[weight].T

    return step


def rope(table: RopeTable, head_dim: int, rotary: int | None = None) -> Callable[..., Step]:
    """Rotate each head's first `rotary` numbers (the whole head by default; `table` is over those), in halves of
    them, and pass the rest through (Phi-3's `apply_rotary_pos_emb`)."""
    rotary = head_dim if rotary is None else rotary
    half = rotary // 2
    concatenate = np.concatenate

    def make(x: int, positions: int, out: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x]
            rows = v.shape[0]
            heads = v.reshape(rows, -1, head_dim)
            index = r[positions] - 1
            cos = table.cos[index][:, None, :]
            sin = table.sin[index][:, None, :]
            turned = heads[..., :rotary]
            swapped = concatenate((turned[..., half:], turned[..., :half]), axis=-1)
            rotated = turned * cos + swapped * sin
            if rotary < head_dim:
                rotated = concatenate((rotated, heads[..., rotary:]), axis=-1)
            r[out] = rotated.reshape(rows, -1)

        return step

    return make


def cache_write(cache: np.ndarray) -> Callable[..., Step]:
    kv_heads, head_dim = cache.shape[-3], cache.shape[-1]
    if cache.ndim == 4:
        sequences = np.arange(cache.shape[0])

        def make4(x: int, positions: int) -> Step:
            def step(r: Registers) -> None:
                v = r[x]
                cache[sequences, :, r[positions] - 1, :] = v.reshape(v.shape[0], kv_heads, head_dim)

            return step

        return make4

    def make(x: int, positions: int) -> Step:
        def step(r: Registers) -> None:
            v = r[x]
            index = r[positions] - 1
            if v.shape[0] == 1:  # a decode step: basic indexing, no fancy-index machinery
                cache[:, index[0], :] = v.reshape(kv_heads, head_dim)
            else:
                cache[:, index, :] = v.reshape(v.shape[0], kv_heads, head_dim).transpose(1, 0, 2)

        return step

    return make


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _causal_bias(positions: np.ndarray, length: int, window: int | None = None) -> np.ndarray:
    """[rows, length]: 0 where a row at position p (from 1) may attend column c (c < p; within a sliding window of
    W positions also c >= p - W: the last W positions, its own included, as transformers' sliding-window mask),
    else -inf."""
    columns = np.arange(length)[None, :]
    allowed = columns < positions[:, None]
    if window is not None:
        allowed &= columns >= positions[:, None] - window
    return np.where(allowed, _F32(0), _F32(-np.inf)).astype(_F32)


def _queries_by_kv_head(q: np.ndarray, kv_heads: int, group: int, head_dim: int) -> np.ndarray:
    """[kv_heads, rows * group, head_dim]: query head h = kv * group + g reads KV head kv, so each KV head's queries
    of all rows are gathered together."""
    rows = q.shape[0]
    return q.reshape(rows, kv_heads, group, head_dim).transpose(1, 0, 2, 3).reshape(kv_heads, -1, head_dim)


def _rows_from_kv_heads(attended: np.ndarray, rows: int, kv_heads: int, group: int, head_dim: int) -> np.ndarray:
    """The inverse of `_queries_by_kv_head`: [rows, heads * head_dim], each row's heads side by side."""
    return attended.reshape(kv_heads, rows, group, head_dim).transpose(1, 0, 2, 3).reshape(rows, -1)


def attention(
    keys: np.ndarray,
    values: np.ndarray,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
) -> Callable[..., Step]:
    """Each row's query heads over the cached positions up to its own (within the last `window` when given), the
    scores scaled by `scale` (else 1 / sqrt(head_dim)) and soft-capped at `softcap` (tanh(s / cap) * cap, before
    the mask, as transformers' Gemma 2 computes them)."""
    if keys.ndim == 4:
        return _attention_per_sequence(keys, values, window, scale, softcap)
    kv_heads, head_dim = keys.shape[0], keys.shape[2]
    scale = _F32(1 / math.sqrt(head_dim) if scale is None else scale)
    cap = None if softcap is None else _F32(softcap)
    matmul = np.matmul

    def make(query: int, positions: int, out: int) -> Step:
        def step(r: Registers) -> None:
            q = r[query]
            pos = r[positions]
            rows = q.shape[0]
            group = q.shape[1] // (kv_heads * head_dim)
            length = int(pos.max())
            k = keys[:, :length]
            v = values[:, :length]
            qh = _queries_by_kv_head(q, kv_heads, group, head_dim)
            scores = matmul(qh, k.transpose(0, 2, 1))
            scores *= scale
            if cap is not None:
                scores = np.tanh(scores / cap) * cap
            if rows > 1 or (window is not None and length > window):  # else a decode row attends every position
                scores.reshape(kv_heads, rows, group, length)[...] += _causal_bias(pos, length, window)[
                    None, :, None, :
                ]
            r[out] = _rows_from_kv_heads(matmul(_softmax_rows(scores), v), rows, kv_heads, group, head_dim)

        return step

    return make


def _attention_per_sequence(
    keys: np.ndarray, values: np.ndarray, window: int | None, scale: float | None, softcap: float | None
) -> Callable[..., Step]:
    kv_heads, head_dim = keys.shape[1], keys.shape[3]
    scale = _F32(1 / math.sqrt(head_dim) if scale is None else scale)
    cap = None if softcap is None else _F32(softcap)
    matmul = np.matmul

    def make(query: int, positions: int, out: int) -> Step:
        def step(r: Registers) -> None:
            q = r[query]
            pos = r[positions]
            rows = q.shape[0]
            length = int(pos.max())
            qh = q.reshape(rows, kv_heads, -1, head_dim)
            scores = matmul(qh, keys[:, :, :length].transpose(0, 1, 3, 2))
            scores *= scale
            if cap is not None:
                scores = np.tanh(scores / cap) * cap
            scores += _causal_bias(pos, length, window)[:, None, None, :]
            r[out] = matmul(_softmax_rows(scores), values[:, :, :length]).reshape(rows, -1)

        return step

    return make


def self_attention(head_dim: int) -> Callable[..., Step]:
    scale = _F32(1 / math.sqrt(head_dim))
    matmul = np.matmul

    def make(query: int, key: int, value: int, out: int) -> Step:
        def step(r: Registers) -> None:
            q, k, v = r[query], r[key], r[value]
            rows = q.shape[0]
            kv_heads = k.shape[1] // head_dim
            group = q.shape[1] // k.shape[1]
            qh = _queries_by_kv_head(q, kv_heads, group, head_dim)
            kh = k.reshape(rows, kv_heads, head_dim).transpose(1, 2, 0)
            vh = v.reshape(rows, kv_heads, head_dim).transpose(1, 0, 2)
            scores = matmul(qh, kh)
            scores *= scale
            bias = _causal_bias(np.arange(1, rows + 1), rows)
            scores.reshape(kv_heads, rows, group, rows)[...] += bias[None, :, None, :]
            r[out] = _rows_from_kv_heads(matmul(_softmax_rows(scores), vh), rows, kv_heads, group, head_dim)

        return step

    return make


def binary(ufunc: np.ufunc) -> Callable[..., Step]:
    def make(lhs: int, rhs: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = ufunc(r[lhs], r[rhs])

        return step

    return make


def silu(x: int, out: int) -> Step:
    tanh = np.tanh

    def step(r: Registers) -> None:
        v = r[x]
        # sigmoid(v) = (1 + tanh(v/2)) / 2 never overflows, unlike 1 / (1 + exp(-v)) for v below about -88.
        r[out] = v * (tanh(v * _F32(0.5)) * _F32(0.5) + _F32(0.5))

    return step


def experts(
    gate: np.ndarray, up: np.ndarray, down: np.ndarray, top_k: int, renormalize: bool, first: int = 0
) -> Callable[..., Step]:
    """A mixture of experts as transformers' Mixtral and Qwen3-MoE compute it: each row's router logits to
    probabilities by a softmax over every expert (f32), the `top_k` most probable chosen (the lowest index first
    on a tie, as `torch.topk`), divided by their sum where `renormalize`; then, expert by expert in ascending
    index (transformers' loop over the experts hit), each chosen expert's SwiGLU MLP of its rows, times its
    weight, added into the result. The stacked weights may be one chip's share of the experts, experts
    [first, first + len(gate)) (expert parallelism): the rows are routed among all the logits' experts, and the
    result sums only the chosen experts held here, a partial sum."""
    gates, ups, downs = (np.ascontiguousarray(np.swapaxes(w, 1, 2)) for w in (gate, up, down))  # [in, out] each
    tanh = np.tanh

    def make(x: int, logits: int, out: int) -> Step:
        def step(r: Registers) -> None:
            v, scores = r[x], r[logits].astype(_F32)
            exp = np.exp(scores - scores.max(axis=1, keepdims=True))
            probs = exp / exp.sum(axis=1, keepdims=True)
            chosen = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
            weights = np.take_along_axis(probs, chosen, axis=1)
            if renormalize:
                weights = weights / weights.sum(axis=1, keepdims=True)
            result = np.zeros_like(v)
            for expert in np.unique(chosen):
                held = expert - first
                if not 0 <= held < len(gates):
                    continue  # another chip's expert
                rows, slots = np.nonzero(chosen == expert)
                g, u = v[rows] @ gates[held], v[rows] @ ups[held]
                activated = g * (tanh(g * _F32(0.5)) * _F32(0.5) + _F32(0.5))  # SiLU, as `silu` computes it
                result[rows] += (activated * u) @ downs[held] * weights[rows, slots][:, None]
            r[out] = result

        return step

    return make


def gelu_tanh(x: int, out: int) -> Step:
    """GELU with the tanh approximation, as PyTorch's `gelu(approximate="tanh")` writes it, in f32."""
    tanh, c, k, half = np.tanh, _F32(math.sqrt(2 / math.pi)), _F32(0.044715), _F32(0.5)

    def step(r: Registers) -> None:
        v = r[x]
        r[out] = half * v * (_F32(1) + tanh(c * (v + k * v * v * v)))

    return step


def softcap(cap: float) -> Callable[..., Step]:
    c = _F32(cap)

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = np.tanh(r[x] / c) * c

        return step

    return make


def scale(factor: float) -> Callable[..., Step]:
    f = _F32(factor)

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = r[x] * f

        return step

    return make


def row(index: int) -> Callable[..., Step]:
    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            r[out] = r[x][index - 1 : index]

        return step

    return make


def argmax(x: int, out: int) -> Step:
    argmax = np.argmax

    def step(r: Registers) -> None:
        r[out] = argmax(r[x], axis=-1) + 1  # numpy takes the first maximum on ties, as logos.argmax does

    return step


def share(axis: int, chip: int, chips: int) -> Callable[[int, int], Step]:
    """This chip's contiguous part of a whole value along `axis`, `shard.all_slice`'s (a copy, so later steps may
    write their slots freely)."""

    def make(x: int, out: int) -> Step:
        def step(r: Registers) -> None:
            whole = r[x]
            size = whole.shape[axis] // chips
            index = [slice(None)] * whole.ndim
            index[axis] = slice(chip * size, (chip + 1) * size)
            r[out] = np.ascontiguousarray(whole[tuple(index)])

        return step

    return make


def copy(x: int, out: int) -> Step:
    def step(r: Registers) -> None:
        r[out] = r[x]

    return step
