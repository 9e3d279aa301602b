"""The engine's pipelined loops as data: for each routine of `engine.cl` (`emit_opencl.py` prints them), the loops
it marks `/* loop NAME */`, with the `for` header it prints, what each iteration carries and how many times each
runs for an instruction word: the trip counts, which depend on the instruction word. What each iteration costs
(unrolls, carried results, ports, channels) the cost model reads from the printed source itself (`aoc_report.py`);
a test checks that each loop here is printed, with this header, under its mark.

A routine is a function of the engine's constants (the `#define`s `engine_constants` gives the emitter), one
instruction word (16 fields, `d5005.W_*`), the step's token and position and, for a bank reader, its bank; it returns
its outermost loops. A loop whose inner loops' bounds change from one iteration to the next gives them per iteration
(`inner_of`): its iterations cannot overlap, so each inner loop's invocation pays its fill and drain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from logos_ir.dialects import d5005
from logos_ir.numerics import ceil_div


@dataclass(frozen=True)
class Loop:
    """One pipelined loop: its name (its mark in the source), the `for` header printed under the mark, and its
    trip count for the word being costed. What an iteration costs is read from the source (`aoc_report`)."""

    name: str
    header: str
    trips: int
    inner: tuple[Loop, ...] = ()
    inner_of: Callable[[int], tuple[Loop, ...]] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Step:
    """What a routine's trip counts read: the engine's constants, the instruction word, the token, the position and
    (for a bank reader) the bank."""

    constants: dict[str, int]
    word: list[int]
    token: int
    position: int
    bank: int = 0

    def __getitem__(self, name: str) -> int:
        return self.constants[name]

    def has(self, feature: str) -> bool:
        """Whether the engine was printed with an optional part (its `#define ENGINE_... 1`)."""
        return self.constants.get(feature, 0) == 1

    def field(self, index: int) -> int:
        return self.word[index]

    def words(self, elements: int, element_bytes: int) -> int:
        """Bank words (bursts) of `elements` of `element_bytes`: the source's WORDS(n, bytes)."""
        return ceil_div(elements * element_bytes, self["BURST_BYTES"])

    @property
    def stored(self) -> str:
        """The block format the word's weight streams in (an embedding row's or a matvec's, in an engine with
        weights as stored), or "": the image's floats."""
        if not self.has("ENGINE_STORED"):
            return ""
        return {code: f for f, code in d5005.STORED_FORMATS.items()}.get(self.field(d5005.W_FORMAT), "")

    def row_words(self) -> int:
        """Bank words of one row of the word's weight: the source's ROW_WORDS(cols, w.s3), as stored (whole
        groups of scale and code words, `d5005.stored_row_words`) or of the image's floats."""
        cols = self.field(d5005.W_COLS)
        if self.stored:
            return d5005.stored_row_words(cols, self.stored, self["BURST_BYTES"])
        return self.words(cols, self["WEIGHT_BYTES"])

    @property
    def rotary(self) -> int:
        """The numbers of each head a rope rotates: the source's `rotary` (w.sa, or the head's w.sb)."""
        rotary = self.field(d5005.W_ROTARY) if self.has("ENGINE_PARTIAL_ROTARY") else 0
        return rotary or self.field(d5005.W_HEAD_DIM)

    @property
    def window_start(self) -> int:
        """The first cache row (from 0) an attention reads: the source's `low` (0 with no window, w.s3 = 0)."""
        window = self.field(d5005.W_WINDOW) if self.has("ENGINE_WINDOW") else 0
        return self.position - window if window and self.position > window else 0

    @property
    def ov(self) -> int:
        """float32 words of one bank word (the source's OV)."""
        return self["BURST_BYTES"] // 4

    @property
    def cpw(self) -> int:
        """Cache elements in one bank word (the source's CPW)."""
        return self["BURST_BYTES"] // self["CACHE_BYTES"]


Routine = Callable[[Step], list[Loop]]


def _counted(name: str, var: str, bound: str, trips: int, step: str = "", **kind: object) -> Loop:
    """A loop `for (uint var = 0; var < bound; var++ or var += step)` of `trips` iterations."""
    advance = f"{var} += {step}" if step else f"{var}++"
    return Loop(name, f"for (uint {var} = 0; {var} < {bound}; {advance})", trips, **kind)  # type: ignore[arg-type]


def _by_ov(name: str, bound: str, count: int, s: Step, **kind: object) -> Loop:
    """A loop over `count` float32 words, a bank word of them an iteration."""
    return _counted(name, "c", bound, ceil_div(count, s.ov), "OV", **kind)


# -- the bank readers: one burst an iteration --------------------------------------------------------------------


def read_embed_row(s: Step) -> list[Loop]:
    row = s.token - 1
    words = s.row_words() if row % s["BANKS"] == s.bank else 0
    return [_counted("read_embed_row.words", "c", "words", words)]


def read_matvec(s: Step) -> list[Loop]:
    """Bank 0's words of the bias first (in an engine with biases; none where the word has none), then this
    bank's rows."""
    rows, bias = s.field(d5005.W_ROWS), s.field(d5005.W_BIAS)
    mine = (rows + s["BANKS"] - 1 - s.bank) // s["BANKS"]
    bias_words = s.words(bias, s["WEIGHT_BYTES"]) if s.bank == 0 else 0
    biased = [_counted("read_matvec.bias", "c", "bias_words", bias_words)] if s.has("ENGINE_BIAS") else []
    return [*biased, _counted("read_matvec.words", "n", "mine * words", mine * s.row_words())]


def read_rms_norm(s: Step) -> list[Loop]:
    words = s.words(s.field(d5005.W_COLS), s["WEIGHT_BYTES"]) if s.bank == 0 else 0
    return [_counted("read_rms_norm.words", "c", "words", words)]


def read_rope(s: Step) -> list[Loop]:
    """The table's row from its bank, then (in an engine that norms heads) bank 0's words of the norm's weight."""
    row = s.position - 1
    words = 2 * s.words(s.rotary // 2, 4) if row % s["BANKS"] == s.bank else 0
    loops = [_counted("read_rope.words", "c", "words", words)]
    if s.has("ENGINE_HEAD_NORM"):
        normed = s.bank == 0 and s.field(d5005.W_HEAD_NORM)
        norm_words = s.words(s.field(d5005.W_HEAD_DIM), s["WEIGHT_BYTES"]) if normed else 0
        loops.append(_counted("read_rope.norm", "c", "norm_words", norm_words))
    return loops


def read_attention(s: Step) -> list[Loop]:
    """Head h's earlier positions in this bank, each row's key words then its value words (the bounds change
    with h)."""
    banks, ctx, past, low = s["BANKS"], s.field(d5005.W_CTX), s.position - 1, s.window_start
    row_words = s.words(s.field(d5005.W_HEAD_DIM), s["CACHE_BYTES"])

    def head(h: int) -> tuple[Loop, ...]:
        first = low + (s.bank - h * ctx - low) % banks
        mine = (past - first + banks - 1) // banks if past > first else 0
        return (_counted("read_attention.rows", "n", "mine * 2 * row_words", mine * 2 * row_words),)

    kv_heads = d5005.attention_counts(s.word)[1]
    return [Loop("read_attention.kv_heads", "for (uint h = 0; h < kv_heads; h++)", kv_heads, inner_of=head)]


# -- the compute kernel's routines -------------------------------------------------------------------------------


def embed_row(s: Step) -> list[Loop]:
    """A bank word of the row an iteration (a stored row's code words dequantized OV numbers at a time, a loop left
    serial in it: the source reads it)."""
    return [_counted("embed_row.words", "c", "words", s.row_words())]


def matvec(s: Step) -> list[Loop]:
    """The input copied on chip, then rows 4i .. 4i+3 a word of each bank a cycle, summed in shift registers."""
    rows, words = s.field(d5005.W_ROWS), s.row_words()
    row_words = _counted("matvec.words", "c", "words", words)
    bias = s.field(d5005.W_BIAS)
    bias_words = s.words(bias, s["WEIGHT_BYTES"])
    biased = [_counted("matvec.bias", "c", "bias_words", bias_words)] if s.has("ENGINE_BIAS") else []
    first = s.field(d5005.W_FIRST) if s.has("ENGINE_COLUMNS") else 0  # a part after the first: dst copied first
    prior = [_by_ov("matvec.prior", "prior_count", rows if first else 0, s)] if s.has("ENGINE_COLUMNS") else []
    if s.has("ENGINE_STORED"):  # the copy spans the input's columns for a stored row (a float row's words else)
        span = s.field(d5005.W_COLS) if s.stored else words * s["VECTOR_WIDTH"]
        load = _by_ov("matvec.load", "span", span, s)
    else:
        load = _by_ov("matvec.load", "words * VECTOR_WIDTH", words * s["VECTOR_WIDTH"], s)
    return [
        load,
        *biased,
        *prior,
        _counted("matvec.rows", "i", "quads", ceil_div(rows, s["BANKS"]), inner=(row_words,)),
    ]


def rms_norm(s: Step) -> list[Loop]:
    n = s.field(d5005.W_COLS)
    return [
        _by_ov("rms_norm.squares", "n", n, s),
        _counted("rms_norm.scale", "c", "words", s.words(n, s["WEIGHT_BYTES"])),
    ]


def rope(s: Step) -> list[Loop]:
    """The table's row, then each head's two halves rotated a bank word of floats at a time."""
    head_dim, rotary = s.field(d5005.W_HEAD_DIM), s.rotary
    rotate = _by_ov("rope.rotate", "mid", rotary // 2, s)
    table = _counted("rope.table", "c", "words", 2 * s.words(rotary // 2, 4))
    heads = s.field(d5005.W_WIDTH) // head_dim
    kept = [_by_ov("rope.pass", "rest", head_dim - rotary, s)]
    kept = kept if s.has("ENGINE_PARTIAL_ROTARY") else []  # the numbers past the rotary part, passed through
    if not s.has("ENGINE_HEAD_NORM"):
        return [table, _counted("rope.heads", "head", "heads", heads, inner=(rotate, *kept))]
    normed = s.field(d5005.W_HEAD_NORM)  # the norm's weight, then each head's squares before its rotation
    norm = _counted("rope.norm", "c", "norm_words", s.words(head_dim, s["WEIGHT_BYTES"]) if normed else 0)
    squares = _by_ov("rope.squares", "squared", head_dim // 2 if normed else 0, s)
    return [table, norm, _counted("rope.heads", "head", "heads", heads, inner=(squares, rotate, *kept))]


def cache_write(s: Step) -> list[Loop]:
    words = _counted("cache_write.words", "c", "words", s.words(s.field(d5005.W_COLS), s["CACHE_BYTES"]))
    return [_counted("cache_write.heads", "h", "kv_heads", s.field(d5005.W_KV_HEADS), inner=(words,))]


def attention(s: Step) -> list[Loop]:
    """One KV head at a time: its group's queries on chip (with their products with the position's own key),
    then one pass over its earlier rows, each row's key words then its value words, then the output, a bank word
    of one query head's an iteration."""
    heads, kv_heads, _ = d5005.attention_counts(s.word)
    group = heads // max(kv_heads, 1)
    start = s.window_start // s["BANKS"] * s["BANKS"]  # the row of four holding the window's first row
    quads = ceil_div(s.position - 1 - start, s["BANKS"])
    row_words = s.words(s.field(d5005.W_HEAD_DIM), s["CACHE_BYTES"])
    inner = (
        _counted("attention.queries", "i", "row_words", row_words),
        _counted("attention.rows", "n", "quads * 2 * row_words", quads * 2 * row_words),
        _counted("attention.output", "n", "group * row_words", group * row_words),
    )
    return [_counted("attention.kv_heads", "h", "kv_heads", kv_heads, inner=inner)]


def silu_mul(s: Step) -> list[Loop]:
    return [_by_ov("silu_mul.words", "n", s.field(d5005.W_ROWS), s)]


def add(s: Step) -> list[Loop]:
    return [_by_ov("add.words", "n", s.field(d5005.W_ROWS), s)]


def argmax(s: Step) -> list[Loop]:
    return [_by_ov("argmax.words", "n", s.field(d5005.W_ROWS), s)]


def route(s: Step) -> list[Loop]:
    """The logits' maximum, their exponentials and sum, top_k scans over the experts, then the ids' bank words
    (an engine without experts prints none of it)."""
    if not s.has("ENGINE_EXPERTS"):
        return []
    experts, top_k = s.field(d5005.W_ROUTE_EXPERTS), s.field(d5005.W_COLS)
    scan = _by_ov("route.scan", "experts", experts, s)
    return [
        _by_ov("route.most", "experts", experts, s),
        _by_ov("route.exp", "experts", experts, s),
        _counted("route.choose", "j", "top_k", top_k, inner=(scan,)),
        _counted("route.ids", "c", "WORDS(top_k, 4)", s.words(top_k, 4)),
    ]


def expert_sum(s: Step) -> list[Loop]:
    if not s.has("ENGINE_EXPERTS"):
        return []
    return [_by_ov("expert_sum.words", "n", s.field(d5005.W_ROWS), s)]


# Each opcode's routine in the compute kernel and, for those that stream board memory, in the bank readers.
COMPUTE: dict[str, Routine] = {
    "embed_row": embed_row,
    "matvec": matvec,
    "rms_norm": rms_norm,
    "rope": rope,
    "cache_write": cache_write,
    "attention": attention,
    "silu_mul": silu_mul,
    "add": add,
    "argmax": argmax,
    "route": route,
    "expert_sum": expert_sum,
}
READERS: dict[str, Routine] = {
    "embed_row": read_embed_row,
    "matvec": read_matvec,
    "rms_norm": read_rms_norm,
    "rope": read_rope,
    "attention": read_attention,
}
# The fields of an instruction word any trip count reads: words equal in these cost the same.
TRIP_FIELDS = (
    d5005.W_OPCODE,
    d5005.W_ROWS,
    d5005.W_COLS,
    d5005.W_HEADS,
    d5005.W_KV_HEADS,
    d5005.W_HEAD_DIM,
    d5005.W_CTX,
    d5005.W_WIDTH,
    d5005.W_WINDOW,
)
