"""A model's one program, and the cuts of it that backends lower.

The author (`logos_ir.author`) writes a model's computation as a LOGOS program, and every backend lowers that program
and no other. What a backend lowers is a `Cut` of it: the decode step over a cache of `ctx` positions, a prefill
chunk of `rows` tokens, a batch of `rows` sequences, the single token's forward, or one layer, the embedding or the
head of any of them. The author's `write(spec, cut)` gives its text with the placeholder inputs every backend replaces
at run time (each token and position 1; a prefill layer's rows at positions 1..rows); `write(spec, cut, tp=N)` gives
it split over chips.

A program's `Identity` is its cut, the chips it is split over and the SHA-256 of the exact text the author wrote for
it. Every artifact records `Identity.line()`, so an artifact names the program it came from, and a program written
by anyone else cannot pass for it.

This module is the bottom of the program layers (spec -> program -> author/printer -> parser -> passes -> lanes ->
tools): it names programs and imports none of the layers above. Writing a cut's text is the author's
(`logos_ir.author.write`, `written`, `written_split`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import ClassVar

from logos_ir.errors import CutError

# The fourteen kinds, each with the parameters its constructor takes, in order, and its display template.
_KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "decode": (("ctx",), "decode step, ctx {ctx}"),
    "prefill": (("rows", "ctx"), "prefill chunk of {rows} rows, ctx {ctx}"),
    "batch": (("rows", "ctx"), "batch of {rows} sequences, ctx {ctx}"),
    "forward": ((), "forward"),
    "forward_layer": (("layer",), "forward layer {layer}"),
    "forward_head": ((), "forward head"),
    "decode_embed": ((), "decode step's embedding"),
    "decode_layer": (("layer", "ctx"), "decode step's layer {layer}, ctx {ctx}"),
    "decode_head": ((), "decode step's head"),
    "batch_embed": (("rows",), "batch of {rows} sequences' embedding"),
    "batch_layer": (("layer", "rows", "ctx"), "batch of {rows} sequences' layer {layer}, ctx {ctx}"),
    "batch_head": (("rows",), "batch of {rows} sequences' head"),
    "prefill_layer": (("layer", "rows", "ctx"), "prefill chunk of {rows} rows' layer {layer}, ctx {ctx}"),
    "prefill_head": (("rows",), "prefill chunk of {rows} rows' head"),
}


def _display_pattern(template: str) -> re.Pattern[str]:
    pattern = re.escape(template)
    for name in ("ctx", "rows", "layer"):
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>0|[1-9][0-9]*)")
    return re.compile(pattern)


_DISPLAY_PATTERNS = {kind: _display_pattern(template) for kind, (_, template) in _KINDS.items()}


@dataclass(frozen=True, order=True)
class Cut:
    """Which cut of a model's program a backend lowers. Build one with the named constructors (`Cut.decode(128)`),
    read one with `Cut.parse("decode ctx=128")`. Layers count from 0, as the weights' names do."""

    kind: str
    layer: int | None = None
    rows: int | None = None
    ctx: int | None = None

    KINDS: ClassVar[tuple[str, ...]] = tuple(_KINDS)
    WHOLE: ClassVar[tuple[str, ...]] = ("decode", "prefill", "batch", "forward")
    SPLITTABLE: ClassVar[tuple[str, ...]] = ("decode", "batch", "decode_layer", "batch_layer")

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise CutError(f"unknown cut kind '{self.kind}'", hint=f"known kinds: {', '.join(_KINDS)}")
        wanted = _KINDS[self.kind][0]
        for name in ("layer", "rows", "ctx"):
            value = getattr(self, name)
            if (value is None) == (name in wanted):
                need = "needs" if value is None else "takes no"
                raise CutError(f"cut '{self.kind}' {need} '{name}'")
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise CutError(f"cut '{self.kind}': '{name}' must be an integer, not {value!r}")
            least = 0 if name == "layer" else 1
            if value < least:
                raise CutError(f"cut '{self.kind}': '{name}' must be at least {least}, not {value}")
        if self.kind in ("prefill", "prefill_layer") and self.rows is not None and self.ctx is not None:
            if self.rows > self.ctx:
                raise CutError(f"a prefill chunk of {self.rows} rows does not fit a cache of {self.ctx} positions")

    # -- the fourteen constructors --------------------------------------------------------------------------------

    @classmethod
    def decode(cls, ctx: int) -> Cut:
        return cls("decode", ctx=ctx)

    @classmethod
    def prefill(cls, rows: int, ctx: int) -> Cut:
        return cls("prefill", rows=rows, ctx=ctx)

    @classmethod
    def batch(cls, rows: int, ctx: int) -> Cut:
        return cls("batch", rows=rows, ctx=ctx)

    @classmethod
    def forward(cls) -> Cut:
        return cls("forward")

    @classmethod
    def forward_layer(cls, layer: int) -> Cut:
        return cls("forward_layer", layer=layer)

    @classmethod
    def forward_head(cls) -> Cut:
        return cls("forward_head")

    @classmethod
    def decode_embed(cls) -> Cut:
        return cls("decode_embed")

    @classmethod
    def decode_layer(cls, layer: int, ctx: int) -> Cut:
        return cls("decode_layer", layer=layer, ctx=ctx)

    @classmethod
    def decode_head(cls) -> Cut:
        return cls("decode_head")

    @classmethod
    def batch_embed(cls, rows: int) -> Cut:
        return cls("batch_embed", rows=rows)

    @classmethod
    def batch_layer(cls, layer: int, rows: int, ctx: int) -> Cut:
        return cls("batch_layer", layer=layer, rows=rows, ctx=ctx)

    @classmethod
    def batch_head(cls, rows: int) -> Cut:
        return cls("batch_head", rows=rows)

    @classmethod
    def prefill_layer(cls, layer: int, rows: int, ctx: int) -> Cut:
        return cls("prefill_layer", layer=layer, rows=rows, ctx=ctx)

    @classmethod
    def prefill_head(cls, rows: int) -> Cut:
        return cls("prefill_head", rows=rows)

    # -- text forms -----------------------------------------------------------------------------------------------

    @property
    def params(self) -> dict[str, int]:
        """The constructor's arguments, in its order."""
        return {name: getattr(self, name) for name in _KINDS[self.kind][0]}

    def __str__(self) -> str:
        return _KINDS[self.kind][1].format(**self.params)

    def option(self) -> str:
        """The option form command lines use: `decode_layer layer=3 ctx=128`."""
        return " ".join([self.kind, *(f"{k}={v}" for k, v in self.params.items())])

    @classmethod
    def parse(cls, text: str) -> Cut:
        """Read the option form: the constructor's name, then its arguments as `key=value` in its order."""
        words = text.split()
        if not words:
            raise CutError("empty cut", hint="write e.g. 'decode ctx=128' or 'decode_layer layer=3 ctx=128'")
        kind, args = words[0], words[1:]
        if kind not in _KINDS:
            raise CutError(f"unknown cut '{kind}' in '{text}'", hint=f"known cuts: {', '.join(_KINDS)}")
        wanted = _KINDS[kind][0]
        usage = " ".join([kind, *(f"{name}=N" for name in wanted)])
        if len(args) != len(wanted):
            given = [arg.partition("=")[0] for arg in args]
            extra = [k for k in given if k not in wanted]
            missing = [k for k in wanted if k not in given]
            why = "".join(
                [
                    f": {', '.join(repr(k) for k in extra)} is not one of them" if extra else "",
                    f"; {', '.join(repr(k) for k in missing)} missing" if missing else "",
                ]
            )
            raise CutError(
                f"cut '{text}' needs {len(wanted)} argument(s) ({', '.join(wanted) or 'none'}){why}",
                hint=f"write '{usage}'",
            )
        values: dict[str, int] = {}
        for arg, name in zip(args, wanted, strict=True):
            key, eq, value = arg.partition("=")
            if key != name or not eq:
                raise CutError(f"cut '{text}': expected '{name}=N', got '{arg}'", hint=f"write '{usage}'")
            if not value.isdigit() or not value.isascii():
                raise CutError(f"cut '{text}': '{name}' must be a whole number, not '{value}'")
            if len(value.lstrip("0")) > 13 or int(value) > 2**40:  # past any machine's memory; and past i64 in the IR
                raise CutError(f"cut '{text}': '{name}' {value} is too large (at most {2**40})")
            values[name] = int(value)
        return cls(kind, **values)

    @classmethod
    def from_display(cls, text: str) -> Cut | None:
        """The cut whose display text is exactly `text`, or None."""
        for kind, pattern in _DISPLAY_PATTERNS.items():
            match = pattern.fullmatch(text)
            if match:
                values = {k: int(v) for k, v in match.groupdict().items()}
                cut = cls(kind, **values)
                return cut if str(cut) == text else None
        return None

    # -- what a cut is made of ------------------------------------------------------------------------------------

    @property
    def whole(self) -> Cut | None:
        """The whole program this cut is part of (itself for a whole program), or None when the part does not say
        (a decode head has no ctx; a batch head has no ctx)."""
        family = self.kind.split("_")[0]
        if family == "forward":
            return Cut.forward()
        if family == "decode":
            return None if self.ctx is None else Cut.decode(self.ctx)
        if self.rows is None or self.ctx is None:
            return None
        return Cut(family, rows=self.rows, ctx=self.ctx)

    def part_of(self, whole: Cut) -> bool:
        """Whether `whole` contains this cut: same family, same rows, same ctx where this cut has them."""
        if whole.kind not in Cut.WHOLE or whole.kind != self.kind.split("_")[0]:
            return False
        return all(getattr(self, name) in (None, getattr(whole, name)) for name in ("rows", "ctx"))

    def parts(self, layers: int) -> list[Cut]:
        """The parts of this whole program, of `layers` layers, in model order: its embedding, each layer, its head.
        A prefill chunk and a forward have no embedding part (no cut names it); a part has no parts."""
        rows, ctx, each = self.rows or 1, self.ctx or 1, range(layers)
        if self.kind == "decode":
            return [Cut.decode_embed(), *(Cut.decode_layer(i, ctx) for i in each), Cut.decode_head()]
        if self.kind == "batch":
            return [Cut.batch_embed(rows), *(Cut.batch_layer(i, rows, ctx) for i in each), Cut.batch_head(rows)]
        if self.kind == "prefill":
            return [*(Cut.prefill_layer(i, rows, ctx) for i in each), Cut.prefill_head(rows)]
        if self.kind == "forward":
            return [*(Cut.forward_layer(i) for i in each), Cut.forward_head()]
        return []


@dataclass(frozen=True)
class Identity:
    """The program an artifact was lowered from: its cut, the chips it is split over (1 when it is not) and the
    SHA-256 of the LOGOS text written for it."""

    cut: Cut
    chips: int
    sha256: bytes = field(repr=False)

    @classmethod
    def of(cls, cut: Cut, source: str) -> Identity:
        """The identity of `source`, written as the cut `cut` on one chip."""
        return cls.of_split(cut, 1, source)

    @classmethod
    def of_split(cls, cut: Cut, chips: int, source: str) -> Identity:
        """The identity of `source`, written as the cut `cut` split over `chips` chips."""
        return cls(cut, chips, hashlib.sha256(source.encode("utf-8")).digest())

    def hex(self) -> str:
        """The digest as 64 lowercase hex digits."""
        return self.sha256.hex()

    def line(self) -> str:
        """The one line every artifact records: `LOGOS program: <cut>, sha256 <hex>`, the cut said to be split over
        its chips when it is."""
        over = "" if self.chips == 1 else f" over {self.chips} chips"
        return f"LOGOS program: {self.cut}{over}, sha256 {self.hex()}"

    _LINE = re.compile(
        r"LOGOS program: (?P<cut>.+?)(?: over (?P<chips>[1-9][0-9]*) chips)?, sha256 (?P<hex>[0-9a-f]{64})"
    )

    @classmethod
    def from_line(cls, line: str) -> Identity | None:
        """The identity an artifact's header line records, or None when `line` is not an identity line."""
        match = cls._LINE.fullmatch(line.strip())
        if not match:
            return None
        cut = Cut.from_display(match["cut"])
        if cut is None:
            return None
        return cls(cut, int(match["chips"] or 1), bytes.fromhex(match["hex"]))
