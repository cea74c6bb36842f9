"""A CPU stand-in for the part of FlashInfer's API that model/attention_flashinfer.py uses:
``BatchDecodeWithPagedKVCacheWrapper`` (eager and ``use_cuda_graph`` mode) and the causal
``BatchPrefillWithPagedKVCacheWrapper`` over an HND pool, with FlashInfer's signatures and
its rules (from flashinfer/decode.py and prefill.py): ``plan`` takes the CSR page table
(int32 indptr / indices / last-page lengths), a graph-mode wrapper has a batch size fixed by
its buffers and copies each plan into them, ``run`` attends from what was planned.

It attends from the CSR alone, never from our block tables, so a wrong page table gives
wrong outputs here as it would on a GPU; and a graph-mode wrapper reads its buffers at
``run``, so a replay that was not re-planned reads the previous batch's pages.
"""

from __future__ import annotations

import types

import torch


def _ints(t: torch.Tensor, what: str) -> list[int]:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
        raise TypeError(f"{what}: expected a 1-D int32 tensor, got {t!r}")
    return t.tolist()


def _check_cache(paged_kv_cache, hkv: int, page_size: int, d: int, dtype) -> tuple:
    k, v = paged_kv_cache
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or tuple(t.shape[1:]) != (hkv, page_size, d):  # HND
            raise ValueError(f"{name} cache {tuple(t.shape)} is not HND [pages, {hkv}, "
                             f"{page_size}, {d}]")
        if t.dtype != dtype:
            raise ValueError(f"{name} cache is {t.dtype}, planned kv_data_type {dtype}")
    return k, v


def _attend(q, k, v, pages: list[int], kv_len: int, causal_rows: int | None, scale: float):
    """q [R, Hq, D] over one sequence's first kv_len tokens in ``pages``; causal_rows: the
    rows are the sequence's last R tokens (bottom-right causal), None: every row sees all."""
    hq, hkv = q.shape[1], k.shape[1]
    keys = k[pages].permute(1, 0, 2, 3).reshape(hkv, -1, k.shape[-1])[:, :kv_len].float()
    vals = v[pages].permute(1, 0, 2, 3).reshape(hkv, -1, v.shape[-1])[:, :kv_len].float()
    keys = keys.repeat_interleave(hq // hkv, 0)
    vals = vals.repeat_interleave(hq // hkv, 0)
    s = torch.einsum("rhd,htd->hrt", q.float(), keys) * scale
    if causal_rows is not None:
        r = torch.arange(q.shape[0])[:, None] + (kv_len - q.shape[0])
        s = s.masked_fill(torch.arange(kv_len)[None, :] > r, float("-inf"))
    return torch.einsum("hrt,htd->rhd", s.softmax(-1), vals).to(q.dtype)


class _Plan:
    def __init__(self, indptr, indices, last, hq, hkv, d, page_size, q_dtype, kv_dtype, scale):
        if hq % hkv:
            raise ValueError(f"num_qo_heads {hq} is not a multiple of num_kv_heads {hkv}")
        if len(indptr) != len(last) + 1 or indptr[0] != 0 or indptr[-1] > len(indices):
            raise ValueError(f"indptr {indptr} does not fit {len(indices)} indices")
        if any(not 1 <= n <= page_size for n in last):
            raise ValueError(f"last_page_len {last} outside 1..{page_size}")
        self.indptr, self.indices, self.last = indptr, indices, last
        self.heads, self.page_size = (hq, hkv, d), page_size
        self.q_dtype, self.kv_dtype = q_dtype, kv_dtype or q_dtype
        self.scale = scale if scale is not None else d ** -0.5

    def kv(self, b: int) -> tuple[list[int], int]:
        pages = self.indices[self.indptr[b]:self.indptr[b + 1]]
        return pages, (len(pages) - 1) * self.page_size + self.last[b]


class BatchDecodeWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        if kv_layout != "HND":
            raise ValueError(f"this stand-in holds HND pools only, got {kv_layout}")
        self.use_tensor_cores = use_tensor_cores
        self.is_cuda_graph_enabled = use_cuda_graph
        if use_cuda_graph:
            bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer,
                    paged_kv_last_page_len_buffer)
            if any(b is None for b in bufs):
                raise ValueError("cuda graph mode needs the indptr, indices and "
                                 "last_page_len buffers")
            self._indptr_buf, self._indices_buf, self._last_buf = bufs
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
        self._plan = None
        self.plans = 0

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, sm_scale=None, non_blocking=True,
             **unused):
        if pos_encoding_mode != "NONE":
            raise ValueError("the stand-in applies no position encoding")
        ip, idx, last = (_ints(indptr, "indptr"), _ints(indices, "indices"),
                         _ints(last_page_len, "last_page_len"))
        if self.is_cuda_graph_enabled:
            if len(last) != self._fixed_batch_size:
                raise ValueError(f"The batch size should be fixed in cudagraph mode, the "
                                 f"runtime batch size {len(last)} mismatches the batch size "
                                 f"set during initialization {self._fixed_batch_size}")
            if len(idx) > len(self._indices_buf):
                raise ValueError("The size of indices should be less than or equal to the "
                                 "allocated buffer")
            self._indptr_buf.copy_(indptr)
            self._last_buf.copy_(last_page_len)
            self._indices_buf[:len(idx)].copy_(indices)
        self._plan = _Plan(ip, idx, last, num_qo_heads, num_kv_heads, head_dim, page_size,
                           q_data_type, kv_data_type, sm_scale)
        self.plans += 1

    def run(self, q, paged_kv_cache, *args, **kwargs):
        p = self._plan
        if p is None:
            raise RuntimeError("run() before plan()")
        if self.is_cuda_graph_enabled:  # a captured kernel reads the buffers, not the plan
            ip = self._indptr_buf.tolist()
            p = _Plan(ip, self._indices_buf[:ip[-1]].tolist(), self._last_buf.tolist(),
                      *p.heads, p.page_size, p.q_dtype, p.kv_dtype, p.scale)
        hq, hkv, d = p.heads
        if q.dtype != p.q_dtype or tuple(q.shape) != (len(p.last), hq, d):
            raise ValueError(f"q {tuple(q.shape)} {q.dtype} for a plan of "
                             f"{len(p.last)} x {hq} x {d} {p.q_dtype}")
        k, v = _check_cache(paged_kv_cache, hkv, p.page_size, d, p.kv_dtype)
        out = [_attend(q[b:b + 1], k, v, *p.kv(b), None, p.scale) for b in range(len(p.last))]
        return torch.cat(out)


class BatchPrefillWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 **unused):
        if kv_layout != "HND":
            raise ValueError(f"this stand-in holds HND pools only, got {kv_layout}")
        if use_cuda_graph:
            raise ValueError("the stand-in's prefill has no cuda graph mode")
        self._plan = None
        self.plans = 0

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             **unused):
        self._qo = _ints(qo_indptr, "qo_indptr")
        self._causal = causal
        self._plan = _Plan(_ints(paged_kv_indptr, "paged_kv_indptr"),
                           _ints(paged_kv_indices, "paged_kv_indices"),
                           _ints(paged_kv_last_page_len, "paged_kv_last_page_len"),
                           num_qo_heads, num_kv_heads, head_dim_qk, page_size, q_data_type,
                           kv_data_type, sm_scale)
        if len(self._qo) != len(self._plan.indptr):
            raise ValueError("qo_indptr and paged_kv_indptr differ in batch size")
        self.plans += 1

    def run(self, q, paged_kv_cache, *args, **kwargs):
        p = self._plan
        if p is None:
            raise RuntimeError("run() before plan()")
        hq, hkv, d = p.heads
        if q.dtype != p.q_dtype or tuple(q.shape) != (self._qo[-1], hq, d):
            raise ValueError(f"q {tuple(q.shape)} {q.dtype} for a plan of {self._qo[-1]} "
                             f"x {hq} x {d} {p.q_dtype}")
        k, v = _check_cache(paged_kv_cache, hkv, p.page_size, d, p.kv_dtype)
        out = []
        for b in range(len(p.last)):
            rows = q[self._qo[b]:self._qo[b + 1]]
            pages, n = p.kv(b)
            if rows.shape[0] > n:
                raise ValueError(f"sequence {b}: {rows.shape[0]} query rows over {n} tokens")
            out.append(_attend(rows, k, v, pages, n, rows.shape[0] if self._causal else None,
                               p.scale))
        return torch.cat(out)


def module() -> types.ModuleType:
    """A fresh ``flashinfer`` module object to put in sys.modules."""
    m = types.ModuleType("flashinfer")
    m.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    m.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    return m
