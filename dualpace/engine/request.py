"""Engine-side request state (torch-free: the schedulers are tested with fake workers).

Ownership (paper §4.1): every live request is owned by exactly one engine. It changes only
through a committed migration (swap-out, swap-in, Prefill-to-CPU), and the destination does
not run the request before the transfer completed (``ready``).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from dualpace.kv.block_pool import blocks_for_tokens
from dualpace.sampling.params import SamplingParams


class Owner(enum.Enum):
    GPU = "gpu"
    CPU = "cpu"


class Phase(enum.Enum):
    WAITING = "waiting"  # GPU waiting queue: prompt not (fully) computed
    PREFILL = "prefill"  # GPU-owned, chunked prefill in progress
    DECODE = "decode"  # decoding on its owner engine
    FINISHED = "finished"


@dataclass(eq=False)
class EngineRequest:
    rid: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    block_size: int
    arrival: float = field(default_factory=time.monotonic)
    out: list[int] = field(default_factory=list)
    owner: Owner = Owner.GPU
    phase: Phase = Phase.WAITING
    ready: bool = True  # False while a transfer into its owner's pool is in flight
    blocks: list[int] = field(default_factory=list)  # in its owner's pool
    pending_free: list[int] = field(default_factory=list)  # source blocks of a move in flight
    in_flight: str | None = None  # "gpu" / "cpu" while a submitted step involves it
    abort_requested: str | None = None  # finish reason to apply once no step involves it
    computed: int = 0  # tokens whose KV is materialised in ``blocks``
    swap_in_mark: bool = False  # deferred swap-in (A.1 step 6)
    finish_reason: str | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    preemptions: int = 0
    prompt_lps: list = field(default_factory=list)  # prompt logprobs so far (a worker's)
    # Parallel sampling (n > 1): the group's first request carries its siblings in
    # ``forks`` until its prefill has run; a sibling ``awaiting_fork`` holds blocks in the
    # same pool but runs nothing until that prefill copies the prompt's KV into them.
    forks: list[EngineRequest] = field(default_factory=list)
    awaiting_fork: bool = False

    @property
    def prompt_logprobs_done(self) -> bool:
        """Every prompt token after the first has its logprob (a recomputed prefill does not
        ask again)."""
        return len(self.prompt_lps) >= len(self.prompt) - 1

    def group(self) -> list[EngineRequest]:
        """This request and the live siblings that take its prompt's KV (admitted together:
        one prefill, its KV copied into each sibling's blocks)."""
        return [self, *(s for s in self.forks if not s.finished)]

    # --- sizes ----------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.out)

    @property
    def peak_blocks(self) -> int:
        """Finish-peak footprint b̂_r: blocks for prompt + max_tokens (§4.1)."""
        return blocks_for_tokens(len(self.prompt) + self.max_tokens, self.block_size)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def blocks_for_next(self) -> int:
        """Blocks to append so the next decode token's KV fits."""
        return max(0, blocks_for_tokens(self.num_tokens, self.block_size) - len(self.blocks))

    def growth_blocks(self) -> int:
        """max(b̂_r - b_r, 0) of Eq. 3."""
        return max(self.peak_blocks - len(self.blocks), 0)

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    def reset_for_recompute(self) -> None:
        """Recompute preemption (vLLM's): the KV is dropped (the caller frees ``blocks``) and
        the request re-enters the GPU waiting queue as a prompt of prompt + outputs so far.
        A deferred swap-in mark is void (the workers' tables start over at the prefill from
        position 0: runtime/translator.py)."""
        self.blocks, self.computed, self.phase = [], 0, Phase.WAITING
        self.owner, self.ready, self.swap_in_mark = Owner.GPU, True, False
        if not self.prompt_logprobs_done:  # the new prefill computes them from the start
            self.prompt_lps = []
        self.preemptions += 1
