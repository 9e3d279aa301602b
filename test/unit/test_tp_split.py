"""tp-split: the pass's split of the author's unsplit program is the author's split program, byte for byte.

For every legal width (tp in 1, 2, 3, 4, 8 where the spec splits) of tiny, tiny-tp8, smollm2-135m and
llama-3.1-70b, and for the four cuts that split (a decode step, a batch, and a layer of either), the pass's
result prints as the LOGOS text `written_split` gives, records the same identity, verifies, names the same
split weights as the author's manifest, and (on the small models) is the same MLIR as the author's text
parsed. Each whole program is parsed once and cloned per width. Then the refusals: each leaves the IR as it
was.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.arg_spec import parse_pipeline

from logos_ir import author, identity, registry, tensor_parallel
from logos_ir.author import written, written_split
from logos_ir.dialects import logos
from logos_ir.errors import NotYet, PassError, SpecError
from logos_ir.parser import parse_program
from logos_ir.passes.tp_split import TpSplit, communication_report
from logos_ir.printer import print_program
from logos_ir.program import Cut, Identity
from logos_ir.spec import ModelSpec
from logos_ir.tensor_parallel import weight_split

WIDTHS = (1, 2, 3, 4, 8)
LEGAL = {"tiny": (1, 2), "tiny-tp8": (1, 2, 4, 8), "smollm2-135m": (1, 3), "llama-3.1-70b": (1, 2, 4, 8)}
SMALL = ("tiny", "tiny-tp8")


def _cuts(model: str) -> list[Cut]:
    if model == "llama-3.1-70b":  # 80 layers: the whole step and batch, and a couple of its layers
        return [
            Cut.decode(128),
            Cut.batch(2, 64),
            Cut.decode_layer(0, 128),
            Cut.decode_layer(79, 128),
            Cut.batch_layer(41, 2, 64),
        ]
    last = ModelSpec.preset(model).layers - 1
    return [Cut.decode(64), Cut.batch(3, 32), Cut.decode_layer(last, 64), Cut.batch_layer(0, 2, 16)]


CASES = [(model, cut) for model in LEGAL for cut in _cuts(model)]


@cache
def _unsplit(model: str, cut: Cut) -> logos.ProgramOp:
    """The author's unsplit program, parsed once; tests split clones of it."""
    return parse_program(written(ModelSpec.preset(model), cut)[0].text)


def split(program: logos.ProgramOp, tp: int) -> ModuleOp:
    module = ModuleOp([program.clone()])
    TpSplit(tp).apply(Context(), module)
    return module


def only(module: ModuleOp) -> logos.ProgramOp:
    program = module.ops.first
    assert isinstance(program, logos.ProgramOp)
    return program


@pytest.mark.parametrize("model", list(LEGAL))
def test_legal_widths(model: str) -> None:
    spec = ModelSpec.preset(model)
    assert tuple(tp for tp in WIDTHS if spec.splits_over(tp) is None) == LEGAL[model]


@pytest.mark.parametrize(("model", "cut"), CASES, ids=[f"{m}-{c.option().replace(' ', '-')}" for m, c in CASES])
def test_split_is_the_authors(model: str, cut: Cut) -> None:
    spec = ModelSpec.preset(model)
    unsplit = _unsplit(model, cut)
    before = print_program(unsplit)
    for tp in LEGAL[model]:
        module = split(unsplit, tp)
        program = only(module)
        authored, expected = written_split(spec, cut, "", tp)
        text = print_program(program)
        assert text == authored.text, f"tp {tp}"
        assert expected == Identity.of_split(cut, tp, text)
        assert identity.identity(program) == expected  # the digest recorded is the print's
        assert author.manifest_of(program, "") == authored.manifest
        module.verify()
        if model in SMALL:
            assert str(module) == str(ModuleOp([parse_program(authored.text)]))
    assert print_program(unsplit) == before  # the clones were split, not the original


def test_split_ir_shapes() -> None:
    """The shares and the all-reduces, read off the IR (tiny-tp8 over 4 chips: 4 query heads, 2 KV heads)."""
    program = only(split(_unsplit("tiny-tp8", Cut.decode(64)), 4))
    first = program.block.first_op
    assert first is not None and first.name == "shard.grid"
    layer = program.function("layer_0")
    assert layer is not None
    named = {op.results[0].name_hint: op for op in layer.body.block.ops if op.results}
    types = {name: logos.tensor_shape(op.results[0]) for name, op in named.items()}
    assert types["query_weight"] == (32, 64) and types["query"] == types["turned_query"] == (1, 32)
    assert types["key_weight"] == (16, 64) and types["key"] == (1, 16) and types["value"] == (1, 16)
    assert types["keys"] == (2, 64, 8) and types["values"] == (2, 64, 8) and types["attended"] == (1, 32)
    assert types["output_weight"] == (64, 32) and types["projected_part"] == (1, 64)
    assert types["gate"] == (1, 32) and types["activated"] == (1, 32) and types["product"] == (1, 32)
    assert types["down_weight"] == (64, 32) and types["down"] == (1, 64)
    for name, part in (("projected", "projected_part"), ("down", "down_part")):
        reduce = named[name]
        assert reduce.name == "shard.all_reduce" and reduce.operands[0] is named[part].results[0]
        assert reduce.prev_op is named[part]  # right after its linear
        assert [use.operation for use in named[part].results[0].uses] == [reduce]
    assert named["mixed"].operands[1] is named["projected"].results[0]
    assert named["result"].operands[1] is named["down"].results[0]
    head = program.function("head")
    assert head is not None
    ops = {op.results[0].name_hint: op for op in head.body.block.ops if op.results}
    shapes = {name: logos.tensor_shape(op.results[0]) for name, op in ops.items()}
    # the head's table split by vocabulary rows (256 / 4 = 64 a chip), the chips' logits gathered before the arg-max
    assert shapes["head_table"] == (64, 64) and shapes["logits_part"] == (1, 64) and shapes["logits"] == (1, 256)
    gather = ops["logits"]
    assert gather.name == "shard.all_gather" and gather.prev_op is ops["logits_part"]
    assert gather.operands[0] is ops["logits_part"].results[0]
    assert gather.gather_axis.value.data == 1 and gather.grid_axes.get_values() == (0,)
    assert ops["next"].operands[0] is gather.results[0]
    assert [op.name for op in head.walk() if op.name.startswith("shard.")] == ["shard.all_gather"]


def test_weight_roles() -> None:
    p = "model.layers.12."
    rows = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
    assert [weight_split(p + w + ".weight") for w in rows] == ["rows"] * 5
    assert weight_split(p + "self_attn.o_proj.weight") == "columns"
    assert weight_split(p + "mlp.down_proj.weight") == "columns"
    stacked = ("mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj")  # whole experts a chip
    assert [weight_split(p + w + ".weight") for w in stacked] == ["experts"] * 3
    others = (
        p + "mlp.gate.weight",  # a mixture's router: every chip routes every token
        p + "input_layernorm.weight",
        p + "post_attention_layernorm.weight",
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
    )
    for name in others:
        assert weight_split(name) is None


def test_pass_is_registered_and_parses_its_option() -> None:
    assert registry.passes()["tp-split"]() is TpSplit
    spec = next(iter(parse_pipeline("tp-split{tp=4}")))
    assert TpSplit.from_pass_spec(spec) == TpSplit(4)


# -- refusals ------------------------------------------------------------------------------------------------


def refused(text: str, tp: int) -> PassError:
    """The pass's refusal of `text` split over `tp`, after checking it left the IR as it was."""
    module = ModuleOp([parse_program(text)])
    before = str(module)
    with pytest.raises(PassError) as caught:
        TpSplit(tp).apply(Context(), module)
    assert str(module) == before
    assert caught.value.message.startswith("tp-split: ")
    return caught.value


NOT_SPLITTABLE = [
    Cut.prefill(4, 64),
    Cut.forward(),
    Cut.forward_layer(1),
    Cut.forward_head(),
    Cut.decode_embed(),
    Cut.decode_head(),
    Cut.batch_embed(2),
    Cut.batch_head(2),
    Cut.prefill_layer(0, 4, 64),
    Cut.prefill_head(4),
]


@pytest.mark.parametrize("cut", NOT_SPLITTABLE, ids=lambda c: c.kind)
def test_refuses_cuts_that_do_not_split_as_the_author_does(cut: Cut) -> None:
    spec = ModelSpec.preset("tiny")
    with pytest.raises(NotYet) as not_yet:
        written_split(spec, cut, "", 2)
    error = refused(written(spec, cut)[0].text, 2)
    assert not_yet.value.message == tensor_parallel.NOT_YET_SPLIT
    assert f"logos.program '{cut.option()}': not yet: {tensor_parallel.NOT_YET_SPLIT}" in error.message


@pytest.mark.parametrize(
    ("spec", "tp", "width"),
    [
        (ModelSpec.preset("tiny"), 4, "kv_heads"),
        (ModelSpec.preset("tiny"), 3, "heads"),
        (ModelSpec.preset("smollm2-135m"), 2, "heads"),
        (ModelSpec.preset("tiny-tp8"), 16, "kv_heads"),
        (
            ModelSpec(
                vocab=64,
                hidden=48,
                layers=1,
                heads=6,
                kv_heads=3,
                head_dim=8,
                intermediate=100,
                rms_eps=1e-5,
                rope_theta=10000.0,
                tie_embeddings=True,
            ),
            3,
            "intermediate",
        ),
    ],
    ids=["tiny-4-kv_heads", "tiny-3-heads", "smollm2-2-heads", "tiny-tp8-16-kv_heads", "intermediate"],
)
def test_refuses_widths_that_do_not_divide(spec: ModelSpec, tp: int, width: str) -> None:
    cut = Cut.decode(16)
    with pytest.raises(SpecError) as by_author:
        written_split(spec, cut, "", tp)
    error = refused(written(spec, cut)[0].text, tp)
    assert f"{width} ({getattr(spec, width)}) is not a multiple of {tp}" in error.message
    assert by_author.value.message in error.message  # the author's words


def test_refuses_a_vocabulary_that_does_not_divide() -> None:
    """The head is split by vocabulary rows, unpadded: a vocabulary not a multiple of the chips is refused, by the
    author and the pass alike; a layer cut (no head) still splits."""
    spec = replace(ModelSpec.preset("tiny"), vocab=255)
    cut = Cut.decode(16)
    with pytest.raises(SpecError) as by_author:
        written_split(spec, cut, "", 2)
    error = refused(written(spec, cut)[0].text, 2)
    assert "its vocabulary (255) is not a multiple of 2" in error.message and "padded" in error.message
    assert by_author.value.message in error.message
    layer = Cut.parse("decode_layer layer=0 ctx=16")
    assert (
        print_program(only(split(parse_program(written(spec, layer)[0].text), 2)))
        == written_split(spec, layer, "", 2)[0].text
    )


def test_a_tied_head_splits_its_own_use_of_the_table() -> None:
    """With tied embeddings the head's table is the embedding's: the head's use is split by vocabulary rows, the
    embedding's stays whole (its rows are picked by token)."""
    spec = replace(ModelSpec.preset("tiny"), tie_embeddings=True)
    program = only(split(parse_program(written(spec, Cut.decode(16))[0].text), 2))
    shapes = {
        (function.sym_name.data, op.tensor.data): (logos.tensor_shape(op.result), op.split)
        for function in program.block.ops
        if isinstance(function, func.FuncOp)
        for op in function.body.block.ops
        if isinstance(op, logos.WeightOp)
    }
    table = "model.embed_tokens.weight"
    assert shapes[("embedding", table)] == ((256, 64), None)
    assert shapes[("head", table)][0] == (128, 64) and shapes[("head", table)][1].data == "rows"
    assert print_program(program) == written_split(spec, Cut.decode(16), "", 2)[0].text


@pytest.mark.parametrize("tp", [1, 2])
def test_refuses_a_split_program(tp: int) -> None:
    spec = ModelSpec.preset("tiny")
    error = refused(written_split(spec, Cut.decode(64), "", tp)[0].text, 2)
    assert "is already split" in error.message
    # and the pass's own output, split again
    module = split(_unsplit("tiny", Cut.decode(64)), 2)
    before = str(module)
    with pytest.raises(PassError, match="is already split over 2 chips"):
        TpSplit(2).apply(Context(), module)
    assert str(module) == before


@pytest.mark.parametrize("tp", [0, -2])
def test_refuses_fewer_than_one_chip(tp: int) -> None:
    error = refused(written(ModelSpec.preset("tiny"), Cut.decode(64))[0].text, tp)
    assert f"a program is split over at least 1 chip, not {tp}" in error.message


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "Let mixed be x plus projected.",
            "Let mixed be x plus query.",
            "'logos.add' %mixed in @layer_0 combines a split value with a value that is not split the same way",
        ),
        (
            "Let normed_mixed be the RMS norm of mixed with mlp_norm.",
            "Let normed_mixed be the RMS norm of attended with mlp_norm.",
            "'logos.rms_norm' %normed_mixed in @layer_0 reads the split value %attended",
        ),
        ("Let result be mixed plus down.", "Let result be mixed plus down.\n    Let odd be the SiLU of query.", None),
    ],
    ids=["add", "rms-norm", "return"],
)
def test_refuses_layers_it_cannot_split(old: str, new: str, message: str | None) -> None:
    """Split values may flow only where Megatron's split keeps them whole heads (see the pass's docstring)."""
    text = written(ModelSpec.preset("tiny"), Cut.decode(64))[0].text
    assert old in text
    text = text.replace(old, new, 1)
    if message is None:  # the layer returns a split value
        text = text.replace("    Return result.", "    Return odd.", 1)
        message = "'func.return' in @layer_0 reads the split value %odd"
    assert message in refused(text, 2).message


def test_refuses_a_partial_sum_name_in_use() -> None:
    text = written(ModelSpec.preset("tiny"), Cut.decode(64))[0].text
    text = text.replace(
        "Let mixed be x plus projected.",
        "Let projected_part be x plus projected.\n    Let mixed be x plus projected.",
        1,
    )
    assert "would name its partial sum 'projected_part'" in refused(text, 2).message


def test_needs_exactly_one_program() -> None:
    with pytest.raises(PassError, match="tp-split: expects one logos.program in the module, found 0"):
        TpSplit(2).apply(Context(), ModuleOp([]))


# -- communication ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "cut", "tp", "layers"),
    [
        ("tiny", Cut.decode(64), 2, 2),
        ("tiny-tp8", Cut.batch(3, 32), 8, 2),
        ("tiny-tp8", Cut.decode_layer(1, 64), 4, 1),
        ("llama-3.1-70b", Cut.decode(128), 8, 80),
    ],
)
def test_communication_report(model: str, cut: Cut, tp: int, layers: int) -> None:
    spec = ModelSpec.preset(model)
    report = communication_report(only(split(_unsplit(model, cut), tp)))
    rows = cut.rows or 1
    per_layer = 2 * rows * spec.hidden * 4  # two all-reduces of rows x hidden float32 per layer
    assert report["all_reduces"] == 2 * layers
    assert report["bytes_per_step"] == report["megatron_bytes"] == per_layer * layers
    heads = 0 if cut.layer is not None else 1  # a layer cut has no head
    assert report["all_gathers"] == heads and report["gathered_bytes_per_step"] == heads * rows * spec.vocab * 4
    assert set(report["bytes_per_layer"].values()) == {per_layer}  # type: ignore[union-attr]
    assert len(report["bytes_per_layer"]) == layers  # type: ignore[arg-type]
    assert report["ring_bytes_per_chip"] == per_layer * layers * 2 * (tp - 1) // tp
    assert report["program"] == written_split(spec, cut, "", tp)[1].line()


def test_communication_report_agrees_with_the_interpreter() -> None:
    from logos_ir.interpreter import Interpreter
    from logos_ir.weights import RandomWeights

    spec = ModelSpec.preset("tiny-tp8")
    program = only(split(_unsplit("tiny-tp8", Cut.decode(64)), 4))
    counted = Interpreter(program, RandomWeights(spec, 0)).communication_bytes_per_run()
    report = communication_report(program)
    assert counted.total == report["bytes_per_step"]
    assert dict(counted.per_section) == report["bytes_per_layer"]


def test_comm_report_tool(capsys: pytest.CaptureFixture[str]) -> None:
    from logos_ir.tools import comm_report

    assert comm_report.main(["--model", "tiny", "--cut", "decode ctx=64", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "bytes all-reduced per step: 1024" in out
    assert "2 x rows x hidden x 4 x layers: 1024" in out
    assert comm_report.main(["--model", "tiny", "--cut", "prefill rows=2 ctx=8", "--tp", "2"]) == 1
    assert "not yet" in capsys.readouterr().err
