"""The prefill GEMM (cext/gemm.c, gemm_body.h) against float64 on each vector path: shapes
around its register tile (16 or 32 rows of x by 6 or 12 rows of W), its K blocks (512
steps) and its M blocks (128 rows), with bias and a residual added (in place too), on 1-3
threads; bf16 and fp16 weights, widened a tile at a time; rows that do not depend on the
batch or the thread count; the refusals; and the choice of GEMM for prefill chunks
($DUALPACE_PREFILL_GEMM)."""

from __future__ import annotations

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

SUPPORTED = cpu_kernels.supported_isas() if cpu_kernels.available() else []
# every path that has the GEMM; one without it on this CPU skips (AVX-512 on an AVX2 host)
GEMM_PATHS = [pytest.param(i, marks=pytest.mark.skipif(
    i not in SUPPORTED, reason=f"this CPU has no {i} (has {SUPPORTED})"))
    for i in ("avx2", "avx512")]

SHAPES = [(1, 1, 1), (5, 7, 3), (16, 6, 16), (17, 13, 33), (31, 12, 512), (33, 25, 513),
          (64, 100, 1100), (129, 37, 200), (300, 70, 1030), (256, 96, 64)]


def _want(x, w, bias, add):
    ref = x.double() @ w.double().T
    if bias is not None:
        ref += bias.double()
    if add is not None:
        ref += add.double()
    return ref


def _assert_close(got, ref, K):
    err = (got.double() - ref).abs().max().item()
    assert err <= 2e-6 * K ** 0.5 * (ref.abs().max().item() + 1), err


@pytest.mark.parametrize("isa", GEMM_PATHS)
@pytest.mark.parametrize("threads", [1, 3])
def test_gemm_matches_float64(isa, threads, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    g = torch.Generator().manual_seed(threads)
    for M, N, K in SHAPES:
        x = torch.randn(M, K, generator=g)
        w = torch.randn(N, K, generator=g)
        b = torch.randn(N, generator=g)
        a = torch.randn(M, N, generator=g)
        for bias, add in ((None, None), (b, None), (None, a), (b, a)):
            got = cpu_kernels.gemm(x, w, bias, add, isa=isa)
            assert got.shape == (M, N)
            _assert_close(got, _want(x, w, bias, add), K)
        # the residual updated in place (post_chunk's down projection)
        inplace = a.clone()
        assert cpu_kernels.gemm(x, w, b, inplace, out=inplace, isa=isa) is inplace
        _assert_close(inplace, _want(x, w, b, a), K)


# narrow weights need K a multiple of 16 (whole vectors widened): the shapes with such a K,
# and more K blocks, an edge tile of W and a last M block of 1 row
NARROW_SHAPES = [(M, N, K) for M, N, K in SHAPES if K % 16 == 0] + [
    (129, 13, 1040), (300, 70, 1536), (3, 5, 16)]


@pytest.mark.parametrize("isa", GEMM_PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 3])
def test_narrow_weights_multiply_as_their_fp32_widening(isa, dtype, threads, monkeypatch):
    """bf16 / fp16 W widened exactly and multiplied in fp32: to the bit what the fp32 GEMM
    gives on ``W.float()`` (the same sums in the same order, from the widened tile instead
    of W in place), and so within fp32 rounding of float64 on the widened weights."""
    monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
    g = torch.Generator().manual_seed(10 + threads)
    for M, N, K in NARROW_SHAPES:
        x = torch.randn(M, K, generator=g)
        w = torch.randn(N, K, generator=g).to(dtype)
        b = torch.randn(N, generator=g)
        a = torch.randn(M, N, generator=g)
        for bias, add in ((None, None), (b, a)):
            got = cpu_kernels.gemm(x, w, bias, add, isa=isa)
            assert torch.equal(got, cpu_kernels.gemm(x, w.float(), bias, add, isa=isa)), (M, N, K)
            _assert_close(got, _want(x, w.float(), bias, add), K)
        inplace = a.clone()
        assert cpu_kernels.gemm(x, w, b, inplace, out=inplace, isa=isa) is inplace
        _assert_close(inplace, _want(x, w.float(), b, a), K)


@pytest.mark.parametrize("isa", GEMM_PATHS)
def test_rows_do_not_depend_on_the_batch_or_the_threads(isa, monkeypatch):
    """Each output sums its K products in order, block after block: a row computed alone,
    in a padded panel or another M block, or by other threads, is the same to the bit (a
    prompt's first token must not depend on what was batched with it)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(300, 1100, generator=g)
    w = torch.randn(77, 1100, generator=g)
    monkeypatch.setattr(cpu_kernels, "_threads_override", 1)
    whole = cpu_kernels.gemm(x, w, isa=isa)
    for r in (0, 17, 131, 299):
        assert torch.equal(cpu_kernels.gemm(x[r:r + 1].contiguous(), w, isa=isa), whole[r:r + 1])
    monkeypatch.setattr(cpu_kernels, "_threads_override", 3)
    assert torch.equal(cpu_kernels.gemm(x, w, isa=isa), whole)


def test_bad_arguments_are_refused():
    x, w = torch.randn(4, 8), torch.randn(5, 8)
    bad = [
        (dict(x=x.double(), weight=w), "dtype"),
        (dict(x=x, weight=w.double()), "dtype"),
        (dict(x=x.bfloat16(), weight=w.bfloat16()), "dtype"),
        (dict(x=x, weight=w.bfloat16()), "K a multiple of 16"),
        (dict(x=x, weight=w.half()), "K a multiple of 16"),
        (dict(x=x, weight=torch.randn(5, 9)), "in-features"),
        (dict(x=x[:, :4], weight=w[:, :4]), "contiguous"),
        (dict(x=torch.randn(0, 8), weight=w), "M, N, K > 0"),
        (dict(x=x, weight=w, bias=torch.randn(4)), "bias"),
        (dict(x=x, weight=w, add=torch.randn(5, 4)), "add: shape"),
        (dict(x=x, weight=w, out=torch.randn(4, 4)), "out: shape"),
        (dict(x=x, weight=w, add=torch.randn(4, 5), isa="scalar"), "no 'scalar' path"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            cpu_kernels.gemm(**kwargs)
    shared = torch.randn(4, 8)
    with pytest.raises(ValueError, match="overlap"):
        cpu_kernels.gemm(shared, torch.randn(8, 8), out=shared)


def test_the_prefill_gemm_choice(monkeypatch):
    """auto: the cext GEMM on the AVX2 path, and on the AVX-512 paths of AMD CPUs (measured
    faster than torch's there; Intel's AVX-512 hosts not yet measured against MKL); cext: on
    any path that has it; torch: never."""
    path = cpu_kernels.resolve_isa()
    vendor = cpu_kernels.cpu_vendor()
    monkeypatch.delenv("DUALPACE_PREFILL_GEMM", raising=False)
    on_auto = path == "avx2" or (path in cpu_kernels.GEMM_ISAS and vendor == "AuthenticAMD")
    assert cpu_kernels.prefill_gemm_isa() == (path if on_auto else None)
    monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "cext")
    assert cpu_kernels.prefill_gemm_isa() == (path if path in cpu_kernels.GEMM_ISAS else None)
    monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "torch")
    assert cpu_kernels.prefill_gemm_isa() is None
    monkeypatch.setattr(cpu_kernels, "_default_isa", "scalar")
    monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "cext")
    assert cpu_kernels.prefill_gemm_isa() is None
    # the rule for each path and vendor, whatever this host is
    for vendor in ("AuthenticAMD", "GenuineIntel", ""):
        monkeypatch.setattr(cpu_kernels, "cpu_vendor", lambda v=vendor: v)
        amd = vendor == "AuthenticAMD"
        for name, auto, cext in (("avx2", "avx2", "avx2"),
                                 ("avx512", "avx512" if amd else None, "avx512"),
                                 ("avx512_bf16", "avx512_bf16" if amd else None, "avx512_bf16"),
                                 ("amx", "amx" if amd else None, "amx"),
                                 ("scalar", None, None)):
            monkeypatch.setattr(cpu_kernels, "resolve_isa", lambda name=None, p=name: p)
            monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "auto")
            assert cpu_kernels.prefill_gemm_isa() == auto, (vendor, name)
            monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "cext")
            assert cpu_kernels.prefill_gemm_isa() == cext, (vendor, name)
            monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "torch")
            assert cpu_kernels.prefill_gemm_isa() is None, (vendor, name)
            # bf16 / fp16 weights (asked only where torch's GEMM lacks the arithmetic):
            # cext wherever the path has one, unless torch's is asked for
            for dtype in (torch.bfloat16, torch.float16):
                monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "auto")
                assert cpu_kernels.prefill_gemm_isa(dtype) == cext, (vendor, name, dtype)
                monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "torch")
                assert cpu_kernels.prefill_gemm_isa(dtype) is None, (vendor, name, dtype)
    monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "fast")
    with pytest.raises(ValueError, match="DUALPACE_PREFILL_GEMM"):
        cpu_kernels.prefill_gemm_isa()
    monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "auto")
    with pytest.raises(ValueError, match=r"no GEMM for torch\.float64"):
        cpu_kernels.prefill_gemm_isa(torch.float64)


def test_vendor_from_cpuinfo():
    """The first vendor_id line's value, whatever its spacing; "" where there is none (an
    ARM host's cpuinfo, an unreadable file)."""
    amd = ["processor\t: 0\n", "vendor_id\t: AuthenticAMD\n", "cpu family\t: 25\n",
           "processor\t: 1\n", "vendor_id\t: AuthenticAMD\n"]
    assert cpu_kernels.vendor_from_cpuinfo(amd) == "AuthenticAMD"
    assert cpu_kernels.vendor_from_cpuinfo(["vendor_id:GenuineIntel"]) == "GenuineIntel"
    assert cpu_kernels.vendor_from_cpuinfo(["processor : 0\n", "BogoMIPS : 50.00\n",
                                            "CPU implementer : 0x41\n"]) == ""
    assert cpu_kernels.vendor_from_cpuinfo(["vendor_id_extra : X\n", "vendor_id\n"]) == ""
    assert cpu_kernels.vendor_from_cpuinfo([]) == ""
