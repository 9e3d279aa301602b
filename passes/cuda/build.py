"""`logos-compile --target cuda`: the CUDA lane's build of a decode step, prefill chunk or batch (split or not).

The build runs the lane's pipeline in one process on IR (no text round trip): `convert-logos-to-cuda-kernels`,
then `convert-cuda-kernels-to-gpu`, verifying the IR after each, then the emitter. Its artifacts, each headed by the
identity line of the program it was lowered from:

* `kernels.cu`: the kernels as CUDA C++ (`-t cuda`), one `extern "C"` function each;
* `step.mlir`: the lowered module itself: the `gpu.module` of kernels the emulator executes and the host plan
  (`@step`: named buffers, ordered `gpu.launch_func`, `shard.all_reduce`) the runtime follows;
* with `--with-weights`, `weights.bin` (one a chip, `weights.chip<N>.bin`, for a split program): the device image,
  a 4 KiB header (magic, identity line, a JSON index of name, offset, shape and element type, or when that does not
  fit a line `index-at-end <offset>` and the index after the data) then each weight
  buffer of the plan, 256-byte aligned, bf16 as bit patterns rounded to nearest even, or f32.

A build of code opens no weights. The report counts the kernels, launches and the bytes a step reads.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from logos_ir.build import Artifact, BuildRequest, LaneBuild, program_module
from logos_ir.errors import PassError
from logos_ir.passes.cuda import tensor_core  # issue 19 (tensor cores)
from logos_ir.program import Identity

IMAGE_MAGIC = b"LOGOS-CUDA-WEIGHTS 1\n"
HEADER_BYTES = 4096
ALIGN = 256


def lower(module: ModuleOp, weights: str) -> ModuleOp:
    """The lane's pipeline on `module` in place (a `logos.program` in, the lowered module out), verified after
    each pass."""
    from logos_ir.passes.cuda.kernels_to_gpu import ConvertCudaKernelsToGpu
    from logos_ir.passes.cuda.logos_to_kernels import ConvertLogosToCudaKernels

    context = Context()
    for lowering in (ConvertLogosToCudaKernels(weights), ConvertCudaKernelsToGpu()):
        lowering.apply(context, module)
        try:
            module.verify()
        except VerifyException as error:
            raise PassError(f"{lowering.name}: its output does not verify: {error}") from None
    return module


def module_text(module: ModuleOp, identity: Identity) -> str:
    out = io.StringIO()
    out.write(f"// {identity.line()}\n")
    Printer(stream=out).print_op(module)
    out.write("\n")
    return out.getvalue()


def cuda_text(module: ModuleOp) -> str:
    from logos_ir.passes.cuda.emit_cuda import print_cuda

    out = io.StringIO()
    print_cuda(module, out)
    return out.getvalue()


def build_cuda(request: BuildRequest) -> LaneBuild:
    """The target `cuda` (see the module docstring)."""
    if request.weights not in ("bf16", "f32"):
        raise PassError(f"logos-compile --target cuda: weight images are bf16 or f32, not {request.weights}")
    module, identity, _ = program_module(request)
    lower(module, request.weights)
    step = module_text(module, identity)
    artifacts = [
        Artifact.text("kernels.cu", cuda_text(module), identity, role="kernels"),
        Artifact.text("step.mlir", step, identity, role="host"),
    ]
    report = plan_report(module)
    report.update(tensor_core.report(module))  # issue 19 (tensor cores): each product's HBM bytes vs the minimum
    if request.with_weights:
        artifacts += weight_images(request, module, identity)
    summary = [
        f"{report['kernels']} kernels, {report['launches']} launches a step, "
        f"{report['weight_bytes'] / 1e6:.1f} MB of weights read a step (each chip)"
    ]
    return LaneBuild(artifacts, report, summary)


def plan_report(module: ModuleOp) -> dict[str, Any]:
    from logos_ir.passes.cuda.host_plan import plan_of

    plan = plan_of(module)
    sizes = {"bf16": 2, "f32": 4, "i64": 8}
    weight_bytes = sum(int(np.prod(b.shape)) * sizes[b.element] for b in plan.buffers.values() if b.kind == "weight")
    cache_bytes = sum(int(np.prod(b.shape)) * 4 for b in plan.buffers.values() if b.kind == "cache")
    return {
        "kernels": len(plan.kernels),
        "kernel_names": sorted(plan.kernels),
        "launches": len(plan.launches),
        "all_reduces": len(plan.steps) - len(plan.launches),
        "weight_bytes": weight_bytes,
        "cache_bytes": cache_bytes,
        "chips": plan.chips,
    }


def weight_images(request: BuildRequest, module: ModuleOp, identity: Identity) -> list[Artifact]:
    """The device image of each chip's weights, in the order of the plan's weight buffers."""
    from logos_ir.passes.cuda.host_plan import bf16_bits, plan_of, weight_share

    plan = plan_of(module)
    store = request.model.store()
    images = []
    weights = [b for b in plan.buffers.values() if b.kind == "weight"]
    for chip in range(plan.chips):
        index, blobs, offset = [], [], 0
        for buffer in request.progress.over(weights, f"weights of chip {chip}"):
            share = np.ascontiguousarray(weight_share(store, buffer.name, buffer.shape, chip, plan.chips), np.float32)
            data = (bf16_bits(share) if buffer.element == "bf16" else share.astype("<f4")).tobytes()
            index.append(
                {"name": buffer.name, "offset": offset, "shape": list(buffer.shape), "element": buffer.element}
            )
            blobs.append(data + b"\0" * (-len(data) % ALIGN))
            offset += len(blobs[-1])
        header = IMAGE_MAGIC + f"{identity.line()}\n".encode() + json.dumps({"chip": chip, "buffers": index}).encode()
        if len(header) > HEADER_BYTES:
            header = IMAGE_MAGIC + f"{identity.line()}\nindex-at-end {offset}\n".encode()
            blobs.append(json.dumps({"chip": chip, "buffers": index}).encode())
        name = "weights.bin" if plan.chips == 1 else f"weights.chip{chip}.bin"
        data = header + b"\0" * (HEADER_BYTES - len(header)) + b"".join(blobs)
        images.append(Artifact(name, data, identity, kind="binary", role="weights"))
    return images
