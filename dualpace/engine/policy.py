"""The three scheduling policies, one object each (paper §6.1 "Baselines"). Torch-free.

The GPU round's steps (Appendix A.1) and the engine's loops are shared; a policy says which
of them apply, by capability rather than by name, so a fourth policy is one more object:

    dualpace   both engines on their own clocks (§4.1); host KV tier; deferred swap-in marks
               yielded at CPU-engine boundaries; Dense Assist routed per batch by Eq. 5.
    gated      NEO-style (§2, §6.1): host KV tier, but no CPU clock: CPU-resident decodes
               advance only inside GPU iterations whose overlap condition (Eq. 1) holds,
               attention on the CPU worker and every dense stage on the GPU worker (the
               forced ``neo-pipeline`` route, which the workers read from their spec).
    gpu-only   vLLM-style: no host tier; a decode shortage recompute-preempts the newest.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpace.runtime.routing import NEO_PIPELINE, assist_reachable


@dataclass(frozen=True)
class Policy:
    name: str
    host_tier: bool  # a host KV pool: swap-out/in, Prefill-to-CPU, the migration reserve
    cpu_clock: bool  # the CPU engine runs its own loop (otherwise the GPU loop carries it)
    deferred_swap_in: bool  # A.1 step 6's marks, yielded by the CPU engine's own rounds
    forced_route: str  # a CPU step's route for every batch; "" = Eq. 5 per batch size

    @property
    def gpu_carries_cpu(self) -> bool:
        """The GPU loop adds CPU-resident decodes to its iterations (NEO's single clock)."""
        return self.host_tier and not self.cpu_clock

    def serves_boundaries(self, cpu_batch_limit: int, p: int, f: int) -> bool:
        """Whether the GPU worker checks for assists at its stage boundaries (§4.2): when a
        route can call one, and always under a forced route (its dense stages run there)."""
        return bool(self.forced_route) or assist_reachable(cpu_batch_limit, p, f)


DUALPACE = Policy("dualpace", host_tier=True, cpu_clock=True, deferred_swap_in=True,
                  forced_route="")
GATED = Policy("gated", host_tier=True, cpu_clock=False, deferred_swap_in=False,
               forced_route=NEO_PIPELINE)
GPU_ONLY = Policy("gpu-only", host_tier=False, cpu_clock=False, deferred_swap_in=False,
                  forced_route="")
POLICIES = {p.name: p for p in (DUALPACE, GATED, GPU_ONLY)}


def policy_named(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}") from None
