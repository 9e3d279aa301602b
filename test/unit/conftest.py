"""The suite's set-up: under pytest-xdist (the default, `-n auto` in pyproject.toml, at most 4 workers),
each worker and every process a test starts keeps BLAS to one thread, so that N workers on N cores do not each
start N BLAS threads and spin against one another. `python3 -m pytest -n 0` runs the suite in one process,
with BLAS's own default. The fixture every D5005 engine test uses: the OpenCL CPU device it runs on; and a patched
test's own CUDA builds (the lane keeps a process's last builds)."""

from __future__ import annotations

import os

import pytest

_BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    workers = getattr(config.option, "numprocesses", None)
    if workers and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller, before it starts the workers
        for name in _BLAS_THREADS:
            os.environ.setdefault(name, "1")


@pytest.fixture
def opencl_device() -> None:
    """The OpenCL CPU device the D5005 engine runs on: PoCL gives it and is a declared dependency, so a test fails
    without it rather than skipping."""
    from logos_ir.runtime.opencl import opencl_available

    missing = opencl_available()
    if missing is not None:
        pytest.fail(f"no OpenCL CPU device ({missing}): install PoCL, `pip install pocl-binary-distribution`")


@pytest.fixture(autouse=True)
def _fresh_cuda_builds(request: pytest.FixtureRequest):  # noqa: ANN202
    """A test that patches code (through `monkeypatch`: a lowering changed to show what the tokens depend on) lowers
    its own programs: the CUDA lane's builds kept by this process (`runtime.cuda.artifacts`) are dropped before it
    and after it, so it neither reads an earlier build nor leaves its patched ones to the next test."""
    if "monkeypatch" not in request.fixturenames:
        yield
        return
    from logos_ir.runtime.cuda import artifacts

    artifacts._BUILDS.clear()
    yield
    artifacts._BUILDS.clear()
