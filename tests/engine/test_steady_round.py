"""The GPU round's steady-state path (only GPU decodes can enter it) commits exactly what
the full Appendix A.1 sequence commits on the same state: the same decodes in the same
order, the same blocks from the pool, the same Eq. 4 reserve; and it steps aside for the
full sequence whenever anything else could enter the round or HBM is short."""

from __future__ import annotations

import copy
import random

import pytest

from dualpace.engine import gpu_round as G
from dualpace.engine.request import EngineRequest, Phase
from dualpace.engine.state import Limits, SchedulerState
from dualpace.kv.block_pool import BlockPool, blocks_for_tokens
from dualpace.sampling.params import SamplingParams

from . import other_work

BS = 4


def _state(rng: random.Random, policy: str) -> SchedulerState:
    st = SchedulerState(BlockPool(rng.randint(8, 40), BS), BlockPool(rng.randint(8, 80), BS),
                        Limits(max_num_seqs=8, gpu_token_limit=32, cpu_batch_limit=4,
                               max_model_len=1000), policy)
    for rid in range(rng.randint(1, 6)):
        prompt, out = rng.randint(1, 20), rng.randint(1, 12)
        need = blocks_for_tokens(prompt + out - 1, BS)
        if need > st.gpu_pool.num_free:
            break
        mt = out + rng.randint(1, 30)
        r = EngineRequest(rid, [1] * prompt, SamplingParams(max_tokens=mt), 0, mt, BS)
        r.out, r.phase = [5] * out, Phase.DECODE
        r.computed = r.num_tokens - 1
        r.blocks = st.gpu_pool.allocate(need)
        st.gpu_running.append(r)
    return st


def _outcome(st: SchedulerState, plan: G.GpuPlan):
    return ([r.rid for r in plan.decodes], [m.req.rid for m in plan.swap_out],
            [r.rid for r in plan.preempted], plan.prefills, plan.swap_in,
            {r.rid: list(r.blocks) for r in st.gpu_running + list(st.cpu_waiting)},
            st.migration_reserve, st.gpu_pool.num_free, st.host_pool.num_free)


@pytest.mark.parametrize("policy", ["dualpace", "gpu-only", "gated"])
def test_the_steady_path_commits_what_the_full_round_commits(policy):
    rng = random.Random(policy)
    took = 0
    for _ in range(300):
        st = _state(rng, policy)
        twin = copy.deepcopy(st)
        fast = G.gpu_round(st)
        G.step1_transfer_frontier(twin)
        full = G.full_round(twin, G.GpuPlan())
        assert _outcome(st, fast) == _outcome(twin, full)
        took += bool(fast.decodes) and not full.swap_out and not full.preempted
    assert took > 100  # most drawn states fit, so the steady path ran


@pytest.mark.parametrize("case", ["prompt", "cpu-tier", "prefilling"])
def test_anything_else_in_the_round_takes_the_full_sequence(case, monkeypatch):
    st = _state(random.Random(1), "dualpace")
    if case == "prompt":
        other_work.add_waiting_prompt(st, 99)
    elif case == "cpu-tier":
        other_work.add_cpu_resident(st, 99)
    else:
        st.gpu_running[0].phase = Phase.PREFILL
    calls = []
    real = G.full_round
    monkeypatch.setattr(G, "full_round", lambda s, p: calls.append(1) or real(s, p))
    G.gpu_round(st)
    assert calls == [1]
