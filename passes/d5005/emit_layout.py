"""The D5005 weight layout (which tensor at which bank and offset, `-t d5005-layout`) and the weight image.

The layout is a text table, one line per region of the program: tensor, kind (weight, table, cache), element type,
rows x cols, offset in each bank, row stride, bytes per bank; row r of every region lives in bank r % 4 at
`offset + (r // 4) * stride`. The weight image is what the host copies into the banks before the first launch: a
4 KiB header (magic `D5005IMG`, version, banks, element bytes, bytes per bank, the identity line at byte 128),
then each bank's first `image bytes` in bank order: the weights (bf16 rounded to nearest even, or f32; a weight
stored in a block format the engine reads, its file's blocks in groups: `stored_rows`), and the
rotary table (float32 cos and sin for every position, derived from the spec). The caches after it are zeroed by
the host, never shipped. `weight_image` is the only code of the lane that reads weight values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, ClassVar

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from logos_ir.dialects import d5005
from logos_ir.numerics import bf16_bits
from logos_ir.passes.d5005.emit_opencl import the_d5005_program
from logos_ir.passes.d5005.emit_stream import HEADER_FIELDS, header
from logos_ir.passes.d5005.placement import ROUTES, TABLES, table_turn
from logos_ir.spec import ModelSpec


def regions_of(program: d5005.ProgramOp) -> dict[str, d5005.RegionAttr]:
    found: dict[str, d5005.RegionAttr] = {}
    for op in program.instructions():
        for region in op.regions_read():
            found.setdefault(region.tensor.data, region)
    return dict(sorted(found.items(), key=lambda item: item[1].offset.data))


def region_kind(name: str) -> str:
    if name == ROUTES:
        return "routes"
    return "table" if name in TABLES else "cache" if name.startswith("cache.") else "weight"


ZEROED = ("cache", "routes")  # the kinds of region the host zeroes, never in the image


def image_bytes(program: d5005.ProgramOp) -> int:
    """Bytes per bank the weight image fills: up to the end of the last weight or table region."""
    return max((r.end for n, r in regions_of(program).items() if region_kind(n) not in ZEROED), default=0)


def layout(program: d5005.ProgramOp) -> str:
    regions = regions_of(program)
    lines = [
        f"# {program.identity.data}",
        f"# d5005 weight layout: {d5005.BANKS} banks of {d5005.BANK_BYTES} bytes; row r of a region in bank r % 4 at"
        " offset + (r // 4) * stride; weights in the image, caches zeroed by the host",
        f"# weights {program.weights.data}; image {image_bytes(program)} bytes per bank;"
        f" board memory used {max((r.end for r in regions.values()), default=0)} bytes per bank",
        f"# {'tensor':<48} {'kind':<6} {'dtype':<5} {'rows':>7} {'cols':>6} {'offset':>12} {'stride':>7}"
        f" {'bytes/bank':>11}",
    ]
    for name, r in regions.items():
        dtype = r.stored or {2: "bf16", 4: "f32"}[r.element_bytes.data]
        lines.append(
            f"{name:<50} {region_kind(name):<6} {dtype:<5} {r.rows.data:>7} {r.cols.data:>6} {r.offset.data:>12}"
            f" {r.stride.data:>7} {r.bank_bytes:>11}"
        )
    return "\n".join(lines) + "\n"


# -- the weight image ------------------------------------------------------------------------------------------


def rope_table(spec: ModelSpec, ctx: int, row_floats: int, name: str = TABLES[0]) -> np.ndarray:
    """[ctx, row_floats] float32 of the table `name` (its base and scaling: `table_turn`): row p-1 holds cos of
    (p-1) * each frequency, as the reference's, then their sines, each half padded with zeros to `row_floats / 2`
    (whole bank words: `d5005.rope_row_floats`)."""
    from logos_ir.rope import rope_attention_factor, rope_inv_freq

    theta, scaling = table_turn(name, spec.at_context(ctx))  # a cache's table: LongRoPE's factors of its context
    inv_freq = rope_inv_freq(spec.rotary_dim or spec.head_dim, theta, scaling)  # over the numbers that rotate
    angles = np.arange(ctx, dtype=np.float64)[:, None] * inv_freq[None, :]
    half = np.zeros((ctx, 2, row_floats // 2), dtype=np.float64)
    scale = rope_attention_factor(scaling)  # YaRN's and LongRoPE's scale of cos and sin
    half[:, 0, : inv_freq.size], half[:, 1, : inv_freq.size] = scale * np.cos(angles), scale * np.sin(angles)
    return half.reshape(ctx, row_floats).astype(np.float32)


def stored_rows(blocks: np.ndarray, storage: str, burst: int) -> np.ndarray:
    """A stored region's rows [rows, stored_row_words * burst] (uint8) from the file's blocks [rows, row bytes]:
    each group of `burst / 2` blocks its scale word (the blocks' f16 scales in order; Q4_1 then a word of their
    f16 minimums) then its code words (the blocks' codes, each block's bytes as the file stores them, in order); a
    last part-group's words zero-padded and cut after its last code word (`d5005.stored_row_words`)."""
    bits, scale_words, group = d5005.STORED_BITS[storage], d5005.STORED_SCALE_WORDS[storage], burst // 2
    code_bytes = d5005.BLOCK * bits // 8
    rows, row_bytes = blocks.shape
    block_bytes = 2 * scale_words + code_bytes
    count = row_bytes // block_bytes
    groups = -(-count // group)
    padded = np.zeros((rows, groups * group, block_bytes), dtype=np.uint8)
    padded[:, :count] = np.asarray(blocks, dtype=np.uint8).reshape(rows, count, block_bytes)
    padded = padded.reshape(rows, groups, group, block_bytes)
    parts = [padded[..., 2 * k : 2 * k + 2].reshape(rows, groups, burst) for k in range(scale_words)]
    parts.append(padded[..., 2 * scale_words :].reshape(rows, groups, group * code_bytes))
    laid = np.concatenate(parts, axis=-1).reshape(rows, -1)
    return laid[:, : d5005.stored_row_words(count * d5005.BLOCK, storage, burst) * burst]


def _striped(region: d5005.RegionAttr, matrix: np.ndarray, banks: np.ndarray) -> None:
    """Write `matrix` [rows, cols] (a stored region's: its rows' bytes) into the banks: row r into bank r % 4 at
    offset + (r // 4) * stride."""
    rows, cols, per_bank = region.rows.data, region.cols.data, region.rows_per_bank
    stride, offset = region.stride.data, region.offset.data
    raw = np.zeros((per_bank * d5005.BANKS, stride), dtype=np.uint8)
    data = np.ascontiguousarray(matrix).view(np.uint8).reshape(rows, -1)
    raw[:rows, : data.shape[1]] = data
    assert data.shape[1] == (stride if region.stored else cols * region.element_bytes.data)
    for bank in range(d5005.BANKS):
        banks[bank, offset : offset + per_bank * stride] = raw[bank :: d5005.BANKS].reshape(-1)


def weight_image(program: d5005.ProgramOp, spec: ModelSpec, store, progress=None) -> bytes:  # noqa: ANN001
    """The image's bytes: header, then bank 0 to 3 (reads every weight the program streams from `store`)."""
    size = image_bytes(program)
    banks = np.zeros((d5005.BANKS, size), dtype=np.uint8)
    regions = [(n, r) for n, r in regions_of(program).items() if region_kind(n) not in ZEROED]
    items = progress.over(regions, "weight image") if progress is not None else regions
    for name, region in items:
        if name in TABLES:
            _striped(region, rope_table(spec, region.rows.data, region.cols.data, name), banks)
            continue
        if region.stored:  # the file's blocks, re-laid in groups: the engine dequantizes them as it streams
            blocks = np.asarray(store.blocks(name)).reshape(region.rows.data, -1)
            _striped(region, stored_rows(blocks, region.stored, program.params.burst_bytes), banks)
            continue
        values = np.asarray(store.get(name), dtype=np.float32).reshape(region.rows.data, region.cols.data)
        _striped(region, bf16_bits(values) if region.element_bytes.data == 2 else values, banks)
    element = d5005.WEIGHT_BYTES[program.weights.data]
    identity = program.identity.data
    fields = (d5005.FORMAT_VERSION, d5005.HEADER_BYTES, d5005.BANKS, element, len(identity.encode("utf-8")))
    fields += (0,) * (HEADER_FIELDS - len(fields))
    return header(d5005.IMAGE_MAGIC, identity, fields, (size, size)) + banks.tobytes()


@dataclass(frozen=True)
class LayoutTarget(Target):
    """`-t d5005-layout`: the weight layout of the `d5005.program` in the module."""

    name: ClassVar[str] = "d5005-layout"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(layout(the_d5005_program(module, self.name)))
