"""`logos-run`: greedy generation with a model's LOGOS programs, on the reference interpreter or a lane's backend.

    logos-run [--model tiny|DIR|FILE.gguf|ORG/NAME] [--prompt TEXT | --prompt-ids 1,2,3] [--max-new-tokens 32]
              [--backend reference|...] [--emulate] [--weights f32|bf16|f16] [--json]

The backends are the registry's (`logos_ir.registry.backends`): each lane adds its own.
With no `--model` it runs the embedded SmolLM2-135M-Instruct; with no prompt, the model's chat template
applied to "What is the capital of France?" (plain text when the model has no template). The continuation goes
to standard output (with `--json`, one JSON object as the last line); progress, when standard error is a
terminal, and the speed at the end go to standard error. Heavy modules are imported inside `main`, so `--help`
answers at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from logos_ir.cli import count, positive, run_tool
from logos_ir.errors import LogosError

DEFAULT_QUESTION = "What is the capital of France?"


def _ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated whole numbers: '{text}'") from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError("give one or more token ids, from 0, separated by commas")
    return ids


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logos-run",
        description="Generate text greedily with a model's LOGOS programs, on the reference interpreter or a lane's "
        "backend.",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a preset name (random weights), a folder with config.json and safetensors, a .gguf "
        "file; default: the embedded SmolLM2-135M-Instruct",
    )
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the prompt text (default: a question in the model's chat template)")
    prompt.add_argument("--prompt-ids", type=_ids, help="the prompt as comma-separated token ids, from 0")
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template to --prompt")
    parser.add_argument("--max-new-tokens", type=count, default=32, help="how many tokens to generate at most")
    parser.add_argument("--prefill-rows", type=positive, default=16, help="prompt tokens per prefill chunk")
    parser.add_argument(
        "--ctx",
        type=positive,
        default=None,
        help="cache positions (default: prompt plus new tokens, rounded up to a multiple of 64)",
    )
    backends = _backends()
    parser.add_argument(
        "--backend",
        choices=sorted(backends),
        default="reference",
        help="what runs the programs: " + "; ".join(f"{b.name}: {b.description}" for b in backends.values()),
    )
    parser.add_argument(
        "--emulate", action="store_true", help="run the backend's lowered kernels on the CPU (backends that have it)"
    )
    parser.add_argument(
        "--weights",
        choices=["f32", "bf16", "f16"],
        default=None,
        help="the weight image the backend runs (default: the backend's own; f32 matches the reference exactly)",
    )
    parser.add_argument("--tp", type=positive, default=1, help="split the decode step over this many chips")
    parser.add_argument(
        "--aocx", default=None, metavar="FILE", help="an engine compiled ahead of time (the d5005 backend loads it)"
    )
    parser.add_argument("--seed", type=count, default=0, help="the seed of a preset's random weights")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks of internal errors")
    return parser


def _backends():
    from logos_ir import registry

    return registry.backends()


def chat_prompt(template: str, question: str) -> str | None:
    """`question` as a user turn in a model's chat template (a Jinja template from the model's files, rendered
    in a sandbox), ready for the assistant's answer; None when it cannot be rendered here."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None
    try:
        rendered = (
            ImmutableSandboxedEnvironment()
            .from_string(template)
            .render(
                messages=[{"role": "user", "content": question}],
                add_generation_prompt=True,
                bos_token="",
                eos_token="",
            )
        )
    except Exception:  # a template is the model file's code: any failure means "no usable template"
        return None
    return rendered if isinstance(rendered, str) and rendered else None


def _prompt_ids(args: argparse.Namespace, tokenizer: Any, model: str) -> list[int]:
    from logos_ir.errors import LogosError

    if args.prompt_ids is not None:
        return list(args.prompt_ids)
    if tokenizer is None:
        raise LogosError(f"the model {model} has no tokenizer: give the prompt as --prompt-ids (ids from 0)")
    if args.prompt is not None and not args.chat:
        return tokenizer.encode(args.prompt)
    question = DEFAULT_QUESTION if args.prompt is None else args.prompt
    text = chat_prompt(tokenizer.chat_template, question) if tokenizer.chat_template else None
    if text is None and args.chat:
        raise LogosError(f"the model {model} has no chat template logos-run can apply")
    return tokenizer.encode(text if text is not None else question)


class _Progress:
    """The continuation as it grows, on standard error when that is a terminal; otherwise silent."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = ""
        self.live = sys.stderr.isatty()

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        if not self.live:
            return
        if self.tokenizer is None:
            sys.stderr.write(f"{token} ")
        else:
            text = self.tokenizer.decode(self.ids)
            if text.startswith(self.shown):  # a partial UTF-8 character shows once it is complete
                sys.stderr.write(text[len(self.shown) :])
                self.shown = text
        sys.stderr.flush()

    def done(self) -> None:
        if self.live and self.ids:
            sys.stderr.write("\n")


def _text(tokenizer: Any, ids: list[int]) -> str | None:
    if tokenizer is None:
        return None
    if ids and ids[-1] == tokenizer.eos_id:
        ids = ids[:-1]  # the end-of-sequence token ends the text; it is no part of it
    return tokenizer.decode(ids)


def _weights_for(backend: Any, wanted: str | None) -> str:
    """The weight image to run: the one asked for, if the backend runs it, else the backend's default."""
    if wanted is None:
        return str(backend.weights[0])
    if wanted not in backend.weights:
        raise LogosError(f"the {backend.name} backend runs weights {', '.join(backend.weights)}, not {wanted}")
    return wanted


def _generate(args: argparse.Namespace) -> int:
    from logos_ir.generate import default_ctx
    from logos_ir.runtime import RunRequest
    from logos_ir.tokenizer import Tokenizer
    from logos_ir.weights import open_model

    backend = _backends()[args.backend]
    weights = _weights_for(backend, args.weights)
    if args.emulate and not backend.emulates:
        raise LogosError(f"the {backend.name} backend has no --emulate mode")
    store = open_model(args.model, seed=args.seed)
    tokenizer = Tokenizer.from_store(store)
    prompt = _prompt_ids(args, tokenizer, store.source)
    ctx = args.ctx or default_ctx(len(prompt), args.max_new_tokens)
    aocx = None
    if args.aocx is not None:
        from pathlib import Path

        aocx = Path(args.aocx)
        if not aocx.is_file():
            raise LogosError(f"--aocx {args.aocx}: no such file")
    request = RunRequest(store, ctx, args.prefill_rows, args.tp, weights, args.emulate, aocx=aocx)
    generator = backend.generator()(request)
    progress = _Progress(tokenizer)
    started = time.perf_counter()
    eos = tokenizer.eos_id if tokenizer is not None else None
    new = generator.generate(prompt, args.max_new_tokens, eos_id=eos, on_token=progress)
    progress.done()
    stats = generator.stats
    report = {
        "model": store.source,
        "backend": args.backend,
        "emulate": args.emulate,
        "weights": weights,
        "tp": args.tp,
        "ctx": ctx,
        "prompt_ids": prompt,
        "new_ids": new,
        "text": _text(tokenizer, new),
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 3),
        "prefill_s": round(stats.prefill_s, 4),
        "decode_s": round(stats.decode_s, 4),
        "wall_s": round(time.perf_counter() - started, 4),
        "programs": [identity.line() for identity in generator.identities],
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(report["text"] if report["text"] is not None else ",".join(str(i) for i in new))
    print(
        f"logos-run: {len(new)} new tokens in {stats.total_s:.2f} s: {stats.tokens_per_s:.1f} tokens/s "
        f"(decode {stats.decode_tokens_per_s:.1f} tokens/s)",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    return run_tool("logos-run", lambda: _generate(args), argv)


if __name__ == "__main__":
    sys.exit(main())
