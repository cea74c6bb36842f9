"""CPU-core and NUMA placement of worker processes (DESIGN.md §Processes)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger("dualpace.runtime")


def parse_cores(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11]."""
    cores: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-"))
                if hi < lo:
                    raise ValueError
                cores.extend(range(lo, hi + 1))
            else:
                cores.append(int(part))
    except ValueError:
        raise ValueError(f"cores: expected a list like '0-3,8', got {text!r}") from None
    if not cores or any(c < 0 for c in cores):
        raise ValueError(f"cores: expected a non-empty list of core ids, got {text!r}")
    return sorted(set(cores))


def split_cores(allowed: list[int], gpu: str = "", cpu: str = "") -> tuple[list[int], list[int]]:
    """GPU-worker and CPU-worker cores: the flags if given, else the allowed cores split in two
    (the GPU worker needs few; on 2 cores each worker gets one)."""
    allowed = sorted(allowed)
    gpu_cores = parse_cores(gpu) if gpu else []
    cpu_cores = parse_cores(cpu) if cpu else []
    for name, cores in (("gpu_cores", gpu_cores), ("cpu_cores", cpu_cores)):
        bad = [c for c in cores if c not in allowed]
        if bad:
            raise ValueError(f"{name}: cores {bad} are not available to this process "
                             f"(allowed: {allowed})")
    if not gpu_cores and not cpu_cores:
        if len(allowed) == 1:
            return allowed, allowed
        n_gpu = max(1, len(allowed) // 4)
        return allowed[:n_gpu], allowed[n_gpu:]
    if not gpu_cores:
        gpu_cores = [c for c in allowed if c not in cpu_cores] or allowed[:1]
    if not cpu_cores:
        cpu_cores = [c for c in allowed if c not in gpu_cores] or allowed[-1:]
    return gpu_cores, cpu_cores


def split_among(cores: list[int], parts: int) -> list[list[int]]:
    """Contiguous shares of ``cores`` for ``parts`` ranks (sharing cores when too few)."""
    if parts <= len(cores):
        per = len(cores) // parts
        return [cores[i * per:(i + 1) * per] if i < parts - 1 else cores[i * per:]
                for i in range(parts)]
    return [[cores[i % len(cores)]] for i in range(parts)]


def _numa_node_of(core: int) -> int | None:
    base = f"/sys/devices/system/cpu/cpu{core}"
    try:
        for name in os.listdir(base):
            if name.startswith("node") and name[4:].isdigit():
                return int(name[4:])
    except OSError:
        return None
    return None


def pin_current_process(cores: list[int]) -> str:
    """Pin to ``cores`` and prefer their NUMA node's memory. Returns a line for the log."""
    os.sched_setaffinity(0, cores)
    node = _numa_node_of(cores[0])
    libname = ctypes.util.find_library("numa")
    if node is None or libname is None:
        return f"pinned to cores {cores}; libnuma not available, plain affinity only"
    try:
        numa = ctypes.CDLL(libname)
        if numa.numa_available() < 0:
            return f"pinned to cores {cores}; NUMA not available, plain affinity only"
        numa.numa_set_preferred(node)
    except (OSError, AttributeError) as e:
        return f"pinned to cores {cores}; libnuma failed ({e}), plain affinity only"
    return f"pinned to cores {cores}, memory preferred on NUMA node {node}"


PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = 9) -> None:
    """PR_SET_PDEATHSIG, then exit if the parent is already gone (the race prctl leaves)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)
