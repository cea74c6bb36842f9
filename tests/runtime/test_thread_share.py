"""Thread counts that follow the other tier's occupancy (runtime/thread_share.py), and when
the configuration shares the cores at all."""

from __future__ import annotations

import mmap

import pytest

from dualpace.config import EngineConfig
from dualpace.resolved import resolve
from dualpace.runtime.thread_share import OCCUPANCY_SIZE, ThreadShare, occupancy_words


def _pair():
    buf = mmap.mmap(-1, OCCUPANCY_SIZE)
    calls = {"gpu": [], "cpu": []}
    shares = {}
    for kind in ("gpu", "cpu"):
        mine, peer = occupancy_words(buf, kind)
        own = 1 if kind == "gpu" else 3
        shares[kind] = ThreadShare(own, 4, mine, peer, set_threads=calls[kind].append)
    return shares, calls


def test_all_cores_while_the_other_tier_is_idle_own_share_while_it_works():
    s, calls = _pair()
    assert s["gpu"].begin() == 4  # the CPU tier is idle: every core
    assert s["cpu"].begin() == 3  # the GPU tier is in a step: its own share
    assert s["gpu"].check() == 1  # at the GPU worker's next layer: back to its share
    s["cpu"].end()
    assert s["gpu"].check() == 4
    s["gpu"].end()
    assert s["cpu"].begin() == 4
    # The thread count is applied only when it changes.
    assert calls == {"gpu": [4, 1, 4], "cpu": [3, 4]}
    assert s["gpu"].switches == 3


def test_bad_shares_are_refused():
    buf = mmap.mmap(-1, OCCUPANCY_SIZE)
    with pytest.raises(ValueError, match="own 3 of total 2"):
        ThreadShare(3, 2, *occupancy_words(buf, "gpu"))


def test_cores_are_shared_only_without_a_gpu_and_without_core_flags(llama_checkpoint):
    path = str(llama_checkpoint[0])
    assert resolve(EngineConfig(model=path, gpu_device="cpu")).shared_cores
    assert not resolve(EngineConfig(model=path, gpu_device="cpu", gpu_cores="0")).shared_cores
    assert not resolve(EngineConfig(model=path, gpu_device="cuda")).shared_cores
    assert not resolve(EngineConfig(model=path, gpu_device="cpu", gpu_tp=2)).shared_cores


def test_a_served_run_uses_every_core_while_one_tier_works(llama_checkpoint):
    """gpu-only traffic on a CPU "GPU": the GPU worker computes on every allowed core."""
    import os

    from dualpace import LLM, SamplingParams

    path = str(llama_checkpoint[0])
    allowed = len(os.sched_getaffinity(0))
    if allowed < 2:
        pytest.skip("one allowed core: nothing to share")
    import psutil

    with LLM(path, gpu_device="cpu", policy="gpu-only", cpu_kv_gib=0.05) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4))
        stats = llm._run(llm._serving.runtime.stats())
        pids = llm._serving.runtime.worker_pids()
        affinity = {k: len(psutil.Process(p).cpu_affinity()) for k, p in pids.items()}
    gpu = next(s for s in stats if s.kind == "gpu")
    assert gpu.threads == allowed
    assert affinity == {"gpu0": allowed, "cpu0": allowed}
