"""`logos-compile`: builds a model's cut for a target into a build folder, and checks build folders.

    logos-compile --model MODEL --target TARGET --cut 'decode ctx=1024' [--tp N]
                  [--weights f32|bf16|f16|q8_0|...|q4_k_m] [--with-weights] [--option key=value ...] -o DIR
    logos-compile --check DIR [--model MODEL]
    logos-compile --rebuild-check DIR [--model MODEL]
    logos-compile --cost DIR                 # a d5005 build folder's engine.cl, as it is now, re-costed

`MODEL` is a preset, `embedded`, a Hugging Face folder or cache snapshot, a `.gguf` file or a hub id in the local
Hugging Face cache. The targets are the registry's (`logos_ir.registry.compile_targets`): `--help` lists them. A
build writes code without reading a weight value; `--with-weights` adds the lane's weight image. The folder, its
manifest and the checks are described in `docs/builds.md`. Heavy modules are imported inside `main`, so `--help`
answers at once.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logos_ir.cli import USAGE_ERROR, add_common, count, positive, run_tool
from logos_ir.quant import WEIGHT_CHOICES as QUANTIZED

if TYPE_CHECKING:
    from logos_ir.build import Artifact, LaneBuild


def _targets() -> dict[str, Any]:
    from logos_ir import registry

    return registry.compile_targets()


def _option(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"a target option is key=value, not '{text}'")
    return key, value


def _arguments(targets: dict[str, Any]) -> argparse.ArgumentParser:
    listing = "\n".join(f"  {t.name:<10} {t.description}" for t in targets.values())
    parser = argparse.ArgumentParser(
        prog="logos-compile",
        description="Build a model's cut for a target into a build folder (or check a build folder).",
        epilog="targets:\n" + listing,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(parser, "logos-compile")
    parser.add_argument("--target", choices=sorted(targets), metavar="TARGET", help="what to build (see below)")
    parser.add_argument("--cut", help="the cut in option form, e.g. 'decode ctx=1024'")
    parser.add_argument("--tp", type=positive, default=1, help="split the program over this many chips")
    parser.add_argument(
        "--weights",
        choices=["f32", "bf16", "f16", *QUANTIZED],
        help="the weight image (default: the target's); a block format (q8_0, q4_0, q4_k, q6_k, mxfp4, ...) or "
        "q4_k_m (llama.cpp's mix) stores a preset's random weights in it with logos-ir's quantizer, the lane reading "
        "them dequantized in its default image",
    )
    parser.add_argument("--with-weights", action="store_true", help="also write the lane's weight image")
    parser.add_argument(
        "--option", type=_option, action="append", default=[], metavar="KEY=VALUE", help="a target's own option"
    )
    parser.add_argument("--seed", type=count, dest="model_seed", help=argparse.SUPPRESS)  # --model-seed's old name
    parser.add_argument("-o", "--output", help="the build folder to write (replaced atomically)")
    checks = parser.add_mutually_exclusive_group()
    checks.add_argument("--check", metavar="DIR", help="re-hash a build folder against its manifest")
    checks.add_argument("--rebuild-check", metavar="DIR", help="rebuild a build folder and compare byte for byte")
    checks.add_argument("--cost", metavar="DIR", help="re-cost a d5005 build folder's engine.cl as it is now")
    return parser


TARGETS_WITH_OPTIONS = ("cuda", "spatial")  # the targets that read --option (each checks its own keys)


def _request(args: argparse.Namespace, targets: dict[str, Any], progress: Any) -> Any:
    """The build request the arguments name, checked against the target before any work."""
    from logos_ir.build import BuildError, BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.program import Cut

    target = targets[args.target]
    if args.option and target.name not in TARGETS_WITH_OPTIONS:
        keys = ", ".join(key for key, _ in args.option)
        raise BuildError(f"target {target.name} takes no --option ({keys} given)")
    cut = Cut.parse(args.cut)
    if target.cuts and cut.kind not in target.cuts:
        raise BuildError(f"target {target.name} lowers {', '.join(target.cuts)}, not a {cut}")
    storage = args.weights if args.weights in QUANTIZED else None
    weights = target.weights[0] if storage is not None or args.weights is None else args.weights
    if weights not in target.weights:
        raise BuildError(f"target {target.name} writes weights {', '.join(target.weights)}, not {weights}")
    model = ModelSource.resolve(args.model, seed=args.model_seed, progress=progress, storage=storage)
    return BuildRequest(model, cut, args.tp, weights, args.with_weights, progress, dict(args.option))


def storage_line(request: Any, target: Any, report: Any = None) -> str:
    """What the model's weights take as stored, and how the lane reads them: the formats its decode step reads as
    stored (`CompileTarget.stored`, or the build's own report where it says which it read so, `read_as_stored`: the
    spatial lane's, which reads a format as stored in some tensors only), the others dequantized into its image."""
    from logos_ir.build import weight_bytes

    b = weight_bytes(request)
    formats = sorted(b["formats"])
    read = (report or {}).get("read_as_stored") if isinstance(report, dict) else None
    stored = {a["format"] for a in read["arrays"].values()} if read else tuple(target.stored())
    as_stored = [f for f in formats if f in stored]
    line = f"logos-compile: weights stored in {b['stored_bytes']:,} bytes ({', '.join(formats)}); "
    if not as_stored:
        return line + f"the lane reads them dequantized as {b['image']}, {b['read_bytes']:,} bytes"
    if read:  # the build read these formats as stored in the tensors its report names, not in every one of them
        return line + (
            f"the lane reads {', '.join(as_stored)} as stored in the tensors its build names above, every other "
            f"tensor as {b['image']} (its report says the bytes)"
        )
    rest = [f for f in formats if f not in as_stored and f != "f32"]
    image = (
        f", the others ({', '.join(rest)}) and the f32 tensors as {b['image']}"
        if rest
        else (f", its f32 tensors as {b['image']}")
    )
    return line + f"the lane's decode step reads {', '.join(as_stored)} as stored{image} (its report says the bytes)"


def build(args: argparse.Namespace, targets: dict[str, Any], destination: Path) -> list[str]:
    """Build what the arguments name into `destination`; the lines to print."""
    from logos_ir.build import manifest_of, write_build
    from logos_ir.progress import Progress

    progress = Progress.on_terminal()
    request = _request(args, targets, progress)
    built: list[LaneBuild] = []

    def produce() -> tuple[dict[str, Any], list[Artifact]]:
        lane = targets[args.target].build()(request)
        built.append(lane)
        return manifest_of(request, args.target, lane), lane.artifacts

    write_build(destination, produce)
    lane = built[0]
    size = sum(len(a.data) for a in lane.artifacts)
    return [
        *lane.summary,
        storage_line(request, targets[args.target], lane.report),
        f"logos-compile: wrote {destination} ({len(lane.artifacts)} files, {size} bytes)",
        f"logos-compile: run it with: {run_command(args, destination)}",
    ]


def run_command(args: argparse.Namespace, destination: Path) -> str:
    """The `logos-run` command that runs a build: the folder, and what the manifest cannot say (the path of a model
    folder or file; --emulate for the CUDA lane on a machine without a GPU). The D5005 backend runs the folder's
    weight image, so for a D5005 build made without one the command first rebuilds it `--with-weights`."""
    import shlex

    from logos_ir.spec import ModelSpec
    from logos_ir.weights import is_hub_id

    if (args.cut or "").split()[0:1] != ["decode"]:
        return "(none: logos-run runs a build of a whole decode step, 'decode ctx=N')"
    words = ["logos-run", str(destination)]
    if args.model not in (None, "", "embedded") and args.model not in ModelSpec.presets() and not is_hub_id(args.model):
        words += ["--model", args.model]  # a folder or a file: the manifest names it without its path
    if args.target == "cuda":
        words.append("--emulate")  # the kernels executed on the CPU; drop it on a machine with a GPU
    run = " ".join(shlex.quote(w) for w in words)
    if args.target == "d5005" and not args.with_weights:
        rebuild = " ".join(shlex.quote(w) for w in compile_words(args, destination, with_weights=True))
        return f"{rebuild} && {run}"
    return run


def compile_words(args: argparse.Namespace, destination: Path, with_weights: bool) -> list[str]:
    """The `logos-compile` command of these arguments (as given, so the same model and build)."""
    words = ["logos-compile"]
    if args.model is not None:
        words += ["--model", args.model]
    if args.model_seed:
        words += ["--model-seed", str(args.model_seed)]
    words += ["--target", args.target, "--cut", args.cut]
    if args.tp != 1:
        words += ["--tp", str(args.tp)]
    if args.weights:
        words += ["--weights", args.weights]
    for key, value in args.option:
        words += ["--option", f"{key}={value}"]
    if with_weights:
        words.append("--with-weights")
    return [*words, "-o", str(destination)]


def _check(folder: Path, model: str | None, seed: int | None) -> int:
    from logos_ir.build import check_build
    from logos_ir.models import ModelSource
    from logos_ir.progress import Progress

    progress = Progress.on_terminal()
    source = ModelSource.resolve(model, seed=seed or 0, progress=progress) if model is not None else None
    report = check_build(folder, source, progress)
    if report.ok:
        what = "every artifact and the model's weight files match" if source else "every artifact matches"
        print(f"logos-compile: {folder}: {what} the manifest")
        return 0
    for line in report.lines():
        print(f"logos-compile: {folder}: {line}")
    return 1


def _cost(folder: Path) -> int:
    from logos_ir.build import BuildError, read_manifest
    from logos_ir.passes.d5005.build import cost_folder
    from logos_ir.passes.d5005.cost_model import summary_lines

    if read_manifest(folder).get("target", {}).get("name") != "d5005":
        raise BuildError(f"{folder}: --cost re-costs a d5005 build folder; this one is not")
    for line in summary_lines(cost_folder(folder)):
        print(f"logos-compile: {folder}: {line}")
    return 0


def _rebuild_check(folder: Path, args: argparse.Namespace, targets: dict[str, Any]) -> int:
    """Rebuild from the inputs the manifest records, into a temporary folder, and compare byte for byte."""
    from logos_ir.build import BuildError, compare_folders, read_manifest
    from logos_ir.models import ModelSource, check_model_matches

    manifest = read_manifest(folder)
    recorded, target = manifest.get("model", {}), manifest.get("target", {})
    if target.get("name") not in targets:
        raise BuildError(f"{folder}: the manifest's target {target.get('name')!r} is not one this tool builds")
    model = args.model if args.model is not None else _recorded_model(recorded, folder)
    again = argparse.Namespace(
        model=model,
        target=target["name"],
        cut=target["cut"],
        tp=target["tp"],
        weights=recorded.get("storage") or target["weights"],  # a preset stored by the quantizer: its format
        with_weights=target["with_weights"],
        option=list(target.get("options", {}).items()),
        model_seed=recorded.get("seed", 0),
    )
    storage = recorded.get("storage") if recorded.get("kind") == "preset" else None
    check_model_matches(ModelSource.resolve(model, seed=again.model_seed, storage=storage), recorded)
    with tempfile.TemporaryDirectory(prefix="logos-rebuild-") as scratch:
        fresh = Path(scratch) / "build"
        build(again, targets, fresh)
        differ = compare_folders(folder, fresh)
    if not differ:
        print(f"logos-compile: {folder}: a rebuild gives the same bytes")
        return 0
    for name in differ:
        print(f"logos-compile: {folder}: rebuild differs: {name}")
    return 1


def _recorded_model(recorded: dict[str, Any], folder: Path) -> str:
    from logos_ir.build import BuildError

    if recorded.get("kind") in ("preset", "embedded", "hub"):
        return "embedded" if recorded["kind"] == "embedded" else str(recorded["name"])
    raise BuildError(
        f"{folder}: the build was made from a {recorded.get('kind')} ('{recorded.get('name')}'), which the manifest "
        "names without its path",
        hint="give --model the folder or file it was built from",
    )


_BUILD_ONLY = (
    ("--target", "target"),
    ("--cut", "cut"),
    ("-o", "output"),
    ("--tp", "tp"),
    ("--weights", "weights"),
    ("--with-weights", "with_weights"),
    ("--option", "option"),
)


def main(argv: list[str] | None = None) -> int:
    targets = _targets()
    parser = _arguments(targets)
    args = parser.parse_args(argv)

    def body() -> int:
        if args.check or args.rebuild_check or args.cost:
            given = [flag for flag, value in _BUILD_ONLY if getattr(args, value) not in (None, False, [], 1)]
            if given:
                parser.print_usage(sys.stderr)
                which = "--check" if args.check else "--rebuild-check" if args.rebuild_check else "--cost"
                print(
                    f"logos-compile: error: {which} reads what to check from the manifest: it takes no "
                    f"{', '.join(given)}",
                    file=sys.stderr,
                )
                return USAGE_ERROR
        if args.check:
            return _check(Path(args.check), args.model, args.model_seed)
        if args.rebuild_check:
            return _rebuild_check(Path(args.rebuild_check), args, targets)
        if args.cost:
            return _cost(Path(args.cost))
        needed = (("--target", args.target), ("--cut", args.cut), ("-o", args.output))
        missing = [flag for flag, value in needed if not value]
        if missing:
            parser.print_usage(sys.stderr)
            print(f"logos-compile: error: a build needs {', '.join(missing)}", file=sys.stderr)
            return USAGE_ERROR
        for line in build(args, targets, Path(args.output)):
            print(line)
        return 0

    return run_tool("logos-compile", body, argv)


if __name__ == "__main__":
    sys.exit(main())
