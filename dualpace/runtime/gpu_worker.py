"""The GPU worker: GPU-main batches as FIFO stage tasks, Dense Assist at stage boundaries,
and KV migrations (paper §4.1, §4.2, §5; DESIGN.md §Processes).

A step enqueues its migrations first (swap-out GPU->host, swap-in host->GPU), layer by layer,
on the copy engine (runtime/copies.py), then runs the forward: pre-layer, each layer,
post-layer; layer i waits only for the swaps' layer-i copies (it may write KV into blocks just
swapped out and reads blocks just swapped in), so later layers' copies overlap its compute.
Between two stage tasks the worker serves a ready Dense Assist before taking the next task
(non-preemptive stage-boundary priority); when no assist route is reachable it skips those
checks (whole-forward mode). Prefill-to-CPU rows run as a second sub-batch whose K/V go to a
double-buffered staging area, copied layer by layer into the request's reserved host blocks
(§4.1's layer-wise transfer): layer i's copy overlaps layer i+1's compute, and layer i+2
waits for it before reusing its buffer. Nothing is reported ready before every copy of the
step has landed.
"""

from __future__ import annotations

import collections
import itertools
import time

import torch

from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.stages import StagedModel
from dualpace.runtime.assist import AssistChannel, needs_group
from dualpace.runtime.copies import copy_engine
from dualpace.runtime.decode_graphs import DecodeGraphs
from dualpace.runtime.device import DeviceOps
from dualpace.runtime.layouts import (
    ASSIST_CPU_READY,
    OP_ECHO,
    OP_NEO_MID,
    OP_NEO_PRE,
    OP_POST_ATTN,
)
from dualpace.runtime.protocol import (
    GpuBatch,
    Migration,
    ProfileAssist,
    ProfileDone,
    SeqStep,
    StepDone,
    wire_logprobs,
)
from dualpace.runtime.stage_gate import StageGate
from dualpace.runtime.tp_control import BOUNDARY, IDLE, DecisionLog
from dualpace.runtime.worker_state import RequestTable
from dualpace.sampling.logprobs import prompt_logprobs
from dualpace.sampling.sampler import plain_greedy, sample_with_logprobs


class StagingKV:
    """Two layers' worth of KV blocks, presented to the stages as every layer's cache: layer
    i writes buffer i % 2, so layer i's copy to the host can run while layer i+1 computes."""

    BUFFERS = 2

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        ks = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.BUFFERS)]
        vs = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.BUFFERS)]
        self.k = [ks[i % self.BUFFERS] for i in range(num_layers)]
        self.v = [vs[i % self.BUFFERS] for i in range(num_layers)]
        self.num_blocks = num_blocks
        self.block_size = block_size


class GpuWorker:
    def __init__(self, model: StagedModel, kv: KVCache, staging: StagingKV,
                 host_regions: list[tuple[list[torch.Tensor], list[torch.Tensor]]],
                 head_map: list[tuple[int, int, int, int, int]],
                 channels: list[AssistChannel], assist_reachable: bool,
                 tp_rank: int = 0, tp_size: int = 1, decisions: DecisionLog | None = None,
                 copies=None, graphs: DecodeGraphs | None = None):
        """``host_regions``: per CPU TP rank, the per-layer (K, V) views of its host-pool
        region; ``head_map``: where this rank's KV heads live in them (layouts.head_ranges).
        ``channels``: the assist channels (Dense Assist uses the first; the gated pipeline's
        two CPU sub-batches one each); ``assist_reachable``: serve them at stage
        boundaries (else only while idle: the whole-forward path of §4.2). ``copies``: the
        host<->GPU copy engine (default: the device's; tests pass the deferred stand-in).
        ``graphs``: captured decode forwards (decode_graphs.py), or None: eager."""
        self.model = model
        self.kv = kv
        self.staging = staging
        self.host_regions = host_regions
        self.head_map = head_map
        self.channels = channels
        self.assist = channels[0] if channels else None
        self.assist_reachable = assist_reachable and bool(channels)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.decisions = decisions
        q = model.cfg.q_size  # this rank's query columns of the full attention output
        self.q_cols = slice(tp_rank * q, (tp_rank + 1) * q)
        kvs = model.cfg.kv_size  # ... and its k/v columns of a full QKV output
        self.kv_cols = slice(tp_rank * kvs, (tp_rank + 1) * kvs)
        self.boundary_served = 0  # assists served between two main stage tasks
        self.step_pauses = 0  # one-call decode steps' stops at a layer boundary (_pause)
        self.graphs = graphs
        self.graph_steps = 0  # decode steps replayed from graphs
        self.ops = DeviceOps(model.device)
        self.copies = copies if copies is not None else copy_engine(model.device)
        self.gate = StageGate(self.ops.record_event if self.ops.cuda else None,
                              self._serve_ready if tp_rank == 0 else None)
        self.requests = RequestTable()
        self.block_size = kv.block_size
        self.steps = 0
        self.assist_served = 0
        self.assist_busy_us = 0
        # [op, rows, cuda_us, launch_us, finalize_us] per served call (Appendix B's G, L, F;
        # the profiler drains them); bounded so a server that never drains stays small.
        self.assist_samples: collections.deque[list[int]] = collections.deque(maxlen=4096)

    # --- Dense Assist ---------------------------------------------------------------------
    def boundary(self) -> None:
        """A stage boundary: serve every ready assist before the next main task. On CUDA the
        boundary is a completion point (stage_gate.py): at most two main stages stay queued
        on the device, and assists that become ready meanwhile are served. Rank 0 decides
        and publishes, per call the group must join, the channel (index + 1), then 0 to end
        the boundary; the other ranks follow that sequence."""
        if not self.assist_reachable:
            return
        self.gate.stage_enqueued()
        if self.tp_rank == 0:
            self._serve_ready()
            if self.decisions is not None:
                self.decisions.publish(BOUNDARY, 0)
            return
        while True:
            kind, c = self.decisions.next_decision()
            if kind == BOUNDARY and c == 0:
                return
            self._run_assist(False, self.channels[c - 1])

    def _serve_ready(self) -> bool:
        """Rank 0 at a boundary: serve the assists ready now, publishing each group call."""
        served = False
        for idx, ch in enumerate(self.channels):
            if ch.ready() and ch.claim():
                if self.decisions is not None and needs_group(ch.op.load()):
                    self.decisions.publish(BOUNDARY, idx + 1)
                self.boundary_served += 1
                self._serve_claimed(ch)
                served = True
        return served

    def serve_assists(self) -> bool:
        """While idle: serve waiting assists (any configuration: the profiler and benchmarks
        use the echo op even when no route is reachable)."""
        if not self.channels:
            return False
        served = False
        if self.tp_rank == 0:
            for idx, ch in enumerate(self.channels):
                if ch.ready() and ch.claim():
                    if self.decisions is not None and needs_group(ch.op.load()):
                        self.decisions.publish(IDLE, idx + 1)
                    self._serve_claimed(ch)
                    served = True
            return served
        while (c := self.decisions.next_idle()) != 0:
            self._run_assist(False, self.channels[c - 1])
            served = True
        return served

    def _serve_claimed(self, ch: AssistChannel) -> None:
        """Serve the claimed call; record its CUDA execution G, the host launch time L (the
        rest of the time before the outputs are in place) and the finalization F (publishing
        GPU-Done), Appendix B's calibration intervals."""
        ok = False
        t0 = time.perf_counter()
        iv = self.ops.interval()
        op, rows = ch.op.load(), ch.rows.load()
        try:
            self._run_assist(True, ch, op, ch.layer.load(), rows, iv)
            ok = True
        finally:
            t1 = time.perf_counter()
            # Counted before GPU-Done is published: a caller that saw its result and then
            # reads the counters finds its call in them.
            self.assist_served += 1
            ch.finish(ok)
            t2 = time.perf_counter()
            # GPU-main time displaced by assists: the disturbance d (Eq. 8).
            self.assist_busy_us += int((t2 - t0) * 1e6)
            if ok:
                g = iv.seconds()
                self.assist_samples.append([op, rows, int(g * 1e6),
                                            int(max(t1 - t0 - g, 0.0) * 1e6),
                                            int((t2 - t1) * 1e6)])

    @torch.inference_mode()
    def profile_assist(self, msg: ProfileAssist) -> ProfileDone:
        """Appendix B's GPU microbenchmark g_x(b): the op's whole device path (input upload,
        kernels, output download) on the staged inputs, each repeat synchronized; every rank
        runs it (the op's all-reduces span the group) and reports its own times. The calls
        take ``msg.layers`` layers in turn from ``msg.layer``."""
        leader = self.tp_rank == 0
        if msg.layers < 1:
            raise ValueError(f"ProfileAssist: layers must be at least 1, got {msg.layers}")
        turns = itertools.cycle([(msg.layer + k) % self.model.cfg.num_layers
                                 for k in range(msg.layers)])

        def once() -> None:
            self._run_assist(leader, self.assist, msg.op, next(turns), msg.rows)

        for _ in range(msg.warmup):
            once()
        times = []
        for _ in range(msg.repeats):
            self.ops.wait_compute()
            t0 = time.perf_counter()
            for _ in range(msg.iters):
                once()
            self.ops.wait_compute()
            times.append(int((time.perf_counter() - t0) * 1e6))
        return ProfileDone(step_id=msg.step_id, repeat_us=times)

    @torch.inference_mode()
    def _run_assist(self, leader: bool, ch: AssistChannel, op: int | None = None,
                    layer: int = 0, rows: int = 0, iv=None) -> None:
        if op is None:  # a follower rank: the leader published the call in the words
            op, layer, rows = ch.op.load(), ch.layer.load(), ch.rows.load()
        if iv is not None:
            iv.start()
        self._assist_op(leader, ch, op, layer, rows)
        if iv is not None:
            iv.stop()

    def _assist_op(self, leader: bool, ch: AssistChannel, op: int, layer: int,
                   rows: int) -> None:
        m = self.model
        if op == OP_ECHO:
            if leader:
                ch.buf["hidden_out"][:rows].copy_(ch.buf["hidden_in"][:rows])
            return
        if op == OP_NEO_PRE:
            h = m.pre_layer(ch.buf["ids_in"][:rows].to(m.device, non_blocking=True))
        else:
            # Uploads from the page-locked Assist Buffer are asynchronous: the CPU side
            # rewrites it only after GPU-Done, which follows this call's (blocking) download.
            h = ch.buf["hidden_in"][:rows].to(m.device, m.dtype, non_blocking=True)
        if needs_group(op) and op != OP_NEO_PRE:
            a = ch.buf["attn_in"][:rows, self.q_cols].to(m.device, m.dtype, non_blocking=True)
            h = m.post_attention(layer, h, a)  # all ranks: the O/down all-reduces
        if op in (OP_NEO_PRE, OP_NEO_MID):  # the next layer's QKV, this rank's heads
            nxt = 0 if op == OP_NEO_PRE else layer + 1
            q, k, v = m.qkv(nxt, h, ch.buf["pos_in"][:rows].to(m.device, non_blocking=True))
            ch.buf["q_out"][:rows, self.q_cols].copy_(q.reshape(rows, -1).float())
            ch.buf["k_out"][:rows, self.kv_cols].copy_(k.reshape(rows, -1).float())
            ch.buf["v_out"][:rows, self.kv_cols].copy_(v.reshape(rows, -1).float())
            if leader:
                ch.buf["hidden_out"][:rows].copy_(h.float())
            if self.tp_size > 1:
                # Every rank wrote its own heads: none may publish GPU-Done (rank 0) before
                # all have, and a follower must read this call's words before the CPU can
                # post the next one. A one-element all-reduce, waited on, is that barrier.
                float(m.all_reduce(torch.ones(1, device=m.device)))
            return
        if not leader:
            return
        if op == OP_POST_ATTN:
            ch.buf["hidden_out"][:rows].copy_(h.float())
            return
        ch.write_outputs(*sample_with_logprobs(m.post_layer(h), ch.sampling_rows(rows)))

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
                    self.copies.to_host(dev, host, src_ids, dst_ids)
                else:
                    self.copies.to_device(host, dev, src_ids, dst_ids)

    def _blocks_to_move(self, m: Migration) -> tuple[list[int], list[int]]:
        nb = -(-m.num_tokens // self.block_size)
        src, dst = m.src_blocks[:nb], m.dst_blocks[:nb]
        if len(src) < nb or len(dst) < nb:
            raise ValueError(f"migration of request {m.req_id}: {m.num_tokens} tokens need {nb} "
                             f"blocks, got {len(m.src_blocks)} -> {len(m.dst_blocks)}")
        return src, dst

    def _issue_migrations(self, msg: GpuBatch) -> list:
        """Every swap of the step on the copy stream, layer by layer; returns fences[i], the
        point after which layer i of every swap has landed. The forward's layer i waits for
        fences[i] only (it writes KV into blocks just swapped out, reads blocks just swapped
        in): later layers' copies overlap its compute."""
        moves = ([(*self._blocks_to_move(m), True) for m in msg.swap_out]
                 + [(*self._blocks_to_move(m), False) for m in msg.swap_in])
        if not moves:
            return []
        fences = []
        for i in range(self.model.cfg.num_layers):
            for src, dst, to_host in moves:
                self._copy_layer(i, src, dst, to_host)
            fences.append(self.copies.fence())
            self.boundary()
        return fences

    # --- a GPU-main step ------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, msg: GpuBatch) -> StepDone:
        ready: list[int] = []
        mig_fences = self._issue_migrations(msg)
        for m in msg.swap_out:
            self.requests.set_blocks(m.req_id, [])
            ready.append(m.req_id)
        for m in msg.swap_in:
            self.requests.set_blocks(m.req_id, m.dst_blocks)
            ready.append(m.req_id)
        self.requests.apply_outputs(msg.seqs)
        self.requests.resolve_previous(msg.seqs)
        main = [s for s in msg.seqs if not s.host_blocks]
        to_cpu = [s for s in msg.seqs if s.host_blocks]
        tokens: dict[int, tuple] = {}
        plps: dict[int, list] = {}
        if main:
            self.requests.apply_blocks(main)
            tokens.update(self._forward(main, self.kv, None, plps, mig_fences))
            if mig_fences:  # a fork's destination may be a block just swapped out
                self.copies.compute_waits(mig_fences[-1])
            self._copy_forks(main)
        if to_cpu:
            tokens.update(self._forward(to_cpu, self.staging, self._staging_tables(to_cpu),
                                        plps))
            ready.extend(s.req_id for s in to_cpu)
            ready.extend(f.req_id for s in to_cpu for f in s.forks)
        # Ready means the CPU tier may read the host blocks: every copy must have landed.
        self.copies.synchronize()
        self.gate.drain()  # the step's results were read: its stages are done
        self.steps += 1
        out = [tokens.get(id(s), (-1, None)) for s in msg.seqs]
        self.requests.record_sampled(msg.seqs, [t for t, _ in out])
        return StepDone(step_id=msg.step_id, tokens=[t for t, _ in out],
                        logprobs=wire_logprobs([lp for _, lp in out]), ready=ready,
                        prompt_logprobs=([wire_logprobs(plps.get(id(s), [])) for s in msg.seqs]
                                         if plps else []))

    def _copy_forks(self, seqs: list[SeqStep]) -> None:
        """Parallel sampling: the prompt's KV, just written, into each sibling's GPU blocks
        (every layer; the siblings' first decodes read it)."""
        for s in seqs:
            if not s.forks:
                continue
            nb = -(-(s.start_pos + len(s.token_ids)) // self.block_size)
            src = self.requests.get(s.req_id).blocks[:nb]
            for f in s.forks:
                if len(f.blocks) < nb or len(src) < nb:
                    raise ValueError(f"fork of request {s.req_id} into {f.req_id}: {nb} blocks "
                                     f"needed, {len(src)} -> {len(f.blocks)}")
                for i in range(self.model.cfg.num_layers):
                    self.ops.copy_within(self.kv.k[i], src, f.blocks[:nb])
                    self.ops.copy_within(self.kv.v[i], src, f.blocks[:nb])

    def _staging_tables(self, seqs: list[SeqStep]) -> list[list[int]]:
        bs, nxt, tables = self.block_size, 0, []
        for s in seqs:
            if s.start_pos != 0:
                raise ValueError(f"request {s.req_id}: Prefill-to-CPU takes a whole prompt "
                                 "in one step")
            nb = -(-len(s.token_ids) // bs)
            for rid, blocks in [(s.req_id, s.host_blocks),
                                *((f.req_id, f.blocks) for f in s.forks)]:
                if len(blocks) < nb:
                    raise ValueError(f"request {rid}: {len(blocks)} host blocks for "
                                     f"{len(s.token_ids)} tokens")
            tables.append(list(range(nxt, nxt + nb)))
            nxt += nb
        if nxt > self.staging.num_blocks:
            raise ValueError(f"Prefill-to-CPU needs {nxt} staging blocks, "
                             f"the staging area has {self.staging.num_blocks}")
        return tables

    def _forward(self, seqs: list[SeqStep], kv, staging_tables,
                 plps: dict[int, list], mig_fences=()) -> dict[int, tuple]:
        """Stage tasks of one sub-batch; returns id(seq) -> (sampled token, its logprobs or
        None) for sampling rows, and puts id(seq) -> the chunk's prompt logprobs in
        ``plps`` for seqs that asked (``next_token`` > -2). ``mig_fences[i]``: the step's
        swaps of layer i, which layer i must wait for."""
        m = self.model
        if staging_tables is None:
            fb = self.requests.forward_batch(seqs, self.block_size, m.device)
        else:
            fb = build_forward_batch(
                [SeqChunk(s.token_ids, s.start_pos, t) for s, t in zip(seqs, staging_tables)],
                self.block_size, m.device)
        if (staging_tables is None and self.graphs is not None
                and all(s.next_token == -2 for s in seqs) and self.graphs.prepare(fb)):
            hidden = self._replay(fb, mig_fences)
        else:
            # every row samples and none wants prompt logprobs: the embedding, the LM head
            # and greedy rows' argmax in the layers' call (StagedModel.decode_logits)
            fused = rows = None
            if (all(s.sample and s.next_token == -2 for s in seqs)
                    and self._one_native_call(fb, staging_tables, mig_fences)):
                rows = self.requests.sampling_rows(seqs)
                fused = m.decode_logits(fb, kv, self._pause(), plain_greedy(rows))
            if fused is not None:
                self.boundary()
                toks, lps = sample_with_logprobs(fused[0], rows, fused[1])
                return {id(s): (t, lp) for s, t, lp in zip(seqs, toks, lps)}
            hidden = self._eager(m.pre_layer(fb.input_ids), fb, kv, staging_tables, seqs,
                                 mig_fences)
        return self._outputs(seqs, fb, hidden, plps)

    def _replay(self, fb, mig_fences) -> torch.Tensor:
        """A decode step from the captured graphs: per stage, with the same boundaries and
        swap fences as the eager path (whole forward: every swap landed first)."""
        g = self.graphs
        if mig_fences and not g.per_stage:
            self.copies.compute_waits(mig_fences[-1])
        for k in range(g.num_stages):
            if mig_fences and g.per_stage and k > 0:
                self.copies.compute_waits(mig_fences[k - 1])
            g.run_stage(k)
            self.boundary()
        m = self.model
        key = m.decode_attention.__module__
        m.attention_calls[key] = m.attention_calls.get(key, 0) + m.cfg.num_layers
        self.graph_steps += 1
        return g.output(fb.num_rows)

    def _one_native_call(self, fb, staging_tables, mig_fences) -> bool:
        """Whether the step's layers run as one native call (StagedModel.decode_layers):
        no swap to wait for between layers, a batch that call takes. With assists
        reachable (one rank) the call returns at a layer boundary where an assist request
        waits, the boundary serves it and the call goes on (``_pause``): the per-layer
        boundaries of ``_eager``'s loop, at a native call's cost per layer (on this
        project's 2-core box the loop's Python per layer was ~1.6 ms of a 7.6 ms
        single-stream step)."""
        return (staging_tables is None and not mig_fences
                and self.model.runs_decode_rows(fb)
                and (not self.assist_reachable or self.decisions is None))

    def _pause(self) -> tuple | None:
        """The native call's pause words (NativeStages.decode_layers), after serving what
        waits now; None where no assist is reachable."""
        if not self.assist_reachable:
            return None
        self.boundary()
        return [ch.state for ch in self.channels], ASSIST_CPU_READY, self._serve_paused

    def _serve_paused(self) -> None:
        """The one-call step stopped at a layer boundary, an assist word raised: serve it."""
        self.step_pauses += 1
        self.boundary()

    def _eager(self, hidden, fb, kv, staging_tables, seqs, mig_fences) -> torch.Tensor:
        m = self.model
        if self._one_native_call(fb, staging_tables, mig_fences):
            hidden = m.decode_layers(hidden, fb, kv, self._pause())[0]
            self.boundary()
            return hidden
        self.boundary()
        fences = []  # staging only: fences[i] covers layer i's copies out of its buffer
        for i in range(m.cfg.num_layers):
            if mig_fences:
                self.copies.compute_waits(mig_fences[i])
            if staging_tables is not None and i >= StagingKV.BUFFERS:
                # Layer i overwrites the buffer layer i-2 filled: its copies must be done.
                self.copies.compute_waits(fences[i - StagingKV.BUFFERS])
            hidden = m.layer(i, hidden, fb, kv)
            if staging_tables is not None:  # this layer's K/V -> the reserved host blocks
                for s, t in zip(seqs, staging_tables):  # (and n > 1 siblings' blocks)
                    for dst in [s.host_blocks, *(f.blocks for f in s.forks)]:
                        self._copy_layer(i, t, dst[:len(t)], to_host=True, kv=kv)
                fences.append(self.copies.fence())
            self.boundary()
        return hidden

    def _outputs(self, seqs, fb, hidden, plps: dict[int, list]) -> dict[int, tuple]:
        m = self.model
        want = [j for j, s in enumerate(seqs) if s.next_token > -2]
        last = fb.logits_indices.tolist() if want else []  # a device sync: only when asked
        for j in want:
            s = seqs[j]
            targets = s.token_ids[1:] + ([s.next_token] if s.next_token >= 0 else [])
            first = last[j] - len(s.token_ids) + 1
            k = self.requests.get(s.req_id).sampling.prompt_logprobs
            plps[id(s)] = prompt_logprobs(m.post_layer, hidden[first:], targets, max(k, 0))
        sampling = [(j, s) for j, s in enumerate(seqs) if s.sample]
        if not sampling:
            return {}
        rows = fb.logits_indices[[j for j, _ in sampling]]
        toks, lps = sample_with_logprobs(m.post_layer(hidden[rows]),
                                         self.requests.sampling_rows([s for _, s in sampling]))
        return {id(s): (t, lp) for (_, s), t, lp in zip(sampling, toks, lps)}
