"""Weights read as stored: a decode step's GEMVs and embedding read a weight's GGUF blocks as the file holds them
and dequantize them in registers.

A weight buffer held as stored (`cuda.storage` on its `cuda.buffer`, the format's name) is a memref of the rows'
bytes in 16- or 32-bit units (`UNIT_BYTES`: the widest that every block of the format starts on, as llama.cpp's
`get_int_b2` / `get_int_b4` read them: Q8_0's 34-byte, Q4_0's 18-byte and Q5_0's 22-byte blocks are 2-byte aligned,
Q4_1's 20-byte and Q5_1's 24-byte blocks 4-byte aligned). Where a row's bytes are a multiple of 16 (so every row
starts 16-byte aligned), a lane reads a group of `GROUP` blocks at once in 16-byte loads (the fewest whole blocks
whose bytes are a multiple of 16: 80 bytes of Q4_1, 144 of Q4_0); the blocks past the last whole group of such a
row, and every block of a row whose bytes are not a multiple of 16, are read a block at a time in units.

The numbers come out of the loaded units by static shifts and masks (the block layouts of `logos_ir.quant`, as
llama.cpp's `ggml-common.h` lays them), each the value the reference's dequantizer gives (`quant.dequantize`): the
f16 scale d (and minimum m) widened exactly, then d * q (Q8_0: q the signed byte; Q4_0 and Q5_0: the code less 8
or 16) or d * q + m (Q4_1, Q5_1), each product and sum rounded once in f32 as numpy rounds them.
"""

from __future__ import annotations

from xdsl.dialects import arith
from xdsl.dialects.builtin import Float16Type, IntegerAttr, IntegerType, MemRefType, StringAttr, f32
from xdsl.ir import Operation, SSAValue

from logos_ir import quant
from logos_ir.dialects import cuda
from logos_ir.passes.cuda.thread_code import Body

UNIT_BYTES = {"q8_0": 2, "q4_0": 2, "q5_0": 2, "q4_1": 4, "q5_1": 4}
READ_AS_STORED = tuple(UNIT_BYTES)
VECTOR_BYTES = 16
MAX_GROUP_BYTES = 288  # a lane's groups of all its streams at once: more (Q8_0's 2 x 272) spills under 128 registers


def group(fmt: str) -> int:
    """The fewest whole blocks of `fmt` whose bytes are a multiple of 16 (a lane's 16-byte loads)."""
    size = quant.FORMATS[fmt].block_bytes
    count = 1
    while count * size % VECTOR_BYTES:
        count += 1
    return count


def unit_type(fmt: str) -> IntegerType:
    return IntegerType(8 * UNIT_BYTES[fmt])


def stored_type(fmt: str, shape: tuple[int, ...]) -> MemRefType:
    """The memref of a weight of `shape` (numbers) held as stored in `fmt`: its rows' bytes in units."""
    row_bytes = quant.FORMATS[fmt].stored_bytes((shape[-1],))
    return MemRefType(unit_type(fmt), [*shape[:-1], row_bytes // UNIT_BYTES[fmt]])


def mark(buffer: Operation, fmt: str) -> None:
    buffer.attributes[cuda.STORAGE] = StringAttr(fmt)


def storage_of(value: SSAValue) -> str | None:
    """The format a weight buffer holds its blocks in, or None for a float image."""
    owner = value.owner
    found = owner.attributes.get(cuda.STORAGE) if isinstance(owner, cuda.BufferOp) else None
    return found.data if isinstance(found, StringAttr) else None


def row_vectors(fmt: str, numbers: int) -> bool:
    """Whether a row of `numbers` in `fmt` is read in 16-byte loads: its bytes a multiple of 16."""
    return quant.FORMATS[fmt].stored_bytes((numbers,)) % VECTOR_BYTES == 0


# -- integer and f16 thread code (upstream arith) ----------------------------------------------------------------

I32 = IntegerType(32)


def _iconst(b: Body, value: int, kind: IntegerType = I32) -> SSAValue:
    return b.op(arith.ConstantOp(IntegerAttr(value, kind)))


class Units:
    """The units a lane loaded for a span of bytes (a block or a group of blocks), and the fields of those bytes as
    i32 values: `bits(offset, shift, count)` is `count` bits from bit `shift` of the span's byte `offset` (the
    units it lies in widened to i32, shifted and masked); each unit is widened once."""

    def __init__(self, b: Body, units: list[SSAValue], unit: int):
        self.b, self.units, self.unit = b, units, unit
        self._wide: dict[int, SSAValue] = {}

    def word(self, index: int) -> SSAValue:
        found = self._wide.get(index)
        if found is None:
            value = self.units[index]
            if self.unit != 4:
                value = self.b.op(arith.ExtUIOp(value, I32))
            found = self._wide[index] = value
        return found

    def field(self, offset: int, size: int) -> SSAValue:
        """The 4 bytes at byte `offset` of the span (a Q5 block's fifth bits, unit-aligned), little-endian, as an
        i32: one 32-bit unit, or two 16-bit units joined."""
        assert size == 4 and offset % self.unit == 0
        index = offset // self.unit
        if self.unit == 4:
            return self.word(index)
        b = self.b
        high = b.op(arith.ShLIOp(self.word(index + 1), _iconst(b, 16)))
        return b.op(arith.OrIOp(self.word(index), high))

    def bits(self, offset: int, shift: int, count: int) -> SSAValue:
        """`count` bits from bit `shift` of byte `offset` (within one unit)."""
        b = self.b
        index, within = divmod(offset, self.unit)
        value = self.word(index)
        total = 8 * within + shift
        if total:
            value = b.op(arith.ShRUIOp(value, _iconst(b, total)))
        if total + count < 32:
            value = b.op(arith.AndIOp(value, _iconst(b, (1 << count) - 1)))
        return value

    def half(self, offset: int) -> SSAValue:
        """The f16 at byte `offset`, widened to f32 (exact)."""
        b = self.b
        index, within = divmod(offset, self.unit)
        value = self.units[index]
        if self.unit == 4:
            value = self.word(index)
            if within:
                value = b.op(arith.ShRUIOp(value, _iconst(b, 8 * within)))
            value = b.op(arith.TruncIOp(value, IntegerType(16)))
        return b.op(arith.ExtFOp(b.op(arith.BitcastOp(value, Float16Type())), f32))


def dequantize(b: Body, fmt: str, span: Units, start: int) -> list[SSAValue]:
    """The 32 numbers (f32) of the block at byte `start` of `span`, as `quant.dequantize` gives them."""
    fifth = {"q5_0": 2, "q5_1": 4}.get(fmt)
    minimum = fmt in ("q4_1", "q5_1")
    scale = span.half(start)
    low = span.half(start + 2) if minimum else None
    qs = start + {"q8_0": 2, "q4_0": 2, "q4_1": 4, "q5_0": 6, "q5_1": 8}[fmt]
    high_bits = span.field(start + fifth, 4) if fifth is not None else None
    values = []
    for i in range(quant.FORMATS[fmt].block):
        if fmt == "q8_0":
            code = b.op(arith.TruncIOp(span.bits(qs + i, 0, 8), IntegerType(8)))
            number = b.op(arith.SIToFPOp(code, f32))  # the signed byte
        else:
            code = span.bits(qs + i % 16, 4 * (i // 16), 4)
            if high_bits is not None:  # bit i of qh is the code's fifth bit
                bit = b.op(arith.AndIOp(b.op(arith.ShRUIOp(high_bits, _iconst(b, i))), _iconst(b, 1)))
                code = b.op(arith.OrIOp(code, b.op(arith.ShLIOp(bit, _iconst(b, 4)))))
            if minimum:
                number = b.op(arith.UIToFPOp(code, f32))
            else:
                offset = 16 if fifth is not None else 8
                number = b.op(arith.SIToFPOp(b.op(arith.SubiOp(code, _iconst(b, offset))), f32))
        value = b.fmul(scale, number)
        values.append(b.fadd(value, low) if low is not None else value)
    return values


def load_units(b: Body, weight: SSAValue, row: SSAValue, first: SSAValue, count: int, vectors: bool) -> list[SSAValue]:
    """`count` units of row `row` from unit `first`: in 16-byte vector loads (`vectors`: `first` 16-byte aligned,
    `count` whole vectors) or one unit a load."""
    if not vectors:
        return [b.load_raw(weight, [row, b.add(first, i) if i else first]) for i in range(count)]
    unit = weight.type.element_type.width.data // 8  # type: ignore[attr-defined]
    per = VECTOR_BYTES // unit
    got: list[SSAValue] = []
    for v in range(count // per):
        got += b.vload_raw(weight, [row, b.add(first, v * per) if v else first], per)
    return got


