"""BlockAllocator: a free list and one reference count per block, every operation O(1) per block.

A block's reference count is the number of owners that name it: block tables, prefix-cache
entries. Only a count that drops to zero puts the block back on the free list, so memory that a
sibling sequence still reads is never handed to someone else.
"""
from __future__ import annotations

from collections import deque

from engine.cache.errors import BlockRefError, OutOfBlocks


class BlockAllocator:
    """Hands out physical KV blocks 0..num_blocks-1 and counts how many owners each one has."""

    def __init__(self, num_blocks: int):
        """Start with every block free (reference count 0), oldest-freed first in line."""
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be an int >= 0, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.free = deque(range(num_blocks))
        self.refs = [0] * num_blocks

    def allocate(self, n: int = 1) -> list[int]:
        """Take n free blocks, count 1 each; all or nothing: failing changes nothing."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"can only allocate an int >= 0 of blocks, got {n!r}")
        if n > len(self.free):
            raise OutOfBlocks(n, len(self.free))   # before touching the free list
        blocks = [self.free.popleft() for _ in range(n)]
        for block in blocks:
            self.refs[block] = 1
        return blocks

    def share(self, block: int) -> None:
        """Add one owner to a block in use (a fork, or a prefix-cache hit)."""
        self.check_id(block)
        if self.refs[block] == 0:
            raise BlockRefError(block, f"block {block} is free: it cannot be shared")
        self.refs[block] += 1

    def release(self, block: int) -> None:
        """Drop one owner; the last owner's release frees the block."""
        self.check_id(block)
        if self.refs[block] == 0:
            raise BlockRefError(block,
                                f"block {block} released too often: it is already free")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)

    def refcount(self, block: int) -> int:
        """How many owners name this block (0 means free)."""
        self.check_id(block)
        return self.refs[block]

    @property
    def num_free(self) -> int:
        """Blocks on the free list, ready to allocate."""
        return len(self.free)

    def check_id(self, block: int) -> None:
        """Raise an IndexError naming the block unless it is an id in this pool."""
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block!r} is not in this pool of {self.num_blocks} blocks "
                             f"(ids 0..{self.num_blocks - 1})")
