"""The weight-streaming decode linear (cext/linear_body.h) against torch on every ISA path:
row counts around the 4-row register tile, widths whose thread shares end in partial tiles,
weights in fp32, bf16 and fp16, with and without bias, on 1-3 threads; on the AMX path the
tiles' rows (bf16 weights, from 4 rows of x, K a multiple of 32) against x rounded to bf16."""

from __future__ import annotations

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

ISAS = cpu_kernels.supported_isas() if cpu_kernels.available() else []
needs_amx = pytest.mark.skipif("amx" not in ISAS, reason="this CPU or kernel offers no AMX tiles")


def tile_rows(isa: str, w_dtype: torch.dtype, M: int, N: int, K: int) -> int:
    """How many leading output columns cext/linear_amx.c computes on AMX tiles, by its
    documented rule: the amx path, bf16 W, M >= 4, K a multiple of 32, and every whole 16
    rows of W (the claims end on multiples of 16, but for the last at N)."""
    if isa != "amx" or w_dtype != torch.bfloat16 or M < 4 or K % 32:
        return 0
    return N // 16 * 16


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1, 3])
def test_linear_matches_torch(isa, w_dtype, threads, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    g = torch.Generator().manual_seed(threads)
    for M, N, K in [(1, 1, 16), (3, 7, 48), (4, 64, 512), (5, 13, 32), (9, 101, 80),
                    (17, 40, 1376), (16, 48, 64), (33, 200, 96), (40, 16, 32),
                    (9, 21, 2752), (33, 70, 8192),  # K blocks (fp32); panels (1 MB of x)
                    (40, 150, 4128),  # AMX: K blocks past 32 rows, the last one short
                    (40, 150, 11296)]:  # AMX: past 1 MiB of packed x, grouped panels
        x = torch.randn(M, K, generator=g)
        w = torch.randn(N, K, generator=g).to(w_dtype)
        b = torch.randn(N, generator=g)
        want = x.double() @ w.double().T
        tiles = tile_rows(isa, w_dtype, M, N, K)
        want[:, :tiles] = (x.bfloat16().double() @ w.double().T)[:, :tiles]
        for bias in (None, b):
            got = cpu_kernels.linear(x, w, bias, isa=isa)
            ref = want + (0 if bias is None else bias.double())
            assert got.shape == (M, N)
            err = (got.double() - ref).abs().max().item()
            assert err <= 1e-5 * K ** 0.5 * (ref.abs().max().item() + 1), (M, N, K, err)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "amx"])
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_row_results_do_not_depend_on_the_batch(isa, w_dtype, monkeypatch):
    """Tiles 1-4 rows of x deep and 1-4 W rows wide (cext/linear_body.h), K blocks with the
    sums carried from block to block where a tile's W rows pass 24 KB (from 5 rows of x),
    and panels of tiles past 1 MB of x: the same accumulations in the same order, so a
    row's output is bit for bit the same whichever tile, batch size or thread count
    computed it (a decode row must not change with its batch)."""
    g = torch.Generator().manual_seed(5)
    # tiles of 2-4 KB, 5.5 KB and 16 KB of W rows; the last batch takes panels (40 x 8192)
    for K, batch in ((512, 8), (1376, 8), (4096, 8), (8192, 40)):
        x = torch.randn(batch, K, generator=g)
        w = torch.randn(70, K, generator=g).to(w_dtype)
        b = torch.randn(70, generator=g)
        monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
        full = cpu_kernels.linear(x, w, b, isa=isa)
        for M in (1, 2, 3, 4, 5):
            for threads in (1, 3):
                monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
                got = cpu_kernels.linear(x[:M], w, b, isa=isa)
                assert torch.equal(got, full[:M]), (K, M, threads)


def test_linear_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu_kernels.linear(torch.randn(2, 20), torch.randn(3, 20))
    with pytest.raises(ValueError, match="in-features"):
        cpu_kernels.linear(torch.randn(2, 32), torch.randn(3, 16))


def test_the_kernels_answer_which_projections_take_the_tiles_by_the_documented_rule():
    """dp_linear_uses_amx (what bench/decode_throughput.py leaves out of its FMA floor) says
    tiles exactly where tile_rows does, on every path code (the rule, not the CPU: it runs
    without AMX too), and the Python wrapper agrees on the paths this CPU has."""
    _, lib = cpu_kernels.require()
    for isa, code in cpu_kernels.ISAS.items():
        for dt, dcode in cpu_kernels.DTYPE_CODES.items():
            for M in range(1, 9):
                for K in (32, 48, 64, 4096):
                    want = tile_rows(isa, dt, M, 16, K) > 0
                    assert bool(lib.dp_linear_uses_amx(code, dcode, M, K)) == want, (
                        isa, dt, M, K)
                    if isa in ISAS:
                        assert cpu_kernels.linear_uses_amx(dt, M, K, isa=isa) == want


@needs_amx
def test_amx_path_changes_only_the_projections_it_names(monkeypatch):
    """Forcing ``amx`` leaves fp32 and fp16 weights, and bf16 below 4 rows, to the AVX-512
    body, bit for bit; from 4 rows bf16 weights take the tiles (x rounded to bf16)."""
    monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
    g = torch.Generator().manual_seed(9)
    for M in (1, 3, 4, 32):
        x = torch.randn(M, 256, generator=g)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            w = torch.randn(96, 256, generator=g).to(dt)
            a = cpu_kernels.linear(x, w, None, isa="amx")
            b = cpu_kernels.linear(x, w, None, isa="avx512_bf16")
            assert torch.equal(a, b) == (tile_rows("amx", dt, M, 96, 256) == 0), (M, dt)


@needs_amx
def test_amx_rows_do_not_depend_on_the_batch(monkeypatch):
    """From 4 rows the tiles sum every row's products in one order (cext/linear_amx.c): past
    32 rows a panel's passes go in K blocks (past 1 MiB of packed x, a batch of 33-40 rows
    at K = 11296, in groups of panels), the tiles carried exactly, so a row is bit for bit
    the same in a blocked batch, in an unblocked one (4-17 rows, one pass a panel) and on
    any thread count."""
    g = torch.Generator().manual_seed(3)
    for K in (4096, 11296):
        x = torch.randn(40, K, generator=g)
        w = torch.randn(150, K, generator=g).bfloat16()
        b = torch.randn(150, generator=g)
        monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
        full = cpu_kernels.linear(x, w, b, isa="amx")
        for M in (4, 5, 17, 33):
            for threads in (1, 3):
                monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
                got = cpu_kernels.linear(x[:M], w, b, isa="amx")
                assert torch.equal(got, full[:M]), (K, M, threads)
