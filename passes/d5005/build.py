"""`logos-compile --target d5005`: the D5005 lane's build folder.

From the decode step's LOGOS program (`program.logos`) it writes the lowered `d5005` IR (`decode.d5005.mlir`), the
instruction stream (`instructions.bin`) and its listing (`instructions.txt`), the weight layout (`layout.txt`),
the engine's OpenCL C (`engine.cl`) and, with `--with-weights`, the weight image (`weights.bin`); the report is
the cost model's estimate. A build of code reads no weight value: only `weight_image` does, and only when asked.
"""

from __future__ import annotations

from logos_ir.build import Artifact, BuildError, BuildRequest, LaneBuild, program_module


def build_d5005(request: BuildRequest) -> LaneBuild:
    from logos_ir.passes.d5005 import cost_model
    from logos_ir.passes.d5005.convert_logos_to_d5005 import lower_program
    from logos_ir.passes.d5005.emit_layout import image_bytes, layout, weight_image
    from logos_ir.passes.d5005.emit_listing import listing
    from logos_ir.passes.d5005.emit_opencl import engine_source
    from logos_ir.passes.d5005.emit_stream import encode_stream

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
    module, identity, text = program_module(request)
    program = lower_program(module.ops.first, request.weights)  # type: ignore[arg-type]
    line = identity.line()
    size = image_bytes(program)
    artifacts = [
        Artifact("program.logos", text.encode("utf-8"), identity, kind="logos", role="program"),
        Artifact.text("decode.d5005.mlir", f"// {line}\n{program}\n", identity, role="ir"),
        Artifact("instructions.bin", encode_stream(program, size), identity, kind="binary", role="instructions"),
        Artifact.text("instructions.txt", listing(program), identity, role="listing"),
        Artifact.text("layout.txt", layout(program), identity, role="layout"),
        Artifact.text("engine.cl", engine_source(line, program.params), identity, role="engine"),
    ]
    if request.with_weights:
        image = weight_image(program, request.spec, request.model.store(), request.progress)
        artifacts.append(Artifact("weights.bin", image, identity, kind="binary", role="weights"))
    cost = cost_model.estimate(program)
    report = {
        "cost_model": cost,
        "instructions": len(program.instructions()),
        "routines": sorted({op.name for op in program.instructions()}),
        "image_bytes_per_bank": size,
    }
    return LaneBuild(artifacts, report, cost_model.summary_lines(cost))
