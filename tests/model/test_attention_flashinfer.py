"""The FlashInfer backend's page table (pure Python, checked against the block tables the
torch reference reads) and, on CUDA with flashinfer installed, the backend against the
reference (skipped elsewhere; never counted as passed)."""

from __future__ import annotations

import importlib.util
import logging
import os

import pytest
import torch

if not torch.cuda.is_available():  # Triton (the fallback) runs interpreted on CPU tensors
    os.environ["TRITON_INTERPRET"] = "1"

from dualpace.model.attention_flashinfer import paged_csr, query_indptr


def test_csr_literal_case():
    indptr, indices, last = paged_csr([[7, 3, 9], [4], [5, 6]], [33, 16, 17], 16)
    assert indptr == [0, 3, 4, 6]
    assert indices == [7, 3, 9, 4, 5, 6]
    assert last == [1, 16, 1]  # 33 = 2 x 16 + 1; a full page; 17 = 16 + 1
    assert query_indptr([5, 1, 20]) == [0, 5, 6, 26]


def test_csr_ignores_padding_and_refuses_short_tables():
    # A table padded past the sequence (as build_forward_batch pads): only the pages used.
    assert paged_csr([[2, 8, 0, 0]], [20], 16) == ([0, 2], [2, 8], [4])
    with pytest.raises(ValueError, match="a sequence of 40 tokens needs 3 blocks, has 2"):
        paged_csr([[1, 2]], [40], 16)
    with pytest.raises(ValueError, match="2 block lists for 1 sequences"):
        paged_csr([[1], [2]], [3], 16)


def test_csr_rebuilds_each_sequences_tokens():
    """Walking the CSR page by page gives exactly each sequence's token slots."""
    tables, lens, bs = [[3, 1, 4, 15], [9, 2], [6]], [50, 17, 16], 16
    indptr, indices, last = paged_csr(tables, lens, bs)
    for b, n in enumerate(lens):
        pages = indices[indptr[b]:indptr[b + 1]]
        slots = [p * bs + o for j, p in enumerate(pages)
                 for o in range(bs if j < len(pages) - 1 else last[b])]
        assert slots == [tables[b][t // bs] * bs + t % bs for t in range(n)]


CUDA_FI = torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_FI, reason="needs CUDA and flashinfer")
def test_flashinfer_backend_passes_the_start_up_check():
    from dualpace.model.attention_check import check_backend

    for dtype in (torch.bfloat16, torch.float16):
        assert check_backend("flashinfer", torch.device("cuda"), dtype) is None


def test_a_failing_flashinfer_falls_back_to_triton(monkeypatch, caplog):
    from dualpace.model import attention_check

    real = attention_check._backend

    def backend(name, device):
        if name == "flashinfer":
            raise ImportError("libflashinfer.so: cannot open shared object file")
        return real(name, device)

    monkeypatch.setattr(attention_check, "_backend", backend)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with caplog.at_level(logging.ERROR, logger="test"):
        got = attention_check.checked_backend("flashinfer", dev, torch.float32,
                                              logging.getLogger("test"))
    assert got == "triton"
    assert "flashinfer attention failed its start-up check" in caplog.text
    assert "cannot open shared object file" in caplog.text
