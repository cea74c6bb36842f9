"""systemd notify protocol without libsystemd: one datagram per message to $NOTIFY_SOCKET
(a leading '@' names an abstract socket). No-op when not run under systemd."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None):
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        usec = os.environ.get("WATCHDOG_USEC")
        # Ping at half the watchdog period (systemd's advice); None = no watchdog asked for.
        self.watchdog_interval = int(usec) / 2e6 if usec and usec.isdigit() else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        # Non-blocking: a unix datagram send blocks while the receiver's queue is full (10
        # datagrams by default), and a blocked send here would freeze the event loop that
        # serves every request. A notification the reader has no room for is dropped.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                           | socket.SOCK_NONBLOCK) as s:
            try:
                s.sendto("\n".join(lines).encode(), addr)
            except OSError:  # BlockingIOError included
                return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")
