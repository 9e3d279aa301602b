"""Guards around two faults of xDSL 0.74's MLIR reader that let a few bytes of input hang or exhaust a machine.

Fuzzing `logos-opt` (docs/fuzzing.md) found them; both are applied by `logos-opt` before it reads any input, and
by the fuzz driver. Each patch is the fix to propose upstream, and each checks that the code it replaces is still
the code it was written against, so a newer xDSL is left alone rather than patched blindly.

- The lexer matches a string literal with a nested quantifier, which backtracks exponentially on an unterminated
  string (30 characters after a lone `"` take minutes). The guard's pattern matches the same strings linearly.
- `IntegerType` accepts any width, and an integer attribute's range check computes `1 << width`: `1 : i17179869184`
  in a 40-byte file allocates gigabytes. The guard refuses widths above MLIR's own limit of 2**24 - 1 bits.
"""

from __future__ import annotations

import re

MLIR_MAX_INTEGER_WIDTH = 2**24 - 1
_LINEAR_STRING = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')
_BACKTRACKING_STRING = r'"(?:[^"\\\n\v\f]+|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"'


def apply() -> None:
    """Install both guards in this process (idempotent)."""
    _guard_string_literals()
    _guard_integer_widths()


def _guard_string_literals() -> None:
    from xdsl.utils.mlir_lexer import MLIRLexer

    current = MLIRLexer._unescaped_characters_regex
    if current.pattern == _BACKTRACKING_STRING:
        MLIRLexer._unescaped_characters_regex = _LINEAR_STRING


def _guard_integer_widths() -> None:
    from xdsl.dialects.builtin import IntegerType
    from xdsl.utils.exceptions import VerifyException

    verify = IntegerType.verify
    if getattr(verify, "_logos_guard", False):
        return

    def verify_width(self: IntegerType) -> None:
        verify(self)
        if self.width.data > MLIR_MAX_INTEGER_WIDTH:
            raise VerifyException(f"integer type bitwidth {self.width.data} is above {MLIR_MAX_INTEGER_WIDTH}")

    verify_width._logos_guard = True  # type: ignore[attr-defined]
    IntegerType.verify = verify_width  # type: ignore[method-assign]
