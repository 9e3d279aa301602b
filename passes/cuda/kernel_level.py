"""The CUDA lane's kernel level as its passes read it: the host function `@step`, its buffers and its steps.

At the kernel level a buffer is the SSA value of its `cuda.buffer` op (all of them at the top of `@step`, in the
order they were named); a step is a kernel-level op, a `shard.all_reduce` (in place: it writes the buffer it reads;
its result is the reduced buffer later steps read) or a `shard.all_gather` (a new buffer). The fusion passes at this
level match steps by what they read and write, add the buffers a fused kernel needs after the others, and drop the
buffers no step uses any more.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import MemRefType, ModuleOp
from xdsl.dialects.shard import AllReduceOp
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter
from xdsl.rewriter import InsertPoint

from logos_ir.dialects import cuda
from logos_ir.dialects.shard_ext import AllGatherOp
from logos_ir.errors import PassError

Step = cuda.KernelOp | AllReduceOp | AllGatherOp


def host_function(module: ModuleOp, pass_name: str) -> func.FuncOp:
    """The module's host function `@step`, refused by `pass_name` when there is none."""
    for op in module.ops:
        if isinstance(op, func.FuncOp) and op.sym_name.data == "step":
            return op
    raise PassError(f"{pass_name}: the module has no host function @step (run convert-logos-to-cuda-kernels first)")


def reads(step: Operation) -> list[SSAValue]:
    if isinstance(step, cuda.KernelOp):
        return list(step.ins)
    if isinstance(step, AllReduceOp | AllGatherOp):
        return [step.input]
    return []


def writes(step: Operation) -> list[SSAValue]:
    if isinstance(step, cuda.KernelOp):
        return list(step.outs)
    if isinstance(step, AllReduceOp):
        return [step.input]
    if isinstance(step, AllGatherOp):
        return [step.result]
    return []


def steps_after(op: Operation) -> Iterator[Operation]:
    """The steps after `op` in its host function, in launch order."""
    later = op.next_op
    while later is not None:
        if isinstance(later, cuda.KernelOp | AllReduceOp | AllGatherOp):
            yield later
        later = later.next_op


def next_steps(op: Operation, count: int) -> list[Operation]:
    """The `count` steps after `op` (fewer at the end of the host function)."""
    found: list[Operation] = []
    for later in steps_after(op):
        if len(found) == count:
            break
        found.append(later)
    return found


def previous_step(op: Operation) -> Operation | None:
    earlier = op.prev_op
    while earlier is not None and not isinstance(earlier, cuda.KernelOp | AllReduceOp | AllGatherOp):
        earlier = earlier.prev_op
    return earlier


def buffer_name(value: SSAValue) -> str:
    owner = value.owner
    assert isinstance(owner, cuda.BufferOp)
    return owner.buffer.data


def buffer(rewriter: PatternRewriter, host: func.FuncOp, name: str, kind: str, kind_type: Attribute) -> SSAValue:
    """The buffer `name` of the host function, added after the others when it has none (named `<name>.<shape>`
    when `name` is taken by a buffer of another type)."""
    last: cuda.BufferOp | None = None
    for op in host.body.block.ops:
        if not isinstance(op, cuda.BufferOp):
            continue
        last = op
        if op.buffer.data == name:
            if op.result.type != kind_type:
                shape = "x".join(str(d) for d in cuda.shape_of(kind_type))
                return buffer(rewriter, host, f"{name}.{shape}", kind, kind_type)
            return op.result
    assert last is not None and isinstance(kind_type, MemRefType)
    op = cuda.BufferOp(name, kind, kind_type)
    op.result.name_hint = value_name(name)
    rewriter.insert(op, InsertPoint.after(last))
    return op.result


def value_name(name: str) -> str:
    """The SSA name of a buffer's value: its name without the `model.` prefix, as an identifier (a fused
    query/key/value weight by its query's name, `qkv_proj`)."""
    if "+" in name:
        name = name.split("+")[0].replace("q_proj", "qkv_proj")
    cleaned = "".join(c if c.isalnum() else "_" for c in name.removeprefix("model."))
    return cleaned if not cleaned[0].isdigit() else f"b{cleaned}"


def rebuilt(
    op: cuda.KernelOp, ins: Sequence[SSAValue], outs: Sequence[SSAValue], properties: Mapping[str, Attribute]
) -> cuda.KernelOp:
    """A kernel-level op of `op`'s kind on other buffers and properties."""
    props = {k: v for k, v in properties.items() if k != "operandSegmentSizes"}
    return type(op)(ins, outs, props)


def drop_unused_buffers(host: func.FuncOp) -> None:
    """Erase the buffers no step reads or writes (named for values a fusion removed)."""
    for op in list(host.body.block.ops):
        if isinstance(op, cuda.BufferOp) and not op.result.uses:
            host.body.block.erase_op(op)
