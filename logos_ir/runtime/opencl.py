"""Finding the OpenCL CPU device that the lanes which run OpenCL use here: PoCL's, from PyPI.

Shared by the lanes that run OpenCL code on the CPU (the D5005 engine runs on it; the CUDA lane's emulation may):
`pip install pyopencl pocl-binary-distribution` gives a working platform with no system packages, because the
PyPI wheel of pyopencl carries its own ICD loader and finds the PoCL that `pocl-binary-distribution` installs
beside it. `pocl_cpu_context()` returns a context on PoCL's CPU device, or raises `OpenCLUnavailable` (a
`LogosError`, so the tools print one line) saying what is missing; `opencl_available()` is the test suites' gate.
`PYOPENCL_CTX` is not consulted on purpose: the lanes want PoCL's CPU device, whatever else a machine offers.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from logos_ir.errors import LogosError

if TYPE_CHECKING:
    import pyopencl as cl

INSTALL_HINT = "install PoCL's CPU device from PyPI: pip install pyopencl pocl-binary-distribution"


class OpenCLUnavailable(LogosError):
    """No OpenCL CPU device of PoCL can be opened here."""


def _platforms() -> list[cl.Platform]:
    try:
        import pyopencl as cl
    except ImportError:
        raise OpenCLUnavailable("pyopencl is not installed", hint=INSTALL_HINT) from None
    try:
        return list(cl.get_platforms())
    except cl.Error as error:  # the ICD loader found no platform at all
        raise OpenCLUnavailable(f"no OpenCL platform is installed ({error})", hint=INSTALL_HINT) from None


def pocl_cpu_device() -> cl.Device:
    """PoCL's CPU device (OpenCLUnavailable naming the platforms seen when there is none)."""
    import pyopencl as cl

    platforms = _platforms()
    for platform in platforms:
        if "pocl" not in (platform.name + platform.vendor).lower():
            continue
        devices = platform.get_devices(device_type=cl.device_type.CPU)
        if devices:
            return devices[0]
    seen = ", ".join(f"'{p.name}'" for p in platforms) or "none"
    raise OpenCLUnavailable(f"no CPU device of PoCL among the OpenCL platforms (found: {seen})", hint=INSTALL_HINT)


@lru_cache(maxsize=1)
def pocl_cpu_context() -> cl.Context:
    """A context on PoCL's CPU device, made once per process (every caller shares it)."""
    import pyopencl as cl

    return cl.Context([pocl_cpu_device()])


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
        devices = platform.get_devices(device_type=cl.device_type.ACCELERATOR)
        if devices:
            return cl.Context(devices[:1])
    return None


def opencl_available() -> str | None:
    """None when PoCL's CPU device opens, else why not (a test's skip reason)."""
    try:
        pocl_cpu_device()
    except OpenCLUnavailable as error:
        return error.message
    return None
