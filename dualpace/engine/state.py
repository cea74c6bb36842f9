"""The scheduling state both engine loops share: block pools, queues, limits, and the host-KV
obligations of Eq. 2-4 (paper §4.1). Torch-free; single-threaded (one asyncio loop)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dualpace.engine.policy import Policy, policy_named
from dualpace.engine.request import EngineRequest, Owner, Phase
from dualpace.kv.block_pool import BlockPool


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int  # rows of a GPU batch
    gpu_token_limit: int  # GPU batched-token limit (profile or --max-num-batched-tokens)
    cpu_batch_limit: int  # C: the CPU decode batch limit (flag, profile, else 256); the
    # CPU-owned population is bounded by host KV (Eq. 2), not by a row count
    max_model_len: int
    staging_blocks: int = 1 << 30  # GPU staging blocks for one round's Prefill-to-CPU


class SchedulerState:
    def __init__(self, gpu_pool: BlockPool, host_pool: BlockPool, limits: Limits,
                 policy: Policy | str = "dualpace"):
        self.gpu_pool = gpu_pool
        self.host_pool = host_pool
        self.limits = limits
        self.policy = policy if isinstance(policy, Policy) else policy_named(policy)
        self.gpu_waiting: deque[EngineRequest] = deque()  # prompts, FIFO
        self.gpu_running: list[EngineRequest] = []  # GPU-owned; the tail is evicted first
        self.cpu_waiting: deque[EngineRequest] = deque()  # CPU-owned, not in the active batch
        self.cpu_running: list[EngineRequest] = []  # the CPU active batch
        self.migration_reserve = 0  # B_C^migration, published by the GPU round
        # Host blocks the idle CPU tier's ready head needs but cannot get because of the
        # migration reserve (published by the CPU round, counted as growth by the GPU
        # round's admissions so they cannot grow the reserve past it: CPU-tier liveness).
        self.cpu_head_claim = 0

    # --- Eq. 2-4 --------------------------------------------------------------------------
    def cpu_growth(self, running: list[EngineRequest] | None = None) -> int:
        """B_C^growth (Eq. 3) over ``running`` (default: the CPU running queue)."""
        rs = self.cpu_running if running is None else running
        return sum(r.growth_blocks() for r in rs)

    def host_fits(self, planned: int = 0, growth: int | None = None,
                  migration: int | None = None) -> bool:
        """Eq. 2: used + planned + growth + migration <= capacity (blocks)."""
        g = self.cpu_growth() if growth is None else growth
        m = self.migration_reserve if migration is None else migration
        return self.host_pool.num_used + planned + g + m <= self.host_pool.num_blocks

    def eq2_violation(self) -> str | None:
        """Eq. 2 in full between rounds (B_C^planned is then materialised in used):
        a description of the violation, or None."""
        used, growth = self.host_pool.num_used, self.cpu_growth()
        m, cap = self.migration_reserve, self.host_pool.num_blocks
        if used + growth + m <= cap:
            return None
        return f"Eq. 2: used {used} + growth {growth} + migration {m} > capacity {cap}"

    def marked(self) -> list[EngineRequest]:
        """CPU-owned requests marked for a deferred swap-in (A.1 step 6), running ones first."""
        return [r for r in (*self.cpu_running, *self.cpu_waiting)
                if r.swap_in_mark and not r.finished]

    def migration_reserve_for(self, gpu_population: list[EngineRequest]) -> int:
        """Eq. 4: if the GPU population's finish-peak exceeds HBM, the suffix scanned from
        the eviction-priority tail that must move for the rest to fit, in blocks."""
        peak = sum(r.peak_blocks for r in gpu_population)
        cap = self.gpu_pool.num_blocks
        reserve = 0
        for r in reversed(gpu_population):
            if peak <= cap:
                break
            peak -= r.peak_blocks
            reserve += r.peak_blocks
        return reserve

    # --- ownership invariants (tests call this after every round) ---------------------------
    def check_invariants(self, live: list[EngineRequest]) -> None:
        queues = {
            "gpu_waiting": list(self.gpu_waiting), "gpu_running": self.gpu_running,
            "cpu_waiting": list(self.cpu_waiting), "cpu_running": self.cpu_running,
        }
        seen: dict[int, str] = {}
        for name, q in queues.items():
            for r in q:
                if r.rid in seen:
                    raise AssertionError(f"request {r.rid} in {seen[r.rid]} and {name}")
                seen[r.rid] = name
                want = Owner.GPU if name.startswith("gpu") else Owner.CPU
                if r.owner is not want:
                    raise AssertionError(f"request {r.rid} in {name} owned by {r.owner}")
        for r in self.gpu_waiting:  # n > 1: siblings not admitted yet wait with the first
            for f in r.forks:
                if f.rid in seen or f.blocks or not f.awaiting_fork:
                    raise AssertionError(f"sibling {f.rid} of waiting request {r.rid} is "
                                         "queued, holds blocks or awaits no fork")
                seen[f.rid] = f"forks of {r.rid}"
        # (set unions and len sums run in C: the simulator checks this after every round)
        gpu_lists = [r.blocks for r in live if r.owner is Owner.GPU]
        cpu_lists = [r.blocks for r in live if r.owner is Owner.CPU]
        cpu_lists += [r.pending_free for r in live if r.pending_free]  # swap-in sources
        n_gpu, n_cpu = sum(map(len, gpu_lists)), sum(map(len, cpu_lists))
        if n_gpu != len(set().union(*gpu_lists)) or n_cpu != len(set().union(*cpu_lists)):
            raise AssertionError("a KV block is held twice")
        if n_gpu != self.gpu_pool.num_used:
            raise AssertionError(f"GPU pool: {self.gpu_pool.num_used} used, requests hold "
                                 f"{n_gpu}")
        if n_cpu != self.host_pool.num_used:
            raise AssertionError(f"host pool: {self.host_pool.num_used} used, requests hold "
                                 f"{n_cpu}")
        for r in live:
            if r.phase is not Phase.FINISHED and r.rid not in seen:
                raise AssertionError(f"live request {r.rid} is in no queue")
