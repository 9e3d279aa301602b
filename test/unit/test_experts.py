"""Mixtures of experts below the program: their configs read (every key accounted for), their checkpoints' experts
stacked by the weight manifest (each file tensor read or refused by name), and the reference's routing held to a
plain per-token reading of transformers' Mixtral and Qwen3-MoE routers (softmax, `torch.topk`, renormalisation,
the experts' weighted sum); transformers' own tokens are test_families'.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from logos_ir.errors import SpecError, WeightError
from logos_ir.interpreter import kernels
from logos_ir.spec import ModelSpec
from logos_ir.testing import RandomWeights, save_gguf
from logos_ir.weights import open_model
from logos_ir.weights.safetensors import save_model

FAMILIES = Path(__file__).parent / "families"


# -- configs ---------------------------------------------------------------------------------------------------


def _config(family: str) -> dict:
    return json.loads((FAMILIES / family / "config.json").read_text())


def test_the_families_configs_say_their_mixtures() -> None:
    mixtral = ModelSpec.from_hf_config(_config("mixtral"))
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.renormalize, mixtral.intermediate) == (4, 2, True, 32)
    qwen = ModelSpec.from_hf_config(_config("qwen3_moe"))
    assert (qwen.experts, qwen.experts_per_token, qwen.renormalize, qwen.intermediate) == (4, 2, True, 32)
    assert qwen.head_norms and not mixtral.head_norms
    assert not ModelSpec.from_hf_config(_config("qwen3_moe-unnormed")).renormalize
    olmoe = ModelSpec.from_hf_config(_config("olmoe"))
    assert (olmoe.experts, olmoe.experts_per_token, olmoe.renormalize, olmoe.intermediate) == (4, 2, False, 32)
    assert olmoe.projection_norms and not olmoe.head_norms and not qwen.projection_norms
    # its norms as wide as the whole query (4 heads of 16) and the whole key (2 key-value heads)
    assert olmoe.weight_shape("model.layers.0.self_attn.q_norm.weight") == (64,)
    assert olmoe.weight_shape("model.layers.0.self_attn.k_norm.weight") == (32,)


@pytest.mark.parametrize(
    ("family", "change", "named"),
    [
        ("qwen3_moe", {"decoder_sparse_step": 2}, "'decoder_sparse_step' 2 and 'mlp_only_layers' []"),
        ("qwen3_moe", {"mlp_only_layers": [1]}, "'mlp_only_layers' [1]"),
        ("qwen3_moe", {"num_experts_per_tok": 5}, "a mixture of 4 experts cannot route each token to 5"),
        ("qwen3_moe", {"norm_topk_prob": 1}, "field 'norm_topk_prob' must be true or false"),
        ("mixtral", {"num_local_experts": None}, "required field 'num_local_experts' is missing"),
        ("mixtral", {"moe_intermediate_size": 16}, "config key 'moe_intermediate_size' is not one logos-ir reads"),
        ("olmoe", {"clip_qkv": 8.0}, "config key 'clip_qkv' is 8.0, which a LOGOS program cannot say yet"),
        ("olmoe", {"head_dim": 8}, "an OLMoE's query is hidden_size (64) wide, which its q_norm norms whole"),
        ("olmoe", {"sliding_window": 16}, "config key 'sliding_window' is not one an 'olmoe' model reads"),
        ("olmoe", {"norm_topk_prob": "no"}, "field 'norm_topk_prob' must be true or false"),
        ("olmoe", {"moe_intermediate_size": 16}, "config key 'moe_intermediate_size' is not one logos-ir reads"),
        ("mixtral", {"model_type": "llama"}, "config key 'num_experts_per_tok' is 2, which a LOGOS program cannot"),
    ],
    ids=[
        "sparse-step",
        "mlp-only-layers",
        "top-k",
        "norm-topk-prob",
        "no-experts",
        "qwen-key",
        "olmoe-clip-qkv",
        "olmoe-head-dim",
        "olmoe-window",
        "olmoe-norm-topk-prob",
        "olmoe-qwen-key",
        "llama",
    ],  # fmt: skip
)
def test_a_mixture_the_program_cannot_say_is_refused_by_name(family: str, change: dict, named: str) -> None:
    config = {**_config(family), **change}
    with pytest.raises(SpecError) as refused:
        ModelSpec.from_hf_config(config)
    assert named in str(refused.value)


def test_the_routers_training_keys_are_neutral() -> None:
    """Router noise (training only), its auxiliary loss and whether the forward returns its logits change nothing
    transformers computes at inference; Qwen3-MoE's dense width is no layer's where every layer is a mixture."""
    mixtral = _config("mixtral")
    noisy = {**mixtral, "router_jitter_noise": 0.1, "router_aux_loss_coef": 0.5, "output_router_logits": True}
    assert ModelSpec.from_hf_config(noisy) == ModelSpec.from_hf_config(mixtral)
    qwen = _config("qwen3_moe")
    assert ModelSpec.from_hf_config({**qwen, "intermediate_size": 999}) == ModelSpec.from_hf_config(qwen)


# The published config.json files of Mixtral-8x7B-v0.1 and Qwen3-30B-A3B (their hub pages), key for key.
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


@pytest.mark.parametrize(("config", "preset"), [(MIXTRAL_8X7B, "mixtral-8x7b"), (QWEN3_30B_A3B, "qwen3-30b-a3b")])
def test_the_published_configs_read_as_their_presets(config: dict, preset: str) -> None:
    assert ModelSpec.from_hf_config(config) == ModelSpec.preset(preset)


def test_the_mixture_presets_have_their_published_shapes() -> None:
    mixtral = ModelSpec.preset("mixtral-8x7b")
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.intermediate, mixtral.hidden) == (8, 2, 14336, 4096)
    qwen = ModelSpec.preset("qwen3-30b-a3b")
    assert (qwen.experts, qwen.experts_per_token, qwen.intermediate, qwen.layers) == (128, 8, 768, 48)
    assert qwen.renormalize and qwen.head_norms
    # the published totals: about 46.7B parameters for Mixtral-8x7B, 30.5B for Qwen3-30B-A3B
    for spec, total in ((mixtral, 46.7e9), (qwen, 30.5e9)):
        count = sum(int(np.prod(shape)) for _, shape in spec.weights())
        assert abs(count - total) / total < 0.01, (spec, count)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"experts": 4}, "'experts_per_token' must be a positive integer"),
        ({"experts": 4, "experts_per_token": 5}, "'experts_per_token' (5) must be at most the number of experts (4)"),
        ({"renormalize": True}, "a model without experts has none"),
        ({"experts": 4, "experts_per_token": 2, "activation": "gelu_tanh"}, "another activation is not said yet"),
        ({"experts": 4, "experts_per_token": 2, "biases": ("gate", "up", "down")}, "MLPs add biases"),
    ],
)
def test_a_spec_of_a_mixture_it_cannot_compute_is_refused(change: dict, message: str) -> None:
    from dataclasses import replace

    with pytest.raises(SpecError) as refused:
        replace(ModelSpec.preset("tiny"), **change)
    assert message in str(refused.value)


# -- checkpoints: experts stacked by the manifest --------------------------------------------------------------


def test_the_store_stacks_each_experts_tensor_in_expert_order() -> None:
    store = open_model(str(FAMILIES / "mixtral"))
    header = _header(FAMILIES / "mixtral" / "model.safetensors")
    stacked = store.get("model.layers.1.mlp.experts.down_proj.weight")
    assert stacked.shape == (4, 64, 32)
    for expert in range(4):
        entry = header[f"model.layers.1.block_sparse_moe.experts.{expert}.w2.weight"]
        raw = (FAMILIES / "mixtral" / "model.safetensors").read_bytes()
        start = 8 + struct.unpack("<Q", raw[:8])[0] + entry["data_offsets"][0]
        own = np.frombuffer(raw, "<f4", count=64 * 32, offset=start).reshape(64, 32)
        np.testing.assert_array_equal(stacked[expert], own)
    assert store.get("model.layers.1.mlp.gate.weight").shape == (4, 64)  # block_sparse_moe.gate, renamed


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe-unnormed", "olmoe"])
@pytest.mark.parametrize("shards", [1, 3])
def test_a_mixture_saved_as_its_familys_checkpoint_reads_back(tmp_path: Path, family: str, shards: int) -> None:
    spec = ModelSpec.from_hf_config(_config(family))
    weights = RandomWeights(spec, seed=2)
    save_model(weights, tmp_path, shards=shards)
    back = open_model(str(tmp_path))
    assert back.spec == spec
    for name in weights.names():
        np.testing.assert_array_equal(back.get(name), weights.get(name))
    names = (
        set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"])
        if shards > 1
        else set(_header(tmp_path / "model.safetensors"))
    )
    expert = "block_sparse_moe.experts.3.w3" if family == "mixtral" else "mlp.experts.3.up_proj"
    assert f"model.layers.1.{expert}.weight" in names and "model.layers.1.mlp.experts.up_proj.weight" not in names


def _header(path: Path) -> dict:
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    header.pop("__metadata__", None)
    return header


def _rewritten(tmp_path: Path, family: str, edit) -> Path:  # noqa: ANN001
    """A copy of the family's folder whose safetensors header `edit` changes (tensors renamed or dropped; the data
    left as it is, so every remaining entry still lies inside the file)."""
    folder = tmp_path / family
    shutil.copytree(FAMILIES / family, folder)
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the offsets count from the data's start, wherever the header ends
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])
    return folder


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            lambda h: h.pop("model.layers.0.block_sparse_moe.experts.2.w1.weight"),
            "tensor 'model.layers.0.block_sparse_moe.experts.2.w1.weight' is missing (expert 2 of "
            "'model.layers.0.mlp.experts.gate_proj.weight')",
        ),
        (
            lambda h: h.update(
                {
                    "model.layers.0.block_sparse_moe.experts.4.w1.weight": h.pop(
                        "model.layers.0.block_sparse_moe.experts.3.w1.weight"
                    )
                }
            ),
            "tensor 'model.layers.0.block_sparse_moe.experts.4.w1.weight' is expert 4, but the model has experts 0"
            " to 3",
        ),
        (
            lambda h: h.update(
                {
                    "model.layers.0.block_sparse_moe.experts.1.w1.weight": h.pop(
                        "model.layers.0.block_sparse_moe.experts.1.w2.weight"
                    )
                }
            ),
            "tensor 'model.layers.0.block_sparse_moe.experts.1.w1.weight' has shape [64, 32], but the model's spec"
            " says [32, 64] (expert 1 of 'model.layers.0.mlp.experts.gate_proj.weight')",
        ),
        (
            lambda h: h.update(  # an empty tensor: its span overlaps no other's
                {
                    "model.layers.2.block_sparse_moe.gate.weight": {
                        "dtype": "F32",
                        "shape": [0, 64],
                        "data_offsets": [0, 0],
                    }
                }
            ),
            "tensor 'model.layers.2.block_sparse_moe.gate.weight' is not read by the model's program",
        ),
    ],
    ids=["missing-expert", "extra-expert", "wrong-shape", "layer-it-lacks"],
)
def test_an_expert_the_model_does_not_read_as_it_is_refused_by_name(tmp_path: Path, edit, named: str) -> None:  # noqa: ANN001
    folder = _rewritten(tmp_path, "mixtral", edit)
    with pytest.raises(WeightError) as refused:
        open_model(str(folder))
    assert named in str(refused.value)


# -- the reference's routing -----------------------------------------------------------------------------------


def _routed_by_hand(x, logits, gate, up, down, top_k, renormalize):  # noqa: ANN001, ANN202
    """transformers' routing read token by token in float64: softmax, the k best (lowest index on a tie), their
    weights renormalized or not, each chosen expert's SwiGLU weighted and summed."""
    out = np.zeros(x.shape, np.float64)
    for row in range(x.shape[0]):
        z = logits[row].astype(np.float64)
        probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:top_k]
        weights = probs[chosen] / (probs[chosen].sum() if renormalize else 1.0)
        for expert, weight in zip(chosen, weights, strict=True):
            g, u = gate[expert] @ x[row], up[expert] @ x[row]
            out[row] += weight * (down[expert] @ (g / (1 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_the_kernel_routes_as_transformers_does(top_k: int, renormalize: bool) -> None:
    rng = np.random.default_rng(top_k + 10 * renormalize)
    rows, hidden, inter, experts = 6, 8, 5, 4
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    logits = rng.standard_normal((rows, experts)).astype(np.float32) * 2
    gate, up = (rng.standard_normal((experts, inter, hidden)).astype(np.float32) for _ in range(2))
    down = rng.standard_normal((experts, hidden, inter)).astype(np.float32)
    registers: list = [x, logits, None]
    kernels.experts(gate, up, down, top_k, renormalize)(0, 1, 2)(registers)
    expected = _routed_by_hand(x, logits, gate, up, down, top_k, renormalize)
    np.testing.assert_allclose(registers[2], expected, rtol=2e-5, atol=2e-5)
    assert registers[2].dtype == np.float32


def test_a_tie_goes_to_the_lowest_expert_as_torch_topk() -> None:
    """Equal logits for experts 1, 2 and 3: top-2 takes expert 0 (the best) and expert 1, the lowest of the tie."""
    hidden, inter, experts = 3, 2, 4
    gate = np.ones((experts, inter, hidden), np.float32)
    up = np.ones((experts, inter, hidden), np.float32)
    down = np.stack([np.full((hidden, inter), e + 1.0, np.float32) for e in range(experts)])  # expert e: e + 1
    x = np.ones((1, hidden), np.float32)
    logits = np.array([[3.0, 1.0, 1.0, 1.0]], np.float32)
    registers: list = [x, logits, None]
    kernels.experts(gate, up, down, 2, True)(0, 1, 2)(registers)
    np.testing.assert_allclose(registers[2], _routed_by_hand(x, logits, gate, up, down, 2, True), rtol=1e-6)
    other = _routed_by_hand(x, np.array([[3.0, 1.0, 1.0, 1.001]], np.float32), gate, up, down, 2, True)
    assert not np.allclose(registers[2], other)  # had expert 3 been taken, the sum would differ


# -- the program: written once, printed and parsed byte for byte -----------------------------------------------


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen3_moe-unnormed", "olmoe"])
@pytest.mark.parametrize("cut", ["decode ctx=8", "prefill rows=4 ctx=8", "batch rows=2 ctx=8", "forward"])
def test_a_mixtures_program_round_trips_byte_for_byte(family: str, cut: str) -> None:
    from logos_ir.author import write
    from logos_ir.parser import parse_program
    from logos_ir.printer import print_program
    from logos_ir.program import Cut

    spec = ModelSpec.from_hf_config(_config(family))
    text = write(spec, Cut.parse(cut)).text
    program = parse_program(text)
    program.verify()
    assert print_program(program) == text
    mixtures = [op for op in program.walk() if op.name == "logos.experts"]
    assert len(mixtures) == spec.layers and all(op.name != "logos.silu" for op in program.walk())


def test_a_malformed_mixture_sentence_is_located() -> None:
    from logos_ir.author import write
    from logos_ir.errors import ParseError
    from logos_ir.parser import parse_program
    from logos_ir.program import Cut

    text = write(ModelSpec.from_hf_config(_config("mixtral")), Cut.parse("decode ctx=8")).text
    broken = text.replace("routed by router_logits to the best 2", "routed by router_logit to the best 2", 1)
    with pytest.raises(ParseError) as refused:
        parse_program(broken, "moe.logos")
    line = next(n for n, row in enumerate(broken.split("\n"), start=1) if "router_logit to" in row)
    column = broken.split("\n")[line - 1].index("router_logit to") + 1
    assert str(refused.value).startswith(f"moe.logos:{line}:{column}: error: 'router_logit' is not defined")


# -- GGUF: llama.cpp's qwen3moe, its experts stacked in the file -----------------------------------------------


def _moe_gguf(  # noqa: ANN201
    path: Path,
    store,
    skip: tuple[str, ...] = (),
    arch: str = "qwen3moe",
    expert_width: bool | None = None,  # noqa: ANN001
):
    """`store` written as llama.cpp's converter writes a Qwen3-MoE (`Qwen3MoeModel`; with `arch` llama, a Mixtral,
    `MixtralModel`): keys under the architecture's prefix, the experts stacked (`blk.N.ffn_gate_exps`,
    `ffn_up_exps`, `ffn_down_exps`), the router `ffn_gate_inp`, Q and K unpermuted for Qwen's "neox" rotary and
    permuted for a Llama's, F32 throughout; `expert_width`: whether it writes `expert_feed_forward_length` (by
    default as its family's converter does: Qwen's, not Mixtral's)."""
    import gguf

    from logos_ir.weights.gguf import gguf_tensor_name, permute_qk

    spec = store.spec
    mixtral = arch == "llama"
    dense_width = arch == "qwen3moe"  # Qwen's converter: feed_forward_length a dense width, the experts' their own
    names = {"mlp.gate": "ffn_gate_inp", **{f"mlp.experts.{p}_proj": f"ffn_{p}_exps" for p in ("gate", "up", "down")}}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(spec.layers)
    writer.add_context_length(128)
    writer.add_embedding_length(spec.hidden)
    writer.add_feed_forward_length(128 if dense_width else spec.intermediate)  # Qwen's: a dense width no layer has
    if dense_width if expert_width is None else expert_width:  # Mixtral's and OLMoE's converters write none
        writer.add_expert_feed_forward_length(spec.intermediate)
    writer.add_expert_count(spec.experts)
    writer.add_expert_used_count(spec.experts_per_token)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    for hf in store.names():
        if hf in skip:
            continue
        layer, _, role = hf.removeprefix("model.layers.").partition(".")
        role = role.removesuffix(".weight")
        name = f"blk.{layer}.{names[role]}.weight" if role in names else gguf_tensor_name(hf)
        array = np.array(store.get(hf), np.float32)
        if mixtral and role in ("self_attn.q_proj", "self_attn.k_proj"):
            array = permute_qk(array, spec.heads if role == "self_attn.q_proj" else spec.kv_heads)
        writer.add_tensor(name, array)
    save_gguf(writer)
    return path


@pytest.mark.parametrize(("family", "arch"), [("qwen3_moe", "qwen3moe"), ("mixtral", "llama"), ("olmoe", "olmoe")])
def test_a_moe_gguf_gives_transformers_tokens(tmp_path: Path, family: str, arch: str) -> None:
    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    run = json.loads((FAMILIES / "goldens.json").read_text())["families"][family]["runs"][0]
    folder = open_model(str(FAMILIES / family))
    store = open_model(str(_moe_gguf(tmp_path / "moe.gguf", folder, arch=arch)))
    assert store.spec == folder.spec
    np.testing.assert_array_equal(
        store.get("model.layers.1.mlp.experts.down_proj.weight"),
        folder.get("model.layers.1.mlp.experts.down_proj.weight"),
    )
    lane = backends()["reference"].generator()(RunRequest(store))
    assert lane.generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.parametrize(("family", "arch"), [("qwen3_moe", "qwen3moe"), ("mixtral", "llama"), ("olmoe", "olmoe")])
def test_logos_run_on_a_moe_gguf_gives_transformers_tokens(tmp_path: Path, family: str, arch: str, capsys) -> None:  # type: ignore[no-untyped-def]
    from logos_ir.tools import logos_run

    path = _moe_gguf(tmp_path / "moe.gguf", open_model(str(FAMILIES / family)), arch=arch)
    for run in json.loads((FAMILIES / "goldens.json").read_text())["families"][family]["runs"]:
        argv = ["--model", str(path), "--prompt-ids", ",".join(map(str, run["prompt"])), "-n", "12", "--json"]
        assert logos_run.main(argv) == 0
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert report["new_ids"] == run["tokens"]


def test_a_qwen3moe_gguf_is_renormalized_as_llama_cpp_computes_it(tmp_path: Path) -> None:
    """llama.cpp's qwen3moe graph always divides the chosen weights by their sum (its GGUF has no key for
    norm_topk_prob), so a model without it reads as llama.cpp runs it: renormalized, not as transformers ran it."""
    folder = open_model(str(FAMILIES / "qwen3_moe-unnormed"))
    store = open_model(str(_moe_gguf(tmp_path / "unnormed.gguf", folder)))
    assert not folder.spec.renormalize and store.spec.renormalize


def test_a_moe_gguf_the_program_cannot_read_is_refused_by_name(tmp_path: Path) -> None:
    folder = open_model(str(FAMILIES / "qwen3_moe"))
    missing = _moe_gguf(tmp_path / "m.gguf", folder, skip=("model.layers.1.mlp.experts.up_proj.weight",))
    with pytest.raises(WeightError, match=r"tensor 'model.layers.1.mlp.experts.up_proj.weight' is missing"):
        open_model(str(missing))
    # llama.cpp's llama architecture (a Mixtral) says no expert width of its own: each expert's is its
    # feed_forward_length, so the key is refused by name there
    with pytest.raises(SpecError, match=r"GGUF metadata 'llama\.expert_feed_forward_length' is not one logos-ir"):
        open_model(
            str(
                _moe_gguf(
                    tmp_path / "llama.gguf", open_model(str(FAMILIES / "mixtral")), arch="llama", expert_width=True
                )
            )
        )


# -- expert parallelism: each chip whole experts, the router on every chip -------------------------------------

GOLDENS = json.loads((FAMILIES / "goldens.json").read_text())["families"]
MIXTURES = ("mixtral", "qwen3_moe", "qwen3_moe-unnormed", "olmoe")


def _kv_replicated(store, kv_heads: int):  # noqa: ANN001, ANN202
    """The same model with each key-value head repeated so it has `kv_heads` of them, as vLLM replicates them when
    the chips outnumber them: query head h still reads the copy of its own group's head, so the attention is the
    one the model computes, number for number, and the tokens are transformers' own. The tiny mixtures have 2
    key-value heads; repeated to 4, their attention splits by heads over 4 chips and their 4 experts one a chip."""
    from dataclasses import replace

    from logos_ir.weights.store import ArrayStore

    spec = store.spec
    repeat = kv_heads // spec.kv_heads
    arrays = {name: store.get(name) for name in store.names()}
    for name in arrays:
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            heads = arrays[name].reshape(spec.kv_heads, spec.head_dim, spec.hidden)
            arrays[name] = np.repeat(heads, repeat, axis=0).reshape(kv_heads * spec.head_dim, spec.hidden)
        if spec.projection_norms and name.endswith("self_attn.k_norm.weight"):  # OLMoE's norm of the whole key:
            # each head's weights repeated with it (the mean of squares over repeated heads is the same)
            heads = arrays[name].reshape(spec.kv_heads, spec.head_dim)
            arrays[name] = np.repeat(heads, repeat, axis=0).reshape(kv_heads * spec.head_dim)
    return ArrayStore(replace(spec, kv_heads=kv_heads), arrays)


def _generate(store, tokens: list[int], count: int, tp: int) -> list[int]:  # noqa: ANN001
    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    return backends()["reference"].generator()(RunRequest(store, tp=tp)).generate(tokens, count)


@pytest.mark.parametrize("family", MIXTURES)
@pytest.mark.parametrize("tp", [2, 4])
def test_a_mixture_split_by_experts_gives_transformers_tokens(family: str, tp: int) -> None:
    """Over 2 chips as the families are; over 4 with their key-value heads repeated to 4 (`_kv_replicated`), each
    chip then holding one expert of the 4. Every run of the goldens, prefilled and decoded on the split program."""
    store = open_model(str(FAMILIES / family))
    if tp > store.spec.kv_heads:
        store = _kv_replicated(store, tp)
        assert store.spec.kv_heads == tp
    for run in GOLDENS[family]["runs"]:
        assert _generate(store, run["prompt"], len(run["tokens"]), tp) == run["tokens"]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_a_mixture_with_four_key_value_heads_splits_over_4_chips_as_it_is(tp: int) -> None:
    """qwen3_moe-kv4 (4 query and 4 key-value heads, 4 experts): over 4 chips with nothing repeated, each chip one
    head of attention and one expert, transformers' tokens on every run of its goldens."""
    store = open_model(str(FAMILIES / "qwen3_moe-kv4"))
    assert store.spec.kv_heads == 4 and store.spec.experts == 4
    for run in GOLDENS["qwen3_moe-kv4"]["runs"]:
        assert _generate(store, run["prompt"], len(run["tokens"]), tp) == run["tokens"]


def test_a_mixture_needs_its_key_value_heads_to_split_over_4_chips() -> None:
    """The check on `_kv_replicated`: as they are, the tiny mixtures' 2 key-value heads do not split over 4 chips
    (attention keeps its head split), and the repeated heads change no token on one chip."""
    from logos_ir.author import written_split
    from logos_ir.program import Cut

    store = open_model(str(FAMILIES / "mixtral"))
    with pytest.raises(SpecError, match=r"kv_heads \(2\) is not a multiple of 4"):
        written_split(store.spec, Cut.decode(8), "", 4)
    run = GOLDENS["mixtral"]["runs"][0]
    assert _generate(_kv_replicated(store, 4), run["prompt"], len(run["tokens"]), 1) == run["tokens"]


@pytest.mark.parametrize(("family", "arch"), [("qwen3_moe", "qwen3moe"), ("mixtral", "llama"), ("olmoe", "olmoe")])
@pytest.mark.parametrize("tp", [2, 4])
def test_a_moe_gguf_split_by_experts_gives_transformers_tokens(tmp_path: Path, family: str, arch: str, tp: int) -> None:
    folder = open_model(str(FAMILIES / family))
    if tp > folder.spec.kv_heads:
        folder = _kv_replicated(folder, tp)
    store = open_model(str(_moe_gguf(tmp_path / "moe.gguf", folder, arch=arch)))
    assert store.spec == folder.spec
    run = GOLDENS[family]["runs"][0]
    assert _generate(store, run["prompt"], len(run["tokens"]), tp) == run["tokens"]


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_the_chips_partial_mixtures_add_up_to_the_whole(tp: int, top_k: int) -> None:
    """Each chip's kernel over its share of the experts (chip c: experts [c E / tp, (c + 1) E / tp)), the rows routed
    among all of them: the partial sums, added in chip order as the all-reduce adds them, are the whole mixture.
    With at most 2 experts a row they are bit for bit the unsplit sum (a row's two outputs meet in one addition,
    in ascending expert order, on one chip or across the all-reduce); with more, within f32 rounding."""
    rng = np.random.default_rng(tp + 10 * top_k)
    rows, hidden, inter, experts = 7, 8, 5, 4
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    logits = rng.standard_normal((rows, experts)).astype(np.float32) * 2
    gate, up = (rng.standard_normal((experts, inter, hidden)).astype(np.float32) for _ in range(2))
    down = rng.standard_normal((experts, hidden, inter)).astype(np.float32)
    held = experts // tp
    total = None
    for chip in range(tp):
        mine = slice(chip * held, (chip + 1) * held)
        registers: list = [x, logits, None]
        kernels.experts(gate[mine], up[mine], down[mine], top_k, True, chip * held)(0, 1, 2)(registers)
        total = registers[2].copy() if total is None else total + registers[2]
    whole: list = [x, logits, None]
    kernels.experts(gate, up, down, top_k, True)(0, 1, 2)(whole)
    np.testing.assert_allclose(total, _routed_by_hand(x, logits, gate, up, down, top_k, True), rtol=2e-5, atol=2e-5)
    if top_k <= 2:
        np.testing.assert_array_equal(total, whole[2])
    unchosen = np.array([[9.0, 9.0, -9.0, -9.0]] * rows, np.float32)  # experts 0 and 1 for every row
    registers = [x, unchosen, None]
    kernels.experts(gate[2:], up[2:], down[2:], 2, True, 2)(0, 1, 2)(registers)  # the chip of experts 2 and 3
    assert registers[2].shape == x.shape and not registers[2].any()


SPLIT_CUTS = ["decode ctx=8", "batch rows=2 ctx=8", "decode_layer layer=1 ctx=8", "batch_layer layer=0 rows=3 ctx=8"]


@pytest.mark.parametrize("family", MIXTURES)
@pytest.mark.parametrize("cut", SPLIT_CUTS)
def test_a_split_mixtures_program_is_the_authors_and_round_trips(family: str, cut: str) -> None:
    """tp-split of the author's unsplit program is the author's split program (written_split), byte for byte, with
    its identity and manifest; the text parses back to the same IR and prints the same bytes."""
    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from logos_ir import identity
    from logos_ir.author import manifest_of, written, written_split
    from logos_ir.parser import parse_program
    from logos_ir.passes.tp_split import TpSplit
    from logos_ir.printer import print_program
    from logos_ir.program import Cut, Identity

    spec = ModelSpec.from_hf_config(_config(family))
    the_cut = Cut.parse(cut)
    authored, expected = written_split(spec, the_cut, "", 2)
    module = ModuleOp([parse_program(written(spec, the_cut)[0].text)])
    TpSplit(2).apply(Context(), module)
    module.verify()
    program = module.ops.first
    text = print_program(program)
    assert text == authored.text
    assert identity.identity(program) == expected == Identity.of_split(the_cut, 2, text)
    assert manifest_of(program, "") == authored.manifest
    splits = {entry.name.rsplit(".", 2)[-2]: entry.split for entry in authored.manifest if ".mlp." in entry.name}
    assert splits == {"gate": None, "gate_proj": "experts", "up_proj": "experts", "down_proj": "experts"}
    reparsed = parse_program(authored.text)
    reparsed.verify()
    assert print_program(reparsed) == authored.text
    assert str(module) == str(ModuleOp([reparsed]))


def test_the_split_mixture_reads_the_shares_and_all_reduces_after_the_experts() -> None:
    from xdsl.dialects.shard import AllReduceOp

    from logos_ir.author import written_split
    from logos_ir.dialects import logos
    from logos_ir.parser import parse_program
    from logos_ir.passes.tp_split import communication_report
    from logos_ir.program import Cut

    spec = ModelSpec.from_hf_config(_config("qwen3_moe"))
    program = parse_program(written_split(spec, Cut.batch(3, 8), "", 2)[0].text)
    layer = program.function("layer_1")
    assert layer is not None
    named = {op.results[0].name_hint: op for op in layer.body.block.ops if op.results}
    shapes = {name: logos.tensor_shape(op.results[0]) for name, op in named.items()}
    assert shapes["router_weight"] == (4, 64) and named["router_weight"].split is None  # whole on every chip
    assert shapes["router_logits"] == (3, 4)  # every expert's logit, every row
    assert shapes["gate_weights"] == shapes["up_weights"] == (2, 32, 64) and shapes["down_weights"] == (2, 64, 32)
    mixture, reduce = named["routed_part"], named["routed"]
    assert isinstance(mixture, logos.MixtureOp) and mixture.experts_routed() == 4
    assert isinstance(reduce, AllReduceOp) and reduce.prev_op is mixture and reduce.input is mixture.result
    assert [use.operation for use in mixture.result.uses] == [reduce]
    assert named["result"].operands[1] is reduce.result
    report = communication_report(program)
    assert report["all_reduces"] == 2 * spec.layers and report["expert_all_reduces"] == spec.layers
    assert report["bytes_per_step"] == report["megatron_bytes"] == 2 * 3 * spec.hidden * 4 * spec.layers
    from logos_ir.interpreter import Interpreter

    counted = Interpreter(program, open_model(str(FAMILIES / "qwen3_moe"))).communication_bytes_per_run()
    assert counted.total == report["bytes_per_step"] and dict(counted.per_section) == report["bytes_per_layer"]


def test_an_expert_count_that_does_not_divide_is_refused_by_name() -> None:
    """Six experts over 4 chips (heads and key-value heads that divide): the author and tp-split refuse it by the
    experts' count; the experts' own width (each whole on its chip) need not divide."""
    from dataclasses import replace

    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from logos_ir.author import written, written_split
    from logos_ir.errors import PassError
    from logos_ir.parser import parse_program
    from logos_ir.passes.tp_split import TpSplit
    from logos_ir.program import Cut

    base = ModelSpec.from_hf_config(_config("mixtral"))
    spec = replace(base, kv_heads=4, experts=6)
    with pytest.raises(SpecError) as by_author:
        written_split(spec, Cut.decode(8), "", 4)
    assert by_author.value.message == "the model does not split over 4 chips: experts (6) is not a multiple of 4"
    module = ModuleOp([parse_program(written(spec, Cut.decode(8))[0].text)])
    before = str(module)
    with pytest.raises(PassError) as by_pass:
        TpSplit(4).apply(Context(), module)
    assert by_author.value.message in by_pass.value.message and str(module) == before
    odd = replace(base, kv_heads=4, intermediate=30)  # experts of 30 numbers: each whole on its chip
    assert written_split(odd, Cut.decode(8), "", 4)[0].text.count("split by experts over the chips") == 3 * odd.layers


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'mlp.experts.up_proj.weight" of 4 by 32 by 64, split by experts over the chips.',
            'mlp.experts.up_proj.weight" of 4 by 32 by 64.',
            "logos.experts: up weights shape mismatch: got (4, 32, 64), expected (2, 32, 64)",
        ),
        (
            'mlp.experts.up_proj.weight" of 4 by 32 by 64, split by experts over the chips.',
            'mlp.experts.up_proj.weight" of 4 by 32 by 64, split by rows over the chips.',
            "cannot split by 'rows' here",
        ),
        (
            'mlp.gate.weight" of 4 by 64.',
            'mlp.gate.weight" of 4 by 64, split by experts over the chips.',
            "cannot split by 'experts' here",
        ),
    ],
    ids=["half-split", "rows", "router"],
)
def test_a_split_mixture_that_is_not_split_by_whole_experts_is_refused(old: str, new: str, message: str) -> None:
    from logos_ir.author import written_split
    from logos_ir.parser import parse_program
    from logos_ir.program import Cut

    text = written_split(ModelSpec.from_hf_config(_config("mixtral")), Cut.decode(8), "", 2)[0].text
    assert old in text
    with pytest.raises(Exception) as refused:  # noqa: PT011 (a located ParseError or the op's VerifyException)
        parse_program(text.replace(old, new, 1)).verify()
    assert message in str(refused.value)


@pytest.mark.parametrize(("preset", "tp", "held"), [("mixtral-8x7b", 8, 1), ("qwen3-30b-a3b", 4, 32)])
def test_the_published_mixtures_split_by_experts(preset: str, tp: int, held: int) -> None:
    """Mixtral-8x7B over 8 chips holds one expert of its 8 a chip; Qwen3-30B-A3B (4 key-value heads) over 4, 32 of
    its 128. Their layer's print round-trips and states each chip's share."""
    from logos_ir.author import written_split
    from logos_ir.dialects import logos
    from logos_ir.parser import parse_program
    from logos_ir.printer import print_program
    from logos_ir.program import Cut

    spec = ModelSpec.preset(preset)
    text = written_split(spec, Cut.decode_layer(1, 64), "", tp)[0].text
    program = parse_program(text)
    program.verify()
    assert print_program(program) == text
    stacked = [op for op in program.walk() if isinstance(op, logos.WeightOp) and len(op.full_shape) == 3]
    assert [logos.tensor_shape(op.result) for op in stacked] == [
        (held, spec.intermediate, spec.hidden),
        (held, spec.intermediate, spec.hidden),
        (held, spec.hidden, spec.intermediate),
    ]
    assert held * tp == spec.experts


def test_tp_split_refuses_a_mixtures_partial_sum_name_in_use() -> None:
    from xdsl.context import Context
    from xdsl.dialects.builtin import ModuleOp

    from logos_ir.author import written
    from logos_ir.errors import PassError
    from logos_ir.parser import parse_program
    from logos_ir.passes.tp_split import TpSplit
    from logos_ir.program import Cut

    text = written(ModelSpec.from_hf_config(_config("mixtral")), Cut.decode(8))[0].text
    result = "    Let result be mixed plus routed."
    taken = text.replace(result, f"    Let routed_part be mixed plus routed.\n{result}", 1)
    module = ModuleOp([parse_program(taken)])
    before = str(module)
    with pytest.raises(PassError) as refused:
        TpSplit(2).apply(Context(), module)
    assert "'logos.experts' %routed in @layer_0 would name its partial sum 'routed_part'" in refused.value.message
    assert str(module) == before
