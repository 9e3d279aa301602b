"""Benchmark: compile speed at the scale of the largest models, stage by stage (a script, not a test).

    python bench/compile_speed.py [--layers 10,20,40,80] [--skip-scaling] [--only NAME] [--repeat 3]

In one process it builds, for each lane registered in `logos_ir.registry`, the largest builds it makes, without
weights: the CUDA decode step of `llama-3.1-70b` over 8 chips (ctx 8192) and its prefill chunk of 512 rows, the
D5005 decode step of `llama-3.1-8b`, the spatial lane's `llama-3.1-8b` decode step (one program for one grid of a
WSE-2), and the `logos` target's programs.
Each stage is timed where it runs: the author, the LOGOS parse, the verifier, cut extraction, tp split, every
registered pass of the lane (each level of its lowering, timed by wrapping the pass's `apply`), every emitter (each
`-t` target's `emit`), the lane functions its build calls instead of a pass or an emitter (`LANE_FUNCTIONS`), and
writing the build folder. Beside it, in the same run, xDSL's own parse and print of the same `logos` IR in MLIR
form (the baseline). Then each build as `logos-compile` runs it, a whole fresh process: seconds and peak memory.
Last, a scaling table: every stage at 10, 20, 40 and 80 layers of the same widths, to show how each grows.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_frontend import best_of, mlir_context, mlir_text  # beside this script, on its path
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser

from logos_ir import registry
from logos_ir.author import written, written_split
from logos_ir.build import BuildRequest, manifest_of, write_build
from logos_ir.models import ModelSource
from logos_ir.parser import parse_program
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One build to time: a lane's target, a preset, a cut, the chips."""

    name: str
    target: str
    model: str
    cut: str
    tp: int = 1
    scaling_model: str = ""  # the widths of the scaling table, where 80 layers of `model`'s do not fit the target

    @property
    def widths(self) -> str:
        return self.scaling_model or self.model

    def args(self, output: Path) -> list[str]:
        return [
            "--model",
            self.model,
            "--target",
            self.target,
            "--cut",
            self.cut,
            "--tp",
            str(self.tp),
            "-o",
            str(output),
        ]


SCENARIOS = [
    Scenario("cuda decode 70b tp8", "cuda", "llama-3.1-70b", "decode ctx=8192", 8),
    Scenario("cuda prefill 70b 512 rows", "cuda", "llama-3.1-70b", "prefill rows=512 ctx=8192"),
    Scenario("d5005 decode 8b", "d5005", "llama-3.1-8b", "decode ctx=8192", scaling_model="llama-3.2-1b"),
    Scenario(
        "spatial decode 8b (one grid)", "spatial", "llama-3.1-8b", "decode ctx=8192", scaling_model="smollm2-135m"
    ),
    Scenario("logos decode 70b", "logos", "llama-3.1-70b", "decode ctx=8192"),
]


# The functions a lane's build calls in place of a registered pass's `apply` or an emitter's `emit` (the spatial
# build lowers with `lower_module`, as the pass `convert-logos-to-csl` does, and prints with `print_csl`, as `-t csl`
# does): (module, function, stage), each wrapped where the build looks it up.
LANE_FUNCTIONS: dict[str, list[tuple[str, str, str]]] = {
    "spatial": [
        ("logos_ir.passes.spatial.build", "lower_module", "convert-logos-to-csl: plan the grid, lower the parts"),
        ("logos_ir.passes.spatial.convert_logos_to_csl", "lower_parts", "convert-logos-to-csl: lower the parts"),
        ("logos_ir.passes.spatial.build", "print_csl", "emit csl (print_csl)"),
        ("logos_ir.passes.spatial.verify_grid", "static_check", "static check of the printed CSL"),
    ],
}


# -- timing stages in one process ----------------------------------------------------------------------------


class Stages:
    """Seconds per stage, in the order stages first ran; a stage nested in another is charged to the inner one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.peak_mib: dict[str, float] = {}
        self._stack: list[list[float]] = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        frame = [0.0]
        self._stack.append(frame)
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self._stack.pop()
            self.seconds[name] += spent - frame[0]
            if self._stack:
                self._stack[-1][0] += spent
            self.peak_mib[name] = peak_rss_mib()

    def wrap(self, owner: Any, method: str, name: str) -> Callable[[], None]:
        """Time every call of `owner.method` as stage `name`; returns the function that undoes it."""
        original = getattr(owner, method)
        stages = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            with stages.stage(name):
                return original(*args, **kwargs)

        setattr(owner, method, timed)
        return lambda: setattr(owner, method, original)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def instrumented(stages: Stages, lane: str) -> Iterator[None]:
    """Every registered pass and emitter times itself while the lane builds."""
    undo = []
    for name, factory in registry.passes().items():
        cls = factory()
        if "apply" in vars(cls):
            undo.append(stages.wrap(cls, "apply", f"pass {name}"))
    for name, factory in registry.emitters().items():
        cls = factory()
        if "emit" in vars(cls):
            undo.append(stages.wrap(cls, "emit", f"emit {name}"))
    from logos_ir.passes import cut_extract

    undo.append(stages.wrap(cut_extract, "extract", "cut extraction"))
    for module, function, name in LANE_FUNCTIONS.get(lane, []):
        owner = importlib.import_module(module)
        if not hasattr(owner, function):
            print(f"  note: {module}.{function} is gone; its time is in '{lane} build (the rest)'")
            continue
        undo.append(stages.wrap(owner, function, name))
    try:
        yield
    finally:
        for restore in reversed(undo):
            restore()


def best_stages(scenario: Scenario, spec: ModelSpec, repeat: int) -> tuple[Stages, int]:
    """The scenario's stages, each the best of `repeat` builds (the least disturbed by other load), after one
    build that warms the caches the first build of a process fills (imports, memoised attributes)."""
    time_build(scenario, spec, Stages())
    runs = [Stages() for _ in range(repeat)]
    ops = 0
    for stages in runs:
        gc.collect()  # start each build from a heap as clean as a fresh logos-compile's, not the last build's garbage
        ops = time_build(scenario, spec, stages)
    best = Stages()
    for name in runs[0].seconds:
        best.seconds[name] = min(run.seconds.get(name, float("inf")) for run in runs)
        best.peak_mib[name] = max(run.peak_mib.get(name, 0.0) for run in runs)
    return best, ops


def time_build(scenario: Scenario, spec: ModelSpec, stages: Stages) -> int:
    """The scenario's build in this process, stage by stage; the number of ops of its `logos` program."""
    cut = Cut.parse(scenario.cut)
    with stages.stage("author"):
        authored = written_split(spec, cut, "", scenario.tp)[0] if scenario.tp > 1 else written(spec, cut)[0]
    with stages.stage("LOGOS parse"):
        program = parse_program(authored.text, "<bench>")
    module = ModuleOp([program])
    with stages.stage("verify"):
        module.verify()
    ops = sum(1 for _ in module.walk())
    if scenario.tp > 1:
        whole = ModuleOp([parse_program(written(spec, cut)[0].text, "<bench>")])
        from logos_ir.passes.tp_split import TpSplit

        with stages.stage("tp split"):
            TpSplit(scenario.tp).apply(Context(), whole)
    source = ModelSource("preset", scenario.model, spec)
    # ptxas=off: the CUDA build's register report compiles kernels.cu with nvcc (seconds, and memoised by the
    # source's hash after the warm-up build): the NVIDIA toolchain's time, not logos-ir's, so it is left out here.
    options = {"ptxas": "off"} if scenario.target == "cuda" else {}
    request = BuildRequest(
        source,
        cut,
        scenario.tp,
        registry.compile_targets()[scenario.target].weights[0],
        False,
        Progress.silent(),
        options,
    )
    build = registry.compile_targets()[scenario.target].build()
    with instrumented(stages, scenario.target), stages.stage(f"{scenario.target} build (the rest)"):
        lane = build(request)
    with tempfile.TemporaryDirectory() as scratch, stages.stage("write the build"):
        write_build(Path(scratch) / "build", lambda: (manifest_of(request, scenario.target, lane), lane.artifacts))
    return ops


# -- the baseline: xDSL's MLIR parse and print of the same IR ---------------------------------------------------


def baseline(spec: ModelSpec, cut: Cut) -> dict[str, float]:
    text = written(spec, cut)[0].text
    module = ModuleOp([parse_program(text)])
    ctx = mlir_context()
    mlir = mlir_text(module)
    ops = sum(1 for _ in module.walk())
    return {
        "ops": ops,
        "xDSL MLIR print": best_of(3, lambda: mlir_text(module)),
        "xDSL MLIR parse": best_of(3, lambda: Parser(ctx, mlir).parse_module()),
        "LOGOS parse": best_of(3, lambda: parse_program(text)),
    }


# -- whole processes --------------------------------------------------------------------------------------------


def whole_process(scenario: Scenario) -> tuple[float, float, int]:
    """`logos-compile` for the scenario in a fresh process: wall seconds, peak RSS in MiB, exit code."""
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "logos_ir.tools.logos_compile", *scenario.args(Path(scratch) / "build")]
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            print(f"  {scenario.name}: logos-compile failed: {child.stderr.read().decode()[-400:]}")
        return seconds, usage.ru_maxrss / 1024, child.returncode


# -- report -----------------------------------------------------------------------------------------------------


def scaled(model: str, layers: int) -> ModelSpec:
    return dataclasses.replace(ModelSpec.preset(model), layers=layers)


def print_stages(scenario: Scenario, stages: Stages, ops: int) -> None:
    total = sum(stages.seconds.values())
    print(f"\n### {scenario.name}: `logos-compile {' '.join(scenario.args(Path('DIR')))}`\n")
    print(f"{ops:,} ops in the `logos` program; {total:.2f} s in all stages\n")
    print("| stage | seconds | ops/s | peak RSS so far (MiB) |")
    print("| --- | ---: | ---: | ---: |")
    for name, seconds in stages.seconds.items():
        rate = f"{ops / seconds:,.0f}" if seconds > 0 else "-"
        print(f"| {name} | {seconds:.3f} | {rate} | {stages.peak_mib[name]:.0f} |")


def growth(by_layers: dict[int, float], first: int, last: int) -> str:
    if not by_layers.get(first):
        return "-"
    return f"{by_layers.get(last, 0) / by_layers[first]:.1f}x"


def exponent(by_layers: dict[int, float], layer_counts: list[int]) -> str:
    """The slope of log(seconds) over log(layers), fitted by least squares over every layer count: 1 is linear
    growth, 2 quadratic; stages too short to time (under a millisecond at the fewest layers) show '-'."""
    points = [(math.log(n), math.log(by_layers[n])) for n in layer_counts if by_layers.get(n, 0) > 0]
    if len(points) < 2 or by_layers.get(layer_counts[0], 0) < 1e-3:
        return "-"
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return f"{slope:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="10,20,40,80", help="the layer counts of the scaling table")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--only", help="run only scenarios whose name contains this")
    parser.add_argument("--repeat", type=int, default=3, help="each stage's figure is the best of this many builds")
    args = parser.parse_args()
    targets = registry.compile_targets()
    scenarios = [s for s in SCENARIOS if s.target in targets and (not args.only or args.only in s.name)]
    missing = sorted({s.target for s in SCENARIOS} - set(targets))
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    if missing:
        print(f"targets not registered (skipped): {', '.join(missing)}")

    print("\n## Whole builds (`logos-compile`, a fresh process each, no weights)\n")
    print("| build | seconds | peak RSS (MiB) | exit |")
    print("| --- | ---: | ---: | ---: |")
    together = 0.0
    for scenario in scenarios:
        seconds, peak, code = whole_process(scenario)
        together += seconds
        print(f"| {scenario.name} | {seconds:.2f} | {peak:.0f} | {code} |")
    print(f"| all together | {together:.2f} | | |")

    print("\n## Stage by stage (in one process)")
    for scenario in scenarios:
        stages, ops = best_stages(scenario, ModelSpec.preset(scenario.model), args.repeat)
        print_stages(scenario, stages, ops)

    figures = baseline(ModelSpec.preset("llama-3.1-70b"), Cut.parse("decode ctx=8192"))
    ops = figures["ops"]
    print("\n## Baseline: xDSL's parse and print of the same `logos` IR (llama-3.1-70b decode step, MLIR form)\n")
    print("| | seconds | ops/s |")
    print("| --- | ---: | ---: |")
    for name in ("LOGOS parse", "xDSL MLIR parse", "xDSL MLIR print"):
        print(f"| {name} | {figures[name]:.3f} | {ops / figures[name]:,.0f} |")
    print(
        f"\nLOGOS parse is {figures['xDSL MLIR parse'] / figures['LOGOS parse']:.1f}x xDSL's MLIR parse (goal: >= 5x)"
    )

    if args.skip_scaling:
        return
    layer_counts = [int(n) for n in args.layers.split(",")]
    for scenario in scenarios:
        table: dict[str, dict[int, float]] = defaultdict(dict)
        for layers in layer_counts:
            stages, _ = best_stages(scenario, scaled(scenario.widths, layers), args.repeat)
            for name, seconds in stages.seconds.items():
                table[name][layers] = seconds
        first, last = layer_counts[0], layer_counts[-1]
        print(f"\n### Scaling: {scenario.name}, seconds by layers ({scenario.widths}'s widths)\n")
        layers_row = " | ".join(str(n) for n in layer_counts)
        print(f"| stage | {layers_row} | growth {first}->{last} (linear: {last / first:.0f}x) | exponent (linear: 1) |")
        print("| --- | " + " | ".join("---:" for _ in layer_counts) + " | ---: | ---: |")
        for name, by_layers in table.items():
            cells = " | ".join(f"{by_layers.get(n, 0):.3f}" for n in layer_counts)
            print(f"| {name} | {cells} | {growth(by_layers, first, last)} | {exponent(by_layers, layer_counts)} |")


if __name__ == "__main__":
    main()
