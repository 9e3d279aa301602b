"""What the CUDA host fills its device buffers from: each chip's share of each weight (cut from the weight store
as the split program states it, or read from a build's device image files) and the tables the host computes (the
rotary cos / signed sin, the chip index). The image's layout is the build's (`weights.bin`, one a chip
`weights.chip<N>.bin`: a fixed-size header holding the identity line and a JSON index of each buffer's offset,
shape and element, then the buffers, bf16 as bit patterns); nothing is kept on the host once a device has its copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from logos_ir.dialects import cuda
from logos_ir.errors import LogosError
from logos_ir.passes.cuda.host_plan import UNIT_BYTES, Buffer, stored_share, weight_share
from logos_ir.rope import rope_attention_factor, rope_inv_freq


def rope_tables(
    spec: Any, length: int, theta: float | None = None, rotary: int | None = None, unscaled: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """cos and signed sin ([-sin, sin]) per position over a whole head, as the reference builds them: by the
    model's base or `theta`, with the model's rope scaling or none (`unscaled`), over the head's first `rotary`
    numbers (the whole head by default), with cos 1 and sin 0 past them (a partial rotary's numbers that pass
    through). A table of `length` positions is a cache's: LongRoPE's factors are those of that context."""
    rotary = spec.head_dim if rotary is None else rotary
    scaling = None if unscaled else spec.at_context(length).rope_scaling
    inv_freq = rope_inv_freq(rotary, spec.rope_theta if theta is None else theta, scaling)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    scale = rope_attention_factor(scaling)  # YaRN's and LongRoPE's scale of cos and sin, over the rotating numbers
    cos, sin = scale * np.cos(angles), scale * np.sin(angles)
    rest = spec.head_dim - rotary
    ones, zeros = np.ones((length, rest)), np.zeros((length, rest))
    return (
        np.concatenate([cos, cos, ones], axis=1).astype(np.float32),
        np.concatenate([-sin, sin, zeros], axis=1).astype(np.float32),
    )


def host_table(spec: Any, buffer: Buffer, chip: int) -> np.ndarray:
    """A table the host fills: the rotary cos / signed sin (`cuda.rope_table_names`: the model's, or a layer's
    own base or partial rotary), or `chip` (this chip's index)."""
    if buffer.name == "chip":
        return np.full(buffer.shape, chip, np.int64)
    table = cuda.rope_table_of(buffer.name)
    if table is None:
        raise LogosError(f"the CUDA runtime fills no table named '{buffer.name}'")
    which, theta, rotary, unscaled = table
    cos, sin = rope_tables(spec, buffer.shape[0], theta, rotary, unscaled)
    return cos if which == "cos" else sin


class EmulatedWeights:
    """Where a run's weights come from, one buffer (one chip's shard of one weight) at a time: the weight store
    (each shard cut from the full tensor as the split program states it) or a build's device image files
    (`weights.bin` / `weights.chip<N>.bin`, read through a memory map, bf16 as bit patterns). Nothing is kept on
    the host: a device uploads each shard and keeps only its device copy."""

    def __init__(self, store: Any, image: str, chips: int, folder: Any = None):
        self.store, self.image, self.chips, self.folder = store, image, chips, folder
        self._index: dict[int, dict[str, Any]] = {}

    def share(self, chip: int, buffer: Buffer) -> np.ndarray:
        """This chip's values of `buffer`: f32, or for a bf16 buffer its uint16 bit patterns, or for a weight read as
        stored its blocks' units (from the build's image or from the store, which reads only this share, through
        its file's memory map where it has one)."""
        if self.folder is not None:
            return self._from_image(chip, buffer)
        if buffer.element in UNIT_BYTES:  # a weight read as stored: its blocks' bytes, in units
            return stored_share(self.store, buffer.name, buffer.shape, buffer.element, chip, self.chips)
        element = "bf16" if buffer.element == "bf16" else "f32"
        return weight_share(self.store, buffer.name, buffer.shape, chip, self.chips, element)

    def _from_image(self, chip: int, buffer: Buffer) -> np.ndarray:
        name = "weights.bin" if self.chips == 1 else f"weights.chip{chip}.bin"
        path = Path(self.folder) / name
        if chip not in self._index:
            if not path.is_file():
                raise LogosError(f"{self.folder}: the build holds no weight image {name} (build it --with-weights)")
            data = np.memmap(path, np.uint8, mode="r")
            lines = bytes(data[: cuda.HEADER_BYTES]).rstrip(b"\0").split(b"\n", 2)
            if lines[2].startswith(b"index-at-end "):
                at = cuda.HEADER_BYTES + int(lines[2].split()[1])
                index = json.loads(bytes(data[at:]).decode())
            else:
                index = json.loads(lines[2].decode())
            self._index[chip] = {"data": data, "buffers": {b["name"]: b for b in index["buffers"]}}
        found = self._index[chip]["buffers"].get(buffer.name)
        if found is None or tuple(found["shape"]) != buffer.shape or found["element"] != buffer.element:
            raise LogosError(f"{path}: holds no {buffer.element} buffer '{buffer.name}' of shape {buffer.shape}")
        count = int(np.prod(buffer.shape))
        start = cuda.HEADER_BYTES + int(found["offset"])
        kind = np.uint16 if buffer.element == "bf16" else np.dtype("<f4")
        if buffer.element in UNIT_BYTES:
            kind = np.dtype("<u2" if UNIT_BYTES[buffer.element] == 2 else "<u4")
        size = count * np.dtype(kind).itemsize
        return np.frombuffer(self._index[chip]["data"][start : start + size], kind).reshape(buffer.shape)
