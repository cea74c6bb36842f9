"""Tensor-parallel control of the GPU worker group (paper §5: fixed-layout shared-memory
blocks carry "tensor-parallel control state").

Serving a Dense Assist on a tensor-parallel GPU group is a collective: every rank must run
its shard of the post-attention at the same point of its FIFO of stage tasks. Rank 0 alone
looks at the assist state words and publishes the decisions; the other ranks consume the
same sequence in order, so all ranks agree without a collective per boundary. A decision's
value is the assist channel the group joins (index + 1); at a stage boundary rank 0
publishes one per call it serves that needs the group, then 0 to end the boundary; while
idle, one per such call.
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
    def publish(self, kind: int, join: int) -> None:
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

    def next_decision(self, timeout: float = 600.0) -> tuple[int, int]:
        """Block until rank 0's next decision: (kind, channel to join as index + 1, or 0 at
        a boundary's end). At a boundary a follower may meet an IDLE decision: rank 0
        served that assist while idle, before it took the step this rank already began (no
        collective runs before a step's first boundary), so the follower joins it there."""
        want = self.seen + 1
        # Sleep while head still holds the value just compared: reloading it for the wait
        # would lose a decision published in between (the wait would then be for the next
        # one, which rank 0 cannot publish before this rank joins its collective).
        while (head := self.head.load()) < want:
            if not self.head.wait_while_equal(head, timeout=timeout, spin=2000):
                raise TimeoutError("GPU rank 0 published no decision in time")
        seq, kind, join = self._slot(want)
        if seq != want or kind not in (BOUNDARY, IDLE):
            raise RuntimeError(f"tensor-parallel decision log out of step (want {want}, "
                               f"found seq {seq} kind {kind})")
        self.seen = want
        return kind, join

    def next_idle(self) -> int:
        """Consume a pending idle-time decision if that is what comes next (never a boundary
        decision: that one belongs to a step this rank has not started yet): the channel
        to join (index + 1), or 0 when there is none."""
        want = self.seen + 1
        if self.head.load() < want:
            return 0
        seq, kind, join = self._slot(want)
        if seq != want or kind != IDLE:
            return 0
        self.seen = want
        return join
