"""`logos-compile --target cuda`: the CUDA lane's build of a decode step, prefill chunk or batch (split or not).

The build runs the lane's pipeline (`logos-to-cuda`) in one process on IR (no text round trip), verifying the IR
after each pass, then the emitter. Its artifacts, each headed by the identity line of the program it was lowered
from:

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

import hashlib
import io
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from xdsl.dialects.builtin import IntegerType, ModuleOp
from xdsl.printer import Printer

from logos_ir.build import Artifact, BuildRequest, LaneBuild, program_module
from logos_ir.dialects import cuda
from logos_ir.dialects.cuda import ALIGN, HEADER_BYTES, IMAGE_MAGIC
from logos_ir.errors import PassError
from logos_ir.passes.cuda.traffic import SIZES, buffer_bytes, step_bytes
from logos_ir.program import Identity


def lower(module: ModuleOp, weights: str) -> ModuleOp:
    """The lane's pipeline (`logos-to-cuda`, every stage of it) on `module` in place (a `logos.program` in, the
    lowered module out), verified after each pass."""
    from logos_ir.registry import run_pipeline

    return run_pipeline("logos-to-cuda", {"weights": weights}, module)


def module_text(module: ModuleOp, identity: Identity) -> str:
    """step.mlir: the lowered module in generic form and upstream MLIR's spelling (`host_plan.to_upstream`), so
    upstream tools parse and verify it (the lane's `cuda` ops as unregistered ones)."""
    from logos_ir.passes.cuda.host_plan import to_upstream

    out = io.StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return f"// {identity.line()}\n{to_upstream(out.getvalue())}\n"


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
    report.update(tensor_core_report(module))  # each tensor-core product's HBM bytes against the minimum
    report["ptxas"] = measured_kernels(request, artifacts[0].data.decode(), module)
    report["latency_model"] = latency_model(module, report["ptxas"])
    if request.with_weights:
        artifacts += weight_images(request, module, identity)
    return LaneBuild(artifacts, report, build_summary(report))


def build_summary(report: dict[str, Any]) -> list[str]:
    """The lines logos-compile prints for a build, one figure a quantity, each named for what it is: the weights a
    chip holds (every table whole), the bytes a chip's step reads, and the least a step must read (the weights it
    uses, the embedding one row, and the full cache)."""
    return [
        f"{report['kernels']} kernels, {report['launches']} launches a step, "
        f"{report['weight_bytes'] / 1e6:.1f} MB of weights held (each chip)",
        f"{report['launches_per_layer']} launches a layer; each chip reads {report['bytes_read'] / 1e6:.1f} MB a step"
        f" against a minimum of {report['bytes_minimum'] / 1e6:.1f} MB (the weights a step uses and the full cache)",
        *_experts_summary(report),
        ptxas_summary(report["ptxas"]),
        *latency_summary(report.get("latency_model")),
    ]


def _experts_summary(report: dict[str, Any]) -> list[str]:
    if "expert_weight_bytes" not in report:
        return []
    return [
        f"experts: {report['expert_bytes_read'] / 1e6:.1f} MB of their {report['expert_weight_bytes'] / 1e6:.1f} MB"
        f" read a step (the chosen ones); active parameters {report['active_weight_bytes'] / 1e6:.1f} MB, read"
        f" {report['bytes_read_per_active_byte']:.3f}x of them a step"
    ]


def latency_model(module: ModuleOp, ptxas: dict[str, Any] | str) -> dict[str, Any] | None:
    """The decode step's latency model (`cost_model.latency_report`) at ptxas's occupancy where measured; None for
    other cuts (prefill chunks and batches are reported by `tensor_core_products`)."""
    from logos_ir.passes.cuda.cost_model import latency_report
    from logos_ir.passes.cuda.host_plan import plan_of

    plan = plan_of(module)
    tokens = next((b for b in plan.buffers.values() if b.kind == "input" and b.name.startswith("token")), None)
    if tokens is None or int(np.prod(tokens.shape)) != 1:
        return None
    occupancy = None
    if not isinstance(ptxas, str):
        occupancy = {name: k["blocks_per_sm"] * 4 for name, k in ptxas["kernels"].items()}
    return latency_report(plan, occupancy)


def latency_summary(model: dict[str, Any] | None) -> list[str]:
    """The summary's line on the latency model: the step's estimated fraction of HBM at each live length."""
    if not model or not model["steps"]:
        return []
    parts = [
        f"ctx {live}: {step['hbm_fraction'][0]:.0%}-{step['hbm_fraction'][1]:.0%}"
        for live, step in model["steps"].items()
    ]
    return [f"estimated fraction of HBM a step (latency model, {model['occupancy']} occupancy): {', '.join(parts)}"]


# -- HBM traffic of the products (the build report) -----------------------------------------------------------------

_KINDS = (
    *("linear", "linear_residual", "linear_bias", "linear_bias_residual"),
    *("gate_up", "gate_up_bias", "gate_up_gelu_tanh", "gate_up_bias_gelu_tanh"),
)
_PRODUCTS = tuple(f"{kind}_{core}_" for kind in _KINDS for core in ("tc", "wgmma"))
WGMMA_BLOCKS_PER_SM = 1  # a Hopper product's 128 KB TMA ring: one block an SM
BLOCKS_PER_SM = 4  # the emitter's launch bound (and 40 KB of shared memory a block fits 4 times in 228 KB)
L2_BYTES = 50 * 2**20  # H100 / H200 L2


def product_traffic(plan: Any) -> list[dict[str, Any]]:
    """Each distinct tensor-core product of a host plan (with its launch count): the bytes it must move at least
    (every weight, the activations and the output once) and the HBM bytes modelled from its grid: the row tiles of
    one weight tile are launched together (x fastest) and are resident together when they fit on the SMs, so each
    weight tile is read from HBM once a wave they share; the activations are read once while they fit in half the
    L2 (the other half streams weights), else once a wave of blocks (the resident blocks walk k together). L2-to-SM
    bytes (every block reads its tiles) are given beside. A model, computed from the launch: no GPU measured it."""
    out: dict[str, dict[str, Any]] = {}
    for launch in plan.launches:
        stem = launch.kernel.removeprefix("norm_")  # a folded norm: its scale is the last input
        if not stem.startswith(_PRODUCTS):
            continue
        hopper = "_wgmma_" in stem  # A is the bf16 image its conversion launch wrote (norm folded there)
        resident = SMS * (WGMMA_BLOCKS_PER_SM if hopper else BLOCKS_PER_SM)
        if launch.kernel in out:
            out[launch.kernel]["launches"] += 1
            continue
        buffers = [plan.buffers[name] for name in launch.buffers]
        ins = buffers[:-1]
        scales = [ins.pop()] if stem != launch.kernel else []
        count = 2 if stem.startswith("gate_up") else 1
        x, weights, outputs = ins[0], ins[1 : 1 + count], buffers[-1:]
        residual = [*ins[1 + count :], *scales]  # read once, as the output is written once
        size = {id(b): int(np.prod(b.shape)) * SIZES[b.element] for b in buffers}
        row_tiles, column_tiles, _ = launch.grid
        waves = -(-row_tiles * column_tiles // resident)
        weight_bytes = sum(size[id(w)] for w in weights)
        x_bytes = size[id(x)]
        rest = sum(size[id(b)] for b in (*residual, *outputs))
        weight_reads = -(-row_tiles // resident)  # row tiles of one weight tile that cannot be resident together
        x_reads = 1 if x_bytes <= L2_BYTES // 2 else waves
        minimum = weight_bytes + x_bytes + rest
        modelled = weight_bytes * weight_reads + x_bytes * x_reads + rest
        out[launch.kernel] = {
            "kernel": launch.kernel,
            "launches": 1,
            "grid": list(launch.grid),
            "minimum_bytes": minimum,
            "hbm_bytes": modelled,
            "ratio": round(modelled / minimum, 3),
            "l2_to_sm_bytes": weight_bytes * row_tiles + x_bytes * column_tiles + rest,
        }
    return list(out.values())


def tensor_core_report(module: ModuleOp) -> dict[str, Any]:
    """The build report's entry for the tensor-core products of a lowered module (nothing when it has none)."""
    from logos_ir.passes.cuda.host_plan import plan_of

    products = product_traffic(plan_of(module))
    return {"tensor_core_products": products} if products else {}


# -- registers, spills and bytes in flight, from ptxas ------------------------------------------------------------

# ptxas's figures for the kernels as the runtime compiles them (its NVCC_FLAGS: -O3 -fmad=false) for Hopper.
PTXAS_ARCH = "sm_90"
# wgmma and setmaxnreg are arch-specific features: PTX for sm_90a, whose cubin runs on compute capability 9.0 only
# (H100 / H200), not on a later GPU; a kernels.cu holding them is compiled for it.
PTXAS_ARCH_SPECIFIC = "sm_90a"


def ptxas_arch(source: str) -> str:
    """The architecture a kernels.cu is compiled for: sm_90a when a kernel uses wgmma, else sm_90."""
    return PTXAS_ARCH_SPECIFIC if "wgmma." in source else PTXAS_ARCH


PTXAS_FLAGS = ("-O3", "-fmad=false")
NOT_MEASURED = "nvcc not found: registers not measured"
SHARED_PER_SM, SHARED_RESERVED_PER_BLOCK = 228 * 1024, 1024  # Hopper: 228 KB of shared memory an SM, 1 KB a block
SMS = 132  # an H100 / H200 SXM
_PTXAS_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
_measured: dict[str, dict[str, Any]] = {}  # ptxas's figures by the SHA-256 of a source (its identity line aside)


def measured_kernels(request: BuildRequest, source: str, module: ModuleOp) -> dict[str, Any] | str:
    """The build report's `ptxas`: each kernel's registers and spills as ptxas reports them compiling kernels.cu
    for sm_90 with the runtime's flags, the blocks an SM holds at them and, for each GEMV, the weight bytes it keeps
    in flight an SM; or why not (no nvcc on PATH; `ptxas=off` in the request's options, for builds that only need
    the code, as the runtime's own and the tests')."""
    setting = request.options.get("ptxas", "on")
    unknown = sorted(set(request.options) - {"ptxas"})
    if unknown or setting not in ("on", "off"):
        raise PassError(f"target cuda takes the option ptxas=on|off only, not {', '.join(unknown) or setting}")
    if setting == "off":
        return "not measured (ptxas=off)"
    resources = kernel_resources(source)
    if isinstance(resources, str):
        return resources
    from logos_ir.passes.cuda.host_plan import plan_of

    return resource_report(resources, plan_of(module))


def kernel_resources(source: str) -> dict[str, Any] | str:
    """ptxas's figures for a kernels.cu (`nvcc -arch=sm_90 -cubin -O3 -fmad=false -Xptxas -v`): the tool's version
    and, per kernel, registers a thread, spill store and load bytes, barriers and static shared memory bytes; or
    `NOT_MEASURED` where nvcc is not on PATH."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return NOT_MEASURED
    key = hashlib.sha256(source.split("\n", 1)[-1].encode()).hexdigest()
    if key not in _measured:
        arch = ptxas_arch(source)
        with tempfile.TemporaryDirectory() as folder:
            cu = Path(folder) / "kernels.cu"
            cu.write_text(source)
            command = [nvcc, f"-arch={arch}", "-cubin", *PTXAS_FLAGS, "-Xptxas", "-v", "-diag-suppress", "177"]
            done = subprocess.run(
                [*command, "-o", str(Path(folder) / "kernels.cubin"), str(cu)], capture_output=True, text=True,
                timeout=900,
            )  # fmt: skip
            version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        if done.returncode:
            raise PassError(f"nvcc refused the emitted kernels.cu: {done.stderr[-2000:]}")
        _measured[key] = {
            "nvcc": version.strip().splitlines()[-2] if version.strip() else "nvcc",
            "command": f"nvcc -arch={arch} -cubin {' '.join(PTXAS_FLAGS)} -Xptxas -v",
            "arch": arch,
            "kernels": parse_ptxas(done.stderr + done.stdout),
        }
    return json.loads(json.dumps(_measured[key]))  # a copy


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """Each kernel's figures from ptxas's `-v` report."""
    found: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        if m := _PTXAS_FUNCTION.search(line):
            current = m.group(1)
            found[current] = {"registers": 0, "spill_stores": 0, "spill_loads": 0, "barriers": 0, "shared_bytes": 0}
        elif current and (m := _PTXAS_SPILL.search(line)):
            found[current]["spill_stores"], found[current]["spill_loads"] = int(m.group(1)), int(m.group(2))
        elif current and (m := _PTXAS_USED.search(line)):
            registers, barriers, shared = m.groups()
            found[current].update(registers=int(registers), barriers=int(barriers or 0), shared_bytes=int(shared or 0))
    return found


def resource_report(resources: dict[str, Any], plan: Any) -> dict[str, Any]:
    """ptxas's figures per kernel with what follows from them: the blocks an SM holds (registers and shared memory),
    and for each GEMV the weight bytes in flight an SM, at that occupancy and at the blocks its grid gives each of
    132 SMs on average (`bytes_in_flight_per_sm_at_grid`: a grid of fewer blocks than the SMs hold leaves them
    idle; split-K or more blocks is the remedy)."""
    in_flight = loads_in_flight(plan)
    grids: dict[str, int] = {}
    threads: dict[str, int] = {}
    for launch in plan.launches:
        blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
        grids[launch.kernel] = max(grids.get(launch.kernel, 0), blocks)
        threads[launch.kernel] = launch.block
    kernels = {}
    for name, figures in sorted(resources["kernels"].items()):
        entry = dict(figures)
        dynamic = _dynamic_shared(plan.kernels.get(name))  # ptxas reports static shared memory only
        if dynamic:
            entry["dynamic_shared_bytes"] = dynamic
        shared = figures["shared_bytes"] + dynamic
        entry["blocks_per_sm"] = occupancy(figures["registers"], threads.get(name, 128), shared)
        if name in in_flight:
            per_sm = in_flight[name] * 128 * entry["blocks_per_sm"]
            at_grid = round(in_flight[name] * 128 * min(entry["blocks_per_sm"], grids.get(name, 0) / SMS))
            entry.update(
                bytes_in_flight_per_thread=in_flight[name], bytes_in_flight_per_sm=per_sm,
                of_needed=round(per_sm / NEEDED_IN_FLIGHT, 2), grid_blocks=grids.get(name, 0),
                bytes_in_flight_per_sm_at_grid=at_grid,
            )  # fmt: skip
        kernels[name] = entry
    return {**resources, "kernels": kernels}


def ptxas_summary(ptxas: dict[str, Any] | str) -> str:
    """The build summary's line on registers, spills and bytes in flight."""
    if isinstance(ptxas, str):
        return f"registers and spills: {ptxas}"
    kernels = ptxas["kernels"].values()
    registers = [k["registers"] for k in kernels]
    spilled = [name for name, k in ptxas["kernels"].items() if k["spill_stores"] or k["spill_loads"]]
    flights = [k["bytes_in_flight_per_sm"] for k in kernels if "bytes_in_flight_per_sm" in k]
    arch = ptxas.get("arch", PTXAS_ARCH)
    only = " (arch-specific: runs on compute capability 9.0 only)" if arch == PTXAS_ARCH_SPECIFIC else ""
    line = f"ptxas ({arch}{only}): {min(registers, default=0)}-{max(registers, default=0)} registers a thread, "
    line += f"spills in {', '.join(spilled)}" if spilled else f"no spill in {len(registers)} kernels"
    if flights:
        line += (
            f"; GEMVs keep {min(flights) / 1024:.0f}-{max(flights) / 1024:.0f} KB of weights in flight an SM at their"
            f" occupancy ({NEEDED_IN_FLIGHT // 1024} KB needed)"
        )
    return line


NEEDED_IN_FLIGHT = 29 * 1024  # bytes in flight an H200 SM needs: 4.8 TB/s x ~800 ns of latency / 132 SMs
REGISTERS_PER_SM, MAX_WARPS_PER_SM, MAX_BLOCKS_PER_SM = 65536, 64, 32  # Hopper (sm_90)


def plan_report(module: ModuleOp) -> dict[str, Any]:
    """The step's counts from its host plan and kernels: kernels, launches (a layer's at most), all-reduces, the
    weight and cache bytes, the bytes the step reads against the minimum (`step_bytes`, the cache full), and each
    projection's 16-byte weight loads in flight per thread (`loads_in_flight`)."""
    from logos_ir.passes.cuda.host_plan import plan_of

    plan = plan_of(module)
    weight_bytes = sum(buffer_bytes(b) for b in plan.buffers.values() if b.kind == "weight")
    cache_bytes = sum(buffer_bytes(b) for b in plan.buffers.values() if b.kind == "cache")
    read, minimum = step_bytes(plan)
    return {
        "kernels": len(plan.kernels),
        "kernel_names": sorted(plan.kernels),
        "launches": len(plan.launches),
        "launches_per_layer": launches_per_layer(plan),
        "all_reduces": len(plan.all_reduces),
        "all_gathers": len(plan.all_gathers),  # a split head's logits
        "weight_bytes": weight_bytes,
        "cache_bytes": cache_bytes,
        "bytes_read": read,
        "bytes_minimum": minimum,
        "loads_in_flight": loads_in_flight(plan),
        "chips": plan.chips,
        **_experts_report(plan),
    }


def _experts_report(plan: Any) -> dict[str, Any]:
    """A mixture's figures: the stacked experts' bytes, what a step reads of them (its rows' chosen experts, at
    most every expert held), and the active parameters' bytes (every weight whole, the embedding's table too, but
    of the stacked experts only those a step chooses) with the bytes a step reads against them."""
    from logos_ir.passes.cuda.traffic import expert_bytes

    read, whole = expert_bytes(plan)
    if not whole:
        return {}
    weights = sum(buffer_bytes(b) for b in plan.buffers.values() if b.kind == "weight")
    active = weights - whole + read
    return {
        "expert_weight_bytes": whole,
        "expert_bytes_read": read,
        "active_weight_bytes": active,
        "bytes_read_per_active_byte": step_bytes(plan)[0] / active,
    }


def launches_per_layer(plan: Any) -> int:
    """The most launches that read one layer's weights or caches."""
    import re

    counts: dict[str, int] = {}
    for launch in plan.launches:
        layers = {
            m.group(1) for name in launch.buffers for m in [re.search(r"(?:layers|cache\.\w+)\.(\d+)", name)] if m
        }
        for layer in layers:
            counts[layer] = counts.get(layer, 0) + 1
    return max(counts.values(), default=0)


def loads_in_flight(plan: Any) -> dict[str, int]:
    """Each projection kernel's bytes of weight loads a thread issues per step of its main loop (all issued before
    the first is used): the bytes each thread keeps in flight."""
    found: dict[str, int] = {}
    for name, kernel in plan.kernels.items():
        loops = [op for op in kernel.walk() if op.name == "scf.for"]
        if not loops:
            continue
        weights = {arg for arg in kernel.body.block.args if arg.name_hint in ("weight", "gate", "up")}
        if not weights:
            continue
        body = loops[0].body.block
        total = 0
        for op in body.ops:
            if op.name in ("vector.load", "memref.load") and op.operands[0] in weights:  # (units of stored blocks)
                element = op.operands[0].type.element_type
                size = (
                    element.width.data // 8 if isinstance(element, IntegerType) else 2 if "bf16" in str(element) else 4
                )
                total += (op.results[0].type.get_shape()[0] if op.name == "vector.load" else 1) * size
        if total:
            found[name] = total
    return found


def _dynamic_shared(kernel: Any) -> int:
    """The dynamic shared memory a kernel's launch asks for (a Hopper product's TMA ring and barriers)."""
    if kernel is None or not any(isinstance(op, cuda.TmaLoadOp) for op in kernel.walk()):
        return 0
    return cuda.shared_layout(kernel)[1]


def occupancy(registers: int, threads: int = 128, shared: int = 0) -> int:
    """Blocks an sm_90 SM holds at `registers` a thread and `shared` bytes of shared memory a block:
    registers are given a warp 256 at a time, shared memory a block with 1 KB reserved (CUDA's occupancy rules)."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    warps = min(REGISTERS_PER_SM // per_warp, MAX_WARPS_PER_SM)
    blocks = min(warps // (threads // 32), MAX_BLOCKS_PER_SM)
    if shared:
        blocks = min(blocks, SHARED_PER_SM // (shared + SHARED_RESERVED_PER_BLOCK))
    return blocks


def weight_images(request: BuildRequest, module: ModuleOp, identity: Identity) -> list[Artifact]:
    """The device image of each chip's weights, in the order of the plan's weight buffers."""
    from logos_ir.passes.cuda.host_plan import UNIT_BYTES, plan_of, stored_share, weight_share

    plan = plan_of(module)
    store = request.model.store()
    images = []
    weights = [b for b in plan.buffers.values() if b.kind == "weight"]
    for chip in range(plan.chips):
        index, blobs, offset = [], [], 0
        for buffer in request.progress.over(weights, f"weights of chip {chip}"):
            element = "bf16" if buffer.element == "bf16" else "f32"  # bf16: bit patterns rounded to nearest even
            if buffer.element in UNIT_BYTES:  # read as stored: the blocks' bytes as the file holds them
                data = stored_share(store, buffer.name, buffer.shape, buffer.element, chip, plan.chips).tobytes()
            else:
                data = (
                    weight_share(store, buffer.name, buffer.shape, chip, plan.chips, element)
                    .astype("<u2" if element == "bf16" else "<f4")
                    .tobytes()
                )
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
