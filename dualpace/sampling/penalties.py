"""Penalties, logit bias and min_tokens, applied per row in the batched sampler on either
tier (and on the GPU side of a Dense Assist call, which gets them through the assist buffer).

vLLM's order and definitions, on the raw logits of a row:
  1. min_tokens: while fewer than ``min_tokens`` outputs exist, the stop tokens (EOS and
     ``stop_token_ids``) get -inf;
  2. logit_bias: ``logits[t] += bias[t]``;
  3. repetition_penalty r, over every token in the prompt or the outputs so far:
     ``logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r``;
  4. frequency f and presence p, over the outputs: ``logits[t] -= f * count[t] + p * (count[t]
     > 0)``.
Logprobs stay those of the raw logits (sampling/logprobs.py), as vLLM reports by default.
"""

from __future__ import annotations

import msgspec
import torch


class Penalties(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A request's penalties as its worker holds them (``prompt`` only when r != 1)."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    min_tokens: int = 0
    stop_ids: tuple[int, ...] = ()  # masked while fewer than min_tokens outputs exist
    bias: tuple[tuple[int, float], ...] = ()
    prompt: tuple[int, ...] = ()


def apply_penalties(logits: torch.Tensor, rows) -> torch.Tensor:
    """A copy of ``logits`` [B, V] with each row's penalties applied (rows without any are
    untouched). ``rows[i].penalties`` (Penalties or None) and ``rows[i].outputs`` (the
    request's output ids so far)."""
    if all(r.penalties is None for r in rows):
        return logits
    out = logits.float().clone()
    dev = out.device
    for i, r in enumerate(rows):
        p = r.penalties
        if p is None:
            continue
        x = out[i]
        if len(r.outputs) < p.min_tokens and p.stop_ids:
            x[torch.tensor(p.stop_ids, device=dev)] = float("-inf")
        if p.bias:
            ids = torch.tensor([t for t, _ in p.bias], device=dev)
            x.index_add_(0, ids, torch.tensor([b for _, b in p.bias], device=dev))
        if p.repetition != 1.0:
            seen = torch.tensor(sorted(set(p.prompt) | set(r.outputs)), device=dev,
                                dtype=torch.long)
            if seen.numel():
                v = x[seen]
                x[seen] = torch.where(v > 0, v / p.repetition, v * p.repetition)
        if (p.frequency or p.presence) and r.outputs:
            ids, counts = torch.tensor(r.outputs, device=dev).unique(return_counts=True)
            x[ids] -= p.frequency * counts.float() + p.presence
    return out
