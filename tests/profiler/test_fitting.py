"""Algorithm 1, PAVA and the plateau rule on hand-made inputs with known answers."""

from __future__ import annotations

import pytest

from dualpace.profiler.fitting import (
    FULL_CPU,
    FUSED_ASSIST,
    SPLIT_FINAL,
    Components,
    choose_thresholds,
    pava,
    peak_batch,
    plateau_limit,
    route_scores,
)


def _scores(table):
    return {b: dict(zip((FULL_CPU, SPLIT_FINAL, FUSED_ASSIST), row)) for b, row in table.items()}


def test_algorithm1_exact_minimum_without_tolerance():
    # Full-CPU best up to 16, Split-Final best at 32, Fused-Assist best from 64.
    s = _scores({8: (1.0, 2.0, 5.0), 16: (2.0, 2.5, 5.0), 32: (6.0, 4.0, 5.0),
                 64: (12.0, 8.0, 6.0)})
    assert choose_thresholds(s, num_layers=4, eps=0.0) == (32, 16)


def test_algorithm1_tolerance_prefers_fewer_assist_calls():
    # Fused-Assist at 64 saves only 1% over Split-Final: within eps=2% the pair with fewer
    # average assist calls wins (Split-Final everywhere above 16).
    s = _scores({8: (1.0, 2.0, 5.0), 16: (2.0, 2.5, 5.0), 32: (6.0, 4.0, 5.0),
                 64: (12.0, 8.08, 8.0)})
    assert choose_thresholds(s, num_layers=32, eps=0.0) == (32, 16)
    assert choose_thresholds(s, num_layers=32, eps=0.02) == (64, 16)


def test_algorithm1_fused_assist_everywhere_gives_zero_zero():
    # Eq. 5 read literally: (0, 0) routes every batch b >= 1 to Fused-Assist.
    s = _scores({1: (9.0, 8.0, 1.0), 4: (9.0, 8.0, 2.0), 16: (9.0, 8.0, 3.0)})
    assert choose_thresholds(s, num_layers=8, eps=0.0) == (0, 0)


def test_algorithm1_full_cpu_everywhere_keeps_split_final_at_the_largest_batch():
    # Θ's pairs have F < P with both in B ∪ {0}: the largest profiled batch is never
    # Full-CPU. The best pair is (16, 4): Full-CPU to 4, Split-Final at 16 (mean 7/3).
    # No assist at all is F >= C, a deployment's choice (§4.2), not one of Θ's pairs.
    s = _scores({1: (1.0, 3.0, 9.0), 4: (2.0, 3.5, 9.0), 16: (3.0, 4.0, 9.0)})
    assert choose_thresholds(s, num_layers=8, eps=0.0) == (16, 4)


def test_route_scores_follow_eq6_to_8():
    c = Components(t_p=1.0, t_l=2.0, w_p=0.5, w_lS=1.5, w_lA=0.7, d_p=0.1, d_lS=0.3, d_lA=0.2)
    s = route_scores(c, num_layers=10, lam=2.0)
    assert s[FULL_CPU] == pytest.approx(10 * 1.0 + 2.0)
    assert s[SPLIT_FINAL] == pytest.approx(10 * 1.0 + 1.5 + 2.0 * 0.3)
    assert s[FUSED_ASSIST] == pytest.approx(9 * 0.5 + 0.7 + 2.0 * (9 * 0.1 + 0.2))


def test_pava_known_answers():
    assert pava([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert pava([5, 4, 3]) == [4, 4, 4]
    assert pava([1, 2, 3]) == [1, 2, 3]
    assert pava([3, 1], [1, 3]) == [1.5, 1.5]


def test_plateau_rule_picks_the_earliest_point_near_the_plateau():
    tokens = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    thr = [50, 90, 150, 190, 199.5, 200.2, 199.8, 200.1, 200.0]
    # Fitted tail (last 5) ~ 200: the first point within 1% is 1024.
    assert plateau_limit(tokens, thr, k=5, delta=0.01) == 1024
    assert plateau_limit(tokens, thr, k=5, delta=0.10) == 512


def test_peak_batch():
    assert peak_batch([1, 8, 32, 128, 256], [10, 70, 200, 260, 250]) == 128
    assert peak_batch([1, 2], [5, 5]) == 1
    with pytest.raises(ValueError):
        peak_batch([], [])
