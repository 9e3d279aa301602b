"""The D5005 engine's cost model, read from the engine's own source: its loops, their trip counts and initiation
intervals, the kernels that run at once and the bursts each bank serves.

The model parses the OpenCL C that `emit_opencl.engine_source` writes (or any edit of it): each routine (marked
`/* routine NAME */`), its pipelined loops (marked `/* loop NAME */`), their bounds and the `uint` declarations
they use, evaluated with the instruction word's fields at the step being costed. For each loop:

* **trip count**: from its `for` header, `(bound - start) / step` rounded up, bounds evaluated as C integer
  arithmetic with the word's fields (`w.s4` ...), the step's token and position, the bank and the `#define`s;
* **initiation interval (II)**: 1, unless the loop body carries a floating-point operation from one iteration to
  the next: an update (`acc += ...`, `acc = acc + ...`, `m = fmax(m, ...)`) of a value declared outside the loop is
  carried at distance 1, an array update under `IVDEP_SAFELEN(n)` at distance n, a shift register (`r[SHIFT_DEPTH]
  = r[0] + ...`) at distance SHIFT_DEPTH; the II is then ceil(FP_LATENCY / distance). A loop that stores to and
  loads from one memory it does not own (a pointer argument) without `IVDEP` has the II of that memory's
  store-to-load latency (ONCHIP_DEPENDENCE);
* **cycles**: trips x II, plus for each nested loop its own cycles per outer iteration; a loop's invocation costs
  LOOP_LATENCY cycles of fill and drain when it is outermost or its bounds change between the outer loop's
  iterations (the outer loop is then not pipelined), else INNER_ENTRY cycles per outer iteration.

The bank readers' loops write one 512-bit word (a burst) an iteration; a bank serves them at DDR_EFFICIENCY of
its peak of one burst a cycle. The five kernels run at once, so an instruction takes the longest of the compute
routine's cycles and each reader's cycles / DDR_EFFICIENCY. Bytes per token are the readers' bursts (the weights
as streamed, then K and V of each KV head as the attention's loops read them, once for the group) plus the
compute kernel's writes (cache rows, logits). The sources of the constants are in docs/d5005.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logos_ir.dialects import d5005
from logos_ir.errors import LogosError

DDR_EFFICIENCY = 0.90  # sustained / peak of a DDR4 bank for long sequential reads (docs/d5005.md: the sources)
FP_LATENCY = 6  # cycles of a carried floating-point operation: its II when carried at distance 1
ONCHIP_DEPENDENCE = 4  # cycles from a store to a load of the same on-chip memory: the II of a loop that may alias
LOOP_LATENCY = 100  # cycles of fill and drain of a pipelined loop's invocation
INNER_ENTRY = 4  # cycles an inner loop of fixed bounds adds per iteration of its (pipelined) outer loop


class CostModelError(LogosError):
    """The engine's source has a loop the cost model cannot read."""


# -- reading the source ------------------------------------------------------------------------------------------


@dataclass
class Loop:
    name: str
    var: str
    start: str
    bound: str
    step: str
    body: str  # the text between the braces (or the single statement)
    own: str  # the body less the bodies of nested marked loops
    pragma: str  # IVDEP, IVDEP_SAFELEN(n) or ""
    span: tuple[int, int]
    children: list[Loop] = field(default_factory=list)


@dataclass
class Routine:
    name: str
    text: str
    params: str
    loops: list[Loop]  # outermost, in order


def _matching(text: str, at: int, open_: str = "{", close: str = "}") -> int:
    """The index just past the bracket that closes the one at `at`."""
    depth = 0
    for i in range(at, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    raise CostModelError("the engine's source has an unbalanced bracket")


_FOR = re.compile(r"for\s*\(\s*uint\s+(\w+)\s*=\s*([^;]+);\s*\1\s*<\s*([^;]+);\s*(?:\1\+\+|\1\s*\+=\s*([^)]+))\)")


def _loops(text: str) -> list[Loop]:
    found: list[Loop] = []
    for marker in re.finditer(r"/\* loop ([\w.]+) \*/", text):
        header = _FOR.match(text, marker.end() + len(text[marker.end() :]) - len(text[marker.end() :].lstrip()))
        if header is None:
            raise CostModelError(f"loop {marker.group(1)}: no 'for (uint i = a; i < b; i++ or += s)' after its mark")
        rest = header.end() + len(text[header.end() :]) - len(text[header.end() :].lstrip())
        if text[rest] == "{":
            end = _matching(text, rest)
            body = text[rest + 1 : end - 1]
        else:
            end = _statement_end(text, rest)
            body = text[rest:end]
        before = text[: marker.start()].rstrip().splitlines()[-1].strip() if text[: marker.start()].strip() else ""
        pragma = before if before.startswith("IVDEP") else ""
        var, start, bound, step = header.group(1), header.group(2), header.group(3), header.group(4) or "1"
        found.append(Loop(marker.group(1), var, start, bound, step, body, body, pragma, (marker.start(), end)))
    return _nest(found)


def _statement_end(text: str, at: int) -> int:
    depth = 0
    for i in range(at, len(text)):
        depth += text[i] in "({[" and 1 or 0
        depth -= text[i] in ")}]" and 1 or 0
        if text[i] == ";" and depth == 0:
            return i + 1
    raise CostModelError("the engine's source has an unterminated statement")


def _nest(loops: list[Loop]) -> list[Loop]:
    outer: list[Loop] = []
    for loop in loops:
        parent = None
        for other in loops:
            inside = other.span[0] < loop.span[0] and loop.span[1] <= other.span[1]
            if other is not loop and inside and (parent is None or other.span[0] > parent.span[0]):
                parent = other
        (parent.children if parent is not None else outer).append(loop)
    for loop in loops:
        for child in loop.children:
            loop.own = loop.own.replace(child.body, "")
    return outer


def read_routines(source: str) -> dict[str, Routine]:
    """Every routine of the engine's source, by name."""
    routines: dict[str, Routine] = {}
    for marker in re.finditer(r"/\* routine (\w+) \*/", source):
        brace = source.index("{", marker.end())
        paren = source.index("(", marker.end())
        params = source[paren + 1 : _matching(source, paren, "(", ")") - 1]
        end = _matching(source, brace)
        text = source[brace + 1 : end - 1]
        routines[marker.group(1)] = Routine(marker.group(1), text, params, _loops(text))
    return routines


def dispatch(source: str, function: str) -> dict[str, str]:
    """The routine each opcode's `case` calls in the switch of `function` (a kernel or the readers' `read_bank`)."""
    at = re.search(rf"\b{function}\s*\(", source)
    if at is None:
        raise CostModelError(f"the engine's source has no '{function}'")
    body = source[at.end() : _matching(source, source.index("{", at.end()))]
    return {op.lower(): name for op, name in re.findall(r"case OP_(\w+):\s*(?:result\[0\]\s*=\s*)?(\w+)\(", body)}


def defines(source: str) -> dict[str, int]:
    """The numeric object-like `#define`s, each evaluated with the ones before it (first definition wins)."""
    values: dict[str, int] = {}
    for name, text in re.findall(r"^#define (\w+) (.+)$", source, flags=re.MULTILINE):
        text = re.sub(r"/\*.*?\*/", "", text)
        if name in values:
            continue
        try:
            values[name] = int(_evaluate(text, values))
        except CostModelError:
            continue
    return values


# -- evaluating C integer expressions ----------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\d+)u?|(w\.s[0-9a-f])|(\w+)|(&&|\|\||==|!=|<=|>=|[-+*/%()<>,?:!]))")


def _evaluate(text: str, env: dict[str, Any]) -> int:
    """A C expression of unsigned integers (with SELECT and WORDS) in Python: `/` truncates."""
    out, at = [], 0
    text = text.strip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise CostModelError(f"cannot read '{text}'")
        at = match.end()
        number, field_, name, op = match.groups()
        if number is not None:
            out.append(number)
        elif field_ is not None:
            out.append(f"F[{int(field_[-1], 16)}]")
        elif name is not None:
            if name not in env and name not in ("SELECT", "WORDS"):
                raise CostModelError(f"cannot read '{text}': '{name}' is unknown")
            out.append(f"E[{name!r}]" if name in env else name)
        else:
            out.append({"/": "//", "&&": " and ", "||": " or ", "!": " not "}.get(op, op))
    burst = env.get("BURST_BYTES", 64)
    helpers: dict[str, Callable[..., int]] = {
        "SELECT": lambda c, a, b: a if c else b,
        "WORDS": lambda n, size: -(-(n * size) // burst),
    }
    try:
        return int(eval("".join(out), {"__builtins__": {}}, {**helpers, "E": env, "F": env.get("_fields", [])}))
    except (ZeroDivisionError, SyntaxError, TypeError, IndexError, KeyError) as error:
        raise CostModelError(f"cannot read '{text}': {error}") from None


def _top_level(block: str) -> list[str]:
    """The statements of a block, not those of the blocks nested in it."""
    statements: list[str] = []
    current: list[str] = []
    depth = 0
    for char in block:
        if char == "{":
            depth += 1
            current = []
            continue
        if char == "}":
            depth -= 1
            current = []
            continue
        if depth:
            continue
        if char == ";":
            statements.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    return statements


def _declare(block: str, env: dict[str, Any]) -> None:
    """Evaluate the block's top-level `uint` declarations into env (those the model cannot read are left out)."""
    for statement in _top_level(block):
        match = re.match(r"(?:const\s+)?uint\s+(.*)$", statement, flags=re.DOTALL)
        if match is None:
            continue
        for part in _split_commas(match.group(1)):
            name, _, value = part.partition("=")
            try:
                env[name.strip()] = _evaluate(value, env) if value else 0
            except CostModelError:
                env.pop(name.strip(), None)


def _split_commas(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([" and 1 or 0
        depth -= char in ")]" and 1 or 0
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


# -- initiation intervals ----------------------------------------------------------------------------------------


def _float_names(text: str) -> tuple[set[str], set[str]]:
    """(register floats, pointers to float memory) declared in `text`."""
    pointers = set(re.findall(r"float\s*\*\s*(?:const\s+)?(?:restrict\s+)?(\w+)", text))
    registers: set[str] = set()
    for declaration in re.findall(r"\bfloat\s+([^;(){}]*?)\s*(?:;|=[^;]*;)", text):
        for part in _split_commas(declaration):
            name = re.match(r"\s*(\w+)", part)
            if name:
                registers.add(name.group(1))
    return registers - pointers, pointers


@dataclass(frozen=True)
class Interval:
    ii: int
    why: str


def initiation_interval(routine: Routine, loop: Loop, shift_depth: int) -> Interval:
    """The loop's II by the rules in this module's docstring, and what sets it."""
    outside = routine.params + "," + routine.text.replace(loop.body, "")
    registers, pointers = _float_names(outside)
    inside_registers, _ = _float_names(loop.own)
    carried = (registers | pointers) - inside_registers
    safelen = re.match(r"IVDEP_SAFELEN\((\w+)\)", loop.pragma)
    worst = Interval(1, "no carried floating-point operation")
    for name, index, distance in _carried_updates(loop.own, shift_depth):
        if name not in carried:
            continue
        if index and name in pointers and loop.pragma == "IVDEP":
            continue
        if index and safelen:
            distance = max(distance, shift_depth if safelen.group(1) == "SHIFT_DEPTH" else int(safelen.group(1)))
        ii = math.ceil(FP_LATENCY / distance)
        if ii > worst.ii:
            worst = Interval(ii, f"'{name}{index}' carries a floating-point operation at distance {distance}")
    if not loop.pragma:
        for name in pointers:
            stores = len(re.findall(rf"\b{name}\[[^\]]*\]\s*(?:[-+*]?=)(?!=)", loop.own))
            if stores and len(re.findall(rf"\b{name}\[", loop.own)) > stores and worst.ii < ONCHIP_DEPENDENCE:
                worst = Interval(ONCHIP_DEPENDENCE, f"'{name}' is stored and loaded with no IVDEP")
    return worst


def _carried_updates(body: str, shift_depth: int) -> list[tuple[str, str, int]]:
    index = r"((?:\[[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*\])*)"
    found: list[tuple[str, str, int]] = []
    for match in re.finditer(rf"\b(\w+){index}\s*([-+*])=", body):
        found.append((match.group(1), match.group(2), 1))
    for match in re.finditer(rf"\b(\w+){index}\s*=\s*(?:fmax|fmin)?\(?\s*\1\2\s*[-+*,]", body):
        found.append((match.group(1), match.group(2), 1))
    shift = rf"\b(\w+){index}\[SHIFT_DEPTH\]\s*=\s*(?:fmax\(|fmin\(|SELECT\([^,]*,\s*)?\1\2\[0\]"
    for match in re.finditer(shift, body):
        found.append((match.group(1), match.group(2), shift_depth))
    return found


# -- cycles and bursts -------------------------------------------------------------------------------------------


def _trips(loop: Loop, env: dict[str, Any]) -> int:
    try:
        start, bound, step = (_evaluate(t, env) for t in (loop.start, loop.bound, loop.step))
    except CostModelError as error:
        raise CostModelError(f"loop {loop.name}: {error.message}") from None
    return max(0, -(-(bound - start) // max(step, 1)))


def _uses(loop: Loop, names: set[str]) -> bool:
    text = " ".join([loop.start, loop.bound, loop.step])
    return any(re.search(rf"\b{n}\b", text) for n in names) or any(_uses(c, names) for c in loop.children)


@dataclass
class LoopCost:
    cycles: float = 0.0
    iterations: int = 0
    by_loop: dict[str, float] = field(default_factory=dict)


def loop_cycles(routine: Routine, loop: Loop, env: dict[str, Any], shift_depth: int, out: LoopCost) -> float:
    """Cycles of one invocation of `loop` (fill and drain not included)."""
    trips = _trips(loop, env)
    ii = initiation_interval(routine, loop, shift_depth).ii
    own = trips * ii
    if not loop.children or trips == 0:
        out.iterations += trips
        out.by_loop[loop.name] = out.by_loop.get(loop.name, 0) + own
        return own
    changing = {loop.var, *re.findall(r"\buint\s+(\w+)", loop.own)}
    changing |= {n.strip().split("=")[0].strip() for s in _top_level(loop.body) for n in _split_commas(s[5:])
                 if s.startswith("uint ")}  # fmt: skip
    varying = [c for c in loop.children if _uses(c, changing)]
    total = float(own)
    if varying:
        for value in range(_evaluate(loop.start, env), _evaluate(loop.bound, env), max(_evaluate(loop.step, env), 1)):
            inner = {**env, loop.var: value}
            _declare(loop.body, inner)
            for child in loop.children:
                entry = LOOP_LATENCY if child in varying else INNER_ENTRY
                total += entry + loop_cycles(routine, child, inner, shift_depth, out)
    else:
        inner = {**env, loop.var: 0}
        _declare(loop.body, inner)
        for child in loop.children:
            once = LoopCost()
            total += trips * (INNER_ENTRY + loop_cycles(routine, child, inner, shift_depth, once))
            out.iterations += trips * once.iterations
            for name, cycles in once.by_loop.items():
                out.by_loop[name] = out.by_loop.get(name, 0) + trips * cycles
    out.by_loop[loop.name] = out.by_loop.get(loop.name, 0) + own
    return total


def routine_cycles(routine: Routine, env: dict[str, Any], shift_depth: int) -> LoopCost:
    """Cycles of one call of the routine: each outermost loop's invocation, plus its fill and drain."""
    env = dict(env)
    _declare(routine.text, env)
    cost = LoopCost()
    for loop in routine.loops:
        trips = _trips(loop, env)
        cost.cycles += (LOOP_LATENCY if trips else 0) + loop_cycles(routine, loop, env, shift_depth, cost)
    return cost


# -- the estimate ------------------------------------------------------------------------------------------------


@dataclass
class Engine:
    """The engine's source, read: routines, which routine runs each opcode in the compute kernel and the readers,
    and the `#define`s."""

    source: str
    routines: dict[str, Routine]
    compute: dict[str, str]
    readers: dict[str, str]
    constants: dict[str, int]

    def fields_read(self) -> set[int]:
        """The instruction word's fields any loop's trip count depends on (through the `uint`s its bounds use):
        instructions equal in these cost the same."""
        fields: set[int] = set()
        for routine in self.routines.values():
            texts = [f"{loop.start} {loop.bound} {loop.step}" for loop in _every(routine.loops)]
            names = set(re.findall(r"\b[a-z_]\w*\b", " ".join(texts)))
            declarations = dict(_declarations(routine.text))
            for loop in _every(routine.loops):
                declarations.update(_declarations(loop.body))
            seen: set[str] = set()
            while names - seen:
                name = (names - seen).pop()
                seen.add(name)
                value = declarations.get(name, "")
                fields |= {int(f, 16) for f in re.findall(r"w\.s([0-9a-f])\b", value)}
                names |= set(re.findall(r"\b[a-z_]\w*\b", value))
            fields |= {int(f, 16) for f in re.findall(r"w\.s([0-9a-f])\b", " ".join(texts))}
        return fields

    @classmethod
    def read(cls, source: str) -> Engine:
        return cls(source, read_routines(source), dispatch(source, d5005.COMPUTE_KERNEL), dispatch(source, "read_bank"),
                   defines(source))  # fmt: skip


def _every(loops: list[Loop]) -> list[Loop]:
    return [x for loop in loops for x in [loop, *_every(loop.children)]]


def _declarations(block: str) -> list[tuple[str, str]]:
    found = []
    for statement in _top_level(block):
        match = re.match(r"(?:const\s+)?uint\s+(.*)$", statement, flags=re.DOTALL)
        for part in _split_commas(match.group(1)) if match else []:
            name, _, value = part.partition("=")
            found.append((name.strip(), value))
    return found


def _word_env(engine: Engine, word: list[int], token: int, position: int) -> dict[str, Any]:
    return {**engine.constants, "_fields": word, "token": token, "position": position}


def instruction_cost(engine: Engine, word: list[int], token: int, position: int) -> dict[str, Any]:
    """Cycles of one instruction word: the compute routine and each bank reader run at once."""
    opcode = {code: name.split(".")[1] for name, code in d5005.OPCODES.items()}[word[d5005.W_OPCODE]]
    depth = engine.constants.get("SHIFT_DEPTH", 1)
    env = _word_env(engine, word, token, position)
    routine = engine.routines.get(engine.compute.get(opcode, ""))
    if routine is None:
        raise CostModelError(f"the compute kernel runs no routine the model can read for opcode '{opcode}'")
    compute = routine_cycles(routine, env, depth)
    bursts = [0] * d5005.BANKS
    reader = engine.routines.get(engine.readers.get(opcode, ""))
    if reader is not None:
        for b in range(d5005.BANKS):
            bursts[b] = routine_cycles(reader, {**env, "b": b}, depth).iterations
    streamed = max(bursts) / DDR_EFFICIENCY + (LOOP_LATENCY if any(bursts) else 0)
    burst = engine.constants["BURST_BYTES"]
    written = compute.by_loop.get(f"{opcode}.words", 0) * burst if opcode == "cache_write" else 0
    written += word[d5005.W_ROWS] * 4 if opcode == "argmax" else 0
    return {
        "opcode": opcode,
        "cycles": max(compute.cycles, streamed),
        "compute_cycles": compute.cycles,
        "bursts": bursts,
        "read_bytes": sum(bursts) * burst,
        "written_bytes": written,
        "by_loop": compute.by_loop,
    }


def estimate(program: d5005.ProgramOp, position: int | None = None, source: str | None = None) -> dict[str, Any]:
    """The decode step's estimated cycles, tokens/s and share of the roofline of the bytes the engine reads (at
    `position`, the last position of the cache by default), from the engine's source (`source`, or the one the
    emitter writes for the program)."""
    from logos_ir.passes.d5005.emit_opencl import engine_source
    from logos_ir.passes.d5005.emit_stream import encode_instruction

    params = program.params
    engine = Engine.read(source if source is not None else engine_source(program.identity.data, params))
    position = position or program.ctx.value.data
    cycles = 0.0
    read = written = weights = 0
    by_opcode: dict[str, float] = {}
    by_loop: dict[str, float] = {}
    cache: dict[tuple[int, ...], dict[str, Any]] = {}
    fields = sorted(engine.fields_read() | {d5005.W_OPCODE, d5005.W_ROWS})
    for op in program.instructions():
        word = encode_instruction(op, params.burst_bytes)
        key = tuple(word[f] for f in fields)  # what the trip counts read of the word (and the bytes written)
        cost = cache.get(key) or cache.setdefault(key, instruction_cost(engine, word, 1, position))
        cycles += cost["cycles"]
        read += cost["read_bytes"]
        written += cost["written_bytes"]
        weights += cost["read_bytes"] if cost["opcode"] in ("matvec", "embed_row", "rms_norm") else 0
        by_opcode[cost["opcode"]] = by_opcode.get(cost["opcode"], 0) + cost["cycles"]
        for name, value in cost["by_loop"].items():
            by_loop[name] = by_loop.get(name, 0) + value
    peak = d5005.BANKS * d5005.BANK_GBPS * 1e9
    tokens = params.clock_mhz * 1e6 / cycles
    roofline = peak / read
    return {
        "clock_mhz": params.clock_mhz,
        "burst_bytes": params.burst_bytes,
        "vector_width": params.vector_width,
        "banks": d5005.BANKS,
        "peak_gb_per_s": round(peak / 1e9, 1),
        "ddr_efficiency": DDR_EFFICIENCY,
        "fp_latency": FP_LATENCY,
        "loop_latency": LOOP_LATENCY,
        "position": position,
        "cycles_per_token": round(cycles),
        "cycles_by_opcode": {k: round(v) for k, v in sorted(by_opcode.items())},
        "loop_cycles": {k: round(v) for k, v in sorted(by_loop.items())},
        "bytes_read_per_token": read,
        "weight_bytes_per_token": weights,
        "kv_bytes_per_token": read - weights - _rope_bytes(program, params.burst_bytes),
        "bytes_written_per_token": written,
        "tokens_per_s": round(tokens, 3),
        "roofline_tokens_per_s": round(roofline, 3),
        "fraction_of_roofline": round(tokens / roofline, 4),
    }


def _rope_bytes(program: d5005.ProgramOp, burst: int) -> int:
    return sum(
        d5005.bank_words(op.head_dim.value.data, 4, burst) * burst
        for op in program.instructions()
        if isinstance(op, d5005.RopeOp)
    )


def summary_lines(cost: dict[str, Any]) -> list[str]:
    return [
        f"d5005 cost model (read from the engine's loops): {cost['tokens_per_s']} tokens/s (estimate, not a"
        f" measurement) at position {cost['position']}, {cost['cycles_per_token']} cycles at {cost['clock_mhz']} MHz",
        f"  {cost['bytes_read_per_token'] / 1e9:.3f} GB read from board memory per token; roofline"
        f" {cost['roofline_tokens_per_s']} tokens/s at {cost['peak_gb_per_s']} GB/s;"
        f" {cost['fraction_of_roofline'] * 100:.1f}% of it (DDR4 efficiency assumed {cost['ddr_efficiency']})",
    ]
