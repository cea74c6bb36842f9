"""The supervisor: creates one instance's shared memory, spawns and pins the GPU and CPU
worker processes, runs the start-up handshake, watches them, and restarts the group when one
dies (DESIGN.md §Processes; paper §5 "Asynchronous runtime", without Ray).

Everything it creates is released on every exit path: ``stop()``, a failed start, garbage
collection (``weakref.finalize``) and interpreter exit. If the supervisor itself is killed,
the workers die with it (PR_SET_PDEATHSIG) and the next start sweeps the dead instance's
segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import weakref

import msgspec
import zmq
import zmq.asyncio

from dualpace.config import EngineConfig
from dualpace.kernels.futex import FutexWord
from dualpace.resolved import ResolvedConfig, resolve
from dualpace.runtime import protocol as P
from dualpace.runtime.assist import AssistChannel
from dualpace.runtime.client import WorkerClient, WorkerDied, WorkerGroup
from dualpace.runtime.layouts import (
    NUM_ASSIST_CHANNELS,
    RingLayout,
    TPControlLayout,
    WakeLayout,
)
from dualpace.runtime.placement import split_among
from dualpace.runtime.ring import Ring
from dualpace.runtime.shm import Instance, sweep_stale
from dualpace.runtime.thread_share import OCCUPANCY_SIZE
from dualpace.runtime.worker_main import SPEC_ENV

log = logging.getLogger("dualpace.runtime")

RING = RingLayout()


# OpenMP threads that finish a parallel region spin this many pause iterations (~13 ns each
# on an Ice Lake-SP) before sleeping: ~40 us. The C kernels run on a thread team of their own
# (cext/team.c, whose idle wait follows the other tier's occupancy), so OpenMP's threads are
# torch's alone: the torch stages and ops of a prefill or a step, each a region of its own.
# libgomp's default (300,000: ~4 ms) would keep them spinning on the cores the team's next
# kernel call needs, in this process and, on shared cores, in the other worker's; the short
# spin cost a prefill chunk of four GEMMs and three C calls nothing (82 ms either way). It
# used to be set only for two tiers on shared cores, when the C kernels were OpenMP too
# (there, under gpu-only, the short spin cost decode ~35% at 12 req/s).
OMP_SPIN_COUNT = 3000


def worker_env(spec: P.WorkerSpec, base: dict[str, str]) -> dict[str, str]:
    """A worker process's environment: ``base`` plus its spec, thread pools sized to its
    cores, and a short OpenMP spin unless the operator chose a wait policy or spin count."""
    env = dict(base)
    env[SPEC_ENV] = msgspec.json.encode(spec).decode()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(len(spec.all_cores or spec.cores))
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["GOMP_SPINCOUNT"] = str(OMP_SPIN_COUNT)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # TP ranks are local processes
    return env


@dataclasses.dataclass
class _Child:
    kind: str
    rank: int
    proc: subprocess.Popen
    pidfd: int
    eventfd: int


def _release(instance: Instance | None, children: list[_Child]) -> None:
    """Finalizer-safe teardown: kill children, close fds, unlink segments, remove the dir."""
    for c in children:
        if c.proc.poll() is None:
            c.proc.kill()
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(timeout=5)
        for fd in (c.pidfd, c.eventfd):
            with contextlib.suppress(OSError):
                os.close(fd)
    children.clear()
    if instance is not None:
        instance.cleanup()


class Runtime:
    """One GPU worker and one CPU worker, their shared memory and their control sockets."""

    def __init__(self, config: EngineConfig | ResolvedConfig):
        self.config = config if isinstance(config, ResolvedConfig) else resolve(config)
        self.gpu: WorkerGroup | None = None
        self.cpu: WorkerGroup | None = None
        self.generation = 0  # bumps on every (re)start; the engine resets its state then
        self.restarts = 0
        self.dead = asyncio.Event()
        self.available = asyncio.Event()  # set while a started group can take steps
        self.failure: str | None = None
        self._on_failure: list = []
        self._instance: Instance | None = None
        self._segments: dict = {}
        self._children: list[_Child] = []
        self._ctx: zmq.asyncio.Context | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._identities: dict[tuple[str, int], bytes] = {}
        self._kv_blocks: dict[int, int] = {}  # GPU rank -> the KV blocks its Hello reported
        self._replies: dict[tuple[str, int], asyncio.Queue] = {}
        self._stopping = False
        self._restart_task: asyncio.Task | None = None
        self._reader_task: asyncio.Task | None = None
        self._finalizer = weakref.finalize(self, _release, None, self._children)

    # --- life cycle -------------------------------------------------------------------------
    async def start(self) -> None:
        sweep_stale()
        try:
            await self._start_group()
        except BaseException:
            await self._teardown()
            raise

    async def _start_group(self) -> None:
        cfg = self.config
        inst = self._instance = Instance()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release, inst, self._children)
        ranks = [("gpu", r) for r in range(cfg.gpu_tp)] + [("cpu", r) for r in range(cfg.cpu_tp)]
        wake_layout = WakeLayout(len(ranks))
        segs = {
            "host_kv": inst.create("host-kv", cfg.cpu_tp * cfg.host_kv.size),
            "rings": inst.create("rings", 2 * len(ranks) * RING.size),
            "wake": inst.create("wake", wake_layout.size),
            "assist": inst.create("assist", NUM_ASSIST_CHANNELS * cfg.assist.size),
            "tpctl": inst.create("tpctl", TPControlLayout().size),
            "occupancy": inst.create("occupancy", OCCUPANCY_SIZE),
        }
        self._segments = segs
        self._ctx = zmq.asyncio.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        endpoint = inst.ipc_endpoint("control")
        self._router.bind(endpoint)
        loop = asyncio.get_running_loop()
        gpu_cores = split_among(list(cfg.gpu_cores), cfg.gpu_tp)
        cpu_cores = split_among(list(cfg.cpu_cores), cfg.cpu_tp)
        clients: dict[str, list[WorkerClient]] = {"gpu": [], "cpu": []}
        gpu_pid = 0
        for index, (kind, rank) in enumerate(ranks):
            ring_in = 2 * index * RING.size
            ring_out = ring_in + RING.size
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            tp = cfg.gpu_tp if kind == "gpu" else cfg.cpu_tp
            spec = P.WorkerSpec(
                kind=kind, rank=rank, tp_size=tp, parent_pid=os.getpid(),
                config=cfg,
                cores=(gpu_cores if kind == "gpu" else cpu_cores)[rank],
                control=endpoint, runtime_dir=str(inst.runtime_dir),
                shm={k: v.name for k, v in segs.items()},
                ring_in_offset=ring_in, ring_out_offset=ring_out, ring_capacity=RING.capacity,
                num_workers=len(ranks), wake_index=index, gpu_wake_index=0,
                follower_wake_indices=list(range(1, cfg.gpu_tp)) if index == 0 else [],
                eventfd=efd, num_host_regions=cfg.cpu_tp, gpu_pid=gpu_pid,
                all_cores=(sorted(set(cfg.gpu_cores) | set(cfg.cpu_cores))
                           if cfg.shared_cores else []),
            )
            proc = self._spawn(spec, efd)
            if index == 0:
                gpu_pid = proc.pid
            self._children.append(_Child(kind, rank, proc, os.pidfd_open(proc.pid), efd))
            client = WorkerClient(
                kind, rank,
                Ring(segs["rings"].buf, ring_in, RING),
                Ring(segs["rings"].buf, ring_out, RING),
                FutexWord(segs["wake"].buf, wake_layout.offset(index)), efd)
            client.pid = proc.pid
            clients[kind].append(client)
        self.gpu, self.cpu = WorkerGroup(clients["gpu"]), WorkerGroup(clients["cpu"])
        self._reader_task = asyncio.create_task(self._read_control())
        await self._await_hellos()
        self._settle_gpu_kv_blocks()
        self.gpu.attach(loop)
        self.cpu.attach(loop)
        for child in self._children:
            loop.add_reader(child.pidfd, self._on_death, child)
        self.generation += 1
        self.available.set()
        log.info("runtime up: gpu workers %s on cores %s, cpu workers %s on cores %s",
                 self.gpu.pids, gpu_cores, self.cpu.pids, cpu_cores)

    def _spawn(self, spec: P.WorkerSpec, efd: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "dualpace.runtime.worker_main"],
                                env=worker_env(spec, os.environ), pass_fds=(efd,),
                                stdin=subprocess.DEVNULL)

    async def _await_hellos(self) -> None:
        expected = {(c.kind, c.rank) for c in self._children}
        deadline = time.monotonic() + self.config.startup_timeout
        while not expected.issubset(self._identities):
            for c in self._children:
                if c.proc.poll() is not None:
                    raise RuntimeError(f"{c.kind} worker {c.rank} exited during start-up "
                                       f"(code {c.proc.returncode})")
            if time.monotonic() > deadline:
                missing = sorted(expected - set(self._identities))
                raise TimeoutError(f"workers {missing} did not finish start-up within "
                                   f"{self.config.startup_timeout}s")
            await asyncio.sleep(0.02)

    def _settle_gpu_kv_blocks(self) -> None:
        """A CUDA GPU worker sizes its own pool (runtime/gpu_memory.py); the group's smallest
        becomes the configuration from here on (the engine's pool, and a restart's workers,
        which then do not size it again)."""
        reported = [self._kv_blocks.get(r, 0) for r in range(self.config.gpu_tp)]
        if self.config.gpu_kv_blocks:
            if any(n != self.config.gpu_kv_blocks for n in reported):
                raise RuntimeError(f"GPU workers report {reported} KV blocks, the "
                                   f"configuration says {self.config.gpu_kv_blocks}")
            return
        if min(reported) < 1:
            raise RuntimeError(f"GPU workers reported no KV pool size ({reported})")
        self.config = msgspec.structs.replace(self.config, gpu_kv_blocks=min(reported))
        log.warning("GPU KV pool: %d blocks of %d tokens", min(reported),
                    self.config.block_size)

    async def _read_control(self) -> None:
        while True:
            ident, raw = await self._router.recv_multipart()
            msg = P.control_decoder.decode(raw)
            if isinstance(msg, P.Hello):
                self._identities[(msg.kind, msg.rank)] = ident
                if msg.kind == "gpu":
                    self._kv_blocks[msg.rank] = msg.kv_blocks
            elif isinstance(msg, (P.Pong, P.Stats, P.AssistSamples)):
                q = self._replies.setdefault((msg.kind, msg.rank), asyncio.Queue())
                q.put_nowait(msg)

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask every worker to stop, wait for them, release everything. Idempotent."""
        self._stopping = True
        if self._restart_task is not None:
            self._restart_task.cancel()
        for ident in list(self._identities.values()):
            with contextlib.suppress(zmq.ZMQError):
                await self._router.send_multipart([ident, P.encode(P.Shutdown())])
        deadline = time.monotonic() + timeout
        for c in self._children:
            while c.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        await self._teardown()

    async def _teardown(self) -> None:
        self.available.clear()
        loop = asyncio.get_running_loop()
        for c in self._children:
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(c.pidfd)
        for client in (self.gpu, self.cpu):
            if client is not None:
                client.detach()
        if self._reader_task is not None:
            self._reader_task.cancel()
            self._reader_task = None
        if self._router is not None:
            self._router.close(linger=0)
            self._router = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._identities.clear()
        self._finalizer()  # kills what is left, unlinks segments, removes the runtime dir

    # --- failure ----------------------------------------------------------------------------
    def on_failure(self, callback) -> None:
        """``callback(exc)`` runs when a worker dies, after in-flight steps have failed."""
        self._on_failure.append(callback)

    def _on_death(self, child: _Child) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(child.pidfd)
        if self._stopping:
            return
        rc = child.proc.poll()
        if rc is None:
            rc = child.proc.wait()
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        exc = WorkerDied(f"{child.kind} worker {child.rank} (pid {child.proc.pid}) died: {how}")
        log.error("%s", exc)
        self.available.clear()
        for client in (self.gpu, self.cpu):
            if client is not None:
                client.fail_all(exc)
        for cb in self._on_failure:
            cb(exc)
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.create_task(self._restart(exc))

    async def _restart(self, exc: WorkerDied) -> None:
        await self._teardown()
        self.restarts += 1
        if self.restarts > self.config.max_restarts:
            self.failure = f"{exc}; gave up after {self.config.max_restarts} restarts"
            log.error("runtime dead: %s", self.failure)
            self.dead.set()
            return
        backoff = min(0.25 * 2 ** (self.restarts - 1), 5.0)
        log.warning("restarting the worker group in %.2fs (restart %d of %d)", backoff,
                    self.restarts, self.config.max_restarts)
        await asyncio.sleep(backoff)
        try:
            await self._start_group()
        except Exception as e:
            await self._teardown()
            self.failure = f"restart failed: {e}"
            self.dead.set()

    # --- control round trips ----------------------------------------------------------------
    async def _ask(self, kind: str, rank: int, msg, timeout: float = 5.0):
        ident = self._identities[(kind, rank)]
        q = self._replies.setdefault((kind, rank), asyncio.Queue())
        await self._router.send_multipart([ident, P.encode(msg)])
        return await asyncio.wait_for(q.get(), timeout)

    async def ping(self, kind: str = "gpu", rank: int = 0, nonce: int = 0) -> P.Pong:
        return await self._ask(kind, rank, P.Ping(nonce=nonce))

    async def stats(self) -> list[P.Stats]:
        return [await self._ask(c.kind, c.rank, P.StatsRequest()) for c in self._children]

    async def assist_samples(self) -> list[list[int]]:
        """GPU rank 0's timings of the Dense Assists served since the last call (drained):
        [op, rows, cuda_us, launch_us, finalize_us] each (Appendix B calibration)."""
        return (await self._ask("gpu", 0, P.AssistSamplesRequest())).samples

    def assist_channel(self) -> AssistChannel:
        """An extra handle on the Dense Assist exchange, for the profiler and benchmarks,
        which stand in for the CPU worker group (it must be idle meanwhile)."""
        segs = self._segments
        n = self.config.gpu_tp + self.config.cpu_tp
        wake = FutexWord(segs["wake"].buf, WakeLayout(n).offset(0))
        return AssistChannel(segs["assist"], self.config.assist, 0, wake)

    def worker_pids(self) -> dict[str, int]:
        return {f"{c.kind}{c.rank}": c.proc.pid for c in self._children}
