"""Upstream MLIR `shard` ops that xDSL 0.74 lacks: `shard.all_gather` and `shard.all_slice`.

A split program's head computes each chip's share of the logits (the `lm_head` split by vocabulary rows) and
concatenates the shares over the chips so that every chip holds the whole row of logits and takes the same
arg-max (vLLM's logits processor with `all_gather`; Megatron-LM's `gather_from_tensor_model_parallel_region`).
Upstream's `shard.gather` leaves its result undefined on every device but `root`, so a chip other than the root
could not take the arg-max; `shard.all_gather` is upstream's op for this, and this module defines it as upstream
does (`mlir/include/mlir/Dialect/Shard/IR/ShardOps.td`): the same operands, properties and assembly format, so
the printed form is the one upstream parses:

```mlir
shard.grid @chips(shape = 2)
%logits = shard.all_gather %logits_part on @chips grid_axes = [0] gather_axis = 1
    : tensor<1x24xf32> -> tensor<1x48xf32>
```

`grid_axes` names the grid axes whose devices form one group (the chips' one axis, 0: empty axes would make each
device a group of its own), and the result is the group's inputs concatenated along `gather_axis` in the order
of the devices' coordinates on those axes. The op keeps upstream's name, and importing this module adds it to
xDSL's `shard` dialect (`extend_shard`: the one addition upstream xDSL lacks, left alone where an xDSL already has
an op of that name), so every context that loads `shard` afterwards reads it: `logos-opt`, the lane's `step.mlir`
reader, the tests' contexts.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexTypeConstr, IntegerAttr, MemRefType, TensorType
from xdsl.dialects.shard import CollectiveCommunicationOp
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException


@irdl_op_definition
class AllGatherOp(CollectiveCommunicationOp):
    """All-gather over a device grid: each device of a group receives the group's inputs concatenated along
    `gather_axis`, in device order (a split head's logits, a split OLMoE's query for its norm):

    ```mlir
    %logits = shard.all_gather %logits_part on @chips grid_axes = [0] gather_axis = 1
        : tensor<1x24xf32> -> tensor<1x48xf32>
    ```
    """

    name = "shard.all_gather"

    input = operand_def(MemRefType.constr() | TensorType.constr())
    gather_axis = prop_def(IntegerAttr.constr(IndexTypeConstr))

    result = result_def(MemRefType.constr() | TensorType.constr())

    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? "
        + "`gather_axis` `=` $gather_axis "
        + "attr-dict `:` type($input) `->` type($result)"
    )

    def verify_(self) -> None:
        source, target = self.input.type, self.result.type
        assert isinstance(source, MemRefType | TensorType) and isinstance(target, MemRefType | TensorType)
        axis = self.gather_axis.value.data
        ins, outs = source.get_shape(), target.get_shape()
        if not 0 <= axis < len(ins) or len(ins) != len(outs):
            raise VerifyException(f"{self.name}: gather_axis {axis} is not an axis of {list(ins)} -> {list(outs)}")
        others = [d for i, d in enumerate(ins) if i != axis] == [d for i, d in enumerate(outs) if i != axis]
        if not others or outs[axis] % ins[axis] or source.element_type != target.element_type:
            raise VerifyException(f"{self.name}: {list(ins)} gathered along axis {axis} cannot give {list(outs)}")


@irdl_op_definition
class AllSliceOp(CollectiveCommunicationOp):
    """All-slice over a device grid, all-gather's inverse: each device of a group, holding the whole input, keeps
    its part of it along `slice_axis` (the input split in as many parts as the group has devices, in device order).
    No data moves. A split program whose OLMoE norms need the whole query gathers it, norms it on every chip, and
    slices each chip's heads back out (vLLM's `_apply_qk_norm` under tensor parallelism):

    ```mlir
    %normed_query_part = shard.all_slice %normed_query on @chips grid_axes = [0] slice_axis = 1
        : tensor<1x64xf32> -> tensor<1x32xf32>
    ```
    """

    name = "shard.all_slice"

    input = operand_def(MemRefType.constr() | TensorType.constr())
    slice_axis = prop_def(IntegerAttr.constr(IndexTypeConstr))

    result = result_def(MemRefType.constr() | TensorType.constr())

    traits = traits_def(Pure())

    assembly_format = (
        "$input `on` $grid (`grid_axes` `=` $grid_axes^)? "
        + "`slice_axis` `=` $slice_axis "
        + "attr-dict `:` type($input) `->` type($result)"
    )

    def verify_(self) -> None:
        source, target = self.input.type, self.result.type
        assert isinstance(source, MemRefType | TensorType) and isinstance(target, MemRefType | TensorType)
        axis = self.slice_axis.value.data
        ins, outs = source.get_shape(), target.get_shape()
        if not 0 <= axis < len(ins) or len(ins) != len(outs):
            raise VerifyException(f"{self.name}: slice_axis {axis} is not an axis of {list(ins)} -> {list(outs)}")
        others = [d for i, d in enumerate(ins) if i != axis] == [d for i, d in enumerate(outs) if i != axis]
        if not others or ins[axis] % outs[axis] or source.element_type != target.element_type:
            raise VerifyException(f"{self.name}: {list(ins)} sliced along axis {axis} cannot give {list(outs)}")


def extend_shard() -> None:
    """Add `shard.all_gather` and `shard.all_slice` to xDSL's `shard` dialect, once; a context loading `shard`
    after this reads them."""
    from xdsl.dialects.shard import Shard

    for added in (AllGatherOp, AllSliceOp):
        if not any(op.name == added.name for op in Shard.operations):
            Shard._operations.append(added)  # pyright: ignore[reportPrivateUsage]


extend_shard()
