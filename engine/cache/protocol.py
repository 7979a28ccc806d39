"""The cache protocol: the six methods through which the model stores and reads keys and values.

Every cache in the course (static slots, the paged cache, a learner's own) implements it, so the model
runs on any of them unchanged. Shapes are those of engine/README.md.

A scheduler needs more than the model does: how big a sequence may grow, whether memory comes in
blocks it can count, fork, swap or evict. Those abilities are protocols of their own below
(`PagedCache`, `SwappableCache`, `UpFrontCache`, `SlotCache`), and `capabilities(cache)` reads them
once, so the scheduler asks `caps.paged` instead of probing attributes one by one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class KVCache(Protocol):
    """What the engine asks of a KV cache, in the order one step uses it."""

    def create(self, seq: int) -> None:
        """Start an empty sequence with id `seq`."""

    def reserve(self, seq: int, num_new: int) -> None:
        """Make room for `num_new` more positions before any compute.

        Raises a MemoryError subclass (CacheFull, OutOfBlocks) and changes nothing when it cannot,
        so a scheduler can wait, evict or preempt and try again.
        """

    def set_batch(self, seqs: Sequence[int]) -> None:
        """Name the sequences of the next forward pass, in batch-row order."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store k, v [B, Hkv, T, D] at positions [B, T] (skip -1), return each row's history.

        Returns (keys, values, kv_lens): keys/values [B, Hkv, L, D] with key index j at position j,
        kv_lens [B] the valid keys per row. The last layer's call commits the new lengths.
        """

    def free(self, seq: int) -> None:
        """Forget `seq` and give its memory back."""

    def length(self, seq: int) -> int:
        """Number of tokens stored for `seq`."""


class BlockPool(Protocol):
    """What a scheduler reads of a block allocator: the pool's size and how many blocks are free."""

    num_blocks: int
    num_free: int


@runtime_checkable
class PagedCache(KVCache, Protocol):
    """A cache over one pool of fixed-size blocks (engine/cache/paged.py): countable, forkable, shareable."""

    block_size: int
    allocator: BlockPool
    tables: dict[int, list[int]]

    def blocks_wanted(self, seq: int, num_new: int) -> int:
        """Free blocks reserve(seq, num_new) would take (new blocks plus copies of shared ones)."""

    def fork(self, parent: int, child: int) -> None:
        """Start `child` as an alias of every block of `parent`; nothing is copied."""


@runtime_checkable
class SwappableCache(Protocol):
    """A cache that can move a sequence's K/V to host memory and back (preemption by swap)."""

    def swap_out(self, seq: int) -> int:
        """Copy seq's K/V to the host and free its device memory; returns blocks moved."""

    def swap_in(self, seq: int) -> int:
        """Bring seq back (maybe into other blocks), or raise a MemoryError and change nothing."""


@runtime_checkable
class UpFrontCache(KVCache, Protocol):
    """A contiguous cache that reserves a sequence's whole region at create (engine/tools/contiguous.py)."""

    reserves_up_front: bool
    max_request_tokens: int

    def create(self, seq: int, max_length: int | None = None) -> None:
        """Reserve a region for a sequence that will reach `max_length` tokens."""


@runtime_checkable
class SlotCache(KVCache, Protocol):
    """Fixed slots of `capacity` positions each (engine/cache/static.py)."""

    capacity: int
    max_seqs: int


@dataclass(frozen=True)
class Capabilities:
    """What a scheduler may ask of one cache, read once from the protocols it implements."""

    paged: bool                 # PagedCache: block arithmetic, prefix caching, fork
    swappable: bool             # SwappableCache: preemption by swap
    up_front: bool              # UpFrontCache: create() needs the final length
    max_request_tokens: int     # the most KV positions one sequence can ever get


def protocol_members(protocol) -> frozenset[str]:
    """The public methods and attributes a protocol (and the protocols it extends) declares."""
    names = set()
    for base in protocol.__mro__:
        if base is object or base is Protocol or not getattr(base, "_is_protocol", False):
            continue
        names |= {name for name in vars(base) if not name.startswith("_")}
        names |= {name for name in getattr(base, "__annotations__", {}) if not name.startswith("_")}
    return frozenset(names)


def implements(cache, protocol) -> bool:
    """Whether `cache` has every member `protocol` declares (a structural check, like isinstance on a
    runtime_checkable protocol, without touching the protocol class's caches)."""
    return all(hasattr(cache, name) for name in _MEMBERS[protocol])


def capabilities(cache) -> Capabilities:
    """Read what `cache` can do from the protocols it implements; a TypeError names what is missing."""
    if not implements(cache, KVCache):
        missing = sorted(name for name in _MEMBERS[KVCache] if not hasattr(cache, name))
        raise TypeError(f"{type(cache).__name__} does not implement the cache protocol (KVCache): "
                        f"it lacks {', '.join(missing)}")
    paged = implements(cache, PagedCache)
    up_front = not paged and implements(cache, UpFrontCache) and bool(cache.reserves_up_front)
    if paged:
        most = cache.allocator.num_blocks * cache.block_size
    elif up_front:
        most = cache.max_request_tokens
    elif implements(cache, SlotCache):
        most = cache.capacity
    else:
        raise TypeError(f"{type(cache).__name__} says nothing about its size: implement PagedCache, "
                        "UpFrontCache or SlotCache (engine/cache/protocol.py)")
    return Capabilities(paged, implements(cache, SwappableCache), up_front, most)


_MEMBERS = {protocol: protocol_members(protocol)
            for protocol in (KVCache, PagedCache, SwappableCache, UpFrontCache, SlotCache)}


def kv_lengths(positions: torch.Tensor, old_lengths: torch.Tensor) -> torch.Tensor:
    """The kv-length rule, the one home of it: each row's length after a step, [B] long, is
    max(old length, highest position + 1); padding (-1) adds nothing, so a row of padding keeps its length."""
    newest = torch.where(positions >= 0, positions + 1, 0)           # one past each written position
    old = old_lengths.to(device=positions.device, dtype=newest.dtype)
    return torch.cat([old[:, None], newest], dim=1).amax(dim=1)


def new_lengths(positions: torch.Tensor, old_lengths: Sequence[int]) -> list[int]:
    """Each row's length after this step: one past its highest position, never shorter than before
    (kv_lengths, on a list of ints)."""
    return kv_lengths(positions, torch.tensor(list(old_lengths), dtype=torch.long)).tolist()
