"""FlashInfer paged attention over the HND pool (issue 12; the paper's GPU engine, §5).

FlashInfer plans a batch once and then runs every layer on that plan: ``FlashInferAttention``
plans when it first sees a step's ``ForwardBatch`` (decode rows with
``BatchDecodeWithPagedKVCacheWrapper``, anything with a prompt chunk with the causal
``BatchPrefillWithPagedKVCacheWrapper``) from the batch's host-side block lists, so planning
never waits on the device, and reuses the plan for the step's other layers. The page table
is FlashInfer's CSR form, built here (``paged_csr``) and tested without a GPU.

Only CUDA runs it. A GPU worker on this backend checks it against the torch reference at
start (``model/attention_check.py``) and falls back to the reference if it disagrees.
"""

from __future__ import annotations

import torch

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended float workspace


def paged_csr(block_ids: list[list[int]], seq_lens: list[int], block_size: int
              ) -> tuple[list[int], list[int], list[int]]:
    """FlashInfer's page table for sequences of ``seq_lens`` tokens in ``block_ids``:
    (indptr [B+1], indices [sum of pages], last_page_len [B], each in 1..block_size)."""
    if len(block_ids) != len(seq_lens):
        raise ValueError(f"{len(block_ids)} block lists for {len(seq_lens)} sequences")
    indptr, indices, last = [0], [], []
    for blocks, n in zip(block_ids, seq_lens):
        pages = -(-n // block_size)
        if n < 1 or pages > len(blocks):
            raise ValueError(f"a sequence of {n} tokens needs {pages} blocks, has "
                             f"{len(blocks)}")
        indices.extend(blocks[:pages])
        indptr.append(len(indices))
        last.append(n - (pages - 1) * block_size)
    return indptr, indices, last


def query_indptr(query_lens: list[int]) -> list[int]:
    out = [0]
    for n in query_lens:
        out.append(out[-1] + n)
    return out


class FlashInferAttention:
    """One workspace and one decode and one prefill wrapper for a device; ``__call__``
    attends layer i's queries of ``batch`` (planning on the batch's first layer)."""

    wants_batch = True  # StagedModel passes the ForwardBatch (its host-side block lists)

    def __init__(self, device: torch.device, num_qo_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int):
        import flashinfer

        self.device = device
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.block_size = block_size
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND")
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND")
        self._planned = None  # the batch the current plan is for
        self.plans = 0

    def _tensor(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int32).pin_memory().to(self.device,
                                                                    non_blocking=True)

    def _plan(self, batch, q_dtype: torch.dtype, kv_dtype: torch.dtype, scale: float) -> None:
        if batch.block_ids_list is None:
            raise ValueError("FlashInfer needs the batch's host-side block lists")
        indptr, indices, last = paged_csr(batch.block_ids_list, batch.seq_lens_list,
                                          self.block_size)
        hq, hkv, d = self.heads
        args = (self._tensor(indptr), self._tensor(indices), self._tensor(last))
        if batch.is_decode:
            self.decode.plan(*args, hq, hkv, d, self.block_size, pos_encoding_mode="NONE",
                             q_data_type=q_dtype, kv_data_type=kv_dtype, sm_scale=scale)
        else:
            self.prefill.plan(self._tensor(query_indptr(batch.query_lens_list)), *args,
                              hq, hkv, d, self.block_size, causal=True, sm_scale=scale,
                              q_data_type=q_dtype, kv_data_type=kv_dtype)
        self._planned = batch
        self.plans += 1

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch,
                 scale: float) -> torch.Tensor:
        """q [T, Hq, D] -> [T, Hq, D]."""
        if batch is not self._planned:
            self._plan(batch, q.dtype, k_cache.dtype, scale)
        wrapper = self.decode if batch.is_decode else self.prefill
        return wrapper.run(q.contiguous(), (k_cache, v_cache))
