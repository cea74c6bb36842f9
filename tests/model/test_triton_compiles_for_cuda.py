"""The Triton attention kernels compile for real GPUs, checked without one: every launch the
decode and prefill functions make (recorded, not run) goes through Triton's whole compiler,
ptxas included, for Hopper (sm_90: H100/H200), Ada (sm_89: the paper's RTX 4090) and Ampere
(sm_80). The interpreter tests (test_attention_triton.py) check the numbers; these check
what only a GPU build enforces (tests/model/triton_aot.py says why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]

LENS = [1, 37, 150]  # one token, a ragged tail, several splits
CASES = [  # the block sizes (4 and 8 take a multi-block key tile), dtypes and GQA shapes
    {"hq": 8, "hkv": 2, "d": 64, "bs": 4, "dtype": "float32"},  # the CPU worker tests' blocks
    {"hq": 4, "hkv": 4, "d": 64, "bs": 8, "dtype": "float16"},
    {"hq": 32, "hkv": 8, "d": 128, "bs": 16, "dtype": "bfloat16"},  # Llama-3.1-8B
    {"hq": 16, "hkv": 2, "d": 80, "bs": 32, "dtype": "bfloat16"},
    {"hq": 40, "hkv": 8, "d": 96, "bs": 64, "dtype": "float32"},
    {"hq": 4, "hkv": 2, "d": 8, "bs": 16, "dtype": "float32"},  # head dim under tl.dot's 16
]


def _compile(cases: list[dict], capabilities: list[int]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    spec = json.dumps({"cases": [dict(c, lens=LENS) for c in cases],
                       "capabilities": capabilities})
    proc = subprocess.run([sys.executable, "-m", "tests.model.triton_aot", spec], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_launch_compiles_for_hopper_ada_and_ampere():
    results = _compile(CASES, [90, 89, 80])
    failed = [(r["kernel"], r["sm"], r["case"], r.get("error")) for r in results
              if not r["ok"]]
    assert not failed, failed
    kernels = {r["kernel"] for r in results}
    assert kernels == {"_decode_split_kernel", "_decode_merge_kernel", "_prefill_kernel"}
    # every case reached the compiler for every target, once per distinct launch
    assert {(r["case"]["bs"], r["sm"]) for r in results} >= {
        (c["bs"], sm) for c in CASES for sm in (90, 89, 80)}
