"""kernels.cu compiled by NVRTC (CUDA's runtime compiler library) where nvcc is absent: called through ctypes, so
the options are exactly the lane's (cupy's own NVRTC path adds `-ftz=true`, which neither nvcc's defaults nor the
emulator have), and the result is a cubin for one architecture (SASS: no PTX JIT, so a driver older than the NVRTC
still loads it). NVRTC needs no GPU: the suite compiles the embedded model's kernels with it
(`test/unit/test_cuda_nvrtc.py`).

Where it is found: `LOGOS_NVRTC` (a path to libnvrtc), else the PyPI wheel `nvidia-cuda-nvrtc` (CUDA 13:
`nvidia/cu13/lib/libnvrtc.so.13`; CUDA 12: `nvidia/cuda_nvrtc/lib/libnvrtc.so.12`), else the toolkit's
(`$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`), else the loader's search path. `cuda_bf16.h` is not one of NVRTC's
built-in headers: its folder is the wheel `nvidia-cuda-runtime`'s `include` (or the toolkit's `include`), passed as
`-I` (`pip install 'logos-ir[nvrtc]'` installs both wheels).

Options, one rounding rule with nvcc's build and the emulator: `-fmad=false` (no contraction: products the IR keeps
apart stay apart), `-ftz=false` (subnormals kept, as numpy keeps them), `-prec-div=true`, `-prec-sqrt=true` (IEEE
division and square root, nvcc's defaults), `-std=c++17`, `-arch=sm_XX`; `-Xptxas -v` asks ptxas for its register
and spill lines, which `Compiled.log` holds.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from logos_ir.errors import LogosError

NVRTC_OPTIONS = ("-std=c++17", "-fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-Xptxas", "-v")

INSTALL_HINT = (
    "pip install 'logos-ir[nvrtc]' (the wheels nvidia-cuda-nvrtc and nvidia-cuda-runtime), or set LOGOS_NVRTC"
)


@dataclass(frozen=True)
class Compiled:
    """A cubin NVRTC made, the compiler's log (ptxas's lines included), its version and the options it ran with."""

    cubin: bytes
    ptx: str
    log: str
    version: tuple[int, int]
    options: tuple[str, ...]


def _site_roots() -> list[Path]:
    roots = []
    for entry in sys.path:
        path = Path(entry) / "nvidia"
        if path.is_dir():
            roots.append(path)
    return roots


def find_library() -> str | None:
    """The libnvrtc to load (see the module docstring for the order), or None."""
    given = os.environ.get("LOGOS_NVRTC")
    if given:
        return given
    for root in _site_roots():
        for pattern in ("cu13/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*", "cu*/bin/nvrtc64_*.dll"):
            found = sorted(p for p in glob.glob(str(root / pattern)) if "builtins" not in p)
            if found:
                return found[-1]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found = sorted(p for p in glob.glob(f"{home}/lib64/libnvrtc.so*") if "builtins" not in p)
            if found:
                return found[-1]
    import ctypes.util

    return ctypes.util.find_library("nvrtc")


def find_include(library: str | None = None) -> str | None:
    """The folder holding cuda_bf16.h: beside the wheel's library (`../include`), the runtime wheel's, or the
    toolkit's."""
    candidates = []
    if library:
        candidates.append(Path(library).resolve().parent.parent / "include")
    for root in _site_roots():
        candidates += [root / "cu13" / "include", root / "cuda_runtime" / "include"]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(Path(home) / "include")
    for folder in candidates:
        if (folder / "cuda_bf16.h").is_file():
            return str(folder)
    return None


def _load(library: str) -> ctypes.CDLL:
    nvrtc = ctypes.CDLL(library)
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    nvrtc.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    nvrtc.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    nvrtc.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for name in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize", "nvrtcGetPTXSize"):
        getattr(nvrtc, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for name in ("nvrtcGetProgramLog", "nvrtcGetCUBIN", "nvrtcGetPTX"):
        getattr(nvrtc, name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    nvrtc.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    nvrtc.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    return nvrtc


def compile_cubin(source: str, arch: str = "sm_90", name: str = "kernels.cu") -> Compiled:
    """`source` compiled by NVRTC to a cubin for `arch` with the lane's options; a LogosError naming NVRTC's
    log where it fails, or naming what to install where NVRTC or cuda_bf16.h is not found."""
    library = find_library()
    if library is None:
        raise LogosError("NVRTC (libnvrtc) was not found, and nvcc is not on PATH", hint=INSTALL_HINT)
    include = find_include(library)
    if include is None:
        raise LogosError("cuda_bf16.h was not found for NVRTC (no CUDA runtime headers)", hint=INSTALL_HINT)
    try:
        nvrtc = _load(library)
    except OSError as error:
        raise LogosError(f"{library}: cannot load NVRTC: {error}", hint=INSTALL_HINT) from None

    def check(result: int, what: str) -> None:
        if result != 0:
            raise LogosError(f"NVRTC {what}: {nvrtc.nvrtcGetErrorString(result).decode()}")

    major, minor = ctypes.c_int(), ctypes.c_int()
    check(nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
    options = (f"-arch={arch}", f"-I{include}", *NVRTC_OPTIONS)
    program = ctypes.c_void_p()
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None), "create")
    try:
        encoded = [o.encode() for o in options]
        array = (ctypes.c_char_p * len(encoded))(*encoded)
        result = nvrtc.nvrtcCompileProgram(program, len(encoded), array)
        size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size)), "log size")
        text = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetProgramLog(program, text), "log")
        log = text.value.decode(errors="replace")
        if result != 0:
            raise LogosError(f"NVRTC {major.value}.{minor.value} could not compile {name} for {arch}:\n{log.strip()}")
        check(nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size)), "cubin size")
        cubin = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetCUBIN(program, cubin), "cubin")
        check(nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size)), "PTX size")
        ptx = ctypes.create_string_buffer(size.value)
        check(nvrtc.nvrtcGetPTX(program, ptx), "PTX")
        return Compiled(cubin.raw, ptx.value.decode(), log, (major.value, minor.value), options)
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
