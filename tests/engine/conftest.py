"""Every engine test with fake workers fails on a recorded protocol violation, even when the
engine turned it into an ordinary abort that the test expected anyway."""

from __future__ import annotations

import pytest

from . import fake_workers


@pytest.fixture(autouse=True)
def no_protocol_violations():
    fake_workers.LIVE.clear()
    yield
    found = [v for w in fake_workers.LIVE for v in w.violations]
    fake_workers.LIVE.clear()
    assert not found, f"protocol violations: {found}"
