"""`convert-logos-to-cuda-kernels`: a `logos` program -> the CUDA lane's kernel level (host plan of fused kernels).

    logos-opt decode.logos -p 'convert-logos-to-cuda-kernels{weights=bf16}'

Assumes: a module holding one `logos.program` of a whole decode step, prefill chunk or batch (split over chips or
not), in the author's form: @main calls @embedding, each @layer_n and @head in order; a layer computes its
projections, rotates queries and keys, writes keys and values into its caches, attends, projects back with a
residual add, and runs SwiGLU with a residual add.

Guarantees: the program is replaced by one host function `@step` (and, when split, the program's `shard.grid`):
`cuda.buffer` ops naming every device buffer (each weight by its tensor name in the `weights` image, norm scales in
f32 whatever the image, each layer's
caches, the inputs, the output, the activations named by the value names the author gave them, so that every layer
reuses the same activation buffers, and the rotary cos/sin tables), then one kernel-level op per fused kernel in
launch order, with `shard.all_reduce` kept between kernels where the program has it, and a split head's
`shard.all_gather` (this chip's logits into the whole row, a new buffer named by the op's `cuda.buffer` attribute,
the arg-max's input). Fusions: the residual add into
the projection before it (unless an all-reduce sits between), SiLU and the product into one gate/up kernel, the key
rotation and both cache writes into one kernel, the prefill head's row pick into its RMS norm. The module records
the program's identity line (`cuda.identity`) and the weight image (`cuda.weights`). Any other cut, or a program
not in the author's form, is refused with a `PassError` naming the pass and the op, before anything is changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
    TensorType,
    f32,
    i64,
)
from xdsl.dialects.shard import AllReduceOp, GridOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from logos_ir import identity
from logos_ir.dialects import cuda, logos
from logos_ir.dialects.shard_ext import AllGatherOp
from logos_ir.errors import PassError
from logos_ir.program import Cut

NAME = "convert-logos-to-cuda-kernels"
LOWERED = ("decode", "prefill", "batch")
ATTENTION_WARPS = 4 * 132  # warps attention aims at: 4 a block over an H200's 132 SMs
ATTENTION_MIN_SPLIT = 32  # the fewest positions a split holds at a full cache
ARGMAX_CHUNK = 1024  # values one warp reduces in the first stage of the arg-max


def attention_split(kv_items: int, ctx: int) -> int:
    """The most positions a split attends at a full cache (flash-decoding): enough splits that the (row, KV head,
    split) warps fill the SMs (`ATTENTION_WARPS`), none shorter than `ATTENTION_MIN_SPLIT`. The kernel shares the
    live length over the same number of splits, so a short cache uses fewer positions a split."""
    splits = max(1, min(-(-ATTENTION_WARPS // kv_items), -(-ctx // ATTENTION_MIN_SPLIT)))
    return -(-ctx // splits)


@dataclass
class _Kernel:
    """A kernel-level op before it is built: its class, the buffers it reads and writes, its properties."""

    op: type[cuda.KernelOp]
    ins: list[str]
    outs: list[str]
    props: Mapping[str, Attribute] = field(default_factory=dict)


@dataclass
class _Reduce:
    """A `shard.all_reduce` of a buffer, in place: later readers of `result` read the reduced buffer."""

    buffer: str
    result: str


@dataclass
class _Gather:
    """A `shard.all_gather` of a buffer along `axis` into the new buffer `result` (the chips' shares in chip
    order): later readers of the gathered value read `result`."""

    buffer: str
    result: str
    axis: int


@dataclass(frozen=True)
class _Lazy:
    """A value the plan folds into the kernel that reads it: a rotation, a SiLU, a row pick."""

    kind: str
    source: SSAValue
    name: str
    index: int = 0


@dataclass
class _Buffer:
    name: str
    kind: str
    type: MemRefType


class _Plan:
    """The host plan of one program: buffers by name, then kernels (and all-reduces) in launch order."""

    def __init__(self, program: logos.ProgramOp, weights: str):
        self.program = program
        self.spec = program.spec
        self.element: Attribute = BFloat16Type() if weights == "bf16" else Float32Type()
        self.buffers: dict[str, _Buffer] = {}
        self.steps: list[_Kernel | _Reduce | _Gather] = []
        self.env: dict[SSAValue, str | _Lazy] = {}
        self.producer: dict[str, int] = {}
        self.pending_key: tuple[str, str, str] | None = None  # (rotated key source, cache, positions)
        self.grid: GridOp | None = None
        self.ctx = 1

    # -- buffers ------------------------------------------------------------------------------------------------

    def buffer(self, name: str, kind: str, kind_type: MemRefType) -> str:
        known = self.buffers.get(name)
        if known is not None and known.type != kind_type:
            return self.buffer(f"{name}.{'x'.join(str(d) for d in kind_type.get_shape())}", kind, kind_type)
        if known is None:
            self.buffers[name] = _Buffer(name, kind, kind_type)
        return name

    def activation(self, value: SSAValue, kind: str = "activation") -> str:
        shape = logos.tensor_shape(value)
        element = i64 if isinstance(cast(TensorType, value.type).element_type, IntegerType) else f32
        return self.buffer(value.name_hint or "value", kind, MemRefType(element, list(shape)))

    def of(self, value: SSAValue, op: Operation) -> str:
        found = self.env.get(value)
        if isinstance(found, str):
            return found
        raise PassError(f"{NAME}: '{op.name}' reads a value the CUDA lane cannot hold in a buffer ({found})")

    def lazy(self, value: SSAValue) -> _Lazy | None:
        found = self.env.get(value)
        return found if isinstance(found, _Lazy) else None

    def add(self, kernel: _Kernel | _Reduce | _Gather) -> None:
        self.steps.append(kernel)
        outs = kernel.outs if isinstance(kernel, _Kernel) else [kernel.result]
        for out in outs:
            self.producer[out] = len(self.steps) - 1

    def rope_tables(self) -> tuple[str, str]:
        kind_type = MemRefType(f32, [self.ctx, self.spec.head_dim])
        return self.buffer("rope.cos", "table", kind_type), self.buffer("rope.sin", "table", kind_type)

    # -- walking the program ------------------------------------------------------------------------------------

    def run(self) -> None:
        main = self.program.function("main")
        assert main is not None
        for op in self.program.body.block.ops:
            if isinstance(op, GridOp):
                self.grid = op
        for op in main.body.block.ops:
            if isinstance(op, logos.InputOp):
                self.env[op.result] = self.activation(op.result, "input")
            elif not isinstance(op, func.ReturnOp):
                self.lower(op)
        if self.pending_key is not None:
            raise PassError(f"{NAME}: a rotated key is written into a cache with no value written after it")

    def lower(self, op: Operation) -> None:
        handler = _HANDLERS.get(type(op))
        if isinstance(op, func.CallOp):
            raise PassError(
                f"{NAME}: @main calls @{op.callee.root_reference.data}: the lane lowers an inlined @main",
                hint="run inline-sections first (logos-to-cuda does)",
            )
        if handler is None:
            raise PassError(f"{NAME}: @main holds '{op.name}', which the CUDA lane does not lower")
        handler(self, op)

    # -- one handler per source op ------------------------------------------------------------------------------

    def weight(self, op: logos.WeightOp) -> None:
        shape = logos.tensor_shape(op.result)
        # Norm scales (the only 1-D weights) stay f32 in a bf16 image: a rounding of them would scale every channel
        # of every row, and they are some 0.03% of a model's bytes.
        element = self.element if len(shape) > 1 else f32
        self.env[op.result] = self.buffer(op.tensor.data, "weight", MemRefType(element, list(shape)))

    def cache(self, op: logos.CacheOp) -> None:
        shape = logos.tensor_shape(op.result)
        self.ctx = shape[-2]
        name = f"cache.{op.kind.data}.{op.layer.value.data}"
        # the cache holds the weight image's element: bf16 beside bf16 weights (half attention's bytes), f32 beside
        # f32 weights (the exact path)
        self.env[op.result] = self.buffer(name, "cache", MemRefType(self.element, list(shape)))

    def embed(self, op: logos.EmbedOp) -> None:
        out = self.activation(op.result)
        self.add(_Kernel(cuda.EmbedOp, [self.of(op.table, op), self.of(op.tokens, op)], [out]))
        self.env[op.result] = out

    def rms_norm(self, op: logos.RMSNormOp) -> None:
        row = -1
        picked = self.lazy(op.input)
        source = op.input
        if picked is not None and picked.kind == "row":
            source, row = picked.source, picked.index - 1
        out = self.activation(op.result)
        props = {"epsilon": FloatAttr(op.epsilon.value.data, f32), "row": IntegerAttr(row, i64)}
        self.add(_Kernel(cuda.RMSNormOp, [self.of(source, op), self.of(op.weight, op)], [out], props))
        self.env[op.result] = out

    def row(self, op: logos.RowOp) -> None:
        self.env[op.result] = _Lazy("row", op.input, op.result.name_hint or "row", op.index.value.data)

    def linear(self, op: logos.LinearOp) -> None:
        out = self.activation(op.result)
        self.add(_Kernel(cuda.LinearOp, [self.of(op.input, op), self.of(op.weight, op)], [out]))
        self.env[op.result] = out

    def silu(self, op: logos.SiluOp) -> None:
        self.env[op.result] = _Lazy("silu", op.input, op.result.name_hint or "silu")

    def mul(self, op: logos.MulOp) -> None:
        activated = self.lazy(op.lhs)
        if activated is None or activated.kind != "silu":
            raise PassError(f"{NAME}: 'logos.mul' is lowered only as SwiGLU's silu(gate) times up")
        gate = self._linear_of(self.of(activated.source, op), op)
        up = self._linear_of(self.of(op.rhs, op), op)
        if gate.ins[0] != up.ins[0]:
            raise PassError(f"{NAME}: 'logos.mul' multiplies projections of two different inputs")
        self.steps = [s for s in self.steps if s is not gate and s is not up]
        out = self.activation(op.result)
        self.add(_Kernel(cuda.GateUpOp, [gate.ins[0], gate.ins[1], up.ins[1]], [out]))
        self.env[op.result] = out

    def _linear_of(self, buffer: str, op: Operation) -> _Kernel:
        index = self.producer.get(buffer)
        step = self.steps[index] if index is not None and index < len(self.steps) else None
        if not isinstance(step, _Kernel) or step.op is not cuda.LinearOp or step.outs != [buffer]:
            raise PassError(f"{NAME}: '{op.name}' expects a projection feeding it, found none for '{buffer}'")
        return step

    def elementwise_add(self, op: logos.AddOp) -> None:
        out = self.activation(op.result)
        lhs, rhs = self.of(op.lhs, op), self.of(op.rhs, op)
        last = self.steps[-1] if self.steps else None
        fusable = isinstance(last, _Kernel) and last.op is cuda.LinearOp and len(last.ins) == 2
        if fusable and isinstance(last, _Kernel) and last.outs == [rhs] and op.rhs.has_one_use():
            last.ins.append(lhs)
            last.outs = [out]
            self.producer[out] = len(self.steps) - 1
        else:
            self.add(_Kernel(cuda.AddOp, [lhs, rhs], [out]))
        self.env[op.result] = out

    def rope(self, op: logos.RopeOp) -> None:
        if op.head_dim.value.data != self.spec.head_dim:
            raise PassError(f"{NAME}: 'logos.rope' rotates heads of {op.head_dim.value.data}, not the model's")
        self.env[op.result] = _Lazy("rope", op.input, op.result.name_hint or "turned")

    def cache_write(self, op: logos.CacheWriteOp) -> None:
        rotated = self.lazy(op.input)
        cache, positions = self.of(op.cache, op), self.of(op.positions, op)
        if rotated is not None and rotated.kind == "rope":
            if self.pending_key is not None:
                raise PassError(f"{NAME}: 'logos.cache_write' writes two rotated keys with no value between")
            self.pending_key = (self.of(rotated.source, op), cache, positions)
            return
        if self.pending_key is None:
            raise PassError(f"{NAME}: 'logos.cache_write' writes values before their rotated keys")
        key, keys, key_positions = self.pending_key
        self.pending_key = None
        cos, sin = self.rope_tables()
        ins = [key, self.of(op.input, op), positions, cos, sin]
        self.add(_Kernel(cuda.RopeCacheWriteOp, ins, [keys, cache]))

    def attention(self, op: logos.AttentionOp) -> None:
        query = self._rotated_query(op)
        keys, values, positions = self.of(op.keys, op), self.of(op.values, op), self.of(op.positions, op)
        rows, width = logos.tensor_shape(op.query)
        cache = logos.tensor_shape(op.keys)
        heads, split = width // cache[-1], attention_split(cache[-3] * rows, cache[-2])
        splits = -(-cache[-2] // split)
        scratch = self.buffer("attention.partial", "scratch", MemRefType(f32, [rows, heads, splits, cache[-1] + 2]))
        count = self.buffer("attention.count", "scratch", MemRefType(i64, [rows, cache[-3]]))
        out = self.activation(op.result)
        props = {"split": IntegerAttr(split, i64)}
        self.add(_Kernel(cuda.AttentionOp, [query, keys, values, positions], [out, scratch, count], props))
        self.env[op.result] = out

    def _rotated_query(self, op: logos.AttentionOp) -> str:
        rotated = self.lazy(op.query)
        if rotated is None or rotated.kind != "rope":
            return self.of(op.query, op)
        cos, sin = self.rope_tables()
        x = self.of(rotated.source, op)
        shape = self.buffers[x].type
        out = self.buffer(rotated.name, "activation", shape)
        props = {"head_dim": IntegerAttr(self.spec.head_dim, i64)}
        positions = self.of(op.positions, op)
        self.add(_Kernel(cuda.RopeOp, [x, positions, cos, sin], [out], props))
        return out

    def argmax(self, op: logos.ArgmaxOp) -> None:
        rows, width = logos.tensor_shape(op.input)
        chunks = -(-width // ARGMAX_CHUNK)
        scratch = self.buffer("argmax.partial", "scratch", MemRefType(f32, [rows, chunks, 2]))
        out = self.activation(op.result, "output")
        props = {"chunk": IntegerAttr(ARGMAX_CHUNK, i64)}
        self.add(_Kernel(cuda.ArgmaxOp, [self.of(op.input, op)], [out, scratch], props))
        self.env[op.result] = out

    def all_reduce(self, op: AllReduceOp) -> None:
        source = self.of(op.input, op)
        result = f"{source}@reduced"
        self.add(_Reduce(source, result))
        self.env[op.result] = result

    def all_gather(self, op: AllGatherOp) -> None:
        if op.grid_axes.get_values() != (0,):
            raise PassError(f"{NAME}: 'shard.all_gather' gathers over the chips' one grid axis, [0]")
        source = self.of(op.input, op)
        result = op.result.name_hint or f"{source}@gathered"
        if result in self.buffers:
            result = f"{source}@gathered"
        self.add(_Gather(source, result, op.gather_axis.value.data))
        self.env[op.result] = result


_HANDLERS: dict[type[Operation], Any] = {
    logos.WeightOp: _Plan.weight,
    logos.CacheOp: _Plan.cache,
    logos.EmbedOp: _Plan.embed,
    logos.RMSNormOp: _Plan.rms_norm,
    logos.RowOp: _Plan.row,
    logos.LinearOp: _Plan.linear,
    logos.SiluOp: _Plan.silu,
    logos.MulOp: _Plan.mul,
    logos.AddOp: _Plan.elementwise_add,
    logos.RopeOp: _Plan.rope,
    logos.CacheWriteOp: _Plan.cache_write,
    logos.AttentionOp: _Plan.attention,
    logos.ArgmaxOp: _Plan.argmax,
    AllReduceOp: _Plan.all_reduce,
    AllGatherOp: _Plan.all_gather,
}


def _host_function(plan: _Plan) -> func.FuncOp:
    """The plan as IR: buffers first (in the order they were named), then the kernels and all-reduces."""
    block = Block()
    values: dict[str, SSAValue] = {}
    used = {name for step in plan.steps for name in _names(step)}
    for buffer in plan.buffers.values():
        if buffer.name not in used:
            continue  # named for a value a fusion removed
        op = cuda.BufferOp(buffer.name, buffer.kind, buffer.type)
        op.result.name_hint = _hint(buffer.name)
        block.add_op(op)
        values[buffer.name] = op.result
    for step in plan.steps:
        if isinstance(step, _Reduce):
            assert plan.grid is not None
            reduce = AllReduceOp.build(
                operands=[values[step.buffer]],
                result_types=[values[step.buffer].type],
                properties={"grid": _grid_ref(plan.grid), "grid_axes": _grid_axes(plan.grid)},
            )
            reduce.result.name_hint = _hint(step.buffer) + "_reduced"
            block.add_op(reduce)
            values[step.result] = reduce.result
            continue
        if isinstance(step, _Gather):
            assert plan.grid is not None
            source = values[step.buffer]
            kind = cast(MemRefType, source.type)
            shape = list(kind.get_shape())
            shape[step.axis] *= plan.grid.shape.get_values()[0]
            gather = AllGatherOp.build(
                operands=[source],
                result_types=[MemRefType(kind.element_type, shape)],
                properties={
                    "grid": _grid_ref(plan.grid),
                    "grid_axes": _grid_axes(plan.grid),
                    "gather_axis": IntegerAttr(step.axis, IndexType()),
                },
                attributes={"cuda.buffer": StringAttr(step.result)},  # the new buffer's name, for the host plan
            )
            gather.result.name_hint = _hint(step.result)
            block.add_op(gather)
            values[step.result] = gather.result
            continue
        _check_no_alias(step)
        ins = [values[name] for name in step.ins]
        outs = [values[name] for name in step.outs]
        block.add_op(step.op(ins, outs, step.props))
    block.add_op(func.ReturnOp())
    return func.FuncOp("step", ((), ()), Region(block))


def _names(step: _Kernel | _Reduce | _Gather) -> list[str]:
    return [*step.ins, *step.outs] if isinstance(step, _Kernel) else [step.buffer]


def _grid_ref(grid: GridOp) -> Attribute:
    from xdsl.dialects.builtin import FlatSymbolRefAttr

    return FlatSymbolRefAttr(grid.sym_name.data)


def _grid_axes(grid: GridOp) -> Attribute:
    """Every axis of the chips' grid (a 1-D grid: axis 0): upstream reads empty `grid_axes` as "each device alone",
    so an all-reduce without them would be a no-op its canonicalizer erases."""
    from xdsl.dialects.builtin import BytesAttr, DenseArrayBase, i16

    axes = list(range(len(grid.shape.get_values())))
    return DenseArrayBase(i16, BytesAttr(i16.pack(axes)))


def _check_no_alias(step: _Kernel) -> None:
    both = set(step.ins) & set(step.outs)
    if both:
        raise PassError(f"{NAME}: the {step.op.name} kernel would read and write buffer '{sorted(both)[0]}'")


def _hint(name: str) -> str:
    if "+" in name:  # the fused query/key/value weight
        name = name.split("+")[0].replace("q_proj", "qkv_proj")
    cleaned = "".join(c if c.isalnum() else "_" for c in name.removeprefix("model."))
    return cleaned if not cleaned[0].isdigit() else f"b{cleaned}"


def check_cut(program: logos.ProgramOp) -> Cut:
    """The program's cut, refused unless the lane lowers it."""
    cut = Cut.parse(program.cut.data)
    if cut.kind not in LOWERED:
        raise PassError(
            f"{NAME}: the CUDA lane lowers whole decode steps, prefill chunks and batches, not the cut '{cut}' "
            f"('logos.program' cut \"{program.cut.data}\")",
            hint="give the whole program's cut (decode ctx=N, prefill rows=R ctx=N or batch rows=R ctx=N)",
        )
    return cut


@dataclass(frozen=True)
class ConvertLogosToCudaKernels(ModulePass):
    """Lowers the module's `logos.program` to the CUDA lane's kernel level; `weights` (bf16 or f32) is the weight
    image the kernels read. The module's docstring says what it assumes and guarantees."""

    name = NAME

    weights: str = "bf16"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.weights not in ("bf16", "f32"):
            raise PassError(f"{NAME}: weights are bf16 or f32, not '{self.weights}'")
        program = identity.the_program(op, NAME)
        check_cut(program)
        line = identity.identity(program).line()
        plan = _Plan(program, self.weights)
        plan.run()
        host = _host_function(plan)
        block = op.body.block
        if plan.grid is not None:
            grid = plan.grid.clone()
            block.insert_op_before(grid, program)
        block.insert_op_before(host, program)
        block.erase_op(program)
        op.attributes["cuda.identity"] = StringAttr(line)
        op.attributes["cuda.weights"] = StringAttr(self.weights)
