"""Abort in every state frees every block exactly once (fake workers with slow steps)."""

from __future__ import annotations

import asyncio

import pytest

from dualpace.engine.request import Owner
from dualpace.sampling.params import SamplingParams

from .fake_workers import FakeWorkers, fake_engine


def _engine(gpu_blocks=12, host_blocks=64, delay=0.02):
    workers = FakeWorkers(delay=delay)
    return fake_engine(workers, gpu_blocks=gpu_blocks, host_blocks=host_blocks,
                       cpu_batch_limit=2), workers


async def _assert_drained(eng, settle: float) -> None:
    """After ``settle`` seconds no request is left and every KV block is free."""
    await asyncio.sleep(settle)
    assert eng.state.gpu_pool.num_used == 0 and eng.state.host_pool.num_used == 0
    assert not eng.requests


async def _drain(stream):
    out = []
    async for d in stream:
        out.append(d)
    return out


async def _until(pred, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.001)


def _params(n=200):
    return SamplingParams(max_tokens=n, temperature=0)


@pytest.mark.parametrize("state", ["waiting", "gpu-running", "mid-prefill-to-cpu",
                                   "cpu-running", "mid-swap-out"])
def test_abort_in_every_state(state):
    async def main():
        eng, _ = _engine()
        eng.start()
        try:
            if state == "waiting":  # queued behind others, aborted before any step took it
                blockers = [eng.add_request([1] * 40, _params(), 1000) for _ in range(4)]
                s = eng.add_request([2] * 8, _params(), 1000)
                assert eng.requests[s.rid] in eng.state.gpu_waiting
            elif state == "gpu-running":
                s = eng.add_request([2] * 8, _params(), 1000)
                await _until(lambda: eng.requests[s.rid].out)
                blockers = []
            elif state == "mid-prefill-to-cpu":
                blockers = [eng.add_request([1] * 40, _params(), 1000)]
                await _until(lambda: eng.requests[blockers[0].rid].out)
                s = eng.add_request([3] * 30, _params(), 1000)
                await _until(lambda: eng.requests[s.rid].owner is Owner.CPU
                             and eng.requests[s.rid].in_flight == "gpu")
            elif state == "cpu-running":
                blockers = [eng.add_request([1] * 40, _params(), 1000)]
                await _until(lambda: eng.requests[blockers[0].rid].out)
                s = eng.add_request([3] * 30, _params(), 1000)
                await _until(lambda: eng.requests[s.rid].owner is Owner.CPU
                             and eng.requests[s.rid].in_flight == "cpu")
            else:  # a GPU request evicted to the host while its copy is in flight
                blockers = [eng.add_request([1] * 4, _params(), 1000) for _ in range(3)]
                s = blockers[-1]
                await _until(lambda: s.rid in eng.requests and
                             eng.requests[s.rid].owner is Owner.CPU
                             and eng.requests[s.rid].in_flight == "gpu", timeout=10)
            eng.abort(s.rid)
            deltas = await asyncio.wait_for(_drain(s), 5)
            assert deltas[-1].finished and deltas[-1].finish_reason == "abort"
            for b in blockers:
                if b is not s:
                    eng.abort(b.rid)
            await asyncio.wait_for(asyncio.gather(*(_drain(b) for b in blockers if b is not s)),
                                   5)
            await _assert_drained(eng, 0.1)
        finally:
            await eng.stop()

    asyncio.run(main())


def test_gated_abort_between_selection_and_dispatch_waits_for_the_step():
    """An abort that arrives right after the gated loop selected a CPU decode, before the
    step is dispatched: the request is already in flight, so it finishes when the step
    returns, and the rest of the CPU batch is untouched (before, its Release reached the
    CPU worker ahead of the step, which refused a request it no longer knew and the whole
    batch was aborted)."""
    async def main():
        workers = FakeWorkers(delay=0.01)
        eng = fake_engine(workers, gpu_blocks=12, host_blocks=64, policy="gated", check=False)
        aborted: list[int] = []
        select = eng._gated_selection

        def select_then_abort(plan):
            sel = select(plan)
            if len(sel.cpu) >= 2 and not aborted:
                aborted.append(sel.cpu[0].rid)
                eng.abort(sel.cpu[0].rid)  # a client went away: no await in between
            return sel

        eng._gated_selection = select_then_abort
        eng.start()
        try:
            streams = [eng.add_request([5 + i] * 30, _params(12), 1000) for i in range(4)]
            outs = await asyncio.wait_for(asyncio.gather(*(_drain(s) for s in streams)), 20)
        finally:
            await eng.stop()
        return streams, outs, aborted

    streams, outs, aborted = asyncio.run(main())
    assert aborted, "no CPU batch of two or more was selected"
    for s, deltas in zip(streams, outs):
        last = deltas[-1]
        assert last.error is None, last.error
        assert last.finish_reason == ("abort" if s.rid == aborted[0] else "length")


def test_a_failed_step_carrying_a_swap_in_releases_both_ends():
    """A GPU step that fails while it carries a swap-in: its requests fail with the error,
    and neither the host source blocks (held until the step returns) nor the GPU
    destination blocks leak; the others finish."""
    async def main():
        eng, workers = _engine(gpu_blocks=12, host_blocks=64, delay=0.002)
        workers.fail_step = lambda kind, b: (kind == "gpu" and bool(b.swap_in)
                                             and not workers.failed_steps)
        eng.start()
        try:
            streams = [eng.add_request([5 + i] * 30, _params(12), 1000) for i in range(6)]
            outs = await asyncio.wait_for(asyncio.gather(*(_drain(s) for s in streams)), 20)
            assert len(workers.failed_steps) == 1, "no swap-in step was ever dispatched"
            failed = {m.req_id for m in workers.failed_steps[0].swap_in}
            failed |= {q.req_id for q in workers.failed_steps[0].seqs}
            for s, deltas in zip(streams, outs):
                end = deltas[-1]
                if s.rid in failed:
                    assert end.finish_reason == "abort" and "injected" in end.error
                else:
                    assert end.finish_reason == "length" and end.error is None
            await _assert_drained(eng, 0.05)
        finally:
            await eng.stop()

    asyncio.run(main())
