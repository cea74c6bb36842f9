"""The CPU worker: whole decode iterations over host-resident KV (paper §4.2, Fig. 6 lower
lane), with post-attention routed by π_{P,F}(b) (Eq. 5).

The local prefix (pre-layer; per layer pre-attention, KV append into the host pool, paged
attention with the cext kernel) always runs here, so the CPU engine never waits for the GPU
scheduler. Then by route: Full-CPU runs every post-attention stage and the post-layer
locally; Split-Final runs the layers locally and assists the post-layer (with sampling);
Fused-Assist assists every post-attention stage, the last one fused with the post-layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dualpace.model.stages import StagedModel
from dualpace.runtime.assist import AssistChannel
from dualpace.runtime.layouts import (
    OP_NEO_MID,
    OP_NEO_PRE,
    OP_POST_ATTN,
    OP_POST_ATTN_FINAL,
    OP_POST_LAYER,
)
from dualpace.runtime.protocol import CpuBatch, StepDone, wire_logprobs
from dualpace.runtime.routing import (
    FULL_CPU,
    FUSED_ASSIST,
    NEO_PIPELINE,
    ROUTES,
    SPLIT_FINAL,
    route_for,
)
from dualpace.runtime.worker_state import RequestTable
from dualpace.sampling.sampler import plain_greedy, sample_with_logprobs


class HostKV:
    """The host pool's per-layer views, in the shape the stages expect of a KV cache."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], block_size: int):
        self.k, self.v, self.block_size = k, v, block_size


class CpuWorker:
    def __init__(self, model: StagedModel, kv: HostKV, channels: list[AssistChannel],
                 thresholds: tuple[int, int], gpu_alive: Callable[[], bool],
                 tp_rank: int = 0, tp_size: int = 1, forced_route: str = ""):
        """Under CPU tensor parallelism every rank runs the same batch over its KV heads
        (``kv`` is its region of the host pool); the model all-reduces its row-parallel
        projections, and Dense Assist calls gather every rank's attention columns.
        ``channels``: Dense Assist uses the first, the gated pipeline one per sub-batch.
        ``forced_route``: the policy's route for every batch ("" = Eq. 5 per batch size)."""
        self.model = model
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.kv = kv
        self.channels = channels
        self.assist = channels[0] if channels else None
        self.p, self.f = thresholds
        self.forced_route = forced_route
        self.gpu_alive = gpu_alive
        self.requests = RequestTable()
        self.steps = 0
        self.assist_calls = 0
        self.routes = {FULL_CPU: 0, SPLIT_FINAL: 0, FUSED_ASSIST: 0, NEO_PIPELINE: 0}

    def route(self, batch_size: int) -> str:
        r = route_for(batch_size, self.p, self.f)
        return FULL_CPU if self.assist is None else r

    def run(self, msg: CpuBatch) -> StepDone:
        if not msg.seqs:  # an empty step: answered at once (ring round-trip probes)
            return StepDone(step_id=msg.step_id)
        self.requests.resolve_previous(msg.seqs)
        done = self._run(msg)
        self.requests.record_sampled(msg.seqs, done.tokens)
        return done

    @torch.inference_mode()
    def _run(self, msg: CpuBatch) -> StepDone:
        m = self.model
        if any(len(s.token_ids) != 1 for s in msg.seqs):
            raise ValueError("a CPU batch holds decode rows only (one token per request)")
        self.requests.apply_blocks(msg.seqs)
        self.requests.apply_outputs(msg.seqs)
        rows = self.requests.sampling_rows(msg.seqs)
        if self.forced_route and msg.route not in ("", self.forced_route):
            raise ValueError(f"route {msg.route!r}: this worker's policy forces "
                             f"{self.forced_route!r}")
        route = msg.route or self.forced_route or self.route(len(msg.seqs))
        if route == NEO_PIPELINE:  # its sub-batches build their own forward batches
            return self._run_pipelined(msg, rows)
        fb = self.requests.forward_batch(msg.seqs, self.kv.block_size, m.device)
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}; expected one of {ROUTES}")
        if route != FULL_CPU and self.assist is None:
            raise ValueError(f"route {route!r} needs a Dense Assist channel")
        calls = 0
        n = m.cfg.num_layers
        tokens, lps = None, []
        attn_s = 0.0
        # Full-CPU and Split-Final run every layer here: one native call where it applies
        # (StagedModel.decode_layers; Full-CPU's with the embedding, LM head and greedy
        # argmax in it, decode_logits); Fused-Assist hands each layer's post-attention over
        fused = m.decode_logits(fb, self.kv, greedy=plain_greedy(rows)) \
            if route == FULL_CPU else None
        if fused is not None:
            logits, greedy, attn_s = fused
            tokens, lps = sample_with_logprobs(logits, rows, greedy)
            hidden = None
        else:
            hidden = m.pre_layer(fb.input_ids)
            if route == SPLIT_FINAL:
                fused = m.decode_layers(hidden, fb, self.kv)
                if fused is not None:
                    hidden, attn_s = fused
        for i in range(0 if fused is None else n, n):
            q = m.pre_attention(i, hidden, fb, self.kv)
            ta = time.perf_counter()
            attn = m.attention(i, q, fb, self.kv)
            attn_s += time.perf_counter() - ta
            if route != FUSED_ASSIST:
                hidden = m.post_attention(i, hidden, attn)
            elif i < n - 1:
                hidden = self._assist(OP_POST_ATTN, i, hidden, attn, None)
                calls += 1
            else:
                tokens, lps = self._assist(OP_POST_ATTN_FINAL, i, hidden, attn, rows)
                calls += 1
        last = hidden[fb.logits_indices] if tokens is None else None
        if route == FULL_CPU and tokens is None:
            tokens, lps = sample_with_logprobs(m.post_layer(last), rows)
        elif route == SPLIT_FINAL:
            tokens, lps = self._assist(OP_POST_LAYER, n - 1, last, None, rows)
            calls += 1
        self.steps += 1
        self.assist_calls += calls
        self.routes[route] += 1
        return StepDone(step_id=msg.step_id, tokens=tokens, logprobs=wire_logprobs(lps),
                        route=route, assist_calls=calls, attn_us=int(attn_s * 1e6))

    def _run_pipelined(self, msg: CpuBatch, rows) -> StepDone:
        """The gated baseline's CPU step as NEO runs it (paper §3.1, Figure 4): the GPU runs
        every dense stage (embedding, QKV, post-attention, post-layer) of both CPU
        sub-batches between its own stage tasks, the CPU appends their K/V to the host pool
        and attends. The sub-batches alternate on two assist channels, so one's dense work
        on the GPU overlaps the CPU attention over the other's KV."""
        if len(self.channels) < 2:
            raise ValueError("route 'neo-pipeline' needs two assist channels")
        m, n = self.model, self.model.cfg.num_layers
        if not 0 <= msg.split <= len(msg.seqs):
            raise ValueError(f"split {msg.split} outside the batch of {len(msg.seqs)}")
        parts = [(0, msg.split), (msg.split, len(msg.seqs))]
        subs = []
        for (lo, hi), ch in zip(parts, self.channels):
            if lo < hi:
                sfb = self.requests.forward_batch(msg.seqs[lo:hi], self.kv.block_size,
                                                  m.device)
                subs.append((sfb, rows[lo:hi], ch))
        rank, size, alive = self.tp_rank, self.tp_size, self.gpu_alive
        for sfb, _, ch in subs:
            ch.post(OP_NEO_PRE, 0, None, None, None, rank, size, positions=sfb.positions,
                    ids=sfb.input_ids)
        ops = [OP_NEO_PRE] * len(subs)
        calls, attn_s = len(subs), 0.0
        hq, hkv, d = m.cfg.num_heads, m.cfg.num_kv_heads, m.cfg.head_dim
        for i in range(n):
            for j, (sfb, srows, ch) in enumerate(subs):
                b = sfb.num_rows
                hidden, q, k, v = ch.collect(ops[j], b, alive, rank=rank, size=size)
                dt = m.dtype
                m.append_kv(i, k.view(b, hkv, d).to(dt), v.view(b, hkv, d).to(dt), sfb,
                            self.kv)
                ta = time.perf_counter()
                attn = m.attention(i, q.view(b, hq, d).to(dt), sfb, self.kv)
                attn_s += time.perf_counter() - ta
                ops[j] = OP_NEO_MID if i < n - 1 else OP_POST_ATTN_FINAL
                ch.post(ops[j], i, hidden, attn.float(), srows if i == n - 1 else None, rank,
                        size, positions=sfb.positions)
                calls += 1
        tokens, lps = [], []
        for (sfb, _, ch), op in zip(subs, ops):
            t, lp = ch.collect(op, sfb.num_rows, alive, rank=rank, size=size)
            tokens += t
            lps += lp
        self.steps += 1
        self.assist_calls += calls
        self.routes[NEO_PIPELINE] += 1
        return StepDone(step_id=msg.step_id, tokens=tokens, logprobs=wire_logprobs(lps),
                        route=NEO_PIPELINE,
                        assist_calls=calls, attn_us=int(attn_s * 1e6))

    def _assist(self, op, layer, hidden, attn, rows):
        out = self.assist.call(op, layer, hidden.float(), None if attn is None else attn.float(),
                               rows, self.gpu_alive, rank=self.tp_rank, size=self.tp_size)
        return out.to(self.model.dtype) if op == OP_POST_ATTN else out
