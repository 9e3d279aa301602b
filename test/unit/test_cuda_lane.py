"""The CUDA lane on tiny random models: the emulated kernels (the very `gpu` IR the emitter prints, executed over
numpy) give the reference interpreter's greedy tokens with f32 weights (GQA, MQA, tied and untied heads, a head
size that is not hidden / heads, prompts longer than one prefill chunk, a split decode step over 2 chips); bf16
weights agree teacher-forced; one kernel set for any depth; builds carry their identity; bad requests are refused.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from logos_ir.build import BuildRequest, check_artifact
from logos_ir.errors import LogosError, PassError
from logos_ir.generate import Generator
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda.agreement import teacher_forced
from logos_ir.runtime.cuda.devices import gpu_count
from logos_ir.runtime.cuda.generator import cuda_generator
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights


def _spec(**sizes: object) -> ModelSpec:
    base: dict[str, object] = dict(
        vocab=300, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
        rms_eps=1e-5, rope_theta=10000.0, tie_embeddings=False,
    )  # fmt: skip
    base.update(sizes)
    return ModelSpec(**base)  # type: ignore[arg-type]


MODELS = {
    "gqa-untied": _spec(),
    "mqa-tied": _spec(kv_heads=1, tie_embeddings=True),
    "head-size-not-hidden-over-heads": _spec(hidden=48, heads=4, kv_heads=2, head_dim=24, intermediate=96),
    # 384 rotation pairs of 512: the QKV launch splits each pair's depth in 2 (split-K, combined by the last warp)
    "qkv-split-k": _spec(hidden=512, heads=8, kv_heads=2, head_dim=64, intermediate=256),
}
PROMPT = [3, 17, 250, 9, 41, 77, 5, 120, 33, 8]  # longer than a prefill chunk of 4 rows


def _tokens(store: RandomWeights, tp: int = 1, weights: str = "f32") -> tuple[list[int], list[int]]:
    reference = Generator(store, prefill_rows=4, tp=tp).generate(PROMPT, 6)
    lane = cuda_generator(RunRequest(store, None, 4, tp, weights, emulate=True))
    return lane.generate(PROMPT, 6), reference


@pytest.mark.parametrize("name", sorted(MODELS))
def test_emulated_kernels_give_the_reference_tokens(name: str) -> None:
    got, want = _tokens(RandomWeights(MODELS[name], seed=1))
    assert got == want


def test_the_qkv_launch_splits_k_where_its_pairs_cannot_fill_the_sms() -> None:
    """The 70B over 8 chips has 640 rotation pairs a chip (160 blocks of 4 warps for 132 SMs): split in 4, its QKV
    launch has 640 blocks; the 8B's 3,072 pairs fill the SMs unsplit, SmolLM2's rows (576) are too short for a
    part to keep a lane's loads in flight; the test model above splits in 2."""
    from dataclasses import replace

    from logos_ir.runtime.cuda.artifacts import build_program

    plan, _, _ = build_program(replace(ModelSpec.preset("llama-3.1-70b"), layers=2), Cut.decode(8192), 8, "bf16")
    qkv = [launch for launch in plan.launches if launch.kernel.startswith("qkv_")]
    assert {launch.grid for launch in qkv} == {(640, 1, 1)} and plan.buffers["qkv.partial"].shape == (640, 4, 3)
    plan, _, _ = build_program(replace(ModelSpec.preset("llama-3.1-8b"), layers=2), Cut.decode(1024), 1, "bf16")
    assert "qkv.partial" not in plan.buffers
    plan, _, _ = build_program(replace(ModelSpec.preset("smollm2-135m"), layers=2), Cut.decode(1024), 1, "bf16")
    assert "qkv.partial" not in plan.buffers
    plan, _, _ = build_program(MODELS["qkv-split-k"], Cut.decode(64), 1, "f32")
    assert plan.buffers["qkv.partial"].shape == (384, 2, 3) and plan.buffers["qkv.count"].element == "i64"


def test_a_split_decode_step_over_two_chips_gives_the_reference_tokens() -> None:
    got, want = _tokens(RandomWeights(ModelSpec.preset("tiny"), seed=2), tp=2)
    assert got == want


def test_bf16_weights_agree_teacher_forced() -> None:
    result = teacher_forced(RandomWeights(ModelSpec.preset("tiny"), seed=3), PROMPT, 12, "bf16", prefill_rows=4)
    assert len(result.matches) == 13
    assert result.agreement >= 0.9
    assert result.min_cosine >= 0.999


def _build(spec: ModelSpec, cut: str, tp: int = 1, weights: str = "bf16", with_weights: bool = False):
    from logos_ir.passes.cuda.build import build_cuda

    source = ModelSource("preset", "test", spec)
    request = BuildRequest(source, Cut.parse(cut), tp, weights, with_weights, Progress.silent(), {"ptxas": "off"})
    return build_cuda(request)


def test_two_and_thirty_layers_of_one_width_emit_the_same_kernels() -> None:
    two, thirty = _spec(layers=2), _spec(layers=30)
    for cut in ("decode ctx=128", "prefill rows=8 ctx=128", "batch rows=4 ctx=128"):
        few, many = _build(two, cut).report, _build(thirty, cut).report
        assert few["kernel_names"] == many["kernel_names"]
        assert many["launches"] > few["launches"]


def test_a_build_carries_its_identity_and_weight_image() -> None:
    built = _build(ModelSpec.preset("tiny"), "decode ctx=64", tp=2, with_weights=False)
    paths = sorted(a.path for a in built.artifacts)
    assert paths == ["kernels.cu", "step.mlir"]
    for artifact in built.artifacts:
        check_artifact(artifact)
        assert artifact.data.decode().splitlines()[0] == "// " + artifact.identity.line()
    assert built.report["all_reduces"] == 4 and built.report["chips"] == 2
    assert built.report["all_gathers"] == 1  # the head's logits, split by vocabulary rows


def test_the_weight_image_holds_each_chips_bf16_shares() -> None:
    from logos_ir.dialects.cuda import HEADER_BYTES
    from logos_ir.passes.cuda.build import build_cuda

    spec = ModelSpec.preset("tiny")
    source = ModelSource("preset", "tiny", spec)
    request = BuildRequest(source, Cut.decode(64), 2, "bf16", True, Progress.silent(), {"ptxas": "off"})
    images = {a.path: a for a in build_cuda(request).artifacts if a.role == "weights"}
    assert sorted(images) == ["weights.chip0.bin", "weights.chip1.bin"]
    import json

    image = images["weights.chip1.bin"]
    check_artifact(image)
    header = image.data[:HEADER_BYTES].rstrip(b"\0").split(b"\n", 2)
    index = {b["name"]: b for b in json.loads(header[2])["buffers"]}
    entry = index["model.layers.0.mlp.down_proj.weight"]
    assert entry["shape"] == [64, 64] and entry["element"] == "bf16"
    start = HEADER_BYTES + entry["offset"]
    bits = np.frombuffer(image.data[start : start + 64 * 64 * 2], np.uint16).reshape(64, 64)
    values = (bits.astype(np.uint32) << 16).view(np.float32)
    full = source.store().get("model.layers.0.mlp.down_proj.weight")
    assert np.allclose(values, full[:, 64:], rtol=1 / 128, atol=0)  # chip 1's columns, rounded to bf16


@pytest.mark.parametrize("cut", ["forward", "decode_layer layer=0 ctx=64", "prefill_head rows=4"])
def test_cuts_the_lane_does_not_lower_are_refused_by_name(cut: str) -> None:
    with pytest.raises(PassError, match="convert-logos-to-cuda-kernels: the CUDA lane lowers whole decode steps"):
        _build(ModelSpec.preset("tiny"), cut)


def test_f16_images_are_refused() -> None:
    with pytest.raises(LogosError, match="bf16 or f32"):
        cuda_generator(RunRequest(RandomWeights(ModelSpec.preset("tiny")), weights="f16", emulate=True))


@pytest.mark.skipif(gpu_count() > 0, reason="a GPU is present: the no-GPU refusal does not apply")
def test_without_a_gpu_logos_run_says_so_in_one_line_and_suggests_emulate() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "logos_ir.tools.logos_run",
            "--model",
            "tiny",
            "--backend",
            "cuda",
            "--prompt-ids",
            "1,2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPU" in lines[0] and "--emulate" in lines[0]


@pytest.mark.parametrize("tp", [1, 2])
def test_a_batch_of_sequences_gives_the_reference_tokens(tp: int) -> None:
    batch_gives_the_reference_tokens(RandomWeights(ModelSpec.preset("tiny"), seed=4), Cut.batch(3, 64), tp)


def batch_gives_the_reference_tokens(store: Any, cut: Cut, tp: int) -> Any:
    """A batch of 3 sequences (tokens 5, 90, 201) decoded 5 steps on the emulated lane over `tp` chips: each step's
    tokens are the reference interpreter's on the same program, fed back as the next step's. The lane's plan."""
    from logos_ir.author import written, written_split
    from logos_ir.interpreter import Interpreter, KVState
    from logos_ir.parser import parse_program
    from logos_ir.runtime.cuda.artifacts import build_program
    from logos_ir.runtime.cuda.host import EmulatedDevice
    from logos_ir.runtime.cuda.weights import EmulatedWeights

    spec = store.spec
    authored, _ = written_split(spec, cut, "", tp) if tp > 1 else written(spec, cut)
    reference = Interpreter(parse_program(authored.text), store, KVState())
    plan, _, _ = build_program(spec, cut, tp, "f32")
    device = EmulatedDevice(spec, EmulatedWeights(store, "f32", tp))
    chips = device.prepare(plan)
    tokens = np.array([5, 90, 201])
    for position in range(1, 6):
        positions = np.full(3, position)
        want = reference.run(tokens=tokens, positions=positions)
        for arrays in chips:
            arrays["tokens"][...], arrays["positions"][...] = tokens, positions
        device.run(plan, chips)
        assert chips[0]["next"].tolist() == want.tolist()
        tokens = want
    return plan


def test_an_edit_after_the_identity_check_is_what_the_lane_lowers() -> None:
    """The lane lowers the module it is given: after verify-identity, the head's norm and layer 1's second norm
    get other epsilons and a projection's weight another tensor name; the rest of logos-to-cuda lowers them, so the
    head's projection carries the new epsilon (the kernel level's property, the constant of its gpu.func), layer
    1's gate/up launches a kernel of its own (its shapes are layer 0's, its epsilon is not), and the host plan names
    the renamed tensor's buffer, not the old one."""
    from xdsl.context import Context
    from xdsl.dialects import arith, gpu
    from xdsl.dialects.builtin import FloatAttr, ModuleOp, StringAttr
    from xdsl.passes import PassPipeline

    from logos_ir.author import written
    from logos_ir.dialects import cuda, logos
    from logos_ir.parser import parse_program
    from logos_ir.passes.cuda.host_plan import plan_of
    from logos_ir.registry import passes, pipelines

    authored, _ = written(ModelSpec.preset("tiny"), Cut.decode(64))
    module = ModuleOp([parse_program(authored.text, "<decode>")])
    stages = pipelines()["logos-to-cuda"].stages({"weights": "f32"})
    assert stages[0] == "verify-identity"
    context = Context()
    PassPipeline.parse_spec(passes(), stages[0]).apply(context, module)

    epsilon, old_name, new_name = 3.5e-4, "model.layers.1.mlp.down_proj.weight", "renamed.down_proj.weight"
    (head_norm,) = [
        op
        for op in module.walk()
        if isinstance(op, logos.RMSNormOp)
        and isinstance(op.weight.owner, logos.WeightOp)
        and op.weight.owner.tensor.data == "model.norm.weight"
    ]
    head_norm.properties["epsilon"] = FloatAttr(epsilon, head_norm.epsilon.type)
    (layer_norm,) = [
        op
        for op in module.walk()
        if isinstance(op, logos.RMSNormOp)
        and isinstance(op.weight.owner, logos.WeightOp)
        and op.weight.owner.tensor.data == "model.layers.1.post_attention_layernorm.weight"
    ]
    layer_norm.properties["epsilon"] = FloatAttr(7e-4, layer_norm.epsilon.type)  # a kernel shape layer 0 shares
    (weight,) = [op for op in module.walk() if isinstance(op, logos.WeightOp) and op.tensor.data == old_name]
    weight.properties["tensor"] = StringAttr(new_name)

    *kernel_level, to_gpu, programmatic = stages[1:]
    PassPipeline.parse_spec(passes(), ",".join(kernel_level)).apply(context, module)
    (head,) = [op for op in module.walk() if isinstance(op, cuda.LinearOp) and cuda.shape_of(op.outs[0].type)[1] == 256]
    assert head.epsilon is not None and np.float32(head.epsilon.value.data) == np.float32(epsilon)

    PassPipeline.parse_spec(passes(), f"{to_gpu},{programmatic}").apply(context, module)
    module.verify()
    plan = plan_of(module)
    assert new_name in plan.buffers and old_name not in plan.buffers
    assert any(new_name in launch.buffers for launch in plan.launches)
    head_kernel = plan.kernels[plan.launches[-3].kernel]
    assert isinstance(head_kernel, gpu.FuncOp) and head_kernel.sym_name.data.startswith("norm_linear_")
    constants = [
        op.value.value.data
        for op in head_kernel.walk()
        if isinstance(op, arith.ConstantOp) and isinstance(op.value, FloatAttr)
    ]
    assert np.float32(epsilon) in [np.float32(c) for c in constants]
    gate_ups = [launch.kernel for launch in plan.launches if launch.kernel.startswith("norm_gate_up_")]
    assert len(gate_ups) == 2 and gate_ups[1] == gate_ups[0] + "_v2"  # layer 1's epsilon: a kernel of its own
    layer_1 = [op.value.value.data for op in plan.kernels[gate_ups[1]].walk() if isinstance(op, arith.ConstantOp)]
    assert np.float32(7e-4) in [np.float32(c) for c in layer_1 if isinstance(c, float)]


def test_every_fusion_is_a_pass_of_the_pipeline() -> None:
    """Each of the lane's fusions is a registered pass that logos-to-cuda runs as a stage of its own."""
    from logos_ir.registry import passes, pipelines

    stages = [s.split("{")[0] for s in pipelines()["logos-to-cuda"].stages({"weights": "bf16"})]
    fusions = [name for name in passes() if name.startswith("cuda-f")]
    assert fusions == ["cuda-fold-norms", "cuda-fuse-qkv", "cuda-fold-residual-adds",
                       "cuda-fuse-prefill-attention", "cuda-fold-prefill-norms"]  # fmt: skip
    assert stages == ["verify-identity", "inline-sections", "convert-logos-to-cuda-kernels", *fusions,
                      "convert-cuda-kernels-to-gpu", "cuda-programmatic-launch"]  # fmt: skip


def test_the_build_summary_gives_one_figure_a_quantity() -> None:
    """The summary logos-compile prints names each byte figure for what it is (the weights a chip holds, what a
    chip's step reads, the least a step must read), and no quantity twice: on a split step, where the weights a
    chip holds (the embedding table whole) differ from what its step reads."""
    import re

    build = _build(_spec(), "decode ctx=64", tp=2)
    text = "\n".join(build.summary)
    figures = re.findall(r"(\d+\.\d) MB", text)
    assert len(figures) == 3, text
    named = re.findall(r"([\d.]+) MB of weights held \(each chip\)|each chip reads ([\d.]+) MB a step|a minimum of "
                       r"([\d.]+) MB \(the weights a step uses and the full cache\)", text)  # fmt: skip
    assert sorted(f for match in named for f in match if f) == sorted(figures), text
    assert text.count("read a step") + text.count("reads") == 1, text
    report = build.report
    assert report["weight_bytes"] != report["bytes_read"]  # two quantities, so two names
    assert f"{report['bytes_read'] / 1e6:.1f} MB a step" in text and f"{report['weight_bytes'] / 1e6:.1f} MB of" in text
