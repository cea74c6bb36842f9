"""The calibration's GPU-main load (Appendix B): a decoding population, and the window in
which an assist call may be issued so that it meets decode steps only."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
from types import SimpleNamespace

import pytest

from dualpace.profiler.run import GpuLoad, issue_spaced
from dualpace.runtime import protocol as P


class _Gpu:
    """Records each step as it is issued: prefill or decode, and whether a call issued at
    that moment would have been let through."""

    def __init__(self):
        self.load: GpuLoad | None = None
        self.seen: list[tuple[str, bool]] = []
        self.sent: list[type] = []

    def send(self, msg) -> None:
        self.sent.append(type(msg))

    async def step(self, batch: P.GpuBatch) -> None:
        kind = "prefill" if len(batch.seqs[0].token_ids) > 1 else "decode"
        self.seen.append((kind, self.load.decoding.is_set()))
        await asyncio.sleep(0)


def _load(steps: int, blocks: int = 1000):
    gpu = _Gpu()
    rt = SimpleNamespace(config=SimpleNamespace(block_size=16, gpu_kv_blocks=blocks), gpu=gpu)
    load = GpuLoad(rt, rows=4, context=32, steps=steps, ids=itertools.count())
    gpu.load = load
    return load, gpu


def test_calls_are_let_through_only_while_no_prefill_can_follow():
    load, gpu = _load(steps=5)
    times = asyncio.run(load.run(populations=2))
    population = [("prefill", False), *[("decode", True)] * 4, ("decode", False)]
    assert gpu.seen == population * 2
    assert len(times) == 10 and all(t >= 0 for t in times)
    assert not load.decoding.is_set()  # and closed once the load stops
    assert gpu.sent.count(P.Release) == 2 and gpu.sent.count(P.NewRequest) == 8


def test_a_cancelled_load_closes_the_window_and_releases_its_population():
    async def main():
        load, gpu = _load(steps=1000)
        task = asyncio.create_task(load.run())
        while len(gpu.seen) < 10:
            await asyncio.sleep(0)
        assert load.decoding.is_set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return load, gpu

    load, gpu = asyncio.run(main())
    assert not load.decoding.is_set()
    assert gpu.sent[-1] is P.Release


def test_rows_shrink_to_the_block_pool():
    load, _ = _load(steps=31, blocks=10)  # 32 + 31 + 1 tokens: 4 blocks a row
    assert load.per_req == 4 and load.rows == 2


class _StageClock:
    """GPU-main on a virtual clock: stage boundaries every ``stage`` seconds; a call waits
    for the next boundary, then runs ``g`` seconds (the GPU holds the stage meanwhile)."""

    def __init__(self, stage: float, g: float):
        self.stage, self.g, self.now = stage, g, 0.0
        self.waits: list[float] = []

    def sleep(self, dt: float) -> None:
        assert dt >= 0
        self.now += dt

    def call(self) -> None:
        boundary = -(-self.now // self.stage) * self.stage  # the next boundary, or now
        self.waits.append(boundary - self.now)
        self.now = boundary + self.g


def test_each_call_waits_for_its_pause_then_for_decoding():
    events: list[tuple] = []
    pauses = issue_spaced(5, 0.004, random.Random(7), lambda: events.append(("ready",)) or True,
                          lambda: events.append(("call",)), lambda dt: events.append(("sleep", dt)))
    assert len(pauses) == 5 and all(0.0 <= p < 0.004 for p in pauses)
    assert events == [e for p in pauses for e in (("sleep", p), ("ready",), ("call",))]
    assert len(set(pauses)) == 5  # drawn, not a fixed spacing
    assert pauses == issue_spaced(5, 0.004, random.Random(7), lambda: True, lambda: None,
                                  lambda dt: None)


def test_a_load_that_stopped_decoding_gets_no_call():
    calls: list[int] = []
    with pytest.raises(RuntimeError, match="stopped decoding"):
        issue_spaced(3, 0.001, random.Random(1), lambda: False, lambda: calls.append(1),
                     lambda dt: None)
    assert calls == []


def test_spaced_calls_wait_half_a_stage_where_back_to_back_calls_wait_a_whole_one():
    """The reason for the pause: a call issued the moment its predecessor returns lands
    just after a boundary (plus the GPU time) and waits a stage less that; spaced over one
    whole step (N = 8 stages), calls arrive at a uniform phase and wait half a stage."""
    stage, g = 1.0e-3, 0.1e-3
    tight = _StageClock(stage, g)
    issue_spaced(400, 0.0, random.Random(3), lambda: True, tight.call, tight.sleep)
    assert statistics.mean(tight.waits[1:]) == pytest.approx(stage - g, rel=1e-6)
    spaced = _StageClock(stage, g)
    issue_spaced(400, 8 * stage, random.Random(3), lambda: True, spaced.call, spaced.sleep)
    assert 0.42 * stage < statistics.mean(spaced.waits) < 0.58 * stage
