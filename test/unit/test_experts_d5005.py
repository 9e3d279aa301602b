"""Mixtures of experts on the D5005 engine: the route on the engine, the expert matvecs whose bank readers
stream only the chosen experts' rows, the weighted sum in ascending expert index, the cost model counting only the
chosen experts' bytes, and the presets that fit the card's banks."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from test_d5005_cost_model import _sent, edited  # the suite's rootdir-relative imports, as test_d5005_engine's
from test_families import FAMILIES, GOLDENS, _lane
from test_families_d5005 import _lowered, printed_loops

from logos_ir import quant
from logos_ir.author import written
from logos_ir.dialects import d5005
from logos_ir.parser import parse_program
from logos_ir.passes.d5005 import cost_model
from logos_ir.passes.d5005.emit_layout import image_bytes, weight_image
from logos_ir.passes.d5005.emit_opencl import engine_features, engine_source
from logos_ir.passes.d5005.emit_stream import encode_instruction, encode_stream
from logos_ir.program import Cut
from logos_ir.runtime.d5005 import Engine, StreamError, read_stream
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_program
from logos_ir.weights import RandomWeights, open_model
from logos_ir.weights.store import QuantizedWeights, WeightStore

MIXTURES = ("mixtral", "qwen3_moe", "qwen3_moe-unnormed", "qwen3_moe-kv4")


def _engine(family: str, source: str | None = None) -> tuple[Engine, d5005.ProgramOp]:
    store = open_model(str(FAMILIES / family))
    program = _lowered(family)
    source = source or engine_source(program.identity.data, program.params, engine_features(program))
    return Engine(
        source, encode_stream(program, image_bytes(program)), weight_image(program, store.spec, store)
    ), program


def _greedy(engine: Engine, prompt: list[int], count: int) -> list[int]:
    """Greedy tokens (ids from 0) from the engine's steps alone (ids from 1), the prompt a token a step."""
    engine.reset()
    tokens = list(prompt)
    for position in range(1, len(prompt) + count):
        predicted = engine.step(tokens[position - 1] + 1, position) - 1
        if position >= len(prompt):
            tokens.append(predicted)
    return tokens[len(prompt) :]


@pytest.mark.usefixtures("opencl_device")
@pytest.mark.parametrize("family", MIXTURES)
def test_a_mixture_gives_transformers_tokens_on_the_engine(family: str) -> None:
    run = GOLDENS[family]["runs"][0]
    assert _lane(family, "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]


@pytest.mark.usefixtures("opencl_device")
def test_olmoe_gives_transformers_tokens_on_the_engine() -> None:
    """OLMoE: its norms of the whole query and key (an RMS norm of a matvec's output into `inputs`, the rope
    rotating from there) and its mixture (unnormalized, 4 experts, top 2)."""
    run = GOLDENS["olmoe"]["runs"][0]
    assert _lane("olmoe", "d5005", False).generate(run["prompt"], len(run["tokens"])) == run["tokens"]
    program = _lowered("olmoe")
    ropes = [op for op in program.instructions() if isinstance(op, d5005.RopeOp)]
    assert len(ropes) == 4 and all(op.src.owner.array_name == "inputs" for op in ropes)  # type: ignore[union-attr]
    assert {"projection_norms", "sandwich", "experts"} <= engine_features(program)


@pytest.mark.usefixtures("opencl_device")
def test_projection_norms_are_the_ropes_own_part() -> None:
    """The same OLMoE stream on an engine printed without `projection_norms` is refused by the host; the engine's
    rope with the array it rotates from forced to `outputs` gives other tokens."""
    run = GOLDENS["olmoe"]["runs"][0]
    program = _lowered("olmoe")
    store = open_model(str(FAMILIES / "olmoe"))
    stream, image = encode_stream(program, image_bytes(program)), weight_image(program, store.spec, store)
    without = engine_source(program.identity.data, program.params, engine_features(program) - {"projection_norms"})
    with pytest.raises(StreamError, match="rotates a buffer of 'inputs'.*no ENGINE_PROJECTION_NORMS"):
        Engine(without, stream, image)
    source = engine_source(program.identity.data, program.params, engine_features(program))
    blind = edited(source, ("uint normed = (w.s2 >> ARRAY_SHIFT) == ARRAY_INPUTS;", "uint normed = 0;"))
    assert _greedy(Engine(source, stream, image), run["prompt"], 6) == run["tokens"][:6]
    assert _greedy(Engine(blind, stream, image), run["prompt"], 6) != run["tokens"][:6]


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"intermediate": 30}, "stacks experts of 30 rows of 64 in 'model.layers.0.mlp.experts.gate_proj.weight'"),
        ({"experts": 300, "experts_per_token": 2}, "routes to 2 of 300 experts, over the engine's 16 of 256"),
        ({"experts": 32, "experts_per_token": 17}, "routes to 17 of 32 experts, over the engine's 16 of 256"),
    ],
)
def test_a_mixture_the_engine_does_not_take_is_refused_by_name(change: dict, refusal: str) -> None:
    """Experts whose rows are not whole rows of four (each expert's rows must start in bank 0), more experts than
    the route's on-chip copy, more chosen than its registers: refused naming the mixture, before anything runs."""
    from logos_ir.errors import PassError

    shape = {"intermediate": 32, "experts": 4, "experts_per_token": 2} | change
    spec = ModelSpec(vocab=96, hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, rms_eps=1e-5,
                     rope_theta=10000.0, tie_embeddings=False, **shape)  # fmt: skip
    text, _ = written(spec, Cut.decode(32))
    with pytest.raises(PassError, match=f"'logos.experts' %routed {re.escape(refusal)}"):
        lower_program(parse_program(text.text, "<decode>"), "f32")


def test_each_mixture_is_a_route_then_each_slots_expert_instructions() -> None:
    """Per layer: the router's matvec, one route, then for each of the top_k slots the chosen expert's gate, up,
    silu_mul, down and its expert_sum, each expert matvec over its whole stack with the route's region and its
    slot; the words carry the expert's rows, the stack's stride from one expert to the next and the slot."""
    store = open_model(str(FAMILIES / "mixtral"))
    spec = store.spec
    program = _lowered("mixtral")
    ops = program.instructions()
    routes = [i for i, op in enumerate(ops) if isinstance(op, d5005.RouteOp)]
    assert len(routes) == spec.layers
    k = spec.experts_per_token
    for at in routes:
        route = ops[at]
        assert isinstance(route, d5005.RouteOp) and route.top_k.value.data == k and route.renormalize is not None
        assert isinstance(ops[at - 1], d5005.MatvecOp) and ops[at - 1].weight.tensor.data.endswith("mlp.gate.weight")
        names = [op.name.split(".")[1] for op in ops[at + 1 : at + 1 + 5 * k]]
        assert names == ["matvec", "matvec", "silu_mul", "matvec", "expert_sum"] * k
        for slot in range(k):
            gate, up, _, down, added = ops[at + 1 + 5 * slot : at + 6 + 5 * slot]
            for op, rows in ((gate, spec.intermediate), (up, spec.intermediate), (down, spec.hidden)):
                assert isinstance(op, d5005.MatvecOp) and op.slot is not None and op.slot.value.data == slot
                assert op.weight.rows.data == spec.experts * rows and op.routes == route.routes
                word = encode_instruction(op, 64)
                assert word[d5005.W_ROWS] == rows and word[d5005.W_SLOT] == slot + 1
                assert word[d5005.W_EXPERT_STRIDE] * 64 == rows // 4 * op.weight.stride.data
            assert isinstance(added, d5005.ExpertSumOp) and added.slot.value.data == slot
    assert engine_features(program) == {"experts"}


@pytest.mark.usefixtures("opencl_device")
def test_the_readers_send_what_the_model_costs_and_only_the_chosen_experts_rows() -> None:
    """Each expert matvec's bank readers send the model's bursts (one expert's rows); and the rows they send are
    those of the expert whose id the route left in their bank: the fifo of a run of the expert's matvec alone holds
    that expert's rows of the image, not expert 0's."""
    import pyopencl as cl

    engine, program = _engine("mixtral")
    model = cost_model.Engine.for_program(program)
    for position, token in enumerate([5, 9, 17], start=1):
        engine.step(token, position)
    ops = program.instructions()
    burst = program.params.burst_bytes
    last_route = max(i for i, op in enumerate(ops) if isinstance(op, d5005.RouteOp))
    ids = np.zeros(burst // 4, np.uint32)
    routes = ops[last_route].routes
    for b in range(d5005.BANKS):  # the ids, the same in every bank
        cl.enqueue_copy(engine.queue, ids, engine.banks[b], src_offset=routes.offset.data)
        assert sorted(set(ids[:2].tolist())) == ids[:2].tolist()  # two experts, ascending
    image = np.frombuffer(weight_image(program, open_model(str(FAMILIES / "mixtral")).spec,
                                       open_model(str(FAMILIES / "mixtral"))), np.uint8)  # fmt: skip
    banks = image[d5005.HEADER_BYTES :].reshape(d5005.BANKS, -1)
    assert ids[:2].any()  # an expert other than 0 was chosen: its rows are not the stack's first
    for index in range(last_route + 1, len(ops)):
        op = ops[index]
        if not (isinstance(op, d5005.MatvecOp) and op.slot is not None):
            continue
        bursts = cost_model.instruction_cost(model, encode_instruction(op, burst), 17, 3, cost_model.LOW)["bursts"]
        assert bursts == _sent(engine, index, 17, 3)
        expert, stride = int(ids[op.slot.value.data]), op.expert_stride
        fifo = np.zeros(bursts[0] * burst, np.uint8)
        cl.enqueue_copy(engine.queue, fifo, engine.fifos[0])
        start = op.weight.offset.data + expert * stride
        assert np.array_equal(fifo, banks[0, start : start + len(fifo)])
        if expert:
            assert not np.array_equal(fifo, banks[0, op.weight.offset.data : op.weight.offset.data + len(fifo)])


@pytest.mark.usefixtures("opencl_device")
def test_a_reader_that_ignores_the_route_gives_other_tokens() -> None:
    """The same stream on an engine whose readers stream expert 0 whatever the route chose: other tokens (the
    readers' addresses are what chooses the experts' rows; the compute kernel's matvec is the plain one)."""
    run = GOLDENS["mixtral"]["runs"][0]
    engine, program = _engine("mixtral")
    assert _greedy(engine, run["prompt"], 6) == run["tokens"][:6]
    source = engine_source(program.identity.data, program.params, engine_features(program))
    blind = edited(source, ("expert = SELECT(chosen < w.sd, chosen, 0u);", "expert = 0u;"))
    engine, _ = _engine("mixtral", blind)
    assert _greedy(engine, run["prompt"], 6) != run["tokens"][:6]


@pytest.mark.usefixtures("opencl_device")
def test_renormalizing_is_the_routes_own() -> None:
    """Qwen3-MoE with and without norm_topk_prob: the route's flag in its word; the renormalized stream with the
    flag cleared gives the unnormalized weights, and other logits."""
    engine, program = _engine("qwen3_moe")
    words = [[int(v) for v in w] for w in read_stream(encode_stream(program, image_bytes(program))).words]
    flags = [w[d5005.W_RENORMALIZE] for w in words if w[0] == d5005.OPCODES["d5005.route"]]
    assert flags == [1, 1]
    unnormed = _lowered("qwen3_moe-unnormed")
    assert [op.renormalize for op in unnormed.instructions() if isinstance(op, d5005.RouteOp)] == [None, None]
    engine.step(7, 1)
    normed = engine.logits.copy()
    for op in program.instructions():
        if isinstance(op, d5005.RouteOp):
            del op.properties["renormalize"]
    store = open_model(str(FAMILIES / "qwen3_moe"))
    source = engine_source(program.identity.data, program.params, engine_features(program))
    cleared = Engine(source, encode_stream(program, image_bytes(program)), weight_image(program, store.spec, store))
    cleared.step(7, 1)
    assert not np.allclose(cleared.logits, normed, atol=1e-3)


@pytest.mark.usefixtures("opencl_device")
@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_stacked_experts_as_stored_give_the_reference_tokens(fmt: str) -> None:
    """The tiny Mixtral with its projections and its stacks of experts stored in a block format: the stacks stream
    as stored (the stream's regions say the format) and the engine gives the reference's greedy tokens."""
    from logos_ir.generate import Generator
    from logos_ir.runtime.d5005 import D5005Generator

    store = QuantizedWeights(open_model(str(FAMILIES / "mixtral")), fmt)
    prompt = [5, 17, 3, 60, 2]
    engine = D5005Generator(store, weights="f32")
    assert engine.generate(prompt, 10) == Generator(store, prefill_rows=4).generate(prompt, 10)
    regions = engine.engine(64).stream.symbols["regions"]
    stacks = {r[0]: r[-1] for r in regions if ".experts." in r[0]}
    assert len(stacks) == 3 * store.spec.layers and set(stacks.values()) == {fmt}


def test_an_engine_without_experts_refuses_a_routed_stream() -> None:
    """A routed stream on the engine printed without `experts`: the host refuses it before anything runs, and the
    cost model will not cost it."""
    program = _lowered("mixtral")
    stream = encode_stream(program, image_bytes(program))
    plain = engine_source(program.identity.data, program.params)
    store = open_model(str(FAMILIES / "mixtral"))
    image = weight_image(program, store.spec, store)
    with pytest.raises(StreamError, match="routes a mixture of experts, and this engine has no ENGINE_EXPERTS"):
        Engine(plain, stream, image)
    words = [[int(v) for v in w] for w in read_stream(stream).words]
    with pytest.raises(Exception, match="routes a mixture of experts, and the engine has no ENGINE_EXPERTS"):
        cost_model.band(engine=cost_model.Engine.read(plain), words=words, ctx=32)


def _active_bytes(store: WeightStore, element: int, fmt: str = "") -> int:
    """Bytes of the weights one decode step uses, from the tensors' shapes in the store: the embedding's one row,
    every norm, every attention projection, each router, top_k of each layer's stacked experts, the final norm
    and the head; a tensor the spec stores in `fmt` at that format's block bytes, any other at `element` bytes a
    number."""
    spec, total = store.spec, 0.0
    stored = dict(spec.storage)
    for name in store.names():
        shape = store.shape(name)
        if name == "model.embed_tokens.weight":
            shape = (1, shape[1])  # its one row (a tied head reads the whole table as its own tensor's region)
        size = quant.FORMATS[fmt].stored_bytes(shape) if fmt and stored.get(name) == fmt else math.prod(shape) * element
        if ".experts." in name:
            size = size * spec.experts_per_token / spec.experts  # top_k of the stacked experts, each the same size
        total += size
    return round(total)


def test_the_cost_model_counts_only_the_chosen_experts() -> None:
    """The weight bytes a step reads are the active weights' bytes counted from the store's tensor shapes (top_k of
    each layer's experts, every router), not all the resident experts'; each expert matvec's readers also load a
    bank word of ids from each bank."""
    store = open_model(str(FAMILIES / "mixtral"))
    spec = store.spec
    program = _lowered("mixtral")
    low = cost_model.band(program)["low"]
    assert not spec.tie_embeddings and low["weight_bytes_per_token"] == _active_bytes(store, 4)
    expert_matvecs = sum(isinstance(op, d5005.MatvecOp) and op.slot is not None for op in program.instructions())
    assert expert_matvecs == spec.layers * spec.experts_per_token * 3
    assert low["route_bytes_per_token"] == expert_matvecs * d5005.BANKS * 64
    resident = sum(math.prod(store.shape(n)) * 4 for n in store.names() if ".experts." in n)
    all_experts = _active_bytes(store, 4) + resident * (1 - spec.experts_per_token / spec.experts)
    assert low["weight_bytes_per_token"] < all_experts  # k of E: not every resident expert


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_a_mixture_preset_fits_the_card_in_q4_0_and_reads_only_its_active_weights(preset: str) -> None:
    """The preset with its matrices and stacks of experts stored in q4_0 (in bf16 it does not fit the 32 GiB)
    lowers at ctx 4096, every expert resident in the banks; a step reads its active weights' bytes, the q4_0 ones
    at the format's block bytes (`BlockFormat.stored_bytes`), within the 4% a part-group's scale word pads a row
    (Qwen3's experts' rows of 768), the norms in bf16; nothing is arbitrated but, in Qwen3's engine (its head
    norms' loads of `outputs` beside the route's and the sums'), `outputs`."""
    spec = ModelSpec.preset(preset)
    store = QuantizedWeights(RandomWeights(spec, seed=0), "q4_0")
    text, _ = written(store.spec, Cut.decode(4096))
    program = lower_program(parse_program(text.text, "<decode>"), "bf16")
    stacks = {
        r.tensor.data: r for op in program.instructions() for r in op.regions_read() if ".experts." in r.tensor.data
    }
    assert len(stacks) == 3 * spec.layers and all(r.stored == "q4_0" for r in stacks.values())
    cost = cost_model.band(program)
    weights = cost["low"]["weight_bytes_per_token"]
    active = _active_bytes(store, 2, "q4_0")
    assert active <= weights <= 1.04 * active
    resident = sum(r.bank_bytes * d5005.BANKS for r in stacks.values())
    read = sum(op.expert_rows // d5005.BANKS * op.weight.stride.data * d5005.BANKS for op in program.instructions()
               if isinstance(op, d5005.MatvecOp) and op.slot is not None)  # fmt: skip
    assert read * spec.experts == resident * spec.experts_per_token  # k of E of every stack, each expert once
    assert set(cost["arbitrated"]) <= ({"outputs"} if spec.head_norms else set())


def test_a_route_word_past_the_engines_registers_is_refused_by_the_reader() -> None:
    """A route word choosing more experts than it routes among, or more ids (4 bytes each, whatever the weights'
    precision) than its region's row holds, and an expert
    matvec whose stack would run past the memory the program uses (their CRC made right, so the reader sees the
    words themselves): refused before anything runs."""
    from test_families_d5005 import _rewritten

    program = _lowered("mixtral", weights="bf16")
    stream = encode_stream(program, image_bytes(program))
    read_stream(_rewritten(stream, d5005.OPCODES["d5005.route"], d5005.W_COLS, 3))  # 3 of 4: a route
    refusals = {5: "chooses 5 of 4 experts", 17: "has rows of 17 elements in a stride of 64 bytes"}  # 17 ids: 68
    for top_k, refusal in refusals.items():
        with pytest.raises(StreamError, match=f"instruction 14 \\(d5005.route\\) {refusal}"):
            read_stream(_rewritten(stream, d5005.OPCODES["d5005.route"], d5005.W_COLS, top_k))
    with pytest.raises(StreamError, match="streams its experts or reads its route past the memory"):
        read_stream(_rewritten(stream, d5005.OPCODES["d5005.matvec"], d5005.W_EXPERT_STRIDE, 1 << 24))


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_the_experts_engine_prints_the_loops_it_costs(family: str) -> None:
    """The loops the model costs for an engine with `experts` (OLMoE's: with `projection_norms` and `sandwich`)
    are the ones it prints under their marks, the route's among them; no on-chip array is arbitrated and no loop
    divides by a run-time value but the route's scan (its probabilities' sum)."""
    program = _lowered(family)
    source, engine, stated = printed_loops(program)
    routed = {"route.most", "route.exp", "route.choose", "route.scan", "route.ids", "expert_sum.words"}
    assert routed <= {loop.name for loop in stated}
    assert not any(engine.analysis.arbitrated.values())
    dividing = [name for name, report in engine.analysis.loops.items() if report.dividers]
    assert set(dividing) <= {"route.choose", "route.scan"}


@pytest.mark.usefixtures("opencl_device")
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_the_lanes_bf16_image_agrees_with_the_reference(family: str) -> None:
    """The lane's usual image (bf16 weights and KV cache, the route in float32 over bf16-weighted logits):
    teacher-forced, the engine predicts the f32 reference's next token at least 90% of 40 steps."""
    from test_d5005_engine import _teacher_forced

    from logos_ir.runtime.d5005 import D5005Generator

    store = open_model(str(FAMILIES / family))
    assert _teacher_forced(store, D5005Generator(store, weights="bf16"), [4, 9, 30], 40) >= 0.9


RINGS_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_families import FAMILIES, GOLDENS
from logos_ir.weights import open_model
from logos_ir.runtime.d5005 import D5005Generator
out = {}
for family in ("mixtral", "olmoe"):
    run = GOLDENS[family]["runs"][0]
    generator = D5005Generator(open_model(str(FAMILIES / family)), weights="f32", rings=True)
    out[family] = generator.generate(run["prompt"], len(run["tokens"]))
print(json.dumps(out))
"""


@pytest.mark.usefixtures("opencl_device")
def test_the_channel_path_routes_as_the_card_does() -> None:
    """The five kernels at once (D5005_RINGS, PoCL's pthread device with five threads), each reader waiting at a
    route until the compute kernel has run it (the second word of its ring's count taken), as a reader on the card
    waits on `routed`: transformers' tokens for Mixtral and OLMoE."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from logos_ir.runtime.opencl import cpu_runtime

    if cpu_runtime() != "pocl":
        pytest.skip("the five kernels at once need PoCL's pthread device (Intel's CPU runtime runs fewer here)")
    env = {**os.environ, "POCL_MAX_PTHREAD_COUNT": "5"}
    run = subprocess.run(
        [sys.executable, "-c", RINGS_RUN, str(Path(__file__).parent)], env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    tokens = json.loads(run.stdout.splitlines()[-1])
    for family in ("mixtral", "olmoe"):
        assert tokens[family] == GOLDENS[family]["runs"][0]["tokens"], family
