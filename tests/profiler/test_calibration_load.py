"""The calibration's GPU-main load (Appendix B): a decoding population, and the window in
which an assist call may be issued so that it meets decode steps only."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

from dualpace.profiler.run import GpuLoad
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
