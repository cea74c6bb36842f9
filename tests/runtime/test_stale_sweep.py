"""The start-up sweep identifies an instance by its supervisor's pid *and* start time: a
dead instance's segments go even while its pid lingers as a zombie or belongs to someone
else; a live instance's stay."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time

import posix_ipc

from dualpace.runtime.shm import SHM_DIR, Instance, process_start_time, sweep_stale


def _segment(pid: int, start: int | None) -> str:
    mid = f"s{start}-" if start is not None else ""  # None: the name before start times
    name = f"dualpace-{pid}-{mid}{secrets.token_hex(4)}-test"
    posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600, size=64).close_fd()
    return name


def _exists(name: str) -> bool:
    return (SHM_DIR / name).exists()


def _unlink(*names: str) -> None:
    for n in names:
        if _exists(n):
            posix_ipc.unlink_shared_memory("/" + n)


def test_live_instance_kept_and_a_reused_pid_swept():
    me, start = os.getpid(), process_start_time(os.getpid())
    assert start is not None
    mine = _segment(me, start)
    reused = _segment(me, start - 1)  # an earlier process that had this pid
    try:
        removed = sweep_stale()
        assert _exists(mine) and mine not in removed
        assert not _exists(reused) and reused in removed
    finally:
        _unlink(mine, reused)


def test_a_zombie_supervisors_segments_are_swept():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "supervisor": wait for its start time to be read, then die
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    try:
        start = process_start_time(pid)
        assert start is not None
        name = _segment(pid, start)
        os.write(w, b"x")
        deadline = time.monotonic() + 10
        while process_start_time(pid) is not None:  # exited, not reaped: a zombie
            assert time.monotonic() < deadline, "child did not exit"
            time.sleep(0.01)
        assert os.path.exists(f"/proc/{pid}"), "the zombie's entry must linger for the test"
        try:
            assert name in sweep_stale() and not _exists(name)
        finally:
            _unlink(name)
    finally:
        os.close(w)
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_legacy_names_go_by_pid_alone():
    me = os.getpid()
    live = _segment(me, None)
    digits = f"dualpace-{me}-12345678-test"  # an all-digit token is not a start time
    posix_ipc.SharedMemory("/" + digits, posix_ipc.O_CREX, mode=0o600, size=64).close_fd()
    try:
        removed = sweep_stale()
        assert _exists(live) and _exists(digits) and not {live, digits} & set(removed)
    finally:
        _unlink(live, digits)


def test_instance_tags_carry_pid_and_start_time():
    inst = Instance()
    try:
        pid, start = inst.tag.split("-")[1:3]
        assert int(pid) == os.getpid()
        assert start == f"s{process_start_time(os.getpid())}"
        seg = inst.create("probe", 64)
        assert seg.name.startswith(f"/{inst.tag}-") and not sweep_stale().count(seg.name[1:])
        assert _exists(seg.name[1:])
    finally:
        inst.cleanup()
