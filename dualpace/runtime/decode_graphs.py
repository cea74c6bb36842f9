"""CUDA graphs for GPU decode steps (issue 12; vLLM captures decode the same way).

A decode step's launches cost more host time than its kernels take at small batches, so the
GPU worker captures the decode forward once per batch-size bucket (vLLM's capture sizes up to
``--max-num-seqs``) over static input buffers, and replays it: a batch is padded up to its
bucket with rows that read and write only a scratch KV block the engine never hands out.

- Whole-forward graphs (embedding through the last layer) when no Dense Assist route is
  reachable (C <= F, §4.2): nothing needs the host between layers.
- Per-stage graphs otherwise (the embedding, then one graph per layer), so the worker keeps
  its stage boundaries between replays and still serves assists there.

The LM head and sampling run eagerly on the captured hidden rows (sampling parameters vary
per request). ``--enforce-eager`` turns graphs off. Capture needs the Triton or the FlashInfer
attention backend: the torch reference decode syncs with the host (``int(seq_lens.max())``).
FlashInfer's kernels read a page table planned on the host, so an attention that has
``plan_graph`` (model/attention_flashinfer.py) gets one decode wrapper per bucket over static
page-table buffers, planned for the padded batch before the capture and before every replay.

After capture, ``check`` replays one ragged decode batch and compares it with the eager
forward; a worker whose graphs disagree serves eagerly (worker_main.py): neither the graphs
nor FlashInfer's planning could be checked on hardware in CI.

Off CUDA a "graph" is the recorded stage itself, re-run on the static buffers at replay: the
same padding, buckets and stage order, so the worker's graph path is tested on CPU.
"""

from __future__ import annotations

import logging
import time

import torch

from dualpace.model.batch import ForwardBatch, SeqChunk, build_forward_batch

log = logging.getLogger("dualpace.runtime")

# How far replayed hidden rows may be from the eager forward's, relative to their largest
# value: the same kernels, but the bucket's padded shapes may take other GEMM tilings.
GRAPH_CHECK_TOL = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's decode capture sizes: 1, 2, 4, then every multiple of 8, up to (and always
    including) ``max_num_seqs``."""
    sizes = {s for s in (1, 2, 4) if s <= max_num_seqs}
    sizes.update(range(8, max_num_seqs + 1, 8))
    sizes.add(max_num_seqs)
    return sorted(sizes)


def bucket_for(rows: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds ``rows`` (None: larger than every graph)."""
    for s in sizes:
        if s >= rows:
            return s
    return None


class PaddedDecodeInputs:
    """Static decode inputs for ``max_rows`` rows and block tables ``max_blocks`` wide. A
    batch fills the first rows; the rest of its bucket become padding rows: token 0 at
    position 0, written to and attending over only ``scratch_block`` (context length 1)."""

    def __init__(self, max_rows: int, max_blocks: int, scratch_block: int, block_size: int,
                 device: torch.device):
        self.max_rows, self.max_blocks = max_rows, max_blocks
        self.scratch_block, self.block_size = scratch_block, block_size
        self.device = device

        def z(*shape, dtype):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = z(max_rows, dtype=torch.int64)
        self.positions = z(max_rows, dtype=torch.int64)
        self.slot_mapping = z(max_rows, dtype=torch.int64)
        self.block_tables = z(max_rows, max_blocks, dtype=torch.int32)
        self.seq_lens = z(max_rows, dtype=torch.int32)
        self.logits_indices = torch.arange(max_rows, dtype=torch.int64, device=device)
        self.pad_all()

    def pad(self, lo: int, hi: int) -> None:
        """Rows lo..hi become padding rows."""
        self.input_ids[lo:hi] = 0
        self.positions[lo:hi] = 0
        self.slot_mapping[lo:hi] = self.scratch_block * self.block_size
        self.block_tables[lo:hi] = 0
        self.block_tables[lo:hi, 0] = self.scratch_block
        self.seq_lens[lo:hi] = 1

    def pad_all(self) -> None:
        self.pad(0, self.max_rows)

    def view(self, rows: int) -> ForwardBatch:
        """The first ``rows`` rows as a decode batch (what a graph of that size captured)."""
        return ForwardBatch(
            input_ids=self.input_ids[:rows], positions=self.positions[:rows],
            slot_mapping=self.slot_mapping[:rows], block_tables=self.block_tables[:rows],
            seq_lens=self.seq_lens[:rows], logits_indices=self.logits_indices[:rows],
            query_lens_list=[1] * rows, seq_lens_list=[1] * rows)

    def fill(self, fb: ForwardBatch, bucket: int) -> ForwardBatch:
        """Copy a decode batch into the buffers, pad it to ``bucket`` rows, return the view."""
        b = fb.num_rows
        if not fb.is_decode or b > bucket or bucket > self.max_rows:
            raise ValueError(f"a decode batch of {b} rows does not fit bucket {bucket} of "
                             f"{self.max_rows}")
        width = fb.block_tables.shape[1]
        if width > self.max_blocks:
            raise ValueError(f"block tables {width} wide, the graphs hold {self.max_blocks}")
        self.input_ids[:b].copy_(fb.input_ids, non_blocking=True)
        self.positions[:b].copy_(fb.positions, non_blocking=True)
        self.slot_mapping[:b].copy_(fb.slot_mapping, non_blocking=True)
        self.block_tables[:b, :width].copy_(fb.block_tables, non_blocking=True)
        self.block_tables[:b, width:] = 0
        self.seq_lens[:b].copy_(fb.seq_lens, non_blocking=True)
        # Rows b..bucket may hold an earlier, larger batch's rows: make them padding again.
        self.pad(b, bucket)
        return self.view(bucket)


class _Replayed:
    """Off CUDA: a stage recorded as a call, run again at each replay."""

    def __init__(self, fn):
        self.replay = fn


class DecodeGraphs:
    """Captured decode forwards per bucket. ``run_stage(k)`` replays stage k of the bucket
    chosen by ``prepare``: with ``per_stage`` the stages are the embedding and each layer;
    without it, stage 0 is the whole forward."""

    def __init__(self, model, kv, inputs: PaddedDecodeInputs, sizes: list[int],
                 per_stage: bool):
        self.model, self.kv, self.inputs = model, kv, inputs
        self.sizes = sizes
        self.per_stage = per_stage
        self.num_stages = 1 + model.cfg.num_layers if per_stage else 1
        self.hidden = torch.zeros((inputs.max_rows, model.cfg.hidden_size), dtype=model.dtype,
                                  device=model.device)
        self.graphs: dict[int, list] = {}  # bucket -> its stages' graphs
        self.views: dict[int, ForwardBatch] = {}  # bucket -> the static batch it captured
        self.pool = None
        self.bucket = 0
        att = model.decode_attention
        self.planner = att if hasattr(att, "plan_graph") else None  # FlashInfer

    def _plan(self, rows: int, block_ids: list[list[int]], seq_lens: list[int]) -> None:
        """Plan bucket ``rows``'s page table (FlashInfer) for these rows, padding included."""
        if self.planner is not None:
            self.planner.plan_graph(rows, self.views[rows], block_ids, seq_lens,
                                    self.model.dtype, self.kv.k[0].dtype, self.model.scale)

    def _bind(self, rows: int) -> ForwardBatch:
        """Bucket ``rows``'s static batch, all padding, planned (FlashInfer) as such."""
        self.inputs.pad_all()
        fb = self.views[rows] = self.inputs.view(rows)
        if self.planner is not None:
            self.planner.graph_wrapper(rows, rows * self.inputs.max_blocks)
        self._plan(rows, [[self.inputs.scratch_block]] * rows, [1] * rows)
        return fb

    def _stage(self, k: int, fb: ForwardBatch, rows: int) -> None:
        m, h = self.model, self.hidden[:rows]
        if not self.per_stage:
            x = m.pre_layer(fb.input_ids)
            for i in range(m.cfg.num_layers):
                x = m.layer(i, x, fb, self.kv)
            h.copy_(x)
        elif k == 0:
            h.copy_(m.pre_layer(fb.input_ids))
        else:
            h.copy_(m.layer(k - 1, h, fb, self.kv))

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest bucket first (vLLM's order: smaller graphs reuse its pool's memory)."""
        if self.model.device.type != "cuda":
            for rows in self.sizes:
                fb = self._bind(rows)
                self.graphs[rows] = [_Replayed(lambda k=k, fb=fb, rows=rows:
                                               self._stage(k, fb, rows))
                                     for k in range(self.num_stages)]
            return
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            for rows in sorted(self.sizes, reverse=True):
                fb = self._bind(rows)
                for k in range(self.num_stages):  # warm-up: Triton compiles, cuBLAS plans
                    self._stage(k, fb, rows)
                torch.cuda.synchronize(self.model.device)
                graphs = []
                for k in range(self.num_stages):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool, stream=stream):
                        self._stage(k, fb, rows)
                    if self.pool is None:
                        self.pool = g.pool()
                    graphs.append(g)
                self.graphs[rows] = graphs
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        self.inputs.pad_all()
        log.warning("captured decode CUDA graphs for %d batch sizes (%s, %d per size) in "
                    "%.1f s", len(self.sizes), "per stage" if self.per_stage else
                    "whole forward", self.num_stages, time.perf_counter() - t0)

    @torch.inference_mode()
    def check(self, tol: float) -> str | None:
        """Replay a decode batch of up to 3 ragged rows over pool blocks (before serving: no
        request owns any yet) in a bucket with padding, against the eager forward of the same
        rows; None when the hidden rows agree within ``tol`` (relative to their largest
        value), else why not. The blocks are zeroed again afterwards."""
        bs, inp = self.inputs.block_size, self.inputs
        rows = min(3, self.sizes[-1])
        lens = [min((i + 1) * bs // 2 + 1, inp.max_blocks * bs) for i in range(rows)]
        need = [-(-n // bs) for n in lens]
        if sum(need) > inp.scratch_block:  # a pool too small to hold the batch
            return None
        firsts = [sum(need[:i]) for i in range(rows)]
        blocks = [list(range(f, f + k))[::-1] for f, k in zip(firsts, need)]  # not in order
        used = [b for bl in blocks for b in bl]
        g = torch.Generator().manual_seed(0)
        for t in (*self.kv.k, *self.kv.v):
            t[used] = torch.randn(t[used].shape, generator=g).to(t.device, t.dtype)
        chunks = [SeqChunk([(7 * i + 3) % 100], n - 1, bl)
                  for i, (n, bl) in enumerate(zip(lens, blocks))]
        fb = build_forward_batch(chunks, bs, self.model.device)
        try:
            m = self.model
            x = m.pre_layer(fb.input_ids)
            for i in range(m.cfg.num_layers):
                x = m.layer(i, x, fb, self.kv)
            if not self.prepare(fb):
                return f"no graph holds a decode batch of {rows} rows"
            for k in range(self.num_stages):
                self.run_stage(k)
            got = self.output(rows).float()
            err = (got - x.float()).abs().max().item()
            scale = x.float().abs().max().item()
        finally:
            for t in (*self.kv.k, *self.kv.v):
                t[used] = 0
            self.inputs.pad_all()
        if not err <= tol * max(scale, 1.0):  # also catches NaN
            return (f"a replayed decode batch of {rows} rows (bucket {self.bucket}) differs "
                    f"from the eager forward by {err:.3g} (largest value {scale:.3g})")
        return None

    def prepare(self, fb: ForwardBatch) -> bool:
        """Load a decode batch into the static inputs; False when no graph holds it."""
        bucket = bucket_for(fb.num_rows, self.sizes)
        if (bucket is None or not fb.is_decode
                or fb.block_tables.shape[1] > self.inputs.max_blocks
                or (self.planner is not None and fb.block_ids_list is None)):
            return False
        self.inputs.fill(fb, bucket)
        if self.planner is not None:
            pad = bucket - fb.num_rows
            self._plan(bucket, fb.block_ids_list + [[self.inputs.scratch_block]] * pad,
                       fb.seq_lens_list + [1] * pad)
        self.bucket = bucket
        return True

    def run_stage(self, k: int) -> None:
        self.graphs[self.bucket][k].replay()

    def output(self, rows: int) -> torch.Tensor:
        """The last layer's hidden rows of the replayed batch (its first ``rows``)."""
        return self.hidden[:rows]
