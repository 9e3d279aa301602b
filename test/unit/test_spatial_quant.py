"""The wafer reads Q8_0 and Q4_0 matrices as stored (docs/spatial.md, "Weights read as stored"): each element holds
its tile of a layer's matrix as the file's codes (packed in u16 words) and the f16 scale of each block of 32 its
slice of a row touches, and dequantizes each column in the printed element code (`@and16`, `@slr16`, `@xor16`,
`@sub16`, `@xp162fs`, `@fh2s`, `@fmuls`) before its f32 `@fmacs`.

- Tiny GGUF files in Q8_0 and Q4_0 give, on the fabric simulator running the printed module, the reference
  interpreter's greedy tokens on the same file (f32 image: f32 activations everywhere).
- A two-layer model stored by the project's quantizer on a 3 x 3 grid, whose elements' slices of a row cut blocks
  of 32 (two scale slots a column), gives the reference's tokens; the printed dequantization is what runs: a
  removed scale multiply changes the tokens.
- The unpacking is counted in the step's cycles (DSD ops, element by element).
- The arrays each element holds (in the lowering's count and the simulator's memory model) fall, against the f16
  image on the same grid, by the bytes worked out here from the block format and the tile shapes (codes at 8 or 4
  bits rounded up to 16-bit words a column, a 2-byte scale for each (row, block) pair of the worst element, counted
  by enumerating the blocks each element's columns fall in).
- llama-3.1-8b at Q4_0 fits a WSE-2 on fewer elements than its f16 build, and on the f16 build's grid caches 37
  positions an element where the f16 image caches 13.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_spatial_generation import _run as grid_tokens  # the suite's rootdir-relative imports
from xdsl.dialects import csl

from logos_ir import testing
from logos_ir.generate import Generator
from logos_ir.passes.spatial.convert_logos_to_csl import memory_use
from logos_ir.runtime.spatial.generator import SpatialGenerator
from logos_ir.runtime.spatial.host import GridMachine
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights, open_model
from logos_ir.weights.store import QuantizedWeights

PROMPT = [5, 1, 3, 6]
BITS = {"q8_0": 8, "q4_0": 4}


def _gguf(tmp_path: Path, fmt: str) -> Path:
    path = tmp_path / f"tiny-{fmt}.gguf"
    path.write_bytes(testing.model_gguf(32, fmt.upper()))
    return path


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_a_tiny_gguf_read_as_stored_gives_the_reference_tokens(tmp_path: Path, fmt: str) -> None:
    store = open_model(_gguf(tmp_path, fmt))
    expected = Generator(store, prefill_rows=4).generate(PROMPT, 6)
    generator = SpatialGenerator(store, ctx=32, image="f32")
    assert generator.generate(PROMPT, 6) == expected
    host = generator.machine(32).host
    formats = {name: w.get("format") for name, w in host["weights"].items()}
    matrices = ("query", "key", "value", "output", "gate", "up", "down")
    assert {formats[f"{m}_weight"] for m in matrices} == {fmt}
    assert formats["table"] is None and formats["head_table"] is None  # the tables: the image


def _spec() -> ModelSpec:
    return ModelSpec(
        vocab=40, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96,
        rms_eps=1e-5, rope_theta=10000.0, tie_embeddings=False,
    )  # fmt: skip


def _run(module, host, store, steps: int) -> list[int]:  # type: ignore[no-untyped-def]
    return grid_tokens(module, host, store, steps, PROMPT)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_slices_that_cut_blocks_give_the_reference_tokens(fmt: str) -> None:
    """On 3 x 3 the hidden 64 is cut 22, 22, 20: the middle column's slice of a row holds parts of two blocks, so
    each column of the tile keeps two scale slots; two layers (each layer's codes and scales at its offset)."""
    store = QuantizedWeights(RandomWeights(_spec(), seed=5), fmt)
    expected = Generator(store).generate(PROMPT, 5)
    lowered = testing.lower_decode(store.spec, 16, "f32", p=3)
    weights = lowered.host["weights"]
    assert weights["query_weight"]["scale_slots"] == 2 and weights["gate_weight"]["scale_slots"] == 2
    assert _run(lowered.module, lowered.host, store, 5) == expected
    # the printed dequantization is what runs: without the scales' multiply the tokens are others
    program = next(op for op in lowered.module.ops if isinstance(op, csl.CslModuleOp))
    removed = 0
    for op in list(program.walk()):
        block = op.parent_block()
        if isinstance(op, csl.FmulsOp) and block is not None and any(isinstance(o, csl.Xp162fsOp) for o in block.ops):
            op.detach()
            op.erase()
            removed += 1
    assert removed == 7  # a stored product's loop each: q, k, v, o, gate, up, down
    assert _run(lowered.module, lowered.host, store, 5) != expected


def _blocks_touched(sources: np.ndarray) -> int:
    """The most blocks of 32 any element's columns fall in (each element's source columns enumerated)."""
    return max(len({int(s) // 32 for s in chunk if s >= 0}) for chunk in sources)


def _saved_by_tiles(host: dict, fmt: str) -> tuple[int, int, int]:
    """(f16 bytes, stored bytes, longest tile column) of the stored matrices' arrays on an element, worked out from
    the tiles' shapes and the block format: the f16 tile 2 bytes a number; as stored, a column's codes at 8 or 4 bits
    in whole 16-bit words, a 2-byte scale for each row and each block the worst element's columns touch (enumerated
    from the column order), a 4-byte slot index a column."""
    width, height = host["grid"]
    f16 = stored = longest = 0
    for w in host["weights"].values():
        if not w.get("format"):
            continue
        assert w["format"] == fmt
        tr, tc, layers = w["tile_rows"], w["tile_columns"], len(w["tensors"])
        blocks = width if w["orient"] == "col" else height  # the elements a row of the matrix is cut over
        order = list(w["column_map"] or range(w["columns"]))
        sources = np.array((order + [-1] * (blocks * tc))[: blocks * tc]).reshape(blocks, tc)
        sources[sources >= w["columns"]] = -1
        codes = tc * 2 * -(-(tr * BITS[fmt]) // 16)
        scales = 2 * tr * _blocks_touched(sources)
        f16 += layers * 2 * tr * tc
        stored += layers * (codes + scales) + 4 * tc
        longest = max(longest, tr)
    return f16, stored, longest


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_each_element_holds_fewer_bytes_by_the_blocks_it_keeps(fmt: str) -> None:
    spec = QuantizedWeights(RandomWeights(_spec(), seed=5), fmt).spec
    stored = testing.lower_decode(spec, 16, "f16", p=3)
    image = testing.lower_decode(replace(spec, storage=()), 16, "f16", p=3)
    f16, held, longest = _saved_by_tiles(stored.host, fmt)
    scratch = 2 * longest + 4 * longest + 4 * longest  # the unpacked codes (i16), the values and the scales (f32)
    # the image's f16 copies of the products' inputs (its @fmachs reads f16): read as stored the codes' values
    # multiply the f32 input, so those copies are gone where no product of the image reads them
    halves = {n: words for n, (words, t) in image.host["arrays"].items() if t == "f16" and n.endswith("_f16")}
    copies = sum(2 * words for n, words in halves.items() if n not in stored.host["arrays"])
    assert f16 - held - scratch > 0 and copies > 0
    assert memory_use(image)["arrays"] - memory_use(stored)["arrays"] == f16 - held - scratch + copies
    # the simulator's memory model (the arrays it allocates, at their element types' bytes) counts the same
    store = QuantizedWeights(RandomWeights(_spec(), seed=5), fmt)
    simulated = GridMachine(stored.module, stored.host, store).fabric.element_bytes()[0]
    assert simulated == memory_use(stored)["arrays"]
    assert (
        GridMachine(image.module, image.host, store).fabric.element_bytes()[0] - simulated
        == f16 - held - scratch + copies
    )


def test_the_8b_at_q4_0_fits_a_wse2_on_fewer_elements_or_with_a_longer_context() -> None:
    """llama-3.1-8b at ctx 8192 stored in Q4_0 (every matrix; the norms f32), with the f16 image for the rest: the
    lane's own search finds a grid of a WSE-2 that holds it within 48 KiB at the band's high end with fewer elements
    than its f16 build takes (683 x 994, `test_spatial_build.test_models_fit_a_wse2`), a grid the f16 image does not
    fit; on 683 x 994 with the f16 build's layout (KV heads narrow) the stored matrices' tiles take the bytes worked
    out from the block format, and the room saved holds a cache of 37 positions an element (25,271 in all) where
    the f16 image holds 13 (8,879) and not 14; and not 38 as stored."""
    from logos_ir.errors import LogosError
    from logos_ir.models import ModelSource

    spec = ModelSource.resolve("llama-3.1-8b", storage="q4_0").spec
    image = replace(spec, storage=())
    searched = testing.lower_decode(spec, 8192, "f16")
    width, height = searched.plan.width, searched.plan.height
    assert memory_use(searched)["band"]["high"] <= 49152 and width * height < 683 * 994
    with pytest.raises(LogosError, match="does not fit"):
        testing.lower_decode(image, 8192, "f16", p=(width, height))
    stored = testing.lower_decode(spec, 8192, "f16", p=(683, 994), copies=1)
    f16, held, _ = _saved_by_tiles(stored.host, "q4_0")
    assert held < f16 and memory_use(stored)["band"]["high"] <= 49152
    assert not stored.host["weights"]["output_weight"].get("format")  # its scattered columns: cheaper as f16
    assert memory_use(testing.lower_decode(spec, 37 * 683, "f16", p=(683, 994), copies=1))["band"]["high"] <= 49152
    with pytest.raises(LogosError, match="does not fit"):
        testing.lower_decode(spec, 37 * 683 + 1, "f16", p=(683, 994), copies=1)
    with pytest.raises(LogosError, match="does not fit"):
        testing.lower_decode(image, 13 * 683 + 1, "f16", p=(683, 994), copies=1)


def test_the_unpacking_is_counted_in_the_cycles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unpacking is DSD ops the cycle model counts element by element (no scalar loop): a step of the stored
    build costs more than the image's on the same grid, and a dearer DSD element adds to it more than to the
    image's, by at least the stored columns' extra elements (each stored column's codes unpacked, widened, scaled:
    at least 3 more ops of the column's rows each)."""
    from logos_ir.runtime.spatial import CYCLES

    store = QuantizedWeights(RandomWeights(_spec(), seed=5), "q4_0")
    machines = []
    for spec in (store.spec, replace(store.spec, storage=())):
        lowered = testing.lower_decode(spec, 16, "f32", p=3)
        machine = GridMachine(lowered.module, lowered.host, store)
        machine.reset()
        machine.step(2, 1)
        machines.append((machine, lowered.host))
    (stored, host), (image, _) = machines
    assert stored.cycles[0] > image.cycles[0]
    monkeypatch.setitem(CYCLES, "dsd_element", CYCLES["dsd_element"] + 1)
    stored.step(3, 2)
    image.step(3, 2)
    extra = (
        sum(3 * w["tile_rows"] * w["tile_columns"] for w in host["weights"].values() if w.get("format"))
        * store.spec.layers
    )
    assert (stored.cycles[1] - stored.cycles[0]) - (image.cycles[1] - image.cycles[0]) >= extra
