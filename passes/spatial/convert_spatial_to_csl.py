"""`convert-spatial-to-csl`: each `spatial.region` as a `csl_wrapper.module`, then xDSL's `lower-csl-wrapper` makes
its layout and program `csl.module`s, which xDSL's CSL printer prints (`emit_csl.py`).

Assumes: a module holding one `spatial.grid` and placed `spatial.region` ops. Guarantees: each region becomes one
`csl_wrapper.module` of the region's width and height whose layout gives every element its coordinates (`px`, `py`)
and whose program (the same for every element; CSL resolves its branches at compile time from those parameters)
holds:
* `weights`, the element's weight arena (f16 or f32, as large as the fullest element's tiles and cache blocks),
  exported so the host loads each element's tiles into it; `acts`, its f32 activation arena;
* one function per distinct stage of the region (a matrix-vector product of a tile shape on its colours, a route's
  send or receive, a norm, a rotation, a cache write, an attention block, an elementwise map, an embedding row, an
  argmax), written with CSL's DSD builtins (`@fmovs`, `@fmacs`/`@fmachs`, `@fadds`, `@fmuls`) over memory and
  fabric DSDs, loops and `<math>` calls; a stage function is made once per distinct shape and shared by every stage
  (and, in a build, every region) that has it;
* `step`, exported, which calls on each element, in program order, the stage functions of the stages whose
  elements include it, with the element's column and row inside that stage.

xDSL's CSL support is used as it is: `csl_wrapper` for the two modules, `lower-csl-wrapper` to split them,
`print_csl` to print. What this lane adds is the lowering from `spatial` into them (xDSL's own lowerings start
from `stencil`/`linalg`, not from placed model parts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from xdsl.builder import ImplicitBuilder
from xdsl.context import Context
from xdsl.dialects import arith, csl, csl_wrapper, memref, scf
from xdsl.dialects.builtin import (
    AffineMapAttr,
    Float16Type,
    Float32Type,
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    Signedness,
    StringAttr,
    SymbolRefAttr,
    f32,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.ir.affine import AffineExpr, AffineMap
from xdsl.passes import ModulePass
from xdsl.transforms.lower_csl_wrapper import LowerCslWrapperPass

from logos_ir.dialects import spatial as sp
from logos_ir.errors import PassError

PASS = "convert-spatial-to-csl"
i16 = IntegerType(16)
_COLOUR = IntegerType(5, Signedness.UNSIGNED)
_QUEUE = IntegerType(3)
_IN, _OUT = csl.DsdType(csl.DsdKind.fabin_dsd), csl.DsdType(csl.DsdKind.fabout_dsd)
_MEM = csl.DsdType(csl.DsdKind.mem1d_dsd)


@dataclass(frozen=True)
class Stage:
    """One call of `step`: the rectangle of elements it runs on and the name of its (shared) stage function."""

    rect: sp.Rect
    function: str


@dataclass
class _Program:
    """What the program module of one region is being built from."""

    weights: str
    weights_buffer: SSAValue
    acts: SSAValue
    math: Operation  # the `<math>` import
    functions: dict[str, csl.FuncOp] = field(default_factory=dict)
    stages: list[Stage] = field(default_factory=list)

    @property
    def weight_type(self) -> Float16Type | Float32Type:
        return Float16Type() if self.weights == "f16" else Float32Type()


# -- small builders: constants, DSDs, loops -----------------------------------------------------------------------


def _int(value: int, kind: IntegerType = i16) -> SSAValue:
    return arith.ConstantOp(IntegerAttr(value, kind)).result


def _float(value: float) -> SSAValue:
    return arith.ConstantOp(FloatAttr(value, f32)).result


def _mem(buffer: SSAValue, length: int, offset: int = 0, stride: int = 1) -> SSAValue:
    """A memory DSD over `length` words of `buffer` from `offset`, every `stride`-th."""
    access = AffineMap(1, 0, (AffineExpr.dimension(0) * stride + offset,))
    return csl.GetMemDsdOp(
        operands=[buffer, [_int(length)]], properties={"tensor_access": AffineMapAttr(access)}, result_types=[_MEM]
    ).result


def _fabric(kind: csl.DsdType, length: int, colour: int, queue: int) -> SSAValue:
    return csl.GetFabDsdOp(
        operands=[[_int(length)]],
        properties={"fabric_color": IntegerAttr(colour, _COLOUR), "queue_id": IntegerAttr(queue, _QUEUE)},
        result_types=[kind],
    ).result


def _receive(buffer: SSAValue, length: int, offset: int, colour: int) -> None:
    csl.FmovsOp(operands=[[_mem(buffer, length, offset), _fabric(_IN, length, colour, 0)]])


def _send(buffer: SSAValue, length: int, offset: int, colour: int) -> None:
    csl.FmovsOp(operands=[[_fabric(_OUT, length, colour, 1), _mem(buffer, length, offset)]])


def _loop(count: int, body: Callable[[SSAValue], object]) -> None:
    block = Block(arg_types=[i16])
    with ImplicitBuilder(block):
        body(block.args[0])
        scf.YieldOp()
    scf.ForOp(_int(0), _int(count), _int(1), [], block)


def _load(buffer: SSAValue, index: SSAValue, offset: int = 0) -> SSAValue:
    at = arith.AddiOp(index, _int(offset)).result if offset else index
    return memref.LoadOp.get(buffer, [arith.IndexCastOp(at, IndexType()).result]).res


def _store(value: SSAValue, buffer: SSAValue, index: SSAValue, offset: int = 0) -> None:
    at = arith.AddiOp(index, _int(offset)).result if offset else index
    memref.StoreOp.get(value, buffer, [arith.IndexCastOp(at, IndexType()).result])


def _when(condition: SSAValue, body: Callable[[], object]) -> None:
    then, otherwise = Block(), Block()
    with ImplicitBuilder(then):
        body()
        scf.YieldOp()
    with ImplicitBuilder(otherwise):
        scf.YieldOp()
    scf.IfOp(condition, [], Region(then), Region(otherwise))


def _compare(predicate: str, value: SSAValue, bound: int) -> SSAValue:
    return arith.CmpiOp(value, _int(bound), predicate).result


# -- stage functions ---------------------------------------------------------------------------------------------


def _function(program: _Program, name: str, build: Callable[[SSAValue, SSAValue], None]) -> str:
    """The stage function `name(column, row)`, built on first use and shared afterwards."""
    if name in program.functions:
        return name
    block = Block(arg_types=[i16, i16])
    block.args[0].name_hint, block.args[1].name_hint = "column", "row"
    with ImplicitBuilder(block):
        build(block.args[0], block.args[1])
        csl.ReturnOp()
    program.functions[name] = csl.FuncOp(name, FunctionType.from_lists([i16, i16], []), Region(block))
    return name


def _gemv(program: _Program, rows: int, columns: int, acc: int, x: int, w_offset: int = 0) -> None:
    """acts[acc : acc+rows] += W x for the [rows, columns] tile at weights[w_offset] (row-major) and x at acts[x],
    one column of the tile at a time: @fmacs (f32) or @fmachs (f16 weights, f32 sums)."""
    column_dsd = _mem(program.weights_buffer, rows, w_offset, stride=columns)
    acc_dsd = _mem(program.acts, rows, acc)

    def body(c: SSAValue) -> None:
        column = csl.IncrementDsdOffsetOp(
            operands=[column_dsd, c], properties={"elem_type": program.weight_type}, result_types=[_MEM]
        ).result
        scalar = _load(program.acts, c, x)
        if program.weights == "f16":
            half = arith.TruncFOp(scalar, Float16Type()).result
            csl.FmachsOp(operands=[[acc_dsd, acc_dsd, column, half]])
        else:
            csl.FmacsOp(operands=[[acc_dsd, acc_dsd, column, scalar]])

    _loop(columns, body)


def _matvec(program: _Program, op: sp.MatvecOp) -> None:
    place = op.place
    rows, columns = sp.int_values(place.tile)
    down, along = sp.int_values(op.colours)
    last = place.rect.w - 1
    name = f"matvec_{rows}x{columns}_c{down}_c{along}_w{last + 1}"

    def build(column: SSAValue, row: SSAValue) -> None:
        _receive(program.acts, columns, 0, down)  # x's tile, down the column
        csl.FmovsOp(operands=[[_mem(program.acts, rows, columns), _float(0.0)]])
        _gemv(program, rows, columns, acc=columns, x=0)
        acc = _mem(program.acts, rows, columns)
        _when(_compare("sgt", column, 0), lambda: csl.FaddsOp(operands=[[acc, acc, _fabric(_IN, rows, along, 2)]]))
        _when(_compare("slt", column, last), lambda: _send(program.acts, rows, columns, along))

    program.stages.append(Stage(place.rect, _function(program, name, build)))


def _route(program: _Program, op: sp.RouteOp) -> None:
    source, target = sp.layout_of(op.input), op.layout
    colour = sp.int_values(op.colours)[0]
    send = _function(program, f"send_{source.tile}_c{colour}", lambda c, r: _send(program.acts, source.tile, 0, colour))
    receive = _function(
        program, f"receive_{target.tile}_c{colour}", lambda c, r: _receive(program.acts, target.tile, 0, colour)
    )
    program.stages += [Stage(source.rect(), send), Stage(target.rect(), receive)]


def _norm(program: _Program, op: sp.NormOp) -> None:
    layout, colour = op.layout, sp.int_values(op.colours)[0]
    width = sp.shape_of(op.input)[-1]
    tile = layout.tile
    epsilon = op.epsilon.value.data

    def build(column: SSAValue, row: SSAValue) -> None:
        index = arith.AddiOp(column, row).result  # the element's place along its line
        x = _mem(program.acts, tile)
        total = _mem(program.acts, 1, tile)
        csl.FmovsOp(operands=[[total, _float(0.0)]])
        _loop(tile, lambda k: _square_into(program, k, tile))
        _when(_compare("sgt", index, 0), lambda: csl.FaddsOp(operands=[[total, total, _fabric(_IN, 1, colour, 2)]]))
        _when(_compare("slt", index, layout.n - 1), lambda: _send(program.acts, 1, tile, colour))
        mean = arith.MulfOp(_load(program.acts, _int(0), tile), _float(1.0 / width)).result
        root = csl.MemberCallOp("sqrt_f32", f32, program.math, [arith.AddfOp(mean, _float(epsilon)).result])
        scale = arith.DivfOp(_float(1.0), root.results[0]).result
        csl.FmulsOp(operands=[[x, x, scale]])
        csl.FmulsOp(operands=[[x, x, _mem(program.weights_buffer, tile)]])

    name = f"norm_{tile}_n{layout.n}_c{colour}"
    program.stages.append(Stage(layout.rect(), _function(program, name, build)))


def _square_into(program: _Program, k: SSAValue, tile: int) -> None:
    value = _load(program.acts, k)
    total = _load(program.acts, _int(0), tile)
    _store(arith.AddfOp(total, arith.MulfOp(value, value).result).result, program.acts, _int(0), tile)


def _rope(program: _Program, op: sp.RopeOp) -> None:
    layout, head_dim = op.layout, op.head_dim.value.data
    half, theta = head_dim // 2, op.theta.value.data
    position = layout.tile  # the position word lands after the tile

    def rotate(k: SSAValue) -> None:
        pair = arith.AddiOp(k, _int(half)).result
        exponent = arith.MulfOp(
            arith.SIToFPOp(arith.RemSIOp(k, _int(half)).result, f32).result, _float(-2.0 / head_dim)
        )
        frequency = csl.MemberCallOp("pow_f32", f32, program.math, [_float(theta), exponent.result]).results[0]
        angle = arith.MulfOp(_load(program.acts, _int(0), position), frequency).result
        cos = csl.MemberCallOp("cos_f32", f32, program.math, [angle]).results[0]
        sin = csl.MemberCallOp("sin_f32", f32, program.math, [angle]).results[0]
        a, b = _load(program.acts, k), _load(program.acts, pair)
        _store(arith.SubfOp(arith.MulfOp(a, cos).result, arith.MulfOp(b, sin).result).result, program.acts, k)
        _store(arith.AddfOp(arith.MulfOp(b, cos).result, arith.MulfOp(a, sin).result).result, program.acts, pair)

    def build(column: SSAValue, row: SSAValue) -> None:
        _receive(program.acts, 1, position, sp.int_values(op.colours)[0])  # the position (less one), along the line
        for head in range(layout.tile // head_dim):
            _loop(half, partial(_rotate_at, rotate, head * head_dim))

    name = f"rope_{layout.tile}_h{head_dim}"
    program.stages.append(Stage(layout.rect(), _function(program, name, build)))


def _rotate_at(rotate: Callable[[SSAValue], None], offset: int, k: SSAValue) -> None:
    rotate(arith.AddiOp(k, _int(offset)).result)


def _cache_write(program: _Program, op: sp.CacheWriteOp) -> None:
    cache = op.cache.owner
    assert isinstance(cache, sp.CacheOp)
    head_dim, block = sp.int_values(cache.shape)[2], cache.block.value.data
    colour = sp.int_values(op.colours)[0]
    base = _cache_base(cache)

    def build(column: SSAValue, row: SSAValue) -> None:
        _receive(program.acts, head_dim, 0, colour)  # the new key or value, along the row to its block's owner
        slot = _load(program.acts, _int(0), head_dim)  # the slot in the block, sent with it
        offset = arith.FPToSIOp(slot, i16).result

        def copy(d: SSAValue) -> None:
            value = _load(program.acts, d)
            if program.weights == "f16":
                value = arith.TruncFOp(value, Float16Type()).result
            at = arith.AddiOp(arith.MuliOp(offset, _int(head_dim)).result, d).result
            _store(value, program.weights_buffer, at, base)

        _loop(head_dim, copy)

    name = f"cache_write_{cache.kind.data}_{block}x{head_dim}_c{colour}"
    program.stages.append(Stage(cache.rect, _function(program, name, build)))


def _cache_base(cache: sp.CacheOp) -> int:
    """Where a cache block starts in the element's weight arena: keys first, then values (the elements of an
    attention rectangle hold nothing else)."""
    head_dim, block = sp.int_values(cache.shape)[2], cache.block.value.data
    return 0 if cache.kind.data == "key" else block * head_dim


def _attend(program: _Program, op: sp.AttendOp) -> None:
    """Each element: the group's queries and the position arrive along the row; per query head, the scores of the
    block's positions up to the position (scaled; the others -inf), their maximum m, l = sum exp(s - m) and
    o = sum exp(s - m) v; then (m, l, o) is combined with the west neighbour's, rescaled to the larger maximum, and
    sent east; the row's last element divides o by l."""
    cache = op.cache
    head_dim, block = sp.int_values(cache.shape)[2], cache.block.value.data
    tile = op.layout.tile
    group = tile // head_dim
    along, combine = sp.int_values(op.colours)
    last = cache.rect.w - 1
    state = head_dim + 2  # per query head: m, l, o
    scores, position = tile, tile + block
    mine, theirs = position + 1, position + 1 + group * state

    def head(g: int, count: SSAValue) -> None:
        at = mine + g * state
        csl.FmovsOp(operands=[[_mem(program.acts, block, scores), _float(0.0)]])
        _gemv(program, block, head_dim, acc=scores, x=g * head_dim, w_offset=0)  # K q, the keys as a tile
        csl.FmulsOp(
            operands=[[_mem(program.acts, block, scores), _mem(program.acts, block, scores), _float(head_dim**-0.5)]]
        )
        _store(_float(-3.0e38), program.acts, _int(0), at)
        _loop(block, lambda j: _mask_and_max(program, j, scores, count, at))
        csl.FmovsOp(operands=[[_mem(program.acts, head_dim + 1, at + 1), _float(0.0)]])
        _loop(block, lambda j: _weigh(program, j, scores, count, at, block * head_dim, head_dim))

    def build(column: SSAValue, row: SSAValue) -> None:
        _receive(program.acts, tile, 0, along)  # the group's queries, along the row
        _receive(program.acts, 1, position, along)  # and the position, less one
        _when(_compare("slt", column, last), lambda: _send(program.acts, tile + 1, 0, along))
        first = arith.MuliOp(column, _int(block)).result  # the block's first position, less one
        count = arith.SubiOp(arith.FPToSIOp(_load(program.acts, _int(0), position), i16).result, first).result
        for g in range(group):
            head(g, count)
        for g in range(group):
            at = mine + g * state
            _when(_compare("sgt", column, 0), partial(_combine_state, program, at, theirs, head_dim, combine))
        _when(_compare("slt", column, last), lambda: _send(program.acts, group * state, mine, combine))
        _when(_compare("eq", column, last), lambda: _finish(program, mine, state, group, head_dim))

    name = f"attend_{block}x{head_dim}_g{group}_c{along}_c{combine}"
    program.stages.append(Stage(cache.rect, _function(program, name, build)))


def _mask_and_max(program: _Program, j: SSAValue, scores: int, count: SSAValue, at: int) -> None:
    """Score j is -inf past the position; the running maximum at acts[at] takes the others."""
    beyond = arith.CmpiOp(j, count, "sgt").result
    _when(beyond, lambda: _store(_float(-3.0e38), program.acts, j, scores))
    value, high = _load(program.acts, j, scores), _load(program.acts, _int(0), at)
    _when(arith.CmpfOp(value, high, "ogt").result, lambda: _store(value, program.acts, _int(0), at))


def _weigh(program: _Program, j: SSAValue, scores: int, count: SSAValue, at: int, values: int, head_dim: int) -> None:
    """l += e and o += e * v_j for e = exp(s_j - m), position j of the block up to the current one."""

    def add() -> None:
        shifted = arith.SubfOp(_load(program.acts, j, scores), _load(program.acts, _int(0), at)).result
        weight = csl.MemberCallOp("exp_f32", f32, program.math, [shifted]).results[0]
        total = _load(program.acts, _int(0), at + 1)
        _store(arith.AddfOp(total, weight).result, program.acts, _int(0), at + 1)
        row = csl.IncrementDsdOffsetOp(
            operands=[_mem(program.weights_buffer, head_dim, values), arith.MuliOp(j, _int(head_dim)).result],
            properties={"elem_type": program.weight_type},
            result_types=[_MEM],
        ).result
        out = _mem(program.acts, head_dim, at + 2)
        if program.weights == "f16":
            csl.FmachsOp(operands=[[out, out, row, arith.TruncFOp(weight, Float16Type()).result]])
        else:
            csl.FmacsOp(operands=[[out, out, row, weight]])

    _when(arith.CmpiOp(j, count, "sle").result, add)


def _combine_state(program: _Program, at: int, scratch: int, head_dim: int, colour: int) -> None:
    """(m, l, o) here and the west neighbour's (received into `scratch`), both rescaled to the larger maximum."""
    _receive(program.acts, head_dim + 2, scratch, colour)
    m, other = _load(program.acts, _int(0), at), _load(program.acts, _int(0), scratch)
    high = arith.SelectOp(arith.CmpfOp(m, other, "ogt").result, m, other).result
    here = csl.MemberCallOp("exp_f32", f32, program.math, [arith.SubfOp(m, high).result]).results[0]
    there = csl.MemberCallOp("exp_f32", f32, program.math, [arith.SubfOp(other, high).result]).results[0]
    _store(high, program.acts, _int(0), at)
    mine, received = _mem(program.acts, head_dim + 1, at + 1), _mem(program.acts, head_dim + 1, scratch + 1)
    csl.FmulsOp(operands=[[mine, mine, here]])
    csl.FmacsOp(operands=[[mine, mine, received, there]])


def _finish(program: _Program, mine: int, state: int, group: int, head_dim: int) -> None:
    """o / l of each query head, laid out head after head from acts[0] (the attention's result tile)."""
    for g in range(group):
        at = mine + g * state
        inverse = arith.DivfOp(_float(1.0), _load(program.acts, _int(0), at + 1)).result
        csl.FmulsOp(
            operands=[[_mem(program.acts, head_dim, g * head_dim), _mem(program.acts, head_dim, at + 2), inverse]]
        )


def _exp_in_place(program: _Program, j: SSAValue, offset: int) -> None:
    value = _load(program.acts, j, offset)
    _store(csl.MemberCallOp("exp_f32", f32, program.math, [value]).results[0], program.acts, j, offset)


def _combine_in(program: _Program, offset: int, length: int, colour: int) -> None:
    here = _mem(program.acts, length, offset)
    csl.FaddsOp(operands=[[here, here, _fabric(_IN, length, colour, 2)]])


def _map(program: _Program, op: sp.MapOp) -> None:
    tile, fn = op.layout.tile, op.fn.data

    def silu(k: SSAValue) -> None:
        v = _load(program.acts, k)
        half = arith.MulfOp(v, _float(0.5)).result
        t = csl.MemberCallOp("tanh_f32", f32, program.math, [half]).results[0]
        gate = arith.AddfOp(arith.MulfOp(t, _float(0.5)).result, _float(0.5)).result
        _store(arith.MulfOp(v, gate).result, program.acts, k)

    def build(column: SSAValue, row: SSAValue) -> None:
        x, y = _mem(program.acts, tile), _mem(program.acts, tile, tile)  # the operands' tiles, side by side
        if fn == "silu":
            _loop(tile, silu)
        elif fn == "add":
            csl.FaddsOp(operands=[[x, x, y]])
        else:
            csl.FmulsOp(operands=[[x, x, y]])

    program.stages.append(Stage(op.layout.rect(), _function(program, f"map_{fn}_{tile}", build)))


def _embed(program: _Program, op: sp.EmbedOp) -> None:
    place = op.table.owner
    assert isinstance(place, sp.PlaceOp)
    rows, columns = sp.int_values(place.tile)
    into, down = sp.int_values(op.colours)
    bottom = place.rect.h - 1

    def build(column: SSAValue, row: SSAValue) -> None:
        _receive(program.acts, 1, 0, into)  # the token (less one), to every element of the table
        token = arith.FPToSIOp(_load(program.acts, _int(0)), i16).result
        first = arith.MuliOp(row, _int(rows)).result
        mine = arith.AndIOp(
            arith.CmpiOp(token, first, "sge").result,
            arith.CmpiOp(token, arith.AddiOp(first, _int(rows)).result, "slt").result,
        ).result
        local = arith.SubiOp(token, first).result

        def send_row() -> None:
            line = csl.IncrementDsdOffsetOp(
                operands=[_mem(program.weights_buffer, columns), arith.MuliOp(local, _int(columns)).result],
                properties={"elem_type": program.weight_type},
                result_types=[_MEM],
            ).result
            csl.FmovsOp(operands=[[_fabric(_OUT, columns, down, 1), line]]) if program.weights == "f32" else csl.Fh2sOp(
                operands=[[_fabric(_OUT, columns, down, 1), line]]
            )

        _when(mine, send_row)
        _when(_compare("eq", row, bottom), lambda: _receive(program.acts, columns, 1, down))

    name = f"embed_{rows}x{columns}_c{into}_c{down}_h{bottom + 1}"
    program.stages.append(Stage(place.rect, _function(program, name, build)))


def _argmax(program: _Program, op: sp.ArgmaxOp) -> None:
    """Each element: its tile's first greatest value and its index in the whole vector; the previous element's pair is
    taken when its value is at least as great (it holds the earlier indices: the first on a tie), then sent on."""
    source = sp.layout_of(op.input)
    colour = sp.int_values(op.colours)[0]
    tile = source.tile
    best, received = tile, tile + 2

    def better(k: SSAValue, index: SSAValue) -> None:
        value = _load(program.acts, k)

        def take() -> None:
            _store(value, program.acts, _int(0), best)
            at = arith.AddiOp(k, arith.MuliOp(index, _int(tile)).result).result
            _store(arith.SIToFPOp(at, f32).result, program.acts, _int(0), best + 1)

        _when(arith.CmpfOp(value, _load(program.acts, _int(0), best), "ogt").result, take)

    def west() -> None:
        _receive(program.acts, 2, received, colour)
        theirs = _load(program.acts, _int(0), received)
        keep = arith.CmpfOp(theirs, _load(program.acts, _int(0), best), "oge").result
        _when(keep, lambda: csl.FmovsOp(operands=[[_mem(program.acts, 2, best), _mem(program.acts, 2, received)]]))

    def build(column: SSAValue, row: SSAValue) -> None:
        index = arith.AddiOp(column, row).result  # the element's place along its line
        csl.FmovsOp(operands=[[_mem(program.acts, 2, best), _float(-3.0e38)]])
        _loop(tile, lambda k: better(k, index))
        _when(_compare("sgt", index, 0), west)
        _when(_compare("slt", index, source.n - 1), lambda: _send(program.acts, 2, best, colour))

    name = f"argmax_{tile}_n{source.n}_c{colour}"
    program.stages.append(Stage(source.rect(), _function(program, name, build)))


def _receive_stage(program: _Program, op: sp.ReceiveOp) -> None:
    layout, colour = op.layout, sp.int_values(op.colours)[0]
    name = _function(
        program, f"receive_{layout.tile}_c{colour}", lambda c, r: _receive(program.acts, layout.tile, 0, colour)
    )
    program.stages.append(Stage(layout.rect(), name))


def _send_stage(program: _Program, op: sp.SendOp) -> None:
    layout, colour = sp.layout_of(op.input), sp.int_values(op.colours)[0]
    name = _function(program, f"send_{layout.tile}_c{colour}", lambda c, r: _send(program.acts, layout.tile, 0, colour))
    program.stages.append(Stage(layout.rect(), name))


_STAGES: dict[type[Operation], Callable[[_Program, Operation], None]] = {
    sp.MatvecOp: _matvec,  # type: ignore[dict-item]
    sp.RouteOp: _route,  # type: ignore[dict-item]
    sp.NormOp: _norm,  # type: ignore[dict-item]
    sp.RopeOp: _rope,  # type: ignore[dict-item]
    sp.CacheWriteOp: _cache_write,  # type: ignore[dict-item]
    sp.AttendOp: _attend,  # type: ignore[dict-item]
    sp.MapOp: _map,  # type: ignore[dict-item]
    sp.EmbedOp: _embed,  # type: ignore[dict-item]
    sp.ArgmaxOp: _argmax,  # type: ignore[dict-item]
    sp.ReceiveOp: _receive_stage,  # type: ignore[dict-item]
    sp.SendOp: _send_stage,  # type: ignore[dict-item]
}
_HELD_ONLY = (sp.PlaceOp, sp.CacheOp)  # what the host loads (weights) or the program keeps (caches): no stage


# -- the wrapper --------------------------------------------------------------------------------------------------


def _arena_words(region: sp.RegionOp) -> tuple[int, int]:
    """(weight words, activation words) of the fullest element of the region."""
    weights = activations = 1
    for op in region.body.block.ops:
        for rect, nbytes in op.holds(region.weight_bytes) if isinstance(op, sp.SpatialOp) else []:
            del rect
            if isinstance(op, _HELD_ONLY):
                weights = max(weights, nbytes // region.weight_bytes)
            else:
                activations = max(activations, nbytes // sp.ACTIVATION_BYTES)
    keys_and_values = [op for op in region.body.block.ops if isinstance(op, sp.CacheOp)]
    if keys_and_values:
        weights = max(weights, 2 * keys_and_values[0].block.value.data * sp.int_values(keys_and_values[0].shape)[2])
    return weights, 4 * activations + 4


def region_wrapper(region: sp.RegionOp) -> csl_wrapper.ModuleOp:
    """The `csl_wrapper.module` of one region (see the module docstring)."""
    wrapper = csl_wrapper.ModuleOp(region.width, region.height, "wse2")
    wrapper.program_name = StringAttr("pe_program")
    layout = wrapper.layout_module.block
    with ImplicitBuilder(layout):
        # lower-csl-wrapper erases the yield before it inlines the block, so a block argument yielded as it is would
        # be left dangling: yield the coordinates through an op (an offset of 0 from the region's corner)
        corner = _int(0)
        px_value, py_value = arith.AddiOp(layout.args[0], corner).result, arith.AddiOp(layout.args[1], corner).result
        csl_wrapper.YieldOp([px_value, py_value], ["px", "py"])
    wrapper.update_program_block_args()
    block = wrapper.program_module.block
    px, py = block.args[2], block.args[3]
    weight_words, activation_words = _arena_words(region)
    with ImplicitBuilder(block):
        kind = Float16Type() if region.weights.data == "f16" else Float32Type()
        weights = memref.AllocOp([], [], MemRefType(kind, [weight_words])).memref
        weights.name_hint = "weights"
        acts = memref.AllocOp([], [], MemRefType(f32, [activation_words])).memref
        acts.name_hint = "acts"
        math = csl_wrapper.ImportOp("<math>", {})
        math.result.name_hint = "math"
    program = _Program(region.weights.data, weights, acts, math)
    for op in region.body.block.ops:
        stage = _STAGES.get(type(op))
        if stage is None and not isinstance(op, _HELD_ONLY):
            raise PassError(f"{PASS}: does not lower '{op.name}' (in @{region.sym_name.data})")
        if stage is not None:
            with ImplicitBuilder(Block()):  # stage functions are built detached, then added once
                stage(program, op)
    for function in program.functions.values():
        function.detach()  # built under the scratch builder above
    block.add_ops([*program.functions.values(), _step(program, px, py)])
    with ImplicitBuilder(block):
        pointer = csl.PtrType(kind, csl.PtrKindAttr(csl.PtrKind.MANY), csl.PtrConstAttr(csl.PtrConst.VAR))
        address = csl.AddressOfOp(weights, pointer).res
        csl.SymbolExportOp("weights", address)
        csl.SymbolExportOp("step", FunctionType.from_lists([], []))
        csl_wrapper.YieldOp([], [])
    return wrapper


def _step(program: _Program, px: SSAValue, py: SSAValue) -> csl.FuncOp:
    """`step`: every stage whose rectangle holds this element, in program order."""
    block = Block()
    with ImplicitBuilder(block):
        for stage in program.stages:
            rect = stage.rect
            inside = arith.AndIOp(
                arith.AndIOp(_compare("sge", px, rect.x), _compare("slt", px, rect.x + rect.w)).result,
                arith.AndIOp(_compare("sge", py, rect.y), _compare("slt", py, rect.y + rect.h)).result,
            ).result

            def call(stage: Stage = stage) -> None:
                column = arith.SubiOp(px, _int(stage.rect.x)).result
                row = arith.SubiOp(py, _int(stage.rect.y)).result
                csl.CallOp(SymbolRefAttr(stage.function), [column, row])

            _when(inside, call)
        csl.ReturnOp()
    return csl.FuncOp("step", FunctionType.from_lists([], []), Region(block))


@dataclass(frozen=True)
class ConvertSpatialToCsl(ModulePass):
    """Each `spatial.region` as a `csl_wrapper.module`, lowered by xDSL's `lower-csl-wrapper` into its layout and
    program `csl.module`s (see the module docstring). The grid op goes."""

    name = "convert-spatial-to-csl"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        regions = [o for o in op.ops if isinstance(o, sp.RegionOp)]
        if not regions:
            raise PassError(f"{PASS}: the module holds no spatial.region")
        for region in regions:
            wrapper = region_wrapper(region)
            region.detach()
            region.erase()
            op.body.block.add_op(wrapper)
        for grid in [o for o in op.ops if isinstance(o, sp.GridOp)]:
            grid.detach()
            grid.erase()
        LowerCslWrapperPass().apply(ctx, op)
