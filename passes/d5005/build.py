"""`logos-compile --target d5005`: the D5005 lane's build folder.

From the decode step's LOGOS program (`program.logos`) it writes the lowered `d5005` IR (`decode.d5005.mlir`), the
instruction stream (`instructions.bin`) and its listing (`instructions.txt`), the weight layout (`layout.txt`),
the engine's OpenCL C (`engine.cl`), how to compile it with Intel's `aoc` for the card (`compile.sh`) and, with
`--with-weights`, the weight image (`weights.bin`); the report is the cost model's estimate of the engine's loops
over this program's instruction words. A build of code reads no weight value: only `weight_image` does, and only
when asked.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from logos_ir.build import Artifact, BuildError, BuildRequest, LaneBuild, program_module


def lower(module: ModuleOp, weights: str) -> ModuleOp:
    """The lane's pipeline (`logos-to-d5005`, every stage of it: `verify-identity`, `inline-sections`,
    `convert-logos-to-d5005`) on `module` in place (a `logos.program` in, a `d5005.program` out), verified after
    each pass."""
    from logos_ir.registry import run_pipeline

    return run_pipeline("logos-to-d5005", {"weights": weights}, module)


def _emitted(target: Target, module: ModuleOp) -> str:
    out = io.StringIO()
    target.emit(Context(), module, out)
    return out.getvalue()


def build_d5005(request: BuildRequest) -> LaneBuild:
    """The lane's build: the pipeline (`lower`), then the registered emitters, then the stream and the image."""
    from logos_ir.passes.d5005 import cost_model
    from logos_ir.passes.d5005.emit_layout import LayoutTarget, image_bytes, weight_image
    from logos_ir.passes.d5005.emit_listing import ListingTarget
    from logos_ir.passes.d5005.emit_opencl import OpenclTarget, the_d5005_program
    from logos_ir.passes.d5005.emit_stream import encode_stream

    _check_request(request)
    module, identity, text = program_module(request)
    lower(module, request.weights)
    program = the_d5005_program(module, "d5005")
    line = identity.line()
    size = image_bytes(program)
    engine = _emitted(OpenclTarget(), module)
    artifacts = [
        Artifact("program.logos", text.encode("utf-8"), identity, kind="logos", role="program"),
        Artifact.text("decode.d5005.mlir", f"// {line}\n{program}\n", identity, role="ir"),
        Artifact("instructions.bin", encode_stream(program, size), identity, kind="binary", role="instructions"),
        Artifact.text("instructions.txt", _emitted(ListingTarget(), module), identity, role="listing"),
        Artifact.text("layout.txt", _emitted(LayoutTarget(), module), identity, role="layout"),
        Artifact.text("engine.cl", engine, identity, role="engine"),
        Artifact.text("compile.sh", compile_commands(line), identity, role="commands"),
    ]
    if request.with_weights:
        image = weight_image(program, request.spec, request.model.store(), request.progress)
        artifacts.append(Artifact("weights.bin", image, identity, kind="binary", role="weights"))
    cost = cost_model.band(program, cost_model.Engine.read(engine))  # engine.cl as printed, read as aoc would
    report = {
        "cost_model": cost,
        "instructions": len(program.instructions()),
        "routines": sorted({op.name for op in program.instructions()}),
        "image_bytes_per_bank": size,
    }
    return LaneBuild(artifacts, report, cost_model.summary_lines(cost))


def cost_folder(folder: Path) -> dict[str, Any]:
    """The cost band of a build folder as it is now: its `engine.cl` read afresh (edited or not) over the words
    of its `instructions.bin`."""
    from logos_ir.passes.d5005 import aoc_report, cost_model
    from logos_ir.runtime.d5005 import StreamError, read_stream

    try:
        engine = cost_model.Engine.read((folder / "engine.cl").read_text(encoding="utf-8"))
        stream = read_stream((folder / "instructions.bin").read_bytes())
    except OSError as error:
        raise BuildError(f"{folder}: {error.strerror}: {Path(error.filename or '').name}") from None
    except (aoc_report.ReportError, StreamError) as error:
        raise BuildError(f"{folder}: {error}") from None
    words = [[int(v) for v in row] for row in stream.words.reshape(-1, 16)]
    return cost_model.band(engine=engine, words=words, ctx=stream.ctx)


def compile_commands(identity_line: str) -> str:
    """`compile.sh`: how a user with the card compiles `engine.cl` and runs this build on it."""
    return f"""#!/bin/sh
# {identity_line}
# Compile the D5005 engine (engine.cl: four bank readers and the compute kernel, joined by Intel channels) with
# Intel's FPGA SDK for OpenCL Pro and the Intel FPGA PAC D5005's board support package (board pac_s10_dc), then
# run this build on the card with the compiled engine:
#
#   sh compile.sh                                       # engine.aocx (a full compile takes hours)
#   logos-run THIS_FOLDER --backend d5005 --aocx engine.aocx
#
# -no-interleaving=DDR: each bank is its own memory (the host allocates bank n with CL_CHANNEL_<n+1>_INTELFPGA), so
# the four readers stream the four DDR4 banks at once; -fp-relaxed lets aoc balance the unrolled sums as trees.
# aoc defines INTELFPGA_CL, which selects the channels, the pragmas and the buffer_location attributes in engine.cl.
set -e
cd "$(dirname "$0")"
aoc -board=pac_s10_dc -fp-relaxed -no-interleaving=DDR -report engine.cl -o engine.aocx
"""


def _check_request(request: BuildRequest) -> None:
    if request.tp != 1:
        raise BuildError(f"the d5005 target builds for one card, not {request.tp} chips")
    if request.weights not in ("bf16", "f32"):
        raise BuildError(f"the d5005 target writes bf16 or f32 weights, not {request.weights}")
    if request.options:
        raise BuildError(f"the d5005 target has no options ({', '.join(sorted(request.options))} given)")
    if request.cut.kind != "decode":
        raise BuildError(
            f"the d5005 target builds a whole decode step, not '{request.cut}'", hint="give --cut 'decode ctx=N'"
        )
