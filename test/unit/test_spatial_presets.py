"""The published presets on the wafer at ctx 8192, f16: each preset's layout and memory plan (the lane's lowering for
one given grid: the search that picks it is `bench/spatial_presets.py`'s, too slow for the suite) fits the machine
docs/spatial.md states, or is refused by its bytes; and the compact layout those fits need (a tied head reading the
embedding's array, the head's logits reduced in pieces of the row's line buffer), taken only where nothing else
fits, gives transformers' tokens on the fabric simulator for a tiny tied family."""

from __future__ import annotations

import pytest
from test_families import FAMILIES, GOLDENS

from logos_ir.dialects import csl_ext
from logos_ir.errors import PassError
from logos_ir.passes.spatial.convert_logos_to_csl import memory_use
from logos_ir.runtime.spatial.host import GridMachine
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_decode
from logos_ir.weights import open_model


def _tokens(lowered: object, store: object, run: dict) -> list[int]:
    machine = GridMachine(lowered.module, lowered.host, store)  # type: ignore[attr-defined]
    machine.reset()
    tokens, out = list(run["prompt"]), []
    for position in range(1, len(run["prompt"]) + len(run["tokens"])):
        token = tokens[position - 1] if position <= len(tokens) else out[-1]
        predicted = machine.step(token + 1, position) - 1
        if position >= len(tokens):
            out.append(predicted)
    return out


def test_the_compact_layout_only_where_nothing_else_fits_and_its_tokens() -> None:
    """gemma2-gguf (tied embeddings, soft-capped logits) on a 4 x 4 grid, f16, KV heads kept narrow: with the
    element's memory it fits as it is (its own head table, a line buffer as long as the vocabulary's chunk); given
    one byte less than that build's band, the lowering takes the compact layout (one table, the logits reduced in
    pieces) and still gives transformers' tokens on the fabric simulator; one byte less than the compact build's
    band is refused."""
    family = "gemma2-gguf"
    store = open_model(str(FAMILIES / family))
    assert store.spec.tie_embeddings
    plain = lower_decode(store.spec, 32, "f16", (4, 4), copies=1)
    assert not plain.plan.compact and len([w for w in plain.plan.weights.values() if w.kind == "table"]) == 2
    high = memory_use(plain)["fits"]
    compact = lower_decode(store.spec, 32, "f16", (4, 4), memory=high - 1, copies=1)
    assert compact.plan.compact
    tables = [w for w in compact.plan.weights.values() if w.kind == "table"]
    assert len(tables) == 1 and "head_table" not in compact.host["arrays"]
    vocab_chunk = -(-store.spec.vocab // 4)
    assert compact.host["arrays"]["line_row"][0] < vocab_chunk  # the logits go through it in pieces
    assert memory_use(compact)["fits"] < high
    run = GOLDENS[family]["runs"][0]
    assert _tokens(compact, store, run) == run["tokens"]
    with pytest.raises(PassError, match="does not fit a 4 x 4 grid"):
        lower_decode(store.spec, 32, "f16", (4, 4), memory=memory_use(compact)["fits"] - 1, copies=1)


# (preset, machine, grid the search takes there, the band's high end it reports): bench/spatial_presets.py's run
PRESETS_THAT_FIT = [
    ("gemma-2-9b", "wse3", (745, 1170)),
    ("qwen3-8b", "wse3", (683, 1170)),
]


@pytest.mark.parametrize(("preset", "arch", "grid"), PRESETS_THAT_FIT)
def test_the_preset_fits_its_wafer_at_ctx_8192(preset: str, arch: str, grid: tuple[int, int]) -> None:
    lowered = lower_decode(ModelSpec.preset(preset), 8192, "f16", grid, arch=arch)
    band = memory_use(lowered)["band"]
    assert lowered.host["grid"] == list(grid) and lowered.host["arch"] == csl_ext.TARGETS[arch].name
    assert band["high"] <= csl_ext.MEMORY


@pytest.mark.parametrize(("preset", "arch"), [("gemma-2-9b", "wse2"), ("qwen3-8b", "wse2"), ("gemma-3-12b", "wse3")])
def test_the_preset_is_refused_by_its_bytes_where_it_does_not_fit(preset: str, arch: str) -> None:
    """The machine's whole usable rectangle with KV heads kept narrow (the least cache; more copies only add), the
    compact layout tried too: still over the element's 48 KiB, refused with its bytes."""
    usable = csl_ext.TARGETS[arch].usable
    with pytest.raises(PassError, match=rf"does not fit a {usable[0]} x {usable[1]} grid of 49152-byte elements"):
        lower_decode(ModelSpec.preset(preset), 8192, "f16", usable, copies=1, arch=arch)
