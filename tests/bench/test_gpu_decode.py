"""bench/gpu_decode.py: its byte count against Llama-3.1-8B's published parameter count, and
one run of the script on CPU (the tiny shape, torch backend)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import gpu_decode  # noqa: E402


def test_bytes_read_per_step_are_the_8b_models_parameters_but_the_embedding():
    cfg = gpu_decode.model_config("llama-3.1-8b")
    embedding = cfg.vocab_size * cfg.hidden_size
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    assert gpu_decode.weight_bytes(cfg, 1) + embedding + norms == 8_030_261_248


def test_a_cpu_run_reports_every_case():
    out = subprocess.run(
        [sys.executable, str(BENCH / "gpu_decode.py"), "--device", "cpu", "--shape", "tiny",
         "--backends", "torch", "--batches", "1,4", "--contexts", "32,64", "--prefill", "48",
         "--repeats", "1", "--json"], capture_output=True, text=True, timeout=300, check=True)
    r = json.loads(out.stdout)
    rows = r["backends"]["torch"]["decode"]
    assert [(x["batch"], x["context"]) for x in rows] == [(1, 32), (4, 32), (1, 64), (4, 64)]
    assert all(x["tokens_per_s"] > 0 and x["fraction_of_roofline"] > 0 for x in rows)
    assert r["backends"]["torch"]["prefill"][0]["tokens"] == 48
