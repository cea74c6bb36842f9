"""Futex wait/wake on a 32-bit word inside a shared buffer (Dense Assist handshake, §4.2, §5).

The word is usually in a posix_ipc mapping shared by the CPU and GPU worker processes. cffi
releases the GIL around the C calls, so a waiting thread never blocks the interpreter.
"""

from __future__ import annotations

from dualpace.kernels._lib import require

_NS = 1_000_000_000


def _timeout_ns(timeout: float | None) -> int:
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError(f"timeout: must be >= 0 or None, got {timeout!r}")
    return int(timeout * _NS)


class FutexWord:
    """A 4-byte-aligned uint32 at ``offset`` of a writable buffer (mmap, bytearray...)."""

    def __init__(self, buffer, offset: int = 0):
        ffi, lib = require()
        view = memoryview(buffer)
        if view.readonly:
            raise ValueError("buffer: must be writable")
        if offset < 0 or offset % 4 or offset + 4 > view.nbytes:
            raise ValueError(f"offset: {offset} is not a 4-byte aligned word inside "
                             f"a {view.nbytes}-byte buffer")
        self._buf = ffi.from_buffer(buffer)  # keeps the buffer alive and exported
        self._ffi, self._lib = ffi, lib
        self._addr = ffi.cast("uint32_t *", ffi.cast("char *", self._buf) + offset)
        if int(ffi.cast("uintptr_t", self._addr)) % 4:
            raise ValueError("buffer: the word's address is not 4-byte aligned")

    def close(self) -> None:
        """Release the buffer export (an mmap cannot be closed while it is exported)."""
        if self._buf is not None:
            self._ffi.release(self._buf)
            self._buf = self._addr = None

    @property
    def address(self):
        """The word as a cffi ``uint32_t *`` (for C code that reads it)."""
        return self._addr

    def load(self) -> int:
        return self._lib.dp_atomic_load(self._addr)

    def store(self, value: int) -> None:
        self._lib.dp_atomic_store(self._addr, value)

    def add(self, delta: int = 1) -> int:
        """Atomically add ``delta`` (mod 2^32); returns the new value."""
        return self._lib.dp_atomic_add(self._addr, delta)

    def compare_exchange(self, expected: int, desired: int) -> bool:
        return bool(self._lib.dp_atomic_cas(self._addr, expected, desired))

    def wait(self, expected: int, timeout: float | None = None) -> bool:
        """Sleep while the word equals ``expected``. False only on timeout; may return True
        spuriously (signal), so callers re-check the word."""
        rc = self._lib.dp_futex_wait(self._addr, expected, _timeout_ns(timeout))
        if rc < 0:
            raise OSError("futex wait failed")
        return rc == 0

    def wake(self, n: int = 1) -> int:
        rc = self._lib.dp_futex_wake(self._addr, n)
        if rc < 0:
            raise OSError("futex wake failed")
        return rc

    def wait_while_equal(self, value: int, timeout: float | None = None,
                         spin: int = 2000) -> bool:
        """Spin (bounded) then futex-wait until the word differs from ``value``.
        True when it changed, False on timeout."""
        if spin < 0:
            raise ValueError(f"spin: must be >= 0, got {spin}")
        return self._lib.dp_wait_while_equal(self._addr, value, spin, _timeout_ns(timeout)) == 0


class AtomicU64:
    """An 8-byte-aligned uint64 counter in a shared buffer, read with acquire and written with
    release semantics (ring head/tail: the payload is visible before the counter moves)."""

    def __init__(self, buffer, offset: int = 0):
        ffi, lib = require()
        view = memoryview(buffer)
        if offset < 0 or offset % 8 or offset + 8 > view.nbytes:
            raise ValueError(f"offset: {offset} is not an 8-byte aligned word inside "
                             f"a {view.nbytes}-byte buffer")
        self._buf = ffi.from_buffer(buffer)
        self._ffi, self._lib = ffi, lib
        self._addr = ffi.cast("uint64_t *", ffi.cast("char *", self._buf) + offset)

    @property
    def address(self):
        """The word as a cffi ``uint32_t *`` (for C code that reads it)."""
        return self._addr

    def load(self) -> int:
        return self._lib.dp_atomic_load64(self._addr)

    def store(self, value: int) -> None:
        self._lib.dp_atomic_store64(self._addr, value)

    def close(self) -> None:
        if self._buf is not None:
            self._ffi.release(self._buf)
            self._buf = self._addr = None
