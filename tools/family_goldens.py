"""Make the model families' goldens from their definition, Hugging Face transformers (a script, not a test: it needs
torch and transformers, `pip install -e '.[families]'` (here: `pip install torch==2.13.0 transformers`, the CPU
build of torch on this machine's disk); the suite reads what it wrote and needs neither).

    python3 tools/family_goldens.py [--out test/unit/families]

For each family, a tiny model of random weights made by transformers' own config and model classes (seeded), saved
by `save_pretrained` as a folder (`config.json` and `model.safetensors`, float32), and the greedy continuation of
fixed prompts as transformers computes it (eager attention, float32, the argmax of each step's logits), with the
margin between the best and the second-best logit at each step (a near-tie would make a token test flaky, so the
weights are drawn wider than the library's default initialisation). All of it goes to `goldens.json` beside the
folders, with the versions that computed it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

PROMPTS = [[1, 17, 42, 200, 5], [3, 3, 9]]
NEW_TOKENS = 12

# Sizes shared by every family's tiny model: GQA (2 KV heads) so it splits over 2 chips; widths the lanes take.
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.25,  # wider than the default 0.02: well-separated logits, no near-ties
}

# The tiny Qwen3-MoE's own settings (4 experts of 32, 2 a token), which its variants change one of
_QWEN3_MOE: dict[str, Any] = {
    "head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# family name -> (transformers config class, model class, its own settings beyond TINY)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    # a window no longer than the runs' caches would need: the window never bites, in transformers or here
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 64, "bos_token_id": 1, "eos_token_id": 2}),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "original_max_position_embeddings": 128,
            "sliding_window": None,  # Phi-3-mini-4k's is 2047: windows are not said in LOGOS yet, so refused
            "rope_scaling": None,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
    # biases on the query, key and value projections (always, in Qwen2's attention); its window unused
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"bos_token_id": 1, "eos_token_id": 2}),
    # a Llama with every projection's bias: the output's and the down projection's added after the chips' sum
    "llama-biases": ("LlamaConfig", "LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
    # an RMS norm on each head of the query and of the key (q_norm, k_norm), before the rotation
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16, "bos_token_id": 1, "eos_token_id": 2}),
    # a window that bites: 4 positions, shorter than every run (prompt and new tokens), in every layer
    "mistral-window": (
        "MistralConfig",
        "MistralForCausalLM",
        {"sliding_window": 4, "bos_token_id": 1, "eos_token_id": 2},
    ),
    # Qwen2's window used: layer 0 (below max_window_layers) attends everything, layer 1 its last 4 positions
    "qwen2-window": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "bos_token_id": 1, "eos_token_id": 2},
    ),
    # Gemma 2: norms by one plus their weight, the embedding times sqrt(64), GeGLU, sandwich norms, scores scaled by
    # 1 / sqrt(4) (not the head's 16) and soft-capped, the logits soft-capped, layer 0 windowed over 4 positions;
    # caps small enough to bite at these widths (the published 50 and 30 would not change a tiny model's tokens);
    # its head untied as TINY's (a tied one, its rows scaled by sqrt(64), repeats the last token: a weak test)
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 4,
            "sliding_window": 4,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 5.0,
        },
    ),
    # Gemma 3: Gemma 2's norms, embedding, GeGLU and sandwich norms, head norms (by one plus their weight), no
    # soft-caps, layer 1 global (a pattern of 2) rotating with base 1e6 and layer 0 local with 1e4 over 4 positions
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 4,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
        },
    ),
    # Gemma 2 and 3 as a GGUF of llama.cpp can say them (its loader hard-codes what the file does not state): the
    # scores scaled by 1 / sqrt(head size) (query_pre_attn_scalar 16), Gemma 2's head tied to its embedding (its
    # loader has no output tensor), Gemma 3's every 6th layer global (six layers, the last global) and its local
    # layers rotating with base 10000; read from the GGUF that test_gguf_families writes from each folder, with the
    # SentencePiece tokenizer of test/unit/tokenizers (400 pieces, hence the vocabulary of 400)
    "gemma2-gguf": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "sliding_window": 4,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 5.0,
            "tie_word_embeddings": True,
            "vocab_size": 400,
        },
    ),
    "gemma3_text-gguf": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "num_hidden_layers": 6,
            "query_pre_attn_scalar": 16,
            "sliding_window": 4,
            "sliding_window_pattern": 6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "vocab_size": 400,
        },
    ),
    # Phi-3 with the same tokenizer's vocabulary, for the GGUF of it (its fused attn_qkv and ffn_up)
    "phi3-gguf": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "original_max_position_embeddings": 128,
            "sliding_window": None,
            "rope_scaling": None,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "vocab_size": 400,
        },
    ),
    # mixtures of experts: 4 experts of which each token takes 2, every layer's MLP a mixture; Mixtral's chosen
    # weights always divided by their sum; Qwen3-MoE's head norms, its experts' own width (moe_intermediate_size)
    # and its renormalisation by norm_topk_prob, once on and once off
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 32,  # each expert's: four of them kept as small as one dense MLP
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        _QWEN3_MOE,
    ),
    "qwen3_moe-unnormed": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {**_QWEN3_MOE, "norm_topk_prob": False},
    ),
    # Linear rope scaling: a Llama's over every layer (long-context Llama 2s), Gemma 3's over its global layers only
    # (4B and larger: factor 8), as a folder and, six layers as llama.cpp's Gemma 3 loader has them, as a GGUF
    "llama-linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    ),
    "gemma3_text-linear": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 4,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    ),
    "gemma3_text-gguf-linear": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "num_hidden_layers": 6,
            "query_pre_attn_scalar": 16,
            "sliding_window": 4,
            "sliding_window_pattern": 6,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "vocab_size": 400,
        },
    ),
    # Phi-3 rotating the first half of each head only (Phi-4-mini's partial_rotary_factor is 0.75), with the
    # GGUF tokenizer's vocabulary so that its GGUF (rope.dimension_count 8) runs through logos-run too
    "phi3-gguf-partial": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "original_max_position_embeddings": 128,
            "sliding_window": None,
            "rope_scaling": None,
            "partial_rotary_factor": 0.5,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "vocab_size": 400,
        },
    ),
    # YaRN (Qwen2.5's long-context configs): an original context of 32 stretched to 128, so factor 4; the ramp
    # between beta_fast 32 and beta_slow 1 and the attention factor 0.1 ln 4 + 1 on cos and sin
    "qwen2-yarn": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10000.0,
            },
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
    ),
    # LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): one factor a rotating pair, the attention factor
    # sqrt(1 + ln 4 / ln 32) on cos and sin; short and long factors alike (a program states one set for its ctx)
    "phi3-longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "original_max_position_embeddings": 32,
            "sliding_window": None,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0],
                "long_factor": [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 6.0, 8.0],
            },
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
    # LongRoPE with short and long factors that differ (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): transformers
    # turns by the short ones while the sequence is at most the original context (64 here) and by the long ones past
    # it: a short prompt that stays within it and a long one that starts past it (PROMPTS_OF), run over caches of 32
    # and 128 positions (llama.cpp's rule, by the context, choosing the same factors)
    "phi3-longrope-two": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "original_max_position_embeddings": 64,
            "sliding_window": None,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0],
                "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0],
            },
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
    # OLMoE: the whole query and the whole key RMS-normed (its q_norm 64 wide, k_norm 32), the chosen experts'
    # weights not renormalized (norm_topk_prob false, as OLMoE-1B-7B ships)
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 32,  # each expert's
            "norm_topk_prob": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        },
    ),
    # Qwen3-MoE with as many key-value heads as query heads (4), so that attention splits by heads and the 4 experts
    # one a chip over 4 chips as it is (the 2-KV-head mixtures split over 2 at most)
    "qwen3_moe-kv4": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {**_QWEN3_MOE, "num_key_value_heads": 4},
    ),
}
# Families whose prompts are their own: the LongRoPE model's short prompt stays within its original context of 64
# (5 + 11 tokens the last step reads) and its long one starts past it (70 tokens).
PROMPTS_OF = {"phi3-longrope-two": [PROMPTS[0], [(37 * i + 11) % 250 + 3 for i in range(70)]]}
# Families whose norm weights are drawn as 1 + N(0, initializer_range) rather than left at transformers' ones, so
# that a norm read from the wrong tensor (or not applied) changes the tokens: the families made after the first five
# (whose committed files stay as they were made).
DRAWN_NORMS = {
    "qwen3": 1.0,
    "gemma2": 0.0,
    "gemma3_text": 0.0,
    "gemma2-gguf": 0.0,
    "gemma3_text-gguf": 0.0,
    "gemma3_text-linear": 0.0,
    "gemma3_text-gguf-linear": 0.0,
    "mixtral": 1.0,
    "qwen3_moe": 1.0,
    "qwen3_moe-unnormed": 1.0,
    "olmoe": 1.0,
    "qwen3_moe-kv4": 1.0,
}  # the mean of each (Gemma's norms scale by one plus the weight)
# Families whose embedding is drawn narrower than the rest (a tied head scores each token by its embedding, which
# Gemma scales by sqrt(64): drawn as wide as the layers, the last token's own row wins every step)
EMBEDDING_STD = {"gemma2-gguf": 0.02}
# Families whose runs also record the first step's logits (the soft-capped logits of Gemma 2, which greedy tokens
# alone cannot pin).
FIRST_LOGITS = {"gemma2", "gemma2-gguf"}
# A family whose first draw (seeded by its place in FAMILIES) had a near-tie (a top-1 margin of 1e-3 or less, which
# f32 rounding could flip) takes another seed, said here.
SEEDS = {"qwen3": 105, "phi3-longrope-two": 202}


def routing_margins(model: Any) -> list[float]:
    """Hooks on every router of a mixture of experts (transformers' `*TopKRouter`) that record, for each token it
    routes, the gap between the k-th and the (k+1)-th softmax probability: a near-tie there would let f32 rounding
    choose another expert. The list fills as the model runs."""
    import torch

    gaps: list[float] = []

    def record(module: Any, args: Any, output: Any) -> None:
        probs = torch.softmax(output[0].double(), dim=-1).sort(dim=-1, descending=True).values
        k = module.top_k
        if probs.shape[-1] > k:
            gaps.append(float((probs[:, k - 1] - probs[:, k]).min()))

    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            module.register_forward_hook(record)
    return gaps


def greedy(model: Any, prompt: list[int], new: int) -> tuple[list[int], float, list[float]]:
    """The greedy continuation by whole-sequence forward passes (no cache), the smallest top-1 margin, and the
    first step's logits (a monotonic map of the logits, such as a soft-cap, never changes a greedy token)."""
    import torch

    ids, margin, first = list(prompt), float("inf"), []
    with torch.no_grad():
        for _ in range(new):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            first = first or [round(float(v), 5) for v in logits]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt) :], margin, first


def make(family: str, out: Path) -> dict[str, Any]:
    import torch
    import transformers

    config_class, model_class, own = FAMILIES[family]
    torch.manual_seed(SEEDS.get(family, list(FAMILIES).index(family)))  # a model of its own for each family
    config = getattr(transformers, config_class)(**{**TINY, **own})
    config._attn_implementation = "eager"
    model = getattr(transformers, model_class)(config).float().eval()
    with torch.no_grad():  # transformers starts every bias at zero, which would prove nothing: drawn like the weights
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0.0, TINY["initializer_range"])
            elif family in DRAWN_NORMS and name.endswith("norm.weight"):
                parameter.normal_(DRAWN_NORMS[family], TINY["initializer_range"])
            elif family in EMBEDDING_STD and name.endswith("embed_tokens.weight"):
                parameter.normal_(0.0, EMBEDDING_STD[family])
    folder = out / family
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    for extra in ("generation_config.json",):  # the sampler's defaults, not the model's: not committed
        (folder / extra).unlink(missing_ok=True)
    runs = []
    gaps = routing_margins(model)
    for prompt in PROMPTS_OF.get(family, PROMPTS):
        gaps.clear()
        tokens, margin, first = greedy(model, prompt, NEW_TOKENS)
        run = {"prompt": prompt, "tokens": tokens, "min_top1_margin": round(margin, 4)}
        if gaps:  # a mixture of experts: the closest any token came to choosing another expert
            run["min_route_margin"] = round(min(gaps), 5)
        if family in FIRST_LOGITS:
            run["first_logits"] = first
        runs.append(run)
    import transformers as library

    return {"model_class": model_class, "torch": torch.__version__, "transformers": library.__version__, "runs": runs}


def main() -> int:
    import torch
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "test" / "unit" / "families"))
    parser.add_argument("--only", nargs="+", choices=list(FAMILIES), help="remake these families, keep the others")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kept: dict[str, Any] = {}
    if args.only:
        # a family remade alone is made by the versions that made the rest, or the goldens would mix definitions
        first = json.loads((out / "goldens.json").read_text())
        versions = {"transformers": transformers.__version__, "torch": torch.__version__}
        if any(first[name] != version for name, version in versions.items()):
            wanted = ", ".join(f"{name}=={first[name]}" for name in versions)
            print(
                f"error: --only remakes with the versions that made {out / 'goldens.json'} ({wanted}); "
                f"installed: {versions['transformers']}, {versions['torch']} (remake every family instead)",
                file=sys.stderr,
            )
            return 1
        kept = first["families"]
    made = {family: make(family, out) if not args.only or family in args.only else kept[family] for family in FAMILIES}
    goldens = {  # the versions of the whole run (a remake --only checked they are the same)
        "made_by": "tools/family_goldens.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "new_tokens": NEW_TOKENS,
        "families": made,
    }
    (out / "goldens.json").write_text(json.dumps(goldens, indent=1) + "\n")
    for family, made in goldens["families"].items():
        print(family, [(run["tokens"], run["min_top1_margin"]) for run in made["runs"]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
