"""bench/prefill_gemm.py end to end on one small shape: every GEMM path this CPU has is
reported, the fractions are GFLOP/s over the same run's FMA roofline, and a path without a
GEMM is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dualpace.kernels import cpu as cpu_kernels

BENCH = Path(__file__).resolve().parents[2] / "bench" / "prefill_gemm.py"
pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_bench_reports_each_path_against_its_roofline():
    proc = _run("--json", "--shapes", "o-512", "--rows", "40", "--repeats", "2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    paths = [i for i in ("avx2", "avx512") if i in cpu_kernels.supported_isas()]
    assert sorted(out["paths"]) == sorted(paths)
    for isa, p in out["paths"].items():
        lanes = 8 if isa == "avx2" else 16
        assert p["fma_lanes"] == lanes
        peak = p["fma_per_core_per_s"] * lanes * 2 * out["threads"] / 1e9
        assert p["fma_peak_gflop_per_s"] == pytest.approx(peak, abs=0.1)
        (row,) = p["results"]
        assert (row["n"], row["k"], row["rows"]) == (512, 512, 40)
        assert row["gflop_per_s"] > 0 and row["torch_gflop_per_s"] > 0
        assert row["fraction_of_fma_peak"] == pytest.approx(row["gflop_per_s"] / peak,
                                                            rel=0.02, abs=2e-3)


def test_a_path_without_a_gemm_is_refused():
    proc = _run("--isas", "scalar")
    assert proc.returncode == 2 and "has no GEMM" in proc.stderr


def test_a_narrow_weight_dtype_reports_the_widening_against_fp32_and_the_sliced_linear():
    """--weight-dtype bfloat16: the same roofline fractions, and per row the kernel's time
    on bf16 W over its time on the same W in fp32 and its speedup over the decode linear a
    slice at a time (two rows above NATIVE_MAX_ROWS: two slices); the OpenMP spin that the
    workers get unless the caller set one."""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    proc = _run("--json", "--shapes", "o-512", "--rows", "136", "--repeats", "2",
                "--weight-dtype", "bfloat16", env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["weight_dtype"] == "bfloat16" and out["gomp_spincount"] == "3000"
    for p in out["paths"].values():
        (row,) = p["results"]
        assert row["rows"] == 136 and row["time_vs_fp32_gemm"] > 0
        assert row["speedup_vs_sliced_linear"] > 0
        assert p["median_time_vs_fp32_gemm"] == row["time_vs_fp32_gemm"]
    fp32 = json.loads(_run("--json", "--shapes", "o-512", "--rows", "40", "--repeats", "1")
                      .stdout.strip().splitlines()[-1])
    assert fp32["weight_dtype"] == "float32"
    assert "time_vs_fp32_gemm" not in next(iter(fp32["paths"].values()))["results"][0]
