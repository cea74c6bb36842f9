"""Exact block accounting of the paged KV pool."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpace.kv.block_pool import BlockPool, BlockTable, blocks_for_tokens


def test_blocks_for_tokens():
    assert [blocks_for_tokens(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


def test_allocate_free_accounting():
    pool = BlockPool(10, 16)
    a = pool.allocate(4)
    b = pool.allocate(6)
    assert sorted(a + b) == list(range(10))
    assert pool.num_free == 0 and not pool.can_allocate(1) and pool.can_allocate(0)
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.free(a)
    assert pool.num_free == 4 and pool.num_used == 6
    with pytest.raises(ValueError, match="freed twice"):
        pool.free(a[:1])
    with pytest.raises(ValueError, match="never allocated"):
        BlockPool(2, 16).free([1])


def test_block_table_grows_on_block_boundaries():
    pool = BlockPool(8, 4)
    t = BlockTable(pool)
    t.append(4)
    assert len(t.blocks) == 1
    t.append(1)
    assert len(t.blocks) == 2 and t.num_tokens == 5
    assert t.slots(3, 5) == [t.blocks[0] * 4 + 3, t.blocks[1] * 4]
    t.release()
    assert pool.num_free == 8 and t.blocks == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), max_size=40))
def test_random_appends_and_releases_never_leak(ops):
    pool = BlockPool(32, 8)
    tables = [BlockTable(pool) for _ in range(6)]
    for which, n in ops:
        t = tables[which]
        if t.can_append(n):
            t.append(n)
        else:
            t.release()
        assert len(t.blocks) == blocks_for_tokens(t.num_tokens, 8)
        held = [b for tb in tables for b in tb.blocks]
        assert len(held) == len(set(held)) == pool.num_used
        assert pool.num_used + pool.num_free == 32
    for t in tables:
        t.release()
    assert pool.num_free == 32
