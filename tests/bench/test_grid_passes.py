"""bench/cpu_attention.py's grid: each row is the pass with the median fraction of DRAM
bandwidth, the passes' fractions kept beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_a_row_is_its_median_pass_not_its_first_or_worst():
    from cpu_attention import median_pass

    passes = [{"fraction_of_dram_bw": 0.25, "kernel_ms": 4.0},  # a slow spell
              {"fraction_of_dram_bw": 0.91, "kernel_ms": 1.2},
              {"fraction_of_dram_bw": 0.83, "kernel_ms": 1.3}]
    row = median_pass(passes)
    assert row["fraction_of_dram_bw"] == 0.83 and row["kernel_ms"] == 1.3  # one measured pass
    assert row["fraction_samples"] == [0.25, 0.91, 0.83]  # in pass order
    assert row["kernel_ms_samples"] == [4.0, 1.2, 1.3]
    # an even count takes the upper median, still a measured pass
    assert median_pass(passes[:2])["fraction_of_dram_bw"] == 0.91
    assert median_pass(passes[:1])["fraction_of_dram_bw"] == 0.25
    with pytest.raises(ValueError):
        median_pass([])


def test_grid_groups_are_checked_positive_integers():
    from cpu_attention import parse_groups

    assert parse_groups("1,4,8") == (1, 4, 8)
    assert parse_groups("5") == (5,)
    for bad in ("", "1,,8", "x", "4,0", "-1"):
        with pytest.raises(ValueError, match="--grid-groups"):
            parse_groups(bad)
