"""Batched sampling with per-row parameters (post-layer "Sampling", paper Fig. 2).

Random rows draw their noise from a counter-based generator keyed by (request seed, output
index): SplitMix64 evaluated at the vocabulary index, in integer tensor ops that give the same
bits on the CPU and on CUDA. A token therefore depends only on its request's seed and its
logits: the same seed gives the same noise whatever else shares the batch and whichever tier
(GPU or CPU) ran the step. (torch's generators differ per device: a CUDA Generator with the
same seed draws other numbers than the CPU one.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dualpace.kernels import cpu as cpu_kernels
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


def _i64(x: int) -> int:
    """A 64-bit pattern as the int64 that holds it."""
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA, _M1, _M2 = (_i64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                      0x94D049BB133111EB))
_NOISE_CHUNK = 1 << 22  # elements per pass: bounds the int64 temporaries on a large vocab


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def uniform_draws(keys: list[int], vocab: int, device) -> torch.Tensor:
    """[len(keys), vocab] float64 u in (0, 1): element (r, v) is the top 53 bits of
    SplitMix64's (v+1)-th output from state ``keys[r]`` (mix(key + (v+1)·γ)), plus half an
    ulp. Integer ops wrap mod 2^64 on every device and the conversion is exact, so these are
    the same bits on CPU and CUDA (checked on an H200: tests/cuda)."""
    out = torch.empty((len(keys), vocab), dtype=torch.float64, device=device)
    rows = max(1, _NOISE_CHUNK // max(vocab, 1))
    counter = (torch.arange(vocab, dtype=torch.int64, device=device) + 1) * _GAMMA
    for r0 in range(0, len(keys), rows):
        k = torch.tensor([_i64(x) for x in keys[r0:r0 + rows]], dtype=torch.int64,
                         device=device)
        z = k[:, None] + counter[None, :]
        z = (z ^ _lsr(z, 30)) * _M1
        z = (z ^ _lsr(z, 27)) * _M2
        z = z ^ _lsr(z, 31)
        out[r0:r0 + rows] = (_lsr(z, 11).to(torch.float64) + 0.5) * 2.0 ** -53
    return out


def exponential_noise(keys: list[int], vocab: int, device) -> torch.Tensor:
    """[len(keys), vocab] float64 Exp(1) draws -log(u), u from ``uniform_draws``. The u are
    the same bits on every device; the log is each device's own float64 log (CUDA's, torch's
    CPU one, glibc's in the C race), which the first H200 run showed differ in the last bit
    for some elements. So a seed picks the same token on either tier unless two candidates'
    ratios p / E lie within an ulp or two of each other, which sampled logits practically
    never produce (tests/cuda checks the tokens on both devices)."""
    return -torch.log(uniform_draws(keys, vocab, device))


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


_CANDIDATES = 1024  # best tokens a row's top-p nucleus is looked for among before a full sort


def _filter_by_sort(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Mask logits outside each row's top-k, then outside its top-p nucleus (vLLM's order),
    over the whole sorted vocabulary: the definition, and the fallback of
    ``_filter_top_k_top_p`` for a nucleus wider than its candidates."""
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


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """``_filter_by_sort`` without sorting the vocabulary: the best ``_CANDIDATES`` tokens
    (or the largest top-k) come from ``topk``, each row's softmax denominator from the whole
    row, and a row is finished among its candidates when its top-k lies inside them or its
    candidates already hold top_p of the mass (every later token then has at least that much
    before it and is cut). Only the other rows, flat distributions, are sorted whole (those
    that cannot close among the candidates at once); rows that asked for neither filter are
    left as they are. A full sort of a 32k vocabulary
    cost ~2 ms a row on CPU, more than a small model's decode step, for any request with
    top-k or top-p; ``topk`` of 1024 costs 0.2-0.5 ms. The kept set is the sorted
    definition's, up to the rounding of the denominator's summation order (a token whose
    mass-before lies within an ulp or so of top_p)."""
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    nucleus = bool((top_p < 1.0).any())
    m = min(vocab, max(int(torch.where(top_k > 0, k, 0).max()), _CANDIDATES if nucleus else 1))
    inside = k <= m  # the row's top-k cut lies among the candidates
    lse = logits.logsumexp(dim=-1)
    # Rows that asked for neither filter pass through whole (the sorted definition could cut
    # a tail whose cumulative sum rounds to 1 before the last token). A row cut beyond the
    # candidates whose best token holds less than top_p / m of the mass cannot close its
    # nucleus among them (a flat distribution): it is sorted whole, without the topk.
    plain = (top_k <= 0) & (top_p >= 1.0)
    flat = ~plain & ~inside & ((logits.amax(dim=-1) - lse).exp() * m < top_p)
    out = logits.clone()
    rows = ~plain & ~flat
    if bool(rows.any()):
        sub, kr, tp, ins = logits[rows], k[rows], top_p[rows], inside[rows]
        vals, idx = sub.topk(m, dim=-1)
        ranks = torch.arange(m, device=logits.device)[None, :]
        vals = vals.masked_fill(ranks >= kr[:, None], float("-inf"))
        # the top-k-masked row's softmax denominator: its candidates alone when the cut is
        # among them, else the whole row
        denom = torch.where(ins, vals.logsumexp(dim=-1), lse[rows])
        probs = (vals - denom[:, None]).exp()
        mass = probs.cumsum(dim=-1)
        vals = vals.masked_fill(mass - probs >= tp[:, None], float("-inf"))
        done = torch.full_like(sub, float("-inf")).scatter(-1, idx, vals)
        wide = ~(ins | (mass[:, -1] >= tp))
        if bool(wide.any()):
            done[wide] = _filter_by_sort(sub[wide], top_k[rows][wide], tp[wide])
        out[rows] = done
    if bool(flat.any()):
        out[flat] = _filter_by_sort(logits[flat], top_k[flat], top_p[flat])
    return out


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
    """logits [B, V] (fp32) -> one token id per row."""
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(rows)} sampling rows")
    logits = apply_penalties(logits, rows)
    out = greedy_tokens(logits)
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
        keys = [step_seed(rows[i].seed, rows[i].step) for i in rand]
        out[idx] = exponential_race(probs, keys)
    return out.tolist()


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)``: on CPU one C pass a row (cext/argmax.c, the same first
    index of the maximum or of the first NaN; torch's took 0.79 ms for 32 rows of a 32k
    vocabulary, 8% of such a bf16 decode step), elsewhere torch's."""
    if (logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2
            and logits.is_contiguous() and logits.numel() and logits.shape[1] < 1 << 31
            and cpu_kernels.available()):
        return cpu_kernels.argmax_rows(logits)
    return logits.argmax(dim=-1)


def exponential_race(probs: torch.Tensor, keys: list[int]) -> torch.Tensor:
    """The token each row's race picks: ``(probs.double() / noise).argmax(-1)`` with the
    noise of ``exponential_noise``. On CPU the C kernel computes exactly that without the
    noise tensor (kernels/cpu.py; ~15 full-vocabulary tensor passes cost as much as a
    small model's decode step); elsewhere, and without the C kernels, the tensor ops."""
    if probs.device.type == "cpu" and cpu_kernels.available():
        return cpu_kernels.exponential_race(probs.float().contiguous(), keys)
    noise = exponential_noise(keys, probs.shape[-1], probs.device)
    return (probs.double() / noise).argmax(dim=-1)


def plain_greedy(rows: list[SamplingRow]) -> bool:
    """Whether ``sample`` takes every row's argmax of the logits as they are (temperature
    0, no penalties): then a caller may hand ``sample_with_logprobs`` those argmaxes."""
    return all(r.temperature <= 0.0 and r.penalties is None for r in rows)


def sample_with_logprobs(logits: torch.Tensor, rows: list[SamplingRow],
                         greedy: list[int] | None = None
                         ) -> tuple[list[int], list[TokenLogprobs | None]]:
    """``sample`` plus each row's logprobs where it asked for them (from the same logits).
    ``greedy``: each row's argmax of ``logits``, computed already (the one-call decode step,
    NativeStages.decode_logits), taken as the tokens where ``plain_greedy(rows)``."""
    if greedy is not None and len(greedy) == len(rows) and plain_greedy(rows):
        tokens = greedy
    else:
        tokens = sample(logits, rows)
    return tokens, token_logprobs(logits, tokens, [r.logprobs for r in rows])
