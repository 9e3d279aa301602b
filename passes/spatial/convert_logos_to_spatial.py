"""`convert-logos-to-spatial`: one part of a decode step (its embedding, one layer or its head) lowered to a
`spatial.region`: every weight cut into tiles placed on a rectangle of elements, the layer's KV caches kept in the
elements of its attention rectangle, and every op of the part a `spatial` op on the elements that hold its data.

Assumes: a module holding one `logos.program` of cut `decode_embed`, `decode_layer` or `decode_head` on one chip
(as `cut-extract` leaves it). Guarantees: the module holds one `spatial.grid` (the stated grid) and one
`spatial.region` named after the part (`embedding`, `layer_<n>`, `head`) at origin (0, 0), whose body computes what
the part computes; the region verifies (memory per element, colours, routes inside the region), else a diagnostic
that names the pass, the op and the sizes. No weight value is read: only names and shapes.

How it lowers, in three steps over the part's ops:
1. size: each op that needs elements of its own asks for a rectangle (a matrix-vector product: one element per
   weight tile; the embedding: one per table tile; the layer's attention: one per KV head and block of positions;
   the hidden input: a row of elements);
2. pack: the rectangles are packed into the region (shelves, tallest first, about square);
3. emit: each op becomes its `spatial` op on its rectangle, with a `spatial.route` in front wherever its operand is
   not already on the elements that need it. Colours rotate over the grid's colours (0 is kept for traffic between
   regions), so no stage reuses a colour of the stage before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    Float16Type,
    Float32Type,
    MemRefType,
    ModuleOp,
    TensorType,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from logos_ir.dialects import logos
from logos_ir.dialects import spatial as sp
from logos_ir.errors import PassError
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec

PASS = "convert-logos-to-spatial"
PARTS = ("decode_embed", "decode_layer", "decode_head")
TILE_EDGES = (16, 32, 64, 128)
MIN_BLOCK = 16  # positions of a KV block, at least
GRID_SHARE = 0.6  # the automatic tile is the smallest whose model takes at most this share of the grid


# -- the grid ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A grid of elements. The default is a Cerebras WSE-2 by its published figures (docs/spatial.md): a fabric of
    757 x 996 usable processing elements (of its 850,000 cores), 48 KiB of memory each and 24 routable colours."""

    width: int = 757
    height: int = 996
    memory: int = 48 * 1024
    colours: int = 24
    name: str = "wse2"

    def op(self) -> sp.GridOp:
        return sp.GridOp(self.name, self.width, self.height, self.memory, self.colours)

    @property
    def elements(self) -> int:
        return self.width * self.height


def region_name(cut: Cut) -> str:
    if cut.kind == "decode_embed":
        return "embedding"
    if cut.kind == "decode_head":
        return "head"
    return f"layer_{cut.layer}"


def next_region(cut: Cut, layers: int) -> str:
    """Where a part sends its result: the next part's region, or the host after the head."""
    if cut.kind == "decode_embed":
        return "layer_0"
    if cut.kind == "decode_head":
        return "host"
    assert cut.layer is not None
    return f"layer_{cut.layer + 1}" if cut.layer + 1 < layers else "head"


def model_elements(spec: ModelSpec, tile: int) -> int:
    """About how many elements the whole model's weight tiles take with square tiles of `tile` (the head's table is
    placed apart from the embedding's, tied or not)."""
    per_layer = 0
    for _, shape in spec.weights():
        if len(shape) == 2:
            per_layer += math.ceil(shape[0] / tile) * math.ceil(shape[1] / tile)
    if spec.tie_embeddings:
        per_layer += math.ceil(spec.vocab / tile) * math.ceil(spec.hidden / tile)
    return per_layer


def auto_tile(spec: ModelSpec, grid: Grid, weight_bytes: int) -> int:
    """The smallest tile edge whose tiles fit an element with room to spare and whose model takes at most
    `GRID_SHARE` of the grid: the most elements, so the most parallel multiply-accumulates, that still fit."""
    fitting = [
        t for t in TILE_EDGES if t * t * weight_bytes + sp.CODE_BYTES + 8 * t * sp.ACTIVATION_BYTES <= grid.memory
    ]
    if not fitting:
        raise PassError(
            f"{PASS}: no tile of {TILE_EDGES[0]} x {TILE_EDGES[0]} fits the {grid.memory} bytes of an element"
        )
    for tile in fitting:
        if model_elements(spec, tile) <= GRID_SHARE * grid.elements:
            return tile
    return fitting[-1]


# -- step 1 and 2: rectangles and their packing -----------------------------------------------------------------


@dataclass(eq=False)
class Slot:
    """A rectangle a part's op asked for; `x` and `y` are set when the region is packed."""

    w: int
    h: int
    what: str
    x: int = -1
    y: int = -1

    def rect(self) -> sp.Rect:
        return sp.Rect(self.x, self.y, self.w, self.h)


def pack(slots: list[Slot], exact: int | None = None) -> tuple[int, int]:
    """Pack the slots into the smallest rectangle found: skyline packing (each slot, tallest first, at the lowest place
    left, leftmost of equals) tried at a range of widths from the widest slot to twice the square root of the total
    area. Sets each slot's place; returns (width, height)."""
    from logos_ir.passes.spatial.place import skyline_origins

    area = sum(s.w * s.h for s in slots)
    narrowest = max(s.w for s in slots)
    widest = max(narrowest, math.ceil(2 * math.sqrt(area)))
    widths = sorted({narrowest, widest, *range(narrowest, widest + 1, max(1, (widest - narrowest) // 24))})
    if exact is not None:
        widths = [exact]
    best: tuple[int, int, list[Slot], list[tuple[int, int]]] | None = None
    for key in _ORDERS:
        ordered = sorted(slots, key=key)
        sizes = [(s.w, s.h) for s in ordered]
        for width in widths:
            origins, height = skyline_origins(sizes, width)
            used = max(x + w for (x, _), (w, _) in zip(origins, sizes, strict=True))
            if best is None or used * height < best[0] * best[1]:
                best = (used, height, ordered, origins)
    assert best is not None
    for slot, (x, y) in zip(best[2], best[3], strict=True):
        slot.x, slot.y = x, y
    return best[0], best[1]


_ORDERS = (lambda s: (-s.h, -s.w), lambda s: (-s.w, -s.h), lambda s: -s.w * s.h)  # tallest, widest, largest first


@dataclass(frozen=True)
class At:
    """A layout relative to a slot, resolved once the slot is packed."""

    slot: Slot
    x: int
    y: int
    dx: int
    dy: int
    n: int
    tile: int

    def resolve(self) -> sp.Layout:
        return sp.Layout(self.slot.x + self.x, self.slot.y + self.y, self.dx, self.dy, self.n, self.tile)


def row_of(slot: Slot, n: int, tile: int, y: int = 0) -> At:
    return At(slot, 0, y, 1, 0, n, tile)


def column_of(slot: Slot, n: int, tile: int, x: int = 0) -> At:
    return At(slot, x, 0, 0, 1, n, tile)


# -- the lowering -----------------------------------------------------------------------------------------------


def _width(value: SSAValue) -> int:
    return logos.tensor_shape(value)[-1]


@dataclass
class _Part:
    """The state of lowering one part: its slots, what each logos value became, the ops emitted so far."""

    spec: ModelSpec
    cut: Cut
    tile: int
    weights: str
    grid: Grid
    slots: dict[Operation, Slot] = field(default_factory=dict)
    entry: dict[SSAValue, Slot] = field(default_factory=dict)
    attention: Slot | None = None
    block: int = 0
    values: dict[SSAValue, SSAValue] = field(default_factory=dict)
    inputs: dict[SSAValue, str] = field(default_factory=dict)
    weight_ops: dict[SSAValue, logos.WeightOp] = field(default_factory=dict)
    ops: list[Operation] = field(default_factory=list)
    colour: int = 0
    widen: bool = False

    # colours: 0 between regions; 1 .. colours-1 in turn inside the region
    def colours(self, count: int) -> list[int]:
        span = self.grid.colours - 1
        if span < 2 * count:
            raise PassError(
                f"{PASS}: the grid's {self.grid.colours} colours are too few to route a part (need {2 * count + 1})"
            )
        picked = [1 + (self.colour + k) % span for k in range(count)]
        self.colour = (self.colour + count) % span
        return picked

    def matrix_tile(self, rows: int, columns: int) -> tuple[int, int]:
        """The tile of a [rows, columns] weight: square tiles of the part's edge, but taller (and then narrower, to
        stay in an element's memory) where that many rows of elements would not fit half the grid's height: a
        vector along a line of elements must fit the grid."""
        edge = self.tile
        line = max(1, self.grid.height // 2)
        tall = max(edge, math.ceil(math.ceil(rows / line) / edge) * edge)
        budget = self.grid.memory - sp.CODE_BYTES - 8 * tall * sp.ACTIVATION_BYTES
        wide = edge
        while wide > 1 and tall * wide * sp.WEIGHT_BYTES[self.weights] > budget:
            wide //= 2
        if self.widen:  # a model that fills the grid: as many columns as the memory holds
            room = self.grid.memory - sp.CODE_BYTES - 3 * tall * sp.ACTIVATION_BYTES - 1024
            wide = max(wide, room // (tall * sp.WEIGHT_BYTES[self.weights] + 2 * sp.ACTIVATION_BYTES) // 16 * 16)
        return min(tall, rows), min(wide, columns)

    def emit(self, op: Operation) -> Operation:
        self.ops.append(op)
        return op

    def element_type(self):
        return Float16Type() if self.weights == "f16" else Float32Type()

    # -- values on layouts ------------------------------------------------------------------------------------

    def at(self, value: SSAValue, want: sp.Layout) -> SSAValue:
        """`value` on the layout `want`: received there if it is an input not yet received, else routed there if it
        is elsewhere."""
        if value in self.inputs and value not in self.values:
            return self.receive(value, want)
        current = self.values[value]
        if sp.layout_of(current) == want:
            return current
        routed = self.emit(sp.RouteOp(current, self.colours(1)[0], want)).results[0]
        routed.name_hint = current.name_hint
        return routed

    def receive(self, value: SSAValue, want: sp.Layout) -> SSAValue:
        kind = self.inputs[value]
        source = "host" if kind in ("token", "position") else previous_region_of(self.cut, self.spec.layers)
        received = self.emit(sp.ReceiveOp(kind, source, 0, want, value.type)).results[0]
        received.name_hint = value.name_hint
        self.values[value] = received
        return received

    def current(self, value: SSAValue) -> SSAValue:
        """`value` where it is (an input is received on its default elements)."""
        if value in self.inputs and value not in self.values:
            return self.receive(value, self.default_layout(value))
        return self.values[value]

    def default_layout(self, value: SSAValue) -> sp.Layout:
        if value in self.entry:
            slot = self.entry[value]
            return row_of(slot, slot.w, self.matrix_tile(self.spec.hidden, _width(value))[1]).resolve()
        if self.attention is not None:  # positions land on the attention's first element
            return At(self.attention, 0, 0, 1, 0, 1, 1).resolve()
        raise PassError(f"{PASS}: input '{value.name_hint}' has no elements to land on")

    def define(self, source: SSAValue, result: SSAValue) -> None:
        result.name_hint = source.name_hint
        self.values[source] = result

    def place(self, weight: SSAValue, rect: sp.Rect, tile: tuple[int, int]) -> SSAValue:
        op = self.weight_ops[weight]
        shape = op.full_shape if len(op.full_shape) == 2 else (1, op.full_shape[0])
        kind = TensorType(self.element_type(), list(shape))
        placed = self.emit(sp.PlaceOp(op.tensor.data, shape, rect, tile, kind)).results[0]
        placed.name_hint = weight.name_hint
        return placed


def previous_region_of(cut: Cut, layers: int) -> str:
    if cut.kind == "decode_head":
        return f"layer_{layers - 1}"
    if cut.kind == "decode_layer":
        return "embedding" if cut.layer == 0 else f"layer_{(cut.layer or 0) - 1}"
    return "host"


# -- step 1: sizing ---------------------------------------------------------------------------------------------


def _size(part: _Part, section: func.FuncOp, main: func.FuncOp) -> None:
    for op in section.body.walk():
        if isinstance(op, logos.LinearOp | logos.EmbedOp):
            rows, columns = logos.tensor_shape(op.weight if isinstance(op, logos.LinearOp) else op.table)
            tile_rows, tile_columns = part.matrix_tile(rows, columns)
            what = "matvec" if isinstance(op, logos.LinearOp) else "table"
            part.slots[op] = Slot(math.ceil(columns / tile_columns), math.ceil(rows / tile_rows), what)
    for op in main.body.walk():
        if isinstance(op, logos.InputOp) and op.kind.data == "hidden":
            entry_tile = part.matrix_tile(part.spec.hidden, _width(op.result))[1]
            part.entry[op.result] = Slot(math.ceil(_width(op.result) / entry_tile), 1, "entry")
    caches = [op for op in section.body.walk() if isinstance(op, logos.CacheOp)]
    if caches:
        _size_attention(part, logos.tensor_shape(caches[0].result))


def _size_attention(part: _Part, cache: tuple[int, ...]) -> None:
    """The KV block each attention element holds: short enough that its scores and weighted values take about as long
    as a product's tile (at least 16 positions), long enough that a KV head's row is no wider than the part's widest
    product, and no longer than an element's memory holds (the longest it holds when the model fills the grid)."""
    kv_heads, positions, head_dim = cache
    # an attention element holds its key and value blocks and a score per position, besides its code, the group's
    # queries, its running sums and the vectors routed through its first and last columns
    group_width = part.spec.q_dim // kv_heads
    fixed = sp.CODE_BYTES + (5 * group_width + 3 * head_dim + 8) * sp.ACTIVATION_BYTES + 512
    per_position = 2 * head_dim * sp.WEIGHT_BYTES[part.weights] + sp.ACTIVATION_BYTES
    longest = (part.grid.memory - fixed) // per_position
    balanced = max(MIN_BLOCK, math.ceil(part.tile * part.tile / (group_width * 2)))
    widest = max([MIN_BLOCK, *(s.w for s in part.slots.values() if s.what == "matvec")])
    wanted = longest if part.widen else max(balanced, math.ceil(positions / widest))
    part.block = max(1, min(positions, longest, wanted))
    part.attention = Slot(math.ceil(positions / part.block), kv_heads, "attention")


# -- step 3: one rewrite per logos op ----------------------------------------------------------------------------


def _weight(part: _Part, op: logos.WeightOp) -> None:
    part.weight_ops[op.result] = op


def _cache(part: _Part, op: logos.CacheOp) -> None:
    assert part.attention is not None
    kind = MemRefType(part.element_type(), list(logos.tensor_shape(op.result)))
    cache = sp.CacheOp(
        op.kind.data, op.layer.value.data, logos.tensor_shape(op.result), part.attention.rect(), part.block, kind
    )
    part.define(op.result, part.emit(cache).results[0])


def _rms_norm(part: _Part, op: logos.RMSNormOp) -> None:
    x = part.current(op.input)
    layout = sp.layout_of(x)
    weight = part.place(op.weight, layout.rect(), (1, layout.tile))
    norm = sp.NormOp(
        operands=[x, weight],
        properties={"epsilon": op.epsilon, "colours": sp.i64_array(part.colours(1)), "out": layout.attr()},
        result_types=[x.type],
    )
    part.define(op.result, part.emit(norm).results[0])


def _linear(part: _Part, op: logos.LinearOp) -> None:
    slot = part.slots[op]
    tile = part.matrix_tile(*logos.tensor_shape(op.weight))
    weight = part.place(op.weight, slot.rect(), tile)
    place = weight.owner
    assert isinstance(place, sp.PlaceOp)
    x = part.at(op.input, sp.MatvecOp.input_layout(place))
    matvec = sp.MatvecOp(x, weight, part.colours(2), sp.MatvecOp.output_layout(place), op.result.type)
    part.define(op.result, part.emit(matvec).results[0])


def _heads_layout(part: _Part, width: int) -> sp.Layout:
    assert part.attention is not None, "a layer with rotary embeddings has caches"
    return column_of(part.attention, part.attention.h, width // part.attention.h).resolve()


def _rope(part: _Part, op: logos.RopeOp) -> None:
    x = part.at(op.input, _heads_layout(part, _width(op.input)))
    positions = part.current(op.positions)
    properties = {
        "head_dim": op.head_dim,
        "theta": op.theta,
        "colours": sp.i64_array(part.colours(1)),
        "out": sp.layout_of(x).attr(),
    }
    if op.scaling is not None:
        properties["scaling"] = op.scaling
    rope = sp.RopeOp(operands=[x, positions], properties=properties, result_types=[x.type])
    part.define(op.result, part.emit(rope).results[0])


def _cache_write(part: _Part, op: logos.CacheWriteOp) -> None:
    x = part.at(op.input, _heads_layout(part, _width(op.input)))
    write = sp.CacheWriteOp(
        operands=[x, part.values[op.cache], part.current(op.positions)],
        properties={"colours": sp.i64_array(part.colours(1))},
    )
    part.emit(write)


def _attention(part: _Part, op: logos.AttentionOp) -> None:
    assert part.attention is not None
    q = part.at(op.query, _heads_layout(part, _width(op.query)))
    tile = sp.layout_of(q).tile
    out = column_of(part.attention, part.attention.h, tile, x=part.attention.w - 1).resolve()
    attend = sp.AttendOp(
        operands=[q, part.values[op.keys], part.values[op.values], part.current(op.positions)],
        properties={"colours": sp.i64_array(part.colours(2)), "out": out.attr()},
        result_types=[op.result.type],
    )
    part.define(op.result, part.emit(attend).results[0])


def _binary(part: _Part, op: logos.ElementwiseBinaryOp) -> None:
    rhs = part.current(op.rhs)
    layout = sp.layout_of(rhs)
    lhs = part.at(op.lhs, layout)
    fn = "add" if isinstance(op, logos.AddOp) else "mul"
    part.define(op.result, part.emit(sp.MapOp(fn, [lhs, rhs], layout)).results[0])


def _silu(part: _Part, op: logos.SiluOp) -> None:
    x = part.current(op.input)
    part.define(op.result, part.emit(sp.MapOp("silu", [x], sp.layout_of(x))).results[0])


def _embed(part: _Part, op: logos.EmbedOp) -> None:
    slot = part.slots[op]
    tile = part.matrix_tile(*logos.tensor_shape(op.table))
    table = part.place(op.table, slot.rect(), tile)
    tokens = part.at(op.tokens, At(slot, 0, 0, 1, 0, 1, 1).resolve())
    out = row_of(slot, slot.w, tile[1], y=slot.h - 1).resolve()
    embed = sp.EmbedOp(
        operands=[table, tokens],
        properties={"colours": sp.i64_array(part.colours(2)), "out": out.attr()},
        result_types=[op.result.type],
    )
    part.define(op.result, part.emit(embed).results[0])


def _argmax(part: _Part, op: logos.ArgmaxOp) -> None:
    x = part.current(op.input)
    layout = sp.layout_of(x)
    last = layout.elements()[-1]
    out = sp.Layout(int(last[0]), int(last[1]), layout.dx, layout.dy, 1, 1)
    argmax = sp.ArgmaxOp(
        operands=[x],
        properties={"colours": sp.i64_array(part.colours(1)), "out": out.attr()},
        result_types=[op.result.type],
    )
    part.define(op.result, part.emit(argmax).results[0])


_REWRITES: dict[type[Operation], Callable[[_Part, Operation], None]] = {
    logos.WeightOp: _weight,  # type: ignore[dict-item]
    logos.CacheOp: _cache,  # type: ignore[dict-item]
    logos.RMSNormOp: _rms_norm,  # type: ignore[dict-item]
    logos.LinearOp: _linear,  # type: ignore[dict-item]
    logos.RopeOp: _rope,  # type: ignore[dict-item]
    logos.CacheWriteOp: _cache_write,  # type: ignore[dict-item]
    logos.AttentionOp: _attention,  # type: ignore[dict-item]
    logos.AddOp: _binary,  # type: ignore[dict-item]
    logos.MulOp: _binary,  # type: ignore[dict-item]
    logos.SiluOp: _silu,  # type: ignore[dict-item]
    logos.EmbedOp: _embed,  # type: ignore[dict-item]
    logos.ArgmaxOp: _argmax,  # type: ignore[dict-item]
}


# -- the pass ---------------------------------------------------------------------------------------------------


def _sections(program: logos.ProgramOp) -> tuple[func.FuncOp, func.FuncOp, func.CallOp]:
    main = program.function("main")
    assert main is not None
    calls = [op for op in main.body.walk() if isinstance(op, func.CallOp)]
    if len(calls) != 1:
        raise PassError(f"{PASS}: @main of '{program.cut.data}' calls {len(calls)} sections, not one")
    section = program.function(calls[0].callee.root_reference.data)
    if section is None:
        raise PassError(f"{PASS}: @main calls {calls[0].callee}, which the program does not define")
    return main, section, calls[0]


def lower_part(program: logos.ProgramOp, weights: str, tile: int, grid: Grid) -> sp.RegionOp:
    """The `spatial.region` of one decode part (see the module docstring)."""
    from logos_ir.identity import identity

    cut = Cut.parse(program.cut.data)
    if cut.kind not in PARTS or program.chips.value.data != 1:
        raise PassError(
            f"{PASS}: lowers the decode step's parts on one chip (decode_embed, decode_layer, decode_head), "
            f"not '{program.cut.data}' over {program.chips.value.data} chip(s)",
            hint="extract a part first: -p 'cut-extract{cut=\"decode_layer layer=0 ctx=64\"}'",
        )
    if weights not in sp.WEIGHT_BYTES:
        raise PassError(f"{PASS}: weights '{weights}' are not f16 or f32")
    spec = program.spec
    edge = tile or auto_tile(spec, grid, sp.WEIGHT_BYTES[weights])
    widen = not tile and model_elements(spec, edge) > GRID_SHARE * grid.elements
    part = _Part(spec, cut, edge, weights, grid, widen=widen)
    main, section, call = _sections(program)
    _size(part, section, main)
    slots = [*part.slots.values(), *part.entry.values(), *([part.attention] if part.attention else [])]
    width, height = pack(slots)
    _bind_inputs(part, main, section, call)
    for op in section.body.block.ops:
        _lower_op(part, op, next_region(cut, spec.layers))
    body = Region(Block(part.ops))
    name = region_name(cut)
    return sp.RegionOp(name, grid.name, (0, 0), (width, height), cut.option(), identity(program).line(), weights, body)


def _bind_inputs(part: _Part, main: func.FuncOp, section: func.FuncOp, call: func.CallOp) -> None:
    kinds = {op.result: op.kind.data for op in main.body.walk() if isinstance(op, logos.InputOp)}
    for argument, operand in zip(section.body.block.args, call.arguments, strict=True):
        if operand not in kinds:
            raise PassError(f"{PASS}: @main passes {operand.name_hint} to {call.callee}, which is not an input")
        part.inputs[argument] = kinds[operand]
        if operand in part.entry:
            part.entry[argument] = part.entry.pop(operand)


def _lower_op(part: _Part, op: Operation, target: str) -> None:
    if isinstance(op, func.ReturnOp):
        part.emit(sp.SendOp(part.current(op.arguments[0]), target, 0))
        return
    rewrite = _REWRITES.get(type(op))
    if rewrite is None:
        raise PassError(f"{PASS}: the spatial lane does not lower '{op.name}' (in '{part.cut.option()}')")
    rewrite(part, op)


@dataclass(frozen=True)
class ConvertLogosToSpatial(ModulePass):
    """Lower one decode part to a `spatial.region` on a grid (see the module docstring). Options: the weight image
    (`weights`: f16 as the hardware computes, or f32), the tile edge (`tile`, 0 for automatic) and the grid
    (`width`, `height`, `memory` bytes per element, `colours`; a WSE-2 by default)."""

    name = "convert-logos-to-spatial"

    weights: str = "f16"
    tile: int = 0
    width: int = Grid.width
    height: int = Grid.height
    memory: int = Grid.memory
    colours: int = Grid.colours

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from logos_ir.identity import the_program

        program = the_program(op, PASS)
        grid = Grid(self.width, self.height, self.memory, self.colours)
        region = lower_part(program, self.weights, self.tile, grid)
        program.detach()
        program.erase()
        op.body.block.add_ops([grid.op(), region])
        try:
            region.verify()
        except VerifyException as error:
            raise PassError(f"{PASS}: the placement of '{region.cut.data}' does not fit: {error}") from None
