"""Simulated worker groups: the engine's ``workers`` interface (``gpu``/``cpu`` groups with
``send`` and ``step``, and ``available``) whose steps take the cost model's time on the
virtual clock and return what a real worker would (a token per sampling row, the transfers
that completed, the route a CPU batch took and its attention time).

Three couplings between the workers are modeled, as the real ones behave:
- Shared cores: while both groups run a step, each progresses at 1/``slowdown`` of its pace
  alone (processor sharing; the cost model fits the factors to the step log's ``overlap``),
  so a step's duration depends on what the other group starts and finishes meanwhile. On
  separate chips (the hardware descriptions) the factor is 1.
- Dense Assist (Eq. 8): a CPU step whose route offloads dense stages takes GPU-main time.
  Where the cost model lists the step's calls (``boundary_waits``: the rooflines), the CPU
  step runs call by call (§4.2's non-preemptive stage-boundary priority): a call that lands
  while a GPU step is in flight waits for that step's next stage boundary (the step is N
  equal stages, N the layers), then the GPU serves it and the step grows by the call's GPU
  time; a call that lands on an idle GPU is served at once, and a GPU step that starts
  during its service starts behind it. Elsewhere (fitted costs, whose measured CPU steps
  already include their waits) a step's disturbance is owed by the next GPU step when
  GPU-main is busy, and nothing when it is idle.
- The gated (NEO) pipeline: the CPU sub-batches' dense stages run inside the GPU step they
  ride on, so that step's cost counts their rows (``carried_rows``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dualpace.runtime import protocol as P
from dualpace.runtime.routing import NEO_PIPELINE, assist_calls
from dualpace.runtime.step_work import cpu_route, cpu_step_work, gpu_step_work
from dualpace.sim.costs import AssistCall, CostModel


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


DONE_EPS = 1e-9  # seconds of work left that count as none (float error at the finish time)


@dataclass
class _Running:
    """A step in flight on the virtual clock."""

    work: float  # seconds it still needs at its pace alone
    slowdown: float  # its pace divisor while the other group runs a step
    done: asyncio.Future
    main: float = 0.0  # a GPU step with stage boundaries: its own work (assists not in it)
    stages: int = 0  # ... in this many equal stages (0: no boundaries modeled)

    def to_boundary(self) -> float:
        """Work left to the next stage boundary (0 at one). Assist work added at a boundary
        is all served before anyone asks again (the one CPU step waits for its call), so
        the main work done is ``main - work``."""
        stage = self.main / self.stages
        done = self.main - self.work
        into = done - stage * int(done / stage + DONE_EPS)
        return 0.0 if into <= DONE_EPS else stage - into


class SimWorkers:
    def __init__(self, costs: CostModel, thresholds: tuple[int, int], num_layers: int):
        self.costs = costs
        self.thresholds = thresholds
        self.num_layers = num_layers
        self.gpu = SimGroup("gpu", self)
        self.cpu = SimGroup("cpu", self)
        self.available = asyncio.Event()
        self.available.set()
        self.running: dict[str, _Running | None] = {"gpu": None, "cpu": None}
        self.gpu_busy = False  # from a GPU step's call to its end (its CPU peers see it)
        self._updated = 0.0  # when the running steps' work was last brought up to date
        self._timer: asyncio.TimerHandle | None = None
        self.disturbance = 0.0  # assist GPU time GPU-main owes its next step
        self.assist_until = 0.0  # an idle GPU serves an assist call until then
        self.boundary_waits = bool(getattr(costs, "boundary_waits", False))
        self.stage_wait = 0.0  # seconds assist calls waited for a GPU stage boundary
        self.assist_calls = 0  # Dense Assist calls the CPU steps made
        self.neo_rows = 0  # the gated pipeline's CPU rows issued beside the next GPU step
        self.busy = {"gpu": 0.0, "cpu": 0.0}  # seconds each worker ran steps
        self.steps = {"gpu": 0, "cpu": 0}

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    # --- processor sharing --------------------------------------------------------------------
    def _pace(self, r: _Running) -> float:
        both = self.running["gpu"] is not None and self.running["cpu"] is not None
        return 1.0 / r.slowdown if both else 1.0

    def _bring_up_to_date(self) -> None:
        now = self._now()
        for r in self.running.values():
            if r is not None:
                r.work -= (now - self._updated) * self._pace(r)
        self._updated = now

    def _next_finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ends = [r.work / self._pace(r) for r in self.running.values() if r is not None]
        if ends:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, min(ends)),
                                                                self._finish)

    def _finish(self) -> None:
        self._timer = None
        self._bring_up_to_date()
        for kind, r in self.running.items():
            if r is not None and r.work <= DONE_EPS:
                self.running[kind] = None
                if not r.done.done():
                    r.done.set_result(None)
        self._next_finish()  # the step still running may now have the cores alone

    async def _run(self, kind: str, seconds: float, slowdown: float, stages: int = 0) -> None:
        """``seconds`` of work at this group's pace: alone, or 1/``slowdown`` of it while the
        other group runs a step (the other's pace changes too: both are brought up to date
        and the next finish rescheduled at every start and finish). ``stages``: a GPU step's
        stage boundaries, where assist calls are served."""
        if self.running[kind] is not None:
            raise AssertionError(f"two {kind} steps in flight at once")
        t0 = self._now()
        self._bring_up_to_date()
        r = _Running(seconds, slowdown, asyncio.get_running_loop().create_future(),
                     seconds, stages)
        self.running[kind] = r
        self._next_finish()
        try:
            await r.done
        finally:
            if self.running[kind] is r:  # cancelled mid-step (the engine stopping)
                self._bring_up_to_date()
                self.running[kind] = None
                self._next_finish()
            self.busy[kind] += self._now() - t0

    # --- the two groups' steps -----------------------------------------------------------------
    async def gpu_step(self, batch: P.GpuBatch) -> P.StepDone:
        self.gpu_busy = True  # a CPU step issued in this same instant sees GPU-main busy
        await asyncio.sleep(0)  # the gated loop issues its CPU sub-batches in the same instant
        carried, self.neo_rows = self.neo_rows, 0
        beside = carried > 0 or self.running["cpu"] is not None
        t = self.costs.gpu_step(gpu_step_work(batch, carried), beside) + self.disturbance
        self.disturbance = 0.0
        self.steps["gpu"] += 1
        try:
            while self.assist_until > self._now():  # assist calls an idle GPU is serving
                behind = self.assist_until - self._now()
                await asyncio.sleep(behind)
                self.busy["gpu"] += behind
            await self._run("gpu", t, self.costs.slowdown("gpu"),
                            self.num_layers if self.boundary_waits else 0)
        finally:
            self.gpu_busy = False
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
        slowdown = self.costs.slowdown("cpu", w.route)
        self.steps["cpu"] += 1
        if c.calls and self.boundary_waits:
            for call in c.calls:
                if call.before > 0:
                    await self._run("cpu", call.before, slowdown)
                await self._assist(call)
            rest = c.seconds - sum(x.before + x.wait for x in c.calls)
            if rest > DONE_EPS:
                await self._run("cpu", rest, slowdown)
        else:
            if c.gpu_disturbance and self.gpu_busy:
                self.disturbance += c.gpu_disturbance
            await self._run("cpu", c.seconds, slowdown)
        calls = 0 if w.route == NEO_PIPELINE else assist_calls(w.route, self.num_layers)
        self.assist_calls += calls
        return P.StepDone(step_id=batch.step_id, tokens=[1] * w.batch, route=w.route,
                          assist_calls=calls, attn_us=int(c.attention * 1e6))

    async def _assist(self, call: AssistCall) -> None:
        """One Dense Assist call of the CPU step in flight (§4.2): a busy GPU-main takes it
        at its step's next stage boundary and its step grows by the call's GPU time; an
        idle one takes it at once. The CPU waits for the boundary, then the service."""
        t0 = self._now()
        r = self.running["gpu"]
        if r is not None and r.stages:
            self._bring_up_to_date()
            wait = r.to_boundary() / self._pace(r)
            if wait > 0:
                await asyncio.sleep(wait)
            self.stage_wait += self._now() - t0
        r = self.running["gpu"]
        if r is not None:
            self._bring_up_to_date()
            r.work += call.gpu
            self._next_finish()
        else:
            self.assist_until = max(self.assist_until, self._now()) + call.gpu
        await asyncio.sleep(call.wait)
        self.busy["cpu"] += self._now() - t0
