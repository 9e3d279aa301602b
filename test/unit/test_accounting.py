"""Everything in a model's files is accounted for: every key of a `config.json` and of GGUF metadata is read into
the spec, known not to change the computation, or refused by name; every tensor is read by the program or refused
by name. Each case here ran before as a plain Llama and gave its tokens, silently wrong (an independent
implementation that applies the feature gives other tokens): a bias after a projection, a biased MLP, GELU,
rotation over half the head, a sliding window, a layer the config does not have, a bias a GGUF carries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from xdsl.context import Context
from xdsl.dialects import builtin, func, shard
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.utils.exceptions import VerifyException

from logos_ir.author import write
from logos_ir.dialects.logos import LOGOS
from logos_ir.errors import LogosError, SpecError, WeightError
from logos_ir.parser import parse_program
from logos_ir.printer import print_program
from logos_ir.program import Cut
from logos_ir.spec import ModelSpec
from logos_ir.testing import F32, STRING, U32, mlir_text, model_gguf, small_spec, write_model_folder
from logos_ir.weights import hf_config, open_model


def _folder(tmp_path: Path, config: dict | None = None, tensors: dict | None = None) -> Path:
    """A small Llama folder, its config updated with `config` and its safetensors with `tensors`."""
    folder = write_model_folder(tmp_path / "model")
    if config:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    if tensors:
        weights = folder / "model.safetensors"
        save_file({**load_file(weights), **tensors}, weights)
    return folder


def _bias(size: int) -> np.ndarray:
    return np.full(size, 0.25, np.float32)


@pytest.mark.parametrize(
    ("config", "tensors", "named"),
    [
        ({"attention_bias": "yes"}, {}, "field 'attention_bias' must be true or false, not \"yes\""),
        (
            {"layer_types": ["full_attention", "sliding_attention"]},
            {},
            'config key \'layer_types\' is ["full_attention", "sliding_attention"]',
        ),
        ({"hidden_act": "gelu"}, {}, "config key 'hidden_act' is \"gelu\""),
        ({"hidden_act": "gelu_pytorch_tanh"}, {}, "config key 'hidden_act' is \"gelu_pytorch_tanh\""),
        ({"partial_rotary_factor": 0.5}, {}, "config key 'partial_rotary_factor' is 0.5"),
        (
            {"layer_types": ["full_attention", "chunked_attention"], "sliding_window": 2},
            {},
            'config key \'layer_types\' is ["full_attention", "chunked_attention"]',
        ),
        ({"layer_types": ["full_attention"] * 2, "sliding_window": 2}, {}, "for each of the 1 layers"),
        (
            {"rope_parameters": {"rope_theta": 1e4, "rope_type": "default", "partial_rotary_factor": 0.5}},
            {},
            "rope_parameters: 'partial_rotary_factor' is 0.5",
        ),
        (
            {"rope_parameters": {"rope_theta": 1e4, "rope_type": "default", "mrope_section": [1]}},
            {},
            "rope_parameters: key 'mrope_section' is not one logos-ir reads",
        ),
        ({"model_type": "phi3", "rope_scaling": {"type": "longrope"}}, {}, "longrope rope scaling: required field"),
        ({"attn_logit_softcapping": 50.0}, {}, "config key 'attn_logit_softcapping' is not one a 'llama' model reads"),
        ({"num_local_experts": 8}, {}, "config key 'num_local_experts' is 8"),
        ({"query_pre_attn_scalar": 256}, {}, "config key 'query_pre_attn_scalar' is not one a 'llama' model reads"),
        ({"frobnicate": True}, {}, "config key 'frobnicate' is not one logos-ir reads"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) and v else None,
)
def test_a_config_key_the_program_cannot_say_is_refused_by_name(
    tmp_path: Path, config: dict, tensors: dict, named: str
) -> None:
    folder = _folder(tmp_path, config, tensors)
    with pytest.raises(SpecError, match=re.escape(named)):
        open_model(str(folder))


@pytest.mark.parametrize(
    ("config", "biased", "missing"),
    [  # a Llama's attention_bias is the output projection's bias too (Qwen2's attention has none there)
        ({"attention_bias": True}, "qkv", "model.layers.0.self_attn.o_proj.bias"),
        ({"mlp_bias": True}, "", "model.layers.0.mlp.gate_proj.bias"),
    ],
    ids=["attention_bias", "mlp_bias"],
)
def test_a_bias_the_config_says_is_read_and_a_missing_one_refused_by_name(
    tmp_path: Path, config: dict, biased: str, missing: str
) -> None:
    spec = small_spec()
    tensors = {
        f"model.layers.{n}.self_attn.{p}_proj.bias": _bias(spec.q_dim if p == "q" else spec.kv_dim)
        for p in biased
        for n in range(spec.layers)
    }
    with pytest.raises(WeightError, match=re.escape(f"tensor '{missing}' is missing")):
        open_model(str(_folder(tmp_path, config, tensors)))


def test_the_keys_a_llama_config_carries_beside_its_sizes_are_accepted(tmp_path: Path) -> None:
    neutral = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 2048,
        "mlp_bias": False,
        "pretraining_tp": 1,
        "use_cache": True,
        "transformers_version": "4.46.0",
        "rope_interleaved": False,
        "partial_rotary_factor": 1,
        "sliding_window": None,
    }
    plain = open_model(str(_folder(tmp_path / "plain")))
    store = open_model(str(_folder(tmp_path / "neutral", neutral)))
    assert store.spec == plain.spec


@pytest.mark.parametrize(
    ("tensor", "hint"),
    [
        ("model.layers.1.mlp.down_proj.weight", "computes without one of its tensors"),  # a layer beyond the config
        ("model.layers.0.self_attn.q_proj.bias", "computes without one of its tensors"),
        ("model.layers.0.post_feedforward_layernorm.weight", "computes without one of its tensors"),
    ],
)
def test_a_tensor_the_program_does_not_read_is_refused_by_name(tmp_path: Path, tensor: str, hint: str) -> None:
    folder = _folder(tmp_path, tensors={tensor: _bias(4)})
    with pytest.raises(WeightError, match=rf"model.safetensors: tensor '{tensor}' is not read") as error:
        open_model(str(folder))
    assert "compute without one of its tensors" in str(error.value)


def test_a_head_beside_a_tied_embedding_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"tie_word_embeddings": True})  # the file holds the untied model's lm_head.weight
    with pytest.raises(WeightError, match="tensor 'lm_head.weight' is not read") as error:
        open_model(str(folder))
    assert "tie_word_embeddings" in str(error.value)


def test_rotary_buffers_of_older_checkpoints_are_not_weights(tmp_path: Path) -> None:
    buffers = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(1, np.float32)}  # recomputed, as HF does
    store = open_model(str(_folder(tmp_path / "buffers", tensors=buffers)))
    assert store.spec == open_model(str(_folder(tmp_path / "plain"))).spec


def _gguf(tmp_path: Path, name: str, **extra: object) -> Path:
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(model_gguf(**extra))  # type: ignore[arg-type]
    return path


def test_a_gguf_bias_is_read_and_one_of_a_layer_the_model_lacks_refused_by_name(tmp_path: Path) -> None:
    # a first layer's bias says the projection adds one, as llama.cpp applies it (every layer must then hold it)
    assert open_model(str(_gguf(tmp_path, "bias", extra_tensors=["blk.0.attn_q.bias"]))).spec.biases == ("query",)
    path = _gguf(tmp_path, "late", extra_tensors=["blk.1.attn_q.bias"])  # the model has one layer
    with pytest.raises(WeightError, match=r"late.gguf: tensor 'model.layers.1.self_attn.q_proj.bias' is not read"):
        open_model(str(path))
    open_model(str(_gguf(tmp_path, "plain")))  # the same file without it opens


@pytest.mark.parametrize(
    ("key", "kind", "value", "named"),
    [
        ("llama.attention.sliding_window", U32, 2, "'llama.attention.sliding_window' is not one logos-ir reads"),
        # experts (a Mixtral) without how many a token takes
        ("llama.expert_count", U32, 8, "GGUF metadata 'llama.expert_used_count' is missing"),
        ("llama.attention.value_length", U32, 1, "'llama.attention.value_length' is 1, not the head size 2"),
        # a rotation over part of a Llama's head (its rows are permuted for the interleaved mode over all of it)
        ("llama.rope.dimension_count", U32, 1, "'llama.rope.dimension_count' is 1, not the head size 2"),
        ("llama.logit_scale", F32, 0.5, "'llama.logit_scale' is not one logos-ir reads"),
        ("split.count", U32, 2, "'split.count' is not one logos-ir reads"),
    ],
)
def test_a_gguf_key_the_program_cannot_say_is_refused_by_name(
    tmp_path: Path, key: str, kind: int, value: object, named: str
) -> None:
    path = _gguf(tmp_path, "key", extra_metadata=[(key, kind, value)])
    with pytest.raises(SpecError, match=named):
        open_model(str(path))


def test_neutral_gguf_keys_are_accepted(tmp_path: Path) -> None:
    meta = [
        ("general.license", STRING, "apache-2.0"),
        ("llama.expert_count", U32, 0),
        ("quantize.imatrix.file", STRING, "x"),
    ]
    assert (
        open_model(str(_gguf(tmp_path, "neutral", extra_metadata=meta))).spec
        == open_model(str(_gguf(tmp_path, "plain"))).spec
    )


def test_logos_run_refuses_before_anything_runs(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"hidden_act": "gelu"})
    done = subprocess.run(
        [sys.executable, "-m", "logos_ir.tools.logos_run", "--model", str(folder), "--prompt-ids", "1,2", "-n", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode not in (0, 70), done.stderr
    assert "config key 'hidden_act' is \"gelu\"" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_neutral_key_changes_nothing() -> None:
    config = hf_config(small_spec())
    assert ModelSpec.from_hf_config({**config, "use_cache": False, "bos_token_id": 9}) == small_spec()


def test_a_cache_longer_than_the_trained_context_is_warned_of(tmp_path: Path) -> None:
    # max_position_embeddings changes nothing computed (transformers computes past it alike), so it is neutral;
    # logos-run says, as llama.cpp does, when the cache is longer than what the model was trained on
    folder = _folder(tmp_path, {"max_position_embeddings": 32})
    assert open_model(str(folder)).trained_ctx == 32
    assert open_model(str(_gguf(tmp_path, "gguf"))).trained_ctx == 2048  # llama.context_length

    def run(ctx: str) -> subprocess.CompletedProcess[str]:
        command = ["--model", str(folder), "--prompt-ids", "1,2", "-n", "2", "--ctx", ctx]
        return subprocess.run(
            [sys.executable, "-m", "logos_ir.tools.logos_run", *command], capture_output=True, text=True, timeout=120
        )

    longer, within = run("64"), run("32")
    assert longer.returncode == 0 and within.returncode == 0, longer.stderr + within.stderr
    assert "a cache of 64 positions is longer than the 32 the model was trained on" in longer.stderr
    assert "trained on" not in within.stderr


def test_prompt_ids_run_a_gguf_whose_tokenizer_logos_ir_cannot_rebuild(tmp_path: Path) -> None:
    # a WordPiece tokenizer (llama.cpp's "bert", of embedding models): text is refused, ids run, the answer as ids
    path = _gguf(tmp_path, "wpm", extra_metadata=[("tokenizer.ggml.model", STRING, "bert")])

    def run(*given: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "logos_ir.tools.logos_run", "--model", str(path), *given, "-n", "3"]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    ids, text = run("--prompt-ids", "1,2"), run("--prompt", "hello")
    assert ids.returncode == 0, ids.stderr
    assert "tokenizer model 'bert' is not supported; the answer is given as token ids" in ids.stderr
    assert text.returncode not in (0, 70) and "tokenizer model 'bert' is not supported" in text.stderr
    assert "Traceback" not in ids.stderr + text.stderr


def test_a_sliding_window_is_said_and_applied_where_the_cache_is_longer(tmp_path: Path) -> None:
    # Mistral's window: every program of the model says it; an attention says it where it bites (the families'
    # goldens prove the tokens: mistral-window, qwen2-window)
    folder = _folder(tmp_path, {"model_type": "mistral", "sliding_window": 2})
    spec = open_model(str(folder)).spec
    assert spec.sliding_window == 2 and spec.full_layers == ()
    assert "Attention looks back over a sliding window of 2 positions." in write(spec, Cut.decode(2)).text
    assert "within the last" not in write(spec, Cut.decode(2)).text  # a cache the window covers: nothing to say
    assert write(spec, Cut.decode(64)).text.count("up to position, within the last 2 positions.") == spec.layers
    two = replace(spec, layers=2, full_layers=(1,))  # the text alone: its second layer attends everything
    assert write(two, Cut.decode(64)).text.count("up to position, within the last 2 positions.") == 1
    # a window the config says it does not use (Qwen2's files carry one) is no window
    unused = {"sliding_window": 4, "use_sliding_window": False, "max_window_layers": 1}
    assert open_model(str(_folder(tmp_path / "unused", unused))).spec.sliding_window is None
    # Qwen2's window used, with no layer_types: its first max_window_layers (by default 28) attend everything
    used = {"model_type": "qwen2", "sliding_window": 4, "use_sliding_window": True}
    assert ModelSpec.from_hf_config(_folder(tmp_path / "default", used)).sliding_window is None  # 28 >= its 1 layer
    two_layers = {**used, "num_hidden_layers": 2, "max_window_layers": 1}
    first = ModelSpec.from_hf_config(_folder(tmp_path / "first", two_layers))
    assert (first.sliding_window, first.full_layers) == (4, (0,))
    assert "a sliding window of 4 positions, except in layer 0." in write(first, Cut.decode(8)).text


FAMILIES = Path(__file__).parent / "families"
UNWINDOWED = "attention of layer 0 over every cached position, but its layer's attention slides over a window of 32"


def test_the_window_fact_round_trips_and_the_verifier_holds_the_cache_to_it() -> None:
    spec = replace(small_spec(), sliding_window=64)
    text = write(spec, Cut.decode(64)).text
    assert print_program(parse_program(text)) == text
    module = mlir_text(text)
    assert "sliding_window = 64>" in module
    narrowed = module.replace("sliding_window = 64>", "sliding_window = 32>")
    with pytest.raises(VerifyException, match=UNWINDOWED):
        _parse_mlir(narrowed).verify()
    windowed = write(replace(spec, layers=2, sliding_window=32, full_layers=(1,)), Cut.decode(64)).text
    assert print_program(parse_program(windowed)) == windowed
    assert "full_layers = array<i64: 1>" in mlir_text(windowed) and "window 32 :" in mlir_text(windowed)
    unwindowed = mlir_text(windowed).replace("window 32 :", ":")
    with pytest.raises(VerifyException, match=UNWINDOWED):
        _parse_mlir(unwindowed).verify()


def _parse_mlir(text: str) -> ModuleOp:
    context = Context()
    for dialect in (builtin.Builtin, func.Func, shard.Shard, LOGOS):
        context.load_dialect(dialect)
    return Parser(context, text).parse_module()


def test_the_biases_fact_and_sentence_round_trip_and_the_verifier_holds_a_bias_to_its_rows() -> None:
    spec = replace(small_spec(), sliding_window=64, biases=("query", "key", "value", "down"))
    text = write(spec, Cut.decode(64)).text
    assert "    The query, key, value and down projections add biases.\n" in text
    assert "    Let query be unbiased_query with query_bias added to each row.\n" in text
    assert print_program(parse_program(text)) == text
    module = mlir_text(text)
    assert 'sliding_window = 64, biases = ["query", "key", "value", "down"]>' in module
    assert _parse_mlir(module).ops.first.spec == spec  # type: ignore[union-attr]
    bias = f'"model.layers.0.self_attn.q_proj.bias" shape [{spec.q_dim}] : tensor<{spec.q_dim}xf32>'
    narrowed = module.replace(bias, '"model.layers.0.self_attn.q_proj.bias" shape [3] : tensor<3xf32>', 1)
    narrowed = narrowed.replace(
        f"%query_bias : (tensor<1x{spec.q_dim}xf32>, tensor<{spec.q_dim}xf32>)",
        "%query_bias : (tensor<1x4xf32>, tensor<3xf32>)",
        1,
    )
    assert narrowed.count("tensor<3xf32>") == 2
    with pytest.raises(VerifyException, match=re.escape(f"bias shape mismatch: got (3,), expected ({spec.q_dim},)")):
        _parse_mlir(narrowed).verify()


@pytest.mark.parametrize(
    ("fact", "message"),
    [
        ("The query and bananas projections add biases.", "malformed biases fact"),
        ("The key and query projections add biases.", "the projections of a biases fact are named in model order"),
    ],
)
def test_a_wrong_biases_fact_is_located(fact: str, message: str) -> None:
    text = write(replace(small_spec(), biases=("query", "key")), Cut.decode(8)).text
    at = text.split("\n").index("    The query and key projections add biases.") + 1
    with pytest.raises(LogosError, match=re.escape(message)) as raised:
        parse_program(text.replace("The query and key projections add biases.", fact), "p.logos")
    assert str(raised.value).startswith(f"p.logos:{at}:5: error: ")


def test_the_linear_rope_scaling_fact_round_trips_and_says_which_layers_it_scales(tmp_path: Path) -> None:
    """A linear scaling (a long-context Llama 2's in every layer; Gemma 3's in its global layers, whose windowed
    layers rotate unscaled with their own base) is a fact of the program, its attribute in the module and on each
    rotation it applies to, and read from a config in either form transformers writes."""
    from logos_ir.spec import RopeScaling

    linear = RopeScaling(4.0, rope_type="linear")
    spec = replace(small_spec(), rope_scaling=linear)
    text = write(spec, Cut.decode(8)).text
    assert "    The rotary frequencies are divided by 4.0 (linear scaling).\n" in text
    assert print_program(parse_program(text)) == text
    module = mlir_text(text)
    assert "rope_scaling = #logos.linear_rope_scaling<factor = 4.0>" in module
    assert module.count("linear_scaling <factor = 4.0>") == 2 * spec.layers
    assert _parse_mlir(module).ops.first.spec == spec  # type: ignore[union-attr]
    assert ModelSpec.from_hf_config(_folder(tmp_path / "llama", hf_config(spec))) == spec

    gemma = replace(spec, layers=2, sliding_window=4, full_layers=(1,), local_rope_theta=5000.0)
    text = write(gemma, Cut.decode(8)).text
    fact = "The rotary frequencies are divided by 4.0 (linear scaling), except in the layers with a sliding window."
    assert f"    {fact}\n" in text
    assert print_program(parse_program(text)) == text
    assert mlir_text(text).count("linear_scaling <factor = 4.0>") == 2  # layer 1's query and key only
    at = text.split("\n").index(f"    {fact}") + 1
    with pytest.raises(LogosError, match="this fact is not written the one LOGOS way") as raised:
        parse_program(text.replace(fact, "The rotary frequencies are divided by 4.0 (linear scaling)."), "p.logos")
    assert str(raised.value).startswith(f"p.logos:{at}:5: error: ")
    newer = json.loads((FAMILIES / "gemma3_text-linear" / "config.json").read_text())
    older = {key: value for key, value in newer.items() if key != "rope_parameters"}  # transformers 4's form
    older |= {"rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_local_base_freq": 1e4}
    for config in (newer, older):
        read = ModelSpec.from_hf_config(config)
        said = (read.rope_scaling, read.rope_theta, read.local_rope_theta)
        assert said == (RopeScaling(8.0, rope_type="linear"), 1e6, 1e4)


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        ({"rope_type": "linear"}, "required field 'factor' is missing"),
        ({"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 64}, "key 'original_max_posi"),
        ({"rope_type": "linear", "factor": -2.0}, "rope scaling factor must be a positive number"),
        ({"rope_type": "dynamic", "factor": 2.0}, "rope scaling of type 'dynamic' is not supported"),
    ],
)
def test_a_linear_rope_scaling_a_program_cannot_say_is_refused_by_name(
    tmp_path: Path, rope: dict, message: str
) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        ModelSpec.from_hf_config(_folder(tmp_path, {"rope_scaling": rope}))


def test_a_scaling_of_gemma3s_windowed_layers_is_refused_by_name() -> None:
    linear = {"rope_type": "linear", "factor": 8.0}
    config = json.loads((FAMILIES / "gemma3_text-linear" / "config.json").read_text())
    config["rope_parameters"]["sliding_attention"] |= linear
    with pytest.raises(SpecError, match="a rope scaling of the windowed layers is not said yet"):
        ModelSpec.from_hf_config(config)


def test_the_rotary_embedding_fact_round_trips_and_the_verifier_holds_each_rotation_to_it(tmp_path: Path) -> None:
    """Phi-3's partial rotary (`partial_rotary_factor`, at the top level or in `rope_parameters`): the first
    int(head_dim x factor) numbers of each head rotate; a fact of the program and a property of each rotation."""
    base = json.loads((FAMILIES / "phi3-gguf-partial" / "config.json").read_text())
    spec = ModelSpec.from_hf_config(base)
    assert (spec.head_dim, spec.rotary_dim) == (16, 8)
    top = {key: value for key, value in base.items() if key != "rope_parameters"} | {"rope_theta": 10000.0}
    assert ModelSpec.from_hf_config(top) == spec  # the older form, the factor at the top level
    whole = {**base, "rope_parameters": {**base["rope_parameters"], "partial_rotary_factor": 1.0}}
    assert ModelSpec.from_hf_config(whole).rotary_dim is None
    text = write(spec, Cut.decode(8)).text
    fact = "The rotary embedding turns the first 8 of each head's 16 numbers."
    assert f"    {fact}\n" in text and print_program(parse_program(text)) == text
    module = mlir_text(text)
    assert "rotary_dim = 8>" in module and module.count("head_dim 16 rotary_dim 8 theta") == 2 * spec.layers
    assert _parse_mlir(module).ops.first.spec == spec  # type: ignore[union-attr]
    whole_head = module.replace("head_dim 16 rotary_dim 8 theta", "head_dim 16 theta", 1)
    with pytest.raises(VerifyException, match="has a rotation of the whole head, not its model's rotary_dim 8"):
        _parse_mlir(whole_head).verify()
    at = text.split("\n").index(f"    {fact}") + 1
    with pytest.raises(LogosError, match="this fact is not written the one LOGOS way") as raised:
        parse_program(
            text.replace(fact, "The rotary embedding turns the first 8 of each head's 17 numbers."), "p.logos"
        )
    assert str(raised.value).startswith(f"p.logos:{at}:5: error: ")
    odd = {**base, "rope_parameters": {**base["rope_parameters"], "partial_rotary_factor": 0.1}}
    with pytest.raises(SpecError, match="rotates 1 of each head's 16 numbers, which is no whole number of pairs"):
        ModelSpec.from_hf_config(odd)
