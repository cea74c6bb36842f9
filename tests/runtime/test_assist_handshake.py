"""The Dense Assist handshake: state machine, timeouts, a dead peer, no lost wake-up."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
import torch

from dualpace.kernels.futex import FutexWord
from dualpace.runtime.assist import AssistChannel, AssistFailed, PeerDied
from dualpace.runtime.layouts import (
    ASSIST_GPU_RUNNING,
    ASSIST_IDLE,
    OP_ECHO,
    OP_NEO_MID,
    AssistLayout,
    WakeLayout,
)
from dualpace.runtime.shm import Segment

LAYOUT = AssistLayout(max_rows=8, hidden=32, attn_dim=32)


@pytest.fixture
def channel():
    seg = Segment.create(f"/dualpace-test-{uuid.uuid4().hex[:12]}", LAYOUT.size + 4096)
    try:
        wake = FutexWord(seg.buf, LAYOUT.size)
        yield AssistChannel(seg, LAYOUT, 0, wake), wake, seg
    finally:
        seg.unlink()


def _echo(ch, op, layer, rows):
    assert ch.state.load() == ASSIST_GPU_RUNNING
    ch.buf["hidden_out"][:rows].copy_(ch.buf["hidden_in"][:rows] * 2)


def _server(ch, wake, stop, serve=_echo):
    while not stop.is_set():
        seq = wake.load()
        if not ch.serve(serve):
            wake.wait_while_equal(seq, timeout=0.05, spin=100)


def test_round_trip_state_machine(channel):
    ch, wake, _ = channel
    stop = threading.Event()
    t = threading.Thread(target=_server, args=(ch, wake, stop))
    t.start()
    try:
        x = torch.arange(3 * 32, dtype=torch.float32).view(3, 32)
        out = ch.call(OP_ECHO, 0, x, None, None, lambda: True, timeout=5)
        assert torch.equal(out, x * 2)
        assert ch.state.load() == ASSIST_IDLE
    finally:
        stop.set()
        t.join()


def test_timeout_without_a_server(channel):
    ch, _, _ = channel
    t0 = time.monotonic()
    with pytest.raises(AssistFailed, match="timed out"):
        ch.call(OP_ECHO, 0, torch.zeros(1, 32), None, None, lambda: True, timeout=0.6)
    assert time.monotonic() - t0 < 3


def test_dead_peer_is_noticed(channel):
    ch, _, _ = channel
    t0 = time.monotonic()
    with pytest.raises(PeerDied):
        ch.call(OP_ECHO, 0, torch.zeros(1, 32), None, None, lambda: False, timeout=60)
    assert time.monotonic() - t0 < 2


def test_gpu_side_failure_reaches_the_caller(channel):
    ch, _, _ = channel

    def boom(*args):
        raise RuntimeError("kernel failed")

    raised: list[BaseException] = []

    def server():
        while not ch.ready():
            time.sleep(0.001)
        try:
            ch.serve(boom)
        except RuntimeError as e:  # recorded: a pytest.raises in a thread only warns
            raised.append(e)

    t = threading.Thread(target=server)
    t.start()
    with pytest.raises(AssistFailed, match="failed"):
        ch.call(OP_ECHO, 0, torch.zeros(1, 32), None, None, lambda: True, timeout=5)
    t.join()
    assert [str(e) for e in raised] == ["kernel failed"]  # serve re-raised after publishing
    assert ch.state.load() == ASSIST_IDLE


def test_oversized_batch_is_rejected(channel):
    ch, _, _ = channel
    with pytest.raises(ValueError, match="exceeds"):
        ch.call(OP_ECHO, 0, torch.zeros(9, 32), None, None, lambda: True)


def test_no_lost_wakeup_across_processes(channel):
    """10k assists between two processes; a lost wake-up would hang into the timeout."""
    ch, wake, _ = channel
    n = 10_000
    pid = os.fork()
    if pid == 0:  # the "GPU worker"
        code = 1
        try:
            served = 0
            deadline = time.monotonic() + 60
            while served < n and time.monotonic() < deadline:
                seq = wake.load()
                if ch.serve(_echo):
                    served += 1
                else:
                    wake.wait_while_equal(seq, timeout=1.0, spin=200)
            code = 0 if served == n else 2
        finally:
            os._exit(code)
    try:
        x = torch.ones(2, 32)
        for i in range(n):
            x[0, 0] = i
            out = ch.call(OP_ECHO, 0, x, None, None, lambda: True, timeout=5)
            assert out[0, 0].item() == 2 * i
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_wake_layout_separates_words():
    lay = WakeLayout(3)
    assert lay.offset(1) - lay.offset(0) >= 64 and lay.size >= 3 * 64


def test_two_channels_post_then_collect_in_any_order():
    """The gated pipeline posts one sub-batch's call and collects the other's: two channels
    in one segment are independent, and a NEO op returns hidden with q/k/v."""
    lay = AssistLayout(max_rows=4, hidden=8, attn_dim=8, kv_dim=4)
    seg = Segment.create(f"/dualpace-test-{uuid.uuid4().hex[:12]}", 2 * lay.size + 4096)
    try:
        wake = FutexWord(seg.buf, 2 * lay.size)
        chans = [AssistChannel(seg, lay, i * lay.size, wake) for i in range(2)]

        def neo(ch, op, layer, rows):
            h = ch.buf["hidden_in"][:rows]
            ch.buf["hidden_out"][:rows].copy_(h + layer)
            ch.buf["q_out"][:rows].copy_(ch.buf["attn_in"][:rows] * 3)
            ch.buf["k_out"][:rows].fill_(float(op))
            ch.buf["v_out"][:rows].copy_(ch.buf["pos_in"][:rows, None].float().expand(-1, 4))

        stop = threading.Event()

        def serve_both():
            while not stop.is_set():
                seq = wake.load()
                if not any(c.serve(neo) for c in chans):
                    wake.wait_while_equal(seq, timeout=0.05, spin=100)

        t = threading.Thread(target=serve_both)
        t.start()
        try:
            h, a = torch.ones(2, 8), torch.full((2, 8), 2.0)
            pos = torch.tensor([5, 9])
            b0 = chans[0].post(OP_NEO_MID, 1, h, a, None, positions=pos)
            b1 = chans[1].post(OP_NEO_MID, 3, h * 10, a, None, positions=pos + 1)
            h1, _, _, v1 = chans[1].collect(OP_NEO_MID, b1, lambda: True, timeout=5)
            h0, q0, k0, v0 = chans[0].collect(OP_NEO_MID, b0, lambda: True, timeout=5)
        finally:
            stop.set()
            t.join()
        assert torch.equal(h0, h + 1) and torch.equal(h1, h * 10 + 3)
        assert torch.equal(q0, a * 3) and torch.equal(k0, torch.full((2, 4), float(OP_NEO_MID)))
        assert v0[:, 0].tolist() == [5.0, 9.0] and v1[:, 0].tolist() == [6.0, 10.0]
        assert all(c.state.load() == ASSIST_IDLE for c in chans)
    finally:
        seg.unlink()
