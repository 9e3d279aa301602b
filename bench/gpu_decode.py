"""The CUDA lane on one GPU (an H200 here): one prepared script, under 10 minutes (it stops starting work at 9).

    python3 bench/gpu_decode.py                 # on a machine with a CUDA GPU and cupy
    python3 bench/gpu_decode.py --cpu-agreement # no GPU needed: the bf16 agreement of the emulated kernels

On a GPU it
1. builds and runs the embedded SmolLM2-135M end to end (f32 image) and checks its greedy tokens against the
   reference interpreter's, then times the bf16 image;
2. for a `smollm2-135m`-shaped model at ctx 1024 and a `llama-3.1-8b`-shaped one at ctx 256, 1024 and 8192, with
   random bf16 weights (made on the GPU): decode tokens/s at batch 1 with the bf16 cache filled (the step replayed
   as a CUDA graph through the host runtime; the eager step, the capture and 3 replays outside the clock), beside
   the same step captured with plain launches (no programmatic dependent launch) on the same buffers, the
   achieved bandwidth (the bytes the step reads as its plan reads them, `passes/cuda/traffic.step_bytes`) against a
   read-only kernel and a device-to-device copy measured in the same run (compiled and warmed before timing) and
   the minimum bytes against the published peak, the latency model's band for the same step; each distinct kernel
   timed alone with the L2 flushed (256 MB written) before every launch, each projection beside cuBLAS's GEMV
   (`cublasGemmEx`, n = 1, on the same bytes) and a device copy of its weight's bytes;
3. the tensor-core prefill figures (`bench/gpu_prefill.py`: each product beside `cupy.matmul`) in the same run;
4. appends its rows, dated and naming the device, to docs/benchmarks.md (`--no-docs`: print only).

`--cpu-agreement` runs the embedded model teacher-forced over 64 decode steps through the reference and the
emulated lane with bf16 weights: next-token agreement (the lane is held to >= 98%) and the logits' cosine (>= 0.999).
Without a GPU (and without `--cpu-agreement`) the script says so and exits 1: it claims no GPU figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12}
CTX = 1024
DECODE_REPEATS = 50
PREFILL_ROWS = 512


PROMPTS = [
    "Once upon a time, in a small village far away, there lived an old man who",
    "The capital of France is",
    "def fibonacci(n):\n",
]


def cpu_agreement(steps: int) -> dict[str, Any]:
    from logos_ir.runtime.cuda.agreement import teacher_forced
    from logos_ir.tokenizer import Tokenizer
    from logos_ir.weights import open_model

    store = open_model(None)
    tokenizer = Tokenizer.from_store(store)
    assert tokenizer is not None
    report: dict[str, Any] = {"prompts": []}
    matches: list[bool] = []
    for text in PROMPTS:
        started = time.perf_counter()
        result = teacher_forced(store, tokenizer.encode(text), steps, "bf16", prefill_rows=16)
        matches += result.matches
        misses = [i for i, ok in enumerate(result.matches) if not ok]
        report["prompts"].append(
            {
                "prompt": text,
                "steps": len(result.matches),
                "agreement": round(result.agreement, 4),
                "min_cosine": round(result.min_cosine, 6),
                "mean_cosine": round(float(np.mean(result.cosines)), 6),
                "missed_steps": misses,
                "reference_margin_at_misses": [round(result.margins[i], 4) for i in misses],
                "median_margin": round(float(np.median(result.margins)), 4),
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    report["agreement_all"] = round(sum(matches) / len(matches), 4)
    return report


# -- on the GPU ------------------------------------------------------------------------------------------------

WARMUP = 3
FLUSH_BYTES = (
    256 << 20
)  # written between per-kernel timings: 5x the H200's 50 MB L2, so no kernel finds its bytes there
CONTEXTS = (256, 1024, 8192)
DEADLINE_S = 540  # the run stops starting new work after 9 minutes (an H200 loan gives 10 a command)


class Clock:
    """Timings on one stream with CUDA events: every piece of work is run WARMUP times first (kernels compiled and
    loaded, graphs instantiated, caches warm where that is the point), then timed; `flushed` writes FLUSH_BYTES
    before each timed repetition and times each one alone, so the L2 holds nothing of the kernel's inputs."""

    def __init__(self, cp: Any, stream: Any):
        self.cp, self.stream = cp, stream
        with stream:
            self.flush = cp.empty(FLUSH_BYTES // 4, cp.float32)
        stream.synchronize()

    def warm(self, work: Any, repeats: int) -> float:
        for _ in range(WARMUP):
            work()
        self.stream.synchronize()
        start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record(self.stream)
        for _ in range(repeats):
            work()
        stop.record(self.stream)
        stop.synchronize()
        return self.cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeats

    def flushed(self, work: Any, repeats: int) -> float:
        for _ in range(WARMUP):
            work()
        times = []
        for _ in range(repeats):
            with self.stream:
                self.flush.fill(0)
            start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
            start.record(self.stream)
            work()
            stop.record(self.stream)
            stop.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return float(np.median(times))


def copy_bandwidth(cp: Any, clock: Clock) -> float:
    """Bytes a second of a device-to-device copy of 2 GiB (read plus write)."""
    with clock.stream:
        source = cp.zeros(1 << 29, cp.float32)
        target = cp.empty_like(source)

    def copy() -> None:
        with clock.stream:
            target[...] = source

    return 2 * source.nbytes / clock.warm(copy, 10)


READ_ONLY = r"""
extern "C" __global__ void read_only(const uint4* __restrict__ data, unsigned long long n, unsigned int* out)
{
    uint4 acc = make_uint4(0u, 0u, 0u, 0u);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {  // four 16-byte loads in flight a thread
        const uint4 a = data[i], b = data[i + stride], c = data[i + 2 * stride], d = data[i + 3 * stride];
        acc.x ^= a.x ^ b.x ^ c.x ^ d.x; acc.y ^= a.y ^ b.y ^ c.y ^ d.y;
        acc.z ^= a.z ^ b.z ^ c.z ^ d.z; acc.w ^= a.w ^ b.w ^ c.w ^ d.w;
    }
    for (; i < n; i += stride) { const uint4 a = data[i]; acc.x ^= a.x; acc.y ^= a.y; acc.z ^= a.z; acc.w ^= a.w; }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) out[0] = 1u;  // keeps every load
}
"""


def read_bandwidth(cp: Any, clock: Clock) -> float:
    """Bytes a second a read-only kernel streams from 2 GiB (16-byte loads, four in flight a thread): the ceiling a
    decode step, which reads far more than it writes, is held to. Compiled before the clock starts."""
    with clock.stream:
        data = cp.zeros(1 << 29, cp.uint32)
        out = cp.zeros(1, cp.uint32)
    kernel = cp.RawKernel(READ_ONLY, "read_only")
    kernel.compile()
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    vectors = data.nbytes // 16

    def read() -> None:
        with clock.stream:
            kernel((sms * 8,), (256,), (data, cp.uint64(vectors), out))

    return data.nbytes / clock.warm(read, 10)


_CUDA_R_16BF, _CUDA_R_32F, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT = 14, 0, 68, -1


def cublas_gemv(cp: Any, clock: Clock, rows: int, depth: int) -> float:
    """cuBLAS on the same bytes as a bf16 GEMV of `rows` x `depth` (y = W x, W row-major bf16, x and y f32 accumulate):
    cublasGemmEx with n = 1 (bf16 A, bf16 x, f32 y, f32 compute), its time with the L2 flushed first."""
    from cupy_backends.cuda.libs import cublas  # type: ignore[import-not-found]

    with clock.stream:
        # 2-byte elements that cuBLAS reads as bf16 (the time does not depend on the values; cupy has no bf16 dtype)
        weight = cp.random.standard_normal((rows, depth), dtype=cp.float32).astype(cp.float16)
        x = cp.random.standard_normal(depth, dtype=cp.float32).astype(cp.float16)
        y = cp.zeros(rows, cp.float32)
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, clock.stream.ptr)
    one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)

    def gemv() -> None:
        # column-major view: W^T is depth x rows with leading dimension depth; op(A) = A^T gives rows x depth
        cublas.gemmEx(
            handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, rows, 1, depth,
            one.ctypes.data, weight.data.ptr, _CUDA_R_16BF, depth, x.data.ptr, _CUDA_R_16BF, depth,
            zero.ctypes.data, y.data.ptr, _CUDA_R_32F, rows, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    return clock.flushed(gemv, 10)


def device_copy(cp: Any, clock: Clock, nbytes: int) -> float:
    """A device-to-device copy of `nbytes` (read `nbytes`, write as many), L2 flushed first."""
    with clock.stream:
        source = cp.zeros(nbytes // 2, cp.uint16)
        target = cp.empty_like(source)

    def copy() -> None:
        with clock.stream:
            target[...] = source

    return clock.flushed(copy, 10)


class RandomGpuWeights:
    """Random bf16 weights made on the GPU (a 8B model's 16 GB never pass through the host), given to the host
    runtime through its `on_device` hook."""

    def __init__(self, cp: Any):
        self.cp = cp

    def on_device(self, device: Any, chip: int, buffer: Any) -> Any:
        cp = self.cp
        with device.stream:
            values = cp.random.standard_normal(buffer.shape, dtype=cp.float32) * 0.02
            if buffer.name.endswith("norm.weight"):
                values += 1.0
            if buffer.element != "bf16":
                return values
            return (values.view(cp.uint32) >> 16).astype(cp.uint16)


def plain_launch_step(program: Any, device: Any, clock: Clock, inputs: dict[str, np.ndarray]) -> float | None:
    """The same step with every kernel launched plainly (no programmatic dependent launch), captured afresh as its
    own graph on the same buffers and timed as the programmatic one was: the baseline that launch is measured
    against, in the same run. None on a GPU older than Hopper, where every launch is already plain."""
    if not device.programmatic:
        return None
    device.programmatic, program.graphs = False, None
    try:
        program.run(**inputs)  # eager, then captured with plain launches
        program.run(**inputs)
        return clock.warm(program.step, DECODE_REPEATS)
    finally:
        device.programmatic, program.graphs = True, None


def shaped_model(cp: Any, clock: Clock, name: str, ctx: int, peak: float, copy: float, read: float) -> dict[str, Any]:
    """Decode at batch 1 with the cache filled to `ctx`, the step replayed as a CUDA graph through the host runtime
    (the eager step, the capture and WARMUP replays outside the clock); the bytes the step reads counted as the plan
    reads them (one embedding row, the live cache); each distinct kernel of layer 0 timed alone with the L2 flushed,
    beside cuBLAS's GEMV and a device copy of the same bytes where it is a projection; the latency model's estimate
    of the same step for comparison."""
    from logos_ir.passes.cuda.cost_model import step_estimate
    from logos_ir.passes.cuda.traffic import kernel_reads, launch_bytes, step_bytes
    from logos_ir.program import Cut
    from logos_ir.runtime.cuda.artifacts import build_program
    from logos_ir.runtime.cuda.devices import Gpu
    from logos_ir.runtime.cuda.host import HostRuntime
    from logos_ir.runtime.cuda.ranks import LocalRanks
    from logos_ir.spec import ModelSpec

    spec = ModelSpec.preset(name)
    plan, source, _ = build_program(spec, Cut.decode(ctx), 1, "bf16")
    device = Gpu(0, cp)
    device.stream = clock.stream
    runtime = HostRuntime(spec, RandomGpuWeights(cp), [device], LocalRanks())
    program = runtime.program(plan, source, graph=True)
    with device.stream:
        for cache in runtime.caches[0].values():  # a context of ctx positions, bf16 bit patterns
            cache[...] = (cp.random.standard_normal(cache.shape, dtype=cp.float32).view(cp.uint32) >> 16).astype(
                cache.dtype
            )
    inputs = {"token": np.array([1], np.int64), "position": np.array([ctx], np.int64)}
    program.run(**inputs)  # eager (kernels compiled and loaded here), then captured and replayed
    program.run(**inputs)
    step = clock.warm(program.step, DECODE_REPEATS)
    plain = plain_launch_step(program, device, clock, inputs)
    per_kernel: dict[str, dict[str, Any]] = {}
    arrays = program.chips[0]
    for launch in plan.launches:
        if launch.kernel in per_kernel:
            continue
        args = [arrays[n] for n in launch.buffers]
        seconds = clock.flushed(lambda s=launch, a=args: device.launch(s.kernel, s.grid, s.block, a), 10)
        reads = kernel_reads(plan.kernels[launch.kernel])
        moved = sum(launch_bytes(plan, launch, n, ctx) for n, r in zip(launch.buffers, reads, strict=True) if r)
        entry: dict[str, Any] = {"us": round(seconds * 1e6, 2), "tb_per_s": round(moved / seconds / 1e12, 3)}
        weight = next((plan.buffers[n] for n in launch.buffers if plan.buffers[n].kind == "weight"), None)
        if weight is not None and len(weight.shape) == 2 and weight.element == "bf16":
            rows, depth = weight.shape
            rows *= 2 if launch.kernel.startswith(("gate_up", "norm_gate_up")) else 1
            entry["cublas_gemv_us"] = round(cublas_gemv(cp, clock, rows, depth) * 1e6, 2)
            entry["device_copy_us"] = round(device_copy(cp, clock, rows * depth * 2) * 1e6, 2)
        per_kernel[launch.kernel] = entry
    moved, minimum = step_bytes(plan, live=ctx)
    model = step_estimate(plan, ctx)
    plain_model = step_estimate(plan, ctx, programmatic=False)
    return {
        "model": f"{name}-shaped, random bf16 weights, bf16 cache at {ctx} positions",
        "ctx": ctx,
        "launches": len(plan.launches),
        "decode_step_ms": round(step * 1e3, 3),
        "modelled_step_ms": [round(t * 1e3, 3) for t in model["seconds"]],
        "programmatic_launches": sum(e["gap"] == "programmatic_gap_s" for e in model["launches"]),
        "plain_launch_step_ms": None if plain is None else round(plain * 1e3, 3),
        "modelled_plain_launch_step_ms": [round(t * 1e3, 3) for t in plain_model["seconds"]],
        "tokens_per_s": round(1 / step, 1),
        "bytes_per_step": moved,
        "minimum_bytes_per_step": minimum,
        "bandwidth_tb_per_s": round(moved / step / 1e12, 3),
        "fraction_of_read_only": round(moved / step / read, 3),
        "fraction_of_copy": round(moved / step / copy, 3),
        "fraction_of_peak": round(minimum / step / peak, 3),
        "kernels": per_kernel,
    }


def embedded(cp: Any) -> dict[str, Any]:
    from logos_ir.generate import Generator
    from logos_ir.runtime import RunRequest
    from logos_ir.runtime.cuda.generator import cuda_generator
    from logos_ir.tokenizer import Tokenizer
    from logos_ir.weights import open_model

    store = open_model(None)
    tokenizer = Tokenizer.from_store(store)
    assert tokenizer is not None
    prompt = tokenizer.encode("The capital of France is")
    want = Generator(store, ctx=CTX).generate(prompt, 32)
    got = cuda_generator(RunRequest(store, CTX, 16, 1, "f32")).generate(prompt, 32)
    fast = cuda_generator(RunRequest(store, CTX, 16, 1, "bf16"))
    fast.generate(prompt, 8)  # warm-up: compiles, captures the graph
    fast.generate(prompt, 64)
    return {
        "tokens_match_reference_f32": got == want,
        "bf16_decode_tokens_per_s": round(fast.stats.decode_tokens_per_s, 1),
        "text_f32": tokenizer.decode(got),
    }


def on_gpu(started: float) -> dict[str, Any]:
    import cupy  # type: ignore[import-not-found]

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    peak = next((v for k, v in PEAK_BYTES_PER_S.items() if k in name), PEAK_BYTES_PER_S["H200"])
    clock = Clock(cupy, cupy.cuda.Stream(non_blocking=True))
    copy, read = copy_bandwidth(cupy, clock), read_bandwidth(cupy, clock)
    report: dict[str, Any] = {
        "device": name,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "copy_tb_per_s": round(copy / 1e12, 3),
        "read_only_tb_per_s": round(read / 1e12, 3),
        "peak_tb_per_s": peak / 1e12,
        "models": [],
        "skipped": [],
    }
    report["embedded"] = embedded(cupy)
    for model, ctx in [("smollm2-135m", 1024)] + [("llama-3.1-8b", c) for c in CONTEXTS]:
        if time.perf_counter() - started > DEADLINE_S:
            report["skipped"].append(f"{model} ctx {ctx}: past the {DEADLINE_S} s deadline")
            continue
        report["models"].append(shaped_model(cupy, clock, model, ctx, peak, copy, read))
        cupy.get_default_memory_pool().free_all_blocks()
    if time.perf_counter() - started < DEADLINE_S:
        report["tensor_core_prefill"] = __import__("gpu_prefill").on_gpu()  # bench/gpu_prefill.py: cupy.matmul beside
    else:
        report["skipped"].append("prefill: past the deadline")
    return report


def benchmark_rows(report: dict[str, Any]) -> str:
    """The run's rows for docs/benchmarks.md: one a decode step, then each kernel beside cuBLAS and a copy."""
    lines = [
        f"### CUDA on a GPU: `python3 bench/gpu_decode.py` ({report['date']}, {report['device']})",
        "",
        f"Device copy {report['copy_tb_per_s']} TB/s (read + write), read-only kernel {report['read_only_tb_per_s']}"
        f" TB/s, peak {report['peak_tb_per_s']} TB/s. Each decode step replayed as a CUDA graph, warm; per-kernel"
        " times with the L2 flushed before each launch (median of 10).",
        "",
        "| model | ctx | step ms (model's band) | plain launches: step ms (model's band) | tokens/s | minimum MB"
        " | of peak | of read-only kernel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in report["models"]:
        plain = m["modelled_plain_launch_step_ms"]
        lines.append(
            f"| {m['model'].split(',')[0]} | {m['ctx']} | {m['decode_step_ms']} ({m['modelled_step_ms'][0]}-"
            f"{m['modelled_step_ms'][1]}) | {m['plain_launch_step_ms']} ({plain[0]}-{plain[1]}) | {m['tokens_per_s']}"
            f" | {m['minimum_bytes_per_step'] / 1e6:.1f} | {m['fraction_of_peak']:.0%}"
            f" | {m['fraction_of_read_only']:.0%} |"
        )
    lines += [
        "",
        "| model | ctx | kernel | us | TB/s | cuBLAS GEMV us | device copy us |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in report["models"]:
        for kernel, k in m["kernels"].items():
            lines.append(
                f"| {m['model'].split(',')[0]} | {m['ctx']} | `{kernel[:40]}` | {k['us']} | {k['tb_per_s']}"
                f" | {k.get('cublas_gemv_us', '')} | {k.get('device_copy_us', '')} |"
            )
    if report.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


def write_rows(report: dict[str, Any], path: str) -> None:
    """Append the run's rows to docs/benchmarks.md (each run its own dated section)."""
    with open(path, "a", encoding="utf-8") as out:
        out.write("\n" + benchmark_rows(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-agreement", action="store_true", help="the bf16 agreement of the emulated kernels")
    parser.add_argument("--steps", type=int, default=64, help="teacher-forced decode steps (with --cpu-agreement)")
    parser.add_argument("--docs", default="docs/benchmarks.md", help="where the GPU run appends its rows")
    parser.add_argument("--no-docs", action="store_true", help="print the figures only")
    args = parser.parse_args(argv)
    if args.cpu_agreement:
        print(json.dumps(cpu_agreement(args.steps), indent=2))
        return 0
    from logos_ir.runtime.cuda.devices import NO_GPU, gpu_count

    if gpu_count() == 0:
        print(f"gpu_decode: {NO_GPU.replace('add --emulate', 'run --cpu-agreement')}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    report = on_gpu(started)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
    if not args.no_docs:
        write_rows(report, args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
