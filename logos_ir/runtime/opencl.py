"""Finding the OpenCL CPU device that the lanes which run OpenCL use here: PoCL's, from PyPI, or Intel's CPU runtime
where PoCL's compiler does not know the CPU.

Shared by the lanes that run OpenCL code on the CPU (the D5005 engine runs on it; the CUDA lane's emulation may):
`pip install pyopencl pocl-binary-distribution` gives a working platform with no system packages, because the
PyPI wheel of pyopencl carries its own ICD loader and finds the PoCL that `pocl-binary-distribution` installs
beside it. That PoCL (3.0) compiles for the CPU its LLVM 14 names; a CPU newer than that LLVM (AMD's Zen 5, say)
is named 'generic', which its clang refuses as a target ("unknown target CPU 'generic'"), so no kernel builds. There
Intel's CPU Runtime for OpenCL (`intel-opencl-rt` on PyPI, x86-64 CPUs of either vendor) runs the same source:
`cpu_device()` takes PoCL's CPU device where a one-line kernel builds on it, else Intel's. `LOGOS_OPENCL_CPU=pocl`
or `=intel` picks one (a benchmark or a test running the engine on both). `cpu_context()` returns a context on the
chosen device or raises `OpenCLUnavailable` (a `LogosError`, so the tools print one line) saying what is missing;
`opencl_available()` is the test suites' gate. `PYOPENCL_CTX` is not consulted on purpose: the lanes want a CPU
device these two runtimes give, whatever else a machine offers.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from logos_ir.errors import LogosError

if TYPE_CHECKING:
    import pyopencl as cl

INSTALL_HINT = "install PoCL's CPU device from PyPI: pip install pyopencl pocl-binary-distribution"
INTEL_HINT = (
    "Intel's CPU Runtime for OpenCL runs where PoCL's compiler does not know the CPU: pip install intel-opencl-rt"
)
CHOICE = "LOGOS_OPENCL_CPU"  # pocl | intel: the runtime to use, where a run must name it
RUNTIMES = ("pocl", "intel")


class OpenCLUnavailable(LogosError):
    """No OpenCL CPU device that builds the engine can be opened here."""


def _intel_library() -> Path | None:
    """libintelocl.so of the `intel-opencl-rt` package when it is installed (its wheel puts it in the prefix's lib)."""
    from importlib import metadata

    try:
        files = metadata.files("intel-opencl-rt") or []
    except metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())).resolve() for f in files if f.name == "libintelocl.so"]
    return next((path for path in found if path.is_file()), None)


SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")  # the ICD loader's own folder, which OCL_ICD_VENDORS replaces


def _register_intel() -> None:
    """Make Intel's CPU runtime visible to pyopencl's ICD loader, which reads its vendor files once, at the first
    platform query: its wheel's own vendor file names a placeholder path, so a file naming the installed library
    goes in a folder of ours, named in OCL_ICD_VENDORS. That folder replaces the system's (/etc/OpenCL/vendors,
    where a card's BSP registers Intel's FPGA platform), so the system's vendor files are copied into it too; the
    loader still reads pyopencl's own folder (PoCL's). A folder the user named is left alone."""
    library = _intel_library()
    if library is None or os.environ.get("OCL_ICD_VENDORS"):
        return
    try:
        system = sorted(SYSTEM_VENDORS.glob("*.icd")) if SYSTEM_VENDORS.is_dir() else []
        files = {f"system-{path.name}": path.read_text() for path in system}
        files["logos-ir-intel-cpu.icd"] = f"{library}\n"
        key = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / f"logos-ir-opencl-vendors-{key}"
        folder.mkdir(exist_ok=True)
        for name, text in files.items():
            icd = folder / name
            if not icd.is_file() or icd.read_text() != text:
                partial = folder / f".{name}.{os.getpid()}"
                partial.write_text(text)
                partial.replace(icd)  # whole or absent: the loader reads every *.icd of the folder
    except OSError:  # no writable temporary folder, or an unreadable vendor file: the loader's own folders alone
        return
    os.environ["OCL_ICD_VENDORS"] = str(folder)


@lru_cache(maxsize=1)
def _platforms() -> tuple[cl.Platform, ...]:
    try:
        import pyopencl as cl
    except ImportError:
        raise OpenCLUnavailable("pyopencl is not installed", hint=INSTALL_HINT) from None
    _register_intel()
    try:
        return tuple(cl.get_platforms())
    except cl.Error as error:  # the ICD loader found no platform at all
        raise OpenCLUnavailable(f"no OpenCL platform is installed ({error})", hint=INSTALL_HINT) from None


def _runtime(platform: cl.Platform) -> str | None:
    said = (platform.name + " " + platform.vendor).lower()
    if "pocl" in said or "portable computing language" in said:
        return "pocl"
    if "intel" in said and "fpga" not in said:
        return "intel"
    return None


def _cpu_devices() -> dict[str, cl.Device]:
    """The first CPU device of each runtime this process sees."""
    import pyopencl as cl

    devices: dict[str, cl.Device] = {}
    for platform in _platforms():
        runtime = _runtime(platform)
        if runtime is None or runtime in devices:
            continue
        try:
            found = platform.get_devices(device_type=cl.device_type.CPU)
        except cl.Error:  # a platform with no device of that type raises rather than returning none
            continue
        if found:
            devices[runtime] = found[0]
    return devices


def _builds(device: cl.Device) -> str | None:
    """None when the device's compiler builds a one-line kernel, else the first line of its error."""
    import pyopencl as cl

    try:
        cl.Program(cl.Context([device]), "__kernel void probe(__global int *x) { x[0] = 1; }").build()
    except cl.Error as error:
        return next((line.strip() for line in str(error).splitlines() if "error:" in line), str(error).strip())
    return None


@lru_cache(maxsize=1)
def cpu_device() -> cl.Device:
    """The CPU device the engine runs on: PoCL's where its compiler builds for this CPU, else Intel's CPU runtime's
    (OpenCLUnavailable naming what each said when neither is there); `LOGOS_OPENCL_CPU` names one instead."""
    devices = _cpu_devices()
    chosen = os.environ.get(CHOICE, "").strip().lower()
    if chosen:
        if chosen not in RUNTIMES:
            raise OpenCLUnavailable(f"{CHOICE}={chosen!r} names no OpenCL CPU runtime (pocl or intel)")
        if chosen not in devices:
            seen = ", ".join(devices) or "none"
            hint = INTEL_HINT if chosen == "intel" else INSTALL_HINT
            raise OpenCLUnavailable(f"{CHOICE}={chosen} but no CPU device of it is here (found: {seen})", hint=hint)
        return devices[chosen]
    why: list[str] = []
    for runtime in RUNTIMES:
        if runtime not in devices:
            continue
        failed = _builds(devices[runtime])
        if failed is None:
            return devices[runtime]
        why.append(f"'{devices[runtime].name.strip()}' builds no kernel ({failed})")
    if not devices:
        seen = ", ".join(f"'{p.name}'" for p in _platforms()) or "none"
        raise OpenCLUnavailable(f"no CPU device of PoCL among the OpenCL platforms (found: {seen})", hint=INSTALL_HINT)
    raise OpenCLUnavailable(
        "no OpenCL CPU device here builds a kernel: " + "; ".join(why),
        hint=INTEL_HINT if "intel" not in devices else "PYOPENCL_COMPILER_OUTPUT=1 shows each compiler's whole log",
    )


def cpu_runtime() -> str:
    """Which runtime `cpu_device()` is: 'pocl' or 'intel'."""
    return _runtime(cpu_device().platform) or "pocl"


@lru_cache(maxsize=1)
def cpu_context() -> cl.Context:
    """A context on the chosen CPU device, made once per process (every caller shares it)."""
    import pyopencl as cl

    return cl.Context([cpu_device()])


def intel_fpga_context() -> cl.Context | None:
    """A context on the accelerator of Intel's FPGA platform (a card's BSP installed), or None where there is none:
    where an `aoc`-built engine (`.aocx`) runs."""
    import pyopencl as cl

    try:
        platforms = _platforms()
    except OpenCLUnavailable:
        return None
    for platform in platforms:
        if "fpga" not in platform.name.lower() or "intel" not in platform.vendor.lower():
            continue
        if "emulat" in platform.name.lower():  # oneAPI's FPGA emulator: a CPU, not the card
            continue
        try:
            devices = platform.get_devices(device_type=cl.device_type.ACCELERATOR)
        except cl.Error:
            continue
        if devices:
            return cl.Context(devices[:1])
    return None


def opencl_available() -> str | None:
    """None when a CPU device that builds the engine opens, else why not (a test's skip reason)."""
    try:
        cpu_device()
    except OpenCLUnavailable as error:
        return error.message
    return None
