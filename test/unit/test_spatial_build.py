"""`logos-compile --target spatial`: the build folder a Cerebras user would compile and run (layout.csl,
pe_program.csl, commands.sh, run.py) and what the simulator reads (grid.mlir, host.json); that it reads no weight
value; that the embedded model (ctx 2048) fits a WSE-2 (750 x 994 of its 757 x 996 elements, 48 KiB each, at the
high end of its memory band) with (nearly) every element holding a tile of every projection, and llama-3.1-8b (ctx
8192) does not; KV heads kept narrow give the reference's tokens; its refusals.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import arith, csl
from xdsl.dialects.builtin import FloatAttr, ModuleOp, StringAttr
from xdsl.ir import Operation

from logos_ir.build import BuildError, BuildRequest, check_artifact
from logos_ir.dialects import logos
from logos_ir.errors import PassError
from logos_ir.models import ModelSource
from logos_ir.passes.spatial.build import build_spatial
from logos_ir.program import Cut
from logos_ir.progress import Progress

WSE2_MEMORY = 48 * 1024


def _request(model: ModelSource, cut: str, weights: str = "f16", **options: str) -> BuildRequest:
    return BuildRequest(model, Cut.parse(cut), 1, weights, False, Progress.silent(), options)


def _no_weights(model: ModelSource, monkeypatch: pytest.MonkeyPatch) -> ModelSource:
    """The model, with its weights made unreadable: a build of code must not open them."""

    def refuse(self: ModelSource) -> None:
        raise AssertionError("a build of code read the weights")

    monkeypatch.setattr(ModelSource, "store", refuse)
    return model


def test_tiny_decode_build(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _no_weights(ModelSource.resolve("tiny"), monkeypatch)
    lane = build_spatial(_request(model, "decode ctx=64"))
    files = {a.path: a.data.decode() for a in lane.artifacts}
    assert sorted(files) == [
        "commands.sh",
        "compile_appliance.py",
        "grid.mlir",
        "host.json",
        "layout.csl",
        "pe_program.csl",
        "run.py",
        "run_appliance.py",
    ]
    for artifact in lane.artifacts:
        check_artifact(artifact)
    p = lane.report["grid"]["width"]
    assert lane.report["grid"]["height"] == p  # the tiny model fits a square
    command = files["commands.sh"]
    # the machine's fabric (WaferLLM's 757,996), or for the SDK's simulator one just larger than the program
    flags = ("--arch=wse2", "DIMS=757,996", f"DIMS={p + 7},{p + 2}", "--fabric-dims=$DIMS", "--fabric-offsets=4,1",
             f"--params=width:{p},height:{p}")  # fmt: skip
    for flag in (*flags, "--memcpy", "--channels=1"):
        assert flag in command
    assert "SdkRuntime" in files["run.py"] and "memcpy_h2d" in files["run.py"]
    # the token and position are the launch's arguments (csl-examples' `runner.launch("f_spmv", np.int16(zDim))`),
    # not copies to every element
    assert 'runner.launch("step", np.int32(token), np.int32(position), nonblock=False)' in files["run.py"]
    assert "token_in" not in files["run.py"] and '@export_name("step", fn(i32, i32) void);' in files["layout.csl"]
    layout, program = files["layout.csl"], files["pe_program.csl"]
    assert "@set_rectangle(width, height);" in layout and "@set_color_config(" in layout
    assert '@import_module("<memcpy/get_params>"' in layout and '@import_module("<memcpy/memcpy>"' in program
    for needed in ("@bind_local_task(", "@activate(", "@block(", "@unblock(", "unblock_cmd_stream()", "@fmachs(",
                   "fabin_dsd", "fabout_dsd"):  # fmt: skip
        assert needed in program, needed
    for reserved in ("@get_color(21)", "@get_color(22)", "@get_color(23)"):
        assert reserved not in program and reserved not in layout
    for text in (layout, program):  # CSL, as Zig, refuses a local that shadows a declaration of its container
        declared = set(re.findall(r"^(?:var|const) (\w+) :", text, re.M))
        assert not declared & _locals(text), sorted(declared & _locals(text))
    host = json.loads(files["host.json"])
    assert host["grid"] == [p, p] and host["logits"]["column"] == p // 2  # the row reductions end on the centre
    report = lane.report
    assert report["elements_used"] == _elements_given_code(layout, command)
    assert report["memory_per_element"]["band"]["high"] <= WSE2_MEMORY
    assert report["working_share_per_layer"] == 1.0
    assert len(report["regions"]) == model.spec.layers + 2
    json.dumps(report)


def _locals(text: str) -> set[str]:
    """The names a CSL text declares inside a block (a function's, a task's, a comptime's): parameters and
    indented `var`/`const`."""
    params = {name for group in re.findall(r"^(?:fn|task) \w+\(([^)]*)\)", text, re.M) for name in
              re.findall(r"(\w+) :", group)}  # fmt: skip
    return params | set(re.findall(r"^ +(?:var|const) (\w+) :", text, re.M))


def _elements_given_code(layout: str, command: str) -> int:
    """The elements the printed layout gives a program: its one `@set_tile_code` sits in a loop over the width and
    one over the height, which commands.sh gives cslc (`--params=width:W,height:H`)."""
    params = dict(pair.split(":") for pair in re.search(r"--params=(\S+)", command).group(1).split(","))  # type: ignore[union-attr]
    assert layout.count("@set_tile_code(") == 1
    tile = layout.index("@set_tile_code(")
    loops = re.findall(r"for\(@range\(i16, 0, (\w+), 1\)\)", layout[:tile])
    assert loops[-2:] == ["width", "height"]
    return int(params["width"]) * int(params["height"])


CSL_BYTES = {"f16": 2, "i16": 2, "u16": 2, "f32": 4, "i32": 4, "u32": 4}  # CSL's scalar types


def _printed_array_bytes(program: str) -> int:
    """The bytes of every array the printed element program declares (`var name : [N]type;`)."""
    arrays = re.findall(r"^var \w+ : \[(\d+)\](\w+);", program, re.M)
    assert arrays
    return sum(int(n) * CSL_BYTES[kind] for n, kind in arrays)


@pytest.mark.parametrize(
    ("name", "ctx", "square", "low", "mlp"),
    [(None, 2048, True, 0.95, 0.95), ("llama-3.1-8b", 8192, False, 0.5, 0.96)],
)
def test_models_fit_a_wse2(
    name: str | None, ctx: int, square: bool, low: float, mlp: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded model at 2048 positions and llama-3.1-8b at 8192, f16, each on one grid of a WSE-2 within 48 KiB
    per element at the high end of its memory band (its arrays, its code, the <math> routines, memcpy's component
    and a stack); the share of elements holding a tile of every projection of a layer, and of the MLP's. The grid is
    read from the build's commands.sh and layout (the elements given code), the arrays from the printed element
    program's declarations; the embedded model takes a square, the 8B (which no square of the WSE-2 holds at the
    band's high end) a rectangle of the usable fabric's full height."""
    model = _no_weights(ModelSource.resolve(name), monkeypatch)
    lane = build_spatial(_request(model, f"decode ctx={ctx}", "f16"))
    files = {a.path: a.data.decode() for a in lane.artifacts}
    report = lane.report
    command = files["commands.sh"]
    params = dict(pair.split(":") for pair in re.search(r"--params=(\S+)", command).group(1).split(","))  # type: ignore[union-attr]
    width, height = int(params["width"]), int(params["height"])
    fabric = re.search(r"^DIMS=(\d+),(\d+)$", command, re.M)
    assert fabric is not None and (int(fabric[1]), int(fabric[2])) == (757, 996)  # a WSE-2 (WaferLLM's compile.py)
    assert width <= 757 - 7 and height <= 996 - 2  # memcpy's 3 west and 2 east columns, a row above and below
    assert (width == height) == square
    if not square:
        assert height == 996 - 2  # the rectangle takes the machine's full height
    assert width * height == _elements_given_code(files["layout.csl"], command) == report["elements_used"]
    assert json.loads(files["host.json"])["grid"] == [width, height]
    memory = report["memory_per_element"]
    arrays = _printed_array_bytes(files["pe_program.csl"])
    assert memory["arrays"] == arrays
    assert arrays + memory["code"] < memory["band"]["low"] < memory["band"]["high"] <= WSE2_MEMORY
    assert report["working_share_per_layer"] >= low
    shares = report["working_share_per_layer_projection"]
    assert min(shares["gate_weight"], shares["up_weight"], shares["down_weight"]) >= mlp


@pytest.mark.parametrize(
    ("shape", "copies"),
    [
        (dict(heads=4, kv_heads=2, head_dim=16), 1),  # GQA, KV heads narrow
        (dict(heads=4, kv_heads=1, head_dim=16), 2),  # MQA, the KV head cached twice (two query heads a copy)
        (dict(vocab=300, hidden=40, heads=5, kv_heads=1, head_dim=8, intermediate=100, layers=3), 1),  # ragged
    ],
)
def test_narrow_kv_heads_give_the_reference_tokens(shape: dict, copies: int) -> None:
    """Each query head of a group reads the same cached K/V tile (`grid.query_rows`): the fabric simulator running
    the narrow-KV module gives the reference's greedy tokens (f32). The lane widens the cache only as far as memory
    allows (most copies that fit); tiny models fit widened, so narrow is forced here."""
    from logos_ir.generate import Generator
    from logos_ir.runtime.spatial.host import GridMachine
    from logos_ir.spec import ModelSpec
    from logos_ir.testing import lower_decode
    from logos_ir.weights import RandomWeights

    sizes: dict = dict(vocab=256, hidden=64, layers=2, intermediate=128, rms_eps=1e-5, rope_theta=10000.0,
                       tie_embeddings=False)  # fmt: skip
    store = RandomWeights(ModelSpec(**{**sizes, **shape}), seed=7)
    prompt, new = [3, 17, 42], 5
    expected = Generator(store).generate(prompt, new)
    lowered = lower_decode(store.spec, 16, "f32", copies=copies)
    assert lowered.plan.kv_copies == copies and lowered.host["kv_copies"] == copies
    machine = GridMachine(lowered.module, lowered.host, store)
    machine.reset()
    out: list[int] = []
    for position in range(1, len(prompt) + new):
        token = prompt[position - 1] if position <= len(prompt) else out[-1]
        predicted = machine.step(token + 1, position) - 1
        if position >= len(prompt):
            out.append(predicted)
    assert out == expected


def test_refusals() -> None:
    tiny = ModelSource.resolve("tiny")
    with pytest.raises(BuildError, match="a whole decode step"):
        build_spatial(_request(tiny, "prefill rows=4 ctx=64"))
    with pytest.raises(BuildError, match="no option colour"):
        build_spatial(_request(tiny, "decode ctx=64", colour="3"))
    with pytest.raises(BuildError, match="f16 or f32"):
        build_spatial(_request(tiny, "decode ctx=64", "bf16"))
    with pytest.raises(BuildError, match=r"builds for wse2 or wse3 \(--option arch=\), not 'wse4'"):
        build_spatial(_request(tiny, "decode ctx=64", arch="wse4"))
    with pytest.raises(PassError, match=r"751 x 751 is more than a wse2 gives a program: 750 x 994 of its 757 x 996"):
        build_spatial(_request(tiny, "decode ctx=64", grid="751"))
    with pytest.raises(PassError, match=r"751 x 994 is more than a wse2 gives a program: 750 x 994 of its 757 x 996"):
        build_spatial(_request(tiny, "decode ctx=64", grid="751x994"))
    with pytest.raises(BuildError, match=r"option grid is P or WxH in whole numbers, not '3x3x3'"):
        build_spatial(_request(tiny, "decode ctx=64", grid="3x3x3"))
    # llama-3.1-8b at ctx 8192, f16, on the largest square a WSE-2 gives (750 x 750): its arrays alone are about
    # 43 KiB an element, and with its code, <math> routines, memcpy's component and a stack the band's high end is
    # past the 48 KiB (docs/spatial.md, "Memory"); the lane's own choice is a rectangle (test_models_fit_a_wse2)
    with pytest.raises(PassError, match=r"does not fit a 750 x 750 grid of 49152-byte elements \((\d+) bytes per ele"):
        build_spatial(_request(ModelSource.resolve("llama-3.1-8b"), "decode ctx=8192", grid="750"))


def _verified_decode(ctx: int) -> ModuleOp:
    """The tiny model's decode step as the author writes it, parsed and through verify-identity (the edits below come
    after the identity check, as a user's or a pass's would)."""
    from logos_ir.author import written
    from logos_ir.parser import parse_program
    from logos_ir.passes.verify_identity import VerifyIdentity

    authored, _ = written(ModelSource.resolve("tiny").spec, Cut.decode(ctx))
    module = ModuleOp([parse_program(authored.text, f"<decode ctx={ctx}>")])
    VerifyIdentity().apply(Context(), module)
    return module


def _float_constants(function: Operation) -> set[float]:
    return {
        op.value.value.data
        for op in function.walk()
        if isinstance(op, arith.ConstantOp) and isinstance(op.value, FloatAttr)
    }


def test_the_lane_lowers_the_module_it_is_given() -> None:
    """Edits made after verify-identity (the head's norm epsilon, a weight's tensor in layer 1) are what the rest of
    the lane's pipeline (extract-parts, csl-fuse-products, convert-logos-to-csl) lowers: the epsilon is the constant
    the head's element code adds, and the host loads the renamed tensor into the down projection's array for layer 1."""
    from logos_ir.passes.extract_parts import ExtractParts
    from logos_ir.passes.spatial.convert_logos_to_csl import lower_module
    from logos_ir.passes.spatial.fuse_products import CslFuseProducts

    module = _verified_decode(16)
    epsilon, renamed = 2.0**-9, "edited.layer_one.down"
    norms = [op for op in module.walk() if isinstance(op, logos.RMSNormOp)]
    authored_epsilon = np.float32(norms[0].epsilon.value.data)
    norms[-1].epsilon = FloatAttr(epsilon, norms[-1].epsilon.type)  # the head's final norm
    down = [
        op for op in module.walk() if isinstance(op, logos.WeightOp) and op.tensor.data.endswith("down_proj.weight")
    ]
    layer_zero_tensor = down[0].tensor.data
    down[1].tensor = StringAttr(renamed)
    ExtractParts().apply(Context(), module)
    CslFuseProducts().apply(Context(), module)
    lowered = lower_module(module, "f32", 5)
    program = next(
        op for op in lowered.module.ops if isinstance(op, csl.CslModuleOp) and op.sym_name.data == "pe_program"
    )
    functions = {op.sym_name.data: op for op in program.body.block.ops if isinstance(op, csl.FuncOp)}
    assert epsilon in _float_constants(functions["head"]) and authored_epsilon not in _float_constants(
        functions["head"]
    )
    assert np.float32(authored_epsilon) in {np.float32(v) for v in _float_constants(functions["layer"])}
    assert lowered.host["weights"]["down_weight"]["tensors"] == [layer_zero_tensor, renamed]


def test_layers_written_differently_are_refused() -> None:
    """Every layer runs the one layer function, so an edit to one layer's ops (its norm's epsilon) is refused by name,
    not lowered as layer 0's."""
    from logos_ir.passes.extract_parts import ExtractParts
    from logos_ir.passes.spatial.convert_logos_to_csl import lower_module
    from logos_ir.passes.spatial.fuse_products import CslFuseProducts

    module = _verified_decode(16)
    norms = [op for op in module.walk() if isinstance(op, logos.RMSNormOp)]
    norms[2].epsilon = FloatAttr(2.0**-9, norms[2].epsilon.type)  # layer 1's attention norm
    ExtractParts().apply(Context(), module)
    CslFuseProducts().apply(Context(), module)
    with pytest.raises(PassError, match="decode_layer layer=1 ctx=16 is not written as layer 0 is"):
        lower_module(module, "f32", 5)


def test_run_py_runs_without_logos_ir(tmp_path: Path) -> None:
    """The build folder's run.py needs Python, numpy and the Cerebras SDK, not logos-ir: run where logos-ir cannot be
    imported (no site-packages, numpy alone on the path), it parses its arguments, reads a safetensors folder and
    tiles every weight to the words its array holds on an element (`--check`); past that it needs the SDK, absent
    here, and says so."""
    from logos_ir.weights import save_model

    model = ModelSource.resolve("tiny")
    lane = build_spatial(_request(model, "decode ctx=64", "f32"))
    build = tmp_path / "build"
    build.mkdir()
    for artifact in lane.artifacts:
        (build / artifact.path).write_bytes(artifact.data)
    save_model(model.store(), tmp_path / "weights")
    sandbox = tmp_path / "sandbox"  # numpy, and nothing else of site-packages
    sandbox.mkdir()
    numpy_dir = Path(np.__file__).parent
    for package in (numpy_dir, numpy_dir.parent / "numpy.libs"):
        if package.exists():
            (sandbox / package.name).symlink_to(package)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(sandbox)}

    def run(*args: str, isolated: bool = False) -> subprocess.CompletedProcess[str]:
        flags = ["-I", "-S"] if isolated else ["-S"]
        command = [sys.executable, *flags, *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    assert run("-c", "import logos_ir").returncode != 0  # the sandbox has no logos-ir
    usage = run(str(build / "run.py"), "--help", isolated=True)
    assert usage.returncode == 0 and "--weights" in usage.stdout
    checked = run(str(build / "run.py"), "--weights", str(tmp_path / "weights"), "--check")
    assert checked.returncode == 0, checked.stderr
    host = json.loads((build / "host.json").read_text())
    words = dict(line.split(": ") for line in checked.stdout.splitlines())
    expected = [*host["weights"], *host["rope_tables"]]
    assert sorted(words) == sorted(expected)
    for name in expected:
        assert words[name].startswith(f"{host['arrays'][name][0]} words on each of ")
    no_sdk = run(str(build / "run.py"), "--weights", str(tmp_path / "weights"))
    assert no_sdk.returncode != 0 and "the Cerebras SDK is not installed" in no_sdk.stderr
    # the appliance-mode scripts (cerebras.sdk.client's SdkCompiler and SdkRuntime), beside run.py: no script of the
    # folder imports logos-ir, each runs its --help where logos-ir is not importable, and says the SDK is missing
    scripts = sorted(path.name for path in build.glob("*.py"))
    assert scripts == ["compile_appliance.py", "run.py", "run_appliance.py"]
    for script in scripts:
        tree = ast.parse((build / script).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(name.split(".")[0] == "logos_ir" for name in imported), script
    assert "cerebras.sdk.client" in imported  # run_appliance.py's SdkRuntime
    for script in ("compile_appliance.py", "run_appliance.py"):
        assert run(str(build / script), "--help", isolated=True).returncode == 0, script
    no_client = run(str(build / "run_appliance.py"), "--weights", str(tmp_path / "weights"))
    assert no_client.returncode != 0 and "appliance client is not installed" in no_client.stderr
    assert "appliance client is not installed" in run(str(build / "compile_appliance.py")).stderr


@pytest.mark.parametrize(("name", "ctx"), [("tiny", 64), (None, 2048)])
def test_builds_for_a_wse3(name: str | None, ctx: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model and the embedded model (SmolLM2, ctx 2048, f16) build for a WSE-3: the build runs the static
    check with its layout's parameters (every element's queue bindings against the DSDs it reaches and the colours
    its router delivers), the program binds all 12 queues memcpy leaves (2 to 7, in and out) with @initialize_queue,
    each to one colour (a broadcast's, or the element's chain colour parameter), and names no queue it has not
    bound; commands.sh compiles for the WSE-3's fabric."""
    model = _no_weights(ModelSource.resolve(name), monkeypatch)
    lane = build_spatial(_request(model, f"decode ctx={ctx}", "f16", arch="wse3"))
    files = {a.path: a.data.decode() for a in lane.artifacts}
    program = files["pe_program.csl"]
    bound = re.findall(r"@initialize_queue\(@get_(input|output)_queue\((\d)\), \.\{ \.color = ([^}]+) \}\);", program)
    assert sorted((side, int(q)) for side, q, _ in bound) == [(s, q) for s in ("input", "output") for q in range(2, 8)]
    named = set(re.findall(r"\.(input|output)_queue = @get_\1_queue\((\d)\)", program))
    assert named and named <= {(side, q) for side, q, _ in bound}
    assert {c for _, _, c in bound} >= {"@get_color(8)", "@get_color(17)", "row_west_in", "col_south_out"}
    assert "cslc --arch=wse3" in files["commands.sh"] and "DIMS=762,1172" in files["commands.sh"]
    assert json.loads(files["host.json"])["arch"] == "wse3"
    assert lane.report["memory_per_element"]["band"]["high"] <= WSE2_MEMORY  # a WSE-3 element has the same 48 KiB
