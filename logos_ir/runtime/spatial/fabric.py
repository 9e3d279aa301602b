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

_EXACT = 1 << 24  # f32 holds every whole number of cycles below this exactly

_STEP = {"EAST": (1, 0), "WEST": (-1, 0), "NORTH": (0, -1), "SOUTH": (0, 1)}
_OPPOSITE = {"EAST": "WEST", "WEST": "EAST", "NORTH": "SOUTH", "SOUTH": "NORTH"}


@dataclass
class Routes:
    """Where each element's wavelets on each colour arrive: for colour c, element e's targets are row `row[c][e]` of
    `dest[c]` ([senders + 1, fan-out] element indices, -1: none) with `hops[c]` the routers crossed; row 0 is the
    empty one, every element that sends nothing on c points there (a broadcast's fan-out is a whole line and only
    the line's root sends: a row for every element would be W H x W words). `broken[c][e]` says where a sender's
    wavelets stop."""

    row: dict[int, np.ndarray]
    dest: dict[int, np.ndarray]
    hops: dict[int, np.ndarray]
    broken: dict[int, dict[int, str]]
    stuck: dict[int, np.ndarray] = field(default_factory=dict)  # [elements]: the sender's wavelets stop somewhere

    def targets(self, colour: int, senders: np.ndarray) -> np.ndarray:
        """[senders, fan-out]: the elements each sender's wavelets on `colour` reach (-1: none)."""
        return self.dest[colour][self.row[colour][senders]]

    def hops_of(self, colour: int, senders: np.ndarray) -> np.ndarray:
        """[senders, fan-out]: the routers each of their wavelets crosses."""
        return self.hops[colour][self.row[colour][senders]]

    def every(self, colour: int, table: dict[int, np.ndarray]) -> np.ndarray:
        """`table`'s rows for every element ([elements, fan-out]): for a colour of fan-out 1 only (a vector)."""
        return table[colour][self.row[colour]]


def trace_routes(layout: Layout, colours: Sequence[int]) -> Routes:
    width, height = layout.width, layout.height
    n = width * height
    row, dest, hops, broken = {}, {}, {}, {}
    for c in colours:
        found: dict[int, list[tuple[int, int]]] = {}
        stops: dict[int, str] = {}
        for sx in range(width):
            for sy in range(height):
                s = sy * width + sx
                if (sx, sy, c) not in layout.routes:
                    continue
                rx, _ = layout.routes[(sx, sy, c)]
                if "RAMP" not in rx:
                    continue
                out: list[tuple[int, int]] = []
                stop = _follow(layout, c, sx, sy, out)
                if out:
                    found[s] = out
                if stop:
                    stops[s] = stop
        fan = max((len(f) for f in found.values()), default=0) or 1
        r = np.zeros(n, dtype=np.int64)
        d = np.full((len(found) + 1, fan), -1, dtype=np.int64)
        h = np.zeros((len(found) + 1, fan), dtype=np.int64)
        for k, (s, targets) in enumerate(sorted(found.items()), start=1):
            r[s] = k
            for j, (t, hop) in enumerate(targets):
                d[k, j], h[k, j] = t, hop
        row[c], dest[c], hops[c], broken[c] = r, d, h, stops
    stuck = {}
    for c in colours:
        mask = np.zeros(n, dtype=bool)
        mask[list(broken[c])] = True
        stuck[c] = mask
    return Routes(row, dest, hops, broken, stuck)


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
        holds at least twice the longest message on its colour, unless `queue_words` says)."""
        n = self.n
        colours = sorted({c for (_, _, c) in self.layout.routes} | self._colours_used())
        self.routes = trace_routes(self.layout, colours)
        self._shared = {}  # whether some receiver is reached by two senders on the colour
        self._route_ok = {  # whether the element's wavelets on the colour reach a receiver (and stop nowhere)
            c: (self.routes.dest[c] >= 0).any(axis=1)[self.routes.row[c]] & ~self.routes.stuck[c] for c in colours
        }
        self._single = {
            c: self.routes.every(c, self.routes.dest)[:, 0] if self.routes.dest[c].shape[1] == 1 else None
            for c in colours
        }
        self._hops_single = {  # a broadcast's root sends in the general path (`_send`), which reads `hops` itself
            c: self.routes.every(c, self.routes.hops)[:, 0] if self.routes.hops[c].shape[1] == 1 else None
            for c in colours
        }
        for c in colours:
            reached = self.routes.dest[c][self.routes.dest[c] >= 0]
            self._shared[c] = bool(reached.size) and np.unique(reached).size != reached.size
        longest = self._longest_messages()
        # each colour's ring holds twice that colour's longest message (a grid's rings are most of the simulator's
        # memory: one the size of the program's longest message on every colour would not fit the 8B's grid)
        self.capacity = {c: queue_words or max(64, 2 * longest.get(c, 1)) for c in colours}
        self.queue = {c: np.zeros((self.capacity[c], n), dtype=np.float32) for c in colours}  # [slot, element]
        self.queue_len = {c: np.zeros(n, dtype=np.int64) for c in colours}
        self.queue_head = {c: np.zeros(n, dtype=np.int64) for c in colours}  # a ring: where the oldest wavelet is
        # each wavelet's arrival (the cycle its message's last wavelet reaches the receiver's router), from the
        # launch's start (`rebase`), in f32: exact for the whole-cycle costs while a launch spans under 2**24 cycles
        self.queue_time = {c: np.zeros((self.capacity[c], n), dtype=np.float32) for c in colours}
        self.epoch = 0.0
        self._lane = np.arange(max(self.capacity.values(), default=64))
        self.queue_depth = QUEUE_DEPTH
        self._unbound = {}
        if self.queue_binding:  # a WSE-3: an element takes a colour's wavelets only into a queue bound to it
            inputs = [c for (inbound, _), c in self.queue_binding.items() if inbound]
            for c in colours:
                self._unbound[c] = (
                    ~np.logical_or.reduce([bound == c for bound in inputs]) if inputs else np.ones(n, bool)
                )

    def rebase(self, epoch: float) -> None:
        """Arrival times from `epoch` (a launch's start) on: wavelets an earlier launch left in a queue keep their
        arrival cycle."""
        shift = epoch - self.epoch
        if shift:
            for c, count in self.queue_len.items():
                left = np.flatnonzero(count)
                if left.size:  # in f64, then back: the shift itself may be past what f32 holds exactly
                    times = self.queue_time[c]
                    times[:, left] = times[:, left].astype(np.float64) - shift
        self.epoch = epoch

    def check_span(self, end: float) -> None:
        """A launch ending at cycle `end`: its arrival times were exact (whole cycles under 2**24 from its start)."""
        if end - self.epoch >= _EXACT:
            raise FabricError(
                f"a launch of {end - self.epoch:.0f} cycles: the simulator keeps a wavelet's arrival in f32 from the "
                f"launch's start, exact only under {_EXACT} cycles"
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

    def _longest_messages(self) -> dict[int, int]:
        """The most wavelets one fabric DSD moves on each colour: its constant extent, or, for an extent known only
        at run time (a reduction function's argument), the size of the arrays whose memory DSDs take the same
        extent."""
        longest: dict[int, int] = {}
        runtime_extents: dict[SSAValue, set[int]] = {}
        for op in self.program.walk():
            if isinstance(op, csl.GetFabDsdOp):
                colour = op.fabric_color.value.data
                size = op.sizes[0].owner
                if isinstance(size, arith.ConstantOp):
                    longest[colour] = max(longest.get(colour, 1), size.value.value.data)  # type: ignore[attr-defined]
                else:
                    runtime_extents.setdefault(op.sizes[0], set()).add(colour)
        for op in self.program.walk():
            if isinstance(op, csl.GetMemDsdOp) and op.sizes[0] in runtime_extents:
                words = self.memory[self._array_of(op.base_addr)].shape[0]
                for colour in runtime_extents[op.sizes[0]]:
                    longest[colour] = max(longest.get(colour, 1), words)
        return longest

    def _receive(self, reg: FabDsd, idx: np.ndarray, length: int) -> np.ndarray:
        """`length` wavelets taken from the queues of receivers `idx` for the DSD's colour (each element's oldest
        first); the op's latest arrival (`_arrived`) follows them."""
        c = reg.colour
        queue, head, count = self.queue[c], self.queue_head[c], self.queue_len[c]
        heads = head[idx]
        first = int(heads[0])
        cap = self.capacity[c]
        if first + length <= cap and (heads == first).all():
            data = queue[first : first + length, idx]
            arrived = self.queue_time[c][first : first + length, idx].max(axis=0).astype(np.float64) + self.epoch
        else:
            at = (heads[None, :] + self._lane[:length, None]) % cap
            data = queue[at, idx[None, :]]
            arrived = self.queue_time[c][at, idx[None, :]].max(axis=0).astype(np.float64) + self.epoch
        left = count[idx] - length
        count[idx] = left
        head[idx] = np.where(left == 0, 0, (heads + length) % cap)  # an emptied queue starts at 0
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
        targets = self.routes.targets(colour, idx)
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
        taking = (self.receiving[receivers] == colour) & (count + length <= self.capacity[colour])
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
        dest, hops = self.routes.targets(colour, idx), self.routes.hops_of(colour, idx)
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
        arrival = self.clock[senders] + hop * CYCLES["hop"] - self.epoch  # the last wavelet, sent at the op's end
        first = int(start[0])
        cap = self.capacity[colour]
        if first + length <= cap and (start == first).all():
            queue[first : first + length, targets] = rows
            times[first : first + length, targets] = arrival[None, :]
        else:
            at = (start[None, :] + self._lane[:length, None]) % cap
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
