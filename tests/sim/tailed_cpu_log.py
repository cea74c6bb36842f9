"""A CPU step log shaped like this box's: most steps are 1-row ones, and the fewer the rows
the longer a step's right tail (5% of 1-row steps at 4x their body, of 13-row ones at 1.5x),
every batch size's mean on two slopes with the knee at 3 rows."""

from __future__ import annotations

TAILS = {1: 4.0, 2: 3.0, 3: 2.5}  # the slow 5%'s factor; 1.5 past 3 rows
COUNTS = {1: 2000, 2: 600, 3: 300, **{b: 60 for b in range(4, 14)}}


def mean_seconds(batch: int) -> float:
    """The mean time of a step of ``batch`` rows (without context)."""
    return 0.0005 + 3.3e-4 * min(batch, 3) + 1.2e-4 * max(batch - 3, 0)


def tailed_steps() -> list[tuple[int, float]]:
    """(rows, seconds) for every step, each batch size averaging ``mean_seconds``: 95% of
    its steps at a body time, every 20th at ``TAILS`` times it."""
    out = []
    for b, n in COUNTS.items():
        tail = TAILS.get(b, 1.5)
        body = mean_seconds(b) / (0.95 + 0.05 * tail)
        out += [(b, tail * body if i % 20 == 0 else body) for i in range(n)]
    return out
