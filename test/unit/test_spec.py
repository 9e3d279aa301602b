"""ModelSpec: validation on construction, presets, and reading Hugging Face config.json files of the Llama family."""

import json

import pytest

from logos_ir.errors import SpecError
from logos_ir.spec import ModelSpec, RopeScaling

# The shape of a real Llama 3.2 1B config.json (newer files carry more keys; the reader ignores what it needs not).
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}


def test_presets_are_listed_and_real():
    assert {"tiny", "smollm2-135m", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"} <= set(ModelSpec.presets())
    big = ModelSpec.preset("llama-3.1-70b")
    assert (big.layers, big.hidden, big.heads, big.kv_heads, big.intermediate) == (80, 8192, 64, 8, 28672)
    assert big.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    tiny = ModelSpec.preset("tiny")
    assert (
        tiny.vocab,
        tiny.hidden,
        tiny.layers,
        tiny.heads,
        tiny.kv_heads,
        tiny.head_dim,
        tiny.intermediate,
    ) == (256, 64, 2, 4, 2, 16, 128)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(SpecError, match="unknown model preset 'llama-9'") as error:
        ModelSpec.preset("llama-9")
    assert "smollm2-135m" in str(error.value)


def test_config_of_llama_3_2_matches_its_preset():
    assert ModelSpec.from_hf_config(LLAMA_32_1B) == ModelSpec.preset("llama-3.2-1b")


def test_config_file_and_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_135M))
    assert ModelSpec.from_hf_config(tmp_path) == ModelSpec.preset("smollm2-135m")
    assert ModelSpec.from_hf_config(tmp_path / "config.json") == ModelSpec.preset("smollm2-135m")


def test_head_dim_is_derived_when_absent():
    spec = ModelSpec.from_hf_config(SMOLLM2_135M)
    assert spec.head_dim == 64


def test_rope_parameters_layout_of_newer_configs():
    newer = {k: v for k, v in LLAMA_32_1B.items() if k not in ("rope_theta", "rope_scaling")}
    newer["rope_parameters"] = {**LLAMA_32_1B["rope_scaling"], "rope_theta": 500000.0}
    assert ModelSpec.from_hf_config(newer) == ModelSpec.preset("llama-3.2-1b")
    plain = {k: v for k, v in SMOLLM2_135M.items() if k not in ("rope_theta", "rope_scaling")}
    plain["rope_parameters"] = {"rope_type": "default", "rope_theta": 100000.0}
    assert ModelSpec.from_hf_config(plain) == ModelSpec.preset("smollm2-135m")


@pytest.mark.parametrize(
    "field",
    [
        "hidden_size",
        "num_hidden_layers",
        "vocab_size",
        "intermediate_size",
        "rms_norm_eps",
        "num_attention_heads",
    ],
)
def test_missing_field_is_named(field):
    config = {k: v for k, v in SMOLLM2_135M.items() if k != field}
    with pytest.raises(SpecError, match=f"required field '{field}' is missing"):
        ModelSpec.from_hf_config(config)


def test_unsupported_model_type_is_named():
    with pytest.raises(SpecError, match="model_type 'gpt2' is not supported"):
        ModelSpec.from_hf_config({**SMOLLM2_135M, "model_type": "gpt2"})


def test_bad_json_names_the_place(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(SpecError, match=r"config.json:2:17: error: invalid JSON"):
        ModelSpec.from_hf_config(tmp_path)


def test_wrong_type_is_refused():
    with pytest.raises(SpecError, match="field 'hidden_size' has the wrong type"):
        ModelSpec.from_hf_config({**SMOLLM2_135M, "hidden_size": "576"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"heads": 9, "kv_heads": 2}, r"heads \(9\) must be a multiple of kv_heads \(2\)"),
        ({"layers": 0}, "'layers' must be at least 1"),
        ({"vocab": -3}, "'vocab' must be at least 1"),
        ({"head_dim": 15}, "head_dim \\(15\\) must be even"),
        ({"rms_eps": 0.0}, "'rms_eps' must be a positive number"),
        ({"hidden": 64.0}, "'hidden' must be an integer"),
    ],
)
def test_invalid_sizes_are_refused(change, message):
    sizes = {**vars(ModelSpec.preset("tiny")), **change}
    with pytest.raises(SpecError, match=message):
        ModelSpec(**sizes)


def test_splits_over_names_the_width_that_does_not_divide():
    spec = ModelSpec.preset("smollm2-135m")
    assert spec.splits_over(3) is None
    assert spec.splits_over(2) == "heads"
    assert ModelSpec.preset("tiny").splits_over(4) == "kv_heads"


@pytest.mark.parametrize("name", ModelSpec.presets())
def test_every_presets_config_reads_back_as_it(name: str) -> None:
    """`hf_config` writes a preset as its family's config.json (Qwen2's biases, Qwen3's head norms, Gemma 2's
    features, a window's layers); reading it back gives the same spec, so a folder saved from it is the same model."""
    from logos_ir.weights.safetensors import hf_config

    spec = ModelSpec.preset(name)
    assert ModelSpec.from_hf_config(hf_config(spec)) == spec


def test_the_families_presets_have_their_published_shapes() -> None:
    gemma = ModelSpec.preset("gemma-2-9b")
    assert (gemma.layers, gemma.hidden, gemma.heads, gemma.kv_heads, gemma.head_dim) == (42, 3584, 16, 8, 256)
    assert gemma.full_layers == tuple(range(1, 42, 2)) and gemma.sliding_window == 4096
    assert (gemma.attention_softcap, gemma.final_softcap, gemma.query_pre_attn_scalar) == (50.0, 30.0, 256.0)
    gemma3 = ModelSpec.preset("gemma-3-12b")
    assert (gemma3.layers, gemma3.hidden, gemma3.heads, gemma3.kv_heads, gemma3.head_dim) == (48, 3840, 16, 8, 256)
    assert gemma3.full_layers == (5, 11, 17, 23, 29, 35, 41, 47) and gemma3.sliding_window == 1024
    assert (gemma3.rope_scaling.rope_type, gemma3.rope_scaling.factor) == ("linear", 8.0)  # type: ignore[union-attr]
    assert gemma3.rope_scaling_of(0) is None and gemma3.rope_scaling_of(5) == gemma3.rope_scaling
    assert ModelSpec.preset("qwen2.5-7b").biases == ("query", "key", "value")
    assert ModelSpec.preset("qwen3-8b").head_norms and ModelSpec.preset("qwen3-8b").head_dim == 128
    assert ModelSpec.preset("mistral-7b-v0.1").sliding_window == 4096
    assert ModelSpec.preset("phi-3-mini-4k").sliding_window == 2047
