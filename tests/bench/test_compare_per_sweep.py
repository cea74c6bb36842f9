"""compare_policies --simulate --per-sweep: each real sweep simulated with a profile fitted to
its own steps alone, the simulated median validated against the real median, and each sweep
against its own simulation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

RATES = [2.0, 4.0]


def _gpu(rows: int, seconds: float) -> dict:
    return {"kind": "gpu", "seconds": seconds, "beside": 0, "prefill_tokens": 0,
            "decode_rows": rows, "context": 10 * rows, "prefill_context": 0, "link_tokens": 0,
            "carried_rows": 0}


def _run(rate: float, norm: float) -> dict:
    return {"request_rate": rate, "mean_normalized_latency_s": norm, "p99_ttft_ms": 1e4 * norm,
            "p99_itl_ms": 1e3 * norm, "engine_p99_itl_ms": 1e3 * norm}


def _real_sweep(d: Path, pace: float) -> dict:
    """A sweep directory as a --repeat run leaves it: GPU steps at ``pace`` x 1 ms + 0.5 ms a
    row, and its compare.json, whose latencies grow with the pace."""
    d.mkdir(parents=True)
    steps = [_gpu(1 + i % 4, pace * (0.001 + 5e-4 * (1 + i % 4))) for i in range(60)]
    (d / "steps-gpu-only.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    runs = {"gpu-only": [_run(r, pace * 0.001 * r) for r in RATES]}
    (d / "compare.json").write_text(json.dumps({"runs": runs, "sweeps": 1}))
    return runs


def _fake_simulate(model, policy, jobs, args, profile, jitter_seed=None):
    """A simulation whose latency is the profile's fitted GPU overhead (1 ms x the pace of the
    sweep it was fitted to) times the rate: it shows which sweep's steps priced it."""
    base = profile["step_costs_by_policy"][policy]["gpu"]["overhead"]
    return [_run(r, base * r) for r in args.rates]


@pytest.fixture
def three_sweeps(tmp_path, monkeypatch):
    import compare_policies

    monkeypatch.setattr(compare_policies, "simulate_policy", _fake_simulate)
    for i, pace in enumerate((1.0, 1.1, 1.6), 1):  # rep3: the slow sweep
        _real_sweep(tmp_path / f"rep{i}", pace)
    (tmp_path / "compare.json").write_text(json.dumps({"runs": {}, "sweeps": 3}))
    return tmp_path


def _args(out: Path) -> argparse.Namespace:
    return argparse.Namespace(out=str(out), profile=None, max_steal=None, seed=0, repeat=1,
                              rates=RATES, target_factor=3.0)


def test_each_sweep_is_simulated_with_its_own_steps_and_the_median_taken(three_sweeps):
    import compare_policies

    reps = compare_policies.per_sweep_reps(three_sweeps, ["gpu-only"])
    median, each = compare_policies.per_sweep_simulation(
        "m", [], ["gpu-only"], _args(three_sweeps), three_sweeps, reps)
    # each sweep's profile is fitted to its own steps alone: overhead 1 ms x its pace
    for name, pace in (("rep1", 1.0), ("rep2", 1.1), ("rep3", 1.6)):
        prof = json.loads((three_sweeps / name / "profile-measured.json").read_text())
        assert prof["step_costs_by_policy"]["gpu-only"]["gpu"]["overhead"] == pytest.approx(
            0.001 * pace, rel=0.02)
        assert each[name]["profile"] == str(three_sweeps / name / "profile-measured.json")
        # validated against its own sweep: the fake simulation reproduces it
        tail = each[name]["validation"]["gpu-only"]["per_rate"]["4.0"]["p99_ttft_ms"]
        assert tail["error"] == pytest.approx(0.0, abs=0.02)
    # the per-rate median of the three simulated sweeps: rep2's (the pooled fit would
    # have priced every step near the three paces' mean, 1.23)
    assert [r["mean_normalized_latency_s"] for r in median["gpu-only"]] == pytest.approx(
        [0.0011 * r for r in RATES], rel=0.02)


def test_per_sweep_needs_the_sweeps_the_real_median_was_taken_of(three_sweeps, tmp_path):
    import compare_policies

    # three sweeps, a median of three
    assert len(compare_policies.per_sweep_reps(three_sweeps, ["gpu-only"])) == 3
    (three_sweeps / "compare.json").write_text(json.dumps({"runs": {}, "sweeps": 2}))
    with pytest.raises(SystemExit, match=r"median of 2 sweeps but .* holds 3"):
        compare_policies.per_sweep_reps(three_sweeps, ["gpu-only"])
    with pytest.raises(SystemExit, match=r"no .*rep1/compare\.json"):
        compare_policies.per_sweep_reps(tmp_path / "rep1", ["gpu-only"])


def test_per_sweep_flags_are_checked_before_anything_runs(monkeypatch, tmp_path):
    import compare_policies

    for flags, said in ((["--per-sweep"], "is a way to --simulate"),
                        (["--simulate", "--per-sweep", "--sim-profile", "p.json"],
                         "give one of the two")):
        monkeypatch.setattr(sys, "argv", ["compare_policies.py", "--out", str(tmp_path),
                                          *flags])
        with pytest.raises(SystemExit, match=said):
            compare_policies.main()
