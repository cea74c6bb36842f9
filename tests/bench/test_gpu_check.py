"""bench/gpu_check.py's parts that run without a GPU: the host facts and the served smoke
run (with the "GPU" worker on CPU), and the verdict on a box without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402

from dualpace.kernels import cpu as cpu_kernels  # noqa: E402


def test_served_smoke_run_checks_the_tiers_and_the_stream():
    out = gpu_check.serve_smoke("cpu", requests=8, rate=8.0)
    assert out["ok"], out
    assert out["loadgen"]["completed"] == 8 and not out["loadgen"]["failed"]
    assert out["stream"]["done"] and out["stream"]["finish_reason"] == "length"
    assert out["tokens"]["gpu"] >= 8 * 64 and out["prefill_to_cpu"] == 0


@pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")
def test_host_facts_name_the_isa_paths_and_the_bandwidth_by_threads():
    h = gpu_check._host(cuda=False)
    assert h["default_isa"] in h["isa_paths"] and h["cores"] >= 1
    assert "1" in h["dram_read_gbps"] and all(v > 0 for v in h["dram_read_gbps"].values())
    assert "pinned_upload_gbps" not in h  # no CUDA, no link figure


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a box with CUDA")
def test_without_cuda_the_check_fails_and_runs_no_tests(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--json-out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    report = json.loads(out.read_text())
    assert report["ok"] is False and "tests" not in report and "host" in report
