"""Causal prefill attention over the paged HND KV pool in C (cext/prefill_attention.c).

The attention stage of a prefill chunk (paper §2.1): each sequence's new rows, whose KV the
pre-attention stage has appended, attend to the sequence's cached context and to the new
rows up to their own. Same arguments and result as the torch reference
``model.attention_ref.ragged_paged_attention``, which is the oracle of its tests and the
path where this one does not exist (the scalar ISA, a head dim that is not a multiple of
16): ``prefill_attention``, serving's, picks per call, as the ISA path may change after a
model is built (``cpu.set_default_isa``).

Only the causal half of the scores is computed: torch's CPU SDPA took the same time with a
mask as with ``is_causal`` (the full square) on our machines, 13% of a 256-token prefill.
"""

from __future__ import annotations

import math

import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.kernels._lib import require
from dualpace.model.attention_ref import ragged_paged_attention

ERRORS = {
    -3: ("seq_lens", "every length must be in [query length, max_blocks * block_size]"),
    -4: ("block_tables", "a block id in use is outside [0, num_blocks)"),
}


def has_path(isa: str | None = None) -> bool:
    """Whether the ISA path ``isa`` (default: this process's) has the C kernel: AVX2 and
    the AVX-512 paths; the scalar path takes the torch reference."""
    return cpu_kernels.available() and cpu_kernels.resolve_isa(isa) in cpu_kernels.GEMM_ISAS


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_lens: list[int], seq_lens: list[int],
                      scale: float) -> torch.Tensor:
    """Serving's prefill attention on CPU: ``paged_prefill_attention`` where this process's
    ISA path has it and the head dim suits it, else the torch reference."""
    D = q.shape[-1]
    if has_path() and D % 16 == 0 and 16 <= D <= 512:
        return paged_prefill_attention(q, k_cache, v_cache, block_tables, query_lens,
                                       seq_lens, scale)
    return ragged_paged_attention(q, k_cache, v_cache, block_tables, query_lens, seq_lens,
                                  scale)


def paged_prefill_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    query_lens: list[int],
    seq_lens: list[int],
    scale: float,
    *,
    isa: str | None = None,
) -> torch.Tensor:
    """Rows [sum(query_lens[:b]), + query_lens[b]) of q belong to sequence b, at positions
    seq_lens[b] - query_lens[b] .. seq_lens[b] - 1. k_cache, v_cache [num_blocks, Hkv,
    block_size, D] (fp32, bf16 or fp16). Returns out [T, Hq, D] in q's dtype (computed in
    fp32: a bf16 q is widened first)."""
    ffi, lib = require()
    fp = tuple(cpu_kernels.DTYPE_CODES)
    cpu_kernels._check_tensor(q, "q", 3, fp)
    cpu_kernels._check_tensor(k_cache, "k_cache", 4, fp)
    cpu_kernels._check_tensor(v_cache, "v_cache", 4, fp)
    cpu_kernels._check_tensor(block_tables, "block_tables", 2, (torch.int32,))
    T, Hq, D = q.shape
    nb, Hkv, bs, Dk = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: shape/dtype {tuple(v_cache.shape)}/{v_cache.dtype} differs "
                         f"from k_cache {tuple(k_cache.shape)}/{k_cache.dtype}")
    if Dk != D:
        raise ValueError(f"k_cache: head_dim {Dk} differs from q's {D}")
    if D % 16 or not 16 <= D <= 512:
        raise ValueError(f"q: head_dim must be a multiple of 16 in [16, 512], got {D}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q: {Hq} query heads are not a multiple of {Hkv} KV heads")
    B = len(query_lens)
    if B == 0 or nb == 0 or bs == 0 or len(seq_lens) != B:
        raise ValueError(f"query_lens/seq_lens: {B} and {len(seq_lens)} sequences "
                         f"(num_blocks={nb}, block_size={bs})")
    if block_tables.shape[0] != B or block_tables.shape[1] == 0:
        raise ValueError(f"block_tables: shape {tuple(block_tables.shape)} for batch {B}")
    if any(ql < 0 for ql in query_lens) or sum(query_lens) != T:
        raise ValueError(f"query_lens: {query_lens} must be >= 0 and sum to q's {T} rows")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: must be a finite number, got {scale!r}")
    path = cpu_kernels.resolve_isa(isa)
    if path not in cpu_kernels.GEMM_ISAS:
        raise ValueError(f"paged_prefill_attention: no {path!r} path "
                         f"(it has {', '.join(cpu_kernels.GEMM_ISAS)})")
    starts = torch.zeros(B + 1, dtype=torch.int32)
    starts[1:] = torch.tensor(query_lens, dtype=torch.int32).cumsum(0)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qf = q if q.dtype == torch.float32 else q.float()
    out = torch.empty_like(qf)
    rc = lib.dp_prefill_attention(
        ffi.cast("float *", qf.data_ptr()), ffi.cast("void *", k_cache.data_ptr()),
        ffi.cast("void *", v_cache.data_ptr()), cpu_kernels.DTYPE_CODES[k_cache.dtype],
        ffi.cast("int32_t *", block_tables.data_ptr()), block_tables.shape[1],
        ffi.cast("int32_t *", starts.data_ptr()), ffi.cast("int32_t *", lens.data_ptr()),
        ffi.cast("float *", out.data_ptr()), B, Hq, Hkv, D, bs, nb, float(scale),
        cpu_kernels.ISAS[path], cpu_kernels.num_threads(),
    )
    if rc == -5:
        raise MemoryError("paged_prefill_attention: out of memory for scratch")
    if rc != 0:
        name, why = ERRORS.get(rc, ("kernel", f"failed with code {rc}"))
        raise ValueError(f"{name}: {why}")
    return out if q.dtype == torch.float32 else out.to(q.dtype)
