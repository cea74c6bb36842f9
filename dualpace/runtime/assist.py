"""Dense Assist: the CPU worker hands a post-attention stage or the post-layer to the GPU
worker through shared memory (paper §4.2, §5).

State word: IDLE -> CPU_READY (CPU wrote the inputs) -> GPU_RUNNING -> GPU_DONE (GPU wrote
the outputs) -> IDLE. The CPU side spins briefly, then futex-waits on the word; the GPU side
notices CPU_READY at its next stage boundary (or when its wake word rings while idle). The
request never changes owner: only activations cross, its KV stays in host memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from dualpace.kernels.futex import FutexWord
from dualpace.runtime.layouts import (
    ASSIST_CPU_READY,
    ASSIST_GPU_DONE,
    ASSIST_GPU_FAILED,
    ASSIST_GPU_RUNNING,
    ASSIST_IDLE,
    OP_ECHO,
    OP_POST_ATTN,
    OP_POST_ATTN_FINAL,
    OP_POST_LAYER,
    AssistLayout,
)
from dualpace.sampling.sampler import SamplingRow

SPIN = 4000  # pause iterations (~10-40 µs) before sleeping in the kernel


class PeerDied(RuntimeError):
    pass


class AssistFailed(RuntimeError):
    pass


class AssistChannel:
    """Both ends of one Dense Assist exchange (one CPU worker rank <-> the GPU worker)."""

    def __init__(self, seg, layout: AssistLayout, base: int, gpu_wake: FutexWord):
        self.layout = layout
        self.state = FutexWord(seg.buf, base + layout.STATE)
        self.op = FutexWord(seg.buf, base + layout.OP)
        self.layer = FutexWord(seg.buf, base + layout.LAYER)
        self.rows = FutexWord(seg.buf, base + layout.ROWS)
        self.buf = layout.views(seg, base)
        self.gpu_wake = gpu_wake

    # --- CPU side -------------------------------------------------------------------------
    def call(self, op: int, layer: int, hidden: torch.Tensor, attn: torch.Tensor | None,
             rows: list[SamplingRow] | None, peer_alive: Callable[[], bool],
             timeout: float = 600.0) -> torch.Tensor:
        """Run one assisted stage; returns hidden [b, H] (OP_POST_ATTN) or tokens [b]."""
        b = hidden.shape[0]
        if b > self.layout.max_rows:
            raise ValueError(
                f"assist batch of {b} rows exceeds the buffer ({self.layout.max_rows})")
        self.buf["hidden_in"][:b].copy_(hidden)
        if attn is not None:
            self.buf["attn_in"][:b].copy_(attn)
        if rows is not None:
            self._write_sampling(rows)
        self.op.store(op)
        self.layer.store(layer)
        self.rows.store(b)
        self.state.store(ASSIST_CPU_READY)
        self.gpu_wake.add(1)
        self.gpu_wake.wake()
        deadline = time.monotonic() + timeout
        while True:
            s = self.state.load()
            if s in (ASSIST_GPU_DONE, ASSIST_GPU_FAILED):
                break
            if not self.state.wait_while_equal(s, timeout=0.5, spin=SPIN):
                if not peer_alive():
                    raise PeerDied("GPU worker died during a Dense Assist call")
                if time.monotonic() > deadline:
                    raise AssistFailed(f"Dense Assist timed out after {timeout}s")
        self.state.store(ASSIST_IDLE)
        if s == ASSIST_GPU_FAILED:
            raise AssistFailed("GPU worker failed the Dense Assist call")
        if op in (OP_POST_ATTN, OP_ECHO):
            return self.buf["hidden_out"][:b].clone()
        return self.buf["tokens_out"][:b].clone()

    def _write_sampling(self, rows: list[SamplingRow]) -> None:
        b = len(rows)
        self.buf["temperature"][:b] = torch.tensor([r.temperature for r in rows])
        self.buf["top_p"][:b] = torch.tensor([r.top_p for r in rows])
        self.buf["top_k"][:b] = torch.tensor([r.top_k for r in rows], dtype=torch.int32)
        self.buf["out_index"][:b] = torch.tensor([r.step for r in rows], dtype=torch.int32)
        self.buf["seed"][:b] = torch.tensor([r.seed for r in rows], dtype=torch.int64)

    # --- GPU side -------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.state.load() == ASSIST_CPU_READY

    def serve(self, run: Callable[[AssistChannel, int, int, int], None]) -> bool:
        """If a request is waiting, claim it, run ``run(self, op, layer, rows)``, publish.
        Returns whether one was served."""
        if not self.state.compare_exchange(ASSIST_CPU_READY, ASSIST_GPU_RUNNING):
            return False
        try:
            run(self, self.op.load(), self.layer.load(), self.rows.load())
            done = ASSIST_GPU_DONE
        except Exception:
            done = ASSIST_GPU_FAILED
            raise
        finally:
            self.state.store(done)
            self.state.wake()
        return True

    def sampling_rows(self, b: int) -> list[SamplingRow]:
        t = self.buf["temperature"][:b].tolist()
        p = self.buf["top_p"][:b].tolist()
        k = self.buf["top_k"][:b].tolist()
        idx = self.buf["out_index"][:b].tolist()
        seed = self.buf["seed"][:b].tolist()
        return [SamplingRow(t[i], p[i], k[i], seed[i], idx[i]) for i in range(b)]


def pid_alive(pid: int) -> Callable[[], bool]:
    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    return alive


__all__ = ["OP_ECHO", "OP_POST_ATTN", "OP_POST_ATTN_FINAL", "OP_POST_LAYER", "AssistChannel"]
