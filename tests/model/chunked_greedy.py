"""The whole-forward workload the attention backends' token-exact tests share: three prompts
(one prefilled in two chunks, the second over cached context) and five batched greedy
decode steps through ``model.forward`` on a 40-block pool."""

from __future__ import annotations

import random

import torch

from dualpace.kv.block_pool import BlockPool, BlockTable
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch

from ..conftest import VOCAB


def chunked_prefill_then_greedy(model, device: torch.device, steps: int = 5
                                ) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, each prompt's greedy outputs: 1 + ``steps`` tokens); ``model.forward`` runs
    1 + 1 + ``steps`` times."""
    cfg = model.cfg
    kv = KVCache(cfg.num_layers, 40, cfg.num_kv_heads, 16, cfg.head_dim, torch.float32,
                 device)
    pool = BlockPool(40, 16)
    rng = random.Random(9)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 17, 40)]
    tables = [BlockTable(pool) for _ in prompts]
    for t, p in zip(tables, prompts):
        t.append(len(p))
    # The long prompt in two chunks: the second attends over cached context.
    model.forward(build_forward_batch([SeqChunk(prompts[2][:24], 0, tables[2].blocks)], 16,
                                      device), kv)
    chunks = [SeqChunk(prompts[0], 0, tables[0].blocks),
              SeqChunk(prompts[1], 0, tables[1].blocks),
              SeqChunk(prompts[2][24:], 24, tables[2].blocks)]
    logits = model.forward(build_forward_batch(chunks, 16, device), kv)
    outs = [[int(t)] for t in logits.argmax(-1)]
    for _ in range(steps):
        step = []
        for p, t, o in zip(prompts, tables, outs):
            t.append(1)
            step.append(SeqChunk([o[-1]], len(p) + len(o) - 1, t.blocks))
        logits = model.forward(build_forward_batch(step, 16, device), kv)
        for o, tok in zip(outs, logits.argmax(-1)):
            o.append(int(tok))
    return prompts, outs
