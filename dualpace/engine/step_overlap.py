"""How much of a step ran while the other worker group had a step in flight.

On a box where the two workers share cores (no GPU: ``--gpu-device cpu``), a step runs
slower while the other group computes. The step log records, per step, ``beside`` (the
other group ran at some point during it) and ``overlap`` (for how many seconds it did): the
simulator fits a contention factor to the latter (``dualpace/sim/costs.py``) and replays it
as processor sharing (``dualpace/sim/workers.py``). A binary flag alone cannot tell a step
that overlapped for a millisecond from one that overlapped throughout; on this box a CPU
step alone took 0.7x the pooled fit and one beside a GPU step 1.05-1.3x, by how much of it
overlapped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

KINDS = ("gpu", "cpu")


@dataclass(frozen=True)
class Snapshot:
    """The other group at a step's start."""

    busy: bool
    started: int
    busy_time: float


class StepOverlap:
    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.in_flight = dict.fromkeys(KINDS, 0)
        self.started = dict.fromkeys(KINDS, 0)
        self._busy_total = dict.fromkeys(KINDS, 0.0)  # closed busy intervals, seconds
        self._busy_since = dict.fromkeys(KINDS, 0.0)  # start of the open one

    def busy_time(self, kind: str) -> float:
        """Seconds during which ``kind`` had at least one step in flight, up to now."""
        open_part = self.clock() - self._busy_since[kind] if self.in_flight[kind] else 0.0
        return self._busy_total[kind] + open_part

    @staticmethod
    def other(kind: str) -> str:
        return "cpu" if kind == "gpu" else "gpu"

    def begin(self, kind: str) -> Snapshot:
        if not self.in_flight[kind]:
            self._busy_since[kind] = self.clock()
        self.in_flight[kind] += 1
        self.started[kind] += 1
        o = self.other(kind)
        return Snapshot(self.in_flight[o] > 0, self.started[o], self.busy_time(o))

    def end(self, kind: str, snap: Snapshot) -> tuple[int, float]:
        """(beside, overlap): 1 if the other group had a step in flight at any time during
        this one, and the seconds it had."""
        self.in_flight[kind] -= 1
        if not self.in_flight[kind]:
            self._busy_total[kind] += self.clock() - self._busy_since[kind]
        o = self.other(kind)
        overlap = max(0.0, self.busy_time(o) - snap.busy_time)
        beside = int(snap.busy or self.started[o] != snap.started or self.in_flight[o] > 0)
        return beside, overlap
