"""bench/common.histogram_quantile (compare_policies' and dashboard_snapshot's stall p99) on
hand-computed histograms, over the increase between two scrapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import histogram_quantile

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
