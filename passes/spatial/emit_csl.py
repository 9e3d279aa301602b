"""`-t csl`: each placed `spatial.region` printed as CSL, a layout file and a program file, by xDSL's CSL printer.

A region is lowered (`convert-spatial-to-csl`, on a copy: the module is left as it was) to its two `csl.module`s and
printed with xDSL's `print_to_csl`, through a print context that extends xDSL's in two places: it refuses an op the
printer does not know (xDSL's prints it as a `//` comment and carries on), and it prints fabric DSDs as CSL reads
them (xDSL 0.74 prints the colour with its MLIR type, `0 : ui5`, and closes the struct with one brace too many).
Every file starts with the identity line of the LOGOS program its region was lowered from.

`CslEmitter` lowers and prints each distinct region shape once: regions that differ only in their names (the
layers of a model) share the text, and only the identity line differs.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import IO, ClassVar

from xdsl.backend.csl.print_csl import CslPrintContext, print_to_csl
from xdsl.context import Context
from xdsl.dialects import csl
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Operation
from xdsl.utils.exceptions import DiagnosticException
from xdsl.utils.target import Target

from logos_ir.dialects import csl_ext
from logos_ir.dialects import spatial as sp
from logos_ir.passes.spatial.convert_spatial_to_csl import ConvertSpatialToCsl

LAYOUT, PROGRAM = "layout.csl", "pe_program.csl"
_NAMES = ("sym_name", "tensor", "layer", "identity", "cut", "source", "target", "origin")


class LaneCslPrintContext(CslPrintContext):
    """xDSL's CSL print context, refusing unknown ops and printing fabric DSDs as CSL reads them."""

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
        self.print(f"  .{queue}_queue = @get_{queue}_queue({op.queue_id.value.data}),")
        self.print(f"  .fabric_color = @get_color({op.fabric_color.value.data}),")
        self.print("});")


def _print(module: ModuleOp) -> dict[str, str]:
    """The layout and program texts of a module of lowered `csl.module`s (one region), printed together so that the
    layout exports the symbols the program exports (xDSL's printer collects them from the program first)."""
    for op in module.ops:
        if not isinstance(op, csl.CslModuleOp):
            raise DiagnosticException(f"csl target: expects csl.module ops, found '{op.name}'")
    out = io.StringIO()
    print_to_csl(module, out, LaneCslPrintContext)
    texts: dict[str, str] = {}
    for chunk in out.getvalue().split("// -----\n"):
        first, _, _ = chunk.partition("\n")
        texts[LAYOUT if first.endswith("_layout") else PROGRAM] = chunk
    return texts


def region_key(region: sp.RegionOp) -> tuple[object, ...]:
    """What a region's CSL depends on: its size, weight image and every op with its properties but not its names."""
    ops: list[tuple[object, ...]] = []
    for op in region.body.block.ops:
        properties = tuple(sorted((k, v) for k, v in op.properties.items() if k not in _NAMES))
        types: tuple[Attribute, ...] = tuple(r.type for r in op.results)
        ops.append((op.name, properties, types))
    return (region.weights.data, region.width, region.height, tuple(ops))


def _header(region: sp.RegionOp) -> str:
    return f"// {region.identity.data}\n// region @{region.sym_name.data} of {region.cut.data}\n"


def lowered_texts(region: sp.RegionOp) -> dict[str, str]:
    """The layout and program texts of one region (without its header), lowered on a copy of it."""
    module = ModuleOp([region.grid_op().clone(), region.clone()])
    ConvertSpatialToCsl().apply(Context(), module)
    return _print(module)


@dataclass
class CslEmitter:
    """CSL texts of regions, lowered and printed (by the `-t csl` target) once per distinct shape (`region_key`)."""

    texts: dict[tuple[object, ...], dict[str, str]] = field(default_factory=dict)

    def emit(self, region: sp.RegionOp) -> dict[str, str]:
        """{"layout.csl": ..., "pe_program.csl": ...}, each headed by the region's identity line."""
        key = region_key(region)
        bodies = self.texts.get(key)
        if bodies is None:
            out = io.StringIO()
            CslTarget().emit(Context(), ModuleOp([region.grid_op().clone(), region.clone()]), out)
            bodies = self.texts[key] = _split(out.getvalue(), region)
        return {name: _header(region) + text for name, text in bodies.items()}

    @property
    def distinct(self) -> int:
        """How many distinct element programs were lowered."""
        return len(self.texts)


def _split(printed: str, region: sp.RegionOp) -> dict[str, str]:
    """The target's output for one region, back into its files' bodies (without the `// FILE:` line and header)."""
    texts: dict[str, str] = {}
    marker = f"// FILE: {region.sym_name.data}/"
    header = _header(region)
    for chunk in printed.split(marker)[1:]:
        name, _, text = chunk.partition("\n")
        texts[name] = text.removeprefix(header)
    return texts


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
    know). A `spatial.region` (the earlier per-part placement) is refused: its CSL does not run."""

    name: ClassVar[str] = "csl"

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        if any(isinstance(op, sp.RegionOp) for op in module.ops):
            raise DiagnosticException(
                "csl target: a spatial.region's per-part CSL does not run (issue 17: no routes, tasks or host I/O); "
                "lower the decode step with -p convert-logos-to-csl (or build with logos-compile --target spatial)"
            )
        for op in module.ops:
            if not isinstance(op, csl.CslModuleOp):
                raise DiagnosticException(f"csl target: expects csl.module ops, found '{op.name}'")
        for name, text in print_csl(module).items():
            output.write(f"// FILE: {name}\n{text}")
