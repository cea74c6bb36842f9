"""POSIX shared-memory segments and the private runtime directory of one server instance.

Names are unique per instance (``/dualpace-<pid>-s<start>-<token>-<what>``), segments are
created 0600, and a start-up sweep removes what a dead instance left behind in /dev/shm and
in the runtime base directory. An instance is its supervisor's pid *and* that process's
start time (/proc/<pid>/stat field 22), so neither a reused pid nor a zombie (dead, its
entry not yet reaped) keeps a dead instance's segments alive.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

import posix_ipc
import torch

log = logging.getLogger("dualpace.runtime")

SHM_DIR = Path("/dev/shm")
_PREFIX = "dualpace-"
_NAME_RE = re.compile(r"^dualpace-(\d+)-s(\d+)-[0-9a-f]+(?:-.*)?$")
# Before the start time was part of the name: the pid alone identifies the instance.
_LEGACY_RE = re.compile(r"^dualpace-(\d+)-[0-9a-f]+(?:-.*)?$")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot), or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 onwards
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22: starttime


def instance_alive(pid: int, start: int) -> bool:
    """The instance tagged (pid, start) still runs: that very process, not a pid reuse."""
    return process_start_time(pid) == start


def runtime_base() -> Path:
    return Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())


def sweep_stale() -> list[str]:
    """Remove segments and runtime dirs whose owning instance is gone (its process exited,
    is a zombie, or its pid now belongs to a process that started later). Names that are
    not this format's are left alone."""
    removed = []
    candidates = [(p, p.name) for p in SHM_DIR.glob(_PREFIX + "*")] if SHM_DIR.is_dir() else []
    candidates += [(p, p.name) for p in runtime_base().glob(_PREFIX + "*") if p.is_dir()]
    for path, name in candidates:
        m = _NAME_RE.match(name)
        if m:
            alive = instance_alive(int(m.group(1)), int(m.group(2)))
        else:
            legacy = _LEGACY_RE.match(name)
            alive = legacy is None or process_alive(int(legacy.group(1)))
        if alive:
            continue
        with contextlib.suppress(OSError, posix_ipc.ExistentialError):  # raced another sweep
            if path.is_dir():
                shutil.rmtree(path)
            else:
                posix_ipc.unlink_shared_memory("/" + name)
            removed.append(name)
    if removed:
        log.info("removed %d stale shared-memory segment(s)/dir(s) of dead instances: %s",
                 len(removed), ", ".join(sorted(removed)))
    return removed


class Instance:
    """Names and the 0700 runtime directory of one server instance."""

    def __init__(self):
        pid = os.getpid()
        self.tag = f"{_PREFIX}{pid}-s{process_start_time(pid)}-{secrets.token_hex(4)}"
        self.runtime_dir = runtime_base() / self.tag
        self.runtime_dir.mkdir(mode=0o700)
        self.segments: list[Segment] = []

    def shm_name(self, what: str) -> str:
        return f"/{self.tag}-{what}"

    def ipc_endpoint(self, what: str) -> str:
        return f"ipc://{self.runtime_dir / what}"

    def create(self, what: str, size: int) -> Segment:
        seg = Segment.create(self.shm_name(what), size)
        self.segments.append(seg)
        return seg

    def cleanup(self) -> None:
        """Unlink every segment and remove the runtime dir (idempotent, any exit path)."""
        for seg in self.segments:
            seg.unlink()
        self.segments.clear()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


class Segment:
    """One POSIX shared-memory mapping."""

    def __init__(self, name: str, shm: posix_ipc.SharedMemory, owner: bool):
        self.name = name
        self.size = shm.size
        self.buf = mmap.mmap(shm.fd, shm.size)
        shm.close_fd()
        self._owner = owner
        self._unlinked = False

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=max(size, 1))
        return cls(name, shm, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        return cls(name, posix_ipc.SharedMemory(name), owner=False)

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        count = 1
        for s in shape:
            count *= s
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.buf, dtype=dtype, count=count, offset=offset).view(shape)

    def unlink(self) -> None:
        if self._owner and not self._unlinked:
            self._unlinked = True
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_shared_memory(self.name)
