"""compare_policies' host_steal_fraction: the hypervisor's share of the box's CPU time
between two /proc/stat readings."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_steal_is_its_share_of_the_first_eight_fields():
    from common import steal_fraction

    before = [100, 5, 20, 300, 1, 0, 2, 12, 0, 0]
    # +60 user, +30 system, +80 idle, +30 steal; guest (+40, field 9) is inside user already
    after = [160, 5, 50, 380, 1, 0, 2, 42, 40, 0]
    assert steal_fraction(before, after) == 0.15
    assert steal_fraction(before, before) is None  # no time passed
    assert steal_fraction(None, after) is None
    assert steal_fraction(before[:7], after[:7]) is None  # a kernel without the steal field


def test_this_hosts_reading_has_the_steal_field_or_is_absent():
    from common import host_cpu_times

    t = host_cpu_times()
    if Path("/proc/stat").exists():
        assert t is not None and len(t) >= 8 and all(x >= 0 for x in t)
    else:
        assert t is None
