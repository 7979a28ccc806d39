"""The chapter-4 checks pass on the engine's PagedKVCache, fail on stubs, and fail on classic fork and
copy-on-write bugs with a message that says what went wrong."""
import pytest

from engine.cache.paged import PagedKVCache
from engine.checks import ch04
from fixtures.check_support import by_name, fails, fails_with, hosted, mutant, passes, stub

CHECKS = [ch04.check_fork_shares, ch04.check_copy_on_write, ch04.check_fork_block_counts,
          ch04.check_fork_then_diverge, ch04.check_parallel_sampling]


@pytest.mark.parametrize("check", CHECKS, ids=by_name)
def test_reference_passes(check):
    passes(check, PagedKVCache)


def test_block_counts_reproduce_the_demo():
    counts = ch04.fork_block_counts(PagedKVCache)
    assert counts == {"parent_blocks": 3, "new_blocks_after_forks": 0,
                      "new_blocks_after_each_fork_writes_a_token": 4,
                      "new_blocks_after_the_parent_writes": 0, "blocks_for_independent_copies": 12}


# ---- stubs ----------------------------------------------------------------------------------------

StubCache = stub(PagedKVCache, "fork", "copy_on_write", name="StubCache")
StubCopyOnWrite = stub(PagedKVCache, "copy_on_write", name="StubCopyOnWrite")


@pytest.mark.parametrize("check", CHECKS, ids=by_name)
def test_stub_is_not_implemented(check):
    fails_with(check, StubCache, ["not implemented yet", ("StubCache.fork", "StubCache.copy_on_write")])


@pytest.mark.parametrize("check", CHECKS, ids=by_name)
def test_half_done_chapter_names_the_missing_method(check):
    if check is ch04.check_fork_shares:      # fork alone works: this check passes
        passes(check, StubCopyOnWrite)
        return
    fails_with(check, StubCopyOnWrite, ["StubCopyOnWrite.copy_on_write", "not implemented yet"])


# ---- planted bugs: the engine's fork or copy_on_write with the edit shown as a diff, or written anew ------

class NoCopyOnWrite(PagedKVCache):
    """Writes go straight into the shared block."""

    def copy_on_write(self, seq, index):
        pass


# Copies the data of the block before the one about to be written.
CopyWrongBlock = mutant(PagedKVCache, "copy_on_write", """
-        pool[fresh].copy_(pool[block])
+        pool[fresh].copy_(pool[table[max(index - 1, 0)]])
""", name="CopyWrongBlock")
CopyForgetsRelease = mutant(PagedKVCache, "copy_on_write", """
-    self.allocator.release(block)
""", name="CopyForgetsRelease")
# Copies into a fresh block and releases the old one, but the table keeps naming the old block.
CopyForgetsRepoint = mutant(PagedKVCache, "copy_on_write", """
-    table[index] = fresh
""", name="CopyForgetsRepoint")
CopyKeysOnly = mutant(PagedKVCache, "copy_on_write", """
-    for pool in self.k_pools + self.v_pools:
+    for pool in self.k_pools:
""", name="CopyKeysOnly")
# Copies even a private block: correct results, wasted copies.
CopyAlways = mutant(PagedKVCache, "copy_on_write", """
-    if self.allocator.refcount(block) == 1:
-        return
""", name="CopyAlways")


class ForkCopiesData(PagedKVCache):
    """A deep copy: right answers, none of the savings."""

    def fork(self, parent, child):
        self.create(child)
        fresh = self.allocator.allocate(len(self.tables[parent]))
        for source, target in zip(self.tables[parent], fresh):
            for pool in self.k_pools + self.v_pools:
                pool[target].copy_(pool[source])
        self.tables[child] = fresh
        self.lengths[child] = self.lengths[parent]


ForkForgetsShare = mutant(PagedKVCache, "fork", """
-    for block in self.tables[child]:
-        self.allocator.share(block)
""", name="ForkForgetsShare")
# The child's table is the parent's list itself.
ForkAliasesTable = mutant(PagedKVCache, "fork", """
-    table = list(self.table(parent))
+    table = self.table(parent)
""", name="ForkAliasesTable")


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
], ids=by_name)
def test_bug_is_caught(check, bug, words):
    fails_with(check, bug, words)


def test_divergence_message_names_the_position():
    # The first token after the fork is at position 10 (a 10-token prompt, blocks of 4).
    fails_with(ch04.check_fork_then_diverge, NoCopyOnWrite, ["after fork + one different token each, sequence",
                                                             "at position 10"])


def test_a_divergence_is_written_out_as_text():
    """The milestone's failure goes on with the trained model's sentence, from scratch and through the
    learner's forked cache, and the token where they part."""
    text = ch04.continuations.side_by_side(ch04.forked_run(NoCopyOnWrite))
    message = fails_with(ch04.check_fork_then_diverge, NoCopyOnWrite,
                         DIVERGED + ["The trained tiny model writes it out: from-scratch: ", ", yours: ",
                                     f", token {text.parted_at}"])
    assert str(text) in message and text.prompt == "The block table maps"
    cut = text.parted_at - len(text.prompt)
    assert cut >= 0 and text.scratch[:cut] == text.cached[:cut] and text.scratch[cut] != text.cached[cut]


def test_the_engine_writes_the_same_sentence_through_a_fork():
    text = ch04.continuations.side_by_side(ch04.forked_run(PagedKVCache))
    assert text.parted_at is None and text.scratch == text.cached and len(text.scratch) == 24
    assert str(text).startswith("from-scratch and yours both write 'The block table maps")


def test_a_plain_cache_and_an_int8_one_are_written_out_too():
    """What the other chapters' checks would call: a plain run through a cache, from scratch on the other
    side, or the engine's own run where the cache is not exact (int8 blocks)."""
    from engine.cache.quantized import QuantizedPagedKVCache
    from engine.checks import ceil_div

    def run(kind):
        return ch04.continuations.plain_run(lambda config, n: kind(config, ceil_div(n, 16) + 1, block_size=16))
    plain = ch04.continuations.side_by_side(run(PagedKVCache))
    assert plain.parted_at is None and str(plain).startswith("from-scratch and yours both write 'The block table")
    int8 = ch04.continuations.side_by_side(run(QuantizedPagedKVCache), reference=run(QuantizedPagedKVCache))
    assert int8.parted_at is None and str(int8).startswith("the engine's and yours both write 'The block table")


def test_a_passing_check_writes_no_text(monkeypatch):
    def never(*args):
        raise AssertionError("continuations computed for a passing check")
    monkeypatch.setattr(ch04.continuations, "shown", never)
    passes(ch04.check_fork_then_diverge, PagedKVCache)


def test_a_cache_that_crashes_while_writing_still_gets_its_message():
    from engine.checkpoint import trained_config

    class CrashesOnFork(NoCopyOnWrite):
        def fork(self, parent, child):
            if self.config == trained_config():            # only in the text's run, under the trained model
                raise RuntimeError("fork broke")
            super().fork(parent, child)
    message = fails_with(ch04.check_fork_then_diverge, CrashesOnFork, DIVERGED)
    assert "could not write through your cache: RuntimeError: fork broke" in message


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


def test_the_checks_count_is_what_a_real_cache_holds():
    """check_shared_blocks counts by formula (so the student edition's judge needs no fork): on every
    case it checks and a grid around block boundaries, that count is what the engine's PagedKVCache holds."""
    grid = {(p, n, g, bs) for bs in (1, 4, 16) for p in (1, bs - 1, bs, bs + 1, 2 * bs + 1, 40) if p > 0
            for n in (1, 3) for g in (0, 1, bs - 1, bs, bs + 1)}
    grid |= {(40, 4, 0, 16), (40, 4, 9, 16), (40, 4, 30, 16), (2000, 4, 1, 16), (100, 8, 100, 8)}
    wrong = [(case, ch04._blocks_held(*case), ch04.simulate_forks(*case).blocks_in_use) for case in sorted(grid)
             if ch04._blocks_held(*case) != ch04.simulate_forks(*case).blocks_in_use]
    assert len(grid) == 149 and not wrong, wrong


def test_shared_blocks_reference_passes():
    assert "129 blocks, not 504" in passes(ch04.check_shared_blocks, shared_blocks)


@pytest.mark.parametrize("bug, words", [
    (shared_blocks_without_copies, ["shared_blocks(prompt_len=40, n=4, generated=1, block_size=16)",
                                    "expected 6, got 3", "once per sample"]),
    (unshared_blocks, ["generated=0", "expected 3, got 12", "share every prompt block"]),
], ids=by_name)
def test_shared_blocks_bug_is_caught(bug, words):
    fails_with(ch04.check_shared_blocks, bug, words)


def test_shared_blocks_stub_is_not_implemented():
    def stub(*args):
        raise NotImplementedError()
    assert "not implemented yet" in fails(ch04.check_shared_blocks, stub)


def test_a_copy_that_is_never_repointed_is_not_blamed_on_fork():
    for check in (ch04.check_copy_on_write, ch04.check_fork_then_diverge, ch04.check_parallel_sampling):
        message = fails(check, CopyForgetsRepoint)
        assert "fork must share" not in message and "repoint" in message, message


# fork's copy of the table, written as learners write it: each is a new list, so each passes.
FORKS_COPYING = {"slice": "table = self.table(parent)[:]", "copy": "table = self.table(parent).copy()",
                 "unpacked": "table = [*self.table(parent)]",
                 "comprehension": "table = [block for block in self.table(parent)]"}


def test_an_aliased_table_is_caught_by_what_the_judge_sees(monkeypatch):
    """make grade holds the learner's class in another process, whose tables the judge reads as data: a
    child's table that is the parent's list object shows there by behaviour (the child truncated, the
    parent's table cut too), through the cache's own methods. The host is asked to run none of the
    checks' helpers, so a host that would report "no aliasing" has no say; honest copies pass."""
    import engine.course.grading.sealed.host as host
    asked = []
    monkeypatch.setattr(host, "named", lambda module, qualname: asked.append(qualname) or (lambda *a, **k: []))
    copying = {name: mutant(PagedKVCache, "fork", f"-    table = list(self.table(parent))\n+    {line}",
                            name=f"Fork_{name}") for name, line in FORKS_COPYING.items()}
    with hosted(right=PagedKVCache, aliases=ForkAliasesTable, **copying) as remote:
        passes(ch04.check_fork_shares, remote["right"])
        fails_with(ch04.check_fork_shares, remote["aliases"], ["same list object", "list(table)",
                                                               "truncate(11, 1)"])
        for name in copying:
            passes(ch04.check_fork_shares, remote[name])
    assert asked == []
    for cls in copying.values():
        passes(ch04.check_fork_shares, cls)
