"""The LOGOS parser: LOGOS text straight into `logos` IR, with a diagnostic `file:line:col` for every mistake.

The text is read line by line: a `## Program:` header naming the cut, the model's facts, then `##` sections, each a
`func.func`, one sentence an op. Sections other than `## Main` are read first so that calls know their callees'
types; every op is verified as soon as it is built, so a shape error points at its own line. After each line is
read, the parser prints the op back (`logos_ir.printer`) and refuses a line that differs from that canonical
sentence: the grammar has one spelling for each program, so parsing then printing gives the same bytes and the
identity of the source is the identity of the IR. The grammar is documented in `docs/logos.md`.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import func
from xdsl.dialects.builtin import FileLineColLoc, IntAttr, MemRefType, StringAttr, TensorType, f32, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from logos_ir import builder, quant
from logos_ir.builder import SectionBuilder
from logos_ir.dialects import logos
from logos_ir.errors import CutError, LogosError, ParseError, SourceLocation, SpecError
from logos_ir.printer import (
    FEATURE_FACTS,
    HEAD_NORMS,
    INDENT,
    PROJECTION_NORMS,
    RENORMALIZED,
    fact_lines,
    mixture_fact,
    section_header,
    sentence,
    word_list,
)
from logos_ir.program import Cut
from logos_ir.spec import PROJECTIONS, ModelSpec, RopeScaling
from logos_ir.tensor_parallel import split_axis

NAME = re.compile(r"[a-z][a-z0-9_]*")
_SUFFIX = re.compile(r"_[0-9]+$")


@dataclass
class _Line:
    number: int  # from 1
    text: str


@dataclass
class _Section:
    header: _Line
    body: list[_Line] = field(default_factory=list)


class _Source:
    """The text being parsed, for diagnostics."""

    def __init__(self, text: str, filename: str, line_offset: int = 0):
        self.filename = filename
        self.lines = text.split("\n")
        self.line_offset = line_offset

    def location(self, line: int, column: int) -> FileLineColLoc:
        """Where an op read from this text stands, as MLIR writes it: `loc("file":line:col)`."""
        return FileLineColLoc(StringAttr(self.filename), IntAttr(line + self.line_offset), IntAttr(column))

    def error(self, line: int, column: int, message: str, hint: str | None = None) -> ParseError:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        where = SourceLocation(self.filename, line + self.line_offset, max(column, 1), text)
        return ParseError(message, where, hint)


def parse_program(source: str | bytes, filename: str = "<logos>", line_offset: int = 0) -> logos.ProgramOp:
    """Parse LOGOS text into a `logos.program`, its digest the SHA-256 of the text. Each op is checked as it is
    read; the program as a whole verifies (`program.verify()`). `line_offset` is added to reported line numbers
    (for a chunk of a larger file)."""
    text = _decode(source, filename)
    src = _Source(text, filename, line_offset)
    lines = _check_layout(src, text)
    cut, facts_end = _read_header(src, lines)
    spec, chips = _read_facts(src, lines, facts_end)
    sections = _split_sections(src, lines[facts_end:])
    program = _Reader(src, cut, spec, chips).read(sections)
    program.location = src.location(lines[0].number, 1)
    program_text = "".join(line.text + "\n" for line in lines)  # the text itself when it has no comment
    builder.set_digest(program, hashlib.sha256(program_text.encode("utf-8")).hexdigest())
    return program


# -- layout -----------------------------------------------------------------------------------------------------


def _decode(source: str | bytes, filename: str) -> str:
    if isinstance(source, str):
        return source
    try:
        return source.decode("utf-8")
    except UnicodeDecodeError as error:
        before = source[: error.start]
        line = before.count(b"\n") + 1
        column = len(before) - (before.rfind(b"\n") + 1) + 1
        raise ParseError(
            f"the file is not UTF-8 text (byte 0x{source[error.start]:02x})",
            SourceLocation(filename, line, column),
        ) from None


def _check_layout(src: _Source, text: str) -> list[_Line]:
    """The program's lines, after refusing what a canonical LOGOS file never has: tabs, carriage returns, trailing
    spaces, a missing final newline, runs of blank lines. Comment lines (`//` at any indentation: a lit test's RUN
    and CHECK lines) are not the program's: they are left out, with a blank line they leave at the start, at the end
    or beside another, so the program is the text around them and its digest that text's."""
    if not text:
        raise src.error(1, 1, "the file is empty", "a LOGOS program starts with '## Program: <cut>'")
    if not text.endswith("\n"):
        last = len(src.lines)
        raise src.error(last, len(src.lines[-1]) + 1, "the file does not end with a newline (is it truncated?)")
    lines: list[_Line] = []
    after_comment = False
    for number, line in enumerate(src.lines[:-1], start=1):
        if line.lstrip(" ").startswith("//"):
            after_comment = True
            continue
        if not line and after_comment and (not lines or not lines[-1].text):
            continue  # a blank line a comment leaves at the start or beside another blank line
        after_comment = after_comment and not line
        for bad, what in (("\t", "a tab"), ("\r", "a carriage return")):
            if bad in line:
                raise src.error(number, line.index(bad) + 1, f"{what} in LOGOS text", "indent with four spaces")
        if line != line.rstrip(" "):
            raise src.error(number, len(line.rstrip(" ")) + 1, "trailing spaces")
        if not line and lines and not lines[-1].text:
            raise src.error(number, 1, "more than one blank line", "sections are separated by one blank line")
        lines.append(_Line(number, line))
    if after_comment and lines and not lines[-1].text:
        lines.pop()  # the blank line before comments at the end
    if not lines:
        raise src.error(1, 1, "the file holds only comments", "a LOGOS program starts with '## Program: <cut>'")
    if not lines[-1].text:
        raise src.error(
            lines[-1].number,
            1,
            "a blank line at the end of the file",
            "a LOGOS file ends with the newline of its last statement",
        )
    return lines


def _read_header(src: _Source, lines: list[_Line]) -> tuple[Cut, int]:
    first = lines[0]
    prefix = "## Program: "
    if not first.text.startswith(prefix):
        raise src.error(
            1, 1, "a LOGOS program starts with '## Program: <cut>'", "e.g. '## Program: decode step, ctx 64'"
        )
    cut = Cut.from_display(first.text[len(prefix) :])
    if cut is None:
        raise src.error(
            1,
            len(prefix) + 1,
            f"unknown cut '{first.text[len(prefix) :]}'",
            "cuts read like 'decode step, ctx 64' or 'prefill chunk of 4 rows' layer 0, ctx 64'",
        )
    end = 1
    while end < len(lines) and lines[end].text.startswith(INDENT):
        end += 1
    return cut, end


# -- facts ------------------------------------------------------------------------------------------------------

_N = r"(\S+)"
_FACTS: list[tuple[str, re.Pattern[str]]] = [
    ("vocab", re.compile(rf"The vocabulary has {_N} tokens?\.")),
    ("hidden", re.compile(rf"The hidden state has {_N} numbers?\.")),
    ("layers", re.compile(rf"The model has {_N} layers?\.")),
    (
        "heads",
        re.compile(rf"Each layer has {_N} attention heads? and {_N} key-value heads? of {_N} numbers?\."),
    ),
    ("intermediate", re.compile(rf"The feed-forward network has {_N} numbers?\.")),
    ("rms_eps", re.compile(rf"The RMS norm epsilon is {_N}\.")),
    ("rope_theta", re.compile(rf"The rotary base is {_N}\.")),
]
_LINEAR = re.compile(
    rf"The rotary frequencies are divided by {_N} \(linear scaling\)(, except in the layers with a sliding window)?\."
)
_SCALING = re.compile(
    rf"The rotary frequencies are scaled as in Llama 3 by {_N}, with low frequency factor {_N}, "
    rf"high frequency factor {_N} and original context {_N}\."
)
_YARN = re.compile(
    rf"The rotary frequencies are scaled by YaRN by {_N} over original context {_N}, ramped between {_N} and "
    rf"{_N} turns, with cos and sin scaled by {_N}\."
)
_LONGROPE = re.compile(
    rf"The rotary frequencies are divided by LongRoPE's factors (\S+(?:, \S+)*) for {_N} times original context "
    rf"{_N}, with cos and sin scaled by {_N}\."
)
_WINDOW = re.compile(
    rf"Attention looks back over a sliding window of {_N} positions?"
    r"(?:, except in layers? ([0-9]+(?:(?:, | and )[0-9]+)*))?\."
)
_BIASES = re.compile(r"The (.+) projections add biases\.")
_MIXTURE = re.compile(
    rf"Each layer's feed-forward network is a mixture of {_N} experts?, each token routed to the best {_N} of them"
    rf"({re.escape(RENORMALIZED)})?\."
)
_TIES = {"The head reads the embedding table.": True, "The head has its own table.": False}
_CHIPS = re.compile(rf"The program runs on {_N} chips?\.")


def _number(src: _Source, line: _Line, text: str, column: int, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise src.error(line.number, column, f"expected {noun}, got '{text}'") from None
    if kind is int and (not text.isdigit() or not text.isascii()):
        raise src.error(line.number, column, f"expected a whole number, got '{text}'")
    return value


def _read_facts(src: _Source, lines: list[_Line], end: int) -> tuple[ModelSpec, int | None]:
    facts = iter(lines[1:end])
    values: dict[str, int | float] = {}
    last = lines[0]
    for key, pattern in _FACTS:
        line = next(facts, None)
        if line is None:
            raise src.error(
                last.number + 1,
                1,
                f"the program's facts stop before its {_FACT_NAMES[key]}",
                f"write '{_FACT_EXAMPLES[key]}'",
            )
        last = line
        values.update(_fact(src, line, key, pattern))
    line = next(facts, None)
    optional: dict[str, Any] = {}
    for starts, read in _OPTIONAL_FACTS:  # each at most once, in this order
        if line is not None and starts(line.text[len(INDENT) :]):
            optional.update(read(src, line))
            line = next(facts, None)
    if line is None or line.text[len(INDENT) :] not in _TIES:
        where = line or last
        raise src.error(
            where.number,
            len(INDENT) + 1,
            "expected how the head reads its table",
            "write 'The head reads the embedding table.' or 'The head has its own table.'",
        )
    tie = _TIES[line.text[len(INDENT) :]]
    chips = None
    line = next(facts, None)
    if line is not None:
        match = _CHIPS.fullmatch(line.text[len(INDENT) :])
        if not match:
            raise src.error(
                line.number,
                len(INDENT) + 1,
                "unknown fact",
                "the last fact may only be 'The program runs on N chips.'",
            )
        chips = int(_number(src, line, match[1], len(INDENT) + match.start(1) + 1, int))
        if chips < 1:
            raise src.error(line.number, len(INDENT) + match.start(1) + 1, "a program runs on at least 1 chip")
        rest = next(facts, None)
        if rest is not None:
            raise src.error(rest.number, len(INDENT) + 1, "unknown fact after the chips")
    spec = _spec(src, lines[0], values, tie, optional)
    _check_canonical_facts(src, lines[1:end], spec, chips)
    return spec, chips


_FACT_NAMES = {
    "vocab": "vocabulary",
    "hidden": "hidden size",
    "layers": "number of layers",
    "heads": "heads",
    "intermediate": "feed-forward size",
    "rms_eps": "RMS norm epsilon",
    "rope_theta": "rotary base",
}
_FACT_EXAMPLES = {
    "vocab": "The vocabulary has 256 tokens.",
    "hidden": "The hidden state has 64 numbers.",
    "layers": "The model has 2 layers.",
    "heads": "Each layer has 4 attention heads and 2 key-value heads of 16 numbers.",
    "intermediate": "The feed-forward network has 128 numbers.",
    "rms_eps": "The RMS norm epsilon is 1e-05.",
    "rope_theta": "The rotary base is 10000.0.",
}


def _fact(src: _Source, line: _Line, key: str, pattern: re.Pattern[str]) -> dict[str, int | float]:
    text = line.text[len(INDENT) :]
    if not line.text.startswith(INDENT):
        raise src.error(line.number, 1, "facts are indented by four spaces")
    match = pattern.fullmatch(text)
    if not match:
        raise src.error(
            line.number,
            len(INDENT) + 1,
            f"expected the model's {_FACT_NAMES[key]}",
            f"write '{_FACT_EXAMPLES[key]}'",
        )
    kind = float if key in ("rms_eps", "rope_theta") else int
    numbers = [
        _number(src, line, match[i], len(INDENT) + match.start(i) + 1, kind) for i in range(1, pattern.groups + 1)
    ]
    if key == "heads":
        return dict(zip(("heads", "kv_heads", "head_dim"), numbers, strict=True))
    return {key: numbers[0]}


_ROTARY = re.compile(rf"The rotary embedding turns the first {_N} of each head's {_N} numbers\.")


def _rotary(src: _Source, line: _Line) -> int:
    """How many numbers of each head rotate (the head's size is checked against the heads fact with the rest)."""
    match = _ROTARY.fullmatch(line.text[len(INDENT) :])
    if not match:
        raise src.error(
            line.number,
            len(INDENT) + 1,
            "malformed rotary embedding fact",
            "write 'The rotary embedding turns the first 96 of each head's 128 numbers.'",
        )
    return int(_number(src, line, match[1], len(INDENT) + match.start(1) + 1, int))


def _long_scaling(src: _Source, line: _Line) -> RopeScaling | None:
    """YaRN's or LongRoPE's scaling fact, or None where the line is neither."""
    text = line.text[len(INDENT) :]
    yarn, longrope = _YARN.fullmatch(text), _LONGROPE.fullmatch(text)
    if yarn is None and longrope is None:
        return None
    match = yarn or longrope
    assert match is not None
    col = [len(INDENT) + match.start(i) + 1 for i in range(1, match.re.groups + 1)]
    try:
        if yarn is not None:
            return RopeScaling(
                factor=float(_number(src, line, yarn[1], col[0], float)),
                original_max_position_embeddings=int(_number(src, line, yarn[2], col[1], int)),
                rope_type="yarn",
                beta_fast=float(_number(src, line, yarn[4], col[3], float)),
                beta_slow=float(_number(src, line, yarn[3], col[2], float)),
                attention_factor=float(_number(src, line, yarn[5], col[4], float)),
            )
        assert longrope is not None
        factors, at = [], col[0]
        for word in longrope[1].split(", "):
            factors.append(float(_number(src, line, word, at, float)))
            at += len(word) + 2
        return RopeScaling(
            factor=float(_number(src, line, longrope[2], col[1], float)),
            original_max_position_embeddings=int(_number(src, line, longrope[3], col[2], int)),
            rope_type="longrope",
            attention_factor=float(_number(src, line, longrope[4], col[3], float)),
            factors=tuple(factors),
        )
    except SpecError as error:
        raise src.error(line.number, len(INDENT) + 1, error.message) from None


def _scaling(src: _Source, line: _Line) -> RopeScaling:
    long = _long_scaling(src, line)
    if long is not None:
        return long
    linear = _LINEAR.fullmatch(line.text[len(INDENT) :])
    if linear:  # whether the windowed layers are left out is checked against the model (the canonical facts)
        try:
            factor = float(_number(src, line, linear[1], len(INDENT) + linear.start(1) + 1, float))
            return RopeScaling(factor, rope_type="linear")
        except SpecError as error:
            raise src.error(line.number, len(INDENT) + 1, error.message) from None
    match = _SCALING.fullmatch(line.text[len(INDENT) :])
    if not match:
        raise src.error(
            line.number,
            len(INDENT) + 1,
            "malformed rotary scaling fact",
            "write 'The rotary frequencies are scaled as in Llama 3 by 8.0, with low frequency factor "
            "1.0, high frequency factor 4.0 and original context 8192.' or 'The rotary frequencies are divided by "
            "8.0 (linear scaling).' or 'The rotary frequencies are scaled by YaRN by 4.0 over original context 32768, "
            "ramped between 1.0 and 32.0 turns, with cos and sin scaled by 1.1386294361119891.' or 'The rotary "
            "frequencies are divided by LongRoPE's factors 1.0, 1.5 for 32.0 times original context 4096, with cos and "
            "sin scaled by 1.1902380714238083.'",
        )
    col = [len(INDENT) + match.start(i) + 1 for i in range(1, 5)]
    try:
        return RopeScaling(
            factor=float(_number(src, line, match[1], col[0], float)),
            low_freq_factor=float(_number(src, line, match[2], col[1], float)),
            high_freq_factor=float(_number(src, line, match[3], col[2], float)),
            original_max_position_embeddings=int(_number(src, line, match[4], col[3], int)),
        )
    except SpecError as error:
        raise src.error(line.number, len(INDENT) + 1, error.message) from None


def _window(src: _Source, line: _Line) -> dict[str, Any]:
    match = _WINDOW.fullmatch(line.text[len(INDENT) :])
    if not match:
        raise src.error(
            line.number,
            len(INDENT) + 1,
            "malformed sliding window fact",
            "write 'Attention looks back over a sliding window of 4096 positions.' (some layers full: '..., except"
            " in layers 5 and 11.')",
        )
    window = int(_number(src, line, match[1], len(INDENT) + match.start(1) + 1, int))
    full = tuple(int(n) for n in re.split(r", | and ", match[2])) if match[2] else ()
    return {"sliding_window": window, "full_layers": full}


def _biases(src: _Source, line: _Line) -> tuple[str, ...]:
    match = _BIASES.fullmatch(line.text[len(INDENT) :])
    names = re.split(r", | and ", match[1]) if match else []
    if not names or any(name not in PROJECTIONS for name in names):
        raise src.error(
            line.number,
            len(INDENT) + 1,
            "malformed biases fact",
            f"write 'The query, key and value projections add biases.' (projections of {', '.join(PROJECTIONS)})",
        )
    if names != [p for p in PROJECTIONS if p in names]:
        raise src.error(
            line.number,
            len(INDENT) + 1,
            "the projections of a biases fact are named in model order, each once",
            f"write 'The {word_list([p for p in PROJECTIONS if p in names])} projections add biases.'",
        )
    return tuple(names)


def _head_norms(src: _Source, line: _Line) -> dict[str, Any]:
    if line.text[len(INDENT) :] != HEAD_NORMS:
        raise src.error(line.number, len(INDENT) + 1, "malformed head norms fact", f"write '{HEAD_NORMS}'")
    return {"head_norms": True}


def _projection_norms(src: _Source, line: _Line) -> dict[str, Any]:
    if line.text[len(INDENT) :] != PROJECTION_NORMS:
        raise src.error(line.number, len(INDENT) + 1, "malformed projection norms fact", f"write '{PROJECTION_NORMS}'")
    return {"projection_norms": True}


def _mixture(src: _Source, line: _Line) -> dict[str, Any]:
    match = _MIXTURE.fullmatch(line.text[len(INDENT) :])
    if not match:
        raise src.error(
            line.number,
            len(INDENT) + 1,
            "malformed mixture of experts fact",
            f"write '{mixture_fact(8, 2, True)}' (without '{RENORMALIZED}' where the chosen weights are not"
            " renormalized)",
        )
    experts = int(_number(src, line, match[1], len(INDENT) + match.start(1) + 1, int))
    top_k = int(_number(src, line, match[2], len(INDENT) + match.start(2) + 1, int))
    return {"experts": experts, "experts_per_token": top_k, "renormalize": match[3] is not None}


def _feature_start(key: str) -> str:
    """The words a feature's fact starts with (up to its number, if it has one)."""
    return FEATURE_FACTS[key].split("{}")[0].removesuffix(".")


def _starts_feature(key: str, text: str) -> bool:
    return text.startswith(_feature_start(key))


def _feature(key: str, src: _Source, line: _Line) -> dict[str, Any]:
    """One of Gemma's facts (`FEATURE_FACTS`): its spec field at the value a model with it has."""
    fact, text = FEATURE_FACTS[key], line.text[len(INDENT) :]
    if "{}" not in fact:
        if text != fact:
            raise src.error(line.number, len(INDENT) + 1, "malformed fact", f"write '{fact}'")
        return {key: "gelu_tanh" if key == "activation" else True}
    before, after = fact.split("{}")
    if not (text.startswith(before) and text.endswith(after)) or len(text) <= len(before) + len(after):
        raise src.error(line.number, len(INDENT) + 1, "malformed fact", f"write '{fact.format('50.0')}'")
    number = text[len(before) : len(text) - len(after)]
    return {key: float(_number(src, line, number, len(INDENT) + len(before) + 1, float))}


# The facts a model may have between the rotary base and its head's table, in their fixed order: how each one's
# sentence starts, and its reader (the spec's fields it says; a malformed one refused at its line).
_OPTIONAL_FACTS: list[tuple[Callable[[str], bool], Callable[[_Source, _Line], dict[str, Any]]]] = [
    (lambda text: text.startswith("The rotary frequencies"), lambda src, line: {"rope_scaling": _scaling(src, line)}),
    (lambda text: text.startswith("The rotary embedding turns"), lambda src, line: {"rotary_dim": _rotary(src, line)}),
    (lambda text: text.startswith("Attention looks back"), _window),
    (lambda text: text.endswith(" projections add biases."), lambda src, line: {"biases": _biases(src, line)}),
    (lambda text: text.startswith("Each head of the query"), _head_norms),
    (lambda text: text.startswith("The whole query"), _projection_norms),
    (lambda text: text.startswith("Each layer's feed-forward network"), _mixture),
    *((functools.partial(_starts_feature, key), functools.partial(_feature, key)) for key in FEATURE_FACTS),
]


def _spec(src: _Source, header: _Line, values: dict, tie: bool, optional: dict[str, Any]) -> ModelSpec:
    try:
        return ModelSpec(**values, tie_embeddings=tie, **optional)
    except SpecError as error:
        raise src.error(
            header.number + 1, len(INDENT) + 1, f"the model's facts do not make a model: {error.message}"
        ) from None


def _check_canonical_facts(src: _Source, lines: list[_Line], spec: ModelSpec, chips: int | None) -> None:
    for line, canonical in zip(lines, fact_lines(spec, chips), strict=True):
        if line.text[len(INDENT) :] != canonical:
            raise src.error(
                line.number,
                len(INDENT) + 1,
                "this fact is not written the one LOGOS way",
                f"write '{canonical}'",
            )


# -- sections ---------------------------------------------------------------------------------------------------


def _split_sections(src: _Source, lines: list[_Line]) -> list[_Section]:
    sections: list[_Section] = []
    expect_blank = True
    for line in lines:
        if expect_blank:
            if line.text:
                raise src.error(line.number, 1, "expected a blank line before the next section")
            expect_blank = False
            continue
        if line.text.startswith("## "):
            if sections and not sections[-1].body:
                raise src.error(line.number, 1, "the section above has no statements")
            if sections and sections[-1].body[-1].text:
                raise src.error(line.number, 1, "expected a blank line before the next section")
            sections.append(_Section(line))
        elif not line.text:
            expect_blank = False
            if not sections or not sections[-1].body:
                raise src.error(line.number, 1, "a blank line where a section's statements should be")
            expect_blank = False
            sections[-1].body.append(line)
        elif not sections:
            raise src.error(line.number, 1, "expected a section header ('## Main', '## Layer 0 of x at position', ...)")
        elif not line.text.startswith(INDENT) or line.text[len(INDENT)] == " ":
            raise src.error(line.number, 1, "statements are indented by exactly four spaces")
        else:
            sections[-1].body.append(line)
    if not sections:
        last = lines[-1].number if lines else len(src.lines) - 1
        raise src.error(last, 1, "the program has no sections", "write '## Main' and its statements")
    # A blank line separates sections; it is recorded as the end of the section before it.
    for section in sections:
        while section.body and not section.body[-1].text:
            section.body.pop()
        if not section.body:
            raise src.error(section.header.number, 1, "this section has no statements")
        if any(not line.text for line in section.body):
            blank = next(line for line in section.body if not line.text)
            raise src.error(blank.number, 1, "a blank line inside a section")
    return sections


_HEADERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"## Main"), "main"),
    (re.compile(r"## Embedding of (\S+)"), "embedding"),
    (re.compile(r"## Layer (\S+) of (\S+) at (\S+)"), "layer"),
    (re.compile(r"## Head of (\S+)"), "head"),
]


class _Reader:
    """Reads the sections of one program into `func.func` ops."""

    def __init__(self, src: _Source, cut: Cut, spec: ModelSpec, chips: int | None):
        self.src, self.cut, self.spec, self.chips = src, cut, spec, chips
        self.rows = cut.rows or 1
        self.functions: dict[str, func.FuncOp] = {}

    def read(self, sections: list[_Section]) -> logos.ProgramOp:
        plans = [self._plan(s) for s in sections]
        if plans[0][0] != "main":
            raise self.src.error(sections[0].header.number, 1, "the first section must be '## Main'")
        seen: dict[str, int] = {}
        for (sym, _), section in zip(plans, sections, strict=True):
            if sym in seen:
                raise self.src.error(
                    section.header.number,
                    1,
                    f"a second section for {_sym_title(sym)}",
                    f"the first is on line {seen[sym]}",
                )
            seen[sym] = section.header.number
        for (sym, args), section in zip(plans[1:], sections[1:], strict=True):
            self.functions[sym] = self._section(sym, args, section)
        main = self._section("main", [], sections[0])
        ordered = [main] + [self.functions[sym] for sym, _ in plans[1:]]
        split = self.chips is not None
        return builder.program(self.cut.option(), self.spec, ordered, self.chips or 1, split)

    # -- headers ----------------------------------------------------------------------------------------------

    def _plan(self, section: _Section) -> tuple[str, list[tuple[str, Attribute]]]:
        line = section.header
        for pattern, kind in _HEADERS:
            match = pattern.fullmatch(line.text)
            if match:
                return self._header_args(line, kind, match)
        raise self.src.error(
            line.number,
            1,
            f"unknown section '{line.text}'",
            "sections are '## Main', '## Embedding of token', '## Layer 0 of x at position' and '## Head of x'",
        )

    def _header_args(self, line: _Line, kind: str, match: re.Match[str]) -> tuple[str, list[tuple[str, Attribute]]]:
        rows, hidden = self.rows, TensorType(f32, [self.rows, self.spec.hidden])
        ids = TensorType(i64, [rows])
        first = 2 if kind == "layer" else 1
        names = [self._new_name(line, match[i], match.start(i) + 1) for i in range(first, match.re.groups + 1)]
        if kind == "main":
            return "main", []
        if kind == "embedding":
            return "embedding", [(names[0], ids)]
        if kind == "head":
            return "head", [(names[0], hidden)]
        layer = self._int(line, match[1], match.start(1) + 1)
        if layer >= self.spec.layers:
            raise self.src.error(
                line.number,
                match.start(1) + 1,
                f"layer {layer} does not exist: the model has layers 0 to {self.spec.layers - 1}",
            )
        return f"layer_{layer}", [(names[0], hidden), (names[1], ids)]

    # -- statements -------------------------------------------------------------------------------------------

    def _section(self, sym: str, args: list[tuple[str, Attribute]], section: _Section) -> func.FuncOp:
        scope = _Scope(self, SectionBuilder(sym, args, self.spec, self.chips or 1))
        for arg in scope.build.args:
            scope.names[arg.name_hint or ""] = arg
        canonical = section_header(_stub_function(sym, scope.build), lambda v: v.name_hint or "")
        if canonical != section.header.text:
            raise self.src.error(
                section.header.number,
                1,
                "this header is not written the one LOGOS way",
                f"write '{canonical}'",
            )
        body = section.body
        for index, line in enumerate(body):
            last = scope.build.block.last_op
            if line.text.startswith(INDENT + "Return "):
                if index != len(body) - 1:
                    raise self.src.error(
                        body[index + 1].number, 5, "a statement after Return", "Return ends its section"
                    )
                function = scope.return_(line)
                self._locate(scope.build.block.ops, last, line.number, len(INDENT) + 1)
                function.location = self.src.location(section.header.number, 1)
                for arg in function.body.block.args:  # a section's parameters are named in its header
                    arg.location = function.location
                return function
            scope.statement(line)
            self._locate(scope.build.block.ops, last, line.number, len(INDENT) + 1)
        last = body[-1]
        raise self.src.error(
            last.number,
            len(last.text) + 1,
            f"{_sym_title(sym)} ends without 'Return <name>.'",
            "is the file truncated?",
        )

    def _locate(self, ops: Iterable[Operation], after: Operation | None, line: int, column: int) -> None:
        """The ops a line added (those after `after`) located at that line, as MLIR locates ops it reads."""
        op = next(iter(ops), None) if after is None else after.next_op
        while op is not None:
            op.location = self.src.location(line, column)
            op = op.next_op

    def _int(self, line: _Line, text: str, column: int) -> int:
        return int(_number(self.src, line, text, column, int))

    def _new_name(self, line: _Line, name: str, column: int) -> str:
        if not NAME.fullmatch(name):
            raise self.src.error(
                line.number,
                column,
                f"'{name}' is not a LOGOS name",
                "names are lowercase letters, digits and '_', starting with a letter",
            )
        if _SUFFIX.search(name):
            raise self.src.error(
                line.number,
                column,
                f"a name may not end in '_' and digits: '{name}'",
                f"write e.g. '{_SUFFIX.sub(lambda m: m[0][1:], name)}'",
            )
        return name


def _sym_title(sym: str) -> str:
    """How diagnostics name a section: 'layer 3', 'the embedding', 'the main section'."""
    if sym.startswith("layer_"):
        return f"layer {sym[6:]}"
    return "the main section" if sym == "main" else f"the {sym}"


def _stub_function(sym: str, build: SectionBuilder) -> func.FuncOp:
    """A function with only the arguments of `build`, for printing its header."""
    from xdsl.ir import Block, Region

    block = Block(arg_types=[a.type for a in build.args])
    for new, old in zip(block.args, build.args, strict=True):
        new.name_hint = old.name_hint
    return func.FuncOp(sym, ([a.type for a in build.args], []), Region(block))


# -- one section's statements -----------------------------------------------------------------------------------

_LET = re.compile(r"    Let (\S+) be (.+)\.")
_WRITE = re.compile(r"    Write (\S+) into (\S+) at (\S+)\.")
_RETURN = re.compile(r"    Return (\S+)\.")
_SHAPE = r"(\S+(?: by \S+)*)"
_EXPRESSIONS: dict[str, tuple[re.Pattern[str], str]] = {
    "input": (
        re.compile(r"the input (token|tokens|position|positions) (\S+(?:, \S+)*)"),
        "the input token 1 / the input positions 1, 2, 3",
    ),
    "hidden": (re.compile(rf"the input hidden state of {_SHAPE}"), "the input hidden state of 1 by 64"),
    "embedding": (re.compile(r"the embedding of (\S+)"), "the embedding of token"),
    "head": (re.compile(r"the head of (\S+)"), "the head of x2"),
    "weight": (
        re.compile(rf'the weight "([^"]*)" of {_SHAPE}(?:, split by (\S+) over the chips)?(?:, stored in (.+))?'),
        'the weight "model.norm.weight" of 64',
    ),
    "cache": (
        re.compile(r"the (key|value) cache of layer (\S+), with (.+?)(?:, split by (\S+) over the chips)?"),
        "the key cache of layer 0, with 2 heads by 64 positions by 16 numbers",
    ),
    "rows": (re.compile(r"the rows of (\S+) at (\S+)"), "the rows of table at token"),
    "RMS": (
        re.compile(r"the RMS norm of (each head of )?(\S+) with (one plus )?(\S+)"),
        "the RMS norm of x with attention_norm (of each head: 'the RMS norm of each head of query with query_norm')",
    ),
    "attention": (
        re.compile(
            r"the attention of (\S+) over (\S+) and (\S+?)"
            r"(?: up to (\S+)(?:, within the last (\S+) positions)?(?:, scaling its scores by (\S+))?"
            r"(?:, soft-capping its scores at (\S+))?|(, with no history))"
        ),
        "the attention of turned_query over keys and values up to position",
    ),
    "SiLU": (re.compile(r"the SiLU of (\S+)"), "the SiLU of gate"),
    "tanh-approximated": (re.compile(r"the tanh-approximated GELU of (\S+)"), "the tanh-approximated GELU of gate"),
    "soft-capped": (re.compile(r"(\S+) soft-capped at (\S+)"), "capped_logits soft-capped at 30.0"),
    "scaled": (re.compile(r"(\S+) scaled by (\S+)"), "hidden scaled by 8.0"),
    "arg-max": (re.compile(r"the arg-max of (\S+)"), "the arg-max of logits"),
    "sum": (re.compile(r"the sum over the chips of (\S+)"), "the sum over the chips of projected_part"),
    "concatenation": (
        re.compile(r"the concatenation over the chips of (\S+)"),
        "the concatenation over the chips of logits_part",
    ),
    "share": (re.compile(r"the share on this chip of (\S+)"), "the share on this chip of normed_query"),
    "layer": (re.compile(r"layer (\S+) of (\S+) at (\S+)"), "layer 0 of x0 at position"),
    "row": (re.compile(r"row (\S+) of (\S+)"), "row 4 of x"),
    "mixture": (
        re.compile(
            r"the mixture of the experts (\S+), (\S+) and (\S+) applied to (\S+), routed by (\S+) to the best (\S+)"
            rf"({re.escape(RENORMALIZED)})?"
        ),
        "the mixture of the experts gate_weights, up_weights and down_weights applied to normed_mixed, routed by"
        " router_logits to the best 2",
    ),
    "applied": (re.compile(r"(\S+) applied to (\S+)"), "query_weight applied to normed"),
    "rotated": (re.compile(r"(\S+) rotated to (\S+?)(?:, with base (\S+))?"), "query rotated to position"),
    "plus": (re.compile(r"(\S+) plus (\S+)"), "x plus projected"),
    "times": (re.compile(r"(\S+) times (\S+)"), "activated times up"),
    "with": (re.compile(r"(\S+) with (\S+) added to each row"), "unbiased_query with query_bias added to each row"),
}
_LAYOUT = re.compile(r"(?:(\S+) sequences? by )?(\S+) heads? by (\S+) positions? by (\S+) numbers?")


def _expression_kind(expr: str) -> str | None:
    words = expr.split(" ", 3)
    if words[0] == "the" and len(words) > 1:
        if words[1] == "input":
            return "hidden" if expr.startswith("the input hidden") else "input"
        if words[1] in ("key", "value"):
            return "cache"
        return words[1] if words[1] in _EXPRESSIONS else None
    if words[0] in ("layer", "row"):
        return words[0]
    if len(words) >= 3 and words[1] in ("applied", "rotated", "plus", "times", "with", "soft-capped", "scaled"):
        return words[1]
    return None


class _Scope:
    """The names of one section and the builder its statements go into."""

    def __init__(self, reader: _Reader, build: SectionBuilder):
        self.reader, self.src, self.build, self.spec = reader, reader.src, build, reader.spec
        self.names: dict[str, SSAValue] = {}
        self.line: _Line = _Line(0, "")
        self.offset = 0  # column (from 0) where the current expression starts

    # -- entry points -----------------------------------------------------------------------------------------

    def statement(self, line: _Line) -> None:
        self.line = line
        if line.text.startswith(INDENT + "Write "):
            return self._write(line)
        match = _LET.fullmatch(line.text)
        if not match:
            if not line.text.endswith("."):
                raise self.src.error(line.number, len(line.text) + 1, "a statement ends with a period")
            raise self.src.error(line.number, 5, "expected 'Let <name> be <expression>.', 'Write ...' or 'Return ...'")
        name = self.reader._new_name(line, match[1], match.start(1) + 1)
        if name in self.names:
            raise self.src.error(
                line.number,
                match.start(1) + 1,
                f"'{name}' is already defined in this section",
                "each name is given once (LOGOS values are never reassigned)",
            )
        self.offset = match.start(2)
        value = self._expression(name, match[2])
        self.names[name] = value
        self._check_canonical(value.owner)  # type: ignore[arg-type]

    def return_(self, line: _Line) -> func.FuncOp:
        self.line = line
        match = _RETURN.fullmatch(line.text)
        if not match:
            if not line.text.endswith("."):
                raise self.src.error(line.number, len(line.text) + 1, "a statement ends with a period")
            raise self.src.error(line.number, 5, "expected 'Return <name>.'")
        value = self._use(match[1], match.start(1))
        function = self.build.ret(value)
        self._verify(function.body.block.last_op)  # type: ignore[arg-type]
        return function

    # -- expressions ------------------------------------------------------------------------------------------

    def _expression(self, name: str, expr: str) -> SSAValue:
        kind = _expression_kind(expr)
        if kind is None:
            raise self._here(0, f"unknown expression '{expr}'", "see docs/logos.md for the sentences LOGOS has")
        pattern, usage = _EXPRESSIONS[kind]
        match = pattern.fullmatch(expr)
        if not match:
            raise self._here(0, f"malformed '{kind}' expression", f"write e.g. '{usage}'")
        value = getattr(self, "_" + kind.replace("-", "_"))(name, match)
        self._verify(value.owner)  # type: ignore[arg-type]
        return value

    def _input(self, name: str, m: re.Match[str]) -> SSAValue:
        noun = m[1].rstrip("s")
        items = m[2].split(", ")
        values, column = [], m.start(2)
        for item in items:
            values.append(self._int(item, column))
            column += len(item) + 2
        limit = self.spec.vocab if noun == "token" else (self.reader.cut.ctx or 1)
        for value in values:
            if not 1 <= value <= limit:
                what = "the vocabulary" if noun == "token" else "the cache"
                raise self._here(m.start(2), f"{noun} {value} is outside {what} ({noun}s 1 to {limit}, from 1)")
        if len(values) != self.reader.rows:
            raise self._here(
                m.start(2), f"{len(values)} {noun}(s), but a {self.reader.cut} has {self.reader.rows} row(s)"
            )
        return self.build.input(name, noun, values)

    def _hidden(self, name: str, m: re.Match[str]) -> SSAValue:
        shape = self._shape(m[1], m.start(1))
        expected = (self.reader.rows, self.spec.hidden)
        if shape != expected:
            raise self._here(m.start(1), f"a hidden state here is {expected[0]} by {expected[1]}, not {_by(shape)}")
        return self.build.hidden_input(name, *shape)

    def _weight(self, name: str, m: re.Match[str]) -> SSAValue:
        tensor, shape = m[1], self._shape(m[2], m.start(2))
        expected = self.spec.weight_shape(tensor)
        if expected is None:
            raise self._here(
                m.start(1) - 1,
                f'unknown weight "{tensor}": the model has no such tensor',
                "weights are named by their Hugging Face tensor names",
            )
        if shape != expected:
            raise self._here(m.start(2), f'weight "{tensor}" is {_by(expected)} in this model, not {_by(shape)}')
        split = m[3]
        if split is not None:
            self._check_split(split, ("experts",) if len(shape) == 3 else ("rows", "columns"), m.start(3))
            axis = split_axis(split, len(shape))
            if shape[axis] % (self.reader.chips or 1):
                raise self._here(
                    m.start(3),
                    f'the {split} of "{tensor}" ({shape[axis]}) do not divide over {self.reader.chips} chips',
                )
        storage = None if m[4] is None else self._storage(tensor, shape, split, m[4], m.start(4))
        return self.build.weight(name, tensor, shape, split, storage)

    def _storage(self, tensor: str, shape: tuple[int, ...], split: str | None, words: str, start: int) -> str:
        fmt = quant.parse_sentence(words)
        if isinstance(fmt, str):
            raise self._here(start, fmt, f"say a block format, e.g. {quant.SENTENCE_EXAMPLE}")
        width = shape[-1] // (self.reader.chips or 1) if split == "columns" else shape[-1]
        if not fmt.row_fits(width):
            raise self._here(
                start,
                f'"{tensor}" cannot be stored in {fmt.name} blocks of {fmt.block}: '
                f"{'a chip' if split == 'columns' else 'a'} row of {width} numbers is not whole blocks",
            )
        return fmt.name

    def _cache(self, name: str, m: re.Match[str]) -> SSAValue:
        layer = self._int(m[2], m.start(2))
        if self.build.sym != f"layer_{layer}":
            raise self._here(m.start(2), f"the cache of layer {layer} is declared outside that layer's section")
        layout = _LAYOUT.fullmatch(m[3])
        if not layout:
            raise self._here(
                m.start(3),
                "malformed cache layout",
                "write e.g. '2 heads by 64 positions by 16 numbers' (a batch: '4 sequences by ...')",
            )
        shape = tuple(self._int(layout[i], m.start(3) + layout.start(i)) for i in range(1, 5) if layout[i] is not None)
        expected = self._cache_shape()
        if shape != expected:
            raise self._here(m.start(3), f"a {self.reader.cut} has caches of {_by(expected)}, not {_by(shape)}")
        split = m[4]
        if split is not None:
            self._check_split(split, ("heads",), m.start(4))
        return self.build.cache(name, m[1], layer, shape, split is not None)

    def _cache_shape(self) -> tuple[int, ...]:
        spec, cut = self.spec, self.reader.cut
        shape = (spec.kv_heads, cut.ctx or 1, spec.head_dim)
        return (self.reader.rows, *shape) if cut.kind.startswith("batch") else shape

    def _check_split(self, split: str, allowed: tuple[str, ...], start: int) -> None:
        if self.reader.chips is None:
            raise self._here(
                start,
                "a split, but the program runs on no chips",
                "add the fact 'The program runs on N chips.'",
            )
        if split not in allowed:
            raise self._here(start, f"cannot split by '{split}' here", f"split by {' or '.join(allowed)}")

    def _embedding(self, name: str, m: re.Match[str]) -> SSAValue:
        return self._call(name, "embedding", [(m[1], m.start(1))], m.start(0))

    def _head(self, name: str, m: re.Match[str]) -> SSAValue:
        return self._call(name, "head", [(m[1], m.start(1))], m.start(0))

    def _layer(self, name: str, m: re.Match[str]) -> SSAValue:
        layer = self._int(m[1], m.start(1))
        return self._call(name, f"layer_{layer}", [(m[2], m.start(2)), (m[3], m.start(3))], m.start(1))

    def _call(self, name: str, callee: str, args: list[tuple[str, int]], start: int) -> SSAValue:
        if self.build.sym != "main":
            raise self._here(start, "sections are called from '## Main' only")
        function = self.reader.functions.get(callee)
        if function is None:
            raise self._here(
                start,
                f"no section defines {_sym_title(callee)}",
                f"add a section '## {_sym_title(callee).removeprefix('the ').capitalize()} ...'",
            )
        values = [self._use(arg, column) for arg, column in args]
        for index, (value, expected) in enumerate(zip(values, function.function_type.inputs, strict=True)):
            if value.type != expected:
                raise self._here(
                    args[index][1],
                    f"{_sym_title(callee)} takes {_type_text(expected)} here, "
                    f"but '{args[index][0]}' is {_type_text(value.type)}",
                )
        return self.build.call(name, callee, values, function.function_type.outputs.data[0])

    def _rows(self, name: str, m: re.Match[str]) -> SSAValue:
        table, tokens = self._tensor(m[1], m.start(1)), self._ids(m[2], m.start(2))
        return self.build.embed(name, table, tokens)

    def _RMS(self, name: str, m: re.Match[str]) -> SSAValue:
        x, weight = self._tensor(m[2], m.start(2)), self._tensor(m[4], m.start(4))
        plus_one = m[3] is not None
        if plus_one != self.spec.norm_plus_one:
            fact = FEATURE_FACTS["norm_plus_one"]
            if plus_one:
                raise self._here(m.start(3), "a norm by one plus its weight, but the model's facts do not say so",
                                 f"add the fact '{fact}'")  # fmt: skip
            raise self._here(m.start(4), "the model's norms scale by one plus their weight", f"write 'one plus {m[4]}'")
        if m[1] is None:
            return self.build.rms_norm(name, x, weight, plus_one)
        if not self.spec.head_norms:
            hint = f"add the fact '{HEAD_NORMS}'"
            raise self._here(m.start(1), "an RMS norm of each head, but the model's facts do not say so", hint)
        return self.build.head_rms_norm(name, x, weight, plus_one)

    def _tanh_approximated(self, name: str, m: re.Match[str]) -> SSAValue:
        if self.spec.activation != "gelu_tanh":
            raise self._here(0, "a GELU, but the model's facts do not say its gate is one",
                             f"add the fact '{FEATURE_FACTS['activation']}'")  # fmt: skip
        return self.build.gelu_tanh(name, self._tensor(m[1], m.start(1)))

    def _soft_capped(self, name: str, m: re.Match[str]) -> SSAValue:
        cap = self._float(m[2], m.start(2))
        if cap != self.spec.final_softcap:
            said = "no soft-cap" if self.spec.final_softcap is None else f"a soft-cap at {self.spec.final_softcap!r}"
            raise self._here(m.start(2), f"the logits soft-capped at {cap!r}, but the model's facts say {said}")
        return self.build.softcap(name, self._tensor(m[1], m.start(1)), cap)

    def _scaled(self, name: str, m: re.Match[str]) -> SSAValue:
        factor = self._float(m[2], m.start(2))
        expected = self.spec.hidden**0.5
        if not self.spec.embedding_scaled or factor != expected:
            raise self._here(m.start(2), f"a scale of {factor!r}, but the model's facts say none here",
                             f"the embedding is scaled by {expected!r} where the facts say so")  # fmt: skip
        return self.build.scale(name, self._tensor(m[1], m.start(1)), factor)

    def _attention(self, name: str, m: re.Match[str]) -> SSAValue:
        query = self._tensor(m[1], m.start(1))
        if m[8] is not None:
            return self.build.self_attention(
                name, query, self._tensor(m[2], m.start(2)), self._tensor(m[3], m.start(3))
            )
        keys, values = self._cache_value(m[2], m.start(2)), self._cache_value(m[3], m.start(3))
        window = None if m[5] is None else self._int(m[5], m.start(5))
        scale = None if m[6] is None else self._float(m[6], m.start(6))
        softcap = None if m[7] is None else self._float(m[7], m.start(7))
        expected = self.spec.query_pre_attn_scalar
        if scale != (None if expected is None else expected**-0.5):
            fact = "1 / sqrt(head_dim)" if expected is None else f"{expected**-0.5!r}"
            raise self._here(m.start(6) if scale is not None else m.end(4), f"the scores' scale is {fact} here",
                             f"write ', scaling its scores by {expected**-0.5!r}'" if expected else None)  # fmt: skip
        if softcap != self.spec.attention_softcap:
            cap = self.spec.attention_softcap
            raise self._here(m.start(7) if softcap is not None else m.end(4),
                             f"the scores' soft-cap is {'none' if cap is None else repr(cap)} here",
                             f"write ', soft-capping its scores at {cap!r}'" if cap else None)  # fmt: skip
        cache = keys.owner
        if isinstance(cache, logos.CacheOp):  # the window its layer's attention has where the cache is longer
            model = self.spec.window_of(cache.layer.value.data)
            bites = model is not None and logos.tensor_shape(keys)[-2] > model
            if window != (model if bites else None):
                column = m.start(5) if window is not None else m.end(4)
                hint = f"write ', within the last {model} positions' after the position" if bites else None
                raise self._here(column, logos.window_mismatch(window, model, bites), hint)
        return self.build.attention(name, query, keys, values, self._ids(m[4], m.start(4)), window, scale, softcap)

    def _mixture(self, name: str, m: re.Match[str]) -> SSAValue:
        spec = self.spec
        if spec.experts is None:
            raise self._here(0, "a mixture of experts, but the model's facts do not say it has one",
                             f"add the fact '{mixture_fact(8, 2, True)}'")  # fmt: skip
        gate, up, down = (self._tensor(m[i], m.start(i)) for i in (1, 2, 3))
        x, logits = self._tensor(m[4], m.start(4)), self._tensor(m[5], m.start(5))
        top_k = self._int(m[6], m.start(6))
        if top_k != spec.experts_per_token:
            raise self._here(m.start(6), f"each token is routed to {top_k} experts, but the model's facts say"
                             f" {spec.experts_per_token}", f"write 'to the best {spec.experts_per_token}'")  # fmt: skip
        if (m[7] is not None) != spec.renormalize:
            said = "are" if spec.renormalize else "are not"
            hint = f"write 'to the best {top_k}{RENORMALIZED if spec.renormalize else ''}'"
            raise self._here(m.end(6), f"the model's facts say the chosen experts' weights {said} divided by their sum",
                             hint)  # fmt: skip
        return self.build.experts(name, x, logits, gate, up, down)

    def _SiLU(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.silu(name, self._tensor(m[1], m.start(1)))

    def _arg_max(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.argmax(name, self._tensor(m[1], m.start(1)))

    def _sum(self, name: str, m: re.Match[str]) -> SSAValue:
        if self.reader.chips is None:
            raise self._here(
                0,
                "a sum over the chips, but the program runs on no chips",
                "add the fact 'The program runs on N chips.'",
            )
        return self.build.all_reduce(name, self._tensor(m[1], m.start(1)))

    def _concatenation(self, name: str, m: re.Match[str]) -> SSAValue:
        if self.reader.chips is None:
            raise self._here(
                0,
                "a concatenation over the chips, but the program runs on no chips",
                "add the fact 'The program runs on N chips.'",
            )
        return self.build.all_gather(name, self._tensor(m[1], m.start(1)))

    def _share(self, name: str, m: re.Match[str]) -> SSAValue:
        if self.reader.chips is None:
            raise self._here(
                0,
                "a share on this chip, but the program runs on no chips",
                "add the fact 'The program runs on N chips.'",
            )
        return self.build.all_slice(name, self._tensor(m[1], m.start(1)))

    def _row(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.row(name, self._tensor(m[2], m.start(2)), self._int(m[1], m.start(1)))

    def _applied(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.linear(name, self._tensor(m[1], m.start(1)), self._tensor(m[2], m.start(2)))

    def _rotated(self, name: str, m: re.Match[str]) -> SSAValue:
        theta = self.spec.rope_theta if m[3] is None else self._float(m[3], m.start(3))
        layer = re.fullmatch(r"layer_([0-9]+)", self.build.sym)
        expected = self.spec.rope_theta_of(int(layer[1])) if layer else self.spec.rope_theta
        if theta != expected:
            hint = "" if expected == self.spec.rope_theta else f", with base {expected!r}"
            raise self._here(m.start(3) if m[3] else m.end(2), f"this layer rotates with base {expected!r}",
                             f"write 'rotated to {m[2]}{hint}'")  # fmt: skip
        x, positions = self._tensor(m[1], m.start(1)), self._ids(m[2], m.start(2))
        return self.build.rope(name, x, positions, theta, int(layer[1]) if layer else None)

    def _plus(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.add(name, self._tensor(m[1], m.start(1)), self._tensor(m[2], m.start(2)))

    def _times(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.mul(name, self._tensor(m[1], m.start(1)), self._tensor(m[2], m.start(2)))

    def _with(self, name: str, m: re.Match[str]) -> SSAValue:
        return self.build.bias_add(name, self._tensor(m[1], m.start(1)), self._tensor(m[2], m.start(2)))

    def _write(self, line: _Line) -> None:
        match = _WRITE.fullmatch(line.text)
        if not match:
            raise self.src.error(
                line.number,
                5,
                "malformed 'Write' statement",
                "write e.g. 'Write turned_key into keys at position.'",
            )
        self.offset = 0
        x = self._tensor(match[1], match.start(1))
        cache = self._cache_value(match[2], match.start(2))
        positions = self._ids(match[3], match.start(3))
        self.build.cache_write(x, cache, positions)
        op = self.build.block.last_op
        assert op is not None
        self._verify(op)
        self._check_canonical(op)

    # -- names and values -------------------------------------------------------------------------------------

    def _use(self, name: str, start: int) -> SSAValue:
        value = self.names.get(name)
        if value is None:
            hint = None
            if not NAME.fullmatch(name):
                hint = "names are lowercase letters, digits and '_'"
            raise self._here(start, f"'{name}' is not defined in this section", hint)
        return value

    def _tensor(self, name: str, start: int) -> SSAValue:
        value = self._use(name, start)
        if isinstance(value.type, MemRefType):
            raise self._here(start, f"'{name}' is a cache; only attention reads it and 'Write' fills it")
        if isinstance(value.type, TensorType) and value.type.element_type != f32:
            raise self._here(start, f"'{name}' holds token ids or positions, not numbers")
        return value

    def _ids(self, name: str, start: int) -> SSAValue:
        value = self._use(name, start)
        if not isinstance(value.type, TensorType) or value.type.element_type != i64:
            raise self._here(start, f"'{name}' is not token ids or positions")
        return value

    def _cache_value(self, name: str, start: int) -> SSAValue:
        value = self._use(name, start)
        if not isinstance(value.type, MemRefType):
            raise self._here(start, f"'{name}' is not a cache")
        return value

    def _int(self, text: str, start: int) -> int:
        return int(_number(self.src, self.line, text, self.offset + start + 1, int))

    def _float(self, text: str, start: int) -> float:
        return float(_number(self.src, self.line, text, self.offset + start + 1, float))

    def _shape(self, text: str, start: int) -> tuple[int, ...]:
        dims, column = [], start
        for item in text.split(" by "):
            dim = self._int(item, column)
            if dim < 1:
                raise self._here(column, f"a size must be at least 1, not {dim}")
            dims.append(dim)
            column += len(item) + 4
        return tuple(dims)

    # -- checks -----------------------------------------------------------------------------------------------

    def _here(self, start: int, message: str, hint: str | None = None) -> ParseError:
        return self.src.error(self.line.number, self.offset + start + 1, message, hint)

    def _verify(self, op: Operation) -> None:
        if isinstance(op, func.CallOp) or "grid" in op.properties:
            # Symbol lookups need the finished program: `_call` and `_check_split` check these here, and the
            # program's verification after parsing checks them again.
            return
        if not isinstance(op, logos.LogosOp):
            return  # a func.return: the section's type is made from what it returns
        try:
            op.check_()
        except VerifyException as error:
            raise self._here(0, str(error).replace(f"'{op.name}' op ", f"{op.name}: ")) from None
        except LogosError:
            raise
        except (CutError, ValueError, IndexError) as error:
            raise self._here(0, f"{op.name}: {error}") from None

    def _check_canonical(self, op: Operation) -> None:
        canonical = INDENT + sentence(op, lambda v: v.name_hint or "", self.spec)
        if canonical != self.line.text:
            raise self.src.error(
                self.line.number,
                5,
                "this statement is not written the one LOGOS way",
                f"write '{canonical.strip()}'",
            )


def _by(shape: tuple[int, ...]) -> str:
    return " by ".join(str(d) for d in shape)


def _type_text(kind: Attribute) -> str:
    if isinstance(kind, TensorType | MemRefType):
        noun = "ids" if kind.element_type == i64 else "numbers"
        return f"{_by(tuple(kind.get_shape()))} {noun}"
    return str(kind)
