"""Every kernel the CUDA lane emits for the embedded model (SmolLM2-135M: a decode step, a prefill chunk of 32 rows,
a batch of 4, a decode step over 3 chips, bf16 and f32 images) compiles for sm_90 with nvcc and with NVRTC (the
runtime's compiler where nvcc is absent), and ptxas reports no register spill for any of them. All distinct kernels
go through one call of each. A build's report carries ptxas's registers and spills per kernel and the bytes each
GEMV keeps in flight an SM at its occupancy (or says nvcc is absent)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from logos_ir.build import BuildRequest
from logos_ir.models import ModelSource
from logos_ir.program import Cut
from logos_ir.progress import Progress
from logos_ir.spec import ModelSpec

NVCC = shutil.which("nvcc")
BUILDS = [("decode ctx=1024", 1), ("prefill rows=32 ctx=1024", 1), ("batch rows=4 ctx=1024", 1), ("decode ctx=1024", 3)]
_KERNEL = re.compile(r'^extern "C" __global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(', re.M)


def _kernels(text: str) -> dict[str, str]:
    """Each kernel of a kernels.cu by name, its text from its `extern` line to its closing brace."""
    starts = [m.start() for m in _KERNEL.finditer(text)]
    bodies = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    return {_KERNEL.match(body).group(1): body for body in bodies}  # type: ignore[union-attr]


def _all_kernels() -> tuple[str, int]:
    from logos_ir.passes.cuda.build import build_cuda
    from logos_ir.passes.cuda.emit_cuda import PREAMBLE

    spec = ModelSpec.preset("smollm2-135m")
    source = ModelSource("preset", "smollm2-135m", spec)
    kernels: dict[str, str] = {}
    for cut, tp in BUILDS:
        for weights in ("bf16", "f32"):
            request = BuildRequest(source, Cut.parse(cut), tp, weights, False, Progress.silent(), {"ptxas": "off"})
            cu = next(a for a in build_cuda(request).artifacts if a.path == "kernels.cu")
            kernels.update(_kernels(cu.data.decode()))
    return PREAMBLE + "\n".join(kernels[name] for name in sorted(kernels)), len(kernels)


def spills(ptxas_report: str) -> dict[str, tuple[int, int]]:
    """(spill store bytes, spill load bytes) of each function in ptxas's `-v` report."""
    from logos_ir.passes.cuda.build import parse_ptxas

    return {name: (k["spill_stores"], k["spill_loads"]) for name, k in parse_ptxas(ptxas_report).items()}


def test_the_ptxas_parser_reads_registers_spills_and_shared_memory() -> None:
    from logos_ir.passes.cuda.build import parse_ptxas

    report = (
        "ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
        "ptxas info    : Function properties for a\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 64 registers, used 0 barriers\n"
        "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
        "ptxas info    : Function properties for b\n"
        "    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
        "ptxas info    : Used 103 registers, used 1 barriers, 30720 bytes smem\n"
    )
    assert spills(report) == {"a": (0, 0), "b": (8, 4)}
    assert parse_ptxas(report)["b"] == {
        "registers": 103, "spill_stores": 8, "spill_loads": 4, "barriers": 1, "shared_bytes": 30720
    }  # fmt: skip


def test_blocks_an_sm_follow_cudas_occupancy_rules_for_sm90() -> None:
    """NVIDIA's occupancy calculator for compute capability 9.0, 128 threads a block: 64 K registers an SM given a
    warp 256 at a time, 64 warps, 32 blocks, 228 KB of shared memory with 1 KB reserved a block."""
    from logos_ir.passes.cuda.build import occupancy

    assert [occupancy(r) for r in (16, 32, 40, 48, 64, 72, 96, 128, 168, 255)] == [16, 16, 12, 10, 8, 7, 5, 4, 3, 2]
    assert (
        occupancy(64, shared=30720) == 7 and occupancy(103, shared=34816) == 4 and occupancy(32, shared=47 * 1024) == 4
    )


def test_the_report_measures_with_the_runtimes_flags_and_says_when_nvcc_is_absent(monkeypatch: Any) -> None:
    from logos_ir.passes.cuda.build import NOT_MEASURED, PTXAS_FLAGS, build_cuda
    from logos_ir.runtime.cuda.devices import NVCC_FLAGS

    assert PTXAS_FLAGS == NVCC_FLAGS  # ptxas's figures are those of the kernels the runtime compiles
    monkeypatch.setenv("PATH", "/nonexistent")
    request = BuildRequest(ModelSource("preset", "tiny", ModelSpec.preset("tiny")), Cut.decode(64), 1, "bf16", False,
                           Progress.silent())  # fmt: skip
    built = build_cuda(request)
    assert built.report["ptxas"] == NOT_MEASURED == "nvcc not found: registers not measured"
    assert f"registers and spills: {NOT_MEASURED}" in built.summary


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed here: ptxas's figures cannot be measured")
def test_the_build_report_gives_each_kernels_registers_spills_and_bytes_in_flight() -> None:
    """A tiny model's decode step as logos-compile builds it: ptxas's registers and spills for every kernel, and each
    GEMV's bytes in flight an SM at the occupancy those registers allow. The same kernels printed with a launch
    bound of 16 blocks an SM make ptxas keep to 32 registers, and the figures follow ptxas's new numbers."""
    from logos_ir.passes.cuda.build import build_cuda, kernel_resources, resource_report
    from logos_ir.passes.cuda.host_plan import read_plan

    request = BuildRequest(ModelSource("preset", "tiny", ModelSpec.preset("tiny")), Cut.decode(64), 1, "bf16", False,
                           Progress.silent())  # fmt: skip
    built = build_cuda(request)
    ptxas = built.report["ptxas"]
    assert ptxas["command"] == "nvcc -arch=sm_90 -cubin -O3 -fmad=false -Xptxas -v" and "release" in ptxas["nvcc"]
    kernels = ptxas["kernels"]
    assert sorted(kernels) == built.report["kernel_names"]
    assert all(k["registers"] > 0 and k["spill_stores"] == k["spill_loads"] == 0 for k in kernels.values())
    gemvs = {name: k for name, k in kernels.items() if "bytes_in_flight_per_sm" in k}
    assert sorted(gemvs) == sorted(built.report["loads_in_flight"]) and any(k.startswith("qkv_") for k in gemvs)
    assert any(k["registers"] > 32 for k in gemvs.values())
    assert "no spill in 10 kernels" in built.summary[2]

    files = {a.path: a.data.decode() for a in built.artifacts}
    bounded = files["kernels.cu"].replace("__launch_bounds__(128, 4)", "__launch_bounds__(128, 16)")
    measured = kernel_resources(bounded)
    assert not isinstance(measured, str)
    tight = resource_report(measured, read_plan(files["step.mlir"]))["kernels"]
    for name, k in gemvs.items():
        assert tight[name]["registers"] <= 32  # ptxas kept to the bound: 65536 / (16 x 128)
        assert tight[name]["blocks_per_sm"] == 16
        assert tight[name]["bytes_in_flight_per_sm"] == k["bytes_in_flight_per_thread"] * 128 * 16
        if k["registers"] > 32:
            assert tight[name]["bytes_in_flight_per_sm"] > k["bytes_in_flight_per_sm"]


def _nvrtc_library() -> str | None:
    from logos_ir.runtime.cuda import nvrtc

    library = nvrtc.find_library()
    return library if library is not None and nvrtc.find_include(library) is not None else None


NVRTC = _nvrtc_library()
# An f32 arithmetic instruction that flushes subnormals (expf's ex2.approx.ftz / rcp.approx.ftz are libdevice's
# own range-reduced steps, not the IR's arithmetic).
_FTZ_ARITHMETIC = re.compile(r"\b(?:add|sub|mul|fma|div|sqrt)\.[a-z.]*ftz[a-z.]*\.f32\b")


@pytest.mark.skipif(NVCC is None and NVRTC is None, reason="neither nvcc nor NVRTC (pip install 'logos-ir[nvrtc]')")
def test_every_kernel_of_the_embedded_model_compiles_for_sm90_without_spills(tmp_path: Path) -> None:
    """One source of every distinct kernel, through nvcc and through NVRTC (the runtime's compiler where nvcc is
    absent: the PyPI wheel's, found as the runtime finds it): both compile it for sm_90 (no `cstdint`, cuda_bf16.h
    from the runtime wheel's headers), ptxas reports every kernel and no spill, and NVRTC's PTX has no f32
    arithmetic flushing subnormals (-ftz=false, as nvcc's default and the emulator)."""
    from logos_ir.runtime.cuda import nvrtc

    source, count = _all_kernels()
    reports = {}
    if NVCC is not None:
        cu = tmp_path / "kernels.cu"
        cu.write_text(source)
        run = subprocess.run(
            [NVCC, "-arch=sm_90", "-Xptxas", "-v", "-cubin", "-o", str(tmp_path / "kernels.cubin"), str(cu)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        reports["nvcc"] = run.stderr + run.stdout
    if NVRTC is not None:
        compiled = nvrtc.compile_cubin(source, "sm_90")
        assert compiled.cubin[:4] == b"\x7fELF" and "-ftz=false" in compiled.options
        assert "-fmad=false" in compiled.options
        flushed = _FTZ_ARITHMETIC.findall(compiled.ptx)
        assert not flushed, f"NVRTC's PTX flushes subnormals: {sorted(set(flushed))}"
        assert "mul.rn.f32" in compiled.ptx and "fma.rn.f32" in compiled.ptx  # the check reads real arithmetic
        reports[f"NVRTC {compiled.version[0]}.{compiled.version[1]}"] = compiled.log
    for compiler, text in reports.items():
        report = spills(text)
        assert len(report) == count, compiler
        spilled = {name: sizes for name, sizes in report.items() if sizes != (0, 0)}
        assert not spilled, f"{compiler}: ptxas spilled registers in {spilled}"
