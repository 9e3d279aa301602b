"""The program API: the fourteen cuts, their display and option forms, identities, and what the author writes."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from logos_ir.author import decode_at, prefill_at, written, written_in, written_split
from logos_ir.errors import CutError, NotYet, SpecError
from logos_ir.program import Cut, Identity
from logos_ir.spec import ModelSpec
from logos_ir.tensor_parallel import NOT_YET_SPLIT

TINY = ModelSpec.preset("tiny")
GOLDEN = Path(__file__).parent / "golden" / "tiny_decode_ctx64.logos"

# Each cut, its display text exactly as the reference writes it, and its option form.
CUTS = [
    (Cut.decode(128), "decode step, ctx 128", "decode ctx=128"),
    (Cut.prefill(4, 128), "prefill chunk of 4 rows, ctx 128", "prefill rows=4 ctx=128"),
    (Cut.batch(4, 128), "batch of 4 sequences, ctx 128", "batch rows=4 ctx=128"),
    (Cut.forward(), "forward", "forward"),
    (Cut.forward_layer(3), "forward layer 3", "forward_layer layer=3"),
    (Cut.forward_head(), "forward head", "forward_head"),
    (Cut.decode_embed(), "decode step's embedding", "decode_embed"),
    (Cut.decode_layer(3, 128), "decode step's layer 3, ctx 128", "decode_layer layer=3 ctx=128"),
    (Cut.decode_head(), "decode step's head", "decode_head"),
    (Cut.batch_embed(4), "batch of 4 sequences' embedding", "batch_embed rows=4"),
    (
        Cut.batch_layer(3, 4, 128),
        "batch of 4 sequences' layer 3, ctx 128",
        "batch_layer layer=3 rows=4 ctx=128",
    ),
    (Cut.batch_head(4), "batch of 4 sequences' head", "batch_head rows=4"),
    (
        Cut.prefill_layer(3, 4, 128),
        "prefill chunk of 4 rows' layer 3, ctx 128",
        "prefill_layer layer=3 rows=4 ctx=128",
    ),
    (Cut.prefill_head(4), "prefill chunk of 4 rows' head", "prefill_head rows=4"),
]


def small_cuts(spec: ModelSpec) -> list[Cut]:
    """Every kind at small sizes, for writing programs."""
    last = spec.layers - 1
    return [
        Cut.decode(16),
        Cut.prefill(3, 16),
        Cut.batch(2, 16),
        Cut.forward(),
        Cut.forward_layer(last),
        Cut.forward_head(),
        Cut.decode_embed(),
        Cut.decode_layer(last, 16),
        Cut.decode_head(),
        Cut.batch_embed(2),
        Cut.batch_layer(0, 2, 16),
        Cut.batch_head(2),
        Cut.prefill_layer(last, 3, 16),
        Cut.prefill_head(3),
    ]


def test_there_are_fourteen_kinds():
    assert len(Cut.KINDS) == 14 and len({cut.kind for cut, _, _ in CUTS}) == 14


@pytest.mark.parametrize(("cut", "display", "option"), CUTS, ids=[c[2] for c in CUTS])
def test_display_and_option_forms(cut, display, option):
    assert str(cut) == display
    assert cut.option() == option
    assert Cut.parse(option) == cut
    assert Cut.from_display(display) == cut


def test_cuts_are_hashable_and_comparable():
    assert Cut.decode(128) == Cut.decode(128) != Cut.decode(64)
    assert len({cut for cut, _, _ in CUTS} | {Cut.decode(128)}) == 14
    assert sorted([Cut.decode(2), Cut.decode(1)]) == [Cut.decode(1), Cut.decode(2)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty cut"),
        ("decoder ctx=128", "unknown cut 'decoder'"),
        ("decode", "needs 1 argument"),
        ("decode ctx=128 rows=2", "needs 1 argument"),
        ("prefill ctx=128 rows=4", "expected 'rows=N', got 'ctx=128'"),
        ("decode ctx=twelve", "'ctx' must be a whole number"),
        ("decode ctx=0", "'ctx' must be at least 1"),
        ("prefill rows=9 ctx=8", "does not fit a cache of 8 positions"),
        ("decode ctx=-1", "'ctx' must be a whole number"),
    ],
)
def test_bad_option_forms_are_refused(text, message):
    with pytest.raises(CutError, match=message):
        Cut.parse(text)


def test_identity_is_the_sha256_of_the_exact_text():
    authored, identity = written(TINY, Cut.decode(64))
    digest = hashlib.sha256(authored.text.encode("utf-8")).hexdigest()
    assert identity.hex() == digest
    assert identity.line() == f"LOGOS program: decode step, ctx 64, sha256 {digest}"
    assert Identity.of(Cut.decode(64), authored.text + " ") != identity
    assert Identity.from_line(identity.line()) == identity


def test_split_identity_names_its_chips():
    authored, identity = written_split(TINY, Cut.decode(64), "", 2)
    digest = hashlib.sha256(authored.text.encode("utf-8")).hexdigest()
    assert identity == Identity.of_split(Cut.decode(64), 2, authored.text)
    assert identity.line() == f"LOGOS program: decode step, ctx 64 over 2 chips, sha256 {digest}"
    assert Identity.from_line(identity.line()) == identity


def test_golden_text_of_the_tiny_decode_step():
    authored, _ = written(TINY, Cut.decode(64))
    assert authored.text == GOLDEN.read_text(encoding="utf-8")


@pytest.mark.parametrize("cut", small_cuts(TINY), ids=str)
def test_text_does_not_depend_on_dir(cut):
    plain, identity = written(TINY, cut)
    elsewhere, other = written_in(TINY, cut, "/models/tiny")
    assert plain.text == elsewhere.text and identity == other
    assert all(entry.file == "/models/tiny/model.safetensors" for entry in elsewhere.manifest)
    assert {entry.name for entry in plain.manifest} == {entry.name for entry in elsewhere.manifest}


# Writes each cut named on its command line ("model:option") to stdout, and the tiny decode step split over 2 chips.
AUTHOR_ALL = """
import sys
from logos_ir.author import written, written_split
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
for arg in sys.argv[1:]:
    model, option = arg.split(":")
    sys.stdout.write(written(ModelSpec.preset(model), Cut.parse(option))[0].text)
sys.stdout.write(written_split(ModelSpec.preset("tiny"), Cut.decode(16), "", 2)[0].text)
"""


def authored_in_a_fresh_process(hash_seed: str) -> bytes:
    models = ("tiny", "smollm2-135m")
    cuts = [f"{model}:{cut.option()}" for model in models for cut in small_cuts(ModelSpec.preset(model))]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", AUTHOR_ALL, *cuts], env=env, capture_output=True, check=True)
    return done.stdout


def test_author_is_deterministic_across_processes():
    # Two interpreters with different string hashing (so different set and dict orders) write the same bytes,
    # and the bytes this process writes.
    first, second = authored_in_a_fresh_process("1"), authored_in_a_fresh_process("2")
    assert first == second
    assert first.startswith(written(TINY, Cut.decode(16))[0].text.encode("utf-8"))


def test_manifest_lists_each_weight_once_with_dtype_and_shape():
    manifest = written(TINY, Cut.decode(64))[0].manifest
    names = [entry.name for entry in manifest]
    assert len(names) == len(set(names)) == 1 + 9 * TINY.layers + 2
    q = next(e for e in manifest if e.name == "model.layers.1.self_attn.q_proj.weight")
    assert (q.dtype, q.shape, q.split) == ("f32", (64, 64), None)
    split = written_split(TINY, Cut.decode(64), "", 2)[0].manifest
    assert next(e for e in split if e.name == q.name).split == "rows"
    tied = written(ModelSpec.preset("smollm2-135m"), Cut.decode_head())[0].manifest
    assert [e.name for e in tied] == ["model.norm.weight", "model.embed_tokens.weight"]


def test_placeholders_and_run_inputs():
    prefill = written(TINY, Cut.prefill(4, 64))[0].text
    assert "Let tokens be the input tokens 1, 1, 1, 1." in prefill
    assert "Let positions be the input positions 1, 2, 3, 4." in prefill
    batch = written(TINY, Cut.batch(3, 64))[0].text
    assert "Let positions be the input positions 1, 1, 1." in batch
    assert "with 3 sequences by 2 heads by 64 positions by 16 numbers" in batch
    layer = written(TINY, Cut.prefill_layer(0, 4, 64))[0].text
    assert "Let positions be the input positions 1, 2, 3, 4." in layer
    run = prefill_at(TINY, "", 64, [5, 6, 7], 10).text
    assert "input tokens 5, 6, 7." in run and "input positions 10, 11, 12." in run
    assert "Let token be the input token 9." in decode_at(TINY, "", 64, 9, 33).text
    assert "Let position be the input position 33." in decode_at(TINY, "", 64, 9, 33).text


def test_run_inputs_outside_the_model_are_refused():
    with pytest.raises(CutError, match="token 257 is outside the vocabulary"):
        decode_at(TINY, "", 64, 257, 1)
    with pytest.raises(CutError, match="position 65 is outside the cache"):
        decode_at(TINY, "", 64, 1, 65)


def test_a_layer_past_the_last_is_refused():
    with pytest.raises(CutError, match="layer 2 does not exist: the model has layers 0 to 1"):
        written(TINY, Cut.decode_layer(2, 64))


@pytest.mark.parametrize(
    "cut",
    [Cut.prefill(4, 64), Cut.forward(), Cut.decode_head(), Cut.prefill_layer(0, 2, 8), Cut.batch_embed(2)],
    ids=str,
)
def test_split_of_other_cuts_is_not_yet(cut):
    with pytest.raises(NotYet, match=NOT_YET_SPLIT):
        written_split(TINY, cut, "", 2)


def test_split_over_a_width_that_does_not_divide():
    with pytest.raises(SpecError, match=r"kv_heads \(2\) is not a multiple of 4"):
        written_split(TINY, Cut.decode(64), "", 4)
    with pytest.raises(SpecError, match=r"heads \(9\) is not a multiple of 2"):
        written_split(ModelSpec.preset("smollm2-135m"), Cut.decode(64), "", 2)
    with pytest.raises(SpecError, match="at least 1 chip"):
        written_split(TINY, Cut.decode(64), "", 0)


def test_split_text_splits_what_megatron_splits():
    text = written_split(TINY, Cut.decode_layer(0, 64), "", 2)[0].text
    assert "    The program runs on 2 chips.\n" in text
    assert 'q_proj.weight" of 64 by 64, split by rows over the chips.' in text
    assert 'o_proj.weight" of 64 by 64, split by columns over the chips.' in text
    assert 'down_proj.weight" of 64 by 128, split by columns over the chips.' in text
    assert "with 2 heads by 64 positions by 16 numbers, split by heads over the chips." in text
    assert "Let projected be the sum over the chips of projected_part." in text
    assert "Let down be the sum over the chips of down_part." in text
    assert 'input_layernorm.weight" of 64.\n' in text
