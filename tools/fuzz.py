"""Coverage-guided fuzzing of every reader of untrusted input, run for a bounded time (not in every test run).

    python -m logos_ir.tools.fuzz --reader READER --seconds 600 [--corpus DIR] [--replay [FILE ...]]

The readers and what one input is:

  logos        LOGOS text, read by `logos_ir.parser.parse_program`
  mlir         MLIR text, read as `logos-opt` reads it (xDSL's parser, the logos dialect, verification,
               printing)
  config       a `config.json`, read by `ModelSpec.from_hf_config`
  safetensors  a model folder's safetensors file, index or config (the first byte picks which; the other files
               are fixed valid ones, beside decoy files outside the folder and links to them)
  gguf         a `.gguf` file, read by `GGUFFile` (every tensor read back) and `GGUFStore`
  tokenizer    a `.gguf` file, read by `Tokenizer.from_gguf`, then used to encode and decode a sentence
  manifest     a build folder's `manifest.json`, read by `read_manifest` and checked by `check_build` (as
               `logos-compile --check` and `logos-run BUILD_DIR` do), in a real build folder with links out of it
  d5005-stream the D5005 engine's instruction stream (`instructions.bin`), read by `read_stream`, then given
               back as ops by `decode_ops`; the first byte 1 has the target restamp the CRC-32s first, so that
               edits reach the checks behind them
  d5005-image  the D5005 engine's weight image (`weights.bin`), read by `read_image`

The contract (`check`): every input either loads or raises the project's error, `LogosError` (for MLIR also
xDSL's `ParseError`, `VerifyException` and `DiagnosticException`, which `logos-opt` reports as user errors).
Anything else is a failure: another exception, a file opened outside the model's folder, an input that loads
but does not print back as it was read, a hang (libFuzzer's `-timeout`) or a memory blow-up (`-rss_limit_mb`).

Seeds are real inputs: authored LOGOS programs and their MLIR, config.json files of the presets, tiny model
folders and GGUF files (written by `logos_ir.testing`, which the unit tests use too), and the embedded SmolLM2
GGUF's header region (its tokenizer arrays cut short so that one input stays small). The regression corpus
(`--corpus`, by default `test/fuzz/corpus/<reader>/` from the repository's root: inputs that once failed) is
added to the corpus; the unit tests replay it through `check`. Atheris (`pip install atheris`) is needed only to
fuzz; `check` and `seeds` import nothing beyond logos-ir's own dependencies. See docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import importlib
import io
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READERS = ("logos", "mlir", "config", "safetensors", "gguf", "tokenizer", "manifest", "d5005-stream", "d5005-image")
# The regression corpus, one folder a reader: the repository's, when the driver runs from its root.
CORPUS = Path("test") / "fuzz" / "corpus"

# The largest input libFuzzer makes, per reader: a little above the largest seed.
MAX_LEN = {
    "logos": 16384,
    "mlir": 32768,
    "config": 4096,
    "safetensors": 8192,
    "gguf": 49152,
    "tokenizer": 49152,
    "manifest": 8192,
    "d5005-stream": 16384,
    "d5005-image": 16384,
}

# What atheris instruments for coverage: all of logos-ir, and for the MLIR reader xDSL's parser and lexer
# (instrumenting the whole of xDSL makes each input several times slower).
XDSL_PARSER = ["xdsl.parser.core", "xdsl.parser.base_parser", "xdsl.parser.generic_parser",
               "xdsl.parser.attribute_parser", "xdsl.utils.mlir_lexer", "xdsl.utils.lexer"]  # fmt: skip

SAMPLE_TEXT = "Hello, world! 123 <|im_start|>user\nWhat is 2+2?<|im_end|> \u00e9t\u00e9 \U0001f600"


class ReaderFailure(AssertionError):
    """An input that loaded but broke a reader's promise (read outside the model folder, printed back
    differently)."""


# -- known failures outside the readers' own code -----------------------------------------------------------

# (reader, exception type name or "*", where it was raised, report): a failure matching one is counted and
# reported by the driver but does not stop the run, and the regression tests mark its corpus input as an
# expected failure. Where: "file.py:function" of logos-ir's innermost frame, or "xdsl" for one raised inside
# xDSL's own code, called straight from the driver or logos-opt, never through logos-ir's dialect. Remove an
# entry once its bug is fixed.
KNOWN: list[tuple[str, str, str, str]] = []  # none: each failure found is guarded against (docs/fuzzing.md)


def apply_workarounds(reader: str) -> None:
    """Install the guards `logos-opt` runs with against xDSL's hang and memory blow-up (logos_ir.xdsl_guards)."""
    if reader == "mlir":
        from logos_ir import xdsl_guards

        xdsl_guards.apply()


def _code_folders() -> tuple[str, ...]:
    """The folders of logos-ir's code, each ending in a separator: the package and its dialects, passes and tools
    (top-level folders of the repository in an editable install, inside the package in an installed one)."""
    import importlib.util

    folders: set[str] = set()
    for name in ("logos_ir", "logos_ir.dialects", "logos_ir.passes", "logos_ir.tools"):
        spec = importlib.util.find_spec(name)
        locations = spec.submodule_search_locations if spec is not None else None
        folders.update(os.path.realpath(folder) + os.sep for folder in locations or ())
    return tuple(sorted(folders))


_CODE = _code_folders()


def _where(error: BaseException) -> tuple[str, bool]:
    """The innermost of logos-ir's frames of `error` as "file.py:function", and whether every frame after it is
    xDSL's (called from the driver or logos-opt)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "", False
    ours = [i for i, f in enumerate(frames) if os.path.realpath(f.filename).startswith(_CODE)]
    xdsl = str(Path(_xdsl_folder())) + os.sep
    inner = frames[ours[-1] + 1 :] if ours else frames
    entry_ok = not ours or Path(frames[ours[-1]].filename).name in ("fuzz.py", "logos_opt.py")
    only_xdsl = bool(inner) and entry_ok and all(f.filename.startswith(xdsl) for f in inner)
    inner_ours = frames[ours[-1]] if ours else frames[-1]
    return f"{Path(inner_ours.filename).name}:{inner_ours.name}", only_xdsl


def _xdsl_folder() -> str:
    import xdsl

    return os.path.dirname(os.path.realpath(xdsl.__file__))


def failure_signature(error: BaseException) -> str:
    """A short name of a failure: its type and where it was raised."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(error).__name__} at {where}"


def known_issue(reader: str, error: BaseException) -> str | None:
    """The report of a known failure `error` matches, or None."""
    if isinstance(error, ReaderFailure):
        return None
    where, only_xdsl = _where(error)
    for name, kind, place, report in KNOWN:
        if name != reader or kind not in ("*", type(error).__name__):
            continue
        if (place == "xdsl" and only_xdsl) or place == where:
            return report
    return None


# -- the contract --------------------------------------------------------------------------------------------


def allowed_errors(reader: str) -> tuple[type[BaseException], ...]:
    """The exception types by which `reader` may refuse an input."""
    from logos_ir.errors import LogosError

    if reader != "mlir":
        return (LogosError,)
    from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException

    return (LogosError, ParseError, VerifyException, DiagnosticException)


def check(reader: str, data: bytes) -> str:
    """Run one input through `reader`: 'loaded' or 'refused'; any other outcome raises (a failure)."""
    target = _TARGETS[reader]
    try:
        target(data)
    except allowed_errors(reader):
        return "refused"
    return "loaded"


# -- a sandbox of files the readers read ---------------------------------------------------------------------


class _Sandbox:
    """A temporary folder holding one folder per reader input (the only folder the reader may read), with
    decoy files outside it: a valid shard and config that a path escaping the folder would reach."""

    def __init__(self, root: Path | None = None) -> None:
        from logos_ir import testing

        if root is None:  # for the tests: removed at exit
            self.root = Path(tempfile.mkdtemp(prefix="logos-fuzz-")).resolve()
            atexit.register(shutil.rmtree, self.root, True)
        else:  # for the driver, in its work folder (libFuzzer ends the process without running atexit)
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            self.root = root.resolve()
        outside = self.root / "outside"
        testing.write_model_folder(outside, shards=1)
        (outside / "evil.safetensors").write_bytes((outside / "model.safetensors").read_bytes())
        self.config = self._folder("config")
        self.gguf = self._folder("gguf")
        self.build = testing.write_logos_build(self.root / "build", outside)
        self.modes: list[Path] = []
        for mode in range(4):
            folder = self.root / f"model{mode}"
            testing.write_model_folder(folder, shards=2 if mode in (1, 2) else 1)
            os.symlink(outside / "evil.safetensors", folder / "link.safetensors")
            os.symlink(outside, folder / "linkdir")
            self.modes.append(folder)

    def _folder(self, name: str) -> Path:
        folder = self.root / name
        folder.mkdir()
        return folder


_SANDBOX: _Sandbox | None = None


def sandbox(root: Path | None = None) -> _Sandbox:
    """The sandbox of this process, made on first use (in `root`, if given)."""
    global _SANDBOX
    if _SANDBOX is None:
        _SANDBOX = _Sandbox(root)
    return _SANDBOX


# Files opened while a reader runs, outside the folder it may read, are recorded here (Python's audit hook
# sees every `open`, whatever opened it; memory maps open their file first).
_WATCH: list[str] = []
_ESCAPES: list[str] = []
_TRUSTED = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}) + _CODE


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _WATCH or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    _WATCH_saved = _WATCH[:]
    _WATCH.clear()  # realpath must not re-enter this hook
    try:
        real = os.path.realpath(os.fsdecode(args[0]))
        allowed = _WATCH_saved[0]
        if not (real + os.sep).startswith(allowed + os.sep) and not real.startswith(_TRUSTED):
            _ESCAPES.append(real)
    finally:
        _WATCH[:] = _WATCH_saved


sys.addaudithook(_audit)


def watched(folder: Path, body: Callable[[], None]) -> None:
    """Run `body`, failing if it opens a file outside `folder`."""
    _ESCAPES.clear()
    _WATCH[:] = [str(folder)]
    try:
        body()
    finally:
        _WATCH.clear()
        escapes = _ESCAPES[:]
        _ESCAPES.clear()
        if escapes:
            raise ReaderFailure(f"read outside the model folder {folder}: {', '.join(sorted(set(escapes)))}")


# -- the targets ---------------------------------------------------------------------------------------------


def _logos(data: bytes) -> None:
    from logos_ir.parser import parse_program
    from logos_ir.printer import print_program

    program = parse_program(data, "fuzz.logos")
    # The digest is the SHA-256 of the program's text (the input less its `//` comment lines): the print is that text.
    if hashlib.sha256(print_program(program).encode("utf-8")).hexdigest() != program.digest.data:
        raise ReaderFailure("the program parsed, but prints back differently: LOGOS has one spelling")


_OPT: Any = None


def _opt() -> Any:
    global _OPT
    if _OPT is None:
        from logos_ir.tools.logos_opt import LogosOptMain

        _OPT = LogosOptMain(args=[])
    return _OPT


def _mlir(data: bytes) -> None:
    """As `logos-opt` reads MLIR: parse, verify (the empty pipeline's check), print as MLIR and as LOGOS."""
    from logos_ir.identity import programs
    from logos_ir.passes.emit_logos import LogosTarget

    tool = _opt()
    module = tool.parse_chunk(io.BytesIO(data), "mlir")
    tool.apply_passes(module)
    printed = tool.output_resulting_program(module)
    if programs(module):
        LogosTarget().emit(tool.ctx, module, io.StringIO())
    # What logos-opt prints, it reads back: the same module, printed the same way.
    again = tool.parse_chunk(io.BytesIO(printed.encode("utf-8")), "mlir")
    again.verify()
    if tool.output_resulting_program(again) != printed:
        raise ReaderFailure("the module parsed and verified, but its print does not read back as itself")


def _config(data: bytes) -> None:
    from logos_ir.spec import ModelSpec
    from logos_ir.weights import hf_config

    folder = sandbox().config
    (folder / "config.json").write_bytes(data)
    spec = None

    def read() -> None:
        nonlocal spec
        spec = ModelSpec.from_hf_config(folder)

    watched(folder, read)
    assert spec is not None
    if ModelSpec.from_hf_config(json.loads(data.decode("utf-8"))) != spec:
        raise ReaderFailure("the file and its parsed mapping give different specs")
    if ModelSpec.from_hf_config(hf_config(spec)) != spec:
        raise ReaderFailure("the spec written back as a config.json reads as another spec")


# The safetensors target's modes: which file of the folder the input is (the first byte, modulo 4).
_ST_MODES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "config.json",
)


def _safetensors(data: bytes) -> None:
    from logos_ir.weights import SafetensorsStore

    if not data:
        return
    folder = sandbox().modes[data[0] % 4]
    (folder / _ST_MODES[data[0] % 4]).write_bytes(data[1:])

    def read() -> None:
        with SafetensorsStore(folder) as store:
            for name in store.names():
                store.get(name)

    watched(folder, read)


def _gguf(data: bytes) -> None:
    from logos_ir.errors import WeightError
    from logos_ir.weights import GGUFFile, GGUFStore

    folder = sandbox().gguf
    path = folder / "model.gguf"
    path.write_bytes(data)

    def read() -> None:
        file = GGUFFile(path)
        try:
            for name in file.tensors:
                try:
                    file.read(name)
                except WeightError:
                    pass  # a tensor logos-ir cannot read, refused by name; the others are still read
        finally:
            file.close()
        with GGUFStore(path) as store:
            for name in store.names():
                store.get(name)

    watched(folder, read)


def _tokenizer(data: bytes) -> None:
    from logos_ir.tokenizer import Tokenizer

    folder = sandbox().gguf
    path = folder / "tokenizer.gguf"
    path.write_bytes(data)

    def read() -> None:
        tokenizer = Tokenizer.from_gguf(path)
        ids = tokenizer.encode(SAMPLE_TEXT)
        tokenizer.decode(ids)
        for i in range(min(tokenizer.vocab_size, 3)):
            tokenizer.token(i)

    watched(folder, read)


def _manifest(data: bytes) -> None:
    """A build folder's manifest, as `logos-compile --check` and `logos-run BUILD_DIR` read it: the reader must
    refuse it or check the folder without opening anything outside it (the folder holds links out of it)."""
    from logos_ir.build import check_build, read_manifest
    from logos_ir.program import Cut

    folder = sandbox().build
    (folder / "manifest.json").write_bytes(data)

    def read() -> None:
        manifest = read_manifest(folder)
        check_build(folder)
        target = manifest.get("target")
        if isinstance(target, dict) and isinstance(target.get("cut"), str):
            Cut.parse(target["cut"])

    watched(folder, read)


def _d5005_stream(data: bytes) -> None:
    """The D5005 instruction stream: refused by `read_stream`, or read and given back as ops. With a first byte of
    1, the CRC-32s of the words and symbols are restamped before reading (the sizes are the input's)."""
    from logos_ir.runtime.d5005 import decode_ops, read_stream

    if data[:1] == b"\1":
        data = restamp_stream(data[1:])
    elif data[:1] == b"\0":
        data = data[1:]
    decode_ops(read_stream(data))


def restamp_stream(data: bytes) -> bytes:
    """`data` with the CRC-32s of its instruction words and symbols recomputed from its header's sizes."""
    import zlib

    if len(data) < 4096:
        return data
    edited = bytearray(data)
    count, word_bytes = struct.unpack_from("<II", data, 16)
    symbol_bytes = struct.unpack_from("<I", data, 60)[0]
    words_end = 4096 + count * word_bytes
    struct.pack_into("<I", edited, 56, zlib.crc32(data[4096:words_end]))
    struct.pack_into("<I", edited, 64, zlib.crc32(data[words_end : words_end + symbol_bytes]))
    return bytes(edited)


def _d5005_image(data: bytes) -> None:
    """The D5005 weight image: refused by `read_image`, or read with every bank's part in the input."""
    from logos_ir.runtime.d5005 import read_image

    image = read_image(data)
    if sum(len(part) for part in image.banks) + 4096 != len(data):
        raise ReaderFailure("the image's banks do not cover the input")


_TARGETS: dict[str, Callable[[bytes], None]] = {
    "logos": _logos,
    "mlir": _mlir,
    "config": _config,
    "safetensors": _safetensors,
    "gguf": _gguf,
    "tokenizer": _tokenizer,
    "manifest": _manifest,
    "d5005-stream": _d5005_stream,
    "d5005-image": _d5005_image,
}


# -- seeds ---------------------------------------------------------------------------------------------------


def embedded_header(keep_tokens: int = 400, tensors: bool = True) -> bytes | None:
    """The embedded SmolLM2 GGUF's header region, as a file: its metadata with the tokenizer's arrays cut to
    the first `keep_tokens` tokens (and the merges among them), and, with `tensors`, its tensor table (the
    data left out). None when the embedded model is not installed."""
    try:
        from gguf import GGUFReader, GGUFValueType

        from logos_ir import testing
        from logos_ir.errors import LogosError
        from logos_ir.weights import embedded_model_path

        path = embedded_model_path()
    except (ImportError, LogosError):
        return None
    reader = GGUFReader(str(path))
    meta: list[tuple[str, int, Any]] = []
    kept: set[str] = set()
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        kind = int(field.types[0])
        value = field.contents()
        if kind == GGUFValueType.ARRAY:
            item = int(field.types[-1])
            if key == "tokenizer.ggml.tokens":
                value = value[:keep_tokens]
                kept = set(value)
            elif key == "tokenizer.ggml.merges":
                value = [
                    m
                    for m in value
                    if len(m.split(" ")) == 2 and "".join(m.split(" ")) in kept and all(p in kept for p in m.split(" "))
                ]
            elif key == "tokenizer.ggml.token_type":
                value = value[:keep_tokens]
            value = (item, value)
        meta.append((key, kind, value))
    infos = []
    if tensors:
        for tensor in reader.tensors:
            infos.append(
                (
                    tensor.name,
                    tuple(int(d) for d in reversed(tensor.shape)),
                    int(tensor.tensor_type),
                    b"\0" * int(tensor.n_bytes),
                )
            )
    return testing.gguf_bytes(meta, infos, header_only=True) if tensors else testing.gguf_bytes(meta, [])


_LOGOS_SEEDS = [
    ("tiny", "decode ctx=64", None),
    ("tiny", "prefill rows=4 ctx=64", None),
    ("tiny", "batch rows=2 ctx=16", None),
    ("tiny", "forward", None),
    ("tiny", "decode_layer layer=1 ctx=64", None),
    ("tiny", "decode_embed", None),
    ("tiny", "decode_head", None),
    ("tiny", "prefill_layer layer=0 rows=2 ctx=8", None),
    ("tiny", "batch_head rows=3", None),
    ("tiny", "decode ctx=64", 2),
    ("tiny-tp8", "batch_layer layer=1 rows=2 ctx=8", 4),
    ("llama-3.2-1b", "decode_layer layer=0 ctx=128", None),
    ("smollm2-135m", "forward_head", None),
]


def _authored() -> list[tuple[str, str]]:
    from logos_ir.author import write
    from logos_ir.program import Cut
    from logos_ir.spec import ModelSpec

    out = []
    for preset, cut, tp in _LOGOS_SEEDS:
        spec = ModelSpec.preset(preset)
        authored = write(spec, Cut.parse(cut), "", tp=tp)
        name = f"{preset}-{cut.replace(' ', '-').replace('=', '')}" + (f"-tp{tp}" if tp else "")
        out.append((name, authored.text))
    return out


def seeds(reader: str) -> dict[str, bytes]:
    """Real inputs of `reader`, by a file name."""
    from logos_ir import testing
    from logos_ir.spec import ModelSpec
    from logos_ir.weights import hf_config

    if reader == "logos":
        return {f"{name}.logos": text.encode() for name, text in _authored()}
    if reader == "mlir":
        # Small programs (the MLIR reader is slow), one whole one, and one in the generic form.
        authored = dict(_authored())
        small = [
            "tiny-decode-ctx64", "tiny-decode_layer-layer1-ctx64", "tiny-decode_embed", "tiny-decode_head",
            "tiny-prefill_layer-layer0-rows2-ctx8", "tiny-tp8-batch_layer-layer1-rows2-ctx8-tp4",
            "llama-3.2-1b-decode_layer-layer0-ctx128",
        ]  # fmt: skip
        out = {f"{name}.mlir": testing.mlir_text(authored[name]).encode() for name in small}
        generic = testing.mlir_text(authored["tiny-decode_embed"], generic=True)
        out["tiny-decode_embed-generic.mlir"] = generic.encode()
        return out
    if reader == "config":
        out = {}
        for preset in ModelSpec.presets():
            out[f"{preset}.json"] = json.dumps(hf_config(ModelSpec.preset(preset)), indent=2).encode()
        newer = hf_config(ModelSpec.preset("llama-3.1-8b"))
        scaling = newer.pop("rope_scaling")
        newer["rope_parameters"] = {"rope_theta": newer.pop("rope_theta"), **scaling}
        out["llama-3.1-8b-rope-parameters.json"] = json.dumps(newer).encode()
        out["small.json"] = json.dumps(hf_config(testing.small_spec()), separators=(",", ":")).encode()
        return out
    if reader == "safetensors":
        return _safetensors_seeds()
    if reader == "gguf":
        out = {
            "small-f32.gguf": testing.model_gguf(4, "F32"),
            "small-f16-tokenizer.gguf": testing.model_gguf(4, "F16", tokenizer=True),
            "small32-q8_0-rope.gguf": testing.model_gguf(32, "Q8_0", rope_scaling=True),
            "small32-q4_0.gguf": testing.model_gguf(32, "Q4_0"),
            "small32-q4_1.gguf": testing.model_gguf(32, "Q4_1"),
            "small32-q5_0.gguf": testing.model_gguf(32, "Q5_0"),
            "small32-q5_1.gguf": testing.model_gguf(32, "Q5_1"),
            "small32-mxfp4.gguf": testing.model_gguf(32, "MXFP4"),
        }
        header = embedded_header(keep_tokens=200)
        if header is not None:
            out["embedded-header.gguf"] = header
        return out
    if reader == "tokenizer":
        out = {
            "byte-level-smollm.gguf": testing.gguf_bytes(testing.tokenizer_metadata(pre="smollm")),
            "byte-level-llama3.gguf": testing.gguf_bytes(testing.tokenizer_metadata(pre="llama-bpe")),
            "byte-level-gpt2.gguf": testing.gguf_bytes(testing.tokenizer_metadata(pre="gpt2")),
            "small-model-with-tokenizer.gguf": testing.model_gguf(4, "F32", tokenizer=True),
        }
        header = embedded_header(keep_tokens=600, tensors=False)
        if header is not None:
            out["embedded-tokenizer.gguf"] = header
        return out
    if reader == "manifest":
        return _manifest_seeds()
    if reader in ("d5005-stream", "d5005-image"):
        return _d5005_seeds(reader)
    raise ValueError(f"unknown reader '{reader}'")


def _safetensors_seeds() -> dict[str, bytes]:
    from logos_ir import testing

    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        for dtype in ("float32", "float16", "bfloat16"):
            folder = testing.write_model_folder(root / dtype, dtype=dtype)
            out[f"0-single-{dtype}"] = b"\0" + (folder / "model.safetensors").read_bytes()
        sharded = testing.write_model_folder(root / "sharded", shards=2)
        index = (sharded / "model.safetensors.index.json").read_bytes()
        out["1-index"] = b"\1" + index
        for name, target in (
            ("dotdot", "../outside/evil.safetensors"),
            ("absolute", "/etc/passwd"),
            ("link", "link.safetensors"),
            ("linkdir", "linkdir/evil.safetensors"),
        ):
            text = json.loads(index)
            first = sorted(text["weight_map"])[0]
            text["weight_map"][first] = target
            out[f"1-index-{name}"] = b"\1" + json.dumps(text).encode()
        out["2-shard"] = b"\2" + (sharded / "model-00001-of-00002.safetensors").read_bytes()
        out["3-config"] = b"\3" + (sharded / "config.json").read_bytes()
    return out


def _manifest_seeds() -> dict[str, bytes]:
    from logos_ir import testing

    with tempfile.TemporaryDirectory() as temporary:
        real = (testing.write_logos_build(Path(temporary) / "build") / "manifest.json").read_bytes()
    out = {"real.json": real}
    for name, path in (
        ("absolute", "/etc/hostname"),
        ("dotdot", "../outside/config.json"),
        ("link", "link.logos"),
        ("linkdir", "linkdir/config.json"),
    ):
        manifest = json.loads(real)
        manifest["artifacts"][0]["path"] = path
        out[f"path-{name}.json"] = json.dumps(manifest).encode()
    manifest = json.loads(real)
    del manifest["target"]
    out["no-target.json"] = json.dumps(manifest).encode()
    return out


def _d5005_seeds(reader: str) -> dict[str, bytes]:
    """Streams (as is, and with the restamping first byte) and weight images of small decode steps."""
    from dataclasses import replace

    from logos_ir.author import written
    from logos_ir.parser import parse_program
    from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
    from logos_ir.passes.d5005.emit_stream import encode_stream
    from logos_ir.program import Cut
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import lower_program
    from logos_ir.weights import RandomWeights

    tiny = ModelSpec.preset("tiny")
    shapes = {
        "gqa": replace(tiny, vocab=16, hidden=16, layers=1, heads=2, kv_heads=1, head_dim=8, intermediate=16),
        "mha-tied": replace(tiny, vocab=8, hidden=8, layers=1, heads=2, kv_heads=2, head_dim=4, intermediate=8,
                            tie_embeddings=True),
    }  # fmt: skip
    out: dict[str, bytes] = {}
    for name, spec in shapes.items():
        for weights in ("bf16", "f32"):
            program = lower_program(parse_program(written(spec, Cut.decode(8))[0].text), weights)
            if reader == "d5005-stream":
                stream = encode_stream(program, image_bytes(program))
                out[f"{name}-{weights}.bin"] = b"\0" + stream
                out[f"{name}-{weights}-restamped.bin"] = b"\1" + stream
            else:
                out[f"{name}-{weights}.bin"] = weight_image(program, spec, RandomWeights(spec, seed=1))
    return out


def write_seeds(reader: str, folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    found = seeds(reader)
    for name, data in found.items():
        (folder / f"seed-{name}").write_bytes(data)
    return len(found)


# -- the regression corpus -----------------------------------------------------------------------------------


def corpus_files(corpus: Path, reader: str) -> list[Path]:
    """The inputs of `<corpus>/<reader>/`, sorted."""
    folder = corpus / reader
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else []


# -- libFuzzer dictionaries ----------------------------------------------------------------------------------

# fmt: off
_DICTIONARY = {
    "logos": [
        "## Program: ", "## Main", "## Embedding of ", "## Layer ", "## Head of ", " of ", " at ", "    Let ",
        " be ", "the weight \"", "\" of ", " by ", "    Return ", "    Write ", " into ", "the input token ",
        "the input positions ", "the input hidden state of ", "the key cache of layer ", ", with ",
        " heads by ", " positions by ", " numbers", ", split by rows over the chips", "columns", "heads",
        "the sum over the chips of ", " applied to ", " rotated to ", " plus ", " times ", "the SiLU of ",
        "the arg-max of ", "the RMS norm of ", "the attention of ", " up to ", ", with no history", "row ",
        "The program runs on 2 chips.", "decode step, ctx 64", "prefill chunk of 4 rows' layer 0, ctx 64",
        "0", "18446744073709551617", "1e-05", "inf", "nan", "-1", "\n\n", "    ",
    ],
    "mlir": [
        "logos.program", "func.func", "func.call", "func.return", "logos.weight", "logos.input",
        "logos.cache", "logos.cache_write", "logos.attention", "logos.self_attention", "logos.rope",
        "logos.linear",
        "logos.rms_norm", "logos.embed", "logos.add", "logos.mul", "logos.silu", "logos.row", "logos.argmax",
        "shard.grid", "shard.all_reduce", " split \"rows\" over @chips", "shape [", "tensor<", "memref<",
        "xf32>", "xi64>", "chips 2", "digest \"", "cut \"", "model {", "epsilon", "theta", "head_dim",
        "values [", "%", "@", "^bb0", "\"builtin.module\"() ({", "<{", "}>", "dense<", ": i64", ": f64",
        "0x7FF8000000000000", "-1", "9223372036854775808", "1.0e+308",
    ],
    "config": [
        "\"model_type\"", "\"llama\"", "\"mistral\"", "\"hidden_size\"", "\"num_attention_heads\"",
        "\"num_key_value_heads\"", "\"num_hidden_layers\"", "\"intermediate_size\"", "\"vocab_size\"",
        "\"head_dim\"", "\"rms_norm_eps\"", "\"rope_theta\"", "\"rope_scaling\"", "\"rope_parameters\"",
        "\"rope_type\"", "\"llama3\"", "\"factor\"", "\"low_freq_factor\"", "\"high_freq_factor\"",
        "\"original_max_position_embeddings\"", "\"tie_word_embeddings\"", "true", "false", "null",
        "1e309", "-1", "0", "NaN", "Infinity", "[", "{", "9" * 30,
    ],
    "safetensors": [
        "\"dtype\"", "\"F32\"", "\"F16\"", "\"BF16\"", "\"I64\"", "\"F64\"", "\"shape\"",
        "\"data_offsets\"", "\"__metadata__\"", "\"weight_map\"", "../", "/", "\\\\", "\\u0000",
        "link.safetensors", "linkdir/", "model-00002-of-00002.safetensors", "18446744073709551615",
        "-1", "[]", "\"model_type\"", "\"hidden_size\"",
    ],
}
_DICTIONARY["d5005-stream"] = [
    "D5005ENG", "D5005IMG", "LOGOS program: decode step, ctx 8, sha256 ", "{\"buffers\":[", "\"regions\":[",
    "[\"scores\",1,0]", "\x02\x00\x00\x00", "\x06\x00\x00\x00", "\x40\x00\x00\x00", "\x00\x10\x00\x00",
]
_DICTIONARY["d5005-image"] = _DICTIONARY["d5005-stream"][:3]
_DICTIONARY["manifest"] = [
    "\"format\"", "\"logos-build 1\"", "\"artifacts\"", "\"path\"", "\"sha256\"", "\"size\"", "\"target\"",
    "\"cut\"", "\"decode ctx=16\"", "\"model\"", "../", "/etc/hostname", "linkdir/", "link.logos",
    "parts/layer_0.logos", "program.logos", "\\u0000", "C:\\\\", "-1", "1e400", "[]", "{}", "null", "9" * 30,
]
_BINARY_DICTIONARY = [
    b"GGUF", b"general.architecture", b"llama", b"general.alignment", b"tokenizer.ggml.tokens",
    b"tokenizer.ggml.merges", b"tokenizer.ggml.model", b"gpt2", b"tokenizer.ggml.pre", b"llama-bpe",
    b"tokenizer.ggml.token_type", b"llama.block_count", b"rope_freqs.weight", b"token_embd.weight",
    b"output.weight", b"\x08\x00\x00\x00", b"\x09\x00\x00\x00", b"\x04\x00\x00\x00",
    b"\xff\xff\xff\xff\xff\xff\xff\xff", b"\x00\x00\x00\x80", b"\x03\x00\x00\x00", b"\x02\x00\x00\x00",
]
# fmt: on


def _dictionary(reader: str) -> str:
    entries = _DICTIONARY.get(reader) or []
    raw = [e.encode("utf-8") for e in entries] or _BINARY_DICTIONARY
    lines = []
    for i, entry in enumerate(raw):
        text = "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\x{b:02x}" for b in entry)
        lines.append(f'kw{i}="{text}"')
    return "\n".join(lines) + "\n"


# -- the driver ----------------------------------------------------------------------------------------------


class _Stats:
    def __init__(self, path: Path, reader: str):
        self.path, self.reader = path, reader
        self.counts = {"loaded": 0, "refused": 0, "known": 0}
        self.known: dict[str, int] = {}
        self.started = time.time()
        self.written = 0.0

    def add(self, outcome: str) -> None:
        self.counts[outcome] += 1
        if time.time() - self.written > 10:
            self.write()

    def write(self) -> None:
        self.written = time.time()
        report = {
            "reader": self.reader,
            "seconds": round(self.written - self.started, 1),
            **self.counts,
            "known_failures": self.known,
        }
        self.path.write_text(json.dumps(report, indent=2) + "\n")


_READER_MODULES = [
    "logos_ir.errors", "logos_ir.spec", "logos_ir.program", "logos_ir.dialects.logos", "logos_ir.builder",
    "logos_ir.printer", "logos_ir.author", "logos_ir.parser", "logos_ir.identity", "logos_ir.weights.store",
    "logos_ir.weights.safetensors", "logos_ir.weights.gguf", "logos_ir.weights.hub",
    "logos_ir.tokenizer", "logos_ir.cli", "logos_ir.registry", "logos_ir.tools.logos_opt", "logos_ir.build",
    "logos_ir.models", "logos_ir.runtime.d5005",
]  # fmt: skip


def _instrument_modules(atheris: Any, names: list[str]) -> None:
    """Instrument, in place, every function and method defined in the modules `names` (already imported)."""
    import inspect

    for name in names:
        module = importlib.import_module(name)
        for value in list(vars(module).values()):
            members = vars(value).values() if inspect.isclass(value) else [value]
            for member in members:
                function = getattr(member, "__func__", member)
                if inspect.isfunction(function) and function.__module__ == name:
                    atheris.instrument_func(function)


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m logos_ir.tools.fuzz",
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after '--' go to libFuzzer.",
    )
    parser.add_argument("--reader", required=True, choices=READERS)
    parser.add_argument("--seconds", type=int, default=60, help="how long to fuzz (libFuzzer's -max_total_time)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="the corpus, crash files and stats go here (default: /tmp/logos-fuzz/<reader>)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        default=CORPUS,
        help="the regression corpus, a folder of inputs a reader (default: test/fuzz/corpus, from the repository's "
        "root); --replay with no files replays it",
    )
    parser.add_argument("--rss-limit-mb", type=int, default=2048, help="a memory blow-up past this is a failure")
    parser.add_argument("--timeout", type=int, default=10, help="an input taking longer (seconds) is a hang")
    parser.add_argument(
        "--replay",
        nargs="*",
        type=Path,
        default=None,
        help="instead of fuzzing, run these inputs through the reader and print each outcome",
    )
    parser.add_argument("--write-seeds", type=Path, default=None, help="write the seeds to this folder and exit")
    return parser


def _replay(reader: str, files: list[Path]) -> int:
    import traceback

    bad = 0
    for path in files:
        try:
            outcome = check(reader, path.read_bytes())
        except BaseException as error:  # noqa: BLE001 - every failure is reported
            known = known_issue(reader, error)
            if known:
                outcome = f"known failure: {known}"
            else:
                bad += 1
                outcome = f"FAILURE: {type(error).__name__}: {error}"
                traceback.print_exc()
        print(f"{path}: {outcome}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = _arguments().parse_args(argv)
    reader = args.reader
    if args.write_seeds is not None:
        print(f"{write_seeds(reader, args.write_seeds)} seeds written to {args.write_seeds}")
        return 0
    if args.replay is not None:
        apply_workarounds(reader)
        return _replay(reader, args.replay or corpus_files(args.corpus, reader))
    try:
        import atheris
    except ImportError:
        print("fuzz: atheris is not installed: pip install atheris", file=sys.stderr)
        return 2
    # Instrument first: seeding imports the readers, and a module imported before this is not instrumented.
    with atheris.instrument_imports(include=["logos_ir"]):
        for module in _READER_MODULES:
            importlib.import_module(module)
    if reader == "mlir":
        _instrument_modules(atheris, XDSL_PARSER)
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "logos-fuzz" / reader).resolve()
    corpus = workdir / "corpus"
    count = write_seeds(reader, corpus)
    dictionary = workdir / f"{reader}.dict"
    dictionary.write_text(_dictionary(reader))
    stats = _Stats(workdir / "stats.json", reader)
    atexit.register(stats.write)
    sandbox(workdir / "sandbox")
    apply_workarounds(reader)
    if reader == "mlir":
        _opt()

    def one_input(data: bytes) -> None:
        try:
            stats.add(check(reader, data))
        except BaseException as error:
            known = known_issue(reader, error)
            if known is None:
                stats.write()
                raise
            signature = failure_signature(error)
            if signature not in stats.known:  # the first input of each known failure, kept to show it
                name = "".join(c if c.isalnum() or c in ".-" else "-" for c in signature)
                (workdir / f"known-{name}").write_bytes(data)
            stats.known[signature] = stats.known.get(signature, 0) + 1
            stats.add("known")

    regression = [str(args.corpus / reader)] if (args.corpus / reader).is_dir() else []
    libfuzzer = [
        sys.argv[0],
        f"-max_total_time={args.seconds}",
        f"-rss_limit_mb={args.rss_limit_mb}",
        f"-timeout={args.timeout}",
        f"-max_len={MAX_LEN[reader]}",
        f"-dict={dictionary}",
        f"-artifact_prefix={workdir}/",
        "-print_final_stats=1",
        *extra,
        str(corpus),
        *regression,
    ]
    print(
        f"fuzz: {reader}: {count} seeds, {len(corpus_files(args.corpus, reader))} regression inputs, {args.seconds} s; "
        f"work folder {workdir}",
        file=sys.stderr,
    )
    atheris.Setup(libfuzzer, one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
