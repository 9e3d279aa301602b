"""The state of one part's lowering onto the grid and the helpers the per-op patterns (`op_patterns.py`)
share: `PartLowering` writes into the element program being built (`element_program.Program`), knows the plan,
declares the arrays and the weight tiles, emits a product's multiply-accumulate, attention's exponentials, and the
reductions along a line (`reductions.LineReductions`).

A logos value, once its op is lowered, is the array it lives in: the pattern replaces the op's result by a
`memref.get_global` of that array (a symbol reference), and `PartLowering.values` holds, for that SSA value, the
vector's layout. Weights and caches stay the logos ops they are until the part is lowered: a product reads its
weight's op to tile it, as the grid needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from xdsl.dialects import arith, csl, memref
from xdsl.dialects.builtin import IntegerAttr, MemRefType, f16, f32, i16, i32
from xdsl.ir import Block, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter

from logos_ir.dialects import logos
from logos_ir.errors import PassError
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.element_program import PASS, Program, Vec
from logos_ir.passes.spatial.emit import U16, Emit
from logos_ir.passes.spatial.fuse_products import FUSED
from logos_ir.passes.spatial.reductions import LineReductions


def stored_rows(plan: g.GridPlan) -> int:
    """The longest tile column a product read as stored can have (the scratch arrays it unpacks a column into are
    declared once, this long): the chunk of the longest of a layer's products' results, in either layout."""
    lengths = (
        plan.hidden,
        plan.intermediate,
        plan.heads * plan.head_dim,
        len(g.query_rows(plan)),
        len(g.kv_rows(plan)),
    )
    return max(plan.chunk(n, layout, even=True) for n in lengths for layout in ("row", "col"))


class PartLowering(LineReductions):
    """One part's lowering: the element code its patterns insert (`e`: in front of the op being rewritten), the
    layer index (the layer function's argument; None for the embedding and head), what each product feeds, and the
    layout of each value already lowered (see the module docstring)."""

    def __init__(self, program: Program, e: Emit, layer: SSAValue | None, feeds: dict[SSAValue, set[str]]):
        self.program, self.plan, self.e, self.layer = program, program.plan, e, layer
        self.values: dict[SSAValue, Any] = {}
        self.feeds = feeds
        self.placeholders: list[Operation] = []  # the get_globals standing for lowered values, erased when done
        self.fused: dict[Operation, list[logos.LinearOp]] = {}
        self.fused_later: set[Operation] = set()

    def at(self, op: Operation) -> PartLowering:
        """This lowering, its element code now inserted in front of `op` (the op a pattern rewrites)."""
        block = op.parent_block()
        assert block is not None
        self.e = Emit(block, before=op)
        return self

    def stand_in(self, vector: Vec) -> memref.GetGlobalOp:
        """A `memref.get_global` of the array `vector` lives in, standing for the value it holds."""
        words, element = self.program.arrays[vector.array]
        placeholder = memref.GetGlobalOp(vector.array, MemRefType(element, [words]))
        self.values[placeholder.memref] = vector
        self.placeholders.append(placeholder)
        return placeholder

    def replace(self, rewriter: PatternRewriter, op: Operation) -> None:
        """`op`, lowered, replaced by the array its result lives in (erased when it has no result); a result that is
        no vector on the grid (the head's arg-max, the host's) is left for the sweep after the walk."""
        if not op.results:
            rewriter.erase(op)
            return
        vector = self.values.get(op.results[0])
        if isinstance(vector, Vec):
            rewriter.replace(op, self.stand_in(vector))

    def coordinate(self, layout: str, e: Emit | None = None) -> SSAValue:
        """px for a reduction along a row, py along a column (as i32, emitted by `e`, the part's emitter if none)."""
        value = self.program.px if layout == "row" else self.program.py
        assert value is not None
        return (e or self.e).op(arith.ExtSIOp(value, i32)).results[0]

    def vec(self, name: str, layout: str, length: int, even: bool = False) -> Vec:
        chunk = self.plan.chunk(length, layout, even)
        self.program.array(name, chunk)
        return Vec(layout, length, chunk, name)

    def arr(self, name: str) -> SSAValue:
        return self.program.get(self.e, name)

    def weight_offset(self, weight: g.Weight) -> SSAValue:
        """Where this layer's tile starts in the weight's array (the layer index times the tile)."""
        size = self.e.int(weight.tile_rows * weight.tile_columns)
        if len(weight.tensors) == 1 or self.layer is None:
            return self.e.int(0)
        return self.e.bin(arith.MuliOp, self.layer, size)

    @property
    def element_type(self) -> Any:
        return f16 if self.plan.image == "f16" else f32

    def program_weight(
        self,
        op: logos.WeightOp,
        orient: str,
        row_map: Sequence[int] = (),
        in_chunk: int = 0,
        column_map: Sequence[int] = (),
    ) -> g.Weight:
        """The weight array this op's tensor lives in (shared by every layer's tensor of the same role)."""
        plan = self.plan
        name = array_name(op.result)
        tensor = op.tensor.data
        shape = list(op.shape.get_values())
        if len(shape) == 1:
            chunk = plan.chunk(shape[0], "col")
            weight = g.Weight(name, (tensor,), "vector", "col", 1, shape[0], 1, chunk)
            return self.declare(weight, plan_layers=self.layer is not None)
        rows, columns = shape
        padded_rows = len(row_map) if row_map else rows
        kind = "table" if self.layer is None else "matrix"
        out_layout = "row" if orient == "col" else "col"  # a product's result is in the other layout
        tr = plan.chunk(padded_rows, out_layout, even=bool(row_map))
        tc = in_chunk or plan.chunk(columns, orient)  # a product's tile is as wide as its input's chunk
        weight = g.Weight(name, (tensor,), kind, orient, rows, columns, tr, tc, tuple(row_map), tuple(column_map))
        fmt = op.storage.format_name.data if op.storage is not None else ""
        if kind == "matrix" and fmt in g.STORED:  # read as stored: its codes and scales (`stored_product`)
            column_blocks = plan.width if orient == "col" else plan.height
            _, blocks = g.block_slots(weight, column_blocks)
            slots = max(1, max(len(b) for b in blocks))
            fields = {**weight.__dict__, "format": fmt, "scale_slots": slots}
            stored = g.Weight(**{**fields, "tensors": (tensor,) * plan.layers})
            image = stored.tile_rows * stored.tile_columns * plan.layers * (2 if plan.image == "f16" else 4)
            if 2 * stored.words + 2 * stored.scale_words + 4 * stored.tile_columns < image:  # else: the image
                weight = g.Weight(**fields)
        return self.declare(weight, plan_layers=self.layer is not None)

    def spread_weight(self, op: logos.WeightOp, x: Vec, column_map: Sequence[int] | None = None) -> g.Weight:
        """A vector weight read feature by feature with `x` (a product's result: a bias, a per-head norm's weight),
        cut as `x` is: element (x, y) holds, at each position of its chunk (chunk x of a `col` vector, chunk y of a
        `row` one, in the product's row order), the weight's number there (`column_map`: which, -1 for none; the
        product's order if not given). The host's tiling takes it as a matrix of one row, repeated over the other
        dimension's blocks (`row_map`), its columns in that map (`Weight.column_map`), kind `spread`: stored as the
        product's weights are (f16 in an f16 image, f32 otherwise)."""
        across = self.plan.extent("row" if x.layout == "col" else "col")  # the blocks the one row is repeated over
        length = op.shape.get_values()[0]
        columns = tuple(x.order if column_map is None else column_map)
        weight = g.Weight(
            array_name(op.result), (op.tensor.data,), "spread", x.layout, 1, length, 1, x.chunk, (0,) * across, columns
        )
        return self.declare(weight, plan_layers=self.layer is not None)

    def declare(self, weight: g.Weight, plan_layers: bool) -> g.Weight:
        plan = self.plan
        known = plan.weights.get(weight.name)
        if known is None and plan.compact and weight.kind == "table":  # a tied head: the embedding's array
            known = next((w for w in plan.weights.values() if w.kind == "table" and w.tensors == weight.tensors), None)
        if known is None:
            tensors = weight.tensors
            if plan_layers:  # the tensor each layer's program names for this weight
                tensors = self.program.layer_tensors[weight.name]
            weight = g.Weight(**{**weight.__dict__, "tensors": tensors})
            plan.weights[weight.name] = weight
            element = self.element_type if weight.kind != "vector" else f32
            if weight.format:  # its codes (u16 words), each layer's scales (f16) and each tile column's slot
                self.program.array(weight.name, weight.words, U16)
                self.program.array(f"{weight.name}_scales", weight.scale_words, f16)
                self.program.array(f"{weight.name}_slots", weight.tile_columns, i32)
                return weight
            self.program.array(weight.name, weight.words, element)
            return weight
        # the same role (another layer) or the same tensor (a tied head): the same tile
        same = (known.tile_rows, known.tile_columns, known.orient, known.column_map) == (
            weight.tile_rows,
            weight.tile_columns,
            weight.orient,
            weight.column_map,
        )
        if not same:
            raise PassError(f"{PASS}: the weight '{weight.name}' is tiled two ways")
        return known

    def product_plan(self, op: logos.LinearOp) -> tuple[list[int], g.Weight]:
        plan = self.plan
        x: Vec = self.values[op.input]
        roles = self.feeds.get(op.result, set())
        out_rows = op.weight.type.get_shape()[0]  # type: ignore[attr-defined]
        row_map: list[int] = []
        if "query" in roles:  # laid out to meet the narrow cache: the group's query heads at the row's KV features
            row_map = g.query_rows(plan)
        elif "cache" in roles:  # KV heads kept narrow, rotary pairs adjacent
            if out_rows != plan.kv_heads * plan.head_dim:
                raise PassError(f"{PASS}: a cached projection of {out_rows} rows, not KV heads x head_dim")
            row_map = g.kv_rows(plan)
        elif "rope" in roles:
            raise PassError(f"{PASS}: the grid rotates only attention's query and the cached keys")
        weight = self.program_weight(self.values[op.weight], x.layout, row_map, x.chunk, x.order)
        return row_map, weight

    def product(self, op: logos.LinearOp, into: SSAValue | None, at: int) -> tuple[Vec, SSAValue]:
        """The element's tile times its input chunk, accumulated into `into[at:]` (or the product's own array)."""
        plan, e = self.plan, self.e
        x: Vec = self.values[op.input]
        row_map, weight = self.product_plan(op)
        out_layout = "row" if x.layout == "col" else "col"
        length = len(row_map) if row_map else op.weight.type.get_shape()[0]  # type: ignore[attr-defined]
        out = Vec(out_layout, length, weight.tile_rows, array_name(op.result), tuple(row_map))
        self.program.array(out.array, out.chunk)
        tile_rows = weight.tile_rows
        acc, source = (into, at) if into is not None else (self.arr(out.array), 0)
        e.dsd_op(csl.FmovsOp, e.dsd(acc, tile_rows, source), e.float(0.0))
        source_array = self.arr(x.array)
        if weight.format:
            self.stored_product(weight, x, acc, source)
            self.values[op.result] = out
            return out, acc
        base = self.weight_offset(weight)
        w = self.arr(weight.name)
        if plan.image == "f16":
            half = self.arr(f"{x.array}_f16") if self.declare_half(x) else source_array
            e.dsd_op(csl.Fs2hOp, e.dsd(half, x.chunk), e.dsd(source_array, x.chunk))
            source_array = half
        with e.loop(x.chunk) as (body, j, _, _y):
            scalar = body.load(source_array, j)
            offset = body.bin(arith.AddiOp, base, body.bin(arith.MuliOp, j, body.int(tile_rows)))
            column = body.moved(body.dsd(w, tile_rows), offset, self.element_type)
            mac = csl.FmachsOp if plan.image == "f16" else csl.FmacsOp
            body.dsd_op(mac, body.dsd(acc, tile_rows, source), body.dsd(acc, tile_rows, source), column, scalar)
        self.values[op.result] = out
        return out, acc

    def stored_product(self, weight: g.Weight, x: Vec, acc: SSAValue, at: int) -> None:
        """The tile read as stored times the input chunk (f32), into acc[at:]: for each column j of the tile, its
        codes unpacked from their u16 words with the SDK's 16-bit DSD ops into `stored_codes` (i16; Q8_0: the low
        byte `@and16`, the high `@slr16`, each made signed by `@xor16` and `@sub16` with 0x80; Q4_0: each nibble
        `@slr16` then `@and16` with 15, less 8 by `@sub16`), widened to f32 (`@xp162fs`), multiplied by their
        block's f16 scales widened (`@fh2s`, `@fmuls`: f32(scale) * f32(code), the dequantizer's own arithmetic),
        then `@fmacs` by x[j] into the sums, as an f32 tile is."""
        e, tr, per = self.e, weight.tile_rows, g.STORED[weight.format]
        words = weight.column_words
        longest = stored_rows(self.plan)
        self.program.array("stored_codes", -(-longest // per) * per, i16)
        self.program.array("stored_values", longest, f32)
        self.program.array("stored_scales", longest, f32)
        codes, values, scales = self.arr("stored_codes"), self.arr("stored_values"), self.arr("stored_scales")
        packed, slot_of = self.arr(weight.name), self.arr(f"{weight.name}_slots")
        held = self.arr(f"{weight.name}_scales")
        layer = self.layer is not None and len(weight.tensors) > 1
        code_base = e.bin(arith.MuliOp, self.layer, e.int(weight.tile_columns * words)) if layer else e.int(0)
        scale_base = e.bin(arith.MuliOp, self.layer, e.int(weight.scale_slots * tr)) if layer else e.int(0)
        source = self.arr(x.array)
        with e.loop(x.chunk) as (body, j, _, _y):
            scalar = body.load(source, j)
            column = body.moved(body.dsd(packed, words), body.bin(arith.AddiOp, code_base, body.bin(
                arith.MuliOp, j, body.int(words))), U16)  # fmt: skip
            every = body.dsd(codes, words * per)
            if per == 2:  # Q8_0: two int8 codes a word, the first row's in the low byte
                body.dsd_op(csl.And16Op, body.dsd(codes, words, 0, 2), column, body.int(0xFF, U16))
                body.dsd_op(csl.Slr16Op, body.dsd(codes, words, 1, 2), column, body.int(8, U16))
                body.dsd_op(csl.Xor16Op, every, every, body.int(0x80, U16))
                body.dsd_op(csl.Sub16Op, every, every, body.int(0x80, U16))
            else:  # Q4_0: four nibbles a word, the first row's in the low nibble
                for i in range(per):
                    body.dsd_op(csl.Slr16Op, body.dsd(codes, words, i, per), column, body.int(4 * i, U16))
                body.dsd_op(csl.And16Op, every, every, body.int(0x0F, U16))
                body.dsd_op(csl.Sub16Op, every, every, body.int(8, U16))
            body.dsd_op(csl.Xp162fsOp, body.dsd(values, tr), body.dsd(codes, tr))
            slot = body.bin(arith.AddiOp, scale_base, body.bin(arith.MuliOp, body.load(slot_of, j), body.int(tr)))
            body.dsd_op(csl.Fh2sOp, body.dsd(scales, tr), body.moved(body.dsd(held, tr), slot, f16))
            body.dsd_op(csl.FmulsOp, body.dsd(values, tr), body.dsd(values, tr), body.dsd(scales, tr))
            body.dsd_op(csl.FmacsOp, body.dsd(acc, tr, at), body.dsd(acc, tr, at), body.dsd(values, tr), scalar)

    def declare_half(self, x: Vec) -> bool:
        self.program.array(f"{x.array}_f16", x.chunk, f16)
        return True

    def cache_array(self, cache: logos.CacheOp, chunk: int) -> str:
        name = f"{cache.kind.data}_cache"
        words = self.plan.cache_slots * chunk
        self.program.array(name, words, self.element_type)
        return name

    def exponentials(
        self, h0: SSAValue, kept_from: SSAValue, scores: SSAValue, high: SSAValue, sums: SSAValue, chunk: int,
        slots: int,
    ) -> None:  # fmt: skip
        """exp(score - max) of the element's window of heads over its `slots` positions, in place, and each head's sum
        of them into sums[chunk + head]."""
        e, window = self.e, self.plan.window
        with e.loop(window) as (outer, j, _, _y):
            m = outer.load(high, j)
            h = outer.bin(arith.SubiOp, outer.bin(arith.AddiOp, h0, j), kept_from)  # its row of the scores
            total_at = outer.bin(arith.AddiOp, j, outer.int(chunk))
            with outer.loop(slots) as (body, s, _, _y2):
                at = body.bin(arith.AddiOp, body.bin(arith.MuliOp, h, body.int(slots)), s)
                weight = body.math(
                    self.program.math, "exp_f32", body.op(arith.SubfOp(body.load(scores, at), m)).results[0]
                )
                body.store(weight, scores, at)
                body.store(body.op(arith.AddfOp(body.load(sums, total_at), weight)).results[0], sums, total_at)

    def shared_exponentials(self, scores: SSAValue, high: SSAValue, sums: SSAValue, chunk: int, slots: int) -> None:
        """The elements of a KV head's column segment hold the same scores: each computes exp(score - max) for every
        segment-length-th of them (from its rank in the segment), zeros elsewhere, with its part of each head's sum of
        weights; the segment's reduction (`segment_only`) gives every element all of them (`slots` positions a
        head)."""
        plan, e = self.plan, self.e
        window, p = plan.window, plan.height  # a column's elements
        length, count, _ = plan.line("col")
        shortest = min(length, p - (count - 1) * length)
        items = window * slots
        self.program.array("exponentials", window * plan.slots + window)
        shared = self.arr("exponentials")
        e.dsd_op(csl.FmovsOp, e.dsd(shared, items + window), e.float(0.0))
        py = self.coordinate("col")
        first = e.bin(arith.MuliOp, e.bin(arith.DivSIOp, py, e.int(length)), e.int(length))
        bound = e.bin(arith.AddiOp, first, e.int(length))
        end = e.int(p)
        size = e.bin(arith.SubiOp, e.op(arith.SelectOp(e.cmp(bound, end, "slt"), bound, end)).results[0], first)
        rank = e.bin(arith.SubiOp, py, first)
        with e.loop(-(-items // shortest)) as (body, t, _, _y):
            i = body.bin(arith.AddiOp, rank, body.bin(arith.MuliOp, t, size))
            with body.when(body.cmp(i, body.int(items), "slt")) as mine:
                j = mine.bin(arith.DivSIOp, i, mine.int(slots))
                difference = mine.op(arith.SubfOp(mine.load(scores, i), mine.load(high, j))).results[0]
                weight = mine.math(self.program.math, "exp_f32", difference)
                mine.store(weight, shared, i)
                total_at = mine.bin(arith.AddiOp, j, mine.int(items))
                mine.store(mine.op(arith.AddfOp(mine.load(shared, total_at), weight)).results[0], shared, total_at)
        self.reduce(e, shared, items + window, "col", csl.FaddsOp, segment_only=True)
        e.dsd_op(csl.FmovsOp, e.dsd(scores, items), e.dsd(shared, items))
        e.dsd_op(csl.FmovsOp, e.dsd(sums, window, chunk), e.dsd(shared, window, items))

    def cache_cases(self) -> Iterator[tuple[Emit, int, int, Callable[[Emit], SSAValue]]]:
        """The layer's cache, for each kind of layer the function may be called for: (the emitter of that kind's
        code, the positions it caches (`GridPlan.ring`), its slots, the first slot of the layer's cache (emitted by
        the emitter given)). One kind (every layer caches ctx, or every layer the same window): the part's emitter
        and layer x slots. Two (windowed and whole-cache layers, Qwen2's and Gemma's): a branch on whether the
        layer is windowed, each side its own code, the first slot counted over the layers before it."""
        plan, e = self.plan, self.e
        rings = sorted({plan.ring(layer) for layer in range(plan.layers)})
        layer = self.layer
        if len(rings) == 1:
            slots = plan.layer_slots(0)
            yield (
                e,
                rings[0],
                slots,
                lambda at: at.bin(arith.MuliOp, at.int(0) if layer is None else layer, at.int(slots)),
            )
            return
        if len(rings) > 2 or layer is None:
            raise PassError(f"{PASS}: layers caching {' or '.join(map(str, rings))} positions: at most two kinds")
        window, whole = rings
        windowed = [k for k in range(plan.layers) if plan.ring(k) == window]
        slots_window, slots_whole = -(-window // plan.width), -(-whole // plan.width)
        zero, one = e.int(0), e.int(1)
        before = zero  # the windowed layers before this one
        for k in windowed:
            earlier = e.op(arith.SelectOp(e.cmp(e.int(k), layer, "slt"), one, zero)).results[0]
            before = e.bin(arith.AddiOp, before, earlier)
        first = e.bin(
            arith.SubiOp,
            e.bin(arith.MuliOp, layer, e.int(slots_whole)),
            e.bin(arith.MuliOp, before, e.int(slots_whole - slots_window)),
        )
        kinds = windowed if len(windowed) <= plan.layers - len(windowed) else [
            k for k in range(plan.layers) if k not in windowed
        ]  # fmt: skip
        then, other, branch = e.branch(self.layer_among(e, kinds))
        cases = [(window, slots_window), (whole, slots_whole)]
        if kinds != windowed:
            cases.reverse()
        for at, (ring, slots) in zip((then, other), cases, strict=True):
            yield at, ring, slots, lambda _at: first
        e.end_branch(then, other, branch)

    def layer_among(self, e: Emit, layers: Sequence[int]) -> SSAValue:
        """Whether the layer (the layer function's argument) is one of `layers`: one comparison where it is one, else
        a count of the matches (selects and adds: no `arith.ori`, which the simulator does not run) above 0."""
        assert self.layer is not None
        if len(layers) == 1:
            return e.cmp(self.layer, e.int(layers[0]), "eq")
        zero, one = e.int(0), e.int(1)
        matches = zero
        for k in layers:
            matches = e.bin(
                arith.AddiOp, matches, e.op(arith.SelectOp(e.cmp(self.layer, e.int(k), "eq"), one, zero)).results[0]
            )
        return e.cmp(matches, zero, "sgt")

    def head_of(self, e: Emit, first_kv: SSAValue, r: SSAValue, group: int = 0, heads: int = 0) -> SSAValue:
        """The query head of feature r of a row whose KV features start at `first_kv` (`grid.query_rows`); with
        `group` 1 and `heads` the cached copies, the cached KV head (copy) of feature r of a key (`grid.kv_rows`)."""
        c = self.plan.kv_chunk
        kv_head = e.bin(
            arith.DivSIOp, e.bin(arith.AddiOp, first_kv, e.bin(arith.RemSIOp, r, e.int(c))), e.int(self.plan.head_dim)
        )
        head = e.bin(
            arith.AddiOp,
            e.bin(arith.MuliOp, kv_head, e.int(group or self.plan.group)),
            e.bin(arith.DivSIOp, r, e.int(c)),
        )
        last = e.int((heads or self.plan.heads) - 1)
        return e.op(arith.SelectOp(e.cmp(head, last, "slt"), head, last)).results[0]

    def elementwise(self, op: Operation, kind: type[csl.BuiltinDsdOp]) -> None:
        a: Vec = self.values[op.operands[0]]
        b: Vec = self.values[op.operands[1]]
        if (a.layout, a.chunk) != (b.layout, b.chunk):
            raise PassError(f"{PASS}: '{op.name}' of vectors laid out differently ({a.layout}, {b.layout})")
        out = self.vec(array_name(op.results[0]), a.layout, a.length)
        e = self.e
        e.dsd_op(
            kind,
            e.dsd(self.arr(out.array), a.chunk),
            e.dsd(self.arr(a.array), a.chunk),
            e.dsd(self.arr(b.array), a.chunk),
        )
        self.values[op.results[0]] = out


def array_name(value: SSAValue) -> str:
    """The array a value lives in: its LOGOS name (every value the author writes has one)."""
    if not value.name_hint:
        raise PassError(f"{PASS}: a value of '{value.owner.name}' has no name to give its array")  # type: ignore[union-attr]
    return value.name_hint


def fused_products(body: Block) -> tuple[dict[Operation, list[logos.LinearOp]], set[Operation]]:
    """The products `csl-fuse-products` marked to be reduced together: {first: its run}, and the rest of each run
    (lowered with its first)."""
    runs: dict[int, list[logos.LinearOp]] = {}
    for op in body.ops:
        if isinstance(op, logos.LinearOp) and isinstance(mark := op.attributes.get(FUSED), IntegerAttr):
            runs.setdefault(mark.value.data, []).append(op)
    groups = {run[0]: run for run in runs.values() if len(run) > 1}
    return groups, {op for run in groups.values() for op in run[1:]}


def product_of(value: SSAValue) -> SSAValue:
    """The product a value comes from, through its bias and its heads' norm (`logos.bias_add`,
    `logos.head_rms_norm`: each computed on the product as it is laid out)."""
    while isinstance(value.owner, logos.BiasAddOp | logos.HeadRMSNormOp):
        value = value.owner.input
    return value


def feeds_of(body: Block) -> dict[SSAValue, set[str]]:
    """What each linear's result feeds (through its bias and its heads' norm, `product_of`): a rotation (`rope`), a
    cache (`cache`, directly or through its rotation), attention's query (`query`)."""
    feeds: dict[SSAValue, set[str]] = {}
    for op in body.ops:
        if isinstance(op, logos.RopeOp):
            feeds.setdefault(product_of(op.input), set()).add("rope")
        if isinstance(op, logos.CacheWriteOp):
            source = op.input
            owner = source.owner
            if isinstance(owner, logos.RopeOp):
                source = owner.input
            feeds.setdefault(product_of(source), set()).add("cache")
        if isinstance(op, logos.AttentionOp):
            owner = op.query.owner
            source = owner.input if isinstance(owner, logos.RopeOp) else op.query
            feeds.setdefault(product_of(source), set()).add("query")
    return feeds
