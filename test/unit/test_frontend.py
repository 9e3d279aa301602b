"""The frontend: every program the author writes parses into verified `logos` IR and prints back byte for byte, as
LOGOS and as MLIR; the identity of parsed IR is the identity of its text."""

import io

import pytest
from xdsl.context import Context
from xdsl.dialects import builtin, func, shard
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from logos_ir.author import written, written_split
from logos_ir.dialects.logos import LOGOS
from logos_ir.identity import check, identity
from logos_ir.parser import parse_program
from logos_ir.printer import print_program
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec

SPECS = ["tiny", "smollm2-135m", "llama-3.2-1b", "llama-3.1-70b"]


def every_cut(spec: ModelSpec) -> list[Cut]:
    last = spec.layers - 1
    return [
        Cut.decode(32),
        Cut.prefill(3, 32),
        Cut.batch(2, 32),
        Cut.forward(),
        Cut.forward_layer(0),
        Cut.forward_layer(last),
        Cut.forward_head(),
        Cut.decode_embed(),
        Cut.decode_layer(0, 32),
        Cut.decode_layer(last, 32),
        Cut.decode_head(),
        Cut.batch_embed(2),
        Cut.batch_layer(last, 2, 32),
        Cut.batch_head(2),
        Cut.prefill_layer(0, 3, 32),
        Cut.prefill_layer(last, 3, 32),
        Cut.prefill_head(3),
    ]


def split_programs(spec: ModelSpec) -> list[tuple[Cut, int]]:
    widths = [tp for tp in (1, 2, 3, 4, 8) if spec.splits_over(tp) is None]
    cuts = [
        Cut.decode(32),
        Cut.batch(2, 32),
        Cut.decode_layer(spec.layers - 1, 32),
        Cut.batch_layer(0, 2, 32),
    ]
    return [(cut, tp) for cut in cuts for tp in widths]


@pytest.fixture(scope="module")
def context() -> Context:
    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, shard.Shard, LOGOS):
        ctx.load_dialect(dialect)
    return ctx


def mlir_of(program) -> str:
    out = io.StringIO()
    Printer(stream=out).print_op(ModuleOp([program.clone()]))
    return out.getvalue()


def roundtrip(text: str, expected_cut: Cut, chips: int, ctx: Context, mlir: bool = True) -> None:
    program = parse_program(text)
    program.verify()
    assert print_program(program) == text
    recorded = check(program)
    assert (recorded.cut, recorded.chips) == (expected_cut, chips)
    if not mlir:
        return
    source = mlir_of(program)
    again = Parser(ctx, source).parse_module()
    again.verify()
    assert print_program(again.ops.first) == text
    assert mlir_of(again.ops.first) == source


@pytest.mark.parametrize("name", SPECS)
def test_every_cut_round_trips(name, context):
    spec = ModelSpec.preset(name)
    for cut in every_cut(spec):
        authored, expected = written(spec, cut)
        # The 80-layer whole programs go through xDSL's MLIR parser once (see the decode test below), not per cut.
        heavy = spec.layers > 40 and cut.kind in Cut.WHOLE
        roundtrip(authored.text, cut, 1, context, mlir=not heavy)
        assert identity(parse_program(authored.text)) == expected


@pytest.mark.parametrize("name", SPECS)
def test_every_split_program_round_trips(name, context):
    spec = ModelSpec.preset(name)
    for cut, tp in split_programs(spec):
        authored, expected = written_split(spec, cut, "", tp)
        roundtrip(authored.text, cut, tp, context, mlir=spec.layers <= 40 or "layer" in cut.kind)
        assert identity(parse_program(authored.text)) == expected


def test_the_70b_decode_step_round_trips_through_mlir(context):
    authored, _ = written(ModelSpec.preset("llama-3.1-70b"), Cut.decode(128))
    roundtrip(authored.text, Cut.decode(128), 1, context)


def test_parsed_program_records_the_digest_of_its_text():
    authored, expected = written(ModelSpec.preset("tiny"), Cut.decode(64))
    program = parse_program(authored.text)
    assert program.digest.data == expected.hex()
    assert program.cut.data == "decode ctx=64"
