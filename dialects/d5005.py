"""The `d5005` dialect: the instructions of the decode engine of Intel's FPGA PAC D5005, over its memories.

The engine is a fixed datapath (one bitstream) that reads a program, the decode step lowered to these
instructions, and streams the weights from the card's four DDR4-2400 banks (8 GiB each). Its operands are of two
kinds: **on-chip buffers** (`d5005.buffer`, float32 words in one of the engine's statically banked on-chip arrays,
`ARRAYS`, each at a word offset that starts a bank word, an SSA value of type `!d5005.buffer` that the
instructions read and write; each instruction reaches each of its buffers in the arrays `OPERANDS` names, those
its routine has ports on) and **board-memory regions**
(`#d5005.region`, a matrix whose rows are striped over the four banks: row r lives in bank r % 4 at byte
`offset + (r // 4) * stride` of that bank, so every bank holds the same offsets and a matrix-vector product
streams from all four at once). A `d5005.program` holds the buffers and, in order, the instructions of one decode
step; running it once is one launch of the engine.

```mlir
d5005.program identity "LOGOS program: decode step" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
  %normed = d5005.buffer "normed" words 64 at 0 in "inputs"
  %query = d5005.buffer "query" words 64 at 64 in "outputs"
  d5005.matvec %query, %normed, <"model.layers.0.self_attn.q_proj.weight" at 0 stride 128 rows 64 cols 64 bytes 2>
}
```

Each op's verifier checks what it can see alone (region inside its bank, aligned to the burst, shapes that agree);
`d5005.program`'s verifier checks the buffers against their arrays and every instruction's buffers (each a
`d5005.buffer` of the program, in an array its routine reaches, large enough for what the instruction reads or
writes), in one walk over its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects.builtin import I64, FloatAttr, IntAttr, IntegerAttr, StringAttr, UnitAttr, i64
from xdsl.ir import Attribute, Block, Dialect, ParametrizedAttribute, Region, SSAValue, TypeAttribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import NoTerminator
from xdsl.utils.exceptions import VerifyException

# -- the card and the engine -------------------------------------------------------------------------------------

BANKS = 4  # DDR4 banks of the D5005
BANK_BYTES = 8 << 30  # 8 GiB each: 32 GiB of board memory
BOARD_BYTES = BANKS * BANK_BYTES
BANK_GBPS = 19.2  # DDR4-2400 on a 64-bit channel: 2400 MT/s x 8 bytes
WEIGHT_BYTES = {"f32": 4, "bf16": 2}
# Limits of the engine's datapath (fixed by the bitstream, the same for every model): query heads sharing one KV
# head, bank words in one cached key or value row, and float32 words of a matvec's input vector (its on-chip copy).
GROUP_MAX = 8
ROW_WORDS_MAX = 8
VECTOR_WORDS = 16384
# Float32 words of the matvec's on-chip copy of a bias (an engine that adds biases holds one in its epilogue).
BIAS_WORDS = 16384
# A matvec's part after the first adds to what its first wrote: the engine's on-chip copy of those rows.
PRIOR_WORDS = 16384
# A mixture of experts: the experts a route chooses among (its on-chip copy of their probabilities) and the most it
# chooses (its route registers, and the lanes of the bank word that holds the chosen experts' ids).
EXPERTS_MAX = 256
TOP_K_MAX = 16


# The engine's on-chip arrays (M20K), one a kind of buffer, each statically banked a float32 word a bank over a bank
# word (burst / 4 banks): the residual stream (embedding rows and the adds), the matvec's inputs (the norms' and
# SiLU*mul's outputs), the attention's outputs, the matvec's outputs, and RoPE's outputs. Each takes a fixed share
# of the on-chip budget (`onchip_words >> shift`), and its id names it in an instruction word's buffer fields.
ARRAY_SHIFTS = {"residual": 4, "inputs": 3, "attended": 5, "outputs": 1, "rotated": 4}
ARRAYS = tuple(ARRAY_SHIFTS)
ARRAY_IDS = {name: index + 1 for index, name in enumerate(ARRAYS)}
OFFSET_BITS = 24  # a buffer field: the array's id above these bits, the buffer's offset in bank words below


def array_words(onchip_words: int, array: str) -> int:
    """The float32 words of one on-chip array of an engine with `onchip_words` of on-chip budget."""
    return onchip_words >> ARRAY_SHIFTS[array]


def bank_words(elements: int, element_bytes: int, burst: int) -> int:
    """Bank words (bursts) that hold `elements` elements of `element_bytes` each."""
    return -(-(elements * element_bytes) // burst)


# The block formats the engine streams as stored (docs/d5005.md, "Weights as stored"): a row of a stored region is
# groups of `burst / 2` blocks of 32 numbers, each group its scale words (an f16 scale of each block; Q4_1 a second
# word, each block's f16 minimum) then its code words (the blocks' codes as the file stores them, 16 a group at 8
# bits, 8 at 4). A matvec's or an embedding row's word says its weight's format in W_FORMAT (0: the image's floats).
STORED_FORMATS = {"q8_0": 1, "q4_0": 2, "q4_1": 3}
STORED_BITS = {"q8_0": 8, "q4_0": 4, "q4_1": 4}
STORED_SCALE_WORDS = {"q8_0": 1, "q4_0": 1, "q4_1": 2}
BLOCK = 32  # numbers of a block


def stored_row_words(cols: int, storage: str, burst: int) -> int:
    """Bank words of one row of `cols` numbers in a stored format (cols a whole number of blocks): each whole group
    its scale words and code words, a last part-group its scale words and the code words its blocks fill."""
    bits, scales, group = STORED_BITS[storage], STORED_SCALE_WORDS[storage], burst // 2
    full, rest = divmod(cols // BLOCK, group)
    tail = scales + -(-(rest * BLOCK * bits // 8) // burst) if rest else 0
    return full * (scales + 2 * bits) + tail


def rope_row_floats(head_dim: int, burst: int) -> int:
    """The floats of one row of the rotary table: the cosines of the head's half-frequencies, then their sines,
    each half padded to whole bank words, so the compute kernel's two on-chip halves are filled and read at banks
    known when the engine is built (word * OV + lane)."""
    return 2 * bank_words(head_dim // 2, 4, burst) * (burst // 4)


@dataclass(frozen=True)
class EngineParams:
    """The engine's fixed parameters (one bitstream): its clock, the burst of one bank read per cycle (the DDR4
    controller's 512-bit user interface at quarter rate), the on-chip buffer budget in float32 words, and the
    multiply-accumulate lanes (one vector of `vector_width` weights from each of the four banks per cycle)."""

    clock_mhz: int = 300
    burst_bytes: int = 64
    onchip_words: int = 1 << 20  # 4 MiB of M20K blocks, of the Stratix 10 SX 2800's 229 Mbit (about 28 MiB)
    weights: str = "bf16"

    @property
    def vector_width(self) -> int:
        """Weights one bank delivers per cycle."""
        return self.burst_bytes // WEIGHT_BYTES[self.weights]

    @property
    def mac_lanes(self) -> int:
        return BANKS * self.vector_width


def _fail(op: IRDLOperation, message: str) -> VerifyException:
    return VerifyException(f"'{op.name}' op {message}")


def _int(attr: IntegerAttr) -> int:
    return attr.value.data


# -- board-memory regions ----------------------------------------------------------------------------------------


@irdl_attr_definition
class RegionAttr(ParametrizedAttribute):
    """A matrix in board memory, rows striped over the four banks (row r in bank r % 4, at `offset + (r // 4) *
    stride` bytes of it), each element `bytes` wide: `#d5005.region<"name" at 0 stride 128 rows 64 cols 64 bytes 2>`.
    A vector is a matrix of one row (it lies in bank 0)."""

    name = "d5005.region"

    tensor: StringAttr
    offset: IntAttr
    stride: IntAttr
    rows: IntAttr
    cols: IntAttr
    element_bytes: IntAttr
    storage: StringAttr  # a block format the rows are stored in (`STORED_FORMATS`; element bytes 1), or ""

    def __init__(
        self, tensor: str, offset: int, stride: int, rows: int, cols: int, element_bytes: int, storage: str = ""
    ):
        super().__init__(
            StringAttr(tensor), IntAttr(offset), IntAttr(stride), IntAttr(rows), IntAttr(cols), IntAttr(element_bytes),
            StringAttr(storage),
        )  # fmt: skip

    @property
    def stored(self) -> str:
        """The block format its rows are stored in, or "" (the image's floats)."""
        return self.storage.data

    @property
    def rows_per_bank(self) -> int:
        return -(-self.rows.data // BANKS)

    @property
    def bank_bytes(self) -> int:
        """Bytes the region takes in each bank it stripes over (the same in all four)."""
        return self.rows_per_bank * self.stride.data

    @property
    def end(self) -> int:
        return self.offset.data + self.bank_bytes

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            tensor = parser.parse_str_literal("a region's tensor name")
            values = []
            for word in ("at", "stride", "rows", "cols", "bytes"):
                parser.parse_keyword(word)
                values.append(IntAttr(parser.parse_integer(allow_boolean=False, allow_negative=False)))
            storage = parser.parse_identifier("a block format") if parser.parse_optional_keyword("stored") else ""
        return [StringAttr(tensor), *values, StringAttr(storage)]

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_string_literal(self.tensor.data)
            printer.print_string(
                f" at {self.offset.data} stride {self.stride.data} rows {self.rows.data} cols {self.cols.data}"
                f" bytes {self.element_bytes.data}" + (f" stored {self.stored}" if self.stored else "")
            )

    def verify(self) -> None:
        name = self.tensor.data
        if self.stored:
            self._verify_stored()
        elif self.element_bytes.data not in (2, 4):
            raise VerifyException(f"region '{name}': elements are 2 (bf16) or 4 (f32) bytes, not {self.element_bytes}")
        if self.rows.data < 1 or self.cols.data < 1:
            raise VerifyException(f"region '{name}': a matrix has at least one row and one column")
        if self.stride.data < self.cols.data * self.element_bytes.data * (not self.stored):
            raise VerifyException(
                f"region '{name}': a row of {self.cols.data} elements of {self.element_bytes.data} bytes does not fit"
                f" its stride of {self.stride.data} bytes"
            )
        if self.end > BANK_BYTES:
            raise VerifyException(
                f"region '{name}' ends at byte {self.end} of its banks, past their {BANK_BYTES} bytes"
            )

    def _verify_stored(self) -> None:
        name, fmt = self.tensor.data, self.stored
        if fmt not in STORED_FORMATS:
            raise VerifyException(
                f"region '{name}': stored in '{fmt}', not a format the engine reads ({', '.join(STORED_FORMATS)})"
            )
        if self.element_bytes.data != 1 or self.cols.data % BLOCK:
            raise VerifyException(f"region '{name}': {fmt} rows are whole blocks of {BLOCK} in bytes (bytes 1)")
        need = self.cols.data * STORED_BITS[fmt] // 8 + self.cols.data // BLOCK * 2 * STORED_SCALE_WORDS[fmt]
        if self.stride.data < need:
            raise VerifyException(
                f"region '{name}': a {fmt} row of {self.cols.data} numbers takes {need} bytes, over its stride of"
                f" {self.stride.data}"
            )


def check_burst(op: IRDLOperation, region: RegionAttr, burst: int) -> None:
    """A region starts, and each of its rows starts, on a burst boundary."""
    for what, value in (("offset", region.offset.data), ("stride", region.stride.data)):
        if value % burst:
            raise _fail(
                op, f"region '{region.tensor.data}': {what} {value} is not a multiple of the {burst}-byte burst"
            )


def _check_cache_precision(op: CacheWriteOp | AttentionOp, weights: str, burst: int) -> None:
    """A cache holds the weights' precision (bf16 or f32), and one of its rows fits the engine's row registers."""
    cache = op.cache if isinstance(op, CacheWriteOp) else op.keys
    if cache.element_bytes.data != WEIGHT_BYTES[weights]:
        raise _fail(
            op,
            f"cache '{cache.tensor.data}' holds {cache.element_bytes.data}-byte elements, not the {weights} weights'",
        )
    words = bank_words(cache.cols.data, cache.element_bytes.data, burst)
    if words > ROW_WORDS_MAX:
        raise _fail(
            op, f"a row of cache '{cache.tensor.data}' takes {words} bank words, over the engine's {ROW_WORDS_MAX}"
        )


# -- the program and its buffers ---------------------------------------------------------------------------------


@irdl_attr_definition
class BufferType(ParametrizedAttribute, TypeAttribute):
    """The type of an on-chip buffer: `!d5005.buffer` (its words and offset are the `d5005.buffer` op's)."""

    name = "d5005.buffer"


@irdl_op_definition
class ProgramOp(IRDLOperation):
    """One decode step for the engine: its identity line, weight precision, cache length and engine parameters;
    its block holds the on-chip buffers, then the instructions in order.

    ```mlir
    d5005.program identity "LOGOS program: decode step" weights "bf16" ctx 64 clock_mhz 300 burst 64 onchip 4096 {
      %logits = d5005.buffer "logits" words 256 at 0 in "outputs"
      d5005.argmax %logits size 256
    }
    ```
    """

    name = "d5005.program"

    identity = prop_def(StringAttr)
    weights = prop_def(StringAttr)
    ctx = prop_def(IntegerAttr[I64])
    clock_mhz = prop_def(IntegerAttr[I64])
    burst = prop_def(IntegerAttr[I64])
    onchip = prop_def(IntegerAttr[I64])
    body = region_def("single_block")

    traits = traits_def(NoTerminator())

    assembly_format = (
        "`identity` $identity `weights` $weights `ctx` $ctx `clock_mhz` $clock_mhz `burst` $burst `onchip` $onchip"
        " $body attr-dict"
    )

    def __init__(self, identity: str, params: EngineParams, ctx: int, ops: Sequence[IRDLOperation] = ()):
        super().__init__(
            properties={
                "identity": StringAttr(identity),
                "weights": StringAttr(params.weights),
                "ctx": IntegerAttr(ctx, i64),
                "clock_mhz": IntegerAttr(params.clock_mhz, i64),
                "burst": IntegerAttr(params.burst_bytes, i64),
                "onchip": IntegerAttr(params.onchip_words, i64),
            },
            regions=[Region(Block(ops))],
        )

    @property
    def params(self) -> EngineParams:
        return EngineParams(_int(self.clock_mhz), _int(self.burst), _int(self.onchip), self.weights.data)

    def buffers(self) -> list[BufferOp]:
        return [op for op in self.body.block.ops if isinstance(op, BufferOp)]

    def instructions(self) -> list[InstructionOp]:
        return [op for op in self.body.block.ops if isinstance(op, InstructionOp)]

    def verify_(self) -> None:
        if self.weights.data not in WEIGHT_BYTES:
            raise _fail(self, f"weights are bf16 or f32, not '{self.weights.data}'")
        burst, onchip = _int(self.burst), _int(self.onchip)
        if burst < 4 * BANKS or burst & (burst - 1):
            raise _fail(self, f"the burst is a power of two of at least {4 * BANKS} bytes, not {burst}")
        for buffer in self.buffers():
            _check_in_array(self, buffer, onchip, burst // 4)
        for op in self.instructions():
            op.check_buffers(self, burst)
            for region in op.regions_read():
                check_burst(op, region, burst)
            if isinstance(op, AttentionOp | CacheWriteOp):
                _check_cache_precision(op, self.weights.data, burst)


def _check_in_array(program: ProgramOp, buffer: BufferOp, onchip: int, bank_word: int) -> None:
    """A buffer lies in one of the engine's arrays, from a bank word's first bank, and inside it."""
    label, array = buffer.label.data, buffer.array_name
    if array not in ARRAY_SHIFTS:
        raise _fail(program, f"buffer '{label}' is in none of the engine's on-chip arrays ({', '.join(ARRAYS)})")
    if _int(buffer.offset) % bank_word:
        raise _fail(
            program, f"buffer '{label}' starts at word {_int(buffer.offset)}, not on a bank word of {bank_word}"
        )
    size = array_words(onchip, array)
    if _int(buffer.offset) + _int(buffer.words) > size:
        raise _fail(program, f"buffer '{label}' lies past the {size} words of on-chip array '{array}'")


@irdl_op_definition
class BufferOp(IRDLOperation):
    """An on-chip buffer of float32 words in one of the engine's arrays (`ARRAYS`), at a word offset into it,
    named for the listing and the stream's symbols.

    ```mlir
    %normed = d5005.buffer "normed" words 64 at 128 in "inputs"
    ```
    """

    name = "d5005.buffer"

    label = prop_def(StringAttr)
    words = prop_def(IntegerAttr[I64])
    offset = prop_def(IntegerAttr[I64])
    array = opt_prop_def(StringAttr)
    buffer = result_def(BufferType)

    assembly_format = "$label `words` $words `at` $offset (`in` $array^)? attr-dict"

    def __init__(self, label: str, words: int, offset: int, array: str | None = None):
        properties: dict[str, Attribute] = {
            "label": StringAttr(label),
            "words": IntegerAttr(words, i64),
            "offset": IntegerAttr(offset, i64),
        }
        if array is not None:
            properties["array"] = StringAttr(array)
        super().__init__(properties=properties, result_types=[BufferType()])
        if SSAValue.is_valid_name(label):
            self.buffer.name_hint = label

    @property
    def array_name(self) -> str | None:
        return self.array.data if self.array is not None else None

    def verify_(self) -> None:
        if _int(self.words) < 1 or _int(self.offset) < 0:
            raise _fail(self, f"buffer '{self.label.data}' needs at least one word at an offset of at least 0")
        if self.array is not None and self.array.data not in ARRAY_SHIFTS:
            raise _fail(self, f"buffer '{self.label.data}': '{self.array.data}' is not an on-chip array of the engine")


def label(value: SSAValue) -> str:
    """The name of the buffer an instruction's operand is (in a verified program, a `d5005.buffer`)."""
    owner = value.owner
    assert isinstance(owner, BufferOp), owner
    return owner.label.data


# -- the instructions --------------------------------------------------------------------------------------------


class InstructionOp(IRDLOperation):
    """Base of the engine's instructions: `buffer_uses` says which buffers an instruction reads or writes and
    how many words of each, `written` and `read` which one it writes and which it reads (a scratch buffer is
    neither: nothing lives in it from one instruction to the next), `regions_read` which board-memory regions it
    streams."""

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        raise NotImplementedError

    def written(self) -> SSAValue | None:
        return None

    def read(self) -> list[SSAValue]:
        return []

    def regions_read(self) -> list[RegionAttr]:
        return []

    def check_buffers(self, program: ProgramOp, burst: int = 64) -> None:
        for value, words in self.buffer_uses(burst):
            owner = value.owner
            if not isinstance(owner, BufferOp) or owner.parent_op() is not program:
                raise _fail(self, "uses a buffer that is not a d5005.buffer of its program")
            if _int(owner.words) < words:
                raise _fail(self, f"needs {words} words of buffer '{owner.label.data}', which has {_int(owner.words)}")
        for operand, (_, arrays) in OPERANDS[self.name].items():
            owner = getattr(self, operand).owner
            assert isinstance(owner, BufferOp)
            if owner.array_name not in arrays:
                raise _fail(
                    self,
                    f"reaches its {operand} in array {' or '.join(repr(a) for a in arrays)}, and buffer"
                    f" '{owner.label.data}' is in '{owner.array_name}'",
                )


@irdl_op_definition
class EmbedRowOp(InstructionOp):
    """Fetch the table's row at the engine's token (from 1) into a buffer; with a `scale`, each number times it.

    ```mlir
    %hidden = d5005.buffer "hidden" words 64 at 0 in "residual"
    d5005.embed_row %hidden, <"model.embed_tokens.weight" at 0 stride 128 rows 256 cols 64 bytes 2>
    ```
    """

    name = "d5005.embed_row"

    dst = operand_def(BufferType)
    table = prop_def(RegionAttr)
    scale = opt_prop_def(FloatAttr)  # each number of the row times it (Gemma's square root of the width)

    assembly_format = "$dst `,` $table (`scale` $scale^)? attr-dict"

    def __init__(self, dst: SSAValue, table: RegionAttr, scale: float | None = None):
        properties: dict[str, Attribute] = {"table": table}
        if scale is not None:
            properties["scale"] = FloatAttr(scale, 32)
        super().__init__(operands=[dst], properties=properties)

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        return [(self.dst, self.table.cols.data)]

    def written(self) -> SSAValue | None:
        return self.dst

    def regions_read(self) -> list[RegionAttr]:
        return [self.table]


@irdl_op_definition
class MatvecOp(InstructionOp):
    """dst = weight @ src (+ bias): stream a weight matrix [rows, cols] from all four banks at once (bank b feeds
    rows b, b+4, ...), one vector of weights per bank per cycle; with a `bias` (a vector of `rows`, in bank 0),
    bank 0 streams it first into the engine's on-chip copy and the epilogue adds it to each row's total.

    ```mlir
    %normed = d5005.buffer "normed" words 64 at 0 in "inputs"
    %query = d5005.buffer "query" words 64 at 64 in "outputs"
    d5005.matvec %query, %normed, <"model.layers.0.mlp.down_proj.weight" at 0 stride 128 rows 64 cols 64 bytes 2>
    d5005.matvec %query, %normed, <"model.layers.0.self_attn.q_proj.weight" at 0 stride 128 rows 64 cols 64 bytes 2>
        bias <"model.layers.0.self_attn.q_proj.bias" at 4096 stride 128 rows 1 cols 64 bytes 2>
    ```
    """

    name = "d5005.matvec"

    dst = operand_def(BufferType)
    src = operand_def(BufferType)
    weight = prop_def(RegionAttr)
    bias = opt_prop_def(RegionAttr)
    columns = opt_prop_def(IntegerAttr[I64])  # a part of the weight's columns (and of src) ...
    first = opt_prop_def(IntegerAttr[I64])  # ... from this one; a part after the first adds to what dst holds
    slot = opt_prop_def(IntegerAttr[I64])  # an expert's matvec: the weight is `experts` stacked, and the rows ...
    experts = opt_prop_def(IntegerAttr[I64])  # ... streamed are those of the expert the route chose in this slot,
    routes = opt_prop_def(RegionAttr)  # ... its id read from this region by each bank's reader

    assembly_format = (
        "$dst `,` $src `,` $weight (`bias` $bias^)? (`columns` $columns^ `from` $first)?"
        " (`expert` `slot` $slot^ `of` $experts `routes` $routes)? attr-dict"
    )

    def __init__(
        self,
        dst: SSAValue,
        src: SSAValue,
        weight: RegionAttr,
        bias: RegionAttr | None = None,
        part: tuple[int, int] | None = None,
        expert: tuple[int, int, RegionAttr] | None = None,
    ):
        properties: dict[str, Attribute] = {"weight": weight}
        if bias is not None:
            properties["bias"] = bias
        if part is not None:
            properties |= {"first": IntegerAttr(part[0], i64), "columns": IntegerAttr(part[1], i64)}
        if expert is not None:
            slot, experts, routes = expert
            properties |= {"slot": IntegerAttr(slot, i64), "experts": IntegerAttr(experts, i64), "routes": routes}
        super().__init__(operands=[dst, src], properties=properties)

    @property
    def expert_rows(self) -> int:
        """The rows it streams: the weight's, or one expert's of a stacked weight."""
        if self.experts is None:
            return self.weight.rows.data
        return self.weight.rows.data // _int(self.experts)

    @property
    def expert_stride(self) -> int:
        """Bytes of each bank from one stacked expert's rows to the next's (0: not an expert's matvec)."""
        if self.experts is None:
            return 0
        return self.expert_rows // BANKS * self.weight.stride.data

    @property
    def part(self) -> tuple[int, int]:
        """The first column and the number of columns it streams: all of them, or its part."""
        if self.columns is None or self.first is None:
            return 0, self.weight.cols.data
        return _int(self.first), _int(self.columns)

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        return [(self.dst, self.expert_rows), (self.src, sum(self.part))]

    def written(self) -> SSAValue | None:
        return self.dst

    def read(self) -> list[SSAValue]:
        return [self.src, self.dst] if self.part[0] else [self.src]

    def regions_read(self) -> list[RegionAttr]:
        extra = [r for r in (self.bias, self.routes) if r is not None]
        return [self.weight, *extra]

    def verify_(self) -> None:
        if self.dst == self.src:
            raise _fail(self, "writes the buffer it streams: a matvec is never in place")
        if self.bias is not None:
            _check_bias(self, self.bias, self.weight.rows.data)
        first, columns = self.part
        if columns > VECTOR_WORDS:
            raise _fail(self, f"reads a vector of {columns} words, over the engine's {VECTOR_WORDS}-word copy of it")
        if (self.columns is None) != (self.first is None):
            raise _fail(self, "streams a part of its columns with both a first column and a count, or with neither")
        if first % VECTOR_WORDS or columns < 1 or first + columns > self.weight.cols.data:
            raise _fail(
                self,
                f"streams columns {first} to {first + columns - 1} of {self.weight.cols.data}: a part starts at a"
                f" multiple of the engine's {VECTOR_WORDS}-word copy and lies inside the weight",
            )
        if first and self.bias is not None:
            raise _fail(self, "adds its bias in a part after the first: the first part adds it")
        if self.weight.stored and columns != self.weight.cols.data:
            raise _fail(self, f"streams a part of a weight stored in {self.weight.stored}: stored rows stream whole")
        if first and self.weight.rows.data > PRIOR_WORDS:
            raise _fail(
                self, f"adds to {self.weight.rows.data} rows, over the engine's {PRIOR_WORDS}-word copy of them"
            )
        if self.experts is not None:
            self._verify_expert()

    def _verify_expert(self) -> None:
        """An expert's matvec streams whole rows (floats or as stored) of one of its stacked experts, each expert's rows
        starting in bank 0 (a whole number of rows of four), its slot one of the route's."""
        experts, rows = _int(self.experts), self.weight.rows.data
        if self.slot is None or self.routes is None:
            raise _fail(self, "is an expert's matvec without its slot and its route's region")
        if experts < 1 or experts > EXPERTS_MAX or rows % experts or (rows // experts) % BANKS:
            raise _fail(
                self,
                f"streams one of {experts} experts stacked in {rows} rows: each expert's rows a whole number of"
                f" rows of {BANKS} (one a bank), at most {EXPERTS_MAX} experts",
            )
        if self.bias is not None or self.columns is not None:
            raise _fail(self, "streams an expert's rows with a bias or in parts: the engine streams whole rows")
        _check_routes(self, self.routes, _int(self.slot))


def _check_routes(op: IRDLOperation, routes: RegionAttr, slot: int | None = None) -> None:
    """A route's region holds, in each bank, one bank word of the chosen experts' ids: BANKS rows of top_k ids."""
    top_k = routes.cols.data
    if routes.rows.data != BANKS or routes.element_bytes.data != 4 or not 1 <= top_k <= TOP_K_MAX:
        raise _fail(
            op,
            f"routes through region '{routes.tensor.data}' of {routes.rows.data} x {top_k}: not a row of at most"
            f" {TOP_K_MAX} ids (4 bytes each) in each of the {BANKS} banks",
        )
    if slot is not None and not 0 <= slot < top_k:
        raise _fail(op, f"takes slot {slot} of a route that chooses {top_k} experts")


def _check_bias(op: IRDLOperation, bias: RegionAttr, rows: int) -> None:
    """A matvec's bias is a vector of its rows, within the engine's on-chip copy of it."""
    if bias.rows.data != 1 or bias.cols.data != rows:
        raise _fail(op, f"adds a bias of {bias.rows.data} x {bias.cols.data}, not a vector of its {rows} rows")
    if rows > BIAS_WORDS:
        raise _fail(op, f"adds a bias of {rows} words, over the engine's {BIAS_WORDS}-word copy of it")


@irdl_op_definition
class RMSNormOp(InstructionOp):
    """dst = src / sqrt(mean(src^2) + epsilon) * weight, over the weight's length; with `plus_one`, times one
    plus the weight (Gemma's norms).

    ```mlir
    %x = d5005.buffer "x" words 64 at 0 in "residual"
    %normed = d5005.buffer "normed" words 64 at 64 in "inputs"
    d5005.rms_norm %normed, %x, <"model.norm.weight" at 0 stride 128 rows 1 cols 64 bytes 2> epsilon 1.0e-05 : f32
    ```
    """

    name = "d5005.rms_norm"

    dst = operand_def(BufferType)
    src = operand_def(BufferType)
    weight = prop_def(RegionAttr)
    epsilon = prop_def(FloatAttr)
    plus_one = opt_prop_def(UnitAttr)

    assembly_format = "$dst `,` $src `,` $weight `epsilon` $epsilon (`plus_one` $plus_one^)? attr-dict"

    def __init__(self, dst: SSAValue, src: SSAValue, weight: RegionAttr, epsilon: float, plus_one: bool = False):
        properties: dict[str, Attribute] = {"weight": weight, "epsilon": FloatAttr(epsilon, 32)}
        if plus_one:
            properties["plus_one"] = UnitAttr()
        super().__init__(operands=[dst, src], properties=properties)

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        n = self.weight.cols.data
        return [(self.dst, n), (self.src, n)]

    def written(self) -> SSAValue | None:
        return self.dst

    def read(self) -> list[SSAValue]:
        return [self.src]

    def regions_read(self) -> list[RegionAttr]:
        return [self.weight]

    def verify_(self) -> None:
        if self.weight.rows.data != 1:
            raise _fail(self, f"reads a weight vector, not a matrix of {self.weight.rows.data} rows")


@irdl_op_definition
class RopeOp(InstructionOp):
    """Rotate each head of `width` words at the engine's position, by the rotary table (row p-1 holds the cos of
    each of the head's half-frequencies, then their sin), the two halves of each head (Hugging Face's layout);
    with a `norm` (a vector of head_dim, in bank 0) and its `epsilon`, each head is RMS-normed by it first
    (Qwen3's query and key norms: head / sqrt(mean(head^2) + epsilon) * norm).

    ```mlir
    %query = d5005.buffer "query" words 64 at 0 in "outputs"
    %turned = d5005.buffer "turned_query" words 64 at 64 in "rotated"
    d5005.rope %turned, %query, <"rope" at 0 stride 64 rows 64 cols 16 bytes 4> width 64 head_dim 16
    ```
    """

    name = "d5005.rope"

    dst = operand_def(BufferType)
    src = operand_def(BufferType)
    table = prop_def(RegionAttr)
    width = prop_def(IntegerAttr[I64])
    head_dim = prop_def(IntegerAttr[I64])
    rotary_dim = opt_prop_def(IntegerAttr[I64])
    norm = opt_prop_def(RegionAttr)
    epsilon = opt_prop_def(FloatAttr)
    plus_one = opt_prop_def(UnitAttr)  # the head norm times one plus its weight (Gemma 3's)

    assembly_format = (
        "$dst `,` $src `,` $table `width` $width `head_dim` $head_dim (`rotary_dim` $rotary_dim^)?"
        " (`norm` $norm^)? (`epsilon` $epsilon^)? (`plus_one` $plus_one^)? attr-dict"
    )

    def __init__(
        self,
        dst: SSAValue,
        src: SSAValue,
        table: RegionAttr,
        width: int,
        head_dim: int,
        norm: tuple[RegionAttr, float] | None = None,
        rotary_dim: int | None = None,
        plus_one: bool = False,
    ):
        properties: dict[str, Attribute] = {
            "table": table,
            "width": IntegerAttr(width, i64),
            "head_dim": IntegerAttr(head_dim, i64),
        }
        if rotary_dim is not None:
            properties["rotary_dim"] = IntegerAttr(rotary_dim, i64)
        if norm is not None:
            properties |= {"norm": norm[0], "epsilon": FloatAttr(norm[1], 32)}
        if plus_one:
            properties["plus_one"] = UnitAttr()
        super().__init__(operands=[dst, src], properties=properties)

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        return [(self.dst, _int(self.width)), (self.src, _int(self.width))]

    def written(self) -> SSAValue | None:
        return self.dst

    def read(self) -> list[SSAValue]:
        return [self.src]

    @property
    def rotary(self) -> int:
        """The numbers of each head that rotate: its first `rotary_dim`, or all of them."""
        return _int(self.rotary_dim) if self.rotary_dim is not None else _int(self.head_dim)

    def regions_read(self) -> list[RegionAttr]:
        return [self.table] if self.norm is None else [self.table, self.norm]

    def verify_(self) -> None:
        width, head_dim = _int(self.width), _int(self.head_dim)
        if (self.norm is None) != (self.epsilon is None):
            raise _fail(self, "norms its heads with a weight and an epsilon, or with neither")
        if self.plus_one is not None and self.norm is None:
            raise _fail(self, "scales by one plus a head norm's weight, and norms no heads")
        if self.rotary_dim is not None and not (2 <= self.rotary < head_dim and self.rotary % 2 == 0):
            raise _fail(self, f"rotates the first {self.rotary} of heads of {head_dim}: not an even part of them")
        if self.rotary_dim is not None and self.norm is not None:
            raise _fail(self, "norms its heads and rotates only a part of each: the engine does one or the other")
        if self.norm is not None and (self.norm.rows.data != 1 or self.norm.cols.data != head_dim):
            raise _fail(self, f"norms heads of {head_dim} by a weight of {self.norm.rows.data} x {self.norm.cols.data}")
        if head_dim < 2 or head_dim % 2 or width % head_dim:
            raise _fail(self, f"cannot rotate {width} words in heads of {head_dim}")
        if self.table.cols.data % 2 or self.table.cols.data < self.rotary:
            part = f"the head's {head_dim}" if self.rotary_dim is None else f"its rotating {self.rotary}"
            raise _fail(self, f"its table has rows of {self.table.cols.data}, not two halves of {part}")

    def check_buffers(self, program: ProgramOp, burst: int = 64) -> None:
        super().check_buffers(program, burst)
        row = rope_row_floats(self.rotary, burst)
        if self.table.cols.data != row:
            raise _fail(
                self,
                f"its table has rows of {self.table.cols.data}, not the {row} of the head's cosines and sines each"
                f" padded to whole {burst}-byte bank words",
            )


@irdl_op_definition
class CacheWriteOp(InstructionOp):
    """Write a buffer of kv_heads x head_dim words into a cache at the engine's position: head h's row in the
    cache region is h * ctx + position - 1.

    ```mlir
    %key = d5005.buffer "turned_key" words 32 at 0 in "rotated"
    d5005.cache_write %key, <"cache.0.key" at 0 stride 64 rows 128 cols 16 bytes 4> kv_heads 2
    ```
    """

    name = "d5005.cache_write"

    src = operand_def(BufferType)
    cache = prop_def(RegionAttr)
    kv_heads = prop_def(IntegerAttr[I64])

    assembly_format = "$src `,` $cache `kv_heads` $kv_heads attr-dict"

    def __init__(self, src: SSAValue, cache: RegionAttr, kv_heads: int):
        super().__init__(operands=[src], properties={"cache": cache, "kv_heads": IntegerAttr(kv_heads, i64)})

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        return [(self.src, _int(self.kv_heads) * self.cache.cols.data)]

    def read(self) -> list[SSAValue]:
        return [self.src]

    def regions_read(self) -> list[RegionAttr]:
        return [self.cache]

    def verify_(self) -> None:
        _check_cache(self, self.cache, _int(self.kv_heads))


def _check_cache(op: IRDLOperation, cache: RegionAttr, kv_heads: int) -> None:
    if kv_heads < 1 or cache.rows.data % kv_heads:
        raise _fail(op, f"cache '{cache.tensor.data}' of {cache.rows.data} rows is not {kv_heads} heads of positions")


@irdl_op_definition
class AttentionOp(InstructionOp):
    """dst = causal grouped-query attention of the query's heads over the keys and values of positions 1 (with a
    `window` of W, position - W + 1) to the engine's position (query head h reads KV head h // (heads /
    kv_heads)): positions before it from the caches in board memory, the position itself from the on-chip
    `current` key and value buffers (what the step's `cache_write`s store), in one pass over the cache with an
    online softmax: nothing goes through a scratch buffer. Each KV head's keys and values are read once for all
    the query heads of its group, and a windowed attention streams only its window's rows.

    ```mlir
    %q = d5005.buffer "turned_query" words 64 at 0 in "rotated"
    %k = d5005.buffer "turned_key" words 32 at 64 in "rotated"
    %v = d5005.buffer "value" words 32 at 96 in "outputs"
    %o = d5005.buffer "attended" words 64 at 128 in "attended"
    d5005.attention %o, %q, <"cache.0.key" at 0 stride 64 rows 128 cols 16 bytes 4>,
        <"cache.0.value" at 8192 stride 64 rows 128 cols 16 bytes 4> current %k, %v heads 4 kv_heads 2
    ```
    """

    name = "d5005.attention"

    dst = operand_def(BufferType)
    query = operand_def(BufferType)
    key = operand_def(BufferType)
    value = operand_def(BufferType)
    keys = prop_def(RegionAttr)
    values = prop_def(RegionAttr)
    heads = prop_def(IntegerAttr[I64])
    kv_heads = prop_def(IntegerAttr[I64])
    window = opt_prop_def(IntegerAttr[I64])
    scale = opt_prop_def(FloatAttr)  # the scores' scale (absent: 1 / sqrt(head_dim)); Gemma's 1 / sqrt(scalar)
    softcap = opt_prop_def(FloatAttr)  # the scaled scores soft-capped, tanh(s / cap) * cap (Gemma 2's)

    assembly_format = (
        "$dst `,` $query `,` $keys `,` $values `current` $key `,` $value `heads` $heads `kv_heads` $kv_heads"
        " (`window` $window^)? (`scale` $scale^)? (`softcap` $softcap^)? attr-dict"
    )

    def __init__(
        self,
        dst: SSAValue,
        query: SSAValue,
        keys: RegionAttr,
        values: RegionAttr,
        current: tuple[SSAValue, SSAValue],
        heads: int,
        kv: int,
        window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ):
        properties: dict[str, Attribute] = {
            "keys": keys,
            "values": values,
            "heads": IntegerAttr(heads, i64),
            "kv_heads": IntegerAttr(kv, i64),
        }
        if window is not None:
            properties["window"] = IntegerAttr(window, i64)
        if scale is not None:
            properties["scale"] = FloatAttr(scale, 32)
        if softcap is not None:
            properties["softcap"] = FloatAttr(softcap, 32)
        super().__init__(operands=[dst, query, current[0], current[1]], properties=properties)

    @property
    def ctx(self) -> int:
        return self.keys.rows.data // _int(self.kv_heads)

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        head_dim, kv = self.keys.cols.data, _int(self.kv_heads)
        width = _int(self.heads) * head_dim
        return [
            (self.dst, width),
            (self.query, width),
            (self.key, kv * head_dim),
            (self.value, kv * head_dim),
        ]

    def written(self) -> SSAValue | None:
        return self.dst

    def read(self) -> list[SSAValue]:
        return [self.query, self.key, self.value]

    def regions_read(self) -> list[RegionAttr]:
        return [self.keys, self.values]

    def verify_(self) -> None:
        heads, kv = _int(self.heads), _int(self.kv_heads)
        _check_cache(self, self.keys, kv)
        _check_cache(self, self.values, kv)
        if (self.keys.rows, self.keys.cols) != (self.values.rows, self.values.cols):
            raise _fail(self, "its key and value caches differ in shape")
        if heads % kv:
            raise _fail(self, f"{heads} query heads do not share {kv} key-value heads evenly")
        if heads // kv > GROUP_MAX:
            raise _fail(self, f"{heads // kv} query heads share a KV head, over the engine's {GROUP_MAX}")
        if self.window is not None and not 1 <= _int(self.window) < self.ctx:
            raise _fail(self, f"has a window of {_int(self.window)}, not 1 to {self.ctx - 1} (shorter than its cache)")
        if self.softcap is not None and not self.softcap.value.data > 0:
            raise _fail(self, f"soft-caps its scores at {self.softcap.value.data}, not a positive cap")
        if max(heads, kv) > COUNT_MASK:
            raise _fail(self, f"has {heads} heads over {kv}: over the {COUNT_MASK} its word's half-fields hold")


class ElementwiseOp(InstructionOp):
    """Base of the elementwise instructions over `size` words of two buffers."""

    dst = operand_def(BufferType)
    lhs = operand_def(BufferType)
    rhs = operand_def(BufferType)
    size = prop_def(IntegerAttr[I64])

    assembly_format = "$dst `,` $lhs `,` $rhs `size` $size attr-dict"

    def __init__(self, dst: SSAValue, lhs: SSAValue, rhs: SSAValue, size: int):
        super().__init__(operands=[dst, lhs, rhs], properties={"size": IntegerAttr(size, i64)})

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        n = _int(self.size)
        return [(self.dst, n), (self.lhs, n), (self.rhs, n)]

    def written(self) -> SSAValue | None:
        return self.dst

    def read(self) -> list[SSAValue]:
        return [self.lhs, self.rhs]


@irdl_op_definition
class SiluMulOp(ElementwiseOp):
    """dst = silu(lhs) * rhs (SwiGLU's gate and up); with `gelu_tanh`, GELU with the tanh approximation of lhs
    instead (GeGLU, Gemma's).

    ```mlir
    %gate = d5005.buffer "gate" words 128 at 0 in "outputs"
    %up = d5005.buffer "up" words 128 at 128 in "outputs"
    %product = d5005.buffer "product" words 128 at 256 in "inputs"
    d5005.silu_mul %product, %gate, %up size 128
    ```
    """

    name = "d5005.silu_mul"

    gelu_tanh = opt_prop_def(UnitAttr)

    assembly_format = "$dst `,` $lhs `,` $rhs `size` $size (`gelu_tanh` $gelu_tanh^)? attr-dict"

    def __init__(self, dst: SSAValue, lhs: SSAValue, rhs: SSAValue, size: int, gelu_tanh: bool = False):
        super().__init__(dst, lhs, rhs, size)
        if gelu_tanh:
            self.properties["gelu_tanh"] = UnitAttr()


@irdl_op_definition
class AddOp(ElementwiseOp):
    """dst = lhs + rhs (the residual connections).

    ```mlir
    %x = d5005.buffer "x" words 64 at 0 in "residual"
    %projected = d5005.buffer "projected" words 64 at 64 in "outputs"
    %mixed = d5005.buffer "mixed" words 64 at 128 in "residual"
    d5005.add %mixed, %x, %projected size 64
    ```
    """

    name = "d5005.add"


@irdl_op_definition
class ArgmaxOp(InstructionOp):
    """The engine's result: the index (from 1) of the greatest of `size` words, the first on a tie; with a `cap`,
    each word soft-capped first (tanh(x / cap) * cap, Gemma 2's logits), the capped logits the ones it writes.

    ```mlir
    %logits = d5005.buffer "logits" words 256 at 0 in "outputs"
    d5005.argmax %logits size 256
    ```
    """

    name = "d5005.argmax"

    src = operand_def(BufferType)
    size = prop_def(IntegerAttr[I64])
    cap = opt_prop_def(FloatAttr)

    assembly_format = "$src `size` $size (`cap` $cap^)? attr-dict"

    def __init__(self, src: SSAValue, size: int, cap: float | None = None):
        properties: dict[str, Attribute] = {"size": IntegerAttr(size, i64)}
        if cap is not None:
            properties["cap"] = FloatAttr(cap, 32)
        super().__init__(operands=[src], properties=properties)

    def verify_(self) -> None:
        if self.cap is not None and not self.cap.value.data > 0:
            raise _fail(self, f"soft-caps at {self.cap.value.data}, not a positive cap")

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        return [(self.src, _int(self.size))]

    def read(self) -> list[SSAValue]:
        return [self.src]


@irdl_op_definition
class RouteOp(InstructionOp):
    """A mixture of experts' route: the router's logits (`experts` words, what its matvec wrote) to probabilities
    by a softmax over every expert in float32, the `top_k` most probable chosen (the lowest index first on a tie,
    as `torch.topk`), divided by their sum with `renormalize`; the chosen experts, in ascending index, go into
    the engine's route registers (their weights, for `expert_sum`) and their ids into one bank word of each bank
    at the `routes` region (row b in bank b), where each bank's reader reads them to stream the chosen experts'
    rows (`matvec ... expert slot j`).

    ```mlir
    %logits = d5005.buffer "router_logits" words 4 at 0 in "outputs"
    d5005.route %logits, <"routes" at 65536 stride 64 rows 4 cols 2 bytes 4> experts 4 top_k 2 renormalize
    ```
    """

    name = "d5005.route"

    src = operand_def(BufferType)
    routes = prop_def(RegionAttr)
    experts = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    renormalize = opt_prop_def(UnitAttr)

    assembly_format = "$src `,` $routes `experts` $experts `top_k` $top_k (`renormalize` $renormalize^)? attr-dict"

    def __init__(self, src: SSAValue, routes: RegionAttr, experts: int, top_k: int, renormalize: bool = False):
        properties: dict[str, Attribute] = {
            "routes": routes,
            "experts": IntegerAttr(experts, i64),
            "top_k": IntegerAttr(top_k, i64),
        }
        if renormalize:
            properties["renormalize"] = UnitAttr()
        super().__init__(operands=[src], properties=properties)

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        return [(self.src, _int(self.experts))]

    def read(self) -> list[SSAValue]:
        return [self.src]

    def regions_read(self) -> list[RegionAttr]:
        return [self.routes]

    def verify_(self) -> None:
        experts, top_k = _int(self.experts), _int(self.top_k)
        if not 1 <= experts <= EXPERTS_MAX:
            raise _fail(self, f"routes among {experts} experts, not 1 to the engine's {EXPERTS_MAX}")
        if not 1 <= top_k <= min(experts, TOP_K_MAX):
            raise _fail(self, f"chooses {top_k} of {experts} experts, not 1 to {min(experts, TOP_K_MAX)}")
        _check_routes(self, self.routes)
        if self.routes.cols.data != top_k:
            raise _fail(self, f"chooses {top_k} experts into a region of {self.routes.cols.data} ids")


@irdl_op_definition
class ExpertSumOp(InstructionOp):
    """dst = (slot 0: 0, else dst) + weight * src: the weighted sum over the chosen experts, in ascending expert
    index (the route's slots), of their down projections; `weight` is the route registers' for the slot.

    ```mlir
    %down = d5005.buffer "expert_down" words 64 at 0 in "outputs"
    %routed = d5005.buffer "routed" words 64 at 64 in "attended"
    d5005.expert_sum %routed, %down slot 1 size 64
    ```
    """

    name = "d5005.expert_sum"

    dst = operand_def(BufferType)
    src = operand_def(BufferType)
    slot = prop_def(IntegerAttr[I64])
    size = prop_def(IntegerAttr[I64])

    assembly_format = "$dst `,` $src `slot` $slot `size` $size attr-dict"

    def __init__(self, dst: SSAValue, src: SSAValue, slot: int, size: int):
        super().__init__(
            operands=[dst, src], properties={"slot": IntegerAttr(slot, i64), "size": IntegerAttr(size, i64)}
        )

    def buffer_uses(self, burst: int = 64) -> list[tuple[SSAValue, int]]:
        n = _int(self.size)
        return [(self.dst, n), (self.src, n)]

    def written(self) -> SSAValue | None:
        return self.dst

    def read(self) -> list[SSAValue]:
        return [self.src, self.dst] if _int(self.slot) else [self.src]

    def verify_(self) -> None:
        if self.dst == self.src:
            raise _fail(self, "adds into the buffer it reads")
        if not 0 <= _int(self.slot) < TOP_K_MAX:
            raise _fail(self, f"takes slot {_int(self.slot)}, not one of the engine's {TOP_K_MAX} route registers")


D5005 = Dialect(
    "d5005",
    [
        ProgramOp,
        BufferOp,
        EmbedRowOp,
        MatvecOp,
        RMSNormOp,
        RopeOp,
        CacheWriteOp,
        AttentionOp,
        SiluMulOp,
        AddOp,
        ArgmaxOp,
        RouteOp,
        ExpertSumOp,
    ],
    [RegionAttr, BufferType],
)


# -- the binary encoding the engine reads (the emitter writes it, the runtime's reader checks it) -----------------

STREAM_MAGIC = b"D5005ENG"
IMAGE_MAGIC = b"D5005IMG"
FORMAT_VERSION = 3
HEADER_BYTES = 4096
INSTRUCTION_WORDS = 16  # one instruction: 16 little-endian uint32 words, 64 bytes, one burst
INSTRUCTION_BYTES = INSTRUCTION_WORDS * 4
IDENTITY_AT = 128  # the identity line starts at this byte of a header
OPCODES = {
    "d5005.embed_row": 1,
    "d5005.matvec": 2,
    "d5005.rms_norm": 3,
    "d5005.rope": 4,
    "d5005.cache_write": 5,
    "d5005.attention": 6,
    "d5005.silu_mul": 7,
    "d5005.add": 8,
    "d5005.argmax": 9,
    "d5005.route": 10,
    "d5005.expert_sum": 11,
}
# The fields of an instruction word, by index (docs/d5005.md has the table of what each opcode reads).
W_OPCODE, W_DST, W_A, W_B, W_ROWS, W_COLS, W_OFFSET, W_STRIDE, W_OFFSET2, W_HEADS, W_KV_HEADS = range(11)
W_HEAD_DIM, W_CTX, W_FLOAT, W_WIDTH, W_RESERVED = range(11, 16)
# The attention's current key and value buffers sit in the words RoPE's width and no opcode else uses.
W_KEY, W_VALUE = W_WIDTH, W_RESERVED
# A matvec's bias: its length in RoPE's width (0: none) and its offset in the attention's second region's word.
W_BIAS, W_BIAS_OFFSET = W_WIDTH, W_OFFSET2
# An attention's window (0: none), in the buffer field b that it has no buffer for.
W_WINDOW = W_B
# A matvec's and an embedding row's weight format (`STORED_FORMATS`; 0: the image's floats), in the same field.
W_FORMAT = W_B
# A rope's head norm: 1 in the attention's heads (0: none), its weight's offset in offset2, epsilon in float; the
# numbers of each head it rotates in kv_heads (0: the whole head).
W_HEAD_NORM, W_NORM_OFFSET, W_ROTARY = W_HEADS, W_OFFSET2, W_KV_HEADS
# An RMS norm's or a rope's head norm's one plus the weight: 1 in the attention's ctx (0: the weight itself).
W_PLUS_ONE = W_CTX
# An embedding row's scale and an arg-max's soft-cap in the float (0: none); a gated product's GELU (tanh
# approximation, 1) or SiLU (0) in the attention's heads.
W_EMBED_SCALE, W_CAP, W_GELU = W_FLOAT, W_FLOAT, W_HEADS
# A matvec's first column, for a part of its columns after the first (0: the first part, or all of them); its
# cols the part's.
W_FIRST = W_HEAD_DIM
# An attention's soft-cap of its scores (0: none): its float32 bits' high half in the high half of heads, the low
# half in the high half of kv_heads (the head counts in the low halves: COUNT_MASK).
W_SOFTCAP_HIGH, W_SOFTCAP_LOW = W_HEADS, W_KV_HEADS
COUNT_MASK = 0xFFFF
# An expert's matvec: its slot of the route plus one in the attention's heads (0: not an expert's), the routes
# region's offset in kv_heads, the bank words from one stacked expert to the next in ctx, the experts stacked in
# the float. A route: its routes region in rows (4), cols (top_k), offset and stride, its experts in RoPE's width,
# renormalize (1) in heads; an expert_sum its slot in heads.
W_SLOT, W_ROUTES, W_EXPERT_STRIDE, W_EXPERTS = W_HEADS, W_KV_HEADS, W_CTX, W_FLOAT
W_RENORMALIZE, W_ROUTE_EXPERTS, W_SUM_SLOT = W_HEADS, W_WIDTH, W_HEADS


def attention_counts(w: Sequence[int]) -> tuple[int, int, int]:
    """An attention word's query heads, KV heads and its soft-cap's float32 bits (0: none)."""
    high, low = int(w[W_SOFTCAP_HIGH]), int(w[W_SOFTCAP_LOW])
    return high & COUNT_MASK, low & COUNT_MASK, (high & ~COUNT_MASK & 0xFFFFFFFF) | (low >> 16)


# The engine's kernels (passes/d5005/emit_opencl.py writes them, the host program launches them).
COMPUTE_KERNEL = "d5005_compute"
READER_KERNELS = tuple(f"d5005_read_bank{b}" for b in range(BANKS))
# Each instruction's buffer operands: the instruction word's field that names it (its array's id and its offset in
# bank words) and the arrays its routine reaches it in (a routine has a port on those arrays only).
OPERANDS: dict[str, dict[str, tuple[int, tuple[str, ...]]]] = {
    "d5005.embed_row": {"dst": (W_DST, ("residual",))},
    "d5005.matvec": {"dst": (W_DST, ("outputs",)), "src": (W_A, ("inputs", "attended"))},
    "d5005.rms_norm": {"dst": (W_DST, ("inputs",)), "src": (W_A, ("residual", "outputs"))},
    "d5005.rope": {"dst": (W_DST, ("rotated",)), "src": (W_A, ("outputs", "inputs"))},
    "d5005.cache_write": {"src": (W_A, ("outputs", "rotated"))},
    "d5005.attention": {
        "dst": (W_DST, ("attended",)),
        "query": (W_A, ("rotated",)),
        "key": (W_KEY, ("rotated",)),
        "value": (W_VALUE, ("outputs",)),
    },
    "d5005.silu_mul": {"dst": (W_DST, ("inputs",)), "lhs": (W_A, ("outputs",)), "rhs": (W_B, ("outputs",))},
    "d5005.add": {
        "dst": (W_DST, ("residual",)),
        "lhs": (W_A, ("residual",)),
        "rhs": (W_B, ("outputs", "inputs", "attended")),
    },
    "d5005.argmax": {"src": (W_A, ("outputs",))},
    "d5005.route": {"src": (W_A, ("outputs",))},
    "d5005.expert_sum": {"dst": (W_DST, ("attended",)), "src": (W_A, ("outputs",))},
}
