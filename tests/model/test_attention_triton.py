"""The Triton paged-attention kernels (model/attention_triton.py) against the torch reference:
ragged batches over shuffled block tables, GQA groups 1/4/8, head dims 64/80/128, block sizes
16/32, one and several KV splits, prefill chunks with cached context and mixed decode rows;
then a whole forward on them, token-exact against transformers. Without CUDA they run on CPU
tensors under Triton's interpreter (TRITON_INTERPRET=1, set before the kernels are imported):
that is how CI tests them."""

from __future__ import annotations

import os
import random

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from dualpace.model import attention_triton as at  # noqa: E402
from dualpace.model.attention_ref import (  # noqa: E402
    paged_decode_attention_ref,
    ragged_paged_attention,
)
from dualpace.model.config import load_model_config  # noqa: E402
from dualpace.model.stages import StagedModel  # noqa: E402
from dualpace.model.weights import load_weights  # noqa: E402

from ..conftest import VOCAB, hf_greedy  # noqa: E402
from .chunked_greedy import chunked_prefill_then_greedy  # noqa: E402

DEV = torch.device("cuda" if CUDA else "cpu")
NUM_BLOCKS = 48


def _pool(hkv: int, bs: int, d: int, lens: list[int], seed: int, dtype=torch.float32):
    """K/V pools with random contents and a shuffled block table per sequence."""
    g = torch.Generator().manual_seed(seed)
    n_blocks = max(NUM_BLOCKS, sum(-(-n // bs) for n in lens) + 8)  # small blocks need more
    k = torch.randn(n_blocks, hkv, bs, d, generator=g).to(DEV, dtype)
    v = torch.randn(n_blocks, hkv, bs, d, generator=g).to(DEV, dtype)
    free = list(range(n_blocks))
    random.Random(seed).shuffle(free)
    width = max(-(-n // bs) for n in lens) + 1  # padded tables, as build_forward_batch's
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    for i, n in enumerate(lens):
        for j in range(-(-n // bs)):
            tables[i, j] = free.pop()
    return k, v, tables.to(DEV)


SHAPES = [  # (query heads, KV heads, head dim): GQA groups 1, 4, 8
    pytest.param(4, 4, 64, id="group1-d64"),
    pytest.param(8, 2, 128, id="group4-d128"),
    pytest.param(16, 2, 64, id="group8-d64"),
    pytest.param(8, 2, 80, id="group4-d80"),
]


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("bs", [4, 16, 32])  # 4: a key tile spans 4 blocks
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_equals_the_reference(hq, hkv, d, bs, splits):
    lens = [1, 37, bs, 150, 2 * bs + 1]  # ragged: one token, exact blocks, long
    k, v, tables = _pool(hkv, bs, d, lens, seed=hq * d + bs)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(1)).to(DEV)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    got = at.paged_decode_attention(q, k, v, tables, seq_lens, d ** -0.5, splits=splits)
    ref = paged_decode_attention_ref(q, k, v, tables, seq_lens, d ** -0.5)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("bs", [8, 16, 32])  # 8: a key tile spans 2 blocks
def test_prefill_with_context_and_mixed_rows_equals_the_reference(hq, hkv, d, bs):
    # (new rows, context after them): whole prompts, a chunk after cached context, a
    # decode row, a chunk that ends mid-block; BLOCK_M 16 makes several row tiles.
    qlens, lens = [5, 20, 1, 33], [5, 70, 41, 33 + bs + 3]
    k, v, tables = _pool(hkv, bs, d, lens, seed=7 + d)
    q = torch.randn(sum(qlens), hq, d, generator=torch.Generator().manual_seed(2)).to(DEV)
    got = at.paged_prefill_attention(q, k, v, tables, qlens, lens, d ** -0.5, block_m=16)
    ref = ragged_paged_attention(q, k, v, tables, qlens, lens, d ** -0.5)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_half_precision_pools():
    """fp16 q and pools (bf16 on CUDA): fp32 accumulation, the reference within fp16 noise."""
    dtype = torch.bfloat16 if CUDA else torch.float16
    lens = [19, 64]
    k, v, tables = _pool(2, 16, 64, lens, seed=3, dtype=dtype)
    q = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(4)).to(DEV, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    got = at.paged_decode_attention(q, k, v, tables, seq_lens, 0.125, splits=2)
    ref = paged_decode_attention_ref(q.float(), k.float(), v.float(), tables, seq_lens, 0.125)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)


def test_bad_shapes_are_clear_errors():
    k, v, tables = _pool(3, 16, 64, [4], seed=0)
    q = torch.randn(1, 8, 64, device=DEV)
    with pytest.raises(ValueError, match="8 query heads do not group over 3 KV heads"):
        at.paged_decode_attention(q, k, v, tables, torch.tensor([4], dtype=torch.int32), 1.0)
    with pytest.raises(ValueError, match="query lengths sum to 3, q has 1 rows"):
        at.paged_prefill_attention(q[:, :6], k, v, tables, [3], [4], 1.0)


def test_split_count_rule():
    assert at.num_splits(1, 8, 512) == 16  # one sequence, long: as many as the merge takes
    assert at.num_splits(1, 8, 8) == 2  # at least 4 blocks a split
    assert at.num_splits(256, 8, 512) == 1  # the batch fills the device alone
    assert at.num_splits(4, 8, 512) == 9  # 2 x 132 programs over 32 (sequence, head) pairs


def test_whole_forward_on_triton_is_token_exact(llama_checkpoint):
    """Chunked prefill, then batched greedy decodes, every attention call through the
    Triton kernels: each sequence's tokens equal transformers' greedy continuation."""
    path, hf = llama_checkpoint
    cfg = load_model_config(str(path))
    model = StagedModel(cfg, load_weights(str(path), cfg, torch.float32, DEV), 512,
                        attention_backend="triton")
    assert model.decode_attention is at.paged_decode_attention
    prompts, outs = chunked_prefill_then_greedy(model, DEV)
    for p, o in zip(prompts, outs):
        assert o == hf_greedy(hf, p, len(o))


def test_served_by_a_gpu_worker_on_triton(llama_checkpoint, monkeypatch):
    """The backend reaches the GPU worker process (which inherits TRITON_INTERPRET off CUDA):
    prefills and GPU decodes of a small pool's worth of requests, token-exact."""
    from dualpace import LLM, SamplingParams

    monkeypatch.setenv("TRITON_INTERPRET", "0" if CUDA else "1")
    path, hf = llama_checkpoint
    rng = random.Random(12)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 21, 33, 2)]
    with LLM(str(path), gpu_device=DEV.type, dtype="float32", attention_backend="triton",
             gpu_kv_blocks=24, cpu_kv_gib=0.05, max_num_seqs=8) as llm:
        assert llm._serving.config.attention_backend == "triton"
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6,
                                                    ignore_eos=True))
        stats = llm._run(llm._serving.runtime.stats())
    calls = next(s for s in stats if s.kind == "gpu").attention_calls
    assert calls.get(at.__name__, 0) >= 5 * 3  # decodes and prefills, 3 layers each
    assert set(calls) == {at.__name__}, calls
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(hf, p, 6)


def test_start_up_check_passes_and_catches_a_broken_kernel(monkeypatch, caplog):
    import logging

    from dualpace.model.attention_check import check_backend, checked_backend

    log = logging.getLogger("test")
    assert check_backend("triton", DEV, torch.float32) is None
    assert checked_backend("triton", DEV, torch.float32, log) == "triton"
    monkeypatch.setattr(at, "paged_decode_attention",
                        lambda q, *a, **k: paged_decode_attention_ref(q, *a[:4], 1.0))
    assert check_backend("triton", DEV, torch.float32).startswith(
        "decode differs from the reference")

    def boom(*a, **k):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(at, "paged_decode_attention", boom)
    assert check_backend("triton", DEV, torch.float32) == \
        "RuntimeError: no kernel image is available"
    with caplog.at_level(logging.ERROR, logger="test"):
        assert checked_backend("triton", DEV, torch.float32, log) == "torch"
    assert "no kernel image is available" in caplog.text
