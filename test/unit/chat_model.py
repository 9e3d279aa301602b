"""A small chat model for the tools' tests: random weights of the tiny preset's widths, in a GGUF file with a
byte-level BPE tokenizer (every byte a token, so any text encodes) and a ChatML chat template, so `logos-run`'s
prompt, template, stop-string, streaming and chat paths run in a second instead of the embedded model's minutes."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_chat_gguf(path: Path, seed: int = 5) -> Path:
    import numpy as np

    from logos_ir import testing
    from logos_ir.spec import ModelSpec
    from logos_ir.weights import RandomWeights, gguf_tensor_name

    tokenizer = [entry for entry in testing.tokenizer_metadata(None) if entry[0] != "tokenizer.chat_template"]
    vocab = len(dict((key, value) for key, _, value in tokenizer)["tokenizer.ggml.tokens"][1])
    tiny = ModelSpec.preset("tiny")
    spec = ModelSpec(
        vocab=vocab,
        hidden=tiny.hidden,
        layers=tiny.layers,
        heads=tiny.heads,
        kv_heads=tiny.kv_heads,
        head_dim=tiny.head_dim,
        intermediate=tiny.intermediate,
        rms_eps=tiny.rms_eps,
        rope_theta=tiny.rope_theta,
        tie_embeddings=False,
    )
    meta = [
        ("general.architecture", testing.STRING, "llama"),
        ("general.name", testing.STRING, "logos-chat-test"),
        ("llama.block_count", testing.U32, spec.layers),
        ("llama.context_length", testing.U32, 2048),
        ("llama.embedding_length", testing.U32, spec.hidden),
        ("llama.feed_forward_length", testing.U32, spec.intermediate),
        ("llama.attention.head_count", testing.U32, spec.heads),
        ("llama.attention.head_count_kv", testing.U32, spec.kv_heads),
        ("llama.rope.freq_base", testing.F32, spec.rope_theta),
        ("llama.attention.layer_norm_rms_epsilon", testing.F32, spec.rms_eps),
        ("llama.vocab_size", testing.U32, spec.vocab),
        ("llama.rope.dimension_count", testing.U32, spec.head_dim),
        ("general.alignment", testing.U32, 32),
        *tokenizer,
        ("tokenizer.chat_template", testing.STRING, TEMPLATE),
    ]
    store = RandomWeights(spec, seed=seed)
    tensors = []
    for name in store.names():
        array = np.array(store.get(name), dtype="<f4")
        tensors.append((gguf_tensor_name(name), array.shape, 0, array.tobytes()))  # GGML type 0: F32
    path.write_bytes(testing.gguf_bytes(meta, tensors))
    return path
