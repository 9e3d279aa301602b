"""Hugging Face model folders: `config.json` and safetensors files (one, or shards listed by an index), written
for tests and read as untrusted input. A header is checked against the real file size before anything is read or
allocated, every tensor's extent is checked to lie inside its file and apart from the others, shard names must stay
inside the model folder, and every tensor the spec needs must be present with its shape, checked at open time from
the headers alone. Tensor data is memory-mapped and converted to float32 on first `get`.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, BinaryIO

import numpy as np

from logos_ir.errors import SpecError, WeightError
from logos_ir.spec import ModelSpec, read_config
from logos_ir.weights.hub import link_root
from logos_ir.weights.manifest import checkpoint_tensors, expert_part, fused_parts
from logos_ir.weights.store import MAX_DIMENSION, WeightStore, check_expected, check_unread, is_int, shape_text

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAVE_DTYPES = ("float32", "float16", "bfloat16")

# A safetensors header or index is JSON text describing the tensors; real ones are well under a megabyte.
_MAX_HEADER_BYTES = 100_000_000
_MAX_RANK = 8


# -- writing safetensors -------------------------------------------------------------------------------------


def hf_config(spec: ModelSpec, dtype: str = "float32") -> dict[str, Any]:
    """A `config.json` for `spec` (rope settings at the top level), as `ModelSpec.from_hf_config` reads it back to
    the same spec: a Llama's, or the family's whose features the spec has (Gemma 2's, Qwen3's head norms, Qwen2's
    Q, K and V biases); a spec no family's config says is refused."""
    scaling = None
    if spec.rope_scaling is not None:
        scaling = spec.rope_scaling.to_dict()
    config: dict[str, Any] = {
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
    if scaling is not None and spec.rope_scaling.rope_type in ("yarn", "longrope"):  # type: ignore[union-attr]
        original = scaling["original_max_position_embeddings"]  # the factor is the longest context over it
        longest = scaling["factor"] * original
        if longest != int(longest):
            raise SpecError(f"a {scaling['rope_type']} factor of {scaling['factor']!r} is no context over {original}")
        config["max_position_embeddings"] = int(longest)
        if scaling["rope_type"] == "longrope":  # Phi-3's original context is at the config's top level
            config["original_max_position_embeddings"] = scaling.pop("original_max_position_embeddings")
    family = _family(spec)
    config["model_type"], config["architectures"] = family, [_ARCHITECTURES[family]]
    if spec.sliding_window is not None:
        config["sliding_window"] = spec.sliding_window
        if family in ("qwen2", "qwen3"):  # a Qwen's window is used only where it says so, from max_window_layers on
            config["use_sliding_window"], config["max_window_layers"] = True, 0
        if spec.full_layers:
            kinds = ["full_attention" if i in spec.full_layers else "sliding_attention" for i in range(spec.layers)]
            config["layer_types"] = kinds
    if family == "llama":
        attention, mlp = ("query", "key", "value", "output"), ("gate", "up", "down")
        config["attention_bias"] = all(p in spec.biases for p in attention)
        config["mlp_bias"] = all(p in spec.biases for p in mlp)
    if spec.local_rope_theta is not None:
        config["rope_local_base_freq"] = spec.local_rope_theta
    if family == "mixtral":
        config["num_local_experts"], config["num_experts_per_tok"] = spec.experts, spec.experts_per_token
    if family == "qwen3_moe":
        config["num_experts"], config["num_experts_per_tok"] = spec.experts, spec.experts_per_token
        config["moe_intermediate_size"], config["norm_topk_prob"] = config.pop("intermediate_size"), spec.renormalize
    if family == "olmoe":  # its intermediate_size each expert's; no head_dim key (its query is hidden_size wide)
        config["num_experts"], config["num_experts_per_tok"] = spec.experts, spec.experts_per_token
        config["norm_topk_prob"] = spec.renormalize
        del config["head_dim"]
    if family in ("gemma2", "gemma3_text"):
        del config["hidden_act"]
        config["hidden_activation"] = "gelu_pytorch_tanh"
        config["query_pre_attn_scalar"] = spec.query_pre_attn_scalar
        config["attn_logit_softcapping"] = spec.attention_softcap
        config["final_logit_softcapping"] = spec.final_softcap
    back = ModelSpec.from_hf_config(config)
    if back != spec:
        raise WeightError(f"no family's config.json says this model's spec (a {family} config reads as {back})")
    return config


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
}


def _family(spec: ModelSpec) -> str:
    """The model_type whose config says `spec`'s features."""
    if spec.projection_norms:
        return "olmoe"
    if spec.experts is not None:  # Mixtral's routing always renormalizes; Qwen3-MoE's says whether
        return "qwen3_moe" if spec.head_norms or not spec.renormalize else "mixtral"
    if spec.norm_plus_one:
        return "gemma3_text" if spec.head_norms else "gemma2"
    if spec.head_norms:
        return "qwen3"
    return "qwen2" if spec.biases == ("query", "key", "value") else "llama"


def save_model(store: WeightStore, directory: str | Path, shards: int = 1, dtype: str = "float32") -> None:
    """Write `store` as a Hugging Face model folder: `config.json` and `model.safetensors`, or, with `shards`
    > 1, `model-0000i-of-0000n.safetensors` files and `model.safetensors.index.json`. dtype: float32, float16,
    bfloat16."""
    if dtype not in SAVE_DTYPES:
        raise WeightError(f"cannot save weights as '{dtype}'", hint=f"use one of {', '.join(SAVE_DTYPES)}")
    family, experts = _family(store.spec), store.spec.experts or 0
    names = [(file, name, index) for name in store.names() for file, index in checkpoint_tensors(family, name, experts)]
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
        for i, group in enumerate(np.array_split(np.arange(len(names)), shards)):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            total += _write_safetensors(directory / file, store, [names[j] for j in group], dtype)
            weight_map.update({names[j][0]: file for j in group})
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


def _write_safetensors(path: Path, store: WeightStore, names: list[tuple[str, str, int | None]], dtype: str) -> int:
    """Write one safetensors file of the tensors `names` (each the file's name, the store's, and the expert of the
    store's stacked tensor it is, or None for the whole); returns the bytes of tensor data it holds."""
    code = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[dtype]
    itemsize = 4 if dtype == "float32" else 2
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for file_name, name, index in names:
        shape = store.shape(name)[1:] if index is not None else store.shape(name)
        size = math.prod(shape) * itemsize
        header[file_name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the format pads the header so the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, name, index in names:
            array = store.get(name)
            f.write(_encode(array if index is None else array[index], dtype).tobytes())
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


@dataclass(frozen=True)
class _Stack:
    """A program tensor the file stores one expert at a time (`logos_ir.weights.manifest.EXPERTS`): its experts'
    entries in expert order, read and stacked along a new first axis; each already checked for shape and dtype."""

    parts: tuple[_Entry, ...]
    shape: tuple[int, ...]

    @property
    def file(self) -> Path:
        return self.parts[0].file

    @property
    def dtype(self) -> str:
        return self.parts[0].dtype


class SafetensorsStore(WeightStore):
    """A Hugging Face model folder: `config.json` plus `model.safetensors`, or shards listed by
    `model.safetensors.index.json`. All headers are validated and checked against the spec on construction;
    tensor data is memory-mapped and converted to float32 on first `get`."""

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        if not directory.is_dir():
            raise WeightError(f"{directory}: no such folder")
        config, where = read_config(directory)  # read once: the spec, the family's manifest, the trained context
        spec = ModelSpec.from_hf_config(config, where)
        super().__init__(spec, str(directory))
        self.directory = directory
        model_type = str(config.get("model_type"))
        entries = _unfused(_safetensors_entries(directory), model_type, spec)
        self._entries: dict[str, _Entry | _Stack] = _stacked(entries, model_type, spec)
        check_expected(
            spec,
            {n: e.shape for n, e in self._entries.items()},
            str(directory),
            {n: str(e.file) for n, e in self._entries.items()},
        )
        check_unread(spec, self._entries, str(directory), {n: str(e.file) for n, e in self._entries.items()})
        for name, _ in spec.weights():
            self._check_dtype(name, self._entries[name])
        self._maps: dict[Path, mmap.mmap] = {}
        trained = config.get("max_position_embeddings")
        self.trained_ctx = trained if is_int(trained) and trained > 0 else None

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
        if isinstance(entry, _Stack):
            return np.stack([self._read(name, part) for part in entry.parts])
        return self._read(name, entry)

    def _mapped(self, name: str) -> np.ndarray | None:
        if isinstance(self._entries.get(name), _Stack):  # its experts lie apart in the file: read by `_load`
            return None
        return super()._mapped(name)

    def _read(self, name: str, entry: _Entry) -> np.ndarray:
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
    def _check_dtype(name: str, entry: _Entry | _Stack) -> None:
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


def _unfused(entries: dict[str, _Entry], model_type: str, spec: ModelSpec) -> dict[str, _Entry]:
    """`entries` with each fused tensor of the family's manifest replaced by its parts, each a row range of the
    fused tensor's bytes; a fused tensor whose rows are not its parts' is refused by name."""
    out: dict[str, _Entry] = {}
    for name, entry in entries.items():
        parts = fused_parts(model_type, spec, name)
        if parts is None:
            out[name] = entry
            continue
        rows = parts[-1][2]
        if len(entry.shape) != 2 or entry.shape[0] != rows:
            raise WeightError(
                f"{entry.file}: tensor '{name}' has shape {shape_text(entry.shape)}, but the model's spec says "
                f"{shape_text((rows, spec.hidden))} (its parts: {', '.join(p for p, _, _ in parts)})"
            )
        row_bytes = (entry.stop - entry.start) // rows if rows else 0
        for part, first, end in parts:
            start = entry.start + first * row_bytes
            out[part] = _Entry(
                entry.file, entry.dtype, (end - first, entry.shape[1]), start, entry.start + end * row_bytes
            )
    return out


def _stacked(entries: dict[str, _Entry], model_type: str, spec: ModelSpec) -> dict[str, _Entry | _Stack]:
    """`entries` with each expert's tensor of the family's manifest gathered into its program tensor (a `_Stack`,
    expert by expert) and each renamed tensor (Mixtral's router) under its program name. An expert the model does
    not have, a missing one, or one of another shape or dtype than its siblings is refused by name; a tensor of a
    layer the model does not have keeps its file name, for `check_unread` to refuse."""
    out: dict[str, _Entry | _Stack] = {}
    groups: dict[str, dict[int, tuple[str, _Entry]]] = {}
    file_names: dict[str, str] = {}
    for name, entry in entries.items():
        part = expert_part(model_type, name)
        if part is None or spec.weight_shape(part[0]) is None:
            out[name] = entry
        elif part[1] is None:
            out[part[0]] = entry
        else:
            groups.setdefault(part[0], {})[part[1]] = (name, entry)
            file_names[part[0]] = part[2]
    for target, experts in groups.items():
        out[target] = _stack(target, experts, file_names[target], spec)
    return out


def _stack(target: str, experts: dict[int, tuple[str, _Entry]], file_name: str, spec: ModelSpec) -> _Stack:
    """The experts' entries of the program tensor `target` as one stack, each checked."""
    want = spec.weight_shape(target)
    assert want is not None
    count, each = want[0], want[1:]
    first_name, first = experts[min(experts)]
    for index in sorted(experts):
        name, entry = experts[index]
        if index >= count:
            raise WeightError(
                f"{entry.file}: tensor '{name}' is expert {index}, but the model has experts 0 to {count - 1}",
                hint="the config's number of experts says how many the file holds",
            )
        if entry.shape != each:
            raise WeightError(
                f"{entry.file}: tensor '{name}' has shape {shape_text(entry.shape)}, but the model's spec says "
                f"{shape_text(each)} (expert {index} of '{target}')"
            )
        if entry.dtype != first.dtype:
            raise WeightError(
                f"{entry.file}: tensor '{name}' is {entry.dtype}, but '{first_name}' is {first.dtype}: the experts "
                "of one tensor are stacked in one dtype"
            )
    missing = next((index for index in range(count) if index not in experts), None)
    if missing is not None:
        raise WeightError(
            f"{first.file.parent}: tensor '{file_name.format(e=missing)}' is missing (expert {missing} of '{target}')",
            hint="the model's spec needs every expert of every layer",
        )
    return _Stack(tuple(experts[index][1] for index in range(count)), want)


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
    root = link_root(directory)
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


def _is_dimension(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_DIMENSION


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
            f"{MAX_DIMENSION} each"
        )
    offsets = info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(is_int(o) for o in offsets):
        raise WeightError(f"{where}: data_offsets {offsets!r} is not a pair of integers")
    begin, end = offsets
    if not 0 <= begin <= end <= size - data_start:
        raise WeightError(
            f"{where}: data_offsets [{begin}, {end}] lie outside the file's {size - data_start} data bytes"
        )
    nbytes = math.prod(shape) * _ST_ITEMSIZE[dtype]
    if end - begin != nbytes:
        raise WeightError(
            f"{where}: shape {shape_text(tuple(shape))} of {dtype} needs {nbytes} bytes, "
            f"but data_offsets span {end - begin}"
        )
    return _Entry(path, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_disjoint(path: Path, entries: Mapping[str, _Entry]) -> None:
    spans = sorted((e.start, e.stop, n) for n, e in entries.items() if e.stop > e.start)
    for (_, stop, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < stop:
            raise WeightError(f"{path}: tensor '{second}' overlaps tensor '{first}'")
