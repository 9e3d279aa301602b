"""Where a decode step's tensors live in the D5005's board memory: the placement `convert-logos-to-d5005` uses.

Every tensor is a matrix whose rows are striped over the four banks (row r in bank r % 4) with each row padded to
the burst, so every bank holds the same offsets and a matrix-vector product reads a quarter of its rows from each
bank at once. The weights come first (in the program's order; a tied head reads the embedding's region), then the
rotary table (derived from the spec, written into the weight image by the build), then the KV caches (zeroed by the
host, never in the image). `Placement.of` reads only the shapes of the `logos.weight` and `logos.cache` ops, never a
weight value, in one walk of the program; `fit_error` refuses a model whose weights and caches do not fit the 32 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from logos_ir.dialects import logos
from logos_ir.dialects.d5005 import BANK_BYTES, BANKS, BOARD_BYTES, WEIGHT_BYTES, RegionAttr
from logos_ir.errors import PassError

ROPE = "rope"


def cache_name(layer: int, kind: str) -> str:
    return f"cache.{layer}.{kind}"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass
class Placement:
    """The regions of one decode step, by tensor name, and where the weight image and the caches end in each bank."""

    burst: int
    regions: dict[str, RegionAttr] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # weight, table or cache
    cursor: int = 0
    image_end: int = 0  # weights and the rotary table: what the weight image holds, per bank

    def place(self, name: str, kind: str, rows: int, cols: int, element_bytes: int) -> RegionAttr:
        found = self.regions.get(name)
        if found is not None:
            return found
        stride = _round_up(cols * element_bytes, self.burst)
        region = RegionAttr(name, self.cursor, stride, rows, cols, element_bytes)
        self.cursor = region.offset.data + _round_up(region.rows_per_bank * stride, self.burst)
        self.regions[name], self.kinds[name] = region, kind
        return region

    @classmethod
    def of(cls, program: logos.ProgramOp, weights: str, burst: int, ctx: int) -> Placement:
        """Weights in program order, the rotary table, then the caches (one walk over the program)."""
        placement = cls(burst)
        caches: list[logos.CacheOp] = []
        head_dim = 0
        for op in program.walk():
            if isinstance(op, logos.WeightOp):
                shape = op.full_shape
                rows, cols = (1, shape[0]) if len(shape) == 1 else shape
                placement.place(op.tensor.data, "weight", rows, cols, WEIGHT_BYTES[weights])
            elif isinstance(op, logos.CacheOp):
                caches.append(op)
            elif isinstance(op, logos.RopeOp):
                head_dim = op.head_dim.value.data
        if head_dim:
            placement.place(ROPE, "table", ctx, head_dim, 4)
        placement.image_end = placement.cursor
        for cache in caches:
            heads, positions, size = cache.full_shape
            placement.place(cache_name(cache.layer.value.data, cache.kind.data), "cache", heads * positions, size, 4)
        return placement

    def bytes_of(self, kind: str) -> int:
        """Bytes over all four banks of the regions of one kind."""
        return BANKS * sum(r.bank_bytes for name, r in self.regions.items() if self.kinds[name] == kind)

    @property
    def total_bytes(self) -> int:
        return BANKS * self.cursor


def gb(count: int) -> str:
    return f"{count / 1e9:.2f} GB"


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
        hint="a smaller model, a shorter ctx, or bf16 weights",
    )
