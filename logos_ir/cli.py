"""What every logos-ir command-line tool shares: how it reports errors and exits.

A user's mistake (a `LogosError`, or xDSL's own parse and verify diagnostics) prints one clear message and exits 1;
a usage mistake exits 2 (argparse's convention); anything else is a bug in logos-ir, reported in one line as an
internal error (exit 70) with a request to rerun with `--debug`, which shows the traceback.
"""

from __future__ import annotations

import os
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
        print(str(error) if error.location else f"{tool}: {error}", file=sys.stderr)
        return USER_ERROR
    except VerifyException as error:
        if debug:
            raise
        print(f"{tool}: error: {error}", file=sys.stderr)
        return USER_ERROR
    except (ParseError, DiagnosticException) as error:  # these carry their own location
        if debug:
            raise
        print(str(error), file=sys.stderr)
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
        return USER_ERROR
    except Exception as error:  # a bug in logos-ir, not the user's input
        if debug:
            raise
        print(
            f"{tool}: internal error: {type(error).__name__}: {error} (rerun with --debug for a traceback)",
            file=sys.stderr,
        )
        return INTERNAL_ERROR


def count(text: str) -> int:
    """An argparse type: a whole number from 0."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    return value


def positive(text: str) -> int:
    """An argparse type: a whole number from 1."""
    import argparse

    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def write_atomically(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, renamed into place: a failure leaves the
    old file (or no file), never half of a new one."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".logos-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
