"""`cut-extract`: every part of every whole program, cut out of the author's whole text, is the author's text
for that part, byte for byte, with the author's identity; refusals leave the IR as it was; and the parts, run
one after another on the reference interpreter, decode the same tokens as the whole decode step."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import cache

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.arg_spec import parse_pipeline

from logos_ir import identity, registry
from logos_ir.author import write, written, written_split
from logos_ir.dialects import logos
from logos_ir.errors import PassError
from logos_ir.parser import parse_program
from logos_ir.passes.cut_extract import CutExtract
from logos_ir.passes.verify_identity import VerifyIdentity
from logos_ir.printer import print_program
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec

# -- helpers -------------------------------------------------------------------------------------------------


def parts(spec: ModelSpec, whole: Cut, layers: list[int] | None = None) -> Iterator[Cut]:
    """Every part of `whole` (its embedding, where it has one; the layers, all or `layers`; its head)."""
    chosen = range(spec.layers) if layers is None else layers
    if whole.kind == "decode":
        yield Cut.decode_embed()
        yield from (Cut.decode_layer(i, whole.ctx) for i in chosen)
        yield Cut.decode_head()
    elif whole.kind == "prefill":
        yield from (Cut.prefill_layer(i, whole.rows, whole.ctx) for i in chosen)
        yield Cut.prefill_head(whole.rows)
    elif whole.kind == "batch":
        yield Cut.batch_embed(whole.rows)
        yield from (Cut.batch_layer(i, whole.rows, whole.ctx) for i in chosen)
        yield Cut.batch_head(whole.rows)
    else:
        yield from (Cut.forward_layer(i) for i in chosen)
        yield Cut.forward_head()


@cache
def whole_module(model: str, whole: str, tp: int | None = None) -> ModuleOp:
    """The author's whole program, parsed once; tests clone it (never mutate this one)."""
    spec, cut = ModelSpec.preset(model), Cut.parse(whole)
    authored = written(spec, cut)[0] if tp is None else written_split(spec, cut, "", tp)[0]
    return ModuleOp([parse_program(authored.text)])


def extract(module: ModuleOp, cut: str) -> logos.ProgramOp:
    """Run the pass in-process on `module` and return its one program."""
    CutExtract(cut).apply(Context(), module)
    return identity.the_program(module, "test")


def check_extracted(model: str, whole: str, part: Cut, tp: int | None = None) -> None:
    program = extract(whole_module(model, whole, tp).clone(), part.option())
    spec = ModelSpec.preset(model)
    authored, expected = written(spec, part) if tp is None else written_split(spec, part, "", tp)
    text = print_program(program)
    assert text == authored.text
    # The identity the extracted program records is this cut, these chips and the SHA-256 of the bytes it prints,
    # hashed here and not by the code under test; the author's identity for the part is the same one.
    sha256 = hashlib.sha256(text.encode("utf-8")).digest()
    recorded = identity.check(program)
    assert (recorded.cut, recorded.chips, recorded.sha256) == (part, tp or 1, sha256)
    assert (expected.cut, expected.chips, expected.sha256) == (part, tp or 1, sha256)
    assert program.digest.data == sha256.hex()
    program.verify()


WHOLES = ("decode ctx=64", "prefill rows=4 ctx=64", "batch rows=3 ctx=64", "forward")
CASES = [
    (model, whole, part.option())
    for model in ("tiny", "smollm2-135m")
    for whole in WHOLES
    for part in [*parts(ModelSpec.preset(model), Cut.parse(whole)), Cut.parse(whole)]
]

# -- extract(author(whole)) == author(part) ------------------------------------------------------------------


@pytest.mark.parametrize(("model", "whole", "part"), CASES)
def test_every_part_is_the_authors(model: str, whole: str, part: str) -> None:
    check_extracted(model, whole, Cut.parse(part))


def test_the_case_list_covers_every_kind() -> None:
    kinds = {Cut.parse(part).kind for _, _, part in CASES}
    assert kinds == set(Cut.KINDS)
    # SmolLM2's decode step: its embedding, each of its layers, its head, and the whole step itself.
    smollm2_parts = ModelSpec.preset("smollm2-135m").layers + 3
    assert sum(1 for model, whole, _ in CASES if model == "smollm2-135m" and whole == "decode ctx=64") == smollm2_parts


LLAMA_70B_PARTS = [p.option() for p in parts(ModelSpec.preset("llama-3.1-70b"), Cut.decode(128), [0, 41, 79])]


@pytest.mark.parametrize("part", LLAMA_70B_PARTS)
def test_llama_70b_parts(part: str) -> None:
    check_extracted("llama-3.1-70b", "decode ctx=128", Cut.parse(part))


@pytest.mark.parametrize("part", ["batch_layer layer=79 rows=2 ctx=32", "batch_head rows=2"])
def test_llama_70b_batch_parts(part: str) -> None:
    check_extracted("llama-3.1-70b", "batch rows=2 ctx=32", Cut.parse(part))


@pytest.mark.parametrize(
    ("whole", "part"),
    [
        ("decode ctx=64", "decode_layer layer=0 ctx=64"),
        ("decode ctx=64", "decode_layer layer=1 ctx=64"),
        ("batch rows=3 ctx=64", "batch_layer layer=1 rows=3 ctx=64"),
    ],
)
@pytest.mark.parametrize(("model", "tp"), [("tiny", 2), ("tiny-tp8", 8)])
def test_split_layers_are_the_authors(whole: str, part: str, model: str, tp: int) -> None:
    check_extracted(model, whole, Cut.parse(part), tp)


def test_the_whole_program_itself_is_left_as_it_is() -> None:
    module = whole_module("tiny", "decode ctx=64").clone()
    before = identity.the_program(module, "test")
    after = extract(module, "decode ctx=64")
    assert after is before
    assert module.is_structurally_equivalent(whole_module("tiny", "decode ctx=64"))


def test_the_extracted_program_passes_verify_identity_and_reparses() -> None:
    module = whole_module("tiny", "prefill rows=4 ctx=64").clone()
    program = extract(module, "prefill_head rows=4")
    VerifyIdentity().apply(Context(), module)
    text = print_program(program)
    assert "Let last be row 4 of x." in text
    again = parse_program(text)
    assert again.digest == program.digest and again.cut.data == "prefill_head rows=4"


def test_main_is_rewritten_with_its_function_type() -> None:
    whole = whole_module("tiny", "batch rows=3 ctx=64").clone()
    program = extract(whole, "batch_layer layer=1 rows=3 ctx=64")
    sections = [op.sym_name.data for op in program.block.ops if isinstance(op, func.FuncOp)]
    assert sections == ["main", "layer_1"]
    main = program.function("main")
    assert main is not None
    assert [str(t) for t in main.function_type.inputs] == []
    assert [str(t) for t in main.function_type.outputs] == ["tensor<3x64xf32>"]
    ops = list(main.body.block.ops)
    assert [type(op) for op in ops] == [logos.InputOp, logos.InputOp, func.CallOp, func.ReturnOp]
    assert [op.kind.data for op in ops[:2]] == ["position", "hidden"]  # type: ignore[attr-defined]
    assert [op.results[0].name_hint for op in ops[:3]] == ["positions", "x1", "x2"]


def test_parts_extract_one_after_another_from_clones() -> None:
    # Extraction never touches the whole module it was cloned from: the same whole gives every part.
    source = whole_module("tiny", "decode ctx=64")
    before = print_program(identity.the_program(source, "test"))
    for part in parts(ModelSpec.preset("tiny"), Cut.decode(64)):
        extract(source.clone(), part.option())
    assert print_program(identity.the_program(source, "test")) == before


# -- the option form -----------------------------------------------------------------------------------------


def test_option_with_spaces_goes_through_the_pipeline_syntax() -> None:
    [spec] = list(parse_pipeline('cut-extract{cut="decode_layer layer=3 ctx=128"}'))
    made = CutExtract.from_pass_spec(spec)
    assert made == CutExtract("decode_layer layer=3 ctx=128")
    assert str(made) == 'cut-extract{cut="decode_layer layer=3 ctx=128"}'
    assert registry.passes()["cut-extract"]() is CutExtract


def test_the_option_is_required() -> None:
    [spec] = list(parse_pipeline("cut-extract"))
    with pytest.raises(ValueError, match='requires argument "cut"'):
        CutExtract.from_pass_spec(spec)


# -- refusals ------------------------------------------------------------------------------------------------


REFUSALS = [
    ("tiny", "decode ctx=64", "decode_layer layer=2 ctx=64", "layer 2 does not exist: the model has layers 0 to 1"),
    ("smollm2-135m", "decode ctx=64", "decode_layer layer=30 ctx=64", "layer 30 does not exist"),
    (
        "tiny",
        "decode ctx=64",
        "batch_layer layer=0 rows=1 ctx=64",
        "a batch cut is part of a batch program, not of a decode program",
    ),
    ("tiny", "decode ctx=64", "prefill_head rows=1", "a prefill cut is part of a prefill program"),
    ("tiny", "batch rows=3 ctx=64", "decode_head", "a decode cut is part of a decode program"),
    ("tiny", "forward", "decode_embed", "a decode cut is part of a decode program"),
    ("tiny", "decode ctx=64", "decode_layer layer=0 ctx=128", "the program has 64 cache positions, the cut 128"),
    (
        "tiny",
        "prefill rows=4 ctx=64",
        "prefill_layer layer=0 rows=4 ctx=32",
        "the program has 64 cache positions, the cut 32",
    ),
    ("tiny", "prefill rows=4 ctx=64", "prefill_head rows=2", "the program has 4 rows, the cut 2"),
    ("tiny", "batch rows=3 ctx=64", "batch_embed rows=4", "the program has 3 rows, the cut 4"),
    ("tiny", "decode ctx=64", "decode ctx=128", "a whole program is not part of another"),
    ("tiny", "decode ctx=64", "prefill rows=4 ctx=64", "a whole program is not part of another"),
    ("tiny", "decode_layer layer=0 ctx=64", "decode_head", "a part of a part is not a cut"),
    ("tiny", "decode_head", "decode_layer layer=1 ctx=64", "a part of a part is not a cut"),
    ("tiny", "decode_layer layer=0 ctx=64", "decode_layer layer=1 ctx=64", "a part of a part is not a cut"),
]


def refused(module: ModuleOp, cut: str) -> PassError:
    with pytest.raises(PassError) as caught:
        CutExtract(cut).apply(Context(), module)
    return caught.value


@pytest.mark.parametrize(("model", "whole", "cut", "reason"), REFUSALS)
def test_refuses_what_is_not_part_of_the_program(model: str, whole: str, cut: str, reason: str) -> None:
    module = whole_module(model, whole).clone()
    error = refused(module, cut)
    message = error.message
    have, wanted = Cut.parse(whole), Cut.parse(cut)
    assert message.startswith("cut-extract: ")
    assert f"the program is the {have} ('{have.option()}')" in message
    assert f"the {wanted} ('{wanted.option()}')" in message
    assert reason in message
    assert module.is_structurally_equivalent(whole_module(model, whole))  # nothing was changed


def test_refusal_hints() -> None:
    module = whole_module("tiny", "decode ctx=64").clone()
    assert refused(module, "decode_layer layer=0 ctx=128").hint == "write the cut with ctx=64"
    part = whole_module("tiny", "decode_layer layer=0 ctx=64").clone()
    assert refused(part, "decode_head").hint == "extract from the whole program, 'decode ctx=64'"


@pytest.mark.parametrize(
    ("cut", "said"),
    [
        ("decode_layer layer=one ctx=64", "'layer' must be a whole number, not 'one'"),
        ("decode_step ctx=64", "unknown cut 'decode_step'"),
        ("decode_layer ctx=64 layer=0", "expected 'layer=N', got 'ctx=64'"),
        ("decode_head layer=0", "needs 0 argument(s)"),
        ("", "empty cut"),
    ],
)
def test_refuses_a_cut_it_cannot_read(cut: str, said: str) -> None:
    module = whole_module("tiny", "decode ctx=64").clone()
    error = refused(module, cut)
    assert error.message.startswith(f"cut-extract: the wanted cut '{cut}' cannot be read: ")
    assert said in error.message


@pytest.mark.parametrize("cut", ["decode_embed", "decode_head"])
def test_refuses_a_part_of_a_split_program_that_is_not_written_split(cut: str) -> None:
    module = whole_module("tiny", "decode ctx=64", 2).clone()
    error = refused(module, cut)
    assert error.message.startswith(
        f"cut-extract: cannot extract the {Cut.parse(cut)} ('{cut}') from the decode step, ctx 64 "
        "('decode ctx=64') split over 2 chips"
    )
    assert module.is_structurally_equivalent(whole_module("tiny", "decode ctx=64", 2))


def test_refuses_a_module_without_exactly_one_program() -> None:
    assert "found 0" in refused(ModuleOp([]), "decode_head").message
    two = ModuleOp([identity.the_program(whole_module("tiny", "decode ctx=64").clone(), "t").clone() for _ in range(2)])
    assert "found 2" in refused(two, "decode_head").message


def test_refuses_a_program_missing_the_section_and_changes_nothing() -> None:
    module = whole_module("tiny", "decode ctx=64").clone()
    program = identity.the_program(module, "test")
    layer = program.function("layer_1")
    assert layer is not None
    program.block.erase_op(layer)
    reference = module.clone()
    error = refused(module, "decode_layer layer=1 ctx=64")
    assert error.message.startswith("cut-extract: cannot extract the decode step's layer 1, ctx 64")
    assert "the program has no @layer_1 section" in error.message
    assert module.is_structurally_equivalent(reference)


def test_refuses_a_main_that_is_not_in_the_authors_form() -> None:
    # @main's call of layer 1 reads x0, a call's result, where the author gives it the position input
    module = whole_module("tiny", "decode ctx=64").clone()
    main = identity.the_program(module, "test").function("main")
    assert main is not None
    calls = [op for op in main.body.block.ops if isinstance(op, func.CallOp)]
    layer_1 = calls[2]
    assert layer_1.callee.root_reference.data == "layer_1"
    layer_1.operands[1] = calls[0].results[0]  # its position replaced by x0: not an input of @main
    reference = module.clone()
    error = refused(module, "decode_layer layer=1 ctx=64")
    assert "reads 'x0', which is not an input of @main" in error.message
    assert module.is_structurally_equivalent(reference)


# -- the parts run as the whole ------------------------------------------------------------------------------


def test_parts_decode_the_same_tokens_as_the_whole_step_on_the_embedded_model() -> None:
    from logos_ir.interpreter import Interpreter, KVState
    from logos_ir.weights import open_model

    weights = open_model("embedded")
    spec, ctx = weights.spec, 16
    text = write(spec, Cut.decode(ctx)).text
    whole_program = parse_program(text)
    module = ModuleOp([whole_program.clone()])

    def part(cut: Cut) -> logos.ProgramOp:
        program = extract(module.clone(), cut.option())
        assert print_program(program) == write(spec, cut).text
        return program

    whole = Interpreter(whole_program, weights, KVState())
    state = KVState()  # one state for the parts: each layer's caches are its own
    embed = Interpreter(part(Cut.decode_embed()), weights, state)
    layers = [Interpreter(part(Cut.decode_layer(i, ctx)), weights, state) for i in range(spec.layers)]
    head = Interpreter(part(Cut.decode_head()), weights, state)
    assert list(layers[3].inputs) == ["position", "x3"]
    assert list(head.inputs) == [f"x{spec.layers}"]

    token, whole_tokens, part_tokens = 1, [], []
    for position in range(1, 4):
        whole_next = int(whole.run(token=[token], position=[position])[0])
        hidden = embed.run(token=[token])
        for i, layer in enumerate(layers):
            hidden = layer.run(position=[position], **{f"x{i}": hidden})
            np.testing.assert_array_equal(hidden, whole.last_values[f"x{i + 1}"])
        part_next = int(head.run(**{f"x{spec.layers}": hidden})[0])
        whole_tokens.append(whole_next)
        part_tokens.append(part_next)
        token = whole_next
    assert part_tokens == whole_tokens
    assert all(1 <= t <= spec.vocab for t in whole_tokens)
