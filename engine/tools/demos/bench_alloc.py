"""`python -m engine bench-alloc`: what one allocate or release costs, from 1k to 1M blocks.

A free list (a deque) and a list of reference counts make both operations O(1): the cost per
operation stays flat while the pool grows a thousandfold. This is a benchmark to look at, not a
timed test: numbers vary by machine; the flatness is the point.
"""
from __future__ import annotations

import argparse
import gc
import time

from engine.cache.allocator import BlockAllocator
from engine.tools.demos import emit
from engine.blocks import ceil_div

POOL_SIZES = (1_000, 10_000, 100_000, 1_000_000)


def timed_round(allocator: BlockAllocator, ops: int, batch: int) -> tuple[int, int]:
    """Nanoseconds spent in `ops` single-block allocates and in the matching releases, `batch` at a time."""
    spent_allocate = spent_release = 0
    for _ in range(0, ops, batch):
        start = time.perf_counter_ns()
        blocks = [allocator.allocate()[0] for _ in range(batch)]
        middle = time.perf_counter_ns()
        for block in blocks:
            allocator.release(block)
        spent_allocate += middle - start
        spent_release += time.perf_counter_ns() - middle
    return spent_allocate, spent_release


BATCH = 256   # blocks taken, then given back, per timed round


def time_pool(num_blocks: int, ops: int, repeats: int) -> tuple[float, float]:
    """Best-of-`repeats` nanoseconds per allocate() and per release() on a half-full pool of num_blocks."""
    allocator = BlockAllocator(num_blocks)
    allocator.allocate(num_blocks // 2)              # a pool in use, not a fresh one
    batch = min(BATCH, allocator.num_free)           # the same batch at every size: only the pool grows
    done = ceil_div(ops, batch) * batch                  # whole batches: slightly more than ops
    gc.disable()                                     # as timeit does: no collector pauses inside a timing
    try:
        rounds = [timed_round(allocator, ops, batch) for _ in range(repeats)]
    finally:
        gc.enable()
    return min(a for a, _ in rounds) / done, min(r for _, r in rounds) / done


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Operations per pool size and how many repeats to take the best of."""
    from engine.tools import cli_args as check
    parser.epilog = (f"Limits: --ops 1 to {MAX_OPS:,}, --repeats 1 to {MAX_REPEATS:,}, each size 1 to "
                     f"{MAX_BLOCKS:,} blocks, given once. A bad input prints one 'error: ...' line and exits "
                     "with status 2.")
    parser.add_argument("--ops", type=check.int_in(1, MAX_OPS), default=20_000,
                        help=f"allocate/release pairs per pool size (1 to {MAX_OPS:,})")
    parser.add_argument("--repeats", type=check.int_in(1, MAX_REPEATS), default=7,
                        help=f"timed rounds per pool size; the best is kept (1 to {MAX_REPEATS:,})")
    parser.add_argument("--sizes", type=check.int_in(1, MAX_BLOCKS), nargs="+", default=list(POOL_SIZES),
                        action=check.Distinct, help=f"pool sizes in blocks (1 to {MAX_BLOCKS:,}, each once)")


MAX_OPS, MAX_REPEATS, MAX_BLOCKS = 100_000_000, 1_000, 100_000_000   # 100M blocks: about 6 GB of free list


def main(args: argparse.Namespace) -> int:
    """Print ns per allocate and per release for each pool size, and the spread across sizes."""
    from engine.tools.cli_args import check_memory
    check_memory(64 * max(args.sizes), f"--sizes {max(args.sizes)} blocks (a free list and a refcount each)")
    allocate_ns, release_ns = {}, {}
    for size in args.sizes:
        allocate_ns[str(size)], release_ns[str(size)] = (round(t) for t in time_pool(size, args.ops, args.repeats))
    spread = max(allocate_ns.values()) / max(1, min(allocate_ns.values()))
    emit({"ops_per_size": args.ops, "allocate_ns": allocate_ns, "release_ns": release_ns,
          "allocate_spread": round(spread, 2)})
    return 0
