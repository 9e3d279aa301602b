"""A weight's storage: the project's own dequantizer and quantizer against gguf-py's (the oracle), the LOGOS
sentence of each format, and the storage the embedded model's program says (its identity's)."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from logos_ir import author, quant
from logos_ir.errors import LogosError
from logos_ir.parser import parse_program
from logos_ir.printer import print_program
from logos_ir.program import Cut, Identity
from logos_ir.spec import ModelSpec
from logos_ir.weights import open_model

BLOCKED = [f for f in quant.FORMATS.values() if f.family not in ("float", "channels")]  # GGUF's (fp8: test_fp8)


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bits, every NaN as one pattern (gguf-py and we may make different NaNs)."""
    return np.where(np.isnan(a), np.float32(np.nan), a).view(np.uint32)


@pytest.mark.parametrize("fmt", BLOCKED, ids=lambda f: f.name)
def test_the_dequantizer_gives_gguf_pys_bits_on_random_blocks(fmt: quant.BlockFormat) -> None:
    """Random bytes (any scale, a corrupt one's inf and NaN included) read as gguf-py reads them, bit for bit."""
    rng = np.random.default_rng(sum(map(ord, fmt.name)))
    rows, blocks = 3, 24
    raw = rng.integers(0, 256, (rows, blocks * fmt.block_bytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, QT[fmt.name.upper()]).astype(np.float32)
    got = quant.dequantize(raw, fmt, (rows, blocks * fmt.block))
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _weights(rng: np.random.Generator) -> np.ndarray:
    """Rows of a weight's values with the blocks that test a quantizer's edges: all zero, one value, a tie in
    magnitude of opposite signs, halves to round."""
    x = rng.standard_normal((6, 256)).astype(np.float32) * np.float32(0.02)
    x[0, :32] = 0
    x[1, :32] = 0.5
    x[2, :32] = np.where(np.arange(32) % 2, 1.0, -1.0)
    x[3, :32] = np.arange(32) / np.float32(2)
    x[4] *= 1e4
    return x


# the formats gguf-py quantizes (the K-quants it does not: test_kquants.py checks them against llama.cpp's bytes)
GGUF_PY_QUANTIZES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4")


def test_every_block_format_has_a_quantizer() -> None:
    assert set(quant.QUANTIZERS) == {f.name for f in BLOCKED} | {"fp8"}
    assert set(GGUF_PY_QUANTIZES) <= set(quant.QUANTIZERS)


@pytest.mark.parametrize("name", GGUF_PY_QUANTIZES)
def test_the_quantizer_gives_gguf_pys_bytes(name: str) -> None:
    fmt = quant.FORMATS[name]
    x = _weights(np.random.default_rng(3))
    want = gguf.quants.quantize(x, QT[name.upper()])
    got = quant.quantize(x, fmt)
    np.testing.assert_array_equal(got, want)
    back = quant.dequantize(got, fmt, x.shape)
    # what it stores reads back within a step of its codes of each block's value
    step = np.abs(x).reshape(-1, fmt.block).max(axis=1) / (2 ** (fmt.bits - 1) - 1)
    err = np.abs(back - x).reshape(-1, fmt.block).max(axis=1)
    assert np.all(err <= 2 * step + 1e-6)


def test_a_quantizer_refuses_rows_that_are_not_whole_blocks() -> None:
    with pytest.raises(ValueError, match="not whole blocks of 32"):
        quant.quantize(np.zeros((2, 48), np.float32), quant.FORMATS["q8_0"])


def test_each_format_has_its_own_sentence_and_reads_back_from_it() -> None:
    sentences = {f.name: quant.sentence(f) for f in quant.FORMATS.values()}
    assert len(set(sentences.values())) == len(sentences)
    for name, words in sentences.items():
        assert quant.parse_sentence(words) is quant.FORMATS[name]
    assert sentences["q4_1"] == "4-bit blocks of 32 with a scale and a minimum"
    assert sentences["q6_k"] == "6-bit super-blocks of 256 in sub-blocks of 16 with 8-bit scales"
    assert (
        quant.parse_sentence("3-bit blocks of 32 with a scale")
        == "no storage format is '3-bit blocks of 32 with a scale'"
    )


def test_the_bytes_a_format_stores_are_its_blocks() -> None:
    shape = (576, 1536)
    assert quant.FORMATS["q4_1"].stored_bytes(shape) == 576 * 1536 // 32 * 20
    assert quant.FORMATS["q4_k"].stored_bytes(shape) == 576 * 1536 // 256 * 144
    assert quant.FORMATS["f32"].stored_bytes(shape) == 576 * 1536 * 4


@pytest.fixture(scope="module")
def embedded() -> ModelSpec:
    return open_model(None).spec


def test_the_embedded_models_program_says_how_the_file_stores_each_weight(embedded: ModelSpec) -> None:
    authored = author.write(embedded, Cut.decode_layer(0, 32))
    manifest = {entry.name: entry.dtype for entry in authored.manifest}
    assert manifest["model.layers.0.mlp.down_proj.weight"] == "q4_1"
    assert manifest["model.layers.0.input_layernorm.weight"] == "f32"
    assert 'down_proj.weight" of 576 by 1536, stored in 4-bit blocks of 32 with a scale and a minimum.' in authored.text
    assert 'input_layernorm.weight" of 576.\n' in authored.text
    whole = author.write(embedded, Cut.decode(32))
    assert 'embed_tokens.weight" of 49152 by 576, stored in 8-bit blocks of 32 with a scale.' in whole.text
    # the storage is the program's: the same sizes stored as f32 are another program, of another identity
    plain = author.write(replace(embedded, storage=()), Cut.decode(32))
    assert plain.text != whole.text and Identity.of(Cut.decode(32), plain.text) != Identity.of(
        Cut.decode(32), whole.text
    )
    assert print_program(parse_program(whole.text)) == whole.text


def test_the_gguf_reader_dequantizes_with_the_projects_own_dequantizer(
    embedded: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_model(None)
    name = "model.layers.0.mlp.down_proj.weight"
    gname = "blk.0.ffn_down.weight"
    tensor = store.file.tensors[gname]
    raw = np.frombuffer(store.file._map, np.uint8, count=tensor.nbytes, offset=tensor.start)
    want = gguf.quants.dequantize(raw.reshape(tensor.shape[0], -1), tensor.type)

    def refuse(*_: object) -> None:
        raise AssertionError("gguf-py's dequantizer was called")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    np.testing.assert_array_equal(store.get(name), want)


def test_a_split_by_columns_that_cuts_blocks_is_refused_by_name() -> None:
    spec = ModelSpec.preset("tiny")
    wide = replace(spec, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512)
    output = "model.layers.0.self_attn.o_proj.weight"
    stored = replace(wide, storage=((output, "q4_k"),))
    split = author.write(replace(wide, storage=((output, "q8_0"),)), Cut.decode_layer(0, 32), tp=2)
    assert "split by columns over the chips, stored in 8-bit blocks of 32 with a scale." in split.text
    with pytest.raises(LogosError, match=r"o_proj.weight' splits its q4_k blocks of 256: a chip's 128 columns"):
        author.write(stored, Cut.decode_layer(0, 32), tp=2)


def test_a_preset_stored_by_the_quantizer_reads_back_its_blocks_and_says_them() -> None:
    from logos_ir.models import ModelSource
    from logos_ir.weights.store import RandomWeights

    source = ModelSource.resolve("tiny", storage="q5_1")
    spec, store = source.spec, source.store()
    matrix, norm = "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight"
    assert spec.stored_as(matrix) == "q5_1" and spec.stored_as(norm) is None
    plain = RandomWeights(ModelSpec.preset("tiny"))
    fmt = quant.FORMATS["q5_1"]
    blocks = gguf.quants.quantize(plain.get(matrix), QT.Q5_1)  # gguf-py's quantizer as the oracle
    np.testing.assert_array_equal(store.get(matrix), gguf.quants.dequantize(blocks, QT.Q5_1))
    assert not np.array_equal(store.get(matrix), plain.get(matrix))
    np.testing.assert_array_equal(store.get(norm), plain.get(norm))
    text = author.write(spec, Cut.decode(64)).text
    assert 'down_proj.weight" of 64 by 128, stored in 5-bit blocks of 32 with a scale and a minimum.' in text
    assert source.describe()["storage"] == "q5_1"
    assert fmt.stored_bytes(plain.shape(matrix)) == blocks.nbytes


def test_the_build_says_the_bytes_stored_and_the_bytes_the_lane_reads() -> None:
    from logos_ir.build import BuildRequest, weight_bytes
    from logos_ir.models import ModelSource
    from logos_ir.progress import Progress

    source = ModelSource.resolve(None)
    request = BuildRequest(source, Cut.decode(256), 1, "bf16", False, Progress.silent())
    got = weight_bytes(request)
    file = source.store().file
    read = {n for n in file.tensors if n != "rope_freqs.weight"}
    assert got["stored_bytes"] == sum(file.tensors[n].nbytes for n in read)  # the file's own bytes
    assert got["read_bytes"] == 2 * sum(int(np.prod(file.tensors[n].shape)) for n in read)
    assert got["formats"] == {"q8_0": 1, "q4_1": 210, "f32": 61}


def test_compile_quantizes_only_a_preset(tmp_path) -> None:
    from logos_ir.tools.logos_compile import main

    out = tmp_path / "b"
    assert (
        main(
            ["--model", "embedded", "--target", "logos", "--cut", "decode ctx=64", "--weights", "q8_0", "-o", str(out)]
        )
        != 0
    )
    assert not out.exists()


def test_a_lane_reads_a_weights_blocks_as_the_file_stores_them_in_the_programs_rows() -> None:
    """`blocks` is the file's bytes of a tensor, rows in Hugging Face's order: the embedded GGUF's permuted Q rows
    put back, so its blocks dequantize to `get`; an f32 tensor has none."""
    from logos_ir.errors import WeightError

    store = open_model(None)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        fmt = quant.FORMATS[store.spec.stored_as(name)]
        raw = store.blocks(name)
        assert raw.dtype == np.uint8 and not raw.flags.writeable
        assert raw.shape == (store.shape(name)[0], fmt.stored_bytes((store.shape(name)[1],)))
        np.testing.assert_array_equal(quant.dequantize(raw, fmt, store.shape(name)), store.get(name))
    with pytest.raises(WeightError, match="input_layernorm.weight' is not stored in blocks"):
        store.blocks("model.layers.0.input_layernorm.weight")


def test_a_store_quantized_by_the_project_keeps_its_blocks_once() -> None:
    from logos_ir.models import ModelSource

    store = ModelSource.resolve("tiny", storage="q4_0").store()
    name = "model.layers.0.self_attn.k_proj.weight"
    raw = store.blocks(name)
    assert store.blocks(name) is raw or np.shares_memory(store.blocks(name), raw)
    np.testing.assert_array_equal(quant.dequantize(raw, quant.FORMATS["q4_0"], store.shape(name)), store.get(name))
