"""The GPU worker: GPU-main batches as FIFO stage tasks, Dense Assist at stage boundaries,
and KV migrations (paper §4.1, §4.2, §5; DESIGN.md §Processes).

A step runs its migrations first (swap-out GPU->host, swap-in host->GPU), then the forward:
pre-layer, each layer, post-layer. Between two stage tasks the worker serves a ready Dense
Assist before taking the next task (non-preemptive stage-boundary priority); when no assist
route is reachable it skips those checks (whole-forward mode). Prefill-to-CPU rows run as a
second sub-batch whose K/V go to a one-layer staging area and are copied layer by layer into
the request's reserved host blocks; the request is reported ready only after the last layer.
"""

from __future__ import annotations

import time

import torch

from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.stages import StagedModel
from dualpace.runtime.assist import AssistChannel, needs_group
from dualpace.runtime.device import DeviceOps
from dualpace.runtime.layouts import OP_ECHO, OP_POST_ATTN
from dualpace.runtime.protocol import GpuBatch, Migration, SeqStep, StepDone
from dualpace.runtime.tp_control import BOUNDARY, IDLE, DecisionLog
from dualpace.runtime.worker_state import RequestTable
from dualpace.sampling.sampler import sample


class StagingKV:
    """One layer's worth of KV blocks, presented to the stages as every layer's cache."""

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        k = torch.zeros(shape, dtype=dtype, device=device)
        v = torch.zeros(shape, dtype=dtype, device=device)
        self.k = [k] * num_layers
        self.v = [v] * num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size


class GpuWorker:
    def __init__(self, model: StagedModel, kv: KVCache, staging: StagingKV,
                 host_regions: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
                 head_map: list[tuple[int, int, int, int, int]],
                 assist: AssistChannel | None, assist_reachable: bool,
                 tp_rank: int = 0, tp_size: int = 1, decisions: DecisionLog | None = None):
        """``host_regions``: per CPU TP rank, the per-layer (K, V) views of its host-pool
        region; ``head_map``: where this rank's KV heads live in them (layouts.head_ranges)."""
        self.model = model
        self.kv = kv
        self.staging = staging
        self.host_regions = host_regions
        self.head_map = head_map
        self.assist = assist
        self.assist_reachable = assist_reachable and assist is not None
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.decisions = decisions
        q = model.cfg.q_size  # this rank's query columns of the full attention output
        self.q_cols = slice(tp_rank * q, (tp_rank + 1) * q)
        self.ops = DeviceOps(model.device)
        for k, v in host_regions:
            self.ops.register_host(k + v)
        self.requests = RequestTable()
        self.block_size = kv.block_size
        self.steps = 0
        self.assist_served = 0
        self.assist_busy_us = 0

    # --- Dense Assist ---------------------------------------------------------------------
    def boundary(self) -> None:
        """A stage boundary: serve a ready Dense Assist before the next main task (rank 0
        decides; the other ranks follow its published decision)."""
        if not self.assist_reachable:
            return
        if self.tp_rank == 0:
            ch = self.assist
            claimed = ch.ready() and ch.claim()
            if self.decisions is not None:
                self.decisions.publish(BOUNDARY, claimed and needs_group(ch.op.load()))
            if claimed:
                self._serve_claimed()
        elif self.decisions.next_boundary():
            self._run_assist(leader=False)

    def serve_assists(self) -> bool:
        """While idle: serve a waiting Dense Assist (any configuration: the profiler and
        benchmarks use the echo op even when no route is reachable)."""
        if self.assist is None:
            return False
        if self.tp_rank == 0:
            ch = self.assist
            if not (ch.ready() and ch.claim()):
                return False
            if self.decisions is not None and needs_group(ch.op.load()):
                self.decisions.publish(IDLE, True)
            self._serve_claimed()
            return True
        served = False
        while self.decisions.next_idle():
            self._run_assist(leader=False)
            served = True
        return served

    def _serve_claimed(self) -> None:
        ok = False
        t0 = time.perf_counter()
        try:
            self._run_assist(leader=True)
            ok = True
        finally:
            self.assist.finish(ok)
            self.assist_served += 1
            # GPU-main time displaced by assists: the profiler's disturbance d (Eq. 8).
            self.assist_busy_us += int((time.perf_counter() - t0) * 1e6)

    @torch.inference_mode()
    def _run_assist(self, leader: bool) -> None:
        ch, m = self.assist, self.model
        op, layer, rows = ch.op.load(), ch.layer.load(), ch.rows.load()
        if op == OP_ECHO:
            if leader:
                ch.buf["hidden_out"][:rows].copy_(ch.buf["hidden_in"][:rows])
            return
        h = ch.buf["hidden_in"][:rows].to(m.device, m.dtype)
        if needs_group(op):
            a = ch.buf["attn_in"][:rows, self.q_cols].to(m.device, m.dtype)
            h = m.post_attention(layer, h, a)  # all ranks: the O/down all-reduces
        if not leader:
            return
        if op == OP_POST_ATTN:
            ch.buf["hidden_out"][:rows].copy_(h.float())
            return
        tokens = sample(m.post_layer(h), ch.sampling_rows(rows))
        ch.buf["tokens_out"][:rows] = torch.tensor(tokens, dtype=torch.int64)

    # --- migrations -----------------------------------------------------------------------
    def _copy_layer(self, i: int, src_ids: list[int], dst_ids: list[int], to_host: bool,
                    kv=None) -> None:
        """One layer's blocks between this rank's pool (or staging) and the host regions."""
        kv = kv or self.kv
        for c, g0, g1, h0, h1 in self.head_map:
            hk, hv = self.host_regions[c]
            pairs = ((kv.k[i][:, g0:g1], hk[i][:, h0:h1]), (kv.v[i][:, g0:g1], hv[i][:, h0:h1]))
            for dev, host in pairs:
                if to_host:
                    self.ops.copy_blocks(dev, host, src_ids, dst_ids)
                else:
                    self.ops.copy_blocks(host, dev, src_ids, dst_ids)

    def _migrate(self, m: Migration, to_host: bool) -> None:
        nb = -(-m.num_tokens // self.block_size)
        src, dst = m.src_blocks[:nb], m.dst_blocks[:nb]
        if len(src) < nb or len(dst) < nb:
            raise ValueError(f"migration of request {m.req_id}: {m.num_tokens} tokens need {nb} "
                             f"blocks, got {len(m.src_blocks)} -> {len(m.dst_blocks)}")
        for i in range(self.model.cfg.num_layers):
            self._copy_layer(i, src, dst, to_host)
            self.boundary()

    # --- a GPU-main step ------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, msg: GpuBatch) -> StepDone:
        t0 = time.perf_counter()
        ready: list[int] = []
        for m in msg.swap_out:
            self._migrate(m, to_host=True)
            self.requests.set_blocks(m.req_id, [])
            ready.append(m.req_id)
        for m in msg.swap_in:
            self._migrate(m, to_host=False)
            self.requests.set_blocks(m.req_id, m.dst_blocks)
            ready.append(m.req_id)
        self.ops.synchronize()
        main = [s for s in msg.seqs if not s.host_blocks]
        to_cpu = [s for s in msg.seqs if s.host_blocks]
        tokens: dict[int, int] = {}
        if main:
            self.requests.apply_blocks(main)
            tokens.update(self._forward(main, self.kv, None))
        if to_cpu:
            tokens.update(self._forward(to_cpu, self.staging, self._staging_tables(to_cpu)))
            ready.extend(s.req_id for s in to_cpu)
        self.steps += 1
        return StepDone(
            step_id=msg.step_id,
            tokens=[tokens.get(id(s), -1) for s in msg.seqs],
            ready=ready,
            elapsed_us=int((time.perf_counter() - t0) * 1e6),
        )

    def _staging_tables(self, seqs: list[SeqStep]) -> list[list[int]]:
        bs, nxt, tables = self.block_size, 0, []
        for s in seqs:
            if s.start_pos != 0:
                raise ValueError(f"request {s.req_id}: Prefill-to-CPU takes a whole prompt "
                                 "in one step")
            nb = -(-len(s.token_ids) // bs)
            if len(s.host_blocks) < nb:
                raise ValueError(f"request {s.req_id}: {len(s.host_blocks)} host blocks for "
                                 f"{len(s.token_ids)} tokens")
            tables.append(list(range(nxt, nxt + nb)))
            nxt += nb
        if nxt > self.staging.num_blocks:
            raise ValueError(f"Prefill-to-CPU needs {nxt} staging blocks, "
                             f"the staging area has {self.staging.num_blocks}")
        return tables

    def _forward(self, seqs: list[SeqStep], kv, staging_tables) -> dict[int, int]:
        """Stage tasks of one sub-batch; returns id(seq) -> sampled token for sampling rows."""
        m = self.model
        if staging_tables is None:
            fb = self.requests.forward_batch(seqs, self.block_size, m.device)
        else:
            fb = build_forward_batch(
                [SeqChunk(s.token_ids, s.start_pos, t) for s, t in zip(seqs, staging_tables)],
                self.block_size, m.device)
        hidden = m.pre_layer(fb.input_ids)
        self.boundary()
        for i in range(m.cfg.num_layers):
            hidden = m.layer(i, hidden, fb, kv)
            if staging_tables is not None:  # this layer's K/V -> the reserved host blocks
                for s, t in zip(seqs, staging_tables):
                    self._copy_layer(i, t, s.host_blocks[:len(t)], to_host=True, kv=kv)
            self.boundary()
        if staging_tables is not None:
            self.ops.synchronize()
        sampling = [(j, s) for j, s in enumerate(seqs) if s.sample]
        if not sampling:
            return {}
        rows = fb.logits_indices[[j for j, _ in sampling]]
        toks = sample(m.post_layer(hidden[rows]),
                      self.requests.sampling_rows([s for _, s in sampling]))
        return {id(s): t for (_, s), t in zip(sampling, toks)}
