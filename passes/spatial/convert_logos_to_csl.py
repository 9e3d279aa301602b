"""`convert-logos-to-csl`: a decode step's parts (the embedding, each layer, the head), as their LOGOS programs say,
lowered to one CSL program for a P x P grid (the whole-grid mapping of `passes/spatial/grid.py`) and its layout.

Assumes: the parts of one decode step on one chip, each a `logos.program` as `extract-parts` makes them (so each is
exactly what the author wrote for it). Guarantees: a module of two `csl.module`s, the layout (`@set_rectangle`,
`@set_tile_code` for each element with its coordinates and memcpy parameters, every router's colour configuration)
and the element program (its arrays, one function per part: `embedding`, `layer` (every layer runs the one function,
the layer's arrays found by its index), `head`; the local tasks that run them in turn; the exported `step` the host
launches), printable by xDSL's CSL printer and executable by the fabric simulator. The layers' programs must lower
to the same code (they do: the author writes them alike); a part the lane does not lower is refused with the op's
name, before the module is changed.

Where the lane's code lives: each logos op's element code is a rewrite pattern (`op_patterns.py`) over a copy of its
part's section, with the state and helpers they share (`part.py`), the reductions along a line (`reductions.py`) and
the emitter (`emit.py`). What is not a per-op rewrite stays plain functions: the element program's frame (its
arrays, tasks and exports) and the host's description, here; the layout (`layout.py`), which follows from the grid
plan alone; the grid search (`lower_module`: the smallest P whose elements hold the lowered program, then the one
with the most working elements), which lowers the parts once per size it tries and so is a loop around the
patterns, not one of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.context import Context
from xdsl.dialects import arith, csl, func, memref
from xdsl.dialects.builtin import (
    FunctionType,
    IntegerType,
    MemRefType,
    ModuleOp,
    Signedness,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    i16,
    i32,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from logos_ir.dialects import csl_ext, logos
from logos_ir.errors import CutError, PassError
from logos_ir.identity import identity
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.element_program import PASS, Program, Vec
from logos_ir.passes.spatial.emit import Emit
from logos_ir.passes.spatial.layout import layout_module
from logos_ir.passes.spatial.op_patterns import lower_part
from logos_ir.passes.spatial.part import PartLowering, array_name, feeds_of
from logos_ir.passes.spatial.queues import bind_queues
from logos_ir.program import Cut, Identity

# -- the element program and the host's description ------------------------------------------------------------

u16 = IntegerType(16, Signedness.UNSIGNED)
TSC_WORDS = 3  # <time>'s tsc_size_words: a 48-bit cycle counter
TIMESTAMPS = ("step_start", "step_end")  # exported: the host reads them back to time the step


@dataclass
class GridProgram:
    """The lowered decode step: the module of `csl.module`s (program and layout) and what the host needs to run
    it (`host`: the grid, each weight array's tensors and tiling, the rotary tables, the logits' array)."""

    module: ModuleOp
    plan: g.GridPlan
    host: dict[str, Any]


def _function(name: str, program: Program, comment: str, args: Sequence[Any] = ()) -> tuple[Emit, csl.FuncOp]:
    block = Block(arg_types=list(args))
    e = Emit(block)
    e.op(csl_ext.CommentOp(comment))
    return e, csl.FuncOp(name, FunctionType.from_lists(list(args), []), Region(block))


def _section(program: logos.ProgramOp) -> func.FuncOp:
    """The one section of a part (its function besides @main)."""
    functions = [op for op in program.block.ops if isinstance(op, func.FuncOp) and op.sym_name.data != "main"]
    if len(functions) != 1:
        raise PassError(f"{PASS}: a part holds one function besides main, found {len(functions)}")
    return functions[0]


def _lower_section(program: Program, e: Emit, layer: SSAValue | None, part: logos.ProgramOp) -> None:
    """A part's section lowered into `e`'s function (a copy of it is rewritten: the module is left as it is)."""
    section = _section(part).clone()
    lower_part(PartLowering(program, e, layer, feeds_of(section.body.block)), section, part.spec)


def lower_parts(
    parts: Sequence[tuple[Cut, Identity, logos.ProgramOp]], plan: g.GridPlan, layer_keys: dict[int, str] | None = None
) -> GridProgram:
    """The decode step's parts ((cut, identity, program) in model order: embedding, layers, head) as one
    element program and its layout for `plan`'s grid. `layer_keys` keeps each layer part's `_layer_key` (by the part's
    id) for the next lowering of the same parts (a grid search lowers them many times)."""
    layer_keys = {} if layer_keys is None else layer_keys
    top = Block()
    program = Program(plan, Emit(top))
    t = program.top
    program.memcpy = None
    memcpy_params = t.op(csl.ParamOp("memcpy_params", csl.ComptimeStructType())).results[0]
    program.px = t.op(csl.ParamOp("px", i16)).results[0]
    program.py = t.op(csl.ParamOp("py", i16)).results[0]
    program.memcpy = t.op(csl.ImportModuleConstOp("<memcpy/memcpy>", memcpy_params)).results[0]
    program.math = t.op(csl.ImportModuleConstOp("<math>")).results[0]
    program.time = t.op(csl.ImportModuleConstOp("<time>")).results[0]
    for name in ("token_in", "position_in", "layer_at"):
        program.array(name, 1, i32)
    for name in TIMESTAMPS:  # the step's start and end (csl-examples topic-02-libraries: [tsc_size_words]u16)
        program.array(name, TSC_WORDS, u16)
    program.array("norm_sum", 1)
    if g.SEGMENTED:  # the reduction functions' buffers: the longest message along a row, along a column
        queries, keys, hidden = plan.query_chunk, plan.kv_chunk, plan.chunk(plan.hidden, "col")
        scores = (plan.window if plan.scores_local else plan.heads) * plan.slots + plan.window
        logits = 1 if plan.compact else plan.chunk(plan.vocab, "row")  # compact: the logits reduced in pieces
        program.array(
            "line_row",
            max(logits, queries + 2 * keys, 2 * plan.chunk(plan.intermediate, "row"), queries + plan.window, hidden, 1),
        )
        normed = any(isinstance(op, logos.HeadRMSNormOp) for _, _, part in parts for op in part.walk())
        program.array("line_col", max(hidden, scores, plan.heads if normed else 1))  # a head norm's sums
    functions: list[Operation] = []
    identities: list[str] = []
    embed_cut, *layer_parts, head_cut = parts
    program.layer_tensors = _layer_tensors([_section(part).body.block for _, _, part in layer_parts])
    # the embedding
    e, fn = _function("embedding", program, embed_cut[1].line())
    _lower_section(program, e, None, embed_cut[2])
    e.op(csl.ReturnOp())
    functions.append(fn)
    identities.append(embed_cut[1].line())
    # the layers: one function, every layer's program lowered to the same code
    layer_fn = None
    first_text = ""
    for cut, ident, part in layer_parts:
        text = layer_keys.get(id(part))
        if text is None:
            text = layer_keys[id(part)] = _layer_key(_section(part).body.block)
        if layer_fn is None:
            e, layer_fn = _function("layer", program, "layers: " + ident.line(), [i32])
            _lower_section(program, e, layer_fn.body.block.args[0], part)
            e.op(csl.ReturnOp())
            first_text = text
        elif text != first_text:
            raise PassError(f"{PASS}: {cut.option()} is not written as layer 0 is; every layer must run one function")
        identities.append(ident.line())
    assert layer_fn is not None
    functions.append(layer_fn)
    # the head
    e, fn = _function("head", program, head_cut[1].line())
    _lower_section(program, e, None, head_cut[2])
    e.op(csl.ReturnOp())
    functions.append(fn)
    identities.append(head_cut[1].line())
    logits: Vec = program.handles["logits"]  # type: ignore[assignment]
    # declarations first, then functions, tasks, the entry and the exports
    for name, (words, element) in program.arrays.items():
        t.op(memref.GlobalOp.get(StringAttr(name), MemRefType(element, [words]), UnitAttr(), StringAttr("public")))
    for fn in [*program.reducers.values(), *functions]:
        t.op(fn)
    _tasks(program, plan.layers)
    stored = [f"{n}_{part}" for n, w in plan.weights.items() if w.format for part in ("scales", "slots")]
    exports = [*plan.weights, *stored, *program.handles.get("rope_tables", {}), logits.array, *TIMESTAMPS]  # type: ignore[arg-type]
    for name in exports:
        words, element = program.arrays[name]
        array = program.get(t, name)
        pointer = csl.PtrType(element, csl.PtrKindAttr(csl.PtrKind.MANY), csl.PtrConstAttr(csl.PtrConst.VAR))
        address = t.op(csl.AddressOfOp(array, pointer)).results[0]
        t.op(csl.SymbolExportOp(name, address))
    t.op(csl.SymbolExportOp("step", FunctionType.from_lists([i32, i32], [])))
    program_module = csl.CslModuleOp(
        regions=[Region(top)],
        properties={"kind": csl.ModuleKindAttr(csl.ModuleKind.PROGRAM), "sym_name": StringAttr("pe_program")},
    )
    layout = layout_module(plan)
    host = {
        "grid": list(plan.grid),
        "kv_copies": plan.kv_copies,
        "ctx": plan.ctx,
        "image": plan.image,
        "weights": {name: w.fields() for name, w in plan.weights.items()},
        "rope_tables": dict(program.handles.get("rope_tables", {})),  # type: ignore[arg-type]
        "logits": {"array": logits.array, "chunk": logits.chunk, "column": plan.centre, "length": logits.length},
        "argmax": "host",
        "identities": identities,
        "arrays": {name: [words, str(element)] for name, (words, element) in program.arrays.items()},
    }
    return GridProgram(ModuleOp([program_module, layout]), plan, host)


def _layer_key(body: Block) -> str:
    """A layer's function as its LOGOS program writes it, its layer number and its weights' tensor names left out:
    layers with the same key lower to the same code (the lowering reads the ops, their shapes and properties; a
    weight's tensor is only what the host loads into its array, `_layer_tensors`)."""
    text = "\n".join(str(op) for op in body.ops)
    text = re.sub(r'logos.weight "[^"]*"', 'logos.weight ""', text)
    text = re.sub(r"(logos.attention [^\n]*) window \d+", r"\1", text)  # a layer's window: its cache (`rings`)
    # a layer's rope base and scaling: the plan's (`local_theta`), each layer's tables chosen by its index
    text = re.sub(r"(logos.rope [^\n]*) theta [^ ]+ : f64( linear_scaling <[^>]*>| scaling <[^>]*>)?", r"\1", text)
    return re.sub(r"(layers\.|layer )\d+", r"\1N", text)


def _layer_tensors(bodies: Sequence[Block]) -> dict[str, tuple[str, ...]]:
    """Each layer weight's tensor in each layer's program, by the weight's name (the array it is loaded into)."""
    tensors: dict[str, list[str]] = {}
    for body in bodies:
        for op in body.ops:
            if isinstance(op, logos.WeightOp):
                tensors.setdefault(array_name(op.result), []).append(op.tensor.data)
    return {name: tuple(found) for name, found in tensors.items()}


def _tasks(program: Program, layers: int) -> None:
    t = program.top
    assert program.memcpy is not None
    # embed_task: the embedding, then the first layer
    block = Block()
    e = Emit(block)
    e.op(csl.CallOp(SymbolRefAttr("embedding"), []))
    e.store(e.int(0), program.get(e, "layer_at"), e.int(0))
    e.op(csl.ActivateOp(g.LAYER_TASK, csl.TaskKind.LOCAL))
    e.op(csl.ReturnOp())
    t.op(csl.TaskOp("embed_task", ([], None), Region(block), task_kind=csl.TaskKind.LOCAL, id=g.EMBED_TASK))
    # layer_task: one layer, then the next (activating itself) or, after the last, unblocking the head
    block = Block()
    e = Emit(block)
    at = program.get(e, "layer_at")
    layer = e.load(at, e.int(0))
    e.op(csl.CallOp(SymbolRefAttr("layer"), [layer]))
    following = e.bin(arith.AddiOp, layer, e.int(1))
    e.store(following, at, e.int(0))
    more, done, op = e.branch(e.cmp(following, e.int(layers), "slt"))
    more.op(csl.ActivateOp(g.LAYER_TASK, csl.TaskKind.LOCAL))
    done.op(csl_ext.UnblockOp(g.HEAD_TASK))
    e.end_branch(more, done, op)
    e.op(csl.ReturnOp())
    t.op(csl.TaskOp("layer_task", ([], None), Region(block), task_kind=csl.TaskKind.LOCAL, id=g.LAYER_TASK))
    # head_task: the head, then the host's command stream goes on (the launch is over)
    block = Block()
    e = Emit(block)
    e.op(csl.CallOp(SymbolRefAttr("head"), []))
    _timestamp(program, e, "step_end")
    e.op(csl.MemberCallOp("unblock_cmd_stream", None, program.memcpy, []))
    e.op(csl.ReturnOp())
    t.op(csl.TaskOp("head_task", ([], None), Region(block), task_kind=csl.TaskKind.LOCAL, id=g.HEAD_TASK))
    # step(token, position): launched by the host with the token (from 0) and its position (from 1) as the launch's
    # arguments (as csl-examples' benchmarks pass theirs: `runner.launch("f_spmv", np.int16(zDim))`), kept for the
    # parts in token_in and position_in; the head waits (blocked) for the last layer
    block = Block(arg_types=[i32, i32])
    e = Emit(block)
    e.store(block.args[0], program.get(e, "token_in"), e.int(0))
    e.store(block.args[1], program.get(e, "position_in"), e.int(0))
    e.op(csl.MemberCallOp("enable_tsc", None, program.time, []))
    _timestamp(program, e, "step_start")
    e.op(csl_ext.BlockOp(g.HEAD_TASK))
    e.op(csl.ActivateOp(g.HEAD_TASK, csl.TaskKind.LOCAL))
    e.op(csl.ActivateOp(g.EMBED_TASK, csl.TaskKind.LOCAL))
    e.op(csl.ReturnOp())
    t.op(csl.FuncOp("step", FunctionType.from_lists([i32, i32], []), Region(block)))


def _timestamp(program: Program, e: Emit, name: str) -> None:
    """`<time>`'s `get_timestamp(&name)`: the element's cycle counter, 48 bits in three u16 words, so a run on the
    machine measures the decode step (csl-examples topic-02-libraries; WaferLLM times its decode the same way)."""
    array = program.get(e, name)
    pointer = csl.PtrType(
        MemRefType(u16, [TSC_WORDS]), csl.PtrKindAttr(csl.PtrKind.SINGLE), csl.PtrConstAttr(csl.PtrConst.VAR)
    )
    address = e.op(csl.AddressOfOp(array, pointer)).results[0]
    e.op(csl.MemberCallOp("get_timestamp", None, program.time, [address]))


def memory_use(program: GridProgram) -> dict[str, Any]:
    """An element's memory: its arrays (every element declares the same) and its code (`csl_ext.code_bytes`, an
    estimate: the SDK publishes no code-size figure per builtin), and as a band (`csl_ext.memory_band`: the code at
    the low and high bytes an op, the `<math>` routines, software division, memcpy's component, a stack). `fits` is
    the band's high end: a grid fits when it is within the element's memory."""
    arrays = sum(words * csl_ext.element_bytes(element) for words, element in program.host["arrays"].values())
    module = next(
        op for op in program.module.ops if isinstance(op, csl.CslModuleOp) and op.kind.data == csl.ModuleKind.PROGRAM
    )
    code = csl_ext.code_bytes(module)
    band = csl_ext.memory_band(module, arrays)
    return {"arrays": arrays, "code": code, "total": arrays + code, "band": band, "fits": band["high"]}


def lower_module(
    module: ModuleOp,
    image: str = "f16",
    p: int | tuple[int, int] = 0,
    memory: int = csl_ext.MEMORY,
    copies: int | None = None,
    arch: str = "wse2",
) -> GridProgram:
    """The decode step whose parts `module` holds (`parts_of`) lowered for the smallest square grid of `arch`'s
    usable rectangle whose elements hold it, else (no square holds it) the machine's full height and the narrowest
    width that does (`grid.best_rectangle`), or for P x P (or width x height) when `p` is given, with the most
    copies of each KV head (up to its group: the widened cache) that fit, or `copies` (1: KV heads kept narrow),
    its queues bound for the target (`queues.bind_queues`). `module` is left as it is."""
    if arch not in csl_ext.TARGETS:
        raise PassError(f"{PASS}: no target '{arch}' (the targets: {', '.join(csl_ext.TARGETS)})")
    target = csl_ext.TARGETS[arch]
    lowered = _search(module, image, p, memory, copies, target)
    program = next(op for op in lowered.module.ops if isinstance(op, csl.CslModuleOp))
    bind_queues(program, target)
    lowered.host["arch"] = target.name
    return lowered


def _search(
    module: ModuleOp, image: str, grid: int | tuple[int, int], memory: int, copies: int | None, target: csl_ext.Target
) -> GridProgram:
    if image not in ("f16", "f32"):
        raise PassError(f"{PASS}: the grid holds f16 or f32 weights, not {image}")
    parts = parts_of(module)
    spec = parts[0][2].spec
    ctx = parts[1][0].ctx or 1  # the first layer's cache
    if spec.heads % spec.kv_heads or spec.head_dim % 2:
        raise PassError(f"{PASS}: heads must be a multiple of KV heads and head_dim even")
    group = spec.heads // spec.kv_heads
    rings = _rings([part for cut, _, part in parts if cut.kind == "decode_layer"], ctx)
    local = _local_bases([part for cut, _, part in parts if cut.kind == "decode_layer"], spec.rope_theta)
    choices = [c for c in range(group if copies is None else copies, 0, -1) if group % c == 0]
    if copies is not None and copies not in choices:
        raise PassError(f"{PASS}: {copies} copies of each KV head do not divide its {group} query heads")
    if copies is not None:
        choices = [copies]

    lowerings: dict[tuple[int, int, int, bool], tuple[GridProgram, int]] = {}
    keys: dict[int, str] = {}  # each layer's `_layer_key`, the same at every grid

    def lowered_at(size: tuple[int, int], c: int, compact: bool = False) -> tuple[GridProgram, int]:
        if (*size, c, compact) not in lowerings:  # a lowering is the search's cost: each grid is lowered once
            plan = g.GridPlan.of(spec, ctx, image, size, c, target.segmented_lines)
            plan.rings = rings
            plan.local_theta, plan.local_layers = local
            plan.compact = compact
            program = lower_parts(parts, plan, keys)
            lowerings[(*size, c, compact)] = program, memory_use(program)["fits"]  # the band's high end must fit
        return lowerings[(*size, c, compact)]

    # the compact layout (`GridPlan.compact`) only where the model fits no other way (the layouts of the models that
    # fit without it stay as they are)
    layouts = (False, True)
    if grid:
        return _given(grid, choices, lowered_at, memory, target, layouts)
    usable_width, usable_height = target.usable
    largest = min(target.usable)
    needed = 0
    for compact in layouts:
        for c in choices:  # the most KV copies that fit some square (KV heads widened keep more rows working)
            if compact and lowered_at(target.usable, c, compact)[1] > memory:
                continue  # nothing smaller than the machine's whole rectangle fits (saves the square's lowering)
            lowered, needed = lowered_at((largest, largest), c, compact)
            if needed > memory:
                continue
            side = _smallest(lambda n, c=c, compact=compact: lowered_at((n, n), c, compact)[1] <= memory, largest)
            best = g.best_grid(spec, side, largest, c)
            if lowered_at((best, best), c, compact)[1] > memory:  # weights read as stored: bytes not monotonic in P
                best = side
            return lowered_at((best, best), c, compact)[0]
        for c in choices:  # no square holds it: the machine's full height, the narrowest width that holds it
            lowered, needed = lowered_at(target.usable, c, compact)
            if needed > memory:
                continue
            width = _smallest(
                lambda n, c=c, compact=compact: lowered_at((n, usable_height), c, compact)[1] <= memory, usable_width
            )
            best_shape = g.best_rectangle(spec, width, target.usable, c)
            if lowered_at(best_shape, c, compact)[1] > memory:  # weights read as stored: bytes not monotonic
                best_shape = (width, usable_height)
            return lowered_at(best_shape, c, compact)[0]
    raise PassError(
        f"{PASS}: the model does not fit a {usable_width} x {usable_height} grid of {memory}-byte elements "
        f"({needed} bytes per element at the high end of its memory band)"
    )


def _rings(layers: Sequence[logos.ProgramOp], ctx: int) -> tuple[int, ...]:
    """Each layer's cached positions as its attention says them: its window where it slides, else ctx; () when no
    layer's window bites (every layer caches ctx, the plan's default)."""
    rings = []
    for part in layers:
        windows = [op.window for op in part.walk() if isinstance(op, logos.AttentionOp)]
        rings.append(windows[0].value.data if windows and windows[0] is not None else ctx)
    return tuple(rings) if any(ring != ctx for ring in rings) else ()


def _local_bases(layers: Sequence[logos.ProgramOp], theta: float) -> tuple[float | None, tuple[int, ...]]:
    """The one rope base other than the model's (`theta`) that some layers rotate by, as their rotations say it
    (Gemma 3's local layers), and those layers; (None, ()) when every layer rotates by the model's. Layers of more
    than one other base are left to the variant check, which refuses a base that is not the plan's."""
    bases = []
    for part in layers:
        ropes = [op.theta.value.data for op in part.walk() if isinstance(op, logos.RopeOp)]
        bases.append(ropes[0] if ropes else theta)
    others = sorted({base for base in bases if base != theta})
    if len(others) != 1:
        return None, ()
    return others[0], tuple(layer for layer, base in enumerate(bases) if base == others[0])


def _smallest(fits: Callable[[int], bool], largest: int) -> int:
    """The smallest n in 2..largest for which `fits` (which holds at `largest`): an element's bytes never grow with
    the grid and fall about as 1 / n (a rectangle's width) or 1 / n^2 (a square's side), so the search halves the
    range of log n (a small model is found in few lowerings)."""
    low, high = 1, largest
    while high - low > 1:
        middle = min(max(math.isqrt(low * high), low + 1), high - 1)
        if fits(middle):
            high = middle
        else:
            low = middle
    return high


def _given(
    grid: int | tuple[int, int],
    choices: list[int],
    lowered_at: Callable[[tuple[int, int], int, bool], tuple[GridProgram, int]],
    memory: int,
    target: csl_ext.Target,
    layouts: Sequence[bool] = (False,),
) -> GridProgram:
    """The grid the user gave (`grid=P` or `grid=WxH`), with the most KV copies that fit it (the compact layout
    only where nothing else fits)."""
    width, height = (grid, grid) if isinstance(grid, int) else grid
    if min(width, height) < 2:
        raise PassError(f"{PASS}: a grid of {width} x {height} elements has no lines to reduce along (both >= 2)")
    usable_width, usable_height = target.usable
    if width > usable_width or height > usable_height:
        raise PassError(
            f"{PASS}: a grid of {width} x {height} is more than a {target.name} gives a program: {usable_width} x "
            f"{usable_height} of its {target.fabric[0]} x {target.fabric[1]} (memcpy takes 7 columns and 2 rows)"
        )
    needed = 0
    for compact in layouts:
        for c in choices:  # the most KV copies that fit: the most rows working on attention
            lowered, needed = lowered_at((width, height), c, compact)
            if needed <= memory:
                return lowered
    raise PassError(
        f"{PASS}: the model does not fit a {width} x {height} grid of {memory}-byte elements ({needed} bytes per "
        "element at the high end of its memory band)",
        hint="give a larger grid (logos-compile --option grid=P or grid=WxH; convert-logos-to-csl{grid=P} in "
        "logos-opt) or none, to have the smallest that fits chosen",
    )


def parts_of(module: ModuleOp) -> list[tuple[Cut, Identity, logos.ProgramOp]]:
    """The parts of one decode step on one chip that `module` holds, each (cut, identity, program), in model order:
    `decode_embed`, `decode_layer` 0 to L - 1 (one ctx), `decode_head`, all of one model; else a diagnostic."""
    programs = [op for op in module.ops if isinstance(op, logos.ProgramOp)]
    if len(programs) != len(list(module.ops)) or not programs:
        raise PassError(f"{PASS}: expects a module of logos.program ops (a decode step's parts)")
    parts = [(_cut_of(program), identity(program), program) for program in programs]
    whole = [cut for cut, _, _ in parts if cut.kind in Cut.WHOLE]
    if whole:
        raise PassError(
            f"{PASS}: lowers a decode step's parts (embedding, layers, head), not the whole '{whole[0].option()}'",
            hint="extract its parts first: -p 'extract-parts,csl-fuse-products,convert-logos-to-csl'"
            " (the logos-to-spatial pipeline)",
        )
    for cut, _, program in parts:
        if not cut.kind.startswith("decode_") or program.chips.value.data != 1:
            raise PassError(
                f"{PASS}: lowers the parts of a decode step on one chip (every part on one grid), not "
                f"'{cut.option()}' over {program.chips.value.data} chip(s)"
            )
    spec = programs[0].spec
    if spec.projection_norms:
        raise PassError(
            f"{PASS}: the model RMS-norms the whole query and the whole key (OLMoE's projection norms), which the"
            " spatial grid does not compute yet (the query's heads lie on different elements)"
        )
    ctx = next((cut.ctx for cut, _, _ in parts if cut.kind == "decode_layer"), None) or 1
    expected = [Cut.decode_embed(), *(Cut.decode_layer(i, ctx) for i in range(spec.layers)), Cut.decode_head()]
    found = [cut for cut, _, _ in parts]
    if found != expected:
        raise PassError(
            f"{PASS}: lowers every part of a decode step (embedding, {spec.layers} layers, head) in model order, "
            f"not {', '.join(repr(cut.option()) for cut in found)}"
        )
    for cut, _, program in parts:
        if program.spec != spec:
            raise PassError(f"{PASS}: the part '{cut.option()}' is of another model than '{found[0].option()}'")
    return parts


def _cut_of(program: logos.ProgramOp) -> Cut:
    try:
        return Cut.parse(program.cut.data)
    except CutError as error:
        raise PassError(f"{PASS}: the program's cut '{program.cut.data}' cannot be read: {error.message}") from None


@dataclass(frozen=True)
class ConvertLogosToCsl(ModulePass):
    """`convert-logos-to-csl{weights=f16 grid=0 arch=wse2}`: a module holding the parts of one decode step
    (`logos.program`s of cuts `decode_embed`, `decode_layer` 0 to L - 1, `decode_head` on one chip, as `extract-parts`
    makes them) replaced by its two `csl.module`s (program and layout) for the grid (see the module docstring) and the
    machine (`arch`: wse2 or wse3); `grid=0` picks P as the build does. Refuses anything else, naming the pass,
    before changing the module."""

    name = "convert-logos-to-csl"

    weights: str = "f16"
    grid: int = 0
    arch: str = "wse2"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        lowered = lower_module(op, self.weights, self.grid, arch=self.arch)
        for old in list(op.ops):
            op.body.block.erase_op(old)
        for new in list(lowered.module.ops):
            new.detach()
            op.body.block.add_op(new)
