"""PagedKVCache: every logit equals a from-scratch run, whatever the physical block order, forks,
rollbacks and swaps; and reserve fails cleanly, before changing anything."""
import inspect
import random

import pytest
import torch

from engine.cache.allocator import BlockAllocator
from engine.cache.errors import OutOfBlocks
from engine.cache.paged import PagedKVCache
from engine.seeded import seeded_tokens
from engine.generate import cached_step, scratch_logits

ATOL = 1e-5
BS = 4
LENGTHS = [BS - 1, BS, BS + 1, 2 * BS + 1]      # the boundaries: short of, at, and past a block


class ShuffledAllocator(BlockAllocator):
    """Hands blocks out in a scrambled order, so no test passes by luck of contiguous physical blocks."""

    def __init__(self, num_blocks, seed=0):
        super().__init__(num_blocks)
        order = list(self.free)
        random.Random(seed).shuffle(order)
        self.free.clear()
        self.free.extend(order)


class NoCopyOnWrite(PagedKVCache):
    """The bug chapter 4 guards against: write into shared blocks in place."""

    def copy_on_write(self, seq, index):
        pass


def step_and_compare(model, cache, history, new):
    """One cached step for the sequences in `new`; return the largest gap to their from-scratch logits."""
    seqs = list(new)
    for seq in seqs:
        history[seq] = history[seq] + new[seq]
    got = cached_step(model, cache, seqs, [new[s] for s in seqs])
    want = scratch_logits(model, [history[s] for s in seqs])
    return max(float((g - w[-len(new[s]):]).abs().max()) for s, g, w in zip(seqs, got, want))


def paged(model, num_blocks=64, cls=PagedKVCache, **kwargs):
    kwargs.setdefault("block_size", BS)
    kwargs.setdefault("allocator", ShuffledAllocator(num_blocks))
    return cls(model.config, num_blocks, **kwargs)


@pytest.mark.parametrize("attention", ["reference", "torch"])
def test_prefill_then_20_decode_steps_equal_scratch(tiny, attention):
    cache = paged(tiny, attention=attention)
    history = {seq: [] for seq in range(len(LENGTHS))}
    for seq in history:
        cache.create(seq)
    prompts = {seq: seeded_tokens(n, seed=seq) for seq, n in enumerate(LENGTHS)}
    assert step_and_compare(tiny, cache, history, prompts) < ATOL
    rng = random.Random(0)
    for _ in range(20):
        assert step_and_compare(tiny, cache, history, {s: [rng.randrange(256)] for s in history}) < ATOL
    assert {s: cache.length(s) for s in history} == {s: n + 20 for s, n in enumerate(LENGTHS)}
    tables = [b for table in cache.tables.values() for b in table]
    assert len(set(tables)) == len(tables)                            # no block in two tables
    assert tables != sorted(tables)                                   # and really scrambled


def test_a_ragged_prefill_beside_decoding_rows(tiny):
    # One batch mixes a 9-token prefill chunk with single-token decode rows (rows padded with -1).
    cache = paged(tiny)
    history = {0: [], 1: [], 2: []}
    for seq in history:
        cache.create(seq)
    assert step_and_compare(tiny, cache, history, {0: seeded_tokens(6, 1), 1: seeded_tokens(2, 2)}) < ATOL
    assert step_and_compare(tiny, cache, history, {0: [7], 1: [8], 2: seeded_tokens(9, 3)}) < ATOL


def fork_and_diverge(model, cls, prompt_length):
    """Prefill, fork, then parent and child each decode different tokens; return the worst logit gap."""
    cache = paged(model, cls=cls)
    history = {0: [], 1: []}
    cache.create(0)
    step_and_compare(model, cache, history, {0: seeded_tokens(prompt_length, 5)})
    cache.fork(0, 1)
    history[1] = list(history[0])
    worst = 0.0
    for t in range(6):
        worst = max(worst, step_and_compare(model, cache, history, {0: [10 + t], 1: [100 + t]}))
    return worst


@pytest.mark.parametrize("prompt_length", [BS + 2, 2 * BS])     # fork mid-block and on a block boundary
def test_fork_then_both_continue_like_scratch(tiny, prompt_length):
    assert fork_and_diverge(tiny, PagedKVCache, prompt_length) < ATOL


def test_without_copy_on_write_a_fork_corrupts_its_sibling(tiny):
    # The same run with copy_on_write disabled: the shared, half-full block is written by both.
    assert fork_and_diverge(tiny, NoCopyOnWrite, BS + 2) > 1e-2


def test_room_reserved_before_a_fork_is_copied_where_it_is_written(tiny):
    # The parent reserved 8 positions ahead, then forked: its half-full block is not the table's last.
    cache = paged(tiny)
    history = {0: [], 1: []}
    cache.create(0)
    step_and_compare(tiny, cache, history, {0: seeded_tokens(BS + 1, 6)})
    cache.reserve(0, 2 * BS)
    assert len(cache.tables[0]) == 4
    cache.fork(0, 1)
    history[1] = list(history[0])
    assert cache.blocks_wanted(1, 1) == 1                # only the block position BS + 1 lands in
    for t in range(4):
        assert step_and_compare(tiny, cache, history, {0: [20 + t], 1: [40 + t]}) < ATOL


def test_fork_shares_every_block_and_copies_only_the_written_one(tiny):
    cache = paged(tiny)
    cache.create(0)
    cached_step(tiny, cache, [0], [seeded_tokens(2 * BS + 2, 0)])
    parent = list(cache.tables[0])
    free = cache.allocator.num_free
    cache.fork(0, 1)
    assert cache.tables[1] == parent and cache.allocator.num_free == free
    assert [cache.allocator.refcount(b) for b in parent] == [2, 2, 2]
    cache.reserve(1, 1)                                  # the child will write into the half-full block
    assert cache.tables[1][:2] == parent[:2] and cache.tables[1][2] != parent[2]
    assert cache.allocator.num_free == free - 1
    assert [cache.allocator.refcount(b) for b in parent] == [2, 2, 1]
    for pool in cache.k_pools + cache.v_pools:           # the copy holds the shared history
        assert torch.equal(pool[cache.tables[1][2]], pool[parent[2]])


def test_truncate_then_continue_equals_scratch(tiny):
    cache = paged(tiny)
    history = {0: []}
    cache.create(0)
    step_and_compare(tiny, cache, history, {0: seeded_tokens(2 * BS + 3, 0)})
    free = cache.allocator.num_free
    cache.truncate(0, BS + 1)                            # reject 6 draft tokens, mid-block
    history[0] = history[0][:BS + 1]
    assert cache.length(0) == BS + 1 and len(cache.tables[0]) == 2 and cache.allocator.num_free == free + 1
    assert step_and_compare(tiny, cache, history, {0: [1, 2, 3]}) < ATOL
    assert step_and_compare(tiny, cache, history, {0: [4]}) < ATOL


def test_truncating_into_a_shared_block_copies_it_before_the_next_write(tiny):
    cache = paged(tiny)
    history = {0: [], 1: []}
    cache.create(0)
    step_and_compare(tiny, cache, history, {0: seeded_tokens(3 * BS, 0)})
    cache.fork(0, 1)
    history[1] = list(history[0])
    cache.truncate(1, BS + 1)                            # the child's block 1 is now partial and shared
    history[1] = history[1][:BS + 1]
    shared = cache.tables[1][1]
    assert cache.allocator.refcount(shared) == 2
    assert step_and_compare(tiny, cache, history, {1: [7, 8]}) < ATOL
    assert cache.tables[1][1] != shared                  # copied on write
    assert step_and_compare(tiny, cache, history, {0: [9], 1: [10]}) < ATOL      # the parent is intact


def test_swap_out_and_in_lands_elsewhere_and_continues_like_scratch(tiny):
    cache = paged(tiny, num_blocks=12, allocator=BlockAllocator(12))
    history = {0: [], 1: []}
    for seq in history:
        cache.create(seq)
    step_and_compare(tiny, cache, history, {0: seeded_tokens(2 * BS + 1, 0), 1: seeded_tokens(BS, 1)})
    before, free = list(cache.tables[0]), cache.allocator.num_free
    assert cache.swap_out(0) == 3
    assert cache.allocator.num_free == free + 3 and 0 not in cache.tables and cache.length(0) == 2 * BS + 1
    assert all(cache.allocator.refcount(b) == 0 for b in before)    # a swapped sequence holds no block
    with pytest.raises(KeyError, match="sequence 0 is swapped out"):
        cache.set_batch([0])
    step_and_compare(tiny, cache, history, {1: seeded_tokens(2 * BS, 2)})   # takes the freed blocks
    assert cache.swap_in(0) == 3
    assert cache.tables[0] != before
    assert step_and_compare(tiny, cache, history, {0: [3], 1: [4]}) < ATOL
    assert step_and_compare(tiny, cache, history, {0: [5, 6, 7]}) < ATOL


def test_swap_in_without_room_changes_nothing(tiny):
    cache = paged(tiny, num_blocks=4)
    cache.create(0)
    cached_step(tiny, cache, [0], [seeded_tokens(2 * BS, 0)])
    cache.swap_out(0)
    cache.create(1)
    cache.reserve(1, 3 * BS)
    refs = [cache.allocator.refcount(b) for b in range(4)]
    with pytest.raises(OutOfBlocks, match="sequence 0 cannot swap in: wanted 2 block\\(s\\), 1 free"):
        cache.swap_in(0)
    assert 0 in cache.swapped and [cache.allocator.refcount(b) for b in range(4)] == refs
    cache.free(1)
    cache.free(0)                                        # freeing a swapped sequence drops its host copy
    assert cache.allocator.num_free == 4 and not cache.swapped


def test_reserve_fails_before_changing_anything(tiny):
    # The child must copy its shared half-full block and add one more: 2 blocks, but only 1 is free.
    cache = paged(tiny, num_blocks=4)
    cache.create(0)
    cached_step(tiny, cache, [0], [seeded_tokens(BS + 2, 0)])
    cache.fork(0, 1)
    cache.create(2)
    cache.reserve(2, 1)
    state = ({s: list(t) for s, t in cache.tables.items()}, [cache.allocator.refcount(b) for b in range(4)],
             [p.clone() for p in cache.k_pools])
    assert cache.blocks_wanted(1, BS) == 2
    with pytest.raises(OutOfBlocks, match="sequence 1 cannot reserve 4 token\\(s\\): wanted 2 block\\(s\\), 1 free"):
        cache.reserve(1, BS)
    assert ({s: list(t) for s, t in cache.tables.items()}, [cache.allocator.refcount(b) for b in range(4)]) \
        == state[:2]
    assert all(torch.equal(a, b) for a, b in zip(cache.k_pools, state[2]))
    cache.reserve(1, 1)                                  # a copy alone fits
    assert cache.allocator.num_free == 0


def test_writes_outside_the_reserved_room_are_refused(tiny):
    cache = paged(tiny)
    cache.create(0)
    cached_step(tiny, cache, [0], [[1, 2, 3]])
    cache.set_batch([0])                                 # no reserve for 2 more tokens past the block
    with pytest.raises(ValueError, match="sequence 0: position 4 is outside \\[3, 4\\)"):
        tiny(torch.tensor([[4, 5]]), torch.tensor([[3, 4]]), cache)
    with pytest.raises(ValueError, match="position 1 is outside \\[3, 4\\)"):
        tiny(torch.tensor([[4]]), torch.tensor([[1]]), cache)          # history is never rewritten


def test_an_allocator_look_alike_drops_in(tiny):
    class DictAllocator:                                 # not a BlockAllocator: just the five members
        def __init__(self, n):
            self.counts, self.num_blocks = {b: 0 for b in range(n)}, n

        @property
        def num_free(self):
            return sum(c == 0 for c in self.counts.values())

        def allocate(self, n=1):
            free = [b for b, c in sorted(self.counts.items(), reverse=True) if c == 0][:n]
            if len(free) < n:
                raise OutOfBlocks(n, self.num_free)
            self.counts.update({b: 1 for b in free})
            return free

        def share(self, b):
            self.counts[b] += 1

        def release(self, b):
            self.counts[b] -= 1

        def refcount(self, b):
            return self.counts[b]

    assert fork_and_diverge(tiny, lambda config, n, **kw: PagedKVCache(
        config, n, **{**kw, "allocator": DictAllocator(n)}), BS + 1) < ATOL


def test_accounting_counts_tokens_slots_and_blocks(tiny):
    cache = paged(tiny)
    for seq, n in enumerate([BS - 1, BS, BS + 1]):
        cache.create(seq)
        cached_step(tiny, cache, [seq], [seeded_tokens(n, seq)])
    assert cache.tokens_stored == 3 * BS and cache.blocks_in_use == 4
    assert cache.slots_reserved == 4 * BS and cache.utilization() == pytest.approx(3 / 4)
    cache.fork(2, 3)                                     # sharing stores 5 more tokens in no new block
    assert cache.blocks_in_use == 4 and cache.utilization() == pytest.approx((3 * BS + BS + 1) / (4 * BS))


def test_protocol_errors_name_the_sequence(tiny):
    cache = paged(tiny)
    cache.create(0)
    with pytest.raises(ValueError, match="sequence 0 already exists"):
        cache.create(0)
    with pytest.raises(KeyError, match="sequence 9 is unknown"):
        cache.reserve(9, 1)
    with pytest.raises(ValueError, match="cannot truncate sequence 0 of 0 tokens to 2"):
        cache.truncate(0, 2)
    with pytest.raises(ValueError, match="distinct"):
        cache.set_batch([0, 0])
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        PagedKVCache(tiny.config, 8, block_size=0)
    with pytest.raises(ValueError, match="manages 8 blocks, the pool has 9"):
        PagedKVCache(tiny.config, 9, allocator=BlockAllocator(8))
    with pytest.raises(ValueError, match="attention must be one of"):
        PagedKVCache(tiny.config, 8, attention="flash")
    cache.swap_out(0)
    with pytest.raises(KeyError, match="sequence 0 is swapped out"):
        cache.fork(0, 1)
    assert 1 not in cache.tables                         # a failed fork leaves no half-made child


def test_a_bfloat16_pool_stays_close_to_fp32(tiny):
    cache = paged(tiny, dtype=torch.bfloat16)
    cache.create(0)
    got = cached_step(tiny, cache, [0], [seeded_tokens(2 * BS + 1, 0)])[0]
    assert cache.k_pools[0].dtype == torch.bfloat16
    assert (got - scratch_logits(tiny, [seeded_tokens(2 * BS + 1, 0)])[0]).abs().max() < 0.1


def test_attend_through_the_triton_kernels_in_the_interpreter(tiny):
    # conftest.py turns the interpreter on where there is no GPU; on a GPU the kernels are compiled.
    pytest.importorskip("triton")
    model = tiny
    cache = paged(model, attention="triton")
    history = {0: [], 1: []}
    for seq in history:
        cache.create(seq)
    # prefill kernel for a ragged batch, then decode kernel steps across a block boundary
    assert step_and_compare(model, cache, history, {0: seeded_tokens(BS + 3, 0), 1: seeded_tokens(BS - 2, 1)}) <= 1e-5
    for token in range(3):
        assert step_and_compare(model, cache, history, {0: [5 + token], 1: [6 + token]}) <= 1e-5


def test_share_blocks_and_set_length_place_cached_history_like_a_prefill(tiny):
    # What a prefix-cache hit does: a newcomer names the full blocks of an earlier sequence.
    cache = paged(tiny)
    history = {0: [], 1: []}
    cache.create(0)
    step_and_compare(tiny, cache, history, {0: seeded_tokens(2 * BS + 1, 0)})
    cache.create(1)
    full = cache.tables[0][:2]
    cache.share_blocks(1, full)
    cache.set_length(1, 2 * BS)
    history[1] = history[0][:2 * BS]
    assert cache.tables[1] == full and [cache.allocator.refcount(b) for b in full] == [2, 2]
    assert step_and_compare(tiny, cache, history, {1: [9, 8, 7]}) < ATOL
    assert step_and_compare(tiny, cache, history, {0: [1], 1: [2]}) < ATOL


def test_share_blocks_and_set_length_refuse_what_would_break_the_cache(tiny):
    cache = paged(tiny)
    cache.create(0)
    cache.reserve(0, BS)
    free_block = next(b for b in range(64) if cache.allocator.refcount(b) == 0)
    cache.create(1)
    with pytest.raises(ValueError, match=f"block {free_block} is free"):
        cache.share_blocks(1, [cache.tables[0][0], free_block])
    assert cache.tables[1] == [] and cache.allocator.refcount(cache.tables[0][0]) == 1   # all or nothing
    with pytest.raises(ValueError, match="length 5 is outside the 4 slots"):
        cache.set_length(0, BS + 1)
    cache.set_length(0, BS)
    assert cache.length(0) == BS


def test_shared_writes_lists_only_shared_blocks_the_new_tokens_land_in(tiny):
    cache = paged(tiny)
    cache.create(0)
    cache.reserve(0, 2 * BS + 2)
    cache.set_length(0, 2 * BS + 2)
    cache.fork(0, 1)
    assert cache.shared_writes(1, 0) == [] and cache.shared_writes(1, 1) == [2]
    assert cache.blocks_wanted(1, BS) == 2               # copy block 2, add block 3
    cache.reserve(1, 1)
    assert cache.shared_writes(1, 1) == [] and cache.shared_writes(0, 1) == []
    with pytest.raises(ValueError, match="int >= 0"):
        cache.shared_writes(0, -1)


def test_attend_stores_through_the_one_write_a_subclass_gives(tiny):
    """attend (Triton or torch path) stores with `write`, the class's own: a learner's runs, nothing else."""
    calls = []

    class CountingWrite(PagedKVCache):
        def write(self, layer, k, v, positions):
            calls.append(layer)
            return super().write(layer, k, v, positions)

    cache = paged(tiny, cls=CountingWrite, attention="torch")
    history = {0: [], 1: []}
    for seq in history:
        cache.create(seq)
    assert step_and_compare(tiny, cache, history, {0: seeded_tokens(5, seed=1), 1: seeded_tokens(2, seed=2)}) < ATOL
    assert calls == list(range(tiny.config.num_layers))


def test_attend_stores_what_write_stores(tiny):
    """The engine's own class stores once-per-forward (store): the very pools, lengths and kv_lens that
    write leaves ("reference" attention runs update, which writes), across a ragged prefill and decodes."""
    caches = [paged(tiny, attention=attention) for attention in ("reference", "torch")]
    steps = [{0: seeded_tokens(6, 1), 1: seeded_tokens(2, 2)}, {0: [7], 1: [8], 2: seeded_tokens(9, 3)},
             {0: [9], 1: [10], 2: [11]}]
    for cache in caches:
        for seq in range(3):
            cache.create(seq)
        for new in steps:
            cached_step(tiny, cache, list(new), list(new.values()))
    reference, stored = caches
    assert stored.write_plan is not None and reference.write_plan is None     # each went its own way
    assert stored.lengths == reference.lengths and torch.equal(stored.batch_lengths, reference.batch_lengths)
    for ours, theirs in zip(stored.k_pools + stored.v_pools, reference.k_pools + reference.v_pools):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("edition", [False, True], ids=["replaced in place", "student edition"])
def test_a_write_other_than_the_engines_runs_every_layer(tiny, monkeypatch, edition):
    """A notebook may set PagedKVCache.write = its own function; in the student edition the module's own
    write is the stub that runs the learner's (EDITION_STUBS). Either way attend stores through that
    write, layer by layer, not around it."""
    import engine.cache.paged as paged_module
    calls, original = [], PagedKVCache.write

    def replaced(self, layer, k, v, positions):
        calls.append(layer)
        return original(self, layer, k, v, positions)

    monkeypatch.setattr(PagedKVCache, "write", replaced)
    if edition:                    # there the stub is write as the module defined it; only the flag tells
        monkeypatch.setattr(paged_module, "ENGINE_WRITE", replaced)
        monkeypatch.setattr(paged_module, "EDITION_STUBS", True)
    cache = paged(tiny, attention="torch")
    cache.create(0)
    assert step_and_compare(tiny, cache, {0: []}, {0: seeded_tokens(5, seed=1)}) < ATOL
    assert calls == list(range(tiny.config.num_layers))


def test_the_bookkeeping_lives_in_block_tables_under_the_old_names(tiny):
    cache = paged(tiny)
    cache.create(0)
    cache.reserve(0, BS + 1)
    assert cache.tables is cache.books.tables and cache.lengths is cache.books.lengths
    assert cache.allocator is cache.books.allocator and cache.block_size == cache.books.block_size == BS
    assert cache.k_pools is cache.pool.keys and cache.v_pools is cache.pool.values
    wrapped = ShuffledAllocator(64)
    cache.allocator = wrapped                            # a prefix cache wraps the allocator this way
    assert cache.books.allocator is wrapped
    # A plain attribute, not a property: the sealed grader lets graded code set data only.
    assert inspect.getattr_static(PagedKVCache, "allocator", None) is None


def test_the_student_edition_stubbing_sets_the_flag_store_reads(tmp_path):
    """The edition's stub_file binds _edition in paged.py above EDITION_STUBS, so the flag is true there."""
    import ast
    import shutil

    import engine.cache.paged as paged_module
    from engine.course.authoring.edition import stub_file
    copy = tmp_path / "paged.py"
    shutil.copy(paged_module.__file__, copy)
    stub_file(copy, {"PagedKVCache.write": "ch03"})
    body = ast.parse(copy.read_text()).body
    bound = [i for i, node in enumerate(body) if isinstance(node, ast.Import)
             and any(alias.asname == "_edition" for alias in node.names)]
    flag = [i for i, node in enumerate(body) if isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "EDITION_STUBS" for t in node.targets)]
    assert bound and flag and bound[0] < flag[0]
