"""Async scheduling (engine/lookahead.py): decode steps submitted ahead of their
predecessor's result give the same outputs as plan -> execute -> apply, finish and abort
exactly as before, free every block once, and step aside whenever the next round could be
anything but the same decodes. The fake workers check each step ahead: the previous token
alone, its out_index one past the last one sampled, its position where the KV ends."""

from __future__ import annotations

import asyncio

import pytest

from dualpace.engine.gpu_round import GpuPlan
from dualpace.engine.lookahead import commit_lookahead, lookahead_rows
from dualpace.engine.request import EngineRequest, Phase
from dualpace.engine.state import Limits, SchedulerState
from dualpace.kv.block_pool import BlockPool, blocks_for_tokens
from dualpace.sampling.params import SamplingParams

from . import other_work
from .fake_workers import FakeWorkers, fake_engine, fake_token

AHEAD = "dualpace:async_scheduled_steps_total"
DROPPED = "dualpace:async_dropped_tokens_total"


def _engine(async_scheduling: bool, gpu_blocks: int = 64, policy: str = "dualpace",
            delay: float = 0.002):
    workers = FakeWorkers(delay=delay)
    eng = fake_engine(workers, gpu_blocks=gpu_blocks, host_blocks=64, policy=policy,
                      async_scheduling=async_scheduling)
    return eng, workers


async def _collect(stream):
    toks, reason = [], None
    async for d in stream:
        toks += d.token_ids
        reason = d.finish_reason or reason
    return toks, reason


def _counter(eng, name: str) -> float:
    return eng.metrics.samples().get(name, 0.0)


async def _workload(eng):
    """Three requests at once (lengths 5, 17, 30), a fourth while they decode."""
    first = [eng.add_request([7 + i] * (3 + 2 * i), SamplingParams(max_tokens=n), 1000)
             for i, n in enumerate((5, 17, 30))]
    tasks = [asyncio.create_task(_collect(s)) for s in first]
    while len(eng.requests[first[2].rid].out) < 8:
        await asyncio.sleep(0.001)
    late = eng.add_request([3] * 6, SamplingParams(max_tokens=9), 1000)
    tasks.append(asyncio.create_task(_collect(late)))
    return await asyncio.gather(*tasks)


@pytest.mark.parametrize("policy", ["dualpace", "gpu-only"])
def test_same_outputs_with_steps_ahead(policy):
    async def run(flag):
        eng, _ = _engine(flag, policy=policy)
        eng.start()
        try:
            out = await _workload(eng)
            await asyncio.sleep(0.02)
            assert eng.state.gpu_pool.num_used == 0 and not eng.requests
            return out, _counter(eng, AHEAD), _counter(eng, DROPPED)
        finally:
            await eng.stop()

    plain, plain_ahead, _ = asyncio.run(run(False))
    ahead, n_ahead, dropped = asyncio.run(run(True))
    assert ahead == plain
    assert [len(t) for t, _ in plain] == [5, 17, 30, 9]
    assert all(reason == "length" for _, reason in plain)
    assert plain_ahead == 0
    assert n_ahead >= 15  # the 30-token request decodes alone for 13 steps, and more
    assert dropped == 0  # length is known ahead: no token past max_tokens is computed


def test_a_stop_token_drops_the_token_ahead():
    async def main():
        eng, workers = _engine(True)
        eng.start()
        try:
            rid = 1  # the engine's first request id
            stop = fake_token(rid, 4, 1000)
            s = eng.add_request([5] * 6, SamplingParams(max_tokens=50, stop_token_ids=[stop]),
                                1000)
            assert s.rid == rid
            toks, reason = await _collect(s)
            await asyncio.sleep(0.02)
            assert reason == "stop" and len(toks) == 5 and toks[-1] == stop
            # The step behind the stop had been submitted: its token is dropped, its KV
            # slot freed with the request's other blocks.
            assert _counter(eng, DROPPED) == 1
            assert eng.state.gpu_pool.num_used == 0
            ran = [rids for kind, rids in workers.executed if kind == "gpu"]
            assert sum(rid in rids for rids in ran) == 6  # prefill, 4 decodes, 1 ahead
        finally:
            await eng.stop()

    asyncio.run(main())


def test_abort_while_steps_are_ahead():
    async def main():
        eng, _ = _engine(True, gpu_blocks=160, delay=0.005)
        eng.start()
        try:
            s = eng.add_request([5] * 6, SamplingParams(max_tokens=500), 1000)
            other = eng.add_request([6] * 6, SamplingParams(max_tokens=40), 1000)
            task = asyncio.create_task(_collect(s))
            while len(eng.requests[s.rid].out) < 10:
                await asyncio.sleep(0.001)
            assert _counter(eng, AHEAD) > 0
            eng.abort(s.rid)
            toks, reason = await task
            assert reason == "abort" and 10 <= len(toks) < 500
            toks2, reason2 = await _collect(other)
            assert len(toks2) == 40 and reason2 == "length"
            await asyncio.sleep(0.03)
            assert eng.state.gpu_pool.num_used == 0 and not eng.requests
        finally:
            await eng.stop()

    asyncio.run(main())


def test_a_failed_step_ahead_aborts_its_rows_and_frees_their_blocks():
    async def main():
        eng, workers = _engine(True)
        workers.fail_step = lambda kind, b: kind == "gpu" and b.step_id == 6
        eng.start()
        try:
            toks, reason = await _collect(eng.add_request([5] * 6, SamplingParams(
                max_tokens=100), 1000))
            assert reason == "abort" and 0 < len(toks) < 100
            await asyncio.sleep(0.02)
            assert eng.state.gpu_pool.num_used == 0 and not eng.requests
            # The engine serves on after the failure.
            toks, reason = await _collect(eng.add_request([5] * 6, SamplingParams(
                max_tokens=12), 1000))
            assert len(toks) == 12 and reason == "length"
        finally:
            await eng.stop()

    asyncio.run(main())


# --- the selection, directly --------------------------------------------------------------
BS = 4


def _state(gpu_blocks=16):
    return SchedulerState(BlockPool(gpu_blocks, BS), BlockPool(16, BS),
                          Limits(max_num_seqs=8, gpu_token_limit=64, cpu_batch_limit=4,
                                 max_model_len=1000), "dualpace")


def _decoding(st, rid, prompt=5, out=2, max_tokens=50, **params):
    r = EngineRequest(rid, [1] * prompt, SamplingParams(max_tokens=max_tokens, **params),
                      seed=0, max_tokens=max_tokens, block_size=BS)
    r.out = [9] * out
    r.phase = Phase.DECODE
    r.computed = r.num_tokens - 1
    r.blocks = st.gpu_pool.allocate(blocks_for_tokens(r.num_tokens, BS))  # the step in flight
    st.gpu_running.append(r)
    return r


def test_lookahead_rows_follow_a_decode_only_round():
    st = _state()
    a, b = _decoding(st, 1, prompt=5, out=2), _decoding(st, 2, prompt=8, out=0)
    plan = GpuPlan(decodes=[a, b])
    assert lookahead_rows(st, plan) == [a, b]
    # a: 7 tokens, the token ahead is the 8th: its 2 blocks hold it; b: 8 -> 9, a 3rd block.
    used = st.gpu_pool.num_used
    ahead = commit_lookahead(st, [a, b])
    assert ahead.decodes == [a, b] and (len(a.blocks), len(b.blocks)) == (2, 3)
    assert st.gpu_pool.num_used == used + 1


@pytest.mark.parametrize("case", ["prefill", "prompt-waiting", "cpu-tier", "left-out",
                                  "penalized", "no-blocks"])
def test_no_lookahead_unless_the_next_round_is_the_same_decodes(case):
    st = _state(gpu_blocks=4 if case == "no-blocks" else 16)
    a = _decoding(st, 1, prompt=8, out=0, **({"presence_penalty": 0.5}
                                              if case == "penalized" else {}))
    plan = GpuPlan(decodes=[a])
    if case == "prefill":
        p = other_work.prompt(2, BS)
        p.phase, p.blocks = Phase.PREFILL, st.gpu_pool.allocate(1)
        st.gpu_running.append(p)
        plan.prefills.append((p, 4))
    elif case == "prompt-waiting":
        other_work.add_waiting_prompt(st, 2)
    elif case == "cpu-tier":
        other_work.add_cpu_resident(st, 2)
    elif case == "left-out":  # a GPU decode that the step in flight does not run
        _decoding(st, 2)
    elif case == "no-blocks":  # a needs a 3rd block for its 9th token; the pool has none
        _decoding(st, 2, prompt=7, out=0)
        assert st.gpu_pool.num_free == 0
    assert lookahead_rows(st, plan) == []


def test_rows_that_finish_in_the_step_in_flight_are_left_out():
    st = _state()
    ending = _decoding(st, 1, out=4, max_tokens=5)  # the step in flight samples its last
    aborted = _decoding(st, 2)
    aborted.abort_requested = "abort"
    going = _decoding(st, 3, out=3, max_tokens=5)  # its last token is the one ahead
    done = _decoding(st, 4)
    st.gpu_running.remove(done)
    done.phase = Phase.FINISHED  # finished by the step before (a stop token)
    plan = GpuPlan(decodes=[ending, aborted, going, done])
    assert lookahead_rows(st, plan) == [going]
