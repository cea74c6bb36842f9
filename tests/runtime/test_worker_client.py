"""The engine's side of a worker's data plane: results resolve their steps by id, and a
result that is not a valid message fails the steps in flight instead of hanging them."""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest

from dualpace.kernels import cpu as cpu_kernels
from dualpace.kernels.futex import FutexWord
from dualpace.runtime import protocol as P
from dualpace.runtime.client import StepError, WorkerClient
from dualpace.runtime.layouts import RingLayout
from dualpace.runtime.ring import Ring

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")


def _client():
    layout = RingLayout(capacity=1 << 16)
    buf = bytearray(2 * layout.size + 64)
    to_worker, from_worker = Ring(buf, 0, layout), Ring(buf, layout.size, layout)
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    client = WorkerClient("gpu", 0, to_worker, from_worker,
                          FutexWord(buf, 2 * layout.size), efd)
    worker_side = Ring(buf, layout.size, layout)  # the worker's view of its output ring
    return client, worker_side, efd, buf


def test_results_resolve_their_steps_and_garbage_fails_the_rest():
    async def main():
        client, out, efd, _buf = _client()
        client.attach(asyncio.get_running_loop())
        try:
            a = client.submit(P.GpuBatch(step_id=1))
            b = client.submit(P.GpuBatch(step_id=2))
            c = client.submit(P.GpuBatch(step_id=3))
            out.write(P.encode(P.StepDone(step_id=2, tokens=[7])))
            os.eventfd_write(efd, 1)
            assert (await asyncio.wait_for(b, 5)).tokens == [7]
            # tokens=None: well-formed msgpack, not a valid StepDone (a worker's bug)
            bad = msgspec.msgpack.encode([10, 1, None])
            out.write(bad)
            os.eventfd_write(efd, 1)
            for fut in (a, c):
                with pytest.raises(StepError, match="invalid message"):
                    await asyncio.wait_for(fut, 5)
            assert client.in_flight == 0
            d = client.submit(P.GpuBatch(step_id=4))  # the client serves on
            out.write(P.encode(P.StepDone(step_id=4, tokens=[1])))
            os.eventfd_write(efd, 1)
            assert (await asyncio.wait_for(d, 5)).tokens == [1]
        finally:
            client.detach()
            os.close(efd)

    asyncio.run(main())
