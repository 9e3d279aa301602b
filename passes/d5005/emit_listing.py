"""The readable listing of a D5005 instruction stream (`-t d5005-listing`): what an FPGA engineer reads beside
the binary. The identity line, the engine's parameters, the on-chip buffers, then one line per instruction: its
index, opcode, buffers and the region it streams (tensor, offset in each bank, stride, rows x cols), as the words
of the binary stream hold them. The printer has one method per instruction and refuses an op it does not know.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import DiagnosticException
from xdsl.utils.target import Target

from logos_ir.dialects import d5005
from logos_ir.dialects.d5005 import label
from logos_ir.passes.d5005.emit_opencl import the_d5005_program


def _region(r: d5005.RegionAttr) -> str:
    return f"{r.tensor.data} @{r.offset.data:#x} stride {r.stride.data} [{r.rows.data}x{r.cols.data}]"


def _embed_row(op: d5005.EmbedRowOp) -> str:
    scale = f" * {op.scale.value.data:g}" if op.scale is not None else ""
    return f"{label(op.dst)} <- row[token] of {_region(op.table)}{scale}"


def _matvec(op: d5005.MatvecOp) -> str:
    if op.slot is not None and op.routes is not None:
        expert = f"expert[{_region(op.routes)}[{op.slot.value.data}]] of {_region(op.weight)}"
        return f"{label(op.dst)} <- {expert} x {label(op.src)}"
    bias = f" + {_region(op.bias)}" if op.bias is not None else ""
    first, columns = op.part
    if (first, columns) == (0, op.weight.cols.data):
        return f"{label(op.dst)} <- {_region(op.weight)} x {label(op.src)}{bias}"
    into = "+=" if first else "<-"
    span = f"[{first}:{first + columns}]"
    return f"{label(op.dst)} {into} {_region(op.weight)}{span} x {label(op.src)}{span}{bias}"


def _rms_norm(op: d5005.RMSNormOp) -> str:
    weight = f"(1 + {_region(op.weight)})" if op.plus_one is not None else _region(op.weight)
    return f"{label(op.dst)} <- rms_norm({label(op.src)}) * {weight} eps {op.epsilon.value.data:g}"


def _rope(op: d5005.RopeOp) -> str:
    heads = f"heads of {op.head_dim.value.data} by {_region(op.table)}"
    src = label(op.src)
    if op.norm is not None and op.epsilon is not None:
        norm = f"(1 + {_region(op.norm)})" if op.plus_one is not None else _region(op.norm)
        src = f"head_rms_norm({src}) * {norm} eps {op.epsilon.value.data:g}"
    return f"{label(op.dst)} <- rope({src}, position) {heads}"


def _cache_write(op: d5005.CacheWriteOp) -> str:
    return f"{_region(op.cache)}[position] <- {label(op.src)} ({op.kv_heads.value.data} heads)"


def _attention(op: d5005.AttentionOp) -> str:
    return (
        f"{label(op.dst)} <- attention({label(op.query)}, {op.heads.value.data} heads over {op.kv_heads.value.data})"
        f" keys {_region(op.keys)} values {_region(op.values)} current {label(op.key)}, {label(op.value)}"
        + (f" window {op.window.value.data}" if op.window is not None else "")
        + (f" softcap {op.softcap.value.data:g}" if op.softcap is not None else "")
    )


def _silu_mul(op: d5005.SiluMulOp) -> str:
    gate = "gelu_tanh" if op.gelu_tanh is not None else "silu"
    return f"{label(op.dst)} <- {gate}({label(op.lhs)}) * {label(op.rhs)} [{op.size.value.data}]"


def _add(op: d5005.AddOp) -> str:
    return f"{label(op.dst)} <- {label(op.lhs)} + {label(op.rhs)} [{op.size.value.data}]"


def _argmax(op: d5005.ArgmaxOp) -> str:
    if op.cap is not None:
        return f"result <- argmax(softcap({label(op.src)} [{op.size.value.data}], {op.cap.value.data:g}))"
    return f"result <- argmax({label(op.src)} [{op.size.value.data}])"


def _route(op: d5005.RouteOp) -> str:
    normed = ", renormalized" if op.renormalize is not None else ""
    return (
        f"route <- top {op.top_k.value.data} of softmax({label(op.src)} [{op.experts.value.data}]){normed};"
        f" ids into {_region(op.routes)}"
    )


def _expert_sum(op: d5005.ExpertSumOp) -> str:
    into = "+=" if op.slot.value.data else "<-"
    return f"{label(op.dst)} {into} route.weight[{op.slot.value.data}] * {label(op.src)} [{op.size.value.data}]"


_LINES: dict[type[d5005.InstructionOp], Callable[..., str]] = {
    d5005.EmbedRowOp: _embed_row,
    d5005.MatvecOp: _matvec,
    d5005.RMSNormOp: _rms_norm,
    d5005.RopeOp: _rope,
    d5005.CacheWriteOp: _cache_write,
    d5005.AttentionOp: _attention,
    d5005.SiluMulOp: _silu_mul,
    d5005.AddOp: _add,
    d5005.ArgmaxOp: _argmax,
    d5005.RouteOp: _route,
    d5005.ExpertSumOp: _expert_sum,
}


def listing(program: d5005.ProgramOp) -> str:
    params = program.params
    lines = [
        f"# {program.identity.data}",
        f"# d5005 engine: {params.clock_mhz} MHz, burst {params.burst_bytes} B, vector width {params.vector_width},"
        f" {params.mac_lanes} MAC lanes, {d5005.BANKS} banks, weights {params.weights}, ctx {program.ctx.value.data}",
    ]
    buffers = program.buffers()
    used = {a: sum(b.words.value.data for b in buffers if b.array_name == a) for a in d5005.ARRAYS}
    lines.append(
        f"# on-chip buffers: {sum(used.values())} words in arrays of the {params.onchip_words}-word budget: "
        + ", ".join(f"{a} {n} of {d5005.array_words(params.onchip_words, a)}" for a, n in used.items())
    )
    lines += [
        f"buffer {b.label.data:<16} {b.words.value.data:>8} words at {b.offset.value.data:<6} in {b.array_name}"
        for b in buffers
    ]
    for index, op in enumerate(program.body.block.ops):
        if isinstance(op, d5005.BufferOp):
            continue
        line = _LINES.get(type(op))
        if line is None:
            raise DiagnosticException(f"d5005-listing: '{op.name}' is not an instruction of the engine")
        lines.append(f"{index - len(buffers):5d}  {op.name.split('.')[1]:<12} {line(op)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ListingTarget(Target):
    """`-t d5005-listing`: the readable listing of the `d5005.program` in the module."""

    name: ClassVar[str] = "d5005-listing"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(listing(the_d5005_program(module, self.name)))
