"""Benchmark: decode speed and peak memory of the reference interpreter against a plain numpy Llama.

    python bench/bench_decode.py [--steps 64] [--rounds 5] [--threads 1] [--write docs/benchmarks.md]

Runs on the embedded SmolLM2-135M-Instruct. Speed: one subprocess holds the weights once and times both
implementations in alternating rounds (so that a busy machine slows both alike), each round `--steps` decode
steps after the same prompt; the best round of each is compared, and the greedy tokens must agree. Memory: one
fresh subprocess per implementation loads the model and generates, and reports its peak resident set size
(`getrusage` ru_maxrss), compared with the size of the model's float32 weights. BLAS threads are fixed per
subprocess (`--threads`, default 1: decoding is matrix-vector products, bound by memory bandwidth, and on a
shared machine OpenBLAS's spinning threads make timings erratic).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADING = "## Decode on the embedded model (reference interpreter)"
PROMPT = "The capital of France is"
OVERHEAD_TARGET = 25.0  # percent
MEMORY_TARGET = 1.5  # times the float32 weights


# -- workers (run in subprocesses) ------------------------------------------------------------------------------


def _load():
    from logos_ir.tokenizer import Tokenizer
    from logos_ir.weights import open_model

    store = open_model(None)
    weights_bytes = sum(store.get(name).nbytes for name in store.names())
    tokenizer = Tokenizer.from_store(store)
    return store, tokenizer.encode(PROMPT), weights_bytes


class _Clock:
    """Wall and CPU time of a stretch of work (CPU time is what a busy machine disturbs least)."""

    def __enter__(self) -> _Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def _interpreter_decoder(store, ctx: int):
    """The decode step as `logos-run` runs it: authored, parsed and compiled by the Generator."""
    import numpy as np

    from logos_ir.generate import Generator
    from logos_ir.program import Cut

    generator = Generator(store, ctx=ctx)
    program = generator.program(Cut.decode(ctx))

    def step(token: int, position: int) -> int:  # ids and positions from 0, as the baseline's
        out = program.run(token=np.array([token + 1]), position=np.array([position + 1]))
        return int(out[0]) - 1

    return step, program.state.reset, generator


def _baseline_decoder(store, ctx: int):
    sys.path.insert(0, str(HERE))
    from numpy_llama import NumpyLlama

    model = NumpyLlama(store.spec, store.get, ctx)
    return model.step, lambda: None, None


def _round(step, reset, prompt: list[int], steps: int) -> tuple[list[int], _Clock]:
    """Feed the prompt (untimed), then time `steps` greedy decode steps."""
    reset()
    for position, token in enumerate(prompt):
        following = step(token, position)
    tokens = [following]
    with _Clock() as clock:
        for _ in range(steps):
            tokens.append(step(tokens[-1], len(prompt) + len(tokens) - 1))
    return tokens, clock


def speed_worker(steps: int, rounds: int) -> dict:
    store, prompt, weights_bytes = _load()
    ctx = len(prompt) + steps + 1
    ours, reset, generator = _interpreter_decoder(store, ctx)
    theirs, nothing, _ = _baseline_decoder(store, ctx)
    times: dict[str, list[list[float]]] = {"interpreter": [], "baseline": []}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):  # alternate, so that load from elsewhere falls on both alike
        for name, step, clear in (("interpreter", ours, reset), ("baseline", theirs, nothing)):
            tokens[name], clock = _round(step, clear, prompt, steps)
            times[name].append([clock.wall / steps, clock.cpu / steps])
    return {
        "times": times,
        "tokens_agree": tokens["interpreter"] == tokens["baseline"],
        "weights_bytes": weights_bytes,
        "prompt_tokens": len(prompt),
        "programs": [identity.line() for identity in generator.identities],
    }


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def memory_worker(impl: str, steps: int) -> dict:
    import numpy  # noqa: F401  (counted in the start-up size, as in any numpy program)

    if impl == "interpreter":
        import logos_ir.interpreter  # noqa: F401  (xDSL and the dialect, part of the interpreter's cost)
    started_kib = _rss_kib()
    store, prompt, weights_bytes = _load()
    ctx = len(prompt) + steps + 1
    step, reset, _ = (_interpreter_decoder if impl == "interpreter" else _baseline_decoder)(store, ctx)
    _round(step, reset, prompt, steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"peak_bytes": peak, "startup_bytes": started_kib * 1024, "weights_bytes": weights_bytes}


# -- the report ---------------------------------------------------------------------------------------------------


def _run_worker(args: list[str], threads: int) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"bench worker {args} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _machine() -> dict[str, str]:
    import numpy

    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()[:10]
    except OSError:
        lscpu = []
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "lscpu": "\n".join(lscpu),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _overheads(times: dict[str, list[list[float]]], which: int) -> list[float]:
    """The interpreter's overhead (%) in each round against the baseline's round right after it."""
    pairs = zip(times["interpreter"], times["baseline"], strict=True)
    return [100 * (ours[which] / theirs[which] - 1) for ours, theirs in pairs]


def _table(speed: dict, memory: dict[str, dict], steps: int, threads: int) -> tuple[str, float, float]:
    times = speed["times"]
    rounds = len(times["interpreter"])
    best = {name: min(t[0] for t in rows) for name, rows in times.items()}
    cpu = {name: statistics.median(t[1] for t in rows) for name, rows in times.items()}
    overhead = statistics.median(_overheads(times, 1))
    wall_overhead = statistics.median(_overheads(times, 0))
    weights = speed["weights_bytes"]
    ratio = {impl: m["peak_bytes"] / weights for impl, m in memory.items()}
    mib = 1024 * 1024
    ours, theirs = memory["interpreter"], memory["baseline"]
    rows = [
        "| | reference interpreter | plain numpy baseline |",
        "|---|---|---|",
        f"| decode tokens/s (best round, wall clock) | {1 / best['interpreter']:.1f} | {1 / best['baseline']:.1f} |",
        f"| ms per token, wall clock (best round) | {1e3 * best['interpreter']:.1f} | {1e3 * best['baseline']:.1f} |",
        f"| ms per token, CPU time (median round) | {1e3 * cpu['interpreter']:.1f} | {1e3 * cpu['baseline']:.1f} |",
        f"| peak RSS (MiB) | {ours['peak_bytes'] / mib:.0f} | {theirs['peak_bytes'] / mib:.0f} |",
        f"| peak RSS / float32 weights ({weights / mib:.0f} MiB) | {ratio['interpreter']:.2f}x "
        f"| {ratio['baseline']:.2f}x |",
        f"| RSS before loading the model (MiB) | {ours['startup_bytes'] / mib:.0f} "
        f"| {theirs['startup_bytes'] / mib:.0f} |",
    ]
    met = {True: "met", False: "MISSED"}
    summary = [
        "",
        f"Interpreter overhead over the baseline: {overhead:+.1f}% CPU time per decode step (median over {rounds} "
        f"alternating rounds of {steps} steps; wall clock {wall_overhead:+.1f}%); target <= "
        f"{OVERHEAD_TARGET:.0f}%: {met[overhead <= OVERHEAD_TARGET]}.",
        f"Interpreter peak memory: {ratio['interpreter']:.2f}x the float32 weights; target <= {MEMORY_TARGET}x: "
        f"{met[ratio['interpreter'] <= MEMORY_TARGET]}.",
        f"Greedy tokens agree: {'yes' if speed['tokens_agree'] else 'NO'}. BLAS threads: {threads}. Prompt: "
        f"{speed['prompt_tokens']} tokens ({PROMPT!r}).",
    ]
    return "\n".join(rows + summary), overhead, ratio["interpreter"]


def _section(table: str, machine: dict[str, str], speed: dict, command: str) -> str:
    programs = "\n".join(f"- `{line}`" for line in speed["programs"])
    return f"""{HEADING}

Measured {machine["date"]} with

    {command}

on SmolLM2-135M-Instruct (the embedded Q4_1 GGUF, dequantized to float32 once): greedy decode steps after a
short prompt. The baseline is `bench/numpy_llama.py`, the same math written directly in numpy; both read the
same weight arrays. Speed is timed in one process, in alternating rounds; the overhead is the median over
rounds of the interpreter's CPU time per step against the baseline's in the round after it (CPU time, because
other work on a shared machine inflates wall-clock time). Peak memory (ru_maxrss) is measured in a fresh
process per implementation and includes Python, numpy (and, for the interpreter, xDSL) and the pages of the
GGUF file read while dequantizing.

{table}

Programs run:
{programs}

Machine: {machine["nproc"]} CPUs (load average {machine["load"]} at the start: the machine was shared with
other work, so absolute speeds vary from run to run), Python {machine["python"]}, numpy {machine["numpy"]}.

```
{machine["lscpu"]}
```
"""


def write_section(path: Path, section: str) -> None:
    """Put `section` into the file at `path` in place of an earlier one under the same heading; other sections
    stay as they are."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip("\n") + "\n\n", text).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=32, help="decode steps per round")
    parser.add_argument("--rounds", type=int, default=9, help="rounds per implementation")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per process")
    parser.add_argument("--write", type=Path, default=None, help="write the results into this markdown file")
    parser.add_argument("--worker", choices=["speed", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=["interpreter", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "speed":
        print(json.dumps(speed_worker(args.steps, args.rounds)))
        return 0
    if args.worker == "memory":
        print(json.dumps(memory_worker(args.impl, args.steps)))
        return 0
    machine = _machine()
    common = ["--steps", str(args.steps)]
    speed = _run_worker(["--worker", "speed", "--rounds", str(args.rounds), *common], args.threads)
    memory = {impl: _run_worker(["--worker", "memory", "--impl", impl, *common], args.threads)
              for impl in ("interpreter", "baseline")}  # fmt: skip
    table, _, _ = _table(speed, memory, args.steps, args.threads)
    print(table)
    if args.write is not None:
        command = f"python bench/bench_decode.py --steps {args.steps} --rounds {args.rounds} --threads {args.threads}"
        write_section(args.write, _section(table, machine, speed, command))
        print(f"\nwritten to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
