"""What a step costs depends on: the features of one batch descriptor, as the cost models see
them. Computed from the wire descriptors (runtime/protocol.py), so the real engine's step
log (``serve --step-log``) and the simulated workers describe a step the same way."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dualpace.runtime import protocol as P
from dualpace.runtime.routing import route_for


@dataclass(frozen=True)
class GpuStepWork:
    """One GPU-main step: rows that run the forward, the KV they attend to, and the KV that
    crosses the host link (migrations, Prefill-to-CPU) or is copied within HBM (forks)."""

    prefill_tokens: int = 0  # prompt tokens computed this step (chunks and Prefill-to-CPU)
    decode_rows: int = 0
    context: int = 0  # KV positions attended, summed over rows (decode: start + 1)
    prefill_context: int = 0  # sum over prefill rows of tokens x (start + tokens / 2)
    link_tokens: int = 0  # KV tokens moved over the host link (swap-out + swap-in + P2C)
    carried_rows: int = 0  # gated: CPU-resident rows whose dense stages this step runs

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_rows + self.carried_rows

    @property
    def prefill_step(self) -> int:
        """1 when the step computes prompt tokens: such steps pay a fixed cost of their own
        (larger activations, the prompt's attention set-up) that decode-only steps do not."""
        return int(self.prefill_tokens > 0)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CpuStepWork:
    """One CPU-worker step: a decode batch over host KV and its post-attention route."""

    batch: int
    context: int  # KV positions attended, summed over the batch
    route: str

    def as_dict(self) -> dict:
        return asdict(self)


def gpu_step_work(batch: P.GpuBatch, carried_rows: int = 0) -> GpuStepWork:
    """A one-token row counts as a decode (a one-token prefill chunk costs the same)."""
    prefill = decode = context = pctx = link = 0
    for s in batch.seqs:
        n = len(s.token_ids)
        context += s.start_pos + n
        if n == 1 and not s.host_blocks:
            decode += 1
            continue
        prefill += n
        pctx += n * (s.start_pos + n // 2)
        if s.host_blocks:  # Prefill-to-CPU: the prompt and its (forked) host copies
            link += n * (1 + len(s.forks))
    link += sum(m.num_tokens for m in (*batch.swap_out, *batch.swap_in))
    return GpuStepWork(prefill, decode, context, pctx, link, carried_rows)


def cpu_route(batch: P.CpuBatch, thresholds: tuple[int, int]) -> str:
    """The batch's forced route (the gated pipeline) or the CPU worker's own choice by batch
    size (runtime/routing.route_for with the configured (P, F))."""
    return batch.route or route_for(len(batch.seqs), *thresholds)


def cpu_step_work(batch: P.CpuBatch, route: str) -> CpuStepWork:
    return CpuStepWork(len(batch.seqs), sum(s.start_pos + 1 for s in batch.seqs), route)
