"""The D5005 engine run for real: its OpenCL C builds on PoCL's CPU device, and the instruction stream and weight
image, loaded as the card's host program loads them, compute the reference interpreter's tokens.

The f32 checks are exact: the same greedy tokens as `logos_ir.generate.Generator` on tiny random models of every
shape the engine must handle (grouped-query, multi-query, tied and untied heads, a head size that is not hidden /
heads, Llama 3 rotary scaling) and on the embedded SmolLM2-135M (the suite's one embedded-model run, marked
EMBEDDED MODEL RUN below, which also holds the bf16 teacher-forced agreement over 128 steps).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from logos_ir.dialects import d5005
from logos_ir.generate import Generator
from logos_ir.passes.d5005.emit_opencl import engine_source
from logos_ir.program import Cut
from logos_ir.runtime.opencl import opencl_available
from logos_ir.spec import ModelSpec, RopeScaling
from logos_ir.weights import RandomWeights

NO_OPENCL = opencl_available()
needs_opencl = pytest.mark.usefixtures("opencl_device")


def spec(**sizes: object) -> ModelSpec:
    base: dict[str, object] = dict(
        vocab=96, hidden=48, layers=2, heads=4, kv_heads=2, head_dim=12, intermediate=80,
        rms_eps=1e-5, rope_theta=10000.0, tie_embeddings=False,
    )  # fmt: skip
    base.update(sizes)
    return ModelSpec(**base)  # type: ignore[arg-type]


SHAPES = {
    "gqa": spec(),
    "mqa": spec(heads=6, kv_heads=1, head_dim=8),
    "tied": spec(tie_embeddings=True, layers=3),
    "head-dim-not-hidden-over-heads": spec(hidden=40, heads=4, kv_heads=2, head_dim=18, intermediate=72),
    "mha-llama3-rope": spec(
        heads=2, kv_heads=2, head_dim=24, rope_theta=500000.0, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 32)
    ),
}


@needs_opencl
@pytest.mark.parametrize("weights", ["bf16", "f32"])
def test_engine_source_builds_on_the_opencl_cpu_device(weights: str) -> None:
    import pyopencl as cl

    from logos_ir.runtime.opencl import cpu_context

    source = engine_source(
        "LOGOS program: decode step, ctx 64, sha256 " + "0" * 64, d5005.EngineParams(weights=weights)
    )
    program = cl.Program(cpu_context(), source).build()
    assert program.d5005_compute.num_args == 16  # instructions, banks, scratch, token, position, outputs, 4 channels
    assert [cl.Kernel(program, f"d5005_read_bank{b}").num_args for b in range(4)] == [8] * 4
    rings = cl.Program(cpu_context(), source).build(options=["-D", "D5005_RINGS"])
    assert rings.d5005_compute.num_args == 24  # ... and each channel's ring, its words sent and its words taken
    assert [cl.Kernel(rings, f"d5005_read_bank{b}").num_args for b in range(4)] == [9] * 4


@needs_opencl
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_f32_engine_gives_the_reference_tokens(name: str) -> None:
    from logos_ir.runtime.d5005 import D5005Generator

    store = RandomWeights(SHAPES[name], seed=7)
    prompt = [5, 17, 3, 60, 2]
    expected = Generator(store, prefill_rows=4).generate(prompt, 24)
    engine = D5005Generator(store, weights="f32")
    assert engine.generate(prompt, 24) == expected
    assert engine.stats.new_tokens == 24 and engine.stats.decode_steps == 23
    assert [i.cut for i in engine.identities] == [Cut.decode(64)]


@needs_opencl
@pytest.mark.parametrize("name", ["gqa", "mqa"])
def test_f32_tokens_hold_once_the_attention_slots_wrap(name: str) -> None:
    """Past 4 x SHIFT_DEPTH = 32 positions each of the attention's slots takes a second row of four and rescales
    its accumulator to the new maximum: 56 tokens (positions up to 60) against the reference's."""
    from logos_ir.runtime.d5005 import D5005Generator

    store = RandomWeights(SHAPES[name], seed=7)
    prompt = [5, 17, 3, 60, 2]
    expected = Generator(store, prefill_rows=4).generate(prompt, 56)
    assert D5005Generator(store, weights="f32").generate(prompt, 56) == expected


# The channel path: the five kernels at once, through rings of the channels' depth, in a process of its own (PoCL
# reads POCL_MAX_PTHREAD_COUNT when it starts; the card runs the five kernels at once, so five threads are needed).
CHANNEL_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_d5005_engine import SHAPES
from logos_ir.runtime.d5005 import D5005Generator
from logos_ir.weights import RandomWeights
tokens = {}
for name in sorted(SHAPES):
    for weights in ("f32", "bf16"):
        engine = D5005Generator(RandomWeights(SHAPES[name], seed=7), weights=weights, rings=True)
        tokens[f"{name}/{weights}"] = engine.generate([5, 17, 3, 60, 2], 12)
print(json.dumps(tokens))
"""


@needs_opencl
def test_the_channel_path_gives_the_reference_tokens() -> None:
    """The engine's five kernels run at once on PoCL (D5005_RINGS), each reader waiting on a full ring of
    CHANNEL_DEPTH words and the compute kernel on an empty one, as on the card: f32 gives the reference's greedy
    tokens on every held shape, and bf16 the tokens of the ordered-buffer path (the same arithmetic)."""
    import json
    import os
    import subprocess
    import sys

    from logos_ir.runtime.d5005 import D5005Generator
    from logos_ir.runtime.opencl import cpu_device, cpu_runtime

    if cpu_runtime() != "pocl":  # Intel's CPU runtime runs as many kernels at once as there are cores, here fewer
        pytest.skip(
            f"the five kernels at once need PoCL's pthread device, and this process runs on Intel's CPU runtime"
            f" ({cpu_device().max_compute_units} at a time): PoCL's compiler builds no kernel for this CPU"
        )
    env = {**os.environ, "POCL_MAX_PTHREAD_COUNT": "5"}
    run = subprocess.run(
        [sys.executable, "-c", CHANNEL_RUN, str(Path(__file__).parent)], env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    tokens = json.loads(run.stdout.splitlines()[-1])
    prompt = [5, 17, 3, 60, 2]
    for name in sorted(SHAPES):
        store = RandomWeights(SHAPES[name], seed=7)
        assert tokens[f"{name}/f32"] == Generator(store, prefill_rows=4).generate(prompt, 12), name
        assert tokens[f"{name}/bf16"] == D5005Generator(store, weights="bf16").generate(prompt, 12), name


def test_the_channel_path_refuses_a_device_that_runs_fewer_kernels_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from logos_ir.errors import LogosError
    from logos_ir.runtime.d5005 import D5005Generator

    if NO_OPENCL is not None:
        pytest.fail(f"no OpenCL CPU device ({NO_OPENCL})")
    from logos_ir.runtime.opencl import cpu_device

    if cpu_device().max_compute_units >= 1 + d5005.BANKS:
        pytest.skip("this process's PoCL runs five kernels at once: nothing to refuse")
    engine = D5005Generator(RandomWeights(SHAPES["gqa"], seed=7), weights="f32", rings=True)
    with pytest.raises(LogosError, match="five kernels at once.*runs [0-9]+ at a time"):
        engine.generate([5, 17], 2)


@needs_opencl
def test_a_build_folder_runs_as_the_card_host_loads_it(tmp_path: Path) -> None:
    import subprocess

    from logos_ir.runtime.d5005 import Engine, StreamError
    from logos_ir.weights import open_model, save_model

    spec = SHAPES["mqa"]
    save_model(RandomWeights(spec, seed=4), tmp_path / "model")
    build = tmp_path / "build"
    command = ["logos-compile", "--model", str(tmp_path / "model"), "--target", "d5005", "--cut", "decode ctx=64"]
    done = subprocess.run([*command, "--weights", "f32", "--with-weights", "-o", str(build)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert b"d5005 cost model (read from engine.cl as aoc would):" in done.stdout + done.stderr
    engine = Engine.from_build(build)
    prompt = [7, 1, 30]
    expected = Generator(open_model(str(tmp_path / "model"))).generate(prompt, 10)
    for position, token in enumerate(prompt, start=1):
        predicted = engine.step(token + 1, position)
    got = []
    for position in range(len(prompt) + 1, len(prompt) + 11):
        got.append(predicted - 1)
        predicted = engine.step(predicted, position)
    assert got == expected
    assert "aoc -board=pac_s10_dc" in (build / "compile.sh").read_text()
    (build / "weights.bin").unlink()
    with pytest.raises(StreamError, match="missing weights.bin"):
        Engine.from_build(build)


@needs_opencl
def test_a_build_folder_and_a_compiled_engine_run_through_the_generator(tmp_path: Path) -> None:
    """RunRequest.build runs the folder's own engine, stream and image; RunRequest.aocx loads a program binary
    with clCreateProgramWithBinary (here PoCL's own binary of engine.cl, as an .aocx is Intel's of it)."""
    import pyopencl as cl

    from logos_ir.build import BuildRequest
    from logos_ir.errors import LogosError
    from logos_ir.models import ModelSource
    from logos_ir.passes.d5005.build import build_d5005
    from logos_ir.progress import Progress
    from logos_ir.runtime import RunRequest
    from logos_ir.runtime.d5005 import d5005_generator
    from logos_ir.runtime.opencl import cpu_context

    store = RandomWeights(SHAPES["gqa"], seed=9)
    source = ModelSource("preset", "gqa", store.spec, _store=store)
    lane = build_d5005(BuildRequest(source, Cut.decode(32), 1, "f32", True, Progress.silent()))
    folder = tmp_path / "build"
    folder.mkdir()
    for artifact in lane.artifacts:
        (folder / artifact.path).write_bytes(artifact.data)
    expected = Generator(store, ctx=32).generate([4, 8, 15], 12)
    built = d5005_generator(RunRequest(store, build=folder, weights="bf16"))  # the build's own precision runs
    assert built.generate([4, 8, 15], 12) == expected
    program = cl.Program(cpu_context(), (folder / "engine.cl").read_text()).build()
    binary = tmp_path / "engine.aocx"
    binary.write_bytes(program.get_info(cl.program_info.BINARIES)[0])
    compiled = d5005_generator(RunRequest(store, build=folder, aocx=binary))
    assert compiled.generate([4, 8, 15], 12) == expected
    assert d5005_generator(RunRequest(store, ctx=32, weights="f32", aocx=binary)).generate([4, 8, 15], 12) == expected
    binary.write_bytes(b"not a program binary")
    with pytest.raises(LogosError, match="the compiled engine does not load"):
        d5005_generator(RunRequest(store, build=folder, aocx=binary))
    other = cl.Program(cpu_context(), "__kernel void d5005_compute(__global int *x) { x[0] = 1; }").build()
    binary.write_bytes(other.get_info(cl.program_info.BINARIES)[0])
    with pytest.raises(LogosError, match="the compiled engine is not the D5005 engine"):
        d5005_generator(RunRequest(store, build=folder, aocx=binary))


@needs_opencl
def test_the_logits_are_the_ones_the_engine_wrote() -> None:
    from logos_ir.runtime.d5005 import D5005Generator

    store = RandomWeights(SHAPES["mqa"], seed=2)
    engine = D5005Generator(store, ctx=64, weights="f32")
    reference = Generator(store, ctx=64).program(Cut.decode(64))
    names = {kind: name for name, kind in reference.inputs.items()}
    machine = engine._machine_for(64)
    machine.reset()
    for position, token in enumerate([5, 6, 7, 8], start=1):
        predicted = machine.step(token, position)
        expected = int(reference.run(**{names["token"]: np.array([token]), names["position"]: np.array([position])})[0])
        assert predicted == expected == int(np.argmax(machine.logits)) + 1
        assert machine.logits.shape == (SHAPES["mqa"].vocab,) and machine.logits.dtype == np.float32
        np.testing.assert_allclose(machine.logits, reference.logits, rtol=1e-4, atol=1e-4)
    # the logits buffer where the stream's symbols put it, in the `outputs` array the arg-max read them from
    name, words, offset, array = next(b for b in machine.engine.stream.symbols["buffers"] if b[0] == "logits")
    assert array == "outputs" and words == SHAPES["mqa"].vocab
    np.testing.assert_array_equal(machine.engine.onchip(array, offset + words)[offset:], machine.logits)


@needs_opencl
@pytest.mark.parametrize("burst", [32, 128])
def test_the_engine_follows_its_parameters(burst: int) -> None:
    """Another burst (so another vector width, MAC lanes and alignment) and a smaller on-chip budget: the same
    tokens, from the same source emitted for those parameters."""
    from logos_ir.author import written
    from logos_ir.parser import parse_program
    from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
    from logos_ir.passes.d5005.emit_stream import encode_stream
    from logos_ir.runtime.d5005 import Engine
    from logos_ir.testing import lower_program

    spec = SHAPES["head-dim-not-hidden-over-heads"]
    store = RandomWeights(spec, seed=11)
    text, _ = written(spec, Cut.decode(64))
    params = d5005.EngineParams(burst_bytes=burst, onchip_words=4096, weights="f32")
    program = lower_program(parse_program(text.text, "<decode>"), "f32", params)
    assert all(r.offset.data % burst == 0 for op in program.instructions() for r in op.regions_read())
    source = engine_source(program.identity.data, program.params)
    assert f"#define VECTOR_WIDTH {burst // 4}" in source
    engine = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, spec, store))
    expected = Generator(store).generate([9, 8], 8)
    for position, token in enumerate([9, 8], start=1):
        predicted = engine.step(token + 1, position)
    got = []
    for position in range(3, 11):
        got.append(predicted - 1)
        predicted = engine.step(predicted, position)
    assert got == expected


@needs_opencl
def test_bf16_engine_agrees_on_a_tiny_model() -> None:
    from logos_ir.runtime.d5005 import D5005Generator

    store = RandomWeights(SHAPES["gqa"], seed=3)
    agreement = _teacher_forced(store, D5005Generator(store, weights="bf16"), [4, 9, 30], 40)
    assert agreement >= 0.9


@needs_opencl
def test_a_step_in_many_runs_of_the_ordered_buffers_gives_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ordered buffers that hold only the largest instruction's words: each step runs as many launches of the
    readers then the compute kernel, whose on-chip state carries from one run to the next."""
    from logos_ir.runtime import d5005 as runtime
    from logos_ir.runtime.d5005 import D5005Generator

    monkeypatch.setattr(runtime, "_FIFO_WORDS_MIN", 1)
    store = RandomWeights(SHAPES["tied"], seed=8)
    generator = D5005Generator(store, weights="f32")
    assert generator.generate([3, 1, 4, 1, 5], 10) == Generator(store).generate([3, 1, 4, 1, 5], 10)
    engine = generator.engine(64)
    runs = engine._runs(7, 12)
    assert len(runs) > 10 and sum(count for _, count, _ in runs) == len(engine.stream.words)


@needs_opencl
def test_the_engine_stops_at_eos_and_at_a_full_cache() -> None:
    from logos_ir.runtime.d5005 import D5005Generator

    store = RandomWeights(SHAPES["gqa"], seed=7)
    full = Generator(store, ctx=8).generate([1, 2, 3], 20)
    assert D5005Generator(store, ctx=8, weights="f32").generate([1, 2, 3], 20) == full
    assert len(full) == 6  # the cache's 8 positions: 3 for the prompt, then 5 steps and the last prediction
    stopped = Generator(store, ctx=8).generate([1, 2, 3], 20, eos_id=full[1])
    assert D5005Generator(store, ctx=8, weights="f32").generate([1, 2, 3], 20, eos_id=full[1]) == stopped
    assert stopped[-1] == full[1] and len(stopped) < len(full)


def _teacher_forced(store: RandomWeights, engine_generator: object, prompt: list[int], steps: int) -> float:
    """The share of `steps` decode steps where the engine predicts the reference's next token, both fed the same
    tokens: the prompt, then the reference's own greedy continuation (ids from 0)."""
    ctx = -(-steps // 64) * 64
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    engine = engine_generator.engine(ctx)  # type: ignore[attr-defined]
    engine.reset()
    fed, same = list(prompt), 0
    for position in range(1, steps + 1):
        token = fed[position - 1]
        step = {names["token"]: np.array([token + 1]), names["position"]: np.array([position])}
        expected = int(reference.run(**step)[0])
        same += engine.step(token + 1, position) == expected
        if position == len(fed):
            fed.append(expected - 1)
    return same / steps


# -- EMBEDDED MODEL RUN: the suite's one run of the embedded SmolLM2-135M (f32 tokens, then bf16 agreement) --------

# The reference interpreter's decode step over 128 positions of the embedded model, fed the prompt then its own
# greedy continuation (`python bench/bench_d5005.py --write-golden` made it in 102 s; the reference is not run here
# for the 128 steps, so that the suite pays for the engine's run alone).
GOLDEN = Path(__file__).parent / "golden" / "smollm2_reference_128.json"


@needs_opencl
def test_embedded_model_on_the_engine() -> None:
    import json

    from logos_ir.author import written
    from logos_ir.runtime.d5005 import D5005Generator
    from logos_ir.weights import open_model

    golden = json.loads(GOLDEN.read_text())
    store = open_model(None)
    _, identity = written(store.spec, Cut.decode(golden["ctx"]))
    assert identity.line() == golden["identity"], "the reference's program changed: rewrite the golden file"
    prompt, fed, predicted = golden["prompt"], golden["fed"], golden["predicted"]
    greedy = predicted[len(prompt) - 1 : len(prompt) + 15]  # the reference's 16 greedy tokens after the prompt
    assert fed[len(prompt) :] == predicted[len(prompt) - 1 : -1] and len(fed) == len(predicted) == 128
    assert D5005Generator(store, weights="f32").generate(prompt, 16) == greedy
    # bf16 weights and KV cache, teacher-forced over 128 steps: fed the reference's tokens, each prediction compared
    engine = D5005Generator(store, weights="bf16").engine(golden["ctx"])
    engine.reset()
    same = sum(engine.step(fed[p] + 1, p + 1) - 1 == predicted[p] for p in range(128))
    assert same / 128 >= 0.98, f"bf16 next-token agreement {same}/128"


@pytest.mark.skipif(NO_OPENCL is not None, reason=str(NO_OPENCL))
def test_a_source_the_device_does_not_build_is_one_clear_error() -> None:
    """The device's compiler's refusal (here of a source that is not OpenCL C; on a CPU PoCL's LLVM does not know,
    of any source) is a LogosError with the compiler's first error line, not pyopencl's traceback."""
    from logos_ir.errors import LogosError
    from logos_ir.runtime.d5005 import _built
    from logos_ir.runtime.opencl import cpu_context

    context = cpu_context()
    with pytest.raises(LogosError, match="does not build the engine's source: .*error") as refused:
        _built(context, "this is not OpenCL C", None)
    assert "PYOPENCL_COMPILER_OUTPUT=1" in (refused.value.hint or "")
