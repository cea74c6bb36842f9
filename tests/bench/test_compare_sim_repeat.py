"""compare_policies --simulate --repeat N: N jitter seeds, their per-rate median."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_each_seed_is_its_own_sweep_and_the_result_their_median(monkeypatch):
    import compare_policies

    seen = []

    def fake(model, policy, jobs, args, profile, jitter_seed=None):
        seen.append((policy, jitter_seed))
        k = jitter_seed - args.seed  # 0, 1, 2: latency grows with the seed
        return [{"request_rate": r, "mean_normalized_latency_s": 0.001 * (1 + k) * r,
                 "p99_ttft_ms": 100.0 * (1 + k), "p99_itl_ms": 10.0, "engine_p99_itl_ms": 9.0}
                for r in args.rates]

    monkeypatch.setattr(compare_policies, "simulate_policy", fake)
    args = argparse.Namespace(seed=7, repeat=3, rates=[2.0, 4.0], target_factor=3.0)
    median, per_seed = compare_policies.simulated_sweeps("m", [], ["gpu-only", "dualpace"],
                                                         args, {})
    assert sorted(seen) == sorted((p, s) for p in ("gpu-only", "dualpace") for s in (7, 8, 9))
    assert [r["mean_normalized_latency_s"] for r in median["dualpace"]] == [0.004, 0.008]
    assert [r["p99_ttft_ms"] for r in median["gpu-only"]] == [200.0, 200.0]
    assert len(per_seed) == 3 and set(per_seed[0]) == {"gpu-only", "dualpace"}
    one = argparse.Namespace(seed=7, repeat=1, rates=[2.0], target_factor=3.0)
    single, none = compare_policies.simulated_sweeps("m", [], ["gpu-only"], one, {})
    assert none == [] and single["gpu-only"][0]["p99_ttft_ms"] == 100.0
