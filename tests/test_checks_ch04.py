"""The chapter-4 checks pass on the engine's PagedKVCache, fail on stubs, and fail on classic fork and
copy-on-write bugs with a message that says what went wrong."""
import pytest

from engine.cache.paged import PagedKVCache
from engine.checks import ch04
from fixtures.check_support import fails

CHECKS = [
    ch04.check_fork_shares,
    ch04.check_copy_on_write,
    ch04.check_fork_block_counts,
    ch04.check_fork_then_diverge,
    ch04.check_parallel_sampling,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_reference_passes(check, capsys):
    check(PagedKVCache)
    assert capsys.readouterr().out.startswith("✓")


def test_block_counts_reproduce_the_demo():
    counts = ch04.fork_block_counts(PagedKVCache)
    assert counts == {"parent_blocks": 3, "new_blocks_after_forks": 0,
                      "new_blocks_after_each_fork_writes_a_token": 4,
                      "new_blocks_after_the_parent_writes": 0, "blocks_for_independent_copies": 12}


# ---- stubs ----------------------------------------------------------------------------------------

class StubCache(PagedKVCache):
    def fork(self, parent, child):
        raise NotImplementedError()

    def copy_on_write(self, seq, index):
        raise NotImplementedError()


class StubCopyOnWrite(PagedKVCache):
    def copy_on_write(self, seq, index):
        raise NotImplementedError()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_stub_is_not_implemented(check):
    message = fails(check, StubCache)
    assert "not implemented yet" in message
    assert "StubCache.fork" in message or "StubCache.copy_on_write" in message


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_half_done_chapter_names_the_missing_method(check):
    if check is ch04.check_fork_shares:      # fork alone works: this check passes
        check(StubCopyOnWrite)
        return
    message = fails(check, StubCopyOnWrite)
    assert "StubCopyOnWrite.copy_on_write" in message and "not implemented yet" in message


# ---- planted bugs: each overrides fork or copy_on_write through the cache's public attributes -----

def copy_block(cache, source, target, pools=None):
    for pool in pools if pools is not None else cache.k_pools + cache.v_pools:
        pool[target].copy_(pool[source])


class NoCopyOnWrite(PagedKVCache):
    """Writes go straight into the shared block."""

    def copy_on_write(self, seq, index):
        pass


class CopyWrongBlock(PagedKVCache):
    """Copies the data of the block before the one about to be written."""

    def copy_on_write(self, seq, index):
        table = self.tables[seq]
        if self.allocator.refcount(table[index]) == 1:
            return
        [fresh] = self.allocator.allocate(1)
        copy_block(self, table[max(index - 1, 0)], fresh)
        self.allocator.release(table[index])
        table[index] = fresh


class CopyForgetsRelease(PagedKVCache):
    def copy_on_write(self, seq, index):
        table = self.tables[seq]
        if self.allocator.refcount(table[index]) == 1:
            return
        [fresh] = self.allocator.allocate(1)
        copy_block(self, table[index], fresh)
        table[index] = fresh


class CopyForgetsRepoint(PagedKVCache):
    """Copies into a fresh block and releases the old one, but the table keeps naming the old block."""

    def copy_on_write(self, seq, index):
        table = self.tables[seq]
        if self.allocator.refcount(table[index]) == 1:
            return
        [fresh] = self.allocator.allocate(1)
        copy_block(self, table[index], fresh)
        self.allocator.release(table[index])


class CopyKeysOnly(PagedKVCache):
    def copy_on_write(self, seq, index):
        table = self.tables[seq]
        if self.allocator.refcount(table[index]) == 1:
            return
        [fresh] = self.allocator.allocate(1)
        copy_block(self, table[index], fresh, pools=self.k_pools)
        self.allocator.release(table[index])
        table[index] = fresh


class CopyAlways(PagedKVCache):
    """Copies even a private block: correct results, wasted copies."""

    def copy_on_write(self, seq, index):
        table = self.tables[seq]
        [fresh] = self.allocator.allocate(1)
        copy_block(self, table[index], fresh)
        self.allocator.release(table[index])
        table[index] = fresh


class ForkCopiesData(PagedKVCache):
    """A deep copy: right answers, none of the savings."""

    def fork(self, parent, child):
        self.create(child)
        fresh = self.allocator.allocate(len(self.tables[parent]))
        for source, target in zip(self.tables[parent], fresh):
            copy_block(self, source, target)
        self.tables[child] = fresh
        self.lengths[child] = self.lengths[parent]


class ForkForgetsShare(PagedKVCache):
    def fork(self, parent, child):
        self.create(child)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]


class ForkAliasesTable(PagedKVCache):
    """The child's table is the parent's list itself."""

    def fork(self, parent, child):
        self.create(child)
        self.tables[child] = self.tables[parent]
        self.lengths[child] = self.lengths[parent]
        for block in self.tables[child]:
            self.allocator.share(block)


DIVERGED = ["from-scratch run", "max |Δ|", "block another sequence still uses"]


@pytest.mark.parametrize("check, bug, words", [
    # fork
    (ch04.check_fork_shares, ForkCopiesData, ["the child's block table", "copy the table, not the blocks"]),
    (ch04.check_fork_shares, ForkForgetsShare, ["refcounts", "expected [2, 2, 2], got [1, 1, 1]", "share every block"]),
    (ch04.check_fork_shares, ForkAliasesTable, ["same list object", "list(table)"]),
    (ch04.check_fork_block_counts, ForkCopiesData, ["after forking it 4 ways", "expected 0, got 12"]),
    (ch04.check_fork_then_diverge, ForkForgetsShare, ["from-scratch run", "has refcount 1", "must share"]),
    (ch04.check_fork_then_diverge, ForkAliasesTable, ["from-scratch run", "the very same table list"]),
    (ch04.check_parallel_sampling, ForkForgetsShare, ["from-scratch run", "has refcount 1", "must share"]),
    # copy-on-write
    (ch04.check_copy_on_write, NoCopyOnWrite, ["is still the shared block"]),
    (ch04.check_copy_on_write, CopyWrongBlock, ["does not hold the contents", "not another one"]),
    (ch04.check_copy_on_write, CopyForgetsRelease, ["refcount of the old block", "expected 1, got 2", "release"]),
    (ch04.check_copy_on_write, CopyForgetsRepoint, ["is still the shared block", "never repointed",
                                                    "set table[index] to the fresh block"]),
    (ch04.check_fork_then_diverge, CopyForgetsRepoint, ["from-scratch run", "named by no table",
                                                        "never repointed the table"]),
    (ch04.check_parallel_sampling, CopyForgetsRepoint, ["from-scratch run", "never repointed the table"]),
    (ch04.check_copy_on_write, CopyKeysOnly, ["V pool of layer 0", "K and V both"]),
    (ch04.check_copy_on_write, CopyAlways, ["only sequence 0 uses", "copy only shared blocks"]),
    (ch04.check_fork_block_counts, NoCopyOnWrite, ["each of the 4 forks writes one token", "expected 4, got 0",
                                                   "copy-on-write missing"]),
    (ch04.check_fork_block_counts, CopyForgetsRelease, ["then the parent writes", "expected 0, got 1"]),
    (ch04.check_fork_then_diverge, NoCopyOnWrite, DIVERGED),
    (ch04.check_fork_then_diverge, CopyWrongBlock, DIVERGED),
    (ch04.check_fork_then_diverge, CopyKeysOnly, DIVERGED),
    (ch04.check_fork_then_diverge, CopyForgetsRelease, ["after freeing every sequence", "release the block it copied"]),
    (ch04.check_parallel_sampling, NoCopyOnWrite, DIVERGED),
    (ch04.check_parallel_sampling, CopyWrongBlock, DIVERGED),
], ids=lambda x: getattr(x, "__name__", ""))
def test_bug_is_caught(check, bug, words):
    message = fails(check, bug)
    for word in words:
        assert word in message, message


def test_divergence_message_names_the_position():
    message = fails(ch04.check_fork_then_diverge, NoCopyOnWrite)
    # The first token after the fork is at position 10 (a 10-token prompt, blocks of 4).
    assert "after fork + one different token each, sequence" in message
    assert "at position 10" in message


# ---- the chapter's small exercise: blocks held by n forked samples ---------------------------------

def shared_blocks(prompt_len, n, generated, block_size):
    if generated == 0:
        return -(-prompt_len // block_size)
    full = prompt_len // block_size
    return full + n * (-(-(prompt_len + generated) // block_size) - full)


def shared_blocks_without_copies(prompt_len, n, generated, block_size):
    """Forgets that each writer copies the shared partial block."""
    prompt_blocks = -(-prompt_len // block_size)
    return prompt_blocks + n * (-(-(prompt_len + generated) // block_size) - prompt_blocks)


def unshared_blocks(prompt_len, n, generated, block_size):
    return n * -(-(prompt_len + generated) // block_size)


def test_shared_blocks_reference_passes(capsys):
    ch04.check_shared_blocks(shared_blocks)
    assert "129 blocks, not 504" in capsys.readouterr().out


@pytest.mark.parametrize("bug, words", [
    (shared_blocks_without_copies, ["shared_blocks(prompt_len=40, n=4, generated=1, block_size=16)",
                                    "expected 6, got 3", "once per sample"]),
    (unshared_blocks, ["generated=0", "expected 3, got 12", "share every prompt block"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_shared_blocks_bug_is_caught(bug, words):
    message = fails(ch04.check_shared_blocks, bug)
    for word in words:
        assert word in message, message


def test_shared_blocks_stub_is_not_implemented():
    def stub(*args):
        raise NotImplementedError()
    assert "not implemented yet" in fails(ch04.check_shared_blocks, stub)


def test_a_copy_that_is_never_repointed_is_not_blamed_on_fork():
    for check in (ch04.check_copy_on_write, ch04.check_fork_then_diverge, ch04.check_parallel_sampling):
        message = fails(check, CopyForgetsRepoint)
        assert "fork must share" not in message and "repoint" in message, message
