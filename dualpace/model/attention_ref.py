"""Torch reference attention over the paged HND KV cache.

Correctness oracle and portable fallback: ragged causal attention for prefill chunks (with any
already-cached context) and padded-gather paged decode. The CPU decode hot path uses the cext
kernel instead (dualpace.kernels.cpu); GPU builds use FlashInfer where present.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """[num_blocks, Hkv, bs, D] + block ids -> [Hkv, length, D] of one sequence."""
    blocks = cache[block_ids]  # [nb, Hkv, bs, D]
    hkv, d = blocks.shape[1], blocks.shape[3]
    return blocks.permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :length]


def ragged_paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_lens: list[int],
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sequence's new rows over its whole cached context."""
    out = torch.empty_like(q)
    bs = k_cache.shape[2]
    row = 0
    for i, (ql, sl) in enumerate(zip(query_lens, seq_lens)):
        nb = -(-sl // bs)
        k = gather_kv(k_cache, block_tables[i, :nb], sl)
        v = gather_kv(v_cache, block_tables[i, :nb], sl)
        qi = q[row : row + ql].transpose(0, 1)  # [Hq, ql, D]
        ctx = sl - ql
        if ql == 1:
            mask = None
        else:
            qpos = torch.arange(ctx, sl, device=q.device)[:, None]
            kpos = torch.arange(sl, device=q.device)[None, :]
            mask = kpos <= qpos
        o = F.scaled_dot_product_attention(
            qi.unsqueeze(0), k.unsqueeze(0).to(q.dtype), v.unsqueeze(0).to(q.dtype),
            attn_mask=mask, scale=scale,
            enable_gqa=True,
        )
        out[row : row + ql] = o[0].transpose(0, 1)
        row += ql
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:
    """One query row per sequence; gathers every sequence's KV padded to the longest."""
    B, _, D = q.shape
    _, Hkv, bs, _ = k_cache.shape
    max_len = int(seq_lens.max())
    nb = -(-max_len // bs)
    tables = block_tables[:, :nb].long()
    k = k_cache[tables].permute(0, 2, 1, 3, 4).reshape(B, Hkv, nb * bs, D)[:, :, :max_len]
    v = v_cache[tables].permute(0, 2, 1, 3, 4).reshape(B, Hkv, nb * bs, D)[:, :, :max_len]
    mask = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2), k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None, None, :],
        scale=scale, enable_gqa=True,
    )
    return o.squeeze(2)
