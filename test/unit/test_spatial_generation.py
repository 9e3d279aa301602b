"""The spatial lane's fabric simulator runs the `csl`-level module the lane prints, and gives the reference
interpreter's greedy tokens with f32 weights on tiny random models of every shape the lane must handle (grouped-query
and multi-query attention, tied and untied heads, a head size that is not hidden / heads, widths that are not whole
chunks); f16 teacher-forced agreement on a tiny model. That the simulator runs what is printed: an edited DSD op
changes the tokens, a removed route stops the run with a deadlock naming the element and colour, a receive's colour
changed is refused by the static check. The embedded model's runs (16 tokens f32, 64 steps f16) are
`bench/spatial_agreement.py` (docs/benchmarks.md): too slow for the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects import csl

from logos_ir.dialects import csl_ext
from logos_ir.errors import PassError
from logos_ir.generate import Generator
from logos_ir.passes.spatial.grid import ROW_BCAST
from logos_ir.passes.spatial.verify_grid import check_scopes, layout_params, split_modules, static_check
from logos_ir.program import Cut
from logos_ir.runtime import RunRequest
from logos_ir.runtime.spatial import CYCLES, FabricError
from logos_ir.runtime.spatial.elements import Fabric
from logos_ir.runtime.spatial.generator import SpatialGenerator, spatial_generator
from logos_ir.runtime.spatial.host import GridMachine
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights, WeightStore

PROMPT = [3, 17, 42]
NEW = 6


def _spec(**sizes: int | bool) -> ModelSpec:
    base: dict = dict(
        vocab=256,
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=128,
        rms_eps=1e-5,
        rope_theta=10000.0,
        tie_embeddings=False,
    )
    base.update(sizes)
    return ModelSpec(**base)


MODELS = {
    "gqa": _spec(),
    "mqa": _spec(kv_heads=1),
    "tied": _spec(tie_embeddings=True),
    "head_dim_not_hidden_over_heads": _spec(hidden=48, heads=4, kv_heads=2, head_dim=24),
    "ragged_widths": _spec(vocab=300, hidden=40, heads=5, kv_heads=1, head_dim=8, intermediate=100, layers=3),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_f32_tokens_match_reference(name: str) -> None:
    store = RandomWeights(MODELS[name], seed=7)
    expected = Generator(store).generate(PROMPT, NEW)
    generator = SpatialGenerator(store, image="f32")
    assert generator.generate(PROMPT, NEW) == expected
    assert generator.stats.new_tokens == NEW
    lines = generator.identities
    assert len(lines) == store.spec.layers + 2  # the identities of the parts it ran: embedding, each layer, head
    assert "embedding" in lines[0] and "layer 1" in lines[2] and "head" in lines[-1]


def _lowered(store: WeightStore, ctx: int = 16, image: str = "f32"):  # type: ignore[no-untyped-def]
    from logos_ir.testing import lower_decode

    return lower_decode(store.spec, ctx, image)


def _run(module, host, store: WeightStore, steps: int, prompt: list[int] = PROMPT) -> list[int]:  # type: ignore[no-untyped-def]
    """The grid's greedy tokens (from 0) after `prompt`, fed one position a step."""
    machine = GridMachine(module, host, store)
    machine.reset()
    tokens, out = list(prompt), []
    for position in range(1, len(prompt) + steps):
        token = tokens[position - 1] if position <= len(prompt) else out[-1]
        predicted = machine.step(token + 1, position) - 1
        if position >= len(prompt):
            out.append(predicted)
    return out


def test_logits_are_read_back_from_the_fabric() -> None:
    """The machine's logits are the head's, read back with memcpy_d2h: their arg-max is the token it returns, and
    they agree with the reference's logits."""
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    token = machine.step(4, 1)
    assert machine.logits is not None and machine.logits.shape == (store.spec.vocab,)
    assert int(np.argmax(machine.logits)) + 1 == token
    reference = Generator(store, ctx=16).program(Cut.decode(16))
    names = {kind: name for name, kind in reference.inputs.items()}
    reference.run(**{names["token"]: np.array([4]), names["position"]: np.array([1])})
    expected = reference.logits
    assert expected is not None
    np.testing.assert_allclose(machine.logits, np.asarray(expected).reshape(-1), rtol=1e-3, atol=1e-3)


def test_an_edited_dsd_op_changes_the_tokens() -> None:
    """The simulator runs the csl module it is given: the layer's first residual add (`@fadds`) made a `@fsubs`
    changes the tokens."""
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    expected = Generator(store).generate(PROMPT, 4)
    assert _run(lowered.module, lowered.host, store, 4) == expected
    lowered = _lowered(store)
    program, _ = split_modules(lowered.module)
    layer = next(op for op in program.body.block.ops if isinstance(op, csl.FuncOp) and op.sym_name.data == "layer")
    residual = next(op for op in layer.body.block.ops if isinstance(op, csl.FaddsOp))
    layer.body.block.insert_op_before(csl.FsubsOp(operands=[list(residual.ops)]), residual)
    residual.detach()
    residual.erase()
    assert _run(lowered.module, lowered.host, store, 4) != expected


def test_a_removed_route_stops_the_run_naming_element_and_colour() -> None:
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    _, layout = split_modules(lowered.module)
    # the row broadcast's configuration at the elements east of a row's centre that take its wavelets and pass them
    # on eastward (rx WEST, tx EAST and RAMP) removed
    config = next(
        op
        for op in layout.walk()
        if isinstance(op, csl_ext.SetColorConfigOp) and op.colour.data == ROW_BCAST and op.transmits == ("EAST", "RAMP")
    )
    config.detach()
    config.erase()
    static_check(lowered.module, params=layout_params(lowered.host))  # a route is not what the static check reads
    with pytest.raises(FabricError, match=rf"deadlock.*element \(\d+, \d+\).*colour {ROW_BCAST}"):
        _run(lowered.module, lowered.host, store, 1)


def test_a_receive_on_a_colour_nothing_sends_is_refused() -> None:
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    program, _ = split_modules(lowered.module)
    receives = [
        op
        for op in program.walk()
        if isinstance(op, csl.GetFabDsdOp) and op.result.type == csl.DsdType(csl.DsdKind.fabin_dsd)
    ]
    receive = receives[-1]  # the last: a broadcast's, which every element but the line's centre runs
    receive.fabric_color = type(receive.fabric_color)(20, receive.fabric_color.type)
    with pytest.raises(PassError, match=r"colour 20 is received .* on element \(\d+, \d+\)\) but no element sends it"):
        static_check(lowered.module, params=layout_params(lowered.host))


def test_reserved_colours_and_names_declared_twice_are_refused() -> None:
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    program, _ = split_modules(lowered.module)
    send = next(op for op in program.walk() if isinstance(op, csl.GetFabDsdOp))
    send.fabric_color = type(send.fabric_color)(22, send.fabric_color.type)
    with pytest.raises(PassError, match="colour 22 .* reserved by memcpy on WSE-2"):
        static_check(lowered.module, params=layout_params(lowered.host))
    check_scopes(
        "fn f() void {\n  const a : i32 = 1;\n  if (a > 0) {\n    const b : i32 = 2;\n  }\n  const b : i32 = 3;\n}\n"
    )
    with pytest.raises(PassError, match="'a' is declared twice in one scope"):
        check_scopes("fn f() void {\n  const a : i32 = 1;\n  if (a > 0) {\n    const a : i32 = 2;\n  }\n}\n")


def test_memory_per_element_is_enforced() -> None:
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    with pytest.raises(FabricError, match=r"element \(0, 0\).* bytes of arrays and .* of code, over its 16384 bytes"):
        Fabric(lowered.module, layout_params(lowered.host), memory=16384)


def _up(n: int, d: int) -> int:
    return -(-n // d)


@pytest.mark.parametrize(
    ("p", "copies"),
    [
        (4, 2),  # each KV head cached twice: a row's KV chunk is one whole head (a one-row segment)
        (6, 1),  # narrow: a row's KV chunk (6 features) does not divide head_dim (16)
        (8, 1),  # narrow: a KV head spans 4 rows, so a column is 2 segments of 4
    ],
)
def test_wavelets_per_step_are_the_mappings(p: int, copies: int) -> None:
    """The wavelets the simulated fabric delivers in one step are those docs/spatial.md's mapping sends, counted here
    from the model's sizes, the grid P and the KV copies alone:

    - a vector of n features is cut in chunks of ceil(n / P) per element; the cached KV features (KV heads x copies x
      head_dim) in chunks kc, rounded up to even (whole rotary pairs); a row holds the kc features and, for each of
      the `group` query heads reading one KV copy (heads / (KV heads x copies)), a query chunk at the same dimensions;
    - an all-reduce of n words along the P lines of a P x P grid delivers P (P - 1) n wavelets as it reduces (every
      element of a line but the one it ends on hears once, within its segment or between centres) and as many on
      its broadcast. A step all-reduces the embedding's row (a hidden chunk, down the column), and per layer: the
      norm's sum of squares (1 word), q, k and v as one message (a query chunk and two KV chunks), softmax's
      maximum and its sums (a word each for each head whose queries the row holds: the `window`), the weighted
      values (a query chunk), the output projection (a hidden chunk), the MLP's norm (1), gate and up as one
      message (two intermediate chunks) and down (a hidden chunk); then the final norm (1). The head reduces its
      logits (a vocabulary chunk) along the row with no broadcast;
    - attention's scores, one per head and cached slot (position t on column t mod P, slot t div P): when kc divides
      head_dim, a KV copy spans head_dim / kc whole rows and, when those are at least two, the column is cut into
      segments of them: the window's heads' scores are reduced within each segment and sent back from its centre
      (P - segments wavelets a column each way), then a second segment reduction gives every row of the segment
      the window's exponentials with each head's sum of weights; otherwise every head's scores go down the whole
      column and back.
    """
    spec = MODELS["gqa"]
    ctx = 16
    store = RandomWeights(spec, seed=7)
    from logos_ir.testing import lower_decode

    lowered = lower_decode(spec, ctx, "f32", p, copies=copies)
    assert lowered.host["grid"] == [p, p] and lowered.host["kv_copies"] == copies
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    machine.step(4, 1)

    hidden, intermediate, vocab = _up(spec.hidden, p), _up(spec.intermediate, p), _up(spec.vocab, p)
    kc = _up(spec.kv_heads * copies * spec.head_dim, p)
    kc += kc % 2
    group = spec.heads // (spec.kv_heads * copies)
    query = group * kc
    kv_heads_a_row_touches = 1 if spec.head_dim % kc == 0 else _up(kc, spec.head_dim) + 1
    window = min(spec.heads, group * kv_heads_a_row_touches)
    layer = 1 + (query + 2 * kc) + 2 * window + query + hidden + 1 + 2 * intermediate + hidden
    all_reduced = hidden + spec.layers * layer + 1
    slots = _up(ctx, p)
    rows_a_kv_head = spec.head_dim // kc if spec.head_dim % kc == 0 else 0
    if rows_a_kv_head >= 2:
        segments = _up(p, rows_a_kv_head)
        exponentials_and_sums = window * slots + window
        scores = spec.layers * (window * slots + exponentials_and_sums) * (p - segments)
    else:
        scores = spec.layers * spec.heads * slots * (p - 1)
    expected = 2 * p * (p - 1) * all_reduced + 2 * p * scores + p * (p - 1) * vocab
    assert machine.fabric.wavelets == expected


def test_cycles_are_counted_from_the_op_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's cycles come from the simulator's per-op costs: a dearer math call makes a dearer step."""
    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered(store)
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    machine.step(4, 1)
    monkeypatch.setitem(CYCLES, "math", CYCLES["math"] * 2)
    machine.step(5, 2)
    assert machine.cycles[1] > machine.cycles[0] * 1.05


def _teacher_forced(store: WeightStore, image: str, tokens: list[int], ctx: int) -> float:
    reference = Generator(store, ctx=ctx).program(Cut.decode(ctx))
    names = {kind: name for name, kind in reference.inputs.items()}
    machine = SpatialGenerator(store, image=image).machine(ctx)
    machine.reset()
    agree = 0
    for position, token in enumerate(tokens[:-1], start=1):
        run = {names["token"]: np.array([token + 1]), names["position"]: np.array([position])}
        expected = int(reference.run(**run)[0])
        agree += machine.step(token + 1, position) == expected
    return agree / (len(tokens) - 1)


def test_f16_teacher_forced_agreement_tiny() -> None:
    store = RandomWeights(MODELS["gqa"], seed=3)
    tokens = PROMPT + Generator(store).generate(PROMPT, 8)
    assert _teacher_forced(store, "f16", tokens, 16) >= 0.9


def test_backend_refuses_what_it_does_not_run() -> None:
    store = RandomWeights(MODELS["gqa"], seed=0)
    with pytest.raises(Exception, match="no --emulate mode"):
        spatial_generator(RunRequest(store, emulate=True))
    with pytest.raises(Exception, match="one grid"):
        spatial_generator(RunRequest(store, tp=2))
    with pytest.raises(Exception, match="f16 or f32"):
        SpatialGenerator(store, image="bf16")


@pytest.mark.parametrize("arch", ["wse2", "wse3"])
def test_logos_run_from_a_build_folder(tmp_path: Path, arch: str) -> None:
    """`logos-compile --target spatial` then `logos-run` on the folder: the reference backend's tokens, from the
    folder's csl modules (on a WSE-3's, with its queue bindings and colour parameters read back from grid.mlir)."""
    build = tmp_path / "tiny"
    compile_command = [sys.executable, "-m", "logos_ir.tools.logos_compile", "--model", "tiny", "--target", "spatial"]
    done = subprocess.run(
        [*compile_command, "--weights", "f32", "--cut", "decode ctx=16", "--option", f"arch={arch}", "-o", str(build)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    run = [sys.executable, "-m", "logos_ir.tools.logos_run", "--prompt-ids", "3,17,42", "--max-new-tokens", "4"]
    spatial = subprocess.run([*run, str(build)], capture_output=True, text=True, timeout=300)
    assert spatial.returncode == 0, spatial.stderr
    reference = subprocess.run([*run, "--model", "tiny"], capture_output=True, text=True, timeout=300)
    assert spatial.stdout.split()[0] == reference.stdout.split()[0]


@pytest.mark.parametrize("grid", [5, 7, (3, 8), (8, 3), (18, 4)])
def test_grids_of_other_sizes(grid: int | tuple[int, int]) -> None:
    """An odd grid (its centres, its halves of unequal parity), chunks that are not even (a product's tile as wide
    as its input's chunk) and rectangles (a `col` vector cut over the width, a `row` one over the height, positions
    cached over the width; 18 columns: two segments a row, one a column) give the same tokens."""
    from logos_ir.testing import lower_decode

    store = RandomWeights(MODELS["gqa"], seed=2)
    lowered = lower_decode(store.spec, 16, "f32", grid)
    width, height = (grid, grid) if isinstance(grid, int) else grid
    assert lowered.host["grid"] == [width, height] and lowered.plan.slots == -(-16 // width)
    assert _run(lowered.module, lowered.host, store, 3) == Generator(store).generate(PROMPT, 3)


def test_lines_of_several_segments() -> None:
    """A grid of 18 has two segments a line (about sqrt(P / 4), docs/spatial.md's reductions), each reduced to its
    centre, the centres then to the line's, by one function a kind of reduction: the reference's tokens."""
    from logos_ir.passes.spatial import grid as g
    from logos_ir.testing import lower_decode

    assert g.segments(18)[1] == 2
    store = RandomWeights(MODELS["gqa"], seed=2)
    lowered = lower_decode(store.spec, 16, "f32", 18)
    assert _run(lowered.module, lowered.host, store, 2) == Generator(store).generate(PROMPT, 2)


def test_the_schedule_and_the_short_way_change_nothing() -> None:
    """Which waiting elements the simulator advances first (the lowest instruction or the highest), and whether DSD
    ops with a fabric operand take the shorter way or the op with every check, change no token, logit, cycle or
    wavelet: each element's clock counts its own ops and the arrival of each wavelet it reads."""
    from logos_ir.testing import lower_decode

    store = RandomWeights(MODELS["gqa"], seed=5)
    lowered = lower_decode(store.spec, 16, "f16", 5)
    runs = []
    for schedule, fast in (("lowest", True), ("highest", True), ("lowest", False)):
        machine = GridMachine(lowered.module, lowered.host, store)
        machine.fabric.schedule, machine.fabric.fast = schedule, fast
        machine.reset()
        tokens = [machine.step(token, position) for position, token in enumerate([4, 9, 13], start=1)]
        assert machine.logits is not None
        runs.append((tokens, machine.cycles, machine.fabric.wavelets, machine.logits.copy()))
    for tokens, cycles, wavelets, logits in runs[1:]:
        assert tokens == runs[0][0] and cycles == runs[0][1] and wavelets == runs[0][2]
        np.testing.assert_array_equal(logits, runs[0][3])
    assert Fabric.schedule == "lowest" and Fabric.fast


def _lowered_wse3(spec: ModelSpec, p: int = 0):  # type: ignore[no-untyped-def]
    """The decode step of `spec` (ctx 16, f32) lowered for a WSE-3."""
    from logos_ir.testing import lower_decode

    return lower_decode(spec, 16, "f32", p, arch="wse3")


@pytest.mark.parametrize(("name", "p"), [("gqa", 0), ("ragged_widths", 0), ("gqa", 7)])
def test_wse3_tokens_match_reference(name: str, p: int) -> None:
    """Built for a WSE-3 (one segment a line, every queue bound to one colour on each element), the simulator,
    holding each element to its queues' bindings, gives the reference's greedy tokens."""
    store = RandomWeights(MODELS[name], seed=7)
    lowered = _lowered_wse3(store.spec, p)
    assert lowered.host["arch"] == "wse3"
    machine = GridMachine(lowered.module, lowered.host, store)
    assert len(machine.fabric.queue_binding) == 12  # 6 input and 6 output queues, each bound
    assert _run(lowered.module, lowered.host, store, 4) == Generator(store).generate(PROMPT, 4)


def test_wse3_wavelets_on_a_colour_no_queue_takes_fault() -> None:
    """A layout whose chain colour parameter is the wrong one of its pair: the element's neighbour sends on the
    colour its queue is not bound to, and the simulator faults there, naming the element and colour, rather than
    delivering; a queue's literal binding changed faults at the DSD op that uses it, and so does a DSD printed with
    the other chain's colour parameter."""
    from xdsl.dialects.builtin import IntAttr, StringAttr

    store = RandomWeights(MODELS["gqa"], seed=7)
    lowered = _lowered_wse3(store.spec, 7)
    module = lowered.module.clone()
    _, layout = split_modules(module)
    struct = next(op for op in layout.walk() if isinstance(op, csl.ConstStructOp) and len(op.operands) > 3)
    names = [f.data for f in struct.ssa_fields.data]  # type: ignore[union-attr]
    struct.operands[names.index("row_west_in")] = struct.operands[names.index("row_west_out")]
    with pytest.raises(FabricError, match=r"element \(\d, \d\) receives wavelets on colour [01], and binds no input"):
        _run(module, lowered.host, store, 1)
    module = lowered.module.clone()
    program, _ = split_modules(module)
    broadcast = next(
        op
        for op in program.walk()
        if isinstance(op, csl_ext.InitializeQueueOp) and op.colour is not None and op.inbound and op.colour.data == 8
    )
    broadcast.colour = IntAttr(9)
    with pytest.raises(FabricError, match=r"runs @fmovs on colour 8 through input queue 4, which it binds to colour 9"):
        _run(module, lowered.host, store, 1)
    module = lowered.module.clone()
    program, _ = split_modules(module)
    receive = next(op for op in program.walk() if csl_ext.colour_param(op) == "row_west_in")
    receive.attributes[csl_ext.COLOUR_PARAM] = StringAttr("row_east_in")  # printed as the eastern chain's colour
    with pytest.raises(FabricError, match=r"whose colour parameter is [23] there, where the op's colour is [01]"):
        _run(module, lowered.host, store, 1)
