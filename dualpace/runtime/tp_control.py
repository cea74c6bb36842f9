"""Tensor-parallel control of the GPU worker group (paper §5: fixed-layout shared-memory
blocks carry "tensor-parallel control state").

Serving a Dense Assist on a tensor-parallel GPU group is a collective: every rank must run
its shard of the post-attention at the same point of its FIFO of stage tasks. Rank 0 alone
looks at the assist state word and publishes one decision per decision point (each stage
boundary, and each idle-time assist that needs the group); the other ranks consume the same
sequence in order, so all ranks agree without a collective per boundary.
"""

from __future__ import annotations

import struct

from dualpace.kernels.futex import FutexWord
from dualpace.runtime.layouts import TPControlLayout

BOUNDARY, IDLE = 1, 2
_SLOT = struct.Struct("<III")


class DecisionLog:
    def __init__(self, buf, base: int, layout: TPControlLayout, follower_wakes: list[FutexWord]):
        self.layout = layout
        self.buf = memoryview(buf)
        self.base = base
        self.head = FutexWord(buf, base + layout.HEAD)
        self.follower_wakes = follower_wakes
        self.seen = self.head.load()  # decisions this rank has published or consumed

    # rank 0
    def publish(self, kind: int, join: bool) -> None:
        seq = self.seen + 1
        _SLOT.pack_into(self.buf, self.base + self.layout.slot(seq), seq, kind, int(join))
        self.seen = seq
        self.head.store(seq)
        self.head.wake(1 << 30)
        if kind == IDLE:
            for w in self.follower_wakes:
                w.add(1)
                w.wake()

    # ranks > 0
    def _slot(self, seq: int) -> tuple[int, int, int]:
        return _SLOT.unpack_from(self.buf, self.base + self.layout.slot(seq))

    def next_boundary(self, timeout: float = 600.0) -> bool:
        """Block until rank 0's decision for this rank's next boundary; True = join."""
        want = self.seen + 1
        while self.head.load() < want:
            if not self.head.wait_while_equal(self.head.load(), timeout=timeout, spin=2000):
                raise TimeoutError("GPU rank 0 published no decision in time")
        seq, kind, join = self._slot(want)
        if seq != want or kind != BOUNDARY:
            raise RuntimeError(f"tensor-parallel decision log out of step (want boundary "
                               f"{want}, found seq {seq} kind {kind})")
        self.seen = want
        return bool(join)

    def next_idle(self) -> bool:
        """Consume a pending idle-time decision if that is what comes next (never a boundary
        decision: that one belongs to a step this rank has not started yet)."""
        want = self.seen + 1
        if self.head.load() < want:
            return False
        seq, kind, _ = self._slot(want)
        if seq != want or kind != IDLE:
            return False
        self.seen = want
        return True
