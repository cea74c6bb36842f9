"""The start-up check of a GPU attention backend against the torch reference (issue 12).

A GPU worker whose backend is Triton or FlashInfer runs one small decode batch and one
prefill batch (chunked, with cached context, ragged, over a shuffled block table) through it
on its device before serving. If the backend fails to compile or launch, or disagrees with
``attention_ref``, the worker serves with the reference instead and says why: wrong tokens
are worse than slow ones, and neither backend's kernels can be checked on hardware in CI.
"""

from __future__ import annotations

import torch

from dualpace.model.attention_ref import paged_decode_attention_ref, ragged_paged_attention
from dualpace.model.batch import SeqChunk, build_forward_batch

HQ, HKV, D, BS = 8, 2, 128, 16
TABLES = [[3, 7], [11, 1, 5], [2]]
SEQ_LENS = [20, 40, 9]  # context after this step's rows
QUERY_LENS = [4, 40, 1]  # a chunk after cached context, a whole prompt, a decode row


def _batch(query_lens: list[int], device: torch.device):
    return build_forward_batch(
        [SeqChunk([0] * q, n - q, t) for q, n, t in zip(query_lens, SEQ_LENS, TABLES)],
        BS, device)


def _backend(name: str, device: torch.device):
    """(decode(q, k, v, batch, scale), prefill(q, k, v, batch, scale)) of a backend."""
    if name == "triton":
        from dualpace.model import attention_triton as at

        return (lambda q, k, v, fb, s: at.paged_decode_attention(q, k, v, fb.block_tables,
                                                                 fb.seq_lens, s, splits=2),
                lambda q, k, v, fb, s: at.paged_prefill_attention(
                    q, k, v, fb.block_tables, fb.query_lens_list, fb.seq_lens_list, s))
    if name == "flashinfer":
        from dualpace.model.attention_flashinfer import FlashInferAttention

        fi = FlashInferAttention(device, HQ, HKV, D, BS)
        return fi, fi
    raise ValueError(f"no start-up check for attention backend {name!r}")


def check_backend(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """None when backend ``name`` agrees with the reference on ``device`` in ``dtype``,
    else why not (an exception while compiling or running it is a reason too)."""
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    try:
        g = torch.Generator().manual_seed(0)
        k, v = (torch.randn(12, HKV, BS, D, generator=g).to(device, dtype) for _ in range(2))
        decode, prefill = _backend(name, device)
        scale = D ** -0.5
        fb = _batch([1, 1, 1], device)
        q = torch.randn(3, HQ, D, generator=g).to(device, dtype)
        got = decode(q, k, v, fb, scale)
        ref = paged_decode_attention_ref(q, k, v, fb.block_tables, fb.seq_lens, scale)
        if not torch.allclose(got.float(), ref.float(), atol=tol, rtol=tol):
            return f"decode differs from the reference by {(got - ref).abs().max().item():.3g}"
        fb = _batch(QUERY_LENS, device)
        q = torch.randn(sum(QUERY_LENS), HQ, D, generator=g).to(device, dtype)
        got = prefill(q, k, v, fb, scale)
        ref = ragged_paged_attention(q, k, v, fb.block_tables, QUERY_LENS, SEQ_LENS, scale)
        if not torch.allclose(got.float(), ref.float(), atol=tol, rtol=tol):
            return f"prefill differs from the reference by {(got - ref).abs().max().item():.3g}"
    except Exception as e:  # a compile or launch failure is a reason, not a crash
        return f"{type(e).__name__}: {e}"
    return None


def checked_backend(name: str, device: torch.device, dtype: torch.dtype, log,
                    block_size: int = BS) -> str:
    """The first of ``name``, then Triton (for FlashInfer, where it imports and the serving
    ``block_size`` suits its tiles, >= 16), then the torch reference, that passes
    ``check_backend`` on this device; each failure is logged with its reason."""
    import importlib.util

    chain = [name] + (["triton"] if name == "flashinfer" and block_size >= 16
                      and importlib.util.find_spec("triton") is not None else [])
    for backend in chain:
        reason = check_backend(backend, device, dtype)
        if reason is None:
            return backend
        log.error("%s attention failed its start-up check on %s (%s)", backend, device,
                  reason)
    log.error("serving with the torch reference attention, without CUDA graphs")
    return "torch"
