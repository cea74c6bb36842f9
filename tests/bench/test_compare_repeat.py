"""compare_policies --repeat: the per-rate median of several real sweeps (median_run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_median_run_takes_every_numbers_median_and_skips_missing_values():
    from compare_policies import median_run

    runs = [{"request_rate": 4.0, "p99_itl_ms": 9.0, "cpu_stall_p99_s": None,
             "assist_calls": {"fused-assist": 10.0}, "note": "a"},
            {"request_rate": 4.0, "p99_itl_ms": 30.0, "cpu_stall_p99_s": 0.02,
             "assist_calls": {"fused-assist": 2.0}, "note": "b"},
            {"request_rate": 4.0, "p99_itl_ms": 10.0, "cpu_stall_p99_s": 0.04,
             "assist_calls": {"fused-assist": 4.0}, "note": "c"}]
    m = median_run(runs)
    assert m["request_rate"] == 4.0
    assert m["p99_itl_ms"] == 10.0  # the median, not the mean (16.3) the outlier drags
    assert m["cpu_stall_p99_s"] == pytest.approx(0.03)  # of the two sweeps that have one
    assert m["assist_calls"] == {"fused-assist": 4.0}
    assert m["note"] == "a"
    assert median_run([{"request_rate": 2.0, "x": None}] * 2)["x"] is None


def test_median_run_refuses_points_at_different_rates():
    from compare_policies import median_run

    with pytest.raises(ValueError, match="different rates"):
        median_run([{"request_rate": 2.0}, {"request_rate": 4.0}])


def _point(rate, steal, itl, window=None):
    return {"request_rate": rate, "host_steal_fraction": steal, "p99_itl_ms": itl,
            "window": window or [0.0, 0.0]}


def test_quiet_points_are_those_the_hypervisor_left_alone():
    from compare_policies import quiet

    assert quiet(_point(2.0, 0.05, 1.0), 0.05) and not quiet(_point(2.0, 0.0501, 1.0), 0.05)
    assert quiet(_point(2.0, 0.9, 1.0), None)  # no threshold: every point counts
    assert not quiet({"request_rate": 2.0}, 0.05)  # unmeasured: cannot say it was quiet


def test_median_sweep_takes_each_rates_quiet_points_or_all_where_none_was():
    from compare_policies import median_sweep

    reps = [{"dualpace": [_point(2.0, 0.01, 10.0), _point(4.0, 0.30, 90.0)]},
            {"dualpace": [_point(2.0, 0.20, 80.0), _point(4.0, 0.25, 70.0)]},
            {"dualpace": [_point(2.0, 0.02, 12.0), _point(4.0, 0.40, 50.0)]}]
    median, counts = median_sweep(reps, ["dualpace"], 0.05)
    assert [r["p99_itl_ms"] for r in median["dualpace"]] == [11.0, 70.0]
    assert counts == {"dualpace": {"2.0": 2, "4.0": 0}}
    every, _ = median_sweep(reps, ["dualpace"], None)
    assert [r["p99_itl_ms"] for r in every["dualpace"]] == [12.0, 70.0]


def test_the_profile_is_fitted_to_the_quiet_points_steps_only(tmp_path, monkeypatch):
    import argparse
    import json

    import compare_policies

    steps = tmp_path / "steps-dualpace.jsonl"
    steps.write_text("".join(json.dumps({"kind": "cpu", "t": t, "n": i}) + "\n"
                             for i, t in enumerate([1.0, 5.0, 11.0, 15.0, 21.0, 25.0])))
    runs = {"dualpace": [_point(2.0, 0.01, 1.0, [0.0, 10.0]), _point(4.0, 0.3, 1.0, [10.0, 20.0]),
                         _point(8.0, 0.0, 1.0, [20.0, 30.0])]}
    fitted = []
    monkeypatch.setattr("dualpace.sim.costs.fit_step_costs",
                        lambda samples, contention=False: fitted.append(samples) or {})
    args = argparse.Namespace(out=str(tmp_path), profile=None, max_steal=0.05)
    compare_policies.fit_measured_profile(["dualpace"], args, [(tmp_path, runs)])
    assert [s["n"] for s in fitted[0]] == [0, 1, 4, 5]  # not the 4 req/s point's steps
    args.max_steal = None
    fitted.clear()
    compare_policies.fit_measured_profile(["dualpace"], args, [(tmp_path, runs)])
    assert [s["n"] for s in fitted[0]] == [0, 1, 2, 3, 4, 5]
    steps.write_text(json.dumps({"kind": "cpu"}) + "\n")  # a log from before the stamps
    args.max_steal = 0.05
    with pytest.raises(SystemExit, match="without a time"):
        compare_policies.fit_measured_profile(["dualpace"], args, [(tmp_path, runs)])


def test_the_profile_gets_a_delivery_model_where_the_sweep_kept_client_times(tmp_path,
                                                                             monkeypatch):
    import json

    import compare_policies

    monkeypatch.setattr("dualpace.sim.costs.fit_step_costs",
                        lambda samples, contention=False: {})
    tokens = [0.01 * (k + 1) for k in range(4)]
    records = [{"kind": "request", "t": 2.0 + i, "arrival": 1.0 + i, "prompt_tokens": 7,
                "tokens": tokens} for i in range(3)]
    (tmp_path / "steps-gated.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = argparse.Namespace(out=str(tmp_path), profile=None, max_steal=None)
    runs = {"gated": [_point(2.0, 0.0, 1.0, [0.0, 10.0])]}
    prof = json.loads(compare_policies.fit_measured_profile(["gated"], args,
                                                            [(tmp_path, runs)]).read_text())
    assert "delivery" not in prof  # no client times kept: nothing to join
    # the client sent each 2 ms before its arrival and got every token 1 ms late
    clients = [{"start": 0.998 + i, "input_len": 7, "ttft": 0.013,
                "itl": [0.01, 0.01, 0.01], "ok": True} for i in range(3)]
    compare_policies.client_log("gated", tmp_path).write_text(json.dumps(clients))
    prof = json.loads(compare_policies.fit_measured_profile(["gated"], args,
                                                            [(tmp_path, runs)]).read_text())
    d = prof["delivery"]
    assert d["matched_requests"] == 3
    assert d["admission"]["quantiles_ms"][0][200] == pytest.approx(2.0)
    assert d["token"]["quantiles_ms"][0][200] == pytest.approx(1.0)
    # a second policy served later, its tokens 3 ms late; a third whose requests all failed
    late = [dict(r, arrival=r["arrival"] + 10, t=r["t"] + 10) for r in records]
    (tmp_path / "steps-dualpace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in late))
    compare_policies.client_log("dualpace", tmp_path).write_text(json.dumps(
        [dict(c, start=c["start"] + 10, ttft=0.015) for c in clients]))
    (tmp_path / "steps-gpu-only.jsonl").write_text("".join(json.dumps(r) + "\n" for r in late))
    compare_policies.client_log("gpu-only", tmp_path).write_text(json.dumps(
        [dict(c, ok=False) for c in clients]))
    runs.update(dualpace=runs["gated"], **{"gpu-only": runs["gated"]})
    prof = json.loads(compare_policies.fit_measured_profile(
        ["dualpace", "gated", "gpu-only"], args, [(tmp_path, runs)]).read_text())
    own = prof["delivery_by_policy"]
    assert set(own) == {"dualpace", "gated"}  # nothing of gpu-only's joined
    assert own["gated"]["token"]["quantiles_ms"][0][200] == pytest.approx(1.0)
    assert own["dualpace"]["token"]["quantiles_ms"][0][200] == pytest.approx(3.0)
    pooled = prof["delivery"]["token"]["quantiles_ms"][0]
    assert [pooled[0], pooled[-1]] == pytest.approx([1.0, 3.0])
    assert prof["delivery"]["matched_requests"] == 6 and prof["delivery"]["client_requests"] == 9
    # only the policy whose requests all failed: no delivery, and the profile still written
    prof = json.loads(compare_policies.fit_measured_profile(
        ["gpu-only"], args, [(tmp_path, runs)]).read_text())
    assert "delivery" not in prof and "delivery_by_policy" not in prof and "format" in prof


def test_resummarize_reads_the_saved_sweeps_and_says_what_is_missing(tmp_path):
    import json

    from compare_policies import saved_sweeps

    with pytest.raises(SystemExit, match=r"no .*rep1/compare\.json"):
        saved_sweeps(tmp_path, ["dualpace"])
    for i in (1, 2):
        (tmp_path / f"rep{i}").mkdir()
        (tmp_path / f"rep{i}" / "compare.json").write_text(json.dumps(
            {"runs": {"dualpace": [_point(2.0, 0.0, float(i))]}}))
    assert [r["dualpace"][0]["p99_itl_ms"] for r in saved_sweeps(tmp_path, ["dualpace"])] == [
        1.0, 2.0]
    with pytest.raises(SystemExit, match="rep1 has no sweep of gated"):
        saved_sweeps(tmp_path, ["dualpace", "gated"])


def test_a_missing_trace_is_said_and_recorded_as_random_jobs(tmp_path, capsys):
    """prepare() replays the trace where it exists; without one it takes random jobs, says
    so on stderr, and workload() names it "random" for the JSON (a sweep from a worktree
    outside the usual tree once compared random jobs with a simulation of the trace)."""
    import compare_policies

    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,12,5\n2023-11-16 18:15:50.1000000,30,9\n")
    args = argparse.Namespace(model="ckpt", out=str(tmp_path / "out"), trace=str(trace),
                              num_requests=2, clip_input=2048, clip_output=256, seed=0)
    model, jobs = compare_policies.prepare(args)
    assert model == "ckpt"
    assert [(len(j.prompt), j.max_tokens) for j in jobs] == [(12, 5), (30, 9)]
    assert compare_policies.workload(args) == str(trace)
    assert "random" not in capsys.readouterr().err
    args.trace = str(tmp_path / "missing.csv")
    _, jobs = compare_policies.prepare(args)
    assert len(jobs) == 2 and compare_policies.workload(args) == "random"
    assert f"no trace at {args.trace}: random jobs instead" in capsys.readouterr().err


def test_a_validation_against_a_single_real_sweep_says_its_reference_is_noisy(tmp_path):
    from compare_policies import reference_warning

    warning = reference_warning({"runs": {}, "sweeps": 1}, tmp_path)
    assert str(tmp_path) in warning and "--repeat 3" in warning
    assert reference_warning({"runs": {}, "sweeps": 3}, tmp_path) is None  # medians
    assert reference_warning({"runs": {}}, tmp_path) is None  # an older file: not stated
