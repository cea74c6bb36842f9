"""The GPU-only pieces behind one small interface, with a portable fallback.

CUDA: the host KV pool is page-locked with cudaHostRegister so block copies are real DMA,
and copies run on a dedicated stream. Anywhere else (``--gpu-device cpu``): plain copies.
"""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger("dualpace.runtime")


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
    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device) if self.cuda else None

    def register_host(self, tensors: list[torch.Tensor]) -> None:
        """Page-lock host tensors for DMA (CUDA only; no-op elsewhere)."""
        if not self.cuda:
            return
        cudart = torch.cuda.cudart()
        for t in tensors:
            rc = cudart.cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
            if rc != 0:
                log.warning("cudaHostRegister failed (%s); host copies will be pageable", rc)
                return

    def copy_blocks(self, src: torch.Tensor, dst: torch.Tensor, src_ids: list[int],
                    dst_ids: list[int]) -> None:
        """dst[dst_ids] = src[src_ids] for whole blocks of one layer (any devices/dtypes;
        head-range views of a pool are fine)."""
        if not src_ids:
            return
        s_idx = torch.tensor(src_ids, dtype=torch.long, device=src.device)
        d_idx = torch.tensor(dst_ids, dtype=torch.long, device=dst.device)
        if (src.device.type == "cpu" and dst.device.type == "cpu" and src.dtype == dst.dtype
                and src.is_contiguous() and dst.is_contiguous()):
            from dualpace.kernels import cpu

            if cpu.available():
                cpu.copy_blocks(src, dst, s_idx, d_idx)
                return
        if self.copy_stream is not None:
            with torch.cuda.stream(self.copy_stream):
                moved = src.index_select(0, s_idx).to(dst.device, dst.dtype, non_blocking=True)
                dst.index_copy_(0, d_idx, moved)
        else:
            dst.index_copy_(0, d_idx, src.index_select(0, s_idx).to(dst.device, dst.dtype))

    def copy_within(self, pool: torch.Tensor, src_ids: list[int], dst_ids: list[int]) -> None:
        """pool[dst_ids] = pool[src_ids] for whole blocks of one layer of one pool (disjoint
        ids), in order with the compute just issued: on CUDA it runs on the current stream,
        behind the forward that wrote the source blocks."""
        if not src_ids:
            return
        s_idx = torch.tensor(src_ids, dtype=torch.long, device=pool.device)
        d_idx = torch.tensor(dst_ids, dtype=torch.long, device=pool.device)
        if pool.device.type == "cpu" and pool.is_contiguous():
            from dualpace.kernels import cpu

            if cpu.available():
                cpu.copy_blocks(pool, pool, s_idx, d_idx)
                return
        pool.index_copy_(0, d_idx, pool.index_select(0, s_idx))

    def synchronize(self) -> None:
        """Wait for every copy issued so far (a transfer is ready only after this)."""
        if self.copy_stream is not None:
            self.copy_stream.synchronize()

    def wait_compute(self) -> None:
        """Wait for all work issued on the device (profiling: time kernels, not launches)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def interval(self) -> DeviceInterval:
        return DeviceInterval(self.cuda)
