"""The scheduler's side of prefix caching: attach on admission, publish what was computed, evict when short.

A mixin of `Scheduler` (kept apart so the step loop reads on its own). It uses the scheduler's
`cache`, `prefix` (a PrefixCache, or None), `caps` (the cache's abilities), `evictable` and
`prefix_stats`. Without a prefix cache every method falls back to the plain cache.
"""
from __future__ import annotations

from engine.serve.request import Sequence


class PrefixSharing:
    """Admission through the prefix cache, publishing computed blocks, and evicting unused ones."""

    def free_blocks(self) -> int:
        """Blocks on the allocator's free list right now."""
        return self.cache.allocator.num_free

    def make_room(self, blocks: int) -> bool:
        """True if `blocks` blocks are free, evicting unused prefix-cache blocks first if that helps."""
        return self.free_blocks() >= blocks or (self.evict(blocks) > 0 and self.free_blocks() >= blocks)

    def evict(self, blocks_wanted: int) -> int:
        """Free prefix-cache blocks that no sequence uses, until `blocks_wanted` are free.

        One evict() call releases every block it can; if that was not enough, nothing more can be
        evicted until some sequence lets go of a block, so later calls are skipped until then.
        """
        if not (self.prefix and self.caps.paged and self.evictable):
            return 0
        freed = self.prefix.evict(blocks_wanted)
        self.evictable = self.free_blocks() >= blocks_wanted
        return freed

    def evict_for(self, seq: Sequence, count: int) -> int:
        """Evict unused prefix-cache blocks until reserve(seq, count) could fit; returns blocks freed."""
        if not self.caps.paged:
            return 0
        return self.evict(self.cache.blocks_wanted(seq.seq_id, count))

    def attach(self, seq: Sequence) -> int:
        """Create `seq` in the cache on the longest cached prefix of its tokens; returns tokens reused."""
        if self.prefix:
            return self.prefix.attach(seq.seq_id, seq.tokens)
        self.cache.create(seq.seq_id)
        return 0

    def detach(self, seq: Sequence) -> None:
        """Undo attach(): free `seq` again; the prefix cache also takes back the lookup it counted."""
        if self.prefix:
            self.prefix.detach(seq.seq_id)
        else:
            self.cache.free(seq.seq_id)
        self.evictable = True

    def count_prefix_hit(self, seq: Sequence) -> None:
        """Record an admitted sequence's prefix-cache lookup."""
        if self.prefix:
            self.prefix_stats["queries"] += 1
            self.prefix_stats["hits"] += seq.cached_tokens > 0
            self.prefix_stats["tokens_saved"] += seq.cached_tokens

    def publish(self, seq: Sequence) -> None:
        """Offer the sequence's full computed blocks to later requests (prefix caching)."""
        if self.prefix and seq.num_computed:
            self.prefix.remember(seq.seq_id, seq.tokens[:seq.num_computed])
