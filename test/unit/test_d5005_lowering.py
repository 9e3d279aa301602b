"""convert-logos-to-d5005 and the d5005 build: placement over the four banks, buffers, refusals, the cost model,
and the shape of the build (routines shared by every layer, no weight read, seconds for 8B)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp

from logos_ir.author import written, written_split
from logos_ir.build import BuildRequest
from logos_ir.dialects import d5005
from logos_ir.errors import PassError
from logos_ir.models import ModelSource
from logos_ir.parser import parse_program
from logos_ir.passes.d5005.build import build_d5005
from logos_ir.passes.d5005.convert_logos_to_d5005 import ConvertLogosToD5005
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec
from logos_ir.testing import lower_program


def logos_program(spec: ModelSpec, cut: Cut):  # noqa: ANN201
    text, _ = written(spec, cut)
    return parse_program(text.text, f"<{cut.option()}>")


def request(name: str, ctx: int, weights: str = "bf16") -> BuildRequest:
    spec = ModelSpec.preset(name)
    source = ModelSource("preset", name, spec)
    return BuildRequest(source, Cut.decode(ctx), 1, weights, False, Progress.silent())


def test_every_matvec_streams_from_all_four_banks_and_regions_align() -> None:
    program = lower_program(logos_program(ModelSpec.preset("smollm2-135m"), Cut.decode(256)), "bf16")
    regions = {}
    for op in program.instructions():
        for region in op.regions_read():
            assert region.offset.data % 64 == 0 and region.stride.data % 64 == 0
            regions[region.tensor.data] = region
        if isinstance(op, d5005.MatvecOp):
            rows = op.weight.rows.data
            assert rows >= 4 and op.weight.rows_per_bank == -(-rows // 4)  # every bank holds a quarter of the rows
    spans = sorted((r.offset.data, r.end) for r in regions.values())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))  # no two overlap
    tied = [op for op in program.instructions() if isinstance(op, d5005.MatvecOp)][-1]
    assert tied.weight.tensor.data == "model.embed_tokens.weight"  # a tied head streams the embedding's region


def test_no_instruction_writes_a_buffer_it_reads_and_buffers_serve_every_layer() -> None:
    spec = ModelSpec.preset("tiny")
    two = lower_program(logos_program(spec, Cut.decode(64)), "f32")
    for op in two.instructions():
        uses = [name for name, _ in op.buffer_uses()]
        if len(uses) > 1:
            assert uses[0] not in uses[1:], op
    deeper = lower_program(logos_program(replace(spec, layers=6), Cut.decode(64)), "f32")
    assert [str(b) for b in deeper.buffers()] == [str(b) for b in two.buffers()]


def test_each_buffer_lies_in_its_kinds_array_from_a_bank_word() -> None:
    """Tiny's buffers by kind, as the engine's routines reach them: the residual stream, the matvec's inputs, the
    attention's output, the matvecs' outputs and RoPE's; each at a whole number of bank words into its array, the
    buffers of one array never overlapping."""
    program = lower_program(logos_program(ModelSpec.preset("tiny"), Cut.decode(64)), "bf16")
    arrays = {b.label.data: b.array_name for b in program.buffers()}
    assert arrays == {
        **dict.fromkeys(["hidden", "mixed", "result"], "residual"),
        **dict.fromkeys(["normed", "normed_mixed", "product"], "inputs"),
        "attended": "attended",
        **dict.fromkeys(["query", "key", "value", "projected", "gate", "up", "down", "logits"], "outputs"),
        **dict.fromkeys(["turned_query", "turned_key"], "rotated"),
    }
    bank_word = program.params.burst_bytes // 4
    for array in set(arrays.values()):
        spans = sorted((b.offset.value.data, b.words.value.data) for b in program.buffers() if b.array_name == array)
        assert all(offset % bank_word == 0 for offset, _ in spans)
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:], strict=False)), array


def test_a_buffer_no_one_array_serves_is_refused_naming_both_routines() -> None:
    """A norm's output read as an add's left-hand side: the norm writes only `inputs`, the add reads its lhs only
    from `residual`, so no array has both ports."""
    from logos_ir.passes.d5005.convert_logos_to_d5005 import share_buffers

    table = d5005.RegionAttr("t", 0, 128, 16, 64, 2)
    weight = d5005.RegionAttr("w", 2048, 128, 1, 64, 2)
    x, n, s = (d5005.BufferOp(name, 64, 0) for name in ("x", "n", "s"))
    ops = [d5005.EmbedRowOp(x.buffer, table), d5005.RMSNormOp(n.buffer, x.buffer, weight, 1e-5)]
    ops.append(d5005.AddOp(s.buffer, n.buffer, x.buffer, 64))
    with pytest.raises(PassError, match=r"buffer 'n' is 'd5005.rms_norm' dst, in array inputs, and"
                       r" 'd5005.add' reaches its lhs only in residual: no on-chip array serves both"):  # fmt: skip
        share_buffers(ops, d5005.EngineParams())


def test_the_same_routines_serve_2_and_80_layers() -> None:
    spec = ModelSpec.preset("llama-3.2-1b")  # 80 layers of 70B's widths do not fit the card; 80 of 1B's do
    small, big = replace(spec, layers=2), replace(spec, layers=80)
    routines = []
    for s in (small, big):
        program = lower_program(logos_program(s, Cut.decode(64)), "bf16")
        routines.append(
            {(op.name, str([(d5005.label(b), n) for b, n in op.buffer_uses()])) for op in program.instructions()}
        )
    assert routines[0] == routines[1]


def test_an_8b_build_of_code_takes_seconds_and_reads_no_weight() -> None:
    built = request("llama-3.1-8b", 8192)
    started = time.perf_counter()
    lane = build_d5005(built)  # the preset's store is never opened: ModelSource.store() would make it
    assert time.perf_counter() - started < 20
    assert built.model._store is None
    cost = lane.report["cost_model"]
    low, high = cost["band_tokens_per_s"]
    assert cost["low"]["bytes_read_per_token"] > 15e9 and 0 < low < high < cost["roofline_tokens_per_s"]
    assert lane.summary[0].startswith("d5005 cost model")  # test_d5005_cost_model.py holds the model
    paths = {a.path for a in lane.artifacts}
    assert paths == {
        "program.logos",
        "decode.d5005.mlir",
        "instructions.bin",
        "instructions.txt",
        "layout.txt",
        "engine.cl",
        "compile.sh",
    }


def test_llama_70b_is_refused_as_not_fitting_with_the_sizes() -> None:
    with pytest.raises(PassError) as refusal:
        build_d5005(request("llama-3.1-70b", 8192))
    message = str(refusal.value)
    assert "convert-logos-to-d5005: the model does not fit the D5005's board memory" in message
    assert "weights 141.12 GB (bf16)" in message
    assert "KV caches at ctx 8192 2.68 GB" in message  # 80 layers x K, V x 8 heads x 8192 x 128 x 2 bytes
    assert "over the 34.36 GB (32 GiB)" in message


def test_an_8b_f32_model_with_a_long_cache_is_refused_too() -> None:
    build_d5005(request("llama-3.1-8b", 8192, "f32"))  # 32.12 GB of weights and 2.15 GB of caches: it fits
    with pytest.raises(
        PassError,
        match=r"(?s)weights 32\.12 GB \(f32\).*ctx 16384 4\.29 GB.*hint: a smaller model or a shorter ctx, or bf16",
    ):
        build_d5005(request("llama-3.1-8b", 16384, "f32"))


@pytest.mark.parametrize(
    ("cut", "words"),
    [
        (Cut.prefill(4, 64), "not 'prefill chunk of 4 rows, ctx 64'"),
        (Cut.decode_layer(0, 64), "not 'decode step's layer 0, ctx 64'"),
        (Cut.decode_head(), "not 'decode step's head'"),
        (Cut.batch(2, 64), "not 'batch of 2 sequences, ctx 64'"),
        (Cut.forward(), "not 'forward'"),
    ],
)
def test_other_cuts_are_refused_naming_them(cut: Cut, words: str) -> None:
    module = ModuleOp([logos_program(ModelSpec.preset("tiny"), cut)])
    before = str(module)
    with pytest.raises(PassError, match=f"convert-logos-to-d5005: the D5005 engine runs whole decode steps, {words}"):
        ConvertLogosToD5005("bf16").apply(Context(), module)
    assert str(module) == before


def test_a_split_program_and_unknown_weights_are_refused() -> None:
    text, _ = written_split(ModelSpec.preset("tiny"), Cut.decode(64), "", 2)
    module = ModuleOp([parse_program(text.text, "<split>")])
    with pytest.raises(PassError, match="one card: a program split over 2 chips"):
        ConvertLogosToD5005("bf16").apply(Context(), module)
    with pytest.raises(PassError, match="weights are bf16 or f32, not 'f16'"):
        lower_program(logos_program(ModelSpec.preset("tiny"), Cut.decode(64)), "f16")


def test_logits_over_the_on_chip_budget_are_refused() -> None:
    spec = replace(ModelSpec.preset("tiny"), vocab=1 << 21)
    refusal = (
        r"buffers in the on-chip array 'outputs' need \d+ words .* over its 524288 words of the engine's budget of"
    )
    with pytest.raises(PassError, match=refusal + " 1048576"):
        lower_program(logos_program(spec, Cut.decode(64)), "bf16")


def test_compile_sh_runs_with_only_the_vendor_tools(tmp_path) -> None:  # noqa: ANN001
    """The build's compile.sh needs Intel's aoc and nothing of this package: here aoc is a stub that records its
    arguments, and python or a logos tool, if the script called one, would fail."""
    import subprocess

    lane = build_d5005(request("tiny", 64))
    for artifact in lane.artifacts:
        (tmp_path / artifact.path).write_bytes(artifact.data)
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("python", "python3", "logos-run", "logos-compile", "logos-opt", "logos-author"):
        (tools / name).write_text("#!/bin/sh\nexit 97\n")
    (tools / "aoc").write_text('#!/bin/sh\necho "$@" > aoc.args\n')
    for stub in tools.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["sh", "compile.sh"], cwd=tmp_path, env=env, check=True, timeout=30)
    assert (tmp_path / "aoc.args").read_text().split() == [
        "-board=pac_s10_dc", "-fp-relaxed", "-no-interleaving=DDR", "-report", "engine.cl", "-o", "engine.aocx"
    ]  # fmt: skip
