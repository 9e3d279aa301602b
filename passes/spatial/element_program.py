"""The element program a lowering builds: its arrays (name, words, element type), the reduction functions it has
made, the handles the host needs (the logits, the rotary tables), and the vectors on the grid that its arrays hold
(`Vec`: a layout, a length, a chunk).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import memref
from xdsl.dialects.builtin import MemRefType, f32
from xdsl.ir import Operation, SSAValue

from logos_ir.errors import PassError
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.emit import Emit

PASS = "convert-logos-to-csl"


@dataclass
class Vec:
    """A vector on the grid: its layout (`col`: element (x, y) holds chunk x; `row`: chunk y), its true length,
    its chunk and the array that holds the element's chunk."""

    layout: str
    length: int
    chunk: int
    array: str
    order: tuple[int, ...] = ()  # the source index of each padded position (a product taking it maps its columns)


@dataclass
class Program:
    """The element program being built: its top block, the arrays declared (name -> (words, element type)), the
    weights the host loads, the imported modules and the parameters."""

    plan: g.GridPlan
    top: Emit
    arrays: dict[str, tuple[int, Any]] = field(default_factory=dict)
    handles: dict[str, SSAValue] = field(default_factory=dict)
    px: SSAValue | None = None
    py: SSAValue | None = None
    math: SSAValue | None = None
    time: SSAValue | None = None
    memcpy: SSAValue | None = None
    functions: list[Operation] = field(default_factory=list)
    reducers: dict[str, Operation] = field(default_factory=dict)
    layer_tensors: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a layer weight's tensor in each layer

    def array(self, name: str, words: int, element: Any = f32) -> None:
        known = self.arrays.get(name)
        if known is not None:
            if known != (words, element):
                raise PassError(f"{PASS}: the array '{name}' is declared twice with different sizes")
            return
        self.arrays[name] = (words, element)

    def get(self, e: Emit, name: str) -> SSAValue:
        words, element = self.arrays[name]
        return e.op(memref.GetGlobalOp(name, MemRefType(element, [words]))).results[0]
