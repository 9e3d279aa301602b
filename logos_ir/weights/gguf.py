"""llama.cpp's GGUF files: the file format, parsed and bounds-checked here, and the store that reads a GGUF
through Hugging Face names and layouts (tensors renamed, dequantized to float32, Q/K rows put back in HF order), with
the model's spec read from the file's metadata.

GGUF is parsed here rather than with `gguf.GGUFReader`: that reader builds numpy views for every string of the
tokenizer's vocabulary (about 4 s for the embedded SmolLM2 file) and may raise arbitrary exceptions on corrupt
input, while this parser bounds-checks each read and takes a fraction of a second. `gguf` still supplies the
type table; the blocks are dequantized by `logos_ir.quant`, and each tensor's type is the spec's `storage`, which
the author writes into the program.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from logos_ir import quant
from logos_ir.errors import SpecError, WeightError
from logos_ir.rope import base_inv_freq, llama3_rope_divisors
from logos_ir.spec import PROJECTIONS, ModelSpec, RopeScaling
from logos_ir.weights.manifest import fused_parts
from logos_ir.weights.store import MAX_DIMENSION, WeightStore, check_expected, check_unread, is_int

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
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
        GGMLQuantizationType.MXFP4,
    }
)
_QUANT_HINT = (
    "logos-ir reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants Q2_K to Q6_K and MXFP4 tensors"
    " (not the IQ and TQ types); re-quantize with llama-quantize"
)


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
            if any(d > MAX_DIMENSION for d in dims):
                raise WeightError(f"{self.path}: tensor '{name}' claims a dimension above {MAX_DIMENSION}")
            kind = cursor.u32(f"tensor '{name}'s type")
            offset = cursor.u64(f"tensor '{name}'s offset")
            raw.append((name, dims, kind, offset))
        alignment = self.metadata.get("general.alignment", 32)
        if not is_int(alignment) or alignment < 1 or alignment & (alignment - 1):
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

    def raw(self, name: str) -> np.ndarray:
        """The tensor `name`'s bytes as stored, a read-only view of the file: uint8 of shape
        `(*shape[:-1], row_bytes)` (no llama.cpp permutation undone)."""
        tensor = self.tensors.get(name)
        if tensor is None:
            raise WeightError(f"{self.path}: tensor '{name}' is not in the file")
        raw = np.frombuffer(self._map, dtype=np.uint8, count=tensor.nbytes, offset=tensor.start)
        rows = tensor.shape[:-1]
        return raw.reshape(*rows, tensor.nbytes // max(1, math.prod(rows)))

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
    # The project's own dequantizer (`logos_ir.quant`, checked against gguf-py's in test_quant_storage.py). A
    # corrupt scale makes NaN or inf, which `WeightStore.get` refuses.
    return quant.dequantize(raw, storage_format(qtype), shape)


def storage_format(qtype: GGMLQuantizationType) -> quant.BlockFormat:
    """The `logos_ir.quant` format of a GGUF tensor type the reader takes."""
    return quant.FORMATS[qtype.name.lower()]


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
    "attn_q_norm": "self_attn.q_norm",  # Qwen3's norm of each head of the query and the key
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_BLOCK_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a llama.cpp tensor name of architecture `arch` (`blk.3.attn_q.weight` gives
    `model.layers.3.self_attn.q_proj.weight`; Gemma's `blk.3.ffn_norm.weight` its pre-feed-forward norm, a Llama's
    its post-attention one), or None for a tensor with no HF counterpart (`rope_freqs.weight`)."""
    block = {**_GGUF_BLOCK, **GGUF_ARCHITECTURES[arch].block_names} if arch in GGUF_ARCHITECTURES else _GGUF_BLOCK
    return _renamed(gguf_name, _GGUF_TOP, _GGUF_BLOCK_NAME, block, "model.layers.{}.{}.{}")


_HF_TOP = {hf: name for name, hf in _GGUF_TOP.items()}
_HF_BLOCK = {hf: name for name, hf in _GGUF_BLOCK.items()}
_HF_LAYER_NAME = re.compile(r"model\.layers\.(0|[1-9][0-9]*)\.(.+)\.(weight|bias)")


def gguf_tensor_name(hf_name: str) -> str | None:
    """llama.cpp's name of a Hugging Face tensor name, the inverse of `hf_tensor_name`, or None."""
    return _renamed(hf_name, _HF_TOP, _HF_LAYER_NAME, _HF_BLOCK, "blk.{}.{}.{}")


def _renamed(
    name: str, top: Mapping[str, str], layer_name: re.Pattern[str], block: Mapping[str, str], layer_format: str
) -> str | None:
    """`name` in the other vocabulary: a top-level tensor by `top`; a layer's (`layer_name` matching its layer,
    its part and its kind, weight or bias) as `layer_format` of the layer, `block`'s name of the part and the kind;
    else None."""
    if name in top:
        return top[name]
    match = layer_name.fullmatch(name)
    if match is None or match.group(2) not in block:
        return None
    return layer_format.format(match.group(1), block[match.group(2)], match.group(3))


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
    """A llama.cpp GGUF file of an architecture in `GGUF_ARCHITECTURES`, read through HF names and layouts:
    tensors are renamed, dequantized to float32 on first `get`, and Q/K rows are put back in HF order where
    llama.cpp's converter permuted them."""

    def __init__(self, path: str | Path):
        self.file = GGUFFile(path)
        try:
            spec = _spec_from_gguf(self.file)
            super().__init__(spec, str(self.file.path))
            arch = self.file.metadata["general.architecture"]
            self._gguf_names: dict[str, str] = {}
            self._rows: dict[str, tuple[int, int]] = {}  # a part of a fused tensor: its rows
            for gname in self.file.tensors:
                hf = hf_tensor_name(gname, arch)
                parts = fused_parts(GGUF_ARCHITECTURES[arch].fused, spec, hf) if hf is not None else None
                for part, first, end in parts or ([(hf, 0, 0)] if hf is not None else []):
                    self._gguf_names[part] = gname
                    if parts:
                        self._rows[part] = (first, end)
            self._check(arch)
            # each program tensor as its file tensor stores it (a part of a fused tensor, rows of it, alike)
            stored = {hf: self.file.tensors[g].type for hf, g in self._gguf_names.items()}
            self.spec = replace(
                self.spec,
                storage=tuple(
                    sorted((hf, storage_format(t).name) for hf, t in stored.items() if t != GGMLQuantizationType.F32)
                ),
            )
            self._permuted = GGUF_ARCHITECTURES[arch].permuted
            trained = self.file.metadata.get(f"{arch}.context_length")
            self.trained_ctx = trained if is_int(trained) and trained > 0 else None
        except BaseException:
            self.file.close()
            raise

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The file's metadata (read-only), tokenizer included."""
        return self.file.metadata

    def _check(self, arch: str) -> None:
        if GGUF_ARCHITECTURES[arch].tied and "output.weight" in self.file.tensors:
            raise WeightError(
                f"{self.source}: tensor 'output.weight' is not read by the model's program",
                hint=f"a '{arch}' model's head is its embedding (llama.cpp's loader has no output tensor for it)",
            )
        for hf, gname in self._gguf_names.items():
            tensor = self.file.tensors[gname]
            if tensor.type not in _GGUF_SUPPORTED:
                raise WeightError(
                    f"{self.source}: tensor '{gname}' ({hf}) has type {tensor.type.name}, which "
                    "logos-ir cannot dequantize",
                    hint=_QUANT_HINT,
                )
        shapes = {hf: self.shape(hf) for hf in self._gguf_names}
        check_expected(self.spec, shapes, self.source)
        read = {*self._gguf_names.values(), "rope_freqs.weight"}
        if self.spec.rope_scaling is not None and self.spec.rope_scaling.rope_type == "longrope":
            read |= set(LONGROPE_TENSORS)
        for gname in sorted(self.file.tensors):  # a bias, an expert, a norm llama.cpp applies and HF names lack
            if gname not in read:
                raise WeightError(
                    f"{self.source}: tensor '{gname}' is not read by the model's program",
                    hint="llama.cpp would apply it; logos-ir refuses a model it would compute without it",
                )
        check_unread(self.spec, self._gguf_names, self.source)

    def names(self) -> list[str]:
        return sorted(self._gguf_names)

    def shape(self, name: str) -> tuple[int, ...]:
        gname = self._gguf_names.get(name)
        if gname is None:
            raise self._missing(name)
        shape = self.file.tensors[gname].shape
        if name in self._rows and len(shape) == 2:
            first, end = self._rows[name]
            return (min(end, shape[0]) - min(first, shape[0]), shape[1])
        return shape

    def _load(self, name: str) -> np.ndarray:
        return self._as_program_reads(name, self.file.read)

    def _blocks(self, name: str) -> np.ndarray:
        return self._as_program_reads(name, self.file.raw)

    def _as_program_reads(self, name: str, read: Callable[[str], np.ndarray]) -> np.ndarray:
        """The tensor read by `read` (its values, or its stored bytes, rows alike) in the program's rows: a part of
        a fused tensor its own rows, a permuted Q or K put back in Hugging Face's order."""
        gname = self._gguf_names.get(name)
        if gname is None:
            raise self._missing(name)
        array = read(gname)
        if name in self._rows:  # a part of a fused tensor (Phi-3's attn_qkv, its ffn_up of gate and up)
            first, end = self._rows[name]
            array = array[first:end].copy()
        if not self._permuted:
            return array
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):  # a bias is permuted as its rows
            return unpermute_qk(array, self.spec.heads)
        if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
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


# Every metadata key of a GGUF is read into the spec, known not to change the computation, or refused by name
# (as every key of a config.json: logos_ir.spec). The reader's own (`GGUF.`), provenance (`general.`), the
# tokenizer's (`tokenizer.`, read by logos_ir.tokenizer) and a quantizer's notes (`quantize.`) are neutral.
_GGUF_NEUTRAL_PREFIXES = ("GGUF.", "general.", "tokenizer.", "quantize.")
# YaRN's parameters beside its factor and original context, as llama.cpp's converter writes them
# (`rope.scaling.yarn_<key>`): the betas are read, the others refused unless llama.cpp's default
YARN_KEYS = ("beta_fast", "beta_slow", "ext_factor", "attn_factor", "log_multiplier")
_GGUF_READ = frozenset(
    {
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "attention.layer_norm_rms_epsilon",
        "rope.freq_base",
        "rope.dimension_count",
        "rope.scaling.type",
        "rope.scaling.attn_factor",
        *(f"rope.scaling.yarn_{key}" for key in YARN_KEYS),
        "vocab_size",
    }
)
# the longest context trained on (how far the model is good, not what it computes); Llama 3's scaling parameters
# beside the divisors (`rope_freqs`) that llama.cpp computes with and this reader checks
_GGUF_NEUTRAL = frozenset(
    {"context_length", "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.finetuned"}
)
_GGUF_LLAMA_VALUE: dict[str, tuple[Any, ...]] = {"expert_count": (0,), "expert_used_count": (0,)}


def _check_every_key(meta: Mapping[str, Any], arch: str, where: str) -> None:
    """Refuse, by name, the first metadata key whose meaning the spec does not carry."""
    prefix = arch + "."
    for key, value in meta.items():
        if key.startswith(_GGUF_NEUTRAL_PREFIXES):
            continue
        own = key[len(prefix) :] if key.startswith(prefix) else None
        if own in _GGUF_READ or own in _GGUF_NEUTRAL or own in GGUF_ARCHITECTURES[arch].keys:
            continue
        allowed = _GGUF_LLAMA_VALUE.get(own or "")
        if allowed is None:
            raise SpecError(
                f"{where}: GGUF metadata '{key}' is not one logos-ir reads",
                hint="llama.cpp would compute with it; logos-ir refuses a model it would compute without it",
            )
        if value not in allowed or isinstance(value, bool):
            raise SpecError(
                f"{where}: GGUF metadata '{key}' is {value!r}, which a LOGOS program cannot say yet"
                f" (a Llama has {' or '.join(map(repr, allowed))})"
            )


def _gguf_biases(file: GGUFFile, arch: str, where: str) -> tuple[str, ...]:
    """The projections that add a bias: those whose first layer's bias tensor the file holds (llama.cpp's llama
    applies `blk.N.attn_q.bias` and the others where present, with no metadata key saying so; its qwen2 requires
    the query, key and value biases). Every layer must then hold them: the store refuses a missing one by name."""
    found: set[str] = set()
    for name in file.tensors:
        match = _GGUF_BLOCK_NAME.fullmatch(name)
        if match and match.group(1) == "0" and match.group(3) == "bias" and match.group(2) in _GGUF_BLOCK:
            found |= {p for p, module in PROJECTIONS.items() if module == _GGUF_BLOCK[match.group(2)]}
    required = GGUF_ARCHITECTURES[arch].biases
    if not set(required) <= found:
        missing = next(p for p in required if p not in found)
        raise WeightError(f"{where}: tensor '{gguf_tensor_name(f'model.layers.0.{PROJECTIONS[missing]}.bias')}' is "
                          f"missing: a '{arch}' model's {', '.join(required)} projections add biases")  # fmt: skip
    return tuple(p for p in PROJECTIONS if p in found)


class GGUFArchitecture(NamedTuple):
    """What a GGUF architecture says without a key, as llama.cpp's converter (`convert_hf_to_gguf.py`) writes it
    and its loader (`llama-model.cpp`) reads it: whether its Q and K rows were permuted (a Llama's rotary pairs
    interleaved for llama.cpp's "norm" rope; the "neox" rope of Qwen, Gemma and Phi-3 keeps Hugging Face's
    rotate-half order), the projections whose biases it always has, whether each head of its query and key is
    RMS-normed (`blk.N.attn_q_norm.weight`, `attn_k_norm`), where its tensor names differ from a Llama's
    (`block_names`, llama.cpp's part name to Hugging Face's), the weight manifest's family whose fused tensors it
    keeps fused (`fused`: Phi-3's `attn_qkv`, and its `ffn_up` holding gate and up), whether its head is always the
    embedding (`tied`: Gemma 2's loader has no output tensor), the metadata keys of its own the spec reads
    (`keys`), and the rest of its spec (`family`: Gemma's, from llama.cpp's hard-coded choices)."""

    permuted: bool
    biases: tuple[str, ...] = ()
    head_norms: bool = False
    block_names: Mapping[str, str] = MappingProxyType({})
    fused: str = ""
    tied: bool = False
    keys: frozenset[str] = frozenset()
    family: Any = None  # (metadata, where, arch, layers, hidden, heads, head size) -> the spec's own fields


# Gemma's sandwich norms: llama.cpp's `post_attention_norm` and `post_ffw_norm` around the attention's and the
# MLP's outputs, and its `ffn_norm` the norm before the MLP (a Llama's `ffn_norm` is its post-attention norm)
_GEMMA_NAMES = MappingProxyType(
    {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }
)


def _gemma_spec(
    meta: Mapping[str, Any], where: str, arch: str, layers: int, hidden: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """Gemma 2 and 3 as llama.cpp computes a GGUF of them. Its converter stores every norm's weight plus one (as
    Gemma's norms scale by one plus their weight), so the program scales by the stored weight as it is; the
    embedding times the square root of the width, GeGLU with tanh's GELU and the sandwich norms are the
    architecture's; the scores are scaled by 1 / sqrt(head size) but for the 27B models (46 layers of Gemma 2, 62 of
    Gemma 3: by 1 / sqrt(width / heads), `f_attention_scale`); the window (`attention.sliding_window`) applies to
    every layer but each 2nd (Gemma 2) or 6th (Gemma 3, whose windowed layers rotate with base 10000, llama.cpp's
    `rope_freq_base_train_swa`); Gemma 2's soft-caps default to 50 and 30 where the file states none, as
    llama.cpp's `llama_hparams` do."""
    a = arch + "."
    big = layers == (46 if arch == "gemma2" else 62)
    window = _meta_number(meta, where, a + "attention.sliding_window", int, 0)
    pattern = 2 if arch == "gemma2" else 6
    windowed = window > 0 and layers > 0
    fields: dict[str, Any] = {
        "norm_plus_one": False,
        "embedding_scaled": True,
        "activation": "gelu_tanh",
        "sandwich_norms": True,
        "query_pre_attn_scalar": float(hidden / heads) if big else float(head_dim),
        "sliding_window": window if windowed else None,
        "full_layers": tuple(i for i in range(layers) if i % pattern == pattern - 1) if windowed else (),
    }
    if arch == "gemma2":
        fields["attention_softcap"] = float(_meta_number(meta, where, a + "attn_logit_softcapping", float, 50.0))
        fields["final_softcap"] = float(_meta_number(meta, where, a + "final_logit_softcapping", float, 30.0))
    else:
        cap = float(_meta_number(meta, where, a + "final_logit_softcapping", float, 0.0))
        fields |= {"head_norms": True, "final_softcap": cap or None, "local_rope_theta": 10000.0 if windowed else None}
    if len(fields["full_layers"]) == layers:
        fields |= {"sliding_window": None, "full_layers": (), "local_rope_theta": None}
    return fields


def _phi3_spec(
    meta: Mapping[str, Any], where: str, arch: str, layers: int, hidden: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """Phi-3's window (`attention.sliding_window`, 0 for none) over every layer, as transformers applies it (the
    definition; llama.cpp's loader turns Phi-3's window off)."""
    window = _meta_number(meta, where, arch + ".attention.sliding_window", int, 0)
    return {"sliding_window": window} if window > 0 else {}


def _qwen3moe_spec(
    meta: Mapping[str, Any], where: str, arch: str, layers: int, hidden: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """Qwen3-MoE as llama.cpp computes a GGUF of it (`llm_build_qwen3moe`): every layer a mixture of
    `expert_count` experts of `expert_feed_forward_length` numbers (its `feed_forward_length` a dense layer's, which
    it has none of), each token routed to `expert_used_count`, the chosen weights always divided by their sum
    (`build_moe_ffn`'s norm_w: true, whatever the model's norm_topk_prob was)."""
    a = arch + "."
    return {
        "intermediate": _meta_number(meta, where, a + "expert_feed_forward_length", int),
        "experts": _meta_number(meta, where, a + "expert_count", int),
        "experts_per_token": _meta_number(meta, where, a + "expert_used_count", int),
        "renormalize": True,
    }


def _olmoe_spec(
    meta: Mapping[str, Any], where: str, arch: str, layers: int, hidden: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """OLMoE as llama.cpp computes a GGUF of it (`llm_build_olmoe`): the whole query and the whole key RMS-normed
    before they are split into heads (`attn_q_norm`, `attn_k_norm`, each as wide as its projection), every layer a
    mixture of `expert_count` experts of `feed_forward_length` numbers each, each token routed to
    `expert_used_count`, the chosen weights not divided by their sum (`build_moe_ffn`'s norm_w false, as OLMoE's
    norm_topk_prob)."""
    a = arch + "."
    return {
        "projection_norms": True,
        "experts": _meta_number(meta, where, a + "expert_count", int),
        "experts_per_token": _meta_number(meta, where, a + "expert_used_count", int),
        "renormalize": False,
    }


def _llama_spec(
    meta: Mapping[str, Any], where: str, arch: str, layers: int, hidden: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """A llama GGUF with experts (Mixtral, as llama.cpp's converter writes it): every layer a mixture of
    `expert_count` experts of `feed_forward_length` numbers each, each token routed to `expert_used_count`, the
    chosen weights divided by their sum (`llm_build_llama`'s `build_moe_ffn`, norm_w true, as Mixtral's router);
    without experts (a count of 0 or none), a Llama."""
    experts = _meta_number(meta, where, arch + ".expert_count", int, 0)
    if experts == 0:
        if _meta_number(meta, where, arch + ".expert_used_count", int, 0):
            raise SpecError(f"{where}: GGUF metadata '{arch}.expert_used_count' routes to experts the file lacks")
        return {}
    used = _meta_number(meta, where, arch + ".expert_used_count", int)
    return {"experts": experts, "experts_per_token": used, "renormalize": True}


# llama.cpp's names of a mixture's router and stacked experts (already stacked in the file: experts first)
_EXPERT_NAMES = MappingProxyType(
    {
        "ffn_gate_inp": "mlp.gate",
        "ffn_gate_exps": "mlp.experts.gate_proj",
        "ffn_up_exps": "mlp.experts.up_proj",
        "ffn_down_exps": "mlp.experts.down_proj",
    }
)

GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    "llama": GGUFArchitecture(
        permuted=True,
        block_names=_EXPERT_NAMES,  # a Mixtral's router and experts
        keys=frozenset({"expert_count", "expert_used_count"}),
        family=_llama_spec,
    ),
    "qwen2": GGUFArchitecture(permuted=False, biases=("query", "key", "value")),
    "olmoe": GGUFArchitecture(  # llama.cpp's "neox" rotary: Q and K as Hugging Face stores them
        permuted=False,
        block_names=_EXPERT_NAMES,
        keys=frozenset({"expert_count", "expert_used_count"}),
        family=_olmoe_spec,
    ),
    "qwen3": GGUFArchitecture(permuted=False, head_norms=True),
    "qwen3moe": GGUFArchitecture(
        permuted=False,
        head_norms=True,
        block_names=_EXPERT_NAMES,
        keys=frozenset({"expert_count", "expert_used_count", "expert_feed_forward_length"}),
        family=_qwen3moe_spec,
    ),
    "gemma2": GGUFArchitecture(
        permuted=False,
        block_names=_GEMMA_NAMES,
        tied=True,
        keys=frozenset({"attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"}),
        family=_gemma_spec,
    ),
    "gemma3": GGUFArchitecture(
        permuted=False,
        block_names=_GEMMA_NAMES,
        keys=frozenset({"final_logit_softcapping", "attention.sliding_window"}),
        family=_gemma_spec,
    ),
    "phi3": GGUFArchitecture(
        permuted=False,
        block_names=MappingProxyType({"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
        fused="phi3",
        keys=frozenset({"attention.sliding_window"}),
        family=_phi3_spec,
    ),
}


def _spec_from_gguf(file: GGUFFile) -> ModelSpec:
    meta, where = file.metadata, str(file.path)
    arch = meta.get("general.architecture")
    if arch is None:
        raise SpecError(f"{where}: GGUF metadata 'general.architecture' is missing")
    if arch not in GGUF_ARCHITECTURES:
        raise SpecError(
            f"{where}: GGUF architecture '{arch}' is not supported",
            hint=f"logos-ir reads GGUF files of the architectures {', '.join(GGUF_ARCHITECTURES)}",
        )
    _check_every_key(meta, arch, where)
    a = arch + "."  # the architecture's own keys: llama.block_count, qwen2.block_count
    hidden = _meta_number(meta, where, a + "embedding_length", int)
    heads = _meta_number(meta, where, a + "attention.head_count", int)
    # llama.cpp's head size: the key length, else the width over the heads; its rotation (n_rot) turns the first
    # rope.dimension_count numbers of each head, all of them by default
    head_dim = meta.get(a + "attention.key_length")
    if head_dim is None:
        if heads < 1 or hidden % heads:
            raise SpecError(f"{where}: embedding_length {hidden} is not a multiple of head_count {heads}")
        head_dim = hidden // heads
    if meta.get(a + "attention.value_length", head_dim) != head_dim:
        raise SpecError(
            f"{where}: GGUF metadata '{a}attention.value_length' is {meta[a + 'attention.value_length']!r}, not the"
            f" head size {head_dim!r}",
            hint="a LOGOS program cannot say yet values of another width than the keys",
        )
    rotary = meta.get(a + "rope.dimension_count", head_dim)
    if rotary != head_dim and arch not in GGUF_PARTIAL_ROTARY:
        raise SpecError(
            f"{where}: GGUF metadata '{a}rope.dimension_count' is {rotary!r}, not the head size {head_dim!r}",
            hint=f"a rotation over part of the head is said for {', '.join(GGUF_PARTIAL_ROTARY)} only",
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    embed = file.tensors.get("token_embd.weight")
    vocab_default = len(tokens) if isinstance(tokens, list) else embed.shape[0] if embed and embed.shape else None
    theta = float(_meta_number(meta, where, a + "rope.freq_base", float, 10000.0))
    layers = _meta_number(meta, where, a + "block_count", int)
    architecture = GGUF_ARCHITECTURES[arch]
    own = architecture.family(meta, where, arch, layers, hidden, heads, head_dim) if architecture.family else {}
    if "intermediate" not in own:  # a mixture's is its experts' width, said by its family
        own["intermediate"] = _meta_number(meta, where, a + "feed_forward_length", int)
    try:
        return ModelSpec(
            vocab=_meta_number(meta, where, a + "vocab_size", int, vocab_default),
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=_meta_number(meta, where, a + "attention.head_count_kv", int, heads),
            head_dim=head_dim,
            rms_eps=float(_meta_number(meta, where, a + "attention.layer_norm_rms_epsilon", float)),
            rope_theta=theta,
            tie_embeddings=architecture.tied or "output.weight" not in file.tensors,
            rope_scaling=_gguf_rope_scaling(file, where, head_dim, theta, arch, rotary),
            rotary_dim=None if rotary == head_dim else rotary,
            biases=_gguf_biases(file, arch, where),
            **{"head_norms": architecture.head_norms, **own},
        )
    except SpecError as error:
        if error.message.startswith(where):
            raise
        raise SpecError(f"{where}: {error.message}", hint=error.hint) from None


# The architectures whose llama.cpp rotation of part of a head (n_rot below the head size, NEOX mode: the halves of
# the rotated part) is transformers' partial rotary (`PARTIAL_ROTARY`); a Llama's rows are permuted for the
# interleaved mode over the whole head, so a part of it is refused there.
GGUF_PARTIAL_ROTARY = ("phi3",)


def _gguf_rope_scaling(
    file: GGUFFile, where: str, head_dim: Any, theta: float, arch: str, rotary: Any = None
) -> RopeScaling | None:
    """The file's rope scaling, as llama.cpp computes it. A linear one is its type and factor (llama.cpp's
    `freq_scale` is one over it; Gemma 3's windowed layers rotate unscaled, its `rope_freq_scale_train_swa`).
    YaRN's and LongRoPE's are read by `_gguf_yarn` and `_gguf_longrope`. llama.cpp computes Llama 3's with
    per-frequency divisors (`rope_freqs`), not with parameters, so the parameters are recovered from the divisors
    (`_llama3_parameters`) and accepted only if they reproduce every one of them. llama.cpp scales cos and sin by
    `rope.scaling.attn_factor` whatever the type; a type that has no attention factor refuses one other than 1."""
    meta = file.metadata
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    longrope = [name for name in LONGROPE_TENSORS if name in file.tensors] if arch in LONGROPE_ARCHITECTURES else []
    if kind not in ("none", "llama3", "linear", "yarn", "longrope"):
        raise SpecError(f"{where}: rope scaling of type '{kind}' is not supported (linear, Llama 3's, YaRN, LongRoPE)")
    if kind == "longrope" and arch not in LONGROPE_ARCHITECTURES:
        raise SpecError(
            f"{where}: a longrope rope scaling is read from a GGUF of {', '.join(LONGROPE_ARCHITECTURES)} only,"
            f" whose loader in llama.cpp reads its factors; not from '{arch}'"
        )
    if kind == "longrope" or (kind == "none" and longrope):
        return _gguf_longrope(file, where, arch, head_dim if rotary is None else rotary)
    if longrope:
        raise SpecError(f"{where}: tensor '{longrope[0]}' is LongRoPE's, but the rope scaling's type is '{kind}'")
    if kind == "yarn":
        if arch not in YARN_ARCHITECTURES:
            raise SpecError(
                f"{where}: a yarn rope scaling is read from a GGUF of {', '.join(YARN_ARCHITECTURES)} only, not"
                f" from '{arch}' (whose local and global layers, or LongRoPE, scale otherwise)"
            )
        return _gguf_yarn(file, where, arch)
    for key in ("attn_factor", *(f"yarn_{key}" for key in YARN_KEYS)):
        name = f"{arch}.rope.scaling.{key}"
        if name in meta and not (key == "attn_factor" and meta[name] == 1):
            raise SpecError(
                f"{where}: GGUF metadata '{name}' is {meta[name]!r}, which a rope scaling of type '{kind}' cannot say"
            )
    if kind == "linear":
        if "rope_freqs.weight" in file.tensors:
            raise SpecError(f"{where}: a linear rope scaling with rope_freqs.weight divisors is not said yet")
        factor = meta.get(f"{arch}.rope.scaling.factor")
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise SpecError(f"{where}: a linear rope scaling needs its {arch}.rope.scaling.factor")
        return None if factor == 1 else RopeScaling(float(factor), rope_type="linear")
    if "rope_freqs.weight" not in file.tensors:
        return None
    if not is_int(head_dim) or head_dim < 2 or head_dim % 2:
        raise SpecError(f"{where}: head_dim {head_dim!r} must be a positive even integer")
    try:
        divisors = file.read("rope_freqs.weight").reshape(-1).astype(np.float64)
    except WeightError as error:
        raise SpecError(error.message) from None
    if divisors.shape != (head_dim // 2,) or not np.all(np.isfinite(divisors)) or divisors.min() <= 0:
        raise SpecError(f"{where}: rope_freqs.weight must hold {head_dim // 2} finite positive divisors")
    if np.allclose(divisors, 1.0):
        return None
    stated = {key: file.metadata.get(f"{arch}.rope.scaling.{key}") for key in ("factor", "original_context_length")}
    for scaling in _llama3_parameters(divisors, head_dim, theta, stated):
        if np.allclose(divisors, llama3_rope_divisors(scaling, head_dim, theta), rtol=1e-4):
            return scaling
    raise SpecError(
        f"{where}: rope_freqs.weight is not a Llama 3 rope scaling logos-ir recognizes: no factor, original context"
        " and frequency factors reproduce its divisors"
    )


# Phi-3's LongRoPE divisors as llama.cpp's converter writes them, one a rotating pair, global tensors; read for
# the architectures whose loader in llama.cpp reads them (elsewhere they are tensors the program does not read)
LONGROPE_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")
LONGROPE_ARCHITECTURES = ("phi3",)
# the architectures whose families scale by YaRN over every layer alike (Qwen2.5's and Qwen3's long context, Llama
# fine-tunes); a Gemma's local layers and Phi-3's LongRoPE are not said with it
YARN_ARCHITECTURES = ("llama", "qwen2", "qwen3")


def _scaling_number(meta: Mapping[str, Any], where: str, key: str, default: float | None = None) -> float:
    """A positive finite number of the rope scaling's metadata, or `default` where the file has none."""
    value = meta.get(key, default)
    if value is None:
        raise SpecError(f"{where}: the rope scaling needs its GGUF metadata '{key}'")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise SpecError(f"{where}: GGUF metadata '{key}' must be a positive number, not {value!r}")
    return float(value)


def _scaling_length(meta: Mapping[str, Any], where: str, key: str) -> int:
    value = meta.get(key)
    if not is_int(value) or value < 1:
        raise SpecError(f"{where}: the rope scaling needs its GGUF metadata '{key}', a positive integer, not {value!r}")
    return int(value)


def _gguf_yarn(file: GGUFFile, where: str, arch: str) -> RopeScaling | None:
    """YaRN as llama.cpp computes it from a GGUF: frequencies scaled by one over `rope.scaling.factor`
    (`freq_scale`) below the ramp between `yarn_beta_fast` and `yarn_beta_slow` turns over
    `rope.scaling.original_context_length` (32 and 1 by default; `ggml_rope_yarn_corr_dims` floors and ceils the
    ramp's ends, transformers' `truncate`), the full blend (`yarn_ext_factor` 1); cos and sin scaled by
    `1 + 0.1 ln(factor)` (ggml's `rope_yarn` mscale) times `rope.scaling.attn_factor` (1 by default). Refused by
    name: a partial blend (`yarn_ext_factor` other than 1), DeepSeek's ratio of mscales (`yarn_log_multiplier`),
    `yarn_attn_factor` (which llama.cpp's versions apply differently), divisors (`rope_freqs`) besides."""
    meta, a = file.metadata, f"{arch}.rope.scaling."
    if "rope_freqs.weight" in file.tensors:
        raise SpecError(f"{where}: a yarn rope scaling with rope_freqs.weight divisors is not said yet")
    refused = {
        "yarn_ext_factor": (1, "a YaRN blend other than the full one (1) is not said yet"),
        "yarn_log_multiplier": (0, "DeepSeek's ratio of YaRN mscales is not said yet"),
        "yarn_attn_factor": (None, "llama.cpp's versions apply it differently; logos-ir does not guess"),
    }
    for key, (default, why) in refused.items():
        if a + key in meta and (default is None or meta[a + key] != default):
            raise SpecError(f"{where}: GGUF metadata '{a}{key}' is {meta[a + key]!r}: {why}")
    factor = _scaling_number(meta, where, a + "factor")
    if factor < 1:
        raise SpecError(f"{where}: a yarn rope scaling's factor {factor!r} is below 1 (it would shrink the context)")
    if factor == 1:
        return None
    attention = (0.1 * math.log(factor) + 1.0) * _scaling_number(meta, where, a + "attn_factor", 1.0)
    return RopeScaling(
        factor,
        original_max_position_embeddings=_scaling_length(meta, where, a + "original_context_length"),
        rope_type="yarn",
        beta_fast=_scaling_number(meta, where, a + "yarn_beta_fast", 32.0),
        beta_slow=_scaling_number(meta, where, a + "yarn_beta_slow", 1.0),
        attention_factor=attention,
    )


def _gguf_longrope(file: GGUFFile, where: str, arch: str, rotary: Any) -> RopeScaling:
    """LongRoPE as llama.cpp computes it from Phi-3's GGUF: each rotating pair's frequency divided by its factor
    in `rope_factors_short.weight` or `rope_factors_long.weight`, the long ones where the context is longer than
    `rope.scaling.original_context_length` (`llama_model::get_rope_factors`; `RopeScaling.at_context`); cos and
    sin scaled by `rope.scaling.attn_factor`, 1 where the file has none, as llama.cpp (Phi-3's converter writes
    `sqrt(1 + ln(s) / ln(original))`, s the context length over the original). The original context is
    `context_length` where the file states none (llama.cpp's `n_ctx_orig_yarn`); the scaling's factor is
    `context_length` over it."""
    meta, a = file.metadata, f"{arch}.rope.scaling."
    for name in LONGROPE_TENSORS:
        if name not in file.tensors:
            raise SpecError(f"{where}: a longrope rope scaling needs its tensor '{name}'")
    if "rope_freqs.weight" in file.tensors:
        raise SpecError(f"{where}: a longrope rope scaling with rope_freqs.weight divisors is not said yet")
    if not is_int(rotary) or rotary < 2 or rotary % 2:
        raise SpecError(f"{where}: the rotated part of a head {rotary!r} must be a positive even integer")
    factors = []
    for name in LONGROPE_TENSORS:
        try:
            values = file.read(name).reshape(-1).astype(np.float64)
        except WeightError as error:
            raise SpecError(error.message) from None
        if values.shape != (rotary // 2,) or not np.all(np.isfinite(values)) or values.min() <= 0:
            raise SpecError(f"{where}: tensor '{name}' must hold {rotary // 2} finite positive factors, one a pair")
        factors.append(tuple(float(v) for v in values))
    short, long = factors
    context = _scaling_length(meta, where, f"{arch}.context_length")
    original = (
        _scaling_length(meta, where, a + "original_context_length")
        if a + "original_context_length" in meta
        else context
    )
    return RopeScaling(
        context / original,
        original_max_position_embeddings=original,
        rope_type="longrope",
        attention_factor=_scaling_number(meta, where, a + "attn_factor", 1.0),
        factors=short,
        long_factors=None if long == short else long,
    )


def _llama3_parameters(divisors: np.ndarray, head_dim: int, theta: float, stated: dict[str, Any]) -> list[RopeScaling]:
    """The Llama 3 scalings that could have made `divisors`, most likely first. The factor is the file's
    `rope.scaling.factor` or else the largest divisor. A divisor strictly between 1 and the factor lies in the
    blend, where 1/divisor = (1 - s)/factor + s with s = (original/wavelength - low)/(high - low), linear in
    1/wavelength: with Llama 3's own frequency factors (low 1, high 4) each such divisor gives the original context
    (wavelength (3 s + 1)), and with the file's `rope.scaling.original_context_length` two of them give low and
    high. Candidates: the stated original with low 1 and high 4, then with the frequency factors the blend gives;
    the original the blend gives with low 1 and high 4; 8192 (Llama 3.1's) where no divisor is in the blend. Two
    scalings that make the same divisors compute the same rotation: (8, 2, 8, 8192) is (8, 1, 4, 4096)."""
    factor = float(stated["factor"]) if isinstance(stated["factor"], int | float) else float(divisors.max())
    original = stated["original_context_length"]
    wavelength = 2 * math.pi / base_inv_freq(head_dim, theta)
    blend = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    s = (1 / divisors[blend] - 1 / factor) / (1 - 1 / factor) if factor > 1 else np.zeros(0)
    candidates: list[tuple[float, float, float]] = []
    if is_int(original) and original > 0:
        candidates.append((float(original), 1.0, 4.0))
    if s.size >= 2 and is_int(original) and original > 0:
        slope, intercept = np.polyfit(1 / wavelength[blend], s, 1)  # slope original/(high - low), -low/(high - low)
        width = original / slope if slope > 0 else 0.0
        candidates.append((float(original), -intercept * width, -intercept * width + width))
    if s.size:
        candidates.append((float(np.median(wavelength[blend] * (3 * s + 1))), 1.0, 4.0))
    candidates.append((8192.0, 1.0, 4.0))
    return [
        RopeScaling(factor, round(low, 6), round(high, 6), round(old))
        for old, low, high in candidates
        if factor >= 1 and 0 < low < high and old >= 1
    ]
