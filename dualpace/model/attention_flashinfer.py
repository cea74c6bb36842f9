"""FlashInfer paged attention over the HND pool (issue 12; the paper's GPU engine, §5).

FlashInfer plans a batch once and then runs every layer on that plan: ``FlashInferAttention``
plans when it first sees a step's ``ForwardBatch`` (decode rows with
``BatchDecodeWithPagedKVCacheWrapper``, anything with a prompt chunk with the causal
``BatchPrefillWithPagedKVCacheWrapper``) from the batch's host-side block lists, and reuses
the plan for the step's other layers. The page table is FlashInfer's CSR form, built here
(``paged_csr``) and tested without a GPU.

Planning never waits on the device: ``plan()`` reads the indptr and last-page lengths on the
host (FlashInfer copies a device tensor back with ``.to("cpu")``, a sync per step), so those
go in as pinned host tensors; the page indices go to the device with a non-blocking copy
(in CUDA-graph mode FlashInfer copies host indices with a blocking ``copy_``).

CUDA graphs (``runtime/decode_graphs.py``): a captured decode kernel reads its page table
from fixed addresses, so each batch-size bucket gets its own decode wrapper built with
``use_cuda_graph=True`` over static indptr / indices / last-page buffers
(``graph_wrapper``); ``plan_graph`` re-plans it before every replay, outside the graph,
which writes the padded batch's CSR into those buffers (vLLM's and SGLang's scheme).

Only CUDA runs the real library. A GPU worker on this backend checks it against the torch
reference at start (``model/attention_check.py``) and falls back to Triton, then the
reference, if it disagrees. The tests run this module on CPU against a stand-in of the
wrappers' API (tests/model/fake_flashinfer.py) that attends from the CSR it is given.
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


def uses_tensor_cores(num_qo_heads: int, num_kv_heads: int) -> bool:
    """FlashInfer's tensor-core decode for GQA groups of 4 or more (vLLM's rule: the CUDA-core
    kernel is faster for small groups, the prefill-style kernel for large ones)."""
    return num_qo_heads // num_kv_heads >= 4


class FlashInferAttention:
    """One workspace, one decode and one prefill wrapper for a device (and one decode wrapper
    per CUDA-graph bucket); ``__call__`` attends layer i's queries of ``batch``, planning on
    the batch's first layer."""

    wants_batch = True  # StagedModel passes the ForwardBatch (its host-side block lists)

    def __init__(self, device: torch.device, num_qo_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int):
        import flashinfer

        self._fi = flashinfer
        self.device = device
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.block_size = block_size
        self.tensor_cores = uses_tensor_cores(num_qo_heads, num_kv_heads)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "HND", use_tensor_cores=self.tensor_cores)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "HND")
        self.graph_wrappers: dict[int, object] = {}  # bucket rows -> its graph wrapper
        self._planned = None  # the batch the current plan is for
        self._wrapper = None  # and the wrapper planned for it
        self.plans = 0

    def _host(self, xs: list[int]) -> torch.Tensor:
        t = torch.tensor(xs, dtype=torch.int32)
        return t.pin_memory() if self.device.type == "cuda" else t

    def _on_device(self, xs: list[int]) -> torch.Tensor:
        return self._host(xs).to(self.device, non_blocking=True)

    def _page_table(self, block_ids: list[list[int]], seq_lens: list[int]) -> tuple:
        """``paged_csr`` as plan() takes it: host indptr, device indices, host last pages."""
        indptr, indices, last = paged_csr(block_ids, seq_lens, self.block_size)
        return self._host(indptr), self._on_device(indices), self._host(last)

    def _plan_decode(self, wrapper, block_ids: list[list[int]], seq_lens: list[int],
                     q_dtype: torch.dtype, kv_dtype: torch.dtype, scale: float) -> None:
        wrapper.plan(*self._page_table(block_ids, seq_lens), *self.heads, self.block_size,
                     pos_encoding_mode="NONE", q_data_type=q_dtype, kv_data_type=kv_dtype,
                     sm_scale=scale)
        self.plans += 1

    def _plan(self, batch, q_dtype: torch.dtype, kv_dtype: torch.dtype, scale: float) -> None:
        if batch.block_ids_list is None:
            raise ValueError("FlashInfer needs the batch's host-side block lists")
        if batch.is_decode:
            self._plan_decode(self.decode, batch.block_ids_list, batch.seq_lens_list,
                              q_dtype, kv_dtype, scale)
            self._wrapper = self.decode
        else:
            self.prefill.plan(self._host(query_indptr(batch.query_lens_list)),
                              *self._page_table(batch.block_ids_list, batch.seq_lens_list),
                              *self.heads, self.block_size, causal=True, sm_scale=scale,
                              q_data_type=q_dtype, kv_data_type=kv_dtype)
            self.plans += 1
            self._wrapper = self.prefill
        self._planned = batch

    def graph_wrapper(self, rows: int, max_pages: int):
        """The decode wrapper of a CUDA-graph bucket of ``rows`` rows whose page tables hold
        at most ``max_pages`` pages in all: its page table lives in buffers of its own."""
        if rows not in self.graph_wrappers:
            def buf(n: int) -> torch.Tensor:
                # Not an inference tensor (capture runs in inference mode): every plan
                # writes into it, inside inference mode or not.
                with torch.inference_mode(False):
                    return torch.zeros(n, dtype=torch.int32, device=self.device)

            self.graph_wrappers[rows] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "HND", use_cuda_graph=True,
                use_tensor_cores=self.tensor_cores,
                paged_kv_indptr_buffer=buf(rows + 1), paged_kv_indices_buffer=buf(max_pages),
                paged_kv_last_page_len_buffer=buf(rows))
        return self.graph_wrappers[rows]

    def plan_graph(self, rows: int, batch, block_ids: list[list[int]],
                   seq_lens: list[int], q_dtype: torch.dtype, kv_dtype: torch.dtype,
                   scale: float) -> None:
        """Plan bucket ``rows``'s graph wrapper for the padded decode batch ``batch`` (the
        static view its graph captured, whose rows are ``block_ids`` / ``seq_lens`` on the
        host): before its capture and before every replay, never inside the graph."""
        if len(block_ids) != rows:
            raise ValueError(f"a graph bucket of {rows} rows planned with {len(block_ids)}")
        wrapper = self.graph_wrappers.get(rows)
        if wrapper is None:
            raise ValueError(f"no graph wrapper for {rows} rows (graph_wrapper first)")
        self._plan_decode(wrapper, block_ids, seq_lens, q_dtype, kv_dtype, scale)
        self._planned, self._wrapper = batch, wrapper

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch,
                 scale: float) -> torch.Tensor:
        """q [T, Hq, D] -> [T, Hq, D]."""
        if batch is not self._planned:
            self._plan(batch, q.dtype, k_cache.dtype, scale)
        return self._wrapper.run(q.contiguous(), (k_cache, v_cache))
