"""The build a CUDA run executes, as data: the host plan (read from `step.mlir`), the CUDA source (`kernels.cu`)
and the identity of the program they were lowered from, either read from a build folder that `logos-compile` wrote
(`read_build`) or built anew through the registry's `cuda` compile target and read back from its artifacts
(`build_program`), so that a run and a build folder execute the same artifacts.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

from logos_ir.author import written, written_split
from logos_ir.build import BuildRequest, read_manifest
from logos_ir.errors import LogosError
from logos_ir.models import ModelSource
from logos_ir.passes.cuda.host_plan import HostPlan, read_plan
from logos_ir.program import Cut, Identity
from logos_ir.progress import Progress
from logos_ir.registry import compile_targets


class Build(NamedTuple):
    """What a run executes of a build: the host plan, the CUDA source and the identity of the program they were
    lowered from."""

    plan: HostPlan
    source: str
    identity: Identity


# The builds of this process, by what determines them: the program's text as the author writes it for the cut (its
# shapes and each weight's storage), the chips and the weight image. The lowering is deterministic
# (test_determinism.py), so the same text lowers to the same step.mlir, and the plan read back from that text is
# the same plan; a run and a test asking for one program again (a decode step at one cache length, the same family
# on two prompts) read it once. A handful are kept: a parsed step of a K-quant model holds about 10^5 ops. The
# build returned is shared: a caller that edits a kernel (a test showing what a fault does) edits a clone of it.
_BUILDS: OrderedDict[tuple[str, int, str], Build] = OrderedDict()
BUILDS_KEPT = 4


def build_program(spec: Any, cut: Cut, tp: int, weights: str) -> Build:
    """The lane's build of `cut` (no weights) through the registry's `cuda` compile target, read back from its
    artifacts (one this process built already from the same program text, chips and image: that build)."""
    authored, _ = written_split(spec, cut, "", tp) if tp > 1 else written(spec, cut)
    key = (hashlib.sha256(authored.text.encode("utf-8")).hexdigest(), tp, weights)
    if key in _BUILDS:
        _BUILDS.move_to_end(key)
        return _BUILDS[key]
    options = {"ptxas": "off"}  # the code only: no nvcc run for the build report
    request = BuildRequest(ModelSource("preset", "run", spec), cut, tp, weights, False, Progress.silent(), options)
    built = compile_targets()["cuda"].build()(request)
    files = {a.path: a for a in built.artifacts}
    step = files["step.mlir"]
    build = Build(read_plan(step.data.decode("utf-8")), files["kernels.cu"].data.decode("utf-8"), step.identity)
    _BUILDS[key] = build
    while len(_BUILDS) > BUILDS_KEPT:
        _BUILDS.popitem(last=False)
    return build


def read_build(folder: Path) -> tuple[Cut, Build]:
    """A CUDA build folder's cut (from its manifest) and build (step.mlir's host plan, kernels.cu), as logos-compile
    wrote them."""
    folder = Path(folder)
    target = read_manifest(folder).get("target") or {}
    cut = Cut.parse(str(target.get("cut")))
    step = (folder / "step.mlir").read_text(encoding="utf-8")
    plan = read_plan(step, str(folder / "step.mlir"))
    identity = Identity.from_line(plan.identity)
    if identity is None:
        raise LogosError(f"{folder}/step.mlir records no identity line of its program")
    return cut, Build(plan, (folder / "kernels.cu").read_text(encoding="utf-8"), identity)
