"""bench/serve_ab.py's summary: medians per side and the median of per-pair ratios."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from serve_ab import summarize


def test_pairs_are_compared_pair_by_pair():
    # B drifts 2x slower over the run; A is 10% faster than B within every pair
    b = [(0.004 * (1 + i / 4), 0.0004) for i in range(5)]
    a = [(t * 0.9, c * 0.5) for t, c in b]
    s = summarize(a, b)
    assert s["pairs"] == 5 and s["a_faster_in"] == 5
    assert s["a_over_b"] == pytest.approx(0.9) and s["a_over_b_engine_cpu"] == 0.5
    assert s["b_ms_per_token"] == pytest.approx(6.0)  # the median of 4, 5, 6, 7, 8 ms
    assert s["a_ms_per_token"] == pytest.approx(5.4)


def test_a_cpu_time_below_the_clock_tick_is_left_out_of_the_cpu_ratio():
    s = summarize([(0.005, 0.0), (0.005, 0.0002)], [(0.004, 0.0), (0.005, 0.0001)])
    assert s["a_over_b_engine_cpu"] == 2.0
    assert s["a_faster_in"] == 0 and s["a_over_b"] == pytest.approx((1.25 + 1.0) / 2)


def test_unequal_sides_are_refused():
    with pytest.raises(ValueError, match="as many requests"):
        summarize([(0.1, 0.0)], [])
