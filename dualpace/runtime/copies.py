"""KV block copies between the GPU pool and the host pool, asynchronous and ordered by fences
(paper §4.1, "layer-wise asynchronous KV transfer"; issue 11).

One interface, three engines:

- ``CudaCopies``: the copy stream. Every copy first makes the copy stream wait on the compute
  stream (the KV it reads, or the blocks it overwrites, belong to work already enqueued
  there). GPU->host gathers on the GPU, then DMAs into the page-locked host pool when the
  destination blocks are contiguous there, else into a pinned staging buffer that the host
  scatters into the pool only after the copy's event completed. Host->GPU DMAs straight from
  the page-locked pool (or gathers into a pinned buffer first), then scatters on the GPU.
- ``EagerCopies``: a CPU "GPU": a copy is done when the call returns.
- ``DeferredCopies``: the CPU stand-in for the copy stream, for tests: a copy lands only when
  a fence covering it is waited on (by the host or by the compute stream) or the engine is
  synchronized. Until then its destination holds stale data, and it reads its source when it
  lands, so a source reused too early hands it the wrong bytes. That is the worst timing a
  real copy stream may show, made the only timing.

The contract the GPU worker keeps, and the stand-in checks:
- ``compute_waits(fence)`` before compute overwrites anything a fenced copy reads (a staging
  buffer reused, swapped-out blocks handed to the forward) or reads anything it writes
  (swapped-in blocks);
- ``synchronize()`` (or ``wait(fence)``) before the host, or another process, reads a copy's
  destination: a request is reported ready only after that.
"""

from __future__ import annotations

import ctypes
import logging
from collections import deque
from collections.abc import Callable

import torch

log = logging.getLogger("dualpace.runtime")

# Set to 1 in a CPU GPU-worker's environment to run it on the deferred stand-in (tests).
DEFERRED_ENV = "DUALPACE_DEFERRED_COPIES"


def _runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive ids: (index in ``ids``, first id, length)."""
    runs: list[tuple[int, int, int]] = []
    for j, b in enumerate(ids):
        if runs and runs[-1][1] + runs[-1][2] == b:
            i, first, n = runs[-1]
            runs[-1] = (i, first, n + 1)
        else:
            runs.append((j, b, 1))
    return runs


def _check(src: torch.Tensor, dst: torch.Tensor, src_ids: list[int], dst_ids: list[int]):
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"block copy: {len(src_ids)} source blocks, {len(dst_ids)} destinations")
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"block copy: block shapes differ, {tuple(src.shape[1:])} -> "
                         f"{tuple(dst.shape[1:])}")
    for name, ids, pool in (("source", src_ids, src), ("destination", dst_ids, dst)):
        if ids and (min(ids) < 0 or max(ids) >= pool.shape[0]):
            raise ValueError(f"block copy: {name} block out of range 0..{pool.shape[0] - 1}")


def host_block_copy(src: torch.Tensor, dst: torch.Tensor, src_ids: list[int],
               dst_ids: list[int]) -> None:
    """dst[dst_ids] = src[src_ids] on the host: the C kernel where it applies."""
    s_idx = torch.tensor(src_ids, dtype=torch.long)
    d_idx = torch.tensor(dst_ids, dtype=torch.long)
    if src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous():
        from dualpace.kernels import cpu

        if cpu.available():
            cpu.copy_blocks(src, dst, s_idx, d_idx)
            return
    dst.index_copy_(0, d_idx, src.index_select(0, s_idx).to(dst.dtype))


class Fence:
    """The copies enqueued before it. ``seq``: how many; ``event``: a CUDA event recorded on
    the copy stream after them (None off CUDA)."""

    __slots__ = ("event", "seq")

    def __init__(self, seq: int, event=None):
        self.seq = seq
        self.event = event


class DeferredCopies:
    """The copy stream's stand-in on CPU: copies land in issue order, only when a fence that
    covers them is waited on (host or compute) or on ``synchronize``; each reads its source
    when it lands. ``landed`` counts them (tests read it)."""

    def __init__(self) -> None:
        self.issued = 0
        self.landed = 0
        self._queue: deque[tuple[int, Callable[[], None]]] = deque()

    def to_host(self, src, dst, src_ids, dst_ids) -> None:
        _check(src, dst, src_ids, dst_ids)
        if not src_ids:
            return
        self.issued += 1
        ids = (list(src_ids), list(dst_ids))
        self._queue.append((self.issued, lambda: host_block_copy(src, dst, *ids)))

    to_device = to_host

    def fence(self) -> Fence:
        return Fence(self.issued)

    def _land(self, upto: int) -> None:
        while self._queue and self._queue[0][0] <= upto:
            self._queue.popleft()[1]()
            self.landed += 1

    def compute_waits(self, fence: Fence) -> None:
        self._land(fence.seq)

    def wait(self, fence: Fence) -> None:
        self._land(fence.seq)

    def synchronize(self) -> None:
        self._land(self.issued)

    @property
    def pending(self) -> int:
        return len(self._queue)


class EagerCopies(DeferredCopies):
    """Copies on a CPU "GPU": each lands as it is issued, so every fence is already passed
    and waiting on one finds nothing queued."""

    def to_host(self, src, dst, src_ids, dst_ids) -> None:
        super().to_host(src, dst, src_ids, dst_ids)
        self.synchronize()

    to_device = to_host


class CudaCopies:
    """The copy stream of one CUDA device (see the module docstring for the ordering)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.issued = 0
        # Host-side scatters still owed: (seq, event, pinned buffer, destination, ids).
        self._drains: deque = deque()

    def _after_compute(self) -> None:
        # The copy reads KV the compute stream wrote (or overwrites blocks it may still read).
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def to_host(self, src, dst, src_ids, dst_ids) -> None:
        _check(src, dst, src_ids, dst_ids)
        if not src_ids:
            return
        self.issued += 1
        self._after_compute()
        with torch.cuda.stream(self.stream):
            s_idx = torch.tensor(src_ids, dtype=torch.long, device=src.device)
            # Gathered (and converted) on the GPU, on this stream: it lives and dies here.
            gathered = src.index_select(0, s_idx).to(dst.dtype)
            runs = _runs(list(dst_ids))
            if all(dst[b:b + n].is_contiguous() for _, b, n in runs):
                for j, b, n in runs:  # DMA into the page-locked pool
                    dst[b:b + n].copy_(gathered[j:j + n], non_blocking=True)
                return
            pinned = torch.empty(gathered.shape, dtype=dst.dtype, pin_memory=True)
            pinned.copy_(gathered, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            self._drains.append((self.issued, event, pinned, dst, list(dst_ids)))

    def to_device(self, src, dst, src_ids, dst_ids) -> None:
        _check(src, dst, src_ids, dst_ids)
        if not src_ids:
            return
        self.issued += 1
        runs = _runs(list(src_ids))
        direct = all(src[b:b + n].is_contiguous() for _, b, n in runs) and src.is_pinned()
        if not direct:  # gathered on the host into pinned memory (freed behind the DMA)
            staged = torch.empty((len(src_ids), *src.shape[1:]), dtype=src.dtype,
                                 pin_memory=True)
            torch.index_select(src, 0, torch.tensor(src_ids, dtype=torch.long), out=staged)
        self._after_compute()
        with torch.cuda.stream(self.stream):
            up = torch.empty((len(src_ids), *src.shape[1:]), dtype=src.dtype, device=dst.device)
            if direct:
                for j, b, n in runs:
                    up[j:j + n].copy_(src[b:b + n], non_blocking=True)
            else:
                up.copy_(staged, non_blocking=True)
            d_idx = torch.tensor(dst_ids, dtype=torch.long, device=dst.device)
            dst.index_copy_(0, d_idx, up.to(dst.dtype))

    def fence(self) -> Fence:
        event = torch.cuda.Event()
        event.record(self.stream)
        return Fence(self.issued, event)

    def compute_waits(self, fence: Fence) -> None:
        torch.cuda.current_stream(self.device).wait_event(fence.event)

    def _drain(self, upto: int) -> None:
        while self._drains and self._drains[0][0] <= upto:
            _, event, pinned, dst, dst_ids = self._drains.popleft()
            event.synchronize()
            dst.index_copy_(0, torch.tensor(dst_ids, dtype=torch.long), pinned)

    def wait(self, fence: Fence) -> None:
        fence.event.synchronize()
        self._drain(fence.seq)

    def synchronize(self) -> None:
        self.stream.synchronize()
        self._drain(self.issued)


def copy_engine(device: torch.device, deferred: bool = False):
    """The copy engine for a worker's device; ``deferred``: the CPU stand-in (tests)."""
    if device.type == "cuda":
        if deferred:
            raise ValueError("deferred copies are the CPU stand-in; this device is CUDA")
        return CudaCopies(device)
    return DeferredCopies() if deferred else EagerCopies()


# --- page-locking the host pool ------------------------------------------------------------
_warned_register = False


def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime this process already loaded (torch's), for what torch does not bind."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def register_host(tensors: list[torch.Tensor]) -> bool:
    """Page-lock host tensors (shared-memory pools) for DMA with cudaHostRegister. On failure
    (a locked-memory limit, a kernel without support) the copies stay correct through pinned
    staging buffers, CUDA's sticky last-error is cleared so the next kernel launch is not
    blamed for it, and the failure is said once."""
    global _warned_register
    cudart = torch.cuda.cudart()
    for t in tensors:
        rc = cudart.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
        if int(rc) != 0:
            lib = _cudart()
            cleared = lib is not None and lib.cudaGetLastError() is not None
            if not _warned_register:
                _warned_register = True
                log.warning("cudaHostRegister failed (%s: %s); host KV copies go through "
                            "pinned staging buffers%s", int(rc), cudart.cudaGetErrorString(rc),
                            "" if cleared else " (CUDA's last-error state was not cleared)")
            return False
    return True
