"""The C kernels' thread team (cext/team.c): how long its idle threads spin, and on what.

Every parallel C kernel runs on helper threads of our own rather than OpenMP's, so that
their idle wait can follow the other tier: an idle member spins ``short`` always, then on
up to ``long`` while the gate word (the other tier's occupancy word,
runtime/thread_share.py) reads 0 - the other tier is not in a step and the core is ours to
keep warm - yielding the core to any thread woken on it, and then sleeps on a futex until
the next call. Without a gate (this process owns its cores) it spins up to ``long``.
"""

from __future__ import annotations

from dualpace.kernels._lib import require

DEFAULT_SHORT_NS = 50_000
DEFAULT_LONG_NS = 5_000_000


def set_gate(word) -> None:
    """Spin past ``short`` only while ``*word`` is 0 (a cffi ``uint32_t *``, e.g.
    FutexWord.address), or with ``None`` whenever there is time left of ``long``. Returns
    once no team member still reads the old word, so its memory may then be unmapped."""
    ffi, lib = require()
    lib.dp_team_set_gate(ffi.NULL if word is None else word)


def set_spin(short_ns: int = DEFAULT_SHORT_NS, long_ns: int = DEFAULT_LONG_NS) -> None:
    """The two spin budgets, in nanoseconds (0 <= short <= long)."""
    _, lib = require()
    if lib.dp_team_set_spin(int(short_ns), int(long_ns)) != 0:
        raise ValueError(f"team spin: need 0 <= short_ns <= long_ns, got {short_ns}, {long_ns}")


def parks() -> int:
    """How often a helper has gone to sleep waiting for work, since the process started."""
    return int(require()[1].dp_team_parks())


def helpers() -> int:
    """Helper threads started so far (the team grows to the largest thread count asked)."""
    return int(require()[1].dp_team_helpers())
