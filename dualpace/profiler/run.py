"""``dualpace profile``: serving-shaped micro-benchmarks, then the controls (paper §4.3,
Appendix B): post-attention routing thresholds (P, F), the GPU batched-token limit, the CPU
decode batch limit and the CPU dense dtype. Writes the profile JSON ``serve --profile``
reads and PNG charts in the shape of the paper's Figure 7.

Appendix B as written, in four measurements:

1. CPU primitives, in this process pinned to the CPU worker's cores with its thread count:
   t_p (post-attention), t_l (post-layer with sampling), and the Assist Buffer movement
   a_w (residual + attention output in), a_r (hidden state out), h_w (Split-Final's final
   hidden state in), on the real shared-memory buffer. W warm-ups, then R repeats of I
   timed calls; with CPU tensor parallelism each rank's shard is timed and a repeat's
   latency is the slowest rank's (Eq. 10-11). Repeat j of every batch size and primitive
   is one round (``interleaved_rounds``). Each call of t_p takes the model's next layer, as
   do ProfileAssist's and the one-layer sweeps' below (``layer_turns``): one layer timed
   over and over reads its weights from the cache, which no serving step does.
2. GPU microbenchmarks g_p, g_lS, g_lA: each assist op's whole device path on the GPU worker
   (ProfileAssist), every GPU rank timing its own repeats; the maximum over ranks (Eq. 10).
   Repeat j of every batch size and path is one round, as for the primitives.
3. End-to-end calibration with GPU-main busy: the GPU worker decodes a synthetic population
   step after step (boundaries active) while this process, standing in for the CPU worker,
   issues assist calls of every path and batch row, each after a pause drawn over one
   GPU-main step (a serving step's calls are not locked to GPU-main's boundaries; the
   paper does not say how its calibration calls are spaced, see ``issue_spaced``); per
   call the CPU-visible wait W and the GPU worker's G, L, F give q_x and o_x (Eq. 12-13),
   so the stage-boundary wait is real. p's calls take the layers in turn too.
4. Eq. 14-15 combine them into the Eq. 7-8 components; Algorithm 1 picks (P, F).

The GPU batched-token limit comes from one decoder layer's prefill over (B, L) shapes with at
least K distinct n = B·L (isotonic fit, plateau rule); the CPU batch limit from one layer's
decode throughput over batch sizes up to 256, all of them measured in the same rounds
(``interleaved_rounds``), and the peak taken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import math
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from dualpace.config import EngineConfig
from dualpace.kv.block_pool import blocks_for_tokens
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import Shard, load_weights
from dualpace.profile_file import PROFILE_FORMAT
from dualpace.profiler.calibration import (
    PATHS,
    CalibrationCall,
    assist_terms,
    calibration_constants,
    components,
    profiled_latency,
)
from dualpace.profiler.fitting import choose_thresholds, pava, peak_batch, plateau_limit
from dualpace.profiler.fitting import route_scores as score_routes
from dualpace.resolved import resolve
from dualpace.runtime import protocol as P
from dualpace.runtime.assist import AssistChannel, pid_alive
from dualpace.runtime.layouts import DTYPES, OP_POST_ATTN, OP_POST_ATTN_FINAL, OP_POST_LAYER
from dualpace.runtime.routing import assist_reachable, route_for
from dualpace.runtime.supervisor import Runtime
from dualpace.sampling.sampler import SamplingRow, sample

log = logging.getLogger("dualpace.profile")
PATH_OPS = {"p": OP_POST_ATTN, "lS": OP_POST_LAYER, "lA": OP_POST_ATTN_FINAL}
PRIMITIVES = ("t_p", "t_l", "a_w", "a_r", "h_w")


@dataclasses.dataclass(frozen=True)
class ProfileSettings:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # (B, L) prefill shapes: n = B·L takes 7 distinct values (the plateau rule needs K).
    prefill_shapes: tuple[tuple[int, int], ...] = (
        (1, 64), (1, 128), (2, 64), (1, 256), (2, 128), (4, 64), (1, 512), (2, 256),
        (4, 128), (1, 1024), (2, 512), (4, 256), (8, 128), (2, 1024), (4, 512), (8, 256),
        (4, 1024), (8, 512), (16, 256))
    decode_contexts: tuple[int, ...] = (128, 512)
    warmup: int = 5  # W (Appendix B, the RTX 4090 profile)
    repeats: int = 3  # R
    iters: int = 100  # I
    calibration_calls: int = 20  # per (path, batch row) with GPU-main busy
    eps: float = 0.0025
    lam: float = 1.0
    plateau_k: int = 5
    plateau_delta: float = 0.01


QUICK = ProfileSettings(batch_sizes=(1, 4, 16), prefill_shapes=(
    (1, 16), (1, 32), (2, 16), (1, 64), (2, 32), (1, 128), (2, 64), (1, 256)),
    decode_contexts=(64,), warmup=1, repeats=2, iters=3, calibration_calls=3)


def _rows(b: int) -> list[SamplingRow]:
    return [SamplingRow(0.0, 1.0, -1, i, 0) for i in range(b)]


def layer_turns(num_layers: int) -> Callable[[], int]:
    """The model's layers in turn, one a call (0, 1, ..., N − 1, 0, ...). A serving step
    reads every layer's weights once, so from DRAM wherever the model is larger than the
    last-level cache; one layer timed over and over reads its weights from the cache
    instead, which no serving step does. Measured on the 2-core Zen 3 VM (2026-12-07, demo
    model, 10.5 MB of post-attention weights a layer, 84 MB in all against a 32 MiB L3, one
    thread, medians of 5 rounds): t_p at 1 / 2 / 4 / 8 rows 0.44 / 0.31 / 0.40 / 0.68 ms on
    layer 0 repeated, 0.68 / 0.69 / 0.81 / 0.90 ms with the layers in turn; 32 rows 2.5 ms
    either way. The L3 made one row look slower than two (the one-row loop streams W in
    sequence, which pays from DRAM, not from the cache)."""
    turns = itertools.cycle(range(num_layers))
    return lambda: next(turns)


def kv_for_every_layer(num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int,
                       head_dim: int, dtype: torch.dtype, device="cpu") -> KVCache:
    """A KV cache whose N layers are one tensor pair: the layers taken in turn
    (``layer_turns``) read their weights as a serving step does while the cache costs one
    layer's memory (a decode batch of 256 at 512 tokens of context is 0.27 GB a layer for
    the demo model in fp32, 17 GB for all 32 layers of Llama-3.1-8B in bf16). Between two
    reads of it the other N − 1 layers' weights pass through the caches, as in a serving
    step."""
    kv = KVCache(1, num_blocks, num_kv_heads, block_size, head_dim, dtype, device)
    kv.k, kv.v = kv.k * num_layers, kv.v * num_layers
    return kv


def cpu_primitive_fns(models: list[StagedModel], ch: AssistChannel, b: int,
                      only: tuple[str, ...] = PRIMITIVES) -> dict[str, list[Callable]]:
    """Each primitive of ``only`` at batch b, one callable per rank: t_p, t_l, a_w, a_r,
    h_w. t_p takes the model's layers in turn (``layer_turns``)."""
    g = torch.Generator().manual_seed(b)
    out: dict[str, list] = {k: [] for k in PRIMITIVES}
    for rank, m in enumerate(models):
        cfg = m.cfg
        h = torch.randn(b, cfg.hidden_size, generator=g).to(m.dtype)
        a = torch.randn(b, cfg.q_size, generator=g).to(m.dtype)
        cols = slice(rank * cfg.q_size, (rank + 1) * cfg.q_size)
        rows = _rows(b)
        layer = layer_turns(cfg.num_layers)

        def a_w(h=h, a=a, cols=cols):  # what the CPU worker writes before an assisted stage
            ch.buf["hidden_in"][:b].copy_(h.float())
            ch.buf["attn_in"][:b, cols].copy_(a.float())

        def h_w(h=h, rows=rows):  # Split-Final: the final hidden rows and the sampling rows
            ch.buf["hidden_in"][:b].copy_(h.float())
            ch._write_sampling(rows)

        out["t_p"].append(lambda m=m, h=h, a=a, layer=layer: m.post_attention(layer(), h, a))
        out["t_l"].append(lambda m=m, h=h, rows=rows: sample(m.post_layer(h), rows))
        out["a_w"].append(a_w)
        out["a_r"].append(lambda m=m: ch.buf["hidden_out"][:b].clone().to(m.dtype))
        out["h_w"].append(h_w)
    return {k: fns for k, fns in out.items() if k in only}


def cpu_primitives(models: list[StagedModel], ch: AssistChannel, sizes: Sequence[int],
                   s: ProfileSettings, only: tuple[str, ...] = PRIMITIVES
                   ) -> dict[int, dict[str, float]]:
    """The primitives of ``only`` at every batch size (seconds), each the slowest rank's
    and the mean over repeats (Eq. 10-11); every (batch, primitive) measured in the same
    rounds, so that repeat j of each is round j (``interleaved_rounds``: a slow spell of
    the host then spoils a round of every batch size rather than all the repeats of a few,
    which would bend the route scores Algorithm 1 compares across batch sizes)."""
    cases = {(b, k): fns for b in sizes
             for k, fns in cpu_primitive_fns(models, ch, b, only).items()}
    with torch.inference_mode():
        rounds = interleaved_rounds(cases, s)
    out: dict[int, dict[str, float]] = {b: {} for b in sizes}
    for (b, k), r in rounds.items():
        out[b][k] = statistics.fmean(r)
    return out


def post_attention_by_dtype(model_sets: dict[str, list[StagedModel]], ch: AssistChannel,
                            sizes: Sequence[int], s: ProfileSettings
                            ) -> dict[str, dict[int, float]]:
    """t_p of each dtype's models (dtype name -> one model per rank) at every batch size
    (seconds): every (batch, dtype) in the same rounds (``interleaved_rounds``), each the
    slowest rank's and the mean over rounds as the primitives' (Eq. 10-11). Both dtypes'
    weights are held at once for it: 1.5x the fp32 model's bytes, which the profiler's
    process needs for the CPU dtype only."""
    cases = {(name, b): cpu_primitive_fns(models, ch, b, ("t_p",))["t_p"]
             for b in sizes for name, models in model_sets.items()}
    with torch.inference_mode():
        rounds = interleaved_rounds(cases, s)
    return {name: {b: statistics.fmean(rounds[(name, b)]) for b in sizes}
            for name in model_sets}


def choose_cpu_dtype(t_p: dict[str, dict[int, float]]) -> tuple[str, float]:
    """The CPU dense dtype (DESIGN.md CPU dtype: the profiler measures the project's own
    kernels and decides) from ``post_attention_by_dtype``: ("bfloat16", g) where g, the
    geometric mean over the batch sizes of t_p(bf16) / t_p(fp32), is below 1, else
    ("float32", g). Every profiled batch size counts alike, since the CPU tier decodes at
    all of them. Until 2026-12-07 the choice read the largest batch alone, measured one
    dtype after the other: past NATIVE_MAX_ROWS (128) rows a bf16 model's stages are the
    prefill chunks' (the GEMM, or slices where the CPU has neither bf16 arithmetic nor the
    GEMM), not the decode-sized kernels most steps run, and on the 2-core Zen 3 VM (AVX2)
    the ratio there is 1.02 while bf16 is 0.63-0.83x fp32's time at 1-8 rows and
    0.92-1.01x at 16-128 (weights read in half the bytes, widened in registers): a profile
    there chose bfloat16 on 16.68 against 17.05 ms at 256 rows, a margin inside the
    box's noise."""
    ratios = [t_p["bfloat16"][b] / t_p["float32"][b] for b in t_p["float32"]]
    g = math.exp(statistics.fmean(math.log(r) for r in ratios))
    return ("bfloat16" if g < 1 else "float32"), g


async def gpu_microbenchmarks(rt: Runtime, ch: AssistChannel, hidden: int, attn: int,
                              num_layers: int, sizes: Sequence[int], s: ProfileSettings, ids
                              ) -> dict[int, dict[str, float]]:
    """g_x(b) for each path and batch size: the op's device path on every GPU rank
    (ProfileAssist), the calls taking the model's layers in turn (as ``layer_turns`` says
    why), Eq. 10-11 over the ranks' repeats. In rounds, as the CPU primitives: first every
    (batch, path)'s W warm-ups, then R rounds, each one repeat of I calls of every
    (batch, path), one ProfileAssist each (a slow spell then spoils a round of every batch
    size, not every repeat of a few)."""
    g = torch.Generator().manual_seed(1000)
    inputs = {b: (torch.randn(b, hidden, generator=g), torch.randn(b, attn, generator=g))
              for b in sizes}
    cases = [(b, path, op) for b in sizes for path, op in PATH_OPS.items()]

    async def run(b: int, op: int, warmup: int, repeats: int) -> list[list[float]]:
        h, a = inputs[b]
        ch.stage_inputs(op, 0, h, a if op != OP_POST_LAYER else None,
                        _rows(b) if op != OP_POST_ATTN else None)
        msg = P.ProfileAssist(step_id=next(ids), op=op, rows=b, layer=0, layers=num_layers,
                              warmup=warmup, repeats=repeats, iters=s.iters)
        per_rank = await rt.gpu.step_all(msg)
        return [[r.repeat_us[j] * 1e-6 for r in per_rank] for j in range(repeats)]

    for b, _, op in cases:
        await run(b, op, s.warmup, 0)
    totals: dict[tuple[int, str], list[list[float]]] = {(b, x): [] for b, x, _ in cases}
    for _ in range(s.repeats):
        for b, path, op in cases:
            totals[(b, path)] += await run(b, op, 0, 1)
    return {b: {x: profiled_latency(totals[(b, x)], s.iters) for x in PATH_OPS}
            for b in sizes}


class GpuLoad:
    """GPU-main work for the calibration: a synthetic population prefilled, then decoded
    step after step until stopped (released and started over when its blocks run out).
    ``decoding`` is set while a call issued now can only meet decode steps: from the first
    decode step until the population's last one is issued. Appendix B's load is a decoding
    population; a call that waited behind the population's prefill (on this box a 1,024-token
    prefill stage is ~20x a decode stage) measured that prefill, not a decode step's stage
    boundary, and the first path calibrated (p) met it every time (its q_x came out 43 ms
    in a quick profile, the other paths' 0.8-0.9 ms)."""

    def __init__(self, rt: Runtime, rows: int, context: int, steps: int, ids):
        cfg = rt.config
        self.rt, self.rows, self.context, self.steps, self.ids = rt, rows, context, steps, ids
        self.bs = cfg.block_size
        self.per_req = blocks_for_tokens(context + steps + 1, self.bs)
        if self.per_req * rows > cfg.gpu_kv_blocks:
            self.rows = max(1, cfg.gpu_kv_blocks // self.per_req)
        self.req_ids = itertools.count(1 << 30)
        self.decoding = threading.Event()  # read by the calling thread

    async def run(self, populations: int | None = None) -> list[float]:
        """Until cancelled, or ``populations`` populations; the decode steps' wall times."""
        spec = P.SamplingSpec(temperature=0.0, top_p=1.0, top_k=-1, seed=0)
        decode_s: list[float] = []
        while populations is None or populations > 0:
            reqs = [next(self.req_ids) for _ in range(self.rows)]
            tables = [list(range(i * self.per_req, (i + 1) * self.per_req))
                      for i in range(self.rows)]
            for rid in reqs:
                self.rt.gpu.send(P.NewRequest(req_id=rid, sampling=spec))
            try:
                seqs = [P.SeqStep(req_id=rid, token_ids=[1] * self.context, start_pos=0,
                                  new_blocks=t) for rid, t in zip(reqs, tables)]
                await self.rt.gpu.step(P.GpuBatch(step_id=next(self.ids), seqs=seqs))
                self.decoding.set()
                for k in range(self.steps):
                    if k == self.steps - 1:  # a call issued from now on could meet a prefill
                        self.decoding.clear()
                    seqs = [P.SeqStep(req_id=rid, token_ids=[1], start_pos=self.context + k,
                                      out_index=k + 1) for rid in reqs]
                    t0 = time.perf_counter()
                    await self.rt.gpu.step(P.GpuBatch(step_id=next(self.ids), seqs=seqs))
                    decode_s.append(time.perf_counter() - t0)
            finally:
                self.decoding.clear()
                self.rt.gpu.send(P.Release(req_ids=reqs))
            if populations is not None:
                populations -= 1
        return decode_s


def issue_spaced(n: int, step_s: float, rng: random.Random, ready: Callable[[], bool],
                 call: Callable[[], None], sleep: Callable[[float], None] = time.sleep
                 ) -> list[float]:
    """``n`` calibration calls, each after a pause drawn uniformly from [0, ``step_s``) (one
    GPU-main step) and once ``ready()`` (GPU-main decoding) says so; the pauses drawn.

    Why the pause: a call issued the moment its predecessor returned lands just after the
    stage boundary that served it and waits nearly a whole stage (back to back, the
    profiler's q_x came out 1.2-1.3 stages on the 2-core Zen 3 VM). In serving a
    Fused-Assist step computes the next layer's attention between its calls, and Appendix B
    takes q_x from calls "executed under the same model, worker topology" as serving, whose
    arrivals are not locked to GPU-main's boundaries; a pause uniform over one whole step
    puts each call at a uniform phase of that step (of each of its N equal stages too), so
    q_x is the mean wait of a call arriving at an unrelated time. The pause is drawn, not
    fixed: a fixed spacing near a multiple of the stage would lock the phase again."""
    pauses = []
    for _ in range(n):
        pause = rng.uniform(0.0, step_s)
        pauses.append(pause)
        sleep(pause)
        if not ready():
            raise RuntimeError("calibration: GPU-main stopped decoding")
        call()
    return pauses


async def calibrate(rt: Runtime, ch: AssistChannel, hidden: int, attn: int, num_layers: int,
                    sizes: Sequence[int], s: ProfileSettings, ids
                    ) -> tuple[dict[str, list[CalibrationCall]], float]:
    """Appendix B's end-to-end calibration: assist calls of every path and batch row while
    the GPU worker runs GPU-main steps; per call W here and G, L, F from the worker. Also
    the median wall time of the load's decode step with no call in flight (one population
    first), against which a call's stage-boundary wait can be read (``dualpace simulate``
    models it as half of one of the step's N layer stages), and over which each call's
    pause before it is drawn (``issue_spaced``)."""
    load = GpuLoad(rt, rows=8, context=128, steps=64, ids=ids)
    alone = statistics.median(await load.run(populations=1))
    busy = asyncio.create_task(load.run())
    alive = pid_alive(rt.gpu.pid)
    calls: dict[str, list[CalibrationCall]] = {x: [] for x in PATHS}
    rng = random.Random(2024)
    try:
        for path, op in PATH_OPS.items():
            # p serves a CPU step's every layer: its calls take them in turn and read their
            # weights as serving does (``layer_turns``; they were all layer 0's until
            # 2026-12-07); lA is the last layer's by definition, lS has none
            layer = (layer_turns(num_layers) if op == OP_POST_ATTN
                     else (lambda last=num_layers - 1: last))
            for b in sizes:
                g = torch.Generator().manual_seed(2000 + b)
                h, a = torch.randn(b, hidden, generator=g), torch.randn(b, attn, generator=g)
                waits: list[float] = []

                def one(op=op, layer=layer, h=h, a=a, b=b, waits=waits):
                    ch.call(op, layer(), h, a if op != OP_POST_LAYER else None,
                            _rows(b) if op != OP_POST_ATTN else None, alive,
                            timeout=120, waits=waits)

                await rt.assist_samples()  # drop what earlier calls left
                await asyncio.to_thread(
                    issue_spaced, s.calibration_calls, alone, rng,
                    lambda: load.decoding.wait(timeout=120), one)
                served = await _served(rt, op, len(waits))
                calls[path] += [CalibrationCall(b, w, g * 1e-6, lt * 1e-6, f * 1e-6)
                                for w, (_, _, g, lt, f) in zip(waits, served)]
    finally:
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
    return calls, alone


async def _served(rt: Runtime, op: int, n: int, timeout: float = 10.0) -> list[list[int]]:
    """The GPU worker's samples of the last ``n`` calls (it records a call just after
    publishing GPU-Done, so the last one may lag the caller a moment)."""
    served: list[list[int]] = []
    deadline = time.monotonic() + timeout
    while len(served) < n:
        served += [x for x in await rt.assist_samples() if x[0] == op]
        if len(served) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"calibration: {n} calls, {len(served)} served samples")
            await asyncio.sleep(0.01)
    return served


def gpu_prefill_throughput(model: StagedModel, shapes, s: ProfileSettings, block_size: int,
                           sync: Callable[[], None]) -> list[tuple[int, float]]:
    """(tokens, tokens/s) of one decoder layer's prefill for each (B, L) shape, every shape
    measured in the same rounds (``interleaved_rounds``), its latency the median over them;
    the calls take the model's layers in turn (``layer_turns``).
    Measured one shape after the other, three full profiles within the hour on the 2-core
    Zen 3 VM fitted limits of 512, 256 and none (a fit that did not rise)."""
    cfg = model.cfg
    cases = {}
    for bsz, length in shapes:
        nb = blocks_for_tokens(length, block_size)
        kv = kv_for_every_layer(cfg.num_layers, bsz * nb, cfg.num_kv_heads, block_size,
                                cfg.head_dim, model.dtype, model.device)
        fb = build_forward_batch([SeqChunk([1] * length, 0, list(range(i * nb, (i + 1) * nb)))
                                  for i in range(bsz)], block_size, model.device)
        h = torch.randn(bsz * length, cfg.hidden_size).to(model.device, model.dtype)
        layer = layer_turns(cfg.num_layers)
        cases[(bsz, length)] = [lambda fb=fb, h=h, kv=kv, layer=layer:
                                model.layer(layer(), h, fb, kv)]
    with torch.inference_mode():
        rounds = interleaved_rounds(cases, s, sync=sync)
    return [(b * n, b * n / statistics.median(rounds[(b, n)])) for b, n in shapes]


def interleaved_rounds(cases: dict, s: ProfileSettings,
                       clock: Callable[[], float] | None = None,
                       sync: Callable[[], None] = lambda: None) -> dict[object, list[float]]:
    """Every case measured in the same rounds: ``cases[key][q]`` is rank q's primitive. W
    warm-ups of each first; then R rounds, each timing I calls of every case on every rank
    in turn, ``sync`` (the device's) before and after. Per case, one latency a round: the
    slowest rank's time over I (Eq. 10).

    Why rounds: measured one case after the other (as every measurement here was until
    2026-12-07), a slow spell of the host (on the 2-core VMs they last seconds) lands on
    every repeat of the cases measured then and reorders a flat curve. In rounds a spell as
    long as one case's measurement spoils one round of a few cases, which a median over
    rounds drops and a mean (Eq. 11, the primitives) spreads over all of them."""
    clock = clock or time.perf_counter  # looked up per call: tests put a fake host here
    for fns in cases.values():
        for fn in fns:
            for _ in range(s.warmup):
                fn()
    rounds: dict[object, list[float]] = {key: [] for key in cases}
    for _ in range(s.repeats):
        for key, fns in cases.items():
            row = []
            for fn in fns:
                sync()
                t0 = clock()
                for _ in range(s.iters):
                    fn()
                sync()
                row.append(clock() - t0)
            rounds[key].append(max(row) / s.iters)
    return rounds


def cpu_decode_throughput(models: list[StagedModel], batch_sizes, contexts,
                          s: ProfileSettings, block_size: int) -> dict[int, float]:
    """tokens/s of one decoder layer's decode step (pre-attention, paged attention,
    post-attention) per batch size, averaged over context lengths; every (batch, context)
    measured in the same rounds (``interleaved_rounds``), its latency the median over them.
    Each context's KV cache is sized for the largest batch and shared by the smaller ones
    (their first blocks); the calls take the model's layers in turn (``layer_turns``,
    ``kv_for_every_layer``).

    Every batch size is measured: the sweep used to stop once throughput fell twice in a
    row past its maximum, and on a curve flat from batch 8 on (the demo model on the 2-core
    Zen 3 VM, one core: 6.5-8k tokens/s from 8 to 256) a dip of a few percent ended it
    early. Four runs of that sweep alternated with four of this one (2026-12-07, 43-48 s
    each here, 6-44 s for the sweep): limits 256 / 8 / 16 / 16 against 32 / 256 / 256 /
    256."""
    cases: dict[tuple[int, int], list] = {}
    for ctx in contexts:
        nb = blocks_for_tokens(ctx + 1, block_size)
        caches = [kv_for_every_layer(m.cfg.num_layers, max(batch_sizes) * nb,
                                     m.cfg.num_kv_heads, block_size, m.cfg.head_dim, m.dtype)
                  for m in models]
        for b in batch_sizes:
            fb = build_forward_batch([SeqChunk([1], ctx, list(range(i * nb, (i + 1) * nb)))
                                      for i in range(b)], block_size)
            hs = [torch.randn(b, m.cfg.hidden_size).to(m.dtype) for m in models]
            turns = [layer_turns(m.cfg.num_layers) for m in models]
            cases[(b, ctx)] = [lambda m=m, fb=fb, h=h, kv=kv, layer=layer:
                               m.layer(layer(), h, fb, kv)
                               for m, kv, h, layer in zip(models, caches, hs, turns)]
    with torch.inference_mode():
        latency = {key: statistics.median(r) for key, r in interleaved_rounds(cases, s).items()}
    return {b: sum(b / latency[(b, ctx)] for ctx in contexts) / len(contexts)
            for b in batch_sizes}


def _cpu_models(config: EngineConfig, dtype: torch.dtype) -> list[StagedModel]:
    """One model per CPU tensor-parallel rank (its shard), as the CPU workers hold them."""
    full = load_model_config(config.model)
    local = full.shard(config.cpu_tp)
    return [StagedModel(local, load_weights(config.model, full, dtype, "cpu",
                                            Shard(r, config.cpu_tp)), 4096)
            for r in range(config.cpu_tp)]


async def run_profile(config: EngineConfig, s: ProfileSettings, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    mc = load_model_config(config.model)
    sizes = list(s.batch_sizes)
    # Assist reachable (boundaries on) and an Assist Buffer for the largest profiled batch.
    rc = resolve(dataclasses.replace(config, assist_thresholds="0,0",
                                     cpu_batch_limit=max(sizes), profile=""))
    rt = Runtime(rc)
    await rt.start()
    allowed = os.sched_getaffinity(0)
    ids = itertools.count(1 << 40)
    try:
        os.sched_setaffinity(0, rc.cpu_cores)
        torch.set_num_threads(len(rc.cpu_cores) // config.cpu_tp or 1)
        ch = rt.assist_channel()
        # CPU dtype: the faster post-attention over every batch size (choose_cpu_dtype)
        model_sets = {name: _cpu_models(config, getattr(torch, name))
                      for name in ("float32", "bfloat16")}
        dtypes = post_attention_by_dtype(model_sets, ch, sizes, s)
        cpu_dtype, dtype_ratio = choose_cpu_dtype(dtypes)
        cpu_models = model_sets.pop(cpu_dtype)
        model_sets.clear()  # the other dtype's weights
        prims = cpu_primitives(cpu_models, ch, sizes, s)
        gpu = await gpu_microbenchmarks(rt, ch, mc.hidden_size, mc.q_size, mc.num_layers,
                                        sizes, s, ids)
        calls, main_step = await calibrate(rt, ch, mc.hidden_size, mc.q_size, mc.num_layers,
                                           sizes, s, ids)
        decode = cpu_decode_throughput(cpu_models, sizes, s.decode_contexts, s,
                                       config.block_size)
    finally:
        os.sched_setaffinity(0, allowed)
        await rt.stop()
    consts = {x: calibration_constants(calls[x]) for x in PATHS}
    comps, scores = {}, {}
    for b in sizes:
        w, d = {}, {}
        for x in PATHS:
            w[x], d[x] = assist_terms(*consts[x], gpu[b][x])
        pr = prims[b]
        c = components(pr["t_p"], pr["t_l"], pr["a_w"], pr["a_r"], pr["h_w"], w, d)
        comps[b] = dataclasses.asdict(c)
        scores[b] = score_routes(c, mc.num_layers, s.lam)
    p, f = choose_thresholds(scores, mc.num_layers, s.eps)
    cpu_limit = peak_batch(list(decode), list(decode.values()))
    device = torch.device(rc.gpu_device)
    gpu_model = StagedModel(mc, load_weights(config.model, mc, DTYPES[rc.gpu_dtype], device),
                            16384, attention_backend=rc.attention_backend,
                            block_size=rc.block_size)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    prefill = gpu_prefill_throughput(gpu_model, s.prefill_shapes, s, config.block_size, sync)
    by_tokens: dict[int, list[float]] = {}
    for n, thr in prefill:
        by_tokens.setdefault(n, []).append(thr)
    tokens = sorted(by_tokens)
    means = [sum(by_tokens[n]) / len(by_tokens[n]) for n in tokens]
    fitted = pava(means)
    if fitted[-1] <= fitted[0]:
        # The plateau rule assumes throughput that rises with batched tokens (a GPU). A flat
        # fit (e.g. --gpu-device cpu, where prefill attention grows quadratically) carries
        # no limit: keep the configured one rather than pick the smallest size.
        token_limit, token_rule = config.max_num_batched_tokens, "flat fit: configured value"
        log.warning("GPU prefill throughput does not rise with batched tokens; keeping "
                    "max_num_batched_tokens=%d", token_limit)
    else:
        token_limit = plateau_limit(tokens, means, s.plateau_k, s.plateau_delta)
        token_rule = f"plateau K={s.plateau_k} delta={s.plateau_delta}"
    profile = {
        "format": PROFILE_FORMAT,
        "model": config.model, "assist_thresholds": [p, f],
        "routes": {str(b): route_for(b, p, f) for b in sizes},
        "assist_reachable_at_cpu_batch_limit": assist_reachable(cpu_limit, p, f),
        "max_num_batched_tokens": max(token_limit, config.block_size),
        "max_num_batched_tokens_rule": token_rule,
        "cpu_batch_limit": cpu_limit, "cpu_dtype": cpu_dtype,
        "settings": dataclasses.asdict(s),
        "cpu_dtype_post_attention_s": {name: {str(b): v for b, v in by_b.items()}
                                       for name, by_b in dtypes.items()},
        "cpu_dtype_bf16_over_fp32": dtype_ratio,
        "components": {str(b): v for b, v in comps.items()},
        "route_scores": {str(b): v for b, v in scores.items()},
        "appendix_b": {
            "cpu_primitives_s": {str(b): v for b, v in prims.items()},
            "gpu_cuda_s": {str(b): v for b, v in gpu.items()},
            "calibration": {x: {"q_s": consts[x][0], "o_s": consts[x][1],
                                "calls": len(calls[x])} for x in PATHS},
            # the load's decode step alone, and half of one of its N layer stages: the
            # simulator's stage-boundary wait, to read the q_s above against
            "calibration_gpu_main_step_s": main_step,
            "calibration_half_stage_s": main_step / mc.num_layers / 2,
        },
        "cpu_decode_tokens_per_s": {str(b): v for b, v in decode.items()},
        "gpu_prefill": {"tokens": tokens, "mean_tokens_per_s": means, "fitted": fitted},
    }
    (out_dir / "profile.json").write_text(json.dumps(profile, indent=2))
    _plots(profile, out_dir)
    return profile


def _plots(profile: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    sizes = [int(b) for b in profile["route_scores"]]
    for route in ("full-cpu", "split-final", "fused-assist"):
        ax[0].plot(sizes, [profile["route_scores"][str(b)][route] * 1e3 for b in sizes],
                   marker="o", label=route)
    p, f = profile["assist_thresholds"]
    ax[0].set_title(f"(a) CPU post-attention routing score: (P, F) = ({p}, {f})")
    ax[0].set_xlabel("batch size (b)")
    ax[0].set_ylabel("score (ms)")
    ax[0].set_xscale("log", base=2)
    ax[0].legend()
    dec = profile["cpu_decode_tokens_per_s"]
    ax[1].plot([int(b) for b in dec], list(dec.values()), marker="o")
    ax[1].set_title(f"(b) CPU single-layer decode: limit {profile['cpu_batch_limit']}")
    ax[1].set_xlabel("batch size")
    ax[1].set_ylabel("tokens/s")
    ax[1].set_xscale("log", base=2)
    pre = profile["gpu_prefill"]
    ax[2].plot(pre["tokens"], pre["mean_tokens_per_s"], marker="o", label="mean")
    ax[2].plot(pre["tokens"], pre["fitted"], label="isotonic fit")
    ax[2].axvline(profile["max_num_batched_tokens"], linestyle="--", color="gray")
    ax[2].set_title(f"(d) GPU single-layer prefill: limit {profile['max_num_batched_tokens']}")
    ax[2].set_xlabel("batched tokens")
    ax[2].set_ylabel("tokens/s")
    ax[2].set_xscale("log", base=2)
    ax[2].legend()
    fig.tight_layout()
    fig.savefig(out_dir / "profile.png", dpi=110)


def main(config: EngineConfig, out_dir: str, quick: bool = False) -> dict:
    """``quick``: a smoke-sized profile (tests, a first look): three batch sizes, W/R/I of
    1/2/3, small prefill shapes that still give the plateau rule K = 5 distinct n."""
    return asyncio.run(run_profile(config, QUICK if quick else ProfileSettings(),
                                   Path(out_dir)))
