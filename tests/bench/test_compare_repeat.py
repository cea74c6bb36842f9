"""compare_policies --repeat: the per-rate median of several real sweeps (median_run)."""

from __future__ import annotations

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
