"""The FlashInfer backend (model/attention_flashinfer.py): its page table (pure Python,
checked against the block tables the torch reference reads); the backend itself on CPU over a
stand-in of FlashInfer's wrappers (fake_flashinfer.py, which attends from the CSR it is
planned with): decode and prefill against the reference on ragged shuffled tables, one plan
per step, a whole forward token-exact against transformers, decode graphs re-planned per
replay; and, on CUDA with flashinfer installed, the real library against the reference
(skipped elsewhere; never counted as passed)."""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import sys

import pytest
import torch

if not torch.cuda.is_available():  # Triton (the fallback) runs interpreted on CPU tensors
    os.environ["TRITON_INTERPRET"] = "1"

from dualpace.kv.cache import KVCache
from dualpace.model import attention_flashinfer as afi
from dualpace.model.attention_flashinfer import paged_csr, query_indptr
from dualpace.model.attention_ref import (
    paged_decode_attention_ref,
    ragged_paged_attention,
)
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights
from dualpace.runtime.decode_graphs import (
    DecodeGraphs,
    PaddedDecodeInputs,
    capture_sizes,
)

from ..conftest import VOCAB, hf_greedy
from . import fake_flashinfer
from .chunked_greedy import chunked_prefill_then_greedy


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
    # blocks smaller than Triton's tiles: the torch reference, not Triton
    assert attention_check.checked_backend("flashinfer", dev, torch.float32,
                                           logging.getLogger("test"), block_size=8) == "torch"


# --- the backend on CPU, over the stand-in of FlashInfer's wrappers -------------------------
CPU = torch.device("cpu")
NUM_BLOCKS = 48


@pytest.fixture
def fake_fi(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())


def _ragged(hkv: int, bs: int, d: int, qlens: list[int], lens: list[int], seed: int):
    """K/V pools with random contents, a batch over shuffled blocks (padded tables)."""
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(NUM_BLOCKS, hkv, bs, d, generator=g) for _ in range(2))
    free = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(free)
    chunks = [SeqChunk([0] * q, n - q, [free.pop() for _ in range(-(-n // bs))])
              for q, n in zip(qlens, lens)]
    return k, v, build_forward_batch(chunks, bs)


SHAPES = [  # (query heads, KV heads, head dim): GQA groups 1, 4, 8
    pytest.param(4, 4, 64, id="group1-d64"),
    pytest.param(8, 2, 128, id="group4-d128"),
    pytest.param(16, 2, 64, id="group8-d64"),
]


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("bs", [16, 32])
def test_decode_equals_the_reference_with_one_plan_a_step(fake_fi, hq, hkv, d, bs):
    lens = [1, 37, bs, 150, 2 * bs + 1]  # ragged: one token, exact blocks, long
    k, v, fb = _ragged(hkv, bs, d, [1] * len(lens), lens, seed=hq * d + bs)
    fi = afi.FlashInferAttention(CPU, hq, hkv, d, bs)
    assert fi.tensor_cores == (hq // hkv >= 4)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(1))
    ref = paged_decode_attention_ref(q, k, v, fb.block_tables, fb.seq_lens, d ** -0.5)
    for _ in range(3):  # three layers of one step: one plan
        torch.testing.assert_close(fi(q, k, v, fb, d ** -0.5), ref, atol=2e-5, rtol=1e-4)
    assert fi.plans == 1 and fi.decode.plans == 1 and fi.prefill.plans == 0
    _, _, other = _ragged(hkv, bs, d, [1], [9], seed=5)
    fi(q[:1], k, v, other, d ** -0.5)
    assert fi.plans == 2  # the next step's batch is planned again


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("bs", [16, 32])
def test_prefill_with_context_and_mixed_rows_equals_the_reference(fake_fi, hq, hkv, d, bs):
    # whole prompts, a chunk after cached context, a decode row, a chunk ending mid-block
    qlens, lens = [5, 20, 1, 33], [5, 70, 41, 33 + bs + 3]
    k, v, fb = _ragged(hkv, bs, d, qlens, lens, seed=7 + d)
    fi = afi.FlashInferAttention(CPU, hq, hkv, d, bs)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(2))
    got = fi(q, k, v, fb, d ** -0.5)
    ref = ragged_paged_attention(q, k, v, fb.block_tables, qlens, lens, d ** -0.5)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    assert fi.prefill.plans == 1 and fi.decode.plans == 0


def test_the_stand_in_attends_from_the_csr_alone(fake_fi, monkeypatch):
    """A page table that drops the last-page lengths (every page full) gives other outputs:
    the tests above would catch a wrong CSR, as a GPU would."""
    k, v, fb = _ragged(2, 16, 64, [1, 1], [20, 7], seed=3)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(4))
    ref = paged_decode_attention_ref(q, k, v, fb.block_tables, fb.seq_lens, 0.125)
    real = afi.paged_csr
    monkeypatch.setattr(afi, "paged_csr", lambda b, n, bs: (*real(b, n, bs)[:2],
                                                            [bs] * len(n)))
    got = afi.FlashInferAttention(CPU, 8, 2, 64, 16)(q, k, v, fb, 0.125)
    assert not torch.allclose(got, ref, atol=1e-3)


def _fi_model(path, dtype=torch.float32) -> StagedModel:
    cfg = load_model_config(str(path))
    return StagedModel(cfg, load_weights(str(path), cfg, dtype, CPU), 512,
                       attention_backend="flashinfer")


def test_whole_forward_on_flashinfer_is_token_exact(fake_fi, llama_checkpoint):
    """Chunked prefill, then batched greedy decodes, every attention call through the
    FlashInfer backend, one plan per forward: transformers' greedy continuations."""
    path, hf = llama_checkpoint
    model = _fi_model(path)
    fi = model.decode_attention
    assert isinstance(fi, afi.FlashInferAttention) and model.prefill_attention is fi
    prompts, outs = chunked_prefill_then_greedy(model, CPU)
    assert fi.plans == 7 and fi.prefill.plans == 2 and fi.decode.plans == 5
    for p, o in zip(prompts, outs):
        assert o == hf_greedy(hf, p, len(o))


@pytest.mark.parametrize("per_stage", [True, False], ids=["per-stage", "whole-forward"])
def test_decode_graphs_replan_the_buckets_page_table_for_every_replay(fake_fi, llama_checkpoint,
                                                                      per_stage):
    """Two different decode batches in one bucket (3 rows of 4), replayed after capture:
    each equals its eager forward, so the bucket's static page table was planned for each
    (the stand-in's graph wrapper reads its buffers at run, as a captured kernel does)."""
    path, _ = llama_checkpoint
    model = _fi_model(path)
    cfg, fi = model.cfg, model.decode_attention
    kv = KVCache(cfg.num_layers, 13, cfg.num_kv_heads, 16, cfg.head_dim, torch.float32, CPU)
    for t in (*kv.k, *kv.v):
        t.normal_()
    graphs = DecodeGraphs(model, kv, PaddedDecodeInputs(8, 4, 12, 16, CPU), capture_sizes(8),
                          per_stage=per_stage)
    graphs.capture()
    assert sorted(fi.graph_wrappers) == [1, 2, 4, 8]
    assert all(w.is_cuda_graph_enabled for w in fi.graph_wrappers.values())
    batches = [[SeqChunk([5], 20, [3, 7]), SeqChunk([9], 0, [11]), SeqChunk([1], 33, [0, 4, 8])],
               [SeqChunk([2], 40, [9, 1, 6]), SeqChunk([7], 3, [10]), SeqChunk([3], 17, [2, 5])]]
    for chunks in batches:
        saved = [t.clone() for t in (*kv.k, *kv.v)]
        eager = model.forward(build_forward_batch(chunks, 16), kv)
        for t, s in zip((*kv.k, *kv.v), saved):
            t.copy_(s)
        plans = fi.graph_wrappers[4].plans
        assert graphs.prepare(build_forward_batch(chunks, 16)) and graphs.bucket == 4
        assert fi.graph_wrappers[4].plans == plans + 1
        for k in range(graphs.num_stages):
            graphs.run_stage(k)
        replayed = model.post_layer(graphs.output(3))
        torch.testing.assert_close(replayed, eager, atol=1e-5, rtol=0)
    # A batch without host-side block lists cannot be planned: it runs eagerly.
    fb = build_forward_batch(batches[0], 16)
    fb.block_ids_list = None
    assert not graphs.prepare(fb)


def test_a_graph_wrapper_is_planned_only_for_its_own_batch_size(fake_fi):
    fi = afi.FlashInferAttention(CPU, 8, 2, 64, 16)
    fi.graph_wrapper(4, 16)
    with pytest.raises(ValueError, match="a graph bucket of 4 rows planned with 3"):
        fi.plan_graph(4, None, [[1]] * 3, [1] * 3, torch.float32, torch.float32, 0.1)
    with pytest.raises(ValueError, match="no graph wrapper for 2 rows"):
        fi.plan_graph(2, None, [[1]] * 2, [1] * 2, torch.float32, torch.float32, 0.1)


def test_the_start_up_check_passes_on_the_stand_in_and_catches_a_wrong_page_table(
        fake_fi, monkeypatch):
    from dualpace.model.attention_check import check_backend, checked_backend

    log = logging.getLogger("test")
    assert check_backend("flashinfer", CPU, torch.float32) is None
    assert checked_backend("flashinfer", CPU, torch.float32, log) == "flashinfer"
    monkeypatch.setattr(afi, "query_indptr", lambda qlens: [0] + [sum(qlens)] * len(qlens))
    assert check_backend("flashinfer", CPU, torch.float32).startswith(
        "ValueError: sequence 0: 45 query rows")


@pytest.mark.parametrize("per_stage", [True, False], ids=["per-stage", "whole-forward"])
def test_a_gpu_worker_on_flashinfer_replays_graphs_beside_interleaved_migrations(
        fake_fi, llama_checkpoint, per_stage):
    """The GPU worker's own paths on the backend (in process, on CPU): random steps of
    prefills, decodes, swaps and Prefill-to-CPU on a worker whose copies land late and whose
    pure decode steps replay FlashInfer graphs, against an eager worker with synchronous
    copies on the same backend: the same tokens, the same KV in both pools."""
    from ..runtime.test_async_copies import (
        BS,
        DeferredCopies,
        EagerCopies,
        _assert_same_kv,
        _Engine,
        _worker,
    )

    path, _ = llama_checkpoint
    cfg = load_model_config(str(path))
    model = StagedModel(cfg, load_weights(str(path), cfg, torch.float32, CPU), 256,
                        attention_backend="flashinfer", block_size=BS)
    rng = random.Random(21 + per_stage)
    eager = _worker(model, EagerCopies())
    late = _worker(model, DeferredCopies(), (per_stage,))
    eng = _Engine([eager, late])
    for _ in range(5):
        eng.add([rng.randrange(VOCAB) for _ in range(rng.randint(3, 14))])
    for _ in range(6):
        eng.step(rng)
        _assert_same_kv(eager, late)
    if not any(r.where == "gpu" for r in eng.reqs):
        eng.step(rng, admit=True)
    for _ in range(3):
        eng.step(rng, decode_only=True)
        _assert_same_kv(eager, late)
    assert late.graph_steps >= 3 and eager.graph_steps == 0
    calls = late.model.attention_calls
    assert set(calls) == {afi.__name__}, calls


def test_the_graphs_start_up_check_passes_and_catches_a_stale_page_table(fake_fi,
                                                                          llama_checkpoint):
    """DecodeGraphs.check replays a ragged batch against the eager forward: it passes on a
    correct capture, leaves the blocks it used zeroed, and reports a replay that was not
    re-planned (the bucket still holds the capture's all-padding page table)."""
    path, _ = llama_checkpoint
    model = _fi_model(path)
    cfg = model.cfg
    kv = KVCache(cfg.num_layers, 13, cfg.num_kv_heads, 16, cfg.head_dim, torch.float32, CPU)
    graphs = DecodeGraphs(model, kv, PaddedDecodeInputs(8, 4, 12, 16, CPU), capture_sizes(8),
                          per_stage=False)
    graphs.capture()
    assert graphs.check(1e-3) is None
    assert all(t[:12].abs().sum() == 0 for t in (*kv.k, *kv.v))  # all but the scratch
    real = graphs._plan
    graphs._plan = lambda rows, block_ids, seq_lens: real(rows, [[12]] * rows, [1] * rows)
    reason = graphs.check(1e-3)
    assert reason.startswith("a replayed decode batch of 3 rows (bucket 4) differs"), reason
