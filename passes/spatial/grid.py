"""The whole-grid mapping of a decode step (WaferLLM's lesson): one W x H grid of processing elements on which every
element holds a tile of every projection of every layer, of the embedding table and head, and a share of every
layer's KV cache, so that every element works on every matrix-vector product.

Vectors live in one of two layouts: `col` (element (x, y) holds chunk x; every element of column x holds the same;
a vector cut in W chunks) and `row` (element (x, y) holds chunk y; H chunks). A product whose input is `col` keeps
on element (x, y) the weight tile [rows of chunk y, columns of chunk x]; each element multiplies its tile by its
input chunk, and the partial sums are reduced along the row (a chain eastward on two alternating colours, as
Cerebras's `gemv-checkerboard` does) and the total is broadcast back along the row: the result is `row`. A product
whose input is `row` has its tiles transposed and reduces along the column: its result is `col`. So the hidden state
stays `col` through a layer (norm, q/k/v to `row`, attention in `row`, the output projection back to `col`, the
MLP's gate/up to `row`, down to `col`), and no vector is ever transposed.

Attention: the queries, keys and values arrive `row`, chunk y of their features on row y. The keys and values are
widened on the host side of the weights to one row per query head (GQA: each KV head's projection rows repeated
for the heads of its group) and the rotary pairs (i, i + head_dim/2) made adjacent in the query and key rows, so a
chunk holds whole pairs and a score's partial sum needs only the element's own features. Position p (from 0) is
cached on column p mod W, slot p div W: every element holds, for its own positions, its own features. A score is
summed down the column, its softmax's maximum and sum along the row, the weighted values along the row.

This module holds the figures of that mapping (`GridPlan`) and the host's side of it: how each weight is cut into
each element's tile (`tile_for`). The lowering (`convert_logos_to_csl`) and the runtime both read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from logos_ir.numerics import ceil_div

# Colours (WSE-2 has 24; memcpy reserves 21, 22 and 23 on WSE-2, so a program may use 0..20: the machine facts of
# `dialects/csl_ext.py`). A line (row or column) is cut into segments; each segment is reduced toward its centre
# from both ends at once (each half a chain on two colours alternating by the distance from its end), the segments'
# centres then toward the line's centre (a chain from each end over the centres, the elements between passing the
# wavelets on), and the line's total is broadcast both ways from its centre.
ROW_WEST_CHAIN = (0, 1)  # a segment's western half, eastward to its centre
ROW_EAST_CHAIN = (2, 3)  # its eastern half, westward
ROW_WEST_CENTRES = (4, 5)  # the segments' centres west of the line's centre, eastward
ROW_EAST_CENTRES = (6, 7)  # those east of it, westward
ROW_BCAST = 8  # the line's total from its centre, both ways
COL_NORTH_CHAIN = (9, 10)
COL_SOUTH_CHAIN = (11, 12)
COL_NORTH_CENTRES = (13, 14)
COL_SOUTH_CENTRES = (15, 16)
COL_BCAST = 17
COL_SEGMENT_BCAST = 18  # a column segment's total from its centre to the segment (attention's scores: one KV head's)
# Local task ids (on WSE-2 a local task id may not be a colour the program routes).
EMBED_TASK, LAYER_TASK, HEAD_TASK = 24, 25, 26


@dataclass(frozen=True)
class Weight:
    """A weight array of the element program: `name` (the symbol), the tensors it holds (one per layer for a layer's
    weight), its kind (`matrix` with orientation `col`/`row` input, `vector` for a norm, `table` for the embedding and
    head), the row map (which source row each padded row takes, -1 for zeros) and the tile."""

    name: str
    tensors: tuple[str, ...]
    kind: str
    orient: str = "col"
    rows: int = 0
    columns: int = 0
    tile_rows: int = 0
    tile_columns: int = 0
    row_map: tuple[int, ...] = ()
    column_map: tuple[int, ...] = ()  # which source column each padded column takes (-1: zeros); () for in order
    # read as stored (`STORED`): the file's block format ("" for the float image) and the scale slots a column of the
    # tile's rows has (the most blocks of 32 an element's slice of a row touches; `block_slots`)
    format: str = ""
    scale_slots: int = 0

    @property
    def words(self) -> int:
        """The words of the weight's array: the image's numbers, or (read as stored) the u16 words of its codes,
        each column of the tile's rows packed `STORED[format]` codes a word."""
        if self.format:
            return len(self.tensors) * self.tile_columns * self.column_words
        return len(self.tensors) * self.tile_rows * self.tile_columns

    @property
    def column_words(self) -> int:
        """A tile column's u16 words of codes (read as stored): its rows' codes packed, the last word padded."""
        return ceil_div(self.tile_rows, STORED[self.format])

    @property
    def scale_words(self) -> int:
        """The f16 scales of the weight's `<name>_scales` array: each layer's scale slots, a tile column's rows each."""
        return len(self.tensors) * self.scale_slots * self.tile_rows

    def fields(self) -> dict[str, Any]:
        """The weight as the host plan (`host.json`) writes it: a weight read as its image without the fields of
        one read as stored (so the builds of the image are as they were)."""
        fields = {**self.__dict__, "tensors": list(self.tensors), "row_map": list(self.row_map)}
        if not self.format:
            del fields["format"], fields["scale_slots"]
        return fields


# The block formats the grid reads as stored (a matrix of a layer, every layer's the same format), with the codes a
# u16 word of the element's memory holds: Q8_0 (8-bit codes, an f16 scale a block of 32) and Q4_0 (4-bit codes, the
# same scales). Every other format, and the embedding and head tables, are read as the image.
STORED = {"q8_0": 2, "q4_0": 4}
BLOCK = 32  # numbers a block of each of them


@dataclass
class GridPlan:
    """The figures of the mapping for one model and cache length (see the module docstring)."""

    width: int  # the grid's columns (a `col` vector's chunks, the cache's positions)
    height: int  # its rows (a `row` vector's chunks)
    ctx: int
    image: str  # f16 or f32
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int
    kv_copies: int = 1  # how many rows' worth of copies each KV head's cache has (1: narrow; heads/kv_heads: widened)
    segmented: bool = True  # a line's reductions in WaferLLM's two phases (False: one segment a line, as on a WSE-3)
    weights: dict[str, Weight] = field(default_factory=dict)
    rings: tuple[int, ...] = ()  # each layer's cached positions: its window where it slides, else ctx (() for all)
    rotary_dim: int | None = None  # each head's numbers that rotate (Phi-3's partial rotary), None: all of them
    rotary_freqs: tuple[float, ...] = ()  # a partial rotary's own frequencies (over rotary_dim), () for the head's
    local_theta: float | None = None  # the rope base of the layers that rotate by their own (Gemma 3's local ones)
    local_layers: tuple[int, ...] = ()  # those layers (unscaled; the others rotate by the model's base and scaling)
    # the compact layout, taken where a model fits no other way: a tied head reads the embedding's array (one copy
    # of the table), and the head's logits are reduced in pieces as long as the row's other messages (the row's
    # line buffer is not as long as the vocabulary's chunk)
    compact: bool = False

    @staticmethod
    def of(
        spec: Any,
        ctx: int,
        image: str,
        grid: int | tuple[int, int] | list[int],
        kv_copies: int = 1,
        segmented: bool = True,
    ) -> GridPlan:
        """The plan of a model's decode step over `ctx` positions on a grid of `grid` = (width, height) elements, or
        P x P for a whole number (a build's `host.json` names the same figures, which is how its runtime reads the
        plan back)."""
        width, height = (grid, grid) if isinstance(grid, int) else grid
        sizes = (spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.intermediate, spec.vocab, spec.layers)
        plan = GridPlan(width, height, ctx, image, *sizes, kv_copies, segmented)
        rotary = getattr(spec, "rotary_dim", None)
        if rotary is not None:  # the rotary part's frequencies, as the reference's table over rotary_dim
            from logos_ir.rope import rope_inv_freq

            plan.rotary_dim = rotary
            plan.rotary_freqs = tuple(float(f) for f in rope_inv_freq(rotary, spec.rope_theta, spec.rope_scaling))
        return plan

    @property
    def p(self) -> int:
        """The side of a square grid (the benches' composition of a square's cycles); a rectangle has none."""
        if self.width != self.height:
            raise ValueError(f"a {self.width} x {self.height} grid is not square")
        return self.width

    @property
    def grid(self) -> tuple[int, int]:
        return self.width, self.height

    def extent(self, layout: str) -> int:
        """The chunks of a vector of `layout`: `col` (element (x, y) holds chunk x) over the width, `row` over the
        height."""
        return self.width if layout == "col" else self.height

    def chunk(self, n: int, layout: str, even: bool = False) -> int:
        c = ceil_div(n, self.extent(layout))
        return c + (c % 2) if even else c

    def line_length(self, along: str) -> int:
        """The elements of a row (`along="row"`: the width) or a column (the height)."""
        return self.width if along == "row" else self.height

    @property
    def centre(self) -> int:
        """The element of a row its reductions end on (the head's logits are on this column)."""
        return self.line_centre("row")

    def line_centre(self, along: str) -> int:
        length, count, middle = self.line(along)
        return segment_centre(middle, length, self.line_length(along))

    def line(self, along: str) -> tuple[int, int, int]:
        """(segment length, segments, the middle segment) of a row or a column: a column's segments are a cached KV
        head's rows when no row straddles two (`scores_local`), so a score is reduced within its head's segment."""
        if along == "col" and self.scores_local:
            return segments(self.height, self.head_rows)
        return segments(self.line_length(along), segmented=self.segmented)

    @property
    def head_rows(self) -> int:
        """The rows one cached KV head (copy) spans when none straddles two (kv_chunk divides head_dim), else 0."""
        return self.head_dim // self.kv_chunk if self.head_dim % self.kv_chunk == 0 else 0

    @property
    def scores_local(self) -> bool:
        """Attention's partial scores reduced within the column segment of their KV head, for its `window` heads
        only, rather than every head's down the whole column."""
        return (
            SEGMENTED and self.segmented and self.head_rows >= 2
        )  # (a KV copy a row: one-row segments, slow for the lines)

    @property
    def window(self) -> int:
        """The query heads an element holds (those reading its KV copies): its softmax's heads."""
        touched = 1 if self.head_rows else -(-self.kv_chunk // self.head_dim) + 1  # the KV copies a row touches
        return min(self.heads, self.group * touched)

    @property
    def slots(self) -> int:
        """The most cache slots a layer has on an element (its arrays' room for one layer's positions)."""
        return ceil_div(max(self.rings) if self.rings else self.ctx, self.width)  # position p on column p mod width

    def ring(self, layer: int) -> int:
        """The positions layer `layer` caches: a windowed layer its window's (a ring: position p at p mod window),
        any other ctx."""
        return self.rings[layer] if self.rings else self.ctx

    def layer_slots(self, layer: int) -> int:
        """The cache slots of layer `layer` on an element (ring index t on column t mod width, slot t div width)."""
        return ceil_div(self.ring(layer), self.width)

    @property
    def cache_slots(self) -> int:
        """The cache slots of every layer on an element, one layer after another."""
        return sum(self.layer_slots(layer) for layer in range(self.layers))

    @property
    def features(self) -> int:
        return self.heads * self.head_dim

    @property
    def group(self) -> int:
        """The query heads that read one cached KV head's copy."""
        return self.heads // (self.kv_heads * self.kv_copies)

    @property
    def kv_chunk(self) -> int:
        """A row's share of the cached key and value features (even: whole rotary pairs)."""
        return self.chunk(self.kv_heads * self.kv_copies * self.head_dim, "row", even=True)

    @property
    def query_chunk(self) -> int:
        """A row's query features: the `group` query heads of its KV features, at the same dimensions."""
        return self.group * self.kv_chunk


SEGMENTED = True  # WaferLLM's two-phase reductions (off: one chain a line, about 1.5 P steps; docs/benchmarks.md)


def segments(p: int, length: int = 0, segmented: bool = True) -> tuple[int, int, int]:
    """(segment length, segments, the middle segment) of a line of P elements: segments of `length`, or about
    sqrt(P / 4) of them, so a reduction costs about P + P / segments + segments steps rather than 1.5 P (one segment
    unless `segmented`)."""
    if not length:
        wanted = max(1, int(math.sqrt(p / 4))) if SEGMENTED and segmented else 1
        length = ceil_div(p, wanted)
    length = min(length, p)
    count = ceil_div(p, length)
    return length, count, count // 2


def segment_centre(q: int, length: int, p: int) -> int:
    first = q * length
    last = min(first + length, p) - 1
    return (first + last) // 2


def expanded_rows(
    heads: int, kv_heads: int, head_dim: int, widen: bool, pairs: bool, rotary: int | None = None
) -> list[int]:
    """Source row of each of the heads*head_dim rows of a query-ordered projection: KV rows repeated for their
    group's query heads (`widen`) and rotary pairs made adjacent (`pairs`: row 2i of a head takes i, 2i+1 takes
    i + head_dim/2; with a partial `rotary` dimension, the pairs of its first `rotary` numbers, i and i + rotary/2,
    the rest in order)."""
    group = heads // kv_heads
    turned = head_dim if rotary is None else rotary
    half = turned // 2
    rows = []
    for f in range(heads * head_dim):
        h, d = divmod(f, head_dim)
        if pairs and d < turned:
            i, odd = divmod(d, 2)
            d = i + half * odd
        source_head = h // group if widen else h
        rows.append(source_head * head_dim + d)
    return rows


def kv_rows(plan: GridPlan) -> list[int]:
    """Source row of each row of the key or value projection as cached: each KV head `kv_copies` times (1: narrow,
    GQA's saving kept), its rotary pairs made adjacent; row y of the grid holds rows [y * kv_chunk, (y + 1) *
    kv_chunk)."""
    copies = plan.kv_heads * plan.kv_copies
    return expanded_rows(copies, plan.kv_heads, plan.head_dim, plan.kv_copies > 1, True, plan.rotary_dim)


def query_rows(plan: GridPlan) -> list[int]:
    """Source row of each row of the query projection laid out to meet the narrow cache: row y of the grid holds, for
    each of the `group` query heads m of its KV features' head j, head j * group + m at the same dimensions
    (m-major: row block y is [m * kv_chunk + t for m, t]), so every query head of a group reads the same cached K/V
    tile on the element (with `kv_copies` > 1, j is the copy and `group` the heads reading it); -1 pads. Also the
    column order of the output projection (attention's result is in it)."""
    kv, c, group = kv_rows(plan), plan.kv_chunk, plan.group
    out = []
    for y in range(plan.height):
        for m in range(group):
            for t in range(c):
                f = y * c + t
                if f >= len(kv):
                    out.append(-1)
                    continue
                d = kv[f] % plan.head_dim  # kv[f]: the source row (its KV head, dimension d)
                copy = f // plan.head_dim  # the cached copy of a KV head that row f belongs to
                out.append((copy * group + m) * plan.head_dim + d)
    return out


def tile_for(array: np.ndarray, weight: Weight, p: int, x: int, y: int) -> np.ndarray:
    """Element (x, y)'s tile of one tensor of `weight`, flat, in the order the element program reads it: a matrix's
    tile column-major (column j of the tile is contiguous), a vector's chunk, a table's tile column-major too (the
    embedding row v of the tile is read with stride tile_rows)."""
    if weight.kind == "vector":
        c = weight.tile_columns
        out = np.zeros(c, dtype=np.float32)
        part = array.reshape(-1)[x * c : (x + 1) * c]
        out[: part.size] = part
        return out
    rows = np.asarray(weight.row_map) if weight.row_map else np.arange(weight.rows)
    r_block, c_block = (y, x) if weight.orient == "col" else (x, y)
    tr, tc = weight.tile_rows, weight.tile_columns
    tile = np.zeros((tr, tc), dtype=np.float32)
    picked = rows[r_block * tr : (r_block + 1) * tr]
    matrix = _columns(array.reshape(-1, array.shape[-1]), weight)
    columns = matrix[:, c_block * tc : (c_block + 1) * tc]
    for i, source in enumerate(picked):
        if 0 <= source < matrix.shape[0]:
            tile[i, : columns.shape[1]] = columns[source]
    return np.ascontiguousarray(tile.T).reshape(-1)


def tiles(array: np.ndarray, weight: Weight, grid: int | tuple[int, int] | list[int]) -> np.ndarray:
    """Every element's tile of one tensor of `weight` at once on a grid of `grid` = (width, height) elements (P x P
    for a whole number): [height (y), width (x), words], each as `tile_for` gives it. A `col`-input matrix's rows
    are cut over the height and its columns over the width; a `row`-input one's the other way."""
    width, height = (grid, grid) if isinstance(grid, int) else grid
    if weight.kind == "vector":
        c = weight.tile_columns
        padded = np.zeros(width * c, dtype=np.float32)
        padded[: array.size] = array.reshape(-1)
        chunks = padded.reshape(width, c)
        return np.broadcast_to(chunks[None, :, :], (height, width, c)).copy()
    matrix = _columns(np.asarray(array, dtype=np.float32).reshape(-1, array.shape[-1]), weight)
    tr, tc = weight.tile_rows, weight.tile_columns
    row_blocks, column_blocks = (height, width) if weight.orient == "col" else (width, height)
    rows = np.asarray(weight.row_map) if weight.row_map else np.arange(weight.rows)
    padded = np.zeros((row_blocks * tr, column_blocks * tc), dtype=np.float32)
    take = rows[: row_blocks * tr]
    good = (take >= 0) & (take < matrix.shape[0])
    padded[np.flatnonzero(good), : min(matrix.shape[1], column_blocks * tc)] = matrix[take[good], : column_blocks * tc]
    blocks = padded.reshape(row_blocks, tr, column_blocks, tc).transpose(0, 2, 3, 1)  # [row block, column block]
    blocks = blocks.reshape(row_blocks, column_blocks, tc * tr)
    return blocks if weight.orient == "col" else blocks.transpose(1, 0, 2).copy()


def _columns(matrix: np.ndarray, weight: Weight) -> np.ndarray:
    """The matrix's columns in the weight's column order (zeros where the map gives -1)."""
    if not weight.column_map:
        return matrix
    order = np.asarray(weight.column_map)
    out = np.zeros((matrix.shape[0], order.size), dtype=np.float32)
    good = order >= 0
    out[:, good] = matrix[:, order[good]]
    return out


def column_sources(weight: Weight, column_blocks: int) -> np.ndarray:
    """The source column of each column of each element's tile, [column block, tile column] (-1: padding): the
    weight's column map if it has one (attention's order for the output projection), else in order."""
    tc = weight.tile_columns
    padded = np.full(column_blocks * tc, -1, dtype=np.int64)
    source = np.asarray(weight.column_map, dtype=np.int64) if weight.column_map else np.arange(weight.columns)
    source = source[: padded.size]
    padded[: source.size] = np.where((source >= 0) & (source < weight.columns), source, -1)
    return padded.reshape(column_blocks, tc)


def block_slots(weight: Weight, column_blocks: int) -> tuple[np.ndarray, list[list[int]]]:
    """Read as stored, each element keeps the scales of the blocks of 32 its slice of a row touches, one slot a
    block: for each column block, the blocks (in order) and each tile column's slot among them (0 for padding,
    whose codes are 0). A slice of whole blocks keeps each block's scale once; a slice that cuts a block keeps the
    block's scale on each element holding a part of it (the scale, 2 bytes a row, repeated, the codes not)."""
    sources = column_sources(weight, column_blocks)
    slots = np.zeros(sources.shape, dtype=np.int64)
    blocks: list[list[int]] = []
    for c in range(column_blocks):
        real = sources[c] >= 0
        touched = sorted({int(b) for b in sources[c][real] // BLOCK})
        blocks.append(touched)
        index = {b: i for i, b in enumerate(touched)}
        slots[c, real] = [index[int(b)] for b in sources[c][real] // BLOCK]
    return slots, blocks


def stored_codes(raw: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """A matrix's stored bytes (rows of blocks, `WeightStore.blocks`) as its signed codes [rows, columns] (Q8_0's
    int8; Q4_0's nibble less 8) and its f16 scales [rows, columns / 32], as the file holds them (quant.py's layout:
    a block's f16 scale, then Q8_0's 32 int8 codes or Q4_0's 16 bytes, low nibbles the block's first 16 numbers)."""
    rows = raw.shape[0]
    size = 34 if fmt == "q8_0" else 18
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, -1, size)
    scales = np.ascontiguousarray(b[:, :, :2]).view("<f2").reshape(rows, -1)
    if fmt == "q8_0":
        codes = b[:, :, 2:].view(np.int8).astype(np.int64)
    else:
        qs = b[:, :, 2:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int64) - 8
    return codes.reshape(rows, -1), scales


def stored_tiles(
    raw: np.ndarray, weight: Weight, grid: int | tuple[int, int] | list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every element's tile of one tensor read as stored, [height, width, words] each: its codes (u16 words, a tile
    column's rows packed `STORED[format]` codes a word, low bits the first row; padding codes 0), the scales of its
    slots (f16, a slot's rows one after another; padding 0) and each tile column's slot (`block_slots`)."""
    width, height = (grid, grid) if isinstance(grid, int) else grid
    codes, scales = stored_codes(raw, weight.format)
    tr, tc, per = weight.tile_rows, weight.tile_columns, STORED[weight.format]
    row_blocks, column_blocks = (height, width) if weight.orient == "col" else (width, height)
    rows = np.asarray(weight.row_map) if weight.row_map else np.arange(weight.rows)
    take = np.full(row_blocks * tr, -1, dtype=np.int64)
    take[: min(rows.size, take.size)] = rows[: take.size]
    take[(take < 0) | (take >= codes.shape[0])] = -1
    sources = column_sources(weight, column_blocks)
    slots, blocks = block_slots(weight, column_blocks)
    words = weight.column_words
    out_codes = np.zeros((row_blocks, column_blocks, tc * words), dtype=np.int64)
    out_scales = np.zeros((row_blocks, column_blocks, weight.scale_slots * tr), dtype=np.float16)
    real_rows = take >= 0
    for r in range(row_blocks):
        mine = take[r * tr : (r + 1) * tr]
        good = real_rows[r * tr : (r + 1) * tr]
        for c in range(column_blocks):
            tile = np.zeros((tc, words * per), dtype=np.int64)  # [column, row]: a column's rows, padded
            real = sources[c] >= 0
            if good.any() and real.any():
                tile[np.ix_(np.flatnonzero(real), np.flatnonzero(good))] = codes[np.ix_(mine[good], sources[c][real])].T
            bits = (tile & 0xFF) if per == 2 else (tile + 8) & 0x0F  # Q4_0's nibble: the code plus 8
            shifts = np.arange(per, dtype=np.int64) * (16 // per)
            packed = (bits.reshape(tc, words, per) << shifts).sum(axis=2)
            out_codes[r, c] = packed.reshape(-1)
            for s, block in enumerate(blocks[c]):
                column = np.zeros(tr, dtype=np.float16)
                column[good] = scales[mine[good], block]
                out_scales[r, c, s * tr : (s + 1) * tr] = column
    out_slots = np.broadcast_to(slots[None], (row_blocks, column_blocks, tc))
    if weight.orient != "col":
        out_codes, out_scales = out_codes.transpose(1, 0, 2), out_scales.transpose(1, 0, 2)
        out_slots = out_slots.transpose(1, 0, 2)
    return out_codes.copy(), out_scales.copy(), out_slots.copy()


def inv_freq_rows(inv_freq: np.ndarray, plan: GridPlan, chunk: int) -> np.ndarray:
    """The rotary frequency of each adjacent pair of each row's chunk of a key (`chunk` = kv_chunk) or query
    (`query_chunk`: the group's heads one after another, each at the row's KV dimensions) vector, [height, chunk // 2];
    0 for padding. `inv_freq` is the whole head's; a partial rotary's pairs take the plan's own (`rotary_freqs`, over
    its rotary_dim), and the numbers it passes through 0 (a rotation by nothing)."""
    kv, c = kv_rows(plan), plan.kv_chunk  # the cached rows, once for every row of the grid
    freqs = np.asarray(plan.rotary_freqs) if plan.rotary_dim is not None else inv_freq
    out = np.zeros((plan.height, chunk // 2), dtype=np.float32)
    for y in range(plan.height):
        for pair in range(chunk // 2):
            feature = y * c + (2 * pair) % c
            if feature < len(kv):
                d = kv[feature] % plan.head_dim
                out[y, pair] = freqs[d] if d < len(freqs) else 0.0
    return out


def least_share(spec: object, grid: int | tuple[int, int], copies: int = 1) -> float:
    """The share of a grid's elements (`grid` = (width, height), or P x P) whose tile of each of a layer's
    projections holds real weights (not padding), the least over the projections: a `row` vector (q, k, v, gate,
    up) is cut in chunks of ceil(n / height) (rotary ones even), a `col` one (the hidden state) in ceil(n / width),
    so ceil(n / chunk) of the blocks hold data."""
    width, height = (grid, grid) if isinstance(grid, int) else grid

    def used(n: int, blocks: int, even: bool = False) -> float:
        c = ceil_div(n, blocks)
        c += c % 2 if even else 0
        return min(ceil_div(n, c), blocks) / blocks

    hidden, inter = spec.hidden, spec.intermediate  # type: ignore[attr-defined]
    kv = spec.kv_heads * copies * spec.head_dim  # type: ignore[attr-defined]
    shares = [
        used(kv, height, True) * used(hidden, width),  # q, k, v: rows follow the narrow KV features (whole pairs)
        used(hidden, width) * used(kv, height, True),  # o (its input is attention's result, laid out as the query)
        used(inter, height) * used(hidden, width),  # gate, up
        used(hidden, width) * used(inter, height),  # down
    ]
    return min(shares)


def best_grid(spec: object, smallest: int, largest: int = 757, copies: int = 1) -> int:
    """From the smallest square grid that holds the model up to the largest square of the machine: the P with the
    highest least share of working elements (`least_share`), the smallest such."""
    best, best_share = smallest, least_share(spec, smallest, copies)
    for p in range(smallest + 1, largest + 1):
        share = least_share(spec, p, copies)
        if share > best_share + 1e-9:
            best, best_share = p, share
    return best


def best_rectangle(spec: object, narrowest: int, usable: tuple[int, int], copies: int = 1) -> tuple[int, int]:
    """A rectangle of the machine's usable one for a model no square holds: the machine's full height, and from the
    narrowest width that holds the model up to the usable width, the width with the highest least share of working
    elements (`least_share`), the narrowest such."""
    width, height = usable
    best, best_share = narrowest, least_share(spec, (narrowest, height), copies)
    for w in range(narrowest + 1, width + 1):
        share = least_share(spec, (w, height), copies)
        if share > best_share + 1e-9:
            best, best_share = w, share
    return best, height
