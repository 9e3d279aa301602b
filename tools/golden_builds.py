"""The golden builds: the SHA-256 of every artifact that `logos-compile` writes for a fixed set of builds (the tiny
preset and the embedded SmolLM2, every target, without weights), so a change that means to print nothing new can be
checked byte for byte against the recorded digests (`test/unit/test_golden_builds.py`).

    python3 tools/golden_builds.py            # rewrite test/unit/golden/builds.json from the tree as it is
    python3 tools/golden_builds.py --check    # compare, print the builds that differ, exit 1 if any
    python3 tools/golden_builds.py --check --dump DIR   # ... and write every build's files under DIR to diff

Regenerate only when a change is meant to change what is printed, and say so in its commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent.parent / "test" / "unit" / "golden" / "builds.json"

# (model, target, cut, tp, weights, options): each a build of code alone (no weight image), ptxas's report off so the
# digests do not depend on whether nvcc is on PATH.
BUILDS: tuple[tuple[str, str, str, int, str, tuple[tuple[str, str], ...]], ...] = (
    ("tiny", "logos", "decode ctx=64", 1, "f32", ()),
    ("tiny", "cuda", "decode ctx=64", 1, "bf16", (("ptxas", "off"),)),
    ("tiny", "cuda", "decode ctx=64", 1, "f32", (("ptxas", "off"),)),
    ("tiny", "cuda", "decode ctx=64", 2, "bf16", (("ptxas", "off"),)),
    ("tiny", "cuda", "prefill rows=8 ctx=64", 1, "bf16", (("ptxas", "off"),)),
    ("tiny", "cuda", "batch rows=4 ctx=64", 1, "bf16", (("ptxas", "off"),)),
    ("tiny", "d5005", "decode ctx=64", 1, "bf16", ()),
    ("tiny", "d5005", "decode ctx=64", 1, "f32", ()),
    ("tiny", "spatial", "decode ctx=64", 1, "f16", ()),
    ("tiny", "spatial", "decode ctx=64", 1, "f32", ()),
    ("embedded", "logos", "decode ctx=256", 1, "f32", ()),
    ("embedded", "cuda", "decode ctx=256", 1, "bf16", (("ptxas", "off"),)),
    ("embedded", "cuda", "prefill rows=16 ctx=256", 1, "bf16", (("ptxas", "off"),)),
    ("embedded", "d5005", "decode ctx=256", 1, "bf16", ()),
    ("embedded", "spatial", "decode ctx=256", 1, "f16", ()),
)


def key(build: tuple[Any, ...]) -> str:
    model, target, cut, tp, weights, options = build
    extra = "".join(f" {k}={v}" for k, v in options)
    return f"{model} {target} '{cut}' tp={tp} {weights}{extra}"


def digests(build: tuple[Any, ...], dump: Path | None = None) -> dict[str, str]:
    """Each artifact's path and SHA-256 for one build (its files also written under `dump`, when given, to diff)."""
    from logos_ir.build import BuildRequest, sha256_hex
    from logos_ir.models import ModelSource
    from logos_ir.program import Cut
    from logos_ir.progress import Progress
    from logos_ir.registry import compile_targets

    model, target, cut, tp, weights, options = build
    request = BuildRequest(
        model=ModelSource.resolve(model),
        cut=Cut.parse(cut),
        tp=tp,
        weights=weights,
        with_weights=False,
        progress=Progress.silent(),
        options=dict(options),
    )
    lane = compile_targets()[target].build()(request)
    for artifact in lane.artifacts if dump else ():
        path = dump / key(build).replace(" ", "_").replace("'", "").replace("=", "-") / artifact.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(artifact.data)
    return {a.path: sha256_hex(a.data) for a in lane.artifacts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare against the golden file instead of writing it")
    parser.add_argument("--dump", type=Path, help="also write every build's files under this folder")
    args = parser.parse_args(argv)
    found = {key(b): digests(b, args.dump) for b in BUILDS}
    if not args.check:
        GOLDEN.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN} ({len(found)} builds)")
        return 0
    golden = json.loads(GOLDEN.read_text())
    differ = [name for name in found if found[name] != golden.get(name)]
    for name in differ:
        print(f"differs: {name}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
