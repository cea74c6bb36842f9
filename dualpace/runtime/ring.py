"""Single-producer/single-consumer byte ring in shared memory (DESIGN.md §Processes).

The producer owns ``tail`` and the consumer owns ``head``, both monotonically increasing byte
counts stored with release and loaded with acquire ordering, so a record's bytes are visible
before the counter that publishes them. Doorbells are the caller's: a futex word for a
worker, an eventfd for the asyncio engine.
"""

from __future__ import annotations

import struct

from dualpace.kernels.futex import AtomicU64
from dualpace.runtime.layouts import RingLayout

_WRAP = 0xFFFFFFFF
_LEN = struct.Struct("<I")


def _align8(n: int) -> int:
    return (n + 7) & ~7


class RingFull(RuntimeError):
    """The consumer is a whole ring behind: the record was not written."""


class Ring:
    def __init__(self, buf, offset: int, layout: RingLayout):
        self.layout = layout
        self.capacity = layout.capacity
        self._tail = AtomicU64(buf, offset + layout.TAIL)
        self._head = AtomicU64(buf, offset + layout.HEAD)
        self._data = memoryview(buf)[offset + layout.HEADER: offset + layout.size]
        # Each side caches its own counter: only it ever writes it.
        self._tail_local = self._tail.load()
        self._head_local = self._head.load()

    def write(self, payload: bytes) -> None:
        """Append one record; RingFull when the consumer is too far behind."""
        n = _align8(4 + len(payload))
        cap = self.capacity
        if n > cap // 2:
            raise ValueError(f"ring record of {len(payload)} bytes exceeds half the ring ({cap})")
        tail = self._tail_local
        pos = tail % cap
        skip = cap - pos if pos + n > cap else 0
        if tail + skip + n - self._head.load() > cap:
            raise RingFull(f"ring full ({cap} bytes)")
        if skip:
            _LEN.pack_into(self._data, pos, _WRAP)
            tail += skip
            pos = 0
        _LEN.pack_into(self._data, pos, len(payload))
        self._data[pos + 4: pos + 4 + len(payload)] = payload
        self._tail_local = tail + n
        self._tail.store(self._tail_local)

    def read_all(self) -> list[bytes]:
        """Every record published so far, in order."""
        out = []
        head, tail = self._head_local, self._tail.load()
        cap = self.capacity
        while head < tail:
            pos = head % cap
            (length,) = _LEN.unpack_from(self._data, pos)
            if length == _WRAP:
                head += cap - pos
                continue
            out.append(bytes(self._data[pos + 4: pos + 4 + length]))
            head += _align8(4 + length)
        if out or head != self._head_local:
            self._head_local = head
            self._head.store(head)
        return out

    def empty(self) -> bool:
        return self._head_local >= self._tail.load()

    def close(self) -> None:
        self._data.release()
        self._tail.close()
        self._head.close()
