"""A virtual-time asyncio event loop: the production engine loops run on it unchanged.

The loop's clock is a number the loop advances itself. When no callback is ready, the
selector is asked to wait until the next timer; the virtual selector does not wait, it moves
the clock to that timer and returns at once. So ``asyncio.sleep(d)`` (the simulated workers'
step costs) takes d seconds of simulated time and no real time, timers fire in time order
(ties in the order they were scheduled), and every callback that is ready at one instant runs
before the clock moves: a discrete-event simulator whose events are asyncio's own timers.

No file descriptor is ever ready in a simulation: a wait with nothing scheduled is a
deadlock of the simulated system (every loop waiting on an event nobody will set), reported
as ``SimulationStalled`` instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors


class SimulationStalled(RuntimeError):
    """Nothing is ready and no timer is pending: the simulated system cannot progress."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self) -> None:
        self.now = 0.0
        self._keys: dict[object, selectors.SelectorKey] = {}

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj):
        return self._keys.pop(fileobj)

    def select(self, timeout=None):
        if timeout is None:
            raise SimulationStalled("no event is pending: every task waits on something "
                                    "that no scheduled work will provide")
        self.now += max(timeout, 0.0)
        return []

    def close(self) -> None:
        self._keys.clear()

    def get_map(self):
        return self._keys


def _fd(fileobj) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``time()`` is simulated seconds since the loop was made."""

    def __init__(self) -> None:
        self._vsel = _VirtualSelector()
        super().__init__(self._vsel)
        self._clock_resolution = 1e-9  # timers due within this of now fire now

    def time(self) -> float:
        return self._vsel.now


def run_virtual(coro):
    """Run ``coro`` to completion on a fresh virtual-time loop; returns its result."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
