"""The one place where logos-ir's dialects, passes, pipelines and targets are registered.

Everything is imported lazily (each entry is a function returning the class), so `logos-opt --help` and the other
tools start without importing every pass. `logos-opt` reads this registry; so do `logos-compile` and `logos-run`.
A lane registers here, and only here: its dialect (`dialects`), its passes (`passes`), its named pipeline
`logos-to-<lane>` (`pipelines`), its `-t` emitters (`emitters`), its `logos-compile` target (`compile_targets`) and
its `logos-run` backend (`backends`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xdsl.ir import Dialect
from xdsl.passes import ModulePass
from xdsl.utils.target import Target

if TYPE_CHECKING:
    from logos_ir.build import BuildRequest, LaneBuild
    from logos_ir.runtime import RunRequest


def _lazy(module: str, name: str) -> Callable[[], Any]:
    """A loader of `name` from `module`, imported only when the entry is used."""

    def load() -> Any:
        return getattr(importlib.import_module(module), name)

    load.__qualname__ = f"load {module}.{name}"
    return load


# -- dialects -------------------------------------------------------------------------------------------------


def dialects() -> dict[str, Callable[[], Dialect]]:
    """The project's own dialects (xDSL's are registered by `logos-opt` from xDSL's universe)."""
    return {
        "logos": _lazy("logos_ir.dialects.logos", "LOGOS"),
        "cuda": _lazy("logos_ir.dialects.cuda", "CUDA"),
        "nvvm": _lazy("logos_ir.dialects.cuda", "NVVM"),
        "d5005": _lazy("logos_ir.dialects.d5005", "D5005"),
        "csl_ext": _lazy("logos_ir.dialects.csl_ext", "CSL_EXT"),
    }


# -- passes, by lane in pipeline order ---------------------------------------------------------------------------


def passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """logos-ir's passes by their kebab-case names: the middle end, then each lane's levels in pipeline order."""
    return {
        "cut-extract": _lazy("logos_ir.passes.cut_extract", "CutExtract"),
        "tp-split": _lazy("logos_ir.passes.tp_split", "TpSplit"),
        "verify-identity": _lazy("logos_ir.passes.verify_identity", "VerifyIdentity"),
        "inline-sections": _lazy("logos_ir.passes.inline_sections", "InlineSections"),
        "convert-logos-to-cuda-kernels": _lazy(
            "logos_ir.passes.cuda.convert_logos_to_kernels", "ConvertLogosToCudaKernels"
        ),
        "cuda-fold-norms": _lazy("logos_ir.passes.cuda.fold_norms", "FoldNorms"),
        "cuda-fuse-qkv": _lazy("logos_ir.passes.cuda.fuse_qkv", "FuseQKV"),
        "cuda-fold-residual-adds": _lazy("logos_ir.passes.cuda.fold_residual_adds", "FoldResidualAdds"),
        "cuda-fuse-prefill-attention": _lazy("logos_ir.passes.cuda.fuse_prefill_attention", "FusePrefillAttention"),
        "cuda-fold-prefill-norms": _lazy("logos_ir.passes.cuda.fold_prefill_norms", "FoldPrefillNorms"),
        "convert-cuda-kernels-to-gpu": _lazy("logos_ir.passes.cuda.convert_kernels_to_gpu", "ConvertCudaKernelsToGpu"),
        "cuda-programmatic-launch": _lazy("logos_ir.passes.cuda.programmatic_launch", "ProgrammaticLaunch"),
        "convert-logos-to-d5005": _lazy("logos_ir.passes.d5005.convert_logos_to_d5005", "ConvertLogosToD5005"),
        "extract-parts": _lazy("logos_ir.passes.extract_parts", "ExtractParts"),
        "csl-fuse-products": _lazy("logos_ir.passes.spatial.fuse_products", "CslFuseProducts"),
        "convert-logos-to-csl": _lazy("logos_ir.passes.spatial.convert_logos_to_csl", "ConvertLogosToCsl"),
        "verify-csl-grid": _lazy("logos_ir.passes.spatial.verify_grid", "VerifyCslGrid"),
    }


# -- named pipelines --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pipeline:
    """A named pipeline: a list of passes, each given some of the pipeline's options. `stages` maps the pipeline's
    options to the pass specs (`name{opt=value}`) it runs, so `logos-opt -p name{...}` runs a whole stage."""

    name: str
    description: str
    options: tuple[str, ...]
    stages: Callable[[dict[str, str]], list[str]]  # the options' plain values -> pass specs


def quoted(value: str) -> str:
    """An option value in xDSL's pipeline syntax: a string in double quotes."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _middle_end(options: dict[str, str]) -> list[str]:
    stages = []
    if "cut" in options:
        stages.append(f"cut-extract{{cut={quoted(options['cut'])}}}")
    if "tp" in options:
        stages.append(f"tp-split{{tp={options['tp']}}}")
    stages.append("verify-identity")
    return stages


CUDA_FUSIONS = (
    "cuda-fold-norms",
    "cuda-fuse-qkv",
    "cuda-fold-residual-adds",
    "cuda-fuse-prefill-attention",
    "cuda-fold-prefill-norms",
)


def _to_cuda(options: dict[str, str]) -> list[str]:
    split = [f"tp-split{{tp={options['tp']}}}"] if "tp" in options else []
    lowering = f"convert-logos-to-cuda-kernels{{weights={options.get('weights', 'bf16')}}}"
    gpu_level = ["convert-cuda-kernels-to-gpu", "cuda-programmatic-launch"]
    return ["verify-identity", *split, "inline-sections", lowering, *CUDA_FUSIONS, *gpu_level]


def _to_d5005(options: dict[str, str]) -> list[str]:
    lowering = f"convert-logos-to-d5005{{weights={options.get('weights', 'bf16')}}}"
    return ["verify-identity", "inline-sections", lowering]


def _to_spatial(options: dict[str, str]) -> list[str]:
    grid, arch = options.get("grid", "0"), options.get("arch", "wse2")
    lowering = f"convert-logos-to-csl{{weights={options.get('weights', 'f16')} grid={grid} arch={arch}}}"
    verify = f"verify-csl-grid{{grid={grid} arch={arch}}}"
    return ["verify-identity", "extract-parts", "csl-fuse-products", lowering, verify]


def pipelines() -> dict[str, Pipeline]:
    """Named pipelines. The lanes (`logos-to-cuda`, `logos-to-d5005`, `logos-to-spatial`) add theirs here."""
    return {
        "logos-middle-end": Pipeline(
            "logos-middle-end",
            'cut extraction (option cut="..."), then tensor-parallel splitting (option tp=N), then the identity check',
            ("cut", "tp"),
            _middle_end,
        ),
        "logos-to-cuda": Pipeline(
            "logos-to-cuda",
            "a decode step, prefill chunk or batch (tp=N: split) to fused kernels, then to a gpu.module of kernels"
            " and a host plan of gpu.launch_func (weights=bf16|f32)",
            ("weights", "tp"),
            _to_cuda,
        ),
        "logos-to-d5005": Pipeline(
            "logos-to-d5005",
            "a decode step to the D5005 engine's instructions over placed board-memory regions (weights=bf16|f32)",
            ("weights",),
            _to_d5005,
        ),
        "logos-to-spatial": Pipeline(
            "logos-to-spatial",
            "a decode step to one program for a P x P grid of a WSE-2 or WSE-3 (the csl modules of the element"
            " program and the layout; weights=f16|f32, grid=P or 0 for the smallest that fits, arch=wse2|wse3);"
            " then -t csl",
            ("weights", "grid", "arch"),
            _to_spatial,
        ),
    }


def run_pipeline(name: str, options: dict[str, str], module: Any) -> Any:
    """Every stage of the named pipeline on `module`, in place, as `logos-opt -p name{...}` runs it, the IR verified
    after each pass (a failure named by the pass): how a lane's build lowers what it builds."""
    from xdsl.context import Context
    from xdsl.passes import PassPipeline
    from xdsl.utils.exceptions import VerifyException

    from logos_ir.errors import PassError

    context = Context()
    for stage in PassPipeline.parse_spec(passes(), ",".join(pipelines()[name].stages(options))).passes:
        stage.apply(context, module)
        try:
            module.verify()
        except VerifyException as error:
            raise PassError(f"{stage.name}: its output does not verify: {error}") from None
    return module


# -- emitters: `logos-opt -t NAME` ---------------------------------------------------------------------------


def emitters() -> dict[str, Callable[[], type[Target]]]:
    """The project's `-t` targets (xDSL's own are registered by `logos-opt`; `csl` here replaces xDSL's)."""
    return {
        "logos": _lazy("logos_ir.passes.emit_logos", "LogosTarget"),
        "cuda": _lazy("logos_ir.passes.cuda.emit_cuda", "CudaTarget"),
        "d5005-listing": _lazy("logos_ir.passes.d5005.emit_listing", "ListingTarget"),
        "d5005-layout": _lazy("logos_ir.passes.d5005.emit_layout", "LayoutTarget"),
        "d5005-opencl": _lazy("logos_ir.passes.d5005.emit_opencl", "OpenclTarget"),
        "csl": _lazy("logos_ir.passes.spatial.emit_csl", "CslTarget"),
    }


def emitter_pipelines() -> dict[str, str]:
    """The named pipeline that lowers LOGOS IR to what each lane's `-t` emitter prints (`logos-opt` names it when
    an emitter is handed a module still in LOGOS IR)."""
    return {
        "cuda": "logos-to-cuda",
        "d5005-listing": "logos-to-d5005",
        "d5005-layout": "logos-to-d5005",
        "d5005-opencl": "logos-to-d5005",
        "csl": "logos-to-spatial",
    }


# -- logos-compile targets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileTarget:
    """A `logos-compile --target`: what it lowers (`cuts`, the cut kinds it takes; empty for any), the weight
    images it writes (`weights`, the first its default), and `build`, which returns the lane's build function
    (a `BuildRequest` in, a `LaneBuild` out; see `logos_ir.build`); `stored` returns the storage formats its decode
    step reads as stored (any other it reads as its image)."""

    name: str
    description: str
    cuts: tuple[str, ...]
    weights: tuple[str, ...]
    build: Callable[[], Callable[[BuildRequest], LaneBuild]]
    stored: Callable[[], Any] = lambda: ()


def compile_targets() -> dict[str, CompileTarget]:
    """`logos-compile`'s targets by name. The lanes add theirs here."""
    return {
        "logos": CompileTarget(
            "logos",
            "the LOGOS program of the cut and, for a whole program, each part (embedding, layers, head)",
            (),
            ("f32",),
            _lazy("logos_ir.build", "build_logos"),
        ),
        "cuda": CompileTarget(
            "cuda",
            "CUDA C++ kernels (kernels.cu) and the lowered module with its host plan (step.mlir)"
            " (--with-weights: the device weight image)",
            ("decode", "prefill", "batch"),
            ("bf16", "f32"),
            _lazy("logos_ir.passes.cuda.build", "build_cuda"),
            _lazy("logos_ir.passes.cuda.blocks", "READ_AS_STORED"),
        ),
        "d5005": CompileTarget(
            "d5005",
            "the D5005 engine's instruction stream, listing, weight layout, OpenCL engine source and cost model"
            " (--with-weights: the weight image)",
            ("decode",),
            ("bf16", "f32"),
            _lazy("logos_ir.passes.d5005.build", "build_d5005"),
            _lazy("logos_ir.dialects.d5005", "STORED_FORMATS"),
        ),
        "spatial": CompileTarget(
            "spatial",
            "a decode step as one program for a P x P grid of a WSE-2: layout.csl, pe_program.csl, commands.sh,"
            " run.py (the SDK's), grid.mlir and host.json (the simulator's); the report: elements, the share working"
            " on each layer, memory per element (--option grid=P)",
            ("decode",),
            ("f16", "f32"),
            _lazy("logos_ir.passes.spatial.build", "build_spatial"),
        ),
    }


# -- logos-run backends --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """A `logos-run --backend`: the weight images it runs (`weights`, the first its default), whether it has an
    `--emulate` mode, and `generator`, which returns the factory of its generator (a `RunRequest` in, an object
    with `generate`, `stats` and `identities` out, as `logos_ir.generate.Generator` has)."""

    name: str
    description: str
    weights: tuple[str, ...]
    generator: Callable[[], Callable[[RunRequest], Any]]
    emulates: bool = False


def backends() -> dict[str, Backend]:
    """`logos-run`'s backends by name. The lanes add theirs here."""
    return {
        "reference": Backend(
            "reference",
            "the numpy reference interpreter (float32)",
            ("f32",),
            _lazy("logos_ir.runtime", "reference_generator"),
        ),
        "cuda": Backend(
            "cuda",
            "the CUDA lane's kernels on a GPU (cupy), or with --emulate executed on the CPU",
            ("bf16", "f32"),
            _lazy("logos_ir.runtime.cuda.generator", "cuda_generator"),
            emulates=True,
        ),
        "d5005": Backend(
            "d5005",
            "the D5005 engine's OpenCL C (four bank readers, a compute kernel) on PoCL's CPU device, or --aocx",
            ("bf16", "f32"),
            _lazy("logos_ir.runtime.d5005", "d5005_generator"),
        ),
        "spatial": Backend(
            "spatial",
            "the spatial lane's simulator of a grid of processing elements, element by element, counting cycles",
            ("f16", "f32"),
            _lazy("logos_ir.runtime.spatial.generator", "spatial_generator"),
        ),
    }
