"""The CUDA lane's host plan as data, read from its lowered module (`step.mlir`), and the weight image's numbers.

The lowered module's host function `@step` is a list of named buffers (`cuda.buffer`), then ordered
`gpu.launch_func`, `shard.all_reduce` and (a split head's logits) `shard.all_gather` ops. `plan_of` (a module) and
`read_plan` (its text, as a build folder holds it) turn it into a `HostPlan`: the buffers by name, the steps in
order, and the `gpu.func` kernels kept as IR for the emulator. The build's report and weight image and the runtime
both read plans through here, so the runtime never reaches back into the lowering. The image's bf16 rounding is
`logos_ir.numerics`'s (to nearest even, as torch does); `weight_share` is a chip's contiguous share of a split
weight, as the interpreter takes it (which axis is split is read off the buffer's shape against the full tensor's,
so the head's table split by vocabulary rows and, tied, the same table whole for the embedding both come from one
tensor).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from logos_ir.errors import LogosError

T = TypeVar("T")

# -- the host plan: what step.mlir says to do ---------------------------------------------------------------


@dataclass(frozen=True)
class Buffer:
    """A named device buffer of the plan: its kind (weight, cache, activation, input, output, table, scratch),
    shape and element type (f32, bf16 or i64; for a weight held as stored, its format: the shape is then its rows
    of 16- or 32-bit units, `UNIT_BYTES`)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    element: str


@dataclass(frozen=True)
class Launch:
    """A kernel launch; `programmatic`: its kernel waits for the launch before it at its top
    (`cuda-programmatic-launch`), so the host launches it with the programmatic-stream-serialization attribute."""

    kernel: str
    grid: tuple[int, int, int]
    block: int
    buffers: tuple[str, ...]
    programmatic: bool = False


@dataclass(frozen=True)
class Reduce:
    buffer: str


@dataclass(frozen=True)
class Gather:
    """An all-gather of `buffer` (this chip's share) along `axis` into `result` (the chips' shares in chip
    order, on every chip)."""

    buffer: str
    result: str
    axis: int


@dataclass
class HostPlan:
    """The host function of a lowered module: its buffers, then its launches and collectives in order."""

    identity: str
    weights: str
    chips: int
    buffers: dict[str, Buffer]
    steps: list[Launch | Reduce | Gather]
    kernels: dict[str, Any]
    _facts: dict[tuple[str, Callable[[Any], Any]], Any] = field(default_factory=dict, repr=False, compare=False)

    def fact(self, kernel: str, of: Callable[[Any], T]) -> T:
        """`of(the kernel's IR)`, computed once for this plan: what a kernel reads and loads are facts of its IR, which
        the plan holds as it was read, and the byte figures and the latency model ask them of every launch of the
        kernel at every live length."""
        key = (kernel, of)
        if key not in self._facts:
            self._facts[key] = of(self.kernels[kernel])
        return self._facts[key]

    @property
    def launches(self) -> list[Launch]:
        return [s for s in self.steps if isinstance(s, Launch)]

    @property
    def all_reduces(self) -> list[Reduce]:
        return [s for s in self.steps if isinstance(s, Reduce)]

    @property
    def all_gathers(self) -> list[Gather]:
        return [s for s in self.steps if isinstance(s, Gather)]


def lowered_context() -> Any:
    """An xDSL context that reads the CUDA lane's `step.mlir`."""
    from xdsl.context import Context
    from xdsl.dialects import arith, builtin, func, gpu, llvm, math, memref, scf, shard, vector

    from logos_ir.dialects.cuda import CUDA, NVVM
    from logos_ir.dialects.shard_ext import extend_shard

    extend_shard()  # upstream's shard.all_gather (a split head's logits), which xDSL 0.74's shard dialect lacks

    context = Context()
    upstream = (builtin.Builtin, func.Func, arith.Arith, memref.MemRef, scf.Scf, math.Math, gpu.GPU, vector.Vector)
    # vector: the kernels' 16-byte loads; llvm: their fences (gpu.shuffle and llvm.fence added by cuda's gpu_ext)
    for dialect in (*upstream, llvm.LLVM, shard.Shard, CUDA, NVVM):
        context.load_dialect(dialect)
    return context


# Where xDSL 0.74 and upstream MLIR spell the lowered module differently: the thread dimension attribute, and
# gpu.func's block size, an inherent attribute upstream (xDSL keeps the older discardable `gpu.known_block_size`).
# step.mlir is written in upstream's spelling (and generic form, so that upstream tools parse the lane's own
# `cuda` ops as unregistered ones) and read back through these.
_TO_UPSTREAM = (
    (re.compile(r"#gpu<(dim|shuffle_mode) (\w+)>"), r"#gpu.\1<\2>"),
    (re.compile(r"\bgpu\.known_block_size = "), "known_block_size = "),
)
_FROM_UPSTREAM = (
    (re.compile(r"#gpu\.(dim|shuffle_mode)<(\w+)>"), r"#gpu<\1 \2>"),
    (re.compile(r"(?<![.\w])known_block_size = "), "gpu.known_block_size = "),
)


def to_upstream(text: str) -> str:
    """A module printed by xDSL (generic form) in the spelling upstream MLIR parses."""
    for pattern, replacement in _TO_UPSTREAM:
        text = pattern.sub(replacement, text)
    return text


def from_upstream(text: str) -> str:
    """`to_upstream`'s inverse: the module in xDSL's spelling."""
    for pattern, replacement in _FROM_UPSTREAM:
        text = pattern.sub(replacement, text)
    return text


def read_plan(text: str, where: str = "step.mlir") -> HostPlan:
    """The host plan of a `step.mlir` artifact (in xDSL's or upstream's spelling), its kernels kept as IR for the
    emulator."""
    from xdsl.parser import Parser

    return plan_of(Parser(lowered_context(), from_upstream(text), where).parse_module(), where)


def plan_of(module: Any, where: str = "step.mlir") -> HostPlan:
    """The host plan of a lowered module."""
    from xdsl.dialects import builtin, func, gpu, shard

    from logos_ir.dialects import cuda
    from logos_ir.dialects.shard_ext import AllGatherOp

    kernels: dict[str, Any] = {}
    host = None
    chips = 1
    for op in module.ops:
        if isinstance(op, gpu.ModuleOp):
            kernels = {k.sym_name.data: k for k in op.body.block.ops if isinstance(k, gpu.FuncOp)}
        elif isinstance(op, func.FuncOp) and op.sym_name.data == "step":
            host = op
        elif isinstance(op, shard.GridOp):
            chips = int(op.shape.get_values()[0])
    if host is None:
        raise LogosError(f"{where}: no host function @step: not a CUDA lane build")
    names: dict[Any, str] = {}
    buffers: dict[str, Buffer] = {}
    steps: list[Launch | Reduce | Gather] = []
    constants: dict[Any, int] = {}
    for op in host.body.block.ops:
        if isinstance(op, cuda.BufferOp):
            kind = op.result.type
            stored = op.attributes.get(cuda.STORAGE)  # a weight held as stored: its format is its element
            element = stored.data if isinstance(stored, builtin.StringAttr) else _tag(kind)
            buffers[op.buffer.data] = Buffer(op.buffer.data, op.kind.data, tuple(kind.get_shape()), element)
            names[op.result] = op.buffer.data
        elif op.name == "arith.constant":
            constants[op.results[0]] = op.value.value.data
        elif isinstance(op, gpu.LaunchFuncOp):
            grid = (constants[op.gridSizeX], constants[op.gridSizeY], constants[op.gridSizeZ])
            operands = tuple(names[v] for v in op.kernelOperands)
            kernel = op.kernel.nested_references.data[0].data
            programmatic = kernel in kernels and cuda.waits_first(kernels[kernel])
            steps.append(Launch(kernel, grid, constants[op.blockSizeX], operands, programmatic))
        elif isinstance(op, shard.AllReduceOp):
            names[op.result] = names[op.input]
            steps.append(Reduce(names[op.input]))
        elif isinstance(op, AllGatherOp):
            named = op.attributes.get("cuda.buffer")
            if not isinstance(named, builtin.StringAttr):
                raise LogosError(f"{where}: a 'shard.all_gather' names no buffer for its result (cuda.buffer)")
            kind = op.result.type
            buffers[named.data] = Buffer(named.data, "activation", tuple(kind.get_shape()), _tag(kind))
            names[op.result] = named.data
            steps.append(Gather(names[op.input], named.data, op.gather_axis.value.data))
    # A buffer no step reads or writes is not allocated: a prefill chunk's attention scratch, which the fused
    # tensor-core flash attention (one launch, `prefill_attention_tc`) no longer uses.
    used = {n for s in steps for n in (s.buffers if isinstance(s, Launch) else (s.buffer, getattr(s, "result", "")))}
    buffers = {name: buffer for name, buffer in buffers.items() if name in used}
    identity = module.attributes.get("cuda.identity")
    weights = module.attributes.get("cuda.weights")
    assert isinstance(identity, builtin.StringAttr) and isinstance(weights, builtin.StringAttr)
    return HostPlan(identity.data, weights.data, chips, buffers, steps, kernels)


def _tag(kind: Any) -> str:
    from xdsl.dialects.builtin import BFloat16Type, Float32Type

    element = kind.element_type
    return "bf16" if isinstance(element, BFloat16Type) else "f32" if isinstance(element, Float32Type) else "i64"


# A buffer the lowering renamed because its tensor is also used whole (`<tensor>.<shape>`: a tied head's share).
_SHAPED = re.compile(r"(.+)\.\d+(?:x\d+)*")


def weight_share(
    store: Any, name: str, shape: tuple[int, ...], chip: int, chips: int, element: str = "f32"
) -> np.ndarray:
    """Chip `chip`'s contiguous share of a weight, as the split program states its shape (the split axis is the
    one the shape divides: rows or columns), as f32 values or (`element` "bf16") bf16 bit patterns; a name "a+b+c"
    is the shares of a, b and c one after the other (each split by rows, the query/key/value projections'). Read
    through the store's `part`: only the share is read and converted (through the file's memory map where the
    store has one), and the store caches nothing."""
    if "+" in name:  # weights laid one after the other (a decode step's fused query/key/value weight)
        parts = []
        for part in name.split("+"):
            rows, width = store.shape(part)
            parts.append(weight_share(store, part, (rows // chips, width), chip, chips, element))
        fused = np.concatenate(parts, axis=0)
        assert fused.shape == shape, (name, fused.shape, shape)
        return fused
    shaped = _SHAPED.fullmatch(name)
    tensor = shaped[1] if name not in store and shaped is not None else name
    full = tuple(store.shape(tensor))
    if full == tuple(shape):
        return store.part(tensor, 0, 0, full[0], element)
    if full[1:] == tuple(shape[1:]) and shape[0] * chips == full[0]:
        axis = 0  # rows: a column-parallel projection's, or the head's table by vocabulary
    elif full[:-1] == tuple(shape[:-1]) and shape[-1] * chips == full[-1]:
        axis = len(full) - 1  # columns: a row-parallel projection's
    else:
        raise LogosError(f"buffer '{name}' of {list(shape)} is no share over {chips} chips of '{tensor}' {list(full)}")
    size = full[axis] // chips
    return store.part(tensor, axis, chip * size, (chip + 1) * size, element)


# a stored weight's unit (`blocks.UNIT_BYTES`)
UNIT_BYTES = {
    "q8_0": 2, "q4_0": 2, "q5_0": 2, "q4_1": 4, "q5_1": 4,
    "q4_k": 4, "q5_k": 4, "q2_k": 4, "q6_k": 2, "q3_k": 2, "fp8": 4,
}  # fmt: skip
CHANNEL_ROW_TAIL = 16  # an fp8 row's codes, its f32 scale and 12 zero bytes (`cuda.CHANNEL_ROW_TAIL`)


def stored_share(store: Any, name: str, shape: tuple[int, ...], fmt: str, chip: int, chips: int) -> np.ndarray:
    """Chip `chip`'s share of a weight held as stored in `fmt` (`shape`: its rows of units), cut from the file's
    blocks (`WeightStore.blocks`) as `weight_share` cuts values: whole rows, or (a row-parallel projection's share)
    each row's bytes of whole blocks; "a+b+c" is the shares of a, b and c one after the other. The units are
    little-endian uint16 or uint32, as the device reads them."""
    from logos_ir import quant

    unit = np.dtype("<u2" if UNIT_BYTES[fmt] == 2 else "<u4")
    if "+" in name:
        parts = []
        for part in name.split("+"):
            rows, _ = store.shape(part)
            parts.append(stored_share(store, part, (rows // chips, shape[1]), fmt, chip, chips))
        fused = np.concatenate(parts, axis=0)
        assert fused.shape == shape, (name, fused.shape, shape)
        return fused
    shaped = _SHAPED.fullmatch(name)
    tensor = shaped[1] if name not in store and shaped is not None else name
    if store.spec.stored_as(tensor) != fmt:
        raise LogosError(
            f"buffer '{name}' holds {fmt} blocks, but '{tensor}' is stored as {store.spec.stored_as(tensor)}"
        )
    if quant.FORMATS[fmt].family == "channels":
        return _channel_share(store.blocks(tensor), shape, fmt, chip, chips, name)
    full = np.ascontiguousarray(store.blocks(tensor)).view(unit)
    if full.shape == tuple(shape):
        return full
    if full.shape[1] == shape[1] and shape[0] * chips == full.shape[0]:
        return np.ascontiguousarray(full[chip * shape[0] : (chip + 1) * shape[0]])
    block = quant.FORMATS[fmt].block_bytes
    if full.shape[0] == shape[0] and shape[1] * chips == full.shape[1] and shape[1] * unit.itemsize % block == 0:
        return np.ascontiguousarray(full[:, chip * shape[1] : (chip + 1) * shape[1]])
    raise LogosError(
        f"buffer '{name}' of {list(shape)} units is no share of whole {fmt} blocks over {chips} chips of '{tensor}'"
    )


def _channel_share(raw: np.ndarray, shape: tuple[int, ...], fmt: str, chip: int, chips: int, name: str) -> np.ndarray:
    """Chip `chip`'s share of a weight stored with a scale a row (fp8: each of `raw`'s rows its n codes, then its
    f32 scale's 4 bytes) as the device holds it (`shape`: its rows of 32-bit units): each row's codes (all, or a
    row-parallel projection's share of them), its scale, then zeros to CHANNEL_ROW_TAIL, so that every row starts
    16-byte aligned. A share of a row's codes keeps the row's scale: each chip's partial sum is scaled alike."""
    numbers = raw.shape[1] - 4
    share = shape[1] * UNIT_BYTES[fmt] - CHANNEL_ROW_TAIL
    codes, scales = raw[:, :numbers], raw[:, numbers:]
    if shape[0] * chips == raw.shape[0] and share == numbers:
        rows = slice(chip * shape[0], (chip + 1) * shape[0])
        codes, scales = codes[rows], scales[rows]
    elif shape[0] == raw.shape[0] and share * chips == numbers:
        codes = codes[:, chip * share : (chip + 1) * share]
    elif shape[0] != raw.shape[0] or share != numbers:  # (else the whole weight on every chip: a tied table's)
        raise LogosError(f"buffer '{name}' of {list(shape)} units is no share over {chips} chips of {fmt} rows")
    pad = np.zeros((codes.shape[0], CHANNEL_ROW_TAIL - 4), np.uint8)
    return np.ascontiguousarray(np.concatenate([codes, scales, pad], axis=1)).view("<u4")
