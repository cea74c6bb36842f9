"""CPU-tier stalls with Figure 1's meaning: the clock's literal cases, then the engine with
fake workers on a scripted virtual clock (gaps while nothing is ready must not count)."""

from __future__ import annotations

import asyncio

import pytest

from dualpace.engine.llm_engine import LLMEngine
from dualpace.engine.stall import CpuStallClock
from dualpace.engine.state import Limits
from dualpace.sampling.params import SamplingParams

from .fake_workers import FakeWorkers, VirtualClock

STALL = "dualpace:cpu_tier_stall_seconds"
LONGEST = "dualpace:cpu_tier_longest_stall_seconds"


# --- the clock alone ------------------------------------------------------------------------
def test_gap_is_time_since_previous_emission_while_ready():
    c = CpuStallClock()
    c.set_ready(0.0, True)
    assert c.emitted(1.0) == pytest.approx(1.0)
    assert c.emitted(1.5) == pytest.approx(0.5)


def test_not_ready_time_between_emissions_does_not_count():
    c = CpuStallClock()
    c.set_ready(0.0, True)
    c.emitted(1.0)
    c.set_ready(2.0, False)  # ready 1.0-2.0: counts
    c.set_ready(5.0, True)  # 2.0-5.0: nothing could run
    assert c.emitted(6.0) == pytest.approx(2.0)  # 1.0 + 1.0, not 5.0


def test_emission_without_any_ready_time_is_not_a_gap():
    assert CpuStallClock().emitted(3.0) is None


def test_window_max_includes_the_open_stall_and_resets_only_when_closed():
    c = CpuStallClock()
    c.set_ready(0.0, True)
    c.emitted(0.5)
    assert c.window_max(2.0, close=False) == pytest.approx(1.5)  # open since 0.5
    assert c.window_max(2.0, close=True) == pytest.approx(1.5)
    c.emitted(3.0)  # the 2.5 s stall closes
    c.set_ready(3.0, False)
    assert c.window_max(4.0, close=False) == pytest.approx(2.5)
    assert c.window_max(4.0, close=True) == pytest.approx(2.5)
    assert c.window_max(9.0, close=True) == 0.0  # a new window, the tier idle


def test_ready_time_that_ended_without_an_emission_is_not_an_open_stall():
    c = CpuStallClock()
    c.set_ready(0.0, True)
    c.emitted(1.0)
    c.set_ready(1.0, False)
    assert c.window_max(1.5, close=True) == pytest.approx(1.0)  # the closed 1 s gap
    c.set_ready(2.0, True)  # a request became ready ...
    c.set_ready(2.5, False)  # ... and left the tier (swapped in) before running here
    assert c.window_max(9.0, close=True) == 0.0  # nothing is stalled now
    c.set_ready(10.0, True)
    assert c.window_max(10.5, close=False) == pytest.approx(1.0)  # 0.5 earlier + 0.5 open
    assert c.emitted(11.0) == pytest.approx(1.5)  # the next gap counts both ready stretches


# --- the engine on a virtual clock ----------------------------------------------------------
def _engine(clock: VirtualClock, step_time) -> LLMEngine:
    """A GPU pool too small for any prompt (each goes Prefill-to-CPU, one per GPU round by the
    token limit) and a host pool that holds them all."""
    workers = FakeWorkers(clock=clock, step_time=step_time)
    limits = Limits(max_num_seqs=8, gpu_token_limit=16, cpu_batch_limit=8, max_model_len=200,
                    staging_blocks=64)
    return LLMEngine(workers, gpu_blocks=2, host_blocks=64, block_size=4, limits=limits,
                     policy="dualpace", vocab_size=1000, eos_ids=(), clock=clock,
                     on_round=lambda e, k, p: e.state.check_invariants(list(e.requests.values())))


async def _drain(stream) -> list:
    return [d async for d in stream]


def _stalls(eng: LLMEngine):
    return eng.metrics.histograms[STALL]


def test_transfer_time_between_two_requests_is_not_a_stall():
    """A decodes on the CPU tier and finishes at 0.32; B's Prefill-to-CPU lands at 0.6.
    0.32-0.6 the tier holds only B, whose KV is still arriving: not a stall. Every gap is
    one 10 ms CPU step (the old definition reported 0.29 s)."""

    def step_time(kind, batch):
        return 0.3 if kind == "gpu" else 0.01

    async def main():
        clock = VirtualClock()
        eng = _engine(clock, step_time)
        eng.start()
        try:
            a = eng.add_request([5] * 16, SamplingParams(max_tokens=3), 200)
            b = eng.add_request([6] * 16, SamplingParams(max_tokens=3), 200)
            outs = await asyncio.gather(_drain(a), _drain(b))
        finally:
            await eng.stop()
        return eng, outs, clock.now

    eng, outs, end = asyncio.run(main())
    assert all(o[-1].finish_reason == "length" and not o[-1].error for o in outs)
    assert end == pytest.approx(0.62)
    h = _stalls(eng)
    assert h.count == 4  # two CPU tokens each for A and B
    assert h.sum == pytest.approx(0.04)
    assert eng.metrics.samples()[LONGEST] == pytest.approx(0.01)
    assert eng.metrics.samples()['dualpace:generation_tokens_total{engine="cpu"}'] == 4


def test_a_slow_step_while_ready_is_a_stall_and_the_gauge_shows_it_while_open():
    """CPU steps of 10 ms, 2 s, 10 ms: the 2 s gap is observed; a scrape in the middle of it
    reports the stall so far; the scrape window resets on read, a peek does not."""
    cpu_times = [0.01, 2.0, 0.01]

    def step_time(kind, batch):
        return 0.3 if kind == "gpu" else cpu_times.pop(0)

    async def main():
        clock = VirtualClock()
        eng = _engine(clock, step_time)
        eng.start()
        try:
            s = eng.add_request([5] * 16, SamplingParams(max_tokens=4), 200)
            task = asyncio.ensure_future(_drain(s))
            await clock.sleep(1.31)  # 1.0 s into the 2 s step that started at 0.31
            mid = (eng.metrics.samples(close_windows=False)[LONGEST],
                   eng.metrics.samples()[LONGEST], eng.metrics.samples()[LONGEST])
            out = await task
            after = eng.metrics.samples()[LONGEST], eng.metrics.samples()[LONGEST]
        finally:
            await eng.stop()
        return eng, out, mid, after

    eng, out, mid, after = asyncio.run(main())
    assert out[-1].finish_reason == "length" and len([t for d in out for t in d.token_ids]) == 4
    assert mid == pytest.approx((1.0, 1.0, 1.0))  # still open: every read reports it
    assert after == pytest.approx((2.0, 0.0))  # the closed 2 s stall, then a new window
    h = _stalls(eng)
    assert h.count == 3 and h.sum == pytest.approx(2.02)
    samples = eng.metrics.samples()
    assert samples[STALL + '_bucket{le="1.0"}'] == 2  # the two 10 ms steps
    assert samples[STALL + '_bucket{le="2.5"}'] == 3


def test_gpu_only_tokens_never_touch_the_stall_metric():
    async def main():
        clock = VirtualClock()
        workers = FakeWorkers(clock=clock, step_time=lambda k, b: 0.05)
        limits = Limits(max_num_seqs=8, gpu_token_limit=64, cpu_batch_limit=8,
                        max_model_len=200, staging_blocks=64)
        eng = LLMEngine(workers, gpu_blocks=64, host_blocks=64, block_size=4, limits=limits,
                        policy="dualpace", vocab_size=1000, eos_ids=(), clock=clock)
        eng.start()
        try:
            out = await _drain(eng.add_request([5] * 8, SamplingParams(max_tokens=5), 200))
        finally:
            await eng.stop()
        return eng, out, workers

    eng, out, workers = asyncio.run(main())
    assert out[-1].finish_reason == "length"
    assert all(kind == "gpu" for kind, _ in workers.executed)
    assert _stalls(eng).count == 0
    assert eng.metrics.samples()[LONGEST] == 0.0


def test_virtual_clock_orders_completions_by_virtual_time():
    async def main():
        clock = VirtualClock()
        order = []

        async def sleeper(name, d):
            await clock.sleep(d)
            order.append((name, clock.now))

        await asyncio.gather(sleeper("slow", 2.0), sleeper("fast", 0.5), sleeper("mid", 1.0))
        return order

    assert asyncio.run(main()) == [("fast", 0.5), ("mid", 1.0), ("slow", 2.0)]

