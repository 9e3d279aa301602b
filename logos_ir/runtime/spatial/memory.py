"""Each element's memory: the program's arrays, held as [words, elements] so that word i of every element is one row
(a DSD over a group of elements reads one block), the bytes an element needs (its arrays and an estimate of its
code, `dialects/csl_ext.py`'s machine facts), memory DSDs read and written within their array's bounds, `memref.load`
and `memref.store` compiled, and the host's memcpy into and out of the exported arrays (`Memory`, the part of
`elements.Fabric` that holds the arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.dialects import csl, memref
from xdsl.ir import SSAValue

from logos_ir.dialects import csl_ext
from logos_ir.runtime.spatial import CYCLES, MEMCPY_WEST, FabricError
from logos_ir.runtime.spatial.state import FabricState


@dataclass
class MemDsd:
    """A memory DSD held by each element: array[offset + stride * i] for i < length."""

    array: str
    offset: np.ndarray
    length: np.ndarray
    stride: np.ndarray
    # (offset, length, stride) when they are constants of the program (the same for every element): the arrays are
    # then not used
    static: tuple[int, int, int] | None = None


_DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int64, "i16": np.int64, "ui16": np.int64}


def dtype_of(type_: Any) -> Any:
    """The numpy type that holds a value of MLIR type `type_` (f32, f16; i1 as bool; every integer as int64)."""
    text = str(type_)
    if text in ("f32", "f16"):
        return _DTYPES[text]
    if text == "i1":
        return np.bool_
    return np.int64


class Memory(FabricState):
    """The memory side of `elements.Fabric`: arrays allocated, DSDs over them, loads, stores and memcpy."""

    def element_bytes(self) -> tuple[int, int]:
        """(array bytes, code bytes) of every element: the program's arrays (`csl_ext.element_bytes` each) and its
        code (`csl_ext.code_bytes`, an estimate: the SDK publishes no code size per builtin)."""
        arrays = sum(a.shape[0] * csl_ext.element_bytes(self.array_types[name]) for name, a in self.memory.items())
        return arrays, csl_ext.code_bytes(self.program)

    def _allocate(self, op: memref.GlobalOp) -> None:
        """A global of the program: an array of its words for every element, [words, elements] (word i of every
        element together: a DSD over all elements reads one contiguous block)."""
        shape = op.type.get_shape()  # type: ignore[union-attr]
        element_type = str(op.type.get_element_type())  # type: ignore[union-attr]
        self.memory[op.sym_name.data] = np.zeros(
            (int(np.prod(shape)), self.n), dtype=_DTYPES.get(element_type, np.float32)
        )
        self.array_types[op.sym_name.data] = element_type

    def _array_of(self, value: SSAValue) -> str:
        op = value.owner
        if isinstance(op, csl.AddressOfOp):
            return self._array_of(op.value)
        if isinstance(op, memref.GetGlobalOp):
            return op.name_.root_reference.data
        raise FabricError(f"the fabric simulator cannot tell which array '{value}' is")

    def _compile_load(self, op: memref.LoadOp) -> None:
        at = len(self.instrs)
        name = self._array_of(op.memref)
        index = self._reg(op.indices[0])
        out = self._reg(op.res)

        clock, n, cost = self.clock, self.n, CYCLES["scalar"]

        def run(idx: np.ndarray) -> int:
            array = self.memory[name]
            rows = slice(None) if idx.size == n else idx
            where = index[rows]
            first = int(where[0])
            if 0 <= first < array.shape[0] and (where == first).all():
                out[rows] = array[first, rows]
            else:
                self._bounds(idx, where, array.shape[0], name, "a load")
                out[rows] = array[where, idx]
            clock[rows] += cost
            return at + 1

        self._emit("load", run)

    def _compile_store(self, op: memref.StoreOp) -> None:
        at = len(self.instrs)
        name = self._array_of(op.memref)
        index, value = self._reg(op.indices[0]), self._reg(op.value)

        clock, n, cost = self.clock, self.n, CYCLES["scalar"]

        def run(idx: np.ndarray) -> int:
            array = self.memory[name]
            rows = slice(None) if idx.size == n else idx
            where = index[rows]
            first = int(where[0])
            if 0 <= first < array.shape[0] and (where == first).all():
                array[first, rows] = value[rows]
            else:
                self._bounds(idx, where, array.shape[0], name, "a store")
                array[where, idx] = value[rows]
            clock[rows] += cost
            return at + 1

        self._emit("store", run)

    def _bounds(self, idx: np.ndarray, where: np.ndarray, words: int, name: str, what: str) -> None:
        bad = (where < 0) | (where >= words)
        if bad.any():
            e = int(idx[np.argmax(bad.any(axis=0) if bad.ndim == 2 else bad)])  # where: [words, elements] or [elements]
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}): {what} reaches outside the array '{name}' of {words} words"
            )

    def _uniform(self, reg: MemDsd, idx: np.ndarray, length: int, words: int, what: str) -> slice | None:
        """The DSD as one slice when every element of `idx` has the same offset and stride (the common case: the
        elements of a group run the same code on the same addresses), checked against the array's bounds."""
        if reg.static is not None:
            first, _, stride = reg.static
        else:
            offsets, strides = reg.offset[idx], reg.stride[idx]
            first, stride = int(offsets[0]), int(strides[0])
            if stride <= 0 or (offsets != first).any() or (strides != stride).any():
                return None
        if stride <= 0:
            return None
        last = first + stride * (length - 1)
        if first < 0 or last >= words:
            e = int(idx[0])
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}): {what} reaches outside the array '{reg.array}' of {words} words"
            )
        return slice(first, last + 1, stride)

    def _rows(self, idx: np.ndarray) -> slice | np.ndarray:
        """All elements as a slice (no copy) when `idx` is every element in order."""
        if idx.size == self.n and idx[0] == 0 and idx[-1] == self.n - 1:
            return slice(None)
        return idx

    def _read_memory(self, reg: MemDsd, idx: np.ndarray, length: int) -> np.ndarray:
        """The `length` words a memory DSD reads on each element of `idx`: [length, elements]."""
        array = self.memory[reg.array]
        span = self._uniform(reg, idx, length, array.shape[0], "a DSD")
        if span is not None:
            return array[span, self._rows(idx)]
        where = reg.offset[None, idx] + reg.stride[None, idx] * self._lane[:length, None]
        self._bounds(idx, where, array.shape[0], reg.array, "a DSD")
        return array[where, idx[None, :]]

    def _write(self, value: SSAValue, idx: np.ndarray, data: np.ndarray, kind: str) -> None:
        reg = self.regs[value]
        array = self.memory[reg.array]
        length = data.shape[0]
        span = self._uniform(reg, idx, length, array.shape[0], f"@{kind}'s destination")
        if span is not None:
            array[span, self._rows(idx)] = data
            return
        where = reg.offset[None, idx] + reg.stride[None, idx] * self._lane[:length, None]
        self._bounds(idx, where, array.shape[0], reg.array, f"@{kind}'s destination")
        array[where, idx[None, :]] = data.astype(array.dtype)

    def memcpy_h2d(self, symbol: str, data: np.ndarray) -> None:
        """Write `data` ([height, width, words], or [words] for every element) into each element's exported array;
        its cycles (`_memcpy_cost`) added to `memcpy_cycles`."""
        array = self._exported(symbol)
        values = np.asarray(data)
        if values.ndim == 1:
            array[: values.size, :] = values.astype(array.dtype)[:, None]
            self.memcpy_cycles += self._memcpy_cost(values.size * self.n, self.width)
            return
        flat = values.reshape(self.n, -1)
        if flat.shape[1] > array.shape[0]:
            raise FabricError(f"memcpy_h2d: {flat.shape[1]} words for '{symbol}' of {array.shape[0]} per element")
        array[: flat.shape[1], :] = flat.T.astype(array.dtype)
        self.memcpy_cycles += self._memcpy_cost(flat.size, self.width)

    def _memcpy_cost(self, wavelets: int, columns: int) -> float:
        return memcpy_cost(wavelets, columns, self.channels)

    def memcpy_d2h(self, symbol: str, x: int, y: int, width: int, height: int, words: int) -> np.ndarray:
        """[height, width, words] read from the exported array of the elements of a rectangle; its cycles added to
        `memcpy_cycles`."""
        self.memcpy_cycles += self._memcpy_cost(width * height * words, x + width)
        array = self._exported(symbol)
        rows = []
        for j in range(y, y + height):
            rows.append(array[:words, j * self.width + x : j * self.width + x + width].T)
        return np.stack(rows).astype(np.float32)

    def _exported(self, symbol: str) -> np.ndarray:
        name = self.exports.get(symbol)
        if name is None or name not in self.memory:
            raise FabricError(f"memcpy: the program exports no array '{symbol}'")
        return self.memory[name]


def memcpy_cost(wavelets: int, columns: int, channels: int = 1) -> float:
    """memcpy's cycles for `wavelets` to or from a rectangle `columns` wide: one wavelet a cycle on each channel
    (the build's --channels=1), plus the hops between memcpy's west columns and the farthest column."""
    return wavelets * CYCLES["memcpy_wavelet"] / channels + (columns + MEMCPY_WEST) * CYCLES["hop"]
