"""The CUDA lane's prefill on tensor cores: one prepared script.

    python3 bench/gpu_prefill.py                 # on a machine with a CUDA GPU and cupy: the 8B's 512-row prefill
    python3 bench/gpu_prefill.py --report        # no GPU needed: each product's modelled HBM bytes vs the minimum
    python3 bench/gpu_prefill.py --cpu-agreement # no GPU needed: the embedded model through bf16 prefill chunks
                                                 # (tensor-core kernels, emulated) then decode, teacher-forced

On a GPU it builds the `llama-3.1-8b` prefill chunk of 512 rows (bf16 image, random weights made on the GPU),
compiles its `kernels.cu` with nvcc for the device, and times each distinct projection kernel of a layer (q, k, v,
o with its residual, gate/up with SiLU, down with its residual) against `cupy.matmul` of the same shapes in the same
run (cuBLAS; f16, as cupy has no bf16 matrices: the same bytes and the same tensor-core rate), reporting each
kernel's time, TFLOP/s and the fraction of cuBLAS (the aim: 60%). `bench/gpu_decode.py` runs it after its
own figures (a one-line hook), so one prepared script gives both. Without a GPU (and without `--report` or
`--cpu-agreement`) it says so and exits 1: it claims no GPU figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

ROWS = 512
CTX = 1024
REPEATS = 20
PROMPTS = [
    "Once upon a time, in a small village far away, there lived an old man who",
    "The capital of France is",
    "def fibonacci(n):\n",
]


def _plan(model: str, rows: int) -> tuple[Any, str]:
    from logos_ir.program import Cut
    from logos_ir.runtime.cuda.artifacts import build_program
    from logos_ir.spec import ModelSpec

    plan, source, _ = build_program(ModelSpec.preset(model), Cut.prefill(rows, CTX), 1, "bf16")
    return plan, source


def report(model: str = "llama-3.1-8b", rows: int = ROWS) -> dict[str, Any]:
    """Each tensor-core product's HBM bytes (modelled from its launch) against the minimum."""
    from logos_ir.passes.cuda.build import product_traffic

    plan, _ = _plan(model, rows)
    return {"model": model, "rows": rows, "products": product_traffic(plan)}


def cpu_agreement(steps: int, prefill_rows: int) -> dict[str, Any]:
    from logos_ir.runtime.cuda.agreement import teacher_forced
    from logos_ir.tokenizer import Tokenizer
    from logos_ir.weights import open_model

    store = open_model(None)
    tokenizer = Tokenizer.from_store(store)
    assert tokenizer is not None
    out: dict[str, Any] = {"steps": steps, "prefill_rows": prefill_rows, "prompts": []}
    matches: list[bool] = []
    for text in PROMPTS:
        started = time.perf_counter()
        prompt = tokenizer.encode(text)
        result = teacher_forced(store, prompt, steps, "bf16", prefill_rows=prefill_rows)
        matches += result.matches
        out["prompts"].append(
            {
                "prompt": text,
                "prompt_tokens": len(prompt),
                "agreement": result.agreement,
                "min_cosine": result.min_cosine,
                "misses_at_margin": [m for m, ok in zip(result.margins, result.matches, strict=True) if not ok],
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(json.dumps(out["prompts"][-1]), file=sys.stderr, flush=True)
    out["agreement"] = sum(matches) / len(matches)
    return out


# -- on a GPU ------------------------------------------------------------------------------------------------------


def _timed(cp: Any, work: Any, repeats: int) -> float:
    work()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        work()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeats


def _tensor_core_kernels(source: str) -> str:
    """kernels.cu cut to its tensor-core kernels (one short nvcc call instead of the whole step's)."""
    import re

    from logos_ir.passes.cuda.emit_cuda import PREAMBLE

    head = re.compile(r'^extern "C" __global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(', re.M)
    starts = [m.start() for m in head.finditer(source)]
    bodies = [source[a:b] for a, b in zip(starts, [*starts[1:], len(source)], strict=True)]
    return PREAMBLE + "\n".join(b for b in bodies if "_tc_" in head.match(b).group(1))  # type: ignore[union-attr]


def _random(cp: Any, buffer: Any, rows: int) -> Any:
    if buffer.element == "i64":  # positions 1 .. rows
        return cp.arange(1, rows + 1, dtype=cp.int64)
    values = (cp.random.random(buffer.shape, dtype=cp.float32) - 0.5) / 16
    return (values.view(cp.uint32) >> 16).astype(cp.uint16) if buffer.element == "bf16" else values


def _flop(kernel: str, buffers: list[Any]) -> float:
    if "attention" in kernel:  # causal: row r attends r + 1 positions, Q K^T and P V
        rows, width = buffers[0].shape
        return 4.0 * width * rows * (rows + 1) / 2
    rows, depth = buffers[0].shape
    return 2.0 * rows * depth * buffers[1].shape[0] * (2 if kernel.startswith("gate_up") else 1)


def on_gpu() -> dict[str, Any]:
    import cupy as cp  # type: ignore[import-not-found]

    from logos_ir.runtime.cuda.devices import _compile_cuda

    plan, source = _plan("llama-3.1-8b", ROWS)
    module = _compile_cuda(cp, _tensor_core_kernels(source))
    seen: set[str] = set()
    results = []
    for launch in plan.launches:
        if "_tc_" not in launch.kernel or launch.kernel in seen:
            continue
        seen.add(launch.kernel)
        buffers = [plan.buffers[name] for name in launch.buffers]
        arrays = [_random(cp, buffer, ROWS) for buffer in buffers]
        kernel = module.get_function(launch.kernel)
        run = lambda k=kernel, at=launch, a=tuple(arrays): k(at.grid, (at.block, 1, 1), a)  # noqa: E731
        ours = _timed(cp, run, REPEATS)
        flop = _flop(launch.kernel, buffers)
        entry = {"kernel": launch.kernel, "ms": round(ours * 1e3, 4), "tflops": round(flop / ours / 1e12, 1)}
        if "attention" not in launch.kernel:  # cuBLAS (f16: cupy has no bf16 matrices) on the same shapes
            rows, depth = buffers[0].shape
            columns = buffers[1].shape[0] * (2 if launch.kernel.startswith("gate_up") else 1)
            x = cp.random.random((rows, depth), dtype=cp.float32).astype(cp.float16)
            w = cp.random.random((depth, columns), dtype=cp.float32).astype(cp.float16)
            cublas = _timed(cp, lambda x=x, w=w: cp.matmul(x, w), REPEATS)
            entry.update(
                cublas_ms=round(cublas * 1e3, 4),
                cublas_tflops=round(flop / cublas / 1e12, 1),
                fraction_of_cublas=round(cublas / ours, 3),
            )
        results.append(entry)
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return {"device": name, "rows": ROWS, "kernels": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="store_true", help="modelled HBM bytes of each product (no GPU)")
    parser.add_argument("--cpu-agreement", action="store_true", help="bf16 prefill chunks then decode, emulated")
    parser.add_argument("--steps", type=int, default=64, help="teacher-forced decode steps (with --cpu-agreement)")
    parser.add_argument("--prefill-rows", type=int, default=16, help="rows a prefill chunk (with --cpu-agreement)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the prompts to run")
    args = parser.parse_args(argv)
    if args.report:
        print(json.dumps(report(), indent=2))
        return 0
    if args.cpu_agreement:
        del PROMPTS[args.prompts :]
        print(json.dumps(cpu_agreement(args.steps, args.prefill_rows), indent=2))
        return 0
    from logos_ir.runtime.cuda.devices import gpu_count

    if gpu_count() == 0:
        print("gpu_prefill: no CUDA GPU here (cupy sees none); run --report or --cpu-agreement", file=sys.stderr)
        return 1
    print(json.dumps(on_gpu(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
