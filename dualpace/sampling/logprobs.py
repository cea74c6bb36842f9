"""Token log-probabilities of sampled tokens, and of the k most likely alternatives.

Computed from the raw logits the sampler saw, before temperature and the top-k/top-p
filters (vLLM's default ``raw_logprobs``), by whichever worker sampled the token (GPU tier,
CPU tier, or the GPU side of a Dense Assist call), so the value does not depend on the tier.
"""

from __future__ import annotations

import msgspec
import torch

from dualpace.sampling.params import MAX_LOGPROBS


class TokenLogprobs(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Also the wire form (StepDone carries these as they are)."""

    logprob: float  # of the sampled (or, for prompt logprobs, the actual) token
    top_ids: tuple[int, ...]  # the k most likely tokens, most likely first
    top_logprobs: tuple[float, ...]
    rank: int = 1  # 1 + the number of tokens more likely than it


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
    chosen_t = lp.gather(1, torch.tensor([tokens[i] for i in want],
                                         device=logits.device)[:, None])
    ranks = ((lp > chosen_t).sum(dim=-1) + 1).tolist()
    chosen = chosen_t[:, 0].tolist()
    kmax = min(max(ks[i] for i in want), MAX_LOGPROBS, lp.shape[-1])
    top_v, top_i = (lp.topk(kmax, dim=-1) if kmax > 0 else (lp[:, :0], lp[:, :0].long()))
    top_v, top_i = top_v.tolist(), top_i.tolist()
    for j, i in enumerate(want):
        k = min(ks[i], kmax)
        out[i] = TokenLogprobs(chosen[j], tuple(top_i[j][:k]), tuple(top_v[j][:k]), ranks[j])
    return out


def prompt_logprobs(post_layer, hidden: torch.Tensor, targets: list[int], k: int,
                    rows_per_pass: int = 256) -> list[TokenLogprobs]:
    """Logprobs of ``targets[i]`` (the token at the position after hidden row i) from the
    logits of consecutive prefill rows; the LM head runs ``rows_per_pass`` rows at a time,
    so a long prompt never holds [prompt, vocab] logits at once."""
    out: list[TokenLogprobs] = []
    for a in range(0, len(targets), rows_per_pass):
        t = targets[a:a + rows_per_pass]
        out += token_logprobs(post_layer(hidden[a:a + len(t)]), t, [k] * len(t))
    return out
