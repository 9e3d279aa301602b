"""The project's errors: one type, with a message and, where a source exists, the place in it.

Every reader (LOGOS text, MLIR, `config.json`, safetensors, GGUF, the tokenizer) raises `LogosError` or one of its
subclasses for bad input; the command-line tools catch exactly this type, print `str(error)` and exit 1. A traceback
is therefore always a bug in logos-ir, never the user's fault.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    """A place in a source text: file name, line and column, both counted from 1."""

    file: str
    line: int
    column: int
    line_text: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class LogosError(Exception):
    """A user's input is wrong. `str()` gives the whole diagnostic: `file:line:col: error: <what>`, then the source
    line and a caret under the column when a source location is known, else `error: <what>`."""

    kind = "error"

    def __init__(self, message: str, location: SourceLocation | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location
        self.hint = hint

    def __str__(self) -> str:
        if self.location is None:
            text = f"{self.kind}: {self.message}"
        else:
            loc = self.location
            text = f"{loc}: {self.kind}: {self.message}"
            if loc.line_text:
                caret = " " * (loc.column - 1) + "^"
                text += f"\n{loc.line_text}\n{caret}"
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text


class SpecError(LogosError):
    """A model specification (sizes, `config.json`, GGUF metadata) is invalid or unsupported."""


class CutError(LogosError):
    """A cut's option form cannot be read, or a cut does not fit the model (a layer past the last, say)."""


class ParseError(LogosError):
    """LOGOS text (or MLIR text) does not follow the grammar or does not verify."""


class WeightError(LogosError):
    """A weight file or tensor is missing, truncated, corrupt, unsafe, or disagrees with the model."""


class TokenizerError(LogosError):
    """A tokenizer cannot be built from the model's files."""


class PassError(LogosError):
    """A pass cannot do its job on its input; the message names the pass and the op."""


class BuildError(LogosError):
    """A build cannot be made, or a build folder is not what its manifest says."""


class NotYet(LogosError):
    """A program logos-ir knows of but does not write yet; the message names what is not yet written."""

    kind = "not yet"
