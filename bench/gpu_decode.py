"""The CUDA lane on one GPU (an H200 here): one prepared script, under 5 minutes.

    python3 bench/gpu_decode.py                 # on a machine with a CUDA GPU and cupy
    python3 bench/gpu_decode.py --cpu-agreement # no GPU needed: the bf16 agreement of the emulated kernels

On a GPU it
1. builds and runs the embedded SmolLM2-135M end to end (f32 image) and checks its greedy tokens against the
   reference interpreter's, then times the bf16 image;
2. for a `smollm2-135m`-shaped and a `llama-3.1-8b`-shaped model with random bf16 weights (made on the GPU): decode
   tokens/s at batch 1 with the bf16 cache filled to ctx 1024 (the step replayed as a CUDA graph through the host
   runtime), the time of each kernel, and the achieved bandwidth (the bytes the step reads as its plan reads them:
   one embedding row, the live cache, `passes/cuda/build.step_bytes`; / step time) as a fraction of a read-only
   kernel's bandwidth and of a device-to-device copy, both measured in the same run, and of the published peak;
3. the tensor-core prefill figures (`bench/gpu_prefill.py`) in the same run.

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


def _timer(cp: Any, stream: Any) -> Any:
    def timed(work: Any, repeats: int) -> float:
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(repeats):
            work()
        stop.record(stream)
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeats

    return timed


def copy_bandwidth(cp: Any, stream: Any) -> float:
    """Bytes a second of a device-to-device copy of 2 GiB (read plus write)."""
    source = cp.zeros(1 << 29, cp.float32)
    target = cp.empty_like(source)
    with stream:
        seconds = _timer(cp, stream)(lambda: target.__setitem__(slice(None), source), 10)
    return 2 * source.nbytes / seconds


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


def read_bandwidth(cp: Any, stream: Any) -> float:
    """Bytes a second a read-only kernel streams from 2 GiB (16-byte loads, four in flight a thread): the ceiling a
    decode step, which reads far more than it writes, is held to."""
    data = cp.zeros(1 << 29, cp.uint32)
    out = cp.zeros(1, cp.uint32)
    kernel = cp.RawKernel(READ_ONLY, "read_only")
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    vectors = data.nbytes // 16
    with stream:
        seconds = _timer(cp, stream)(lambda: kernel((sms * 8,), (256,), (data, cp.uint64(vectors), out)), 10)
    return data.nbytes / seconds


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


def shaped_model(cp: Any, name: str, peak: float, copy: float, read: float) -> dict[str, Any]:
    """Decode at batch 1 with the cache filled to CTX, the step replayed as a CUDA graph through the host runtime;
    the bytes the step reads counted as the plan reads them (one embedding row, the live cache)."""
    from logos_ir.passes.cuda.build import step_bytes
    from logos_ir.program import Cut
    from logos_ir.runtime.cuda.artifacts import build_program
    from logos_ir.runtime.cuda.devices import Gpu
    from logos_ir.runtime.cuda.host import HostRuntime
    from logos_ir.runtime.cuda.ranks import LocalRanks
    from logos_ir.spec import ModelSpec

    spec = ModelSpec.preset(name)
    plan, source, _ = build_program(spec, Cut.decode(CTX), 1, "bf16")
    device = Gpu(0, cp)
    runtime = HostRuntime(spec, RandomGpuWeights(cp), [device], LocalRanks())
    program = runtime.program(plan, source, graph=True)
    with device.stream:
        for cache in runtime.caches[0].values():  # a context of CTX positions, bf16 bit patterns
            cache[...] = (cp.random.standard_normal(cache.shape, dtype=cp.float32).view(cp.uint32) >> 16).astype(
                cache.dtype
            )
    inputs = {"token": np.array([1], np.int64), "position": np.array([CTX], np.int64)}
    program.run(**inputs)  # eager, then captured and replayed
    program.run(**inputs)
    timed = _timer(cp, device.stream)
    step = timed(program.step, DECODE_REPEATS)
    per_kernel: dict[str, float] = {}
    arrays = program.chips[0]
    for launch in plan.launches:
        args = [arrays[n] for n in launch.buffers]
        seconds = timed(lambda s=launch, a=args: device.launch(s.kernel, s.grid, s.block, a), 5)
        per_kernel[launch.kernel] = per_kernel.get(launch.kernel, 0.0) + seconds
    moved, minimum = step_bytes(plan, live=CTX)
    return {
        "model": f"{name}-shaped, random bf16 weights, bf16 cache at {CTX} positions",
        "launches": len(plan.launches),
        "decode_step_ms": round(step * 1e3, 3),
        "tokens_per_s": round(1 / step, 1),
        "bytes_per_step": moved,
        "minimum_bytes_per_step": minimum,
        "bandwidth_tb_per_s": round(moved / step / 1e12, 3),
        "fraction_of_read_only": round(moved / step / read, 3),
        "fraction_of_copy": round(moved / step / copy, 3),
        "fraction_of_peak": round(moved / step / peak, 3),
        "kernel_ms": {k: round(v * 1e3, 4) for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1])},
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
    fast.generate(prompt, 64)
    return {
        "tokens_match_reference_f32": got == want,
        "bf16_decode_tokens_per_s": round(fast.stats.decode_tokens_per_s, 1),
        "text_f32": tokenizer.decode(got),
    }


def on_gpu() -> dict[str, Any]:
    import cupy  # type: ignore[import-not-found]

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    peak = next((v for k, v in PEAK_BYTES_PER_S.items() if k in name), PEAK_BYTES_PER_S["H200"])
    stream = cupy.cuda.Stream(non_blocking=True)
    copy, read = copy_bandwidth(cupy, stream), read_bandwidth(cupy, stream)
    report: dict[str, Any] = {
        "device": name,
        "copy_tb_per_s": round(copy / 1e12, 3),
        "read_only_tb_per_s": round(read / 1e12, 3),
        "peak_tb_per_s": peak / 1e12,
    }
    report["embedded"] = embedded(cupy)
    report["models"] = [shaped_model(cupy, m, peak, copy, read) for m in ("smollm2-135m", "llama-3.1-8b")]
    report["tensor_core_prefill"] = __import__("gpu_prefill").on_gpu()  # bench/gpu_prefill.py, same run
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-agreement", action="store_true", help="the bf16 agreement of the emulated kernels")
    parser.add_argument("--steps", type=int, default=64, help="teacher-forced decode steps (with --cpu-agreement)")
    args = parser.parse_args(argv)
    if args.cpu_agreement:
        print(json.dumps(cpu_agreement(args.steps), indent=2))
        return 0
    from logos_ir.runtime.cuda.devices import NO_GPU, gpu_count

    if gpu_count() == 0:
        print(f"gpu_decode: {NO_GPU.replace('add --emulate', 'run --cpu-agreement')}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    report = on_gpu()
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
