"""A plain numpy Llama decoder, the baseline the reference interpreter is measured against.

The same math as the LOGOS decode step (RMS norm, linear projections in Hugging Face layout, rotate-half RoPE,
grouped-query attention over a preallocated KV cache, SwiGLU, greedy argmax), written directly for one token at
a time with no interpreter: weights come from the same store, nothing else is shared with logos-ir. Positions and
token ids count from 0 here, as Hugging Face's do.
"""

from __future__ import annotations

import math

import numpy as np

from logos_ir.spec import ModelSpec


class NumpyLlama:
    """Greedy decoding of a Llama model whose weights `get(name)` returns as float32 arrays in HF layout."""

    def __init__(self, spec: ModelSpec, get, ctx: int):
        self.spec, self.ctx = spec, ctx
        self.embed = get("model.embed_tokens.weight")
        self.head = self.embed if spec.tie_embeddings else get("lm_head.weight")
        self.final_norm = get("model.norm.weight")
        self.layers = [self._layer(get, i) for i in range(spec.layers)]
        shape = (spec.kv_heads, ctx, spec.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(spec.layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(spec.layers)]
        self.cos, self.sin = self._rope_tables(ctx)
        self.eps = np.float32(spec.rms_eps)
        self.scale = np.float32(1 / math.sqrt(spec.head_dim))

    @staticmethod
    def _layer(get, i: int) -> dict[str, np.ndarray]:
        p = f"model.layers.{i}."
        names = {
            "attention_norm": "input_layernorm", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
            "v": "self_attn.v_proj", "o": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
            "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
        }  # fmt: skip
        return {role: get(p + name + ".weight") for role, name in names.items()}

    def _rope_tables(self, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        d = self.spec.head_dim
        inv_freq = 1.0 / self.spec.rope_theta ** (np.arange(0, d, 2) / d)
        if self.spec.rope_scaling is not None:
            raise NotImplementedError("the baseline covers models without RoPE scaling")
        angles = np.arange(ctx)[:, None] * inv_freq[None, :]
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.dot(x, x) / x.shape[0] + self.eps) * weight

    def _rope(self, x: np.ndarray, position: int) -> np.ndarray:
        heads = x.reshape(-1, self.spec.head_dim)
        half = self.spec.head_dim // 2
        a, b = heads[:, :half], heads[:, half:]
        cos, sin = self.cos[position], self.sin[position]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=1)

    def _attention(self, i: int, layer: dict[str, np.ndarray], x: np.ndarray, position: int) -> np.ndarray:
        s = self.spec
        q = self._rope(layer["q"] @ x, position)
        self.keys[i][:, position] = self._rope(layer["k"] @ x, position)
        self.values[i][:, position] = (layer["v"] @ x).reshape(s.kv_heads, s.head_dim)
        keys, values = self.keys[i][:, : position + 1], self.values[i][:, : position + 1]
        q = q.reshape(s.kv_heads, s.heads // s.kv_heads, s.head_dim)  # query heads grouped by their KV head
        scores = q @ keys.transpose(0, 2, 1) * self.scale
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        return layer["o"] @ (scores @ values).reshape(-1)

    def step(self, token: int, position: int) -> int:
        """Feed `token` at `position` (both from 0); the greedy next token (from 0)."""
        x = self.embed[token]
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, self._norm(x, layer["attention_norm"]), position)
            h = self._norm(x, layer["mlp_norm"])
            gate = layer["gate"] @ h
            x = x + layer["down"] @ (gate / (1 + np.exp(-gate)) * (layer["up"] @ h))
        return int(np.argmax(self.head @ self._norm(x, self.final_norm)))
