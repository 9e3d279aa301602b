"""Which OpenCL CPU device the engine runs on: PoCL's where its compiler builds for this CPU, else Intel's CPU
runtime, `LOGOS_OPENCL_CPU` naming one; what is said when neither builds (logos_ir.runtime.opencl)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from logos_ir.runtime import opencl


@pytest.fixture
def runtimes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The runtimes seen, as fakes: each device's build result set by the test (None: it builds)."""
    opencl.cpu_device.cache_clear()
    seen: dict[str, Any] = {}
    monkeypatch.setattr(opencl, "_cpu_devices", lambda: dict(seen))
    monkeypatch.setattr(opencl, "_builds", lambda device: device.fails)
    monkeypatch.delenv(opencl.CHOICE, raising=False)
    yield seen
    opencl.cpu_device.cache_clear()


def test_pocl_is_taken_where_its_compiler_knows_the_cpu(runtimes: dict[str, Any]) -> None:
    runtimes["pocl"] = SimpleNamespace(name="pthread-cpu", fails=None)
    runtimes["intel"] = SimpleNamespace(name="cpu", fails=None)
    assert opencl.cpu_device() is runtimes["pocl"]


def test_intels_runtime_is_taken_where_pocl_builds_no_kernel(runtimes: dict[str, Any]) -> None:
    runtimes["pocl"] = SimpleNamespace(name="pthread-AMD EPYC", fails="error: unknown target CPU 'generic'")
    runtimes["intel"] = SimpleNamespace(name="AMD EPYC", fails=None)
    assert opencl.cpu_device() is runtimes["intel"]


def test_neither_building_is_said_with_each_compilers_words(runtimes: dict[str, Any]) -> None:
    runtimes["pocl"] = SimpleNamespace(name="pthread-AMD EPYC", fails="error: unknown target CPU 'generic'")
    with pytest.raises(opencl.OpenCLUnavailable) as raised:
        opencl.cpu_device()
    assert "'pthread-AMD EPYC' builds no kernel (error: unknown target CPU 'generic')" in raised.value.message
    assert "intel-opencl-rt" in (raised.value.hint or "")


@pytest.mark.parametrize("chosen", ["intel", "pocl"])
def test_logos_opencl_cpu_names_the_runtime(
    runtimes: dict[str, Any], monkeypatch: pytest.MonkeyPatch, chosen: str
) -> None:
    runtimes["pocl"] = SimpleNamespace(name="pthread-cpu", fails=None)
    runtimes["intel"] = SimpleNamespace(name="cpu", fails=None)
    monkeypatch.setenv(opencl.CHOICE, chosen)
    assert opencl.cpu_device() is runtimes[chosen]


def test_logos_opencl_cpu_refuses_what_it_cannot_give(
    runtimes: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtimes["pocl"] = SimpleNamespace(name="pthread-cpu", fails=None)
    monkeypatch.setenv(opencl.CHOICE, "intel")
    with pytest.raises(opencl.OpenCLUnavailable, match="LOGOS_OPENCL_CPU=intel but no CPU device of it is here"):
        opencl.cpu_device()
    opencl.cpu_device.cache_clear()
    monkeypatch.setenv(opencl.CHOICE, "cuda")
    with pytest.raises(opencl.OpenCLUnavailable, match="names no OpenCL CPU runtime"):
        opencl.cpu_device()


def test_the_chosen_device_builds_a_kernel_here() -> None:
    """Whichever runtime is chosen on this machine, a kernel builds and runs on it (the engine's gate)."""
    import numpy as np
    import pyopencl as cl

    context = opencl.cpu_context()
    program = cl.Program(context, "__kernel void k(__global int *x) { x[get_global_id(0)] = 7; }").build()
    queue = cl.CommandQueue(context)
    out = cl.Buffer(context, cl.mem_flags.WRITE_ONLY, 16)
    program.k(queue, (4,), None, out)
    host = np.zeros(4, np.int32)
    cl.enqueue_copy(queue, host, out)
    assert host.tolist() == [7, 7, 7, 7]
    assert opencl.cpu_runtime() in opencl.RUNTIMES


def test_intels_vendor_file_sits_beside_the_systems(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """OCL_ICD_VENDORS replaces the loader's /etc/OpenCL/vendors: the folder named there holds the system's vendor
    files (a card's FPGA platform among them) beside Intel's CPU runtime's, and a folder the user named is kept."""
    system = tmp_path / "vendors"
    system.mkdir()
    (system / "intel-fpga.icd").write_text("libintelocl_fpga.so\n")
    library = tmp_path / "lib" / "libintelocl.so"
    monkeypatch.setattr(opencl, "SYSTEM_VENDORS", system)
    monkeypatch.setattr(opencl, "_intel_library", lambda: library)
    monkeypatch.setattr(opencl.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)
    opencl._register_intel()
    folder = tmp_path / next(p.name for p in tmp_path.iterdir() if p.name.startswith("logos-ir-opencl-vendors-"))
    assert opencl.os.environ["OCL_ICD_VENDORS"] == str(folder)
    assert {p.name: p.read_text() for p in folder.glob("*.icd")} == {
        "system-intel-fpga.icd": "libintelocl_fpga.so\n",
        "logos-ir-intel-cpu.icd": f"{library}\n",
    }
    monkeypatch.setenv("OCL_ICD_VENDORS", "/somewhere/else")
    opencl._register_intel()
    assert opencl.os.environ["OCL_ICD_VENDORS"] == "/somewhere/else"
