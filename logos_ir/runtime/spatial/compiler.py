"""The element program compiled into instructions: its top level read (each element's parameters, arrays, exports),
each op of a function or task made a closure over the elements at it (numpy over those elements), looked up by op
type in one table (an op it does not know is refused by name). Straight-line ops that never wait are fused into one
instruction, and loops and branches whose bodies never wait run within one, each op still adding its own cycles;
calls, returns, and loops and branches that can wait become instructions that jump (`Compiler`, the part of
`elements.Fabric` that compiles).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from xdsl.dialects import arith, csl, memref, scf
from xdsl.ir import Block, Operation, SSAValue

from logos_ir.dialects import csl_ext
from logos_ir.runtime.spatial import CYCLES, FabricError
from logos_ir.runtime.spatial.dsd import DSD_OPS, DsdOps, _fabric_dsd
from logos_ir.runtime.spatial.memory import Memory, dtype_of
from logos_ir.runtime.spatial.state import FabricState


def _cmp(a: Any, b: Any, op: Any) -> Any:
    predicate = op.predicate.value.data
    return [a == b, a != b, a < b, a <= b, a > b, a >= b, a < b, a <= b, a > b, a >= b][predicate]


def _int_div(a: Any, b: Any, op: Any) -> Any:
    return np.trunc(np.asarray(a) / b).astype(np.int64) if isinstance(a, np.ndarray) else int(a / b)


def _int_rem(a: Any, b: Any, op: Any) -> Any:
    return np.fmod(a, b)


def _select(c: Any, a: Any, b: Any, op: Any) -> Any:
    return np.where(c, a, b)


# The arithmetic an element computes with, numpy over the elements at the op, by op type.
SCALAR: dict[type[Operation], Callable[..., Any]] = {
    arith.AddiOp: lambda a, b, op: a + b,
    arith.SubiOp: lambda a, b, op: a - b,
    arith.MuliOp: lambda a, b, op: a * b,
    arith.DivSIOp: _int_div,
    arith.RemSIOp: _int_rem,
    arith.CmpiOp: _cmp,
    arith.AndIOp: lambda a, b, op: np.logical_and(a, b),
    arith.SelectOp: _select,
    arith.AddfOp: lambda a, b, op: np.float32(a) + np.float32(b),
    arith.SubfOp: lambda a, b, op: np.float32(a) - np.float32(b),
    arith.MulfOp: lambda a, b, op: np.float32(a) * np.float32(b),
    arith.DivfOp: lambda a, b, op: np.float32(a) / np.float32(b),
    arith.ExtSIOp: lambda a, op: a,
    arith.TruncIOp: lambda a, op: a,
    arith.IndexCastOp: lambda a, op: a,
    arith.SIToFPOp: lambda a, op: np.asarray(a).astype(np.float32),
    arith.ExtFOp: lambda a, op: np.asarray(a).astype(np.float32),
    arith.TruncFOp: lambda a, op: np.asarray(a).astype(np.float16),
}


class Compiler(FabricState):
    """The compiling side of `elements.Fabric`: the program loaded, its functions and tasks compiled."""

    def _load(self, memory: int) -> None:
        """The program's top level: each element's parameters from its tile code, arrays allocated, functions and
        tasks compiled, exports bound; an element whose arrays and code exceed `memory` bytes is refused."""
        params = {op.param_name.data: op.res for op in self.program.body.block.ops if isinstance(op, csl.ParamOp)}
        for name, value in params.items():
            array = np.zeros(self.n, dtype=np.int64)
            for (x, y), given in self.layout.params.items():
                if name in given and isinstance(given[name], int):
                    array[y * self.width + x] = given[name]
            self.regs[value] = array
            self.param_values[name] = array
        missing = [(x, y) for x in range(self.width) for y in range(self.height) if (x, y) not in self.layout.params]
        if missing:
            raise FabricError(f"element {missing[0]} has no tile code (@set_tile_code)")
        for op in self.program.body.block.ops:
            handler = _TOP_LEVEL.get(type(op))
            if handler is None:
                raise FabricError(f"the fabric simulator does not run '{op.name}' at the program's top level")
            handler(self, op)
        for _, callee in self.fixups:
            if callee not in self.entries:
                raise FabricError(f"the program calls '{callee}', which it does not define")
        arrays, code = self.element_bytes()
        if arrays + code > memory:
            raise FabricError(
                f"element (0, 0) (and every element: they run one program) needs {arrays} bytes of arrays and "
                f"{code} of code, over its {memory} bytes"
            )

    def _export(self, op: csl.SymbolExportOp) -> None:
        name = op.get_name()
        self.exports[name] = self._array_of(op.value) if op.value is not None else name

    def _constant_op(self, op: arith.ConstantOp) -> None:
        """A constant: the same value in every element's register (one value, read-only: a grid's constants would
        otherwise be most of its registers' memory)."""
        value = op.value.value.data  # type: ignore[attr-defined]
        self.regs[op.result] = np.broadcast_to(np.array(value, dtype=dtype_of(op.result.type)), (self.n,))

    def _cast_constant(self, op: csl.SignednessCastOp) -> None:
        """`@as(u16, 91)`: a literal's cast, folded as cslc folds it (no instruction, no cycle)."""
        if not isinstance(op.inp.owner, arith.ConstantOp):
            raise FabricError(f"the fabric simulator casts only constants ({op.name} of '{op.inp}')")
        self.regs[op.result] = np.asarray(self._reg(op.inp)) % 65536

    def _initialize_queue(self, op: csl_ext.InitializeQueueOp) -> None:
        """`@initialize_queue` (comptime, no cycles): each element's queue bound to its colour, a literal or its tile
        code's `color` parameter; a fabric DSD on that queue must name that colour (`DsdOps._check_queue`) and a
        wavelet reaching the element's ramp must find an input queue bound to its colour (`Wavelets._check_bound`)."""
        if op.colour is not None:
            colours = np.full(self.n, op.colour.data, dtype=np.int64)
        else:
            colours = np.asarray(self.regs[op.colour_param], dtype=np.int64)  # type: ignore[index]
        self.queue_binding[(op.inbound, op.queue.data)] = colours

    def _no_effect(self, op: Operation) -> None:
        """An op with no run-time effect (a global's address, a module import, a parameter, a comment)."""

    def _emit(self, name: str, run: Callable[[np.ndarray], np.ndarray]) -> int:
        if self._simple:
            self.pending.append((name, run))
            return len(self.instrs)
        self._flush()
        self.instrs.append(run)
        self.names.append(name)
        return len(self.instrs) - 1

    def _flush(self) -> None:
        """Fuse the pending straight-line ops (none of which can wait) into one instruction: the elements at it run
        them all, in order, each op adding its own cycles."""
        if not self.pending:
            return
        runs = [run for _, run in self.pending]
        names = ", ".join(dict.fromkeys(name for name, _ in self.pending))
        self.pending = []
        at = len(self.instrs)
        following = at + 1

        def fused(idx: np.ndarray) -> int:
            for run in runs:
                run(idx)
            return following

        self.instrs.append(fused)
        self.names.append(names)
        del at

    def _is_simple(self, op: Operation) -> bool:
        """An op that never waits and never leaves its function: a DSD op with no fabric operand, a scalar op, and
        a loop or branch whose every op is simple (it can be fused with its neighbours, the loop or branch run within
        the fused instruction)."""
        if isinstance(op, csl.BuiltinDsdOp):
            return not any(_fabric_dsd(v) for v in op.ops)
        if isinstance(op, scf.ForOp | scf.IfOp):
            return all(self._is_simple(inner) for region in op.regions for b in region.blocks for inner in b.ops)
        return not isinstance(op, csl.CallOp | csl.ReturnOp)

    def _compile_function(self, fn: csl.FuncOp | csl.TaskOp) -> None:
        name = fn.sym_name.data
        if isinstance(fn, csl.TaskOp) and fn.kind.data != csl.TaskKind.LOCAL:
            raise FabricError(f"the fabric simulator runs local tasks only; '{name}' is a {fn.kind.data.value} task")
        self.entries[name] = len(self.instrs)
        if isinstance(fn, csl.TaskOp) and fn.id is not None:
            self.tasks[fn.id.value.data] = len(self.instrs)
        for arg in fn.body.block.args:
            self.regs[arg] = np.zeros(self.n, dtype=dtype_of(arg.type))
        self.parameters[name] = [self.regs[arg] for arg in fn.body.block.args]
        self._compile_block(fn.body.block)

    def _compile_block(self, block: Block) -> None:
        for op in block.ops:
            self._compile_op(op)

    def _reg(self, value: SSAValue) -> np.ndarray:
        reg = self.regs.get(value)
        if reg is None:
            reg = self.regs[value] = np.zeros(self.n, dtype=dtype_of(value.type))
        return reg

    def _next(self, idx: np.ndarray, at: int) -> int:
        return at + 1

    def _compile_op(self, op: Operation) -> None:
        self._simple = self._is_simple(op)
        if not self._simple:
            self._flush()
        self._compile_one(op)
        self._simple = False

    def _compile_one(self, op: Operation) -> None:
        handler = _INSTRUCTIONS.get(type(op))
        if handler is None:
            raise FabricError(f"the fabric simulator does not run '{op.name}'")
        handler(self, op)

    def _compile_activate(self, op: csl.ActivateOp) -> None:
        at = len(self.instrs)
        task = op.id.value.data

        def activate(idx: np.ndarray) -> np.ndarray:
            self.activated[idx, task] = True
            self.clock[idx] += CYCLES["scalar"]
            return self._next(idx, at)

        self._emit("@activate", activate)

    def _compile_task_control(self, op: csl_ext.BlockOp | csl_ext.UnblockOp) -> None:
        at = len(self.instrs)
        task, value = op.task.data, isinstance(op, csl_ext.BlockOp)

        def block(idx: np.ndarray) -> np.ndarray:
            self.blocked[idx, task] = value
            self.clock[idx] += CYCLES["scalar"]
            return self._next(idx, at)

        self._emit("@block" if value else "@unblock", block)

    def _compile_return(self, op: csl.ReturnOp) -> None:
        self._flush()
        self._emit("return", self._return)

    def _compile_loop(self, op: scf.ForOp) -> None:
        if self._simple:
            self._compile_simple_for(op)
        else:
            self._compile_for(op)

    def _compile_branching(self, op: scf.IfOp) -> None:
        if self._simple:
            self._compile_simple_if(op)
        else:
            self._compile_if(op)

    def _compile_scalar(self, op: Operation) -> None:
        at = len(self.instrs)
        function = SCALAR[type(op)]
        inputs = [self._reg(v) for v in op.operands]
        out = self._reg(op.results[0])

        clock, n, cost = self.clock, self.n, CYCLES["divf" if isinstance(op, arith.DivfOp) else "scalar"]

        def run(idx: np.ndarray) -> int:
            rows = slice(None) if idx.size == n else idx  # every element (in order): no gather
            out[rows] = function(*(r[rows] for r in inputs), op)
            clock[rows] += cost
            return at + 1

        self._emit(op.name, run)

    def _compile_call(self, op: csl.CallOp) -> None:
        at = len(self.instrs)
        callee = op.callee.string_value()
        self.fixups.append((at, callee))
        args = [self._reg(a) for a in op.args]
        fn = next(
            (f for f in self.program.body.block.ops if isinstance(f, csl.FuncOp) and f.sym_name.data == callee), None
        )
        if fn is None:
            raise FabricError(f"the program calls '{callee}', which it does not define")
        params = [self._reg(a) for a in fn.body.block.args]

        def run(idx: np.ndarray) -> np.ndarray:
            for source, target in zip(args, params, strict=True):
                target[idx] = source[idx]
            if (self.depth[idx] >= self.stack.shape[1]).any():
                raise FabricError(f"calls nest deeper than {self.stack.shape[1]} at '{callee}'")
            self.stack[idx, self.depth[idx]] = at + 1
            self.depth[idx] += 1
            self.clock[idx] += CYCLES["call"]
            return self.entries[callee]

        self._emit(f"call {callee}", run)

    def _return(self, idx: np.ndarray) -> np.ndarray:
        self.clock[idx] += CYCLES["call"]
        out = np.full(idx.size, -1, dtype=np.int64)
        inner = self.depth[idx] > 0
        if inner.any():
            callers = idx[inner]
            self.depth[callers] -= 1
            out[inner] = self.stack[callers, self.depth[callers]]
        return out

    def _compile_for(self, op: scf.ForOp) -> None:
        lower, upper, step = self._reg(op.lb), self._reg(op.ub), self._reg(op.step)
        iv, *carried = (self._reg(a) for a in op.body.block.args)
        initial = [self._reg(v) for v in op.iter_args]
        start = len(self.instrs)

        def init(idx: np.ndarray) -> np.ndarray:
            iv[idx] = lower[idx]
            for source, target in zip(initial, carried, strict=True):
                target[idx] = source[idx]
            self.clock[idx] += CYCLES["scalar"]
            return self._next(idx, start)

        self._emit("for", init)
        test_at = len(self.instrs)
        exit_at: list[int] = []

        def test(idx: np.ndarray) -> np.ndarray:
            self.clock[idx] += CYCLES["scalar"]
            return np.where(iv[idx] < upper[idx], test_at + 1, exit_at[0]).astype(np.int64)

        self._emit("for (test)", test)
        body = list(op.body.block.ops)
        for inner in body[:-1]:
            self._compile_op(inner)
        self._flush()
        yielded = [self._reg(v) for v in body[-1].operands]
        back_at = len(self.instrs)

        def back(idx: np.ndarray) -> np.ndarray:
            values = [v[idx].copy() for v in yielded]
            for value, target in zip(values, carried, strict=True):
                target[idx] = value
            iv[idx] += step[idx]
            self.clock[idx] += CYCLES["scalar"]
            return test_at

        self._emit("for (next)", back)
        results = [self._reg(r) for r in op.results]
        exit_at.append(len(self.instrs))
        end = exit_at[0]

        def finish(idx: np.ndarray) -> np.ndarray:
            for source, target in zip(carried, results, strict=True):
                target[idx] = source[idx]
            return self._next(idx, end)

        self._emit("for (end)", finish)
        del back_at

    def _compile_if(self, op: scf.IfOp) -> None:
        condition = self._reg(op.cond)
        at = len(self.instrs)
        targets: list[int] = []

        def branch(idx: np.ndarray) -> np.ndarray:
            self.clock[idx] += CYCLES["scalar"]
            return np.where(condition[idx], at + 1, targets[0]).astype(np.int64)

        self._emit("if", branch)
        results = [self._reg(r) for r in op.results]
        self._compile_branch(op.true_region.block, results)
        jump_at = len(self.instrs)
        self.jumps[len(self.instrs)] = lambda: targets[1]
        self._emit("if (end of then)", lambda idx: targets[1])
        targets.append(len(self.instrs))
        if op.false_region.blocks:
            self._compile_branch(op.false_region.block, results)
        targets.append(len(self.instrs))
        self.jumps[len(self.instrs)] = lambda: targets[1] + 1
        self._emit("if (end)", lambda idx: targets[1] + 1)
        del jump_at

    def _simple_body(self, ops: Sequence[Operation]) -> list[Callable[[np.ndarray], Any]]:
        """The closures of simple ops (run in order, within one instruction)."""
        saved, self.pending = self.pending, []
        for inner in ops:
            self._simple = True
            self._compile_one(inner)
        runs = [run for _, run in self.pending]
        self.pending = saved
        self._simple = True
        return runs

    def _compile_simple_for(self, op: scf.ForOp) -> None:
        """A loop whose body never waits, run within one instruction: the same steps and cycles as the loop's
        instructions (the start, each test, each step back), for each element its own trip count."""
        lower, upper, step = self._reg(op.lb), self._reg(op.ub), self._reg(op.step)
        iv, *carried = (self._reg(a) for a in op.body.block.args)
        initial = [self._reg(v) for v in op.iter_args]
        ops = list(op.body.block.ops)
        body = self._simple_body(ops[:-1])
        yielded = [self._reg(v) for v in ops[-1].operands]
        results = [self._reg(r) for r in op.results]
        scalar = CYCLES["scalar"]
        clock = self.clock

        def run(idx: np.ndarray) -> None:
            iv[idx] = lower[idx]
            for source, target in zip(initial, carried, strict=True):
                target[idx] = source[idx]
            clock[idx] += scalar
            active = idx
            while True:
                clock[active] += scalar  # the test
                going = iv[active] < upper[active]
                if not going.all():
                    active = active[going]
                    if active.size == 0:
                        break
                for inner in body:
                    inner(active)
                values = [v[active].copy() for v in yielded]
                for value, target in zip(values, carried, strict=True):
                    target[active] = value
                iv[active] += step[active]
                clock[active] += scalar  # the step back
            for source, target in zip(carried, results, strict=True):
                target[idx] = source[idx]

        self._emit("for", run)

    def _compile_simple_if(self, op: scf.IfOp) -> None:
        """A branch whose arms never wait, run within one instruction (each element its arm)."""
        condition = self._reg(op.cond)
        results = [self._reg(r) for r in op.results]
        arms = []
        for region in (op.true_region, op.false_region):
            ops = list(region.block.ops) if region.blocks else []
            runs = self._simple_body(ops[:-1] if ops else [])
            yielded = [self._reg(v) for v in ops[-1].operands] if ops else []
            arms.append((runs, yielded))
        scalar = CYCLES["scalar"]
        clock = self.clock

        def run(idx: np.ndarray) -> None:
            clock[idx] += scalar
            taken = condition[idx].astype(bool)
            for (runs, yielded), part in ((arms[0], taken), (arms[1], ~taken)):
                if part.all():
                    sub = idx
                elif part.any():
                    sub = idx[part]
                else:
                    continue
                for inner in runs:
                    inner(sub)
                if results:
                    values = [v[sub].copy() for v in yielded]
                    for value, target in zip(values, results, strict=True):
                        target[sub] = value

        self._emit("if", run)

    def _compile_branch(self, block: Block, results: list[np.ndarray]) -> None:
        ops = list(block.ops)
        for inner in ops[:-1]:
            self._compile_op(inner)
        yielded = [self._reg(v) for v in ops[-1].operands] if ops else []
        if results:
            self._simple = True
            at = len(self.instrs)

            def assign(idx: np.ndarray) -> np.ndarray:
                for source, target in zip(yielded, results, strict=True):
                    target[idx] = source[idx]
                return self._next(idx, at)

            self._emit("yield", assign)
            self._simple = False
        self._flush()

    def _compile_member_call(self, op: csl.MemberCallOp) -> None:
        at = len(self.instrs)
        name = op.field.data
        module = op.struct.owner
        library = module.module.data if isinstance(module, csl.ImportModuleConstOp) else ""
        if library == "<memcpy/memcpy>" and name == "unblock_cmd_stream":

            def end(idx: np.ndarray) -> np.ndarray:
                self.ended[idx] = True
                self.clock[idx] += CYCLES["scalar"]
                return self._next(idx, at)

            self._emit("unblock_cmd_stream", end)
            return
        if library == "<time>":
            self._compile_time_call(op, name, at)
            return
        functions = {"exp_f32": np.exp, "sqrt_f32": np.sqrt, "cos_f32": np.cos, "sin_f32": np.sin}
        if library != "<math>" or name not in functions:
            raise FabricError(f"the fabric simulator does not run {library}'s '{name}'")
        function = functions[name]
        args = [self._reg(a) for a in op.args]
        out = self._reg(op.result)  # type: ignore[arg-type]

        def call(idx: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", under="ignore"):
                out[idx] = function(args[0][idx].astype(np.float64)).astype(np.float32)
            self.clock[idx] += CYCLES["math"]
            return self._next(idx, at)

        self._emit(f"math.{name}", call)

    def _compile_time_call(self, op: csl.MemberCallOp, name: str, at: int) -> None:
        """`<time>`: `enable_tsc()` starts the element's cycle counter (its clock here); `get_timestamp(&words)`
        writes the clock, 48 bits as three u16 words, low word first (csl-examples topic-02-libraries' make_u48)."""
        if name == "enable_tsc":

            def enable(idx: np.ndarray) -> np.ndarray:
                self.clock[idx] += CYCLES["scalar"]
                return self._next(idx, at)

            self._emit("time.enable_tsc", enable)
            return
        if name != "get_timestamp" or len(op.args) != 1:
            raise FabricError(f"the fabric simulator does not run <time>'s '{name}'")
        words = self.memory[self._array_of(op.args[0])]

        def stamp(idx: np.ndarray) -> np.ndarray:
            counter = self.clock[idx].astype(np.int64)
            for word in range(3):
                words[word, idx] = (counter >> (16 * word)) & 0xFFFF
            self.clock[idx] += CYCLES["scalar"]
            return self._next(idx, at)

        self._emit("time.get_timestamp", stamp)


# Each op of the program's top level, by op type.
_TOP_LEVEL: dict[type[Operation], Callable[[Any, Any], None]] = {
    memref.GlobalOp: Memory._allocate,
    csl.FuncOp: Compiler._compile_function,
    csl.TaskOp: Compiler._compile_function,
    csl.SymbolExportOp: Compiler._export,
    arith.ConstantOp: Compiler._constant_op,
    memref.GetGlobalOp: Compiler._no_effect,
    csl.ImportModuleConstOp: Compiler._no_effect,
    csl.AddressOfOp: Compiler._no_effect,
    csl.ParamOp: Compiler._no_effect,
    csl_ext.CommentOp: Compiler._no_effect,
    csl_ext.InitializeQueueOp: Compiler._initialize_queue,
    csl.GetFabDsdOp: DsdOps._fab_dsd_constant,
}

# Each op of a function or task, by op type: what compiles it into instructions.
_INSTRUCTIONS: dict[type[Operation], Callable[[Any, Any], None]] = {
    arith.ConstantOp: Compiler._constant_op,
    memref.GetGlobalOp: Compiler._no_effect,
    csl.AddressOfOp: Compiler._no_effect,  # an array's address: its uses name the array
    csl_ext.CommentOp: Compiler._no_effect,
    **{op_type: Compiler._compile_scalar for op_type in SCALAR},
    memref.LoadOp: Memory._compile_load,
    memref.StoreOp: Memory._compile_store,
    csl.GetMemDsdOp: DsdOps._compile_mem_dsd,
    csl.IncrementDsdOffsetOp: DsdOps._compile_increment,
    csl.GetFabDsdOp: DsdOps._compile_fab_dsd,
    csl.SetDsdLengthOp: DsdOps._compile_set_length,
    csl.SignednessCastOp: Compiler._cast_constant,
    **{op_type: DsdOps._compile_dsd_op for op_type in DSD_OPS},
    csl.MemberCallOp: Compiler._compile_member_call,
    csl.ActivateOp: Compiler._compile_activate,
    csl_ext.BlockOp: Compiler._compile_task_control,
    csl_ext.UnblockOp: Compiler._compile_task_control,
    csl.CallOp: Compiler._compile_call,
    csl.ReturnOp: Compiler._compile_return,
    scf.ForOp: Compiler._compile_loop,
    scf.IfOp: Compiler._compile_branching,
}
