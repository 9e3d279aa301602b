"""Robustness of every reader of untrusted input: weights from strangers, truncated and absurd files, configs
missing fields, and the fuzzing's regression corpus (test/fuzz/corpus/<reader>/, replayed through the same
`check` the fuzz driver runs; see docs/fuzzing.md).

Every bad input gets the project's error (`LogosError`), names what is wrong, reads nothing outside the model's
folder and allocates nothing on a file's word alone."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from logos_ir import errors, testing
from logos_ir.errors import LogosError, SourceLocation, SpecError, TokenizerError, WeightError
from logos_ir.spec import ModelSpec
from logos_ir.tokenizer import Tokenizer
from logos_ir.tools import fuzz
from logos_ir.weights import GGUFFile, GGUFStore, SafetensorsStore, hf_config, open_model

REPO = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"
# A reader may use a little memory for headers; a file's word must never make it allocate more than this.
SMALL_ALLOCATION = 4 * 1024 * 1024


def refused(kind: type[LogosError], body: Callable[[], object], *words: str) -> str:
    """Run `body`, which must raise `kind` whose message holds every one of `words`; the message."""
    with pytest.raises(kind) as error:
        body()
    text = str(error.value)
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"
    return text


def peak_allocation(body: Callable[[], object]) -> int:
    """The most memory (bytes, as tracemalloc sees Python and numpy allocations) `body` held at once."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        body()
    except LogosError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def safetensors_bytes(header: dict | bytes, data: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def split_safetensors(raw: bytes) -> tuple[dict, bytes]:
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A small model folder in its own parent, beside an `outside/` folder with a valid shard."""
    outside = testing.write_model_folder(tmp_path / "outside")
    (outside / "evil.safetensors").write_bytes((outside / "model.safetensors").read_bytes())
    return testing.write_model_folder(tmp_path / "model")


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    testing.write_model_folder(tmp_path / "outside")
    return testing.write_model_folder(tmp_path / "model", shards=2)


def rewrite_index(folder: Path, target: str) -> str:
    """Point the index's first tensor at `target`; the tensor's name."""
    index = json.loads((folder / INDEX).read_text())
    first = sorted(index["weight_map"])[0]
    index["weight_map"][first] = target
    (folder / INDEX).write_text(json.dumps(index))
    return first


def open_watched(folder: Path) -> None:
    """Open the folder as a model and read every tensor, failing on any file opened outside it."""

    def read() -> None:
        with SafetensorsStore(folder) as store:
            for name in store.names():
                store.get(name)

    fuzz.watched(folder, read)


# -- weights from strangers: nothing outside the model's folder is read -------------------------------------------


@pytest.mark.parametrize(
    "target",
    [
        "../outside/evil.safetensors",
        "../outside/model.safetensors",
        "sub/../../outside/evil.safetensors",
        "..",
        "/etc/passwd",
        "C:/Windows/win.ini",
        "..\\outside\\evil.safetensors",
        "model-00001-of-00002.safetensors\0.txt",
        "",
    ],
)
def test_shard_path_leaving_the_model_folder_is_refused(sharded, target):
    rewrite_index(sharded, target)
    refused(WeightError, lambda: open_watched(sharded), "model folder", INDEX)


@pytest.mark.parametrize("link", ["file", "folder", "chain"])
def test_shard_symlink_leaving_the_model_folder_is_refused(sharded, link):
    outside = sharded.parent / "outside"
    if link == "file":
        os.symlink(outside / "model.safetensors", sharded / "link.safetensors")
        target = "link.safetensors"
    elif link == "folder":
        os.symlink(outside, sharded / "linkdir")
        target = "linkdir/model.safetensors"
    else:  # a link inside the folder to a link that leaves it
        os.symlink(outside / "model.safetensors", sharded / "hop2.safetensors")
        os.symlink(sharded / "hop2.safetensors", sharded / "hop1.safetensors")
        target = "hop1.safetensors"
    rewrite_index(sharded, target)
    refused(WeightError, lambda: open_watched(sharded), "outside the model folder")


def test_single_file_and_index_that_are_links_outside_are_refused(folder):
    outside = folder.parent / "outside"
    (folder / "model.safetensors").unlink()
    os.symlink(outside / "model.safetensors", folder / "model.safetensors")
    refused(WeightError, lambda: open_watched(folder), "outside the model folder")


def test_index_that_is_a_link_outside_is_refused(sharded, tmp_path):
    index = json.loads((sharded / INDEX).read_text())
    (tmp_path / "elsewhere.json").write_text(json.dumps(index))
    (sharded / INDEX).unlink()
    os.symlink(tmp_path / "elsewhere.json", sharded / INDEX)
    refused(WeightError, lambda: open_watched(sharded), "outside the model folder")


def test_symlink_loop_is_refused(sharded):
    os.symlink(sharded / "loop-b.safetensors", sharded / "loop-a.safetensors")
    os.symlink(sharded / "loop-a.safetensors", sharded / "loop-b.safetensors")
    rewrite_index(sharded, "loop-a.safetensors")
    refused(WeightError, lambda: open_watched(sharded))


def test_plain_sharded_folder_reads_only_its_own_files(sharded):
    open_watched(sharded)  # no escape, no error


def test_the_escape_detector_itself_sees_a_read_outside(folder):
    outside = folder.parent / "outside" / "config.json"
    with pytest.raises(fuzz.ReaderFailure, match="outside the model folder"):
        fuzz.watched(folder, outside.read_bytes)


# -- nothing is allocated on a file's word alone ------------------------------------------------------------------


def test_truncated_safetensors_is_refused_before_any_large_allocation(folder):
    file = folder / "model.safetensors"
    data = file.read_bytes()
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    for cut in sorted({0, 7, 8, 9, header_end // 2, header_end - 1, header_end, header_end + 5, len(data) - 1}):
        file.write_bytes(data[:cut])
        refused(WeightError, lambda: SafetensorsStore(folder), "model.safetensors")
        assert peak_allocation(lambda: SafetensorsStore(folder)) < SMALL_ALLOCATION


@pytest.mark.parametrize("length", [2**40, 2**63, 2**64 - 1])
def test_safetensors_header_length_past_the_file_is_refused_without_reading_it(folder, length):
    file = folder / "model.safetensors"
    file.write_bytes(struct.pack("<Q", length) + b"{}")
    refused(WeightError, lambda: SafetensorsStore(folder), "truncated", str(length))
    assert peak_allocation(lambda: SafetensorsStore(folder)) < SMALL_ALLOCATION


def test_truncated_gguf_is_refused_before_any_large_allocation(tmp_path):
    data = testing.model_gguf(32, "Q8_0", tokenizer=True)
    path = tmp_path / "t.gguf"
    for cut in sorted({0, 3, 4, 23, 24, 40, 100, len(data) // 3, len(data) // 2, len(data) - 1}):
        path.write_bytes(data[:cut])
        refused(WeightError, lambda: GGUFStore(path), "t.gguf")
        assert peak_allocation(lambda: GGUFStore(path)) < SMALL_ALLOCATION


def huge_count_gguf(what: str) -> bytes:
    """A GGUF whose one count or length claims far more than the file holds."""
    huge = 2**62
    head = b"GGUF" + struct.pack("<I", 3)
    key = struct.pack("<Q", 4) + b"name"
    if what == "tensor count":
        return head + struct.pack("<QQ", huge, 0)
    if what == "metadata count":
        return head + struct.pack("<QQ", 0, huge)
    if what == "key length":
        return head + struct.pack("<QQQ", 0, 1, huge) + b"name"
    if what == "string length":
        return head + struct.pack("<QQ", 0, 1) + key + struct.pack("<IQ", 8, huge) + b"x"
    if what == "array count":
        return head + struct.pack("<QQ", 0, 1) + key + struct.pack("<IIQ", 9, 6, huge) + b"\0" * 8
    if what == "string array count":
        return head + struct.pack("<QQ", 0, 1) + key + struct.pack("<IIQ", 9, 8, huge) + b"\0" * 8
    if what == "nested array count":
        return head + struct.pack("<QQ", 0, 1) + key + struct.pack("<IIQ", 9, 9, huge) + b"\0" * 16
    if what == "tensor dims":
        name = struct.pack("<Q", 1) + b"x"
        return head + struct.pack("<QQ", 1, 0) + name + struct.pack("<I4QIQ", 4, *[2**32] * 4, 0, 0)
    raise ValueError(what)


@pytest.mark.parametrize(
    "what",
    ["tensor count", "metadata count", "key length", "string length", "array count", "string array count",
     "nested array count", "tensor dims"],
)  # fmt: skip
def test_gguf_count_past_the_file_is_refused_before_any_allocation(tmp_path, what):
    path = tmp_path / "huge.gguf"
    path.write_bytes(huge_count_gguf(what) + b"\0" * 64)
    refused(WeightError, lambda: GGUFFile(path), "huge.gguf")
    assert peak_allocation(lambda: GGUFFile(path)) < SMALL_ALLOCATION


# -- a header declaring an absurd shape ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [[2**20, 2**20], [2**62, 2**62], [2**64], [10**30], [1] * 9, [-1, 4], [4.0], ["4"], [True], None, 4],
)
def test_safetensors_header_declaring_an_absurd_shape_is_refused(folder, shape):
    file = folder / "model.safetensors"
    header, data = split_safetensors(file.read_bytes())
    header["model.norm.weight"]["shape"] = shape
    file.write_bytes(safetensors_bytes(header, data))
    text = refused(WeightError, lambda: SafetensorsStore(folder), "model.norm.weight")
    assert "shape" in text or "data_offsets" in text
    assert peak_allocation(lambda: SafetensorsStore(folder)) < SMALL_ALLOCATION


def test_safetensors_zero_size_tensor_of_absurd_shape_is_refused_at_open(folder):
    file = folder / "model.safetensors"
    header, data = split_safetensors(file.read_bytes())
    header["extra"] = {"dtype": "F32", "shape": [0, 10**30], "data_offsets": [0, 0]}
    file.write_bytes(safetensors_bytes(header, data))
    with pytest.raises(LogosError):
        with SafetensorsStore(folder) as store:
            store.get("extra")


@pytest.mark.parametrize("dims", [(2**40, 2**40), (2**32, 2**32, 2**32, 2**32), (2**64 - 1,)])
def test_gguf_tensor_of_absurd_shape_is_refused(tmp_path, dims):
    meta = [("general.architecture", testing.STRING, "llama")]
    path = tmp_path / "absurd.gguf"
    path.write_bytes(testing.gguf_bytes(meta, [("x", dims, 0, b"\0" * 64)]))
    refused(WeightError, lambda: GGUFFile(path), "'x'", "absurd.gguf")
    assert peak_allocation(lambda: GGUFFile(path)) < SMALL_ALLOCATION


def test_gguf_zero_size_tensor_of_absurd_shape_is_refused(tmp_path):
    meta = [("general.architecture", testing.STRING, "llama")]
    path = tmp_path / "absurd.gguf"
    path.write_bytes(testing.gguf_bytes(meta, [("x", (2**63, 0), 0, b"")]))
    with pytest.raises(LogosError):
        GGUFFile(path).read("x")


# -- dtype and shape disagreeing with the spec are refused by name -------------------------------------------------


@pytest.mark.parametrize("dtype", ["I32", "U8", "BOOL", "F8_E4M3", "I64"])
def test_safetensors_dtype_disagreeing_with_the_spec_is_refused_by_name(folder, dtype):
    file = folder / "model.safetensors"
    header, data = split_safetensors(file.read_bytes())
    entry = header["model.layers.0.self_attn.q_proj.weight"]
    begin, end = entry["data_offsets"]
    size = {"I32": 4, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "I64": 8}[dtype]
    entry["dtype"], entry["shape"] = dtype, [(end - begin) // size // 4, 4]
    file.write_bytes(safetensors_bytes(header, data))
    refused(WeightError, lambda: SafetensorsStore(folder), "model.layers.0.self_attn.q_proj.weight")


def test_safetensors_dtype_of_the_right_size_but_not_float_is_refused_by_name(folder):
    file = folder / "model.safetensors"
    header, data = split_safetensors(file.read_bytes())
    header["model.layers.0.self_attn.q_proj.weight"]["dtype"] = "I32"  # 4 bytes, as F32
    file.write_bytes(safetensors_bytes(header, data))
    refused(WeightError, lambda: SafetensorsStore(folder), "model.layers.0.self_attn.q_proj.weight", "I32")


def test_safetensors_shape_disagreeing_with_the_spec_is_refused_by_name(folder):
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 8
    (folder / "config.json").write_text(json.dumps(config))
    refused(WeightError, lambda: SafetensorsStore(folder), "mlp", "[8, 4]", "[4, 4]")


def test_gguf_shape_disagreeing_with_the_spec_is_refused_by_name(tmp_path):
    data = testing.model_gguf(4, "F32")
    marker = struct.pack("<Q", len(b"llama.feed_forward_length")) + b"llama.feed_forward_length"
    at = data.index(marker) + len(marker)
    patched = data[: at + 4] + struct.pack("<I", 8) + data[at + 8 :]
    path = tmp_path / "shape.gguf"
    path.write_bytes(patched)
    refused(WeightError, lambda: GGUFStore(path), "mlp", "[8, 4]", "shape.gguf")


# -- configs --------------------------------------------------------------------------------------------------------

REQUIRED = ["model_type", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
            "vocab_size", "rms_norm_eps"]  # fmt: skip


@pytest.mark.parametrize("field", REQUIRED)
def test_config_missing_a_required_field_names_the_field(tmp_path, field):
    config = hf_config(ModelSpec.preset("tiny"))
    del config[field]
    (tmp_path / "config.json").write_text(json.dumps(config))
    refused(SpecError, lambda: ModelSpec.from_hf_config(tmp_path), f"'{field}'", "config.json", "missing")
    refused(SpecError, lambda: ModelSpec.from_hf_config(config), f"'{field}'", "missing")


@pytest.mark.parametrize("field", ["factor", "low_freq_factor", "high_freq_factor",
                                   "original_max_position_embeddings"])  # fmt: skip
def test_config_missing_a_rope_scaling_field_names_the_field(field):
    config = hf_config(ModelSpec.preset("llama-3.1-8b"))
    del config["rope_scaling"][field]
    refused(SpecError, lambda: ModelSpec.from_hf_config(config), f"'{field}'", "rope scaling")


@pytest.mark.parametrize(
    "text, words",
    [
        (b"", ["invalid JSON"]),
        (b"\xff\xfe{}", ["cannot read"]),
        (b"[1, 2]", ["JSON object"]),
        (b"[" * 100000, ["nested too deeply"]),
        (b'{"model_type": "llama", "hidden_size": ' + b"1" * 5000 + b"}", ["too many digits"]),
        (b'{"model_type": "gpt2"}', ["gpt2", "not supported"]),
        (b'{"model_type": "llama", "hidden_size": "64"}', ["hidden_size", "wrong type"]),
        (b'{"model_type": "llama", "hidden_size": true}', ["hidden_size", "must be a number"]),
    ],
    ids=["empty", "not-utf8", "array", "deep", "huge-integer", "gpt2", "string-size", "bool-size"],
)
def test_bad_config_json_gets_one_clear_error(tmp_path, text, words):
    (tmp_path / "config.json").write_bytes(text)
    refused(SpecError, lambda: ModelSpec.from_hf_config(tmp_path), "config.json", *words)


def test_missing_config_and_missing_model_are_named(tmp_path):
    refused(SpecError, lambda: ModelSpec.from_hf_config(tmp_path), "config.json", "no such file")
    refused(WeightError, lambda: open_model(tmp_path / "nope"), "nope")
    refused(WeightError, lambda: open_model(tmp_path / "nope.gguf"), "nope.gguf", "no such file")


# -- tokenizer ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, words",
    [
        ({"tokenizer.ggml.model": "bert"}, ["'bert'", "not supported"]),
        ({"tokenizer.ggml.model": "llama"}, ["tokenizer.ggml.scores"]),
        ({"tokenizer.ggml.pre": "falcon"}, ["falcon"]),
        ({"tokenizer.ggml.tokens": []}, ["empty"]),
        ({"tokenizer.ggml.tokens": ["a", "a"]}, ["'a'", "twice"]),
        ({"tokenizer.ggml.tokens": [1, 2]}, ["tokenizer.ggml.tokens"]),
        ({"tokenizer.ggml.merges": ["h"]}, ["merge 0"]),
        ({"tokenizer.ggml.merges": ["x y"]}, ["merge 0", "not in the vocabulary"]),
        ({"tokenizer.ggml.bos_token_id": 10**6}, ["bos_token_id"]),
        ({"tokenizer.ggml.token_type": [1]}, ["token_type"]),
    ],
)
def test_bad_tokenizer_metadata_gets_a_tokenizer_error(change, words):
    meta = {key: value[1] if kind == testing.ARRAY else value for key, kind, value in testing.tokenizer_metadata()}
    meta.update(change)
    refused(TokenizerError, lambda: Tokenizer.from_gguf_metadata(meta, "t.gguf"), "t.gguf", *words)


def test_gguf_without_a_tokenizer_is_named(tmp_path):
    path = tmp_path / "none.gguf"
    path.write_bytes(testing.model_gguf(4, "F32"))
    refused(TokenizerError, lambda: Tokenizer.from_gguf(path), "none.gguf", "no tokenizer")


# -- errors ---------------------------------------------------------------------------------------------------------


def test_error_with_a_location_prints_file_line_column_and_a_caret():
    error = errors.ParseError("unknown cut 'x'", SourceLocation("p.logos", 1, 13, "## Program: x"), hint="try")
    assert str(error) == "p.logos:1:13: error: unknown cut 'x'\n## Program: x\n            ^\nhint: try"
    assert str(errors.SpecError("bad")) == "error: bad"
    assert str(errors.NotYet("later")) == "not yet: later"


def test_every_error_class_derives_from_logos_error_and_is_in_docs():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, LogosError)]
    assert len(classes) >= 8
    text = (REPO / "docs" / "errors.md").read_text()
    for kind in classes:
        assert f"`{kind.__name__}`" in text, f"docs/errors.md does not list {kind.__name__}"


def test_logos_parse_error_has_file_line_and_column():
    text = "## Program: decode step, ctx 64\n    The vocabulary has many tokens.\n"
    from logos_ir.parser import parse_program

    message = refused(errors.ParseError, lambda: parse_program(text, "bad.logos"), "bad.logos:2:24: error:")
    assert message.splitlines()[1] == "    The vocabulary has many tokens."


# -- the fuzzing's regression corpus -------------------------------------------------------------------------------


# The regression corpus beside this folder, so it is found wherever logos-ir is installed.
CORPUS_FOLDER = Path(__file__).resolve().parents[1] / "fuzz" / "corpus"
CORPUS = [(reader, path) for reader in fuzz.READERS for path in fuzz.corpus_files(CORPUS_FOLDER, reader)]


@pytest.mark.parametrize("reader, path", CORPUS, ids=[f"{r}/{p.name}" for r, p in CORPUS])
def test_regression_corpus(reader, path):
    """Each input that once broke a reader loads or is refused with the project's error. An input whose bug is
    known and lies outside the readers' own code (`fuzz.KNOWN`) is an expected failure, with the report."""
    data = path.read_bytes()
    if path.name.startswith("hang-"):
        return hang_in_subprocess(reader, path)
    try:
        fuzz.check(reader, data)
    except BaseException as error:
        report = fuzz.known_issue(reader, error)
        if report is None:
            raise
        pytest.xfail(report)


def hang_in_subprocess(reader: str, path: Path) -> None:
    """A known hang runs in a child with a time limit: past it, an expected failure with the report."""
    code = (
        "import sys\nfrom logos_ir.tools import fuzz\n"
        "try:\n    print(fuzz.check(sys.argv[1], open(sys.argv[2], 'rb').read()))\n"
        "except BaseException as error:\n"
        "    if not fuzz.known_issue(sys.argv[1], error):\n        raise\n    print('known')\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code, reader, str(path)], capture_output=True, timeout=4)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path.name} hangs the {reader} reader")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    if done.stdout.strip() == b"known":
        pytest.xfail("a known failure")


def test_known_hang_has_its_workaround():
    path = CORPUS_FOLDER / "mlir" / "hang-unterminated-string.mlir"
    code = (
        "import sys; from logos_ir.tools import fuzz; fuzz.apply_workarounds('mlir'); "
        "print(fuzz.check('mlir', open(sys.argv[1], 'rb').read()))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=60, text=True)
    assert done.stdout.strip() == "refused", done.stderr[-2000:]


@pytest.mark.parametrize("reader", fuzz.READERS)
def test_fuzz_seeds_are_real_inputs_that_load(reader, monkeypatch):
    """The fuzzer starts from real inputs: each seed loads (the embedded model's header region, a truncated
    file, is left out here: building it takes seconds)."""
    monkeypatch.setattr(fuzz, "embedded_header", lambda *args, **kwargs: None)
    seeds = fuzz.seeds(reader)
    assert seeds
    for name, data in seeds.items():
        refused_on_purpose = (reader == "safetensors" and name.startswith("1-index-")) or (
            reader == "manifest" and name.startswith("path-")
        )  # paths leaving the folder
        assert fuzz.check(reader, data) == ("refused" if refused_on_purpose else "loaded"), name
