"""histogram_quantile (dualpace.engine.metrics: compare_policies' and dashboard_snapshot's
stall and inter-token p99) on hand-computed histograms, over the
increase between two scrapes; and compare_policies' validation of a simulated sweep."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dualpace.engine.metrics import histogram_quantile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

NAME = "dualpace:cpu_tier_stall_seconds"


def _scrape(counts: dict[str, float]) -> dict[str, float]:
    return {f'{NAME}_bucket{{le="{le}"}}': c for le, c in counts.items()}


def test_linear_inside_the_bucket_holding_the_rank():
    now = _scrape({"1.0": 0, "2.0": 10, "+Inf": 10})
    assert histogram_quantile(0.5, NAME, now) == pytest.approx(1.5)  # 1 + 5/10
    assert histogram_quantile(0.99, NAME, now) == pytest.approx(1.99)


def test_over_the_increase_since_the_previous_scrape():
    before = _scrape({"0.1": 100, "1.0": 100, "+Inf": 100})
    now = _scrape({"0.1": 100, "1.0": 110, "+Inf": 110})  # 10 new gaps, all in (0.1, 1]
    assert histogram_quantile(0.5, NAME, now, before) == pytest.approx(0.55)


def test_rank_in_inf_answers_the_largest_finite_bound_and_empty_is_none():
    assert histogram_quantile(0.99, NAME, _scrape({"0.5": 1, "+Inf": 5})) == 0.5
    assert histogram_quantile(0.99, NAME, _scrape({"0.5": 0, "+Inf": 0})) is None
    assert histogram_quantile(0.99, NAME, {}) is None


def _runs(norms, ttfts):
    return [{"request_rate": r, "mean_normalized_latency_s": n, "p99_ttft_ms": t,
             "p99_itl_ms": 10.0, "engine_p99_itl_ms": 5.0}
            for r, n, t in zip((2.0, 4.0, 8.0), norms, ttfts)]


def test_validation_compares_at_the_real_runs_targets():
    from compare_policies import validation

    real = {"runs": {"gpu-only": _runs((0.01, 0.02, 0.06), (100, 200, 900)),
                     "dualpace": _runs((0.01, 0.02, 0.04), (100, 200, 300))}}
    sim = {"gpu-only": _runs((0.01, 0.025, 0.06), (100, 250, 900)),
           "dualpace": _runs((0.01, 0.02, 0.04), (110, 200, 300))}
    v = validation(real, sim, factor=3.0)
    # target 0.03 s/token (3 x gpu-only's 0.01 at 2 req/s): real gpu-only crosses it at
    # 4 + 4 x (0.03 - 0.02) / (0.06 - 0.02) = 5, simulated at 4 + 4 x 0.005 / 0.035
    g = v["gpu-only"]["sustainable_rate"]
    assert g["real"] == pytest.approx(5.0)
    assert g["simulated"] == pytest.approx(4 + 4 * 0.005 / 0.035)
    assert g["error"] == pytest.approx(round(g["simulated"] / 5.0 - 1, 4))
    assert v["dualpace"]["sustainable_rate"]["real"] == pytest.approx(4 + 4 * 0.01 / 0.02)
    # at 4x the factor (0.12) nothing crosses inside the sweep: null, never extrapolated
    assert v["dualpace"]["sustainable_rate_at_12x"] == {"real": None, "simulated": None,
                                                         "error": None}
    assert v["dualpace"]["per_rate"]["2.0"]["p99_ttft_ms"] == {"real": 100, "simulated": 110,
                                                                "error": 0.1}
    assert v["gpu-only"]["per_rate"]["8.0"]["engine_p99_itl_ms"]["error"] == 0.0


def test_validation_gives_the_real_sweeps_range_and_whether_the_simulation_is_inside():
    import json

    import numpy as np
    from compare_policies import validation

    reps = [{"gpu-only": _runs((0.01, 0.02, 0.06), (100, 150, 900))},
            {"gpu-only": _runs((0.01, 0.02, 0.06), (90, 300, 700))},
            {"gpu-only": _runs((0.01, 0.02, 0.06), (120, 200, 1000))}]
    del reps[2]["gpu-only"][2]["engine_p99_itl_ms"]  # a sweep that did not record one
    real = {"runs": {"gpu-only": _runs((0.01, 0.02, 0.06), (100, 200, 800))}}
    # the simulator's numbers come out of numpy
    sim = {"gpu-only": _runs((0.01, 0.025, 0.06), np.array((130.0, 250.0, 750.0)))}
    full = validation(real, sim, factor=3.0, reps=reps)
    # as --simulate prints it: numpy's values (the interpolated rates) must serialize
    v = json.loads(json.dumps(full))["gpu-only"]
    ttft = v["per_rate"]
    # at 2 req/s the sweeps ran 90-120 ms: 130 is outside, 30% above the median
    assert ttft["2.0"]["p99_ttft_ms"] == {"real": 100, "simulated": 130, "error": 0.3,
                                          "real_range": [90, 120],
                                          "within_real_range": False}
    # at 4 req/s 150-300: 250 inside, though 25% above the median
    assert ttft["4.0"]["p99_ttft_ms"]["real_range"] == [150, 300]
    assert ttft["4.0"]["p99_ttft_ms"]["within_real_range"] is True
    assert ttft["8.0"]["p99_ttft_ms"]["real_range"] == [700, 1000]
    # a sweep without the value counts as none: the others' range
    assert ttft["8.0"]["engine_p99_itl_ms"]["real_range"] == [5.0, 5.0]
    # every sweep crosses the 0.03 s/token target at 5 req/s: a range of one value
    assert v["sustainable_rate"]["real_range"] == [pytest.approx(5.0)] * 2
    assert v["sustainable_rate"]["within_real_range"] is False
    # without the sweeps (or with one) the entries say nothing of a range
    assert "real_range" not in validation(real, sim, factor=3.0)["gpu-only"][
        "sustainable_rate"]
    assert "real_range" not in validation(real, sim, 3.0, reps[:1])["gpu-only"]["per_rate"][
        "2.0"]["p99_ttft_ms"]


def test_a_rate_on_one_side_only_says_where_the_other_curve_ran():
    from compare_policies import validation

    # gated's case: the real curve just under the target at the lowest rate, the simulated
    # one just over it (target 3 x gpu-only's 0.01 = 0.03 s/token)
    ref = _runs((0.01, 0.02, 0.06), (100, 200, 300))
    real = {"runs": {"gpu-only": ref, "gated": _runs((0.029, 0.05, 0.07), (100, 200, 300))}}
    sim = {"gpu-only": ref, "gated": _runs((0.031, 0.05, 0.07), (100, 200, 300))}
    v = validation(real, sim, factor=3.0)["gated"]["sustainable_rate"]
    assert v["real"] == pytest.approx(2 + 2 * 0.001 / 0.021) and v["simulated"] is None
    assert v["one_sided"] == {"outside": "simulated", "where": "below", "rate": 2.0,
                              "real_metric": 0.029, "simulated_metric": 0.031,
                              "metric_error": 0.069, "target": pytest.approx(0.03)}
    # the other way: the simulated curve crosses by 8 req/s, the real one never does
    real["runs"]["gated"] = _runs((0.01, 0.02, 0.029), (100, 200, 300))
    sim["gated"] = _runs((0.01, 0.02, 0.04), (100, 200, 300))
    one = validation(real, sim, factor=3.0)["gated"]["sustainable_rate"]["one_sided"]
    assert (one["outside"], one["where"], one["rate"]) == ("real", "beyond", 8.0)
    assert one["metric_error"] == pytest.approx(0.04 / 0.029 - 1, abs=1e-4)
    # both sides with a rate, or neither: nothing to explain
    v = validation(real, real["runs"], factor=3.0)["gated"]
    assert "one_sided" not in v["sustainable_rate"]
    assert "one_sided" not in v["sustainable_rate_at_12x"]
