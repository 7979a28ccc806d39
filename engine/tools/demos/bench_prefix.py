"""`python -m engine bench-prefix`: what evicting one cached block costs, from 1k to 1M cache entries.

Half of each cache's entries are held by live sequences, published first so they are the oldest, and
half are evictable leaves. An eviction that walked the entries in LRU order would step over every
held one before it found a victim, so its cost would grow with the cache. The prefix cache keeps a
line of evictable entries only, so each evicted block costs the same at every size: the flatness is
the point. A benchmark to look at, not a timed test: the numbers vary by machine.
"""
from __future__ import annotations

import argparse
import gc
import time

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.checkpoint import tiny_config
from engine.tools.demos import emit

SIZES = (1_000, 10_000, 100_000, 1_000_000)
BATCH = 256          # blocks evicted per timed round, the same at every size


def filled_cache(entries: int, held_fraction: float = 0.5) -> tuple[PrefixCache, list[int]]:
    """A prefix cache of `entries` one-block entries over a real (one-token-block) paged pool.

    The first `held_fraction` of them stay held by a sequence (refcount 2); the rest only by the
    cache (refcount 1), so evict() may take them. Returns the cache and the list of held blocks.
    """
    config = tiny_config(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2)
    cache = PagedKVCache(config, entries + BATCH, block_size=1)
    prefix = PrefixCache(cache, hash_fn=lambda parent, tokens, extra: tokens[0])
    blocks = cache.allocator.allocate(entries)
    for token, block in enumerate(blocks):
        prefix.publish(block, token, None, (token,), ())
    held = blocks[:int(entries * held_fraction)]
    for block in blocks[len(held):]:
        cache.allocator.release(block)               # its sequence ended: only the cache holds it now
    return prefix, held


def refill(prefix: PrefixCache, count: int, first_token: int) -> int:
    """Publish `count` fresh evictable entries (as requests that ended would); returns the next token."""
    for block in prefix.cache.allocator.allocate(count):
        prefix.publish(block, first_token, None, (first_token,), ())
        prefix.cache.allocator.release(block)
        first_token += 1
    return first_token


def time_evict(entries: int, rounds: int) -> float:
    """Best-of-`rounds` nanoseconds per evicted block, evicting BATCH blocks per round."""
    prefix, _ = filled_cache(entries)
    allocator, batch = prefix.cache.allocator, min(BATCH, entries // 2)
    token, best = entries, float("inf")
    gc.disable()                                     # as timeit does: no collector pauses inside a timing
    try:
        for _ in range(rounds):
            wanted = allocator.num_free + batch
            start = time.perf_counter_ns()
            freed = prefix.evict(wanted)
            spent = time.perf_counter_ns() - start
            assert freed == batch, f"evicted {freed} blocks, wanted {batch}"
            best = min(best, spent / batch)
            token = refill(prefix, batch, token)     # back to the same size, untimed
    finally:
        gc.enable()
    return best


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Cache sizes and how many timed rounds to take the best of."""
    from engine.tools import cli_args as check
    parser.epilog = (f"Limits: each size 2 to {MAX_ENTRIES:,} entries (half held, half evictable), given once; "
                     f"--rounds 1 to {MAX_ROUNDS:,}. A bad input prints one 'error: ...' line and exits with "
                     "status 2.")
    parser.add_argument("--sizes", type=check.int_in(2, MAX_ENTRIES), nargs="+", default=list(SIZES),
                        action=check.Distinct, help=f"cache sizes in entries (2 to {MAX_ENTRIES:,}, each once)")
    parser.add_argument("--rounds", type=check.int_in(1, MAX_ROUNDS), default=7,
                        help=f"timed rounds per size; the best is kept (1 to {MAX_ROUNDS:,})")


MAX_ENTRIES, MAX_ROUNDS = 10_000_000, 1_000     # 10M entries: about 4 GB and two minutes to fill
BYTES_PER_ENTRY = 400                            # measured: a 1M-entry cache takes about 370 MB


def main(args: argparse.Namespace) -> int:
    """Print ns per evicted block for each cache size, and the spread across sizes."""
    from engine.tools.cli_args import check_memory
    check_memory(BYTES_PER_ENTRY * max(args.sizes), f"--sizes {max(args.sizes)} entries")
    evict_ns = {str(size): round(time_evict(size, args.rounds)) for size in args.sizes}
    spread = max(evict_ns.values()) / max(1, min(evict_ns.values()))
    emit({"entries": list(args.sizes), "held_fraction": 0.5, "blocks_per_round": BATCH,
          "evict_ns_per_block": evict_ns, "evict_spread": round(spread, 2)})
    return 0
