"""One CPU engine scheduling round: Appendix A.2 steps 1-5, each a function.

The CPU engine advances host-resident requests on its own clock. It keeps its running
frontier first, admits only a ready FIFO prefix of its waiting queue (it waits on the head's
readiness rather than bypassing it), and treats the migration reserve B_C^migration that the
GPU round published as unavailable host capacity (Eq. 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpace.engine.request import EngineRequest, Owner, Phase
from dualpace.engine.state import SchedulerState


@dataclass
class CpuPlan:
    batch: list[EngineRequest] = field(default_factory=list)
    wait_for: EngineRequest | None = None  # nothing runnable: the unready queue head
    moved: bool = False  # running requests were yielded / pushed back this round
    recomputed: list[EngineRequest] = field(default_factory=list)  # liveness preemption


@dataclass
class _Budget:
    rows: int
    selected: list[EngineRequest] = field(default_factory=list)
    growth: int = 0


def step1_budgets(st: SchedulerState) -> _Budget:
    return _Budget(rows=st.limits.cpu_batch_limit)


def _fits(st: SchedulerState, b: _Budget, r: EngineRequest) -> bool:
    """Row limit, then the host KV envelope with r's next token and finish growth."""
    return len(b.selected) < b.rows and st.host_fits(growth=b.growth + r.growth_blocks())


def _liveness_fallback(st: SchedulerState, b: _Budget, r: EngineRequest) -> bool:
    """An idle CPU tier admits its ready head even into the migration reserve when the host
    can hold its growth: the reserve protects future evictions, but a tier that can never
    run would hold its host KV forever (and with it, the evictions' space)."""
    return not b.selected and st.host_fits(growth=r.growth_blocks(), migration=0)


def step2_preserve_running_frontier(st: SchedulerState, b: _Budget, plan: CpuPlan) -> None:
    keep_going = True
    pushed: list[EngineRequest] = []
    for r in st.cpu_running:
        if r.finished:
            continue
        if r.swap_in_mark:  # yield to the GPU: host KV stays until the swap-in commits
            pushed.append(r)
            plan.moved = True
            continue
        if keep_going and _fits(st, b, r):
            b.selected.append(r)
            b.growth += r.growth_blocks()
        else:
            keep_going = False
            pushed.append(r)
            plan.moved = True
    for r in reversed(pushed):
        st.cpu_waiting.appendleft(r)
    st.cpu_running = []


def step3_admit_ready_prefix(st: SchedulerState, b: _Budget, plan: CpuPlan) -> None:
    if plan.moved:  # no older waiting work jumps ahead of a displaced running request
        return
    while st.cpu_waiting:
        r = st.cpu_waiting[0]
        if r.finished:
            st.cpu_waiting.popleft()
            continue
        if not r.ready or r.swap_in_mark:
            break
        if not _fits(st, b, r) and not _liveness_fallback(st, b, r):
            break
        st.cpu_waiting.popleft()
        b.selected.append(r)
        b.growth += r.growth_blocks()


def step4_wait_on_readiness(st: SchedulerState, b: _Budget, plan: CpuPlan) -> None:
    if not b.selected and st.cpu_waiting and not st.cpu_waiting[0].ready:
        plan.wait_for = st.cpu_waiting[0]
    elif not b.selected and st.cpu_waiting:
        _progress_guarantee(st, b, plan)


def _progress_guarantee(st: SchedulerState, b: _Budget, plan: CpuPlan) -> None:
    """Liveness beyond the paper's envelope. When the idle tier cannot reserve its ready
    head's whole finish growth (host KV held by waiting requests whose peaks do not all
    fit), run the head with next-token allocation only; if not even one block is free,
    recompute-preempt the youngest waiting request (its KV is dropped and it re-enters the
    GPU waiting queue, as vLLM preempts), so the oldest request always advances."""
    head = st.cpu_waiting[0]
    if head.swap_in_mark or head.finished:
        return
    while head.blocks_for_next() > st.host_pool.num_free:
        victims = [r for r in st.cpu_waiting if r is not head and not r.in_flight
                   and r.ready and not r.finished]
        if not victims:
            return
        victim = victims[-1]
        st.cpu_waiting.remove(victim)
        st.host_pool.free(victim.blocks)
        victim.blocks, victim.computed, victim.phase = [], 0, Phase.WAITING
        victim.owner, victim.known = Owner.GPU, {"gpu": -1, "cpu": -1}
        victim.preemptions += 1
        st.gpu_waiting.appendleft(victim)
        plan.recomputed.append(victim)
    st.cpu_waiting.popleft()
    b.selected.append(head)


def step5_commit(st: SchedulerState, b: _Budget, plan: CpuPlan) -> None:
    """Materialise only the blocks for each selected request's next token."""
    for r in b.selected:
        r.blocks += st.host_pool.allocate(r.blocks_for_next())
    st.cpu_running = list(b.selected)
    plan.batch = list(b.selected)


def cpu_round(st: SchedulerState) -> CpuPlan:
    plan = CpuPlan()
    b = step1_budgets(st)
    step2_preserve_running_frontier(st, b, plan)
    step3_admit_ready_prefix(st, b, plan)
    step4_wait_on_readiness(st, b, plan)
    step5_commit(st, b, plan)
    return plan
