"""The weight-streaming decode linear (cext/linear_body.h) against torch on every ISA path:
row counts around the 4-row register tile, widths whose thread shares end in partial tiles,
weights in fp32, bf16 and fp16, with and without bias, on 1-3 threads."""

from __future__ import annotations

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

ISAS = cpu_kernels.supported_isas() if cpu_kernels.available() else []


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1, 3])
def test_linear_matches_torch(isa, w_dtype, threads, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    g = torch.Generator().manual_seed(threads)
    for M, N, K in [(1, 1, 16), (3, 7, 48), (4, 64, 512), (5, 13, 32), (9, 101, 80),
                    (17, 40, 1376)]:
        x = torch.randn(M, K, generator=g)
        w = torch.randn(N, K, generator=g).to(w_dtype)
        b = torch.randn(N, generator=g)
        want = x.double() @ w.double().T
        for bias in (None, b):
            got = cpu_kernels.linear(x, w, bias, isa=isa)
            ref = want + (0 if bias is None else bias.double())
            assert got.shape == (M, N)
            err = (got.double() - ref).abs().max().item()
            assert err <= 1e-5 * K ** 0.5 * (ref.abs().max().item() + 1), (M, N, K, err)


def test_linear_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu_kernels.linear(torch.randn(2, 20), torch.randn(3, 20))
    with pytest.raises(ValueError, match="in-features"):
        cpu_kernels.linear(torch.randn(2, 32), torch.randn(3, 16))
