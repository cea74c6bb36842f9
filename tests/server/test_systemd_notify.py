"""The systemd notify client: messages arrive, and a reader that falls behind never blocks
the server (a unix datagram send blocks once the receiver holds 10 unread datagrams)."""

from __future__ import annotations

import os
import secrets
import socket
import threading

from dualpace.server.systemd import Notifier


def test_messages_arrive_on_a_path_and_an_abstract_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    for address, bind in ((path, path), ("@dualpace-test-" + secrets.token_hex(4), None)):
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(bind or "\0" + address[1:])
        rx.settimeout(2)
        try:
            n = Notifier(address)
            assert n.enabled and n.ready("serving") and n.watchdog()
            assert rx.recv(4096).decode() == "READY=1\nSTATUS=serving"
            assert rx.recv(4096).decode() == "WATCHDOG=1"
        finally:
            rx.close()


def test_a_reader_that_falls_behind_never_blocks_the_sender(tmp_path):
    path = str(tmp_path / "notify.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)  # never read
    try:
        n = Notifier(path)
        sent: list[bool] = []
        # In a thread: a sender that blocks must fail this test, not hang the suite.
        t = threading.Thread(target=lambda: sent.extend(n.watchdog() for _ in range(200)),
                             daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "the notify send blocked on a full receiver queue"
        assert sent[0] and not sent[-1]  # the first went through, the overflow was dropped
        rx.settimeout(1)
        assert rx.recv(4096) == b"WATCHDOG=1"
    finally:
        rx.close()


def test_no_socket_means_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    n = Notifier()
    assert not n.enabled and not n.ready("x") and n.watchdog_interval == 1.5
    os.environ.pop("WATCHDOG_USEC")
    assert Notifier().watchdog_interval is None
