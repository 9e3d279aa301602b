"""Weight stores: random weights, safetensors and GGUF round trips, the checks that refuse bad files,
llama.cpp's naming, Q/K permutation and block quantization, and the embedded SmolLM2 model."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from logos_ir.errors import LogosError, SpecError, WeightError
from logos_ir.rope import llama3_rope_divisors
from logos_ir.spec import ModelSpec, RopeScaling
from logos_ir.testing import save_gguf
from logos_ir.weights import (
    ArrayStore,
    GGUFFile,
    GGUFStore,
    RandomWeights,
    SafetensorsStore,
    embedded_model_path,
    expected_weights,
    gguf_tensor_name,
    hf_tensor_name,
    open_model,
    permute_qk,
    save_model,
    unpermute_qk,
)

TINY = ModelSpec.preset("tiny")
LAYER0 = "model.layers.0."


# -- helpers -------------------------------------------------------------------------------------------------


def gguf_name(hf: str) -> str:
    """llama.cpp's name for a Hugging Face tensor name, written out independently of the module's table."""
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    layer, rest, kind = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf).groups()
    block = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.q_norm": "attn_q_norm",  # gguf-py's MODEL_TENSOR.ATTN_Q_NORM (Qwen3)
        "self_attn.k_norm": "attn_k_norm",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    return f"blk.{layer}.{block[rest]}.{kind}"


def write_gguf(
    path: Path,
    store,
    qtype: QT = QT.Q8_0,
    *,
    arch: str = "llama",
    types: dict | None = None,
    skip: tuple[str, ...] = (),
    extra=None,
    permute: bool = True,
) -> Path:
    """A llama.cpp-style GGUF of `store`: matrices in `qtype` (or `types[hf_name]`), norms F32, Q/K permuted
    as convert_hf_to_gguf.py does for a Llama (`permute`; its Qwen2 does not). `extra(writer)` may add metadata or
    tensors."""
    spec = store.spec
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(spec.layers)
    w.add_context_length(2048)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(spec.intermediate)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_vocab_size(spec.vocab)
    w.add_rope_dimension_count(spec.head_dim)
    if spec.head_dim * spec.heads != spec.hidden:  # as convert_hf_to_gguf writes a config's own head_dim
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    for hf in store.names():
        if hf in skip:
            continue
        array = np.array(store.get(hf))
        if permute and hf.endswith(("q_proj.weight", "q_proj.bias")):  # convert_hf_to_gguf permutes a bias too
            array = permute_qk(array, spec.heads)
        elif permute and hf.endswith(("k_proj.weight", "k_proj.bias")):
            array = permute_qk(array, spec.kv_heads)
        kind = (types or {}).get(hf, QT.F32 if array.ndim == 1 else qtype)
        if kind == QT.F32:
            w.add_tensor(gguf_name(hf), array.astype(np.float32))
        elif kind == QT.F16:
            w.add_tensor(gguf_name(hf), array.astype(np.float16))
        else:
            w.add_tensor(gguf_name(hf), gguf.quants.quantize(array, kind), raw_dtype=kind)
    if extra is not None:
        extra(w)
    save_gguf(w)
    return path


def write_raw_safetensors(path: Path, header: dict, data: bytes = b"") -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def tiny_folder(tmp_path: Path, **kwargs) -> Path:
    folder = tmp_path / "model"
    save_model(RandomWeights(TINY, seed=1), folder, **kwargs)
    return folder


def assert_refused(error: pytest.ExceptionInfo, *words: str) -> None:
    text = str(error.value)
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


# -- the tensors of a model ----------------------------------------------------------------------------------


def test_expected_weights_of_tiny_model():
    shapes = expected_weights(TINY)
    assert len(shapes) == 1 + 9 * TINY.layers + 2
    assert shapes["model.embed_tokens.weight"] == (256, 64)
    assert shapes[LAYER0 + "self_attn.q_proj.weight"] == (4 * 16, 64)
    assert shapes[LAYER0 + "self_attn.k_proj.weight"] == (2 * 16, 64)
    assert shapes[LAYER0 + "self_attn.v_proj.weight"] == (2 * 16, 64)
    assert shapes[LAYER0 + "self_attn.o_proj.weight"] == (64, 4 * 16)
    assert shapes[LAYER0 + "mlp.gate_proj.weight"] == shapes[LAYER0 + "mlp.up_proj.weight"] == (128, 64)
    assert shapes[LAYER0 + "mlp.down_proj.weight"] == (64, 128)
    assert shapes["model.layers.1.post_attention_layernorm.weight"] == (64,)
    assert shapes["model.norm.weight"] == (64,)
    assert shapes["lm_head.weight"] == (256, 64)


def test_tied_embeddings_have_no_lm_head():
    shapes = expected_weights(ModelSpec.preset("smollm2-135m"))
    assert "lm_head.weight" not in shapes
    assert len(shapes) == 272  # the tensor count of the embedded GGUF


# -- random weights ------------------------------------------------------------------------------------------


def test_random_weights_are_deterministic_and_order_independent():
    a, b = RandomWeights(TINY, seed=3), RandomWeights(TINY, seed=3)
    names = a.names()
    assert names == sorted(expected_weights(TINY))
    first = {n: np.array(a.get(n)) for n in names}
    for n in reversed(names):
        np.testing.assert_array_equal(b.get(n), first[n])
    assert not np.array_equal(RandomWeights(TINY, seed=4).get(names[0]), first[names[0]])


def test_random_weights_are_cached_read_only_float32():
    store = RandomWeights(TINY)
    w = store.get(LAYER0 + "mlp.up_proj.weight")
    assert w.dtype == np.float32 and w.shape == (128, 64) and w.flags.c_contiguous
    assert store.get(LAYER0 + "mlp.up_proj.weight") is w
    with pytest.raises(ValueError):
        w[0, 0] = 1.0


def test_random_weights_keep_activations_of_order_one():
    store = RandomWeights(TINY)
    norm = store.get("model.norm.weight")
    assert abs(norm.mean() - 1) < 0.05 and 0.05 < norm.std() < 0.15
    down = store.get(LAYER0 + "mlp.down_proj.weight")
    assert abs(down.std() * math.sqrt(128) - 1) < 0.1
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    assert 0.5 < np.linalg.norm(down @ x) / math.sqrt(64) < 2


def test_random_weights_refuse_unknown_names_and_bad_seeds():
    with pytest.raises(WeightError) as error:
        RandomWeights(TINY).get("model.layers.9.mlp.up_proj.weight")
    assert_refused(error, "model.layers.9.mlp.up_proj.weight", "random weights")
    for seed in (-1, 1.5, True):
        with pytest.raises(WeightError):
            RandomWeights(TINY, seed=seed)


# -- safetensors round trips ---------------------------------------------------------------------------------


def bfloat16_reference(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bfloat16, one value at a time, the slow obvious way."""
    out = []
    for value in x.reshape(-1).tolist():
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        upper, lower = bits >> 16, bits & 0xFFFF
        if lower > 0x8000 or (lower == 0x8000 and upper & 1):
            upper += 1
        out.append(struct.unpack("<f", struct.pack("<I", upper << 16))[0])
    return np.array(out, dtype=np.float32).reshape(x.shape)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_safetensors_round_trip(tmp_path, dtype, shards):
    source = RandomWeights(TINY, seed=1)
    folder = tiny_folder(tmp_path, dtype=dtype, shards=shards)
    store = SafetensorsStore(folder)
    assert store.spec == TINY
    assert store.names() == source.names()
    assert (folder / "model.safetensors.index.json").exists() == (shards > 1)
    assert len(list(folder.glob("*.safetensors"))) == shards
    for name in source.names():
        want = source.get(name)
        if dtype == "float16":
            want = want.astype(np.float16).astype(np.float32)
        elif dtype == "bfloat16" and name.endswith("norm.weight"):
            want = bfloat16_reference(want)
        elif dtype == "bfloat16":
            want = want.astype(np.float32)
            assert np.all(np.abs(store.get(name) - want) <= np.abs(want) * 2.0**-8), name
            continue
        np.testing.assert_array_equal(store.get(name), want, err_msg=name)
        assert store.shape(name) == want.shape
    got = store.get("model.norm.weight")
    assert got.dtype == np.float32 and not got.flags.writeable and store.get("model.norm.weight") is got
    store.close()
    assert open_model(folder).spec == TINY


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_safetensors_library_reads_what_save_model_writes(tmp_path, dtype):
    folder = tiny_folder(tmp_path, dtype=dtype)
    store = SafetensorsStore(folder)
    with safe_open(str(folder / "model.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == store.names()
        for name in f.keys():
            np.testing.assert_array_equal(f.get_tensor(name).astype(np.float32), store.get(name))


def test_rope_scaling_survives_config_json(tmp_path):
    spec = dataclasses.replace(TINY, rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), tie_embeddings=True)
    save_model(RandomWeights(spec), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rope_scaling"]["rope_type"] == "llama3"
    store = SafetensorsStore(tmp_path)
    assert store.spec == spec and "lm_head.weight" not in store.names()


def test_array_store_saves_arrays_and_checks_them(tmp_path):
    arrays = {n: np.full(shape, 0.5, np.float32) for n, shape in expected_weights(TINY).items()}
    save_model(ArrayStore(TINY, arrays), tmp_path, dtype="bfloat16")
    np.testing.assert_array_equal(SafetensorsStore(tmp_path).get("lm_head.weight"), arrays["lm_head.weight"])
    del arrays["model.norm.weight"]
    with pytest.raises(WeightError) as error:
        ArrayStore(TINY, arrays)
    assert_refused(error, "model.norm.weight", "missing")


def test_save_model_refuses_bad_arguments(tmp_path):
    with pytest.raises(WeightError):
        save_model(RandomWeights(TINY), tmp_path, dtype="int8")
    with pytest.raises(WeightError):
        save_model(RandomWeights(TINY), tmp_path, shards=0)


# -- safetensors: refusing bad files -------------------------------------------------------------------------


def test_missing_tensor_is_named(tmp_path):
    folder = tiny_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model.layers.2.input_layernorm.weight", "missing", str(folder))


def test_wrong_shape_is_named(tmp_path):
    folder = tiny_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model.layers.0.mlp.gate_proj.weight", "[128, 64]", "[96, 64]", "model.safetensors")


def test_get_of_absent_tensor_names_it(tmp_path):
    store = SafetensorsStore(tiny_folder(tmp_path))
    with pytest.raises(WeightError) as error:
        store.get("model.layers.7.mlp.up_proj.weight")
    assert_refused(error, "model.layers.7.mlp.up_proj.weight", str(tmp_path))


@pytest.mark.parametrize("keep", ["half", 7, 0, 8])
def test_truncated_file_is_refused(tmp_path, keep):
    folder = tiny_folder(tmp_path)
    file = folder / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2 if keep == "half" else keep])
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, str(file), "truncated")


def test_every_truncation_is_a_weight_error(tmp_path):
    folder = tiny_folder(tmp_path)
    file = folder / "model.safetensors"
    data = file.read_bytes()
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    for cut in [*range(0, header_end + 16, 37), len(data) - 1]:
        file.write_bytes(data[:cut])
        with pytest.raises(WeightError):
            SafetensorsStore(folder)


def test_corrupt_header_json_is_refused(tmp_path):
    folder = tiny_folder(tmp_path)
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:12] = b"{{{{"
    file.write_bytes(bytes(data))
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, str(file), "JSON")


def test_absurd_shape_is_refused_before_any_allocation(tmp_path):
    save_model(RandomWeights(TINY), tmp_path)
    big = {"lm_head.weight": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}
    write_raw_safetensors(tmp_path / "model.safetensors", big, b"\0\0\0\0")
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(WeightError) as error:
            SafetensorsStore(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0
    assert peak < 1_000_000
    assert_refused(error, "lm_head.weight", "[1099511627776, 1099511627776]", "model.safetensors")


def test_absurd_header_length_is_refused(tmp_path):
    save_model(RandomWeights(TINY), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(WeightError) as error:
        SafetensorsStore(tmp_path)
    assert_refused(error, "header", "truncated")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 64]}, ["outside the file"]),
        ({"dtype": "F32", "shape": [2], "data_offsets": [4, 0]}, ["outside the file"]),
        ({"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}, ["non-negative"]),
        ({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}, ["non-negative"]),
        ({"dtype": "F32", "shape": [2]}, ["data_offsets"]),
        ({"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}, ["unknown dtype"]),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, ["needs 12 bytes"]),
        ("nonsense", ["must be an object"]),
    ],
)
def test_bad_header_entries_are_refused(tmp_path, entry, words):
    save_model(RandomWeights(TINY), tmp_path)
    write_raw_safetensors(tmp_path / "model.safetensors", {"model.norm.weight": entry}, bytes(8))
    with pytest.raises(WeightError) as error:
        SafetensorsStore(tmp_path)
    assert_refused(error, "model.norm.weight", "model.safetensors", *words)


def test_overlapping_tensors_are_refused(tmp_path):
    save_model(RandomWeights(TINY), tmp_path)
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    write_raw_safetensors(tmp_path / "model.safetensors", header, bytes(12))
    with pytest.raises(WeightError) as error:
        SafetensorsStore(tmp_path)
    assert_refused(error, "overlaps")


def test_integer_weights_are_refused_by_name(tmp_path):
    folder = tiny_folder(tmp_path)
    file = folder / "model.safetensors"
    data = file.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    header["model.norm.weight"]["dtype"] = "I32"
    write_raw_safetensors(file, header, data[8 + n :])
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model.norm.weight", "I32")


def test_nan_weights_are_refused_by_name(tmp_path):
    folder = tiny_folder(tmp_path)
    file = folder / "model.safetensors"
    data = bytearray(file.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    begin = 8 + n + json.loads(data[8 : 8 + n])["model.norm.weight"]["data_offsets"][0]
    data[begin : begin + 4] = struct.pack("<f", float("nan"))
    file.write_bytes(bytes(data))
    store = SafetensorsStore(folder)
    with pytest.raises(WeightError) as error:
        store.get("model.norm.weight")
    assert_refused(error, "model.norm.weight", "NaN")


def test_no_weights_at_all(tmp_path):
    save_model(RandomWeights(TINY), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(WeightError) as error:
        SafetensorsStore(tmp_path)
    assert_refused(error, "model.safetensors")


# -- safetensors: shard names must stay inside the folder ----------------------------------------------------


def rewrite_index(folder: Path, first_file: str) -> None:
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    old = index["weight_map"]["model.embed_tokens.weight"]
    index["weight_map"] = {k: (first_file if v == old else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))


def test_shard_path_with_dotdot_is_refused(tmp_path):
    folder = tiny_folder(tmp_path, shards=2)
    (tmp_path / "x.safetensors").write_bytes((folder / "model-00001-of-00002.safetensors").read_bytes())
    rewrite_index(folder, "../x.safetensors")
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "../x.safetensors", "leaves the model folder")


def test_absolute_shard_path_is_refused(tmp_path):
    folder = tiny_folder(tmp_path, shards=2)
    target = folder / "model-00001-of-00002.safetensors"
    rewrite_index(folder, str(target.resolve()))
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, str(target.resolve()), "not a plain relative path")


def test_symlink_leaving_the_folder_is_refused(tmp_path):
    folder = tiny_folder(tmp_path, shards=2)
    shard = folder / "model-00001-of-00002.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    shard.rename(outside)
    os.symlink(outside, shard)
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model-00001-of-00002.safetensors", "outside the model folder")


def test_symlink_inside_the_folder_is_accepted(tmp_path):
    folder = tiny_folder(tmp_path, shards=2)
    shard = folder / "model-00001-of-00002.safetensors"
    (folder / "blobs").mkdir()
    shard.rename(folder / "blobs" / "one")
    os.symlink(folder / "blobs" / "one", shard)
    assert SafetensorsStore(folder).spec == TINY


def test_index_naming_a_missing_shard_or_tensor_is_refused(tmp_path):
    folder = tiny_folder(tmp_path, shards=2)
    rewrite_index(folder, "model-00009-of-00002.safetensors")
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model-00009-of-00002.safetensors", "no such file")
    folder = tiny_folder(tmp_path / "b", shards=2)
    rewrite_index(folder, "model-00002-of-00002.safetensors")
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model-00002-of-00002.safetensors", "tensor 'lm_head.weight' is listed", "lacks it")


@pytest.mark.parametrize("text", ["[]", '{"weight_map": []}', '{"weight_map": {"a": 3}}', "{"])
def test_malformed_index_is_refused(tmp_path, text):
    folder = tiny_folder(tmp_path, shards=2)
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(WeightError) as error:
        SafetensorsStore(folder)
    assert_refused(error, "model.safetensors.index.json")


# -- GGUF ----------------------------------------------------------------------------------------------------

# The size of one quantization step of a block; no value is off by more than that (Q4_0's scale comes from the
# signed extreme, so the far end of its range can be clipped by nearly one step), plus float16 rounding of
# scales.
STEP = {
    QT.Q8_0: lambda b: np.abs(b).max() / 127,
    QT.Q4_0: lambda b: np.abs(b).max() / 8,
    QT.Q4_1: lambda b: (b.max() - b.min()) / 15,
}


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_gguf_round_trip(tmp_path, qtype):
    source = RandomWeights(TINY, seed=2)
    store = GGUFStore(write_gguf(tmp_path / "tiny.gguf", source, qtype))
    assert store.spec == TINY
    assert store.names() == source.names()
    for name in source.names():
        want, got = source.get(name), store.get(name)
        assert got.shape == want.shape and got.dtype == np.float32 and not got.flags.writeable, name
        if want.ndim == 1 or qtype == QT.F32:
            np.testing.assert_array_equal(got, want, err_msg=name)
        elif qtype in (QT.F16, QT.BF16):
            np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=1e-6, err_msg=name)
        else:
            blocks_w, blocks_g = want.reshape(-1, 32), got.reshape(-1, 32)
            for w, g in zip(blocks_w, blocks_g, strict=True):
                assert np.abs(w - g).max() <= STEP[qtype](w) + np.abs(w).max() * 2e-3, name
    assert store.get(LAYER0 + "self_attn.q_proj.weight") is store.get(LAYER0 + "self_attn.q_proj.weight")
    assert open_model(tmp_path / "tiny.gguf").spec == TINY


def test_gguf_matches_gguf_reader(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", RandomWeights(TINY), QT.Q4_1)
    mine, theirs = GGUFFile(path), gguf.GGUFReader(path)
    assert mine.metadata["llama.block_count"] == theirs.fields["llama.block_count"].contents()
    assert mine.metadata["general.architecture"] == "llama"
    assert sorted(mine.tensors) == sorted(t.name for t in theirs.tensors)
    for t in theirs.tensors:
        ours = mine.tensors[t.name]
        assert ours.type == t.tensor_type and ours.nbytes == t.n_bytes
        assert ours.start == t.data_offset
        assert ours.shape == tuple(reversed([int(d) for d in t.shape]))


def one_block(kind: QT, seed: int = 5) -> tuple[np.ndarray, bytes, np.ndarray]:
    """32 values, their quantized block bytes, and what a GGUF of them reads back as."""
    values = np.random.default_rng(seed).standard_normal((1, 32)).astype(np.float32) * 3 + 0.5
    raw = gguf.quants.quantize(values, kind)
    return values[0], raw.tobytes(), raw


def decode_block_by_hand(kind: QT, data: bytes) -> list[float]:
    """ggml's block formats written out plainly: a float16 scale d (and for Q4_1 a float16 minimum m), then 32
    8-bit (Q8_0) or 16 bytes of 4-bit codes, low nibbles giving values 0-15, high nibbles values 16-31."""
    d = struct.unpack("<e", data[:2])[0]
    if kind == QT.Q8_0:
        return [d * q for q in struct.unpack("<32b", data[2:34])]
    m, codes = (struct.unpack("<e", data[2:4])[0], data[4:20]) if kind == QT.Q4_1 else (0.0, data[2:18])
    nibbles = [b & 0xF for b in codes] + [b >> 4 for b in codes]
    if kind == QT.Q4_0:
        return [d * (q - 8) for q in nibbles]
    return [d * q + m for q in nibbles]


@pytest.mark.parametrize("kind", [QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_dequantization_matches_hand_written_block_decoding(tmp_path, kind):
    values, data, raw = one_block(kind)
    assert len(data) == gguf.GGML_QUANT_SIZES[kind][1]

    def extra(w):
        w.add_tensor("probe.weight", raw, raw_dtype=kind)

    path = write_gguf(tmp_path / "probe.gguf", RandomWeights(TINY), extra=extra)
    got = GGUFFile(path).read("probe.weight")
    assert got.shape == (1, 32)
    np.testing.assert_allclose(got[0], decode_block_by_hand(kind, data), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], values, atol=STEP[kind](values) + 1e-2)


def test_gguf_name_mapping():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.12.attn_norm.weight") == "model.layers.12.input_layernorm.weight"
    assert hf_tensor_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    for hf in expected_weights(TINY):
        assert hf_tensor_name(gguf_name(hf)) == hf
        assert gguf_tensor_name(hf) == gguf_name(hf)
    assert gguf_tensor_name("model.layers.0.self_attn.rotary.weight") is None
    for other in (
        "rope_freqs.weight",
        "blk.01.attn_q.weight",
        "blk.0.attn_norm.scale",
    ):
        assert hf_tensor_name(other) is None
    # a Mixtral's experts, stacked in the file as the program reads them (test_experts reads such a file)
    assert hf_tensor_name("blk.0.ffn_gate_exps.weight") == "model.layers.0.mlp.experts.gate_proj.weight"
    assert hf_tensor_name("blk.0.ffn_gate_exps.weight", "qwen2") is None
    assert hf_tensor_name("blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"  # a projection's bias
    assert gguf_tensor_name("model.layers.2.mlp.down_proj.bias") == "blk.2.ffn_down.bias"


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5))
def test_unpermute_inverts_llama_cpp_permute(n_head, half, columns):
    w = np.arange(n_head * 2 * half * columns, dtype=np.float32).reshape(n_head * 2 * half, columns)
    assert not np.array_equal(permute_qk(w, n_head), w) or half == 1
    np.testing.assert_array_equal(unpermute_qk(permute_qk(w, n_head), n_head), w)
    np.testing.assert_array_equal(permute_qk(unpermute_qk(w, n_head), n_head), w)


def test_permute_turns_rotate_half_rope_into_interleaved_rope():
    """What the permutation is for: llama.cpp rotates adjacent pairs (2i, 2i+1) of each head, Hugging Face
    rotates (i, i + head_dim/2); the same rotary embedding must come out of both layouts."""
    heads, head_dim, hidden, pos, theta = 3, 8, 5, 7, 10000.0
    rng = np.random.default_rng(0)
    w_hf, x = rng.standard_normal((heads * head_dim, hidden)), rng.standard_normal(hidden)
    angle = pos * theta ** (-np.arange(0, head_dim, 2) / head_dim)
    cos, sin = np.cos(angle), np.sin(angle)

    q = (w_hf @ x).reshape(heads, head_dim)
    a, b = q[:, : head_dim // 2], q[:, head_dim // 2 :]
    hf = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=1)

    g = (permute_qk(w_hf, heads) @ x).reshape(heads, head_dim // 2, 2)
    a, b = g[..., 0], g[..., 1]
    cpp = np.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(heads * head_dim, 1)
    np.testing.assert_allclose(unpermute_qk(cpp, heads).reshape(heads, head_dim), hf, atol=1e-12)


def test_gguf_without_output_weight_ties_embeddings(tmp_path):
    spec = dataclasses.replace(TINY, tie_embeddings=True)
    store = GGUFStore(write_gguf(tmp_path / "tied.gguf", RandomWeights(spec)))
    assert store.spec.tie_embeddings and "lm_head.weight" not in store.names()


def test_gguf_rope_freqs_give_llama3_scaling(tmp_path):
    scaling = RopeScaling(32.0, 1.0, 4.0, 8192)
    divisors = llama3_rope_divisors(scaling, TINY.head_dim, TINY.rope_theta).astype(np.float32)

    def extra(w):
        w.add_tensor("rope_freqs.weight", divisors)

    store = GGUFStore(write_gguf(tmp_path / "l3.gguf", RandomWeights(TINY), extra=extra))
    assert store.spec.rope_scaling == scaling

    def odd(w):
        w.add_tensor("rope_freqs.weight", divisors[::-1].copy())

    with pytest.raises(SpecError) as error:
        GGUFStore(write_gguf(tmp_path / "odd.gguf", RandomWeights(TINY), extra=odd))
    assert_refused(error, "rope_freqs.weight", "odd.gguf")


def test_gguf_of_other_architecture_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as error:
        GGUFStore(write_gguf(tmp_path / "g.gguf", RandomWeights(TINY), arch="falcon"))
    assert_refused(error, "falcon", "g.gguf")


def test_a_qwen2_gguf_gives_transformers_tokens_and_one_without_its_biases_is_refused(tmp_path: Path) -> None:
    """llama.cpp's qwen2: keys under `qwen2.`, Q and K rows as Hugging Face stores them (its rotary is "neox", so
    convert_hf_to_gguf.py does not permute them), query, key and value biases required."""
    import json

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    families = Path(__file__).parent / "families"
    run = json.loads((families / "goldens.json").read_text())["families"]["qwen2"]["runs"][0]
    folder = open_model(str(families / "qwen2"))
    store = open_model(str(write_gguf(tmp_path / "qwen2.gguf", folder, QT.F32, arch="qwen2", permute=False)))
    assert store.spec == folder.spec
    lane = backends()["reference"].generator()(RunRequest(store))
    assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]
    with pytest.raises(WeightError, match="tensor 'blk.0.attn_q.bias' is missing: a 'qwen2' model's query, key"):
        open_model(str(write_gguf(tmp_path / "plain.gguf", RandomWeights(TINY), QT.F32, arch="qwen2")))


def test_a_qwen3_gguf_gives_transformers_tokens_with_its_head_norms(tmp_path: Path) -> None:
    """llama.cpp's qwen3: keys under `qwen3.`, Q and K rows unpermuted (its rotary is "neox"), and the norm of each
    head of the query and key as `blk.N.attn_q_norm.weight` and `attn_k_norm`; a file without them is refused."""
    import json

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    families = Path(__file__).parent / "families"
    run = json.loads((families / "goldens.json").read_text())["families"]["qwen3"]["runs"][0]
    folder = open_model(str(families / "qwen3"))
    store = open_model(str(write_gguf(tmp_path / "qwen3.gguf", folder, QT.F32, arch="qwen3", permute=False)))
    assert store.spec == folder.spec and store.spec.head_norms
    lane = backends()["reference"].generator()(RunRequest(store))
    assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]
    with pytest.raises(WeightError, match=r"tensor .model.layers.0.self_attn.q_norm.weight. is missing"):
        open_model(str(write_gguf(tmp_path / "plain.gguf", RandomWeights(TINY), QT.F32, arch="qwen3")))


def test_gguf_missing_tensor_and_wrong_shape_are_named(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", RandomWeights(TINY), skip=(LAYER0 + "mlp.up_proj.weight",))
    with pytest.raises(WeightError) as error:
        GGUFStore(path)
    assert_refused(error, LAYER0 + "mlp.up_proj.weight", "missing", "m.gguf")

    def extra(w):
        w.add_tensor("blk.1.ffn_up.weight", np.zeros((64, 128), np.float32))

    skip = ("model.layers.1.mlp.up_proj.weight",)
    with pytest.raises(WeightError) as error:
        GGUFStore(write_gguf(tmp_path / "s.gguf", RandomWeights(TINY), skip=skip, extra=extra))
    assert_refused(error, "model.layers.1.mlp.up_proj.weight", "[64, 128]", "[128, 64]")


def test_unsupported_quant_type_is_named(tmp_path):
    spec = dataclasses.replace(TINY, intermediate=256)
    down = LAYER0 + "mlp.down_proj.weight"

    def extra(w):  # an IQ4_XS block (an importance-matrix type) is 136 bytes for 256 values; zeros are valid
        w.add_tensor("blk.0.ffn_down.weight", np.zeros((64, 136), np.uint8), raw_dtype=QT.IQ4_XS)

    path = write_gguf(tmp_path / "k.gguf", RandomWeights(spec), skip=(down,), extra=extra)
    with pytest.raises(WeightError) as error:
        GGUFStore(path)
    assert_refused(error, "blk.0.ffn_down.weight", "IQ4_XS", "k.gguf")
    with pytest.raises(WeightError) as error:
        GGUFFile(path).read("blk.0.ffn_down.weight")
    assert_refused(error, "blk.0.ffn_down.weight", "IQ4_XS")


def test_unknown_type_number_is_named(tmp_path):
    path = write_gguf(tmp_path / "u.gguf", RandomWeights(TINY))
    data = bytearray(path.read_bytes())
    name = b"output_norm.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    rank = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * rank, 200)
    path.write_bytes(bytes(data))
    with pytest.raises(WeightError) as error:
        GGUFStore(path)
    assert_refused(error, "output_norm.weight", "type number 200")


@pytest.mark.parametrize("keep", ["half", "all but one", 100, 23, 0])
def test_truncated_gguf_is_refused(tmp_path, keep):
    path = write_gguf(tmp_path / "t.gguf", RandomWeights(TINY))
    data = path.read_bytes()
    cut = {"half": len(data) // 2, "all but one": len(data) - 1}.get(keep, keep)
    path.write_bytes(data[:cut])
    with pytest.raises(WeightError) as error:
        GGUFStore(path)
    assert_refused(error, "t.gguf")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "n.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(WeightError) as error:
        GGUFStore(path)
    assert_refused(error, "not a GGUF file")
    with pytest.raises(WeightError):
        GGUFStore(tmp_path / "absent.gguf")


def test_corrupt_gguf_bytes_never_escape_as_raw_exceptions(tmp_path):
    path = write_gguf(tmp_path / "c.gguf", RandomWeights(TINY))
    data = path.read_bytes()
    table_end = data.index(b"output_norm.weight") + 64  # metadata and the tensor table lie before this
    rng = np.random.default_rng(0)
    for _ in range(150):
        corrupt = bytearray(data)
        for at in rng.integers(4, table_end, size=3):
            corrupt[at] = int(rng.integers(0, 256))
        path.write_bytes(bytes(corrupt))
        try:
            GGUFStore(path).get("model.norm.weight")
        except LogosError:
            pass


# -- opening models ------------------------------------------------------------------------------------------


def test_open_model_dispatch(tmp_path):
    assert isinstance(open_model("tiny", seed=2), RandomWeights) and open_model("tiny", seed=2).seed == 2
    assert isinstance(open_model(tiny_folder(tmp_path)), SafetensorsStore)
    with pytest.raises(WeightError) as error:
        open_model("no-such-model")
    assert "tiny" in (error.value.hint or "")
    with pytest.raises(WeightError):
        open_model(tmp_path / "absent.gguf")


# -- the embedded model --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded() -> GGUFStore:
    return open_model("embedded")


def test_embedded_model_opens_quickly_with_the_right_spec(embedded):
    start = time.perf_counter()
    store = open_model(None)
    assert time.perf_counter() - start < 2.0
    assert store.source == str(embedded_model_path())
    assert store.spec == ModelSpec.preset("smollm2-135m")
    assert len(store.names()) == 272
    assert store.file.tensors["token_embd.weight"].type == QT.Q8_0
    assert store.file.tensors["blk.0.attn_q.weight"].type == QT.Q4_1
    store.close()


def test_embedded_weights_read_back(embedded):
    embed = embedded.get("model.embed_tokens.weight")
    assert embed.shape == (49152, 576) and np.isfinite(embed).all()
    q = embedded.get(LAYER0 + "self_attn.q_proj.weight")
    k = embedded.get(LAYER0 + "self_attn.k_proj.weight")
    assert q.shape == (576, 576) and k.shape == (192, 576) and not q.flags.writeable
    norm = embedded.get(LAYER0 + "input_layernorm.weight")
    assert norm.shape == (576,) and 0.01 < np.abs(norm).mean() < 10


def greedy_next(store, ids: list[int]) -> int:
    """One greedy step of a plain numpy Llama (Hugging Face conventions: rotate-half RoPE)."""
    spec, get = store.spec, store.get
    x = get("model.embed_tokens.weight")[ids]
    t, d = len(ids), spec.head_dim

    def norm(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + spec.rms_eps) * w

    angle = np.outer(np.arange(t), spec.rope_theta ** (-np.arange(0, d, 2) / d))
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]

    def rope(v):
        a, b = v[..., : d // 2], v[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    mask = np.triu(np.full((t, t), -np.inf), 1)
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        h = norm(x, get(p + "input_layernorm.weight"))
        q = rope((h @ get(p + "self_attn.q_proj.weight").T).reshape(t, spec.heads, d))
        k = rope((h @ get(p + "self_attn.k_proj.weight").T).reshape(t, spec.kv_heads, d))
        v = (h @ get(p + "self_attn.v_proj.weight").T).reshape(t, spec.kv_heads, d)
        k, v = (np.repeat(a, spec.heads // spec.kv_heads, axis=1) for a in (k, v))
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(d) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hts,shd->thd", s / s.sum(-1, keepdims=True), v).reshape(t, -1)
        x = x + o @ get(p + "self_attn.o_proj.weight").T
        h = norm(x, get(p + "post_attention_layernorm.weight"))
        gate, up = h @ get(p + "mlp.gate_proj.weight").T, h @ get(p + "mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ get(p + "mlp.down_proj.weight").T
    return int(np.argmax(norm(x[-1], get("model.norm.weight")) @ get("model.embed_tokens.weight").T))


def test_embedded_model_knows_the_capital_of_france(embedded):
    """End to end through dequantization, renaming and Q/K unpermutation: the model's greedy answer."""
    from logos_ir.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_store(embedded)
    ids = tokenizer.encode("The capital of France is")
    assert tokenizer.decode([greedy_next(embedded, ids)]) == " Paris"


def test_a_llama_gguf_with_biases_gives_transformers_tokens(tmp_path: Path) -> None:
    """llama.cpp's llama applies `blk.N.attn_q.bias` and the other projections' biases where a file holds them: the
    tiny Llama with every projection's bias (tools/family_goldens.py), written as convert_hf_to_gguf.py writes it
    (Q and K rows and biases permuted), gives transformers' greedy tokens on the reference."""
    import json

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    families = Path(__file__).parent / "families"
    run = json.loads((families / "goldens.json").read_text())["families"]["llama-biases"]["runs"][0]
    folder = open_model(str(families / "llama-biases"))
    store = open_model(str(write_gguf(tmp_path / "biases.gguf", folder, QT.F32)))
    assert store.spec == folder.spec and "down" in store.spec.biases
    lane = backends()["reference"].generator()(RunRequest(store))
    assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]
