"""Parallel sampling (n > 1) in the scheduler, with fake workers that track which positions
of each request's KV were written: one prefill per group, the prompt's KV forked into the
siblings' blocks in the step that completes it, on either destination (Prefill-to-GPU,
Prefill-to-CPU), and every way a group can come apart (an abort of the first request
mid-prefill, of a sibling while its blocks are being filled)."""

from __future__ import annotations

import asyncio

import pytest

from dualpace.engine.llm_engine import _int64
from dualpace.runtime import protocol as P
from dualpace.sampling.params import SamplingParams

from .fake_workers import FakeWorkers, fake_engine, fake_token


def _engine(gpu_blocks=40, host_blocks=80, token_limit=64, max_seqs=8, policy="dualpace",
            delay=0.002):
    workers = FakeWorkers(delay=delay)
    eng = fake_engine(workers, gpu_blocks=gpu_blocks, host_blocks=host_blocks, policy=policy,
                      max_num_seqs=max_seqs, gpu_token_limit=token_limit, cpu_batch_limit=8)
    batches: list = []
    for group in (workers.gpu, workers.cpu):
        step = group.step

        async def recorded(batch, step=step):
            batches.append(batch)
            return await step(batch)

        group.step = recorded
    return eng, workers, batches


def _run(coro, timeout: float = 30.0):
    """A lost request hangs its stream: fail the test instead of hanging it."""
    asyncio.run(asyncio.wait_for(coro, timeout))


async def _collect(stream):
    toks, reason = [], None
    async for d in stream:
        assert d.error is None, d.error
        toks += d.token_ids
        reason = d.finish_reason
    return stream.rid, toks, reason


def _seqs(batches, rid):
    return [(type(b).__name__, s) for b in batches for s in b.seqs if s.req_id == rid]


@pytest.mark.parametrize("destination", ["gpu", "cpu"])
def test_one_prefill_and_the_prompt_kv_forked(destination):
    """Prefill-to-GPU (HBM holds the group) and Prefill-to-CPU (HBM cannot): the first
    request's prompt is computed once; each sibling's first step is a decode at the prompt's
    last position, on the tier that holds the group, over KV the fork wrote."""
    async def main():
        eng, _, batches = _engine(gpu_blocks=40 if destination == "gpu" else 6)
        eng.start()
        try:
            prompt = list(range(10, 23))  # 13 tokens: 4 blocks each
            streams = eng.add_samples(prompt, SamplingParams(n=3, max_tokens=5,
                                                             temperature=0), 1000)
            outs = await asyncio.gather(*(_collect(s) for s in streams))
        finally:
            await eng.stop()
        first = streams[0].rid
        prefills = [s for _, s in _seqs(batches, first) if len(s.token_ids) > 1]
        assert sum(len(s.token_ids) for s in prefills) == len(prompt)  # once, whole
        forking = [s for s in prefills if s.forks]
        assert len(forking) == 1 and forking[0].sample
        assert [f.req_id for f in forking[0].forks] == [s.rid for s in streams[1:]]
        assert bool(forking[0].host_blocks) == (destination == "cpu")
        for s in streams[1:]:
            kind, step0 = _seqs(batches, s.rid)[0]
            assert kind == ("GpuBatch" if destination == "gpu" else "CpuBatch")
            assert step0.token_ids == [prompt[-1]] and step0.start_pos == len(prompt) - 1
            assert step0.out_index == 0
        for rid, toks, reason in outs:
            assert reason == "length" and toks == [fake_token(rid, k, 1000) for k in range(5)]
        assert eng.state.gpu_pool.num_used == 0 and eng.state.host_pool.num_used == 0

    _run(main())


def test_group_is_admitted_whole_and_waits_for_room():
    """Rows: a group of 3 where 2 rows are left waits (FIFO) rather than splitting."""
    async def main():
        eng, _, batches = _engine(max_seqs=4, policy="gpu-only")
        eng.start()
        try:
            first = eng.add_request([5] * 8, SamplingParams(max_tokens=30, temperature=0), 1000)
            second = eng.add_request([6] * 8, SamplingParams(max_tokens=30, temperature=0), 1000)
            await asyncio.sleep(0.02)
            group = eng.add_samples([7] * 8, SamplingParams(n=3, max_tokens=2, temperature=0),
                                    1000)
            await asyncio.sleep(0.02)
            assert all(eng.requests[s.rid].blocks == [] for s in group)  # not admitted
            outs = await asyncio.gather(*(_collect(s) for s in [first, second, *group]))
        finally:
            await eng.stop()
        assert all(reason == "length" for _, _, reason in outs)
        # The group's first prefill came only after one of the others finished.
        order = [s.req_id for b in batches for s in b.seqs if len(s.token_ids) > 1]
        assert order.index(group[0].rid) == 2

    _run(main())


def test_abort_of_the_first_mid_prefill_leaves_siblings_to_prefill_themselves():
    """A 40-token prompt in 8-token chunks; the first request is aborted after its first
    chunk: the siblings' blocks (admitted with it, still empty) are freed and each sibling
    prefills its own prompt from position 0, then finishes normally."""
    async def main():
        eng, _, batches = _engine(token_limit=8, delay=0.01)
        eng.start()
        try:
            streams = eng.add_samples(list(range(1, 41)), SamplingParams(
                n=3, max_tokens=4, temperature=0), 1000)
            first = eng.requests[streams[0].rid]
            while first.computed == 0:
                await asyncio.sleep(0.001)
            eng.abort(first.rid)
            outs = await asyncio.gather(*(_collect(s) for s in streams))
        finally:
            await eng.stop()
        assert outs[0][2] == "abort"
        for s, (rid, toks, reason) in zip(streams[1:], outs[1:]):
            assert reason == "length" and toks == [fake_token(rid, k, 1000) for k in range(4)]
            prefill = [q for _, q in _seqs(batches, s.rid) if len(q.token_ids) > 1]
            assert prefill[0].start_pos == 0
            assert sum(len(q.token_ids) for q in prefill) == 40
        assert not any(q.forks for b in batches for q in b.seqs)
        assert eng.state.gpu_pool.num_used == 0

    _run(main())


@pytest.mark.parametrize("destination", ["gpu", "cpu"])
def test_abort_of_a_sibling_while_its_blocks_are_filled(destination):
    """The sibling is in the forking step: its abort waits for the step (its blocks are
    being written), then frees them once; the rest of the group is unaffected."""
    async def main():
        eng, _, batches = _engine(gpu_blocks=40 if destination == "gpu" else 6,
                                        delay=0.03)
        eng.start()
        try:
            streams = eng.add_samples([3] * 13, SamplingParams(n=3, max_tokens=3,
                                                               temperature=0), 1000)
            victim = eng.requests[streams[1].rid]
            while victim.in_flight is None:
                await asyncio.sleep(0.001)
            held = list(victim.blocks)
            eng.abort(victim.rid)
            assert victim.blocks == held and not victim.finished  # waits for the step
            outs = await asyncio.gather(*(_collect(s) for s in streams))
        finally:
            await eng.stop()
        assert [r for _, _, r in outs] == ["length", "abort", "length"]
        assert not _seqs([b for b in batches if isinstance(b, (P.GpuBatch, P.CpuBatch))],
                         victim.rid)  # it never ran a step of its own
        assert eng.state.gpu_pool.num_used == 0 and eng.state.host_pool.num_used == 0

    _run(main())


def test_sibling_seeds_follow_the_request_seed():
    """vLLM's parallel sampling: sample i uses seed + i (wrapped into int64)."""
    async def main():
        eng, _, _ = _engine()
        streams = eng.add_samples([1, 2, 3], SamplingParams(n=3, seed=2**63 - 2,
                                                            max_tokens=2), 1000)
        seeds = [eng.requests[s.rid].seed for s in streams]
        assert seeds == [2**63 - 2, 2**63 - 1, -(2**63)]
        assert [s.sample_index for s in streams] == [0, 1, 2]
        await eng.stop()

    _run(main())
    assert _int64(2**63) == -(2**63) and _int64(-1) == -1 and _int64(5) == 5


def test_groups_that_can_never_be_admitted_are_refused():
    async def main():
        eng, _, _ = _engine(gpu_blocks=12, host_blocks=20, max_seqs=4, policy="gpu-only")
        with pytest.raises(ValueError, match="n: 5 samples"):  # more rows than max_num_seqs
            eng.add_samples([1] * 4, SamplingParams(n=5), 1000)
        with pytest.raises(ValueError, match="need 16 KV blocks"):  # 4 x 4 blocks > 12
            eng.add_samples([1] * 13, SamplingParams(n=4, max_tokens=2), 1000)
        with pytest.raises(ValueError, match="use add_samples"):
            eng.add_request([1] * 4, SamplingParams(n=2), 1000)
        assert not eng.requests and not eng.state.gpu_waiting
        eng2, _, _ = _engine(gpu_blocks=12, host_blocks=20, max_seqs=4)  # host tier: 16 <= 20
        assert len(eng2.add_samples([1] * 13, SamplingParams(n=4, max_tokens=2), 1000)) == 4
        await eng.stop()
        await eng2.stop()

    _run(main())
