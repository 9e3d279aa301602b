"""`logos-run`: generation with a model's LOGOS programs, on the reference interpreter or a lane's backend, or from
a build folder that `logos-compile` wrote.

    logos-run [BUILD_DIR | PROGRAM.logos [--strict]] [--model MODEL]
              [--prompt TEXT | --prompt - | --prompt-file FILE | --prompt-ids 1,2,3]
              [--system TEXT] [--raw] [-i] [--max-new-tokens 32] [--temperature T --top-k K --top-p P --min-p P
              --repeat-penalty R --repeat-last-n N --seed S] [--stop TEXT ...] [--backend B] [--emulate]
              [--weights f32|bf16|f16] [--tp N] [--ctx N] [--json]

`BUILD_DIR` (a folder `logos-compile` wrote) is checked against its manifest first, as `logos-compile --check`
does, and a folder that does not match is refused before anything runs; then its target's backend runs its
artifacts (the `logos` target: its LOGOS program on the reference interpreter), with the model its manifest names
(or `--model`, which must be that model). A LOGOS program (`PROGRAM.logos`, a whole `decode ctx=N` step, say
one `logos-author` wrote and a person edited) runs alone on the reference interpreter with `--model`'s weights, its
cut and chips fixed by its text; one that is not the program the author writes for that model, cut and chips is
said on standard error, and refused with `--strict`. With no `--model` it runs the embedded SmolLM2-135M-Instruct.
A prompt goes through the model's chat template when it has one (`--raw` sends the text as it is); with no prompt, the
question "What is the capital of France?". The tokens are the backend's arg-max (greedy) unless `--temperature`
is above 0 or a repetition penalty is set: then `logos_ir.sampling` draws them from the backend's logits, seeded
by `--seed`. The answer streams to standard output as it is generated (with `--json`, one JSON object per answer
instead); the timing line (time to the first token, prompt and decode tokens per second) goes to standard error.
`-i` holds a conversation: each line of standard input is a user turn, the cache kept between turns; Ctrl-C stops
an answer and returns to the prompt. llama-cli's options mean what they mean there: `-m`, `-p`, `-f`, `-n` (-1:
until the end of the text or of the cache), `-c`/`--ctx-size`, `-t`/`--threads` (the BLAS threads), `-s`, `-sys`,
`-cnv`, `--chat-template`, `--temp`, `--top-k`, `--top-p`, `--min-p`, `--repeat-penalty`, `--repeat-last-n`;
`-ngl` is read and has no effect (the backend decides where layers run). The load time (reading the model,
authoring and compiling its programs) is reported apart from the time to the first token. Heavy modules are
imported inside `main`, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from logos_ir.cli import LARGEST, add_common, count, fraction, positive, run_tool
from logos_ir.errors import LogosError

TOOL = "logos-run"
DEFAULT_QUESTION = "What is the capital of France?"
INTERACTIVE_CTX = 2048  # the cache of a conversation when --ctx is not given
TARGET_BACKEND = {"logos": "reference"}  # a build target's backend, where the names differ


def _ids(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if text.strip() and parts[-1] == "":
        parts.pop()  # one trailing comma is forgiven
    if not text.strip() or any(not part for part in parts):
        raise argparse.ArgumentTypeError(f"'{text}': give one or more token ids, from 0, separated by single commas")
    try:
        ids = [int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated whole numbers: '{text}'") from None
    if any(i < 0 or i > LARGEST for i in ids):
        raise argparse.ArgumentTypeError(f"'{text}': token ids count from 0")
    return ids


def _new_tokens(text: str) -> int:
    """`-n`: a count from 0, or -1 (llama-cli's "until the end of the text or of the cache")."""
    if text.strip() == "-1":
        return -1
    return count(text)


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=TOOL,
        description="Generate text with a model's LOGOS programs, on the reference interpreter or a lane's backend, "
        "or run a build folder that logos-compile wrote.",
    )
    parser.add_argument(
        "build",
        nargs="?",
        metavar="BUILD_DIR|PROGRAM",
        help="a build folder (logos-compile -o): checked, then run; or a LOGOS program (a whole 'decode ctx=N' "
        "step, e.g. written by logos-author and edited), run on the reference backend with --model's weights",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse a LOGOS program that is not the one the author writes for the model (default: a warning)",
    )
    add_common(parser, TOOL)
    prompt = parser.add_argument_group("the prompt")
    given = prompt.add_mutually_exclusive_group()
    given.add_argument("-p", "--prompt", help="the prompt text; '-' reads it from standard input")
    given.add_argument("-f", "--prompt-file", metavar="FILE", help="read the prompt from FILE ('-': standard input)")
    given.add_argument("--prompt-ids", type=_ids, help="the prompt as comma-separated token ids, from 0 (no template)")
    prompt.add_argument(
        "-sys", "--system", "--system-prompt", dest="system", help="a system message, for the chat template"
    )
    prompt.add_argument(
        "--chat-template",
        metavar="JINJA",
        help="a chat template (Jinja text, or 'chatml') used instead of the model's own",
    )
    template = prompt.add_mutually_exclusive_group()
    template.add_argument(
        "--chat", action="store_true", help="require the model's chat template (the default when it has one)"
    )
    template.add_argument("--raw", action="store_true", help="send the prompt as it is, without the chat template")
    prompt.add_argument(
        "-i",
        "--interactive",
        "-cnv",
        "--conversation",
        action="store_true",
        help="a conversation: each line of standard input is a turn (Ctrl-C stops an answer, end of input ends it)",
    )
    gen = parser.add_argument_group("generation")
    gen.add_argument(
        "-n",
        "--max-new-tokens",
        "--n-predict",
        dest="max_new_tokens",
        type=_new_tokens,
        default=32,
        help="how many tokens to generate at most (-1: until the end of the text or of the cache; default 32)",
    )
    gen.add_argument(
        "--ignore-eos", action="store_true", help="go on past the end-of-text token (llama-cli's --ignore-eos)"
    )
    gen.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="end the answer at this text (repeatable)"
    )
    gen.add_argument(
        "--temp",
        "--temperature",
        dest="temperature",
        type=fraction,
        default=0.0,
        help="0 (default): greedy; above 0: sample",
    )
    gen.add_argument("--top-k", type=count, default=40, help="sample from the K likeliest tokens (0: all; default 40)")
    gen.add_argument("--top-p", type=fraction, default=0.95, help="nucleus: the likeliest tokens reaching P (0.95)")
    gen.add_argument("--min-p", type=fraction, default=0.05, help="drop tokens below P times the likeliest (0.05)")
    gen.add_argument("--repeat-penalty", type=fraction, default=1.0, help="penalise repeated tokens (1: off)")
    gen.add_argument("--repeat-last-n", type=count, default=64, help="the penalty's window, in tokens (64)")
    gen.add_argument(
        "-s", "--seed", type=count, default=None, help="the sampling seed (default: a fresh one, reported)"
    )
    run = parser.add_argument_group("what runs it")
    backends = _backends()
    run.add_argument(
        "--backend",
        choices=sorted(backends),
        default=None,
        help="what runs the programs (default: reference, or a build's own): "
        + "; ".join(f"{b.name}: {b.description}" for b in backends.values()),
    )
    run.add_argument(
        "--emulate", action="store_true", help="run the backend's lowered kernels on the CPU (backends that have it)"
    )
    run.add_argument(
        "--weights",
        choices=["f32", "bf16", "f16"],
        default=None,
        help="the weight image the backend runs (default: the backend's own; f32 matches the reference exactly)",
    )
    run.add_argument("--tp", type=positive, default=None, help="split the decode step over this many chips")
    run.add_argument("--prefill-rows", type=positive, default=16, help="prompt tokens per prefill chunk")
    run.add_argument(
        "-c",
        "--ctx",
        "--ctx-size",
        dest="ctx",
        type=positive,
        default=None,
        help="cache positions (default: prompt plus new tokens, rounded up to 64; 2048 with -i; a build's own)",
    )
    run.add_argument(
        "--aocx", default=None, metavar="FILE", help="an engine compiled ahead of time (the d5005 backend)"
    )
    run.add_argument(
        "-t",
        "--threads",
        type=positive,
        default=None,
        help="the BLAS threads the CPU backends use (default: the cores not already busy, by the load average,"
        " at least 1; or what OMP_NUM_THREADS / OPENBLAS_NUM_THREADS say)",
    )
    run.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="gpu_layers",
        type=int,
        default=None,
        metavar="N",
        help="llama-cli's; here the backend decides where layers run (--backend cuda: all on the GPU), so it is "
        "read and has no effect",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per answer instead of the text")
    return parser


def _backends():  # type: ignore[no-untyped-def]
    from logos_ir import registry

    return registry.backends()


# -- the prompt ---------------------------------------------------------------------------------------------


def chat_text(template: str, messages: list[dict[str, str]]) -> str | None:
    """`messages` (role and content) in a model's chat template (a Jinja template from the model's files, rendered
    in a sandbox), ready for the assistant's answer; None when it cannot be rendered here."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None
    try:
        rendered = (
            ImmutableSandboxedEnvironment()
            .from_string(template)
            .render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")
        )
    except Exception:  # a template is the model file's code: any failure means "no usable template"
        return None
    return rendered if isinstance(rendered, str) and rendered else None


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NAMED_TEMPLATES = {"chatml": CHATML}  # llama-cli's --chat-template names that have a template here


def _chat_template(given: str | None) -> str | None:
    """`--chat-template`: a name logos-run knows, or Jinja text; None: the model's own."""
    if given is None:
        return None
    if given in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[given]
    if "{%" not in given and "{{" not in given:
        names = ", ".join(sorted(NAMED_TEMPLATES))
        raise LogosError(f"--chat-template {given}: not a template logos-run knows ({names}), nor Jinja text")
    return given


def _read_text(source: str, what: str) -> str:
    if source == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise LogosError(f"{what} {source}: not UTF-8 text") from None
    return text


def _question(args: argparse.Namespace) -> str | None:
    if args.prompt_file is not None:
        return _read_text(args.prompt_file, "--prompt-file")
    if args.prompt == "-":
        return _read_text("-", "--prompt")
    return args.prompt


class Conversation:
    """The turns so far, and the prompt ids they make for the next answer: in the model's chat template (unless
    raw), or as plain text."""

    def __init__(
        self, tokenizer: Any, model: str, system: str | None, raw: bool, chat: bool, template: str | None = None
    ):
        self.tokenizer, self.model, self.raw = tokenizer, model, raw
        if template is None:
            template = None if tokenizer is None else tokenizer.chat_template
        elif chat_text(template, [{"role": "user", "content": "?"}]) is None:
            raise LogosError("--chat-template cannot be rendered (give Jinja text, or 'chatml')")
        self.template = None if raw else template
        if chat and not template:
            raise LogosError(f"the model {model} has no chat template (--chat)")
        if self.template is not None and chat_text(self.template, [{"role": "user", "content": "?"}]) is None:
            if chat:
                raise LogosError(f"the model {model}'s chat template cannot be rendered here (--chat)")
            self.template = None
        if system is not None and self.template is None:
            why = "--raw sends the text as it is" if raw else f"the model {model} has no chat template"
            raise LogosError(f"--system needs a chat template: {why}")
        self.messages: list[dict[str, str]] = [] if system is None else [{"role": "system", "content": system}]
        self.text = ""  # the raw conversation so far

    def ask(self, question: str) -> list[int]:
        """The prompt ids for the answer to `question`, after the turns so far."""
        if self.template is None:
            self.text += question
            return self.tokenizer.encode(self.text)
        self.messages.append({"role": "user", "content": question})
        rendered = chat_text(self.template, self.messages)
        if rendered is None:
            raise LogosError(f"the model {self.model}'s chat template cannot render this conversation")
        return self.tokenizer.encode(rendered)

    def answered(self, answer: str) -> None:
        if self.template is None:
            self.text += answer
        else:
            self.messages.append({"role": "assistant", "content": answer})


# -- the answer as it grows ---------------------------------------------------------------------------------


class Stream:
    """The answer as it grows: its text, written to standard output as soon as it is sure (not a partial UTF-8
    character, not the start of a stop string), once. `__call__` takes each new token and returns True when a
    stop string has appeared (the text ends before it)."""

    def __init__(self, tokenizer: Any, stops: list[str], live: bool):
        self.tokenizer, self.stops, self.live = tokenizer, [s for s in stops if s], live
        self.ids: list[int] = []
        self.shown = 0
        self.text = ""
        self.stopped = False

    def __call__(self, token: int) -> bool:
        self.ids.append(token)
        if self.tokenizer is None:
            return False
        ids = self.ids[:-1] if token == self.tokenizer.eos_id else self.ids
        text = self.tokenizer.decode(ids)
        sure = len(text)
        if text.endswith("\ufffd"):  # a character whose bytes are not all out yet
            sure = len(text.rstrip("\ufffd"))
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
            self._show(cut)
            return True
        for stop in self.stops:  # hold back what may be the start of a stop string
            for length in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:length]):
                    sure = min(sure, len(text) - length)
                    break
        self.text = text
        self._show(sure)
        return False

    def _show(self, upto: int) -> None:
        if self.live and upto > self.shown:
            sys.stdout.write(self.text[self.shown : upto])
            sys.stdout.flush()
            self.shown = upto

    def finish(self) -> None:
        """The rest of the text (held back for a stop string that did not come), and the line's end."""
        if self.tokenizer is None:
            if self.live:
                print(",".join(str(i) for i in self.ids))
            return
        if not self.stopped:
            self._show(len(self.text))
        if self.live:
            sys.stdout.write("\n")
            sys.stdout.flush()


# -- what runs ----------------------------------------------------------------------------------------------


class Progress:
    """On a terminal, a line on standard error saying what is under way and for how long, once it has taken a
    second (loading a large model or compiling its programs can take minutes); cleared when it ends."""

    def __init__(self, what: str):
        import threading

        self.what = what
        self.done = threading.Event()
        self.shown = False
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> Progress:
        if sys.stderr.isatty() and launched_rank() == 0:
            self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.done.is_set():
            return
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    def _tick(self) -> None:
        started = time.perf_counter()
        while not self.done.wait(1.0):
            sys.stderr.write(f"\r{TOOL}: {self.what} ({time.perf_counter() - started:.0f} s)")
            sys.stderr.flush()
            self.shown = True


def _weights_for(backend: Any, wanted: str | None) -> str:
    """The weight image to run: the one asked for, if the backend runs it, else the backend's default."""
    if wanted is None:
        return str(backend.weights[0])
    if wanted not in backend.weights:
        raise LogosError(f"the {backend.name} backend runs weights {', '.join(backend.weights)}, not {wanted}")
    return wanted


class Plan:
    """What runs: the backend, the model's weights and tokenizer, the cache, the chips, the weight image and,
    for a build folder, the folder."""

    def __init__(self, args: argparse.Namespace):
        from logos_ir.models import ModelSource

        self.args = args
        self.build: Path | None = None
        self.loaded_s = 0.0  # loading the model and authoring and compiling its programs, until it is reported
        self.backend_name = args.backend or "reference"
        self.tp, self.weights, self.ctx = args.tp or 1, args.weights, args.ctx
        if args.model is not None and (Path(args.model) / "manifest.json").is_file():
            raise LogosError(
                f"{args.model} is a build folder, not a model",
                hint=f"run a build with: logos-run {args.model} (the model is the one its manifest names)",
            )
        self.program: Any = None  # a LOGOS program given instead of a build folder, and its identity
        if args.build is not None and Path(args.build).is_file():
            self.source = self._from_program(Path(args.build))
        elif args.build is not None:
            self.source = self._from_build(Path(args.build))
        else:
            self.source = ModelSource.resolve(args.model, seed=args.model_seed)
        backend = _backends()[self.backend_name]
        self.backend = backend
        self.weights = _weights_for(backend, self.weights)
        if args.emulate and not backend.emulates:
            raise LogosError(f"the {backend.name} backend has no --emulate mode")
        self.aocx = None
        if args.aocx is not None:
            self.aocx = Path(args.aocx)
            if not self.aocx.is_file():
                raise LogosError(f"--aocx {args.aocx}: no such file")
        _refuse_too_large(self.source.spec, self.source.kind, self.ctx)
        self.store = self.source.store()

    def _from_build(self, folder: Path) -> Any:
        """Check the folder against its manifest (refusing one that does not match), then take its target, cut,
        chips, weight image and model."""
        from logos_ir.build import check_build, read_manifest
        from logos_ir.models import ModelSource, check_model_matches
        from logos_ir.program import Cut

        report = check_build(folder)
        if not report.ok:
            raise LogosError(
                f"{folder}: the build does not match its manifest ({'; '.join(report.lines()[:4])}): refused",
                hint=f"rebuild it, or see logos-compile --check {folder}",
            )
        manifest = read_manifest(folder)
        target, recorded = manifest.get("target") or {}, manifest.get("model") or {}
        name = str(target.get("name"))
        backend = TARGET_BACKEND.get(name, name)
        if backend not in _backends():
            raise LogosError(f"{folder}: no backend runs a build of target '{name}'")
        if self.args.backend is not None and self.args.backend != backend:
            raise LogosError(
                f"{folder}: a build of target '{name}' runs on the {backend} backend, not {self.args.backend}"
            )
        for flag, mine, theirs in (
            ("--tp", self.args.tp, target.get("tp")),
            ("--weights", self.args.weights, target.get("weights")),
        ):
            if mine is not None and mine != theirs:
                raise LogosError(f"{folder}: the build was made with {flag} {theirs}, not {mine}")
        cut = Cut.parse(str(target.get("cut")))
        if self.args.ctx is not None and cut.ctx is not None and self.args.ctx != cut.ctx:
            raise LogosError(f"{folder}: the build's cache holds {cut.ctx} positions, not {self.args.ctx} (--ctx)")
        self.build, self.backend_name = folder, backend
        self.tp, self.weights, self.ctx = int(target.get("tp", 1)), str(target.get("weights")), cut.ctx
        kind = recorded.get("kind")
        self._refuse_seed(folder, kind, recorded)
        if self.args.model is not None:
            seed = recorded.get("seed", 0) if kind == "preset" and self.args.model_seed == 0 else self.args.model_seed
            storage = recorded.get("storage") if kind == "preset" else None  # a preset stored by the quantizer
            source = ModelSource.resolve(self.args.model, seed=seed, storage=storage)
        elif kind == "preset":
            seed = int(recorded.get("seed", 0))
            source = ModelSource.resolve(str(recorded.get("name")), seed=seed, storage=recorded.get("storage"))
        elif kind in ("embedded", "hub"):
            source = ModelSource.resolve(None if kind == "embedded" else str(recorded.get("name")))
        else:
            raise LogosError(
                f"{folder}: the build was made from a {kind} ('{recorded.get('name')}'), which the manifest names "
                "without its path",
                hint="give --model the folder or file it was built from",
            )
        check_model_matches(source, recorded)
        return source

    def _from_program(self, path: Path) -> Any:
        """A hand-written LOGOS program: parsed, refused unless it is a whole decode step, run on the reference
        backend with --model's weights. Its identity is checked against the program the author writes for that
        model, cut and chips: a difference is a warning (refused with --strict)."""
        from logos_ir.author import written, written_split
        from logos_ir.identity import identity
        from logos_ir.models import ModelSource
        from logos_ir.parser import parse_program

        program = parse_program(path.read_bytes(), str(path))
        mine = identity(program)
        cut, chips = mine.cut, mine.chips
        if cut.kind != "decode":
            raise LogosError(
                f"{path}: a program of '{cut.option()}' is not a whole decode step: logos-run runs a program of "
                "'decode ctx=N'",
                hint="write it with: logos-author --cut 'decode ctx=N'",
            )
        args = self.args
        if args.backend not in (None, "reference"):
            raise LogosError(f"{path}: a LOGOS program runs on the reference backend, not {args.backend}")
        for flag, given, fixed in (("--tp", args.tp, chips), ("--ctx", args.ctx, cut.ctx)):
            if given is not None and given != fixed:
                raise LogosError(f"{path}: the program fixes {flag} {fixed}, not {given}")
        if args.emulate or args.aocx is not None:
            raise LogosError(f"{path}: a LOGOS program runs on the reference interpreter: no --emulate or --aocx")
        source = ModelSource.resolve(args.model, seed=args.model_seed)
        split = any(op.name == "shard.grid" for op in program.block.ops)  # "The program runs on N chips."
        if split:
            _, theirs = written_split(source.spec, cut, "", chips)
        else:
            _, theirs = written(source.spec, cut)
        if theirs != mine:
            what = (
                f"{path}: not the program the author writes for the model {source.name} ({theirs.line()}): its text "
                f"hashes to sha256 {mine.hex()}"
            )
            if args.strict:
                raise LogosError(f"{what}: refused (--strict)", hint="run it without --strict to run it anyway")
            print(f"{TOOL}: warning: {what}", file=sys.stderr)
        self.program = (program, mine)
        self.tp, self.ctx = chips, cut.ctx
        return source

    def _refuse_seed(self, folder: Path, kind: Any, recorded: dict[str, Any]) -> None:
        """--model-seed chooses a preset's random weights, which a build's manifest fixes: a different one is
        refused, not ignored."""
        seed = self.args.model_seed
        if seed == 0 or self.args.model is not None:
            return
        if kind != "preset":
            raise LogosError(f"{folder}: --model-seed makes a preset's weights; the build's model is the {kind} one")
        if seed != int(recorded.get("seed", 0)):
            raise LogosError(f"{folder}: the build was made with --model-seed {recorded.get('seed', 0)}, not {seed}")

    def generator(self) -> Any:
        from logos_ir.runtime import RunRequest

        if self.program is not None:
            return program_generator(self.store, *self.program)

        request = RunRequest(
            self.store,
            self.ctx,
            self.args.prefill_rows,
            self.tp,
            self.weights,
            self.args.emulate,
            build=self.build,
            aocx=self.aocx,
        )
        return self.backend.generator()(request)

    def run_command(self) -> str:
        return f"logos-run {self.build}" if self.build is not None else TOOL


def program_generator(weights: Any, program: Any, identity: Any) -> Any:
    """A generator running the hand-written `program` (a whole decode step, with its `identity`) on the reference
    interpreter (made here, so --help imports no numpy)."""
    from logos_ir.generate import Compiled, Generator
    from logos_ir.interpreter import Interpreter

    class ProgramGenerator(Generator):
        """The reference interpreter running one given LOGOS program, split over its chips where it is: the prompt
        goes through it one token at a time, then each new token, so nothing the author writes runs beside it."""

        def __init__(self) -> None:
            super().__init__(weights, ctx=identity.cut.ctx, tp=identity.chips)
            self.prompt_by_step = True

        def compile_program(self, cut: Any) -> Any:
            if cut != identity.cut:
                raise LogosError(f"the program is '{identity.cut.option()}', not '{cut.option()}'")
            return Compiled(Interpreter(program, self.weights, self.kv_state(cut.ctx or 1)), identity)

    return ProgramGenerator()


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _refuse_too_large(spec: Any, kind: str, ctx: int | None) -> None:
    """Refuse, before anything is allocated, a cache or a preset's random weights larger than this machine's
    memory (float32: a preset's weights are made in memory, a cache of ctx positions is 2 x layers x ctx x kv
    width floats)."""
    memory = _physical_memory()
    if memory is None:
        return
    gib = 1 << 30
    if kind == "preset":
        weights = sum(_product(shape) for _, shape in spec.weights()) * 4
        if weights > memory:
            raise LogosError(
                f"the preset's random weights take {weights / gib:.1f} GiB as float32, more than this machine's "
                f"{memory / gib:.1f} GiB of memory",
                hint="give a smaller preset (--list-models), or compile it with logos-compile (which reads no weight)",
            )
    if ctx is not None:
        cache = 2 * spec.layers * ctx * spec.kv_dim * 4
        if cache > memory:
            raise LogosError(
                f"a cache of {ctx} positions takes {cache / gib:.1f} GiB for this model, more than this machine's "
                f"{memory / gib:.1f} GiB of memory",
                hint="give a smaller --ctx (or fewer --max-new-tokens)",
            )


def _product(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


# -- generating ---------------------------------------------------------------------------------------------


def _sampler(args: argparse.Namespace, backend: str) -> Any:
    from logos_ir.sampling import Sampler, SamplingSettings, new_seed

    settings = SamplingSettings(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        seed=new_seed() if args.seed is None else args.seed,
    )
    return Sampler(settings, backend=backend)


def _fits(ctx: int, prompt: int, new: int, cached: int = 0) -> None:
    """Refuse an answer that cannot fit the cache: the prompt and every new token but the last take a position."""
    if prompt > ctx:
        raise LogosError(
            f"the prompt's {prompt} tokens do not fit a cache of {ctx} positions", hint="give a larger --ctx"
        )
    if prompt + new - 1 > ctx:
        room = ctx - prompt + 1
        raise LogosError(
            f"--max-new-tokens {new} does not fit: the prompt's {prompt} tokens leave room for {room} new tokens in a "
            f"cache of {ctx} positions",
            hint=f"give --ctx at least {prompt + new - 1}, or --max-new-tokens {room}",
        )


def _report(
    plan: Plan, generator: Any, prompt: list[int], new: list[int], stream: Stream, sampler: Any, ctx: int
) -> dict[str, Any]:
    stats = generator.stats
    tokenizer = stream.tokenizer
    text = stream.text if tokenizer is not None else None
    return {
        "model": plan.store.source,
        "backend": plan.backend_name,
        "build": None if plan.build is None else str(plan.build),
        "emulate": plan.args.emulate,
        "weights": plan.weights,
        "tp": plan.tp,
        "ctx": ctx,
        "prompt_ids": prompt,
        "new_ids": new,
        "text": text,
        "stop_reason": stats.stop,
        "sampling": sampler.settings.describe(),
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "ttft_s": round(first_token_s(stats), 4),
        "load_s": round(plan.loaded_s, 4),
        "prompt_tokens_per_s": round(stats.prompt_tokens_per_s, 3),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 3),
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "prefill_s": round(stats.prefill_s, 4),
        "decode_s": round(stats.decode_s, 4),
        "wall_s": round(stats.prepare_s + stats.total_s, 4),
        "programs": [getattr(identity, "line", lambda i=identity: str(i))() for identity in generator.identities],
    }


def first_token_s(stats: Any) -> float:
    """The time to the first token from the prompt's arrival: the prefill and the first choice, not the loading
    and compiling before it (reported apart as the load time)."""
    return max(stats.first_token_s - stats.prepare_s, 0.0)


def timing_line(stats: Any, loaded_s: float = 0.0) -> str:
    return (
        f"{TOOL}: prompt {stats.prompt_tokens} tokens in {stats.prefill_s:.3f} s ({stats.prompt_tokens_per_s:.1f} "
        f"tokens/s), first token after {first_token_s(stats):.3f} s, {stats.new_tokens} new tokens, decode "
        f"{stats.decode_tokens_per_s:.1f} tokens/s"
        + (f" ({stats.cached_tokens} prompt tokens from the cache)" if stats.cached_tokens else "")
        + (f"; loading and compiling {loaded_s:.3f} s before it" if loaded_s > 0 else "")
    )


def new_tokens(asked: int, ctx: int, prompt: int) -> int:
    """How many tokens an answer may make: `-n`, or with -1 as many as the cache has room for."""
    return max(ctx - prompt + 1, 0) if asked < 0 else asked


def _ctx_for(plan: Plan, prompt: int) -> int:
    """The cache: the one given or fixed by the build; else room for the prompt and `-n` (2048 with -n -1)."""
    from logos_ir.generate import default_ctx

    if plan.ctx is not None:
        return plan.ctx
    if plan.args.max_new_tokens < 0:
        return max(INTERACTIVE_CTX, default_ctx(prompt, 1))
    return default_ctx(prompt, plan.args.max_new_tokens)


def _answer(
    plan: Plan,
    generator: Any,
    prompt: list[int],
    tokenizer: Any,
    sampler: Any,
    ctx: int,
    keep: bool,
    stream: Stream | None = None,
) -> tuple[Stream, list[int]]:
    args = plan.args
    stream = stream or Stream(tokenizer, args.stop, live=not args.json)
    eos = tokenizer.eos_id if tokenizer is not None and not args.ignore_eos else None
    wanted = new_tokens(args.max_new_tokens, ctx, len(prompt))
    waiting = Progress("compiling and reading the prompt, to the first token")

    def on_token(token: int) -> bool:
        waiting.stop()
        return stream(token)

    try:
        with waiting:
            new = generator.generate(prompt, wanted, eos_id=eos, on_token=on_token, sampler=sampler, keep_cache=keep)
    finally:
        stream.finish()
    plan.loaded_s += generator.stats.prepare_s  # authoring and compiling the programs this answer needed
    if args.json:
        print(json.dumps(_report(plan, generator, prompt, new, stream, sampler, ctx)), flush=True)
    seed = "" if sampler.greedy else f" (sampled, --seed {sampler.settings.seed})"  # so a run can be repeated
    if launched_rank() != 0:
        return stream, new  # rank 0 reports for every rank
    print(timing_line(generator.stats, plan.loaded_s) + seed, file=sys.stderr)
    plan.loaded_s = 0.0
    if generator.stats.stop == "ctx":
        print(f"{TOOL}: the cache of {ctx} positions is full: the answer ends there", file=sys.stderr)
    return stream, new


def _generate(args: argparse.Namespace) -> int:
    from logos_ir.errors import TokenizerError
    from logos_ir.tokenizer import Tokenizer

    if args.interactive and (args.prompt == "-" or args.prompt_file == "-"):
        raise LogosError("-i reads the conversation from standard input: give the first turn with --prompt TEXT")
    started = time.perf_counter()
    with Progress("reading the model"):
        plan = Plan(args)
    plan.loaded_s = time.perf_counter() - started
    try:
        tokenizer = Tokenizer.from_store(plan.store)
    except TokenizerError as error:
        if args.prompt_ids is None or args.stop:  # text in or out needs the tokenizer
            raise
        print(f"{TOOL}: warning: {error.message}; the answer is given as token ids", file=sys.stderr)
        tokenizer = None
    model = plan.store.source
    if args.gpu_layers and plan.backend_name != "cuda":
        print(f"{TOOL}: note: -ngl has no effect: the {plan.backend_name} backend runs on the CPU", file=sys.stderr)
    sampler = _sampler(args, plan.backend_name)
    if args.prompt_ids is not None:
        if args.interactive:
            raise LogosError("-i takes text turns: --prompt-ids cannot start a conversation")
        if args.system is not None or args.chat:
            raise LogosError("--prompt-ids is sent as it is: --system and --chat need a text prompt")
        if args.stop and tokenizer is None:
            raise LogosError(f"--stop needs text, and the model {model} has no tokenizer to make it")
        prompt = list(args.prompt_ids)
        if any(i >= plan.store.spec.vocab for i in prompt):
            raise LogosError(f"--prompt-ids: ids run from 0 to {plan.store.spec.vocab - 1} for this model")
        ctx = _ctx_for(plan, len(prompt))
        _fits(ctx, len(prompt), max(new_tokens(args.max_new_tokens, ctx, len(prompt)), 1))
        _refuse_too_large(plan.store.spec, "", ctx)
        _answer(plan, _generator_for(plan, ctx), prompt, tokenizer, sampler, ctx, False)
        return 0
    if tokenizer is None:
        raise LogosError(f"the model {model} has no tokenizer: give the prompt as --prompt-ids (ids from 0)")
    conversation = Conversation(tokenizer, model, args.system, args.raw, args.chat, _chat_template(args.chat_template))
    first = _question(args)
    if not args.interactive:
        prompt = conversation.ask(DEFAULT_QUESTION if first is None else first)
        ctx = _ctx_for(plan, len(prompt))
        _fits(ctx, len(prompt), max(new_tokens(args.max_new_tokens, ctx, len(prompt)), 1))
        _refuse_too_large(plan.store.spec, "", ctx)
        _answer(plan, _generator_for(plan, ctx), prompt, tokenizer, sampler, ctx, False)
        return 0
    return _chat(plan, conversation, first, tokenizer, sampler)


def _generator_for(plan: Plan, ctx: int) -> Any:
    if plan.ctx is None:
        plan.ctx = ctx
    trained = getattr(plan.store, "trained_ctx", None)
    if trained is not None and plan.ctx > trained:  # llama.cpp's warning: computed alike, but past what it learned
        print(
            f"{TOOL}: warning: a cache of {plan.ctx} positions is longer than the {trained} the model was trained on",
            file=sys.stderr,
        )
    started = time.perf_counter()
    with Progress(f"preparing the {plan.backend_name} backend"):
        generator = plan.generator()
    plan.loaded_s += time.perf_counter() - started
    return generator


def _chat(plan: Plan, conversation: Conversation, first: str | None, tokenizer: Any, sampler: Any) -> int:
    """The conversation: each line of standard input a user turn (an empty line is skipped, end of input ends
    it); the whole conversation is rendered each turn and the cache keeps what it already holds of it."""
    ctx = plan.ctx or INTERACTIVE_CTX
    _refuse_too_large(plan.store.spec, "", ctx)
    generator = _generator_for(plan, ctx)
    terminal = sys.stdin.isatty()
    turns = 0
    while True:
        if first is not None:
            line, first = first, None
        else:
            if terminal:
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line:
                break
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.strip() in ("/exit", "/quit"):
                break
        prompt = conversation.ask(line if conversation.template is not None or not turns else "\n" + line)
        if len(prompt) + max(new_tokens(plan.args.max_new_tokens, ctx, len(prompt)), 1) - 1 > ctx:
            raise LogosError(
                f"the conversation's {len(prompt)} tokens and --max-new-tokens {plan.args.max_new_tokens} no longer "
                f"fit the cache of {ctx} positions",
                hint="start again with a larger --ctx",
            )
        conversation.answered(_turn(plan, generator, prompt, tokenizer, sampler, ctx))
        turns += 1
    return 0


def _turn(plan: Plan, generator: Any, prompt: list[int], tokenizer: Any, sampler: Any, ctx: int) -> str:
    """One answer of a conversation; Ctrl-C stops it where it is (the conversation keeps what was said) and
    returns to the prompt, as llama-cli does. The cache keeps only what it held before the answer began."""
    stream = Stream(tokenizer, plan.args.stop, live=not plan.args.json)
    try:
        _answer(plan, generator, prompt, tokenizer, sampler, ctx, keep=True, stream=stream)
    except KeyboardInterrupt:
        print(f"{TOOL}: interrupted: the answer stops here", file=sys.stderr, flush=True)
        plan.loaded_s = 0.0
    return stream.text


# The rank a process started by an MPI launcher (mpiexec / mpirun / srun) was given, from the launcher's environment
# (MPICH's and Intel MPI's PMI, PMIx, Open MPI, Slurm): every rank runs the same loop and gets the same tokens, and
# rank 0 alone prints them.
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def launched_rank() -> int:
    """This process's rank under an MPI launcher, else 0."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def default_threads(cores: int | None = None, load: float | None = None) -> int:
    """`-t`'s default: the cores this process may use less those already busy (the 1-minute load average, rounded),
    at least one. BLAS's own default, a thread a core, is the fastest on idle cores and spins against other work
    on busy ones (SmolLM2 on 2 cores: 14.2 decode tokens/s with 2 threads against 10.5 with 1 when idle; 4.3
    against 12.1 when both cores were busy)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, cores - int(load + 0.5)))


def limit_threads(threads: int | None) -> None:
    """`-t`: the BLAS libraries' threads. Set in their environment before numpy loads them; where numpy is already
    loaded (a caller in this process), through threadpoolctl. Without `-t`, a thread variable the user set is
    kept, else `default_threads()`."""
    if threads is None:
        if any(name in os.environ for name in _THREAD_VARIABLES):
            return
        threads = default_threads()
    for name in _THREAD_VARIABLES:
        os.environ[name] = str(threads)
    if "numpy" not in sys.modules:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    limit_threads(args.threads)
    if launched_rank() != 0:  # the answer, the JSON and the timing line from rank 0 alone; errors from every rank
        with open(os.devnull, "w", encoding="utf-8") as quiet:
            stdout, sys.stdout = sys.stdout, quiet
            try:
                return run_tool(TOOL, lambda: _generate(args), argv)
            finally:
                sys.stdout = stdout
    return run_tool(TOOL, lambda: _generate(args), argv)


if __name__ == "__main__":
    sys.exit(main())
