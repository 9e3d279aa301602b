"""The spatial lane's static check refuses what cslc would: a DSD whose length is known only at run time
(the SDK's `tensor_access` and `extent` take lengths known at compile time; a run-time length is `@set_dsd_length`'s,
a u16), a length outside a u16, a queue the target does not give a program (memcpy's), a queue serving two colours
or unbound on a WSE-3 (and, on each element, bound to a colour other than the one its DSDs and routes use), a
segmented line on a WSE-3, a local task id outside the target's. Each refusal is made from the tiny model's lowered
module with one op edited, so the unedited module passing is what the edit breaks.
"""

from __future__ import annotations

import pytest
from xdsl.dialects import arith, csl
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i16, i32
from xdsl.ir import Operation

from logos_ir.errors import PassError
from logos_ir.passes.spatial.verify_grid import layout_params, split_modules, static_check
from logos_ir.spec import ModelSpec

SPEC = ModelSpec.preset("tiny")


@pytest.fixture(scope="module")
def lowered():  # type: ignore[no-untyped-def]
    from logos_ir.testing import lower_decode

    return lower_decode(SPEC, 16, "f32")


def _check(module: ModuleOp, host: dict, arch: str | None = None) -> None:
    static_check(module, params=layout_params(host), arch=arch)


def _ops(module: ModuleOp, kind: type[Operation], function: str | None = None) -> list:
    program, _ = split_modules(module)
    found = []
    for top in program.body.block.ops:
        if function is not None and getattr(top, "sym_name", None) is not None and top.sym_name.data != function:
            continue
        if function is not None and not isinstance(top, csl.FuncOp):
            continue
        found.extend(op for op in top.walk() if isinstance(op, kind))
    return found


def test_the_lowered_program_passes_and_its_run_time_lengths_are_set_on_compile_time_dsds(lowered) -> None:  # type: ignore[no-untyped-def]
    _check(lowered.module, lowered.host)
    sizes = [op.sizes[0].owner for op in _ops(lowered.module, csl.GetMemDsdOp | csl.GetFabDsdOp)]
    assert sizes and all(isinstance(s, arith.ConstantOp) for s in sizes)
    lengths = _ops(lowered.module, csl.SetDsdLengthOp, "reduce_row_fadds")
    assert lengths and all(str(op.length.type) == "ui16" for op in lengths)


def test_a_dsd_length_known_only_at_run_time_is_refused(lowered) -> None:  # type: ignore[no-untyped-def]
    module = lowered.module.clone()
    fn = next(op for op in _ops(module, csl.FuncOp) if op.sym_name.data == "reduce_row_fadds")
    memory = next(op for op in fn.walk() if isinstance(op, csl.GetMemDsdOp))
    memory.operands[1] = fn.body.block.args[0]  # the function's argument as the tensor_access length
    with pytest.raises(
        PassError, match=r"mem1d_dsd\) over line_row in reduce_row_fadds has a length known only at run"
    ):
        _check(module, lowered.host)


def test_a_signed_run_time_length_and_a_length_past_a_u16_are_refused(lowered) -> None:  # type: ignore[no-untyped-def]
    module = lowered.module.clone()
    length = _ops(module, csl.SetDsdLengthOp, "reduce_row_fadds")[0]
    signed = arith.ConstantOp(IntegerAttr(3, i16))
    length.parent_block().insert_op_before(signed, length)
    length.operands[1] = signed.result
    with pytest.raises(PassError, match=r"in reduce_row_fadds sets a length of type i16: it takes a u16"):
        _check(module, lowered.host)
    module = lowered.module.clone()
    dsd = _ops(module, csl.GetMemDsdOp, "embedding")[0]
    wide = arith.ConstantOp(IntegerAttr(70000, i32))
    dsd.parent_block().insert_op_before(wide, dsd)
    dsd.operands[1] = wide.result
    with pytest.raises(PassError, match=r"over .* in embedding has length 70000: a u16 holds 0 to 65535"):
        _check(module, lowered.host)


def test_queues_the_target_does_not_give_are_refused(lowered) -> None:  # type: ignore[no-untyped-def]
    module = lowered.module.clone()
    receive = next(op for op in _ops(module, csl.GetFabDsdOp) if op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd))
    receive.queue_id = IntegerAttr(0, receive.queue_id.type)  # memcpy's input queue
    with pytest.raises(PassError, match=r"uses input queue 0: a wse2 program has input queues 1 to 7"):
        _check(module, lowered.host)
    # a WSE-2's program (one input queue for every colour) on a WSE-3, which binds a queue to one colour
    with pytest.raises(
        PassError, match=r"uses output queue 3, which no @initialize_queue binds to colour \d+ \(a wse3"
    ):
        _check(lowered.module, lowered.host, "wse3")


def test_a_segmented_line_is_refused_by_name_on_a_wse3() -> None:
    """A line of several segments (the WSE-2's two phases, grid 18) uses the segments' centres' colours, which a
    WSE-3's 6 queues a direction do not take: bind_queues refuses it, naming the colours."""
    from logos_ir.dialects import csl_ext
    from logos_ir.passes.spatial.queues import bind_queues
    from logos_ir.testing import lower_decode

    program, _ = split_modules(lower_decode(SPEC, 16, "f32", 18).module)
    with pytest.raises(PassError, match=r"uses colours 4, 5, 6, 7, 13, 14, 15, 16, 18, outside the one-segment line's"):
        bind_queues(program, csl_ext.TARGETS["wse3"])


def _lowered_wse3(p: int = 0):  # type: ignore[no-untyped-def]
    """The tiny model's decode step (ctx 16, f32) lowered for a WSE-3."""
    from logos_ir.testing import lower_decode

    return lower_decode(SPEC, 16, "f32", p, arch="wse3")


def test_a_wse3_program_binds_each_element_s_queues_to_the_colours_it_uses() -> None:
    """On a WSE-3 the tiny model's program (P = 7: two chains of three a line) uses the 6 input and 6 output queues
    memcpy leaves, each bound by @initialize_queue to a broadcast's colour or to the element's own chain colour (a
    `color` parameter the layout gives by parity); every element's DSDs and routes agree with its bindings. Each
    edit below breaks one rule and is refused: a literal binding changed, a chain's colours swapped on the
    elements, a queue initialized twice, a DSD moved to another class's queue."""
    from xdsl.dialects.builtin import IntAttr

    from logos_ir.dialects import csl_ext
    from logos_ir.passes.spatial.emit_csl import print_csl

    lowered = _lowered_wse3(7)
    static_check(lowered.module, params=layout_params(lowered.host))
    program, layout = split_modules(lowered.module)
    bindings = [op for op in program.walk() if isinstance(op, csl_ext.InitializeQueueOp)]
    assert sorted((op.inbound, op.queue.data) for op in bindings) == [
        (b, q) for b in (False, True) for q in range(2, 8)
    ]
    used = {
        (op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd), csl_ext.queue_id(op))
        for op in _ops(lowered.module, csl.GetFabDsdOp)
    }
    assert used <= {(op.inbound, op.queue.data) for op in bindings}
    text = print_csl(lowered.module)
    assert "param row_west_in : color;" in text["pe_program.csl"]
    assert "@initialize_queue(@get_input_queue(2), .{ .color = row_west_in });" in text["pe_program.csl"]
    assert "@initialize_queue(@get_input_queue(4), .{ .color = @get_color(8) });" in text["pe_program.csl"]
    assert ".row_west_in = @get_color((0 + ((" in text["layout.csl"]

    module = lowered.module.clone()
    broadcast = next(
        op
        for op in split_modules(module)[0].walk()
        if isinstance(op, csl_ext.InitializeQueueOp) and op.colour is not None and op.inbound
    )
    broadcast.colour = IntAttr(9)
    with pytest.raises(PassError, match=r"uses input queue 4, which no @initialize_queue binds to colour 8"):
        static_check(module, params=layout_params(lowered.host))

    module = lowered.module.clone()
    struct = next(
        op for op in split_modules(module)[1].walk() if isinstance(op, csl.ConstStructOp) and len(op.operands) > 3
    )
    names = [f.data for f in struct.ssa_fields.data]  # type: ignore[union-attr]
    struct.operands[names.index("row_west_in")] = struct.operands[names.index("row_west_out")]
    with pytest.raises(
        PassError, match=r"on element \(\d, 0\) names its colour as the parameter row_west_in, which is"
    ):
        static_check(module, params=layout_params(lowered.host))

    module = lowered.module.clone()
    program = split_modules(module)[0]
    params = {op.param_name.data: op.res for op in program.body.block.ops if isinstance(op, csl.ParamOp)}
    west = next(
        op for op in program.walk() if isinstance(op, csl_ext.InitializeQueueOp) and op.param_name == "row_west_in"
    )
    west.operands[0] = params["row_east_in"]  # input queue 2 bound to the eastern chain's colour
    with pytest.raises(PassError, match=r"on element \(\d, 0\) uses input queue 2, which that element binds to colour"):
        static_check(module, params=layout_params(lowered.host))

    module = lowered.module.clone()
    split_modules(module)[0].body.block.add_op(csl_ext.InitializeQueueOp(True, 4, 9))
    with pytest.raises(PassError, match=r"input queue 4 is initialized twice \(with colour 8 and colour 9\)"):
        static_check(module, params=layout_params(lowered.host))

    module = lowered.module.clone()
    receive = next(
        op
        for op in _ops(module, csl.GetFabDsdOp)
        if op.fabric_color.value.data == 8 and op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
    )
    receive.queue_id = IntegerAttr(7, receive.queue_id.type)  # the column broadcast's queue
    with pytest.raises(PassError, match=r"uses input queue 7, which no @initialize_queue binds to colour 8"):
        static_check(module, params=layout_params(lowered.host))

    configs = [op for op in split_modules(lowered.module)[1].walk() if isinstance(op, csl_ext.SetColorConfigOp)]
    free = min(set(range(csl_ext.COLOURS)) - {op.colour.data for op in configs} - set(csl_ext.RESERVED_COLOURS))
    for delivers, message in ((True, f"delivers colour {free} to it, and it binds no input"),
                              (False, f"takes colour {free} from it, and it binds no output")):  # fmt: skip
        module = lowered.module.clone()
        config = next(  # a route to (or from) the element's ramp moved to a colour no queue is bound to
            op
            for op in split_modules(module)[1].walk()
            if isinstance(op, csl_ext.SetColorConfigOp)
            and ("RAMP" in (op.transmits if delivers else op.receives))
            and op.receives != ("RAMP",) * delivers
        )
        config.colour = IntAttr(free)
        with pytest.raises(PassError, match=r"the router of element \(\d+, \d+\) " + message):
            static_check(module, params=layout_params(lowered.host))


def test_local_task_ids_outside_the_target_are_refused(lowered) -> None:  # type: ignore[no-untyped-def]
    module = lowered.module.clone()
    task = next(op for op in _ops(module, csl.TaskOp))
    task.id = IntegerAttr(27, task.id.type)  # memcpy's
    with pytest.raises(PassError, match=r"local task id 27 \(\w+\) is not one a wse2 gives: 0 to 30, less memcpy's"):
        _check(module, lowered.host)


def _one_colour_program() -> ModuleOp:
    """A program that sends and receives on colour 8 (one output and one input fabric DSD: a row's broadcast) and an
    empty layout."""
    from xdsl.dialects.builtin import FunctionType, StringAttr
    from xdsl.ir import Block, Region

    from logos_ir.passes.spatial.emit import Emit

    block = Block()
    e = Emit(block)
    e.fabric(8, 4, False)
    e.fabric(8, 4, True)
    e.op(csl.ReturnOp())
    top = Block([csl.FuncOp("f", FunctionType.from_lists([], []), Region(block))])
    program = csl.CslModuleOp(
        regions=[Region(top)],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.PROGRAM), "sym_name": StringAttr("pe_program")},
    )
    layout = csl.CslModuleOp(
        regions=[Region(Block())],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.LAYOUT), "sym_name": StringAttr("layout")},
    )
    return ModuleOp([program, layout])


def test_a_wse3_program_binds_each_queue_to_its_one_colour() -> None:
    from logos_ir.dialects import csl_ext
    from logos_ir.passes.spatial.emit_csl import print_csl
    from logos_ir.passes.spatial.queues import bind_queues

    module = _one_colour_program()
    program, _ = split_modules(module)
    with pytest.raises(PassError, match=r"uses output queue 3, which no @initialize_queue binds to colour 8"):
        static_check(module, arch="wse3")
    bind_queues(program, csl_ext.TARGETS["wse3"])
    static_check(module)  # the program's own target (csl_ext.arch = wse3)
    text = print_csl(module)["pe_program.csl"]
    assert "@initialize_queue(@get_input_queue(4), .{ .color = @get_color(8) });" in text
    assert "@initialize_queue(@get_output_queue(4), .{ .color = @get_color(8) });" in text
    program.body.block.add_op(csl_ext.InitializeQueueOp(True, 4, 6))
    with pytest.raises(PassError, match=r"input queue 4 is initialized twice \(with colour 8 and colour 6\)"):
        static_check(module)


def test_a_layout_moves_out_of_its_loop_only_what_cannot_fail() -> None:
    """The layout runs as one function whose loop-invariant arithmetic runs before the loop; `6 / (width - 1)` in a
    branch taken where width > 1 is loop-invariant but may fail, so it stays in its branch: a rectangle of width 1
    (the branch never taken) reads, and one of width 3 gives each element what walking the ops gives (C's truncating
    remainder of a negative number, -1, included)."""
    from xdsl.dialects.builtin import StringAttr
    from xdsl.ir import Block, Region

    from logos_ir.passes.spatial.emit import Emit
    from logos_ir.passes.spatial.verify_grid import read_layout

    outer, block = Block(), Block()
    top, e = Emit(outer), Emit(block)
    width = top.op(csl.ParamOp("width", i16)).results[0]
    height = top.op(csl.ParamOp("height", i16)).results[0]
    e.op(csl.SetRectangleOp(operands=[width, height]))
    with e.loop_i16(width) as (column, x):
        wider = column.bin(arith.SubiOp, width, column.int(1, i16))  # the same in every column: moved out
        with column.when(column.cmp(wider, column.int(0, i16), "sgt")) as taken:
            q = taken.bin(arith.DivSIOp, taken.int(6, i16), wider)  # by width - 1, 0 where width is 1: stays
            back = taken.bin(arith.SubiOp, x, taken.int(2, i16))
            parity = taken.bin(arith.RemSIOp, back, taken.int(2, i16))  # (x - 2) rem 2: -1 at x = 1
            struct = taken.op(csl.ConstStructOp(("q", q), ("parity", parity))).results[0]
            taken.op(csl.SetTileCodeOp("pe_program.csl", x, taken.int(0, i16), struct))
    top.op(csl.LayoutOp(Region(block)))
    layout = csl.CslModuleOp(
        regions=[Region(outer)],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.LAYOUT), "sym_name": StringAttr("layout")},
    )
    assert read_layout(layout, {"width": 1, "height": 1}).params == {}
    three = read_layout(layout, {"width": 3, "height": 1})
    assert three.params == {(x, 0): {"q": 3, "parity": parity} for x, parity in enumerate((0, -1, 0))}
