"""bench/mixed_precision_steps.py end to end on a tiny checkpoint: both steps through every
route the process's path has, against fp32, the route this CPU takes named; sizes that
would not reach the routes refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.model import native_stages

BENCH = Path(__file__).resolve().parents[2] / "bench" / "mixed_precision_steps.py"
pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_both_steps_through_every_route(llama_checkpoint):
    path, _ = llama_checkpoint
    proc = _run("--json", "--model", str(path), "--prompt-len", "140", "--decode-rows", "130",
                "--context", "20", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["dtype"] == "bfloat16" and out["gomp_spincount"] == "3000"
    routes = ["torch", "sliced"] + (["gemm"] if out["path"] in cpu_kernels.GEMM_ISAS else [])
    lacks = native_stages.torch_gemm_lacks_arithmetic(torch.bfloat16)
    assert out["default_route"] == ("torch" if not lacks else routes[-1])
    for step, rows in (("prefill", 140), ("decode", 130)):
        res = out["steps"][step]
        assert res["rows"] == rows and res["fp32_ms"] > 0
        assert sorted(res["routes"]) == sorted(routes)
        for r in res["routes"].values():
            assert r["ms"] > 0 and r["vs_fp32"] > 0


def test_rows_within_decode_size_are_refused():
    proc = _run("--decode-rows", str(native_stages.NATIVE_MAX_ROWS))
    assert proc.returncode == 2 and "more than NATIVE_MAX_ROWS" in proc.stderr
