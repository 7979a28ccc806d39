"""A hypothesis state machine drives PagedKVCache + PrefixCache through random interleavings of
create / append / fork / truncate / free / attach / remember / evict / swap / reset, and checks the
bookkeeping after every step.

No model: the cache is one layer with one KV head of width 2, and each token writes its own id as
its key (and minus its id as its value). So besides the reference counts, every step can check
that every live sequence still reads back exactly its own tokens: forks, copy-on-write, prefix hits,
rollbacks and swaps must never let one sequence see another's writes.
"""
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from engine.cache.errors import OutOfBlocks
from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.checkpoint import tiny_config

BLOCK_SIZE, NUM_BLOCKS = 2, 12
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=7)     # a tiny alphabet: prefixes repeat often
PICK = st.integers(0, 10_000)                                    # picks one of the live sequences
STEPS = {"count": 0}


class CacheMachine(RuleBasedStateMachine):
    """The caches under test, and a plain-Python model of what each sequence must hold."""

    def __init__(self):
        super().__init__()
        config = tiny_config(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2)
        self.cache = PagedKVCache(config, NUM_BLOCKS, block_size=BLOCK_SIZE, attention="reference")
        self.prefix = PrefixCache(self.cache)
        self.tokens: dict[int, list[int]] = {}       # what each sequence (live or swapped) must hold
        self.salts: dict[int, object] = {}
        self.next_id, self.started = 0, False

    # ---- helpers ----

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def live(self) -> list[int]:
        return sorted(self.cache.tables)

    def pick(self, index: int) -> int:
        return self.live()[index % len(self.live())]

    def snapshot(self):
        allocator = self.cache.allocator
        return ({s: list(t) for s, t in self.cache.tables.items()}, list(allocator.refs), list(allocator.free),
                dict(self.cache.lengths))

    def write(self, seq: int, new: list[int]) -> bool:
        """Reserve and store new tokens for seq (evicting cached blocks if short); False if no room."""
        before = self.snapshot()
        try:
            self.cache.reserve(seq, len(new))
        except OutOfBlocks as error:
            assert self.snapshot() == before, "a failed reserve changed the cache"
            self.prefix.evict(error.wanted)
            try:
                self.cache.reserve(seq, len(new))
            except OutOfBlocks:
                return False
        start = self.cache.length(seq)
        positions = torch.arange(start, start + len(new))[None]
        keys = torch.tensor(new, dtype=torch.float32)[None, None, :, None].expand(1, 1, len(new), 2)
        self.cache.set_batch([seq])
        self.cache.update(0, keys, -keys, positions)
        self.tokens[seq] = self.tokens[seq] + new
        return True

    # ---- rules ----

    @rule(new=TOKENS, publish=st.booleans())
    def create_and_prefill(self, new, publish=False):
        seq = self.new_id()
        self.cache.create(seq)
        self.tokens[seq], self.salts[seq] = [], None
        if self.write(seq, new) and publish:
            self.prefix.remember(seq, self.tokens[seq])

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK, tail=st.lists(st.integers(0, 2), max_size=3))
    def prefill_a_known_prompt_without_the_cache(self, index, tail):
        # Two requests with one prompt, the second prefilled before the first was remembered:
        # equal blocks in different physical blocks, the case that pins a child but not its parent.
        source = self.pick(index)
        if self.tokens[source] + tail:
            self.create_and_prefill(self.tokens[source] + tail)
            self.salts[self.next_id - 1] = self.salts[source]

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK, new=TOKENS)
    def append(self, index, new):
        self.write(self.pick(index), new[:3])

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK)
    def fork(self, index):
        parent, child = self.pick(index), self.new_id()
        free = self.cache.allocator.num_free
        self.cache.fork(parent, child)
        assert self.cache.allocator.num_free == free, "a fork must not allocate"
        self.tokens[child], self.salts[child] = list(self.tokens[parent]), self.salts[parent]

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK, cut=st.integers(0, 6))
    def truncate(self, index, cut):
        seq = self.pick(index)
        length = max(0, len(self.tokens[seq]) - cut)
        self.cache.truncate(seq, length)
        self.tokens[seq] = self.tokens[seq][:length]

    @precondition(lambda self: self.tokens)
    @rule(index=PICK)
    def free(self, index):
        seq = sorted(self.tokens)[index % len(self.tokens)]
        self.cache.free(seq)
        del self.tokens[seq], self.salts[seq]

    @rule(prompt=TOKENS, salt=st.sampled_from([None, "tenant-b"]))
    def attach_and_prefill(self, prompt, salt):
        seq = self.new_id()
        reused = self.prefix.attach(seq, prompt, salt=salt)
        # Only whole blocks are reused, and at least one prompt token is always left to prefill.
        assert reused < len(prompt) and (reused % BLOCK_SIZE == 0 or reused == len(prompt) - 1)
        assert self.cache.length(seq) == reused
        self.tokens[seq], self.salts[seq] = list(prompt[:reused]), salt
        if self.write(seq, prompt[reused:]):
            self.prefix.remember(seq, self.tokens[seq], salt=salt)     # as a server does after prefill

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK, tail=st.lists(st.integers(0, 2), max_size=3))
    def attach_to_a_known_prompt(self, index, tail):
        source = self.pick(index)                    # a live sequence's tokens: often remembered
        if self.tokens[source] + tail:
            self.attach_and_prefill(self.tokens[source] + tail, self.salts[source])

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK)
    def remember(self, index):
        seq = self.pick(index)
        self.prefix.remember(seq, self.tokens[seq], salt=self.salts[seq])

    @rule(wanted=st.integers(0, NUM_BLOCKS))
    def evict(self, wanted):
        free = self.cache.allocator.num_free
        freed = self.prefix.evict(wanted)
        assert self.cache.allocator.num_free == free + freed
        if self.cache.allocator.num_free < wanted:   # it stopped short: nothing left it may evict
            assert all(e.children or self.cache.allocator.refcount(e.block) > 1 for e in self.prefix.entries.values())

    @precondition(lambda self: self.cache.tables)
    @rule(index=PICK)
    def swap_out(self, index):
        self.cache.swap_out(self.pick(index))

    @precondition(lambda self: self.cache.swapped)
    @rule(index=PICK)
    def swap_in(self, index):
        seq = sorted(self.cache.swapped)[index % len(self.cache.swapped)]
        before = self.snapshot()
        try:
            self.cache.swap_in(seq)
        except OutOfBlocks:
            assert self.snapshot() == before and seq in self.cache.swapped

    @rule()
    def reset_prefix_cache(self):
        in_use = any(self.cache.allocator.refcount(e.block) > 1 for e in self.prefix.entries.values())
        try:
            self.prefix.reset()
            assert not in_use and not self.prefix.entries
        except RuntimeError:
            assert in_use

    # ---- invariants, checked after every step ----

    @invariant()
    def count_the_step(self):
        STEPS["count"] += self.started             # invariants also run once before the first step
        self.started = True

    @invariant()
    def refcounts_equal_the_owners_naming_each_block(self):
        owners = [0] * NUM_BLOCKS
        for table in self.cache.tables.values():     # swapped-out sequences hold no block
            for block in table:
                owners[block] += 1
        for entry in self.prefix.entries.values():
            owners[entry.block] += 1
        assert [self.cache.allocator.refcount(b) for b in range(NUM_BLOCKS)] == owners

    @invariant()
    def free_and_referenced_blocks_split_the_pool(self):
        free = list(self.cache.allocator.free)
        used = {b for b in range(NUM_BLOCKS) if self.cache.allocator.refcount(b) > 0}
        assert len(free) == len(set(free)) == self.cache.allocator.num_free
        assert set(free).isdisjoint(used) and set(free) | used == set(range(NUM_BLOCKS))

    @invariant()
    def every_sequence_reads_back_its_own_tokens(self):
        keys = self.cache.k_pools[0][:, 0, :, 0].tolist()      # keys[block][offset]: the token written there
        values = self.cache.v_pools[0][:, 0, :, 1].tolist()
        for seq, table in self.cache.tables.items():
            want = self.tokens[seq]
            assert self.cache.length(seq) == len(want) and len(table) * BLOCK_SIZE >= len(want)
            slots = [(table[p // BLOCK_SIZE], p % BLOCK_SIZE) for p in range(len(want))]
            assert [keys[b][o] for b, o in slots] == want
            assert [values[b][o] for b, o in slots] == [-t for t in want]
        for seq, saved in self.cache.swapped.items():
            assert saved.length == len(self.tokens[seq])

    @invariant()
    def prefix_entries_are_consistent(self):
        entries = self.prefix.entries
        assert {e.block: e.key for e in entries.values()} == self.prefix.block_keys
        for entry in entries.values():
            children = [e for e in entries.values() if e.parent == entry.key]
            assert entry.children == len(children)
        # The eviction line holds exactly the leaves that only the cache holds: leaves before parents,
        # never a block in use, and evict() never has to step over anything.
        evictable = {k for k, e in entries.items() if not e.children and self.cache.allocator.refcount(e.block) == 1}
        assert set(self.prefix.lru) == evictable and len(self.prefix.lru) == len(evictable)

    def teardown(self):
        for seq in list(self.tokens):
            self.cache.free(seq)
        self.prefix.reset()
        allocator = self.cache.allocator
        assert allocator.num_free == NUM_BLOCKS and not any(allocator.refs), "blocks leaked"
        assert sorted(allocator.allocate(NUM_BLOCKS)) == list(range(NUM_BLOCKS))


SETTINGS = settings(
    max_examples=300, stateful_step_count=50, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], print_blob=False,
)


def test_ten_thousand_random_steps_keep_the_books_straight():
    STEPS["count"] = 0
    run_state_machine_as_test(CacheMachine, settings=SETTINGS)
    assert STEPS["count"] >= 10_000, f"the state machine ran only {STEPS['count']} steps"
