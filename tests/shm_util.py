"""Shared-memory segments of one instance: ``dualpace-<pid>-<random>`` names belong to the
process with that pid. Leak checks look only at their own instance's, so another DualPace
on the machine (a benchmark, a second test run) cannot break them."""

from __future__ import annotations

import os


def owned_segments(pid: int) -> set[str]:
    prefix = f"dualpace-{pid}-"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
