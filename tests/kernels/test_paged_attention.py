"""cext paged decode attention against the torch reference, on every ISA this CPU has."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpace.kernels import cpu
from dualpace.model.attention_ref import paged_decode_attention_ref

ALL_ISAS = ["scalar", "avx2", "avx512", "avx512_bf16", "amx"]
SUPPORTED = cpu.supported_isas()
# Max abs error vs the fp32 reference, for outputs of unit scale. fp32 KV: the kernel's
# polynomial exp and summation order (~1e-6; ~2e-5 with scores of magnitude ~50).
# bf16/fp16 KV: the inputs' own rounding
# (bf16 has 8 mantissa bits, ~4e-3 relative) dominates; the reference sees the same
# rounded values, so what remains is the output rounding to q's dtype.
TOL = {torch.float32: 5e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def isa_param(name: str):
    return pytest.param(name, marks=pytest.mark.skipif(
        name not in SUPPORTED, reason=f"this CPU has no {name} (has {SUPPORTED})"))


ISA_PARAMS = [isa_param(n) for n in ALL_ISAS]


@pytest.fixture(autouse=True)
def bf16_dot_route_on():
    """Every test here runs with the bf16-dot route on, so that an AVX512_BF16 CPU whose
    probe turned it off (cpu.set_bf16_dot) still checks it; the probed state comes back
    after."""
    probed = cpu.bf16_dot_enabled()
    cpu.set_bf16_dot(True)
    yield
    cpu.set_bf16_dot(probed)


def make_case(seed, lens, hkv, group, head_dim, block_size, dtype, extra_blocks=3):
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(per_seq) + extra_blocks
    k = torch.randn(num_blocks, hkv, block_size, head_dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, hkv, block_size, head_dim, generator=g).to(dtype)
    q = torch.randn(len(lens), hkv * group, head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)  # shuffled, non-contiguous tables
    max_blocks = max(per_seq) + 1
    tables = torch.zeros(len(lens), max_blocks, dtype=torch.int32)
    at = 0
    for i, nb in enumerate(per_seq):
        tables[i, :nb] = perm[at: at + nb].int()
        at += nb
    return q, k, v, tables, torch.tensor(lens, dtype=torch.int32)


def dense_attention(q, k, v, tables, lens, scale):
    """The oracle, independent of the package: gather each sequence's first n tokens from its
    blocks, repeat the KV heads over their query group, softmax(q·Kᵀ·scale)·V in float64."""
    bs, hkv = k.shape[2], k.shape[1]
    group = q.shape[1] // hkv
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, n in enumerate(lens.tolist()):
        rows = [(int(tables[i, t // bs]), t % bs) for t in range(n)]
        kk = torch.stack([k[b, :, o, :] for b, o in rows], 1).double()  # [hkv, n, d]
        vv = torch.stack([v[b, :, o, :] for b, o in rows], 1).double()
        kk, vv = kk.repeat_interleave(group, 0), vv.repeat_interleave(group, 0)
        w = torch.softmax((q[i].double()[:, None, :] * kk).sum(-1) * scale, dim=-1)
        out[i] = (w[:, :, None] * vv).sum(1)
    return out


def check(isa, q, k, v, tables, lens, scale):
    out = cpu.paged_decode_attention(q, k, v, tables, lens, scale, isa=isa)
    oracle = dense_attention(q, k, v, tables, lens, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    err = (out.double() - oracle).abs().max().item()
    assert err <= TOL[q.dtype], f"max abs error {err} > {TOL[q.dtype]}"
    # The torch fallback serves the GPU worker without a kernel: it must agree too.
    ref = paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, lens, scale)
    assert (ref.double() - oracle).abs().max().item() <= TOL[torch.float32]


@pytest.mark.parametrize("isa", ISA_PARAMS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    block_size=st.sampled_from([8, 16, 32, 128]),
    group=st.sampled_from([1, 2, 4, 8, 16]),
    hkv=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    data=st.data(),
)
def test_random_ragged_batches(isa, seed, block_size, group, hkv, head_dim, dtype, data):
    lens = data.draw(st.lists(
        st.one_of(st.integers(1, 300), st.sampled_from([block_size, 2 * block_size,
                                                        5 * block_size + 1])),
        min_size=1, max_size=6))
    q, k, v, tables, sl = make_case(seed, lens, hkv, group, head_dim, block_size, dtype)
    check(isa, q, k, v, tables, sl, head_dim**-0.5)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_contexts_split_kv(isa, dtype):
    """One long request among short ones: the split-KV + LSE merge path."""
    lens = [8192, 1, 4096, 16 * 37]
    q, k, v, tables, sl = make_case(3, lens, 2, 4, 128, 16, dtype)
    check(isa, q, k, v, tables, sl, 128**-0.5)
    q, k, v, tables, sl = make_case(4, [8192], 1, 8, 64, 128, dtype)
    check(isa, q, k, v, tables, sl, 64**-0.5)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_few_sequences_split_into_segments_and_head_ranges(isa, threads, monkeypatch):
    """Too few sequences to busy every thread: the driver cuts KV segments, then each block's
    KV heads into ranges (uneven ones: 12 heads over 8 ranges at 2 threads, 5 over 2 at 3),
    and an item walks each block across its range of heads. Groups of 3 and 20 take the
    generic instantiation, 20 in QK slices of 4 heads and a PV in slices of 8."""
    monkeypatch.setattr(cpu, "_threads_override", threads)
    for hkv, group, lens in ((12, 1, [100]), (3, 4, [100, 7]), (5, 8, [1000]),
                             (8, 2, [40, 33, 17]), (2, 3, [70]), (1, 20, [300, 5])):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v, tables, sl = make_case(hkv * 10 + group, lens, hkv, group, 64, 16, dtype)
            check(isa, q, k, v, tables, sl, 64**-0.5)


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_every_listed_head_dim_group_and_block_size(isa, dtype, head_dim):
    """The issue's shapes: the PV loop takes PV_ACC / G head-dim chunks per pass over the
    tokens, so head dims that are not a multiple of that (80, 96) end on a shorter pass."""
    for group, block_size in ((1, 16), (2, 32), (4, 64), (8, 16), (5, 16), (6, 32), (7, 64)):
        lens = [1, block_size + 3, 3 * block_size - 1, 200]
        q, k, v, tables, sl = make_case(head_dim + group, lens, 2, group, head_dim,
                                        block_size, dtype)
        check(isa, q, k, v, tables, sl, head_dim**-0.5)


@pytest.mark.parametrize("isa", ISA_PARAMS)
def test_head_dims_and_large_scores(isa):
    for d in (16, 96, 256):
        q, k, v, tables, sl = make_case(d, [1, 70, 300], 2, 2, d, 16, torch.float32)
        check(isa, q * 4, k * 4, v, tables, sl, d**-0.5)  # sharp softmax: exp range matters


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("group", [3, 5, 6, 7, 12])
def test_groups_that_do_not_divide_the_vector_width(isa, group):
    """GQA 3, 5, 6, 7 and 12 (Qwen's 40 over 8, 28 over 4 heads...): the QK slices of 4 heads
    end on a shorter one, and the softmax takes each lane's head maximum from a periodic
    vector (attention_simd.h's prim_softmax_periodic); sharp scores, so that a maximum taken
    from the wrong head overflows or flushes the exponentials, and fp32 q over bf16 KV to the
    fp32 bound."""
    lens = [1, 7, 16, 33, 300]
    q, k, v, tables, sl = make_case(group, lens, 2, group, 64, 16, torch.float32)
    check(isa, q * 4, k * 4, v, tables, sl, 0.125)
    q, k, v, tables, sl = make_case(group + 1, lens, 2, group, 128, 16, torch.bfloat16)
    q = torch.randn(q.shape, generator=torch.Generator().manual_seed(group)) * 3
    out = cpu.paged_decode_attention(q, k, v, tables, sl, 128**-0.5, isa=isa)
    err = (out.double() - dense_attention(q, k, v, tables, sl, 128**-0.5)).abs().max()
    assert err.item() <= 2e-4, err.item()


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_fp32_queries_over_bf16_kv_keep_fp32_precision(isa, head_dim):
    """The serving case (fp32 activations, bf16 KV) to a bound 80x tighter than the bf16
    tests': the KV's rounding is in the oracle too, so what remains is the kernel's."""
    lens = [1, 37, 300, 16 * 20]
    for group in (4, 8):  # 8: a group the bf16 dot products take for bf16 queries
        q, k, v, tables, sl = make_case(head_dim, lens, 2, group, head_dim, 16, torch.bfloat16)
        q = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)) * 3  # sharp
        out = cpu.paged_decode_attention(q, k, v, tables, sl, head_dim**-0.5, isa=isa)
        err = (out.double() - dense_attention(q, k, v, tables, sl, head_dim**-0.5)).abs().max()
        assert err.item() <= 2e-4, (group, err.item())


def test_bf16_dot_products_where_they_apply():
    """The AVX512_BF16 path takes bf16 dot products for bf16 q and KV, groups of 8 or more,
    head dims a multiple of 32, and the AVX-512 route otherwise (where the dot products
    measured no faster, or cannot keep an fp32 query's precision)."""
    bf, f32 = torch.bfloat16, torch.float32
    isa = "avx512_bf16" if "avx512_bf16" in SUPPORTED else None
    if isa is None:
        assert not cpu.attention_uses_bf16_dot(bf, bf, 4, 128)
        pytest.skip(f"this CPU has no avx512_bf16 (has {SUPPORTED})")
    assert cpu.attention_uses_bf16_dot(bf, bf, 8, 128, isa=isa)
    assert cpu.attention_uses_bf16_dot(bf, bf, 8, 64, isa=isa)
    assert cpu.attention_uses_bf16_dot(bf, bf, 20, 96, isa=isa)
    assert not cpu.attention_uses_bf16_dot(bf, bf, 4, 128, isa=isa)
    assert not cpu.attention_uses_bf16_dot(bf, bf, 1, 128, isa=isa)
    assert not cpu.attention_uses_bf16_dot(bf, bf, 8, 80, isa=isa)
    assert not cpu.attention_uses_bf16_dot(f32, bf, 8, 128, isa=isa)
    assert not cpu.attention_uses_bf16_dot(f32, f32, 8, 128, isa=isa)
    assert not cpu.attention_uses_bf16_dot(bf, bf, 8, 128, isa="avx512")
    assert not cpu.set_bf16_dot(False)  # a CPU whose dot products do not pay
    assert not cpu.bf16_dot_enabled()
    assert not cpu.attention_uses_bf16_dot(bf, bf, 8, 128, isa=isa)


def test_bf16_dot_pays_at_three_quarters_of_the_fma_rate():
    """bf16_dot_pays: dot_per_s >= BF16_DOT_MIN_RATIO * fma_per_s, its literal cases."""
    assert cpu.BF16_DOT_MIN_RATIO == 0.75
    assert cpu.bf16_dot_pays(1.0e9, 1.0e9)       # Zen 4/5: as fast as an FMA
    assert cpu.bf16_dot_pays(0.75e9, 1.0e9)      # the boundary itself
    assert not cpu.bf16_dot_pays(0.74e9, 1.0e9)
    assert not cpu.bf16_dot_pays(0.25e9, 1.0e9)  # the Intel Xeon measured here
    with pytest.raises(ValueError, match="positive"):
        cpu.bf16_dot_pays(1.0e9, 0.0)


def test_the_route_follows_dualpace_bf16_dot(monkeypatch):
    """DUALPACE_BF16_DOT=0/1 overrides the probe; anything else is a clear error that
    leaves the route as it was."""
    bf = torch.bfloat16
    isa = "avx512_bf16" if "avx512_bf16" in SUPPORTED else None
    monkeypatch.setenv("DUALPACE_BF16_DOT", "0")
    assert not cpu.set_bf16_dot()
    monkeypatch.setenv("DUALPACE_BF16_DOT", "1")
    assert cpu.set_bf16_dot()
    if isa:
        assert cpu.attention_uses_bf16_dot(bf, bf, 8, 128, isa=isa)
    monkeypatch.setenv("DUALPACE_BF16_DOT", "yes")
    with pytest.raises(ValueError, match="DUALPACE_BF16_DOT"):
        cpu.set_bf16_dot()
    if isa:
        assert cpu.attention_uses_bf16_dot(bf, bf, 8, 128, isa=isa)


def test_bf16_dot_probe_measures_a_rate():
    """The probe counts real instructions: a positive rate where the CPU has AVX512_BF16,
    a clear error where it has not."""
    if "avx512_bf16" not in SUPPORTED:
        with pytest.raises(ValueError, match="AVX512_BF16"):
            cpu.bf16_dot_rate(0.001)
        return
    assert cpu.bf16_dot_rate(0.001, 1) > 1e6


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("group,head_dim,block_size", [
    (2, 64, 16), (4, 128, 16), (8, 96, 1), (8, 128, 32), (8, 64, 15), (9, 32, 3), (20, 64, 7),
    (8, 80, 16), (16, 64, 5), (16, 32, 16), (3, 64, 7)])
def test_bf16_within_its_rounding_bound(isa, group, head_dim, block_size):
    """bf16 q and KV to the bound the dot-product route is allowed (attention_avx512bf16.c):
    the output's own rounding to bf16 (2^-8 relative) plus the probabilities' (2^-8 of
    max|v|); odd lengths and odd block sizes end on half a token pair. Every route must
    stay within it, whichever it takes."""
    lens = [1, 2, 3, block_size, 2 * block_size + 1, 157]
    q, k, v, tables, sl = make_case(group * 100 + head_dim, lens, 2, group, head_dim,
                                    block_size, torch.bfloat16)
    scale = head_dim**-0.5
    out = cpu.paged_decode_attention(q, k, v, tables, sl, scale, isa=isa)
    oracle = dense_attention(q, k, v, tables, sl, scale)
    bound = 2.0**-8 * (v.float().abs().max().item() + oracle.abs()) + 1e-5
    excess = ((out.double() - oracle).abs() - bound).max().item()
    assert excess <= 0, f"error above the bound by {excess}"


def nan_past_lengths(k, v, tables, lens):
    """Copies of the pools with NaN in every slot no sequence covers: the rest of each last
    block, and every block not in a table."""
    block_size = k.shape[2]
    live = torch.zeros(k.shape[0], block_size, dtype=torch.bool)
    for i, n in enumerate(lens):
        for t in range(n):
            live[tables[i, t // block_size], t % block_size] = True
    k_nan, v_nan = k.clone(), v.clone()
    k_nan.permute(0, 2, 1, 3)[~live] = float("nan")
    v_nan.permute(0, 2, 1, 3)[~live] = float("nan")
    return k_nan, v_nan


@pytest.mark.parametrize("isa", ISA_PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slots_past_a_sequence_are_never_read(isa, dtype):
    """Pool slots past each sequence's length (the rest of its last block, and every block
    not in a table) hold NaN, as freed or never-written KV may: nothing of them may reach
    the output, not even as a zero weight's partner in a token pair."""
    lens = [1, 3, 16 + 5, 45]
    for group, head_dim, block_size in ((1, 64, 16), (4, 128, 16), (8, 64, 3)):
        q, k, v, tables, sl = make_case(7 + group, lens, 2, group, head_dim, block_size,
                                        dtype)
        k_nan, v_nan = nan_past_lengths(k, v, tables, lens)
        out = cpu.paged_decode_attention(q, k_nan, v_nan, tables, sl, head_dim**-0.5, isa=isa)
        ref = cpu.paged_decode_attention(q, k, v, tables, sl, head_dim**-0.5, isa=isa)
        assert not out.isnan().any()
        assert torch.equal(out, ref)


def test_forcing_an_isa_by_environment(monkeypatch):
    q, k, v, tables, sl = make_case(0, [5, 40], 1, 1, 64, 16, torch.float32)
    monkeypatch.setenv("DUALPACE_CPU_ISA", "scalar")
    check(None, q, k, v, tables, sl, 0.125)
    monkeypatch.setenv("DUALPACE_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="unknown ISA"):
        cpu.paged_decode_attention(q, k, v, tables, sl, 0.125)
    unsupported = [n for n in ALL_ISAS if n not in SUPPORTED]
    for name in unsupported:
        monkeypatch.setenv("DUALPACE_CPU_ISA", name)
        with pytest.raises(ValueError, match="does not support"):
            cpu.paged_decode_attention(q, k, v, tables, sl, 0.125)


def _good():
    return make_case(0, [5, 40], 2, 2, 64, 16, torch.float32)


def _bad_cases():
    q, k, v, t, s = _good()
    yield "q", (q.double(), k, v, t, s, 0.1)
    yield "q", (q[:, :, :48].contiguous()[:, :, :40], k, v, t, s, 0.1)
    yield "q", (q.transpose(0, 1), k, v, t, s, 0.1)
    yield "q", (q[0], k, v, t, s, 0.1)
    yield "q", ("not a tensor", k, v, t, s, 0.1)
    yield "k_cache", (q, k[..., :32].contiguous(), v, t, s, 0.1)
    yield "k_cache", (q, k.to(torch.int32), v, t, s, 0.1)
    yield "v_cache", (q, k, v.bfloat16(), t, s, 0.1)
    yield "v_cache", (q, k, v[:-1], t, s, 0.1)
    yield "q", (q[:, :3].contiguous(), k, v, t, s, 0.1)  # 3 heads over 2 KV heads
    yield "block_tables", (q, k, v, t.long(), s, 0.1)
    yield "block_tables", (q, k, v, t[:1], s, 0.1)
    bad = t.clone()
    bad[1, 0] = k.shape[0]
    yield "block_tables", (q, k, v, bad, s, 0.1)
    bad = t.clone()
    bad[0, 0] = -1
    yield "block_tables", (q, k, v, bad, s, 0.1)
    yield "seq_lens", (q, k, v, t, s.long(), 0.1)
    yield "seq_lens", (q, k, v, t, s[:1], 0.1)
    yield "seq_lens", (q, k, v, t, torch.tensor([0, 3], dtype=torch.int32), 0.1)
    yield "seq_lens", (q, k, v, t, torch.tensor([5, 10_000], dtype=torch.int32), 0.1)
    yield "seq_lens", (q, k, v, t, torch.tensor([-4, 3], dtype=torch.int32), 0.1)
    yield "scale", (q, k, v, t, s, float("nan"))


@pytest.mark.parametrize("name,args", list(_bad_cases()))
def test_bad_arguments_raise_value_error(name, args):
    with pytest.raises(ValueError, match=name):
        cpu.paged_decode_attention(*args)


AMX = "amx" if "amx" in SUPPORTED else None


def test_amx_tiles_where_they_apply():
    """The AMX path runs attention on tiles for bf16 KV, groups of 8 to 16 (8 for an fp32 q,
    which takes two bf16 parts a column), head dims a multiple of 16 and block sizes a
    multiple of 16; elsewhere it is the AVX512_BF16 path's (attention_amx.c)."""
    bf, f32 = torch.bfloat16, torch.float32
    if AMX is None:
        assert not cpu.attention_uses_amx(bf, bf, 8, 128, 16)
        pytest.skip(f"this CPU has no amx (has {SUPPORTED})")
    for q_dtype in (bf, f32):
        assert cpu.attention_uses_amx(q_dtype, bf, 8, 128, 16, isa=AMX)
        assert cpu.attention_uses_amx(q_dtype, bf, 8, 64, 64, isa=AMX)
        assert cpu.attention_uses_amx(q_dtype, bf, 8, 96, 32, isa=AMX)
        assert not cpu.attention_uses_amx(q_dtype, bf, 4, 128, 16, isa=AMX)  # measured no faster
        assert cpu.attention_uses_amx(q_dtype, bf, 8, 80, 16, isa=AMX)  # 2 chunks + a tail
        assert not cpu.attention_uses_amx(q_dtype, bf, 8, 72, 16, isa=AMX)  # 72 = 4.5 x 16
        assert not cpu.attention_uses_amx(q_dtype, bf, 8, 128, 8, isa=AMX)   # half a tile
        assert not cpu.attention_uses_amx(q_dtype, f32, 8, 128, 16, isa=AMX)
        assert not cpu.attention_uses_amx(q_dtype, bf, 8, 128, 16, isa="avx512_bf16")
    assert cpu.attention_uses_amx(bf, bf, 16, 128, 16, isa=AMX)
    assert not cpu.attention_uses_amx(f32, bf, 16, 128, 16, isa=AMX)  # 32 columns
    assert not cpu.attention_uses_amx(bf, bf, 20, 128, 16, isa=AMX)
    # where the tiles run, the bf16 dot products do not
    assert not cpu.attention_uses_bf16_dot(bf, bf, 8, 128, isa=AMX, block_size=16)


@pytest.mark.skipif(AMX is None, reason=f"this CPU has no amx (has {SUPPORTED})")
@pytest.mark.parametrize("group", [8, 12, 16])
@pytest.mark.parametrize("head_dim,block_size", [(64, 16), (96, 32), (128, 64), (128, 16),
                                                 (80, 16), (80, 64), (48, 32), (16, 16)])
def test_amx_tiles_on_ragged_batches(group, head_dim, block_size):
    """bf16 q over bf16 KV on tiles: lengths ending mid-tile, mid-block, on a block, one
    token, and one long enough to be split into KV segments; within the bf16 bound."""
    lens = [1, 15, 17, block_size, 2 * block_size + 5, 700]
    q, k, v, tables, sl = make_case(group * 1000 + head_dim, lens, 2, group, head_dim,
                                    block_size, torch.bfloat16)
    assert cpu.attention_uses_amx(q.dtype, k.dtype, group, head_dim, block_size, isa=AMX)
    scale = head_dim**-0.5
    out = cpu.paged_decode_attention(q, k, v, tables, sl, scale, isa=AMX)
    oracle = dense_attention(q, k, v, tables, sl, scale)
    bound = 2.0**-8 * (v.float().abs().max().item() + oracle.abs()) + 1e-5
    assert ((out.double() - oracle).abs() - bound).max().item() <= 0


@pytest.mark.skipif(AMX is None, reason=f"this CPU has no amx (has {SUPPORTED})")
@pytest.mark.parametrize("head_dim,block_size", [(64, 16), (96, 32), (128, 64), (128, 16),
                                                 (80, 16), (80, 32), (16, 32)])
def test_amx_tiles_keep_an_fp32_query_to_fp32_precision(head_dim, block_size):
    """The serving case on tiles: q and the probabilities each as two bf16 parts keep the
    fp32 bound of test_fp32_queries_over_bf16_kv_keep_fp32_precision, with sharp scores
    (measured: a bf16 q alone misses it by ~40x, bf16 probabilities alone by ~8x)."""
    lens = [1, 37, 300, 16 * 20, 1100]
    q, k, v, tables, sl = make_case(head_dim + block_size, lens, 2, 8, head_dim, block_size,
                                    torch.bfloat16)
    q = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)) * 3
    assert cpu.attention_uses_amx(q.dtype, k.dtype, 8, head_dim, block_size, isa=AMX)
    out = cpu.paged_decode_attention(q, k, v, tables, sl, head_dim**-0.5, isa=AMX)
    err = (out.double() - dense_attention(q, k, v, tables, sl, head_dim**-0.5)).abs().max()
    assert err.item() <= 2e-4, err.item()


@pytest.mark.skipif(AMX is None, reason=f"this CPU has no amx (has {SUPPORTED})")
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_amx_tiles_never_read_past_a_sequence(q_dtype):
    """A tile reads 16 rows of its block whatever the sequence's length: the slots past it
    hold NaN here, and neither its scores nor its V rows may reach the output."""
    lens = [1, 3, 16 + 5, 45, 64]
    for head_dim, block_size in ((64, 16), (128, 32), (80, 16)):
        q, k, v, tables, sl = make_case(head_dim, lens, 2, 8, head_dim, block_size,
                                        torch.bfloat16)
        q = q.to(q_dtype)
        k_nan, v_nan = nan_past_lengths(k, v, tables, lens)
        out = cpu.paged_decode_attention(q, k_nan, v_nan, tables, sl, head_dim**-0.5, isa=AMX)
        ref = cpu.paged_decode_attention(q, k, v, tables, sl, head_dim**-0.5, isa=AMX)
        assert not out.isnan().any()
        assert torch.equal(out, ref)


@pytest.mark.skipif(AMX is None, reason=f"this CPU has no amx (has {SUPPORTED})")
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_amx_tiles_over_head_ranges_and_segments(threads, monkeypatch):
    """Few sequences: items over ranges of KV heads (5 over 2 ranges at 3 threads) and KV
    segments, each item configuring the tiles on its own thread."""
    monkeypatch.setattr(cpu, "_threads_override", threads)
    for hkv, lens in ((5, [1000]), (8, [40, 33, 17]), (1, [300, 5])):
        for q_dtype in (torch.float32, torch.bfloat16):
            q, k, v, tables, sl = make_case(hkv * 7, lens, hkv, 8, 64, 16, torch.bfloat16)
            q = q.to(q_dtype)
            out = cpu.paged_decode_attention(q, k, v, tables, sl, 0.125, isa=AMX)
            err = (out.double() - dense_attention(q, k, v, tables, sl, 0.125)).abs().max()
            assert err.item() <= (2e-4 if q_dtype == torch.float32 else TOL[q_dtype])
