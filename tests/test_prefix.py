"""PrefixCache: a hit gives exactly the logits of a cold prefill, and nothing is ever shared that
should not be (other histories, other salts, hash collisions, evicted blocks)."""
import pytest
import torch

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.seeded import seeded_tokens
from engine.generate import cached_step, scratch_logits

ATOL = 1e-5
BS = 4


def setup(model, num_blocks=32, **kwargs):
    cache = PagedKVCache(model.config, num_blocks, block_size=BS)
    return cache, PrefixCache(cache, **kwargs)


def serve(model, cache, prefix, seq, prompt, **keys):
    """Attach, prefill the rest, remember; return (tokens reused, worst gap to a cold prefill)."""
    reused = prefix.attach(seq, prompt, **keys)
    got = cached_step(model, cache, [seq], [prompt[reused:]])[0]
    prefix.remember(seq, prompt, **keys)
    cold = scratch_logits(model, [prompt])[0][reused:]
    return reused, float((got - cold).abs().max())


def test_hits_give_the_logits_of_a_cold_prefill(tiny):
    cache, prefix = setup(tiny)
    shared = seeded_tokens(3 * BS, 0)
    assert serve(tiny, cache, prefix, 0, shared + [1, 2]) == (0, pytest.approx(0, abs=ATOL))
    reused, gap = serve(tiny, cache, prefix, 1, shared + [3, 4, 5])
    assert reused == 3 * BS and gap < ATOL
    reused, gap = serve(tiny, cache, prefix, 2, shared[:2 * BS] + [6, 7])      # a shorter shared prefix
    assert reused == 2 * BS and gap < ATOL
    assert cache.tables[1][:3] == cache.tables[0][:3] and cache.tables[2][:2] == cache.tables[0][:2]
    assert prefix.stats() == {"queries": 3, "hits": 2, "tokens_saved": 5 * BS, "cached_blocks": 3}
    # ...and the sequences keep decoding correctly on the shared blocks
    got = cached_step(tiny, cache, [0, 1], [[9], [9]])
    want = scratch_logits(tiny, [shared + [1, 2, 9], shared + [3, 4, 5, 9]])
    assert max(float((g - w[-1:]).abs().max()) for g, w in zip(got, want)) < ATOL


def test_same_block_text_after_a_different_history_never_shares(tiny):
    cache, prefix = setup(tiny)
    a, b, text = seeded_tokens(BS, 1), seeded_tokens(BS, 2), seeded_tokens(BS, 3)
    serve(tiny, cache, prefix, 0, a + text + [7])
    reused, gap = serve(tiny, cache, prefix, 1, b + text + [7])
    assert reused == 0 and gap < ATOL
    assert cache.tables[1][1] != cache.tables[0][1]


def test_a_hash_that_ignores_history_still_cannot_share_across_histories(tiny):
    # With a key of the block's own tokens only, "X after X" hashes like "X at the start";
    # the stored parent key tells them apart, so the second block is a miss, not wrong KV.
    cache, prefix = setup(tiny, hash_fn=lambda parent, tokens, extra: hash(tokens))
    x = seeded_tokens(BS, 4)
    serve(tiny, cache, prefix, 0, x + x + [1])
    reused, gap = serve(tiny, cache, prefix, 1, x + x + [1])
    assert reused == BS and gap < ATOL


def test_a_hash_collision_is_a_miss_not_wrong_kv(tiny):
    cache, prefix = setup(tiny, hash_fn=lambda parent, tokens, extra: 0)     # every block collides
    first, other = seeded_tokens(2 * BS + 1, 5), seeded_tokens(2 * BS + 1, 6)
    assert serve(tiny, cache, prefix, 0, first)[0] == 0
    assert len(prefix.entries) == 1                  # the second block's key was taken: not published
    reused, gap = serve(tiny, cache, prefix, 1, other)
    assert reused == 0 and gap < ATOL
    reused, gap = serve(tiny, cache, prefix, 2, first)
    assert reused == BS and gap < ATOL


def test_a_fully_cached_block_aligned_prompt_still_prefills_one_token(tiny):
    cache, prefix = setup(tiny)
    prompt = seeded_tokens(2 * BS, 7)
    serve(tiny, cache, prefix, 0, prompt)
    cached_block = cache.tables[0][1]
    saved = [pool[cached_block].clone() for pool in cache.k_pools + cache.v_pools]
    reused = prefix.attach(1, prompt)
    assert reused == 2 * BS - 1 and cache.length(1) == 2 * BS - 1
    assert cache.tables[1] == cache.tables[0]         # both blocks attached...
    got = cached_step(tiny, cache, [1], [prompt[reused:]])[0]
    assert got.shape[0] == 1                          # ...one token prefilled: its logits pick the first output
    assert float((got - scratch_logits(tiny, [prompt])[0][-1:]).abs().max()) < ATOL
    assert cache.tables[1][1] != cached_block         # the shared last block was copied before the write
    assert all(torch.equal(pool[cached_block], s) for pool, s in zip(cache.k_pools + cache.v_pools, saved))


def test_different_salts_never_share_and_equal_salts_do(tiny):
    cache, prefix = setup(tiny)
    prompt = seeded_tokens(2 * BS + 2, 8)
    serve(tiny, cache, prefix, 0, prompt, salt="tenant-a")
    assert serve(tiny, cache, prefix, 1, prompt, salt="tenant-b")[0] == 0
    assert serve(tiny, cache, prefix, 2, prompt)[0] == 0                  # no salt is a salt of its own
    assert serve(tiny, cache, prefix, 3, prompt, salt="tenant-a")[0] == 2 * BS
    assert serve(tiny, cache, prefix, 4, prompt, extra_keys=("adapter-1",))[0] == 0
    assert serve(tiny, cache, prefix, 5, prompt, extra_keys=("adapter-1",))[0] == 2 * BS


def test_remember_publishes_only_blocks_whose_kv_was_computed(tiny):
    cache, prefix = setup(tiny)
    prompt = seeded_tokens(3 * BS, 9)
    prefix.attach(0, prompt)
    cached_step(tiny, cache, [0], [prompt[:BS + 1]])  # a first prefill chunk
    assert prefix.remember(0, prompt) == 1
    cached_step(tiny, cache, [0], [prompt[BS + 1:]])
    assert prefix.remember(0, prompt) == 2 and prefix.remember(0, prompt) == 0


def blocks_evicted_one_by_one(prefix):
    """Evict one block at a time (ask for one more free block than there is) and list them in order."""
    order = []
    while prefix.entries:
        before = {entry.block for entry in prefix.entries.values()}
        assert prefix.evict(prefix.cache.allocator.num_free + 1) == 1
        order += before - {entry.block for entry in prefix.entries.values()}
    return order


def test_exact_eviction_order_lru_with_leaves_before_parents(tiny):
    cache, prefix = setup(tiny)
    p = list(range(1, 3 * BS + 2))                    # 3 full blocks: chain e1 <- e2 <- e3
    q = p[:BS] + [50] * BS + [51]                     # shares e1, then its own f2
    serve(tiny, cache, prefix, 0, p)
    e1, e2, e3 = cache.tables[0][:3]
    serve(tiny, cache, prefix, 1, q)
    f2 = cache.tables[1][1]
    serve(tiny, cache, prefix, 2, p)                  # touches e1, e2, e3 again: f2 is now the oldest
    for seq in (0, 1, 2):
        cache.free(seq)
    assert prefix.evict(cache.allocator.num_free) == 0        # already enough free: nothing goes
    assert [e.block for e in prefix.lru.values()] == [f2, e3]  # only leaves nobody holds are in line
    assert blocks_evicted_one_by_one(prefix) == [f2, e3, e2, e1]
    assert cache.allocator.num_free == cache.num_blocks and not prefix.entries and not prefix.block_keys


def test_blocks_in_use_are_never_evicted_and_neither_are_their_parents(tiny):
    cache, prefix = setup(tiny)
    prompt = seeded_tokens(2 * BS + 1, 10)
    # Two requests prefill the same prompt before either is remembered: sequence 1 publishes the
    # first block; sequence 0 then publishes only the second, as a child of sequence 1's block.
    for seq in (0, 1):
        prefix.attach(seq, prompt)
        cached_step(tiny, cache, [seq], [prompt])
    cache.truncate(1, BS)
    assert prefix.remember(1, prompt) == 1 and prefix.remember(0, prompt) == 1
    cache.free(1)                                     # the parent entry is now held by the cache alone
    assert prefix.evict(cache.num_blocks) == 0        # its child is in use by sequence 0: both stay
    cache.free(0)
    assert prefix.evict(cache.num_blocks) == 2
    reused, gap = serve(tiny, cache, prefix, 2, prompt)
    assert reused == 0 and gap < ATOL


def test_an_evicted_block_loses_its_key_before_anyone_reuses_it(tiny):
    cache, prefix = setup(tiny, num_blocks=4)
    old = seeded_tokens(BS + 1, 11)
    serve(tiny, cache, prefix, 0, old)
    published = cache.tables[0][0]
    cache.free(0)
    cache.create(1)
    with pytest.raises(MemoryError):
        cache.reserve(1, 4 * BS)
    assert prefix.evict(4) == 1                       # make room, as a scheduler would
    cache.reserve(1, 4 * BS)
    assert published in cache.tables[1] and published not in prefix.block_keys and not prefix.entries
    cached_step(tiny, cache, [1], [seeded_tokens(4 * BS, 12)])    # overwrites the old block's KV
    cache.free(1)
    reused, gap = serve(tiny, cache, prefix, 2, old)
    assert reused == 0 and gap < ATOL


def test_attached_blocks_survive_eviction_pressure(tiny):
    cache, prefix = setup(tiny, num_blocks=6)
    prompt = seeded_tokens(2 * BS + 1, 13)
    serve(tiny, cache, prefix, 0, prompt)
    cache.free(0)
    assert prefix.attach(1, prompt) == 2 * BS         # the hit takes its references at once...
    assert prefix.evict(6) == 0                       # ...so the pressure cannot evict what it counted
    got = cached_step(tiny, cache, [1], [prompt[2 * BS:]])[0]
    assert float((got - scratch_logits(tiny, [prompt])[0][-1:]).abs().max()) < ATOL


def test_reset_refuses_while_blocks_are_in_use_then_returns_the_pool(tiny):
    cache, prefix = setup(tiny)
    serve(tiny, cache, prefix, 0, seeded_tokens(2 * BS + 1, 14))
    with pytest.raises(RuntimeError, match="2 cached block\\(s\\) are still in use"):
        prefix.reset()
    cache.free(0)
    prefix.reset()
    assert cache.allocator.num_free == cache.num_blocks and not prefix.entries
    assert prefix.stats() == {"queries": 0, "hits": 0, "tokens_saved": 0, "cached_blocks": 0}


def test_an_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="sequence 3: an empty prompt"):
        PrefixCache(None).attach(3, [])


# ---- a key of the block's own tokens: the quiet failure the tests above cannot see ----------------

class OwnTokensKey(PrefixCache):
    """Planted bug: each block keyed by its own tokens alone. The parent is still checked on lookup,
    so nothing wrong is shared; but X after A and X after B want the same entry, and the second
    request's X is never published."""

    def chain(self, tokens, salt=None, extra_keys=()):
        for _, parent, block_tokens, extra in super().chain(tokens, salt, extra_keys):
            yield self.hash_fn(None, block_tokens, extra), parent, block_tokens, extra


class OwnTokensKeyOverwrites(OwnTokensKey):
    """The same bug with a remember() that replaces a mismatching entry: X after B evicts X after A."""

    def remember(self, seq, tokens, salt=None, extra_keys=()):
        for index, (key, parent, block_tokens, extra) in enumerate(self.chain(tokens[:self.cache.length(seq)],
                                                                                salt, extra_keys)):
            entry = self.entries.get(key)
            if entry is not None and not self.matches(entry, parent, block_tokens, extra):
                self.forget(entry) if entry.children == 0 else None
            if key not in self.entries and self.cache.tables[seq][index] not in self.block_keys:
                self.publish(self.cache.tables[seq][index], key, parent, block_tokens, extra)


def reuse_when_two_histories_share_a_block_text(model, prefix_class):
    """Serve A+X, B+X, then A+X and B+X again; return the tokens each of the last two reused."""
    cache = PagedKVCache(model.config, 32, block_size=BS)
    prefix = prefix_class(cache)
    a, b, x = seeded_tokens(BS, 21), seeded_tokens(BS, 22), seeded_tokens(BS, 23)
    reused = []
    for seq, prompt in enumerate([a + x + [1], b + x + [2], a + x + [3], b + x + [4]]):
        got, gap = serve(model, cache, prefix, seq, prompt)
        assert gap < ATOL
        reused.append(got)
        cache.free(seq)
    return reused[2:]


def test_two_histories_with_the_same_block_text_both_keep_hitting(tiny):
    assert reuse_when_two_histories_share_a_block_text(tiny, PrefixCache) == [2 * BS, 2 * BS]


@pytest.mark.parametrize("bug", [OwnTokensKey, OwnTokensKeyOverwrites], ids=lambda c: c.__name__)
def test_the_test_above_catches_a_key_of_the_blocks_own_tokens(tiny, bug):
    reused = reuse_when_two_histories_share_a_block_text(tiny, bug)
    assert reused != [2 * BS, 2 * BS] and min(reused) == BS     # one of the two lost its second block


# ---- counting: an admission the scheduler undoes is no hit -----------------------------------------

def test_detach_undoes_attach_and_its_counts(tiny):
    cache, prefix = setup(tiny)
    prompt = seeded_tokens(2 * BS + 1, 24)
    serve(tiny, cache, prefix, 0, prompt)
    before = (prefix.stats(), [cache.allocator.refcount(b) for b in cache.tables[0]], cache.allocator.num_free)
    assert prefix.attach(1, prompt) == 2 * BS
    prefix.detach(1)
    assert 1 not in cache.tables
    assert (prefix.stats(), [cache.allocator.refcount(b) for b in cache.tables[0]],
            cache.allocator.num_free) == before


def test_stats_count_only_admissions_that_stand(tiny):
    # Request 2 hits the cache but cannot fit while request 1 runs: the scheduler attaches it, finds
    # no room, and undoes the attach, step after step. Only the admission that stands is a query.
    from engine.sampling import SamplingParams
    from engine.serve.engine import Engine
    cache = PagedKVCache(tiny.config, 11, block_size=BS)
    engine = Engine(tiny, cache)
    prefix = engine.scheduler.prefix
    attaches = []
    attach = prefix.attach
    prefix.attach = lambda seq, *args, **kwargs: attaches.append(seq) or attach(seq, *args, **kwargs)
    shared = seeded_tokens(2 * BS, 25)
    engine.generate([shared + [1]], SamplingParams(max_tokens=1))
    engine.add_request(seeded_tokens(5 * BS, 26), SamplingParams(max_tokens=3 * BS))
    engine.add_request(shared + seeded_tokens(3 * BS, 27), SamplingParams(max_tokens=1))
    engine.run(progress=False)
    assert len(attaches) > 3                          # the third request was attached and undone
    assert prefix.stats()["queries"] == 3 == engine.scheduler.prefix_stats["queries"]
    assert prefix.stats()["hits"] == 1 and prefix.stats()["tokens_saved"] == 2 * BS


# ---- eviction is O(1) per block: the line holds only what may go ------------------------------------

def test_the_eviction_line_holds_exactly_the_evictable_entries(tiny):
    cache, prefix = setup(tiny, num_blocks=40)
    prompts = [seeded_tokens(2 * BS + 1, 30 + i) for i in range(4)]
    for seq, prompt in enumerate(prompts):
        serve(tiny, cache, prefix, seq, prompt)

    def line_is_exact():
        evictable = {k for k, e in prefix.entries.items() if e.children == 0 and cache.allocator.refcount(e.block) == 1}
        return set(prefix.lru) == evictable

    assert not prefix.lru and line_is_exact()        # every cached block is held by its sequence
    leaves = [cache.tables[seq][1] for seq in (2, 0)]
    for seq in (2, 0):
        cache.free(seq)
        assert line_is_exact()
    assert [e.block for e in prefix.lru.values()] == leaves   # in the order they were let go
    cache.fork(1, 9)                                  # more owners: nothing changes in the line
    assert prefix.attach(10, prompts[0]) == 2 * BS    # a hit takes sequence 0's chain out of the line
    assert line_is_exact() and len(prefix.lru) == 1
    prefix.detach(10)
    assert line_is_exact() and len(prefix.lru) == 2


def test_evict_never_looks_at_blocks_in_use(tiny):
    cache, prefix = setup(tiny, num_blocks=64)
    for seq in range(12):
        serve(tiny, cache, prefix, seq, seeded_tokens(2 * BS + 1, 40 + seq))
    cache.free(0)                                     # one chain of two blocks may go; 22 blocks are held
    looked = []
    inner = cache.allocator.inner
    refcount = inner.refcount
    inner.refcount = lambda block: looked.append(block) or refcount(block)
    assert prefix.evict(cache.num_blocks) == 2
    assert len(looked) <= 4                           # the two victims (and a parent check), not the 22
