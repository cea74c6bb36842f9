"""A real (quick) `dualpace profile` run on a tiny checkpoint, then serving with it."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from dualpace import LLM, SamplingParams
from dualpace.runtime.routing import route_for


def test_profile_then_serve_with_it(llama_checkpoint, tmp_path):
    path, _ = llama_checkpoint
    out = tmp_path / "prof"
    r = subprocess.run([sys.executable, "-m", "dualpace", "profile", "--model", str(path),
                        "--gpu-device", "cpu", "--gpu-kv-blocks", "32", "--cpu-kv-gib", "0.05",
                        "--max-num-seqs", "16", "--out", str(out), "--quick"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    prof = json.loads((out / "profile.json").read_text())
    assert prof["format"] == 2
    p, f = prof["assist_thresholds"]
    assert (p, f) == (0, 0) or 0 <= f < p
    assert prof["routes"] == {str(b): route_for(b, p, f) for b in (1, 4, 16)}
    assert prof["cpu_batch_limit"] in (1, 4, 16)
    # Appendix B: calibration calls of every path and row with GPU-main busy (W/R/I quick),
    # and the components assembled by Eq. 14-15 from what was measured.
    ab = prof["appendix_b"]
    for x in ("p", "lS", "lA"):
        assert ab["calibration"][x]["calls"] == 3 * 3
        assert ab["calibration"][x]["q_s"] >= 0 and ab["calibration"][x]["o_s"] > 0
    # the calibration load's decode step alone, and half of one of its layer stages
    layers = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    step = ab["calibration_gpu_main_step_s"]
    assert step > 0
    assert ab["calibration_half_stage_s"] == pytest.approx(step / layers / 2)
    for b in ("1", "4", "16"):
        pr, g, c = ab["cpu_primitives_s"][b], ab["gpu_cuda_s"][b], prof["components"][b]
        q = {x: ab["calibration"][x]["q_s"] for x in ("p", "lS", "lA")}
        o = {x: ab["calibration"][x]["o_s"] for x in ("p", "lS", "lA")}
        assert c["w_p"] == pytest.approx(pr["a_w"] + q["p"] + g["p"] + pr["a_r"])
        assert c["w_lS"] == pytest.approx(pr["h_w"] + q["lS"] + g["lS"])
        assert c["w_lA"] == pytest.approx(pr["a_w"] + q["lA"] + g["lA"])
        assert c["d_p"] == pytest.approx(o["p"] + g["p"])
        assert all(v > 0 for v in (*pr.values(), *g.values()))
    assert len(prof["gpu_prefill"]["tokens"]) >= 5  # the plateau rule's K distinct n
    assert prof["cpu_dtype"] in ("float32", "bfloat16")
    if prof["max_num_batched_tokens_rule"].startswith("plateau"):
        assert prof["max_num_batched_tokens"] in prof["gpu_prefill"]["tokens"]
    else:  # a flat throughput curve keeps the configured limit
        assert prof["max_num_batched_tokens"] == 2048
    fitted = prof["gpu_prefill"]["fitted"]
    assert all(a <= b for a, b in itertools.pairwise(fitted))
    for b, scores in prof["route_scores"].items():
        assert set(scores) == {"full-cpu", "split-final", "fused-assist"}
        assert all(v > 0 for v in scores.values()), b
    assert (out / "profile.png").stat().st_size > 0
    with LLM(str(path), gpu_device="cpu", gpu_kv_blocks=32, cpu_kv_gib=0.05,
             profile=str(out / "profile.json")) as llm:
        assert llm.config.profile
        o = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))[0]
        assert len(o.token_ids) == 4
