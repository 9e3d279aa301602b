"""What the parts of `elements.Fabric` share: the grid's state, set by `Fabric.__init__` and the parts it calls
(`FabricState`, the base of every part, so each part's methods see it typed), and the methods one part calls on
another, declared here for the type checker only (each is defined by its part: `compiler`, `dsd`, `fabric`, `memory`,
`elements`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects import csl
from xdsl.ir import SSAValue

from logos_ir.passes.spatial.verify_grid import Layout


class FabricState:
    """The grid of elements' state (see `elements.Fabric`)."""

    schedule: str
    fast: bool
    # the program and its grid
    program: csl.CslModuleOp
    layout: Layout
    width: int
    height: int
    n: int
    xs: np.ndarray
    ys: np.ndarray
    # the compiled program: instructions, entries, tasks, registers, arrays
    regs: dict[SSAValue, Any]
    memory: dict[str, np.ndarray]
    array_types: dict[str, str]
    exports: dict[str, str]
    instrs: list[Callable[[np.ndarray], Any]]
    names: list[str]
    entries: dict[str, int]
    parameters: dict[str, list[np.ndarray]]
    tasks: dict[int, int]
    fixups: list[tuple[int, str]]
    pending: list[tuple[str, Callable[[np.ndarray], Any]]]
    jumps: dict[int, Callable[[], int]]
    waits: set[int]
    _simple: bool
    _threaded: list[int]
    _threaded_array: np.ndarray
    # each element's control: clock, program counter, call stack, tasks, the launch's end, what it waits for
    clock: np.ndarray
    pc: np.ndarray
    stack: np.ndarray
    depth: np.ndarray
    activated: np.ndarray
    blocked: np.ndarray
    ended: np.ndarray
    waiting: dict[int, Any]  # element: fabric.Blocked
    park_colour: np.ndarray
    park_need: np.ndarray
    groups: dict[int, list[np.ndarray]]
    _retrying: bool
    _arrived: np.ndarray
    # the fabric: routes, queues, wavelets
    routes: Any  # fabric.Routes
    _shared: dict[int, bool]
    _route_ok: dict[int, np.ndarray]
    _single: dict[int, np.ndarray | None]
    _hops_single: dict[int, np.ndarray | None]
    queue: dict[int, np.ndarray]
    queue_len: dict[int, np.ndarray]
    queue_head: dict[int, np.ndarray]
    queue_time: dict[int, np.ndarray]
    _lane: np.ndarray
    epoch: float  # the launch's start: queue_time counts from it
    capacity: dict[int, int]  # each colour's ring, in wavelets
    queue_depth: int
    receiving: np.ndarray
    # a WSE-3's @initialize_queue bindings: (input?, queue id) -> each element's colour; empty on a WSE-2
    queue_binding: dict[tuple[bool, int], np.ndarray]
    param_values: dict[str, np.ndarray]
    _unbound: dict[int, np.ndarray]  # colour -> the elements binding no input queue to it (with bindings only)
    memcpy_cycles: float
    channels: int
    wavelets: int

    if TYPE_CHECKING:

        def _emit(self, name: str, run: Callable[[np.ndarray], Any]) -> int: ...
        def _reg(self, value: SSAValue) -> np.ndarray: ...
        def _load(self, memory: int) -> None: ...
        def _array_of(self, value: SSAValue) -> str: ...
        def element_bytes(self) -> tuple[int, int]: ...
        def _read_memory(self, reg: Any, idx: np.ndarray, length: int) -> np.ndarray: ...
        def _write(self, value: SSAValue, idx: np.ndarray, data: np.ndarray, kind: str) -> None: ...
        def _connect(self, queue_words: int | None) -> None: ...
        def rebase(self, epoch: float) -> None: ...
        def check_span(self, end: float) -> None: ...
        def _receive(self, reg: Any, idx: np.ndarray, length: int) -> np.ndarray: ...
        def _can_send(self, idx: np.ndarray, colour: int, length: int, kind: str, ready: np.ndarray) -> np.ndarray: ...
        def _send(self, idx: np.ndarray, colour: int, data: np.ndarray) -> None: ...
        def room(self, receivers: np.ndarray, colour: int, length: int) -> np.ndarray: ...
        def streamed_end(self, receivers: np.ndarray, colour: int, length: int) -> np.ndarray: ...
        def _wake(self, targets: np.ndarray, colour: int) -> None: ...
        def _add_many(self, idx: np.ndarray) -> None: ...
        def _check_bound(self, receivers: np.ndarray, colour: int) -> None: ...
