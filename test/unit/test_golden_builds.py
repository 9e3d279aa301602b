"""Every target's build of the tiny preset and of the embedded SmolLM2 gives the same bytes as the golden file
records (`tools/golden_builds.py` wrote it from the tree before a change that meant to print nothing new). A build
that differs names its artifacts; `python3 tools/golden_builds.py --check --dump DIR` writes them to diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logos_ir.tools.golden_builds import BUILDS, digests, key

GOLDEN = json.loads((Path(__file__).parent / "golden" / "builds.json").read_text())


@pytest.mark.parametrize("build", BUILDS, ids=key)
def test_build_is_byte_identical_to_the_golden(build):
    found = digests(build)
    expected = GOLDEN[key(build)]
    changed = sorted(path for path in expected.keys() | found.keys() if expected.get(path) != found.get(path))
    assert not changed, f"{key(build)}: these artifacts differ from the golden build: {changed}"
