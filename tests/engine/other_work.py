"""Requests that put something besides GPU decodes into a GPU round, for the tests of the
rounds' shortcuts (the steady-state round, the step submitted ahead)."""

from __future__ import annotations

from dualpace.engine.request import EngineRequest, Owner, Phase
from dualpace.engine.state import SchedulerState
from dualpace.sampling.params import SamplingParams


def prompt(rid: int, block_size: int) -> EngineRequest:
    """A 4-token prompt of max_tokens 5, not yet admitted."""
    return EngineRequest(rid, [1] * 4, SamplingParams(max_tokens=5), 0, 5, block_size)


def add_waiting_prompt(st: SchedulerState, rid: int) -> None:
    st.gpu_waiting.append(prompt(rid, st.gpu_pool.block_size))


def add_cpu_resident(st: SchedulerState, rid: int) -> None:
    r = prompt(rid, st.gpu_pool.block_size)
    r.owner, r.phase = Owner.CPU, Phase.DECODE
    st.cpu_running.append(r)
