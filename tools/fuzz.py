"""Coverage-guided fuzzing of every reader of untrusted input, run for a bounded time (not in every test run).

    python -m logos_ir.tools.fuzz --reader logos|mlir|config|safetensors|gguf|tokenizer --seconds 600

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
folders written by `save_model`, tiny GGUF files, and the embedded SmolLM2 GGUF's header region (its
tokenizer arrays cut short so that one input stays small). The inputs in `test/fuzz/corpus/<reader>/` (inputs
that once failed) are added to the corpus and replayed by the unit tests through `check`. Atheris
(`pip install atheris`) is needed only to fuzz; `check`, `seeds` and the file writers here import nothing
beyond logos-ir's own dependencies. See docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import atexit
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
REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "test" / "fuzz" / "corpus"

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


# -- known, reported failures in code the fuzzing owner may not change ---------------------------------------

# (reader, exception type name or "*", where it was raised, report): a failure matching one is counted and
# reported by the driver but does not stop the run, and the regression tests mark its corpus input as an
# expected failure. Where: "file.py:function" of logos-ir's innermost frame, or "xdsl" for one raised inside
# xDSL's own code, called straight from the driver or logos-opt, never through logos-ir's dialect. Remove an
# entry once its bug is fixed.
KNOWN: list[tuple[str, str, str, str]] = []  # every failure found so far is fixed (docs/fuzzing.md)


def apply_workarounds(reader: str) -> None:
    """Install the guards `logos-opt` runs with against xDSL's hang and memory blow-up (logos_ir.xdsl_guards)."""
    if reader == "mlir":
        from logos_ir import xdsl_guards

        xdsl_guards.apply()


def _where(error: BaseException) -> tuple[str, bool]:
    """The innermost of logos-ir's frames of `error` as "file.py:function", and whether every frame after it is
    xDSL's (called from the driver or logos-opt)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "", False
    ours = [i for i, f in enumerate(frames) if Path(f.filename).resolve().is_relative_to(REPO)]
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


def known_report(reader: str, place: str) -> str:
    """The report of the known failure of `reader` at `place` (as in KNOWN)."""
    return next(report for name, _, where, report in KNOWN if name == reader and where == place)


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
        if root is None:  # for the tests: removed at exit
            self.root = Path(tempfile.mkdtemp(prefix="logos-fuzz-")).resolve()
            atexit.register(shutil.rmtree, self.root, True)
        else:  # for the driver, in its work folder (libFuzzer ends the process without running atexit)
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            self.root = root.resolve()
        outside = self.root / "outside"
        _write_folder(outside, shards=1)
        (outside / "evil.safetensors").write_bytes((outside / "model.safetensors").read_bytes())
        self.config = self._folder("config")
        self.gguf = self._folder("gguf")
        self.build = _write_build(self.root / "build", outside)
        self.modes: list[Path] = []
        for mode in range(4):
            folder = self.root / f"model{mode}"
            _write_folder(folder, shards=2 if mode in (1, 2) else 1)
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
_TRUSTED = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, REPO)})


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
    if print_program(program).encode("utf-8") != data:
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


# -- writers of small real inputs ----------------------------------------------------------------------------


def small_spec(hidden: int = 4) -> Any:
    """A model small enough that its whole weight file is a fuzz input: hidden 4 (or 32, for GGUF block
    types)."""
    from logos_ir.spec import ModelSpec

    if hidden == 4:
        return ModelSpec(
            vocab=4,
            hidden=4,
            layers=1,
            heads=2,
            kv_heads=1,
            head_dim=2,
            intermediate=4,
            rms_eps=1e-5,
            rope_theta=10000.0,
            tie_embeddings=False,
        )
    return ModelSpec(
        vocab=8,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        head_dim=16,
        intermediate=32,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
    )


def _write_folder(folder: Path, shards: int = 1, dtype: str = "float32", seed: int = 1) -> Path:
    from logos_ir.weights import RandomWeights, save_model

    save_model(RandomWeights(small_spec(), seed=seed), folder, shards=shards, dtype=dtype)
    return folder


def write_model_folder(folder: Path, shards: int = 1, dtype: str = "float32", seed: int = 1) -> Path:
    """A Hugging Face model folder of `small_spec()` with random weights, written by `save_model`."""
    return _write_folder(Path(folder), shards, dtype, seed)


# GGUF value types (the GGUF specification's numbering).
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_PACK = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}


def _gguf_string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _gguf_value(kind: int, value: Any) -> bytes:
    if kind == STRING:
        return _gguf_string(value)
    if kind == ARRAY:
        item_kind, items = value
        return struct.pack("<IQ", item_kind, len(items)) + b"".join(_gguf_value(item_kind, v) for v in items)
    return struct.pack(_PACK[kind], value)


def gguf_bytes(
    metadata: list[tuple[str, int, Any]],
    tensors: list[tuple[str, tuple[int, ...], int, bytes]] = (),  # type: ignore[assignment]
    alignment: int = 32,
    version: int = 3,
    header_only: bool = False,
) -> bytes:
    """A GGUF file: `metadata` as (key, value type, value) (an array's value is (item type, items)), `tensors`
    as (name, numpy-order shape, GGML type number, data). With `header_only`, the tensors' data is left out (a
    header region, as a truncated file)."""
    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(metadata))]
    for key, kind, value in metadata:
        out += [_gguf_string(key), struct.pack("<I", kind), _gguf_value(kind, value)]
    offset, data = 0, []
    for name, shape, qtype, raw in tensors:
        dims = tuple(reversed(shape))
        out += [
            _gguf_string(name),
            struct.pack("<I", len(dims)),
            struct.pack(f"<{len(dims)}Q", *dims),
            struct.pack("<IQ", qtype, offset),
        ]
        padded = raw + b"\0" * (-len(raw) % alignment)
        data.append(padded)
        offset += len(padded)
    head = b"".join(out)
    if header_only:
        return head
    return head + b"\0" * (-len(head) % alignment) + b"".join(data)


def model_gguf(hidden: int = 4, qtype: str = "F32", tokenizer: bool = False, rope_scaling: bool = False) -> bytes:
    """A GGUF of `small_spec(hidden)` with random weights: norms F32, matrices `qtype` (F32, F16, Q8_0, Q4_0,
    Q4_1; block types need hidden 32), optionally with a tokenizer and llama3 rope scaling (`rope_freqs`)."""
    import numpy as np
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import quantize

    from logos_ir.rope import llama3_rope_divisors
    from logos_ir.spec import RopeScaling
    from logos_ir.weights import RandomWeights, gguf_tensor_name

    spec = small_spec(hidden)
    store = RandomWeights(spec, seed=2)
    meta: list[tuple[str, int, Any]] = [
        ("general.architecture", STRING, "llama"),
        ("general.name", STRING, "logos-fuzz"),
        ("llama.block_count", U32, spec.layers),
        ("llama.context_length", U32, 2048),
        ("llama.embedding_length", U32, spec.hidden),
        ("llama.feed_forward_length", U32, spec.intermediate),
        ("llama.attention.head_count", U32, spec.heads),
        ("llama.attention.head_count_kv", U32, spec.kv_heads),
        ("llama.rope.freq_base", F32, spec.rope_theta),
        ("llama.attention.layer_norm_rms_epsilon", F32, spec.rms_eps),
        ("llama.vocab_size", U32, spec.vocab),
        ("llama.rope.dimension_count", U32, spec.head_dim),
        ("general.alignment", U32, 32),
    ]
    if tokenizer:
        meta += tokenizer_metadata(spec.vocab)
    tensors = []
    for hf in store.names():
        array = np.array(store.get(hf))
        kind = QT.F32 if array.ndim == 1 else QT[qtype]
        if kind == QT.F32:
            raw = array.astype("<f4").tobytes()
        elif kind == QT.F16:
            raw = array.astype("<f2").tobytes()
        else:
            raw = quantize(array, kind).tobytes()
        tensors.append((gguf_tensor_name(hf), array.shape, int(kind), raw))
    if rope_scaling:
        scaling = RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        )
        divisors = llama3_rope_divisors(scaling, spec.head_dim, spec.rope_theta).astype("<f4")
        meta.append(("llama.rope.scaling.type", STRING, "llama3"))
        tensors.append(("rope_freqs.weight", divisors.shape, int(QT.F32), divisors.tobytes()))
    return gguf_bytes(meta, tensors)


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each of the 256 bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_metadata(vocab: int | None = None, pre: str = "smollm") -> list[tuple[str, int, Any]]:
    """The `tokenizer.ggml.*` metadata of a small byte-level BPE: the 256 byte tokens, a few merges, three
    control tokens. With `vocab` (fewer than 256), a vocabulary of that many tokens and no merges."""
    if vocab is not None and vocab < 256:
        tokens = [f"t{i}" for i in range(vocab)]
        return [
            ("tokenizer.ggml.model", STRING, "gpt2"),
            ("tokenizer.ggml.pre", STRING, pre),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.bos_token_id", U32, 0),
            ("tokenizer.ggml.eos_token_id", U32, vocab - 1),
        ]
    tokens = _byte_level_alphabet()
    merges = []
    for left, right in (
        ("Ġ", "w"),
        ("h", "e"),
        ("he", "l"),
        ("hel", "l"),
        ("hell", "o"),
        ("Ġw", "o"),
        ("l", "d"),
    ):
        merges.append(f"{left} {right}")
        if left + right not in tokens:
            tokens.append(left + right)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    return [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (I32, types)),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
        ("tokenizer.ggml.bos_token_id", U32, len(tokens) - 2),
        ("tokenizer.ggml.eos_token_id", U32, len(tokens) - 1),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
        (
            "tokenizer.chat_template",
            STRING,
            "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
        ),
    ]


def embedded_header(keep_tokens: int = 400, tensors: bool = True) -> bytes | None:
    """The embedded SmolLM2 GGUF's header region, as a file: its metadata with the tokenizer's arrays cut to
    the first `keep_tokens` tokens (and the merges among them), and, with `tensors`, its tensor table (the
    data left out). None when the embedded model is not installed."""
    try:
        from gguf import GGUFReader, GGUFValueType

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
    return gguf_bytes(meta, infos, header_only=True) if tensors else gguf_bytes(meta, [])


# -- seeds ---------------------------------------------------------------------------------------------------


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


def _mlir_text(text: str, generic: bool = False) -> str:
    from xdsl.dialects.builtin import ModuleOp
    from xdsl.printer import Printer

    from logos_ir.parser import parse_program

    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=generic).print_op(ModuleOp([parse_program(text)]))
    return stream.getvalue() + "\n"


def seeds(reader: str) -> dict[str, bytes]:
    """Real inputs of `reader`, by a file name."""
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
        out = {f"{name}.mlir": _mlir_text(authored[name]).encode() for name in small}
        generic = _mlir_text(authored["tiny-decode_embed"], generic=True)
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
        out["small.json"] = json.dumps(hf_config(small_spec()), separators=(",", ":")).encode()
        return out
    if reader == "safetensors":
        return _safetensors_seeds()
    if reader == "gguf":
        out = {
            "small-f32.gguf": model_gguf(4, "F32"),
            "small-f16-tokenizer.gguf": model_gguf(4, "F16", tokenizer=True),
            "small32-q8_0-rope.gguf": model_gguf(32, "Q8_0", rope_scaling=True),
            "small32-q4_0.gguf": model_gguf(32, "Q4_0"),
            "small32-q4_1.gguf": model_gguf(32, "Q4_1"),
        }
        header = embedded_header(keep_tokens=200)
        if header is not None:
            out["embedded-header.gguf"] = header
        return out
    if reader == "tokenizer":
        out = {
            "byte-level-smollm.gguf": gguf_bytes(tokenizer_metadata(pre="smollm")),
            "byte-level-llama3.gguf": gguf_bytes(tokenizer_metadata(pre="llama-bpe")),
            "byte-level-gpt2.gguf": gguf_bytes(tokenizer_metadata(pre="gpt2")),
            "small-model-with-tokenizer.gguf": model_gguf(4, "F32", tokenizer=True),
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
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        for dtype in ("float32", "float16", "bfloat16"):
            folder = _write_folder(root / dtype, dtype=dtype)
            out[f"0-single-{dtype}"] = b"\0" + (folder / "model.safetensors").read_bytes()
        sharded = _write_folder(root / "sharded", shards=2)
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


def _write_build(folder: Path, outside: Path | None = None) -> Path:
    """A `logos` build of the tiny preset (decode ctx=16, its parts), written by `write_build`, with a link to a
    file and a link to a folder outside it (a manifest naming them must not make the checker read them)."""
    from logos_ir.build import BuildRequest, build_logos, manifest_of, write_build
    from logos_ir.models import ModelSource
    from logos_ir.program import Cut
    from logos_ir.progress import Progress

    request = BuildRequest(ModelSource.resolve("tiny"), Cut.decode(16), 1, "f32", False, Progress.silent())

    def produce() -> tuple[dict[str, Any], list[Any]]:
        lane = build_logos(request)
        return manifest_of(request, "logos", lane), lane.artifacts

    write_build(folder, produce)
    if outside is not None:
        os.symlink(outside / "config.json", folder / "link.logos")
        os.symlink(outside, folder / "linkdir")
    return folder


def _manifest_seeds() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as temporary:
        real = (_write_build(Path(temporary) / "build") / "manifest.json").read_bytes()
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
    from logos_ir.passes.d5005.convert_logos_to_d5005 import lower_program
    from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
    from logos_ir.passes.d5005.emit_stream import encode_stream
    from logos_ir.program import Cut
    from logos_ir.spec import ModelSpec
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


def corpus_files(reader: str) -> list[Path]:
    """The inputs of `test/fuzz/corpus/<reader>/`, sorted."""
    folder = CORPUS / reader
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
        return _replay(reader, args.replay or corpus_files(reader))
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

    regression = [str(CORPUS / reader)] if (CORPUS / reader).is_dir() else []
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
        f"fuzz: {reader}: {count} seeds, {len(corpus_files(reader))} regression inputs, {args.seconds} s; "
        f"work folder {workdir}",
        file=sys.stderr,
    )
    atheris.Setup(libfuzzer, one_input)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
