"""The fabric: where each element's wavelets on each colour go (`trace_routes`, through the layout's router
configurations, hop by hop), each element's input queue for each colour (a ring of 32-bit wavelets, each with the
cycle it arrives), and sending and receiving on them (`Wavelets`, the part of `elements.Fabric` that moves
wavelets): a send waits while its route is broken or a receiver's queue is full, a receive takes its wavelets in
order, and a receiver waiting for them goes back to run when they come.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from xdsl.dialects import arith, csl
from xdsl.ir import SSAValue

from logos_ir.passes.spatial.verify_grid import Layout
from logos_ir.runtime.spatial import CYCLES, QUEUE_DEPTH, FabricError
from logos_ir.runtime.spatial.state import FabricState

_STEP = {"EAST": (1, 0), "WEST": (-1, 0), "NORTH": (0, -1), "SOUTH": (0, 1)}
_OPPOSITE = {"EAST": "WEST", "WEST": "EAST", "NORTH": "SOUTH", "SOUTH": "NORTH"}


@dataclass
class Routes:
    """Where each element's wavelets on each colour arrive: for colour c, `dest[c]` is [elements, fan-out] of
    element indices (-1: none) with `hops[c]` the routers crossed; `broken[c][e]` says where a sender's wavelets
    stop."""

    dest: dict[int, np.ndarray]
    hops: dict[int, np.ndarray]
    broken: dict[int, dict[int, str]]
    stuck: dict[int, np.ndarray] = field(default_factory=dict)  # [elements]: the sender's wavelets stop somewhere


def trace_routes(layout: Layout, colours: Sequence[int]) -> Routes:
    width, height = layout.width, layout.height
    n = width * height
    dest, hops, broken = {}, {}, {}
    for c in colours:
        found: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        stops: dict[int, str] = {}
        for sx in range(width):
            for sy in range(height):
                s = sy * width + sx
                if (sx, sy, c) not in layout.routes:
                    continue
                rx, _ = layout.routes[(sx, sy, c)]
                if "RAMP" not in rx:
                    continue
                stop = _follow(layout, c, sx, sy, found[s])
                if stop:
                    stops[s] = stop
        fan = max((len(f) for f in found), default=0) or 1
        d = np.full((n, fan), -1, dtype=np.int64)
        h = np.zeros((n, fan), dtype=np.int64)
        for s, targets in enumerate(found):
            for k, (t, hop) in enumerate(targets):
                d[s, k], h[s, k] = t, hop
        dest[c], hops[c], broken[c] = d, h, stops
    stuck = {}
    for c in colours:
        mask = np.zeros(n, dtype=bool)
        mask[list(broken[c])] = True
        stuck[c] = mask
    return Routes(dest, hops, broken, stuck)


def _follow(layout: Layout, colour: int, sx: int, sy: int, out: list[tuple[int, int]]) -> str:
    """Follow colour's wavelets from element (sx, sy)'s ramp; append (element, hops) for each delivery; return
    where they stop ('' if nowhere)."""
    width = layout.width
    frontier = [(sx, sy, "RAMP", 0)]
    seen = set()
    while frontier:
        x, y, came, hop = frontier.pop()
        if (x, y, came) in seen:
            return f"colour {colour} loops at element ({x}, {y})"
        seen.add((x, y, came))
        config = layout.routes.get((x, y, colour))
        if config is None or came not in config[0]:
            return f"element ({x}, {y}) has no route for colour {colour} from {came}"
        for direction in config[1]:
            if direction == "RAMP":
                if (x, y) != (sx, sy) or came != "RAMP":
                    out.append((y * width + x, hop))
                continue
            dx, dy = _STEP[direction]
            nx, ny = x + dx, y + dy
            if not (0 <= nx < layout.width and 0 <= ny < layout.height):
                return f"colour {colour} leaves the grid at element ({x}, {y}) going {direction}"
            frontier.append((nx, ny, _OPPOSITE[direction], hop + 1))
    return ""


@dataclass
class FabDsd:
    """A fabric DSD: `extent` wavelets on `colour`, into (`inbound`) or out of the element."""

    colour: int
    inbound: bool
    extent: np.ndarray
    static: int | None = None  # the extent when it is a constant of the program
    queue: int = -1  # its input or output queue
    param: np.ndarray | None = None  # each element's value of the colour parameter it prints as (csl_ext.colour_param)


@dataclass
class Blocked:
    element: int
    colour: int | None
    op: str
    why: str


class Wavelets(FabricState):
    """The fabric's side of `elements.Fabric`: routes traced, queues made, wavelets sent and received."""

    def _connect(self, queue_words: int | None) -> None:
        """Trace each colour's routes and make every element's queue for it (once the program is loaded: a queue
        holds at least twice the longest message, unless `queue_words` says)."""
        n = self.n
        colours = sorted({c for (_, _, c) in self.layout.routes} | self._colours_used())
        self.routes = trace_routes(self.layout, colours)
        self._shared = {}  # whether some receiver is reached by two senders on the colour
        self._route_ok = {  # whether the element's wavelets on the colour reach a receiver (and stop nowhere)
            c: (self.routes.dest[c] >= 0).any(axis=1) & ~self.routes.stuck[c] for c in colours
        }
        self._single = {c: self.routes.dest[c][:, 0] if self.routes.dest[c].shape[1] == 1 else None for c in colours}
        self._hops_single = {c: self.routes.hops[c][:, 0] for c in colours}
        for c in colours:
            reached = self.routes.dest[c][self.routes.dest[c] >= 0]
            self._shared[c] = bool(reached.size) and np.unique(reached).size != reached.size
        cap = queue_words or max(64, 2 * self._longest_message())
        self.queue = {c: np.zeros((cap, n), dtype=np.float32) for c in colours}  # [slot, element]: rings
        self.queue_len = {c: np.zeros(n, dtype=np.int64) for c in colours}
        self.queue_head = {c: np.zeros(n, dtype=np.int64) for c in colours}  # a ring: where the oldest wavelet is
        # each wavelet's arrival (the cycle its message's last wavelet reaches the receiver's router)
        self.queue_time = {c: np.zeros((cap, n)) for c in colours}
        self._lane = np.arange(cap)
        self.capacity = cap  # the ring's size (the simulator's store); the hardware's room is `depth`
        self.queue_depth = QUEUE_DEPTH
        self._unbound = {}
        if self.queue_binding:  # a WSE-3: an element takes a colour's wavelets only into a queue bound to it
            inputs = [c for (inbound, _), c in self.queue_binding.items() if inbound]
            for c in colours:
                self._unbound[c] = (
                    ~np.logical_or.reduce([bound == c for bound in inputs]) if inputs else np.ones(n, bool)
                )

    def _check_bound(self, receivers: np.ndarray, colour: int) -> None:
        """A wavelet on `colour` reaching an element's ramp goes into the input queue bound to that colour there; an
        element binding none faults (the wavelets have nowhere to go), naming the element and the colour."""
        unbound = self._unbound.get(colour)
        if unbound is None:
            return
        bad = unbound[receivers]
        if bad.any():
            e = int(receivers[bad][0])
            raise FabricError(
                f"element ({self.xs[e]}, {self.ys[e]}) receives wavelets on colour {colour}, and binds no input queue "
                "to that colour (@initialize_queue): they have nowhere to go"
            )

    def _colours_used(self) -> set[int]:
        return {op.fabric_color.value.data for op in self.program.walk() if isinstance(op, csl.GetFabDsdOp)}

    def _longest_message(self) -> int:
        """The most wavelets one fabric DSD moves: its constant extent, or, for an extent known only at run time (a
        reduction function's argument), the size of the arrays whose memory DSDs take the same extent."""
        longest = 1
        runtime_extents: set[SSAValue] = set()
        for op in self.program.walk():
            if isinstance(op, csl.GetFabDsdOp):
                size = op.sizes[0].owner
                if isinstance(size, arith.ConstantOp):
                    longest = max(longest, size.value.value.data)  # type: ignore[attr-defined]
                else:
                    runtime_extents.add(op.sizes[0])
        for op in self.program.walk():
            if isinstance(op, csl.GetMemDsdOp) and op.sizes[0] in runtime_extents:
                longest = max(longest, self.memory[self._array_of(op.base_addr)].shape[0])
        return longest

    def _receive(self, reg: FabDsd, idx: np.ndarray, length: int) -> np.ndarray:
        """`length` wavelets taken from the queues of receivers `idx` for the DSD's colour (each element's oldest
        first); the op's latest arrival (`_arrived`) follows them."""
        c = reg.colour
        queue, head, count = self.queue[c], self.queue_head[c], self.queue_len[c]
        heads = head[idx]
        first = int(heads[0])
        if first + length <= self.capacity and (heads == first).all():
            data = queue[first : first + length, idx]
            arrived = self.queue_time[c][first : first + length, idx].max(axis=0)
        else:
            at = (heads[None, :] + self._lane[:length, None]) % self.capacity
            data = queue[at, idx[None, :]]
            arrived = self.queue_time[c][at, idx[None, :]].max(axis=0)
        left = count[idx] - length
        count[idx] = left
        head[idx] = np.where(left == 0, 0, (heads + length) % self.capacity)  # an emptied queue starts at 0
        self._arrived = np.maximum(self._arrived, arrived)
        return data

    def _can_send(self, idx: np.ndarray, colour: int, length: int, kind: str, ready: np.ndarray) -> np.ndarray:
        """Which of the senders `idx` can send `length` wavelets on `colour` now: their route reaches a receiver
        (else they wait for ever: the deadlock names where the wavelets stop), every receiver's queue has room,
        and no other sender of this step delivers to the same receiver (that one goes next time)."""
        dest = self.routes.dest.get(colour)
        if dest is None:
            self._note_send(idx, colour, kind, f"colour {colour} has no route at all")
            return np.zeros(idx.size, dtype=bool)
        single = self._single[colour]
        if single is not None and not self._shared[colour] and self._route_ok[colour][idx].all():
            # the common case, in fewer steps: one receiver each, no two senders to one, every route whole
            room = self.room(single[idx], colour, length)
            if room.all():
                return np.ones(idx.size, dtype=bool)
        targets = dest[idx]
        valid = targets >= 0
        ok = valid.any(axis=1) & ~self.routes.stuck[colour][idx]
        if (~ok).any():
            e = int(idx[~ok][0])
            why = (
                self.routes.broken[colour].get(e)
                or f"element ({self.xs[e]}, {self.ys[e]}) has no route for colour {colour} from RAMP"
            )
            self._note_send(np.array([e]), colour, kind, why)
        room = np.where(valid, self.room(np.maximum(targets, 0), colour, length), True).all(axis=1)
        if (~room & ok).any():
            self._note_send(
                idx[~room & ok],
                colour,
                kind,
                f"the receiver's queue for colour {colour} holds {self.queue_depth} wavelets, not {length}, and the "
                "receiver is not taking them",
            )
        ok &= room
        going = ok & ready
        if not self._shared[colour]:  # no two senders' routes reach one receiver on this colour
            return ok
        flat = np.where(valid & going[:, None], targets, -1).reshape(-1)
        real = flat[flat >= 0]
        if real.size and np.unique(real).size != real.size:  # two senders to one receiver: the first goes now
            seen: set[int] = set()
            for k in np.flatnonzero(going):
                mine = {int(t) for t in targets[k][valid[k]]}
                if mine & seen:
                    ok[k] = False
                seen |= mine
        return ok

    def room(self, receivers: np.ndarray, colour: int, length: int) -> np.ndarray:
        """Whether each receiver takes `length` more wavelets on `colour` now: its queue holds them (the hardware's
        depth), or it waits at a receive on the colour and takes them as they come (the ring holds them)."""
        count = self.queue_len[colour][receivers]
        fits = count + length <= self.queue_depth
        taking = (self.receiving[receivers] == colour) & (count + length <= self.capacity)
        return fits | taking

    def streamed_end(self, receivers: np.ndarray, colour: int, length: int) -> np.ndarray:
        """The earliest cycle a send of `length` wavelets to each receiver can end: the wavelets past the room its
        queue has wait until the receiver takes them, from the cycle it began waiting at its receive."""
        over = self.queue_len[colour][receivers] + length - self.queue_depth
        return np.where(over > 0, self.clock[receivers] + over * CYCLES["dsd_element"], -np.inf)

    def _note_send(self, idx: np.ndarray, colour: int, op: str, why: str) -> None:
        if idx.size:
            e = int(idx[0])
            self.waiting[e] = Blocked(e, colour, op, "cannot send: " + why)

    def _send(self, idx: np.ndarray, colour: int, data: np.ndarray) -> None:
        """Senders `idx` each send their row of `data` on `colour`: every receiver its route reaches gets the
        wavelets at the end of its queue, each arriving at the sender's clock plus the routers crossed."""
        dest, hops = self.routes.dest[colour][idx], self.routes.hops[colour][idx]
        length = data.shape[0]
        if dest.shape[1] == 1:
            valid = dest[:, 0] >= 0
            if valid.all():
                targets, rows, hop, senders = dest[:, 0], data, hops[:, 0], idx
            else:
                targets, rows, hop, senders = dest[valid, 0], data[:, valid], hops[valid, 0], idx[valid]
        else:
            which, k = np.nonzero(dest >= 0)
            targets, rows, hop, senders = dest[which, k], data[:, which], hops[which, k], idx[which]
        if targets.size == 0:
            return
        self._check_bound(targets, colour)
        queue, times, head, count = (
            self.queue[colour],
            self.queue_time[colour],
            self.queue_head[colour],
            self.queue_len[colour],
        )
        start = head[targets] + count[targets]
        ends = self.streamed_end(targets, colour, length)  # a message longer than the room: sent as it is taken
        if (ends > -np.inf).any():
            np.maximum.at(self.clock, senders, ends)
        arrival = self.clock[senders] + hop * CYCLES["hop"]  # the last wavelet, sent at the op's end
        first = int(start[0])
        if first + length <= self.capacity and (start == first).all():
            queue[first : first + length, targets] = rows
            times[first : first + length, targets] = arrival[None, :]
        else:
            at = (start[None, :] + self._lane[:length, None]) % self.capacity
            queue[at, targets[None, :]] = rows
            times[at, targets[None, :]] = arrival[None, :]
        count[targets] += length
        self.wavelets += targets.size * length
        self._wake(targets, colour)

    def _wake(self, targets: np.ndarray, colour: int) -> None:
        """Receivers waiting for wavelets on `colour` that now have them go back to run."""
        waiting = self.park_colour[targets] == colour
        if not waiting.any():
            return
        some = targets[waiting]
        some = some[self.queue_len[colour][some] >= self.park_need[some]]
        if some.size:
            some = np.sort(some)
            self.park_colour[some] = -1
            self._add_many(some)
