"""Small real inputs for tests and the fuzzer, written here rather than downloaded: a model small enough that its
whole weight file is one fuzz input (`small_spec`), written as a Hugging Face folder (`write_model_folder`) or as a
GGUF file (`model_gguf`, with a byte-level BPE tokenizer from `tokenizer_metadata`, over GPT-2's byte alphabet,
`byte_level_alphabet`); any GGUF file from metadata and tensors (`gguf_bytes`, with the GGUF specification's value
types `U8` ... `F64`); a `logos` build folder of the tiny preset (`write_logos_build`); an authored program's MLIR
(`mlir_text`); a model's decode step lowered by the spatial lane (`lower_decode`); a model whose rows are whole
K-quant super-blocks (`super_block_spec`) and its weights stored by the project's quantizer (`quantized_store`).
The D5005 lane's decode step as its pipeline lowers it: `lower_program`.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize
from xdsl.dialects.builtin import ModuleOp
from xdsl.printer import Printer

from logos_ir.build import BuildRequest, build_logos, manifest_of, write_build
from logos_ir.dialects import csl_ext
from logos_ir.models import ModelSource
from logos_ir.parser import parse_program
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.rope import llama3_rope_divisors
from logos_ir.spec import ModelSpec, RopeScaling
from logos_ir.weights import RandomWeights, gguf_tensor_name, save_model


def small_spec(hidden: int = 4) -> ModelSpec:
    """A model small enough that its whole weight file is a fuzz input: hidden 4 (or 32, for GGUF block
    types)."""
    spec = ModelSpec(
        vocab=4,
        hidden=4,
        layers=1,
        heads=2,
        kv_heads=1,
        head_dim=2,
        intermediate=4,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
    )
    return spec if hidden == 4 else replace(spec, vocab=8, hidden=32, head_dim=16, intermediate=32)


def write_model_folder(folder: Path, shards: int = 1, dtype: str = "float32", seed: int = 1) -> Path:
    """A Hugging Face model folder of `small_spec()` with random weights, written by `save_model`."""
    save_model(RandomWeights(small_spec(), seed=seed), folder, shards=shards, dtype=dtype)
    return Path(folder)


# GGUF value types (the GGUF specification's numbering).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_PACK = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}


def _gguf_string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _gguf_value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        return _gguf_string(value)
    if kind == ARRAY:
        item_kind, items = value
        return struct.pack("<IQ", item_kind, len(items)) + b"".join(_gguf_value(item_kind, v) for v in items)
    return struct.pack(_PACK[kind], value)


def save_gguf(writer: Any) -> None:
    """Write a gguf-py `GGUFWriter`'s file: its header, its metadata, its tensors, then close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_bytes(
    metadata: list[tuple[str, int, Any]],
    tensors: list[tuple[str, tuple[int, ...], int, bytes]] = (),  # type: ignore[assignment]
    alignment: int = 32,
    version: int = 3,
    header_only: bool = False,
) -> bytes:
    """A GGUF file: `metadata` as (key, value type, value) (an array's value is (item type, items)), `tensors`
    as (name, numpy-order shape, GGML type number, data). With `header_only`, the tensors' data is left out (a
    header region, as a truncated file)."""
    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(metadata))]
    for key, kind, value in metadata:
        out += [_gguf_string(key), struct.pack("<I", kind), _gguf_value(kind, value)]
    offset, data = 0, []
    for name, shape, qtype, raw in tensors:
        dims = tuple(reversed(shape))
        out += [
            _gguf_string(name),
            struct.pack("<I", len(dims)),
            struct.pack(f"<{len(dims)}Q", *dims),
            struct.pack("<IQ", qtype, offset),
        ]
        padded = raw + b"\0" * (-len(raw) % alignment)
        data.append(padded)
        offset += len(padded)
    head = b"".join(out)
    if header_only:
        return head
    return head + b"\0" * (-len(head) % alignment) + b"".join(data)


def model_gguf(
    hidden: int = 4,
    qtype: str = "F32",
    tokenizer: bool = False,
    rope_scaling: bool = False,
    extra_metadata: list[tuple[str, int, Any]] = (),  # type: ignore[assignment]
    extra_tensors: list[str] = (),  # type: ignore[assignment]
) -> bytes:
    """A GGUF of `small_spec(hidden)` with random weights: norms F32, matrices `qtype` (F32, F16, or a block type
    gguf-py quantizes: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4; block types need hidden 32), optionally with a
    tokenizer and llama3 rope scaling (`rope_freqs`); then `extra_metadata` (each replacing a key of the same name
    above), and `extra_tensors` (names of F32 vectors of the hidden size, as a bias a file might carry)."""
    spec = small_spec(hidden)
    store = RandomWeights(spec, seed=2)
    meta: list[tuple[str, int, Any]] = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "logos-fuzz"),
        ("llama.block_count", U32, spec.layers),
        ("llama.context_length", U32, 2048),
        ("llama.embedding_length", U32, spec.hidden),
        ("llama.feed_forward_length", U32, spec.intermediate),
        ("llama.attention.head_count", U32, spec.heads),
        ("llama.attention.head_count_kv", U32, spec.kv_heads),
        ("llama.rope.freq_base", F32, spec.rope_theta),
        ("llama.attention.layer_norm_rms_epsilon", F32, spec.rms_eps),
        ("llama.vocab_size", U32, spec.vocab),
        ("llama.rope.dimension_count", U32, spec.head_dim),
        ("general.alignment", U32, 32),
    ]
    if tokenizer:
        meta += tokenizer_metadata(spec.vocab)
    tensors: list[tuple[str, tuple[int, ...], int, bytes]] = []
    for hf in store.names():
        array = np.array(store.get(hf))
        kind = QT.F32 if array.ndim == 1 else QT[qtype]
        if kind == QT.F32:
            raw = array.astype("<f4").tobytes()
        elif kind == QT.F16:
            raw = array.astype("<f2").tobytes()
        else:
            raw = quantize(array, kind).tobytes()
        name = gguf_tensor_name(hf)
        assert name is not None, f"{hf} has no GGUF name"
        tensors.append((name, array.shape, int(kind), raw))
    if rope_scaling:
        scaling = RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        )
        divisors = llama3_rope_divisors(scaling, spec.head_dim, spec.rope_theta).astype("<f4")
        meta.append(("llama.rope.scaling.type", STRING, "llama3"))
        tensors.append(("rope_freqs.weight", divisors.shape, int(QT.F32), divisors.tobytes()))
    said = {key for key, _, _ in extra_metadata}  # an extra key replaces the same key above
    meta = [entry for entry in meta if entry[0] not in said] + list(extra_metadata)
    for name in extra_tensors:
        tensors.append((name, (spec.hidden,), int(QT.F32), np.full(spec.hidden, 0.5, "<f4").tobytes()))
    return gguf_bytes(meta, tensors)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each of the 256 bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_metadata(vocab: int | None = None, pre: str = "smollm") -> list[tuple[str, int, Any]]:
    """The `tokenizer.ggml.*` metadata of a small byte-level BPE: the 256 byte tokens, a few merges, three
    control tokens. With `vocab` (fewer than 256), a vocabulary of that many tokens and no merges."""
    if vocab is not None and vocab < 256:
        tokens = [f"t{i}" for i in range(vocab)]
        return [
            ("tokenizer.ggml.model", STRING, "gpt2"),
            ("tokenizer.ggml.pre", STRING, pre),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.bos_token_id", U32, 0),
            ("tokenizer.ggml.eos_token_id", U32, vocab - 1),
        ]
    tokens = byte_level_alphabet()
    merges = []
    for left, right in (
        ("Ġ", "w"),
        ("h", "e"),
        ("he", "l"),
        ("hel", "l"),
        ("hell", "o"),
        ("Ġw", "o"),
        ("l", "d"),
    ):
        merges.append(f"{left} {right}")
        if left + right not in tokens:
            tokens.append(left + right)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    return [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, len(tokens) - 2),
        ("tokenizer.ggml.eos_token_id", U32, len(tokens) - 1),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        (
            "tokenizer.chat_template",
            STRING,
            "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
        ),
    ]


def write_logos_build(folder: Path, outside: Path | None = None) -> Path:
    """A `logos` build of the tiny preset (decode ctx=16, its parts), written by `write_build`; given `outside`, with
    a link to a file and a link to a folder there (a manifest naming them must not make the checker read them)."""
    request = BuildRequest(ModelSource.resolve("tiny"), Cut.decode(16), 1, "f32", False, Progress.silent())

    def produce() -> tuple[dict[str, Any], list[Any]]:
        lane = build_logos(request)
        return manifest_of(request, "logos", lane), lane.artifacts

    write_build(folder, produce)
    if outside is not None:
        os.symlink(outside / "config.json", folder / "link.logos")
        os.symlink(outside, folder / "linkdir")
    return folder


def mlir_text(text: str, generic: bool = False) -> str:
    """The MLIR of the LOGOS program `text`, as xDSL prints it (in the generic form with `generic`)."""
    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=generic).print_op(ModuleOp([parse_program(text)]))
    return stream.getvalue() + "\n"


def lower_program(program: Any, weights: str, params: Any = None) -> Any:
    """The `d5005.program` the D5005 lane's pipeline makes of a `logos.program` decode step as the author writes it
    (@main calling its sections): `inline-sections`, then `convert-logos-to-d5005` (with `params`, a
    `d5005.EngineParams`, or the engine's defaults for `weights`), on a copy of `program`."""
    from xdsl.context import Context

    from logos_ir.passes.d5005.convert_logos_to_d5005 import convert_program
    from logos_ir.passes.inline_sections import InlineSections

    module = ModuleOp([program.clone()])
    InlineSections().apply(Context(), module)
    return convert_program(next(iter(module.ops)), weights, params)


def lower_decode(
    spec: Any,
    ctx: int,
    image: str = "f16",
    p: int | tuple[int, int] = 0,
    memory: int = csl_ext.MEMORY,
    copies: int | None = None,
    arch: str = "wse2",
) -> Any:
    """The decode step of `spec` over a cache of `ctx` positions as the author writes it, through the spatial lane's
    pipeline (`verify-identity`, `extract-parts`, `csl-fuse-products`, `convert-logos-to-csl`'s `lower_module`) for
    `arch` (a WSE-2 or a WSE-3), as a `GridProgram`: for the tests and benchmarks that start from a model rather than
    a module."""
    from xdsl.context import Context

    from logos_ir.author import written
    from logos_ir.passes.extract_parts import ExtractParts
    from logos_ir.passes.spatial.convert_logos_to_csl import lower_module
    from logos_ir.passes.spatial.fuse_products import CslFuseProducts
    from logos_ir.passes.verify_identity import VerifyIdentity

    whole = Cut.decode(ctx)
    authored, _ = written(spec, whole)
    module = ModuleOp([parse_program(authored.text, f"<{whole.option()}>")])
    for stage in (VerifyIdentity(), ExtractParts(), CslFuseProducts()):
        stage.apply(Context(), module)
    return lower_module(module, image, p, memory, copies, arch)


def super_block_spec(layers: int = 2) -> ModelSpec:
    """The tiny preset widened so that every matrix's rows are whole K-quant super-blocks (hidden and
    intermediate multiples of 256), for stores in Q4_K, Q6_K or Q4_K_M's mix without llama.cpp's fallbacks."""
    tiny = ModelSpec.preset("tiny")
    return replace(tiny, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, layers=layers)


def quantized_store(spec: ModelSpec, choice: str, seed: int = 0) -> Any:
    """`spec`'s random weights stored as `logos-compile --weights choice` stores a preset's (`QuantizedWeights`)."""
    from logos_ir.weights.store import QuantizedWeights

    return QuantizedWeights(RandomWeights(spec, seed), choice)
