"""`logos-author`: writes the LOGOS program of a model for a cut, so tests and users start from real programs.

    logos-author --model tiny --cut 'decode ctx=64' [--tp 2] [-o decode.logos] [--manifest] [--identity]

`--model` is a preset name (`--list-models` lists them), a `config.json` or a folder holding one. The text goes to
standard output or `-o` (written atomically: a temporary file renamed into place, so a failure leaves nothing
half-written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from logos_ir.cli import run_tool, write_atomically


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="logos-author", description="Write a model's LOGOS program for a cut.")
    parser.add_argument("--model", default="tiny", help="a preset name, a config.json, or a folder holding one")
    parser.add_argument(
        "--cut",
        default="decode ctx=64",
        help="the cut in option form, e.g. 'decode ctx=128', 'decode_layer layer=3 ctx=128'",
    )
    parser.add_argument("--tp", type=int, default=None, help="split over this many chips (Megatron-style)")
    parser.add_argument("--dir", default="", help="the weights' folder named in the manifest")
    parser.add_argument("-o", "--output", help="write the text to this file instead of standard output")
    parser.add_argument("--manifest", action="store_true", help="print the weight manifest as JSON instead")
    parser.add_argument("--identity", action="store_true", help="print the identity line instead")
    parser.add_argument("--list-models", action="store_true", help="list the preset models and exit")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
    return parser


def load_spec(model: str):
    from logos_ir.errors import SpecError
    from logos_ir.spec import ModelSpec

    if model in ModelSpec.presets():
        return ModelSpec.preset(model)
    path = Path(model)
    if path.exists():
        return ModelSpec.from_hf_config(path)
    raise SpecError(
        f"unknown model '{model}': neither a preset nor a config.json",
        hint=f"presets: {', '.join(ModelSpec.presets())}",
    )


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)

    def body() -> int:
        from logos_ir.author import write
        from logos_ir.program import Cut, Identity
        from logos_ir.spec import ModelSpec

        if args.list_models:
            print("\n".join(ModelSpec.presets()))
            return 0
        spec, cut = load_spec(args.model), Cut.parse(args.cut)
        authored = write(spec, cut, args.dir, tp=args.tp)
        if args.manifest:
            text = json.dumps([vars(entry) for entry in authored.manifest], indent=2) + "\n"
        elif args.identity:
            text = Identity.of_split(cut, authored.chips, authored.text).line() + "\n"
        else:
            text = authored.text
        if args.output:
            write_atomically(args.output, text)
        else:
            sys.stdout.write(text)
        return 0

    return run_tool("logos-author", body, argv)


if __name__ == "__main__":
    sys.exit(main())
