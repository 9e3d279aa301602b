"""What `aoc`'s reports would say of an `engine.cl`, read from the printed source itself: the aoc form of the text
(the preprocessor run with `INTELFPGA_CL` defined), then, for each pipelined loop (`/* loop NAME */`), its unroll
factors, the loop-carried floating-point dependencies (a scalar or a shift register in registers, an update through
on-chip memory and the `ivdep`/`ivdep safelen` that governs it), the serial loops left inside it, the channel reads
of an iteration, and the access sites of each on-chip array, banked as `aoc` banks it, against the ports a bank
gives. The cost model (`cost_model.py`) turns these into cycles; nothing here is taken from the emitter's data.

The rules are those of Intel's FPGA SDK for OpenCL Best Practices Guide (docs/d5005.md gives the section for each):

* an `UNROLL(n)` loop of constant bound is copied n times within one iteration of the loop around it; a loop
  without it (or of a bound `aoc` cannot know) runs serially inside that iteration;
* a float updated from its own value across iterations (`s += x`, `s = fmax(s, x)`) is carried at distance 1; a
  shift register (`r[D] = r[0] + x`, then `r[d] = r[d + 1]`) at distance D; an update of an on-chip array at an
  index that does not follow the loop's induction variable (`acc[slot] += x`) is carried through memory, at the
  distance `ivdep safelen(n)` states, at distance 1 with no pragma, and unchecked under a bare `ivdep` (a hazard:
  `aoc` is told there is no dependence that there is);
* an on-chip array is banked on the low bits of its address, as far as every access site's bank is known when the
  engine is built (`numbanks` says how many banks; with no attribute `aoc` banks as far as the sites allow); a site
  whose bank depends on a run-time value reaches every bank. A bank gives PORTS ports per copy; stores take a port
  on every copy, loads share the rest over as many copies as the M20K budget holds; a bank whose sites do not fit
  is arbitrated, and a loop that touches it issues PORTS of its accesses a cycle.
"""

from __future__ import annotations

import ast
import functools
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

M20K_WORDS = 512  # float32 words of one M20K block (512 x 40 bits): Stratix 10 Embedded Memory User Guide
M20K_BLOCKS = 11721  # M20K blocks of the Stratix 10 SX 2800 (Stratix 10 device overview: 229 Mbit)
M20K_USABLE = 0.75  # share of them the kernels may use (the BSP's static region takes the rest): an assumption
PORTS = 4  # ports of one copy of a bank: an M20K's two, double-pumped (Best Practices Guide, local memory)
AUTO_BANKS_MAX = 64  # the most banks aoc splits an unattributed array into: an assumption


class ReportError(Exception):
    """The source has something the reader cannot cost (a loop header it cannot read, an unbalanced brace)."""


# -- the aoc form of the source ----------------------------------------------------------------------------------


def aoc_form(source: str) -> str:
    """The source as `aoc` compiles it: `INTELFPGA_CL` defined, each `#if`/`#else`/`#endif` resolved against the
    numeric `#define`s before it (only `defined(X)`, `!defined(X)` and `NAME == N` occur)."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch taken, parent taken)
    numbers: dict[str, int] = {"INTELFPGA_CL": 1}
    for line in source.splitlines():
        stripped = line.strip()
        taking = all(t for t, _ in stack)
        if stripped.startswith("#if"):
            stack.append((taking and _condition(stripped[3:], numbers), taking))
            continue
        if stripped.startswith("#else"):
            taken, parent = stack.pop()
            stack.append((parent and not taken, parent))
            continue
        if stripped.startswith("#endif"):
            stack.pop()
            continue
        if not taking:
            continue
        found = re.match(r"#define (\w+) (-?\d+)$", stripped)
        if found:
            numbers[found.group(1)] = int(found.group(2))
        out.append(line)
    if stack:
        raise ReportError("an #if without its #endif")
    return "\n".join(out) + "\n"


def _condition(text: str, numbers: dict[str, int]) -> bool:
    text = re.sub(r"!\s*defined\((\w+)\)", lambda m: str(int(m.group(1) not in numbers)), text)
    text = re.sub(r"defined\((\w+)\)", lambda m: str(int(m.group(1) in numbers)), text)
    value = _evaluate(text.replace("&&", " and ").replace("||", " or "), numbers)
    if value is None:
        raise ReportError(f"an #if the reader cannot evaluate: {text.strip()}")
    return bool(value)


def constants(text: str) -> dict[str, int]:
    """Every object-like `#define` of the aoc form whose value is an integer expression of the ones before it."""
    values: dict[str, int] = {}
    for name, body in re.findall(r"^#define (\w+) (.+)$", text, flags=re.MULTILINE):
        value = _evaluate(re.sub(r"/\*.*?\*/", "", body), values)
        if value is not None:
            values[name] = value
    return values


def _macros(text: str, numbers: dict[str, int]) -> dict[str, str]:
    """The object-like macros whose value is not a number (`ONCHIP`, `ONCHIP_DECL`, `TASK`, ...): the reader
    expands them; the numeric ones stay names, evaluated where they are used."""
    found = {}
    for name, body in re.findall(r"^#define (\w+)(?![\w(]) ?(.*)$", text, flags=re.MULTILINE):
        if name not in numbers:
            found[name] = re.sub(r"/\*.*?\*/", "", body).strip()
    return found


def _pragma_macros(text: str) -> dict[str, tuple[str | None, str]]:
    """The macros that render a pragma (`UNROLL(n)`, `IVDEP`, `IVDEP_SAFELEN(n)` over `PRAGMA(x)` as `_Pragma(#x)`):
    name -> (its parameter, the pragma's text)."""
    if not re.search(r"^#define PRAGMA\((\w+)\) _Pragma\(#\1\)$", text, flags=re.MULTILINE):
        return {}
    found: dict[str, tuple[str | None, str]] = {}
    for name, param, body in re.findall(r"^#define (\w+)(?:\((\w+)\))? PRAGMA\((.*)\)$", text, flags=re.MULTILINE):
        found[name] = (param or None, body)
    return found


def expand(text: str) -> str:
    """The aoc form with its pragma macros rendered as the `#pragma` lines `aoc` sees, and its non-numeric
    object-like macros expanded (a few times over: a macro may name another)."""
    pragmas = _pragma_macros(text)
    macros = {k: v for k, v in _macros(text, constants(text)).items() if k not in pragmas}
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#define"))
    for name, (param, pragma) in pragmas.items():
        if param is None:
            body = re.sub(rf"\b{name}\b(?!\s*\()", f"#pragma {pragma}", body)
        else:
            body = re.sub(
                rf"\b{name}\(([^()]*(?:\([^()]*\))?[^()]*)\)",
                lambda m, p=param, t=pragma: "#pragma " + re.sub(rf"\b{p}\b", m.group(1), t),
                body,
            )
    attributes = re.findall(r"^#define (\w+)\((\w+)\) (__attribute__\(\(.*\)\))$", text, flags=re.MULTILINE)
    for name, param, value in attributes:  # BANKED(n): the memory attributes aoc reads
        body = re.sub(rf"\b{name}\(([^()]*)\)", lambda m, p=param, v=value: re.sub(rf"\b{p}\b", m.group(1), v), body)
    for _ in range(3):
        for name, value in macros.items():
            body = re.sub(rf"\b{name}\b(?!\s*\()", value, body)
    return body


# -- expressions -------------------------------------------------------------------------------------------------


def _python(expression: str) -> str:
    text = re.sub(r"\bw\.s([0-9a-f])\b", r"w_s\1", expression)
    text = re.sub(r"\(\s*(?:uint|int|float)\s*\)", "", text)
    text = re.sub(r"(\d+)[uU]\b", r"\1", text).replace("/", "//").replace("&&", " and ").replace("||", " or ")
    return text.replace("!=", " != ").replace("!", " not ").replace(" not  != ", "!=").replace("not =", "!=")


@functools.cache
def _compiled(expression: str) -> Any:
    """The code of an integer C expression, or None where it is not one (a call, a member, a subscript)."""
    try:
        tree = ast.parse(_python(expression.strip()), mode="eval")
    except SyntaxError:
        return None
    if any(isinstance(node, ast.Call | ast.Attribute | ast.Subscript) for node in ast.walk(tree)):
        return None
    return compile(tree, "<c>", "eval")


def _run(code: Any, names: dict[str, int]) -> int | None:
    if code is None:
        return None
    try:
        value = eval(code, {"__builtins__": {}}, names)  # noqa: S307 - arithmetic on integers only (_compiled)
    except Exception:  # noqa: BLE001 - a name the reader does not know: not a constant
        return None
    return int(value) if isinstance(value, bool | int) else None


def evaluate(expression: str, names: dict[str, int]) -> int | None:
    """An integer C expression over `names`, or None where it is not one."""
    return _run(_compiled(expression), names)


_evaluate = evaluate


# -- the loops ---------------------------------------------------------------------------------------------------


@dataclass
class ForLoop:
    """One `for` of a routine: where it lies in the text, its header, its mark, its pragma and its inner loops."""

    start: int
    body_start: int
    end: int
    var: str
    bound: str
    inclusive: bool
    step: str
    mark: str | None
    unroll: str | None
    ivdep: bool
    safelen: str | None
    inner: list[ForLoop] = field(default_factory=list)


_HEADER = re.compile(r"\(\s*uint (\w+) = 0;\s*(\w+) (<=?) ([^;]+);\s*(\w+)(\+\+| \+= ([^)]+))\s*\)")


def _matching(text: str, at: int, open_: str, close: str) -> int:
    depth = 0
    for index in range(at, len(text)):
        if text[index] == open_:
            depth += 1
        elif text[index] == close:
            depth -= 1
            if depth == 0:
                return index
    raise ReportError(f"an unbalanced '{open_}' in the engine's source")


def _statement_end(text: str, at: int) -> int:
    """The end (exclusive) of the statement that starts at `at`: a block, or up to its `;` (an `if`/`for` head
    skipped)."""
    while text[at].isspace():
        at += 1
    if text[at] == "{":
        return _matching(text, at, "{", "}") + 1
    head = re.match(r"(for|if)\s*\(", text[at:])
    if head:
        close = _matching(text, at + head.end() - 1, "(", ")")
        return _statement_end(text, close + 1)
    depth = 0
    for index in range(at, len(text)):
        depth += text[index] in "([" and 1 or (-1 if text[index] in ")]" else 0)
        if text[index] == ";" and depth == 0:
            return index + 1
    raise ReportError("a statement without its ';'")


def loops_of(body: str) -> list[ForLoop]:
    """The `for` loops of a routine's body, nested as they are."""
    flat: list[ForLoop] = []
    for found in re.finditer(r"\bfor\s*\(", body):
        close = _matching(body, found.end() - 1, "(", ")")
        header = _HEADER.fullmatch(body[found.end() - 1 : close + 1])
        if header is None:
            raise ReportError(f"a loop header the reader cannot read: {body[found.start() : close + 1]}")
        before = body[: found.start()]
        lead = before[max(before.rfind(";"), before.rfind("{"), before.rfind("}")) + 1 :]
        mark = re.search(r"/\* loop ([\w.]+) \*/", lead)
        unroll = re.search(r"#pragma unroll (.*)", lead)
        safelen = re.search(r"#pragma ivdep safelen\((.*)\)", lead)
        var, _, op, bound, _, _, step = header.groups()
        flat.append(
            ForLoop(
                found.start(),
                close + 1,
                _statement_end(body, close + 1),
                var,
                bound.strip(),
                op == "<=",
                (step or "1").strip(),
                mark.group(1) if mark else None,
                unroll.group(1) if unroll else None,
                bool(re.search(r"#pragma ivdep\b", lead)),
                safelen.group(1) if safelen else None,
            )  # fmt: skip
        )
    roots: list[ForLoop] = []
    for loop in flat:
        parents = [p for p in flat if p is not loop and p.start < loop.start and loop.end <= p.end]
        (max(parents, key=lambda p: p.start).inner if parents else roots).append(loop)
    return roots


# -- routines, arrays and the kernel's calls ---------------------------------------------------------------------


@dataclass(frozen=True)
class Array:
    """An on-chip array of the compute kernel: its dimensions (float32 words) and `numbanks`, if given."""

    name: str
    dims: tuple[int, ...]
    numbanks: int | None

    @property
    def words(self) -> int:
        return math.prod(self.dims)


@dataclass
class Routine:
    name: str
    signature: str
    params: list[str]
    body: str
    loops: list[ForLoop]
    memories: dict[str, str]  # parameter (or kernel array) name -> the kernel's array it is


def _functions(text: str) -> dict[str, tuple[str, list[str], str]]:
    found = {}
    for match in re.finditer(r"/\* routine (\w+) \*/\s*inline [\w ]+?\b(\w+)\s*\(", text):
        close = _matching(text, match.end() - 1, "(", ")")
        params = [p.strip() for p in _split(text[match.end() : close])]
        open_ = text.index("{", close)
        end = _matching(text, open_, "{", "}")
        names = [re.findall(r"\w+", p)[-1] for p in params]
        found[match.group(1)] = (text[match.end() : close], names, text[open_ + 1 : end])
    return found


def _split(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += 1 if char in "([" else -1 if char in ")]" else 0
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current] if current.strip() else parts


def kernel_arrays(body: str, numbers: dict[str, int]) -> dict[str, Array]:
    """The `__local` arrays the compute kernel declares (the routines' on-chip memories)."""
    arrays = {}
    pattern = r"__local float (\w+)((?:\[[^\]]+\])+)\s*(__attribute__\(\((.*?)\)\))?\s*;"
    for name, dims, _, attributes in re.findall(pattern, body):
        sizes = tuple(_evaluate(d, numbers) or 0 for d in re.findall(r"\[([^\]]+)\]", dims))
        banks = re.search(r"numbanks\(([^)]+)\)", attributes or "")
        arrays[name] = Array(name, sizes, _evaluate(banks.group(1), numbers) if banks else None)
    return arrays


@dataclass
class Source:
    """The engine's source as aoc reads it."""

    text: str  # the aoc form, macros expanded
    numbers: dict[str, int]
    routines: dict[str, Routine]
    arrays: dict[str, Array]
    channel_depth: int | None


def read_source(source: str) -> Source:
    form = aoc_form(source)
    numbers = constants(form)
    text = expand(form)
    kernel = re.search(r"void d5005_compute\s*\(", text)
    if kernel is None:
        raise ReportError("the source has no d5005_compute kernel")
    open_ = text.index("{", _matching(text, kernel.end() - 1, "(", ")"))
    compute = text[open_ + 1 : _matching(text, open_, "{", "}")]
    arrays = kernel_arrays(compute, numbers)
    routines = {}
    for name, (signature, params, body) in _functions(text).items():
        memories = {a: a for a in arrays}
        call = re.search(rf"\b{name}\(([^;]*)\);", compute)
        if call:
            for param, argument in zip(params, _split(call.group(1)), strict=False):
                if argument.strip() in arrays:
                    memories[param] = argument.strip()
        routines[name] = Routine(name, signature, params, body, loops_of(body), memories)
    depth = re.search(r"channel bank_word_t \w+\[\w+\] __attribute__\(\(depth\(([^)]+)\)\)\)", text)
    return Source(text, numbers, routines, arrays, _evaluate(depth.group(1), numbers) if depth else None)


# -- what one pipelined loop holds -------------------------------------------------------------------------------


@dataclass
class Site:
    """One access of an on-chip array in a loop's iteration (each unrolled copy its own site)."""

    array: str
    store: bool
    bank: int  # its address modulo `known`
    known: int  # the largest power of two (up to the banks asked for) its address is known modulo when built

    def banks(self, count: int) -> range | list[int]:
        """The banks of `count` the site reaches: its own when its bank is known, else every one."""
        return [self.bank % count] if self.known % count == 0 else range(count)


@dataclass
class LoopReport:
    """What aoc's loop and memory reports would say of one pipelined loop (a marked one, or a loop left serial
    inside one)."""

    name: str
    header: str = ""  # the `for` header as printed
    step: int = 1  # its step, evaluated
    carried_fp: list[int] = field(default_factory=list)  # distances of carried floating-point results
    carried_memory: list[int | None] = field(default_factory=list)  # distances through on-chip memory (None: ivdep)
    sites: list[Site] = field(default_factory=list)
    channels: set[int] = field(default_factory=set)  # the channels an iteration reads
    dynamic_channels: int = 0
    serial: list[tuple[int, int, LoopReport]] = field(default_factory=list)  # (copies, trips, loop) run in turn
    unrolls: dict[str, int] = field(default_factory=dict)  # the unrolled loops' variables and factors
    dividers: int = 0  # integer divisions (or remainders) by a run-time value an iteration builds


@dataclass
class Analysis:
    source: Source
    loops: dict[str, LoopReport]
    banks: dict[str, int]  # array -> banks aoc builds
    arbitrated: dict[str, set[int]]  # array -> banks whose sites do not fit their ports
    copies: dict[str, list[int]]
    warnings: list[str]
    ports: dict[str, tuple[int, int]] = field(default_factory=dict)  # array -> most loads, most stores on one bank


_STORE = re.compile(r"\s*(=(?!=)|\+=|-=|\*=)")
_DECLARED = re.compile(r"\b(float|uint|int|bank_word_t)\s+((?:\w+(?:\[[^\]]*\])*(?:\s*=\s*[^,;]+)?\s*,\s*)*"
                       r"\w+(?:\[[^\]]*\])*(?:\s*=\s*[^;]+)?);")  # fmt: skip


def _declarations(text: str) -> list[tuple[int, str, str, str | None, bool]]:
    """(position, type, name, initial value, is an array) of each declaration in `text`, in order."""
    found = []
    for match in _DECLARED.finditer(text):
        for part in _split(match.group(2)):
            name, _, value = part.partition("=")
            base = re.match(r"\s*(\w+)", name)
            if base:
                found.append((match.start(), match.group(1), base.group(1), value.strip() or None, "[" in name))
    return found


class _Probe:
    """Values a site's index takes: the unrolled variables at their copies' values, everything else random (a loop
    variable a random multiple of its step), the routine's declarations evaluated in order."""

    def __init__(self, routine: Routine, numbers: dict[str, int], loops: list[ForLoop]) -> None:
        self.routine, self.numbers = routine, numbers
        self.loops = loops
        self.declared = _declarations(routine.body)
        # a variable the routine assigns outside a declaration (`j++`, `slot = 0`) is a run-time value
        spans = [m.span() for m in _DECLARED.finditer(routine.body)]
        spans += [(loop.start, loop.body_start) for loop in loops]  # a loop's own header
        self._bases: dict[tuple[tuple[int, ...], int], dict[str, int]] = {}
        self._arounds: dict[int, tuple[int, ...]] = {}
        self._plans: dict[tuple[str, int, frozenset[str]], list[tuple[str, Any]]] = {}
        self.mutated = {
            m.group(1)
            for m in re.finditer(r"\b(\w+)\s*(?:\+\+|[-+*]?=(?!=))", routine.body)
            if not any(a <= m.start() < b for a, b in spans)
        }

    def _around(self, position: int) -> tuple[int, ...]:
        """The loops (by index) around `position`, outermost first."""
        if position not in self._arounds:
            self._arounds[position] = tuple(i for i, loop in enumerate(self.loops) if loop.start <= position < loop.end)
        return self._arounds[position]

    def _base(self, position: int, seed: int) -> dict[str, int]:
        """The run-time values at `position`: the parameters, the word's fields, the variables the routine
        changes and the loop variables around it, drawn from `seed`."""
        around = self._around(position)
        key = (around, seed)
        if key not in self._bases:
            draw = random.Random(seed)
            env = dict(self.numbers)
            for name in [*self.routine.params, *(f"w_s{d}" for d in "0123456789abcdef"), *sorted(self.mutated)]:
                env[name] = draw.randrange(1 << 12, 1 << 20)
            for i in around:  # outermost first
                loop = self.loops[i]
                env[loop.var] = (_evaluate(loop.step, self.numbers) or 1) * draw.randrange(1, 1 << 10)
            self._bases[key] = env
        return self._bases[key]

    def _plan(self, expression: str, position: int, fixed: frozenset[str]) -> list[tuple[str, Any]]:
        """The declarations `expression` needs at `position`, in order, each the latest of its name before it."""
        key = (expression, position, fixed)
        if key in self._plans:
            return self._plans[key]
        around = {self.loops[i].var for i in self._around(position)}
        skip = around | set(fixed) | self.mutated | set(self.numbers)
        chosen: dict[str, tuple[int, str | None]] = {}
        todo = re.findall(r"[A-Za-z_]\w*", expression)
        while todo:
            name = todo.pop()
            if name in skip or name in chosen:
                continue
            found = [(at, value) for at, _, n, value, is_array in self.declared if n == name and at < position]
            if not found or any(is_array for _, _, n, _, is_array in self.declared if n == name):
                continue
            chosen[name] = found[-1]
            todo += re.findall(r"[A-Za-z_]\w*", found[-1][1] or "")
        plan = [
            (name, _compiled(value) if value else None)
            for name, (at, value) in sorted(chosen.items(), key=lambda x: x[1][0])
        ]
        self._plans[key] = plan
        return plan

    def env(self, fixed: dict[str, int], position: int, seed: int, expression: str = "") -> dict[str, int]:
        env = dict(self._base(position, seed))
        env.update(fixed)
        draw = None
        for name, code in self._plan(expression, position, frozenset(fixed)):
            got = _run(code, env)
            if got is None:  # a value the reader cannot compute (a call, a float): a run-time value
                draw = draw or random.Random(seed * 7919 + position)
                got = draw.randrange(1 << 12, 1 << 20)
            env[name] = got
        return env

    def value(self, expression: str, fixed: dict[str, int], position: int, seed: int) -> int | None:
        return _evaluate(expression, self.env(fixed, position, seed, expression))


def _subscripts(text: str, at: int) -> tuple[list[str], int]:
    """The subscripts of an access whose first '[' is at `at`, and where the access ends."""
    found = []
    while at < len(text) and text[at] == "[":
        close = _matching(text, at, "[", "]")
        found.append(text[at + 1 : close])
        at = close + 1
    return found, at


def _copies(loops: list[ForLoop], numbers: dict[str, int]) -> list[dict[str, int]]:
    """Every combination of the unrolled variables' values."""
    combos: list[dict[str, int]] = [{}]
    for loop in loops:
        trips = _trips(loop, numbers) or 1
        combos = [{**c, loop.var: v} for c in combos for v in range(trips)]
    return combos


def _trips(loop: ForLoop, numbers: dict[str, int]) -> int | None:
    bound, step = _evaluate(loop.bound, numbers), _evaluate(loop.step, numbers)
    if bound is None or not step:
        return None
    return math.ceil((bound + (1 if loop.inclusive else 0)) / step)


def _is_unrolled(loop: ForLoop, numbers: dict[str, int]) -> bool:
    trips = _trips(loop, numbers)
    return loop.unroll is not None and trips is not None and _evaluate(loop.unroll, numbers) == trips


class _LoopReader:
    def __init__(self, source: Source, routine: Routine) -> None:
        self.source, self.routine, self.numbers = source, routine, source.numbers

    def read(self, loop: ForLoop, name: str, every: list[ForLoop]) -> LoopReport:
        """The report of `loop`: its body with its unrolled loops copied, its serial and marked loops apart."""
        advance = f"{loop.var}++" if loop.step == "1" else f"{loop.var} += {loop.step}"
        header = f"for (uint {loop.var} = 0; {loop.var} {'<=' if loop.inclusive else '<'} {loop.bound}; {advance})"
        report = LoopReport(name, header, _evaluate(loop.step, self.numbers) or 1)
        self.probe = _Probe(self.routine, self.numbers, every)
        body = self.routine.body
        own: list[tuple[int, int, list[ForLoop]]] = []  # text spans of this iteration, with the unrolled loops
        self._collect(loop, [], own, report, every)
        declared_inside = {n for at, _, n, _, _ in self.probe.declared if loop.body_start <= at < loop.end}
        floats = {n for _, t, n, _, _ in self.probe.declared if t == "float"}
        integers = self._integers()
        for start, end, unrolled in own:
            text = body[start:end]
            copies = math.prod(_trips(u, self.numbers) or 1 for u in unrolled)
            report.dividers += copies * _dividers(text, integers, self.numbers)
            self._sites(text, start, unrolled, loop, report)
            self._carried(text, unrolled, loop, declared_inside, floats, report)
        stored = {s.array for s in report.sites if s.store}
        if not loop.ivdep and loop.safelen is None and stored & {s.array for s in report.sites if not s.store}:
            report.carried_memory.append(1)  # a store and a load of one array: aoc must assume they meet
        return report

    def _collect(self, loop: ForLoop, unrolled: list[ForLoop], own: list, report: LoopReport, every: list) -> None:
        at = loop.body_start
        for inner in loop.inner:
            own.append((at, inner.start, unrolled))
            at = inner.end
            if inner.mark is not None:
                continue  # a pipelined loop of its own (the cost model nests it)
            if _is_unrolled(inner, self.numbers):
                report.unrolls[inner.var] = _trips(inner, self.numbers) or 1
                self._collect(inner, [*unrolled, inner], own, report, every)
                continue
            copies = math.prod(_trips(u, self.numbers) or 1 for u in unrolled)
            factor = _evaluate(inner.unroll, self.numbers) if inner.unroll else 1
            trips = _trips(inner, self.numbers)
            if trips is None:
                raise ReportError(f"loop over '{inner.var}' in {report.name}: a serial loop of unknown bound")
            sub = _LoopReader(self.source, self.routine).read(inner, f"{report.name}/{inner.var}", every)
            report.serial.append((copies, math.ceil(trips / max(1, factor or 1)), sub))
        own.append((at, loop.end, unrolled))

    def _integers(self) -> set[str]:
        """The routine's integer names: its uint declarations and parameters, its loop variables, the word."""
        declared = {n for _, kind, n, _, _ in self.probe.declared if kind in ("uint", "int")}
        params = set(re.findall(r"\buint\s+(\w+)", self.routine.signature))
        return declared | params | {loop.var for loop in _all(self.routine.loops)}

    def _sites(self, text: str, offset: int, unrolled: list[ForLoop], loop: ForLoop, report: LoopReport) -> None:
        memories = self.routine.memories
        pattern = r"\b(" + "|".join(map(re.escape, memories)) + r")\s*\[" if memories else r"(?!x)x"
        combos = _copies(unrolled, self.numbers)
        for match in re.finditer(pattern, text):
            array = self.source.arrays[memories[match.group(1)]]
            subscripts, end = _subscripts(text, match.end() - 1)
            store_op = _STORE.match(text, end)
            index = _linear(subscripts, array.dims)
            kinds = [True, True] if store_op and store_op.group(1) != "=" else [bool(store_op)]
            for fixed in combos:
                bank, known = self._bank(index, array, fixed, offset + match.start())
                report.sites += [Site(array.name, store, bank, known) for store in kinds]
            updated = store_op is not None and (store_op.group(1) != "=" or _reads_back(text, store_op.end(), match))
            if updated and not self._follows(index, loop, combos[0], offset):
                report.carried_memory.append(self._distance(loop))
        for match in re.finditer(r"READ_BANK\(\w+, ([^)]+)\)", text):
            for fixed in combos:
                seen = {self.probe.value(match.group(1), fixed, offset + match.start(), s) for s in range(3)}
                if len(seen) == 1 and None not in seen:
                    report.channels.add(seen.pop())  # type: ignore[arg-type]
                else:
                    report.dynamic_channels += 1

    def _bank(self, index: str, array: Array, fixed: dict[str, int], position: int) -> tuple[int, int]:
        """The site's address modulo the largest power of two (up to numbanks, or AUTO_BANKS_MAX) for which it is
        the same whatever the run-time values."""
        seen = [self.probe.value(index, fixed, position, seed) for seed in range(4)]
        if any(v is None for v in seen):
            return 0, 1
        known = array.numbanks or AUTO_BANKS_MAX
        while known > 1 and len({v % known for v in seen}) > 1:  # type: ignore[operator]
            known //= 2
        return seen[0] % known, known  # type: ignore[operator]

    def _follows(self, index: str, loop: ForLoop, fixed: dict[str, int], position: int) -> bool:
        """Whether the index moves with the loop's induction variable (each iteration a new address)."""
        step = _evaluate(loop.step, self.numbers) or 1
        here, next_ = ({**fixed, loop.var: step * n} for n in (5, 6))  # declarations re-evaluated at each
        return self.probe.value(index, here, position, 7) != self.probe.value(index, next_, position, 7)

    def _distance(self, loop: ForLoop) -> int | None:
        if loop.safelen is not None:
            return _evaluate(loop.safelen, self.numbers) or 1
        return None if loop.ivdep else 1

    def _carried(self, text: str, unrolled: list[ForLoop], loop: ForLoop, inside: set, floats: set, report) -> None:
        combos = _copies(unrolled, self.numbers)[:1]
        fixed = combos[0] if combos else {}
        for match in re.finditer(r"\b(\w+)((?:\[[^\]=]*\])*)\s*(=(?!=)|\+=|-=|\*=)\s*([^;]+);", text):
            name, subs, op, value = match.groups()
            if name not in floats or name in inside or name in self.routine.memories:
                continue
            if not subs:
                if op != "=" or re.search(rf"\b{name}\b", value):
                    report.carried_fp.append(1)
                continue
            written = _evaluate(re.findall(r"\[([^\]]*)\]", subs)[-1], {**self.numbers, **fixed})
            if op != "=":
                report.carried_fp.append(1)
                continue
            reads = [re.findall(r"\[([^\]]*)\]", r)[-1] for r in re.findall(rf"\b{name}((?:\[[^\]]*\])+)", value)]
            plain_move = re.fullmatch(rf"\s*{name}(\[[^\]]*\])+\s*", value) is not None
            for read in reads:
                at = _evaluate(read, {**self.numbers, **fixed})
                if plain_move or written is None or at is None:
                    continue
                report.carried_fp.append(written - at if written > at else 1)


def _reads_back(text: str, at: int, store: re.Match[str]) -> bool:
    """Whether the value stored by `store` (its `=` ends at `at`) reads the same element back (`a[i] = f(a[i])`):
    an update through memory, as `a[i] += x` is."""
    value = text[at : _statement_end(text, at)]
    return text[store.start() : store.end() - 1].strip() + "[" in value and _subscripts_text(text, store) in value


def _subscripts_text(text: str, store: re.Match[str]) -> str:
    subscripts, end = _subscripts(text, store.end() - 1)
    return text[store.start() : end]


def _dividers(text: str, integers: set[str], numbers: dict[str, int]) -> int:
    """Integer divisions and remainders in `text` whose divisor is a run-time value (a constant power of two is a
    shift, another constant a multiply; a float division is not counted)."""
    count = 0
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    for match in re.finditer(r"[/%]\s*(\((?:[^()]|\([^()]*\))*\)|\w+(?:\.\w+)?)", text):
        divisor = match.group(1)
        if evaluate(divisor, numbers) is not None or re.search(r"\d\.\d|\d\.?f\b|\(float\)", divisor):
            continue
        names = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"\bw\.s[0-9a-f]\b", "", divisor))) - set(numbers)
        if names <= integers:
            count += 1
    return count


def _linear(subscripts: list[str], dims: tuple[int, ...]) -> str:
    """The flat float32 index of a (possibly many-dimensional) access."""
    index = "0"
    for position, subscript in enumerate(subscripts):
        index = f"({index}) * {dims[position] if position < len(dims) else 1} + ({subscript})"
    return index


def analyse(source: str) -> Analysis:
    """The reports of every pipelined loop of the engine and the banking of its on-chip arrays."""
    read = read_source(source)
    loops: dict[str, LoopReport] = {}
    for routine in read.routines.values():
        every = _all(routine.loops)
        for loop in every:
            if loop.mark is not None:
                loops[loop.mark] = _LoopReader(read, routine).read(loop, loop.mark, every)
    banks, arbitrated, copies, ports = _bank_arrays(read, loops)
    warnings = [
        f"loop {name}: {report.dividers} integer dividers by a run-time value in each iteration"
        " (Best Practices Guide: avoid expensive functions such as integer division in loops)"
        for name, report in loops.items()
        if report.dividers
    ]
    if re.search(r"__global[^;{()]*\*\s*(?:const\s*)?\*|__global\s+\w+\s*\*\s*\w+\s*\[", read.text):
        warnings.append(
            "a global pointer chosen at run time (an array of bank pointers): every access through it"
            " is an LSU to each bank it may name"
        )
    warnings += [
        f"loop {name}: a channel read whose channel is a run-time value (aoc requires a constant channel id,"
        " Programming Guide §5.4.4): the model costs it as serial reads"
        for name, report in loops.items()
        if any(r.dynamic_channels for r in every_report(report))
    ]
    return Analysis(read, loops, banks, arbitrated, copies, warnings, ports)


def _all(loops: list[ForLoop]) -> list[ForLoop]:
    return [x for loop in loops for x in [loop, *_all(loop.inner)]]


def every_report(report: LoopReport) -> list[LoopReport]:
    return [report, *(r for _, _, sub in report.serial for r in every_report(sub))]


def _bank_arrays(read: Source, loops: dict[str, LoopReport]):
    """For each array: the banks aoc builds (as many as every site's bank is known for), then per bank its load and
    store sites against PORTS, copies within the M20K budget; the banks that do not fit are arbitrated."""
    sites: dict[str, list[Site]] = {a: [] for a in read.arrays}
    for report in loops.values():
        for each in every_report(report):
            for site in each.sites:
                sites[site.array].append(site)
    banks = {name: _banks_of(read.arrays[name], found) for name, found in sites.items()}
    need: dict[str, list[int | None]] = {}
    ports: dict[str, tuple[int, int]] = {}
    for name, found in sites.items():
        count = banks[name]
        per_bank = [[0, 0] for _ in range(count)]
        for site in found:
            for b in site.banks(count):
                per_bank[b][1 if site.store else 0] += 1
        blocks = math.ceil(read.arrays[name].words / count / M20K_WORDS)
        ports[name] = (max(loads for loads, _ in per_bank), max(stores for _, stores in per_bank))
        need[name] = [
            None if stores >= PORTS else max(1, math.ceil(loads / (PORTS - stores))) * blocks
            for loads, stores in per_bank
        ]
    budget = int(M20K_BLOCKS * M20K_USABLE)
    arbitrated: dict[str, set[int]] = {name: {b for b, n in enumerate(v) if n is None} for name, v in need.items()}
    for name, found in sites.items():  # a site whose bank is a run-time value reaches every bank through an arbiter
        if banks[name] > 1 and any(site.known % banks[name] for site in found):
            arbitrated[name] = set(range(banks[name]))
    used = sum(n for v in need.values() for n in v if n is not None)
    for name in sorted(need, key=lambda n: -sum(x or 0 for x in need[n])):
        if used <= budget:
            break
        used -= sum(x or 0 for x in need[name])
        used += math.ceil(read.arrays[name].words / M20K_WORDS)
        arbitrated[name] = set(range(banks[name]))
    blocks_of = {n: math.ceil(read.arrays[n].words / banks[n] / M20K_WORDS) for n in need}
    copies = {
        n: [1 if b in arbitrated[n] else (x or 0) // blocks_of[n] for b, x in enumerate(v)] for n, v in need.items()
    }
    return banks, arbitrated, copies, ports


def _banks_of(array: Array, sites: list[Site]) -> int:
    """numbanks when given; else the most banks (a power of two) that every site's known bank allows."""
    if array.numbanks is not None:
        return array.numbanks
    count = min([AUTO_BANKS_MAX, *(site.known for site in sites)])
    while count > 1 and array.words % count:
        count //= 2
    return count


def port_ii(analysis: Analysis, report: LoopReport) -> int:
    """The II the ports impose on a loop: 1 where each site has its port, else its accesses of the most contended
    arbitrated bank over PORTS."""
    worst = 1
    for array, arbitrated in analysis.arbitrated.items():
        if not arbitrated:
            continue
        count = analysis.banks[array]
        per_bank = [0] * count
        for site in report.sites:
            if site.array != array:
                continue
            for b in site.banks(count):
                per_bank[b] += 1
        worst = max([worst, *(math.ceil(per_bank[b] / PORTS) for b in arbitrated)])
    return worst
