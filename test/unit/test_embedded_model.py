"""The embedded SmolLM2-135M-Instruct: greedy generation through the LOGOS programs agrees, token for token,
with a plain numpy Llama written here, independently of logos-ir's math; `logos-run` answers the default
question.

The numpy Llama below is the textbook form of the Hugging Face implementation: it shares nothing with the
interpreter but the dequantized weight arrays (each head attends separately over its repeated KV head, the
rotation is built from cos/sin of the angles, one token at a time through a growing cache).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from logos_ir.generate import Generator
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import WeightStore, open_model

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
NEW_TOKENS = 32
CTX = 64


def _openblas() -> ctypes.CDLL | None:
    """numpy's OpenBLAS, when it is the loaded BLAS (Linux: found through /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line and line.rstrip().endswith(".so")}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


# The thread-count functions of OpenBLAS builds: numpy's own (scipy-openblas, 64-bit ints), then plain ones.
_THREAD_FUNCTIONS = [
    (f"{prefix}get_num_threads{suffix}", f"{prefix}set_num_threads{suffix}")
    for prefix, suffix in (("scipy_openblas_", "64_"), ("openblas_", "64_"), ("openblas_", ""))
]


def _blas_threads(library: ctypes.CDLL, count: int | None = None) -> int | None:
    """OpenBLAS's thread count before setting it to `count` (when given); None if the library has no such call."""
    for get_name, set_name in _THREAD_FUNCTIONS:
        getter, setter = getattr(library, get_name, None), getattr(library, set_name, None)
        if getter is not None and setter is not None:
            previous = int(getter())
            if count is not None:
                setter(count)
            return previous
    return None


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread() -> Iterator[None]:
    """Decoding is matrix-vector products, bound by memory, not by cores; OpenBLAS's threads spin-wait for
    each other and, on a busy 2-core CI machine, make each step several times slower. One thread here."""
    library = _openblas()
    previous = _blas_threads(library, 1) if library is not None else None
    yield
    if library is not None and previous is not None:
        _blas_threads(library, previous)


@pytest.fixture(scope="module")
def store() -> WeightStore:
    return open_model(None)


@pytest.fixture(scope="module")
def tokenizer(store: WeightStore) -> Tokenizer:
    found = Tokenizer.from_store(store)
    assert found is not None
    return found


class NumpyLlama:
    """A Llama decoder in plain numpy (float32), one token per call, with a key/value list per layer."""

    def __init__(self, store: WeightStore):
        self.spec = store.spec
        self.w = store.get
        self.keys: list[list[np.ndarray]] = [[] for _ in range(self.spec.layers)]
        self.values: list[list[np.ndarray]] = [[] for _ in range(self.spec.layers)]
        d = self.spec.head_dim
        self.inv_freq = 1.0 / (self.spec.rope_theta ** (np.arange(0, d, 2) / d))

    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return self.w(name) * (x / np.sqrt(np.mean(x**2) + np.float32(self.spec.rms_eps)))

    def rotate(self, x: np.ndarray, position: int) -> np.ndarray:
        """x: [heads, head_dim] at position (from 0): HF's x*cos + rotate_half(x)*sin."""
        angle = position * self.inv_freq
        cos = np.concatenate([np.cos(angle), np.cos(angle)]).astype(np.float32)
        sin = np.concatenate([np.sin(angle), np.sin(angle)]).astype(np.float32)
        half = x.shape[-1] // 2
        rotated_half = np.concatenate([-x[:, half:], x[:, :half]], axis=1)
        return x * cos + rotated_half * sin

    def attend(self, layer: int, x: np.ndarray, position: int) -> np.ndarray:
        s, p = self.spec, f"model.layers.{layer}.self_attn."
        q = (self.w(p + "q_proj.weight") @ x).reshape(s.heads, s.head_dim)
        k = (self.w(p + "k_proj.weight") @ x).reshape(s.kv_heads, s.head_dim)
        v = (self.w(p + "v_proj.weight") @ x).reshape(s.kv_heads, s.head_dim)
        self.keys[layer].append(self.rotate(k, position))
        self.values[layer].append(v)
        keys, values = np.stack(self.keys[layer], axis=1), np.stack(self.values[layer], axis=1)  # [kv, t, d]
        repeat = s.heads // s.kv_heads
        keys, values = np.repeat(keys, repeat, axis=0), np.repeat(values, repeat, axis=0)  # [heads, t, d]
        q = self.rotate(q, position)
        out = np.empty_like(q)
        for head in range(s.heads):
            scores = keys[head] @ q[head] / np.float32(np.sqrt(s.head_dim))
            weights = np.exp(scores - scores.max())
            out[head] = (weights / weights.sum()) @ values[head]
        return self.w(p + "o_proj.weight") @ out.reshape(-1)

    def mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        p = f"model.layers.{layer}.mlp."
        gate, up = self.w(p + "gate_proj.weight") @ x, self.w(p + "up_proj.weight") @ x
        return self.w(p + "down_proj.weight") @ (gate / (1 + np.exp(-gate)) * up)

    def step(self, token: int, position: int) -> int:
        """Feed `token` (from 0) at `position` (from 0); the greedy next token (from 0)."""
        x = self.w("model.embed_tokens.weight")[token]
        for layer in range(self.spec.layers):
            p = f"model.layers.{layer}."
            x = x + self.attend(layer, self.norm(x, p + "input_layernorm.weight"), position)
            x = x + self.mlp(layer, self.norm(x, p + "post_attention_layernorm.weight"))
        head = "model.embed_tokens.weight" if self.spec.tie_embeddings else "lm_head.weight"
        return int(np.argmax(self.w(head) @ self.norm(x, "model.norm.weight")))

    def generate(self, prompt: list[int], new_tokens: int) -> list[int]:
        for position, token in enumerate(prompt):
            following = self.step(token, position)
        out = [following]
        while len(out) < new_tokens:
            out.append(self.step(out[-1], len(prompt) + len(out) - 1))
        return out


def test_generation_agrees_with_a_plain_numpy_llama(store: WeightStore, tokenizer: Tokenizer) -> None:
    # Short chunks, so that each prompt spans several and ends in a shorter one.
    generator = Generator(store, ctx=CTX, prefill_rows=4)
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        assert len(prompt) + NEW_TOKENS <= CTX
        ours = generator.generate(prompt, NEW_TOKENS)
        theirs = NumpyLlama(store).generate(prompt, NEW_TOKENS)
        assert ours == theirs, f"{text!r}: {tokenizer.decode(ours)!r} != {tokenizer.decode(theirs)!r}"


def test_logos_run_answers_the_default_question() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logos_ir.tools.logos_run", "--json", "--max-new-tokens", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("prompt_ids", "new_ids", "text", "tokens_per_s", "programs"):
        assert key in report
    assert 1 <= len(report["new_ids"]) <= 8 and report["tokens_per_s"] > 0
    assert "Paris" in report["text"]  # SmolLM2 answers "The capital of France is Paris."
    assert all(line.startswith("LOGOS program: ") for line in report["programs"])
    assert any("decode step, ctx 64" in line for line in report["programs"])
