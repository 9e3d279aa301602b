"""`logos-opt`'s pass pipelines in both spellings its users write: xDSL's flat list (`-p 'cut-extract{...},tp-split'`)
and MLIR's textual form anchored on the module (`--pass-pipeline='builtin.module(cut-extract{...},tp-split)'`).

Every pass logos-opt runs is a module pass, so an anchor `builtin.module(...)` (or `any(...)`) is unwrapped, at any
depth, into the flat list xDSL's `PassPipeline` reads; an anchor on another op (`func.func(...)`) is refused by name.
A malformed pipeline is one `PipelineError` naming the character or the option at fault, never a traceback (xDSL's
own `ArgSpecParseError` derives from `BaseException` and is turned into one here), and a pass option the pass does
not have is named with the options it has.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any, get_type_hints

from xdsl.passes import ModulePass

_OPENERS = {"(": ")", "{": "}"}
_CLOSERS = {")": "(", "}": "{"}
_ANCHORED = re.compile(r"\s*([A-Za-z_][\w.$-]*)\s*\((.*)\)\s*", re.S)
_MODULE_ANCHORS = ("builtin.module", "any")


class PipelineError(ValueError):
    """A pipeline that cannot be read or run as written; the message says where and what."""


def flat_pipeline(text: str, option: str = "-p") -> str:
    """`text` as xDSL's flat list of pass specs, after checking its brackets and quotes."""
    _check_brackets(text, option)
    return ",".join(_elements(text, 0, option))


def _check_brackets(text: str, option: str) -> None:
    stack: list[tuple[str, int]] = []
    quote: int | None = None
    for index, char in _characters(text):
        if char == '"':
            quote = index if quote is None else None
        elif quote is not None:
            continue
        elif char in _OPENERS:
            stack.append((char, index))
        elif char in _CLOSERS:
            if not stack or stack[-1][0] != _CLOSERS[char]:
                raise _error(option, text, index, f"'{char}' closes nothing")
            stack.pop()
    if quote is not None:
        raise _error(option, text, quote, "the string that starts here has no closing '\"'")
    if stack:
        char, index = stack[-1]
        raise _error(option, text, index, f"'{char}' is never closed (expected '{_OPENERS[char]}')")


def _characters(text: str) -> Iterator[tuple[int, str]]:
    """The characters of `text` with their indices, an escaped one (`\\"`) skipped."""
    index = 0
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        yield index, text[index]
        index += 1


def _elements(text: str, start: int, option: str) -> list[str]:
    """The pass specs of a comma-separated list, anchors unwrapped; `start` is where `text` sits in the whole."""
    if not text.strip():
        return []
    out: list[str] = []
    for begin, element in _split(text):
        anchored = _ANCHORED.fullmatch(element)
        if not element.strip():
            raise _error(option, None, start + begin, "a pass name is missing (an empty entry between commas)")
        if anchored is None:
            out.append(element.strip())
            continue
        if anchored[1] not in _MODULE_ANCHORS:
            raise PipelineError(
                f"{option}: logos-opt runs module passes only: write the passes of '{anchored[1]}(...)' in "
                f"builtin.module(...)"
            )
        out += _elements(anchored[2], start + begin + anchored.start(2), option)
    return out


def _split(text: str) -> Iterator[tuple[int, str]]:
    """The top-level comma-separated entries of `text`, each with where it begins."""
    depth, quoted, begin = 0, False, 0
    for index, char in _characters(text):
        if char == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif char in _OPENERS:
            depth += 1
        elif char in _CLOSERS:
            depth -= 1
        elif char == "," and depth == 0:
            yield begin, text[begin:index]
            begin = index + 1
    yield begin, text[begin:]


def _error(option: str, text: str | None, index: int, what: str) -> PipelineError:
    where = f" at column {index + 1}" if text is None else f" at column {index + 1}: {text[: index + 1]}<--"
    return PipelineError(f"{option}: malformed pass pipeline{where}: {what}")


def parsed(spec: str, option: str = "-p"):  # type: ignore[no-untyped-def]
    """xDSL's reading of a flat list, its `ArgSpecParseError` (a `BaseException`) turned into a `PipelineError`."""
    from xdsl.utils.arg_spec import parse_pipeline
    from xdsl.utils.exceptions import ArgSpecParseError

    try:
        return list(parse_pipeline(spec))
    except ArgSpecParseError as error:
        place = re.search(r"pass-pipeline:\d+:(\d+)\n.*\n\s*\^+\n\s*(.*)", str(error))
        if place is None:
            raise PipelineError(f"{option}: malformed pass pipeline: {error}") from None
        column = int(place[1])
        raise _error(option, spec, column - 1, place[2].strip().removesuffix(" here").lower()) from None


def check_options(spec: str, passes: dict[str, Callable[[], type[ModulePass]]], option: str = "-p") -> None:
    """Each known pass in `spec` given only options it has: an unknown one is named with the pass's options."""
    for item in parsed(spec, option):
        factory = passes.get(item.name)
        if factory is None:
            continue
        cls = factory()
        fields = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"]
        unknown = [name for name in item.parameters if name.replace("-", "_") not in fields]
        if unknown:
            has = ", ".join(name.replace("_", "-") for name in fields) or "none"
            raise PipelineError(f"{option}: pass {item.name} has no option '{unknown[0]}' (its options: {has})")
        _check_values(item.name, cls, item.parameters, option)


def _check_values(name: str, cls: type[ModulePass], parameters: dict[str, Any], option: str) -> None:
    """Each option's value of the type its field has, or an error naming the option (xDSL's names only types)."""
    from xdsl.utils.arg_spec import _convert_arg_to_type  # the conversion `from_pass_spec` makes

    hints = get_type_hints(cls)
    for key, values in parameters.items():
        try:
            _convert_arg_to_type(values, hints[key.replace("-", "_")])
        except ValueError:
            wanted = getattr(hints[key.replace("-", "_")], "__name__", str(hints[key.replace("-", "_")]))
            given = ",".join(str(value) for value in values) or "nothing"
            raise PipelineError(f"{option}: pass {name}: option '{key}' takes {wanted}, not {given}") from None
