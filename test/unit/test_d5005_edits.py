"""The D5005 lane lowers the module it is given: an edit made after the identity check (a norm's epsilon, a
weight's tensor name) reaches the lowered program, its listing and its weight layout."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, ModuleOp, StringAttr

from logos_ir.author import written
from logos_ir.dialects import d5005, logos
from logos_ir.parser import parse_program
from logos_ir.passes.d5005.convert_logos_to_d5005 import ConvertLogosToD5005
from logos_ir.passes.d5005.emit_layout import layout
from logos_ir.passes.d5005.emit_listing import listing
from logos_ir.passes.inline_sections import InlineSections
from logos_ir.passes.verify_identity import VerifyIdentity
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec

UP = "model.layers.1.mlp.up_proj.weight"
RENAMED = "model.layers.1.mlp.up_proj.edited"


def edited_and_lowered() -> d5005.ProgramOp:
    text, _ = written(ModelSpec.preset("tiny"), Cut.decode(64))
    module = ModuleOp([parse_program(text.text, "<tiny>")])
    VerifyIdentity().apply(Context(), module)
    ops = list(module.walk())
    final_norm = [op for op in ops if isinstance(op, logos.RMSNormOp)][-1]
    final_norm.epsilon = FloatAttr(0.03125, final_norm.epsilon.type)
    up = next(op for op in ops if isinstance(op, logos.WeightOp) and op.tensor.data == UP)
    up.tensor = StringAttr(RENAMED)
    for stage in (InlineSections(), ConvertLogosToD5005("bf16")):
        stage.apply(Context(), module)
    program = next(iter(module.ops))
    assert isinstance(program, d5005.ProgramOp)
    return program


def test_an_edited_epsilon_and_weight_name_reach_the_lowered_step() -> None:
    program = edited_and_lowered()
    norms = [op for op in program.instructions() if isinstance(op, d5005.RMSNormOp)]
    assert norms[-1].epsilon.value.data == 0.03125
    assert {op.epsilon.value.data for op in norms[:-1]} == {FloatAttr(1e-05, 32).value.data}  # the others kept
    text = listing(program)
    assert text.count("eps 0.03125") == 1
    assert "rms_norm(result) * model.norm.weight @" in text.split("eps 0.03125")[0].splitlines()[-1]
    assert f"up <- {RENAMED} @" in text
    assert UP not in text
    rows = [line.split() for line in layout(program).splitlines() if not line.startswith("#")]
    assert [row[:2] for row in rows if row[0] == RENAMED] == [[RENAMED, "weight"]]
    assert not any(row[0] == UP for row in rows)
