"""PrefixCache: reuse the KV blocks of prompt prefixes that earlier requests already computed.

A full block's keys and values depend on its own tokens *and on every token before it*, so a block
is keyed by a chained hash: block_key(parent block's key, this block's token ids, extra keys). Extra
keys carry whatever else changes the activations (an adapter id, say); a per-tenant salt goes into the
first block, so tenants with different salts never share. The cache holds its own reference on each
block it publishes, which keeps the block alive after its request ends, until evict() lets it go.

Eviction is O(1) per block: `lru` lists only the entries evict() may take (a leaf that no sequence
holds), least recently released first. The cache hears every change of a published block's owners
from the allocator (see OwnerWatch), so an entry joins or leaves that list the moment it becomes or
stops being evictable, and evict() never steps over a block in use.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator, Sequence


def block_key(parent_key: int | None, tokens: tuple[int, ...], extra: tuple) -> int:
    """A 64-bit key for one block, from its parent's key, its token ids and its extra keys."""
    digest = hashlib.sha256(repr((parent_key, tuple(tokens), tuple(extra))).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(slots=True)
class Entry:
    """One published full block: where its KV lives, and what it was computed from (checked on a hit)."""

    key: int
    block: int
    parent: int | None          # key of the entry for the block before it; None for a first block
    tokens: tuple[int, ...]
    extra: tuple
    children: int = 0           # cached entries whose parent this is; an entry with children is not evicted


class OwnerWatch:
    """The cache's allocator, unchanged, except that it reports each share and release of a block."""

    def __init__(self, allocator, on_change: Callable[[int], None]):
        """Wrap `allocator`; on_change(block) runs after every share(block) and release(block)."""
        self.inner, self.on_change = allocator, on_change

    def __getattr__(self, name: str):
        """Everything else (allocate, refcount, num_free, ...) is the wrapped allocator's."""
        return getattr(self.inner, name)

    def share(self, block: int) -> None:
        """Add an owner to block, then report it."""
        self.inner.share(block)
        self.on_change(block)

    def release(self, block: int) -> None:
        """Drop an owner of block, then report it."""
        self.inner.release(block)
        self.on_change(block)


class PrefixCache:
    """Full blocks keyed by their whole history, shared by every sequence whose prompt starts the same way."""

    def __init__(self, cache, hash_fn: Callable[[int | None, tuple, tuple], int] = block_key):
        """Wrap a PagedKVCache; hash_fn(parent_key, tokens, extra) -> key is swappable (tests force collisions)."""
        self.cache, self.hash_fn = cache, hash_fn
        self.entries: dict[int, Entry] = {}                      # key -> entry
        self.block_keys: dict[int, int] = {}                     # block -> key of the entry that holds it
        self.lru: OrderedDict[int, Entry] = OrderedDict()        # evictable entries, next victim first
        self.queries = self.hits = self.tokens_saved = 0
        if cache is not None:                                    # hear of every owner change of a block
            allocator = getattr(cache.allocator, "inner", cache.allocator)
            cache.allocator = OwnerWatch(allocator, self.owners_changed)

    # ---- the key of a block (chapter 5, exercise 1) ----

    def chain(self, tokens: Sequence[int], salt: Hashable = None,
              extra_keys: tuple = ()) -> Iterator[tuple]:
        """Yield (key, parent key, token ids, extra keys) for each full block."""
        size, parent = self.cache.block_size, None
        for start in range(0, len(tokens) - size + 1, size):     # full blocks only
            block_tokens = tuple(tokens[start:start + size])
            # The salt goes into the first block: every later key is chained on it.
            extra = ((salt,) if start == 0 else ()) + tuple(extra_keys)
            key = self.hash_fn(parent, block_tokens, extra)
            yield key, parent, block_tokens, extra
            parent = key

    @staticmethod
    def matches(entry: Entry, parent: int | None, tokens: tuple, extra: tuple) -> bool:
        """Whether the entry found under a key really is this block (keys collide)."""
        same = entry.parent == parent and entry.tokens == tokens
        return same and entry.extra == extra

    # ---- a request arrives (exercise 2) ----

    def attach(self, seq: int, prompt: Sequence[int], salt: Hashable = None,
               extra_keys: tuple = ()) -> int:
        """Create seq on the longest cached prefix of prompt; return tokens reused."""
        if not prompt:
            raise ValueError(f"sequence {seq}: an empty prompt has nothing to attach")
        blocks = []
        for key, parent, tokens, extra in self.chain(prompt, salt, extra_keys):
            entry = self.entries.get(key)
            if entry is None or not self.matches(entry, parent, tokens, extra):
                break                               # the first miss ends the prefix
            blocks.append(entry.block)
        self.cache.create(seq)
        self.cache.share_blocks(seq, blocks)        # one more owner each: kept now
        # Leave one prompt token to prefill: its logits choose the first new token.
        # If the whole prompt is cached (block-aligned), the last block is shared but
        # not wholly counted; reserve() copies it before the last token is written.
        reused = min(len(blocks) * self.cache.block_size, len(prompt) - 1)
        self.cache.set_length(seq, reused)
        self.queries += 1
        self.hits += reused > 0
        self.tokens_saved += reused
        return reused

    def detach(self, seq: int) -> None:
        """Undo attach(seq) before any prefill: free seq, take back its counts."""
        reused = self.cache.length(seq)
        self.cache.free(seq)
        self.queries -= 1
        self.hits -= reused > 0
        self.tokens_saved -= reused

    # ---- after prefill (exercise 3) ----

    def remember(self, seq: int, tokens: Sequence[int], salt: Hashable = None,
                 extra_keys: tuple = ()) -> int:
        """Publish seq's full, computed blocks; return how many are new."""
        table, published = self.cache.tables[seq], 0
        computed = tokens[:self.cache.length(seq)]  # only blocks whose K/V is written
        for index, item in enumerate(self.chain(computed, salt, extra_keys)):
            key, parent, block_tokens, extra = item
            entry = self.entries.get(key)
            if entry is None:
                if table[index] in self.block_keys:  # published under another key: stop
                    break
                self.publish(table[index], key, parent, block_tokens, extra)
                published += 1
            elif not self.matches(entry, parent, block_tokens, extra):
                break                                # a collision: stop the chain
        return published

    # ---- when the pool runs low (exercise 4) ----

    def evictable(self, entry: Entry) -> bool:
        """Whether evict() may take entry: a leaf that only the cache holds."""
        return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 1

    def evict(self, blocks_wanted: int) -> int:
        """Release evictable blocks, front of the line first, until enough are free."""
        freed = 0
        while self.cache.allocator.num_free < blocks_wanted and self.lru:
            _, entry = self.lru.popitem(last=False)  # the front of the line: O(1)
            self.forget(entry)
            freed += 1
        return freed

    def forget(self, entry: Entry) -> None:
        """Remove an entry, release its block; a parent left childless goes next."""
        self.lru.pop(entry.key, None)
        # Forget the key before the block can be handed out again.
        del self.entries[entry.key], self.block_keys[entry.block]
        if entry.parent is not None:
            parent = self.entries[entry.parent]
            parent.children -= 1
            self.refresh(parent, front=True)
        self.cache.allocator.release(entry.block)  # the cache's own reference

    # ---- bookkeeping the exercises rely on ----

    def publish(self, block: int, key: int, parent: int | None, tokens: tuple, extra: tuple) -> Entry:
        """Record block under key, with the cache's own reference on it; the parent gains a child."""
        entry = Entry(key, block, parent, tokens, extra)
        self.entries[key], self.block_keys[block] = entry, key
        self.cache.allocator.share(block)              # the cache's own reference
        if parent is not None:
            self.entries[parent].children += 1
            self.refresh(self.entries[parent])         # a parent with a child is no longer evictable
        self.refresh(entry)
        return entry

    def owners_changed(self, block: int) -> None:
        """The allocator's report of a share or release: a published block may join or leave the line."""
        entry = self.entries.get(self.block_keys.get(block))
        if entry is not None and entry.block == block:
            self.refresh(entry)

    def refresh(self, entry: Entry, front: bool = False) -> None:
        """Put entry in the eviction line if it is evictable (at the back, or the front), else take it out."""
        if not self.evictable(entry):
            self.lru.pop(entry.key, None)
        elif entry.key not in self.lru:
            self.lru[entry.key] = entry
            if front:                                  # a chain leaves from its tail: the parent goes next
                self.lru.move_to_end(entry.key, last=False)

    def reset(self) -> None:
        """Drop every entry and its reference; refused while a sequence still uses a cached block."""
        busy = [e.block for e in self.entries.values() if self.cache.allocator.refcount(e.block) > 1]
        if busy:
            raise RuntimeError(f"cannot reset the prefix cache: {len(busy)} cached block(s) are still in use "
                               f"by sequences (blocks {busy[:8]}); free those sequences first")
        blocks = [entry.block for entry in self.entries.values()]
        self.entries.clear()
        self.block_keys.clear()
        self.lru.clear()
        for block in blocks:
            self.cache.allocator.release(block)
        self.queries = self.hits = self.tokens_saved = 0

    def stats(self) -> dict:
        """Counters since the last reset: admitted lookups, those that reused a block, tokens not prefilled."""
        return {"queries": self.queries, "hits": self.hits, "tokens_saved": self.tokens_saved,
                "cached_blocks": len(self.entries)}
