"""Thread counts that follow the other tier's occupancy (runtime/thread_share.py), and when
the configuration shares the cores at all."""

from __future__ import annotations

import mmap

import msgspec
import pytest

from dualpace.config import EngineConfig
from dualpace.resolved import resolve
from dualpace.runtime import protocol as P
from dualpace.runtime.supervisor import worker_env
from dualpace.runtime.thread_share import OCCUPANCY_SIZE, ThreadShare, occupancy_words
from dualpace.runtime.worker_main import SPEC_ENV


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
        before = llm._run(llm._serving.runtime.stats())
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=100,
                                                 ignore_eos=True))
        stats = llm._run(llm._serving.runtime.stats())
        pids = llm._serving.runtime.worker_pids()
        affinity = {k: len(psutil.Process(p).cpu_affinity()) for k, p in pids.items()}
        spin = {k: psutil.Process(p).environ().get("GOMP_SPINCOUNT") for k, p in pids.items()}
    gpu = next(s for s in stats if s.kind == "gpu")
    assert gpu.threads == allowed
    assert affinity == {"gpu0": allowed, "cpu0": allowed}
    # OpenMP (prefill only) spins briefly: the decode team needs the cores next
    assert spin == {"gpu0": os.environ.get("GOMP_SPINCOUNT", "3000"),
                    "cpu0": os.environ.get("GOMP_SPINCOUNT", "3000")}
    # the team's gate is the other tier's word: under gpu-only that tier is never in a step,
    # so the GPU worker's helper spins through the gaps between steps rather than sleeping
    # in each (gated on its own word, which its steps raise, it slept ~100 times)
    parks = gpu.team_parks - next(s for s in before if s.kind == "gpu").team_parks
    assert gpu.steps >= 100 and parks < 30


def _spec(path: str, policy: str = "dualpace", all_cores=(0, 1, 2)) -> P.WorkerSpec:
    rc = resolve(EngineConfig(model=path, gpu_device="cpu", policy=policy))
    return P.WorkerSpec(kind="cpu", rank=0, tp_size=1, parent_pid=1, config=rc, cores=[1],
                        control="ipc://x", runtime_dir="/tmp", shm={}, ring_in_offset=0,
                        ring_out_offset=0, ring_capacity=1, num_workers=2, wake_index=1,
                        gpu_wake_index=0, follower_wake_indices=[], eventfd=3,
                        num_host_regions=1, all_cores=list(all_cores))


@pytest.mark.parametrize("policy,all_cores", [("dualpace", (0, 1, 2)), ("gated", (0, 1, 2)),
                                              ("gpu-only", (0, 1, 2)), ("dualpace", ())])
def test_workers_spin_briefly_in_openmp_unless_the_operator_chose(llama_checkpoint, policy,
                                                                  all_cores):
    """OpenMP runs only the prefill and copy kernels now: its idle threads must not spin for
    libgomp's default milliseconds on the cores the decode team (cext/team.c) needs next, on
    shared cores or cores of the worker's own; an operator's own choice stands."""
    spec = _spec(str(llama_checkpoint[0]), policy, all_cores)
    env = worker_env(spec, {"PATH": "/bin"})
    assert env["GOMP_SPINCOUNT"] == "3000" and env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == str(len(all_cores) or 1)  # shared cores: not the share
    assert msgspec.json.decode(env[SPEC_ENV], type=P.WorkerSpec) == spec
    for var, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "infinity")):
        env = worker_env(spec, {var: value})
        assert env[var] == value
        assert "GOMP_SPINCOUNT" not in env or var == "GOMP_SPINCOUNT"

