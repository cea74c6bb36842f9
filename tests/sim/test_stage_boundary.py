"""Dense Assist's stage-boundary wait (§4.2, Appendix B's q_x) in the simulator: the
simulated workers run a CPU step's assist calls one by one against the GPU-main step in
flight, and Algorithm 1's scores on a roofline charge each call the mean wait."""

from __future__ import annotations

import asyncio

import pytest

from dualpace.runtime import protocol as P
from dualpace.runtime.routing import FULL_CPU, FUSED_ASSIST, SPLIT_FINAL, route_for
from dualpace.runtime.step_work import GpuStepWork
from dualpace.sim.costs import AssistCall, CpuStepCost, RooflineCosts
from dualpace.sim.hardware import load_hardware
from dualpace.sim.loop import run_virtual
from dualpace.sim.setup import limit_step_wait, load_shape, setup_from_hardware
from dualpace.sim.workers import SimWorkers

from .test_simulator import HW, SHAPE


# --- the workers ------------------------------------------------------------------------------
class _Staged:
    """GPU steps of 1 s; CPU steps made of ``calls``; separate chips."""

    boundary_waits = True

    def __init__(self, calls):
        self.calls = tuple(calls)

    def gpu_step(self, w, beside=False):
        return 1.0

    def cpu_step(self, w):
        return CpuStepCost(sum(c.before + c.wait for c in self.calls), 0.0,
                           sum(c.gpu for c in self.calls), self.calls)

    def slowdown(self, kind, route=""):
        return 1.0


def _run(costs, gpu_at: float, cpu_at: float, layers: int = 4):
    """A GPU step issued at ``gpu_at`` and a CPU step at ``cpu_at``: when each ended, and
    the workers."""
    async def main():
        loop = asyncio.get_running_loop()
        w = SimWorkers(costs, (0, 0), layers)
        spec = P.SamplingSpec(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
        for g, rid in ((w.gpu, 1), (w.cpu, 2)):
            g.send(P.NewRequest(req_id=rid, sampling=spec))
        ends = {}

        async def gpu():
            await asyncio.sleep(gpu_at)
            await w.gpu.step(P.GpuBatch(step_id=1, seqs=[
                P.SeqStep(req_id=1, token_ids=[1], start_pos=5)]))
            ends["gpu"] = loop.time()

        async def cpu():
            await asyncio.sleep(cpu_at)
            await w.cpu.step(P.CpuBatch(step_id=2, seqs=[
                P.SeqStep(req_id=2, token_ids=[1], start_pos=5)]))
            ends["cpu"] = loop.time()

        await asyncio.gather(gpu(), cpu())
        return ends, w

    return run_virtual(main())


def test_calls_on_a_busy_gpu_wait_for_its_next_stage_boundary():
    """GPU step 0..1 s in 4 stages (boundaries at 0.25, 0.5, 0.75). CPU step from 0.1 s: 0.2 s
    local, a call (GPU 0.05 s, CPU-visible 0.08 s), 0.2 s local, the same call again.
    Call 1 lands at 0.3, waits to the 0.5 boundary, is served 0.5-0.55, the CPU resumes at
    0.58. Call 2 lands at 0.78: the GPU's own work done is 0.73, the next boundary 0.02 away;
    the CPU resumes at 0.88. The GPU step grew by both calls: it ends at 1.1."""
    call = AssistCall(0.2, 0.08, 0.05)
    ends, w = _run(_Staged([call, call]), 0.0, 0.1)
    assert ends["cpu"] == pytest.approx(0.88)
    assert ends["gpu"] == pytest.approx(1.1)
    assert w.stage_wait == pytest.approx(0.2 + 0.02)
    assert w.busy["cpu"] == pytest.approx(0.78)
    assert w.busy["gpu"] == pytest.approx(1.1)
    assert w.disturbance == 0  # served inside the step, nothing owed to the next one


def test_back_to_back_calls_wait_a_stage_less_the_return_trip():
    """The profiler's calibration issues calls back to back (Appendix B): call 1 lands at
    0.1, waits to the 0.25 boundary, is served 0.25-0.3, the CPU resumes at 0.33; call 2
    lands 0.03 into the GPU's next stage of its own work and waits 0.22 for its end (to
    0.55), served 0.55-0.6, the CPU resumes at 0.63: a call that follows its predecessor at
    once waits nearly a whole stage, not the half a uniformly random arrival waits."""
    call = AssistCall(0.0, 0.08, 0.05)
    ends, w = _run(_Staged([call, call]), 0.0, 0.1)
    assert ends["cpu"] == pytest.approx(0.63)
    assert w.stage_wait == pytest.approx(0.15 + 0.22)
    assert ends["gpu"] == pytest.approx(1.1)


def test_a_call_at_a_boundary_waits_for_nothing():
    call = AssistCall(0.15, 0.08, 0.05)  # lands at 0.25, a boundary
    ends, w = _run(_Staged([call]), 0.0, 0.1)
    assert w.stage_wait == pytest.approx(0.0, abs=1e-9)
    assert ends["cpu"] == pytest.approx(0.33) and ends["gpu"] == pytest.approx(1.05)


def test_an_idle_gpu_serves_at_once_and_a_step_starting_meanwhile_starts_behind_it():
    """CPU step from 0: a call at 0.1 s on an idle GPU (no wait; GPU busy 0.1-0.15), then
    0.05 s local. A GPU step issued at 0.12 starts at 0.15 and ends at 1.15."""
    calls = [AssistCall(0.1, 0.08, 0.05)]
    costs = _Staged(calls)
    costs.cpu_step = lambda w: CpuStepCost(0.1 + 0.08 + 0.05, 0.0, 0.05, tuple(calls))
    ends, w = _run(costs, 0.12, 0.0)
    assert w.stage_wait == 0
    assert ends["cpu"] == pytest.approx(0.23)
    assert ends["gpu"] == pytest.approx(1.15)


def test_without_listed_calls_the_next_gpu_step_owes_the_disturbance():
    """Fitted costs (no ``boundary_waits``): one CPU step of its measured seconds, whose
    disturbance the GPU step after it pays when the GPU was busy (the model before)."""
    class Fitted(_Staged):
        boundary_waits = False

    ends, w = _run(Fitted([AssistCall(0.2, 0.08, 0.05)]), 0.0, 0.1)
    assert ends["cpu"] == pytest.approx(0.38) and ends["gpu"] == pytest.approx(1.0)
    assert w.disturbance == pytest.approx(0.05) and w.stage_wait == 0


# --- the roofline's q_x and Algorithm 1 ---------------------------------------------------------
def test_stage_wait_is_half_a_stage_of_the_step():
    c = RooflineCosts(HW, SHAPE)
    step = GpuStepWork(prefill_tokens=100, context=100, prefill_context=100 * 50)
    # 0.5 s overhead + 2 x 1232 x 100 / 1e9 dense + 4 x 2 x 8 x 5000 / 1e9 attention, over
    # 2 layers, halved
    assert c.stage_wait(step) == pytest.approx((0.5 + 246400e-9 + 320000e-9) / 2 / 2)
    assert limit_step_wait(c, 100) == pytest.approx(c.stage_wait(step))


def test_route_scores_charge_every_call_its_stage_wait():
    c = RooflineCosts(HW, SHAPE)
    plain, waited = c.route_scores([1, 4]), c.route_scores([1, 4], stage_wait=0.5)
    for b in (1, 4):
        assert waited[b][FULL_CPU] == pytest.approx(plain[b][FULL_CPU])
        assert waited[b][SPLIT_FINAL] == pytest.approx(plain[b][SPLIT_FINAL] + 0.5)
        assert waited[b][FUSED_ASSIST] == pytest.approx(plain[b][FUSED_ASSIST] + 2 * 0.5)


def test_the_rtx4090_box_keeps_one_row_batches_off_fused_assist():
    """Without the wait the rooflines made every batch Fused-Assist ((0, 0)); a 1,024-token
    prefill step's stages (~5 ms each) make 32 calls cost more than a one-row batch saves
    (the paper's profile keeps batches to 16 rows on the CPU, or on Split-Final)."""
    hw, shape = load_hardware("rtx4090-xeon4510"), load_shape("llama-3.1-8b")
    setup = setup_from_hardware(hw, shape)
    assert setup.stage_wait_s == pytest.approx(
        limit_step_wait(RooflineCosts(hw, shape), 1024))
    assert 1e-3 < setup.stage_wait_s < 5e-3
    assert route_for(1, *setup.thresholds) != FUSED_ASSIST
    assert route_for(256, *setup.thresholds) == FUSED_ASSIST  # where CPU FLOPs run out
    scores = RooflineCosts(hw, shape).route_scores([1])
    assert min(scores[1], key=scores[1].get) == FUSED_ASSIST  # what q_x = 0 would choose
