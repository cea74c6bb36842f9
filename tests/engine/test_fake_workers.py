"""The fake workers' own model of the wire (tests/engine/fake_workers.py): what they flag
must be what a real worker could not execute, and nothing else, or the scheduler tests
report protocol violations the engine never made."""

from __future__ import annotations

import asyncio

from dualpace.runtime import protocol as P

from .fake_workers import FakeWorkers


def _spec() -> P.SamplingSpec:
    return P.SamplingSpec(temperature=0.0, top_p=1.0, top_k=0, seed=0, logprobs=-1,
                          prompt_logprobs=-1)


def test_a_release_at_an_idle_group_keeps_the_kv_a_step_queued_elsewhere_reads():
    """Found by test_random_workloads on a slow host: a request known to both groups (it
    swapped out and back in) finishes while a GPU decode submitted ahead is still queued;
    its release reaches the idle CPU group at once and the GPU group behind that step. The
    step must still find the request's KV (its worker holds it until its own release)."""
    async def scenario():
        w = FakeWorkers(delay=0.001)
        for g in (w.gpu, w.cpu):
            g.send(P.NewRequest(req_id=7, sampling=_spec()))
        prefill = w.gpu.submit(P.GpuBatch(step_id=1, seqs=[P.SeqStep(
            req_id=7, token_ids=[1, 2, 3], start_pos=0, new_blocks=[0], reset=True)]))
        ahead = w.gpu.submit(P.GpuBatch(step_id=2, seqs=[P.SeqStep(
            req_id=7, token_ids=[P.PREVIOUS_TOKEN], start_pos=3, out_index=1)]))
        await prefill
        for g in (w.cpu, w.gpu):  # the CPU group is idle, the GPU group has `ahead` queued
            g.send(P.Release(req_ids=[7]))
        done = await ahead
        await asyncio.sleep(0.01)  # the GPU group's release, queued behind `ahead`
        return w, done

    w, done = asyncio.run(scenario())
    assert w.violations == []
    assert done.tokens and done.tokens[0] > 0
    assert 7 not in w.kv_len and 7 not in w.gpu.known and 7 not in w.cpu.known


def test_a_step_after_both_releases_is_still_flagged():
    async def scenario():
        w = FakeWorkers()
        w.gpu.send(P.NewRequest(req_id=7, sampling=_spec()))
        await w.gpu.submit(P.GpuBatch(step_id=1, seqs=[P.SeqStep(
            req_id=7, token_ids=[1, 2, 3], start_pos=0, new_blocks=[0], reset=True)]))
        w.gpu.send(P.Release(req_ids=[7]))
        try:
            await w.gpu.submit(P.GpuBatch(step_id=2, seqs=[P.SeqStep(
                req_id=7, token_ids=[4], start_pos=3, out_index=1)]))
        except AssertionError:
            pass
        return w

    w = asyncio.run(scenario())
    assert w.violations == ["gpu worker never introduced to 7"]
    w.violations.clear()  # expected here: conftest fails a test on any recorded violation
