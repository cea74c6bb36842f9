"""Single scheduling rounds on hand-built states (Appendix A), one per rule the paper states
and the earlier code broke: Eq. 2 in full for both prefill destinations, a swap-in mark's
reservation lasting until its swap-in commits, long prompts reaching the host tier, the CPU
tier bounded by C and host KV, and the CPU tier's liveness keeping Eq. 2 whole."""

from __future__ import annotations

from dualpace.engine.cpu_round import cpu_round
from dualpace.engine.gpu_round import gpu_round
from dualpace.engine.request import EngineRequest, Owner, Phase
from dualpace.engine.state import Limits, SchedulerState
from dualpace.kv.block_pool import BlockPool, blocks_for_tokens
from dualpace.sampling.params import SamplingParams

BS = 4


def _state(gpu_blocks: int, host_blocks: int, tokens: int = 64, max_seqs: int = 8,
           cpu_limit: int = 8) -> SchedulerState:
    limits = Limits(max_num_seqs=max_seqs, gpu_token_limit=tokens, cpu_batch_limit=cpu_limit,
                    max_model_len=10_000)
    return SchedulerState(BlockPool(gpu_blocks, BS), BlockPool(host_blocks, BS), limits)


_rid = iter(range(1, 10_000))


def _prompt(st: SchedulerState, prompt_len: int, max_tokens: int) -> EngineRequest:
    r = EngineRequest(next(_rid), [1] * prompt_len, SamplingParams(max_tokens=max_tokens),
                      0, max_tokens, BS)
    st.gpu_waiting.append(r)
    return r


def _gpu_decode(st: SchedulerState, num_tokens: int, max_tokens: int) -> EngineRequest:
    """A GPU-resident decode whose KV holds ``num_tokens - 1`` tokens (the last is pending)."""
    r = EngineRequest(next(_rid), [1] * (num_tokens - 1), SamplingParams(max_tokens=max_tokens),
                      0, max_tokens, BS, out=[2])
    r.phase, r.computed = Phase.DECODE, num_tokens - 1
    r.blocks = st.gpu_pool.allocate(blocks_for_tokens(num_tokens - 1, BS))
    st.gpu_running.append(r)
    return r


def _cpu_decode(st: SchedulerState, num_tokens: int, max_tokens: int,
                running: bool) -> EngineRequest:
    r = EngineRequest(next(_rid), [1] * (num_tokens - 1), SamplingParams(max_tokens=max_tokens),
                      0, max_tokens, BS, out=[2], owner=Owner.CPU, phase=Phase.DECODE)
    r.computed = num_tokens - 1
    r.blocks = st.host_pool.allocate(blocks_for_tokens(num_tokens - 1, BS))
    (st.cpu_running if running else st.cpu_waiting).append(r)
    return r


# --- Eq. 2 for both destinations --------------------------------------------------------
def test_prefill_to_gpu_counts_this_rounds_planned_host_blocks():
    """A swap-out plans 5 host blocks; the next prompt's Prefill-to-GPU would raise the
    reserve to 6: 5 + 6 > 10, so it must not go to the GPU (it fits Prefill-to-CPU)."""
    st = _state(gpu_blocks=12, host_blocks=10)
    d1 = _gpu_decode(st, num_tokens=25, max_tokens=8)  # 6 blocks, needs a 7th; peak 8
    d2 = _gpu_decode(st, num_tokens=21, max_tokens=2)  # 5 blocks, needs a 6th: evicted
    a = _prompt(st, 16, 8)  # 4 blocks, peak 6
    plan = gpu_round(st)
    assert [m.req for m in plan.swap_out] == [d2] and d1 in plan.decodes
    assert a not in [r for r, _ in plan.prefills]
    assert plan.to_cpu == [a]
    assert st.eq2_violation() is None


def test_prefill_to_cpu_uses_the_reserve_after_this_rounds_gpu_admissions():
    """Prompt a goes to the GPU and raises B_C^migration from 0 to 10; b (11 host blocks)
    would then break Eq. 2 (11 + 10 > 20): it waits."""
    st = _state(gpu_blocks=16, host_blocks=20)
    _gpu_decode(st, num_tokens=16, max_tokens=24)  # 4 blocks, peak 10
    a = _prompt(st, 16, 24)  # peak 10: population peak 20 > 16, the tail's 10 in reserve
    b = _prompt(st, 44, 4)
    plan = gpu_round(st)
    assert [r for r, _ in plan.prefills] == [a]
    assert plan.to_cpu == [] and b in st.gpu_waiting
    assert st.migration_reserve == 10
    assert st.eq2_violation() is None


# --- swap-in marks ------------------------------------------------------------------------
def test_a_mark_keeps_its_hbm_until_the_swap_in_commits():
    st = _state(gpu_blocks=16, host_blocks=64)
    b = _cpu_decode(st, num_tokens=21, max_tokens=40, running=True)  # peak 15 blocks
    gpu_round(st)
    assert b.swap_in_mark  # GPU idle, CPU waiting queue empty: marked (A.1 step 6)
    # A new prompt needing 12 blocks arrives before the CPU engine yields b: the 6 blocks
    # b's swap-in needs stay reserved, so the prompt cannot take them (it goes to the host).
    c = _prompt(st, 48, 4)
    plan = gpu_round(st)
    assert c not in [r for r, _ in plan.prefills] and plan.to_cpu == [c]
    assert st.gpu_pool.num_free >= blocks_for_tokens(b.num_tokens + 1, BS)
    cpu_round(st)  # the CPU engine yields the marked request at its batch boundary
    assert b in st.cpu_waiting and b not in st.cpu_running
    b_ready_plan = gpu_round(st)
    assert [m.req for m in b_ready_plan.swap_in] == [b]
    assert b.owner is Owner.GPU and not b.swap_in_mark


def test_a_mark_that_no_longer_fits_is_withdrawn():
    st = _state(gpu_blocks=16, host_blocks=64)
    b = _cpu_decode(st, num_tokens=21, max_tokens=40, running=True)
    gpu_round(st)
    assert b.swap_in_mark
    st.gpu_pool.allocate(12)  # HBM taken by GPU work the mark cannot displace
    gpu_round(st)
    assert not b.swap_in_mark and b.owner is Owner.CPU


def test_recompute_preemption_voids_the_mark():
    """The idle CPU tier's head needs room; the youngest waiting request is recompute-
    preempted, and it was marked: the mark goes with its KV (the old code kept it)."""
    st = _state(gpu_blocks=64, host_blocks=15, cpu_limit=4)  # 5 + 6 used, head grows 5
    head = _cpu_decode(st, num_tokens=21, max_tokens=20, running=False)  # 5 blocks, peak 10
    victim = _cpu_decode(st, num_tokens=25, max_tokens=4, running=False)  # 6 blocks
    victim.swap_in_mark = True
    plan = cpu_round(st)
    assert plan.batch == [head] and plan.recomputed == [victim]
    assert victim in st.gpu_waiting and not victim.swap_in_mark
    assert victim.owner is Owner.GPU and victim.blocks == []
    assert st.eq2_violation() is None


# --- CPU-tier liveness keeps Eq. 2 ----------------------------------------------------------
def test_a_head_blocked_by_the_reserve_waits_and_claims_its_growth():
    st = _state(gpu_blocks=64, host_blocks=20)
    head = _cpu_decode(st, num_tokens=21, max_tokens=20, running=False)  # 5 blocks, peak 10
    st.migration_reserve = 12  # 5 + 5 + 12 > 20, and there is nobody to preempt
    plan = cpu_round(st)
    assert plan.batch == [] and head in st.cpu_waiting
    assert st.cpu_head_claim == head.growth_blocks() == 5
    # The GPU round's admissions now count the claim: a prompt whose Prefill-to-GPU leaves
    # no room for the head in Eq. 2 is not admitted to the GPU.
    st.migration_reserve = 0
    _gpu_decode(st, num_tokens=100, max_tokens=150)  # peak 63 of 64: any new peak spills
    p = _prompt(st, 16, 30)  # peak 12 -> reserve 12: 5 + 5 + 12 > 20
    plan = gpu_round(st)
    assert p not in [r for r, _ in plan.prefills]


# --- long prompts and the size of the CPU tier ----------------------------------------------
def test_a_prompt_longer_than_the_token_limit_goes_prefill_to_cpu_alone():
    st = _state(gpu_blocks=8, host_blocks=200, tokens=32)
    long_one = _prompt(st, 100, 4)
    after = _prompt(st, 8, 4)
    plan = gpu_round(st)
    assert plan.to_cpu == [long_one] and plan.prefills == []
    assert after in st.gpu_waiting  # the round is past its limit: nothing else joins it
    plan = gpu_round(st)
    assert [r for r, _ in plan.prefills] == [after]


def test_a_long_prompt_waits_for_a_round_without_other_prefill_work():
    st = _state(gpu_blocks=8, host_blocks=200, tokens=32)
    short = _prompt(st, 8, 4)
    long_one = _prompt(st, 100, 4)
    plan = gpu_round(st)
    assert [r for r, _ in plan.prefills] == [short] and plan.to_cpu == []
    assert long_one in st.gpu_waiting


def test_the_cpu_owned_population_is_not_bounded_by_max_num_seqs():
    st = _state(gpu_blocks=4, host_blocks=400, tokens=1000, max_seqs=4, cpu_limit=12)
    for _ in range(10):
        _prompt(st, 20, 4)
    plan = gpu_round(st)
    assert len(plan.to_cpu) == 4  # a GPU batch has at most max_num_seqs rows
    for r in plan.to_cpu:
        r.ready = True
    for _ in range(2):
        for r in gpu_round(st).to_cpu:
            r.ready = True
    assert len(st.cpu_waiting) == 10 > st.limits.max_num_seqs
    plan = cpu_round(st)
    assert len(plan.batch) == 10  # one CPU batch of 10 rows: bounded by C = 12
