"""Engine side of one worker's data plane, on the asyncio loop.

Descriptors go into the engine->worker ring and ring the worker's futex wake word; results
come back through the worker->engine ring, whose eventfd doorbell the loop watches with
``add_reader``. Each submitted step resolves one future by step id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from dualpace.kernels.futex import FutexWord
from dualpace.runtime import protocol as P
from dualpace.runtime.ring import Ring


class StepError(RuntimeError):
    """The worker reported the step as failed (its message says why)."""


class WorkerDied(RuntimeError):
    """A worker process died; every step in flight fails with this."""


class WorkerClient:
    def __init__(self, kind: str, rank: int, to_worker: Ring, from_worker: Ring,
                 wake: FutexWord, eventfd: int):
        self.kind, self.rank = kind, rank
        self._to, self._from = to_worker, from_worker
        self._wake = wake
        self._efd = eventfd
        self._pending: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pid = 0

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._efd, self._on_readable)

    def detach(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._efd)
            self._loop = None

    def send(self, msg) -> None:
        """A record the worker applies in order (NewRequest, Release, a batch)."""
        self._to.write(P.encode(msg))
        self._wake.add(1)
        self._wake.wake()

    def submit(self, batch: P.GpuBatch | P.CpuBatch) -> asyncio.Future:
        if batch.step_id in self._pending:
            raise ValueError(f"step {batch.step_id} already in flight on {self.kind} worker")
        fut = self._loop.create_future()
        self._pending[batch.step_id] = fut
        self.send(batch)
        return fut

    async def step(self, batch: P.GpuBatch | P.CpuBatch) -> P.StepDone:
        return await self.submit(batch)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _on_readable(self) -> None:
        with contextlib.suppress(BlockingIOError):  # already drained by an earlier call
            os.eventfd_read(self._efd)
        for raw in self._from.read_all():
            try:
                msg = P.to_engine_decoder.decode(raw)
            except Exception as e:  # msgspec's DecodeError and ValidationError alike
                # A record that is not a valid message names no step: fail every step in
                # flight rather than leave the one it answered waiting forever (an
                # exception here would end in the loop's handler, the future unresolved).
                self.fail_all(StepError(f"{self.kind} worker sent an invalid message: {e}"))
                continue
            fut = self._pending.pop(msg.step_id, None)
            if fut is None or fut.done():
                continue
            if isinstance(msg, P.StepFailed):
                fut.set_exception(StepError(f"{self.kind} worker: {msg.message}"))
            else:
                fut.set_result(msg)

    def fail_all(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)


class WorkerGroup:
    """The tensor-parallel ranks of one worker kind, used like a single worker: every record
    goes to every rank; a step completes when every rank completed it (their sampled tokens
    agree: the all-reduced logits are identical), and the result is rank 0's."""

    def __init__(self, ranks: list[WorkerClient]):
        self.ranks = ranks
        self.kind = ranks[0].kind

    @property
    def pid(self) -> int:
        return self.ranks[0].pid

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    @property
    def in_flight(self) -> int:
        return self.ranks[0].in_flight

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        for r in self.ranks:
            r.attach(loop)

    def detach(self) -> None:
        for r in self.ranks:
            r.detach()

    def send(self, msg) -> None:
        for r in self.ranks:
            r.send(msg)

    async def step_all(self, msg) -> list:
        """Every rank's own answer (the profiler's per-rank times, Eq. 10's max over ranks)."""
        return list(await asyncio.gather(*[r.submit(msg) for r in self.ranks]))

    def submit(self, batch: P.GpuBatch | P.CpuBatch) -> asyncio.Future:
        futs = [r.submit(batch) for r in self.ranks]
        if len(futs) == 1:
            return futs[0]
        return asyncio.ensure_future(self._first_of_all(futs))

    @staticmethod
    async def _first_of_all(futs: list[asyncio.Future]) -> P.StepDone:
        results = await asyncio.gather(*futs)
        return results[0]

    async def step(self, batch: P.GpuBatch | P.CpuBatch) -> P.StepDone:
        return await self.submit(batch)

    def fail_all(self, exc: BaseException) -> None:
        for r in self.ranks:
            r.fail_all(exc)
