"""Fake GPU/CPU worker groups for scheduler tests: they execute nothing but check what a
real worker would rely on (introduced requests, block tables covering every position,
KV present in the pool a step runs over) and return deterministic tokens."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from dualpace.engine.llm_engine import LLMEngine
from dualpace.engine.state import Limits
from dualpace.runtime import protocol as P

BLOCK = 4


def fake_token(rid: int, out_index: int, vocab: int) -> int:
    return 1 + (rid * 31 + out_index * 7) % (vocab - 1)


class FakeGroup:
    def __init__(self, kind: str, world: FakeWorkers):
        self.kind = kind
        self.world = world
        self.known: set[int] = set()
        self.tables: dict[int, list[int]] = {}
        self.sampled: dict[int, int] = {}  # rid -> out_index of the token it sampled last
        self.failed: set[tuple[int, int]] = set()  # (rid, out_index) of failed steps' rows
        self.steps = 0
        self._order = asyncio.Lock()  # submitted steps run one at a time, in order
        self._queued = 0  # submitted steps (and releases behind them) not yet executed
        self._releases: set[asyncio.Future] = set()

    def send(self, msg) -> None:
        if isinstance(msg, P.Release) and self._queued:
            # The ring's order: a release sent behind submitted steps reaches the worker
            # after them.
            self._queued += 1
            self._releases.add(task := asyncio.ensure_future(self._send_in_order(msg)))
            task.add_done_callback(self._releases.discard)
            return
        self._receive(msg)

    async def _send_in_order(self, msg) -> None:
        try:
            async with self._order:
                self._receive(msg)
        finally:
            self._queued -= 1

    def _receive(self, msg) -> None:
        if isinstance(msg, P.NewRequest):
            self.world.require(msg.req_id not in self.known, "request introduced twice")
            self.known.add(msg.req_id)
        elif isinstance(msg, P.Release):
            for rid in msg.req_ids:
                self.known.discard(rid)
                self.tables.pop(rid, None)
                self.sampled.pop(rid, None)
                # The KV bookkeeping is the world's (it follows the request between tiers),
                # so it goes with the last group's release: a release reaches an idle group
                # at once but a busy one behind its queued steps, and a step queued there
                # (a decode submitted ahead, behind the one whose result finished the
                # request) still reads its KV.
                if not any(rid in g.known for g in (self.world.gpu, self.world.cpu)):
                    self.world.on_host.discard(rid)
                    self.world.kv_len.pop(rid, None)

    def submit(self, batch) -> asyncio.Future:
        """The step's result as a future; submitted steps execute in submission order,
        each after the one before it (the data-plane ring's order)."""
        self._queued += 1  # from now: a release sent meanwhile queues behind this step
        fut = asyncio.ensure_future(self._in_order(batch))
        fut.add_done_callback(lambda _: self._dequeue())
        return fut

    def _dequeue(self) -> None:
        self._queued -= 1

    async def _in_order(self, batch):
        async with self._order:
            return await self.step(batch)

    async def step(self, batch):
        w = self.world
        if w.clock is not None:
            await w.clock.sleep(w.step_time(self.kind, batch))
        else:
            await asyncio.sleep(w.delay)
        self.steps += 1
        if w.fail_step is not None and w.fail_step(self.kind, batch):
            w.failed_steps.append(batch)
            self.failed.update((s.req_id, s.out_index) for s in batch.seqs)
            raise WorkerFailure(f"{self.kind} step {batch.step_id} failed (injected)")
        ready = []
        if isinstance(batch, P.GpuBatch):
            for m in batch.swap_out:
                w.require(m.req_id in self.known, "swap-out of an unknown request")
                w.require(w.kv_len.get(m.req_id, 0) >= m.num_tokens,
                          "swap-out of KV that was never written")
                w.on_host.add(m.req_id)
                ready.append(m.req_id)
            for m in batch.swap_in:
                w.require(m.req_id in w.on_host, "swap-in of KV that is not on the host")
                w.require(w.kv_len.get(m.req_id, 0) >= m.num_tokens,
                          "swap-in of KV that was never written")
                w.on_host.discard(m.req_id)
                self.tables[m.req_id] = list(m.dst_blocks)
                ready.append(m.req_id)
        tokens = []
        for s in batch.seqs:
            w.require(s.req_id in self.known, f"{self.kind} worker never introduced to {s.req_id}")
            if P.PREVIOUS_TOKEN in s.token_ids and (s.req_id, s.out_index - 1) in self.failed:
                raise WorkerFailure(f"request {s.req_id}: the step this decode follows failed")
            end = s.start_pos + len(s.token_ids)
            # The KV a step attends to must exist: positions [0, start_pos) were written by
            # an earlier step of this request (or copied into its blocks by a fork).
            w.require(s.start_pos == 0 or w.kv_len.get(s.req_id, 0) >= s.start_pos,
                      f"request {s.req_id} runs at position {s.start_pos} with KV for "
                      f"{w.kv_len.get(s.req_id, 0)} positions")
            if P.PREVIOUS_TOKEN in s.token_ids:  # a decode submitted ahead of its input
                w.require(s.token_ids == [P.PREVIOUS_TOKEN] and s.sample,
                          "the previous token not alone in a sampling decode")
                w.require(self.sampled.get(s.req_id) == s.out_index - 1,
                          f"request {s.req_id} decodes the token of out_index "
                          f"{s.out_index - 1}, last sampled {self.sampled.get(s.req_id)}")
                w.require(w.kv_len.get(s.req_id, 0) == s.start_pos,
                          f"request {s.req_id}: the token ahead at {s.start_pos}, KV for "
                          f"{w.kv_len.get(s.req_id, 0)} positions")
            w.kv_len[s.req_id] = end
            if s.sample:
                self.sampled[s.req_id] = s.out_index
            w.require(not s.forks or s.sample, "a fork before the prompt is complete")
            for f in s.forks:
                w.require(len(f.blocks) * w.block_size >= end, "fork into too few blocks")
                w.require(f.req_id not in w.kv_len, f"fork into live request {f.req_id}")
                w.kv_len[f.req_id] = end
            if s.host_blocks:  # Prefill-to-CPU
                w.require(s.start_pos == 0, "Prefill-to-CPU not from position 0")
                w.on_host.add(s.req_id)
                ready.append(s.req_id)
                for f in s.forks:
                    w.on_host.add(f.req_id)
                    ready.append(f.req_id)
            else:
                if self.kind == "cpu":
                    w.require(s.req_id in w.on_host, "CPU decode before its KV reached the host")
                table = self.tables.setdefault(s.req_id, [])
                if s.reset:
                    table[:] = s.new_blocks
                else:
                    table.extend(s.new_blocks)
                w.require(len(table) * w.block_size >= end, "block table too short")
                w.require(len(set(table)) == len(table),
                          f"block twice in {self.kind} table {table}")
            tokens.append(fake_token(s.req_id, s.out_index, w.vocab) if s.sample else -1)
        w.executed.append((self.kind, [s.req_id for s in batch.seqs]))
        calls = 0
        route = ""
        if isinstance(batch, P.CpuBatch):
            route = batch.route or "full-cpu"
        return P.StepDone(step_id=batch.step_id, tokens=tokens, ready=ready, route=route,
                          assist_calls=calls)


class VirtualClock:
    """Scripted time for engine tests: ``sleep(d)`` completes at ``now + d`` virtual
    seconds, in virtual-time order, and time advances only once the event loop is quiescent
    (no callback ready: every engine loop waits on a step or a wake event), so a run's
    timings are exactly the scripted step times whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, asyncio.Future]] = []
        self._seq = itertools.count()
        self._pending = asyncio.Event()
        self._driver: asyncio.Task | None = None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (self.now + seconds, next(self._seq), fut))
        self._pending.set()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.create_task(self._drive())
        await fut

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0)
            while loop._ready:  # CPython's ready queue: let every runnable callback run first
                await asyncio.sleep(0)
            if not self._heap:
                self._pending.clear()
                await self._pending.wait()
                continue
            when, _, fut = heapq.heappop(self._heap)
            self.now = max(self.now, when)
            if not fut.done():
                fut.set_result(None)


class WorkerFailure(RuntimeError):
    """An injected step failure (a worker error, not an engine mistake)."""


class ProtocolViolation(AssertionError):
    """The engine sent a worker something a real worker could not execute."""


LIVE: list[FakeWorkers] = []  # every FakeWorkers of the running test (tests/engine/conftest)


class FakeWorkers:
    def __init__(self, vocab: int = 1000, block_size: int = BLOCK, delay: float = 0.0,
                 clock: VirtualClock | None = None,
                 step_time: Callable[[str, object], float] | None = None):
        """``delay``: real seconds per step; with ``clock``, ``step_time(kind, batch)``
        virtual seconds instead. A protocol violation raises inside the step (the engine
        then aborts the batch, as it would on a real worker's failure) *and* is recorded:
        tests/engine/conftest.py fails the test if any was, so an abort cannot hide it."""
        self.violations: list[str] = []
        LIVE.append(self)
        self.vocab = vocab
        self.block_size = block_size
        self.delay = delay
        self.clock = clock
        self.step_time = step_time or (lambda kind, batch: delay)
        # ``fail_step(kind, batch)`` True: that step raises WorkerFailure (recorded here).
        self.fail_step: Callable[[str, object], bool] | None = None
        self.failed_steps: list = []
        self.on_host: set[int] = set()
        self.kv_len: dict[int, int] = {}  # positions of each request's KV written so far
        self.executed: list[tuple[str, list[int]]] = []
        self.gpu = FakeGroup("gpu", self)
        self.cpu = FakeGroup("cpu", self)
        self.available = asyncio.Event()
        self.available.set()

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            self.violations.append(what)
            raise ProtocolViolation(what)


def fake_engine(workers: FakeWorkers, *, gpu_blocks: int, host_blocks: int,
                policy: str = "dualpace", max_num_seqs: int = 4, gpu_token_limit: int = 64,
                cpu_batch_limit: int = 4, check: bool = True,
                async_scheduling: bool = False) -> LLMEngine:
    """An LLMEngine over ``workers`` (block size 4, vocabulary 1000, no EOS, a 64-block
    staging area); ``check``: the ownership invariants after every round."""
    limits = Limits(max_num_seqs=max_num_seqs, gpu_token_limit=gpu_token_limit,
                    cpu_batch_limit=cpu_batch_limit, max_model_len=1000, staging_blocks=64)
    return LLMEngine(workers, gpu_blocks=gpu_blocks, host_blocks=host_blocks,
                     block_size=workers.block_size, limits=limits, policy=policy,
                     vocab_size=1000, eos_ids=(), async_scheduling=async_scheduling,
                     on_round=(lambda e, k, p: e.state.check_invariants(
                         list(e.requests.values()))) if check else None)
