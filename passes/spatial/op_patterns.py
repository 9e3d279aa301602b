"""The per-op lowering of a part onto the grid, as xDSL rewrite patterns: one pattern per logos op of a part's
section, driven by one `PatternRewriteWalker` over a copy of the section (`lower_part`). Each pattern inserts the
op's element code in front of it and replaces the op's result by the array it lives in (a `memref.get_global`, a
symbol reference; `part.PartLowering.replace`): `logos.linear` a tile's multiply-accumulate (`@fmacs`, `@fmachs` for
f16 weights) and a reduction on the fabric; `logos.rms_norm` a sum of squares reduced along the row; `logos.rope` the
rotation of the element's pairs; `logos.cache_write` a store on the position's column; `logos.attention` scores,
softmax and weighted values over the element's positions, reduced on the fabric; `logos.embed` a row of the table's
tile on its owner row, summed down the column; `logos.argmax` is the host's, over the logits it reads back. Weights,
caches and inputs are declarations the patterns read; they, the arg-max and the stand-ins are swept when the walk is
done, and the element code is what remains. An op no pattern lowers is refused with its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from xdsl.dialects import arith, csl, func, memref
from xdsl.dialects.builtin import f16, f32
from xdsl.ir import Operation, SSAValue
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from logos_ir.dialects import logos
from logos_ir.errors import PassError
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.element_program import PASS, Vec
from logos_ir.passes.spatial.emit import Emit
from logos_ir.passes.spatial.fuse_products import feeds_argmax
from logos_ir.passes.spatial.part import PartLowering, array_name, fused_products
from logos_ir.spec import ModelSpec

# -- each op's element code ----------------------------------------------------------------------------------------


def lower_func_return(part: PartLowering, op: func.ReturnOp) -> None:
    """The part's result left in `residual`, the state each part leaves for the next (the head's arg-max is the
    host's: nothing to copy)."""
    result = part.values.get(op.operands[0]) if op.operands else None
    if isinstance(result, Vec) and result.array != "residual":
        e = part.e
        e.dsd_op(csl.FmovsOp, e.dsd(part.arr("residual"), result.chunk), e.dsd(part.arr(result.array), result.chunk))


def lower_embed(part: PartLowering, op: logos.EmbedOp) -> None:
    plan, e = part.plan, part.e
    table = part.program_weight(part.values[op.table], "col")
    out = part.vec(array_name(op.result), "col", plan.hidden)
    tile_rows = table.tile_rows
    token = e.load(part.arr("token_in"), e.int(0))
    owner = e.bin(arith.DivSIOp, token, e.int(tile_rows))
    row = e.bin(arith.RemSIOp, token, e.int(tile_rows))
    buffer = part.arr(out.array)
    e.dsd_op(csl.FmovsOp, e.dsd(buffer, out.chunk), e.float(0.0))
    py = part.coordinate("col")
    with e.when(e.cmp(py, owner, "eq")) as inner:
        source = inner.moved(inner.dsd(part.arr(table.name), out.chunk, 0, tile_rows), row, part.element_type)
        convert = csl.Fh2sOp if plan.image == "f16" else csl.FmovsOp
        inner.dsd_op(convert, inner.dsd(buffer, out.chunk), source)
    part.reduce(e, buffer, out.chunk, "col", csl.FaddsOp)
    part.values[op.result] = out


def lower_rms_norm(part: PartLowering, op: logos.RMSNormOp) -> None:
    e = part.e
    x: Vec = part.values[op.input]
    weight = part.program_weight(part.values[op.weight], "col")
    out = part.vec(array_name(op.result), x.layout, x.length)
    source, target = part.arr(x.array), part.arr(out.array)
    with e.loop(x.chunk, [e.float(0.0)]) as (body, j, (total,), yielded):
        v = body.load(source, j)
        yielded.append(body.op(arith.AddfOp(total, body.op(arith.MulfOp(v, v)).results[0])).results[0])
    squares = part.arr("norm_sum")
    e.store(yielded[0], squares, e.int(0))
    part.reduce(e, squares, 1, "row" if x.layout == "col" else "col", csl.FaddsOp)
    mean = e.op(arith.MulfOp(e.load(squares, e.int(0)), e.float(1.0 / x.length))).results[0]
    root = e.math(part.program.math, "sqrt_f32", e.op(arith.AddfOp(mean, e.float(op.epsilon.value.data))).results[0])
    scale = e.op(arith.DivfOp(e.float(1.0), root)).results[0]
    e.dsd_op(csl.FmulsOp, e.dsd(target, x.chunk), e.dsd(source, x.chunk), scale)
    w = e.moved(e.dsd(part.arr(weight.name), x.chunk), part.weight_offset(weight))
    if op.plus_one is not None:  # Gemma's: by one plus the weight (1 + w rounded to f32 first, as transformers does)
        part.program.array("norm_weight", x.chunk)
        plus = e.dsd(part.arr("norm_weight"), x.chunk)
        e.dsd_op(csl.FaddsOp, plus, w, e.float(1.0))
        w = plus
    e.dsd_op(csl.FmulsOp, e.dsd(target, x.chunk), e.dsd(target, x.chunk), w)
    part.values[op.result] = out


def lower_head_rms_norm(part: PartLowering, op: logos.HeadRMSNormOp) -> None:
    """Each head of attention's query or cached key RMS-normed (Qwen3's q_norm, k_norm), on the product as it is laid
    out (`grid.query_rows`, `grid.kv_rows`): each element adds its features' squares into its heads' sums, which are
    reduced down the column (a head's features lie on one or more rows of a column); each feature is then scaled by
    its head's 1 / sqrt(mean + epsilon) and by the norm's weight at its dimension (`PartLowering.spread_weight`), in
    place."""
    plan, e = part.plan, part.e
    x: Vec = part.values[op.input]
    if not op.input.has_one_use():
        raise PassError(f"{PASS}: '{op.name}' norms a product that is also read un-normed")
    head_dim = op.weight.type.get_shape()[0]  # type: ignore[attr-defined]
    if x.order == tuple(g.query_rows(plan)):
        group, count = plan.group, plan.heads
    elif x.order == tuple(g.kv_rows(plan)):
        group, count = 1, plan.kv_heads * plan.kv_copies
    else:
        raise PassError(f"{PASS}: the grid norms the heads of attention's query and cached key only")
    if head_dim != plan.head_dim:
        raise PassError(f"{PASS}: '{op.name}' norms heads of {head_dim}, not the model's {plan.head_dim}")
    dims = [-1 if source < 0 else source % head_dim for source in x.order]
    weight = part.spread_weight(part.values[op.weight], x, dims)
    part.program.array("head_sums", plan.heads)
    sums, data = part.arr("head_sums"), part.arr(x.array)
    e.dsd_op(csl.FmovsOp, e.dsd(sums, count), e.float(0.0))
    first_kv = e.bin(arith.MuliOp, part.coordinate("col"), e.int(plan.kv_chunk))
    with e.loop(x.chunk) as (body, r, _, _y):
        head = part.head_of(body, first_kv, r, group, count)
        v = body.load(data, r)
        total = body.op(arith.AddfOp(body.load(sums, head), body.op(arith.MulfOp(v, v)).results[0])).results[0]
        body.store(total, sums, head)
    part.reduce(e, sums, count, "col", csl.FaddsOp)
    epsilon = op.epsilon.value.data
    with e.loop(count) as (body, h, _, _y):
        mean = body.op(arith.MulfOp(body.load(sums, h), body.float(1.0 / head_dim))).results[0]
        root = body.math(part.program.math, "sqrt_f32", body.op(arith.AddfOp(mean, body.float(epsilon))).results[0])
        body.store(body.op(arith.DivfOp(body.float(1.0), root)).results[0], sums, h)
    with e.loop(x.chunk) as (body, r, _, _y):
        scale = body.load(sums, part.head_of(body, first_kv, r, group, count))
        body.store(body.op(arith.MulfOp(body.load(data, r), scale)).results[0], data, r)
    w = e.moved(e.dsd(part.arr(weight.name), x.chunk), part.weight_offset(weight), part.element_type)
    if plan.image == "f16":  # the f16 weights widened to f32 first
        part.program.array("head_norm_weight", plan.query_chunk)  # the query's chunk or the key's
        widened = e.dsd(part.arr("head_norm_weight"), x.chunk)
        e.dsd_op(csl.Fh2sOp, widened, w)
        w = widened
    if op.plus_one is not None:  # by one plus the weight
        part.program.array("head_norm_weight", plan.query_chunk)  # the query's chunk or the key's
        plus = e.dsd(part.arr("head_norm_weight"), x.chunk)
        e.dsd_op(csl.FaddsOp, plus, w, e.float(1.0))
        w = plus
    e.dsd_op(csl.FmulsOp, e.dsd(data, x.chunk), e.dsd(data, x.chunk), w)
    part.values[op.result] = x  # normed in place


def lower_linear(part: PartLowering, op: logos.LinearOp) -> None:
    """A product: each element multiplies its tile by its input chunk, then the partial sums are reduced along
    the line. Products of one input written one after another (q, k and v; gate and up) are reduced together,
    as one message: each element's partial sums side by side in one array, then copied to each product's."""
    if op in part.fused_later:
        return
    group = part.fused.get(op, [op])
    e = part.e
    x: Vec = part.values[op.input]
    along = "row" if x.layout == "col" else "col"
    if len(group) == 1:
        out, acc = part.product(op, None, 0)
        final = feeds_argmax(op.result)  # the logits: reduced to the centre column, where the host reads them
        part.reduce(e, acc, out.chunk, along, csl.FaddsOp, broadcast=not final)
        return
    chunks = [part.product_plan(member)[1].tile_rows for member in group]
    name = "sums_" + "_".join(array_name(member.result) for member in group)
    part.program.array(name, sum(chunks))
    fused = part.arr(name)
    offsets = [sum(chunks[:i]) for i in range(len(group))]
    outs = [part.product(member, fused, at)[0] for member, at in zip(group, offsets, strict=True)]
    part.reduce(e, fused, sum(chunks), along, csl.FaddsOp)
    for out, at in zip(outs, offsets, strict=True):
        e.dsd_op(csl.FmovsOp, e.dsd(part.arr(out.array), out.chunk), e.dsd(fused, out.chunk, at))


def lower_bias_add(part: PartLowering, op: logos.BiasAddOp) -> None:
    """A product's bias, added after its reduction: every element of the line holds the product's total for its
    chunk and adds its slice of the bias (`PartLowering.spread_weight`), in place: `@fadds`, or with f16 weights
    `@fmachs` (the f16 bias times 1 accumulated in f32)."""
    e = part.e
    x: Vec = part.values[op.input]
    if not op.input.has_one_use():
        raise PassError(f"{PASS}: '{op.name}' adds to a product that is also read unbiased")
    bias = part.spread_weight(part.values[op.bias], x)
    data = e.dsd(part.arr(x.array), x.chunk)
    slice_ = e.moved(e.dsd(part.arr(bias.name), x.chunk), part.weight_offset(bias), part.element_type)
    if part.plan.image == "f16":
        e.dsd_op(csl.FmachsOp, data, data, slice_, e.op(arith.TruncFOp(e.float(1.0), f16)).results[0])
    else:
        e.dsd_op(csl.FaddsOp, data, data, slice_)
    part.values[op.result] = x  # added in place


def lower_rope(part: PartLowering, op: logos.RopeOp) -> None:
    e = part.e
    x: Vec = part.values[op.input]
    table = f"inv_freq_{x.chunk}"
    part.program.array(table, x.chunk // 2)
    part.program.handles.setdefault("rope_tables", {})[table] = x.chunk  # type: ignore[index]
    position = e.bin(arith.SubiOp, e.load(part.arr("position_in"), e.int(0)), e.int(1))
    angle_base = e.op(arith.SIToFPOp(position, f32)).results[0]
    data, freq = part.arr(x.array), part.arr(table)
    pairs = x.chunk // 2
    local = part.plan.local_theta is not None and part.layer is not None
    # YaRN's and LongRoPE's attention factor scales cos and sin, in f32 after them (as transformers scales its
    # tables); the local layers' own tables are never scaled (a spec with a local base has no scaling but linear)
    factor = None if op.rope_scaling is None else op.rope_scaling.attention_factor
    factor = None if factor in (None, 1.0) else factor

    def scaled(b: Emit, value: SSAValue) -> SSAValue:
        return value if factor is None else b.op(arith.MulfOp(value, b.float(factor))).results[0]

    if part.layer is not None:  # the angles are the position's in every layer: layer 0 turns them into cos, sin
        part.program.array(f"rope_cos_{x.chunk}", pairs)
        part.program.array(f"rope_sin_{x.chunk}", pairs)
        cosines, sines = part.arr(f"rope_cos_{x.chunk}"), part.arr(f"rope_sin_{x.chunk}")
        with e.when(e.cmp(part.layer, e.int(0), "eq")) as first_layer:
            with first_layer.loop(pairs) as (body, i, _, _y):
                angle = body.op(arith.MulfOp(angle_base, body.load(freq, i))).results[0]
                body.store(scaled(body, body.math(part.program.math, "cos_f32", angle)), cosines, i)
                body.store(scaled(body, body.math(part.program.math, "sin_f32", angle)), sines, i)
            if local:
                local_cosines, local_sines = _local_angles(part, first_layer, x, angle_base)
        if local:
            part.e = e
            local_cosines, local_sines = part.arr(f"rope_cos_local_{x.chunk}"), part.arr(f"rope_sin_local_{x.chunk}")
            named = part.layer_among(e, part.plan.local_layers)
    with e.loop(pairs) as (body, i, _, _y):
        if local:  # a local layer's tables or the model's, by the layer's index
            cos = body.op(arith.SelectOp(named, body.load(local_cosines, i), body.load(cosines, i))).results[0]
            sin = body.op(arith.SelectOp(named, body.load(local_sines, i), body.load(sines, i))).results[0]
        elif part.layer is not None:
            cos, sin = body.load(cosines, i), body.load(sines, i)
        else:
            angle = body.op(arith.MulfOp(angle_base, body.load(freq, i))).results[0]
            cos = scaled(body, body.math(part.program.math, "cos_f32", angle))
            sin = scaled(body, body.math(part.program.math, "sin_f32", angle))
        even = body.bin(arith.MuliOp, i, body.int(2))
        odd = body.bin(arith.AddiOp, even, body.int(1))
        a, b = body.load(data, even), body.load(data, odd)
        first = body.op(
            arith.SubfOp(body.op(arith.MulfOp(a, cos)).results[0], body.op(arith.MulfOp(b, sin)).results[0])
        ).results[0]
        second = body.op(
            arith.AddfOp(body.op(arith.MulfOp(a, sin)).results[0], body.op(arith.MulfOp(b, cos)).results[0])
        ).results[0]
        body.store(first, data, even)
        body.store(second, data, odd)
    part.values[op.result] = x  # rotated in place


def _local_angles(part: PartLowering, e: Emit, x: Vec, angle_base: SSAValue) -> tuple[SSAValue, SSAValue]:
    """The cos and sin of the local layers' angles for each pair of `x`'s chunk (`GridPlan.local_theta`, unscaled:
    Gemma 3's local layers), made on the element (the host writes the model's tables only): pair i of row y's chunk
    rotates the head's dimension d = ((y * kv_chunk + 2i mod kv_chunk) mod head_dim) / 2 (`grid.kv_rows`' pairs),
    at frequency exp(-(2d / head_dim) ln theta); a padding pair's numbers are zeros, whatever its angle."""
    plan = part.plan
    pairs = x.chunk // 2
    part.program.array(f"rope_cos_local_{x.chunk}", pairs)
    part.program.array(f"rope_sin_local_{x.chunk}", pairs)
    cosines, sines = part.program.get(e, f"rope_cos_local_{x.chunk}"), part.program.get(e, f"rope_sin_local_{x.chunk}")
    first = e.bin(arith.MuliOp, part.coordinate("col", e), e.int(plan.kv_chunk))
    rate = -2.0 * math.log(plan.local_theta or 1.0) / plan.head_dim
    with e.loop(pairs) as (body, i, _, _y):
        at = body.bin(arith.RemSIOp, body.bin(arith.MuliOp, i, body.int(2)), body.int(plan.kv_chunk))
        d = body.bin(arith.DivSIOp, body.bin(arith.RemSIOp, body.bin(arith.AddiOp, first, at),
                                             body.int(plan.head_dim)), body.int(2))  # fmt: skip
        exponent = body.op(arith.MulfOp(body.op(arith.SIToFPOp(d, f32)).results[0], body.float(rate))).results[0]
        frequency = body.math(part.program.math, "exp_f32", exponent)
        angle = body.op(arith.MulfOp(angle_base, frequency)).results[0]
        body.store(body.math(part.program.math, "cos_f32", angle), cosines, i)
        body.store(body.math(part.program.math, "sin_f32", angle), sines, i)
    return cosines, sines


def lower_cache_write(part: PartLowering, op: logos.CacheWriteOp) -> None:
    """A store on the position's column: position p at ring index p mod the layer's cached positions (p itself
    where it caches ctx), on column t mod width, slot t div width of the layer's slots (`PartLowering.cache_cases`:
    a windowed layer keeps only its window's positions)."""
    plan, outer = part.plan, part.e
    x: Vec = part.values[op.input]
    name = part.cache_array(part.values[op.cache], x.chunk)
    for e, ring, _slots, first_slot in part.cache_cases():
        part.e = e
        position = e.bin(arith.SubiOp, e.load(part.arr("position_in"), e.int(0)), e.int(1))
        if ring != plan.ctx:  # a ring of the window's positions
            position = e.bin(arith.RemSIOp, position, e.int(ring))
        column = e.bin(arith.RemSIOp, position, e.int(plan.width))
        slot = e.bin(arith.DivSIOp, position, e.int(plan.width))
        px = part.coordinate("row")
        with e.when(e.cmp(px, column, "eq")) as inner:
            at = inner.bin(arith.MuliOp, inner.bin(arith.AddiOp, first_slot(inner), slot), inner.int(x.chunk))
            target = inner.moved(inner.dsd(part.arr(name), x.chunk), at, part.element_type)
            convert = csl.Fs2hOp if plan.image == "f16" else csl.FmovsOp
            inner.dsd_op(convert, target, inner.dsd(part.arr(x.array), x.chunk))
    part.e = outer


def lower_attention(part: PartLowering, op: logos.AttentionOp) -> None:
    """Attention over the element's positions with KV heads kept narrow: row y caches KV features
    [y * kv_chunk, (y + 1) * kv_chunk) and holds the query features of every head of their group at those
    dimensions (`grid.query_rows`), so each query head of a group reads the same cached K/V tile. A windowed
    layer reads only its ring of the window's positions (`PartLowering.cache_cases`), every one of which is in its
    window once written; a layer of either kind, where the layers differ, has its own code."""
    outer = part.e
    for e, ring, slots, first_slot in part.cache_cases():
        part.e = e
        _attend(part, op, ring, slots, first_slot)
    part.e = outer
    q: Vec = part.values[op.query]
    part.values[op.result] = Vec("row", q.length, q.chunk, array_name(op.result), q.order)


def _attend(
    part: PartLowering, op: logos.AttentionOp, ring: int, slots: int, first_slot: Callable[[Emit], SSAValue]
) -> None:
    """`lower_attention` for layers caching `ring` positions in `slots` slots from `first_slot`."""
    plan, e = part.plan, part.e
    q: Vec = part.values[op.query]
    c, group = plan.kv_chunk, plan.group
    keys = part.arr(part.cache_array(part.values[op.keys], c))
    values = part.arr(part.cache_array(part.values[op.values], c))
    heads, chunk, width = plan.heads, q.chunk, plan.width
    window = plan.window  # the heads whose queries the element holds
    # the scores the element keeps: its window's heads (reduced within its KV head's column segment) or every
    # head's (reduced down the whole column) when a row's features straddle KV heads
    kept = window if plan.scores_local else heads
    part.program.array("scores", kept * plan.slots)
    part.program.array("head_max", window)
    scores, high = part.arr("scores"), part.arr("head_max")
    out = Vec("row", q.length, chunk, array_name(op.result), q.order)
    part.program.array(out.array, chunk)
    attended, query = part.arr(out.array), part.arr(q.array)
    position = e.bin(arith.SubiOp, e.load(part.arr("position_in"), e.int(0)), e.int(1))
    px, py = part.coordinate("row"), part.coordinate("col")
    layer = part.layer if part.layer is not None else e.int(0)
    base = e.bin(arith.MuliOp, first_slot(e), e.int(c)) if plan.rings else e.bin(arith.MuliOp, layer, e.int(slots * c))
    first_kv = e.bin(arith.MuliOp, py, e.int(c))
    h0 = e.bin(arith.MuliOp, e.bin(arith.DivSIOp, first_kv, e.int(plan.head_dim)), e.int(group))
    highest = e.int(heads - window)
    h0 = e.op(arith.SelectOp(e.cmp(h0, highest, "slt"), h0, highest)).results[0]
    kept_from = h0 if plan.scores_local else e.int(0)  # the head of the scores' first row
    e.dsd_op(csl.FmovsOp, e.dsd(scores, kept * slots), e.float(0.0))
    # partial scores: each of my query features r (head m of the group, KV feature t) adds q[r] * k[., t] over my
    # positions to its head's scores
    with e.loop(chunk) as (body, r, _, _y):
        head = body.bin(arith.SubiOp, part.head_of(body, first_kv, r), kept_from)
        row = body.moved(body.dsd(scores, slots), body.bin(arith.MuliOp, head, body.int(slots)))
        t = body.bin(arith.RemSIOp, r, body.int(c))
        column = body.moved(body.dsd(keys, slots, 0, c), body.bin(arith.AddiOp, base, t), part.element_type)
        value = body.load(query, r)
        if part.plan.image == "f16":
            body.dsd_op(csl.FmachsOp, row, row, column, body.op(arith.TruncFOp(value, f16)).results[0])
        else:
            body.dsd_op(csl.FmacsOp, row, row, column, value)
    part.reduce(e, scores, kept * slots, "col", csl.FaddsOp, segment_only=plan.scores_local)
    e.dsd_op(
        csl.FmulsOp,
        e.dsd(scores, kept * slots),
        e.dsd(scores, kept * slots),
        e.float(1.0 / math.sqrt(plan.head_dim) if op.scale is None else op.scale.value.data),
    )
    if op.softcap is not None:  # Gemma 2's: cap * tanh(score / cap), before the mask
        with e.loop(kept * slots) as (body, i, _, _y):
            capped = _softcapped(part, body, body.load(scores, i), op.softcap.value.data)
            body.store(capped, scores, i)
    # softmax for my heads (a window of `window` heads from h0; my row's elements share it): my positions after
    # the current one masked, each head's maximum over mine, then along the row
    rows_from = e.bin(arith.MuliOp, e.bin(arith.SubiOp, h0, kept_from), e.int(slots))
    written = position  # the last ring index written: the position, or the ring's last once it has come round
    if ring != plan.ctx:
        last = e.int(ring - 1)
        written = e.op(arith.SelectOp(e.cmp(position, last, "slt"), position, last)).results[0]
    e.dsd_op(csl.FmovsOp, e.dsd(high, window), e.float(-3.0e38))
    with e.loop(slots) as (outer, s, _, _y):
        t = outer.bin(arith.AddiOp, outer.bin(arith.MuliOp, s, outer.int(width)), px)
        later = outer.cmp(t, written, "sgt")
        with outer.when(later) as masked:
            masked.dsd_op(csl.FmovsOp, masked.moved(masked.dsd(scores, kept, 0, slots), s), masked.float(-3.0e38))
        mine = outer.moved(outer.dsd(scores, window, 0, slots), outer.bin(arith.AddiOp, rows_from, s))
        outer.dsd_op(csl.FmaxsOp, outer.dsd(high, window), outer.dsd(high, window), mine)
    part.reduce(e, high, window, "row", csl.FmaxsOp)
    # exp(score - max); my features' weighted values and each head's sum of weights, side by side in one array,
    # summed along the row as one message; then each value divided by its head's sum
    part.program.array("attention_sums", chunk + window)
    sums = part.arr("attention_sums")
    e.dsd_op(csl.FmovsOp, e.dsd(sums, chunk + window), e.float(0.0))
    if plan.scores_local:
        part.shared_exponentials(scores, high, sums, chunk, slots)
    else:
        part.exponentials(h0, kept_from, scores, high, sums, chunk, slots)
    part.program.array("weights_by_feature", plan.slots * chunk)
    spread = part.arr("weights_by_feature")
    with e.loop(chunk) as (body, r, _, _y):
        head = body.bin(arith.SubiOp, part.head_of(body, first_kv, r), kept_from)
        row = body.moved(body.dsd(scores, slots), body.bin(arith.MuliOp, head, body.int(slots)))
        body.dsd_op(csl.FmovsOp, body.moved(body.dsd(spread, slots, 0, chunk), r), row)
    part.program.array("weighted", c)
    scratch = part.arr("weighted")
    if part.plan.image == "f16":
        part.program.array("cached_value", c)
    with e.loop(slots) as (body, s, _, _y):
        cached = body.moved(
            body.dsd(values, c), body.bin(arith.AddiOp, base, body.bin(arith.MuliOp, s, body.int(c))),
            part.element_type,
        )  # fmt: skip
        if part.plan.image == "f16":
            widened = part.program.get(body, "cached_value")
            body.dsd_op(csl.Fh2sOp, body.dsd(widened, c), cached)
            cached = body.dsd(widened, c)
        at = body.bin(arith.MuliOp, s, body.int(chunk))
        with body.loop(group) as (inner, m, _, _y2):  # each head of the group reads the same cached values
            offset = inner.bin(arith.MuliOp, m, inner.int(c))
            weights = inner.moved(inner.dsd(spread, c), inner.bin(arith.AddiOp, at, offset))
            inner.dsd_op(csl.FmulsOp, inner.dsd(scratch, c), cached, weights)
            into = inner.moved(inner.dsd(sums, c), offset)
            inner.dsd_op(csl.FaddsOp, into, into, inner.dsd(scratch, c))
    part.reduce(e, sums, chunk + window, "row", csl.FaddsOp)
    with e.loop(chunk) as (body, r, _, _y):
        head = body.bin(arith.SubiOp, part.head_of(body, first_kv, r), h0)
        total = body.load(sums, body.bin(arith.AddiOp, head, body.int(chunk)))
        body.store(body.op(arith.DivfOp(body.load(sums, r), total)).results[0], attended, r)


def lower_add(part: PartLowering, op: logos.AddOp) -> None:
    part.elementwise(op, csl.FaddsOp)


def lower_mul(part: PartLowering, op: logos.MulOp) -> None:
    part.elementwise(op, csl.FmulsOp)


def lower_silu(part: PartLowering, op: logos.SiluOp) -> None:
    e = part.e
    x: Vec = part.values[op.input]
    out = part.vec(array_name(op.result), x.layout, x.length)
    source, target = part.arr(x.array), part.arr(out.array)
    with e.loop(x.chunk) as (body, j, _, _y):
        v = body.load(source, j)
        negative = body.op(arith.SubfOp(body.float(0.0), v)).results[0]
        denominator = body.op(arith.AddfOp(body.float(1.0), body.math(part.program.math, "exp_f32", negative))).results[
            0
        ]
        body.store(body.op(arith.DivfOp(v, denominator)).results[0], target, j)
    part.values[op.result] = out


def _tanh(part: PartLowering, e: Emit, z: SSAValue) -> SSAValue:
    """tanh(z) = 1 - 2 / (exp(2z) + 1), by `<math>`'s exp (the lane's math has no tanh): +-1 at the extremes."""
    twice = e.op(arith.MulfOp(z, e.float(2.0))).results[0]
    grown = e.op(arith.AddfOp(e.math(part.program.math, "exp_f32", twice), e.float(1.0))).results[0]
    return e.op(arith.SubfOp(e.float(1.0), e.op(arith.DivfOp(e.float(2.0), grown)).results[0])).results[0]


def _softcapped(part: PartLowering, e: Emit, v: SSAValue, cap: float) -> SSAValue:
    """cap * tanh(v / cap)."""
    z = e.op(arith.MulfOp(v, e.float(1.0 / cap))).results[0]
    return e.op(arith.MulfOp(_tanh(part, e, z), e.float(cap))).results[0]


def _result_vec(part: PartLowering, op: Operation, x: Vec) -> Vec:
    """Where an elementwise op's result lives: its input's array (in place) where nothing else reads the input, else
    an array of its own, laid out as the input."""
    if op.operands[0].has_one_use():
        return x
    out = Vec(x.layout, x.length, x.chunk, array_name(op.results[0]), x.order)
    part.program.array(out.array, out.chunk)
    return out


def lower_scale(part: PartLowering, op: logos.ScaleOp) -> None:
    """Each number times the factor rounded to f32 (Gemma's embedding times sqrt(width)): one `@fmuls`."""
    e = part.e
    x: Vec = part.values[op.input]
    out = _result_vec(part, op, x)
    e.dsd_op(csl.FmulsOp, e.dsd(part.arr(out.array), x.chunk), e.dsd(part.arr(x.array), x.chunk),
             e.float(op.factor.value.data))  # fmt: skip
    part.values[op.result] = out


def lower_softcap(part: PartLowering, op: logos.SoftcapOp) -> None:
    """cap * tanh(x / cap) over the chunk (Gemma 2's logits: the head's, before the host's arg-max)."""
    e = part.e
    x: Vec = part.values[op.input]
    out = _result_vec(part, op, x)
    source, target = part.arr(x.array), part.arr(out.array)
    with e.loop(x.chunk) as (body, j, _, _y):
        body.store(_softcapped(part, body, body.load(source, j), op.cap.value.data), target, j)
    part.values[op.result] = out


def lower_gelu_tanh(part: PartLowering, op: logos.GeluTanhOp) -> None:
    """GELU with the tanh approximation over the chunk: 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2 / pi)
    (x + 0.044715 x^3) (Gemma's GeGLU gate; as `logos.silu`, one `<math>` exp a number)."""
    e = part.e
    x: Vec = part.values[op.input]
    out = part.vec(array_name(op.result), x.layout, x.length)
    source, target = part.arr(x.array), part.arr(out.array)
    with e.loop(x.chunk) as (body, j, _, _y):
        v = body.load(source, j)
        cube = body.op(arith.MulfOp(body.op(arith.MulfOp(v, v)).results[0], v)).results[0]
        inner = body.op(arith.AddfOp(v, body.op(arith.MulfOp(cube, body.float(0.044715))).results[0])).results[0]
        minus_twice_u = body.op(arith.MulfOp(inner, body.float(-2.0 * math.sqrt(2.0 / math.pi)))).results[0]
        grown = body.op(arith.AddfOp(body.float(1.0), body.math(part.program.math, "exp_f32", minus_twice_u)))
        body.store(body.op(arith.DivfOp(v, grown.results[0])).results[0], target, j)
    part.values[op.result] = out


def lower_argmax(part: PartLowering, op: logos.ArgmaxOp) -> None:
    logits: Vec = part.values[op.input]
    part.program.handles["logits"] = logits  # type: ignore[assignment]
    part.values[op.result] = "argmax"


# -- the patterns --------------------------------------------------------------------------------------------------


class PartPattern(RewritePattern):
    """A pattern of one part's lowering: it writes into `part`'s program."""

    def __init__(self, part: PartLowering):
        self.part = part


class ReturnToCsl(PartPattern):
    """`func.return`: the part's result into `residual`."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: func.ReturnOp, rewriter: PatternRewriter) -> None:
        lower_func_return(self.part.at(op), op)
        rewriter.erase(op)


class EmbedToCsl(PartPattern):
    """`logos.embed`: the token's row of the table's tile on its owner row, summed down the column."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.EmbedOp, rewriter: PatternRewriter) -> None:
        lower_embed(self.part.at(op), op)
        self.part.replace(rewriter, op)


class RmsNormToCsl(PartPattern):
    """`logos.rms_norm`: a sum of squares reduced along the line, then the scaled chunk."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.RMSNormOp, rewriter: PatternRewriter) -> None:
        lower_rms_norm(self.part.at(op), op)
        self.part.replace(rewriter, op)


class LinearToCsl(PartPattern):
    """`logos.linear`: a tile's multiply-accumulate and a reduction on the fabric."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.LinearOp, rewriter: PatternRewriter) -> None:
        lower_linear(self.part.at(op), op)
        self.part.replace(rewriter, op)


class BiasAddToCsl(PartPattern):
    """`logos.bias_add`: each element's slice of the bias added to its chunk of the reduced product."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.BiasAddOp, rewriter: PatternRewriter) -> None:
        lower_bias_add(self.part.at(op), op)
        self.part.replace(rewriter, op)


class HeadRmsNormToCsl(PartPattern):
    """`logos.head_rms_norm`: each head's sum of squares reduced down the column, then the scaled features."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.HeadRMSNormOp, rewriter: PatternRewriter) -> None:
        lower_head_rms_norm(self.part.at(op), op)
        self.part.replace(rewriter, op)


class RopeToCsl(PartPattern):
    """`logos.rope`: the rotation of the element's pairs, in place."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.RopeOp, rewriter: PatternRewriter) -> None:
        lower_rope(self.part.at(op), op)
        self.part.replace(rewriter, op)


class CacheWriteToCsl(PartPattern):
    """`logos.cache_write`: a store on the position's column."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.CacheWriteOp, rewriter: PatternRewriter) -> None:
        lower_cache_write(self.part.at(op), op)
        self.part.replace(rewriter, op)


class AttentionToCsl(PartPattern):
    """`logos.attention`: scores, softmax and weighted values over the element's positions."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.AttentionOp, rewriter: PatternRewriter) -> None:
        lower_attention(self.part.at(op), op)
        self.part.replace(rewriter, op)


class AddToCsl(PartPattern):
    """`logos.add`: `@fadds` over the chunks."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.AddOp, rewriter: PatternRewriter) -> None:
        lower_add(self.part.at(op), op)
        self.part.replace(rewriter, op)


class MulToCsl(PartPattern):
    """`logos.mul`: `@fmuls` over the chunks."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.MulOp, rewriter: PatternRewriter) -> None:
        lower_mul(self.part.at(op), op)
        self.part.replace(rewriter, op)


class SiluToCsl(PartPattern):
    """`logos.silu`: x / (1 + exp(-x)) over the chunk."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.SiluOp, rewriter: PatternRewriter) -> None:
        lower_silu(self.part.at(op), op)
        self.part.replace(rewriter, op)


class ScaleToCsl(PartPattern):
    """`logos.scale`: `@fmuls` by the factor."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ScaleOp, rewriter: PatternRewriter) -> None:
        lower_scale(self.part.at(op), op)
        self.part.replace(rewriter, op)


class SoftcapToCsl(PartPattern):
    """`logos.softcap`: cap * tanh(x / cap) over the chunk."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.SoftcapOp, rewriter: PatternRewriter) -> None:
        lower_softcap(self.part.at(op), op)
        self.part.replace(rewriter, op)


class GeluTanhToCsl(PartPattern):
    """`logos.gelu_tanh`: x / (1 + exp(-2u)) over the chunk."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.GeluTanhOp, rewriter: PatternRewriter) -> None:
        lower_gelu_tanh(self.part.at(op), op)
        self.part.replace(rewriter, op)


class ArgmaxToCsl(PartPattern):
    """`logos.argmax`: the host's, over the logits it reads back (the op is swept after the walk)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: logos.ArgmaxOp, rewriter: PatternRewriter) -> None:
        lower_argmax(self.part.at(op), op)
        self.part.replace(rewriter, op)


DECLARATIONS = (logos.WeightOp, logos.CacheOp, logos.InputOp)
LOWERED = (
    func.ReturnOp,
    logos.EmbedOp,
    logos.RMSNormOp,
    logos.LinearOp,
    logos.BiasAddOp,
    logos.HeadRMSNormOp,
    logos.RopeOp,
    logos.CacheWriteOp,
    logos.AttentionOp,
    logos.AddOp,
    logos.MulOp,
    logos.SiluOp,
    logos.ScaleOp,
    logos.SoftcapOp,
    logos.GeluTanhOp,
    logos.ArgmaxOp,
)


class RefuseUnlowered(RewritePattern):
    """Any other op of a part's section: refused by name (the grid does not lower it)."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if isinstance(op, (*DECLARATIONS, *LOWERED, memref.GetGlobalOp)):
            return
        if isinstance(op, func.CallOp):
            raise PassError(f"{PASS}: expects a part's function body, found a call")
        raise PassError(f"{PASS}: the spatial grid does not lower '{op.name}'")


def part_patterns(part: PartLowering) -> list[RewritePattern]:
    return [
        ReturnToCsl(part),
        EmbedToCsl(part),
        RmsNormToCsl(part),
        LinearToCsl(part),
        BiasAddToCsl(part),
        HeadRmsNormToCsl(part),
        RopeToCsl(part),
        CacheWriteToCsl(part),
        AttentionToCsl(part),
        AddToCsl(part),
        MulToCsl(part),
        SiluToCsl(part),
        ScaleToCsl(part),
        SoftcapToCsl(part),
        GeluTanhToCsl(part),
        ArgmaxToCsl(part),
        RefuseUnlowered(),
    ]


def _unlowered_variant(op: Operation, plan: g.GridPlan, spec: ModelSpec | None) -> str | None:
    """What `op` says beyond what the grid computes (`logos.variant`, less what the grid computes of it: attention's
    window (the layer's cache, `_attend`), scale and soft-cap; a norm's one plus its weight; a rotation's partial
    rotary dimension where it is the plan's (its pairs and tables, `grid.kv_rows`, `grid.inv_freq_rows`)), or None.
    A rotation's base and scaling are held to the model's (`spec`: the part being lowered is a copy outside its
    program, where `logos.variant` finds no spec)."""
    if isinstance(op, logos.RopeOp) and spec is not None:
        local = op.theta.value.data == plan.local_theta and op.rope_scaling is None and plan.rotary_dim is None
        if op.theta.value.data != spec.rope_theta and not local:
            return f"rotates with base {op.theta.value.data!r}, not its model's {spec.rope_theta!r}"
        if op.rope_scaling != spec.rope_scaling and not local:
            return f"rotates with rope scaling {op.rope_scaling}, not its model's {spec.rope_scaling}"
    computed = ["window", "scale", "softcap", "plus_one"]
    if isinstance(op, logos.RopeOp) and op.rotary_dim is not None and op.rotary_dim.value.data == plan.rotary_dim:
        computed.append("rotary_dim")
    return logos.variant(op, computed)


def lower_part(part: PartLowering, section: func.FuncOp, spec: ModelSpec | None = None) -> None:
    """The ops of `section` (a copy of a part's section, which this changes) rewritten into the part's element
    code, appended to `part.e`'s block; its hidden-state argument and result live in the `residual` array (the state
    each part leaves for the next), its position argument in `position_in`."""
    target = part.e
    body = section.body.block
    for op in body.ops:  # an op the grid lowers only in its plain form: a variant is refused, not computed as plain
        said = _unlowered_variant(op, part.plan, spec)
        if said is not None:
            raise PassError(f"{PASS}: the spatial grid's '{op.name}' {said}, which the grid does not compute")
    residual = part.vec("residual", "col", part.plan.hidden)
    part.fused, part.fused_later = fused_products(body)
    for op in body.ops:  # weights are names and shapes: known before any product that a group lowers early
        if isinstance(op, logos.WeightOp | logos.CacheOp):
            part.values[op.result] = op
    for arg in body.args:
        if len(arg.type.get_shape()) == 2:  # type: ignore[attr-defined]
            stand_in = part.stand_in(residual)
            body.insert_op_before(stand_in, body.ops.first)  # type: ignore[arg-type]
            arg.replace_all_uses_with(stand_in.memref)
    walker = PatternRewriteWalker(GreedyRewritePatternApplier(part_patterns(part)), apply_recursively=False)
    walker.rewrite_region(section.body)
    for op in reversed(list(body.ops)):  # the declarations, the host's arg-max and the stand-ins, all unused now
        if isinstance(op, (*DECLARATIONS, logos.ArgmaxOp)) or op in part.placeholders:
            body.erase_op(op)
    for op in list(body.ops):
        op.detach()
        target.op(op)
    part.e = target
