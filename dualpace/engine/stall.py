"""CPU-tier progress stalls with the meaning of the paper's Figure 1 (§1, §6).

Figure 1 (top right) plots cumulative CPU-resident tokens over time; a gated CPU tier shows
plateaus while host-resident requests sit ready but unserved. A stall is therefore the gap
between two consecutive CPU-tier token emissions, *counted only while at least one
CPU-resident request is decode-ready* (its KV on the host, not finished, no transfer into the
host pool in flight). Time when the tier is empty, or holds only requests whose KV is still
arriving, is not a stall: nothing could have run.

One emission is one CPU step that produced tokens (a batch of 64 rows is one emission, not 63
zero-length gaps), so in steady state the gaps are the CPU step times and a plateau shows up
as one long gap. Ready time between two emissions is summed, so a gap interrupted by a
not-ready stretch counts only its ready parts (the literal "counted only while" reading).
"""

from __future__ import annotations


class CpuStallClock:
    """Measures the ready time between consecutive CPU-tier emissions on the engine's clock.

    The engine calls ``set_ready(now, ready)`` whenever the tier's readiness may have
    changed and ``emitted(now)`` once per CPU step that produced tokens; ``emitted`` returns
    the closed gap (None if the tier was never ready since the previous emission).
    ``window_max(now, close)`` is the longest gap in the current window, a stall still open
    at ``now`` included; ``close`` starts a new window (the scrape-window gauge).
    """

    def __init__(self) -> None:
        self._closed = 0.0  # ready time since the last emission, from finished stretches
        self._ready_since: float | None = None  # start of the ready stretch now open
        self._was_ready = False  # the tier was ready at some point since the last emission
        self._window_max = 0.0

    def set_ready(self, now: float, ready: bool) -> None:
        if ready and self._ready_since is None:
            self._ready_since = now
            self._was_ready = True
        elif not ready and self._ready_since is not None:
            self._closed += now - self._ready_since
            self._ready_since = None

    def open_gap(self, now: float) -> float:
        """Ready time since the last emission, up to ``now``."""
        open_part = now - self._ready_since if self._ready_since is not None else 0.0
        return self._closed + open_part

    def emitted(self, now: float) -> float | None:
        gap = self.open_gap(now) if self._was_ready else None
        if gap is not None:
            self._window_max = max(self._window_max, gap)
        # The tier emitted, so it was ready up to now; whether it still is, the engine says
        # with its next set_ready (a finished last request makes it not ready).
        self._closed = 0.0
        self._ready_since = now
        self._was_ready = True
        return gap

    def window_max(self, now: float, close: bool) -> float:
        # A stall is open only while the tier is ready now; ready time that ended without an
        # emission waits to be part of the next gap, it is not an ongoing stall.
        open_now = self.open_gap(now) if self._ready_since is not None else 0.0
        value = max(self._window_max, open_now)
        if close:
            self._window_max = 0.0
        return value
