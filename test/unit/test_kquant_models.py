"""A model stored in the K-quants and in Q4_K_M's mix by the project's quantizer: the mix llama.cpp chooses, and
the reference's greedy tokens equal to the reference run on gguf-py's dequantization of the same bytes."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from logos_ir import quant
from logos_ir.generate import Generator
from logos_ir.spec import ModelSpec
from logos_ir.testing import quantized_store, super_block_spec
from logos_ir.weights.store import ArrayStore, RandomWeights

PROMPT = [3, 5, 7, 11]


def _plan(preset: str) -> dict[str, str]:
    spec = ModelSpec.preset(preset)
    return quant.storage_plan("q4_k_m", dict(spec.weights()), spec.layers, spec.experts, spec.tie_embeddings)


def test_the_8bs_q4_k_m_is_llama_cpps_mix() -> None:
    """Llama 3.1 8B at Q4_K_M as llama-quantize writes it: output.weight Q6_K, token_embd Q4_K, attn_v and
    ffn_down Q6_K in the 16 layers use_more_bits picks of 32 (the first and last four, every third between), every
    other matrix Q4_K, the norms f32."""
    plan = _plan("llama-3.1-8b")
    more = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    for layer in range(32):
        want = "q6_k" if layer in more else "q4_k"
        assert plan[f"model.layers.{layer}.self_attn.v_proj.weight"] == want
        assert plan[f"model.layers.{layer}.mlp.down_proj.weight"] == want
        assert plan[f"model.layers.{layer}.self_attn.q_proj.weight"] == "q4_k"
        assert f"model.layers.{layer}.input_layernorm.weight" not in plan
    assert plan["lm_head.weight"] == "q6_k" and plan["model.embed_tokens.weight"] == "q4_k"
    assert Counter(plan.values()) == {"q4_k": 193, "q6_k": 33}


def test_the_mix_falls_back_as_llama_cpp_does() -> None:
    """SmolLM2-135M's rows of 576 and 1536: the tied embedding (the output's) Q8_0, Q4_K's matrices of 576 Q5_0,
    Q6_K's attn_v Q8_0; down_proj's rows of 1536 keep Q4_K and Q6_K. Mixtral's 8 experts: attn_v and attn_k Q8_0,
    attn_output Q5_K, the router f32."""
    plan = _plan("smollm2-135m")
    assert plan["model.embed_tokens.weight"] == "q8_0"
    assert plan["model.layers.0.self_attn.q_proj.weight"] == "q5_0"
    assert plan["model.layers.0.self_attn.v_proj.weight"] == "q8_0"
    assert plan["model.layers.0.mlp.down_proj.weight"] == "q6_k"
    assert plan["model.layers.4.mlp.down_proj.weight"] == "q4_k"
    mixtral = _plan("mixtral-8x7b")
    assert mixtral["model.layers.5.self_attn.v_proj.weight"] == "q8_0"
    assert mixtral["model.layers.5.self_attn.k_proj.weight"] == "q8_0"
    assert mixtral["model.layers.5.self_attn.o_proj.weight"] == "q5_k"
    assert mixtral["model.layers.5.mlp.experts.down_proj.weight"] == "q4_k"
    assert "model.layers.5.mlp.gate.weight" not in mixtral
    pure = quant.storage_plan("q4_k", {"a.weight": (8, 576), "b.weight": (8, 40)}, 1, None, False)
    assert pure == {"a.weight": "q5_0", "b.weight": "f16"}
    assert quant.storage_plan("q4_0", {"b.weight": (8, 40)}, 1, None, False) == {}


@pytest.mark.parametrize("choice", ["q4_k_m", "q4_k", "q6_k"])
def test_a_stored_model_gives_the_tokens_of_gguf_pys_dequantization(choice: str) -> None:
    spec = super_block_spec()
    store = quantized_store(spec, choice)
    formats = Counter(dict(store.spec.storage).values())
    if choice == "q4_k_m":  # 2 layers: layer 1 is one use_more_bits picks
        assert dict(store.spec.storage)["model.layers.1.self_attn.v_proj.weight"] == "q6_k"
        assert dict(store.spec.storage)["model.layers.0.self_attn.v_proj.weight"] == "q4_k"
        assert formats == {"q4_k": 13, "q6_k": 3}
    else:
        assert formats == {choice: 16}
    plain = RandomWeights(spec)
    arrays = {}
    for name in store.names():
        fmt = store.spec.stored_as(name)
        if fmt is None:
            arrays[name] = plain.get(name)
            continue
        raw = np.asarray(store.blocks(name))
        arrays[name] = gguf.quants.dequantize(raw, QT[fmt.upper()]).reshape(store.shape(name))
        assert not np.array_equal(arrays[name], plain.get(name))
    oracle = ArrayStore(replace(spec, storage=()), arrays, "gguf-py's dequantization")
    want = Generator(oracle, ctx=32).generate(PROMPT, 8)
    assert Generator(store, ctx=32).generate(PROMPT, 8) == want
    assert Generator(plain, ctx=32).generate(PROMPT, 8) != want or choice == "q6_k"


def test_compile_stores_a_preset_in_q4_k_m_and_records_it(tmp_path) -> None:
    import json

    from logos_ir.tools.logos_compile import main

    out = tmp_path / "b"
    args = ["--model", "tiny", "--target", "logos", "--cut", "decode ctx=64", "--weights", "q4_k_m", "-o", str(out)]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["storage"] == "q4_k_m"
    text = (out / "program.logos").read_text()
    # tiny's rows of 64 are not whole super-blocks: Q4_K falls back to Q5_0, the output's Q6_K to Q8_0
    assert 'q_proj.weight" of 64 by 64, stored in 5-bit blocks of 32 with a scale.' in text
    assert 'lm_head.weight" of 256 by 64, stored in 8-bit blocks of 32 with a scale.' in text


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("cuda", "the lane's decode step reads q5_0, q8_0 as stored, its f32 tensors as bf16"),
        ("d5005", "the lane's decode step reads q8_0 as stored, the others (q5_0) and the f32 tensors as bf16"),
        ("spatial", "the lane reads q8_0 as stored in the tensors its build names above, every other tensor as f16"),
    ],
)
def test_compile_says_which_formats_the_lane_reads_as_stored(tmp_path, capsys, target: str, says: str) -> None:  # type: ignore[no-untyped-def]
    """tiny at q4_k_m is Q5_0 and Q8_0 (its rows of 64 fall back): the CUDA lane's decode reads both as stored, the
    D5005 engine Q8_0 only; the wafer, at q8_0 (its layers' matrices as stored, its tables as its image), says it
    reads them so in the tensors its build names; each build's storage line says so."""
    from logos_ir.tools.logos_compile import main

    args = ["--model", "tiny", "--target", target, "--cut", "decode ctx=64", "--weights", "q4_k_m"]
    if target == "spatial":
        args[-1] = "q8_0"  # the wafer runs one element program for every layer: a mix's layers differ
    assert main([*args, "-o", str(tmp_path / "b")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "weights stored in" in line)
    assert says in line


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("cuda", "the lane's decode step reads fp8 as stored, its f32 tensors as bf16"),
        ("d5005", "the lane reads them dequantized as bf16, "),
        ("spatial", "the lane reads them dequantized as f16, "),
    ],
)
def test_the_storage_line_says_which_lanes_read_fp8_as_stored(target: str, says: str) -> None:
    """tiny at fp8 (every matrix; the untied embedding f32), each lane at its default image: the CUDA lane's decode
    step reads the rows as stored, the D5005 engine and the wafer their image."""
    from logos_ir.build import BuildRequest
    from logos_ir.models import ModelSource
    from logos_ir.program import Cut
    from logos_ir.progress import Progress
    from logos_ir.registry import compile_targets
    from logos_ir.tools.logos_compile import storage_line

    spec = quantized_store(ModelSpec.preset("tiny"), "fp8").spec
    source = ModelSource("preset", "tiny", spec, storage="fp8")
    lane = compile_targets()[target]
    request = BuildRequest(source, Cut.decode(64), 1, lane.weights[0], False, Progress.silent())
    line = storage_line(request, lane)
    assert line.startswith("logos-compile: weights stored in 162,048 bytes (f32, fp8); ")
    assert says in line
