"""The staged model over paged KV equals transformers on the same weights (fp32)."""

from __future__ import annotations

import random

import pytest
import torch

from dualpace import LLM, SamplingParams
from dualpace.kv.block_pool import BlockPool, BlockTable
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights

from ..conftest import VOCAB, hf_greedy

# fp32 on both sides, different summation orders: logits (scale ~10) agree to ~1e-5.
LOGIT_ATOL = 2e-4
PROMPT_LENS = [1, 15, 16, 17, 33, 131]


def _prompts(seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in PROMPT_LENS]


def _staged(path, block_size: int, num_blocks: int = 64):
    cfg = load_model_config(path)
    model = StagedModel(cfg, load_weights(path, cfg, torch.float32), 2048)
    kv = KVCache(cfg.num_layers, num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim,
                 torch.float32)
    pool = BlockPool(num_blocks, block_size)
    pool.allocate(num_blocks)  # shuffle the free list: tables must not be contiguous
    ids = list(range(num_blocks))
    random.Random(7).shuffle(ids)
    pool.free(ids)
    return model, kv, pool


@pytest.mark.parametrize("block_size", [16, 32])
def test_ragged_prefill_and_decode_logits(hf_checkpoint, block_size):
    _, path, hf = hf_checkpoint
    model, kv, pool = _staged(path, block_size)
    prompts = _prompts()
    tables = []
    for p in prompts:
        t = BlockTable(pool)
        t.append(len(p))
        tables.append(t)
    batch = build_forward_batch(
        [SeqChunk(p, 0, t.blocks) for p, t in zip(prompts, tables)], block_size
    )
    logits = model.forward(batch, kv)
    with torch.no_grad():
        ref = [hf(torch.tensor([p])).logits[0, -1] for p in prompts]
    for i, r in enumerate(ref):
        torch.testing.assert_close(logits[i], r, atol=LOGIT_ATOL, rtol=0)

    # One decode step for every sequence at once (the decode attention path).
    nxt = [int(x) for x in logits.argmax(-1)]
    chunks = []
    for p, t, tok in zip(prompts, tables, nxt):
        t.append(1)
        chunks.append(SeqChunk([tok], len(p), t.blocks))
    logits2 = model.forward(build_forward_batch(chunks, block_size), kv)
    with torch.no_grad():
        for i, (p, tok) in enumerate(zip(prompts, nxt)):
            r = hf(torch.tensor([[*p, tok]])).logits[0, -1]
            torch.testing.assert_close(logits2[i], r, atol=LOGIT_ATOL, rtol=0)


def test_chunked_prefill_matches_whole_prefill(llama_checkpoint):
    path, hf = llama_checkpoint
    model, kv, pool = _staged(path, 16)
    prompt = _prompts()[-1]
    t = BlockTable(pool)
    t.append(len(prompt))
    model.forward(build_forward_batch([SeqChunk(prompt[:50], 0, t.blocks)], 16), kv)
    logits = model.forward(build_forward_batch([SeqChunk(prompt[50:], 50, t.blocks)], 16), kv)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(logits[0], ref, atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("block_size", [16, 32])
def test_greedy_generation_token_exact(hf_checkpoint, block_size):
    _, path, hf = hf_checkpoint
    prompts = _prompts(seed=3)
    n = 40
    with LLM(str(path), gpu_device="cpu", block_size=block_size, gpu_kv_blocks=96) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n,
                                                    ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert o.finish_reason == "length"
        assert o.token_ids == hf_greedy(hf, p, n)


def test_preemption_keeps_greedy_output(llama_checkpoint):
    """A KV pool too small for all requests at once: recompute-preemption changes nothing."""
    path, hf = llama_checkpoint
    prompts = _prompts(seed=5)[:4]
    n = 24
    with LLM(str(path), gpu_device="cpu", block_size=16, gpu_kv_blocks=14) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n,
                                                    ignore_eos=True))
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(hf, p, n)
