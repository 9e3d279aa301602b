"""Where a model comes from: what `--model` names, resolved once, for `logos-compile` and the build manifest.

`--model` is a preset (random weights, no files), the embedded SmolLM2, a Hugging Face model folder (a plain
folder or a snapshot of the Hugging Face cache), a `.gguf` file, or a hub id (`org/name`) found in the local
Hugging Face cache (`logos_ir.weights.resolve_hub_id`; never downloaded). A `ModelSource` knows the spec from the
model's headers alone and opens the weights only when asked (`store()`), so a build of code reads no weight
value. It describes itself for the manifest with no absolute path: the kind, the name the user gave (a folder by
its base name, a hub snapshot by id and revision), the spec, and each model file with its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logos_ir.errors import WeightError
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec
from logos_ir.weights import WeightStore, embedded_model_path, hub_snapshot, open_model
from logos_ir.weights.hub import EMBEDDED_PACKAGE
from logos_ir.weights.safetensors import SAFETENSORS_FILE, SAFETENSORS_INDEX
from logos_ir.weights.store import QuantizedWeights, RandomWeights

_BLOCK = 1 << 20
PRESET_NOTE = "a preset: random weights made from the seed, no weight files"


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (a weight file is too large to read at once)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        ticker = progress.bytes(path.stat().st_size, f"hashing {path.name}") if progress else None
        while block := stream.read(_BLOCK):
            digest.update(block)
            if ticker is not None:
                ticker(len(block))
    return digest.hexdigest()


def tool_versions() -> dict[str, str]:
    """The versions of logos-ir and of the libraries whose output a build depends on."""
    return {"logos-ir": importlib.metadata.version("logos-ir"), "xdsl": importlib.metadata.version("xdsl")}


@dataclass
class ModelSource:
    """A model as `--model` named it: `kind` (preset, embedded, folder, gguf, hub), the `name` to record, the
    `spec`, and `path` (the folder or file) where it has files."""

    kind: str
    name: str
    spec: ModelSpec
    path: Path | None = None
    seed: int = 0
    revision: str | None = None
    storage: str | None = None  # a preset's weights stored in this block format by logos_ir.quant's quantizer
    progress: Progress = field(default_factory=Progress.silent)
    _store: WeightStore | None = field(default=None, repr=False)
    _files: list[dict[str, Any]] | None = field(default=None, repr=False)

    @classmethod
    def resolve(
        cls, model: str | None, seed: int = 0, progress: Progress | None = None, storage: str | None = None
    ) -> ModelSource:
        """The model `--model` names (None or "embedded": the embedded SmolLM2); a preset's random weights stored
        in the block format `storage` where given (a file's storage is its own)."""
        progress = progress or Progress.silent()
        if model in ModelSpec.presets():
            assert model is not None
            if storage is None:
                return cls("preset", model, ModelSpec.preset(model), seed=seed, progress=progress)
            store = QuantizedWeights(RandomWeights(ModelSpec.preset(model), seed), storage)
            return cls("preset", model, store.spec, seed=seed, progress=progress, storage=storage, _store=store)
        if storage is not None:
            raise WeightError(
                f"--weights {storage} quantizes a preset's random weights; {model or 'the embedded model'} is "
                "stored as its file says",
                hint="give --weights the lane's image precision (f32, bf16, f16), or --model a preset",
            )
        store = open_model(model, seed=seed)  # reads headers and config only
        if model is None or model in ("", "embedded"):
            path = embedded_model_path()
            version = importlib.metadata.version(EMBEDDED_PACKAGE)
            return cls("embedded", f"{EMBEDDED_PACKAGE} {version}", store.spec, path, progress=progress, _store=store)
        snapshot = hub_snapshot(Path(store.source))
        if snapshot is not None:
            repo, revision = snapshot
            return cls("hub", repo, store.spec, Path(store.source), revision=revision, progress=progress, _store=store)
        path = Path(store.source)
        kind = "folder" if path.is_dir() else "gguf"
        return cls(kind, path.name, store.spec, path, progress=progress, _store=store)

    def store(self) -> WeightStore:
        """The weights, opened once (random ones for a preset)."""
        if self._store is None:
            store = open_model(self.name if self.kind == "preset" else str(self.path), seed=self.seed)
            self._store = store if self.storage is None else QuantizedWeights(store, self.storage)
        return self._store

    # -- the manifest's record ---------------------------------------------------------------------------------

    def files(self) -> list[Path]:
        """The files that define the model's weights: a GGUF file, or a folder's config, index and shards."""
        if self.path is None:
            return []
        if self.path.is_file():
            return [self.path]
        names = ["config.json"]
        index = self.path / SAFETENSORS_INDEX
        if index.exists():
            from logos_ir.weights import read_index

            names += [SAFETENSORS_INDEX, *sorted(set(read_index(index).values()))]
        else:
            names.append(SAFETENSORS_FILE)
        return [self.path / name for name in names]

    def file_records(self) -> list[dict[str, Any]]:
        """Each model file by its name relative to the model, with its size and SHA-256 (hashed once)."""
        if self._files is None:
            base = self.path if self.path is not None and self.path.is_dir() else None
            self._files = [
                {
                    "file": f.relative_to(base).as_posix() if base is not None else f.name,
                    "size": f.stat().st_size,
                    "sha256": file_sha256(f, self.progress),
                }
                for f in self.files()
            ]
        return self._files

    def describe(self) -> dict[str, Any]:
        """The manifest's `model` object."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "spec": self.spec.to_dict()}
        if self.kind == "preset":
            out |= {"seed": self.seed, "files": [], "note": PRESET_NOTE}
            if self.storage is not None:
                out["storage"] = self.storage
        else:
            out["files"] = self.file_records()
        if self.revision is not None:
            out["revision"] = self.revision
        return out

    def differing_weights(self, recorded: dict[str, Any], progress: Progress | None = None) -> list[str]:
        """The model files whose size or digest differ from the manifest's record (or that one side lacks)."""
        if self.spec.to_dict() != recorded.get("spec"):
            return ["the model's spec differs from the one the build was made for"]
        if self.kind == "preset" and (recorded.get("kind"), recorded.get("seed"), recorded.get("storage")) != (
            "preset",
            self.seed,
            self.storage,
        ):
            return [f"the preset's random weights (seed {self.seed}) are not the ones the build was made for"]
        have = {r["file"]: r for r in self.file_records()}
        want = {r.get("file"): r for r in recorded.get("files", []) if isinstance(r, dict)}
        differ = [name for name in sorted(set(have) | set(want), key=str) if have.get(name) != want.get(name)]
        return [str(name) for name in differ]


def check_model_matches(source: ModelSource, recorded: dict[str, Any]) -> None:
    """Refuse to rebuild a build from a model other than the one its manifest records."""
    differ = source.differing_weights(recorded)
    if differ:
        raise WeightError(
            f"the model given is not the one the build was made from: {', '.join(differ)}",
            hint="give --model the model the build's manifest names",
        )
