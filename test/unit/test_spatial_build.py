"""`logos-compile --target spatial`: what the build writes and reports, that it reads no weight value, that every part
of the embedded model places on a WSE-2 within its 48 KiB per element, that element programs are made once per
distinct shape (issue 14: an 80-layer model has as many as a 2-layer one), and its refusals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from logos_ir.build import BuildError, BuildRequest, check_artifact
from logos_ir.errors import PassError
from logos_ir.models import ModelSource
from logos_ir.passes.spatial.build import build_spatial
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec

WSE2_MEMORY = 48 * 1024


def _request(model: ModelSource, cut: str, weights: str = "f16", **options: str) -> BuildRequest:
    return BuildRequest(model, Cut.parse(cut), 1, weights, False, Progress.silent(), options)


def _no_weights(model: ModelSource, monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    """The model, with its weights made unreadable: a build of code must not open them."""

    def refuse(self: ModelSource) -> None:
        raise AssertionError("a build of code read the weights")

    monkeypatch.setattr(ModelSource, "store", refuse)
    return model


def test_tiny_decode_build(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _no_weights(ModelSource.resolve("tiny"), monkeypatch)
    lane = build_spatial(_request(model, "decode ctx=64"))
    paths = sorted(a.path for a in lane.artifacts)
    regions = ["embedding", "head", "layer_0", "layer_1"]
    assert paths == [f"parts/{r}/{f}" for r in regions for f in ("layout.csl", "pe_program.csl", "placement.mlir")]
    for artifact in lane.artifacts:
        check_artifact(artifact)  # the identity line in the first three lines
        assert artifact.data.decode().startswith(f"// {artifact.identity.line()}\n")
    report = lane.report
    spec = model.spec
    assert [r["region"] for r in report["regions"]] == ["embedding", "layer_0", "layer_1", "head"]
    assert report["words_between_regions_per_token"] == spec.hidden * 3 + spec.layers + 2
    assert report["words_between_regions_minimum"] == report["words_between_regions_per_token"]
    assert 0 < report["memory_per_element_mean"] <= report["memory_per_element_max"] <= WSE2_MEMORY
    assert report["elements_used"] == sum(r["elements_used"] for r in report["regions"]) > 0
    assert report["tokens_per_s"] > 0 and report["cycles_per_token"] > 0
    assert report["element_programs"] == 3  # the embedding's, the layers' (shared), the head's
    assert any("tokens/s" in line for line in lane.summary)
    json.dumps(report)


def test_layers_share_their_csl(monkeypatch: pytest.MonkeyPatch) -> None:
    lane = build_spatial(_request(_no_weights(ModelSource.resolve("tiny"), monkeypatch), "decode ctx=64"))
    texts = {a.path: a.data.decode() for a in lane.artifacts}
    first, second = texts["parts/layer_0/pe_program.csl"], texts["parts/layer_1/pe_program.csl"]
    assert first != second  # each names its own program
    assert first.split("\n", 2)[2] == second.split("\n", 2)[2]  # and is otherwise the same program


def _wide(layers: int) -> ModelSpec:
    return ModelSpec(
        vocab=512, hidden=128, layers=layers, heads=8, kv_heads=2, head_dim=16, intermediate=256, rms_eps=1e-5,
        rope_theta=10000.0, tie_embeddings=False,
    )  # fmt: skip


def test_element_programs_do_not_grow_with_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14: as many distinct element programs for 80 layers as for 2 of the same widths."""
    counts = []
    for layers in (2, 80):
        model = _no_weights(ModelSource("preset", f"wide-{layers}", _wide(layers)), monkeypatch)
        counts.append(build_spatial(_request(model, "decode ctx=128")).report["element_programs"])
    assert counts[0] == counts[1] == 3


@pytest.mark.parametrize("weights", ["f16", "f32"])
def test_embedded_model_places_on_a_wse2(weights: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part of SmolLM2-135M, at its longest context, within 48 KiB per element on a WSE-2's 757 x 996."""
    model = _no_weights(ModelSource.resolve(None), monkeypatch)
    report = build_spatial(_request(model, "decode ctx=8192", weights)).report
    assert report["grid"]["width"] * report["grid"]["height"] == 757 * 996
    assert len(report["regions"]) == model.spec.layers + 2
    assert report["memory_per_element_max"] <= WSE2_MEMORY
    for region in report["regions"]:
        x, y = region["origin"]
        w, h = region["size"]
        assert x + w <= 757 and y + h <= 996
    assert 0 < report["grid_share"] < 1
    assert report["words_between_regions_per_token"] <= 2 * report["words_between_regions_minimum"]


def test_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    lane = build_spatial(_request(_no_weights(ModelSource.resolve("tiny"), monkeypatch), "decode_layer layer=1 ctx=64"))
    assert sorted(a.path for a in lane.artifacts) == [
        "parts/layer_1/layout.csl",
        "parts/layer_1/pe_program.csl",
        "parts/layer_1/placement.mlir",
    ]
    assert lane.report["tokens_per_s"] is None  # one part alone does not make a token


def test_refusals() -> None:
    tiny = ModelSource.resolve("tiny")
    with pytest.raises(BuildError, match="decode step or its parts"):
        build_spatial(_request(tiny, "prefill rows=4 ctx=64"))
    with pytest.raises(BuildError, match="no option colour"):
        build_spatial(_request(tiny, "decode ctx=64", colour="3"))
    with pytest.raises(
        PassError, match=r"@layer_0 of 8 x 16 elements at \(0, 0\) does not fit the grid @wse2 of 8 x 8"
    ):
        build_spatial(_request(tiny, "decode ctx=64", width="8", height="8", tile="16"))
    with pytest.raises(PassError, match=r"spatial-place: 4 region\(s\) of \d+ elements in all .* do not fit the grid"):
        build_spatial(_request(tiny, "decode ctx=64", width="12", height="20", tile="16"))
    with pytest.raises(PassError, match="more than the 6500 bytes of memory per element"):
        build_spatial(_request(tiny, "decode ctx=64", memory="6500", tile="16"))


def test_logos_compile_spatial(tmp_path: Path) -> None:
    out = tmp_path / "build"
    command = [sys.executable, "-m", "logos_ir.tools.logos_compile", "--model", "tiny", "--target", "spatial"]
    done = subprocess.run([*command, "--cut", "decode ctx=64", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "words moved per token" in done.stdout + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["report"]["element_programs"] == 3
    assert (out / "parts" / "head" / "pe_program.csl").is_file()
