"""Token log-probabilities of sampled tokens, and of the k most likely alternatives.

Computed from the raw logits the sampler saw, before temperature and the top-k/top-p
filters (vLLM's default ``raw_logprobs``), by whichever worker sampled the token (GPU tier,
CPU tier, or the GPU side of a Dense Assist call), so the value does not depend on the tier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dualpace.sampling.params import MAX_LOGPROBS


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float  # of the sampled token
    top_ids: tuple[int, ...]  # the k most likely tokens, most likely first
    top_logprobs: tuple[float, ...]


def token_logprobs(logits: torch.Tensor, tokens: list[int],
                   ks: list[int]) -> list[TokenLogprobs | None]:
    """logits [B, V]; ``ks[i]`` < 0: no logprobs for row i, else the sampled token's and the
    top ``ks[i]`` (at most MAX_LOGPROBS)."""
    want = [i for i, k in enumerate(ks) if k >= 0]
    out: list[TokenLogprobs | None] = [None] * len(ks)
    if not want:
        return out
    idx = torch.tensor(want, device=logits.device)
    lp = logits[idx].float().log_softmax(dim=-1)
    chosen = lp.gather(1, torch.tensor([tokens[i] for i in want],
                                       device=logits.device)[:, None])[:, 0].tolist()
    kmax = min(max(ks[i] for i in want), MAX_LOGPROBS, lp.shape[-1])
    top_v, top_i = (lp.topk(kmax, dim=-1) if kmax > 0 else (lp[:, :0], lp[:, :0].long()))
    top_v, top_i = top_v.tolist(), top_i.tolist()
    for j, i in enumerate(want):
        k = min(ks[i], kmax)
        out[i] = TokenLogprobs(chosen[j], tuple(top_i[j][:k]), tuple(top_v[j][:k]))
    return out
