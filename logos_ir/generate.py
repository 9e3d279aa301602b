"""Generation through the compiled LOGOS programs, on the reference interpreter or a lane's runtime.

A `Generator` authors each program it needs once per shape (the prefill chunk of so many rows, the decode
step), parses the author's text back into IR, compiles it once, and runs all of them over one shared
`KVState`: the prompt goes through prefill chunks, then each new token through a decode step. Ids the caller sees
count from 0, as the model's tokenizer does; inside the programs they count from 1.

The next token is the backend's own arg-max by default (greedy); given a `logos_ir.sampling.Sampler`, the loop hands
it the arg-max token and the logits the backend read it from (the program's or machine's `logits` attribute), and
takes the token it chooses. `generate(..., keep_cache=True)` continues from the cache: the longest common prefix of
the new prompt and the tokens already in the cache (of the same length) is kept and only the rest is fed, as
llama.cpp's server reuses a prompt cache. An interactive chat renders the whole conversation each turn and pays only
for the new turn. `on_token` may return True to stop (a stop string seen).

The lanes reuse the loop, not copy it. A lane whose runtime runs programs (the CUDA lane's kernels) subclasses
`Generator` and overrides its two hooks, `compile_program` (a cut to something with `inputs` and `run`) and
`kv_state` (where the caches live). A lane whose hardware holds the model in place and takes one token at a time
(the D5005 engine, the spatial grid) subclasses `StepGenerator` and gives `machine(ctx)`: the prompt, then each
new token, goes through its `step`. Both share the prompt checks, the cache sizing and the greedy decode loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from logos_ir.author import written, written_split
from logos_ir.errors import LogosError
from logos_ir.interpreter import Interpreter, KVState
from logos_ir.program import Cut, Identity
from logos_ir.sampling import Sampler
from logos_ir.spec import ModelSpec
from logos_ir.weights import WeightStore

__all__ = [
    "BuildGenerator",
    "Compiled",
    "GenerationStats",
    "Generator",
    "StepGenerator",
    "StepMachine",
    "checked_prompt",
    "default_ctx",
    "greedy",
    "run_program",
]

CTX_MULTIPLE = 64


def default_ctx(prompt_length: int, max_new_tokens: int) -> int:
    """A cache long enough for the prompt and every new token, rounded up to a multiple of 64 positions."""
    need = max(1, prompt_length + max_new_tokens)
    return -(-need // CTX_MULTIPLE) * CTX_MULTIPLE


@dataclass
class GenerationStats:
    """Timings of the last `generate`: preparing its programs, the prompt's (prefill: `prompt_tokens` fed, after
    `cached_tokens` kept from the cache), the time to the first token (from the call: preparing, prefill and the
    first choice) and the decode steps'; `stop` says why it ended: "eos", "length" (max_new_tokens), "stop" (the
    caller's on_token said so), "ctx" (the cache is full)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    cached_tokens: int = 0
    prepare_s: float = 0.0
    first_token_s: float = 0.0
    stop: str = ""

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens fed per second of prefill."""
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of generation (prompt processing included)."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Decode steps per second."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class Compiled:
    """A program ready to run (anything with `inputs` and `run(**inputs)`, as the `Interpreter` has) and the
    identity of the LOGOS program it was made from."""

    program: Any
    identity: Identity


def checked_prompt(spec: ModelSpec, prompt_ids: Sequence[int]) -> list[int]:
    """The prompt's ids (from 0) as a list, refusing an empty prompt or an id outside the vocabulary."""
    prompt = [int(i) for i in prompt_ids]
    if not prompt:
        raise LogosError("the prompt is empty: generation needs at least one token")
    bad = [i for i in prompt if not 0 <= i < spec.vocab]
    if bad:
        raise LogosError(f"prompt ids {bad[:5]} are outside the vocabulary (ids 0 to {spec.vocab - 1})")
    return prompt


def cache_for(ctx: int | None, prompt_length: int, max_new_tokens: int) -> int:
    """The cache length of a call: `ctx`, or `default_ctx`; refused when the prompt does not fit it."""
    ctx = ctx or default_ctx(prompt_length, max_new_tokens)
    if prompt_length > ctx:
        raise LogosError(
            f"the prompt's {prompt_length} tokens do not fit a cache of {ctx} positions",
            hint="give the generator a longer ctx",
        )
    return ctx


OnToken = Callable[[int], "bool | None"]


def greedy(
    token: int,
    position: int,
    ctx: int,
    max_new_tokens: int,
    eos_id: int | None,
    on_token: OnToken | None,
    step: Callable[[int, int], int] | None,
    stats: GenerationStats,
    sampler: Sampler | None = None,
    logits: Callable[[], Any] | None = None,
    started: float | None = None,
) -> list[int]:
    """Emit the token chosen from `token` (the backend's arg-max, from 1, predicted for `position`), then
    `step(token, position)` (the backend's next arg-max, from 1) until `max_new_tokens` are out, the
    end-of-sequence id (from 0) comes, `on_token` returns True or the cache is full; the new ids from 0. `step`
    None: only the first token is wanted or fits. `sampler` (None: greedy) chooses each token from the arg-max and
    `logits()`, the logits the backend read it from; `started` is when the call began (for the time to the first
    token)."""
    sampler = sampler or Sampler()

    def choose(argmax: int) -> int:
        return sampler.choose(argmax - 1, None if sampler.greedy or logits is None else logits()) + 1

    new: list[int] = []
    clock = time.perf_counter()
    token = choose(token)
    stats.first_token_s = time.perf_counter() - (started if started is not None else clock)
    while True:
        new.append(token - 1)
        sampler.accept([token - 1])
        if on_token is not None and on_token(token - 1):
            stats.stop = "stop"
        elif token - 1 == eos_id:
            stats.stop = "eos"
        elif len(new) >= max_new_tokens:
            stats.stop = "length"
        elif position > ctx or step is None:
            stats.stop = "ctx" if position > ctx else "length"
        if stats.stop or step is None:
            break
        token = choose(step(token, position))
        position += 1
        stats.decode_steps += 1
    stats.decode_s = time.perf_counter() - clock
    stats.new_tokens = len(new)
    return new


def reused_prefix(cached: Sequence[int], prompt: Sequence[int]) -> int:
    """How many of `prompt`'s tokens the cache already holds: their longest common prefix, less one when it is
    the whole prompt (the last token must run to give the next one)."""
    same = 0
    for a, b in zip(cached, prompt, strict=False):
        if a != b:
            break
        same += 1
    return min(same, len(prompt) - 1)


@dataclass
class _Call:
    """What one `generate` call starts from: when it was made, its prompt (checked, ids from 0), its cache length,
    its sampler and how many of the prompt's tokens the cache keeps from the last call."""

    called: float
    prompt: list[int]
    ctx: int
    sampler: Sampler
    kept: int


class _Generation:
    """What both generators keep between calls: the model's spec, the cache length (None: sized per call), the
    timings of the last call and the tokens the cache holds."""

    def __init__(self, weights: WeightStore, ctx: int | None):
        if ctx is not None and ctx < 1:
            raise LogosError(f"the cache holds at least 1 position, not {ctx}")
        self.weights, self.spec, self.ctx = weights, weights.spec, ctx
        self.stats = GenerationStats()
        self._cached: tuple[int, list[int]] = (0, [])  # the cache length and the tokens (from 0) it holds

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens (ids from 0) the cache holds after the last `generate`: the prompt and every new token but
        the last (which no step has fed yet)."""
        return list(self._cached[1])

    def _begin(
        self, prompt_ids: Sequence[int], max_new_tokens: int, sampler: Sampler | None, keep_cache: bool
    ) -> _Call:
        """Check the prompt, size the cache, find what it keeps of this prompt (`keep_cache`: a common prefix with
        the last call's tokens, same cache length) and start the call's stats."""
        called = time.perf_counter()
        prompt = checked_prompt(self.spec, prompt_ids)
        ctx = cache_for(self.ctx, len(prompt), max_new_tokens)
        kept = reused_prefix(self._cached[1], prompt) if keep_cache and self._cached[0] == ctx else 0
        self.stats = GenerationStats(prompt_tokens=len(prompt) - kept, cached_tokens=kept)
        self._cached = (ctx, prompt[:kept])
        return _Call(called, prompt, ctx, sampler or Sampler(), kept)

    def _end(self, call: _Call, new: list[int]) -> list[int]:
        """Record what the cache holds after the call (the last new token is not fed yet); its new tokens."""
        self._cached = (call.ctx, call.prompt + new[: self.stats.decode_steps])
        return new


class Generator(_Generation):
    """Greedy generation for the model in `weights` over a cache of `ctx` positions (None: sized per call with
    `default_ctx`), the prompt fed `prefill_rows` tokens at a time, split over `tp` chips when tp > 1. `stats`
    holds the timings of the last `generate`."""

    def __init__(self, weights: WeightStore, ctx: int | None = None, prefill_rows: int = 16, tp: int = 1):
        if prefill_rows < 1:
            raise LogosError(f"a prefill chunk has at least 1 row, not {prefill_rows}")
        if tp < 1:
            raise LogosError(f"generation runs on at least 1 chip, not {tp}")
        super().__init__(weights, ctx)
        self.prefill_rows, self.tp = prefill_rows, tp
        self._programs: dict[Cut, Compiled] = {}
        self._states: dict[int, KVState] = {}
        self._used: dict[Cut, Identity] = {}
        self.prompt_by_step = tp > 1  # feed the prompt through the decode step (no prefill program to run)
        self._last: Any = None  # the program that ran last (its logits are the ones the next choice reads)

    # -- programs --------------------------------------------------------------------------------------------

    def program(self, cut: Cut) -> Any:
        """The compiled program for `cut` (split over `tp` chips when tp > 1), compiled on first use."""
        compiled = self._programs.get(cut)
        if compiled is None:
            compiled = self._programs[cut] = self.compile_program(cut)
        self._used[cut] = compiled.identity
        return compiled.program

    def compile_program(self, cut: Cut) -> Compiled:
        """The hook a lane overrides: `cut` as the author writes it, made runnable. Here: parsed, and compiled by
        the reference interpreter over the KV state of its cache length."""
        from logos_ir.parser import parse_program

        if self.tp > 1:
            authored, identity = written_split(self.spec, cut, "", self.tp)
        else:
            authored, identity = written(self.spec, cut)
        program = parse_program(authored.text, f"<{cut.option()}>")
        return Compiled(Interpreter(program, self.weights, self.kv_state(cut.ctx or 1)), identity)

    def kv_state(self, ctx: int) -> Any:
        """The hook a lane overrides: where the caches of length `ctx` live. Here one `KVState` per cache length,
        shared by every program over that length."""
        state = self._states.get(ctx)
        if state is None:
            state = self._states[ctx] = KVState()
        return state

    @property
    def identities(self) -> list[Identity]:
        """The identities of the programs the last `generate` ran, in the order it first ran them."""
        return list(self._used.values())

    # -- generating ------------------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        eos_id: int | None = None,
        on_token: OnToken | None = None,
        *,
        sampler: Sampler | None = None,
        keep_cache: bool = False,
    ) -> list[int]:
        """The continuation of `prompt_ids` (ids from 0): up to `max_new_tokens` new ids (from 0), stopping after
        `eos_id` (which is returned), when `on_token` returns True or when the cache is full. Each token is the
        backend's arg-max unless `sampler` chooses otherwise. `keep_cache`: keep what the cache holds of this
        prompt (a common prefix with the last call's tokens, same cache length) and feed only the rest."""
        call = self._begin(prompt_ids, max_new_tokens, sampler, keep_cache)
        prompt, ctx, kept = call.prompt, call.ctx, call.kept
        self._used = {}
        if not kept:
            self.kv_state(ctx).reset()
        if max_new_tokens <= 0:
            return []
        call.sampler.reset()
        call.sampler.accept(prompt)
        self._prepare(len(prompt), ctx, max_new_tokens, kept)
        self.stats.prepare_s = time.perf_counter() - call.called
        started = time.perf_counter()
        token = self._prefill(prompt, ctx, kept)
        self.stats.prefill_s = time.perf_counter() - started
        new = self._decode(token, len(prompt) + 1, ctx, max_new_tokens, eos_id, on_token, call.sampler, call.called)
        return self._end(call, new)

    def _chunks(self, length: int, start: int) -> list[tuple[int, int]]:
        """The prefill chunks (first position, from 0; rows) of a prompt of `length` tokens fed from `start`."""
        return [(s, min(self.prefill_rows, length - s)) for s in range(start, length, self.prefill_rows)]

    def _prepare(self, prompt_length: int, ctx: int, max_new_tokens: int, start: int = 0) -> None:
        """Author and compile every program this call will run before the clock starts (and in running order,
        so `identities` lists them as they run)."""
        if not self.prompt_by_step:
            for count in sorted({rows for _, rows in self._chunks(prompt_length, start)}, reverse=True):
                self.program(Cut.prefill(count, ctx))
        if self.prompt_by_step or (max_new_tokens > 1 and prompt_length < ctx):
            self.program(Cut.decode(ctx))

    def _prefill(self, prompt: list[int], ctx: int, start: int = 0) -> int:
        """Run the prompt (from its token `start`, the ones before already cached) through the cache; the first
        new token, from 1."""
        if self.prompt_by_step:
            # Prefill is not splittable (only decode steps and batches are), so a split run feeds the prompt
            # through the split decode step, one token at a time: the same cache, filled position by position.
            step = self._last = self.program(Cut.decode(ctx))
            for position in range(start + 1, len(prompt) + 1):
                out = run_program(step, [prompt[position - 1] + 1], [position])
            return int(out[0])
        for first, rows in self._chunks(len(prompt), start):
            chunk = prompt[first : first + rows]
            program = self._last = self.program(Cut.prefill(rows, ctx))  # a shorter chunk gets its own program
            out = run_program(program, [t + 1 for t in chunk], list(range(first + 1, first + rows + 1)))
        return int(out[0])

    def _decode(
        self,
        token: int,
        position: int,
        ctx: int,
        max_new_tokens: int,
        eos_id: int | None,
        on_token: OnToken | None,
        sampler: Sampler | None = None,
        started: float | None = None,
    ) -> list[int]:
        """Emit the token chosen from `token` (from 1, predicted for `position`), then decode until a stop; the
        new ids from 0."""
        program = self.program(Cut.decode(ctx)) if max_new_tokens > 1 and position <= ctx else None

        def step(token: int, position: int) -> int:
            self._last = program
            return int(run_program(program, [token], [position])[0])

        def logits() -> Any:
            return getattr(self._last, "logits", None)

        return greedy(
            token,
            position,
            ctx,
            max_new_tokens,
            eos_id,
            on_token,
            step if program else None,
            self.stats,
            sampler,
            logits,
            started,
        )


class BuildGenerator(Generator):
    """The reference interpreter running the LOGOS program of a `logos` build folder (`logos-compile --target
    logos`): its `program.logos`, a whole decode step (split over chips where it was built so), read from the folder
    rather than authored anew. The folder holds no prefill program, so the prompt goes through that decode step one
    token at a time, as on a split run. `logos-run` checks the folder against its manifest first."""

    PROGRAM = "program.logos"

    def __init__(self, weights: WeightStore, folder: Any, ctx: int | None = None):
        from pathlib import Path

        from logos_ir.build import read_manifest

        self.folder = Path(folder)
        target = read_manifest(self.folder).get("target")
        if not isinstance(target, dict) or not isinstance(target.get("cut"), str):
            raise LogosError(f"{self.folder}: the manifest names no target cut")
        self.cut = Cut.parse(str(target["cut"]))
        tp = target.get("tp", 1)
        if self.cut.kind != "decode" or not isinstance(tp, int) or tp < 1:
            raise LogosError(
                f"{self.folder}: a build of '{self.cut.option()}' is not a whole decode step: logos-run generates"
                " from a build of 'decode ctx=N'"
            )
        if ctx is not None and ctx != self.cut.ctx:
            raise LogosError(f"{self.folder}: the build's cache holds {self.cut.ctx} positions, not {ctx} (--ctx)")
        super().__init__(weights, ctx=self.cut.ctx, tp=tp)
        self.prompt_by_step = True

    def compile_program(self, cut: Cut) -> Compiled:
        from logos_ir.identity import identity
        from logos_ir.parser import parse_program

        if cut != self.cut:
            raise LogosError(f"{self.folder}: the build holds '{self.cut.option()}', not '{cut.option()}'")
        path = self.folder / self.PROGRAM
        program = parse_program(path.read_text(encoding="utf-8"), str(path))
        return Compiled(Interpreter(program, self.weights, self.kv_state(cut.ctx or 1)), identity(program))


class StepMachine(Protocol):
    """A lane's machine that holds the model in place and takes one token at a time (ids and positions from 1)."""

    @property
    def identities(self) -> Sequence[Identity]: ...

    def reset(self) -> None: ...

    def step(self, token: int, position: int) -> int: ...


class StepGenerator(_Generation):
    """Greedy generation on a machine that runs the decode step alone: the prompt goes through it one token at a
    time, as on a chip that holds the model in place, then each new token. A subclass gives `machine(ctx)` (one
    per cache length, made on first use)."""

    def __init__(self, weights: WeightStore, ctx: int | None = None):
        super().__init__(weights, ctx)
        self._machines: dict[int, StepMachine] = {}
        self._machine: StepMachine | None = None

    def machine(self, ctx: int) -> StepMachine:
        """The hook a lane overrides: its machine for a cache of `ctx` positions."""
        raise LogosError(f"{type(self).__name__} gives no machine to run")

    def _machine_for(self, ctx: int) -> StepMachine:
        machine = self._machines.get(ctx)
        if machine is None:
            machine = self._machines[ctx] = self.machine(ctx)
        return machine

    @property
    def identities(self) -> list[Identity]:
        """The identities of the programs the last `generate` ran."""
        return list(self._machine.identities) if self._machine is not None else []

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        eos_id: int | None = None,
        on_token: OnToken | None = None,
        *,
        sampler: Sampler | None = None,
        keep_cache: bool = False,
    ) -> list[int]:
        """As `Generator.generate`."""
        call = self._begin(prompt_ids, max_new_tokens, sampler, keep_cache)
        prompt, ctx, kept = call.prompt, call.ctx, call.kept
        if max_new_tokens <= 0:
            return []
        machine = self._machine = self._machine_for(ctx)
        if not kept:
            machine.reset()
        call.sampler.reset()
        call.sampler.accept(prompt)
        self.stats.prepare_s = time.perf_counter() - call.called
        started = time.perf_counter()
        for position in range(kept + 1, len(prompt) + 1):
            predicted = machine.step(prompt[position - 1] + 1, position)
        self.stats.prefill_s = time.perf_counter() - started
        new = greedy(
            predicted,
            len(prompt) + 1,
            ctx,
            max_new_tokens,
            eos_id,
            on_token,
            machine.step,
            self.stats,
            call.sampler,
            lambda: getattr(machine, "logits", None),
            call.called,
        )
        return self._end(call, new)


def run_program(program: Any, tokens: list[int], positions: list[int]) -> np.ndarray:
    """Run a program on tokens and positions (from 1), bound to its inputs of those kinds, whatever their
    names (`token` for one row, `tokens` for several)."""
    names = {kind: name for name, kind in program.inputs.items()}
    return program.run(
        **{
            names["token"]: np.array(tokens, dtype=np.int64),
            names["position"]: np.array(positions, dtype=np.int64),
        }
    )
