"""The `spatial` dialect: a model part placed on a grid of processing elements, as on a wafer-scale chip.

A grid (`spatial.grid`) is width x height elements, each with its own memory (bytes) and a router to its four
neighbours carrying a number of route colours. A part of a model (the embedding, a layer, the head) occupies a
rectangle of it, a `spatial.region`, whose body is the part's program: weight tiles placed on elements
(`spatial.place`), KV caches kept in elements (`spatial.cache`), activations received from and sent to other regions
(`spatial.receive`, `spatial.send`), moved inside the region along routes (`spatial.route`), and per-element compute on
local tiles (`spatial.matvec`, `spatial.norm`, `spatial.rope`, `spatial.cache_write`, `spatial.attend`,
`spatial.map`, `spatial.embed`, `spatial.argmax`). Coordinates inside a region count from its top-left element.

A vector value lives on a line of elements, its *layout* `out = [x, y, dx, dy, n, tile]`: n elements from (x, y),
stepping (dx, dy), element k holding values k*tile .. (k+1)*tile-1 (the last one padded). A rectangle is
`at = [x, y, width, height]`. Every op states where it computes and what it holds, so the region's verifier can check
memory per element, the colours in use and that no route leaves the region.

```mlir
spatial.grid @wse2 width 757 height 996 memory 49152 colours 24
spatial.region @layer_0 on @wse2 origin [0, 0] size [8, 12] cut "decode_layer layer=0 ctx=64" identity "..."
    weights "f16" {
  %x = spatial.receive "hidden" from "embedding" colours [0] out [0, 0, 1, 0, 4, 16] : tensor<1x64xf32>
  %w = spatial.place "model.layers.0.self_attn.q_proj.weight" shape [64, 64] at [0, 1, 4, 4] tile [16, 16]
    : tensor<64x64xf16>
  %q = spatial.matvec %x, %w colours [1, 2] out [3, 1, 0, 1, 4, 16]
    : (tensor<1x64xf32>, tensor<64x64xf16>) -> tensor<1x64xf32>
  ...
}
```
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    DictionaryAttr,
    FlatSymbolRefAttr,
    FloatAttr,
    IntegerAttr,
    MemRefType,
    StringAttr,
    SymbolNameConstraint,
    TensorType,
    i64,
)
from xdsl.ir import Attribute, Dialect, Operation, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import IsolatedFromAbove, NoTerminator, SymbolOpInterface, SymbolTable
from xdsl.utils.exceptions import VerifyException

from logos_ir.dialects.logos import i64_array, int_values

WEIGHT_BYTES = {"f16": 2, "f32": 4}
ACTIVATION_BYTES = 4  # activations, partial sums and softmax state are f32 on every element
CODE_BYTES = 6144  # each element's program and runtime (routing tables, task table, stack), reserved first
INPUT_KINDS = ("token", "position", "hidden")
MAP_KINDS = ("add", "mul", "silu")


def _fail(op: Operation, message: str) -> VerifyException:
    return VerifyException(f"'{op.name}' op {message}")


def shape_of(value: SSAValue) -> tuple[int, ...]:
    kind = value.type
    assert isinstance(kind, TensorType | MemRefType)
    return tuple(kind.get_shape())


# -- layouts and rectangles -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """A vector on a line of elements: n elements from (x, y) stepping (dx, dy), each holding `tile` values."""

    x: int
    y: int
    dx: int
    dy: int
    n: int
    tile: int

    @classmethod
    def of(cls, attr: DenseArrayBase) -> Layout:
        return cls(*int_values(attr))

    def attr(self) -> DenseArrayBase:
        return i64_array([self.x, self.y, self.dx, self.dy, self.n, self.tile])

    def elements(self) -> np.ndarray:
        """[n, 2]: the (x, y) of each element, in order."""
        k = np.arange(self.n)
        return np.stack([self.x + k * self.dx, self.y + k * self.dy], axis=1)

    def rect(self) -> Rect:
        """The rectangle the line covers."""
        x1, y1 = self.x + (self.n - 1) * self.dx, self.y + (self.n - 1) * self.dy
        return Rect(min(self.x, x1), min(self.y, y1), abs(x1 - self.x) + 1, abs(y1 - self.y) + 1)


@dataclass(frozen=True)
class Rect:
    """A rectangle of elements: its top-left (x, y), its width and height."""

    x: int
    y: int
    w: int
    h: int

    @classmethod
    def of(cls, attr: DenseArrayBase) -> Rect:
        return cls(*int_values(attr))

    def attr(self) -> DenseArrayBase:
        return i64_array([self.x, self.y, self.w, self.h])

    def inside(self, width: int, height: int) -> bool:
        return (
            self.w >= 1
            and self.h >= 1
            and self.x >= 0
            and self.y >= 0
            and self.x + self.w <= width
            and (self.y + self.h <= height)
        )


# -- the grid and its regions -----------------------------------------------------------------------------------


@irdl_op_definition
class GridOp(IRDLOperation):
    """A grid of processing elements: width x height, `memory` bytes per element, `colours` route colours.

    `spatial.grid @wse2 width 757 height 996 memory 49152 colours 24`
    """

    name = "spatial.grid"

    sym_name = prop_def(SymbolNameConstraint())
    width = prop_def(IntegerAttr[I64])
    height = prop_def(IntegerAttr[I64])
    memory = prop_def(IntegerAttr[I64])
    colours = prop_def(IntegerAttr[I64])

    traits = traits_def(SymbolOpInterface())

    assembly_format = "$sym_name `width` $width `height` $height `memory` $memory `colours` $colours attr-dict"

    def __init__(self, name: str, width: int, height: int, memory: int, colours: int):
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "width": IntegerAttr(width, i64),
                "height": IntegerAttr(height, i64),
                "memory": IntegerAttr(memory, i64),
                "colours": IntegerAttr(colours, i64),
            }
        )

    def verify_(self) -> None:
        for what in ("width", "height", "memory", "colours"):
            if cast(IntegerAttr, getattr(self, what)).value.data < 1:
                raise _fail(self, f"needs a positive {what}")


@irdl_op_definition
class RegionOp(IRDLOperation):
    """The rectangle of `grid` a part occupies (`origin`, `size`), the cut and identity line of the LOGOS program it
    was lowered from, the weight image (`f16` or `f32`) and the part's program as its body.

    `spatial.region @head on @wse2 origin [0, 40] size [4, 20] cut "decode_head" identity "..." weights "f16" {...}`
    """

    name = "spatial.region"

    sym_name = prop_def(SymbolNameConstraint())
    grid = prop_def(FlatSymbolRefAttr)
    origin = prop_def(DenseArrayBase[I64])
    size = prop_def(DenseArrayBase[I64])
    cut = prop_def(StringAttr)
    identity = prop_def(StringAttr)
    weights = prop_def(StringAttr)
    body = region_def("single_block")

    traits = traits_def(NoTerminator(), IsolatedFromAbove(), SymbolOpInterface())

    assembly_format = (
        "$sym_name `on` $grid `origin` $origin `size` $size `cut` $cut `identity` $identity `weights` $weights "
        "$body attr-dict"
    )

    def __init__(
        self,
        name: str,
        grid: str,
        origin: Sequence[int],
        size: Sequence[int],
        cut: str,
        identity: str,
        weights: str,
        body: Region,
    ):
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "grid": FlatSymbolRefAttr(grid),
                "origin": i64_array(origin),
                "size": i64_array(size),
                "cut": StringAttr(cut),
                "identity": StringAttr(identity),
                "weights": StringAttr(weights),
            },
            regions=[body],
        )

    @property
    def width(self) -> int:
        return int_values(self.size)[0]

    @property
    def height(self) -> int:
        return int_values(self.size)[1]

    @property
    def weight_bytes(self) -> int:
        return WEIGHT_BYTES[self.weights.data]

    def grid_op(self) -> GridOp:
        found = SymbolTable.lookup_symbol(self, self.grid)
        if not isinstance(found, GridOp):
            raise _fail(self, f"@{self.sym_name.data} is on {self.grid}, which is not a spatial.grid")
        return found

    def memory_map(self) -> np.ndarray:
        """[height, width]: the bytes each element of the region holds (its code, tiles, caches and buffers)."""
        memory = np.full((self.height, self.width), CODE_BYTES, dtype=np.int64)
        for op in self.body.block.ops:
            if isinstance(op, SpatialOp):
                for rect, nbytes in op.holds(self.weight_bytes):
                    memory[rect.y : rect.y + rect.h, rect.x : rect.x + rect.w] += nbytes
        return memory

    def colours_used(self) -> set[int]:
        return {c for op in self.body.block.ops if isinstance(op, SpatialOp) for c in op.colours_of()}

    def verify_(self) -> None:
        if self.weights.data not in WEIGHT_BYTES:
            raise _fail(self, f"@{self.sym_name.data}: weights '{self.weights.data}' are not f16 or f32")
        grid = self.grid_op()
        origin = int_values(self.origin)
        whole = Rect(origin[0], origin[1], self.width, self.height)
        if not whole.inside(grid.width.value.data, grid.height.value.data):
            raise _fail(
                self,
                f"@{self.sym_name.data} of {self.width} x {self.height} elements at ({origin[0]}, {origin[1]}) does "
                f"not fit the grid @{grid.sym_name.data} of {grid.width.value.data} x {grid.height.value.data}",
            )
        self._verify_routes()
        self._verify_colours(grid.colours.value.data)
        self._verify_memory(grid.memory.value.data)

    def _verify_routes(self) -> None:
        for op in self.body.block.ops:
            if not isinstance(op, SpatialOp):
                continue
            for rect in op.touches():
                if not rect.inside(self.width, self.height):
                    raise _fail(
                        op,
                        f"in @{self.sym_name.data} reaches elements {rect} outside its region of "
                        f"{self.width} x {self.height}",
                    )

    def _verify_colours(self, colours: int) -> None:
        previous: set[int] = set()
        for op in self.body.block.ops:
            if not isinstance(op, SpatialOp):
                continue
            mine = set(op.colours_of())
            if any(c < 0 or c >= colours for c in mine):
                raise _fail(op, f"uses colours {sorted(mine)}, but the grid has colours 0 to {colours - 1}")
            if mine & previous:
                raise _fail(op, f"reuses colour {min(mine & previous)} of the stage before it, still in flight")
            if mine:
                previous = mine

    def _verify_memory(self, memory: int) -> None:
        used = self.memory_map()
        worst = int(used.max())
        if worst > memory:
            y, x = np.unravel_index(int(used.argmax()), used.shape)
            raise _fail(
                self,
                f"@{self.sym_name.data}: element ({x}, {y}) holds {worst} bytes, more than the {memory} bytes of "
                "memory per element",
            )


# -- the part's program -----------------------------------------------------------------------------------------


class SpatialOp(IRDLOperation):
    """Base of the ops in a region's program: what each element holds (`holds`), the elements it reaches
    (`touches`, for the route check) and the colours it routes on (`colours_of`)."""

    def holds(self, weight_bytes: int) -> list[tuple[Rect, int]]:
        """(rectangle, bytes each of its elements holds) for what this op keeps in memory."""
        return []

    def touches(self) -> list[Rect]:
        return []

    def colours_of(self) -> tuple[int, ...]:
        colours = getattr(self, "colours", None)
        return int_values(colours) if isinstance(colours, DenseArrayBase) else ()


def layout_of(value: SSAValue) -> Layout:
    """Where a vector value lives: the layout its defining op states."""
    owner = value.owner
    if not isinstance(owner, VectorOp):
        raise VerifyException(f"value {value.name_hint or ''} is not a spatial vector (it has no layout)")
    return Layout.of(owner.out)


class VectorOp(SpatialOp):
    """Base of the ops whose result is a vector on a line of elements (`out`, its layout)."""

    out = prop_def(DenseArrayBase[I64])

    @property
    def layout(self) -> Layout:
        return Layout.of(self.out)

    def holds(self, weight_bytes: int) -> list[tuple[Rect, int]]:
        return [(self.layout.rect(), self.layout.tile * ACTIVATION_BYTES)]

    def touches(self) -> list[Rect]:
        return [self.layout.rect()]

    def verify_(self) -> None:
        layout = self.layout
        if layout.n < 1 or layout.tile < 1 or (layout.dx, layout.dy) not in ((1, 0), (0, 1)):
            raise _fail(self, f"has an invalid layout {list(int_values(self.out))}")
        self.check_()

    def check_(self) -> None:
        """The op's own checks."""

    def expect_cover(self, value: SSAValue, width: int) -> None:
        """The layout `value` is on holds `width` values."""
        layout = layout_of(value)
        if layout.n * layout.tile < width or (layout.n - 1) * layout.tile >= width:
            raise _fail(self, f"expects {width} values on its operand's layout, which holds {layout.n} x {layout.tile}")

    def expect_layout(self, value: SSAValue, layout: Layout, what: str) -> None:
        got = layout_of(value)
        if got != layout:
            raise _fail(self, f"expects {what} on {layout}, but it is on {got}")


@irdl_op_definition
class PlaceOp(SpatialOp):
    """A weight (its Hugging Face name and full shape [rows, columns]; a vector is [1, n]) cut into tiles of
    `tile` = [rows, columns], tile (i, j) on the element (x + j, y + i) of the rectangle `at`.

    `%w = spatial.place "model.norm.weight" shape [1, 64] at [0, 0, 4, 1] tile [1, 16] : tensor<1x64xf32>`
    """

    name = "spatial.place"

    tensor = prop_def(StringAttr)
    shape = prop_def(DenseArrayBase[I64])
    at = prop_def(DenseArrayBase[I64])
    tile = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = "$tensor `shape` $shape `at` $at `tile` $tile attr-dict `:` type($result)"

    def __init__(self, tensor: str, shape: Sequence[int], at: Rect, tile: Sequence[int], result_type: Attribute):
        super().__init__(
            properties={
                "tensor": StringAttr(tensor),
                "shape": i64_array(shape),
                "at": at.attr(),
                "tile": i64_array(tile),
            },
            result_types=[result_type],
        )

    @property
    def rect(self) -> Rect:
        return Rect.of(self.at)

    def holds(self, weight_bytes: int) -> list[tuple[Rect, int]]:
        rows, columns = int_values(self.tile)
        return [(self.rect, rows * columns * weight_bytes)]

    def touches(self) -> list[Rect]:
        return [self.rect]

    def verify_(self) -> None:
        rows, columns = int_values(self.shape)
        tile_rows, tile_columns = int_values(self.tile)
        rect = self.rect
        if rows == 1 and rect.w == 1 and rect.h == -(-columns // tile_columns):  # a vector along a column
            return
        if -(-rows // tile_rows) != rect.h or -(-columns // tile_columns) != rect.w:
            raise _fail(
                self,
                f"of '{self.tensor.data}': {rows} x {columns} in tiles of {tile_rows} x {tile_columns} needs "
                f"{-(-columns // tile_columns)} x {-(-rows // tile_rows)} elements, not {rect.w} x {rect.h}",
            )


@irdl_op_definition
class CacheOp(SpatialOp):
    """A layer's key or value cache [kv heads, positions, head size] kept in the elements of the rectangle `at`:
    KV head h on row y + h, positions b*block+1 .. (b+1)*block on the element x + b of that row.

    `%keys = spatial.cache key layer 0 shape [2, 64, 16] at [0, 0, 4, 2] block 16 : memref<2x64x16xf32>`
    """

    name = "spatial.cache"

    kind = prop_def(StringAttr)
    layer = prop_def(IntegerAttr[I64])
    shape = prop_def(DenseArrayBase[I64])
    at = prop_def(DenseArrayBase[I64])
    block = prop_def(IntegerAttr[I64])
    result = result_def(MemRefType)

    assembly_format = "$kind `layer` $layer `shape` $shape `at` $at `block` $block attr-dict `:` type($result)"

    def __init__(self, kind: str, layer: int, shape: Sequence[int], at: Rect, block: int, result_type: Attribute):
        super().__init__(
            properties={
                "kind": StringAttr(kind),
                "layer": IntegerAttr(layer, i64),
                "shape": i64_array(shape),
                "at": at.attr(),
                "block": IntegerAttr(block, i64),
            },
            result_types=[result_type],
        )

    @property
    def rect(self) -> Rect:
        return Rect.of(self.at)

    def holds(self, weight_bytes: int) -> list[tuple[Rect, int]]:
        head_dim = int_values(self.shape)[2]
        return [(self.rect, self.block.value.data * head_dim * weight_bytes)]

    def touches(self) -> list[Rect]:
        return [self.rect]

    def verify_(self) -> None:
        kv_heads, positions, _ = int_values(self.shape)
        block = self.block.value.data
        rect = self.rect
        if rect.h != kv_heads or rect.w != -(-positions // block):
            raise _fail(
                self,
                f"{kv_heads} heads of {positions} positions in blocks of {block} need "
                f"{-(-positions // block)} x {kv_heads} elements, not {rect.w} x {rect.h}",
            )


@irdl_op_definition
class ReceiveOp(VectorOp):
    """An input arriving from outside the region (`from`: the host or another region) on `colour`, landing on `out`.

    `%x = spatial.receive "hidden" from "embedding" colour 0 out [0, 0, 1, 0, 4, 16] : tensor<1x64xf32>`
    """

    name = "spatial.receive"

    kind = prop_def(StringAttr)
    source = prop_def(StringAttr)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = "$kind `from` $source `colours` $colours `out` $out attr-dict `:` type($result)"

    def __init__(self, kind: str, source: str, colour: int, out: Layout, result_type: Attribute):
        super().__init__(
            properties={
                "kind": StringAttr(kind),
                "source": StringAttr(source),
                "colours": i64_array([colour]),
                "out": out.attr(),
            },
            result_types=[result_type],
        )

    def check_(self) -> None:
        if self.kind.data not in INPUT_KINDS:
            raise _fail(self, f"receives unknown kind '{self.kind.data}'")
        self.expect_cover(self.result, shape_of(self.result)[-1])


@irdl_op_definition
class SendOp(SpatialOp):
    """The part's result, sent on `colour` to another region or the host from the elements it is on.

    `spatial.send %result to "layer_1" colours [0] : tensor<1x64xf32>`
    """

    name = "spatial.send"

    input = operand_def(TensorType)
    target = prop_def(StringAttr)
    colours = prop_def(DenseArrayBase[I64])

    assembly_format = "$input `to` $target `colours` $colours attr-dict `:` type($input)"

    def __init__(self, value: SSAValue, target: str, colour: int):
        super().__init__(operands=[value], properties={"target": StringAttr(target), "colours": i64_array([colour])})


@irdl_op_definition
class RouteOp(VectorOp):
    """Move a vector along the fabric to another line of elements (`out`), re-tiled to its tile size: each element
    of `out` receives its values from the elements that held them, on `colours`.

    `%y = spatial.route %x colours [3] out [0, 4, 1, 0, 4, 16] : tensor<1x64xf32>`
    """

    name = "spatial.route"

    input = operand_def(TensorType)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = "$input `colours` $colours `out` $out attr-dict `:` functional-type($input, $result)"

    def __init__(self, value: SSAValue, colour: int, out: Layout):
        super().__init__(
            operands=[value], properties={"colours": i64_array([colour]), "out": out.attr()}, result_types=[value.type]
        )

    def touches(self) -> list[Rect]:
        return [self.layout.rect(), layout_of(self.input).rect()]

    def check_(self) -> None:
        self.expect_cover(self.result, shape_of(self.input)[-1])


@irdl_op_definition
class MatvecOp(VectorOp):
    """y = W x on the rectangle of `weight`'s tiles: x's tile j (on the top row, element x + j) goes down column j
    (colour 0 of `colours`), every element multiplies its tile by it, and the partial sums are reduced along each
    row to its last element (colour 1), where y's tile i lands (`out`, a column).

    `%q = spatial.matvec %x, %w colours [1, 2] out [3, 1, 0, 1, 4, 16] : (...) -> tensor<1x64xf32>`
    """

    name = "spatial.matvec"

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $weight `colours` $colours `out` $out attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, value: SSAValue, weight: SSAValue, colours: Sequence[int], out: Layout, result_type: Attribute):
        super().__init__(
            operands=[value, weight],
            properties={"colours": i64_array(colours), "out": out.attr()},
            result_types=[result_type],
        )

    @property
    def place(self) -> PlaceOp:
        owner = self.weight.owner
        assert isinstance(owner, PlaceOp)
        return owner

    @staticmethod
    def input_layout(place: PlaceOp) -> Layout:
        rect = place.rect
        return Layout(rect.x, rect.y, 1, 0, rect.w, int_values(place.tile)[1])

    @staticmethod
    def output_layout(place: PlaceOp) -> Layout:
        rect = place.rect
        return Layout(rect.x + rect.w - 1, rect.y, 0, 1, rect.h, int_values(place.tile)[0])

    def holds(self, weight_bytes: int) -> list[tuple[Rect, int]]:
        rows, columns = int_values(self.place.tile)
        return [*super().holds(weight_bytes), (self.place.rect, (rows + columns) * ACTIVATION_BYTES)]

    def check_(self) -> None:
        if not isinstance(self.weight.owner, PlaceOp):
            raise _fail(self, "multiplies by a weight that is not placed (not a spatial.place)")
        self.expect_layout(self.input, self.input_layout(self.place), "its input")
        if self.layout != self.output_layout(self.place):
            raise _fail(
                self, f"leaves its result on {self.layout}, not on the last column {self.output_layout(self.place)}"
            )


@irdl_op_definition
class NormOp(VectorOp):
    """RMS norm on the elements holding x: each squares and sums its tile, the sums are reduced along the line and the
    total broadcast back (colour), each scales its tile by its own tile of the norm weight (placed on the same line).

    `%n = spatial.norm %x, %w epsilon 1.0e-05 colours [1] out [0, 0, 1, 0, 4, 16] : (...) -> tensor<1x64xf32>`
    """

    name = "spatial.norm"

    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    epsilon = prop_def(FloatAttr)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $weight `epsilon` $epsilon `colours` $colours `out` $out attr-dict `:` "
        "functional-type(operands, results)"
    )

    def check_(self) -> None:
        self.expect_layout(self.input, self.layout, "its input")
        place = self.weight.owner
        if not isinstance(place, PlaceOp) or place.rect != self.layout.rect():
            raise _fail(self, "needs its weight placed on the elements of its input")


@irdl_op_definition
class RopeOp(VectorOp):
    """Rotary embedding at the received position, each element rotating the whole heads of `head_dim` it holds.

    `%t = spatial.rope %q, %pos head_dim 16 theta 1.0e+04 colours [4] out [...] : (...) -> tensor<1x64xf32>`
    """

    name = "spatial.rope"

    input = operand_def(TensorType)
    positions = operand_def(TensorType)
    head_dim = prop_def(IntegerAttr[I64])
    theta = prop_def(FloatAttr)
    scaling = opt_prop_def(DictionaryAttr)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$input `,` $positions `head_dim` $head_dim `theta` $theta (`scaling` $scaling^)? `colours` $colours "
        "`out` $out attr-dict `:` functional-type(operands, results)"
    )

    def check_(self) -> None:
        self.expect_layout(self.input, self.layout, "its input")
        if self.layout.tile % self.head_dim.value.data:
            raise _fail(
                self, f"needs whole heads of {self.head_dim.value.data} on each element, not {self.layout.tile} values"
            )


@irdl_op_definition
class CacheWriteOp(SpatialOp):
    """Each KV head's new key (or value), held on the first element of its cache row, sent along the row to the
    element whose block holds the position, and written there.

    `spatial.cache_write %k, %keys, %pos colours [5] : tensor<1x32xf32>, memref<2x64x16xf32>, tensor<1xi64>`
    """

    name = "spatial.cache_write"

    input = operand_def(TensorType)
    cache = operand_def(MemRefType)
    positions = operand_def(TensorType)
    colours = prop_def(DenseArrayBase[I64])

    assembly_format = (
        "$input `,` $cache `,` $positions `colours` $colours attr-dict `:` type($input) `,` type($cache) `,` "
        "type($positions)"
    )

    def verify_(self) -> None:
        cache = self.cache.owner
        if not isinstance(cache, CacheOp):
            raise _fail(self, "writes a cache that is not a spatial.cache")
        rect, head_dim = cache.rect, int_values(cache.shape)[2]
        if layout_of(self.input) != Layout(rect.x, rect.y, 0, 1, rect.h, head_dim):
            raise _fail(self, "expects each KV head on the first element of its cache row")


@irdl_op_definition
class AttendOp(VectorOp):
    """Attention of each KV head's group of query heads over the cache row of that head: the queries (on the row's
    first element) go along the row, each element scores its block of positions up to the current one, keeps its
    running maximum, sum and weighted values, and these are combined along the row to its last element (`out`).

    `%a = spatial.attend %q, %keys, %values, %pos colours [6, 7] out [...] : (...) -> tensor<1x64xf32>`
    """

    name = "spatial.attend"

    query = operand_def(TensorType)
    keys = operand_def(MemRefType)
    values = operand_def(MemRefType)
    positions = operand_def(TensorType)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$query `,` $keys `,` $values `,` $positions `colours` $colours `out` $out attr-dict `:` "
        "functional-type(operands, results)"
    )

    @property
    def cache(self) -> CacheOp:
        owner = self.keys.owner
        assert isinstance(owner, CacheOp)
        return owner

    def holds(self, weight_bytes: int) -> list[tuple[Rect, int]]:
        # each element keeps the group's queries, its scores and the running weighted values
        group_width, block = self.layout.tile, self.cache.block.value.data
        return [*super().holds(weight_bytes), (self.cache.rect, (2 * group_width + block + 2) * ACTIVATION_BYTES)]

    def check_(self) -> None:
        for cache in (self.keys.owner, self.values.owner):
            if not isinstance(cache, CacheOp):
                raise _fail(self, "attends over a cache that is not a spatial.cache")
        rect, tile = self.cache.rect, self.layout.tile
        self.expect_layout(self.query, Layout(rect.x, rect.y, 0, 1, rect.h, tile), "its queries")
        if self.layout != Layout(rect.x + rect.w - 1, rect.y, 0, 1, rect.h, tile):
            raise _fail(self, "leaves its result off the last column of its cache")


@irdl_op_definition
class MapOp(VectorOp):
    """An elementwise function (`add`, `mul`, `silu`) of vectors on the same elements, each computing its own tile.

    `%s = spatial.map "add" %x, %y out [...] : (tensor<1x64xf32>, tensor<1x64xf32>) -> tensor<1x64xf32>`
    """

    name = "spatial.map"

    fn = prop_def(StringAttr)
    inputs = var_operand_def(TensorType)
    result = result_def(TensorType)

    assembly_format = "$fn $inputs `out` $out attr-dict `:` functional-type(operands, results)"

    def __init__(self, fn: str, inputs: Sequence[SSAValue], out: Layout):
        super().__init__(
            operands=[inputs], properties={"fn": StringAttr(fn), "out": out.attr()}, result_types=[inputs[0].type]
        )

    def check_(self) -> None:
        arity = 1 if self.fn.data == "silu" else 2
        if self.fn.data not in MAP_KINDS or len(self.inputs) != arity:
            raise _fail(self, f"'{self.fn.data}' of {len(self.inputs)} operands is not one of {', '.join(MAP_KINDS)}")
        for value in self.inputs:
            self.expect_layout(value, self.layout, "its operands")


@irdl_op_definition
class EmbedOp(VectorOp):
    """The embedding row of the received token: the token id goes to every element of the table's rectangle, the row
    of elements holding that row sends its tiles down the columns to the bottom row (`out`).

    `%h = spatial.embed %table, %token colours [1, 2] out [...] : (...) -> tensor<1x64xf32>`
    """

    name = "spatial.embed"

    table = operand_def(TensorType)
    tokens = operand_def(TensorType)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = (
        "$table `,` $tokens `colours` $colours `out` $out attr-dict `:` functional-type(operands, results)"
    )

    def check_(self) -> None:
        place = self.table.owner
        if not isinstance(place, PlaceOp):
            raise _fail(self, "reads a table that is not placed")
        rect = place.rect
        if self.layout != Layout(rect.x, rect.y + rect.h - 1, 1, 0, rect.w, int_values(place.tile)[1]):
            raise _fail(self, "leaves the row off the bottom row of its table")


@irdl_op_definition
class ArgmaxOp(VectorOp):
    """The index (from 1) of the greatest value: each element finds its tile's, and (value, index) pairs are reduced
    along the line (the first on a tie) to one element (`out`).

    `%next = spatial.argmax %logits colours [3] out [...] : (tensor<1x256xf32>) -> tensor<1xi64>`
    """

    name = "spatial.argmax"

    input = operand_def(TensorType)
    colours = prop_def(DenseArrayBase[I64])
    result = result_def(TensorType)

    assembly_format = "$input `colours` $colours `out` $out attr-dict `:` functional-type(operands, results)"

    def check_(self) -> None:
        source = layout_of(self.input)
        last = source.elements()[-1]
        if self.layout != Layout(int(last[0]), int(last[1]), source.dx, source.dy, 1, 1):
            raise _fail(self, "leaves its result off the last element of its input")


SPATIAL = Dialect(
    "spatial",
    [
        GridOp,
        RegionOp,
        PlaceOp,
        CacheOp,
        ReceiveOp,
        SendOp,
        RouteOp,
        MatvecOp,
        NormOp,
        RopeOp,
        CacheWriteOp,
        AttendOp,
        MapOp,
        EmbedOp,
        ArgmaxOp,
    ],
    [],
)
