"""Async scheduling: the GPU engine's next decode step, submitted before the step in flight
has returned, so that the worker never waits for the engine's round between two steps.

Beyond the paper: §5's engines alternate plan -> execute -> apply. On a box whose engine
shares cores with the workers, the engine's round between two decode steps (applying the
tokens, the next round, the descriptor) is the GPU worker's idle time every step; vLLM's
``--async-scheduling`` removes it the same way. The step ahead decodes each row's *previous*
token, which only the worker knows yet (``protocol.PREVIOUS_TOKEN``), one position later.

It is taken only where the next round is known to be the same decodes again: nothing waits
for the GPU (no prompt, no swap, no CPU-tier request: the CPU tier then has no work either
and so nothing moves), every GPU-resident request decodes in the step in flight, and HBM
holds each row's next block. A row that step will finish by length is left out; one it
finishes by a stop token or an abort runs one token too many, which is dropped (its KV
lands in blocks that are freed after it; the GPU worker runs its steps in order).
Penalized requests (whose worker-side outputs the engine sends) end the chain.

Torch-free (engine/): the selection and its block commit are tested with fake workers.
"""

from __future__ import annotations

from dualpace.engine.gpu_round import GpuPlan, only_gpu_decodes
from dualpace.engine.request import EngineRequest
from dualpace.engine.state import SchedulerState
from dualpace.kv.block_pool import blocks_for_tokens


def _ahead_need(r: EngineRequest, block_size: int) -> int:
    """Blocks to append so the token after the one in flight has its KV slot."""
    return max(0, blocks_for_tokens(r.num_tokens + 1, block_size) - len(r.blocks))


def lookahead_rows(st: SchedulerState, in_flight: GpuPlan) -> list[EngineRequest]:
    """The requests a decode step submitted now, behind ``in_flight`` (committed, its
    result not applied), runs; empty: none is to be submitted ahead (see the module)."""
    if (in_flight.prefills or in_flight.to_cpu or in_flight.swap_out or in_flight.swap_in
            or in_flight.preempted):
        return []
    if not only_gpu_decodes(st):
        return []
    live = [r for r in in_flight.decodes if not r.finished]
    running = [r for r in st.gpu_running if not r.finished]
    if len(live) != len(running) or {r.rid for r in live} != {r.rid for r in running}:
        return []
    if any(r.params.penalized for r in live):
        return []
    # The step in flight samples out[len(out)]; the one ahead out[len(out) + 1].
    rows = [r for r in live if r.abort_requested is None and len(r.out) + 2 <= r.max_tokens]
    bs = st.gpu_pool.block_size
    if sum(_ahead_need(r, bs) for r in rows) > st.gpu_pool.num_free:
        return []
    return rows


def commit_lookahead(st: SchedulerState, rows: list[EngineRequest]) -> GpuPlan:
    """Give each row the block its token ahead needs; the plan of the step ahead."""
    bs = st.gpu_pool.block_size
    for r in rows:
        r.blocks += st.gpu_pool.allocate(_ahead_need(r, bs))
    return GpuPlan(decodes=list(rows))
