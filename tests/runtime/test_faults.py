"""Failure is designed: a worker killed mid-batch fails its in-flight step at once and the
group restarts; a killed supervisor takes its workers with it and leaks nothing that the
next start does not sweep."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dualpace.config import EngineConfig
from dualpace.runtime import protocol as P
from dualpace.runtime.client import WorkerDied
from dualpace.runtime.supervisor import Runtime

from ..shm_util import owned_segments
from .harness import Driver


def _shm() -> set[str]:
    """This test process's instances' segments (an in-process Runtime is named by our pid)."""
    return owned_segments(os.getpid())


def _config(path, **kw) -> EngineConfig:
    return EngineConfig(model=str(path), gpu_device="cpu", gpu_kv_blocks=48, cpu_kv_gib=0.02,
                        max_num_seqs=8, **kw)


@pytest.mark.parametrize("victim", ["gpu", "cpu"])
def test_worker_killed_mid_batch_fails_step_and_group_restarts(llama_checkpoint, victim):
    path, _ = llama_checkpoint
    before = _shm()

    async def main():
        rt = Runtime(_config(path))
        failures = []
        rt.on_failure(failures.append)
        await rt.start()
        try:
            d = Driver(rt)
            reqs = [d.new(list(range(1, 200))) for _ in range(3)]
            await d.gpu_step(reqs[:1])
            if victim == "cpu":
                await d.swap_out(reqs[:1])
            client = rt.gpu if victim == "gpu" else rt.cpu
            step = (P.GpuBatch(step_id=999, seqs=[d._step_for(r, "gpu") for r in reqs[1:]])
                    if victim == "gpu" else
                    P.CpuBatch(step_id=999, seqs=[d._step_for(reqs[0], "cpu")]))
            # Stopped first, so the step cannot finish before the kill lands (a fast kernel
            # answered a one-row CPU step between submit and kill once).
            os.kill(client.pid, signal.SIGSTOP)
            fut = client.submit(step)
            os.kill(client.pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(WorkerDied, match=f"{victim} worker 0 .* SIGKILL"):
                await fut
            # Noticed through the pidfd at once, not through a step timeout (minutes).
            assert time.monotonic() - t0 < 10.0
            assert failures and isinstance(failures[0], WorkerDied)
            generation = rt.generation
            deadline = time.monotonic() + 60
            while rt.generation == generation and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert rt.generation == generation + 1 and not rt.dead.is_set()
            d2 = Driver(rt)  # fresh pools: the restarted workers know no requests
            r = d2.new([5, 6, 7])
            await d2.gpu_step([r])
            await d2.gpu_step([r])
            assert len(r.out) == 2
        finally:
            await rt.stop()

    asyncio.run(main())
    assert _shm() == before


def test_restart_bound_marks_runtime_dead(llama_checkpoint):
    path, _ = llama_checkpoint
    before = _shm()

    async def main():
        rt = Runtime(_config(path, max_restarts=0))
        await rt.start()
        try:
            os.kill(rt.cpu.pid, signal.SIGKILL)
            await asyncio.wait_for(rt.dead.wait(), 10)
            assert "gave up" in rt.failure
        finally:
            await rt.stop()

    asyncio.run(main())
    assert _shm() == before


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


SUPERVISOR_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from dualpace.config import EngineConfig
    from dualpace.runtime.supervisor import Runtime

    async def main():
        rt = Runtime(EngineConfig(model=sys.argv[1], gpu_device="cpu", gpu_kv_blocks=16,
                                  cpu_kv_gib=0.01, max_num_seqs=4))
        await rt.start()
        print(rt.gpu.pid, rt.cpu.pid, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def test_supervisor_kill9_takes_workers_and_next_start_sweeps(llama_checkpoint):
    path, _ = llama_checkpoint
    before = _shm()
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR_SCRIPT, str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2, "supervisor did not start its workers"
        assert owned_segments(proc.pid), "the supervisor created no segments"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20.0  # PR_SET_PDEATHSIG: at once, unless overloaded
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if _running(p)]
            time.sleep(0.02)
        assert not alive, f"workers {alive} outlived the supervisor by 20 s"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert owned_segments(proc.pid), "the killed instance's segments should still exist " \
        "before the sweep"

    async def restart():
        rt = Runtime(_config(path))
        await rt.start()
        await rt.stop()

    asyncio.run(restart())
    assert not owned_segments(proc.pid), "the next start did not sweep the dead instance"
    assert _shm() == before
