"""Simulated worker groups: the engine's ``workers`` interface (``gpu``/``cpu`` groups with
``send`` and ``step``, and ``available``) whose steps take the cost model's time on the
virtual clock and return what a real worker would (a token per sampling row, the transfers
that completed, the route a CPU batch took and its attention time).

Two couplings between the workers are modeled, as the real ones behave:
- Dense Assist (Eq. 8): a CPU step whose route offloads dense stages takes GPU-main time;
  when GPU-main is busy (the stage-boundary service lengthens its step) the next GPU step
  absorbs it; an idle GPU serves the call at once, so GPU-main loses nothing.
- The gated (NEO) pipeline: the CPU sub-batches' dense stages run inside the GPU step they
  ride on, so that step's cost counts their rows (``carried_rows``).
"""

from __future__ import annotations

import asyncio
import math

from dualpace.runtime import protocol as P
from dualpace.runtime.routing import NEO_PIPELINE, assist_calls
from dualpace.runtime.step_work import cpu_route, cpu_step_work, gpu_step_work
from dualpace.sim.costs import CostModel


class SimGroup:
    def __init__(self, kind: str, world: SimWorkers):
        self.kind = kind
        self.world = world
        self.known: set[int] = set()

    def send(self, msg) -> None:
        if isinstance(msg, P.NewRequest):
            if msg.req_id in self.known:
                raise AssertionError(f"request {msg.req_id} introduced twice")
            self.known.add(msg.req_id)
        elif isinstance(msg, P.Release):
            self.known.difference_update(msg.req_ids)

    async def step(self, batch):
        for s in batch.seqs:
            if s.req_id not in self.known:
                raise AssertionError(f"{self.kind} step for request {s.req_id}, never "
                                     "introduced")
        if self.kind == "gpu":
            return await self.world.gpu_step(batch)
        return await self.world.cpu_step(batch)


class SimWorkers:
    def __init__(self, costs: CostModel, thresholds: tuple[int, int], num_layers: int):
        self.costs = costs
        self.thresholds = thresholds
        self.num_layers = num_layers
        self.gpu = SimGroup("gpu", self)
        self.cpu = SimGroup("cpu", self)
        self.available = asyncio.Event()
        self.available.set()
        self.gpu_busy_until = -1.0
        self.cpu_busy_until = -1.0
        self.disturbance = 0.0  # assist GPU time GPU-main owes its next step
        self.neo_rows = 0  # the gated pipeline's CPU rows issued beside the next GPU step
        self.busy = {"gpu": 0.0, "cpu": 0.0}  # seconds each worker ran steps
        self.steps = {"gpu": 0, "cpu": 0}

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def gpu_step(self, batch: P.GpuBatch) -> P.StepDone:
        self.gpu_busy_until = math.inf  # busy from now: a CPU step issued beside it sees so
        await asyncio.sleep(0)  # the gated loop issues its CPU sub-batches in the same instant
        carried, self.neo_rows = self.neo_rows, 0
        beside = carried > 0 or self.cpu_busy_until > self._now()
        t = self.costs.gpu_step(gpu_step_work(batch, carried), beside) + self.disturbance
        self.disturbance = 0.0
        self.gpu_busy_until = self._now() + t
        self.busy["gpu"] += t
        self.steps["gpu"] += 1
        await asyncio.sleep(t)
        ready = [m.req_id for m in (*batch.swap_out, *batch.swap_in)]
        for s in batch.seqs:
            if s.host_blocks:
                ready += [s.req_id, *(f.req_id for f in s.forks)]
        return P.StepDone(step_id=batch.step_id,
                          tokens=[1 if s.sample else -1 for s in batch.seqs], ready=ready)

    async def cpu_step(self, batch: P.CpuBatch) -> P.StepDone:
        w = cpu_step_work(batch, cpu_route(batch, self.thresholds))
        if w.route == NEO_PIPELINE:
            self.neo_rows += w.batch
        c = self.costs.cpu_step(w)
        if c.gpu_disturbance and self.gpu_busy_until > self._now():
            self.disturbance += c.gpu_disturbance
        self.busy["cpu"] += c.seconds
        self.steps["cpu"] += 1
        self.cpu_busy_until = self._now() + c.seconds
        await asyncio.sleep(c.seconds)
        calls = 0 if w.route == NEO_PIPELINE else assist_calls(w.route, self.num_layers)
        return P.StepDone(step_id=batch.step_id, tokens=[1] * w.batch, route=w.route,
                          assist_calls=calls, attn_us=int(c.attention * 1e6))
