"""`-t csl`: the spatial lane's `csl.module`s (from `convert-logos-to-csl`) printed as CSL by xDSL's CSL printer.

The printer runs through a print context that extends xDSL's: it prints the lane's `csl_ext` ops, it refuses an op
the printer does not know (xDSL's prints it as a `//` comment and carries on), and it prints fabric DSDs as CSL reads
them (xDSL 0.74 prints the colour with its MLIR type, `0 : ui5`, and closes the struct with one brace too many).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, ClassVar

from xdsl.backend.csl.print_csl import CslPrintContext, print_to_csl
from xdsl.context import Context
from xdsl.dialects import csl
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.utils.exceptions import DiagnosticException
from xdsl.utils.target import Target

from logos_ir.dialects import csl_ext


class LaneCslPrintContext(CslPrintContext):
    """xDSL's CSL print context, refusing unknown ops, printing fabric DSDs as CSL reads them, and naming every
    variable of a module once: xDSL 0.74's sub-context (a function's body, a `comptime` block) counts its names from
    its parent's counter but leaves the parent's where it was, so a later module-level `var v48` took the name of a
    function's local `v48`, and CSL, as Zig, refuses a local that shadows a declaration of its container."""

    @contextmanager
    def descend(self, block_start: str = "") -> Iterator[CslPrintContext]:
        with super().descend(block_start) as inner:
            yield inner
        self._counter = max(self._counter, inner._counter)

    def print(self, text: str, prefix: str = "", end: str = "\n") -> None:
        if prefix == "//" and text.startswith("unknown op"):
            raise DiagnosticException(f"csl target: the CSL printer does not know {text.removeprefix('unknown op ')}")
        super().print(text, prefix, end)

    def print_op(self, op: Operation) -> None:
        if isinstance(op, csl_ext.SetColorConfigOp):
            x, y = self._get_variable_name_for(op.x), self._get_variable_name_for(op.y)
            rx, tx = ", ".join(op.receives), ", ".join(op.transmits)
            routes = f".{{ .routes = .{{ .rx = .{{ {rx} }}, .tx = .{{ {tx} }} }} }}"
            self.print(f"@set_color_config({x}, {y}, @get_color({op.colour.data}), {routes});")
            return None
        if isinstance(op, csl_ext.BlockOp | csl_ext.UnblockOp):
            verb = "block" if isinstance(op, csl_ext.BlockOp) else "unblock"
            self.print(f"@{verb}(@get_local_task_id({op.task.data}));")
            return None
        if isinstance(op, csl_ext.InitializeQueueOp):
            side = op.side.data
            queue = f"@get_{side}_queue({op.queue.data})"
            colour = op.param_name if op.colour is None else f"@get_color({op.colour.data})"
            with self.descend("comptime") as inner:
                inner.print(f"@initialize_queue({queue}, .{{ .color = {colour} }});")
            return None
        if isinstance(op, csl_ext.CommentOp):
            self.print(f"// {op.text.data}")
            return None
        if isinstance(op, csl.LayoutOp):
            # as xDSL prints it, but a function's @export_name without the trailing ", " xDSL 0.74 leaves
            with self.descend("layout") as inner:
                inner.print_block(op.body.block)
                for name, (type_, mutable) in inner._symbols_to_export.items():
                    text = inner.mlir_type_to_csl_type(type_)
                    flag = f", {str(mutable).lower()}" if mutable is not None else ""
                    inner.print(f'@export_name("{name}", {text}{flag});')
            return None
        if not isinstance(op, csl.GetFabDsdOp):
            return super().print_op(op)
        kind = self.mlir_type_to_csl_type(op.result.type)
        queue = "input" if op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd) else "output"
        self.print(f"{self._var_use(op.result)} = @get_dsd({kind}, .{{")
        self.print(f"  .extent = {self._get_variable_name_for(op.sizes[0])},")
        self.print(f"  .{queue}_queue = @get_{queue}_queue({csl_ext.queue_id(op)}),")
        param = csl_ext.colour_param(op)
        self.print(f"  .fabric_color = {param or f'@get_color({op.fabric_color.value.data})'},")
        self.print("});")


def print_csl(module: ModuleOp) -> dict[str, str]:
    """{"pe_program.csl": ..., "layout.csl": ...}: the module's two csl.modules as xDSL's printer prints them (with
    the lane's print context: the csl_ext ops, fabric DSDs as CSL reads them, unknown ops refused)."""
    out = io.StringIO()
    print_to_csl(module, out, LaneCslPrintContext)
    texts: dict[str, str] = {}
    for chunk in out.getvalue().split("// -----\n"):
        first, _, rest = chunk.partition("\n")
        name = first.removeprefix("// FILE: ").strip()
        texts[f"{name}.csl" if name != "pe_program" else "pe_program.csl"] = rest
    return texts


@dataclass(frozen=True)
class CslTarget(Target):
    """`-t csl`: a module of `csl.module`s (from `convert-logos-to-csl`) as `pe_program.csl` and `layout.csl`, each
    under a `// FILE:` line, printed by xDSL's printer with the lane's print context (which refuses ops it does not
    know)."""

    name: ClassVar[str] = "csl"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        for op in module.ops:
            if not isinstance(op, csl.CslModuleOp):
                raise DiagnosticException(f"csl target: expects csl.module ops, found '{op.name}'")
        for name, text in print_csl(module).items():
            output.write(f"// FILE: {name}\n{text}")
