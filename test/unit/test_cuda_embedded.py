"""THE CUDA LANE'S ONE EMBEDDED-MODEL RUN IN THE SUITE (194 s on 2 shared cores at a load average of 3-4, 2026-12-01:
the decode kernels' fused multiply-adds are emulated exactly, in f64 with a tie check, about 6x a multiply and an add).

The embedded SmolLM2-135M through `logos-run --backend cuda --emulate --weights f32`'s generator: a prompt of 18
tokens (two prefill chunks of 16 and 2 rows), then 16 new tokens by decode steps, every kernel executed by the
emulator from the lowered `gpu` IR; the tokens must be the reference interpreter's. The bf16 teacher-forced
agreement over 64 steps runs in `bench/gpu_decode.py --cpu-agreement` (it would not fit the suite's budget).
"""

from __future__ import annotations

from logos_ir.generate import Generator
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda.generator import cuda_generator
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import open_model

PROMPT = "Once upon a time, in a small village far away, there lived an old man who"
NEW_TOKENS = 16


def test_embedded_model_emulated_f32_gives_the_reference_tokens() -> None:
    store = open_model(None)
    prompt = Tokenizer.from_store(store).encode(PROMPT)
    assert len(prompt) > 16  # longer than one prefill chunk
    want = Generator(store, prefill_rows=16).generate(prompt, NEW_TOKENS)
    lane = cuda_generator(RunRequest(store, None, 16, 1, "f32", emulate=True))
    got = lane.generate(prompt, NEW_TOKENS)
    assert got == want
    assert len(got) == NEW_TOKENS
    assert [i.cut.kind for i in lane.identities] == ["prefill", "prefill", "decode"]
