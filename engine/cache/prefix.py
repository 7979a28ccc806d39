"""PrefixCache: reuse the KV blocks of prompt prefixes that earlier requests already computed.

A full block's keys and values depend on its own tokens *and on every token before it*, so a block
is keyed by a chained hash: hash(parent block's key, this block's token ids, extra keys). Extra keys
carry whatever else changes the activations (an adapter id, say); a per-tenant salt goes into the
first block, so tenants with different salts never share. The cache holds its own reference on each
block it publishes, which keeps the block alive after its request ends, until evict() lets it go.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Sequence


def chain_hash(parent_key: int | None, tokens: tuple[int, ...], extra: tuple) -> int:
    """A 64-bit key for one block, from its parent's key, its token ids and its extra keys."""
    digest = hashlib.sha256(repr((parent_key, tokens, extra)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass
class Entry:
    """One published full block: where its KV lives, and what it was computed from (checked on a hit)."""

    key: int
    block: int
    parent: int | None          # key of the entry for the block before it; None for a first block
    tokens: tuple[int, ...]
    extra: tuple
    children: int = 0           # cached entries whose parent this is; an entry with children is not evicted


class PrefixCache:
    """Full blocks keyed by their whole history, shared by every sequence whose prompt starts the same way."""

    def __init__(self, cache, hash_fn=chain_hash):
        """Wrap a PagedKVCache; hash_fn(parent_key, tokens, extra) -> key is swappable (tests force collisions)."""
        self.cache, self.hash_fn = cache, hash_fn
        self.entries: OrderedDict[int, Entry] = OrderedDict()    # least recently used first
        self.block_keys: dict[int, int] = {}                     # block -> key of the entry that holds it
        self.queries = self.hits = self.tokens_saved = 0

    def attach(self, seq: int, prompt: Sequence[int], salt: Hashable = None, extra_keys: tuple = ()) -> int:
        """Create seq on the longest cached prefix of prompt; return the tokens reused (prefill the rest)."""
        if not prompt:
            raise ValueError(f"sequence {seq}: an empty prompt has nothing to attach")
        hits = []
        for key, parent, tokens, extra in self.chain(prompt, salt, extra_keys):
            entry = self.entries.get(key)
            if entry is None or not self.matches(entry, parent, tokens, extra):
                break                                 # the first miss ends the prefix
            hits.append(entry)
        self.cache.create(seq)
        for entry in hits:
            self.cache.allocator.share(entry.block)
            self.cache.tables[seq].append(entry.block)
        # Leave at least one prompt token to prefill: its logits choose the first new token. When the
        # whole prompt is cached (block-aligned), the last block stays shared but only partly counted;
        # the next reserve() copies it before the last token is written (copy-on-write).
        reused = min(len(hits) * self.cache.block_size, len(prompt) - 1)
        self.cache.lengths[seq] = reused
        self.touch(hits)
        self.queries += 1
        self.hits += reused > 0
        self.tokens_saved += reused
        return reused

    def remember(self, seq: int, tokens: Sequence[int], salt: Hashable = None, extra_keys: tuple = ()) -> int:
        """After prefill, publish seq's full, computed blocks for later requests; return how many are new."""
        table, chain, published = self.cache.tables[seq], [], 0
        computed = tokens[:self.cache.length(seq)]     # only blocks whose KV has been written
        for index, (key, parent, block_tokens, extra) in enumerate(self.chain(computed, salt, extra_keys)):
            entry = self.entries.get(key)
            if entry is None:
                block = table[index]
                if block in self.block_keys:           # already published under another key: stop here
                    break
                self.cache.allocator.share(block)      # the cache's own reference
                entry = Entry(key, block, parent, block_tokens, extra)
                self.entries[key], self.block_keys[block] = entry, key
                if parent is not None:
                    self.entries[parent].children += 1
                published += 1
            elif not self.matches(entry, parent, block_tokens, extra):
                break                                  # a hash collision: blocks after it cannot be keyed
            chain.append(entry)
        self.touch(chain)
        return published

    def evict(self, blocks_wanted: int) -> int:
        """Release cached blocks nobody else holds until the pool has blocks_wanted free; return how many."""
        allocator, victims = self.cache.allocator, []
        # Least recently used first. touch() keeps every parent more recent than its children, so one
        # pass meets the children first, and a parent whose children all went becomes a leaf in time.
        # Each eviction is O(1); the pass only steps over entries that sequences still hold.
        for entry in self.entries.values():
            if allocator.num_free + len(victims) >= blocks_wanted:
                break
            if entry.children == 0 and allocator.refcount(entry.block) == 1:   # a leaf only we hold
                victims.append(entry)
                if entry.parent is not None:
                    self.entries[entry.parent].children -= 1
        for entry in victims:
            self.forget(entry)
        return len(victims)

    def reset(self) -> None:
        """Drop every entry and its reference; refused while a sequence still uses a cached block."""
        busy = [e.block for e in self.entries.values() if self.cache.allocator.refcount(e.block) > 1]
        if busy:
            raise RuntimeError(f"cannot reset the prefix cache: {len(busy)} cached block(s) are still in use "
                               f"by sequences (blocks {busy[:8]}); free those sequences first")
        for entry in list(self.entries.values()):
            self.cache.allocator.release(entry.block)
        self.entries.clear()
        self.block_keys.clear()
        self.queries = self.hits = self.tokens_saved = 0

    def stats(self) -> dict:
        """Counters since the last reset: attach calls, calls that reused a block, tokens not prefilled."""
        return {"queries": self.queries, "hits": self.hits, "tokens_saved": self.tokens_saved,
                "cached_blocks": len(self.entries)}

    # ---- helpers ----

    def chain(self, tokens: Sequence[int], salt: Hashable, extra_keys: tuple):
        """Yield (key, parent key, token ids, extra keys) for each full block of tokens, in order."""
        size, parent = self.cache.block_size, None
        for start in range(0, len(tokens) - size + 1, size):
            block_tokens = tuple(tokens[start:start + size])
            extra = ((salt,) if start == 0 else ()) + tuple(extra_keys)    # the salt seeds the whole chain
            key = self.hash_fn(parent, block_tokens, extra)
            yield key, parent, block_tokens, extra
            parent = key

    @staticmethod
    def matches(entry: Entry, parent: int | None, tokens: tuple, extra: tuple) -> bool:
        """Whether an entry found under a key really is this block: equal keys may still collide."""
        return entry.parent == parent and entry.tokens == tokens and entry.extra == extra

    def touch(self, chain: list[Entry]) -> None:
        """Mark a chain most recently used, leaf first, so every parent stays more recent than its children."""
        for entry in reversed(chain):
            self.entries.move_to_end(entry.key)

    def forget(self, entry: Entry) -> None:
        """Remove an entry and release its block: a freed block must never stay reachable under an old key."""
        del self.entries[entry.key], self.block_keys[entry.block]
        self.cache.allocator.release(entry.block)
