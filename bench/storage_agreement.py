"""A storage's agreement on the embedded model: teacher-forced next-token agreement of the reference run on the
embedded SmolLM2's weights stored again in another format (by the project's quantizer, `QuantizedWeights`: `fp8`,
e4m3 with a float32 scale a row, or a GGUF block format) with the reference on the file's own weights (f32
activations both), per prompt, each prompt in the model's chat template (as `logos-run` sends it).

Each prompt is run on the file's weights for `--steps` greedy tokens; the stored model is fed the prompt and then
those tokens (a `Sampler` that records its arg-max and returns the file's token), so one miss does not change the
later steps. Each miss is given with the file's margin at that step (its top logit less the second).

    python3 bench/storage_agreement.py [--weights fp8] [--steps 32]

It prints one JSON document (the machine, the date, the seconds); docs/quantization.md keeps the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from logos_ir import quant
from logos_ir.generate import Generator, default_ctx
from logos_ir.quant import QUANTIZERS
from logos_ir.tokenizer import Tokenizer
from logos_ir.tools.logos_run import Conversation
from logos_ir.weights import embedded_model_path, open_model
from logos_ir.weights.store import QuantizedWeights, WeightStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_agreement import Forced  # noqa: E402  (the teacher-forcing sampler the families' agreement uses)

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Explain why the sky is blue in one sentence.",
]


def _bytes(store: WeightStore) -> int:
    """The bytes the store holds its tensors in: a stored one's blocks, a float one's f32."""
    stored = dict(store.spec.storage)
    return sum(quant.FORMATS[stored.get(name, "f32")].stored_bytes(store.shape(name)) for name in store.names())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="fp8", choices=QUANTIZERS)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    store = open_model(str(embedded_model_path()))
    tokenizer = Tokenizer.from_store(store)
    assert tokenizer is not None
    stored = QuantizedWeights(store, args.weights)
    runs = []
    start = time.time()
    for text in PROMPTS:
        prompt = Conversation(tokenizer, "the embedded model", None, raw=False, chat=False).ask(text)  # its template
        ctx = default_ctx(len(prompt), args.steps + 1)
        file = Forced()
        Generator(store, ctx=ctx).generate(prompt, args.steps, sampler=file)
        tokens = file.argmax
        forced = Forced(tokens)
        Generator(stored, ctx=ctx).generate(prompt, args.steps, sampler=forced)
        margins = [float(np.diff(np.sort(logits)[-2:])[0]) for logits in file.logits]
        misses = [
            {"step": i, "file": t, "stored": s, "file_margin": round(margins[i], 4)}
            for i, (t, s) in enumerate(zip(tokens, forced.argmax, strict=True))
            if t != s
        ]
        runs.append(
            {
                "prompt": text,
                "steps": args.steps,
                "agreement": round(1 - len(misses) / args.steps, 4),
                "misses": misses,
                "continuation": tokenizer.decode(tokens),
            }
        )
    print(
        json.dumps(
            {
                "bench": "storage_agreement",
                "model": "embedded SmolLM2-135M-Instruct (its file's weights, dequantized, f32 activations)",
                "weights": args.weights,
                "bytes": {"file": _bytes(store), "stored": _bytes(stored)},
                "runs": runs,
                "seconds": round(time.time() - start, 1),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                "date": datetime.date.today().isoformat(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
