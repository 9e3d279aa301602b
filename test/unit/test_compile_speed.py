"""What a build emits does not grow with the model's depth, at the scale of the largest models.

Every lane emits one kernel, engine routine or element program per distinct shape, shared by every layer that has
it, so an 80-layer model of given widths emits exactly the set a 2-layer model of the same widths does. Timings are
the benchmark's (`bench/compile_speed.py`), never a test's: these machines are too noisy for timed tests.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from logos_ir import registry
from logos_ir.build import BuildRequest, LaneBuild
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec


def build(target: str, spec: ModelSpec, cut: str, tp: int = 1, options: dict[str, str] | None = None) -> LaneBuild:
    source = ModelSource("preset", f"{spec.layers} layers", spec)
    weights = registry.compile_targets()[target].weights[0]
    if options is None:  # the kernels' names and launches, not nvcc's registers
        options = {"ptxas": "off"} if target == "cuda" else {}
    request = BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent(), options)
    lane = registry.compile_targets()[target].build()(request)
    assert source._store is None  # a build of code opens no weights
    return lane


def at_depth(model: str, layers: int) -> ModelSpec:
    return replace(ModelSpec.preset(model), layers=layers)


@pytest.mark.parametrize("cut, tp", [("decode ctx=8192", 8), ("prefill rows=512 ctx=8192", 1)])
def test_cuda_kernels_of_an_80_layer_70b_are_a_2_layer_ones(cut: str, tp: int) -> None:
    few, many = (build("cuda", at_depth("llama-3.1-70b", n), cut, tp).report for n in (2, 80))
    assert few["kernel_names"] == many["kernel_names"]
    assert many["launches"] > few["launches"]  # the same kernels, launched for every layer


def test_d5005_routines_of_80_layers_are_2_layers_ones() -> None:
    """At llama-3.2-1b's widths: 80 layers of the 8B's or the 70B's do not fit the card's 32 GB."""
    few, many = (build("d5005", at_depth("llama-3.2-1b", n), "decode ctx=1024") for n in (2, 80))
    assert few.report["routines"] == many.report["routines"]
    engine = [next(a for a in lane.artifacts if a.role == "engine").data.split(b"\n", 1)[1] for lane in (few, many)]
    assert engine[0] == engine[1]  # the same engine source, its identity line apart


def test_spatial_element_programs_of_80_layers_are_2_layers_ones() -> None:
    """At the embedded model's widths, on one grid (288 x 288, where 80 layers fit): every layer runs the one
    `layer(l)` function, so 80 layers' element program is 2 layers' but for its arrays' lengths, its identity lines
    and the layer count the layer task stops at."""
    few, many = (
        build("spatial", at_depth("smollm2-135m", n), "decode ctx=256", options={"grid": "288"}) for n in (2, 80)
    )
    assert few.report["memory_per_element"]["code"] == many.report["memory_per_element"]["code"]
    assert many.report["memory_per_element"]["arrays"] > few.report["memory_per_element"]["arrays"]
    programs = [next(a for a in lane.artifacts if a.path == "pe_program.csl").data.decode() for lane in (few, many)]
    variable = r"(?m)^var (\w+) : \[\d+\]|LOGOS program: .*$|(\(layer_at\[.*\]\) \+ 1\)  <  )\d+"
    code = [re.sub(variable, r"\1\2", text) for text in programs]  # arrays' lengths, identities, the layer count
    assert programs[0] != programs[1] and code[0] == code[1]
