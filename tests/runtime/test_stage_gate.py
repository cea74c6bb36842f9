"""Event-polled stage boundaries (runtime/stage_gate.py): at most ``depth`` main stages
outstanding on the device, ready assists served while the host waits."""

from __future__ import annotations

import pytest

from dualpace.runtime.stage_gate import StageGate


class FakeDevice:
    """Stages complete in order, one per ``tick``: an event is done once the device has
    ticked past the stage it was recorded after."""

    def __init__(self):
        self.enqueued = 0
        self.completed = 0

    def record(self):
        self.enqueued += 1
        n, dev = self.enqueued, self

        class Event:
            def query(self):
                return dev.completed >= n

        return Event()

    def tick(self):
        if self.completed < self.enqueued:
            self.completed += 1


def test_at_most_depth_stages_are_outstanding_and_assists_are_served_meanwhile():
    dev = FakeDevice()
    served = []

    def serve_ready():
        dev.tick()  # the device progresses while the host polls
        if dev.completed == 3 and not served:
            served.append(dev.enqueued - dev.completed)  # stages ahead of the assist
            return True
        return False

    gate = StageGate(dev.record, serve_ready, depth=2)
    for _ in range(8):
        gate.stage_enqueued()
        assert gate.outstanding <= 2
        assert dev.enqueued - dev.completed <= 2
    assert served == [2]  # the assist was enqueued behind exactly the two queued stages
    assert gate.served_while_waiting == 1 and gate.waits == 6
    gate.drain()
    assert gate.outstanding == 0


def test_depth_one_and_followers_wait_without_serving(monkeypatch):
    dev = FakeDevice()
    yields = []
    monkeypatch.setattr("os.sched_yield", lambda: (yields.append(1), dev.tick()))
    gate = StageGate(dev.record, None, depth=1)
    for _ in range(4):
        gate.stage_enqueued()
        assert dev.enqueued - dev.completed <= 1
    assert len(yields) == 3  # every stage after the first waited for its predecessor


def test_off_cuda_the_gate_is_inert_and_depth_is_checked():
    gate = StageGate(None, lambda: pytest.fail("served"), depth=2)
    for _ in range(5):
        gate.stage_enqueued()
    assert gate.outstanding == 0 and gate.waits == 0
    with pytest.raises(ValueError, match="depth must be >= 1"):
        StageGate(None, None, depth=0)
