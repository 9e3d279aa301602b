"""What the CUDA emulator's op compilers share: a kernel runs in lockstep over all threads of a launch, each value
of its body held in one slot of a list (`Env`: a numpy array with one element a thread, or one scalar for all), the
threads a step runs for given by a mask (`Mask`: None for every thread), each op compiled once into a `Step` that
reads and writes the list. The base ops (`emulator`) and the tensor-core ops (`tensor_core`) are compiled to this
one shape, so `KernelEmulator` runs both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Env = list[Any]
Mask = np.ndarray | None
Step = Callable[[Env, Mask], None]


def row_major_strides(kind: Any) -> tuple[int, ...]:
    """The element strides of a shaped type's dimensions, last fastest (a memref's identity layout)."""
    strides, acc = [], 1
    for size in reversed(list(kind.get_shape())):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))
