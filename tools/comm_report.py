"""What a tensor-parallel split all-reduces in one step: the author's unsplit program, split by `tp-split`.

    python -m logos_ir.tools.comm_report --model tiny --cut 'decode ctx=64' --tp 2 [--json]

Each all-reduce moves rows x hidden x 4 bytes of float32; compare the total with 2 x rows x hidden x 4 x
layers.
"""

from __future__ import annotations

import argparse
import json
import sys

from logos_ir.cli import run_tool


def report(model: str, cut_text: str, tp: int) -> dict[str, object]:
    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from logos_ir.author import written
    from logos_ir.parser import parse_program
    from logos_ir.passes.tp_split import TpSplit, communication_report
    from logos_ir.program import Cut
    from logos_ir.tools.logos_author import load_spec

    spec, cut = load_spec(model), Cut.parse(cut_text)
    module = ModuleOp([parse_program(written(spec, cut)[0].text)])
    TpSplit(tp).apply(Context(), module)
    return communication_report(module.ops.first)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="comm_report", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="a preset, a config.json, or a folder holding one")
    parser.add_argument("--cut", default="decode ctx=64", help="a splittable cut in option form")
    parser.add_argument("--tp", type=int, default=2, help="the number of chips")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
    args = parser.parse_args(argv)

    def body() -> int:
        data = report(args.model, args.cut, args.tp)
        if args.json:
            print(json.dumps(data, indent=2))
            return 0
        per_layer: dict[str, int] = data["bytes_per_layer"]  # type: ignore[assignment]
        sizes = set(per_layer.values())
        if len(sizes) == 1 and len(per_layer) > 4:
            layers = f"{sizes.pop()} in each of {len(per_layer)} layers"
        else:
            layers = ", ".join(f"{k} {v}" for k, v in per_layer.items())
        print(data["program"])
        print(f"all-reduces per step: {data['all_reduces']}")
        if data["expert_all_reduces"]:
            print(f"of them a mixture of experts' partial sums: {data['expert_all_reduces']}")
        print(f"bytes all-reduced per step: {data['bytes_per_step']}")
        print(f"bytes all-reduced per layer: {layers or 'none'}")
        print(f"2 x rows x hidden x 4 x layers: {data['megatron_bytes']}")
        print(f"bytes each chip sends (ring): {data['ring_bytes_per_chip']}")
        return 0

    return run_tool("comm_report", body, argv)


if __name__ == "__main__":
    sys.exit(main())
