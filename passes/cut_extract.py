"""`cut-extract`: cut one part (a layer, the embedding, the head) out of a whole program, as the author
writes it.

    logos-opt decode.logos -p 'cut-extract{cut="decode_layer layer=3 ctx=128"}' -t logos

Assumes: a module holding exactly one `logos.program` whose @main is in the author's form for its cut:
`logos.input` token and position ops, then one `func.call` per section (`x0` = @embedding, `x{n+1}` =
@layer_n, then @head), then the return. The wanted cut (`cut`, in option form) is the program's own cut or
part of it (`Cut.part_of`): same family, same rows and ctx, a layer that exists; of a program split over
chips, only a layer (or the whole).

Guarantees: the program is replaced by the one the author writes for the wanted cut, byte for byte in its
LOGOS print: only the sections the cut needs, in their order; @main rewritten as the author writes it for
that cut (the section's call, fed by the inputs it reads and by a `logos.input hidden` op of the same name in
place of the call that produced its hidden state; everything else dropped; the call's result returned; the
function type fixed). Its identity is restamped: `cut` is the wanted cut, `chips` unchanged, `digest` the
SHA-256 of its own LOGOS print. Extracting the program's own cut changes nothing. Every refusal (an
unreadable cut, a cut not part of the program, @main not in the author's form) is a `PassError` naming the
pass, raised before anything is changed: the new program is built and verified beside the old one and
swapped in only when it is complete. The input's digest is not checked (run `verify-identity` first for
that); the sections the cut keeps are copied unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp
from xdsl.dialects.shard import GridOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from logos_ir import builder, identity
from logos_ir.dialects import logos
from logos_ir.errors import CutError, LogosError, PassError
from logos_ir.program import Cut

NAME = "cut-extract"


@dataclass(frozen=True)
class CutExtract(ModulePass):
    """Replaces the module's program by the part of it that `cut` (option form, e.g. `decode_layer layer=3
    ctx=128`) names, with its identity restamped. The module's docstring says what it assumes and
    guarantees."""

    name = NAME

    cut: str

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        program = identity.the_program(op, NAME)
        wanted = _read_cut(self.cut, "the wanted cut")
        if wanted == _read_cut(program.cut.data, "the program's cut"):
            return  # the whole program itself: nothing to cut
        new = extract(program, wanted)
        block = program.parent_block()
        assert block is not None
        block.insert_op_before(new, program)
        block.erase_op(program)


def extract(program: logos.ProgramOp, wanted: Cut) -> logos.ProgramOp:
    """The part `wanted` of `program` as a new program, verified and with its identity stamped; `program` is left
    as it was, so a caller that wants many parts of one program (a lane lowering every layer) extracts each
    without copying the whole. Refusals are the pass's."""
    have = _read_cut(program.cut.data, "the program's cut")
    _check_part(program, have, wanted)
    _check_split(program, have, wanted)
    new = _Extraction(program, wanted).build()
    try:
        identity.stamp(new, wanted, program.chips.value.data)
        new.verify()
    except VerifyException as error:
        raise PassError(f"{NAME}: the extracted {wanted} does not verify: {error}") from None
    except LogosError as error:
        raise PassError(f"{NAME}: the extracted {wanted} has no LOGOS print: {error.message}") from None
    return new


def _read_cut(text: str, what: str) -> Cut:
    try:
        return Cut.parse(text)
    except CutError as error:
        raise PassError(f"{NAME}: {what} '{text}' cannot be read: {error.message}", hint=error.hint) from None


def _check_part(program: logos.ProgramOp, have: Cut, wanted: Cut) -> None:
    """Refuse a wanted cut that is not part of the program, saying why."""
    reason = _not_part_because(program, have, wanted)
    if reason is not None:
        message, hint = reason
        raise PassError(
            f"{NAME}: the program is the {have} ('{have.option()}'), which does not contain the {wanted} "
            f"('{wanted.option()}'): {message}",
            hint=hint,
        )


def _not_part_because(program: logos.ProgramOp, have: Cut, wanted: Cut) -> tuple[str, str | None] | None:
    if have.kind not in Cut.WHOLE:
        whole = have.whole
        return (
            "the program is itself a part, and a part of a part is not a cut",
            f"extract from the whole program, '{whole.option()}'" if whole and wanted.part_of(whole) else None,
        )
    family, wanted_family = have.kind, wanted.kind.split("_")[0]
    if wanted.kind in Cut.WHOLE:
        return "a whole program is not part of another", None
    if wanted_family != family:
        return f"a {wanted_family} cut is part of a {wanted_family} program, not of a {family} program", None
    for name, noun in (("rows", "rows"), ("ctx", "cache positions")):
        mine, theirs = getattr(have, name), getattr(wanted, name)
        if theirs is not None and theirs != mine:
            return f"the program has {mine} {noun}, the cut {theirs}", f"write the cut with {name}={mine}"
    if not wanted.part_of(have):  # what the checks above did not name
        return "it is not part of it", None
    try:
        layers = program.spec.layers
    except VerifyException as error:
        return f"the program's model attribute is not a valid spec: {error}", None
    if wanted.layer is not None and wanted.layer >= layers:
        return f"layer {wanted.layer} does not exist: the model has layers 0 to {layers - 1}", None
    return None


def _check_split(program: logos.ProgramOp, have: Cut, wanted: Cut) -> None:
    """Refuse a part of a split program that the author does not write split (all but a layer)."""
    if wanted.kind in Cut.SPLITTABLE or not any(isinstance(op, GridOp) for op in program.block.ops):
        return
    chips = program.chips.value.data
    raise PassError(
        f"{NAME}: cannot extract the {wanted} ('{wanted.option()}') from the {have} ('{have.option()}') "
        f"split over {chips} chips: of a split program, only a layer is written split",
        hint="extract the part before splitting (cut-extract before tp-split)",
    )


def _callee(call: func.CallOp) -> str:
    return call.callee.root_reference.data


def _section_of(cut: Cut) -> str:
    """The symbol of the one section a part keeps."""
    part = cut.kind.partition("_")[2]
    if part == "layer":
        return f"layer_{cut.layer}"
    return {"embed": "embedding", "head": "head"}[part]


class _Extraction:
    """The new program for a part of a whole one, built beside it: nothing of the old program is changed."""

    def __init__(self, program: logos.ProgramOp, wanted: Cut):
        self.program, self.wanted = program, wanted
        self.sym = _section_of(wanted)

    def fail(self, message: str, hint: str | None = None) -> PassError:
        wanted, have = self.wanted, Cut.parse(self.program.cut.data)
        return PassError(
            f"{NAME}: cannot extract the {wanted} ('{wanted.option()}') from the {have} ('{have.option()}'): {message}",
            hint=hint,
        )

    def build(self) -> logos.ProgramOp:
        sections: dict[str, func.FuncOp] = {}
        top: list[Operation] = []
        for op in self.program.block.ops:
            if isinstance(op, func.FuncOp):
                sections[op.sym_name.data] = op
            elif not isinstance(op, GridOp):
                raise self.fail(f"'{op.name}' at the top of the program is not a section")
            top.append(op)
        main = sections.get("main")
        if main is None:
            raise self.fail("the program has no @main section")
        if self.sym not in sections:
            raise self.fail(f"the program has no @{self.sym} section")
        new_main = self._main(main)
        ops: list[Operation] = []
        for op in top:
            if op is main:
                ops.append(new_main)
            elif isinstance(op, GridOp) or op is sections[self.sym]:
                ops.append(op.clone())
        return logos.ProgramOp.create(
            properties=self.program.properties.copy(),
            attributes=self.program.attributes.copy(),
            regions=[logos.program_body(ops)],
        )

    def _main(self, main: func.FuncOp) -> func.FuncOp:
        """@main as the author writes it for the part: the section's call, fed by the inputs it reads and,
        for a layer or the head, a hidden-state input in place of the call that produced its hidden state."""
        block = main.body.block
        calls = [op for op in block.ops if isinstance(op, func.CallOp) and _callee(op) == self.sym]
        if len(calls) != 1:
            raise self.fail(f"@main calls @{self.sym} {len(calls)} times, not once", "is @main in the author's form?")
        call = calls[0]
        if len(call.results) != 1:
            raise self.fail(f"the call of @{self.sym} has {len(call.results)} results, not one")
        hidden = call.arguments[0] if self.sym != "embedding" and call.arguments else None
        order = {op: index for index, op in enumerate(block.ops)}
        placed: list[tuple[int, Operation]] = []
        mapping: dict[SSAValue, SSAValue] = {}
        for value in call.arguments:
            if value in mapping:
                continue
            owner = value.owner
            if not isinstance(owner, Operation) or owner not in order:
                raise self.fail(f"the call of @{self.sym} reads a value that @main does not define")
            if value is hidden:
                new_input = self._hidden_input(value)
            elif isinstance(owner, logos.InputOp) and owner.kind.data != "hidden":
                new_input = owner.clone()
            else:
                raise self.fail(
                    f"the call of @{self.sym} reads '{value.name_hint}', which is not an input of @main",
                    "is @main in the author's form?",
                )
            mapping[value] = new_input.results[0]
            placed.append((order[owner], new_input))
        placed.sort(key=lambda entry: entry[0])
        new_call = call.clone(value_mapper=dict(mapping))
        result = new_call.results[0]
        new_block = Block([op for _, op in placed] + [new_call, func.ReturnOp(result)])
        new_main = main.clone_without_regions()
        new_main.function_type = FunctionType.from_lists([], [result.type])
        new_main.body.add_block(new_block)
        return new_main

    def _hidden_input(self, value: SSAValue) -> logos.InputOp:
        op = logos.InputOp.create(properties={"kind": builder.string("hidden")}, result_types=[value.type])
        op.results[0].name_hint = value.name_hint or self._hidden_name()
        return op

    def _hidden_name(self) -> str:
        """The author's name for the part's hidden-state input: x{layer}, or x{layers} for the head."""
        if self.wanted.layer is not None:
            return f"x{self.wanted.layer}"
        return f"x{self.program.spec.layers}"
