"""Appendix B's equations on hand-computed cases (Eq. 10-15)."""

from __future__ import annotations

import pytest

from dualpace.profiler.calibration import (
    CalibrationCall,
    assist_terms,
    calibration_constants,
    components,
    profiled_latency,
)


def test_eq10_11_slowest_rank_per_repeat_then_mean_over_repeats():
    # R = 2 repeats of I = 10 calls on two ranks: max per repeat 2.0 and 4.0 -> 0.2, 0.4.
    assert profiled_latency([[1.0, 2.0], [4.0, 3.0]], iters=10) == pytest.approx(0.3)
    assert profiled_latency([[0.5]], iters=5) == pytest.approx(0.1)  # one rank: no max
    with pytest.raises(ValueError):
        profiled_latency([], iters=5)


def test_eq12_13_groups_weigh_equally_and_negative_waits_clip():
    calls = [
        # row group 1: W - G = 3 and 1 -> Q = 2; L + F = 1 and 3 -> O = 2
        CalibrationCall(1, wait=5.0, cuda=2.0, launch=0.5, finalize=0.5),
        CalibrationCall(1, wait=3.0, cuda=2.0, launch=2.0, finalize=1.0),
        # row group 8 (one call): W - G = -1 clips to 0; L + F = 6
        CalibrationCall(8, wait=1.0, cuda=2.0, launch=4.0, finalize=2.0),
    ]
    q, o = calibration_constants(calls)
    assert q == pytest.approx((2.0 + 0.0) / 2)  # not (3 + 1 + 0) / 3: groups weigh equally
    assert o == pytest.approx((2.0 + 6.0) / 2)
    with pytest.raises(ValueError):
        calibration_constants([])


def test_eq14_15_assemble_the_route_components():
    assert assist_terms(q=0.5, o=0.25, g=2.0) == (2.5, 2.25)
    w = {"p": 1.0, "lS": 2.0, "lA": 3.0}
    d = {"p": 0.1, "lS": 0.2, "lA": 0.3}
    c = components(t_p=7.0, t_l=8.0, a_w=0.01, a_r=0.02, h_w=0.04, w=w, d=d)
    assert c.w_p == pytest.approx(0.01 + 1.0 + 0.02)  # t̄_p = a_w + w_p + a_r
    assert c.w_lS == pytest.approx(0.04 + 2.0)  # t̄_lS = h_w + w_lS
    assert c.w_lA == pytest.approx(0.01 + 3.0)  # t̄_lA = a_w + w_lA
    assert (c.t_p, c.t_l, c.d_p, c.d_lS, c.d_lA) == (7.0, 8.0, 0.1, 0.2, 0.3)
