"""One simulated run: the production LLMEngine (its GPU, CPU and completion loops, the
policy's rounds, every migration) on a virtual-time loop with simulated workers, fed the
load generator's jobs at the load generator's arrival offsets, summarised with the load
generator's keys (dualpace/workload.py). Every round checks the scheduler's invariants
(single ownership, exact block accounting, Eq. 2, the published reserve); a violation ends
the run with an error.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from dualpace.engine.gpu_round import reserve_violation
from dualpace.engine.llm_engine import EngineDead, LLMEngine
from dualpace.engine.metrics import histogram_quantile
from dualpace.sampling.params import SamplingParams
from dualpace.sim.costs import CostModel, FittedCosts, Jittered
from dualpace.sim.delivery import Delivery
from dualpace.sim.loop import run_virtual
from dualpace.sim.setup import SimSetup
from dualpace.sim.workers import SimWorkers
from dualpace.workload import Job, Result, arrival_times, summarize


def engine_latencies(now: dict[str, float], before: dict[str, float] | None = None) -> dict:
    """P99 inter-token latency as the engine stamps it (its histogram, Prometheus's
    interpolation, over the increase since ``before``): the same number from a real
    server's /metrics and from the simulated engine, free of what the simulator does not
    model, the HTTP/SSE delivery to a client that shares the box's cores. (TTFT's buckets
    are too coarse at these rates to compare this way; the client's P99 TTFT is used.)"""
    q = histogram_quantile(0.99, "dualpace:inter_token_latency_seconds", now, before)
    return {"engine_p99_itl_ms": None if q is None else round(q * 1e3, 2)}


class InvariantViolation(AssertionError):
    """A simulated round broke a scheduler invariant."""


def _check_round(engine: LLMEngine, kind: str, plan) -> None:
    st = engine.state
    try:
        st.check_invariants(list(engine.requests.values()))
    except AssertionError as e:
        raise InvariantViolation(f"after a {kind} round: {e}") from None
    violation = st.eq2_violation()
    if violation:
        raise InvariantViolation(f"after a {kind} round: {violation}")
    if kind == "gpu":
        violation = reserve_violation(st)
        if violation:
            raise InvariantViolation(f"after a gpu round: {violation}")


async def _run(setup: SimSetup, costs: CostModel, policy: str, jobs: list[Job],
               offsets: list[float], check: bool, delivery: Delivery | None
               ) -> tuple[list[Result], float, SimWorkers, dict]:
    loop = asyncio.get_running_loop()
    workers = SimWorkers(costs, setup.thresholds, setup.num_layers)
    violations: list[BaseException] = []

    def on_round(engine, kind, plan):
        try:
            _check_round(engine, kind, plan)
        except InvariantViolation as e:
            violations.append(e)
            raise

    engine = LLMEngine(workers, gpu_blocks=setup.gpu_blocks, host_blocks=setup.host_blocks,
                       block_size=setup.block_size, limits=setup.limits, policy=policy,
                       vocab_size=1 << 31, eos_ids=(), clock=loop.time,
                       on_round=on_round if check else None)
    engine.start()
    results = [Result(input_len=len(j.prompt)) for j in jobs]
    stamps: dict[int, tuple[float, list[float]]] = {}  # engine arrival and token times

    async def one(i: int, job: Job) -> None:
        await asyncio.sleep(max(0.0, offsets[i] - loop.time()))
        res = results[i]
        res.start = loop.time()  # the client's send
        if delivery is not None:  # the front end's parse and tokenization
            await asyncio.sleep(delivery.admission_delay(len(engine.requests) + 1))
        try:
            stream = engine.add_request(job.prompt, SamplingParams(
                max_tokens=job.max_tokens, temperature=0.0, ignore_eos=True),
                setup.limits.max_model_len)
        except (ValueError, EngineDead) as e:  # refused, or the engine died (reported below)
            res.error = str(e)
            return
        r = engine.requests[stream.rid]
        async for d in stream:
            if d.error:
                res.error = d.error
        res.output_tokens = len(r.token_times)
        res.ok = not res.error and r.finish_reason == "length"
        stamps[i] = (r.arrival, r.token_times)

    t0 = loop.time()
    try:
        await asyncio.gather(*(one(i, j) for i, j in enumerate(jobs)))
    finally:
        await engine.stop()
    if violations:
        raise violations[0]
    _client_times(results, stamps, delivery)
    if engine.dead:
        raise RuntimeError(f"simulated engine died: {engine.dead}")
    st = engine.state
    if st.gpu_pool.num_used or st.host_pool.num_used:
        raise InvariantViolation(f"blocks leaked: {st.gpu_pool.num_used} GPU, "
                                 f"{st.host_pool.num_used} host")
    return results, loop.time() - t0, workers, engine.metrics.samples(close_windows=False)


def _client_times(results: list[Result], stamps: dict, delivery: Delivery | None) -> None:
    """TTFT, gaps and end-to-end latency as the client sees them: the engine's stamps, plus
    the drawn delivery delays where there is a delivery model."""
    order = sorted(stamps)
    times = [stamps[i][1] for i in order]
    if delivery is not None:
        times = delivery.client_times(times, [stamps[i][0] for i in order])
    for i, t in zip(order, times):
        res = results[i]
        if len(t):
            res.ttft = t[0] - res.start
            res.itl = [float(g) for g in np.diff(t)]
            res.e2e = t[-1] - res.start


def simulate(setup: SimSetup, costs: CostModel, policy: str, jobs: list[Job], rate: float,
             seed: int = 0, burstiness: float = 1.0, check: bool = True,
             jitter: bool = True, jitter_seed: int | None = None,
             delivery: dict | None = None) -> dict:
    """One policy at one offered rate: loadgen's summary keys, plus what the simulator saw
    (simulated seconds, wall seconds, steps and busy time per worker). ``jitter``: fitted
    step costs vary as the measured steps did around their fit (``Jittered``, seeded with
    ``jitter_seed``, default ``seed``, which also draws the arrivals, and with the rate: a
    sweep's points replay different stretches of the measured logs, as a real sweep's points
    run at different times); off, every step takes its prediction. ``delivery``: a
    profile's delivery section (dualpace/sim/delivery.py): the client's times then include
    the front end's admission and per-token delays, drawn with the jitter's seed; None,
    the client sees the engine's stamps."""
    offsets = arrival_times(jobs, rate, burstiness, seed, False, 1.0)
    draws = f"{seed if jitter_seed is None else jitter_seed}@{rate}"
    if jitter and isinstance(costs, FittedCosts):
        costs = Jittered(costs, draws)
    wall = time.perf_counter()
    deliver = None if delivery is None else Delivery(delivery, draws)
    results, duration, workers, samples = run_virtual(
        _run(setup, costs, policy, jobs, offsets, check, deliver))
    out = summarize(results, duration, False)
    out.update(engine_latencies(samples))
    out["request_rate"] = rate
    out["simulator"] = {"wall_s": round(time.perf_counter() - wall, 3),
                        "steps": dict(workers.steps),
                        "busy_s": {k: round(v, 3) for k, v in workers.busy.items()},
                        "assist_calls": workers.assist_calls,
                        "stage_wait_s": round(workers.stage_wait, 3),
                        "invariants_checked": check}
    return out
