"""Greedy sampling's argmax (cext/argmax.c) against torch.argmax on every ISA path this CPU
has: random rows, ties inside a vector and across the threads' spans of a lone row, rows of
-inf, +inf and NaN (torch: the first NaN), maxima in the scalar tail, 1-3 threads."""

from __future__ import annotations

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.sampling.sampler import greedy_tokens

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

ISAS = cpu_kernels.supported_isas() if cpu_kernels.available() else []


def _cases(g: torch.Generator) -> list[torch.Tensor]:
    out = []
    for R, V in [(1, 1), (1, 5), (3, 15), (2, 16), (4, 17), (1, 31), (5, 32000), (1, 32003),
                 (7, 4099)]:
        out.append(torch.randn(R, V, generator=g))
    V = 4099
    tie = torch.zeros(3, V)
    tie[0, [17, 2100, 4098]] = 5.0  # one lane, two threads' spans, the tail
    tie[1, [3, 19]] = 5.0  # two lanes of one vector
    tie[2] = -float("inf")
    out.append(tie)
    special = torch.randn(6, V, generator=g)
    special[0, 4097] = float("inf")  # in the tail
    special[1, [40, 3000]] = float("nan")
    special[2, 4098] = float("nan")
    special[3, [5, 10]] = float("inf")
    special[3, 2000] = float("nan")
    special[4, 0] = float("nan")
    special[5] = float("nan")
    out.append(special)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_argmax_rows_is_torchs(isa, threads, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    for x in _cases(torch.Generator().manual_seed(threads)):
        got = cpu_kernels.argmax_rows(x, isa=isa)
        want = x.argmax(dim=-1)
        assert got.dtype == torch.int64 and torch.equal(got, want), (x.shape, got, want)


def test_argmax_rows_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="dtype"):
        cpu_kernels.argmax_rows(torch.zeros(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernels.argmax_rows(torch.zeros(8, 2).t())
    with pytest.raises(ValueError, match="dimensions"):
        cpu_kernels.argmax_rows(torch.zeros(8))
    with pytest.raises(ValueError, match="shape"):
        cpu_kernels.argmax_rows(torch.zeros(0, 8))


def test_greedy_tokens_takes_torch_where_the_kernel_does_not_apply():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 300, generator=g)
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
    strided = torch.randn(300, 9, generator=g).t()
    assert torch.equal(greedy_tokens(strided), strided.argmax(dim=-1))
    half = x.bfloat16()
    assert torch.equal(greedy_tokens(half), half.argmax(dim=-1))
