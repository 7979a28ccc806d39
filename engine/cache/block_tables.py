"""BlockTables: which physical blocks each sequence names and how many tokens it holds, with no tensors.

The bookkeeping half of the paged cache (its K/V storage is engine/cache/kv_pool.py). Sequence `s`
keeps a table `tables[s]` (logical block i is physical block `tables[s][i]`) and a length
`lengths[s]`; the allocator counts each block's owners. Every answer here is worked out from ints,
so it is tested in microseconds (tests/test_block_tables.py), like nano-vllm's block manager.
"""
from __future__ import annotations

from collections.abc import Container, Iterable

from engine.blocks import ceil_div, check_block_size


class BlockTables:
    """Block tables and lengths of the live sequences, over an allocator of reference-counted blocks."""

    def __init__(self, block_size: int, allocator, away: Container[int] = ()):
        """`away`: sequences that exist but hold no table now (the paged cache's swapped-out ones)."""
        self.block_size = check_block_size(block_size)
        self.allocator, self.away = allocator, away
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def create(self, seq: int) -> None:
        """Start an empty sequence: no blocks until a reserve asks for them."""
        if seq in self.tables or seq in self.away:
            raise ValueError(f"sequence {seq} already exists")
        self.tables[seq], self.lengths[seq] = [], 0

    def table(self, seq: int) -> list[int]:
        """seq's block table, or a KeyError that says why there is none."""
        if seq not in self.tables:
            why = "swapped out (swap_in first)" if seq in self.away else "unknown (create it first)"
            raise KeyError(f"sequence {seq} is {why}")
        return self.tables[seq]

    def length(self, seq: int) -> int:
        """Tokens stored for seq (a KeyError that says why for one without a table)."""
        self.table(seq)
        return self.lengths[seq]

    def shared_writes(self, seq: int, n: int) -> list[int]:
        """Table indices that n new tokens of seq write into while another owner still names the block."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"can only reserve an int >= 0 of tokens, got {n!r}")
        table, start = self.table(seq), self.lengths[seq]
        end = min(len(table), ceil_div(start + n, self.block_size)) if n else 0
        return [i for i in range(start // self.block_size, end) if self.allocator.refcount(table[i]) > 1]

    def blocks_wanted(self, seq: int, n: int) -> int:
        """Free blocks a reserve of n tokens would take: new blocks plus copies of shared blocks written into."""
        copies = self.shared_writes(seq, n)
        needed = ceil_div(self.lengths[seq] + n, self.block_size)
        return len(copies) + max(0, needed - len(self.tables[seq]))

    def share_blocks(self, seq: int, blocks: Iterable[int]) -> None:
        """Append blocks that already hold seq's next positions (a prefix-cache hit), each with one more
        owner; a free block among them is refused before anything changes."""
        table, blocks = self.table(seq), list(blocks)
        for block in blocks:                  # all checked before any is shared
            if self.allocator.refcount(block) == 0:
                raise ValueError(f"sequence {seq}: block {block} is free, so it holds nobody's K/V to share")
        for block in blocks:
            self.allocator.share(block)
        table.extend(blocks)

    def set_length(self, seq: int, length: int) -> None:
        """Record that seq's first `length` positions hold K/V written without a forward (a prefix hit,
        a simulation); more than its blocks' slots is refused."""
        slots = len(self.table(seq)) * self.block_size
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= slots:
            raise ValueError(f"sequence {seq}: length {length!r} is outside the {slots} slots of its blocks")
        self.lengths[seq] = length
