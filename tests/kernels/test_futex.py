"""Futex wait/wake across two processes on a posix_ipc shared-memory segment."""

from __future__ import annotations

import mmap
import os
import time
import uuid

import posix_ipc
import pytest

from dualpace.kernels.futex import FutexWord


@pytest.fixture
def shared_word():
    name = f"/dualpace-test-{uuid.uuid4().hex[:12]}"
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=4096)
    buf = mmap.mmap(shm.fd, shm.size)
    shm.close_fd()
    word = FutexWord(buf, 64)
    try:
        yield word, buf
    finally:
        word.close()
        buf.close()
        shm.unlink()


def _child(fn) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn()
        finally:
            os._exit(code)
    return pid


def _join(pid: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("child did not finish")


def test_wait_times_out(shared_word):
    word, _ = shared_word
    word.store(7)
    t0 = time.monotonic()
    assert word.wait(7, timeout=0.05) is False
    assert time.monotonic() - t0 >= 0.045
    assert word.wait_while_equal(7, timeout=0.05) is False


def test_wait_returns_at_once_when_value_differs(shared_word):
    word, _ = shared_word
    word.store(1)
    assert word.wait(0, timeout=1.0) is True
    assert word.wait_while_equal(0, timeout=1.0) is True


def test_wake_from_other_process(shared_word):
    word, _ = shared_word
    word.store(0)

    def child():
        time.sleep(0.1)
        word.store(5)
        word.wake()
        return 0

    pid = _child(child)
    t0 = time.monotonic()
    assert word.wait_while_equal(0, timeout=5.0, spin=0) is True
    assert word.load() == 5  # it returned because the child stored, not spuriously
    # Woken, not timed out: a missing wake() would sleep the whole 5 s timeout.
    assert time.monotonic() - t0 < 4.0
    assert _join(pid) == 0


def test_no_lost_wakeup_under_100k_ping_pongs(shared_word):
    word, _ = shared_word
    n = 100_000
    word.store(0)

    def child():
        for i in range(n):
            if not word.wait_while_equal(2 * i, timeout=5.0, spin=200):
                return 3  # a lost wake-up would time out here
            if word.load() != 2 * i + 1:
                return 4
            word.store(2 * i + 2)
            word.wake()
        return 0

    pid = _child(child)
    for i in range(n):
        word.store(2 * i + 1)
        word.wake()
        assert word.wait_while_equal(2 * i + 1, timeout=5.0, spin=200), f"lost wake-up at {i}"
    assert word.load() == 2 * n
    assert _join(pid) == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="offset"):
        FutexWord(bytearray(16), 2)
    with pytest.raises(ValueError, match="offset"):
        FutexWord(bytearray(16), 16)
    with pytest.raises(ValueError, match="writable"):
        FutexWord(b"\0" * 16, 0)
    with pytest.raises(ValueError, match="timeout"):
        FutexWord(bytearray(16)).wait(0, timeout=-1)
