"""Weights read as stored: a decode step's GEMVs and embedding read a weight's GGUF blocks as the file holds them
and dequantize them in registers.

A weight buffer held as stored (`cuda.storage` on its `cuda.buffer`, the format's name) is a memref of the rows'
bytes in 16- or 32-bit units (`UNIT_BYTES`: the widest that every block of the format starts on, as llama.cpp's
`get_int_b2` / `get_int_b4` read them: Q8_0's 34-byte, Q4_0's 18-byte, Q5_0's 22-byte, Q6_K's 210-byte and Q3_K's
110-byte blocks are 2-byte aligned, Q4_1's 20-byte, Q5_1's 24-byte, Q4_K's 144-byte, Q5_K's 176-byte and Q2_K's
84-byte blocks, each with a half2 `dm`, 4-byte aligned). Where a row's bytes are a multiple of 16 (so every row
starts 16-byte aligned), a lane reads a group of `group` blocks at once in 16-byte loads (the fewest whole blocks
whose bytes are a multiple of 16: 80 bytes of Q4_1, 144 of Q4_0, one super-block of Q4_K or Q5_K) where the
groups of all its streams fit in MAX_GROUP_BYTES; the blocks past the last whole group of such a row, and every
block of a row whose bytes are not a multiple of 16, are read a block at a time in units.

The numbers come out of the loaded units by static shifts and masks (the block layouts of `logos_ir.quant`, as
llama.cpp's `ggml-common.h` lays them), each the value the reference's dequantizer gives (`quant.dequantize`): the
f16 scale d (and minimum m) widened exactly, then d * q (Q8_0: q the signed byte; Q4_0 and Q5_0: the code less 8
or 16) or d * q + m (Q4_1, Q5_1), each product and sum rounded once in f32 as numpy rounds them. A K-quant's
super-block of 256 numbers takes its sub-block's scale (and minimum) first, d * sc (and dmin * m), then each
number's product (less the minimum), in the order `quant._q2_k` ... `_q6_k` round them; a GEMV takes it in runs of
numbers (`pieces`) over one or more loops (`passes`), each unit loaded where its first field is taken
(`lazy_units`), so that no more of a super-block is in registers at once than a pass needs.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.dialects import arith
from xdsl.dialects.builtin import Float16Type, IntegerAttr, IntegerType, MemRefType, StringAttr, f32
from xdsl.ir import Operation, SSAValue

from logos_ir import quant
from logos_ir.dialects import cuda
from logos_ir.passes.cuda.thread_code import Body

# the widest unit every block of a format starts on (ggml-common.h: a block with a half2 `dm` is 4-byte aligned);
# fp8's rows (`CHANNELS`) in 32-bit units, four codes a unit, each row padded to 16 bytes (`cuda.CHANNEL_ROW_TAIL`)
UNIT_BYTES = {
    "q8_0": 2, "q4_0": 2, "q5_0": 2, "q4_1": 4, "q5_1": 4,
    "q4_k": 4, "q5_k": 4, "q2_k": 4, "q6_k": 2, "q3_k": 2, "fp8": 4,
}  # fmt: skip
READ_AS_STORED = tuple(UNIT_BYTES)
CHANNELS = ("fp8",)  # formats with one scale a row (`quant` family "channels"): a row is its codes, then its scale
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
    """The memref of a weight of `shape` (numbers) held as stored in `fmt`: its rows' bytes in units (an fp8 row's
    codes and scale padded to `cuda.CHANNEL_ROW_TAIL`)."""
    row_bytes = quant.FORMATS[fmt].stored_bytes((shape[-1],))
    if fmt in CHANNELS:
        row_bytes = shape[-1] + cuda.CHANNEL_ROW_TAIL
    return MemRefType(unit_type(fmt), [*shape[:-1], row_bytes // UNIT_BYTES[fmt]])


def reads_as_stored(fmt: str, numbers: int) -> bool:
    """Whether a decode step reads a row of `numbers` in `fmt` as stored: every block format's whole blocks; fp8's
    rows of whole 16-byte vectors of codes (others, and a share of a split row that is not, read the image)."""
    return fmt in READ_AS_STORED and (fmt not in CHANNELS or numbers % VECTOR_BYTES == 0)


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
    units it lies in widened to i32, shifted and masked); each unit is widened once. A span made by `lazy_units`
    loads each unit (or the 16-byte vector it lies in) where its first field is taken, so that a super-block's
    bytes are in registers a sub-block at a time; `memo` keeps the values a span's sub-blocks share (their scales)."""

    def __init__(
        self, b: Body, units: list[SSAValue | None], unit: int, fetch: Callable[[int], None] | None = None
    ) -> None:
        self.b, self.units, self.unit, self.fetch = b, units, unit, fetch
        self._wide: dict[int, SSAValue] = {}
        self.memo: dict[object, SSAValue | tuple[SSAValue, SSAValue]] = {}

    def unit_at(self, index: int) -> SSAValue:
        found = self.units[index]
        if found is None:
            assert self.fetch is not None
            self.fetch(index)
            found = self.units[index]
        assert found is not None
        return found

    def word(self, index: int) -> SSAValue:
        found = self._wide.get(index)
        if found is None:
            value = self.unit_at(index)
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
        value = self.unit_at(index)
        if self.unit == 4:
            value = self.word(index)
            if within:
                value = b.op(arith.ShRUIOp(value, _iconst(b, 8 * within)))
            value = b.op(arith.TruncIOp(value, IntegerType(16)))
        return b.op(arith.ExtFOp(b.op(arith.BitcastOp(value, Float16Type())), f32))


# -- fp8 (e4m3) rows: 16 codes a 16-byte load, the row's f32 scale once ------------------------------------------

E4M3_BIAS_GAP = 2.0**120  # 2^(127 - 7): f32's exponent bias against e4m3's
E4M3_NAN = 0x7F  # E4M3FN's NaN (with either sign): no infinities, 0x7E (448) the largest


def e4m3(b: Body, code: SSAValue) -> SSAValue:
    """The e4m3 (E4M3FN) code `code` (an i32 of 0 ... 255) as the f32 it stands for, exactly: its sign to bit 31 and
    its 4 exponent and 3 mantissa bits to bits 20 ... 26 are an f32 of the code's value times 2^-120 (e4m3's
    subnormals f32 subnormals, exact), so one multiply by 2^120 gives it (no f16 step, no conversion instruction);
    0x7F and 0xFF, the format's NaNs, give a NaN (of the code's sign), as ml_dtypes decodes them."""
    magnitude = b.op(arith.AndIOp(code, _iconst(b, 0x7F)))
    sign = b.op(arith.ShLIOp(b.op(arith.AndIOp(code, _iconst(b, 0x80))), _iconst(b, 24)))
    bits = b.op(arith.OrIOp(sign, b.op(arith.ShLIOp(magnitude, _iconst(b, 20)))))
    nan = b.op(arith.CmpiOp(magnitude, _iconst(b, E4M3_NAN), "eq"))
    bits = b.select(nan, b.op(arith.OrIOp(sign, _iconst(b, 0x7FC00000))), bits)
    return b.fmul(b.op(arith.BitcastOp(bits, f32)), b.fconst(E4M3_BIAS_GAP))


def channel_scale(b: Body, weight: SSAValue, row: SSAValue, numbers: int) -> SSAValue:
    """Row `row`'s f32 scale, the 32-bit unit after its `numbers` codes, loaded once a row."""
    return b.op(arith.BitcastOp(b.load_raw(weight, [row, b.const(numbers // 4)]), f32))


def channel_numbers(b: Body, words: list[SSAValue], scale: SSAValue) -> list[SSAValue]:
    """The numbers of the codes in `words` (32-bit units, four codes each, the first in the low byte) as
    `quant.dequantize` gives them: each code's value (`e4m3`) times the row's scale, one f32 rounding."""
    span = Units(b, list(words), 4)
    return [b.fmul(e4m3(b, span.bits(4 * w + k, 0, 8)), scale) for w in range(len(words)) for k in range(4)]


def dequantize(b: Body, fmt: str, span: Units, start: int, numbers: range | None = None) -> list[SSAValue]:
    """The numbers (f32) of the block at byte `start` of `span`, as `quant.dequantize` gives them: the 32 of a
    legacy format's block, or those of `numbers` (all 256 by default) of a K-quant super-block (`SUPER_BLOCKS`)."""
    if fmt in _SUPER_BLOCKS:
        return _SUPER_BLOCKS[fmt](b, span, start, numbers if numbers is not None else range(quant.QK_K))
    assert numbers is None or numbers == range(quant.FORMATS[fmt].block)
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


# -- the K-quants' super-blocks: 256 numbers, a scale (and a minimum) a sub-block ---------------------------------


def _or_high(b: Body, low: SSAValue, high: SSAValue, shift: int) -> SSAValue:
    """low | (high << shift): a code or a scale put together from its fields."""
    return b.op(arith.OrIOp(low, b.op(arith.ShLIOp(high, _iconst(b, shift)))))


def _unsigned(b: Body, code: SSAValue) -> SSAValue:
    return b.op(arith.UIToFPOp(code, f32))


def _less(b: Body, code: SSAValue, offset: int) -> SSAValue:
    """code - offset as a signed number (f32, exact)."""
    return b.op(arith.SIToFPOp(b.op(arith.SubiOp(code, _iconst(b, offset))), f32))


def _k_scale_min(b: Body, span: Units, at: int, j: int) -> tuple[SSAValue, SSAValue]:
    """Sub-block j's 6-bit scale and minimum from the 12 bytes at byte `at` (Q4_K's and Q5_K's), as
    `quant._k_scales_mins` unpacks them: bytes j and j + 4 for j < 4; else byte j + 4's nibbles with the top two
    bits of bytes j - 4 and j."""
    if j < 4:
        return span.bits(at + j, 0, 6), span.bits(at + j + 4, 0, 6)
    scale = _or_high(b, span.bits(at + j + 4, 0, 4), span.bits(at + j - 4, 6, 2), 4)
    minimum = _or_high(b, span.bits(at + j + 4, 4, 4), span.bits(at + j, 6, 2), 4)
    return scale, minimum


def _memo(span: Units, key: object, make: Callable[[], SSAValue | tuple[SSAValue, SSAValue]]) -> object:
    """A value of the span made once, where its first number needs it (a sub-block's scale)."""
    if key not in span.memo:
        span.memo[key] = make()
    return span.memo[key]


def _q4_k_q5_k(b: Body, span: Units, start: int, numbers: range, fifth: bool) -> list[SSAValue]:
    """Q4_K (144 bytes: d, dmin, 12 bytes of scales and minimums, 128 of nibbles) and Q5_K (176: the 32 bytes of
    fifth bits before the nibbles): number 32j + l is (d * sc_j) * q - (dmin * m_j), q the nibble of byte
    32 (j // 2) + l at bit 4 (j % 2) (with Q5_K bit j of qh[l] as its fifth bit), each product and the difference
    rounded in f32 as `quant._q4_k` / `_q5_k` round them."""
    qh, qs = start + 16, start + (48 if fifth else 16)

    def sub_block(j: int) -> tuple[SSAValue, SSAValue]:
        d, dmin = _memo(span, (start, "d"), lambda: (span.half(start), span.half(start + 2)))  # type: ignore[misc]
        scale, minimum = _k_scale_min(b, span, start + 4, j)
        return b.fmul(d, _unsigned(b, scale)), b.fmul(dmin, _unsigned(b, minimum))

    values = []
    for n in numbers:
        j, low = divmod(n, 32)
        dl, ml = _memo(span, (start, j), lambda j=j: sub_block(j))  # type: ignore[misc]
        code = span.bits(qs + 32 * (j // 2) + low, 4 * (j % 2), 4)
        if fifth:
            code = _or_high(b, code, span.bits(qh + low, j, 1), 4)
        values.append(b.fsub(b.fmul(dl, _unsigned(b, code)), ml))
    return values


def _q6_k(b: Body, span: Units, start: int, numbers: range) -> list[SSAValue]:
    """Q6_K (210 bytes: 128 of low nibbles, 64 of high crumbs, 16 signed 8-bit scales, d): number 128h + 32k + l
    is (d * sc_(n // 16)) * (q - 32), q's low 4 bits from ql[64h + 32 (k % 2) + l] at bit 4 (k // 2) and its high
    2 from qh[32h + l] at bit 2k (`quant._q6_k`)."""

    def sub_block(s: int) -> SSAValue:
        d = _memo(span, (start, "d"), lambda: span.half(start + 208))
        signed = b.op(arith.TruncIOp(span.bits(start + 192 + s, 0, 8), IntegerType(8)))
        return b.fmul(d, b.op(arith.SIToFPOp(signed, f32)))  # type: ignore[arg-type]

    values = []
    for n in numbers:
        h, k, low = n // 128, n % 128 // 32, n % 32
        scale = _memo(span, (start, n // 16), lambda s=n // 16: sub_block(s))
        code = span.bits(start + 64 * h + 32 * (k % 2) + low, 4 * (k // 2), 4)
        code = _or_high(b, code, span.bits(start + 128 + 32 * h + low, 2 * k, 2), 4)
        values.append(b.fmul(scale, _less(b, code, 32)))  # type: ignore[arg-type]
    return values


def _q3_k(b: Body, span: Units, start: int, numbers: range) -> list[SSAValue]:
    """Q3_K (110 bytes: 32 of high bits, 64 of crumbs, 12 of 6-bit scales, d): scale i's low 4 bits from byte
    i % 8 at bit 4 (i // 8), its high 2 from byte 8 + i % 4 at bit 2 (i // 4), less 32; number 128h + 32j + l is
    (d * sc_(n // 16)) * q, q the crumb of qs[32h + l] at bit 2j less 4 unless bit 4h + j of hmask[l] is set
    (`quant._q3_k`)."""
    at = start + 96

    def sub_block(i: int) -> SSAValue:
        d = _memo(span, (start, "d"), lambda: span.half(start + 108))
        scale = _or_high(b, span.bits(at + i % 8, 4 * (i // 8), 4), span.bits(at + 8 + i % 4, 2 * (i // 4), 2), 4)
        return b.fmul(d, _less(b, scale, 32))  # type: ignore[arg-type]

    values = []
    for n in numbers:
        h, j, low = n // 128, n % 128 // 32, n % 32
        scale = _memo(span, (start, n // 16), lambda i=n // 16: sub_block(i))
        crumb = span.bits(start + 32 + 32 * h + low, 2 * j, 2)
        code = _or_high(b, crumb, span.bits(start + low, 4 * h + j, 1), 2)  # crumb + 4 with the bit set
        values.append(b.fmul(scale, _less(b, code, 4)))  # type: ignore[arg-type]
    return values


def _q2_k(b: Body, span: Units, start: int, numbers: range) -> list[SSAValue]:
    """Q2_K (84 bytes: 16 of 4-bit scale and minimum pairs, 64 of crumbs, d, dmin): number 128h + 32j + l is
    (d * (sc_i & 15)) * q - (dmin * (sc_i >> 4)), i = n // 16, q the crumb of qs[32h + l] at bit 2j
    (`quant._q2_k`)."""

    def sub_block(i: int) -> tuple[SSAValue, SSAValue]:
        d, dmin = _memo(span, (start, "d"), lambda: (span.half(start + 80), span.half(start + 82)))  # type: ignore[misc]
        scale, minimum = span.bits(start + i, 0, 4), span.bits(start + i, 4, 4)
        return b.fmul(d, _unsigned(b, scale)), b.fmul(dmin, _unsigned(b, minimum))

    values = []
    for n in numbers:
        h, j, low = n // 128, n % 128 // 32, n % 32
        dl, ml = _memo(span, (start, n // 16), lambda i=n // 16: sub_block(i))  # type: ignore[misc]
        crumb = span.bits(start + 16 + 32 * h + low, 2 * j, 2)
        values.append(b.fsub(b.fmul(dl, _unsigned(b, crumb)), ml))
    return values


SuperBlock = Callable[[Body, Units, int, range], list[SSAValue]]
_SUPER_BLOCKS: dict[str, SuperBlock] = {
    "q4_k": lambda b, span, start, numbers: _q4_k_q5_k(b, span, start, numbers, False),
    "q5_k": lambda b, span, start, numbers: _q4_k_q5_k(b, span, start, numbers, True),
    "q6_k": _q6_k,
    "q3_k": _q3_k,
    "q2_k": _q2_k,
}
SUPER_BLOCKS = tuple(_SUPER_BLOCKS)


PASS_BYTES = MAX_GROUP_BYTES // 2  # a K-quant pass's units of all its streams (Q5_K's two at 176 spill)


def passes(fmt: str, streams: int) -> list[list[range]]:
    """The passes a GEMV of `streams` weight rows makes over its blocks, each taking its share of each block's
    `pieces` (each pass a loop of its own, so that ptxas, which issues a loop step's loads first, holds a pass's
    bytes at once, not the block's): one for a legacy format; for a K-quant the fewest that divide its pieces
    evenly and keep a block's units, each in a 32-bit register (a 16-bit unit takes one of its own), within
    PASS_BYTES a pass for all streams: Q4_K's one stream 1, two 2; Q5_K's 2 and 4; Q6_K's 4 and 8."""
    every = pieces(fmt)
    if fmt not in _SUPER_BLOCKS:
        return [every]
    held = streams * quant.FORMATS[fmt].block_bytes // UNIT_BYTES[fmt] * 4
    count = next(n for n in range(1, len(every) + 1) if len(every) % n == 0 and held <= n * PASS_BYTES)
    size = len(every) // count
    return [every[i : i + size] for i in range(0, len(every), size)]


def pieces(fmt: str) -> list[range]:
    """The runs of a block's numbers a GEMV dequantizes and multiplies at once, in the order it takes them: a
    legacy block whole; Q4_K's and Q5_K's sub-blocks of 32 in order (sub-blocks 2c and 2c + 1 share their bytes);
    Q6_K's, Q3_K's and Q2_K's numbers in runs of 8 by half h, then eighth e of the half's 32 bytes, then the
    byte's 2- or 4-bit field k (numbers 128h + 32k + 8e ... + 7), so that each byte's fields are taken one after
    the other and a lane needs a quarter of a half's bytes at once. The sums' order is the thread code's own
    (the dequantized values are what must be the reference's, bit for bit)."""
    layout = quant.FORMATS[fmt]
    if fmt not in _SUPER_BLOCKS:
        return [range(layout.block)]
    if fmt == "q4_k":
        return [range(32 * j, 32 * j + 32) for j in range(8)]
    if fmt == "q5_k":
        return [range(32 * j, 32 * j + 32) for j in range(8)]
    return [
        range(128 * h + 32 * k + 8 * eighth, 128 * h + 32 * k + 8 * eighth + 8)
        for h in range(2)
        for eighth in range(4)
        for k in range(4)
    ]


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


def lazy_units(b: Body, weight: SSAValue, row: SSAValue, first: SSAValue, count: int, vectors: bool) -> Units:
    """The span of `count` units of row `row` from unit `first` (as `load_units` reads them: 16-byte vector loads
    or one unit a load), each load issued where the span's fields first need it."""
    unit = weight.type.element_type.width.data // 8  # type: ignore[attr-defined]
    per = VECTOR_BYTES // unit if vectors else 1
    span = Units(b, [None] * count, unit)

    def fetch(index: int) -> None:
        at = index - index % per
        where = b.add(first, at) if at else first
        loaded = b.vload_raw(weight, [row, where], per) if vectors else [b.load_raw(weight, [row, where])]
        span.units[at : at + per] = loaded

    span.fetch = fetch
    return span
