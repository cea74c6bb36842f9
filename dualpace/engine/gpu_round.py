"""One GPU engine scheduling round: Appendix A.1 steps 1-7, each a function; the round is
their sequence. Torch-free: it decides and commits blocks/ownership, it does not execute.

Policies share the steps (engine/policy.py): without a host tier (``gpu-only``) a decode
shortage recompute-preempts the newest request and nothing migrates; deferred swap-in marks
exist only where the CPU engine has its own rounds to yield them (``dualpace``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dualpace.engine.request import EngineRequest, Owner, Phase
from dualpace.engine.state import SchedulerState
from dualpace.kv.block_pool import blocks_for_tokens


@dataclass
class Move:
    req: EngineRequest
    src: list[int]
    dst: list[int]
    num_tokens: int


@dataclass(frozen=True)
class StepRow:
    """One row of a GPU step, in the order the descriptor's seqs and the result's tokens
    follow: a decode, a prefill chunk of ``tokens`` tokens, or a whole Prefill-to-CPU.
    ``forks``: the siblings (n > 1) whose blocks take the prompt's KV once this row's
    prefill has written it (the row that completes the prompt)."""

    kind: Literal["decode", "prefill", "to_cpu"]
    req: EngineRequest
    tokens: int
    forks: tuple[EngineRequest, ...] = ()


@dataclass
class GpuPlan:
    decodes: list[EngineRequest] = field(default_factory=list)
    prefills: list[tuple[EngineRequest, int]] = field(default_factory=list)  # (req, tokens)
    to_cpu: list[EngineRequest] = field(default_factory=list)  # Prefill-to-CPU
    swap_out: list[Move] = field(default_factory=list)
    swap_in: list[Move] = field(default_factory=list)
    preempted: list[EngineRequest] = field(default_factory=list)  # gpu-only recompute
    host_planned: int = 0  # B_C^planned: host blocks this round's swap-outs and P2C take

    @property
    def empty(self) -> bool:
        return not (self.decodes or self.prefills or self.to_cpu or self.swap_out
                    or self.swap_in)

    @property
    def rows(self) -> int:
        return len(self.decodes) + len(self.prefills) + len(self.to_cpu)

    def step_rows(self) -> list[StepRow]:
        """The committed plan's rows: decodes, then prefill chunks, then Prefill-to-CPU."""
        return ([StepRow("decode", r, 1) for r in self.decodes]
                + [StepRow("prefill", r, n, _forks(r) if r.computed + n == r.num_tokens
                           else ()) for r, n in self.prefills]
                + [StepRow("to_cpu", r, r.num_tokens, _forks(r)) for r in self.to_cpu])


def _forks(r: EngineRequest) -> tuple[EngineRequest, ...]:
    return tuple(r.group()[1:])


@dataclass
class _Budget:
    free: int  # GPU blocks
    tokens: int
    rows: int
    peak: int  # finish-peak blocks of the planned GPU population


def _gpu_population(st: SchedulerState, plan: GpuPlan) -> list[EngineRequest]:
    """Q_G after the round's decisions, in eviction-priority order (the tail goes first):
    GPU-owned requests, this round's admissions, then requests marked for a swap-in."""
    evicted = {m.req.rid for m in plan.swap_out}
    pop = [r for r in st.gpu_running if r.rid not in evicted]
    pop += [q for r, _ in plan.prefills for q in r.group() if q not in pop]
    pop += [m.req for m in plan.swap_in]
    taken = {m.req.rid for m in plan.swap_in}
    pop += [r for r in st.marked() if r.rid not in taken]
    return pop


def reserve_violation(st: SchedulerState) -> str | None:
    """Right after a GPU round: the reserve it published (Eq. 4) must cover that of the
    population it committed, ranked as the next round will rank it (_gpu_population over
    the queues alone). A larger one there breaks Eq. 2 with no admission at all (as when
    step 7 appended this round's swap-ins before its admissions). A smaller one is only
    conservative (a lookahead round, engine/lookahead.py, publishes before a step's
    finishing requests leave). A description of the shortfall, or None."""
    if not st.policy.host_tier:
        return None
    committed = st.migration_reserve_for(
        [r for r in _gpu_population(st, GpuPlan()) if not r.finished])
    if committed <= st.migration_reserve:
        return None
    return f"published reserve {st.migration_reserve}, committed population's {committed}"


def _admission_growth(st: SchedulerState) -> int:
    """The growth term of Eq. 2 for the GPU round's admissions: the CPU running queue's
    (Eq. 3) plus what an idle CPU tier's blocked head claimed (liveness, see cpu_round)."""
    return st.cpu_growth() + st.cpu_head_claim


# --- step 1 ---------------------------------------------------------------------------------
def step1_transfer_frontier(st: SchedulerState) -> None:
    """Completed transfers were retired when their step returned (the GPU worker drains each
    step's copy group before replying), so staging is never reused while copies run. Here:
    drop finished requests from the GPU queues."""
    st.gpu_running = [r for r in st.gpu_running if not r.finished]
    while st.gpu_waiting and st.gpu_waiting[0].finished:
        st.gpu_waiting.popleft()


# --- step 2 ---------------------------------------------------------------------------------
def step2_next_token_feasibility(st: SchedulerState, plan: GpuPlan, b: _Budget) -> bool:
    """Make room for every GPU decode's next token, evicting from the priority tail to the
    host (skipping victims the host cannot take). Returns False for a migration-only round."""
    decodes = [r for r in st.gpu_running if r.phase is Phase.DECODE]
    need = sum(r.blocks_for_next() for r in decodes)
    if need <= b.free:
        plan.decodes = decodes
        return True
    if not st.policy.host_tier:
        return _recompute_preempt(st, plan, b, decodes)
    deficit = need - b.free
    population = _gpu_population(st, plan)
    for r in reversed(decodes):
        if deficit <= 0:
            break
        n = blocks_for_tokens(r.num_tokens - 1, st.host_pool.block_size)
        # Evictions may use the migration reserve (that is what it was kept for), and only
        # that: Eq. 2 is checked with the reserve of the population the victim leaves, so it
        # still holds once the victim's KV is on the host.
        rest = [q for q in population if q is not r]
        if st.host_fits(planned=plan.host_planned + n, migration=st.migration_reserve_for(rest)):
            plan.swap_out.append(Move(r, list(r.blocks), [], r.num_tokens - 1))
            plan.host_planned += n
            population = rest
            deficit -= len(r.blocks) + r.blocks_for_next()
    victims = {m.req.rid for m in plan.swap_out}
    remaining = [r for r in decodes if r.rid not in victims]
    if not plan.swap_out:  # nothing can move: run the decodes that fit
        free = b.free  # step 4 charges the admitted decodes' next tokens to b.free
        for r in remaining:
            if r.blocks_for_next() <= free:
                free -= r.blocks_for_next()
                plan.decodes.append(r)
        if not plan.decodes:
            # Liveness beyond the paper: no decode can grow and the host takes no victim, so
            # recompute-preempt the newest (as vLLM does) rather than stall the GPU tier.
            _recompute_preempt(st, plan, b, remaining)
        return True
    if deficit > 0:  # partial relief: migrate now, re-evaluate after the transfers
        return False
    plan.decodes = remaining
    b.free += sum(len(m.req.blocks) for m in plan.swap_out)
    return True


def _recompute_preempt(st, plan, b, decodes) -> bool:
    """vLLM-style: free the newest requests' KV and recompute them later."""
    while decodes and sum(r.blocks_for_next() for r in decodes) > b.free:
        victim = decodes.pop()
        plan.preempted.append(victim)
        b.free += len(victim.blocks)
    plan.decodes = decodes
    return True


# --- step 3 ---------------------------------------------------------------------------------
def step3_migration_reserve(st: SchedulerState, plan: GpuPlan) -> None:
    """Publish B_C^migration (Eq. 4) for the GPU ownership queue after current decisions."""
    if not st.policy.host_tier:
        st.migration_reserve = 0
        return
    st.migration_reserve = st.migration_reserve_for(_gpu_population(st, plan))


# --- steps 4 and 6: swap-in ------------------------------------------------------------------
def _swap_in_prefix(st: SchedulerState, plan: GpuPlan, b: _Budget) -> None:
    """Swap in a ready FIFO prefix of the CPU waiting queue while each request fits both the
    next-token HBM budget and, by finish-peak, HBM through completion (migration
    minimisation: it will not have to move again)."""
    taken = {m.req.rid for m in plan.swap_in}
    for r in list(st.cpu_waiting):
        if r.rid in taken or r.finished:
            continue
        if not r.ready or r.in_flight or b.rows < 1 or b.tokens < 1:
            break
        need = blocks_for_tokens(r.num_tokens, st.gpu_pool.block_size)
        if need > b.free or b.peak + r.peak_blocks > st.gpu_pool.num_blocks:
            break
        plan.swap_in.append(Move(r, list(r.blocks), [], r.num_tokens - 1))
        # Eq. 2 with the reserve of the population it joins, in the order the round
        # publishes it: its host blocks stay in use until the step has copied them, and
        # prompts this round admitted may already have grown the reserve (step 6 runs
        # after step 5).
        if not st.host_fits(planned=plan.host_planned,
                            migration=st.migration_reserve_for(_gpu_population(st, plan))):
            plan.swap_in.pop()
            break
        b.free -= need
        b.peak += r.peak_blocks
        b.rows -= 1
        b.tokens -= 1


def _mark_need(r: EngineRequest, block_size: int) -> int:
    """HBM a deferred swap-in takes: the request's KV and its next token (A.1 step 6)."""
    return blocks_for_tokens(r.num_tokens + 1, block_size)


def _hold_marks(st: SchedulerState, plan: GpuPlan, b: _Budget) -> None:
    """A mark reserves GPU rows, tokens, HBM and finish-peak HBM until its swap-in commits
    (A.1 step 6), in every round, not only the one that set it: a marked request the CPU
    engine has yielded is swapped in now, first; one it still runs keeps its reservation.
    A mark that no longer fits (GPU decodes' growth comes first) is withdrawn, and so is
    every mark in a round that evicts (HBM is short)."""
    for r in st.marked():
        if plan.swap_out:
            r.swap_in_mark = False
            continue
        need = _mark_need(r, st.gpu_pool.block_size)
        yielded = r in st.cpu_waiting
        if yielded and r.ready and not r.in_flight:
            need = blocks_for_tokens(r.num_tokens, st.gpu_pool.block_size)
        if b.rows < 1 or b.tokens < 1 or need > b.free or (
                b.peak + r.peak_blocks > st.gpu_pool.num_blocks):
            r.swap_in_mark = False
            continue
        if yielded and r.ready and not r.in_flight:
            plan.swap_in.append(Move(r, list(r.blocks), [], r.num_tokens - 1))
        b.free -= need
        b.peak += r.peak_blocks
        b.rows -= 1
        b.tokens -= 1


def step4_admit_decodes_and_early_swap_in(st: SchedulerState, plan: GpuPlan, b: _Budget) -> None:
    b.rows -= len(plan.decodes)
    b.tokens -= len(plan.decodes)
    b.free -= sum(r.blocks_for_next() for r in plan.decodes)
    if not st.policy.host_tier:
        return
    _hold_marks(st, plan, b)
    cpu_full = len(st.cpu_running) >= st.limits.cpu_batch_limit
    if cpu_full and st.cpu_waiting and not plan.swap_out:
        _swap_in_prefix(st, plan, b)


# --- step 5 ---------------------------------------------------------------------------------
def step5_admit_prefills(st: SchedulerState, plan: GpuPlan, b: _Budget) -> None:
    """FIFO prompt admission: chunks of prompts already prefilling first, then new prompts,
    each Prefill-to-GPU when its persistent KV fits HBM, else Prefill-to-CPU; once one goes
    to the CPU tier the rest of the round follows it (no smaller prompt jumps the queue).
    Both destinations are admitted only while Eq. 2 holds in full: B_C^planned, the CPU
    running growth and the reserve of the GPU population *after* this round's admissions.
    The CPU-owned population is bounded by host KV, not by a row count.

    A prompt longer than the batched-token limit can go Prefill-to-CPU alone in a round past
    the limit (the paper's "hard token limit" beside the profiled one), staged whole: chunking
    it through the one-layer staging area would need its earlier chunks' KV of every layer
    on the GPU for the later chunks' attention (the HBM it was sent away to save) or read
    back from the host per chunk; one long step instead delays the round's GPU decodes once,
    as a prompt without chunked prefill does in vLLM."""
    for r in st.gpu_running:
        if r.phase is Phase.PREFILL and not r.awaiting_fork and b.tokens > 0 and b.rows > 0:
            n = min(r.num_tokens - r.computed, b.tokens)
            plan.prefills.append((r, n))
            b.tokens -= n
            b.rows -= 1
    to_cpu_mode = False
    staging = st.limits.staging_blocks
    population = _gpu_population(st, plan)  # grows as prompts are admitted to the GPU
    growth = _admission_growth(st)
    for r in st.gpu_waiting:
        if r.finished:
            continue
        total = r.num_tokens  # prompt, or prompt + outputs when recomputing
        alone = total > st.limits.gpu_token_limit and not plan.prefills and not plan.to_cpu
        if b.rows < 1 or (b.tokens < 1 and not alone):
            break
        group = r.group()  # n > 1: the siblings are admitted with it, blocks and all
        need = blocks_for_tokens(total, st.gpu_pool.block_size) * len(group)
        if (not to_cpu_mode and b.tokens >= 1 and need <= b.free
                and len(st.gpu_running) + b_new(plan) + len(group) <= st.limits.max_num_seqs):
            n = min(total, b.tokens)
            plan.prefills.append((r, n))
            # The reserve of the population with it, in the order the round publishes it
            # (_gpu_population: admissions before swap-ins and marks; a group appended at
            # the tail instead found a smaller reserve than the one published: Eq. 2 broken
            # by a swap-in's size, found by the property tests).
            admitted = _gpu_population(st, plan)
            reserve = st.migration_reserve_for(admitted)
            if not st.policy.host_tier or st.host_fits(planned=plan.host_planned,
                                                        growth=growth, migration=reserve):
                population = admitted
                b.free -= need
                b.tokens -= n
                b.rows -= 1
                b.peak += sum(q.peak_blocks for q in group)
                continue
            plan.prefills.pop()
        if not st.policy.host_tier:
            break
        n_host = blocks_for_tokens(total, st.host_pool.block_size)
        if (total > b.tokens and not alone) or n_host > staging:
            break  # (the staging area holds the prompt once; siblings' copies leave from it)
        if not st.host_fits(planned=plan.host_planned + n_host * len(group), growth=growth,
                            migration=st.migration_reserve_for(population)):
            break
        plan.to_cpu.append(r)
        to_cpu_mode = True
        plan.host_planned += n_host * len(group)
        staging -= n_host
        b.tokens -= total
        b.rows -= 1


def b_new(plan: GpuPlan) -> int:
    """Requests this round's new prompts add to the GPU running queue (siblings included)."""
    return sum(len(r.group()) for r, _ in plan.prefills if r.phase is Phase.WAITING)


# --- step 6 ---------------------------------------------------------------------------------
def step6_residual_swap_in(st: SchedulerState, plan: GpuPlan, b: _Budget,
                           cpu_waiting_was_empty: bool) -> None:
    if not st.policy.host_tier or plan.swap_out:
        return
    _swap_in_prefix(st, plan, b)
    if not cpu_waiting_was_empty or not st.policy.deferred_swap_in:
        return  # marks are yielded by the CPU engine's own rounds
    for r in st.cpu_running:  # deferred swap-in marks: reserve now, move at a CPU boundary
        if r.swap_in_mark or r.finished:
            continue
        need = _mark_need(r, st.gpu_pool.block_size)
        if (b.rows < 1 or b.tokens < 1 or need > b.free
                or b.peak + r.peak_blocks > st.gpu_pool.num_blocks):
            break
        r.swap_in_mark = True
        b.free -= need
        b.peak += r.peak_blocks
        b.rows -= 1
        b.tokens -= 1


# --- step 7 ---------------------------------------------------------------------------------
def step7_commit(st: SchedulerState, plan: GpuPlan) -> None:
    """Materialise every decision: allocate destinations before releasing sources, move
    ownership, queue Prefill-to-CPU requests unready at the CPU waiting frontier."""
    for m in plan.swap_out:
        r = m.req
        m.dst = st.host_pool.allocate(blocks_for_tokens(m.num_tokens, st.host_pool.block_size))
        st.gpu_running.remove(r)
        # Only the GPU worker touches GPU blocks and it copies them out before this step's
        # forward writes any KV, so they can serve other requests in the same step.
        st.gpu_pool.free(r.blocks)
        r.blocks = list(m.dst)  # the descriptor keeps m.dst as sent
        r.owner, r.ready = Owner.CPU, False
        st.cpu_waiting.append(r)
    for r in plan.preempted:
        st.gpu_running.remove(r)
        st.gpu_pool.free(r.blocks)
        r.reset_for_recompute()
        st.gpu_waiting.appendleft(r)
    # Admissions join the GPU running queue before this round's swap-ins, the order in
    # which _gpu_population ranks them and the round checked Eq. 2 with: appended after the
    # swap-ins, the next round's reserve (Eq. 4, scanned from the tail) took a larger
    # admission instead of a swap-in and broke Eq. 2 (used 41 + growth 4 + migration 23 >
    # 60 in a simulated run, the reserve 8 when the round checked it).
    for r, _ in plan.prefills:
        if r.phase is Phase.WAITING:
            st.gpu_waiting.remove(r)
            nb = blocks_for_tokens(r.num_tokens, st.gpu_pool.block_size)
            for q in r.group():  # siblings wait in PREFILL, awaiting_fork, for the KV copy
                q.blocks = st.gpu_pool.allocate(nb)
                q.phase = Phase.PREFILL
                st.gpu_running.append(q)
    for m in plan.swap_in:
        r = m.req
        m.dst = st.gpu_pool.allocate(blocks_for_tokens(m.num_tokens, st.gpu_pool.block_size))
        st.cpu_waiting.remove(r)
        # The CPU loop may allocate host blocks while this step copies them: free the
        # source only when the step has returned.
        r.pending_free, r.blocks = r.blocks, list(m.dst)
        r.owner, r.swap_in_mark = Owner.GPU, False
        st.gpu_running.append(r)
        plan.decodes.append(r)
    for r in plan.decodes:
        r.blocks += st.gpu_pool.allocate(r.blocks_for_next())
    for r in plan.to_cpu:
        st.gpu_waiting.remove(r)
        nb = blocks_for_tokens(r.num_tokens, st.host_pool.block_size)
        for q in r.group():  # unready until the step has written the KV into them all
            q.blocks = st.host_pool.allocate(nb)
            q.owner, q.ready, q.phase = Owner.CPU, False, Phase.DECODE
            st.cpu_waiting.append(q)


def only_gpu_decodes(st: SchedulerState) -> bool:
    """Nothing but the GPU decodes can enter a GPU round: no prompt waits, the CPU tier
    holds no request (so nothing swaps and no mark is set), every GPU request decodes."""
    if st.cpu_running or st.cpu_waiting or any(not r.finished for r in st.gpu_waiting):
        return False
    return all(r.phase is Phase.DECODE for r in st.gpu_running if not r.finished)


def _steady_decodes(st: SchedulerState, plan: GpuPlan) -> bool:
    """Steps 2-7 where nothing but the GPU decodes can enter the round (no prompt, no
    CPU-tier request, so no swap or mark) and HBM holds every decode's next token: the plan
    the full sequence commits then (every GPU decode; Eq. 4's reserve republished; the next
    tokens' blocks), without its budget bookkeeping. A decode step's round at batch 1 was a
    fifth of the engine's work between two steps (~48 of 218 us on this box)."""
    if not only_gpu_decodes(st):
        return False
    decodes = st.gpu_running
    if sum(r.blocks_for_next() for r in decodes) > st.gpu_pool.num_free:
        return False
    plan.decodes = list(decodes)
    step3_migration_reserve(st, plan)
    for r in plan.decodes:
        r.blocks += st.gpu_pool.allocate(r.blocks_for_next())
    return True


def gpu_round(st: SchedulerState) -> GpuPlan:
    plan = GpuPlan()
    step1_transfer_frontier(st)
    if _steady_decodes(st, plan):
        return plan
    return full_round(st, plan)


def full_round(st: SchedulerState, plan: GpuPlan) -> GpuPlan:
    """Steps 2-7 in full (after step 1)."""
    population_peak = sum(r.peak_blocks for r in st.gpu_running)
    b = _Budget(free=st.gpu_pool.num_free, tokens=st.limits.gpu_token_limit,
                rows=st.limits.max_num_seqs, peak=population_peak)
    cpu_waiting_was_empty = not st.cpu_waiting
    if not step2_next_token_feasibility(st, plan, b):
        plan.decodes = []  # a migration-only round: HBM is short, marks are withdrawn
        for r in st.marked():
            r.swap_in_mark = False
        step3_migration_reserve(st, plan)
        step7_commit(st, plan)
        return plan
    step3_migration_reserve(st, plan)
    step4_admit_decodes_and_early_swap_in(st, plan, b)
    step5_admit_prefills(st, plan, b)
    step6_residual_swap_in(st, plan, b, cpu_waiting_was_empty)
    step3_migration_reserve(st, plan)  # republish after the final decisions
    step7_commit(st, plan)
    return plan
