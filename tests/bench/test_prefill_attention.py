"""bench/prefill_attention.py end to end on one small case: every path this CPU has the
kernel on is reported, the fractions are causal GFLOP/s over the same run's FMA roofline,
and a path without the kernel is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dualpace.kernels import cpu as cpu_kernels

BENCH = Path(__file__).resolve().parents[2] / "bench" / "prefill_attention.py"
pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=300)


def test_the_bench_reports_each_path_against_its_roofline():
    proc = _run("--json", "--shapes", "demo-55m", "--lengths", "40", "--repeats", "2")
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
        assert (row["heads"], row["head_dim"], row["tokens"]) == (8, 64, 40)
        # the causal half of the scores: 4 Hq D T (T + 1) / 2 flops over the kernel's time
        flop = 4 * 8 * 64 * 40 * 41 / 2
        assert row["gflop_per_s"] == pytest.approx(flop / row["ms"] / 1e6, rel=0.02, abs=0.1)
        assert row["fraction_of_fma_peak"] == pytest.approx(row["gflop_per_s"] / peak,
                                                            rel=0.02, abs=2e-3)
        assert row["torch_ms"] > 0 and row["speedup_vs_torch"] > 0


def test_a_path_without_the_kernel_is_refused():
    proc = _run("--isas", "scalar")
    assert proc.returncode == 2 and "has no prefill attention kernel" in proc.stderr
