"""The weight store interface and the stores that need no file: a model's tensors by Hugging Face name, as
read-only float32 arrays, each converted once and cached; deterministic random weights for a spec; arrays given in
memory. The checks every reader shares (the tensors a spec needs, bounds on what a file may claim) live here too.
"""

from __future__ import annotations

import math
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any

import numpy as np

from logos_ir import quant
from logos_ir.errors import WeightError
from logos_ir.spec import ModelSpec

# No real tensor has a dimension near this (2**40 elements); a larger one is a file's word alone, refused before
# anything is computed, printed or allocated from it (a zero-sized tensor's other dimensions included).
MAX_DIMENSION = 2**40


# -- the tensors of a model ----------------------------------------------------------------------------------


def expected_weights(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name of a Llama model of `spec`, with its shape, in model order."""
    return dict(spec.weights())


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_expected(
    spec: ModelSpec,
    shapes: Mapping[str, tuple[int, ...]],
    where: str,
    file_of: Mapping[str, str] | None = None,
) -> None:
    """Refuse, by name, the first tensor the spec needs that is missing or has another shape."""
    for name, want in spec.weights():
        got = shapes.get(name)
        place = file_of.get(name, where) if file_of else where
        if got is None:
            raise WeightError(
                f"{place}: tensor '{name}' is missing", hint="the model's spec needs every layer's weights"
            )
        if got != want:
            raise WeightError(
                f"{place}: tensor '{name}' has shape {shape_text(got)}, but the model's spec says {shape_text(want)}"
            )


# Tensors a file may hold that no model reads: older Llama checkpoints store each layer's rotary inverse
# frequencies, a buffer recomputed from the config (Hugging Face ignores it on load too).
_NOT_WEIGHTS = re.compile(r"model\.layers\.(0|[1-9][0-9]*)\.self_attn\.rotary_emb\.inv_freq")


def check_unread(spec: ModelSpec, names: Iterable[str], where: str, file_of: Mapping[str, str] | None = None) -> None:
    """Refuse, by name, the first tensor of a file that the spec's program does not read: a bias, a layer the
    config does not have, a second head beside a tied one. Computing without it would be silently wrong."""
    wanted = dict(spec.weights())
    for name in sorted(names):
        if name in wanted or _NOT_WEIGHTS.fullmatch(name):
            continue
        place = file_of.get(name, where) if file_of else where
        hint = "logos-ir refuses a model it would compute without one of its tensors"
        if name == "lm_head.weight" and spec.tie_embeddings:
            hint = "the config ties the head to the embedding (tie_word_embeddings), yet the file holds its own head"
        raise WeightError(f"{place}: tensor '{name}' is not read by the model's program", hint=hint)


def is_int(value: Any) -> bool:
    """Whether a value read from a file is an integer (a JSON `true` is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


# The element types a mapped tensor may be read in place from (safetensors' names).
_MAPPED_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


def _finite(values: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Whether every element is finite (bf16 bit patterns as uint16: exponent not all ones), checked a chunk at a
    time so the check's temporaries stay small beside the values."""
    flat = values.reshape(-1)
    for start in range(0, flat.size, chunk):
        part = flat[start : start + chunk]
        if part.dtype == np.uint16:
            if ((part & np.uint16(0x7F80)) == np.uint16(0x7F80)).any():
                return False
        elif not np.isfinite(part).all():
            return False
    return True


# -- the store interface -------------------------------------------------------------------------------------


class WeightStore(ABC):
    """A model's tensors by Hugging Face name: float32, HF layout, read-only, each converted once and then
    cached. A store implements `names`, `shape` and `_load`; `get` does the caching."""

    spec: ModelSpec
    source: str
    trained_ctx: int | None = None  # the longest context the model was trained on, where its file says

    def __init__(self, spec: ModelSpec, source: str):
        self.spec = spec
        self.source = source
        self._cache: dict[str, np.ndarray] = {}

    @abstractmethod
    def names(self) -> list[str]:
        """The tensor names the store holds, sorted."""

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, without reading it; WeightError if the store does not hold it."""

    @abstractmethod
    def _load(self, name: str) -> np.ndarray:
        """The tensor as a fresh float32 array (not yet cached); WeightError if the store does not hold it."""

    def get(self, name: str) -> np.ndarray:
        """The tensor `name` as a read-only float32 array in Hugging Face layout; later calls return the same
        array."""
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        array = np.ascontiguousarray(self._load(name), dtype=np.float32)
        if not np.isfinite(array).all():  # a corrupt file, or a scale byte flipped in a quantized block
            raise WeightError(f"{self.source}: tensor '{name}' holds NaN or infinite values")
        array.setflags(write=False)
        self._cache[name] = array
        return array

    def blocks(self, name: str) -> np.ndarray:
        """The tensor's bytes as its file stores them, for a tensor the spec stores in a block format
        (`spec.stored_as`): a read-only uint8 array of shape `(*shape[:-1], row_bytes)`, one row of bytes a row of
        the tensor in Hugging Face row order (a GGUF's permuted Q and K rows put back, a part of a fused tensor
        its own rows), so rows and whole blocks may be cut from it as from the values. A lane that reads the
        weights as stored reads them here; `get` is their dequantized values. WeightError for a tensor the
        store does not hold in blocks."""
        fmt = self.spec.stored_as(name)
        if fmt is None or quant.FORMATS[fmt].family == "float":
            raise WeightError(f"{self.source}: tensor '{name}' is not stored in blocks")
        raw = np.ascontiguousarray(self._blocks(name), dtype=np.uint8)
        shape = self.shape(name)
        expected = (*shape[:-1], quant.FORMATS[fmt].stored_bytes((shape[-1],)))
        if raw.shape != expected:
            raise WeightError(f"{self.source}: tensor '{name}' holds {raw.shape} bytes, not {expected}")
        raw.setflags(write=False)
        return raw

    def _blocks(self, name: str) -> np.ndarray:
        """The tensor's stored bytes, rows of blocks (stores holding block formats override this)."""
        raise WeightError(f"{self.source}: tensor '{name}' is not stored in blocks")

    def part(self, name: str, axis: int, start: int, stop: int, element: str = "f32") -> np.ndarray:
        """Elements `start:stop` of the tensor along `axis` (a chip's share), as a fresh contiguous array, without
        caching the tensor: float32 values (`element` "f32") or bfloat16 bit patterns (uint16, "bf16": a bf16 file's
        own bits, wider types rounded to nearest even). Where the store reads its file through a memory map
        (`_mapped`), only the share's bytes are touched and converted; otherwise one tensor is made in float32 for
        the cut and dropped (a tensor `get` already cached is cut from the cache). NaN or infinite values are
        refused as `get` refuses them."""
        from logos_ir.numerics import bf16_bits

        if element not in ("f32", "bf16"):
            raise WeightError(f"a share is read as f32 or bf16, not {element}")
        cached = self._cache.get(name)
        stored = self._mapped(name) if cached is None else None
        source = cached if cached is not None else stored if stored is not None else self._load(name)
        if not 0 <= axis < source.ndim or not 0 <= start <= stop <= source.shape[axis]:
            raise WeightError(f"{self.source}: tensor '{name}' has no part {start}:{stop} on axis {axis}")
        index = [slice(None)] * source.ndim
        index[axis] = slice(start, stop)
        cut = source[tuple(index)]
        if cut.dtype == np.uint16:  # bf16 bit patterns, as the file holds them
            bits = np.array(cut, dtype=np.uint16)
            if not _finite(bits):
                raise WeightError(f"{self.source}: tensor '{name}' holds NaN or infinite values")
            if element == "bf16":
                return bits
            return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        values = np.array(cut, dtype=np.float32)
        if not _finite(values):
            raise WeightError(f"{self.source}: tensor '{name}' holds NaN or infinite values")
        return bf16_bits(values) if element == "bf16" else values

    def _mapped(self, name: str) -> np.ndarray | None:
        """The tensor as its file stores it (bf16 as uint16 bit patterns, f16, f32, f64), a read-only view of a
        memory map, or None where the store has no such view (random weights, arrays, GGUF's quantized blocks).
        A store whose `_entries` give each tensor's file, dtype, shape and byte range and whose `_map(file)` maps
        a file (the safetensors store) is served here."""
        entries, mapper = getattr(self, "_entries", None), getattr(self, "_map", None)
        entry = entries.get(name) if isinstance(entries, dict) else None
        kind = _MAPPED_DTYPES.get(getattr(entry, "dtype", None))
        if entry is None or kind is None or mapper is None:
            return None
        count = int(np.prod(entry.shape)) if entry.shape else 1
        if entry.stop - entry.start != count * np.dtype(kind).itemsize:
            return None
        if count == 0:
            return np.zeros(entry.shape, kind)
        buffer = mapper(entry.file)
        if len(buffer) < entry.stop:
            raise WeightError(f"{entry.file}: tensor '{name}': the file shrank after it was opened")
        return np.frombuffer(buffer, dtype=kind, count=count, offset=entry.start).reshape(entry.shape)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.shape(name)
        except WeightError:
            return False
        return True

    def close(self) -> None:  # noqa: B027 - stores without files have nothing to release
        """Release open files; cached arrays stay valid."""

    def __enter__(self) -> WeightStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _missing(self, name: str) -> WeightError:
        return WeightError(f"{self.source}: tensor '{name}' is not in this model")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r})"


# -- random weights ------------------------------------------------------------------------------------------


class RandomWeights(WeightStore):
    """Deterministic random weights for a spec: the same (spec, seed, name) always gives the same tensor.

    Each tensor has its own generator, seeded from the store's seed and a CRC of its name (Python's `hash` of
    a string changes between processes), so tensors can be made lazily and in any order. Norm weights are near
    1 and matrices are scaled by 1/sqrt(in_features), so activations stay of order 1 through any number of
    layers."""

    def __init__(self, spec: ModelSpec, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise WeightError(f"a random-weights seed must be a non-negative integer, not {seed!r}")
        super().__init__(spec, f"random weights (seed {seed})")
        self.seed = seed
        self._shapes = expected_weights(spec)

    def names(self) -> list[str]:
        return sorted(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._shapes:
            raise self._missing(name)
        return self._shapes[name]

    def _load(self, name: str) -> np.ndarray:
        shape = self.shape(name)
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode("utf-8"))])
        values = rng.standard_normal(shape, dtype=np.float32)
        if len(shape) == 1:
            return np.float32(1.0) + np.float32(0.1) * values
        return values / np.float32(math.sqrt(shape[-1]))  # the inputs' width (a stack of experts: each one's)


class QuantizedWeights(WeightStore):
    """Another store's weights stored in a block format (or Q4_K_M's mix) by the project's own quantizer
    (`logos_ir.quant`): each matrix `quant.storage_plan` names quantized and read back dequantized, each vector
    (norms, biases) left f32 as llama.cpp leaves them. The spec says each stored tensor's format, so the program
    the author writes says it too."""

    def __init__(self, inner: WeightStore, format_name: str):
        shapes = {name: inner.shape(name) for name in inner.names()}
        spec = inner.spec
        plan = quant.storage_plan(format_name, shapes, spec.layers, spec.experts, spec.tie_embeddings)
        self.inner, self._formats = inner, {n: quant.FORMATS[f] for n, f in plan.items()}
        spec = replace(inner.spec, storage=tuple(sorted(plan.items())))
        super().__init__(spec, f"{inner.source}, stored in {format_name}")
        self._stored = frozenset(plan)
        self._stored_blocks: dict[str, np.ndarray] = {}

    def names(self) -> list[str]:
        return self.inner.names()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.inner.shape(name)

    def _load(self, name: str) -> np.ndarray:
        values = self.inner.get(name)
        if name not in self._stored:
            return values
        return quant.dequantize(self.blocks(name), self._formats[name], values.shape)

    def _blocks(self, name: str) -> np.ndarray:
        if name not in self._stored:
            return super()._blocks(name)
        cached = self._stored_blocks.get(name)
        if cached is None:
            cached = self._stored_blocks[name] = quant.quantize(self.inner.get(name), self._formats[name])
        return cached


class ArrayStore(WeightStore):
    """Tensors given as arrays (for tests and for weights computed in memory), checked against the spec."""

    def __init__(self, spec: ModelSpec, arrays: Mapping[str, np.ndarray], source: str = "arrays in memory"):
        super().__init__(spec, source)
        self._arrays = dict(arrays)
        check_expected(spec, {n: tuple(np.shape(a)) for n, a in self._arrays.items()}, source)
        check_unread(spec, self._arrays, source)

    def names(self) -> list[str]:
        return sorted(self._arrays)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._arrays:
            raise self._missing(name)
        return tuple(np.shape(self._arrays[name]))

    def _load(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            raise self._missing(name)
        return np.array(self._arrays[name], dtype=np.float32)  # a copy: the caller may still change theirs
