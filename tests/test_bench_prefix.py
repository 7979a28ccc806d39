"""`python -m engine bench-prefix` prints evict cost per block against cache size; its setup is what
it claims (half the entries held, half evictable), and eviction does the same work at every size."""
import json

from engine.__main__ import main
from engine.tools.demos.bench_prefix import BATCH, filled_cache


def test_bench_prefix_prints_one_figure_per_size(capsys):
    assert main(["bench-prefix", "--sizes", "600", "2000", "--rounds", "2"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["entries"] == [600, 2000] and got["blocks_per_round"] == BATCH
    assert set(got["evict_ns_per_block"]) == {"600", "2000"}
    assert all(ns > 0 for ns in got["evict_ns_per_block"].values()) and got["evict_spread"] >= 1


def test_half_the_entries_are_held_and_the_line_holds_the_other_half():
    prefix, held = filled_cache(1000)
    assert len(prefix.entries) == 1000 and len(held) == 500 and len(prefix.lru) == 500
    assert all(prefix.cache.allocator.refcount(block) == 2 for block in held)
    assert not set(held) & {entry.block for entry in prefix.lru.values()}


def refcount_lookups_per_evicted_block(entries: int) -> float:
    prefix, held = filled_cache(entries)
    inner = prefix.cache.allocator.inner
    looked, refcount = [], inner.refcount
    inner.refcount = lambda block: looked.append(block) or refcount(block)
    freed = prefix.evict(prefix.cache.allocator.num_free + 100)
    assert freed == 100 and not set(looked) & set(held)       # never even looks at a held block
    return len(looked) / freed


def test_evict_does_the_same_work_per_block_at_every_size():
    assert refcount_lookups_per_evicted_block(400) == refcount_lookups_per_evicted_block(8000)
