"""`logos-compile --target spatial`: a decode step lowered to one CSL program for a P x P grid of a WSE-2, and the
build folder a Cerebras user compiles and runs with the SDK:

- `layout.csl`: the rectangle, each element's program and parameters, every router's colour configuration, the
  memcpy parameters; `pe_program.csl`: the element program (the embedding, the layer and the head as its
  functions, the tasks that run them, the exported `step`), both printed by xDSL's CSL printer;
- `commands.sh`: the `cslc` call (`--arch=wse2`, `--fabric-dims`, `--fabric-offsets`, `--params`, `--memcpy`,
  `--channels`) and the `cs_python run.py` that follows;
- `run.py`: the host program on the SDK's `SdkRuntime`: the weights read from a folder of safetensors and tiled, the
  tiles and rotary tables written with `memcpy_h2d`, then for each token `step` launched with its id and position
  as the launch's arguments, the logits read back with `memcpy_d2h` and their arg-max taken. It needs Python,
  numpy and the SDK, not logos-ir: the tiling is `grid.tiles`'s source copied in, the rotary tables are computed by
  the build; without the SDK (`cerebras.sdk` not importable, as here) `--check` tiles the weights and stops;
- `grid.mlir` (the `csl`-level module the two .csl files print, which the fabric simulator runs) and `host.json`
  (the grid, each exported array's tensors and tiling, the logits' place): what `logos-run --backend spatial`
  reads from a build folder.

The report: the grid, the elements used, the share of them that hold a tile of each of a layer's projections (the
share that works on each layer), memory per element (arrays and code), and the mapping's figures. Cycles per token
are the simulator's, measured by `bench/spatial_agreement.py --placement` (docs/benchmarks.md). A build reads no
weight value. `--with-weights` is refused: `run.py` tiles the weights itself.
"""

from __future__ import annotations

import inspect
import io
import json
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline
from xdsl.printer import Printer

from logos_ir.build import Artifact, BuildError, BuildRequest, LaneBuild, program_module
from logos_ir.dialects import csl_ext
from logos_ir.identity import the_program
from logos_ir.passes.spatial import grid as g
from logos_ir.passes.spatial.convert_logos_to_csl import ConvertLogosToCsl, GridProgram, lower_module, memory_use
from logos_ir.passes.spatial.emit_csl import print_csl
from logos_ir.rope import rope_inv_freq

_OPTIONS = ("grid", "arch")


def build_spatial(request: BuildRequest) -> LaneBuild:
    """The spatial lane's build (see the module docstring)."""
    cut = request.cut
    if cut.kind != "decode":
        raise BuildError(f"target spatial lowers a whole decode step (every part on one grid), not '{cut.option()}'")
    if request.tp != 1:
        raise BuildError(f"target spatial places a model on one grid, not over {request.tp} chips")
    if request.weights not in ("f16", "f32"):
        raise BuildError(f"target spatial holds f16 or f32 weights, not {request.weights}")
    if request.with_weights:
        raise BuildError("target spatial writes no weight image: run.py tiles the weights itself")
    unknown = sorted(set(request.options) - set(_OPTIONS))
    if unknown:
        raise BuildError(
            f"target spatial has no option {', '.join(unknown)}",
            hint="its options: grid=P (P x P elements) or grid=WxH, arch=wse2|wse3 (the machine)",
        )
    p = _grid_option(request.options.get("grid", "0"))
    arch = request.options.get("arch", "wse2")
    if arch not in csl_ext.TARGETS:
        raise BuildError(f"target spatial builds for {' or '.join(csl_ext.TARGETS)} (--option arch=), not '{arch}'")
    module, identity, _ = program_module(request)
    spec = the_program(module, "convert-logos-to-csl").spec
    return lane_build(lower(module, request.weights, p, arch), identity.line(), identity, spec)


def _grid_option(text: str) -> int | tuple[int, int]:
    """`grid=P` (P x P elements) or `grid=WxH` (W columns, H rows); 0: the lane picks."""
    try:
        sides = [int(side) for side in text.lower().split("x")]
    except ValueError:
        sides = []
    if len(sides) == 1:
        return sides[0]
    if len(sides) != 2:
        raise BuildError(f"target spatial's option grid is P or WxH in whole numbers, not '{text}'")
    return sides[0], sides[1]


def lower(module: ModuleOp, weights: str, p: int | tuple[int, int], arch: str = "wse2") -> GridProgram:
    """The lane's pipeline (`logos-to-spatial`) on `module`: the stages before the lowering applied in place, the
    lowering (`convert-logos-to-csl`'s `lower_module`) kept whole, as the build needs its plan and host description;
    the last stage, `verify-csl-grid`, is `lane_build`'s static check of the printed CSL."""
    from logos_ir.registry import passes, pipelines

    context = Context()
    for stage in PassPipeline.parse_spec(passes(), ",".join(pipelines()["logos-to-spatial"].stages({}))).passes:
        if isinstance(stage, ConvertLogosToCsl):
            return lower_module(module, weights, p, arch=arch)
        stage.apply(context, module)
    raise BuildError("the logos-to-spatial pipeline has no convert-logos-to-csl stage")


def lane_build(lowered: GridProgram, line: str, identity: Any, spec: Any) -> LaneBuild:
    from logos_ir.passes.spatial.verify_grid import layout_params, static_check, target_of

    texts = print_csl(lowered.module)
    target = target_of(lowered.module)
    static_check(lowered.module, "\n// FILE:".join(["", *texts.values()]), layout_params(lowered.host))
    mlir = io.StringIO()
    Printer(stream=mlir, print_generic_format=True).print_op(lowered.module)
    host = {"identity": line, **lowered.host}
    report = spatial_report(lowered)
    artifacts = [
        Artifact.text("layout.csl", f"// {line}\n{texts['layout.csl']}", identity, "layout"),
        Artifact.text("pe_program.csl", f"// {line}\n{texts['pe_program.csl']}", identity, "program"),
        Artifact.text("commands.sh", commands(line, lowered.plan.grid, target), identity, "commands"),
        Artifact.text("run.py", _stored_guard(run_py(line, rope_tables(lowered, spec)), lowered), identity, "host"),
        Artifact.text(
            "compile_appliance.py", compile_appliance_py(line, lowered.plan.grid, target), identity, "commands"
        ),
        Artifact.text("run_appliance.py", _RUN_APPLIANCE.format(line=line), identity, "host"),
        Artifact.text("grid.mlir", f"// {line}\n{mlir.getvalue()}\n", identity, "ir"),
        Artifact.text("host.json", json.dumps(host, indent=1) + "\n", identity, "host"),
    ]
    return LaneBuild(artifacts, report, summary_lines(report))


_WEIGHTS_LOOP = """    for name, fields in host["weights"].items():
"""


def _stored_guard(text: str, lowered: GridProgram) -> str:
    """run.py reads safetensors, which hold no GGUF blocks: where the build reads weights as stored, run.py refuses
    them by name before tiling anything (the fabric simulator's host tiles the file's blocks, `grid.stored_tiles`);
    a build of the image's run.py is as it was."""
    if not any(w.format for w in lowered.plan.weights.values()):
        return text
    guard = (
        '        if fields.get("format"):\n'
        "            sys.exit(f\"run.py: {name} holds {fields['format']} blocks (codes and scales): run.py \"\n"
        '                     "does not tile them from safetensors; the fabric simulator\'s host does (logos-run)")\n'
    )
    assert text.count(_WEIGHTS_LOOP) == 1
    return text.replace(_WEIGHTS_LOOP, _WEIGHTS_LOOP + guard)


def commands(line: str, grid: tuple[int, int], target: csl_ext.Target) -> str:
    """The SDK commands: on the machine, its whole fabric and the program's offset in it (`--fabric-dims` and
    `--fabric-offsets` as WaferLLM compiles for a WSE-2: 757,996 and 4,1); for the SDK's simulator, a fabric 7
    columns wider and 2 rows taller than the rectangle is enough (memcpy's columns and rows around it: the SDK's
    examples' `--fabric-dims=w+7,h+2 --fabric-offsets=4,1`), chosen with `SIMULATOR=1`."""
    width, height = target.fabric
    x, y = target.offsets
    machine = "CS-2" if target.name == "wse2" else "CS-3"
    return (
        "#!/usr/bin/env bash\n"
        f"# {line}\n"
        f"# Compile the decode step for a {target.name.upper().replace('WSE', 'WSE-')} with the Cerebras SDK, then run"
        f" it (on a {machine} with --cmaddr, or\n"
        "# the SDK's simulator without, SIMULATOR=1: a fabric just larger than the program). Not run here: this\n"
        "# project has no SDK.\n"
        "set -e\n"
        f"DIMS={width},{height}\n"
        f'if [ -n "$SIMULATOR" ]; then DIMS={grid[0] + 7},{grid[1] + 2}; fi\n'
        f"cslc --arch={target.name} ./layout.csl --fabric-dims=$DIMS --fabric-offsets={x},{y} \\\n"
        f"  --params=width:{grid[0]},height:{grid[1]} --memcpy --channels=1 -o out\n"
        'cs_python run.py --name out "$@"\n'
    )


def rope_tables(lowered: GridProgram, spec: Any) -> dict[str, list[list[float]]]:
    """Each rotary table's rows as `run.py` writes them: row y's rotary frequency of each pair of its chunk
    (`grid.inv_freq_rows`), for the model's head_dim, theta and scaling."""
    inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
    plan = lowered.plan
    return {
        table: g.inv_freq_rows(inv_freq, plan, chunk).tolist() for table, chunk in lowered.host["rope_tables"].items()
    }


def run_py(line: str, tables: dict[str, list[list[float]]]) -> str:
    """The host program: standalone (Python, numpy and the SDK; not logos-ir), with the weight tiling of
    `grid.tiles` copied in from its one definition and the rotary tables the build computed."""
    tiling = "\n\n".join(inspect.getsource(f) for f in (g.tiles, g._columns))
    return _RUN_PY.format(line=line, tiling=tiling, tables=json.dumps(tables))


_RUN_PY = '''#!/usr/bin/env cs_python
# {line}
"""Host program of the spatial lane's decode step on the Cerebras SDK (SdkRuntime). It reads host.json (the grid,
each exported array's tensors and tiling) and the model's weights from a Hugging Face folder of safetensors, tiles
them as the element program reads them, writes them with memcpy_h2d, then for each token launches `step` with its id
and position as the launch's arguments, reads the logits back from the grid's centre column with memcpy_d2h and
takes their arg-max.

It needs Python, numpy and, to run on a CS-2 or the SDK's simulator, the SDK (`cs_python`), nothing of logos-ir.
Without the SDK, `--check` tiles every weight and says what would be written, and stops there."""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

try:
    import numpy as np
except ImportError:  # --help needs none; main() says so
    np = None

Weight = SimpleNamespace  # a weight of host.json (the fields of logos-ir's grid.Weight)
ROPE_TABLES = {tables}  # each rotary table's rows: row y's frequency of each pair of its chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="out", help="the cslc output folder")
    parser.add_argument("--cmaddr", default=None, help="IP:port of a CS-2 (none: the SDK simulator)")
    parser.add_argument("--weights", required=True, help="a folder of safetensors files (a Hugging Face model)")
    parser.add_argument("--prompt-ids", default="1,2,3")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--check", action="store_true", help="tile the weights and stop (no SDK needed)")
    args = parser.parse_args()
    host, arrays = weight_arrays(Path(args.weights))
    if args.check:
        for name, (data, _) in arrays.items():
            print(f"{{name}}: {{data.shape[2]}} words on each of {{host['grid'][0]}} x {{host['grid'][1]}} elements")
        return
    try:
        from cerebras.sdk.runtime.sdkruntimepybind import MemcpyDataType, MemcpyOrder, SdkRuntime  # type: ignore
    except ImportError:
        sys.exit("run.py: the Cerebras SDK is not installed (run it with cs_python; --check needs no SDK)")
    runner = SdkRuntime(args.name, cmaddr=args.cmaddr)
    runner.load()
    runner.run()
    tokens = [int(t) for t in args.prompt_ids.split(",")]
    generated = decode(runner, host, arrays, MemcpyDataType, MemcpyOrder, tokens, args.max_new_tokens)
    runner.stop()
    print(",".join(map(str, generated)))


def weight_arrays(folder: Path) -> tuple[dict, dict]:
    """host.json, and every array the host writes before the first token: each weight's tiles (read from the
    safetensors of `folder`) and each rotary table, with whether it is a vector (32-bit words)."""
    if np is None:
        sys.exit("run.py: needs numpy")
    host = json.loads((Path(__file__).parent / "host.json").read_text())
    grid = width, height = host["grid"]
    tensors = Safetensors(folder)
    arrays = {{}}
    for name, fields in host["weights"].items():
        maps = {{"row_map": tuple(fields["row_map"]), "column_map": tuple(fields["column_map"])}}
        weight = SimpleNamespace(**{{**fields, **maps}})
        arrays[name] = (np.concatenate([tiles(tensors.get(t), weight, grid) for t in weight.tensors], axis=2),
                        weight.kind == "vector")
    for table, rows in ROPE_TABLES.items():
        chunk = np.asarray(rows, dtype=np.float32)
        arrays[table] = (np.broadcast_to(chunk[:, None, :], (height, width, chunk.shape[1])).copy(), True)
    return host, arrays


def decode(runner, host: dict, arrays: dict, MemcpyDataType, MemcpyOrder, tokens: list, new: int) -> list:
    """The weights written, then the greedy decode: for each position `step` launched with the token and position
    as its arguments (no copy to every element), the logits read back from the centre column, their arg-max.
    `runner` is the SDK's SdkRuntime, direct (run.py) or the appliance client's (run_appliance.py): the calls are
    the same."""
    (width, height), image = host["grid"], host["image"]

    def h2d(name: str, data: np.ndarray, vector: bool = True) -> None:
        if image == "f16" and not vector:  # f16 in the low half of a 32-bit word (MEMCPY_16BIT)
            flat, kind = data.astype(np.float16).view(np.uint16).astype(np.uint32), MemcpyDataType.MEMCPY_16BIT
        else:
            flat, kind = data.astype(np.float32).view(np.uint32), MemcpyDataType.MEMCPY_32BIT
        runner.memcpy_h2d(runner.get_id(name), flat.ravel(), 0, 0, width, height, flat.shape[-1], streaming=False,
                          order=MemcpyOrder.ROW_MAJOR, data_type=kind, nonblock=False)

    def timestamp(name: str, x: int) -> int:  # <time>'s 48-bit counter of element (x, 0): three u16 words
        words = np.zeros(3, dtype=np.uint32)
        runner.memcpy_d2h(words, runner.get_id(name), x, 0, 1, 1, 3, streaming=False, order=MemcpyOrder.ROW_MAJOR,
                          data_type=MemcpyDataType.MEMCPY_16BIT, nonblock=False)
        low = words.astype(np.uint64) & 0xFFFF
        return int(low[0] + (low[1] << 16) + (low[2] << 32))

    for name, (data, vector) in arrays.items():
        h2d(name, data, vector)
    logits = host["logits"]
    out = np.zeros(height * logits["chunk"], dtype=np.float32)
    generated: list[int] = []
    for position in range(1, len(tokens) + new):
        token = tokens[position - 1] if position <= len(tokens) else generated[-1]
        runner.launch("step", np.int32(token), np.int32(position), nonblock=False)  # launch arguments
        runner.memcpy_d2h(out, runner.get_id(logits["array"]), logits["column"], 0, 1, height, logits["chunk"],
                          streaming=False, order=MemcpyOrder.ROW_MAJOR, data_type=MemcpyDataType.MEMCPY_32BIT,
                          nonblock=False)
        if position >= len(tokens):
            generated.append(int(np.argmax(out[: logits["length"]])))
        cycles = timestamp("step_end", logits["column"]) - timestamp("step_start", logits["column"])
        print(f"step {{position}}: {{cycles}} cycles on element ({{logits['column']}}, 0) (<time>)", file=sys.stderr)
    return generated


class Safetensors:
    """The tensors of every .safetensors file in a folder, read as float32 (F32, F16 and BF16 are read)."""

    def __init__(self, folder: Path):
        self.where = {{}}
        for file in sorted(folder.glob("*.safetensors")):
            with open(file, "rb") as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
            for name, entry in header.items():
                if name != "__metadata__":
                    self.where[name] = (file, 8 + size, entry)
        if not self.where:
            sys.exit(f"run.py: no .safetensors file in {{folder}}")

    def get(self, name: str) -> np.ndarray:
        if name not in self.where:
            sys.exit(f"run.py: the weights have no tensor '{{name}}'")
        file, base, entry = self.where[name]
        start, end = entry["data_offsets"]
        with open(file, "rb") as f:
            f.seek(base + start)
            raw = f.read(end - start)
        kind = entry["dtype"]
        if kind == "BF16":
            values = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif kind in ("F16", "F32"):
            values = np.frombuffer(raw, dtype=np.float16 if kind == "F16" else np.float32).astype(np.float32)
        else:
            sys.exit(f"run.py: tensor '{{name}}' is {{kind}}, not F32, F16 or BF16")
        return values.reshape(entry["shape"])


# The tiling of logos-ir's spatial lane (passes/spatial/grid.py), as the element program reads its tiles.
{tiling}

if __name__ == "__main__":
    main()
'''


def compile_appliance_py(line: str, grid: tuple[int, int], target: csl_ext.Target) -> str:
    """The appliance-mode compile (cerebras.sdk.client's SdkCompiler), with commands.sh's flags."""
    width, height = target.fabric
    x, y = target.offsets
    rest = f"--fabric-offsets={x},{y} --params=width:{grid[0]},height:{grid[1]} --memcpy --channels=1 -o out"
    machine = f"--arch={target.name} --fabric-dims={width},{height} {rest}"
    simulator = f"--arch={target.name} --fabric-dims={grid[0] + 7},{grid[1] + 2} {rest}"
    return _COMPILE_APPLIANCE.format(line=line, machine=machine, simulator=simulator)


_COMPILE_APPLIANCE = '''#!/usr/bin/env python3
# {line}
"""Compile the decode step on a Wafer-Scale Cluster in appliance mode (cerebras.sdk.client's SdkCompiler, as
WaferLLM compiles its decode), with the flags commands.sh gives cslc; the artifact's id is written to artifact.json
for run_appliance.py. It needs Python and the SDK's appliance client (the PyPI package cerebras-sdk), nothing of
logos-ir."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MACHINE = "{machine}"
SIMULATOR = "{simulator}"  # a fabric just larger than the program, for the SDK's simulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulator", action="store_true", help="compile for the SDK's simulator")
    args = parser.parse_args()
    try:
        from cerebras.sdk.client import SdkCompiler  # type: ignore
    except ImportError:
        sys.exit("compile_appliance.py: the Cerebras SDK's appliance client is not installed (cerebras-sdk)")
    here = Path(__file__).parent
    with SdkCompiler() as compiler:
        artifact = compiler.compile(str(here), "layout.csl", SIMULATOR if args.simulator else MACHINE)
    (here / "artifact.json").write_text(json.dumps({{"artifact_id": artifact, "simulator": args.simulator}}))
    print(artifact)


if __name__ == "__main__":
    main()
'''

_RUN_APPLIANCE = '''#!/usr/bin/env python3
# {line}
"""Run the decode step compiled by compile_appliance.py in appliance mode: cerebras.sdk.client's SdkRuntime as a
context manager (memcpy_h2d of the weights, then for each token launch and memcpy_d2h, as run.py does with the
direct runtime; the weights read and tiled by run.py's code beside it). It needs Python, numpy and the SDK's
appliance client (the PyPI package cerebras-sdk), nothing of logos-ir."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import run  # noqa: E402  (run.py beside it: the weights read and tiled, the decode loop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="a folder of safetensors files (a Hugging Face model)")
    parser.add_argument("--prompt-ids", default="1,2,3")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    host, arrays = run.weight_arrays(Path(args.weights))
    try:
        from cerebras.appliance.pb.sdk.sdk_common_pb2 import MemcpyDataType, MemcpyOrder  # type: ignore
        from cerebras.sdk.client import SdkRuntime  # type: ignore
    except ImportError:
        sys.exit("run_appliance.py: the Cerebras SDK's appliance client is not installed (cerebras-sdk)")
    artifact = json.loads((Path(__file__).parent / "artifact.json").read_text())
    tokens = [int(t) for t in args.prompt_ids.split(",")]
    with SdkRuntime(artifact["artifact_id"], simulator=artifact["simulator"]) as runner:
        generated = run.decode(runner, host, arrays, MemcpyDataType, MemcpyOrder, tokens, args.max_new_tokens)
    print(",".join(map(str, generated)))


if __name__ == "__main__":
    main()
'''


def spatial_report(lowered: GridProgram) -> dict[str, Any]:
    """The placement's figures (see the module docstring)."""
    plan = lowered.plan
    memory = memory_use(lowered)
    shares = {name: round(working_share(w, plan.grid), 4) for name, w in plan.weights.items() if w.kind == "matrix"}
    target = csl_ext.TARGETS[lowered.host.get("arch", "wse2")]
    grid = {"name": target.name, "fabric": list(target.fabric), "usable": list(target.usable)}
    return {
        "grid": {**grid, "memory": csl_ext.MEMORY, "width": plan.width, "height": plan.height},
        "weights": plan.image,
        "elements_used": plan.width * plan.height,
        "grid_share": round(plan.width * plan.height / (target.fabric[0] * target.fabric[1]), 4),
        "working_share_per_layer_projection": shares,
        "working_share_per_layer": min(shares.values()) if shares else None,
        "memory_per_element": memory,
        "element_programs": 3,  # the embedding's, the layer's (every layer's), the head's: functions of one program
        "regions": [{"region": part, "elements": plan.width * plan.height} for part in _parts(lowered)],
        "kv_slots_per_element": plan.slots,
        **_stored_report(plan),
    }  # no cycles: a build runs nothing; the fabric simulator counts them (bench/spatial_agreement.py placement)


def _stored_report(plan: g.GridPlan) -> dict[str, Any]:
    """The weights read as stored (none: no entry, as the image's builds were): each array's format and its bytes
    an element (codes, scales and slots) against the f16 image's tile of the same shape."""
    stored = {name: w for name, w in plan.weights.items() if w.format}
    if not stored:
        return {}
    arrays = {
        name: {
            "format": w.format,
            "bytes": 2 * w.words + 2 * w.scale_words + 4 * w.tile_columns,
            "f16_bytes": 2 * len(w.tensors) * w.tile_rows * w.tile_columns,
            "scale_slots": w.scale_slots,
        }
        for name, w in stored.items()
    }
    image = sorted(name for name, w in plan.weights.items() if not w.format and w.kind != "vector")
    return {"read_as_stored": {"arrays": arrays, "image": image}}


def _parts(lowered: GridProgram) -> list[str]:
    lines = lowered.host["identities"]
    return ["embedding"] + [f"layer_{i}" for i in range(len(lines) - 2)] + ["head"]


def working_share(weight: g.Weight, grid: int | tuple[int, int]) -> float:
    """The share of the grid's elements (`grid` = (width, height), or P x P) whose tile of `weight` holds at least
    one of its values (not padding): a `col`-input matrix's row blocks are the grid's rows, its column blocks its
    columns; a `row`-input one's the other way."""
    width, height = (grid, grid) if isinstance(grid, int) else grid
    row_blocks, column_blocks = (height, width) if weight.orient == "col" else (width, height)
    rows = np.asarray(weight.row_map) if weight.row_map else np.arange(weight.rows)
    padded = np.full(row_blocks * weight.tile_rows, -1)
    padded[: min(rows.size, padded.size)] = rows[: padded.size]
    real_rows = (padded.reshape(row_blocks, weight.tile_rows) >= 0).any(axis=1)
    real_columns = np.arange(column_blocks) * weight.tile_columns < weight.columns
    return float(real_rows.sum() * real_columns.sum()) / (width * height)


def summary_lines(report: dict[str, Any]) -> list[str]:
    width, height = report["grid"]["width"], report["grid"]["height"]
    memory = report["memory_per_element"]
    return [
        f"grid {width} x {height} of a {report['grid']['name'].upper().replace('WSE', 'WSE-')} "
        f"({report['elements_used']} "
        f"elements, {100 * report['grid_share']:.2f}% of its {report['grid']['fabric'][0]} x "
        f"{report['grid']['fabric'][1]}, {report['grid']['usable'][0]} x {report['grid']['usable'][1]} usable), "
        f"{report['weights']} weights",
        f"memory per element: {memory['band']['low']} to {memory['band']['high']} bytes of {csl_ext.MEMORY} "
        f"({memory['arrays']} of arrays, {memory['code']} of code at 4 bytes an op; the band adds the <math> "
        "routines, memcpy's component and a stack: docs/spatial.md)",
        f"share of the elements working on each layer: {100 * (report['working_share_per_layer'] or 0):.1f}%",
        f"{report['element_programs']} part programs (embedding, layer, head) in one element program",
        "cycles per token: counted by the fabric simulator as it runs the build (bench/spatial_agreement.py placement)",
        *_stored_lines(report),
    ]


def _stored_lines(report: dict[str, Any]) -> list[str]:
    stored = report.get("read_as_stored")
    if not stored:
        return []
    arrays = stored["arrays"]
    formats = sorted({a["format"] for a in arrays.values()})
    held = sum(a["bytes"] for a in arrays.values())
    image = sum(a["f16_bytes"] for a in arrays.values())
    tables = ", ".join(stored["image"]) or "none"
    return [
        f"weights read as stored: {', '.join(formats)} ({len(arrays)} layer matrices: each element holds its tile's "
        f"codes and the f16 scale of each block of 32 its slice of a row touches, {held} bytes an element against "
        f"{image} as f16 tiles, and dequantizes them before its f32 multiply-accumulate); as the "
        f"{report['weights']} image: {tables}, the norms, and every other format (q4_1, q5_*, the K-quants, fp8)"
    ]
