"""`bench/gpu_decode.py` away from a GPU: it claims nothing (exits 1, writes no rows), and the rows it would write
carry, for every decode step, the programmatic-launch time beside the plain-launch baseline and both model bands.

The GPU half runs only on a GPU (`python3 bench/gpu_decode.py`); this pins what a GPU loan must not find broken."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from logos_ir.runtime.cuda.devices import gpu_count

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_decode.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_decode", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(gpu_count() > 0, reason="a GPU is visible here: the script would run its benchmark")
def test_without_a_gpu_the_benchmark_claims_nothing(tmp_path: Path, capsys: Any) -> None:
    docs = tmp_path / "benchmarks.md"
    assert _bench().main(["--docs", str(docs)]) == 1
    assert "found no GPU" in capsys.readouterr().err and not docs.exists()


def test_each_decode_row_sets_the_plain_launch_step_beside_the_programmatic_one() -> None:
    model = {
        "model": "llama-3.1-8b-shaped, random bf16 weights",
        "ctx": 8192,
        "decode_step_ms": 6.1,
        "modelled_step_ms": [5.9, 7.0],
        "plain_launch_step_ms": 6.6,
        "modelled_plain_launch_step_ms": [6.4, 7.6],
        "tokens_per_s": 163.9,
        "minimum_bytes_per_step": 17.2e9,
        "fraction_of_peak": 0.59,
        "fraction_of_read_only": 0.7,
        "kernels": {"gemv_q": {"us": 10.0, "tb_per_s": 4.1, "cublas_gemv_us": 11.0, "device_copy_us": 12.0}},
    }
    report = {"date": "2026-12-02", "device": "H200", "copy_tb_per_s": 4.0, "read_only_tb_per_s": 4.3}
    rows = _bench().benchmark_rows({**report, "peak_tb_per_s": 4.8, "models": [model]})
    header = next(line for line in rows.splitlines() if line.startswith("| model | ctx | step ms"))
    assert "plain launches" in header
    assert "| llama-3.1-8b-shaped | 8192 | 6.1 (5.9-7.0) | 6.6 (6.4-7.6) | 163.9 | 17200.0 | 59% | 70% |" in rows
