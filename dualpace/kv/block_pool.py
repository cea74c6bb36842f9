"""Paged KV block accounting (vLLM's PagedAttention; paper §2.1, §4.1 "physical KV blocks").

Pure Python, no torch: the schedulers use it to reason about capacity and must stay testable
without tensors. A block id indexes the first dimension of every layer's K and V tensor.
"""

from __future__ import annotations


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` KV entries."""
    return -(-num_tokens // block_size)


class BlockPool:
    """A fixed set of block ids with exact free/used accounting.

    Freed blocks go to the back of the free list so that a block just released is the last to
    be reused (makes use-after-free bugs show up as wrong tokens in tests, not silent reuse).
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if not self.can_allocate(n):
            raise MemoryError(f"cannot allocate {n} KV blocks: {len(self._free)} free")
        ids = self._free[:n]
        del self._free[:n]
        self._used.update(ids)
        return ids

    def free(self, ids: list[int]) -> None:
        for b in ids:
            if b not in self._used:
                raise ValueError(f"KV block {b} freed twice or never allocated")
        self._used.difference_update(ids)
        self._free.extend(ids)


class BlockTable:
    """The ordered blocks of one request in one pool, and how many tokens they hold."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.blocks: list[int] = []
        self.num_tokens = 0

    def blocks_needed(self, num_tokens: int) -> int:
        """Extra blocks needed to hold ``num_tokens`` tokens in total."""
        return max(0, blocks_for_tokens(num_tokens, self.pool.block_size) - len(self.blocks))

    def can_append(self, n: int = 1) -> bool:
        return self.pool.can_allocate(self.blocks_needed(self.num_tokens + n))

    def append(self, n: int = 1) -> None:
        """Make room for ``n`` more tokens (allocating blocks as needed) and count them."""
        need = self.blocks_needed(self.num_tokens + n)
        if need:
            self.blocks += self.pool.allocate(need)
        self.num_tokens += n

    def slots(self, start: int, end: int) -> list[int]:
        """Flat slot ids (block * block_size + offset) of token positions [start, end)."""
        bs = self.pool.block_size
        return [self.blocks[p // bs] * bs + p % bs for p in range(start, end)]

    def release(self) -> None:
        self.pool.free(self.blocks)
        self.blocks = []
        self.num_tokens = 0
