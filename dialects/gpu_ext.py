"""Upstream MLIR `gpu` and `llvm` ops that xDSL 0.74 lacks: `gpu.shuffle` (with its `#gpu<shuffle_mode ...>`) and
`llvm.fence`, which the CUDA lane's kernels use at the thread level.

They keep upstream's names, and importing this module adds them to xDSL's own `gpu` and `llvm` dialects
(`extend_gpu_and_llvm`, as `shard_ext` adds `shard.all_gather`; left alone where an xDSL already has an op of that
name). A context finds an op it has not loaded by its name's dialect prefix, so an op named `gpu.shuffle` must be
one of `gpu`'s for a printed `gpu` module to parse back (`logos-opt` re-reading a `logos-to-cuda` output, the lane's
`step.mlir` reader, the tests' contexts).

```mlir
%r, %ok = "gpu.shuffle"(%partial, %c16, %c32) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
"llvm.fence"() <{ordering = 7 : i64, syncscope = "device"}> : () -> ()
```
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, Float32Type, IntegerAttr, IntegerType, StringAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Operation, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum


def _fail(op: Operation, message: str) -> VerifyException:
    return VerifyException(f"'{op.name}' op {message}")


class ShuffleMode(StrEnum):
    XOR = "xor"
    UP = "up"
    DOWN = "down"
    IDX = "idx"


@irdl_attr_definition
class ShuffleModeAttr(EnumAttribute[ShuffleMode], SpacedOpaqueSyntaxAttribute):
    """Upstream `gpu`'s shuffle mode (`#gpu<shuffle_mode xor>` in xDSL's spelling, `#gpu.shuffle_mode<xor>` in
    upstream's), which xDSL 0.74's `gpu` lacks with its op."""

    name = "gpu.shuffle_mode"


@irdl_op_definition
class GpuShuffleOp(IRDLOperation):
    """Upstream MLIR's `gpu.shuffle` (xDSL 0.74 lacks it), used in its `xor` mode over a whole warp (`width` 32): the
    value of lane (this lane xor `offset`), and whether that lane took part (always, at width 32). CUDA's
    `__shfl_xor_sync(0xffffffff, value, offset)`.

    ```mlir
    %r, %ok = "gpu.shuffle"(%v, %c16, %c32) <{mode = #gpu<shuffle_mode xor>}> : (f32, i32, i32) -> (f32, i1)
    ```
    """

    name = "gpu.shuffle"

    T: ClassVar = VarConstraint("T", base(Float32Type) | base(IntegerType))

    value = operand_def(T)
    offset = operand_def(IntegerType)
    width = operand_def(IntegerType)
    mode = prop_def(ShuffleModeAttr)
    shuffle_result = result_def(T)
    valid = result_def(IntegerType)

    def __init__(self, value: SSAValue, offset: SSAValue, width: SSAValue, mode: ShuffleMode = ShuffleMode.XOR):
        super().__init__(
            operands=[value, offset, width],
            properties={"mode": ShuffleModeAttr(mode)},
            result_types=[value.type, IntegerType(1)],
        )

    def verify_(self) -> None:
        for name, operand in (("offset", self.offset), ("width", self.width)):
            if operand.type != IntegerType(32):
                raise _fail(self, f"takes its {name} as i32, not {operand.type}")


@irdl_op_definition
class FenceOp(IRDLOperation):
    """Upstream MLIR's `llvm.fence` (xDSL 0.74's `llvm` lacks it), used as `syncscope("device") seq_cst`: this
    thread's earlier writes are ordered before its later ones for every thread of the device (CUDA's
    `__threadfence()`, PTX `fence.sc.gpu`). What a warp does before it counts itself done with an atomic, so the
    last to count reads the others' results.

    ```mlir
    "llvm.fence"() <{ordering = 7 : i64, syncscope = "device"}> : () -> ()
    ```
    """

    name = "llvm.fence"

    ordering = prop_def(IntegerAttr[I64])
    syncscope = opt_prop_def(StringAttr)

    SEQ_CST: ClassVar[int] = 7  # upstream's LLVM::AtomicOrdering::seq_cst

    def __init__(self, syncscope: str = "device", ordering: int = SEQ_CST):
        super().__init__(properties={"ordering": IntegerAttr(ordering, 64), "syncscope": StringAttr(syncscope)})

    def verify_(self) -> None:
        if self.ordering.value.data not in (4, 5, 6, 7):
            raise _fail(
                self, f"orders as acquire (4), release (5), acq_rel (6) or seq_cst (7), not {self.ordering.value.data}"
            )


def extend_gpu_and_llvm() -> None:
    """Add `gpu.shuffle` with its mode to xDSL's `gpu` dialect and `llvm.fence` to its `llvm`, once; a context
    loading either dialect after this reads them."""
    from xdsl.dialects.gpu import GPU
    from xdsl.dialects.llvm import LLVM

    for dialect, op, attributes in ((GPU, GpuShuffleOp, [ShuffleModeAttr]), (LLVM, FenceOp, [])):
        if any(known.name == op.name for known in dialect.operations):
            continue
        dialect._operations.append(op)  # pyright: ignore[reportPrivateUsage]
        dialect._attributes.extend(attributes)  # pyright: ignore[reportPrivateUsage]


extend_gpu_and_llvm()
