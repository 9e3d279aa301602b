"""The CUDA lane's host runtime, run by the suite on the emulator device: the one code path a GPU run takes
(buffers, the work stream, graph capture and replay, NCCL-shaped all-reduces and the split head's all-gather) with
the emulator behind the device interface; a build folder's own step module and weight image; a split decode step as
two processes under `mpiexec`, all-reducing and all-gathering over MPI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from logos_ir.generate import Generator
from logos_ir.models import ModelSource
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda.devices import Emulator
from logos_ir.runtime.cuda.generator import cuda_generator
from logos_ir.runtime.cuda.ranks import NcclRanks
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights

PROMPT = [3, 17, 250, 9, 41, 77]


def test_the_host_runtime_captures_the_split_decode_step_once_and_replays_it() -> None:
    store = RandomWeights(ModelSpec.preset("tiny"), seed=5)
    reference = Generator(store, prefill_rows=4, tp=2)
    want = reference.generate(PROMPT, 5)
    lane = cuda_generator(RunRequest(store, None, 4, 2, "f32", emulate=True))
    assert lane.generate(PROMPT, 5) == want
    # the head split by vocabulary rows: each chip computes half the logits, the all-gather gives each the whole row
    logits, expected = lane._last.logits, reference._last.logits
    assert logits.shape == expected.shape == (store.spec.vocab,)
    assert np.allclose(logits, expected, rtol=1e-5, atol=1e-5)
    runtime = lane.runtime
    program = lane._last
    for arrays in program.chips:
        assert arrays["lm_head.weight"].shape == (store.spec.vocab // 2, store.spec.hidden)
        assert np.array_equal(arrays["logits"], program.chips[0]["logits"])
    assert [type(d) for d in runtime.devices] == [Emulator, Emulator]
    for device in runtime.devices:
        kinds = [kind for kind, _ in device.stream]
        first_launch = kinds.index("launch")
        # every weight, cache and table is on the device before the first launch, each weight uploaded once
        uploads = [name for kind, name in device.stream if kind == "upload"]
        assert len(uploads) == len(set(uploads)) and "rope.cos" in uploads and "chip" in uploads
        assert (
            kinds.index("alloc") < first_launch and max(i for i, k in enumerate(kinds) if k == "upload") < first_launch
        )
        # the decode step (the prompt goes through it: a split run has no prefill program) runs eagerly once, is
        # captured once with its all-reduces inside, then every later step replays the graph
        assert kinds.count("begin_capture") == kinds.count("end_capture") == 1
        captured = kinds.index("begin_capture")
        assert "all_reduce" in kinds[:captured] and kinds[:captured].count("all_gather") == 1  # the eager run
        assert kinds[captured + 1] == "end_capture"  # launches and collectives became graph nodes, not stream work
        assert kinds.count("graph_launch") == len(PROMPT) + 5 - 2
    graph_nodes = runtime.devices[0].stream[runtime.devices[0].stream.index(("begin_capture", "")) + 1][1]
    layers = store.spec.layers
    # 6 launches a layer (attention's merge its own), embed + head + 2 arg-max, 2 all-reduces a layer, the all-gather
    assert graph_nodes == f"{6 * layers + 4 + 2 * layers + 1} nodes"


def test_a_tied_head_split_over_two_chips_gives_the_reference_tokens() -> None:
    """Tied embeddings: the embedding reads the whole table, the head its chip's rows of the same tensor (a buffer
    of its own, `<table>.<rows>x<hidden>`), each cut from the one weight."""
    from dataclasses import replace

    store = RandomWeights(replace(ModelSpec.preset("tiny"), tie_embeddings=True), seed=4)
    want = Generator(store, prefill_rows=4, tp=2).generate(PROMPT, 4)
    lane = cuda_generator(RunRequest(store, None, 4, 2, "f32", emulate=True))
    assert lane.generate(PROMPT, 4) == want
    table = "model.embed_tokens.weight"
    for chip, arrays in enumerate(lane._last.chips):
        rows = store.spec.vocab // 2
        assert arrays[table].shape == (store.spec.vocab, store.spec.hidden)
        assert np.array_equal(
            arrays[f"{table}.{rows}x{store.spec.hidden}"], store.get(table)[chip * rows : (chip + 1) * rows]
        )


def test_a_build_folder_runs_its_step_module_and_weight_image(tmp_path: Path) -> None:
    folder = tmp_path / "tiny-cuda"
    command = [
        sys.executable, "-m", "logos_ir.tools.logos_compile", "--model", "tiny", "--model-seed", "7", "--target",
        "cuda", "--cut", "decode ctx=32", "--weights", "f32", "--with-weights", "-o", str(folder),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    built = ModelSource.resolve("tiny", seed=7).store()
    want = Generator(built, ctx=32, prefill_rows=1).generate(PROMPT, 4)
    other = RandomWeights(ModelSpec.preset("tiny"), seed=8)  # the run reads the weights from the build's image
    lane = cuda_generator(RunRequest(other, None, 16, 1, "f32", emulate=True, build=folder))
    assert lane.generate(PROMPT, 4) == want
    assert [i.line() for i in lane.identities] == [(folder / "step.mlir").read_text().splitlines()[0][3:]]


MPI_STEP = """
import hashlib, json, sys
from logos_ir.runtime import RunRequest
from logos_ir.runtime.cuda.generator import cuda_generator
from logos_ir.spec import ModelSpec
from logos_ir.weights import RandomWeights
from mpi4py import MPI
lane = cuda_generator(RunRequest(RandomWeights(ModelSpec.preset("tiny"), seed=6), None, 4, 2, "f32", emulate=True))
tokens = lane.generate(PROMPT, 5)
gathers = sum(kind == "all_gather" for kind, _ in lane.runtime.devices[0].stream)
print(json.dumps({"rank": MPI.COMM_WORLD.Get_rank(), "tokens": tokens, "devices": len(lane.runtime.devices),
                  "ranks": type(lane.runtime.ranks).__name__, "gathers": gathers,
                  "logits": hashlib.sha256(lane._last.logits.tobytes()).hexdigest()}))
""".replace("PROMPT", str(PROMPT))


def _mpi_missing() -> str | None:
    if shutil.which("mpiexec") is None:
        return "mpiexec is not installed (pip install 'logos-ir[mpi]')"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'logos-ir[mpi]')"
    return None


@pytest.mark.skipif(_mpi_missing() is not None, reason=str(_mpi_missing()))
def test_a_split_decode_step_runs_as_two_processes_under_mpiexec() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_"))}
    done = subprocess.run(
        ["mpiexec", "-n", "2", sys.executable, "-c", MPI_STEP], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reports = re.findall(r"\{[^{}]*\}", done.stdout)  # the two processes' lines may interleave
    ranks = sorted((json.loads(report) for report in reports), key=lambda r: r["rank"])
    want = Generator(RandomWeights(ModelSpec.preset("tiny"), seed=6), prefill_rows=4, tp=2).generate(PROMPT, 5)
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:  # each process one chip, all-reducing over MPI, both with the reference's tokens
        assert rank["devices"] == 1 and rank["ranks"] == "MpiRanks"
        assert rank["tokens"] == want
        assert rank["gathers"] == 1  # the head's logits gathered over MPI in the eager step (then in the graph)
    assert ranks[0]["logits"] == ranks[1]["logits"]  # every rank holds the whole row: the same arg-max, sampler


class _DeviceArray(np.ndarray):
    """A numpy array standing in for a cupy one: `data.ptr` names it to the fake NCCL below."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return SimpleNamespace(ptr=id(self))


@pytest.mark.parametrize("rows", [1, 3])
def test_nccl_all_gather_lays_each_ranks_logits_side_by_side(rows: int) -> None:
    """`NcclRanks.all_gather` as NCCL runs it, with numpy standing in for cupy and a communicator that, as
    ncclAllGather does, writes every rank's send buffer rank-major into the receive buffer: one row of logits lands
    in the whole buffer itself; several rows go through the staging buffer and the copy that lays them side by side;
    everything on the work stream."""
    world, share = 3, 4
    shares = [np.arange(rows * share, dtype=np.float32).reshape(rows, share).view(_DeviceArray) + 100 * r for r in
              range(world)]  # fmt: skip
    arrays: dict[int, np.ndarray] = {}
    streams: list[Any] = []

    class Stream:
        ptr = 7

        def __enter__(self) -> Stream:
            streams.append(self)
            return self

        def __exit__(self, *exc: Any) -> None:
            pass

    def empty(shape: Any, dtype: Any) -> np.ndarray:
        array = np.zeros(shape, dtype).view(_DeviceArray)
        arrays[id(array)] = array
        return array

    class Communicator:
        def allGather(self, send: int, recv: int, count: int, kind: int, stream: int) -> None:  # noqa: N802
            assert stream == Stream.ptr and count == rows * share and send in arrays
            arrays[recv].reshape(world, count)[...] = np.stack([s.reshape(-1) for s in shares])

    outs = []
    for rank in range(world):
        device = SimpleNamespace(stream=Stream(), cp=SimpleNamespace(empty=empty, moveaxis=np.moveaxis))
        device.collective = lambda name, work, kind, device=device: work()
        ranks = object.__new__(NcclRanks)
        ranks.nccl, ranks.world, ranks.staging = SimpleNamespace(NCCL_FLOAT32=7), world, {}
        ranks.communicator = Communicator()
        out = empty((rows, world * share), np.float32)
        arrays[id(shares[rank])] = shares[rank]
        ranks.all_gather("logits", [(device, shares[rank], out)], 1)
        assert bool(ranks.staging) == (rows > 1)  # one row is gathered in place
        outs.append(out)
    for out in outs:
        assert np.array_equal(out, np.concatenate(shares, axis=1))


@pytest.mark.parametrize(("variable", "rank"), [("PMI_RANK", "0"), ("PMI_RANK", "1"), ("OMPI_COMM_WORLD_RANK", "1")])
def test_logos_run_prints_from_rank_0_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, rank: str
) -> None:
    """Under an MPI launcher every rank runs the same loop: rank 0 alone prints the answer and the timing line (the
    launcher's rank variable, here set by hand on the reference backend, which starts no ranks itself)."""
    from logos_ir.tools import logos_run

    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, rank)
    assert logos_run.main(["--model", "tiny", "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    assert (out != "" and "tokens/s" in err) if rank == "0" else (out == "" and err == "")
    assert logos_run.main(["--model", "tiny", "--prompt-ids", "999"]) == 1  # errors from every rank
    assert "--prompt-ids" in capsys.readouterr().err


def test_a_bf16_prefill_chunk_allocates_no_scratch_its_fused_attention_does_not_use() -> None:
    """The fused tensor-core flash attention (one launch) takes over the split attention's scratch: the plan keeps
    only buffers some step reads or writes, so the runtime allocates neither `attention.partial` nor
    `attention.count` for a bf16 prefill chunk (the f32 chunk's split attention and its merge use the partials;
    no launch counts, so `attention.count` is never allocated)."""
    from logos_ir.program import Cut
    from logos_ir.runtime.cuda.artifacts import build_program

    spec = ModelSpec.preset("tiny")
    for weights, scratch in (("bf16", set()), ("f32", {"attention.partial"})):
        plan = build_program(spec, Cut.parse("prefill rows=16 ctx=64"), 1, weights)[0]
        assert {name for name in plan.buffers if name.startswith("attention.")} == scratch
        used = {name for launch in plan.launches for name in launch.buffers}
        assert set(plan.buffers) == used
