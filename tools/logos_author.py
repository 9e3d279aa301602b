"""`logos-author`: writes the LOGOS program of a model for a cut, so tests and users start from real programs.

    logos-author [--model MODEL] --cut 'decode ctx=64' [--tp 2] [-o decode.logos] [--manifest] [--identity]

`--model` takes what every tool takes (`--list-models`): a preset, `embedded` (the default), a model folder, a
`.gguf` file, a hub id in the local cache; and, here, a `config.json` alone (the author reads sizes, never a weight).
The text goes to standard output or `-o` (a regular file is written atomically: a temporary file renamed into place,
so a failure leaves nothing half-written, with the umask's permissions; a device, a FIFO or a descriptor is written
in place, never replaced; `-o -` is standard output).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from logos_ir.cli import add_common, positive, run_tool, write_output


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="logos-author", description="Write a model's LOGOS program for a cut.")
    add_common(parser, "logos-author")
    parser.add_argument(
        "--cut",
        default="decode ctx=64",
        help="the cut in option form, e.g. 'decode ctx=128', 'decode_layer layer=3 ctx=128'",
    )
    parser.add_argument("--tp", type=positive, default=None, help="split over this many chips (Megatron-style)")
    parser.add_argument("--dir", default="", help="the weights' folder named in the manifest")
    parser.add_argument("-o", "--output", help="write the text to this file instead of standard output")
    parser.add_argument("--manifest", action="store_true", help="print the weight manifest as JSON instead")
    parser.add_argument("--identity", action="store_true", help="print the identity line instead")
    return parser


def load_spec(model: str | None):
    """The sizes of the model `--model` names (its headers only: no weight is read)."""
    from logos_ir.spec import ModelSpec

    if model in ModelSpec.presets():  # a preset's sizes are the spec module's own (no weight reader is loaded)
        return ModelSpec.preset(model)
    from logos_ir.models import ModelSource

    if model is not None:
        path = Path(model)
        if path.is_file() and path.suffix.lower() == ".json" or (path.is_dir() and not _has_weights(path)):
            return ModelSpec.from_hf_config(path)  # sizes alone: a config.json, or a folder of one
    return ModelSource.resolve(model).spec


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.safetensors.index.json"))


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)

    def body() -> int:
        from logos_ir.author import write
        from logos_ir.program import Cut, Identity

        spec, cut = load_spec(args.model), Cut.parse(args.cut)
        authored = write(spec, cut, args.dir, tp=args.tp)
        if args.manifest:
            text = json.dumps([vars(entry) for entry in authored.manifest], indent=2) + "\n"
        elif args.identity:
            text = Identity.of_split(cut, authored.chips, authored.text).line() + "\n"
        else:
            text = authored.text
        if args.output:
            write_output(args.output, text)
        else:
            sys.stdout.write(text)
        return 0

    return run_tool("logos-author", body, argv)


if __name__ == "__main__":
    sys.exit(main())
