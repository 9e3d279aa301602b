"""The spatial lane's simulator: runs the `spatial` programs of a decode step's parts, element by element, and counts
the cycles a grid of processing elements would take.

Every op of a region runs on the elements its layout or rectangle names, vectorised over those elements with numpy:
an array's leading axes are the elements (a matrix-vector product's weights are [tile rows of elements, tile columns
of elements, tile rows, tile columns]; a vector is [elements, tile]), and an element computes only with the tiles it
holds and the words routed to it. A product's partial sums, a norm's sums of squares, an attention's running
(maximum, sum, weighted values) and an argmax's (value, index) pairs are combined one element after another along
their line, in the order the fabric would deliver them. Activations move from region to region as the `send` of one
and the `receive` of the next; only those words cross between regions.

Numbers: f32 weights compute in f32. f16 weights (as the hardware computes) hold every weight and KV-cache entry
rounded to f16, round a product's input vector to f16 and accumulate in f32 (the mixed-precision multiply-accumulate
of the hardware; a product of two f16 values is exact in f32, so holding f16 values in f32 arrays is exact);
norms, rotations, softmax and the residual stream stay f32.

The cycle model (`logos_ir.passes.spatial.cost`, stated in docs/spatial.md): each element does `macs` multiply-
accumulates per cycle (4 in f16, 1 in f32), each link carries one 32-bit word per cycle, each hop costs a cycle; an
op's cycles are its broadcast, its compute on the busiest element and its reduction along its line; a token's cycles
are the sum over every op of every region, as one token crosses them in turn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.ir import Operation, SSAValue

from logos_ir.dialects import spatial as sp
from logos_ir.errors import LogosError
from logos_ir.generate import StepGenerator, default_ctx
from logos_ir.interpreter import rope_inv_freq
from logos_ir.passes.spatial.cost import CycleModel, manhattan, op_cost
from logos_ir.program import Identity
from logos_ir.spec import RopeScaling
from logos_ir.weights import WeightStore

_F32 = np.float32
Env = dict[SSAValue, Any]


@dataclass
class Counters:
    """What the simulated grid did: cycles, words that crossed between regions, word-hops inside regions."""

    cycles: int = 0
    words_between: int = 0
    word_hops_inside: int = 0
    tokens: int = 0

    def add(self, cycles: int = 0, between: int = 0, inside: int = 0) -> None:
        self.cycles += cycles
        self.words_between += between
        self.word_hops_inside += inside


def _f16(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float16).astype(_F32)


def _chain_sum(partial: np.ndarray, axis: int) -> np.ndarray:
    """Sum along `axis` one element after another, as a chain reduction on the fabric adds them."""
    moved = np.moveaxis(partial, axis, 0)
    total = moved[0].copy()
    for k in range(1, moved.shape[0]):
        total += moved[k]
    return total


def tiles_of(array: np.ndarray, rows: int, columns: int, ey: int, ex: int) -> np.ndarray:
    """A [R, C] matrix as [ey, ex, rows, columns] tiles (zero-padded): tile (i, j) is element (j, i)'s."""
    padded = np.zeros((ey * rows, ex * columns), dtype=_F32)
    padded[: array.shape[0], : array.shape[1]] = array
    return np.ascontiguousarray(padded.reshape(ey, rows, ex, columns).transpose(0, 2, 1, 3))


def vector_tiles(values: np.ndarray, n: int, tile: int) -> np.ndarray:
    padded = np.zeros(n * tile, dtype=_F32)
    padded[: values.size] = values.reshape(-1)
    return padded.reshape(n, tile)


def flat(values: np.ndarray, width: int) -> np.ndarray:
    return values.reshape(-1)[:width]


# -- one region ---------------------------------------------------------------------------------------------------


class RegionRun:
    """One region's program, compiled once into steps over an environment of values; `run` executes it for one token
    given what the region receives, and returns what it sends."""

    def __init__(self, region: sp.RegionOp, store: WeightStore | None, model: CycleModel):
        self.region, self.model = region, model
        self.name = region.sym_name.data
        self.weights = region.weights.data
        self.macs = model.macs(self.weights)
        self.origin = np.array(sp.int_values(region.origin))
        self.store = store
        self.caches: list[np.ndarray] = []
        self.steps: list[Callable[[Env, Counters], None]] = []
        self.receives: list[sp.ReceiveOp] = []
        self.send: sp.SendOp | None = None
        self._ropes: dict[tuple[Any, ...], np.ndarray] = {}
        for op in region.body.block.ops:
            self.steps.append(self._compile(op))

    def reset(self) -> None:
        for cache in self.caches:
            cache.fill(0)

    def run(self, inputs: dict[str, Any], counters: Counters) -> np.ndarray:
        env: Env = {}
        self._inputs = inputs
        for step in self.steps:
            step(env, counters)
        assert self.send is not None
        return env[self.send.input]

    # -- compiling ops --------------------------------------------------------------------------------------------

    def _compile(self, op: Operation) -> Callable[[Env, Counters], None]:
        method = getattr(self, "_" + op.name.removeprefix("spatial."), None)
        if method is None:
            raise LogosError(f"spatial simulator: region @{self.name} holds '{op.name}', which it does not run")
        return method(op)

    def _weight(self, op: sp.PlaceOp) -> np.ndarray:
        if self.store is None:
            raise LogosError("spatial simulator: a run needs the weights")
        array = np.asarray(self.store.get(op.tensor.data), dtype=_F32)
        if self.weights == "f16":
            array = _f16(array)
        rows, columns = sp.int_values(op.shape)
        tile_rows, tile_columns = sp.int_values(op.tile)
        rect = op.rect
        if rows == 1:
            return vector_tiles(array, rect.w * rect.h, tile_columns)
        return tiles_of(array.reshape(rows, columns), tile_rows, tile_columns, rect.h, rect.w)

    def _place(self, op: sp.PlaceOp) -> Callable[[Env, Counters], None]:
        tiles = self._weight(op)

        def step(env: Env, counters: Counters) -> None:
            env[op.result] = tiles

        return step

    def _cache(self, op: sp.CacheOp) -> Callable[[Env, Counters], None]:
        kv_heads, _, head_dim = sp.int_values(op.shape)
        rect = op.rect
        cache = np.zeros((kv_heads, rect.w, op.block.value.data, head_dim), dtype=_F32)
        self.caches.append(cache)

        def step(env: Env, counters: Counters) -> None:
            env[op.result] = cache

        return step

    def _receive(self, op: sp.ReceiveOp) -> Callable[[Env, Counters], None]:
        self.receives.append(op)
        kind, layout = op.kind.data, op.layout

        def step(env: Env, counters: Counters) -> None:
            value = self._inputs[kind]
            env[op.result] = value if kind != "hidden" else vector_tiles(value, layout.n, layout.tile)

        return step

    def _send(self, op: sp.SendOp) -> Callable[[Env, Counters], None]:
        self.send = op
        width = sp.shape_of(op.input)[-1]

        def step(env: Env, counters: Counters) -> None:
            value = env[op.input]
            env[op.input] = flat(value, width) if value.ndim == 2 else value

        return step

    def _route(self, op: sp.RouteOp) -> Callable[[Env, Counters], None]:
        width = sp.shape_of(op.input)[-1]
        target = op.layout
        cycles, hops = op_cost(op, self.model, self.weights)

        def step(env: Env, counters: Counters) -> None:
            env[op.result] = vector_tiles(flat(env[op.input], width), target.n, target.tile)
            counters.add(cycles, inside=hops)

        return step

    def _matvec(self, op: sp.MatvecOp) -> Callable[[Env, Counters], None]:
        f16 = self.weights == "f16"
        cycles, hops = op_cost(op, self.model, self.weights)

        def step(env: Env, counters: Counters) -> None:
            x = env[op.input]  # [ex, tile columns]: tile j on the top row's element j, sent down column j
            if f16:
                x = _f16(x)
            partial = np.matmul(env[op.weight], x[None, :, :, None])[..., 0]  # each element: its tile times its x
            env[op.result] = _chain_sum(partial, axis=1)  # along each row to its last element
            counters.add(cycles, inside=hops)

        return step

    def _norm(self, op: sp.NormOp) -> Callable[[Env, Counters], None]:
        width = sp.shape_of(op.input)[-1]
        eps, inv_width = _F32(op.epsilon.value.data), _F32(1.0 / width)
        cycles, hops = op_cost(op, self.model, self.weights)

        def step(env: Env, counters: Counters) -> None:
            x, weight = env[op.input], env[op.weight]
            squares = np.einsum("ij,ij->i", x, x)  # each element its own tile's
            total = _chain_sum(squares, axis=0)  # along the line, then broadcast back
            scale = _F32(1) / np.sqrt(total * inv_width + eps)
            env[op.result] = (x * scale) * weight
            counters.add(cycles, inside=hops)

        return step

    def _rope_table(self, head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
        key = (head_dim, theta, scaling)
        if key not in self._ropes:
            self._ropes[key] = rope_inv_freq(head_dim, theta, scaling)
        return self._ropes[key]

    def _rope(self, op: sp.RopeOp) -> Callable[[Env, Counters], None]:
        from logos_ir.dialects.logos import scaling_from_attr

        head_dim = op.head_dim.value.data
        scaling = None if op.scaling is None else scaling_from_attr(op.scaling)
        inv_freq = self._rope_table(head_dim, op.theta.value.data, scaling)
        layout, half = op.layout, head_dim // 2
        cycles, hops = op_cost(op, self.model, self.weights)

        def step(env: Env, counters: Counters) -> None:
            position = int(env[op.positions][0])  # the position word, passed along the line
            angles = (position - 1) * inv_freq
            cos = np.concatenate([np.cos(angles)] * 2).astype(_F32)
            sin = np.concatenate([-np.sin(angles), np.sin(angles)]).astype(_F32)
            x = env[op.input]
            heads = x.reshape(layout.n, -1, head_dim)
            swapped = np.concatenate((heads[..., half:], heads[..., :half]), axis=-1)
            env[op.result] = (heads * cos + swapped * sin).reshape(layout.n, layout.tile)
            counters.add(cycles, inside=hops)

        return step

    def _cache_write(self, op: sp.CacheWriteOp) -> Callable[[Env, Counters], None]:
        cache_op = op.cache.owner
        assert isinstance(cache_op, sp.CacheOp)
        block = cache_op.block.value.data
        f16 = self.weights == "f16"

        def step(env: Env, counters: Counters) -> None:
            position = int(env[op.positions][0])
            owner, slot = divmod(position - 1, block)
            value = env[op.input]  # [kv heads, head size], each head on its row's first element
            env[op.cache][:, owner, slot] = _f16(value) if f16 else value  # sent along the row to the block's owner
            cycles, hops = op_cost(op, self.model, self.weights, position)
            counters.add(cycles, inside=hops)

        return step

    def _attend(self, op: sp.AttendOp) -> Callable[[Env, Counters], None]:
        cache = op.cache
        kv_heads, _, head_dim = sp.int_values(cache.shape)
        block = cache.block.value.data
        layout = op.layout
        group = layout.tile // head_dim
        scale = _F32(1 / math.sqrt(head_dim))

        def step(env: Env, counters: Counters) -> None:
            position = int(env[op.positions][0])
            active = -(-position // block)  # elements whose block holds a position up to this one
            q = env[op.query].reshape(kv_heads, group, head_dim)  # sent along each row
            keys, values = env[op.keys][:, :active], env[op.values][:, :active]
            scores = np.einsum("hgd,hbjd->hbgj", q, keys) * scale
            valid = np.arange(active * block).reshape(active, block) < position
            scores = np.where(valid[None, :, None, :], scores, _F32(-np.inf))
            high = scores.max(axis=-1)  # each element: its running maximum, sum and weighted values
            weights = np.exp(scores - high[..., None])
            total = weights.sum(axis=-1)
            weighted = np.einsum("hbgj,hbjd->hbgd", weights, values)
            env[op.result] = _combine(high, total, weighted).reshape(kv_heads, layout.tile)
            cycles, hops = op_cost(op, self.model, self.weights, position)
            counters.add(cycles, inside=hops)

        return step

    def _map(self, op: sp.MapOp) -> Callable[[Env, Counters], None]:
        fn = op.fn.data
        cycles, _ = op_cost(op, self.model, self.weights)
        tanh = np.tanh

        def silu(v: np.ndarray) -> np.ndarray:
            return v * (tanh(v * _F32(0.5)) * _F32(0.5) + _F32(0.5))

        def step(env: Env, counters: Counters) -> None:
            args = [env[v] for v in op.inputs]
            if fn == "silu":
                env[op.result] = silu(args[0])
            else:
                env[op.result] = np.add(*args) if fn == "add" else np.multiply(*args)
            counters.add(cycles)

        return step

    def _embed(self, op: sp.EmbedOp) -> Callable[[Env, Counters], None]:
        place = op.table.owner
        assert isinstance(place, sp.PlaceOp)
        tile_rows = sp.int_values(place.tile)[0]

        def step(env: Env, counters: Counters) -> None:
            token = int(env[op.tokens][0])  # sent to every element of the table
            row, local = divmod(token - 1, tile_rows)
            env[op.result] = env[op.table][row, :, local, :].copy()  # that row's elements send it down
            cycles, hops = op_cost(op, self.model, self.weights, row=row)
            counters.add(cycles, inside=hops)

        return step

    def _argmax(self, op: sp.ArgmaxOp) -> Callable[[Env, Counters], None]:
        source = sp.layout_of(op.input)
        width = sp.shape_of(op.input)[-1]
        padded = np.arange(source.n * source.tile).reshape(source.n, source.tile) >= width
        cycles, hops = op_cost(op, self.model, self.weights)

        def step(env: Env, counters: Counters) -> None:
            x = np.where(padded, _F32(-np.inf), env[op.input])
            local = x.argmax(axis=1)  # each element its own tile's first greatest
            local_values = x[np.arange(source.n), local]
            best = 0
            for k in range(1, source.n):  # (value, index) pairs along the line; an equal value keeps the first
                if local_values[k] > local_values[best]:
                    best = k
            env[op.result] = np.array([best * source.tile + int(local[best]) + 1], dtype=np.int64)
            counters.add(cycles, inside=hops)

        return step


def _combine(high: np.ndarray, total: np.ndarray, weighted: np.ndarray) -> np.ndarray:
    """Combine each row's (maximum, sum, weighted values) element after element along the row: [kv, group, head]."""
    m, s, o = high[:, 0], total[:, 0], weighted[:, 0]
    for b in range(1, high.shape[1]):
        new = np.maximum(m, high[:, b])
        mine, theirs = np.exp(m - new), np.exp(high[:, b] - new)
        s = s * mine + total[:, b] * theirs
        o = o * mine[..., None] + weighted[:, b] * theirs[..., None]
        m = new
    return o / s[..., None]


# -- the whole grid ---------------------------------------------------------------------------------------------


@dataclass
class Machine:
    """Every region of a decode step on one grid, run in model order for each token."""

    regions: list[RegionRun]
    identities: list[Identity]
    model: CycleModel = field(default_factory=CycleModel)
    counters: Counters = field(default_factory=Counters)

    @classmethod
    def build(cls, parts: Sequence[Any], store: WeightStore, model: CycleModel | None = None) -> Machine:
        model = model or CycleModel()
        runs = [RegionRun(p.region, store, model) for p in parts]
        return cls(runs, [p.identity for p in parts], model)

    def reset(self) -> None:
        for region in self.regions:
            region.reset()
        self.counters = Counters()

    def step(self, token: int, position: int) -> int:
        """One decode step: token (from 1) at position (from 1) through every region; the next token (from 1)."""
        tokens, positions = np.array([token], dtype=np.int64), np.array([position], dtype=np.int64)
        carried: Any = tokens
        previous: RegionRun | None = None
        for region in self.regions:
            inputs = {"token": tokens, "position": positions, "hidden": carried}
            self._count_arrivals(region, previous, carried)
            carried = region.run(inputs, self.counters)
            previous = region
        self.counters.add(between=1)  # the next token, to the host and the embedding
        self.counters.tokens += 1
        return int(carried[0])

    def _count_arrivals(self, region: RegionRun, previous: RegionRun | None, carried: Any) -> None:
        for receive in region.receives:
            kind = receive.kind.data
            if kind != "hidden":
                self.counters.add(between=1)  # a token or position word from the host
                continue
            assert previous is not None and previous.send is not None
            width = sp.shape_of(receive.result)[-1]
            source, target = sp.layout_of(previous.send.input), receive.layout
            words = np.arange(width)
            a = source.elements()[words // source.tile] + previous.origin
            b = target.elements()[words // target.tile] + region.origin
            hops = manhattan(a, b)
            self.counters.add(int(hops.max()) * self.model.hop + target.tile, between=width, inside=0)


# -- generation -------------------------------------------------------------------------------------------------


class SpatialGenerator(StepGenerator):
    """Greedy generation on the simulated grid: the prompt and every new token go one at a time through the decode
    step's regions (a spatial chip holds the model in place and streams tokens through it). `image` is the weight
    image the grid holds (f16 or f32), `tile` the tile edge (0: automatic)."""

    def __init__(self, weights: WeightStore, ctx: int | None = None, image: str = "f16", tile: int = 0):
        super().__init__(weights, ctx=ctx)
        if image not in sp.WEIGHT_BYTES:
            raise LogosError(f"the spatial backend holds f16 or f32 weights, not {image}")
        self.image, self.tile = image, tile

    def machine(self, ctx: int) -> Machine:
        from logos_ir.passes.spatial.decode_step import lower_decode_step

        return Machine.build(lower_decode_step(self.spec, ctx, self.image, self.tile), self.weights)


def spatial_generator(request: Any) -> SpatialGenerator:
    """The `spatial` backend's generator for a `logos_ir.runtime.RunRequest`."""
    if request.emulate:
        raise LogosError("the spatial backend has no --emulate mode: it is a simulator already")
    if request.tp != 1:
        raise LogosError(f"the spatial backend places the model on one grid; --tp {request.tp} is not for it")
    return SpatialGenerator(request.store, ctx=request.ctx, image=request.weights)


__all__ = ["CycleModel", "Machine", "RegionRun", "SpatialGenerator", "default_ctx", "spatial_generator"]
