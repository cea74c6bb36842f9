"""Paged attention in Triton over the HND KV pool (issue 12; the paper's GPU engine, §5, runs
FlashInfer: this is the backend for a CUDA box without it, and the one CI can test).

- ``paged_decode_attention``: one query row per sequence, split-KV. A program owns one
  (sequence, KV head, split): the GQA group's query heads are one tile (padded to 16 rows so
  the QK and PV products are tensor-core dots), each key tile of the split (a block, or
  several whole blocks: at least 16 keys, tl.dot's least inner dimension) is loaded once for
  the whole group, softmax is online per tile, and each split writes its partial output
  with its log-sum-exp; a second kernel merges the splits. Splits keep the device busy when
  the batch is small and contexts long.
- ``paged_prefill_attention``: causal attention of each sequence's new rows (a prompt chunk,
  or mixed with decode rows) over its whole cached context, the rows' own KV already written
  into the pool. A program owns (sequence, query head, BLOCK_M rows) and walks the key tiles
  up to its last row's position.

Both accumulate in fp32 and accept any head dim (tiles padded to a power of two, masked).
On CPU tensors they run under Triton's interpreter (``TRITON_INTERPRET=1`` set before this
module is imported): that is how CI checks them against the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP_TILE = 16  # query heads of one KV head, padded to a tensor-core tile's rows
DOT_K_MIN = 16  # Triton's smallest inner dimension of tl.dot on NVIDIA GPUs (16-bit and fp32)


def _token_tile(block_size: int) -> int:
    """Keys per inner step: the block, or several whole blocks when a block is shorter than
    the PV product's inner dimension may be (Triton refuses K < 16 when it compiles for a
    GPU; its interpreter does not check, so CI compiles the kernels for sm_90 as well)."""
    return max(DOT_K_MIN, triton.next_power_of_2(block_size))


def _head_tile(head_dim: int) -> int:
    """The head dim padded to a power of two and to the QK product's least inner dimension."""
    return max(DOT_K_MIN, triton.next_power_of_2(head_dim))


def _precision(pool: torch.Tensor) -> str:
    """fp32 KV: exact fp32 dots (Triton's default on GPUs is TF32, which the fp32 oracle
    tests and an fp32 deployment would not expect); half types: the tensor cores' own."""
    return "ieee" if pool.dtype == torch.float32 else "tf32"


@triton.jit
def _online_softmax_step(s, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """One KV tile of the online softmax: scores s [M, BS] (masked keys at -inf) and values
    v [BS, D] folded into the running max m_i, sum l_i and output acc of M query rows. A row
    with no key yet (all -inf: a padded row) stays at zero."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION,
                                        out_dtype=tl.float32)
    return m_new, l_i, acc


@triton.jit
def _kv_offsets(table_row_ptr, pos, ok, kvh, s_kn, s_kh, s_kt, d, BS: tl.constexpr):
    """Pool offsets [TB, BD] of the tokens at positions ``pos`` of one sequence (its block
    table row at ``table_row_ptr``) for KV head ``kvh``: a tile spans TB / BS blocks when
    blocks are smaller than the 16-token tile; positions outside ``ok`` point into block 0
    (their table entries are not read, their loads are masked)."""
    blk = tl.load(table_row_ptr + pos // BS, mask=ok, other=0).to(tl.int64)
    return blk[:, None] * s_kn + kvh * s_kh + (pos % BS)[:, None] * s_kt + d[None, :]


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, seq_lens_ptr, part_out_ptr, part_lse_ptr,
    scale, max_blocks, blocks_per_split,
    s_qb, s_qh,  # q [B, Hq, D] strides (D contiguous)
    s_kn, s_kh, s_kt,  # pool [N, Hkv, bs, D] strides (D contiguous)
    s_ob, s_oh, s_os,  # partial out [B, Hq, S, D]
    s_lb, s_lh,  # partial lse [B, Hq, S]
    GROUP: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr, TB: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BS))

    g = tl.arange(0, GP)
    d = tl.arange(0, BD)
    t = tl.arange(0, TB)
    heads = kvh * GROUP + g
    g_ok = g < GROUP
    d_ok = d < D
    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, BD], tl.float32)
    end = tl.minimum(last * BS, seq_len)  # this split's tokens: [first * BS, end)
    for p0 in range(first * BS, end, TB):
        pos = p0 + t
        ok = pos < end
        off = _kv_offsets(tables_ptr + b * max_blocks, pos, ok, kvh, s_kn, s_kh, s_kt, d, BS)
        kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + off, mask=kv_mask, other=0.0)
        s = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=PRECISION,
                   out_dtype=tl.float32) * scale  # [GP, TB]
        s = tl.where(ok[None, :], s, float("-inf"))
        v = tl.load(v_ptr + off, mask=kv_mask, other=0.0)
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, PRECISION)

    has = last > first
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    tl.store(part_out_ptr + b * s_ob + heads[:, None] * s_oh + split * s_os + d[None, :], out,
             mask=g_ok[:, None] & d_ok[None, :])
    tl.store(part_lse_ptr + b * s_lb + heads * s_lh + split, lse, mask=g_ok)


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    s_ob, s_oh, s_os, s_lb, s_lh, s_yb, s_yh,
    SPLITS: tl.constexpr, SP: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SP)
    d = tl.arange(0, BD)
    sp_ok = sp < SPLITS
    lse = tl.load(part_lse_ptr + b * s_lb + h * s_lh + sp, mask=sp_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(sp_ok & (lse > float("-inf")), tl.exp(lse - m), 0.0)
    parts = tl.load(part_out_ptr + b * s_ob + h * s_oh + sp[:, None] * s_os + d[None, :],
                    mask=sp_ok[:, None] & (d < D)[None, :], other=0.0)
    out = tl.sum(parts * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + b * s_yb + h * s_yh + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def num_splits(batch: int, num_kv_heads: int, max_blocks: int, sms: int = 132) -> int:
    """Splits per (sequence, KV head): enough programs to fill ``sms`` multiprocessors twice,
    each split at least 4 blocks of KV, at most 16 splits (the merge's tile)."""
    programs = max(1, batch * num_kv_heads)
    want = max(1, -(-2 * sms // programs))
    return max(1, min(want, max_blocks // 4, 16))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float, splits: int | None = None) -> torch.Tensor:
    """q [B, Hq, D], pools [N, Hkv, bs, D], tables [B, max_blocks] int32, seq_lens [B] int32
    -> [B, Hq, D] in q's dtype (the same contract as attention_ref.paged_decode_attention_ref)."""
    B, Hq, D = q.shape
    _, Hkv, BS, _ = k_cache.shape
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads do not group over {Hkv} KV heads")
    group = Hq // Hkv
    if group > GROUP_TILE:
        raise ValueError(f"GQA group {group} exceeds the kernel's {GROUP_TILE}-row tile")
    q = q.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(device=q.device, dtype=torch.int32).contiguous()
    max_blocks = tables.shape[1]
    splits = splits or num_splits(B, Hkv, max_blocks)
    per_split = -(-max_blocks // splits)
    bd = _head_tile(D)
    part_out = torch.empty((B, Hq, splits, D), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((B, Hq, splits), dtype=torch.float32, device=q.device)
    _decode_split_kernel[(B, Hkv, splits)](
        q, k_cache, v_cache, tables, lens, part_out, part_lse,
        scale, max_blocks, per_split,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, GP=GROUP_TILE, BS=BS, TB=_token_tile(BS), D=D, BD=bd,
        PRECISION=_precision(k_cache))
    out = torch.empty_like(q)
    _decode_merge_kernel[(B, Hq)](
        part_out, part_lse, out,
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        SPLITS=splits, SP=max(2, triton.next_power_of_2(splits)), D=D, BD=bd)
    return out


@triton.jit
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, q_start_ptr, seq_lens_ptr,
    scale, max_blocks,
    s_qt, s_qh, s_kn, s_kh, s_kt, s_ot, s_oh,
    GROUP: tl.constexpr, BM: tl.constexpr, BS: tl.constexpr, TB: tl.constexpr,
    D: tl.constexpr, BD: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    q0 = tl.load(q_start_ptr + b)
    qlen = tl.load(q_start_ptr + b + 1) - q0
    if mblk * BM >= qlen:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - qlen  # tokens cached before this step's rows
    kvh = h // GROUP
    r = mblk * BM + tl.arange(0, BM)  # rows within the sequence's chunk
    r_ok = r < qlen
    d = tl.arange(0, BD)
    d_ok = d < D
    t = tl.arange(0, TB)
    q = tl.load(q_ptr + (q0 + r)[:, None] * s_qt + h * s_qh + d[None, :],
                mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    qpos = ctx + r
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    # Keys up to this tile's last row's position (causal), and never past the context.
    end = tl.minimum(ctx + (mblk + 1) * BM, seq_len)
    for p0 in range(0, end, TB):
        kpos = p0 + t
        ok = kpos < end
        off = _kv_offsets(tables_ptr + b * max_blocks, kpos, ok, kvh, s_kn, s_kh, s_kt, d, BS)
        kv_mask = ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + off, mask=kv_mask, other=0.0)
        s = tl.dot(q.to(k.dtype), tl.trans(k), input_precision=PRECISION,
                   out_dtype=tl.float32) * scale  # [BM, TB]
        s = tl.where((kpos[None, :] <= qpos[:, None]) & ok[None, :], s, float("-inf"))
        v = tl.load(v_ptr + off, mask=kv_mask, other=0.0)
        m_i, l_i, acc = _online_softmax_step(s, v, m_i, l_i, acc, PRECISION)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (q0 + r)[:, None] * s_ot + h * s_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & d_ok[None, :])


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_lens: list[int],
                            seq_lens: list[int], scale: float,
                            block_m: int = 32) -> torch.Tensor:
    """q [T, Hq, D] (the sequences' rows back to back) -> [T, Hq, D]: the same contract as
    attention_ref.ragged_paged_attention."""
    T, Hq, D = q.shape
    _, Hkv, BS, _ = k_cache.shape
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads do not group over {Hkv} KV heads")
    q = q.contiguous()
    out = torch.empty_like(q)
    B = len(query_lens)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    if starts[-1] != T:
        raise ValueError(f"query lengths sum to {starts[-1]}, q has {T} rows")
    q_start = torch.tensor(starts, dtype=torch.int32, device=q.device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=q.device)
    tables = block_tables.to(torch.int32).contiguous()
    grid = (B, Hq, triton.cdiv(max(query_lens), block_m))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, tables, q_start, lens, scale, tables.shape[1],
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        GROUP=Hq // Hkv, BM=block_m, BS=BS, TB=_token_tile(BS), D=D, BD=_head_tile(D),
        PRECISION=_precision(k_cache))
    return out

