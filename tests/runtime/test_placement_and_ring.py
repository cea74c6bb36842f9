"""Core lists from flags, and the shared-memory ring across its wrap-around."""

from __future__ import annotations

import uuid

import pytest

from dualpace.runtime.layouts import RingLayout
from dualpace.runtime.placement import parse_cores, split_cores
from dualpace.runtime.ring import Ring, RingFull
from dualpace.runtime.shm import Segment


def test_parse_cores_ranges_lists_and_duplicates():
    assert parse_cores("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cores(" 2 , 1,1,0-1 ") == [0, 1, 2]


@pytest.mark.parametrize("bad", ["", ",", "3-1", "0,3-1", "a", "1-", "-1", "0-2-4", "1.5", "0--1"])
def test_parse_cores_refuses_bad_input_with_a_clear_error(bad):
    with pytest.raises(ValueError, match="cores: expected"):
        parse_cores(bad)


def test_split_cores_refuses_cores_outside_the_allowed_set():
    with pytest.raises(ValueError, match="gpu_cores"):
        split_cores([0, 1], gpu="0,5")
    assert split_cores([0, 1]) == ([0], [1])


def test_ring_wraps_around_and_keeps_order():
    """Records of varying sizes through a 4 KiB ring, many times its capacity: every record
    comes out whole and in order, including those written across the wrap marker."""
    layout = RingLayout(capacity=4096)
    seg = Segment.create(f"/dualpace-test-{uuid.uuid4().hex[:12]}", layout.size)
    try:
        producer, consumer = Ring(seg.buf, 0, layout), Ring(seg.buf, 0, layout)
        sent, got = [], []
        for i in range(2000):
            payload = bytes([i % 251]) * (1 + (i * 37) % 700)
            producer.write(payload)
            sent.append(payload)
            if i % 3 == 2:  # the consumer lags, so the ring fills and wraps with data in it
                got += consumer.read_all()
        got += consumer.read_all()
        assert got == sent
        assert consumer.empty()
        with pytest.raises(ValueError, match="exceeds half the ring"):
            producer.write(b"x" * 3000)
        for _ in range(5):
            producer.write(b"y" * 700)
        with pytest.raises(RingFull):
            producer.write(b"z" * 700)
        producer.close()
        consumer.close()
    finally:
        seg.unlink()
