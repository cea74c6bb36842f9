"""The GPU-only pieces behind one small interface, with a portable fallback: device
timing, on-device block copies, waiting for the device. Host<->GPU KV copies, their stream
and their ordering live in ``runtime/copies.py``.
"""

from __future__ import annotations

import time

import torch

from dualpace.runtime.copies import host_block_copy


class DeviceInterval:
    """The device execution time of the work issued between ``start`` and ``stop``: CUDA
    events on CUDA, the wall clock elsewhere (there the work runs as it is issued)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._a = self._b = None
        self._t0 = self._t1 = 0.0

    def start(self) -> None:
        if self.cuda:
            self._a = torch.cuda.Event(enable_timing=True)
            self._a.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._b = torch.cuda.Event(enable_timing=True)
            self._b.record()
        else:
            self._t1 = time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self._b.synchronize()
            return self._a.elapsed_time(self._b) * 1e-3
        return self._t1 - self._t0


class DeviceOps:
    """Device work that is not a host<->GPU copy (those are ``runtime/copies.py``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"

    def copy_within(self, pool: torch.Tensor, src_ids: list[int], dst_ids: list[int]) -> None:
        """pool[dst_ids] = pool[src_ids] for whole blocks of one layer of one pool (disjoint
        ids), in order with the compute just issued: on CUDA it runs on the current stream,
        behind the forward that wrote the source blocks."""
        if not src_ids:
            return
        if pool.device.type == "cpu":
            host_block_copy(pool, pool, src_ids, dst_ids)
            return
        s_idx = torch.tensor(src_ids, dtype=torch.long, device=pool.device)
        d_idx = torch.tensor(dst_ids, dtype=torch.long, device=pool.device)
        pool.index_copy_(0, d_idx, pool.index_select(0, s_idx))

    def record_event(self):
        """A CUDA event recorded now on the current (compute) stream."""
        event = torch.cuda.Event()
        event.record()
        return event

    def wait_compute(self) -> None:
        """Wait for all work issued on the device (profiling: time kernels, not launches)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def interval(self) -> DeviceInterval:
        return DeviceInterval(self.cuda)
