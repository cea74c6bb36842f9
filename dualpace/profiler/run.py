"""``dualpace profile``: serving-shaped micro-benchmarks, then the controls (paper §4.3,
Appendix B): post-attention routing thresholds (P, F), the GPU batched-token limit, the CPU
decode batch limit and the CPU dense dtype. Writes the profile JSON ``serve --profile``
reads and PNG charts in the shape of the paper's Figure 7.

CPU primitives run in this process pinned to the CPU worker's cores with its thread count;
GPU-side assist costs go through a real runtime: this process stands in for the CPU worker
on the shared Assist Buffers (the real CPU worker stays idle), so the measured waits include
the handshake and buffer movement, and the GPU worker's busy time gives the disturbance.
Each primitive: W warm-ups, then R repeats of I calls; the latency is the mean of the
repeats' per-call means (Eq. 10-11).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import torch

from dualpace.config import EngineConfig
from dualpace.kv.block_pool import blocks_for_tokens
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights
from dualpace.profiler.fitting import (
    Components,
    choose_thresholds,
    pava,
    peak_batch,
    plateau_limit,
    route_scores,
)
from dualpace.runtime.layouts import OP_ECHO, OP_POST_ATTN, OP_POST_ATTN_FINAL, OP_POST_LAYER
from dualpace.runtime.supervisor import Runtime
from dualpace.sampling.sampler import SamplingRow, sample

log = logging.getLogger("dualpace.profile")


@dataclasses.dataclass(frozen=True)
class ProfileSettings:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prefill_shapes: tuple[tuple[int, int], ...] = ((1, 64), (1, 256), (1, 1024), (2, 512),
                                                   (4, 256), (4, 1024), (8, 512), (16, 256))
    decode_contexts: tuple[int, ...] = (128, 512)
    warmup: int = 2
    repeats: int = 3
    iters: int = 5
    eps: float = 0.0025
    lam: float = 1.0
    plateau_k: int = 5
    plateau_delta: float = 0.01


def measure(fn, s: ProfileSettings) -> float:
    for _ in range(s.warmup):
        fn()
    means = []
    for _ in range(s.repeats):
        t0 = time.perf_counter()
        for _ in range(s.iters):
            fn()
        means.append((time.perf_counter() - t0) / s.iters)
    return sum(means) / len(means)


def _rows(b: int) -> list[SamplingRow]:
    return [SamplingRow(0.0, 1.0, -1, i, 0) for i in range(b)]


def cpu_components(model: StagedModel, b: int, s: ProfileSettings) -> tuple[float, float]:
    """t_p(b): one CPU post-attention stage; t_l(b): the CPU post-layer with sampling."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(b)
    h = torch.randn(b, cfg.hidden_size, generator=g).to(model.dtype)
    a = torch.randn(b, cfg.q_size, generator=g).to(model.dtype)
    with torch.inference_mode():
        t_p = measure(lambda: model.post_attention(0, h, a), s)
        t_l = measure(lambda: sample(model.post_layer(h), _rows(b)), s)
    return t_p, t_l


async def assist_components(rt: Runtime, hidden: int, attn: int, b: int, s: ProfileSettings
                            ) -> dict[str, float]:
    """Wait times (CPU-visible) and GPU busy time per call for each assisted op."""
    ch = rt.assist_channel()
    h = torch.randn(b, hidden)
    a = torch.randn(b, attn)
    out = {}
    for name, op, with_attn, rows in (("p", OP_POST_ATTN, True, None),
                                      ("lS", OP_POST_LAYER, False, _rows(b)),
                                      ("lA", OP_POST_ATTN_FINAL, True, _rows(b)),
                                      ("echo", OP_ECHO, False, None)):
        def call(op=op, with_attn=with_attn, rows=rows):
            ch.call(op, 0, h, a if with_attn else None, rows, lambda: True, timeout=60)

        for _ in range(s.warmup):  # outside both the timed wait and the busy-time window
            call()
        before = {st.kind: st.assist_busy_us for st in await rt.stats() if st.rank == 0}
        wait = measure(call, dataclasses.replace(s, warmup=0))
        after = {st.kind: st.assist_busy_us for st in await rt.stats() if st.rank == 0}
        n = s.repeats * s.iters
        out["w_" + name] = wait
        out["d_" + name] = (after["gpu"] - before["gpu"]) * 1e-6 / n
    return out


def gpu_prefill_throughput(model: StagedModel, shapes, s: ProfileSettings, block_size: int
                           ) -> list[tuple[int, float]]:
    """(tokens, tokens/s) of one decoder layer's prefill for each (B, L) shape."""
    cfg = model.cfg
    out = []
    for bsz, length in shapes:
        nb = blocks_for_tokens(length, block_size)
        kv = KVCache(1, bsz * nb, cfg.num_kv_heads, block_size, cfg.head_dim, model.dtype,
                     model.device)
        fb = build_forward_batch([SeqChunk([1] * length, 0, list(range(i * nb, (i + 1) * nb)))
                                  for i in range(bsz)], block_size, model.device)
        h = torch.randn(bsz * length, cfg.hidden_size).to(model.device, model.dtype)
        with torch.inference_mode():
            t = measure(lambda fb=fb, h=h, kv=kv: model.layer(0, h, fb, kv), s)
        out.append((bsz * length, bsz * length / t))
    return out


def cpu_decode_throughput(model: StagedModel, batch_sizes, contexts, s: ProfileSettings,
                          block_size: int) -> dict[int, float]:
    """tokens/s of one decoder layer's decode step (pre-attention, paged attention,
    post-attention) per batch size, averaged over context lengths."""
    cfg = model.cfg
    out = {}
    for b in batch_sizes:
        rates = []
        for ctx in contexts:
            nb = blocks_for_tokens(ctx + 1, block_size)
            kv = KVCache(1, b * nb, cfg.num_kv_heads, block_size, cfg.head_dim, model.dtype)
            fb = build_forward_batch([SeqChunk([1], ctx, list(range(i * nb, (i + 1) * nb)))
                                      for i in range(b)], block_size)
            h = torch.randn(b, cfg.hidden_size).to(model.dtype)
            with torch.inference_mode():
                t = measure(lambda fb=fb, h=h, kv=kv: model.layer(0, h, fb, kv), s)
            rates.append(b / t)
        out[b] = sum(rates) / len(rates)
    return out


def _cpu_model(config: EngineConfig, dtype: torch.dtype) -> StagedModel:
    mc = load_model_config(config.model)
    return StagedModel(mc, load_weights(config.model, mc, dtype, "cpu"), 4096)


async def run_profile(config: EngineConfig, s: ProfileSettings, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    mc = load_model_config(config.model)
    sizes = [b for b in s.batch_sizes if b <= config.max_num_seqs]
    rt = Runtime(dataclasses.replace(config, max_num_seqs=max(sizes)))
    await rt.start()
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, rt.sizing.cpu_cores)
        torch.set_num_threads(len(rt.sizing.cpu_cores))
        # CPU dtype: the faster dense path at the largest profiled batch (§DESIGN CPU dtype).
        dtypes = {}
        for dt in (torch.float32, torch.bfloat16):
            dtypes[str(dt).removeprefix("torch.")] = cpu_components(_cpu_model(config, dt),
                                                                     max(sizes), s)[0]
        cpu_dtype = min(dtypes, key=dtypes.get)
        cpu_model = _cpu_model(config, getattr(torch, cpu_dtype))
        comps, scores = {}, {}
        for b in sizes:
            t_p, t_l = cpu_components(cpu_model, b, s)
            a = await assist_components(rt, mc.hidden_size, mc.q_size, b, s)
            c = Components(t_p=t_p, t_l=t_l, w_p=a["w_p"], w_lS=a["w_lS"], w_lA=a["w_lA"],
                           d_p=a["d_p"], d_lS=a["d_lS"], d_lA=a["d_lA"])
            comps[b] = dataclasses.asdict(c) | {"w_echo": a["w_echo"]}
            scores[b] = route_scores(c, mc.num_layers, s.lam)
        p, f = choose_thresholds(scores, mc.num_layers, s.eps)
        decode = cpu_decode_throughput(cpu_model, sizes, s.decode_contexts, s,
                                       config.block_size)
        cpu_limit = peak_batch(list(decode), list(decode.values()))
    finally:
        os.sched_setaffinity(0, allowed)
        await rt.stop()
    device = config.torch_device()
    gpu_model = StagedModel(mc, load_weights(config.model, mc, config.torch_dtype(device),
                                             device), 16384)
    prefill = gpu_prefill_throughput(gpu_model, s.prefill_shapes, s, config.block_size)
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
        "model": config.model, "assist_thresholds": [p, f],
        "max_num_batched_tokens": max(token_limit, config.block_size),
        "max_num_batched_tokens_rule": token_rule,
        "cpu_batch_limit": cpu_limit, "cpu_dtype": cpu_dtype,
        "settings": dataclasses.asdict(s), "cpu_dtype_post_attention_s": dtypes,
        "components": {str(b): v for b, v in comps.items()},
        "route_scores": {str(b): v for b, v in scores.items()},
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
    s = ProfileSettings()
    if quick:  # a smoke-sized profile (tests, a first look)
        s = dataclasses.replace(s, batch_sizes=(1, 4, 16), prefill_shapes=((1, 32), (1, 128),
                                (2, 128), (4, 128)), decode_contexts=(64,), warmup=1,
                                repeats=2, iters=2, plateau_k=2)
    return asyncio.run(run_profile(config, s, Path(out_dir)))
