"""The C causal prefill attention (cext/prefill_attention*.{c,h}) against the torch reference
in float64 on each vector path: every KV dtype, GQA groups 1/4/8, head dims 64/80/96/128,
block sizes 16/32/64, ragged batches whose rows start after cached context, past its key
chunk (256 keys) and its work item (96 query vectors); rows that do not depend on the
thread count; the refusals; and where serving takes it."""

from __future__ import annotations

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.model.attention_ref import ragged_paged_attention

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

from dualpace.kernels import prefill_attention as pfa  # noqa: E402

SUPPORTED = cpu_kernels.supported_isas() if cpu_kernels.available() else []
PATHS = [pytest.param(i, marks=pytest.mark.skipif(
    i not in SUPPORTED, reason=f"this CPU has no {i} (has {SUPPORTED})"))
    for i in ("avx2", "avx512")]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _case(Hq, Hkv, D, bs, qlens, ctxs, dtype, seed=0):
    """q, k, v, tables, seq_lens over a shuffled pool with a spare block at each end."""
    g = torch.Generator().manual_seed(seed)
    lens = [q + c for q, c in zip(qlens, ctxs)]
    nbs = [-(-n // bs) for n in lens]
    pool = sum(nbs) + 2
    perm = torch.randperm(pool, generator=g)[1:]
    tables = torch.zeros(len(qlens), max(nbs), dtype=torch.int32)
    used = 0
    for i, n in enumerate(nbs):
        tables[i, :n] = perm[used:used + n]
        used += n
    k = torch.randn(pool, Hkv, bs, D, generator=g).to(dtype)
    v = torch.randn(pool, Hkv, bs, D, generator=g).to(dtype)
    q = torch.randn(sum(qlens), Hq, D, generator=g)
    return q, k, v, tables, lens


def _ref(q, k, v, tables, qlens, lens, scale):
    return ragged_paged_attention(q.double(), k.double(), v.double(), tables, qlens, lens,
                                  scale)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group,D,bs", [(1, 64, 16), (4, 128, 32), (8, 96, 64), (4, 80, 16),
                                        (1, 128, 64), (8, 64, 32)])
def test_matches_the_reference(isa, dtype, group, D, bs):
    Hkv = 2
    # a whole prompt past one key chunk and several items, a chunk after cached context
    # longer than a key chunk, one row (a decode row in a mixed batch), a short prompt
    qlens, ctxs = [300, 37, 1, 5], [0, 290, 700, 0]
    q, k, v, tables, lens = _case(group * Hkv, Hkv, D, bs, qlens, ctxs, dtype)
    scale = D ** -0.5
    got = pfa.paged_prefill_attention(q, k, v, tables, qlens, lens, scale, isa=isa)
    assert got.shape == q.shape and got.dtype == torch.float32
    err = (got.double() - _ref(q, k, v, tables, qlens, lens, scale)).abs().max().item()
    assert err < 2e-5, err


@pytest.mark.parametrize("isa", PATHS)
def test_bf16_q_and_empty_sequences(isa):
    """A bf16 q is computed in fp32 and returned in bf16; a sequence with no new rows
    (query length 0) writes nothing and shifts nobody's rows."""
    qlens, ctxs = [3, 0, 20], [10, 16, 0]
    q, k, v, tables, lens = _case(8, 2, 64, 16, qlens, ctxs, torch.bfloat16, seed=1)
    q16 = q.to(torch.bfloat16)
    got = pfa.paged_prefill_attention(q16, k, v, tables, qlens, lens, 0.125, isa=isa)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    ref = _ref(q16.float(), k, v, tables, qlens, lens, 0.125)
    assert (got.double() - ref).abs().max().item() < 1e-2


@pytest.mark.parametrize("isa", PATHS)
def test_rows_do_not_depend_on_the_thread_count(isa, monkeypatch):
    """Each output row is one item's (no merge across threads): bit-identical on 1 and 3
    threads."""
    qlens, ctxs = [200, 150], [0, 400]
    q, k, v, tables, lens = _case(16, 4, 128, 16, qlens, ctxs, torch.float32, seed=2)
    outs = []
    for threads in (1, 3):
        monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
        outs.append(pfa.paged_prefill_attention(q, k, v, tables, qlens, lens, 0.1, isa=isa))
    assert torch.equal(outs[0], outs[1])


def test_the_causal_mask_is_exact():
    """Row r sees keys <= its position and nothing after: changing a later key's K and V
    leaves every earlier row bit-identical, and changes the rows that see it."""
    isa = SUPPORTED[-1] if SUPPORTED[-1] in cpu_kernels.GEMM_ISAS else None
    if isa is None:
        pytest.skip(f"no vector path on this CPU (has {SUPPORTED})")
    q, k, v, tables, lens = _case(4, 4, 64, 16, [40], [0], torch.float32, seed=3)
    a = pfa.paged_prefill_attention(q, k, v, tables, [40], lens, 0.125, isa=isa)
    blk, off = int(tables[0, 25 // 16]), 25 % 16
    k[blk, :, off] += 3.0
    v[blk, :, off] -= 2.0
    b = pfa.paged_prefill_attention(q, k, v, tables, [40], lens, 0.125, isa=isa)
    assert torch.equal(a[:25], b[:25])
    assert (a[25:] != b[25:]).any(dim=-1).all()


def test_refusals():
    q, k, v, tables, lens = _case(8, 2, 64, 16, [4, 3], [2, 0], torch.float32)
    isa = next((i for i in SUPPORTED if i in cpu_kernels.GEMM_ISAS), None)
    if isa is None:
        pytest.skip(f"no vector path on this CPU (has {SUPPORTED})")

    def call(**kw):
        args = dict(q=q, k_cache=k, v_cache=v, block_tables=tables, query_lens=[4, 3],
                    seq_lens=lens, scale=0.125, isa=isa)
        args.update(kw)
        return pfa.paged_prefill_attention(**args)

    bad_table = tables.clone()
    bad_table[0, 0] = k.shape[0]
    with pytest.raises(ValueError, match="block_tables: a block id"):
        call(block_tables=bad_table)
    with pytest.raises(ValueError, match="seq_lens"):
        call(seq_lens=[3, 3])  # shorter than its 4 new rows
    with pytest.raises(ValueError, match="seq_lens"):
        call(seq_lens=[lens[0], 10 * 16])  # past its blocks
    with pytest.raises(ValueError, match="query_lens"):
        call(query_lens=[4, 4])
    with pytest.raises(ValueError, match="head_dim"):
        call(q=q[..., :48].contiguous())
    with pytest.raises(ValueError, match="query heads"):
        call(q=q[:, :7].contiguous())
    with pytest.raises(ValueError, match="scale"):
        call(scale=float("nan"))
    with pytest.raises(ValueError, match="v_cache"):
        call(v_cache=v.to(torch.bfloat16))
    with pytest.raises(ValueError, match="no 'scalar' path"):
        call(isa="scalar")


def test_serving_takes_it_on_vector_paths_only(monkeypatch):
    """The "torch" backend's prefill on CPU picks per call: the C kernel where the ISA path
    has it and the head dim suits it, else the reference (the scalar path; head dim 72);
    other devices take the reference."""
    from dualpace.model import stages

    _, prefill = stages.attention_functions("torch", torch.device("cpu"))
    assert prefill is pfa.prefill_attention
    assert stages.default_prefill_attention(torch.device("meta")) is ragged_paged_attention
    took = []
    monkeypatch.setattr(pfa, "paged_prefill_attention", lambda *a, **k: took.append("c"))
    monkeypatch.setattr(pfa, "ragged_paged_attention", lambda *a, **k: took.append("ref"))
    q, k, v, tables, lens = _case(4, 2, 64, 16, [5], [3], torch.float32)
    q72 = torch.zeros(5, 4, 72)
    for path, D, want in (("avx2", 64, "c"), ("avx512", 64, "c"), ("amx", 64, "c"),
                          ("scalar", 64, "ref"), ("avx2", 72, "ref")):
        monkeypatch.setattr(cpu_kernels, "resolve_isa", lambda isa=None, p=path: p)
        took.clear()
        prefill(q if D == 64 else q72, k, v, tables, [5], lens, 0.125)
        assert took == [want], (path, D)
