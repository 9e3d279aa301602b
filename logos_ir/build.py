"""The build folder: what `logos-compile` writes for every lane, and the checks that it is what it says.

A lane's build function turns a `BuildRequest` (the model, the cut, the chips, the weight image wanted) into a
`LaneBuild`: its artifacts (each a relative path, its bytes and the identity of the LOGOS program it was lowered
from) and a report (figures the lane computes, such as a cost model's). `write_build` writes them with
`manifest.json` into a temporary folder beside the destination and renames it into place only when every byte is
written, so a failed or interrupted build leaves the previous build as it was and no half-written folder. The
manifest has sorted keys and no timestamps and no absolute paths, so the same inputs give the same bytes on any
machine. `check_build` re-hashes a folder against its manifest.

The contract every artifact keeps: a text artifact carries its program's identity line in its first lines (as a
comment in its own syntax), a binary artifact carries it in its header (its first 4 KiB), and a LOGOS program is its
own identity (its header names the cut, its bytes hash to the digest); `write_build` refuses an artifact that does
not, so no lane can ship a file that cannot say where it came from. See `docs/builds.md`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from logos_ir.errors import BuildError
from logos_ir.program import Cut, Identity

if TYPE_CHECKING:
    from xdsl.dialects.builtin import ModuleOp

from logos_ir.models import ModelSource, file_sha256, tool_versions
from logos_ir.progress import Progress

MANIFEST = "manifest.json"
FORMAT = "logos-build 1"
TEXT_IDENTITY_LINES = 3  # a text artifact names its program within its first three lines
BINARY_IDENTITY_BYTES = 4096  # a binary artifact names its program within its header's first 4 KiB


# -- what a lane is asked for, and what it gives --------------------------------------------------------------


@dataclass(frozen=True)
class BuildRequest:
    """What `logos-compile` asks a lane to build: `cut` of the model's program, split over `tp` chips when tp > 1,
    with the weight image `weights` (f32, bf16 or f16); the image's bytes only when `with_weights`.
    `options` are the target's own options (`--option key=value`). `model.store()` opens the weights, which a
    lane calls only to write the weight image: a build of code reads no weight value."""

    model: ModelSource
    cut: Cut
    tp: int
    weights: str
    with_weights: bool
    progress: Progress
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def spec(self):  # -> ModelSpec (typed loosely to keep this module's imports light)
        return self.model.spec


@dataclass(frozen=True)
class Artifact:
    """One file of a build: `path` relative to the build folder (POSIX, no `..`), its bytes, the identity of the
    program it was lowered from, its `kind` (`text`, `binary`, or `logos` for a LOGOS program, whose header names
    its cut and whose SHA-256 is its identity's digest, as LOGOS has no comments) and its `role` in one word
    (program, kernels, host, instructions, layout, weights, engine, report ...)."""

    path: str
    data: bytes
    identity: Identity
    kind: str = "text"
    role: str = "program"

    @classmethod
    def text(cls, path: str, text: str, identity: Identity, role: str = "program") -> Artifact:
        return cls(path, text.encode("utf-8"), identity, "text", role)


@dataclass
class LaneBuild:
    """What a lane's build gives: its artifacts, a JSON-ready report for the manifest, and the lines
    `logos-compile` prints after building (a cost model's estimate, a placement's sizes)."""

    artifacts: list[Artifact]
    report: dict[str, Any] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)


# -- the programs a lane lowers -----------------------------------------------------------------------------


def program_module(request: BuildRequest) -> tuple[ModuleOp, Identity, str]:
    """The cut the request names, as the author writes it (split over `tp` chips when tp > 1), parsed into `logos`
    IR: the module, the identity, and the LOGOS text itself."""
    from xdsl.dialects.builtin import ModuleOp

    from logos_ir.author import written, written_split
    from logos_ir.parser import parse_program

    if request.tp > 1:
        authored, identity = written_split(request.spec, request.cut, "", request.tp)
    else:
        authored, identity = written(request.spec, request.cut)
    program = parse_program(authored.text, f"<{request.cut.option()}>")
    return ModuleOp([program]), identity, authored.text


def extracted_parts(module: ModuleOp, parts: Sequence[Cut], progress: Progress) -> Iterator[tuple[Cut, ModuleOp]]:
    """Each part of the whole program in `module`, extracted as `cut-extract` does (so each prints back as exactly
    the author's text for it, its identity restamped), as its own module. `module` is left as it was, and only the
    sections a part keeps are copied."""
    from xdsl.dialects.builtin import ModuleOp

    from logos_ir.identity import the_program
    from logos_ir.passes.cut_extract import extract

    program = the_program(module, "extracted_parts")
    for cut in progress.over(parts, "extracting parts"):
        yield cut, ModuleOp([extract(program, cut)])


# -- writing a build ----------------------------------------------------------------------------------------


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_artifact(artifact: Artifact) -> None:
    """Refuse an artifact that breaks the contract: a path that is not plain and relative, a text artifact whose
    first lines do not carry its identity line, a binary one whose header does not."""
    path = PurePosixPath(artifact.path)
    if not artifact.path or path.is_absolute() or ".." in path.parts or "\\" in artifact.path or path.name == MANIFEST:
        raise BuildError(f"artifact path '{artifact.path}' is not a plain relative path inside the build folder")
    line = artifact.identity.line().encode("utf-8")
    if artifact.kind == "logos":  # a LOGOS program is its own identity: its header names the cut, its bytes hash
        if sha256_hex(artifact.data) != artifact.identity.hex() or not artifact.data.startswith(_header(artifact)):
            raise BuildError(f"artifact '{artifact.path}' is not the LOGOS text of '{artifact.identity.line()}'")
        return
    if artifact.kind == "text":
        head = b"\n".join(artifact.data.split(b"\n", TEXT_IDENTITY_LINES)[:TEXT_IDENTITY_LINES])
        where = f"its first {TEXT_IDENTITY_LINES} lines"
    elif artifact.kind == "binary":
        head, where = artifact.data[:BINARY_IDENTITY_BYTES], f"its first {BINARY_IDENTITY_BYTES} bytes"
    else:
        raise BuildError(f"artifact '{artifact.path}': kind '{artifact.kind}' is not logos, text or binary")
    if line not in head:
        raise BuildError(f"artifact '{artifact.path}' does not carry the identity line of its program in {where}")


def _header(artifact: Artifact) -> bytes:
    return f"## Program: {artifact.identity.cut}".encode()


def manifest_of(request: BuildRequest, target: str, lane: LaneBuild) -> dict[str, Any]:
    """The manifest of a build: tool, model, target, and every artifact with its digest, size and identity."""
    artifacts = sorted(lane.artifacts, key=lambda a: a.path)
    return {
        "format": FORMAT,
        "tool": tool_versions(),
        "model": request.model.describe(),
        "target": {
            "name": target,
            "cut": request.cut.option(),
            "tp": request.tp,
            "weights": request.weights,
            "with_weights": request.with_weights,
            "options": dict(sorted(request.options.items())),
        },
        "programs": sorted({a.identity.line() for a in artifacts}),
        "artifacts": [
            {
                "path": a.path,
                "sha256": sha256_hex(a.data),
                "size": len(a.data),
                "kind": a.kind,
                "role": a.role,
                "identity": a.identity.line(),
            }
            for a in artifacts
        ],
        "report": lane.report,
        "weight_bytes": weight_bytes(request),
    }


IMAGE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def weight_bytes(request: BuildRequest) -> dict[str, Any]:
    """The model's weights as stored (each tensor in its format, `spec.storage`; f32 where it says none) and as
    the lane reads them (every lane reads the dequantized image, `request.weights` a number), with the tensors of
    each format."""
    from logos_ir import quant

    spec = request.spec
    stored = read = 0
    formats: dict[str, int] = {}
    for name, shape in spec.weights():
        fmt = quant.FORMATS[spec.stored_as(name) or "f32"]
        stored += fmt.stored_bytes(shape)
        read += math.prod(shape) * IMAGE_BYTES[request.weights]
        formats[fmt.name] = formats.get(fmt.name, 0) + 1
    return {"stored_bytes": stored, "read_bytes": read, "image": request.weights, "formats": formats}


def manifest_text(manifest: Mapping[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_build(destination: Path, produce: Callable[[], tuple[Mapping[str, Any], Sequence[Artifact]]]) -> None:
    """Build into `destination` atomically: a temporary folder beside it is made first, `produce` computes the
    manifest and the artifacts, every file is written there, and the folder is renamed into place. A failure or an
    interrupt at any point leaves the previous build (if any) as it was; a kill leaves at most a hidden staging
    folder beside it, which the next build removes."""
    destination = destination.absolute()
    for parent in destination.parents:  # a file where a folder of the path should be: one error naming it
        if parent.exists() and not parent.is_dir():
            raise BuildError(f"{destination}: {parent} is a file, not a folder; give -o a folder path")
    _refuse_foreign(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(destination)
    with _temporary_folder(destination) as staging:
        manifest, artifacts = produce()
        _check_artifacts(artifacts)
        for artifact in artifacts:
            target = staging / artifact.path
            target.parent.mkdir(parents=True, exist_ok=True)  # files and folders as the umask gives (0644, 0755)
            target.write_bytes(artifact.data)
        (staging / MANIFEST).write_text(manifest_text(manifest), encoding="utf-8", newline="\n")
        _swap_into_place(staging, destination)


def _check_artifacts(artifacts: Sequence[Artifact]) -> None:
    for artifact in artifacts:
        check_artifact(artifact)
    paths = [a.path for a in artifacts]
    if len(set(paths)) != len(paths):
        raise BuildError("two artifacts of the build have the same path")


def _refuse_foreign(destination: Path) -> None:
    """Only a build folder (or nothing, or an empty folder) is ever replaced."""
    if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
        raise BuildError(f"{destination}: exists and is not a folder; give -o a folder for the build")
    if destination.is_dir() and any(destination.iterdir()) and not (destination / MANIFEST).is_file():
        raise BuildError(
            f"{destination}: the folder is not empty and is not a logos-ir build (it has no {MANIFEST})",
            hint="give -o a new folder, or one a previous logos-compile wrote",
        )


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _staging_prefix(destination: Path) -> str:
    return f".{destination.name}.logos-build-"


def _remove_stale(destination: Path) -> None:
    """Clear what a build killed outright (SIGKILL, power loss) left beside the destination: a previous build it had
    renamed aside is put back where the destination is missing, every staging folder is removed."""
    for aside in sorted(destination.parent.glob(_staging_prefix(destination) + "*" + _ASIDE)):
        if not destination.exists():
            os.rename(aside, destination)
    for stale in destination.parent.glob(_staging_prefix(destination) + "*"):
        shutil.rmtree(stale, ignore_errors=True)


_ASIDE = ".previous"


@contextmanager
def _temporary_folder(destination: Path) -> Iterator[Path]:
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(destination), dir=destination.parent))
    os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's 0700 would keep a deployed build from its readers
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_DFL, None):  # a terminated build cleans up as an interrupted one does
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield staging
    finally:
        if previous in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        shutil.rmtree(staging, ignore_errors=True)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _swap_into_place(staging: Path, destination: Path) -> None:
    """Rename the finished build to `destination`. A previous build is first renamed aside, and put back if the
    second rename fails (or, after a kill between the two, by the next build's `_remove_stale`)."""
    aside = staging.with_name(staging.name + _ASIDE)
    if destination.is_dir() and any(destination.iterdir()):
        os.rename(destination, aside)
    elif destination.is_dir():
        destination.rmdir()
    try:
        os.rename(staging, destination)
    except BaseException:
        if aside.exists():
            os.rename(aside, destination)
        raise
    shutil.rmtree(aside, ignore_errors=True)


# -- checking a build ---------------------------------------------------------------------------------------


@dataclass
class CheckReport:
    """What `check_build` found: files whose bytes differ from the manifest, files it names that are missing,
    files it does not name, and weight files that differ from the model's."""

    differ: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.differ or self.missing or self.extra or self.weights)

    def lines(self) -> list[str]:
        return (
            [f"differs: {p}" for p in self.differ]
            + [f"missing: {p}" for p in self.missing]
            + [f"extra: {p}" for p in self.extra]
            + [f"weights differ: {p}" for p in self.weights]
        )


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a build folder, checked for the fields `check_build` reads."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise BuildError(f"{folder}: {'not a folder' if folder.exists() else 'no such folder'}")
    if not path.is_file():
        raise BuildError(f"{folder}: not a logos-ir build (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BuildError(f"{path}: not a manifest: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BuildError(f"{path}: not a manifest of format '{FORMAT}'")
    entries = manifest.get("artifacts")
    if not isinstance(entries, list) or not all(_is_entry(e) for e in entries):
        raise BuildError(f"{path}: 'artifacts' is not a list of entries with a path, a sha256 and a size")
    for entry in entries:
        inside(folder, entry["path"], path)
    return manifest


def inside(folder: Path, relative: str, manifest: Path | str = MANIFEST) -> Path:
    """`relative`, a path the manifest names, as a path inside `folder`; refused (naming it) when it is absolute,
    has a `..`, or resolves outside the folder through a link, so a build received from elsewhere cannot make the
    checker read the machine."""
    pure = PurePosixPath(relative)
    if (
        not relative
        or pure.is_absolute()
        or ".." in pure.parts
        or "\\" in relative
        or "\0" in relative
        or (len(relative) > 1 and relative[1] == ":")
    ):
        raise BuildError(f"{manifest}: the artifact path '{relative}' is not a plain relative path inside the folder")
    where = folder / relative
    try:
        resolved, root = where.resolve(), folder.resolve()
    except (OSError, RuntimeError):  # a loop of links
        raise BuildError(f"{manifest}: the artifact path '{relative}' cannot be resolved (a loop of links?)") from None
    if resolved != root and root not in resolved.parents:
        raise BuildError(f"{manifest}: the artifact path '{relative}' leads outside the folder (through a link)")
    return where


def _is_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("path"), str)
        and isinstance(entry.get("sha256"), str)
        and isinstance(entry.get("size"), int)
    )


def check_build(folder: Path, model: ModelSource | None = None, progress: Progress | None = None) -> CheckReport:
    """Re-hash every artifact of `folder` against its manifest (and, given `model`, its weight files against the
    manifest's record of them)."""
    manifest = read_manifest(folder)
    report = CheckReport()
    named = {MANIFEST}
    for entry in manifest["artifacts"]:
        relative = entry["path"]
        named.add(relative)
        path = folder / relative
        if not path.is_file() or path.is_symlink():
            report.missing.append(relative)
        elif path.stat().st_size != entry["size"] or file_sha256(path) != entry["sha256"]:
            report.differ.append(relative)
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and relative not in named:
            report.extra.append(relative)
    if model is not None:
        report.weights = model.differing_weights(manifest.get("model", {}), progress)
    return report


def compare_folders(left: Path, right: Path) -> list[str]:
    """The relative paths whose bytes differ between two folders, or that only one of them has."""

    def files(root: Path) -> dict[str, Path]:
        return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}

    a, b = files(left), files(right)
    return sorted(
        name
        for name in set(a) | set(b)
        if name not in a or name not in b or a[name].read_bytes() != b[name].read_bytes()
    )


# -- the `logos` target: the LOGOS programs themselves ---------------------------------------------------------


def build_logos(request: BuildRequest) -> LaneBuild:
    """The target `logos`: the program of the cut (`program.logos`) and, for a whole program, each of its parts
    (`parts/embedding.logos`, `parts/layer_NN.logos`, `parts/head.logos`) as `cut-extract` writes them. LOGOS has
    no comments: each file's header names its cut and its SHA-256 is the digest of its identity line, which the
    manifest records beside it."""
    from logos_ir.identity import identity as identity_of
    from logos_ir.printer import print_program

    module, identity, text = program_module(request)
    artifacts = [_logos_artifact("program.logos", text, identity)]
    parts = request.cut.parts(request.spec.layers) if request.cut.kind in Cut.WHOLE else []
    if request.tp > 1:  # of a split program the author writes only the layers split (the rest is on every chip)
        parts = [cut for cut in parts if cut.layer is not None]
    width = len(str(max(request.spec.layers - 1, 0)))
    for cut, part in extracted_parts(module, parts, request.progress):
        program = part.ops.first
        artifacts.append(_logos_artifact(_part_path(cut, width), print_program(program), identity_of(program)))
    report = {"parts": len(parts)}
    return LaneBuild(artifacts, report, [f"{len(artifacts)} LOGOS programs"])


def _part_path(cut: Cut, width: int) -> str:
    if cut.layer is not None:
        return f"parts/layer_{cut.layer:0{width}d}.logos"
    return "parts/embedding.logos" if cut.kind.endswith("_embed") else "parts/head.logos"


def _logos_artifact(path: str, text: str, identity: Identity) -> Artifact:
    return Artifact(path, text.encode("utf-8"), identity, kind="logos", role="program")
