"""The one place where logos-ir's dialects, passes, pipelines and targets are registered.

Everything is imported lazily (each entry is a function returning the class), so `logos-opt --help` and the other
tools start without importing every pass. `logos-opt` reads this registry; so do `logos-compile` and `logos-run`.
A lane registers here, and only here: its dialect (`dialects`), its passes (`passes`), its named pipeline
`logos-to-<lane>` (`pipelines`), its `-t` emitters (`emitters`), its `logos-compile` target (`compile_targets`) and
its `logos-run` backend (`backends`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xdsl.ir import Dialect
from xdsl.passes import ModulePass
from xdsl.utils.target import Target

if TYPE_CHECKING:
    from logos_ir.build import BuildRequest, LaneBuild
    from logos_ir.runtime import RunRequest


def _logos_dialect() -> Dialect:
    from logos_ir.dialects.logos import LOGOS

    return LOGOS


def _d5005_dialect() -> Dialect:
    from logos_ir.dialects.d5005 import D5005

    return D5005


def _cuda_dialect() -> Dialect:
    from logos_ir.dialects.cuda import CUDA

    return CUDA


def _spatial_dialect() -> Dialect:
    from logos_ir.dialects.spatial import SPATIAL

    return SPATIAL


def dialects() -> dict[str, Callable[[], Dialect]]:
    """The project's own dialects (xDSL's are registered by `logos-opt` from xDSL's universe)."""
    return {"logos": _logos_dialect, "d5005": _d5005_dialect, "cuda": _cuda_dialect, "spatial": _spatial_dialect}


def _cut_extract() -> type[ModulePass]:
    from logos_ir.passes.cut_extract import CutExtract

    return CutExtract


def _tp_split() -> type[ModulePass]:
    from logos_ir.passes.tp_split import TpSplit

    return TpSplit


def _verify_identity() -> type[ModulePass]:
    from logos_ir.passes.verify_identity import VerifyIdentity

    return VerifyIdentity


def _convert_logos_to_d5005() -> type[ModulePass]:
    from logos_ir.passes.d5005.convert_logos_to_d5005 import ConvertLogosToD5005

    return ConvertLogosToD5005


def _convert_logos_to_cuda_kernels() -> type[ModulePass]:
    from logos_ir.passes.cuda.logos_to_kernels import ConvertLogosToCudaKernels

    return ConvertLogosToCudaKernels


def _convert_cuda_kernels_to_gpu() -> type[ModulePass]:
    from logos_ir.passes.cuda.kernels_to_gpu import ConvertCudaKernelsToGpu

    return ConvertCudaKernelsToGpu


def _convert_logos_to_spatial() -> type[ModulePass]:
    from logos_ir.passes.spatial.convert_logos_to_spatial import ConvertLogosToSpatial

    return ConvertLogosToSpatial


def _spatial_place() -> type[ModulePass]:
    from logos_ir.passes.spatial.place import SpatialPlace

    return SpatialPlace


def _convert_spatial_to_csl() -> type[ModulePass]:
    from logos_ir.passes.spatial.convert_spatial_to_csl import ConvertSpatialToCsl

    return ConvertSpatialToCsl


def passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """logos-ir's passes by their kebab-case names."""
    return {
        "cut-extract": _cut_extract,
        "tp-split": _tp_split,
        "verify-identity": _verify_identity,
        "convert-logos-to-d5005": _convert_logos_to_d5005,
        "convert-logos-to-cuda-kernels": _convert_logos_to_cuda_kernels,
        "convert-cuda-kernels-to-gpu": _convert_cuda_kernels_to_gpu,
        "convert-logos-to-spatial": _convert_logos_to_spatial,
        "spatial-place": _spatial_place,
        "convert-spatial-to-csl": _convert_spatial_to_csl,
    }


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


def _to_d5005(options: dict[str, str]) -> list[str]:
    return ["verify-identity", f"convert-logos-to-d5005{{weights={options.get('weights', 'bf16')}}}"]


def _to_cuda(options: dict[str, str]) -> list[str]:
    middle = _middle_end({k: v for k, v in options.items() if k == "tp"})
    weights = options.get("weights", "bf16")
    return [*middle, f"convert-logos-to-cuda-kernels{{weights={weights}}}", "convert-cuda-kernels-to-gpu"]


def _to_spatial(options: dict[str, str]) -> list[str]:
    middle = _middle_end({k: v for k, v in options.items() if k == "cut"})
    lowering = f"convert-logos-to-spatial{{weights={options.get('weights', 'f16')} tile={options.get('tile', '0')}}}"
    return [*middle, lowering, "spatial-place"]


def pipelines() -> dict[str, Pipeline]:
    """Named pipelines. The lanes (`logos-to-cuda`, `logos-to-d5005`, `logos-to-spatial`) add theirs here."""
    return {
        "logos-middle-end": Pipeline(
            "logos-middle-end",
            'cut extraction (option cut="..."), then tensor-parallel splitting (option tp=N), then the identity check',
            ("cut", "tp"),
            _middle_end,
        ),
        "logos-to-d5005": Pipeline(
            "logos-to-d5005",
            "a decode step to the D5005 engine's instructions over placed board-memory regions (weights=bf16|f32)",
            ("weights",),
            _to_d5005,
        ),
        "logos-to-cuda": Pipeline(
            "logos-to-cuda",
            "a decode step, prefill chunk or batch (tp=N: split) to fused kernels, then to a gpu.module of kernels"
            " and a host plan of gpu.launch_func (weights=bf16|f32)",
            ("weights", "tp"),
            _to_cuda,
        ),
        "logos-to-spatial": Pipeline(
            "logos-to-spatial",
            'a decode step\'s part (cut="decode_layer layer=0 ctx=64" to extract it) to a spatial.region placed on a'
            " WSE-2-sized grid: weight tiles on elements, routes, per-element compute (weights=f16|f32 tile=N);"
            " then -t csl",
            ("cut", "weights", "tile"),
            _to_spatial,
        ),
    }


# -- emitters: `logos-opt -t NAME` ---------------------------------------------------------------------------


def _logos_emitter() -> type[Target]:
    from logos_ir.passes.emit_logos import LogosTarget

    return LogosTarget


def _d5005_listing() -> type[Target]:
    from logos_ir.passes.d5005.emit_listing import ListingTarget

    return ListingTarget


def _d5005_layout() -> type[Target]:
    from logos_ir.passes.d5005.emit_layout import LayoutTarget

    return LayoutTarget


def _d5005_opencl() -> type[Target]:
    from logos_ir.passes.d5005.emit_opencl import EngineTarget

    return EngineTarget


def _cuda_emitter() -> type[Target]:
    from logos_ir.passes.cuda.emit_cuda import CudaTarget

    return CudaTarget


def _csl_emitter() -> type[Target]:
    from logos_ir.passes.spatial.emit_csl import CslTarget

    return CslTarget


def emitters() -> dict[str, Callable[[], type[Target]]]:
    """The project's `-t` targets (xDSL's own are registered by `logos-opt`). The lanes add their emitters here."""
    return {
        "logos": _logos_emitter,
        "d5005-listing": _d5005_listing,
        "d5005-layout": _d5005_layout,
        "d5005-opencl": _d5005_opencl,
        "cuda": _cuda_emitter,
        "csl": _csl_emitter,
    }


# -- logos-compile targets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileTarget:
    """A `logos-compile --target`: what it lowers (`cuts`, the cut kinds it takes; empty for any), the weight
    images it writes (`weights`, the first its default), and `build`, which returns the lane's build function
    (a `BuildRequest` in, a `LaneBuild` out; see `logos_ir.build`)."""

    name: str
    description: str
    cuts: tuple[str, ...]
    weights: tuple[str, ...]
    build: Callable[[], Callable[[BuildRequest], LaneBuild]]


def _build_logos() -> Callable[[BuildRequest], LaneBuild]:
    from logos_ir.build import build_logos

    return build_logos


def _build_d5005() -> Callable[[BuildRequest], LaneBuild]:
    from logos_ir.passes.d5005.build import build_d5005

    return build_d5005


def _build_cuda() -> Callable[[BuildRequest], LaneBuild]:
    from logos_ir.passes.cuda.build import build_cuda

    return build_cuda


def _build_spatial() -> Callable[[BuildRequest], LaneBuild]:
    from logos_ir.passes.spatial.build import build_spatial

    return build_spatial


def compile_targets() -> dict[str, CompileTarget]:
    """`logos-compile`'s targets by name. The lanes add theirs here."""
    return {
        "logos": CompileTarget(
            "logos",
            "the LOGOS program of the cut and, for a whole program, each part (embedding, layers, head)",
            (),
            ("f32",),
            _build_logos,
        ),
        "d5005": CompileTarget(
            "d5005",
            "the D5005 engine's instruction stream, listing, weight layout, OpenCL engine source and cost model"
            " (--with-weights: the weight image)",
            ("decode",),
            ("bf16", "f32"),
            _build_d5005,
        ),
        "cuda": CompileTarget(
            "cuda",
            "CUDA C++ kernels (kernels.cu) and the lowered module with its host plan (step.mlir)"
            " (--with-weights: the device weight image)",
            ("decode", "prefill", "batch"),
            ("bf16", "f32"),
            _build_cuda,
        ),
        "spatial": CompileTarget(
            "spatial",
            "every part of a decode step placed on a WSE-2-sized grid: per part its placement (placement.mlir) and"
            " its CSL (layout.csl, pe_program.csl); the report: elements, memory per element, words per token, tokens/s",
            ("decode", "decode_embed", "decode_layer", "decode_head"),
            ("f16", "f32"),
            _build_spatial,
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


def _reference_generator() -> Callable[[RunRequest], Any]:
    from logos_ir.runtime import reference_generator

    return reference_generator


def _d5005_generator() -> Callable[[RunRequest], Any]:
    from logos_ir.runtime.d5005 import d5005_generator

    return d5005_generator


def _cuda_generator() -> Callable[[RunRequest], Any]:
    from logos_ir.runtime.cuda import cuda_generator

    return cuda_generator


def _spatial_generator() -> Callable[[RunRequest], Any]:
    from logos_ir.runtime.spatial import spatial_generator

    return spatial_generator


def backends() -> dict[str, Backend]:
    """`logos-run`'s backends by name. The lanes add theirs here."""
    return {
        "reference": Backend("reference", "the numpy reference interpreter (float32)", ("f32",), _reference_generator),
        "d5005": Backend(
            "d5005",
            "the D5005 engine's OpenCL C run on PoCL's CPU device, one launch per decode step",
            ("bf16", "f32"),
            _d5005_generator,
        ),
        "cuda": Backend(
            "cuda",
            "the CUDA lane's kernels on a GPU (cupy), or with --emulate executed on the CPU",
            ("bf16", "f32"),
            _cuda_generator,
            emulates=True,
        ),
        "spatial": Backend(
            "spatial",
            "the spatial lane's simulator of a grid of processing elements, element by element, counting cycles",
            ("f16", "f32"),
            _spatial_generator,
        ),
    }
