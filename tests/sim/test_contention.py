"""Shared cores: the engine measures how long each step overlapped the other group's, the fit
turns that into a slowdown factor per worker, and the simulated workers share the cores by
it (processor sharing), checked on hand-computed cases."""

from __future__ import annotations

import asyncio
import random

import pytest

from dualpace.engine.step_overlap import StepOverlap
from dualpace.runtime import protocol as P
from dualpace.runtime.step_work import CpuStepWork, GpuStepWork
from dualpace.sim.costs import (
    OVERLAP,
    CpuStepCost,
    FittedCosts,
    contention_fit,
    cpu_linear,
    fit_step_costs,
    profile_costs,
)
from dualpace.sim.loop import run_virtual
from dualpace.sim.workers import SimWorkers

from .tailed_cpu_log import COUNTS, mean_seconds, tailed_steps


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_overlap_is_the_time_the_other_group_had_a_step_in_flight():
    clock = _Clock()
    ov = StepOverlap(clock)
    g = ov.begin("gpu")  # GPU 0 .. 10
    clock.t = 2.0
    c1 = ov.begin("cpu")  # CPU 2 .. 4, inside the GPU step
    clock.t = 4.0
    assert ov.end("cpu", c1) == (1, pytest.approx(2.0))
    clock.t = 7.0
    c2 = ov.begin("cpu")  # CPU 7 .. 12, past the GPU step's end
    clock.t = 10.0
    assert ov.end("gpu", g) == (1, pytest.approx(2.0 + 3.0))
    clock.t = 12.0
    assert ov.end("cpu", c2) == (1, pytest.approx(3.0))
    g2 = ov.begin("gpu")  # 12 .. 13, alone
    clock.t = 13.0
    assert ov.end("gpu", g2) == (0, 0.0)
    assert ov.busy_time("gpu") == pytest.approx(11.0)
    assert ov.busy_time("cpu") == pytest.approx(7.0)


def test_two_steps_of_one_group_in_flight_count_its_busy_time_once():
    """The gated loop's GPU step and CPU sub-batches overlap each other; a group's busy time
    is the union of its steps' intervals."""
    clock = _Clock()
    ov = StepOverlap(clock)
    a = ov.begin("cpu")
    clock.t = 1.0
    b = ov.begin("cpu")
    g = ov.begin("gpu")
    clock.t = 3.0
    ov.end("cpu", a)
    clock.t = 5.0
    ov.end("cpu", b)
    assert ov.end("gpu", g) == (1, pytest.approx(4.0))
    assert ov.busy_time("cpu") == pytest.approx(5.0)


# --- the fit ----------------------------------------------------------------------------------
def _gpu_rec(rows, overlap, seconds):
    return {"kind": "gpu", "seconds": seconds, "step_seconds": seconds,
            "beside": int(overlap > 0), "overlap": overlap, "prefill_tokens": 0,
            "decode_rows": rows, "context": 0, "prefill_context": 0, "link_tokens": 0,
            "carried_rows": 0}


def _cpu_rec(batch, overlap, seconds, route="full-cpu", context=0):
    return {"kind": "cpu", "seconds": seconds, "step_seconds": seconds,
            "beside": int(overlap > 0), "overlap": overlap, "batch": batch, "context": context,
            "route": route, "attention": seconds / 3}


def _contended_log(s_gpu=1.25, s_cpu=2.0, seed=0):
    """Steps whose time alone is W, of which a random part ran beside the other group at
    1/s of its pace: seconds = W - part + part x s."""
    rng = random.Random(seed)
    out = []
    for _ in range(300):
        rows = rng.randint(1, 16)
        w = 0.002 + 0.0004 * rows
        part = rng.choice([0.0, rng.uniform(0, w)])
        out.append(_gpu_rec(rows, part * s_gpu, w - part + part * s_gpu))
        b, ctx = rng.randint(1, 16), rng.randint(10, 5000)
        w = 0.0015 + 0.0004 * b + 2e-7 * ctx
        part = rng.choice([0.0, rng.uniform(0, w)])
        out.append(_cpu_rec(b, part * s_cpu, w - part + part * s_cpu, context=ctx))
    return out


def test_the_fit_recovers_each_workers_pace_alone_and_its_slowdown():
    """W = T (1 - f) + T f / s, f the share of the step beside the other group: on steps
    built that way the fit finds W's coefficients and s for each worker."""
    log = _contended_log()
    assert contention_fit(log)
    costs = FittedCosts(fit_step_costs(log, contention=True))
    assert costs.gpu_beside is None  # the contention term replaces the beside split
    assert costs.gpu_step(GpuStepWork(decode_rows=5)) == pytest.approx(0.004, rel=1e-6)
    assert costs.cpu_step(CpuStepWork(4, 400, "full-cpu")).seconds == pytest.approx(
        0.0015 + 0.0016 + 8e-5, rel=1e-6)
    assert costs.slowdown("gpu") == pytest.approx(1.25, rel=1e-6)
    assert costs.slowdown("cpu", "full-cpu") == pytest.approx(2.0, rel=1e-6)


def test_logs_without_overlap_or_with_the_gated_pipeline_fit_no_contention():
    log = _contended_log()
    old = [{k: v for k, v in r.items() if k != "overlap"} for r in log]
    assert not contention_fit(old)
    assert FittedCosts(fit_step_costs(old, contention=True)).slowdown("gpu") == 1.0
    gated = [*log, _cpu_rec(2, 0.001, 0.003, route="neo-pipeline")]
    assert not contention_fit(gated)
    costs = FittedCosts(fit_step_costs(gated, contention=True))
    assert costs.slowdown("gpu") == 1.0 and costs.slowdown("cpu", "neo-pipeline") == 1.0
    assert not contention_fit([])


def test_contention_is_opt_in_and_a_profile_keeps_both_fits_apart():
    log = _contended_log()
    plain = fit_step_costs(log)
    assert OVERLAP not in plain["gpu"] and FittedCosts(plain).slowdown("cpu", "full-cpu") == 1.0
    contended = fit_step_costs(log, contention=True)
    profile = {"step_costs_by_policy": {"dualpace": plain},
               "step_costs_contended_by_policy": {"dualpace": contended}}
    assert profile_costs(profile, "dualpace").slowdown("gpu") == 1.0
    assert profile_costs(profile, "dualpace", contended=True).slowdown("gpu") == pytest.approx(
        1.25, rel=1e-6)
    with pytest.raises(ValueError, match="overlap"):  # a profile from older step logs
        profile_costs({"step_costs": plain}, "dualpace", contended=True)


def test_a_fitted_slowdown_is_capped():
    costs = FittedCosts({"gpu": {"overhead": 0.001, "overlap": 1.4, **dict.fromkeys(
        ("prefill_tokens", "decode_rows", "context", "prefill_context", "link_tokens",
         "carried_rows", "prefill_step"), 0.0)}})
    assert costs.slowdown("gpu") == pytest.approx(10.0)


# --- processor sharing in the simulated workers ------------------------------------------------
class _Shared:
    """GPU steps 10 ms, CPU steps ``cpu_ms``; beside each other the GPU runs at half pace
    and the CPU at 1/1.5."""

    def __init__(self, cpu_ms=20.0):
        self.cpu_s = cpu_ms / 1e3

    def gpu_step(self, w, beside=False):
        return 0.010

    def cpu_step(self, w):
        return CpuStepCost(self.cpu_s, self.cpu_s / 2, 0.0)

    def slowdown(self, kind, route=""):
        return 2.0 if kind == "gpu" else 1.5


def _workers(costs):
    w = SimWorkers(costs, (1 << 30, 1 << 30), 2)
    spec = P.SamplingSpec(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
    for g in (w.gpu, w.cpu):
        for rid in (1, 2):
            g.send(P.NewRequest(req_id=rid, sampling=spec))
    return w


def _gpu_batch(step):
    return P.GpuBatch(step_id=step, seqs=[P.SeqStep(req_id=1, token_ids=[1], start_pos=5)])


def _cpu_batch(step):
    return P.CpuBatch(step_id=step, seqs=[P.SeqStep(req_id=2, token_ids=[1], start_pos=5)])


def _gpu_then_cpu(cpu_ms: float, cpu_start: float):
    """A GPU step from 0 and a CPU step of ``cpu_ms`` from ``cpu_start`` seconds: when each
    ended, and the workers."""
    async def main():
        loop = asyncio.get_running_loop()
        w = _workers(_Shared(cpu_ms))
        ends = {}

        async def gpu():
            await w.gpu.step(_gpu_batch(1))
            ends["gpu"] = loop.time()

        async def cpu():
            await asyncio.sleep(cpu_start)
            await w.cpu.step(_cpu_batch(2))
            ends["cpu"] = loop.time()

        await asyncio.gather(gpu(), cpu())
        return ends, w

    return run_virtual(main())


def test_steps_beside_each_other_share_the_cores_as_fitted():
    """GPU 0..: 10 ms of work. CPU from 5 ms: 20 ms of work. Beside each other the GPU's
    remaining 5 ms take 10 ms (ends at 15 ms) while the CPU does 10/1.5 ms of its work; the
    CPU's remaining 13.33 ms run alone (ends at 28.33 ms)."""
    ends, w = _gpu_then_cpu(20.0, 0.005)
    assert ends["gpu"] == pytest.approx(0.015)
    assert ends["cpu"] == pytest.approx(0.005 + 0.010 + (0.020 - 0.010 / 1.5))
    assert w.busy["gpu"] == pytest.approx(0.015)
    assert w.busy["cpu"] == pytest.approx(ends["cpu"] - 0.005)
    assert w.running == {"gpu": None, "cpu": None}


def test_a_step_inside_the_others_stretches_by_its_factor_and_the_others_by_the_overlap():
    """CPU 3 ms of work from 2 ms, inside a 10 ms GPU step: the CPU step takes 4.5 ms
    (ends 6.5 ms); the GPU did 2 + 4.5/2 ms of work by then, its last 5.75 ms alone."""
    ends, _ = _gpu_then_cpu(3.0, 0.002)
    assert ends["cpu"] == pytest.approx(0.0065)
    assert ends["gpu"] == pytest.approx(0.0065 + (0.010 - 0.002 - 0.0045 / 2))


def test_a_step_cancelled_midway_leaves_the_cores_to_the_other():
    async def main():
        loop = asyncio.get_running_loop()
        w = _workers(_Shared())
        task = asyncio.ensure_future(w.cpu.step(_cpu_batch(2)))
        await asyncio.sleep(0)
        t0 = loop.time()
        gpu = asyncio.ensure_future(w.gpu.step(_gpu_batch(1)))
        await asyncio.sleep(0.002)  # 2 ms beside: the GPU did 1 ms of its work
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await gpu
        return loop.time() - t0, w

    took, w = run_virtual(main())
    assert took == pytest.approx(0.002 + 0.009)
    assert w.running == {"gpu": None, "cpu": None}


def test_a_noisy_step_overlapping_for_longer_does_not_inflate_the_slowdown():
    """A step that runs long for its own reasons overlaps the other group for longer: with
    the share of the step as the regressor, noise on the steps leaves the fitted factor
    near the true one (here s = 1.25, c = 0.2); the overlap seconds as a linear term took
    up the noise (c = 0.50 on this log, 0.58 on a noisy day's real one)."""
    rng = random.Random(1)
    log = []
    for _ in range(3000):
        rows, frac = rng.randint(1, 16), rng.random()
        t = (0.002 + 0.0004 * rows) * rng.lognormvariate(0.0, 0.3) / (1 - 0.2 * frac)
        log.append(_gpu_rec(rows, frac * t, t))
    costs = FittedCosts(fit_step_costs(log, contention=True))
    assert costs.slowdown("gpu") == pytest.approx(1.25, abs=0.05)


def test_contended_cpu_steps_are_priced_at_each_batch_sizes_mean():
    """With the contention term too, CPU steps are fitted by plain least squares: each batch
    size's time alone at its mean though the 1-row steps' right tail is the longest (as
    test_simulator's uncontended case; weighted, 1 row came out cheap and 13 rows dear)."""
    rng = random.Random(1)
    log = []
    for b, w in tailed_steps():
        part = rng.choice([0.0, rng.uniform(0, w)])  # beside the GPU at half its pace
        log.append(_cpu_rec(b, part * 2.0, w + part))
    fit = fit_step_costs(log, contention=True)["cpu"]["full-cpu"]
    assert fit[OVERLAP] == pytest.approx(0.5, abs=0.01)  # pace lost c = 1 - 1/s, s = 2
    for b in COUNTS:
        assert cpu_linear(fit, b, 0) == pytest.approx(mean_seconds(b), rel=0.015), b
