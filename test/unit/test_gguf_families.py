"""GGUF files of Gemma 2, Gemma 3, Phi-3, Qwen2 and Qwen3, and SentencePiece tokenizers, as llama.cpp writes and
reads them.

Each family's tiny model made by transformers (`test/unit/families/<family>-gguf`, shaped as a GGUF can say it:
llama.cpp's loader hard-codes a Gemma's query scale, its pattern of local and global layers, Gemma 3's local rope
base and Gemma 2's tied head) is written here into a GGUF as llama.cpp's `convert_hf_to_gguf.py` writes it: the
tensor names of gguf-py's own map for the architecture, every Gemma norm's weight plus one, Phi-3's Q, K and V kept
fused in `attn_qkv` and its gate and up in `ffn_up`, the metadata its converter writes, a SentencePiece vocabulary
and a chat template. `logos-run` on the file gives transformers' greedy tokens. The SentencePiece tokenizer rebuilt
from a GGUF encodes and decodes as SentencePiece itself (`test/unit/tokenizers/sentencepiece.json`, made by
`tools/tokenizer_goldens.py`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from logos_ir.errors import LogosError
from logos_ir.testing import save_gguf
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import open_model

FAMILIES = Path(__file__).parent / "families"
GOLDENS = json.loads((FAMILIES / "goldens.json").read_text())["families"]
SENTENCEPIECE = json.loads((Path(__file__).parent / "tokenizers" / "sentencepiece.json").read_text("utf-8"))
ARCH = {"gemma2": gguf.MODEL_ARCH.GEMMA2, "gemma3_text": gguf.MODEL_ARCH.GEMMA3, "phi3": gguf.MODEL_ARCH.PHI3}
TEMPLATE = "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"


def _tokenizer(writer: gguf.GGUFWriter, model: dict[str, Any]) -> None:
    """The vocabulary as llama.cpp's `_set_vocab_sentencepiece` writes it."""
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(model["tokens"])
    writer.add_token_scores(model["scores"])
    writer.add_token_types(model["token_type"])
    writer.add_bos_token_id(model["bos_token_id"])
    writer.add_eos_token_id(model["eos_token_id"])
    writer.add_unk_token_id(model["unknown_token_id"])
    writer.add_add_space_prefix(model["add_space_prefix"])
    writer.add_chat_template(TEMPLATE)


def _metadata(writer: gguf.GGUFWriter, model_type: str, config: dict[str, Any]) -> None:
    """What each family's `set_gguf_parameters` writes (`Gemma2Model`, `Gemma3Model`, `Phi3MiniModel`)."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if model_type == "phi3":
        writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
        rot_pct = config["rope_parameters"].get("partial_rotary_factor", 1.0)  # Phi3MiniModel's rope_dims
        writer.add_rope_dimension_count(int(rot_pct * config["hidden_size"]) // config["num_attention_heads"])
        writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
        writer.add_sliding_window(config.get("sliding_window") or 0)
        return
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_sliding_window(config["sliding_window"])
    if model_type == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    else:
        full = config["rope_parameters"]["full_attention"]
        writer.add_rope_freq_base(full["rope_theta"])
        if full["rope_type"] == "linear":  # Gemma 3 4B and larger: its global layers' linear scaling
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(full["factor"])


def _byte_level_tokenizer(writer: gguf.GGUFWriter, eos: int, template: str | None = None) -> None:
    """A byte-level BPE vocabulary of the 256 bytes alone (each byte its own id), with the `qwen2`
    pre-tokenizer, no BOS, and optionally a chat template."""
    from logos_ir.testing import byte_level_alphabet

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(byte_level_alphabet())
    writer.add_token_types([1] * 256)
    writer.add_token_merges([])
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    if template is not None:
        writer.add_chat_template(template)


def _unused_eos(family: str) -> int:
    """An id no golden run of `family` produces, for its end of sequence (so no run stops early)."""
    return max(set(range(256)) - {t for run in GOLDENS[family]["runs"] for t in run["tokens"]})


def convert(folder: Path, out: Path, *, extra: Any = None, byte_level: bool = False) -> Path:
    """`folder` as llama.cpp's converter writes it into a GGUF (`extra(writer)` adds what a test needs), with the
    SentencePiece vocabulary of its family or, `byte_level`, the 256 bytes (a family of that vocabulary)."""
    config = json.loads((folder / "config.json").read_text())
    model_type = config["model_type"]
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[ARCH[model_type]])
    _metadata(writer, model_type, config)
    if byte_level:
        _byte_level_tokenizer(writer, _unused_eos(folder.name))
    else:
        _tokenizer(writer, SENTENCEPIECE["models"]["gemma" if model_type.startswith("gemma") else "llama"])
    names = gguf.get_tensor_name_map(ARCH[model_type], config["num_hidden_layers"])
    for name, array in sorted(load_file(str(folder / "model.safetensors")).items()):
        if name == "lm_head.weight" and model_type == "gemma2":  # its converter drops it (tied)
            continue
        target = names.get_name(name.removesuffix(".weight")) or name.removesuffix(".weight")
        if model_type.startswith("gemma") and name.endswith("norm.weight"):
            array = array + np.float32(1.0)  # Gemma's norms scale by one plus their weight: stored plus one
        writer.add_tensor(target + ".weight", array.astype(np.float32))
    if extra is not None:
        extra(writer)
    save_gguf(writer)
    return out


@pytest.mark.parametrize(
    "family", ["gemma2-gguf", "gemma3_text-gguf", "gemma3_text-gguf-linear", "phi3-gguf", "phi3-gguf-partial"]
)
def test_logos_run_on_a_gguf_of_the_family_gives_transformers_tokens(tmp_path: Path, family: str, capsys) -> None:  # type: ignore[no-untyped-def]
    from logos_ir.tools import logos_run

    path = convert(FAMILIES / family, tmp_path / f"{family}.gguf")
    folder, file = open_model(str(FAMILIES / family)).spec, open_model(str(path)).spec
    assert file.norm_plus_one is False and (folder.norm_plus_one is family.startswith("gemma"))
    assert file == folder.__class__(**{**folder.__dict__, "norm_plus_one": False})
    for run in GOLDENS[family]["runs"]:
        argv = ["--model", str(path), "--prompt-ids", ",".join(map(str, run["prompt"])), "-n", "12", "--json"]
        assert logos_run.main(argv) == 0
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert report["new_ids"] == run["tokens"], family
    tokenizer = Tokenizer.from_store(open_model(str(path)))
    assert tokenizer is not None and tokenizer.chat_template == TEMPLATE


def test_gemma2s_logits_from_its_gguf_are_transformers_own(tmp_path: Path) -> None:
    from test_families import _Recording

    from logos_ir.registry import backends
    from logos_ir.runtime import RunRequest

    run = GOLDENS["gemma2-gguf"]["runs"][0]
    store = open_model(str(convert(FAMILIES / "gemma2-gguf", tmp_path / "g.gguf")))
    sampler = _Recording()
    lane = backends()["reference"].generator()(RunRequest(store))
    assert lane.generate(run["prompt"], len(run["tokens"]), sampler=sampler) == run["tokens"]
    np.testing.assert_allclose(sampler.logits[0], np.array(run["first_logits"]), atol=2e-4)


def test_a_gemma2_gguf_with_a_head_of_its_own_is_refused_by_name(tmp_path: Path) -> None:
    def head(writer: gguf.GGUFWriter) -> None:  # llama.cpp's Gemma 2 loader has no output tensor: always tied
        writer.add_tensor("output.weight", np.zeros((400, 64), np.float32))

    path = convert(FAMILIES / "gemma2-gguf", tmp_path / "untied.gguf", extra=head)
    with pytest.raises(LogosError, match="tensor 'output.weight' is not read by the model's program"):
        open_model(str(path))


def test_what_a_gemma3_or_phi3_gguf_says_beyond_the_program_is_refused(tmp_path: Path) -> None:
    def yarn(writer: gguf.GGUFWriter) -> None:  # YaRN's scaling (Qwen2.5's long context): not on a Gemma
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)
        writer.add_rope_scaling_orig_ctx_len(32)

    path = convert(FAMILIES / "gemma3_text-gguf", tmp_path / "yarn.gguf", extra=yarn)
    with pytest.raises(LogosError, match="a yarn rope scaling is read from a GGUF of llama, qwen2, qwen3 only"):
        open_model(str(path))

    def unfactored(writer: gguf.GGUFWriter) -> None:  # a linear scaling without the factor it divides by
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)

    path = convert(FAMILIES / "gemma3_text-gguf", tmp_path / "unfactored.gguf", extra=unfactored)
    with pytest.raises(LogosError, match="a linear rope scaling needs its gemma3.rope.scaling.factor"):
        open_model(str(path))

    def long_rope(writer: gguf.GGUFWriter) -> None:  # Phi-3-128k's long rope factors without its short ones
        writer.add_tensor("rope_factors_long.weight", np.ones(8, np.float32))

    path = convert(FAMILIES / "phi3-gguf", tmp_path / "long.gguf", extra=long_rope)
    with pytest.raises(LogosError, match="a longrope rope scaling needs its tensor 'rope_factors_short.weight'"):
        open_model(str(path))


def test_a_phi3_ggufs_window_is_read_as_transformers_applies_it(tmp_path: Path) -> None:
    def window(writer: gguf.GGUFWriter) -> None:
        writer.add_sliding_window(4)

    config = json.loads((FAMILIES / "phi3-gguf" / "config.json").read_text())
    folder = tmp_path / "phi3-window"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 4}))
    (folder / "model.safetensors").write_bytes((FAMILIES / "phi3-gguf" / "model.safetensors").read_bytes())
    path = convert(folder, tmp_path / "w.gguf")
    assert open_model(str(path)).spec == open_model(str(folder)).spec
    assert open_model(str(path)).spec.sliding_window == 4


# -- SentencePiece tokenizers ------------------------------------------------------------------------------------


def _sentencepiece_metadata(model: dict[str, Any], add_bos: bool) -> dict[str, Any]:
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": model["tokens"],
        "tokenizer.ggml.scores": model["scores"],
        "tokenizer.ggml.token_type": model["token_type"],
        "tokenizer.ggml.bos_token_id": model["bos_token_id"],
        "tokenizer.ggml.eos_token_id": model["eos_token_id"],
        "tokenizer.ggml.add_space_prefix": model["add_space_prefix"],
        "tokenizer.ggml.add_bos_token": add_bos,
    }


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_a_sentencepiece_gguf_tokenizer_encodes_and_decodes_as_sentencepiece(kind: str) -> None:
    model = SENTENCEPIECE["models"][kind]
    plain = Tokenizer.from_gguf_metadata(_sentencepiece_metadata(model, add_bos=False), "sp.gguf")
    with_bos = Tokenizer.from_gguf_metadata(_sentencepiece_metadata(model, add_bos=True), "sp.gguf")
    for run in model["runs"]:
        assert plain.encode(run["text"]) == run["ids"], run["text"]
        assert with_bos.encode(run["text"]) == [model["bos_token_id"], *run["ids"]]
        assert plain.decode(run["ids"]) == run["decoded"]
    assert plain.encode("<s>") == [model["bos_token_id"]]  # a control piece written in the text: its one id


def test_a_sentencepiece_gguf_without_its_scores_is_refused() -> None:
    meta = _sentencepiece_metadata(SENTENCEPIECE["models"]["llama"], add_bos=True)
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"][:-1]
    with pytest.raises(LogosError, match="'tokenizer.ggml.scores' must list one number per token"):
        Tokenizer.from_gguf_metadata(meta, "sp.gguf")


def test_qwen2s_pre_tokenizer_splits_digits_one_by_one() -> None:
    from logos_ir import testing

    meta = {key: value for key, _, value in testing.tokenizer_metadata(None)}
    tokens = meta["tokenizer.ggml.tokens"][1]
    merges = [*meta.get("tokenizer.ggml.merges", (None, []))[1], "1 2"]
    base = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [*tokens, "12"],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": False,
    }
    twelve = len(tokens)
    llama3 = Tokenizer.from_gguf_metadata({**base, "tokenizer.ggml.pre": "llama-bpe"}, "q.gguf")
    qwen2 = Tokenizer.from_gguf_metadata({**base, "tokenizer.ggml.pre": "qwen2"}, "q.gguf")
    assert twelve in llama3.encode("a 123") and twelve not in qwen2.encode("a 123")
    assert qwen2.decode(qwen2.encode("a 123")) == "a 123"


QWEN_TEMPLATE = (  # Qwen2.5's own, less its tools and default system turn
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_logos_run_on_a_qwen_gguf_gives_transformers_tokens_with_its_bpe_and_chat_template(
    tmp_path: Path, family: str, capsys
) -> None:  # type: ignore[no-untyped-def]
    """A `qwen2` or `qwen3` GGUF as llama.cpp's converter writes one (keys under the architecture, Q and K rows
    unpermuted, a byte-level BPE vocabulary with the `qwen2` pre-tokenizer, no BOS, the chat template): `logos-run`
    gives transformers' greedy tokens from its ids, and a question goes through the file's own template and
    tokenizer (the vocabulary here is the 256 bytes alone, so each byte of the rendered text is its own id)."""
    from test_weights import write_gguf

    from logos_ir.tools import logos_run

    runs = GOLDENS[family]["runs"]

    def tokenizer(writer: gguf.GGUFWriter) -> None:
        _byte_level_tokenizer(writer, _unused_eos(family), QWEN_TEMPLATE)

    folder = open_model(str(FAMILIES / family))
    path = write_gguf(tmp_path / f"{family}.gguf", folder, gguf.GGMLQuantizationType.F32, arch=family, permute=False,
                      extra=tokenizer)  # fmt: skip
    assert open_model(str(path)).spec == folder.spec
    for run in runs:
        argv = ["--model", str(path), "--prompt-ids", ",".join(map(str, run["prompt"])), "-n", "12", "--json"]
        assert logos_run.main(argv) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["new_ids"] == run["tokens"]
    assert logos_run.main(["--model", str(path), "--prompt", "hi", "-n", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["prompt_ids"] == list(b"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def _logos_run_ids(path: Path, prompt: list[int], capsys, *flags: str) -> list[int]:  # type: ignore[no-untyped-def]
    from logos_ir.tools import logos_run

    argv = ["--model", str(path), "--prompt-ids", ",".join(map(str, prompt)), "-n", "12", "--json", *flags]
    assert logos_run.main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["new_ids"]


def test_a_qwen2_gguf_with_yarn_gives_transformers_tokens(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A `qwen2` GGUF with YaRN as llama.cpp's converter writes it (`rope.scaling.type` yarn, its factor and
    original context; the betas and the attention factor left to llama.cpp's defaults) reads to the folder's
    scaling (factor 4 over 32, the ramp between 32 and 1 turns, cos and sin scaled by 1 + 0.1 ln 4) and gives
    transformers' tokens through `logos-run`."""
    from test_weights import write_gguf

    def yarn(writer: gguf.GGUFWriter) -> None:
        _byte_level_tokenizer(writer, _unused_eos("qwen2-yarn"))
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)
        writer.add_rope_scaling_orig_ctx_len(32)

    folder = open_model(str(FAMILIES / "qwen2-yarn"))
    path = write_gguf(tmp_path / "yarn.gguf", folder, gguf.GGMLQuantizationType.F32, arch="qwen2", permute=False,
                      extra=yarn)  # fmt: skip
    assert open_model(str(path)).spec == folder.spec
    for run in GOLDENS["qwen2-yarn"]["runs"]:
        assert _logos_run_ids(path, run["prompt"], capsys) == run["tokens"]


def _longrope_gguf(tmp_path: Path, name: str = "longrope.gguf", **changes: Any) -> Path:
    """phi3-longrope-two's GGUF as llama.cpp's `Phi3MiniModel` writes it: the short and long factors as F32
    tensors, the attention factor sqrt(1 + ln(s) / ln(original)) with s the context length over the original
    (128 over 64) in `rope.scaling.attn_factor`; `changes` replaces a tensor's values (None drops it)."""
    config = json.loads((FAMILIES / "phi3-longrope-two" / "config.json").read_text())
    rope, original = config["rope_parameters"], config["original_max_position_embeddings"]
    tensors = {"rope_factors_short.weight": rope["short_factor"], "rope_factors_long.weight": rope["long_factor"]}
    tensors.update(changes)

    def longrope(writer: gguf.GGUFWriter) -> None:
        scale = config["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        for tensor, values in tensors.items():
            if values is not None:
                writer.add_tensor(tensor, np.asarray(values, dtype=np.float32))

    return convert(FAMILIES / "phi3-longrope-two", tmp_path / name, extra=longrope, byte_level=True)


def test_a_phi3_gguf_with_longrope_factors_gives_transformers_tokens_at_each_context(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Phi-3's LongRoPE from its GGUF: both sets of factors read (as float32, as the file holds them and as
    transformers turns by them), llama.cpp's choice by the context (the short ones at ctx 32, within the original
    64; the long ones at ctx 128), the file's attention factor; `logos-run` gives transformers' tokens at both."""
    path = _longrope_gguf(tmp_path)
    file, folder = open_model(str(path)).spec, open_model(str(FAMILIES / "phi3-longrope-two")).spec
    read, said = file.rope_scaling, folder.rope_scaling
    assert read is not None and said is not None and said.long_factors is not None
    assert read.factors == tuple(float(np.float32(f)) for f in said.factors)
    assert read.long_factors == tuple(float(np.float32(f)) for f in said.long_factors)
    assert (read.original_max_position_embeddings, read.factor) == (64, 2.0)
    assert read.attention_factor == pytest.approx(said.attention_factor, rel=1e-7)
    for run, ctx in ((0, 32), (1, 128)):
        golden = GOLDENS["phi3-longrope-two"]["runs"][run]
        assert _logos_run_ids(path, golden["prompt"], capsys, "--ctx", str(ctx)) == golden["tokens"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_factors_long.weight": None}, "a longrope rope scaling needs its tensor 'rope_factors_long.weight'"),
        ({"rope_factors_short.weight": [1.0] * 7}, "tensor 'rope_factors_short.weight' must hold 8 finite positive"),
        ({"rope_factors_long.weight": [1.0] * 7 + [0.0]}, "tensor 'rope_factors_long.weight' must hold 8 finite"),
    ],
    ids=["one-set", "count", "zero"],
)
def test_a_phi3_ggufs_longrope_factors_are_refused_by_name_where_wrong(
    tmp_path: Path, changes: dict, message: str
) -> None:
    with pytest.raises(LogosError, match=re.escape(message)):
        open_model(str(_longrope_gguf(tmp_path, **changes)))
