"""The real worker processes, driven without a scheduler: every path token-for-token equal
to transformers' greedy output (paper §4.1 migrations, §4.2 routes)."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
import torch

from dualpace.config import EngineConfig
from dualpace.model.config import load_model_config
from dualpace.runtime.copies import DEFERRED_ENV
from dualpace.runtime.routing import FULL_CPU, FUSED_ASSIST, NEO_PIPELINE, SPLIT_FINAL
from dualpace.runtime.supervisor import Runtime

from ..conftest import VOCAB, hf_greedy
from ..shm_util import owned_segments
from .harness import Driver

PROMPT_LENS = (5, 17, 33)


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in PROMPT_LENS]


def _shm() -> set[str]:
    """This test process's instances' segments (an in-process Runtime is named by our pid)."""
    return owned_segments(os.getpid())


TP = [pytest.param((1, 1), id="tp1"), pytest.param((2, 2), id="gpu_tp2-cpu_tp2")]


def run_with_runtime(path, thresholds: str, body, tp=(1, 1)):
    before = _shm()

    async def main():
        cfg = EngineConfig(model=str(path), gpu_device="cpu", cpu_dtype="float32", gpu_kv_blocks=48,
                           cpu_kv_gib=0.02, max_num_seqs=8, assist_thresholds=thresholds,
                           gpu_tp=tp[0], cpu_tp=tp[1])
        rt = Runtime(cfg)
        await rt.start()
        try:
            return await body(rt, Driver(rt))
        finally:
            await rt.stop()

    out = asyncio.run(main())
    assert _shm() == before, "shared memory leaked"
    return out


@pytest.mark.parametrize("tp", [*TP, pytest.param((1, 2), id="gpu_tp1-cpu_tp2"),
                                pytest.param((2, 1), id="gpu_tp2-cpu_tp1")])
def test_gpu_decode_swap_out_cpu_decode_swap_in(llama_checkpoint, tp):
    path, hf = llama_checkpoint
    prompts = _prompts(11)

    async def body(rt, d):
        reqs = [d.new(p) for p in prompts]
        await d.gpu_step(reqs)  # (a) prefill, then decode on the GPU worker
        for _ in range(4):
            await d.gpu_step(reqs)
        await d.swap_out(reqs[:2])  # (b) swap-out, decode on the CPU worker
        for _ in range(5):
            await d.cpu_step(reqs[:2])
            await d.gpu_step(reqs[2:])
        await d.swap_in(reqs[:1])  # (d) back to the GPU
        for _ in range(3):
            await d.gpu_step([reqs[0], reqs[2]])
            await d.cpu_step([reqs[1]])
        d.release(reqs)
        assert d.gpu_pool.num_used == 0 and d.host_pool.num_used == 0
        return [r.out for r in reqs]

    outs = run_with_runtime(path, "", body, tp)
    for p, out in zip(prompts, outs):
        assert out == hf_greedy(hf, p, len(out))


@pytest.mark.parametrize("tp", TP)
@pytest.mark.parametrize("thresholds,route", [
    ("", FULL_CPU), ("8,0", SPLIT_FINAL), ("0,0", FUSED_ASSIST),
])
def test_prefill_to_cpu_then_each_route(llama_checkpoint, thresholds, route, tp):
    """(c) Prefill-to-CPU (layer-wise staging copies), CPU decode forced onto each route."""
    path, hf = llama_checkpoint
    prompts = _prompts(23)

    async def body(rt, d):
        reqs = [d.new(p) for p in prompts]
        await d.prefill_to_cpu(reqs)
        for _ in range(6):
            await d.cpu_step(reqs)
        await d.swap_in(reqs[:1])
        for _ in range(2):
            await d.gpu_step(reqs[:1])
            await d.cpu_step(reqs[1:])
        stats = {s.kind: s for s in await rt.stats() if s.rank == 0}
        d.release(reqs)
        return [r.out for r in reqs], d, stats

    outs, d, stats = run_with_runtime(path, thresholds, body, tp)
    for p, out in zip(prompts, outs):
        assert out == hf_greedy(hf, p, len(out))
    assert set(d.routes) == {route}
    layers = load_model_config(str(path)).num_layers
    calls = {FULL_CPU: 0, SPLIT_FINAL: 1, FUSED_ASSIST: layers}[route] * len(d.routes)
    assert d.assist_calls == calls
    assert stats["gpu"].assist_served == calls and stats["cpu"].assist_calls == calls


@pytest.mark.parametrize("tp", [*TP, pytest.param((2, 1), id="gpu_tp2-cpu_tp1")])
@pytest.mark.parametrize("split", [1, 0])
def test_neo_pipeline_overlaps_the_gpu_step(llama_checkpoint, tp, split):
    """The gated baseline's CPU step (every dense stage on the GPU, attention on the CPU,
    two sub-batches on two assist channels) while the GPU runs its own steps: token-exact,
    N + 1 assist calls per sub-batch, and served at the GPU's stage boundaries (the CPU
    work overlaps the GPU step instead of waiting for it to end)."""
    path, hf = llama_checkpoint
    prompts = _prompts(29)
    layers = load_model_config(str(path)).num_layers

    async def body(rt, d):
        reqs = [d.new(p) for p in prompts]
        await d.prefill_to_cpu(reqs)
        gpu_req = d.new(_prompts(31)[2] * 4)
        await d.gpu_step([gpu_req])
        done = asyncio.Event()

        async def gpu_busy():
            while not done.is_set():
                await d.gpu_step([gpu_req])

        async def cpu_steps():
            try:
                return [await d.cpu_step(reqs, route=NEO_PIPELINE, split=split)
                        for _ in range(5)]
            finally:
                done.set()

        _, steps = await asyncio.gather(gpu_busy(), cpu_steps())
        stats = {s.kind: s for s in await rt.stats() if s.rank == 0}
        d.release([*reqs, gpu_req])
        return [r.out for r in reqs], steps, stats, gpu_req.out

    outs, steps, stats, gpu_out = run_with_runtime(path, "0,0", body, tp)
    for p, out in zip(prompts, outs):
        assert out == hf_greedy(hf, p, len(out))
    sub_batches = 2 if 0 < split < len(prompts) else 1
    assert all(s.route == NEO_PIPELINE and s.assist_calls == sub_batches * (layers + 1)
               for s in steps)
    assert stats["gpu"].assist_served >= 5 * sub_batches * (layers + 1)
    assert stats["gpu"].assist_at_boundary > 0, "no assist was served inside a GPU step"
    # one rank: its decode steps are one native call that stops at a layer boundary for a
    # waiting assist; with two sub-batches ~30 assists arrive, about a third of them mid-step
    if tp[0] == 1 and sub_batches == 2:
        assert stats["gpu"].step_pauses > 0, "no one-call GPU step stopped for an assist"
    long_prompt = _prompts(31)[2] * 4
    assert gpu_out == hf_greedy(hf, long_prompt, len(gpu_out))


def _host_kv(rt, blocks: list[int], n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the first ``n`` tokens' K and V [kv_heads, n, head_dim] as the host pool
    holds them in ``blocks`` (rank-sharded: CPU rank c's region has its heads)."""
    lay = rt.config.host_kv
    regions = [lay.views(rt._segments["host_kv"], c * lay.size) for c in range(rt.config.cpu_tp)]
    out = []
    for i in range(lay.num_layers):
        per = []
        for kv in (0, 1):
            x = torch.cat([r[kv][i][blocks] for r in regions], 1)  # [nb, heads, bs, d]
            heads, d = x.shape[1], x.shape[3]
            per.append(x.permute(1, 0, 2, 3).reshape(heads, -1, d)[:, :n].clone())
        out.append(tuple(per))
    return out


def _poison_host(rt, blocks: list[int]) -> None:
    """NaN into ``blocks`` of every layer's K and V in every CPU rank's region."""
    lay = rt.config.host_kv
    for c in range(rt.config.cpu_tp):
        k, v = lay.views(rt._segments["host_kv"], c * lay.size)
        for i in range(lay.num_layers):
            k[i][blocks] = float("nan")
            v[i][blocks] = float("nan")


def _hf_kv(hf, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with torch.no_grad():
        cache = hf(torch.tensor([tokens]), use_cache=True).past_key_values
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


@pytest.mark.parametrize("tp,copies", [pytest.param((1, 1), "eager", id="tp1"),
                                       pytest.param((2, 2), "eager", id="gpu_tp2-cpu_tp2"),
                                       pytest.param((1, 1), "deferred", id="tp1-deferred"),
                                       pytest.param((2, 2), "deferred",
                                                    id="gpu_tp2-cpu_tp2-deferred")])
def test_host_kv_after_prefill_to_cpu_and_a_swap_round_trip_equals_transformers(
        llama_checkpoint, tp, copies, monkeypatch):
    """The KV itself, not only the tokens it leads to: after Prefill-to-CPU (layer-wise
    staging copies) and after a CPU decode, swap-in, GPU decode and swap-out, the host pool
    holds exactly transformers' post-RoPE keys and values for every token so far. "deferred":
    the GPU workers run on the copy-stream stand-in (copies land only when waited on)."""
    if copies == "deferred":
        monkeypatch.setenv(DEFERRED_ENV, "1")
    path, hf = llama_checkpoint
    prompts = _prompts(41)

    async def body(rt, d):
        reqs = [d.new(p) for p in prompts]
        await d.prefill_to_cpu(reqs)
        after_p2c = [_host_kv(rt, r.blocks, len(r.prompt)) for r in reqs]
        await d.cpu_step(reqs)
        trip = reqs[-1:]  # the longest: its KV spans several blocks
        src = list(trip[0].blocks)
        await d.swap_in(trip)
        _poison_host(rt, src)  # freed host blocks get reused: the swap-out must copy all
        await d.gpu_step(trip)
        await d.swap_out(trip)
        r = trip[0]
        after_trip = _host_kv(rt, r.blocks, len(r.tokens) - 1)
        tokens = [list(q.tokens) for q in reqs]
        d.release(reqs)
        return after_p2c, after_trip, tokens

    after_p2c, after_trip, tokens = run_with_runtime(path, "", body, tp)
    for p, got in zip(prompts, after_p2c):
        for (k, v), (hk, hv) in zip(got, _hf_kv(hf, p)):
            torch.testing.assert_close(k, hk, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, hv, atol=1e-4, rtol=1e-4)
    assert len(tokens[-1]) == len(prompts[-1]) + 3  # P2C, CPU and GPU each sampled one
    assert len(tokens[-1]) - 1 > 2 * 16  # the swaps moved three blocks
    for (k, v), (hk, hv) in zip(after_trip, _hf_kv(hf, tokens[-1][:-1])):
        torch.testing.assert_close(k, hk, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v, hv, atol=1e-4, rtol=1e-4)
