"""Eq. 5's literal cases: π(b) = Full-CPU for b ≤ F, Split-Final for F < b ≤ P, Fused-Assist
for b > P; legal (P, F) = (0, 0) or 0 ≤ F < P; §4.2's static reachability C ≤ F."""

from __future__ import annotations

import pytest

from dualpace.runtime.routing import (
    FULL_CPU,
    FUSED_ASSIST,
    SPLIT_FINAL,
    assist_reachable,
    no_assist,
    parse_thresholds,
    route_for,
)


@pytest.mark.parametrize("b,p,f,route", [
    (1, 0, 0, FUSED_ASSIST),  # (0, 0): every batch b >= 1 exceeds P = 0
    (256, 0, 0, FUSED_ASSIST),
    (16, 32, 16, FULL_CPU),  # b = F
    (17, 32, 16, SPLIT_FINAL),  # F < b
    (32, 32, 16, SPLIT_FINAL),  # b = P
    (33, 32, 16, FUSED_ASSIST),  # b > P
    (1, 1, 0, SPLIT_FINAL),  # F = 0: no batch is Full-CPU
    (2, 1, 0, FUSED_ASSIST),
])
def test_eq5_literal(b, p, f, route):
    assert route_for(b, p, f) == route


def test_legal_pairs():
    assert parse_thresholds("0,0") == (0, 0)
    assert parse_thresholds("32,16") == (32, 16)
    for bad in ("16,16", "8,16", "0,1", "-1,0", "3", "a,b"):
        with pytest.raises(ValueError, match="assist_thresholds"):
            parse_thresholds(bad)


def test_no_assist_is_f_at_c_and_makes_assist_unreachable():
    p, f = no_assist(256)
    assert (p, f) == (257, 256)
    assert all(route_for(b, p, f) == FULL_CPU for b in range(1, 257))
    assert not assist_reachable(256, p, f)  # C <= F: whole-forward GPU path (§4.2)
    assert assist_reachable(257, p, f)
    assert assist_reachable(1, 0, 0)
    assert assist_reachable(33, 32, 16) and assist_reachable(17, 32, 16)
    assert not assist_reachable(16, 32, 16)
