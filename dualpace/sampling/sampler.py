"""Batched sampling with per-row parameters (post-layer "Sampling", paper Fig. 2).

Random rows draw their noise from a generator seeded by (request seed, output index), so a
token depends only on its request's seed and its logits: the same seed gives the same tokens
whatever else shares the batch and whichever engine (GPU or CPU tier) ran the step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dualpace.sampling.logprobs import TokenLogprobs, token_logprobs
from dualpace.sampling.penalties import Penalties, apply_penalties

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, step: int) -> int:
    """Independent-looking 63-bit seed for output token ``step`` of a request."""
    return _splitmix64(seed ^ _splitmix64(step)) & ((1 << 63) - 1)


@dataclass(frozen=True)
class SamplingRow:
    temperature: float
    top_p: float
    top_k: int
    seed: int  # always set: the engine draws one for unseeded requests
    step: int  # index of the token being sampled among the request's outputs
    logprobs: int = -1  # k: the sampled token's logprob and the top k; -1: none
    penalties: Penalties | None = None
    outputs: tuple[int, ...] = ()  # the request's outputs so far (penalties only)


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Mask logits outside each row's top-k, then outside its top-p nucleus (vLLM's order)."""
    vocab = logits.shape[-1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    sorted_logits = sorted_logits.masked_fill(ranks >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Keep a token if the mass strictly before it is below top_p (the first is always kept).
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    """logits [B, V] (fp32) -> one token id per row."""
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sampling rows")
    logits = apply_penalties(logits, rows)
    out = logits.argmax(dim=-1)
    rand = [i for i, r in enumerate(rows) if r.temperature > 0.0]
    if rand:
        idx = torch.tensor(rand, device=logits.device)
        sub = logits[idx].float()
        temp = torch.tensor([rows[i].temperature for i in rand], device=logits.device)
        top_k = torch.tensor([rows[i].top_k for i in rand], device=logits.device)
        top_p = torch.tensor([rows[i].top_p for i in rand], device=logits.device)
        sub = sub / temp[:, None]
        if any(rows[i].top_k > 0 or rows[i].top_p < 1.0 for i in rand):
            sub = _filter_top_k_top_p(sub, top_k, top_p)
        probs = sub.softmax(dim=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) samples from p.
        noise = torch.empty_like(probs)
        gen = torch.Generator(device=logits.device)
        for j, i in enumerate(rand):
            gen.manual_seed(step_seed(rows[i].seed, rows[i].step))
            noise[j].exponential_(generator=gen)
        out[idx] = (probs / noise).argmax(dim=-1)
    return out.tolist()


def sample_with_logprobs(logits: torch.Tensor, rows: list[SamplingRow]
                         ) -> tuple[list[int], list[TokenLogprobs | None]]:
    """``sample`` plus each row's logprobs where it asked for them (from the same logits)."""
    tokens = sample(logits, rows)
    return tokens, token_logprobs(logits, tokens, [r.logprobs for r in rows])
