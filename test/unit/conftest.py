"""The suite's set-up: under pytest-xdist (the default, `-n auto` in pyproject.toml, at most 4 workers),
each worker and every process a test starts keeps BLAS to one thread, so that N workers on N cores do not each
start N BLAS threads and spin against one another. `python3 -m pytest -n 0` runs the suite in one process,
with BLAS's own default. And the fixture every D5005 engine test uses: the OpenCL CPU device it runs on."""

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
