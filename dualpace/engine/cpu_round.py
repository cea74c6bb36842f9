"""One CPU engine scheduling round: Appendix A.2 steps 1-5, each a function.

The CPU engine advances host-resident requests on its own clock. It keeps its running
frontier first, admits only a ready FIFO prefix of its waiting queue (it waits on the head's
readiness rather than bypassing it), and treats the migration reserve B_C^migration that the
GPU round published as unavailable host capacity (Eq. 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpace.engine.request import EngineRequest
from dualpace.engine.state import SchedulerState


@dataclass
class CpuPlan:
    batch: list[EngineRequest] = field(default_factory=list)
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
    """Row limit C, then Eq. 2 with r's next token and finish growth (the migration reserve
    B_C^migration counts as unavailable)."""
    return len(b.selected) < b.rows and st.host_fits(growth=b.growth + r.growth_blocks())


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
        if not _fits(st, b, r):
            break
        st.cpu_waiting.popleft()
        b.selected.append(r)
        b.growth += r.growth_blocks()


def step4_wait_on_readiness(st: SchedulerState, b: _Budget, plan: CpuPlan) -> None:
    st.cpu_head_claim = 0
    if b.selected or not st.cpu_waiting:
        return
    head = st.cpu_waiting[0]
    if head.ready and not head.swap_in_mark and not head.finished:
        _progress_guarantee(st, b, plan, head)
    # An unready head: the round waits on its readiness (the transfer's step wakes the loop).


def _progress_guarantee(st: SchedulerState, b: _Budget, plan: CpuPlan,
                        head: EngineRequest) -> None:
    """Liveness beyond the paper's envelope (make_room_for_head): the idle tier's ready
    head runs once room is made for it, or waits claiming its growth."""
    victims = make_room_for_head(st, head)
    if victims is None:
        return
    plan.recomputed += victims
    st.cpu_waiting.remove(head)
    b.selected.append(head)
    b.growth += head.growth_blocks()


def make_room_for_head(st: SchedulerState, head: EngineRequest) -> list[EngineRequest] | None:
    """Liveness beyond the paper's envelope, with Eq. 2 kept whole, for a ready CPU-waiting
    ``head`` that nothing else will run. Eq. 2 excludes it only when host KV is held by
    waiting requests (their growth is reserved only while they run, so their peaks need not
    fit together) or by the migration reserve; the paper's rules would then wait for ever on
    the first. If recompute-preempting younger waiting requests (their KV dropped, back to
    the GPU waiting queue, as vLLM preempts) makes room, the youngest go until the head
    fits: returns them (none if it fits already), and the caller runs the head. If only the
    reserve stands in the way, returns None: the head waits, as A.2 step 4 says, and claims
    its growth (``cpu_head_claim``) so the GPU round's admissions cannot grow the reserve
    past it: GPU requests finish, the reserve shrinks, the head runs. Used by the CPU round
    and by the gated pipeline's selection (llm_engine.py), whose NEO admission has no such
    rule of its own."""
    cap = st.host_pool.num_blocks
    over = (st.host_pool.num_used + head.growth_blocks() + st.migration_reserve) - cap
    victims = [r for r in reversed(st.cpu_waiting) if r is not head and r.ready
               and not r.in_flight and not r.finished]
    if over > sum(len(v.blocks) for v in victims):
        st.cpu_head_claim = head.growth_blocks()
        return None
    preempted = []
    for victim in victims:
        if over <= 0:
            break
        over -= len(victim.blocks)
        st.cpu_waiting.remove(victim)
        st.host_pool.free(victim.blocks)
        victim.reset_for_recompute()
        st.gpu_waiting.appendleft(victim)
        preempted.append(victim)
    return preempted


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
