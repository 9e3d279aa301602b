"""Weights as stored on the D5005 engine: Q8_0, Q4_0 and Q4_1 matrices stream from the banks as their blocks and
the datapath dequantizes them (docs/d5005.md, "Weights as stored").

The image is checked against the file's own blocks by undoing the layout here, written from the layout's
description (groups of 32 blocks: a word of scales, Q4_1 a word of minimums, then the codes); the engine on PoCL
gives the reference's greedy tokens on the same file (f32 activations, the reference dequantizing as gguf-py
does); and the cost model counts, for the 8B at q4_0, the bytes the layout places (rows times stride), which are
the stored bytes of its matrices by `quant.BlockFormat.stored_bytes`, and rises with them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from logos_ir import quant, testing
from logos_ir.dialects import d5005
from logos_ir.generate import Generator
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights, open_model
from logos_ir.weights.store import QuantizedWeights

needs_opencl = pytest.mark.usefixtures("opencl_device")
FORMATS = ("q8_0", "q4_0", "q4_1")


def _artifacts(store, ctx: int, weights: str = "f32", with_weights: bool = True) -> dict:  # noqa: ANN001
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.progress import Progress
    from logos_ir.registry import compile_targets

    source = ModelSource("preset", str(store.source), store.spec, _store=store)
    request = BuildRequest(source, Cut.decode(ctx), 1, weights, with_weights, Progress.silent())
    build = compile_targets()["d5005"].build()(request)
    return {a.role: a for a in build.artifacts} | {"report": build.report}


def _layout(text: str) -> dict[str, tuple[str, int, int, int, int]]:
    """tensor -> (dtype, rows, cols, offset, stride), as `layout.txt` states them."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, kind, dtype, rows, cols, offset, stride, _ = line.split()
        if kind == "weight":
            found[name] = (dtype, int(rows), int(cols), int(offset), int(stride))
    return found


def _gguf(tmp_path: Path, fmt: str) -> Path:
    path = tmp_path / f"tiny-{fmt}.gguf"
    path.write_bytes(testing.model_gguf(32, fmt.upper()))
    return path


def _file_blocks(rows: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    """The file's blocks [rows, blocks * block bytes] back from a stored region's rows as the image holds them: for
    each group of 32 blocks (two 64-byte words of codes a block at 8 bits, one at 4), the scale word, the minimum
    word (Q4_1), then the codes; each block is its f16 scale, its f16 minimum (Q4_1), its codes."""
    scales = 2 if fmt == "q4_1" else 1
    code_bytes = 32 if fmt == "q8_0" else 16
    out = []
    for row in rows:
        blocks, at = [], 0
        for first in range(0, cols // 32, 32):
            count = min(32, cols // 32 - first)
            halves = [row[at + 64 * s : at + 64 * s + 2 * count] for s in range(scales)]
            at += 64 * scales
            codes = row[at : at + count * code_bytes]
            at += 64 * -(-(count * code_bytes) // 64)
            for j in range(count):
                blocks += [h[2 * j : 2 * j + 2] for h in halves] + [codes[j * code_bytes : (j + 1) * code_bytes]]
        out.append(np.concatenate(blocks))
    return np.array(out)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_image_holds_the_files_blocks(tmp_path: Path, fmt: str) -> None:
    """Every matrix of the file is placed as stored (the layout says its format) and the image's bytes of it,
    un-striped from the banks and un-grouped, are the file's blocks byte for byte; a row over a group (1088
    numbers: a whole group and two blocks) included."""
    store = open_model(_gguf(tmp_path, fmt))
    built = _artifacts(store, 16)
    layout = _layout(built["layout"].data.decode())
    image = np.frombuffer(built["weights"].data, dtype=np.uint8)[d5005.HEADER_BYTES :]
    size = len(image) // d5005.BANKS
    banks = image.reshape(d5005.BANKS, size)
    stored = {name: entry for name, entry in layout.items() if entry[0] != "f32"}
    assert set(stored) == {name for name, f in store.spec.storage}
    for name, (dtype, rows, cols, offset, stride) in stored.items():
        assert dtype == fmt
        laid = np.array(
            [banks[r % 4, offset + (r // 4) * stride : offset + (r // 4 + 1) * stride] for r in range(rows)]
        )
        np.testing.assert_array_equal(_file_blocks(laid, fmt, cols), np.asarray(store.blocks(name)).reshape(rows, -1))
    grouped = QuantizedWeights(RandomWeights(_wide(), seed=3), fmt)
    built = _artifacts(grouped, 16)
    name = "model.layers.0.mlp.down_proj.weight"
    dtype, rows, cols, offset, stride = _layout(built["layout"].data.decode())[name]
    banks = np.frombuffer(built["weights"].data, dtype=np.uint8)[d5005.HEADER_BYTES :].reshape(d5005.BANKS, -1)
    laid = np.array([banks[r % 4, offset + (r // 4) * stride : offset + (r // 4 + 1) * stride] for r in range(rows)])
    assert (dtype, cols) == (fmt, 1088)
    np.testing.assert_array_equal(_file_blocks(laid, fmt, cols), np.asarray(grouped.blocks(name)).reshape(rows, -1))


def _wide() -> ModelSpec:
    """A model whose down projection's rows cross a group (1088 numbers), with a tied head."""
    return ModelSpec(
        vocab=96, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=1088,
        rms_eps=1e-5, rope_theta=10000.0, tie_embeddings=True,
    )  # fmt: skip


@needs_opencl
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tiny_gguf_as_stored_gives_the_reference_tokens(tmp_path: Path, fmt: str) -> None:
    """The engine streams the file's blocks (the stream's regions say the format) and gives the reference's greedy
    tokens on the same file, with the image's floats f32 and bf16 (the norms; the stored matrices are the same)."""
    from logos_ir.runtime.d5005 import D5005Generator

    store = open_model(_gguf(tmp_path, fmt))
    prompt = [5, 1, 3, 6]
    expected = Generator(store, prefill_rows=4).generate(prompt, 12)
    for weights in ("f32", "bf16"):
        engine = D5005Generator(store, weights=weights)
        assert engine.generate(prompt, 12) == expected, weights
        regions = engine.engine(64).stream.symbols["regions"]
        assert {r[0] for r in regions if r[-1] == fmt} == {name for name, _ in store.spec.storage}


@needs_opencl
@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_over_a_group_and_a_tied_head_give_the_reference_tokens(fmt: str) -> None:
    """Rows of a whole group and a part (the down projection), an embedding row read as stored and the tied head
    streaming the same stored table: the reference's tokens and, at each step, its logits."""
    from logos_ir.runtime.d5005 import D5005Generator

    store = QuantizedWeights(RandomWeights(_wide(), seed=3), fmt)
    prompt = [5, 17, 3, 60, 2]
    assert D5005Generator(store, weights="f32").generate(prompt, 12) == Generator(store).generate(prompt, 12)
    reference = Generator(store, ctx=64).program(Cut.decode(64))
    names = {kind: name for name, kind in reference.inputs.items()}
    machine = D5005Generator(store, ctx=64, weights="f32")._machine_for(64)
    machine.reset()
    for position, token in enumerate([5, 6, 7], start=1):
        machine.step(token, position)
        want = reference.run(**{names["token"]: np.array([token]), names["position"]: np.array([position])})
        assert int(want[0]) == int(np.argmax(machine.logits)) + 1
        np.testing.assert_allclose(machine.logits, reference.logits, rtol=1e-4, atol=1e-4)


@needs_opencl
def test_the_minimums_and_the_scales_are_read() -> None:
    """The same Q4_1 stream with its minimum words zeroed in the image (or the scales' words) gives other logits:
    the datapath adds each block's minimum and multiplies by its scale."""
    from logos_ir.runtime.d5005 import Engine

    store = QuantizedWeights(RandomWeights(_wide(), seed=3), "q4_1")
    built = _artifacts(store, 16)
    layout = _layout(built["layout"].data.decode())
    name = "model.layers.0.self_attn.o_proj.weight"  # 64 numbers a row: two blocks, one group
    _, rows, _, offset, stride = layout[name]
    logits = []
    for word in (None, 0, 1):  # none zeroed, the scale word, the minimum word
        image = bytearray(built["weights"].data)
        size = (len(image) - d5005.HEADER_BYTES) // d5005.BANKS
        for r in range(rows if word is not None else 0):
            at = d5005.HEADER_BYTES + (r % 4) * size + offset + (r // 4) * stride + 64 * word
            image[at : at + 64] = bytes(64)
        engine = Engine(built["engine"].data.decode(), built["instructions"].data, bytes(image))
        engine.reset()
        engine.step(5, 1)
        logits.append(engine.logits.copy())
    assert not np.allclose(logits[0], logits[1]) and not np.allclose(logits[0], logits[2])


@needs_opencl
def test_an_engine_without_stored_weights_refuses_the_stream() -> None:
    from logos_ir.passes.d5005.emit_opencl import engine_source
    from logos_ir.runtime.d5005 import Engine, StreamError

    store = QuantizedWeights(RandomWeights(_wide(), seed=3), "q8_0")
    built = _artifacts(store, 16)
    plain = engine_source("", d5005.EngineParams(weights="f32"))
    with pytest.raises(StreamError, match="streams q8_0 weights as stored, and this engine has no ENGINE_STORED"):
        Engine(plain, built["instructions"].data, built["weights"].data)


def test_the_stream_refuses_an_unknown_format() -> None:
    """A matvec word whose format field names no format the engine reads is refused before anything runs."""
    import zlib

    from logos_ir.runtime.d5005 import StreamError, read_stream

    store = QuantizedWeights(RandomWeights(_wide(), seed=3), "q4_0")
    data = bytearray(_artifacts(store, 16, with_weights=False)["instructions"].data)
    count = int.from_bytes(data[16:20], "little")  # the header's third field
    words = np.frombuffer(bytes(data[d5005.HEADER_BYTES : d5005.HEADER_BYTES + 64 * count]), "<u4").reshape(count, 16)
    matvec = int(np.flatnonzero(words[:, 0] == d5005.OPCODES["d5005.matvec"])[0])
    at = d5005.HEADER_BYTES + 64 * matvec + 4 * d5005.W_FORMAT
    data[at : at + 4] = (7).to_bytes(4, "little")
    crc = zlib.crc32(bytes(data[d5005.HEADER_BYTES : d5005.HEADER_BYTES + 64 * count]))
    data[56:60] = crc.to_bytes(4, "little")  # the words' CRC-32, the header's 13th field
    with pytest.raises(StreamError, match="has weight format 7 in word 3"):
        read_stream(bytes(data))


def test_a_q4_0_build_reads_its_stored_bytes_and_is_faster_than_bf16() -> None:
    """The 8B at ctx 8192, code only: the cost model's weight bytes a step are the bytes the layout places for what
    the step reads (each matrix's rows times its stride, a norm's row, one embedding row), the matrices' bytes
    those the format stores them in (`BlockFormat.stored_bytes`: its rows are whole groups, nothing padded), and
    the band rises with them: q4_0's low end is over bf16's high end, and over 2.5 times its low end."""
    spec = ModelSpec.preset("llama-3.1-8b")
    stored = QuantizedWeights(RandomWeights(spec, seed=0), "q4_0")
    q4 = _artifacts(stored, 8192, "bf16", with_weights=False)
    bf16 = _artifacts(RandomWeights(spec, seed=0), 8192, "bf16", with_weights=False)
    layout = _layout(q4["layout"].data.decode())
    listing = q4["listing"].data.decode()
    expected = 0
    for line in listing.splitlines():
        found = re.search(r"\b(embed_row|matvec|rms_norm)\b.* (\S+\.weight) @", line)
        if found:
            _, rows, _, _, stride = layout[found.group(2)]
            expected += stride * (rows if found.group(1) == "matvec" else 1)
    low = q4["report"]["cost_model"]["low"]
    assert low["weight_bytes_per_token"] == expected
    fmt = quant.FORMATS["q4_0"]
    matrices = [name for name, entry in layout.items() if entry[0] == "q4_0"]
    assert len(matrices) == 7 * 32 + 2  # every projection, the embedding and the head
    placed = sum(layout[n][1] * layout[n][4] for n in matrices)
    assert placed == sum(fmt.stored_bytes(stored.shape(n)) for n in matrices)
    q4_band = q4["report"]["cost_model"]["band_tokens_per_s"]
    bf16_band = bf16["report"]["cost_model"]["band_tokens_per_s"]
    assert q4_band[0] > bf16_band[1] and q4_band[0] > 2.5 * bf16_band[0]
    assert not q4["report"]["cost_model"]["arbitrated"]
    assert low["tokens_per_s"] <= low["roofline_tokens_per_s"]
