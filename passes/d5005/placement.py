"""Where a decode step's tensors live in the D5005's board memory: the placement `convert-logos-to-d5005` uses.

Every tensor is a matrix whose rows are striped over the four banks (row r in bank r % 4) with each row padded to
the burst, so every bank holds the same offsets and a matrix-vector product reads a quarter of its rows from each
bank at once. The weights come first (in the program's order; a tied head reads the embedding's region), then the
rotary tables (the model's, and its windowed layers' where they rotate by a base of their own: derived from the
spec, written into the weight image by the build), then the KV caches (in the
weights' precision, zeroed by the host, never in the image). `Placement.of` reads only the shapes of the
`logos.weight` and `logos.cache` ops, never a weight value, in one walk of the program; `fit_error` refuses a
model whose weights and caches do not fit the 32 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from logos_ir.dialects import logos
from logos_ir.dialects.d5005 import (
    BANK_BYTES,
    BANKS,
    BOARD_BYTES,
    STORED_FORMATS,
    VECTOR_WORDS,
    WEIGHT_BYTES,
    RegionAttr,
    rope_row_floats,
    stored_row_words,
)
from logos_ir.errors import PassError
from logos_ir.spec import ModelSpec, RopeScaling

ROPE = "rope"
ROUTES = "routes"  # the chosen experts' ids, a bank word in each bank, written by each route (zeroed, not in the image)
LOCAL_ROPE = "rope.local"  # the windowed layers' own table, where the model rotates them by a base of their own
TABLES = (ROPE, LOCAL_ROPE)


def rope_table(op: logos.RopeOp, spec: ModelSpec) -> str | None:
    """The rotary table a rotation turns by: the model's own (its base and scaling), the windowed layers' own (the
    model's local base, unscaled, as `ModelSpec.rope_theta_of` and `rope_scaling_of` say), or None (no table)."""
    turn = (op.theta.value.data, op.rope_scaling)
    if turn == (spec.rope_theta, spec.rope_scaling):
        return ROPE
    if spec.local_rope_theta is not None and turn == (spec.local_rope_theta, None):
        return LOCAL_ROPE
    return None


def table_turn(name: str, spec: ModelSpec) -> tuple[float, RopeScaling | None]:
    """The base and scaling of the rotary table `name` (one of `TABLES`)."""
    if name == LOCAL_ROPE:
        assert spec.local_rope_theta is not None
        return spec.local_rope_theta, None
    return spec.rope_theta, spec.rope_scaling


def streamed_as_stored(op: logos.WeightOp) -> str:
    """The block format a weight streams in as stored (a matrix, or a stack of experts' matrices, stored in one of
    `d5005.STORED_FORMATS` whose rows fit the engine's copy of a matvec's input, so no matvec streams a part of
    them), or "": the image's
    floats, its dequantized values (vectors; a format the engine has no datapath for; a row over the copy)."""
    shape = op.full_shape
    fmt = op.storage.format_name.data if op.storage is not None else ""
    if len(shape) not in (2, 3) or fmt not in STORED_FORMATS or shape[-1] > VECTOR_WORDS:  # 3: experts stacked
        return ""
    return fmt


def cache_name(layer: int, kind: str) -> str:
    return f"cache.{layer}.{kind}"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Slot:
    """A region's place before it becomes a `#d5005.region` (which verifies that it fits its bank)."""

    kind: str  # weight, table or cache
    offset: int
    stride: int
    rows: int
    cols: int
    element_bytes: int
    storage: str = ""  # a block format the rows are stored in (`d5005.STORED_FORMATS`), or "" (the image's floats)

    @property
    def bank_bytes(self) -> int:
        return -(-self.rows // BANKS) * self.stride


@dataclass
class Placement:
    """The places of one decode step's tensors, by name, and where the weight image ends in each bank."""

    burst: int
    slots: dict[str, Slot] = field(default_factory=dict)
    cursor: int = 0
    image_end: int = 0  # weights and the rotary table: what the weight image holds, per bank
    _regions: dict[str, RegionAttr] = field(default_factory=dict)

    def place(self, name: str, kind: str, rows: int, cols: int, element_bytes: int, storage: str = "") -> None:
        if name in self.slots:
            return
        if storage:  # the rows as stored: whole bank words of their groups (`d5005.stored_row_words`)
            stride, element_bytes = stored_row_words(cols, storage, self.burst) * self.burst, 1
        else:
            stride = _round_up(cols * element_bytes, self.burst)
        slot = Slot(kind, self.cursor, stride, rows, cols, element_bytes, storage)
        self.slots[name] = slot
        self.cursor += _round_up(slot.bank_bytes, self.burst)

    def region(self, name: str) -> RegionAttr:
        """The region of a placed tensor (only once `fit_error` has passed the placement)."""
        found = self._regions.get(name)
        if found is None:
            s = self.slots[name]
            found = self._regions[name] = RegionAttr(
                name, s.offset, s.stride, s.rows, s.cols, s.element_bytes, s.storage
            )
        return found

    @classmethod
    def of(cls, program: logos.ProgramOp, weights: str, burst: int, ctx: int) -> Placement:
        """Weights in program order, the rotary table, then the caches (one walk over the program)."""
        placement = cls(burst)
        caches: list[logos.CacheOp] = []
        rotary, tables, top_k = 0, set(), 0
        for op in program.walk():
            if isinstance(op, logos.WeightOp):
                shape = op.full_shape
                rows, cols = (1, shape[0]) if len(shape) == 1 else (prod(shape[:-1]), shape[-1])  # experts stacked
                storage = streamed_as_stored(op)
                placement.place(op.tensor.data, "weight", rows, cols, WEIGHT_BYTES[weights], storage)
            elif isinstance(op, logos.CacheOp):
                caches.append(op)
            elif isinstance(op, logos.MixtureOp):
                top_k = max(top_k, op.top_k.value.data)
            elif isinstance(op, logos.RopeOp):
                rotary = op.rotary_dim.value.data if op.rotary_dim is not None else op.head_dim.value.data
                tables.add(rope_table(op, program.model.spec) or ROPE)  # a rotation with no table is refused
        for table in (t for t in TABLES if t in tables):
            placement.place(table, "table", ctx, rope_row_floats(rotary, burst), 4)
        placement.image_end = placement.cursor
        for cache in caches:
            heads, positions, size = cache.full_shape
            name = cache_name(cache.layer.value.data, cache.kind.data)
            placement.place(name, "cache", heads * positions, size, WEIGHT_BYTES[weights])
        if top_k:  # one row of ids in each bank: every route writes it, its layer's experts' readers read it
            placement.place(ROUTES, "routes", BANKS, top_k, 4)
        return placement

    def bytes_of(self, kind: str) -> int:
        """Bytes over all four banks of the regions of one kind."""
        return BANKS * sum(s.bank_bytes for s in self.slots.values() if s.kind == kind)

    @property
    def total_bytes(self) -> int:
        return BANKS * self.cursor


def gb(count: int) -> str:
    """A size in decimal units, as memory vendors state them."""
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.2f} MB"


def fit_error(placement: Placement, pass_name: str, weights: str, ctx: int) -> PassError | None:
    """A diagnostic giving the sizes when the placement overflows a bank, else None."""
    if placement.cursor <= BANK_BYTES:
        return None
    weight_bytes = placement.bytes_of("weight")
    cache_bytes = placement.bytes_of("cache")
    table_bytes = placement.bytes_of("table")
    return PassError(
        f"{pass_name}: the model does not fit the D5005's board memory: weights {gb(weight_bytes)} ({weights}) +"
        f" KV caches at ctx {ctx} {gb(cache_bytes)} + rotary table {gb(table_bytes)} ="
        f" {gb(placement.total_bytes)}, over the {gb(BOARD_BYTES)} (32 GiB) of its four DDR4 banks",
        hint="a smaller model or a shorter ctx" + (", or bf16 weights" if weights == "f32" else ""),
    )
