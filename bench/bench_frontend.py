"""Benchmark: the LOGOS frontend against xDSL's MLIR parser and printer on the same IR (not a test).

Parses, verifies and prints the `llama-3.1-70b` decode step (80 layers) as LOGOS text, and, in the same run, parses
and prints the same IR in MLIR form with xDSL. Each figure is the best of `--repeat` runs (the least disturbed by
other load on the machine), in ops per second over the IR's op count.

    python bench/bench_frontend.py [--model llama-3.1-70b] [--cut 'decode ctx=128'] [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import platform
import time
from collections.abc import Callable

from xdsl.context import Context
from xdsl.dialects import builtin, func, shard
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from logos_ir.author import written
from logos_ir.dialects.logos import LOGOS
from logos_ir.parser import parse_program
from logos_ir.printer import print_program
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec


def best_of(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def mlir_text(module: ModuleOp) -> str:
    out = io.StringIO()
    Printer(stream=out).print_op(module)
    return out.getvalue()


def mlir_context() -> Context:
    """A context that parses the MLIR form of a `logos` program (the dialects its IR uses)."""
    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, shard.Shard, LOGOS):
        ctx.load_dialect(dialect)
    return ctx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--cut", default="decode ctx=128")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    text = written(ModelSpec.preset(args.model), Cut.parse(args.cut))[0].text
    program = parse_program(text)
    module = ModuleOp([program])
    ops = sum(1 for _ in module.walk())
    mlir = mlir_text(module)
    ctx = mlir_context()

    figures = {
        "LOGOS parse": best_of(args.repeat, lambda: parse_program(text)),
        "verify": best_of(args.repeat, module.verify),
        "LOGOS print": best_of(args.repeat, lambda: print_program(program)),
        "xDSL MLIR parse": best_of(args.repeat, lambda: Parser(ctx, mlir).parse_module()),
        "xDSL MLIR print": best_of(args.repeat, lambda: mlir_text(module)),
    }
    print(f"{args.model}, {args.cut}: {ops} ops, LOGOS {len(text):,} bytes, MLIR {len(mlir):,} bytes")
    print(f"python {platform.python_version()}, {platform.machine()}, best of {args.repeat}")
    print(f"| {'stage':<16} | {'seconds':>8} | {'ops/s':>9} |")
    print(f"| {'-' * 16} | {'-' * 8}:| {'-' * 9}:|")
    for stage, seconds in figures.items():
        print(f"| {stage:<16} | {seconds:>8.4f} | {ops / seconds:>9,.0f} |")
    speedup = figures["xDSL MLIR parse"] / figures["LOGOS parse"]
    print(f"LOGOS parse is {speedup:.1f}x xDSL's MLIR parse of the same IR (goal: at least 5x)")


if __name__ == "__main__":
    main()
