"""Stage boundaries that are completion points, not enqueue points (paper §5: "a CUDA event
tracks the active task"; issue 11).

On CUDA the host enqueues kernels far ahead of the device. If the GPU worker enqueued a whole
forward and only then looked for a Dense Assist, the assist would wait behind every layer
already queued, and stage-boundary priority (§4.2) would mean nothing. The gate records an
event after each main stage and lets at most ``depth`` of them be outstanding: enqueuing the
next stage waits until the oldest completed, and while it waits, ready assists are served, so
an assist runs behind at most ``depth`` stages.

Off CUDA the stages run as they are issued, there is nothing to track, and the gate is inert.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable

DEFAULT_DEPTH = 2  # main stages the device may have queued ahead of an assist


class StageGate:
    def __init__(self, make_event: Callable[[], object] | None,
                 serve_ready: Callable[[], bool] | None, depth: int = DEFAULT_DEPTH):
        """``make_event``: records an event on the compute stream and returns it (an object
        with ``query()``); None: stages complete when issued. ``serve_ready``: serves the
        assists that are ready now (returns whether it served one); None: a rank that does
        not decide (a tensor-parallel follower waits, it does not serve)."""
        if depth < 1:
            raise ValueError(f"stage gate depth must be >= 1, got {depth}")
        self.make_event = make_event
        self.serve_ready = serve_ready
        self.depth = depth
        self._events: collections.deque = collections.deque()
        self.waits = 0  # stages that had to wait for the device (tests, stats)
        self.served_while_waiting = 0

    @property
    def outstanding(self) -> int:
        return len(self._events)

    def stage_enqueued(self) -> None:
        """Called after a main stage was issued: returns once at most ``depth`` stages are
        outstanding, serving ready assists meanwhile."""
        if self.make_event is None:
            return
        self._events.append(self.make_event())
        waited = False
        while len(self._events) > self.depth:
            if self._events[0].query():
                self._events.popleft()
                continue
            waited = True
            if self.serve_ready is not None and self.serve_ready():
                self.served_while_waiting += 1
            else:
                os.sched_yield()
        self.waits += waited
        while self._events and self._events[0].query():  # completed meanwhile
            self._events.popleft()

    def drain(self) -> None:
        """Forget the stages of a finished step (the step's results were waited on)."""
        self._events.clear()
