"""Single-process generation over the staged model and one paged KV pool.

The foundation's executor: continuous batching (prefill the newly admitted, otherwise decode
every running request), recompute-preemption of the newest request when KV runs out. The
dual-engine runtime (worker processes, CPU tier) replaces it behind the same ``LLM`` API.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from dualpace.config import EngineConfig
from dualpace.kv.block_pool import BlockPool, BlockTable, blocks_for_tokens
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights
from dualpace.request import Request, find_stop_string
from dualpace.sampling.params import SamplingParams
from dualpace.sampling.sampler import sample
from dualpace.tokenizer.detokenizer import IncrementalDetokenizer
from dualpace.tokenizer.tokenizer import Tokenizer

# Default KV pool when --gpu-kv-blocks is not given: enough for max_num_seqs requests at the
# model length, capped at this many bytes.
_DEFAULT_KV_BYTES = 1 << 30
_PREFILL_TOKEN_BUDGET = 4096


def context_length_error(max_model_len: int, prompt_len: int, max_tokens: int) -> str:
    """vLLM's wording for a request that does not fit the model length."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        "completion."
    )


@dataclass
class _Running:
    req: Request
    table: BlockTable
    detok: IncrementalDetokenizer
    computed: int = 0  # tokens whose KV is in the cache


class InProcessEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        device = config.torch_device()
        dtype = config.torch_dtype(device)
        self.model_config = load_model_config(config.model)
        mc = self.model_config
        self.tokenizer = Tokenizer(config.model)
        self.max_model_len = config.max_model_len or mc.max_position_embeddings
        weights = load_weights(config.model, mc, dtype, device)
        self.model = StagedModel(mc, weights, self.max_model_len)
        bs = config.block_size
        block_bytes = 2 * mc.num_layers * mc.num_kv_heads * bs * mc.head_dim * dtype.itemsize
        wanted = config.max_num_seqs * blocks_for_tokens(self.max_model_len, bs)
        num_blocks = config.gpu_kv_blocks or max(1, min(wanted, _DEFAULT_KV_BYTES // block_bytes))
        self.pool = BlockPool(num_blocks, bs)
        self.kv = KVCache(mc.num_layers, num_blocks, mc.num_kv_heads, bs, mc.head_dim, dtype,
                          device)
        self.eos_ids = mc.eos_token_ids or (
            (self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ()
        )
        self._rng = random.Random()
        self._next_id = 0

    # --- requests ------------------------------------------------------------------------
    def make_request(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        if not prompt_ids:
            raise ValueError("prompt: must not be empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_ids if not (0 <= t < vocab)]
        if bad:
            raise ValueError(f"prompt: token id {bad[0]} is out of vocabulary (size {vocab})")
        room = self.max_model_len - len(prompt_ids)
        if (params.max_tokens is not None and params.max_tokens > room) or room < 1:
            raise ValueError(context_length_error(
                self.max_model_len, len(prompt_ids), params.max_tokens or 1))
        max_tokens = room if params.max_tokens is None else params.max_tokens
        peak = blocks_for_tokens(len(prompt_ids) + max_tokens, self.pool.block_size)
        if peak > self.pool.num_blocks:
            raise ValueError(
                f"request needs up to {peak} KV blocks but the pool has {self.pool.num_blocks}"
            )
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        self._next_id += 1
        return Request(f"req-{self._next_id}", list(prompt_ids), params, seed, max_tokens)

    # --- the loop ------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> dict[str, str]:
        """Generate until every request finishes; returns request id -> output text."""
        waiting: deque[Request] = deque(requests)
        running: list[_Running] = []
        texts: dict[str, str] = {}
        while waiting or running:
            admitted = self._admit(waiting, running)
            if admitted:
                self._step(admitted, prefill=True)
            else:
                self._make_room(running, waiting)
                self._step(running, prefill=False)
            for r in [r for r in running if r.req.finished]:
                r.table.release()
                running.remove(r)
                texts[r.req.request_id] = r.detok.text
        return texts

    def _admit(self, waiting: deque[Request], running: list[_Running]) -> list[_Running]:
        admitted: list[_Running] = []
        budget = _PREFILL_TOKEN_BUDGET
        while waiting and len(running) < self.config.max_num_seqs:
            req = waiting[0]
            n = req.num_tokens
            table = BlockTable(self.pool)
            if table.blocks_needed(n) > self.pool.num_free or (admitted and n > budget):
                break
            waiting.popleft()
            table.append(n)
            budget -= n
            run = _Running(req, table, IncrementalDetokenizer(self.tokenizer, req.prompt_ids))
            for t in req.output_ids:  # resumed after preemption: its text so far stands
                run.detok.add(t)
            running.append(run)
            admitted.append(run)
        return admitted

    def _make_room(self, running: list[_Running], waiting: deque[Request]) -> None:
        """Recompute-preempt the newest requests until every decode can append one token."""
        while sum(r.table.blocks_needed(r.table.num_tokens + 1) for r in running) > (
            self.pool.num_free
        ):
            victim = running.pop()
            victim.table.release()
            waiting.appendleft(victim.req)

    def _step(self, batch: list[_Running], prefill: bool) -> None:
        chunks = []
        for r in batch:
            if prefill:
                ids, start = r.req.all_ids, 0
            else:
                r.table.append(1)
                ids, start = [r.req.all_ids[-1]], r.req.num_tokens - 1
            chunks.append(SeqChunk(ids, start, r.table.blocks))
        fb = build_forward_batch(chunks, self.pool.block_size, self.model.device)
        logits = self.model.forward(fb, self.kv)
        tokens = sample(logits, [r.req.sampling_row() for r in batch])
        for r, tok in zip(batch, tokens):
            self._append_token(r, tok)

    def _append_token(self, r: _Running, token: int) -> None:
        req = r.req
        req.output_ids.append(token)
        reason = req.stop_on_token(token, self.eos_ids)
        new = r.detok.add(token)
        if reason is not None:
            new += r.detok.flush()
        if req.params.stop and new:
            at = find_stop_string(r.detok.text, req.params.stop, len(new))
            if at != -1:
                r.detok.text = r.detok.text[:at]
                reason = "stop"
        req.finish_reason = reason
