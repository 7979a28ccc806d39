"""The chapter-3 checks pass on the engine's PagedKVCache, fail on stubs, and fail on each classic bug of
the paged cache with a hint that names that bug."""
import pytest

from engine.cache.paged import PagedKVCache
from engine.cache.errors import OutOfBlocks
from engine.cache.slots import blocks_needed
from engine.checks import ch03
from fixtures.check_support import by_name, cases, fails, fails_with, hosted, mutant, passes, stub

METHOD_CHECKS = [ch03.check_reserve, ch03.check_set_batch, ch03.check_write, ch03.check_gather,
                 ch03.check_free, ch03.check_truncate]
CHECKS = METHOD_CHECKS + [ch03.check_cache_matches_scratch]
EXERCISES = [(ch03.check_reserve, ch03.check_set_batch), (ch03.check_write, ch03.check_gather),
             (ch03.check_free, ch03.check_truncate)]


@pytest.mark.parametrize("check", CHECKS, ids=by_name)
def test_reference_passes(check):
    passes(check, PagedKVCache)


def test_decisive_check_passes_with_other_sizes():
    assert "20 decode steps" in passes(ch03.check_cache_matches_scratch, PagedKVCache, block_size=3, seed=1, steps=20)


StubCache = stub(PagedKVCache, "reserve", "set_batch", "write", "gather", "free", "truncate", name="StubCache")


@pytest.mark.parametrize("check", CHECKS, ids=by_name)
def test_stub_is_not_implemented(check):
    assert "not implemented yet" in fails(check, StubCache)


@pytest.mark.parametrize("check", [ch03.check_q1_truncate_releases, ch03.check_q2_failed_reserve,
                                   ch03.check_q3_slot], ids=by_name)
def test_unanswered_review_question_fails(check):
    fails(check, None)


def test_review_answers():
    passes(ch03.check_q1_truncate_releases, 1)
    passes(ch03.check_q2_failed_reserve, 5)
    passes(ch03.check_q3_slot, "b")
    assert "ceil(37/16)" in fails(ch03.check_q1_truncate_releases, 2)
    assert "all or nothing" in fails(ch03.check_q2_failed_reserve, 3)
    assert "p // bs" in fails(ch03.check_q3_slot, "a")


# ---- planted bugs: each overrides one method, written as a learner might or as the engine's own with a diff --

class ReservePartial(PagedKVCache):
    """Takes blocks one at a time and lets the allocator's OutOfBlocks stop it halfway."""

    def reserve(self, seq, n):
        table = self.tables[seq]
        while len(table) < blocks_needed(self.lengths[seq] + n, self.block_size):
            table.extend(self.allocator.allocate(1))


# (length + n) // bs + 1 blocks: one too many whenever the end falls on a block boundary.
ReserveExtraBlock = mutant(PagedKVCache, "reserve", """
-    new = max(0, blocks_needed(self.lengths[seq] + n, self.block_size) - len(table))
+    new = max(0, (self.lengths[seq] + n) // self.block_size + (1 if n else 0) - len(table))
""", name="ReserveExtraBlock")


# Counts the new blocks only: the copy of a shared partial last block (chapter 4's copy-on-write) is taken
# unpaid, so a pool that holds the new blocks but not the copy does not raise OutOfBlocks.
ReserveUncountedCopy = mutant(PagedKVCache, "reserve", """
-    wanted = new + len(copies)
+    wanted = new
""", name="ReserveUncountedCopy")
# Counts the copy but never asks for it: the sequence would write into a block another one still reads.
ReserveNeverCopies = mutant(PagedKVCache, "reserve", """
-    self.copy_on_write(seq, index)
+    pass
""", name="ReserveNeverCopies")


class ReserveCommitsLength(PagedKVCache):
    def reserve(self, seq, n):
        super().reserve(seq, n)
        self.lengths[seq] += n


SetBatchPadsWithMinusOne = mutant(PagedKVCache, "set_batch", """
-    rows = [table + [0] * (width - len(table)) for table in tables]
+    rows = [table + [-1] * (width - len(table)) for table in tables]
""", name="SetBatchPadsWithMinusOne")


class SetBatchSortsRows(PagedKVCache):
    def set_batch(self, seqs):
        super().set_batch(sorted(seqs))


# The slot is taken from the logical block: p // bs * bs + p % bs = p, as if the table were [0, 1, ...].
WriteIgnoresTable = mutant(PagedKVCache, "write", """
-    slots = slot_mapping(self.block_tables, positions, self.block_size)[valid]
+    slots = positions[valid]
""", name="WriteIgnoresTable")
# Scatters every column, padding included: slot -1 is the pool's last slot.
WritesPadding = mutant(PagedKVCache, "write", """
-    valid = positions >= 0
+    valid = positions >= -1
""", name="WritesPadding")
# kv_len = the slots reserved: right only when a row ends exactly on a block boundary.
KvLensFromSlots = mutant(PagedKVCache, "write", """
-    kv_lens = torch.cat([self.batch_lengths[:, None], newest], dim=1).amax(dim=1)
+    kv_lens = self.batch_capacity.clone()
""", name="KvLensFromSlots")


class KvLensOneShort(PagedKVCache):
    """kv_len = the highest position, forgetting the + 1."""

    def write(self, layer, k, v, positions):
        kv_lens = super().write(layer, k, v, positions)
        return kv_lens - 1


class CommitsEveryLayer(PagedKVCache):
    """Adds the new tokens to the length on every layer."""

    def write(self, layer, k, v, positions):
        kv_lens = self.batch_lengths + (positions >= 0).sum(dim=1)
        super().write(layer, k, v, positions)
        self.lengths.update(zip(self.batch, kv_lens.tolist()))
        self.batch_lengths = kv_lens
        return kv_lens


GatherIgnoresTable = mutant(PagedKVCache, "gather", """
-    slots = slot_mapping(self.block_tables, history, self.block_size).clamp(min=0)
+    slots = history.clamp(min=0)
""", name="GatherIgnoresTable")


class FreeLeaks(PagedKVCache):
    """Forgets the sequence without releasing its blocks."""

    def free(self, seq):
        del self.tables[seq], self.lengths[seq]


FreeKeepsLastBlock = mutant(PagedKVCache, "free", """
-    for block in self.table(seq):
+    for block in self.table(seq)[:-1]:
""", name="FreeKeepsLastBlock")
# Drops the table entries past the new length but never releases their blocks.
TruncateWithoutRelease = mutant(PagedKVCache, "truncate", """
-        self.allocator.release(block)
+        pass
""", name="TruncateWithoutRelease")
# Keeps length // bs blocks: the partial last block, which still holds tokens, is released.
TruncateDropsPartialBlock = mutant(PagedKVCache, "truncate", """
-    keep = blocks_needed(length, self.block_size)
+    keep = length // self.block_size
""", name="TruncateDropsPartialBlock")
# Rebinds the table to a new list: a caller holding the old one still sees the released blocks.
TruncateRebinds = mutant(PagedKVCache, "truncate", """
-    del table[keep:]
+    self.tables[seq] = table[:keep]
""", name="TruncateRebinds")
# Returns early when the length does not change, keeping blocks reserved past it.
TruncateSameLengthReturns = mutant(PagedKVCache, "truncate", """
-    keep = blocks_needed(length, self.block_size)
+    if length == self.lengths[seq]:
+        return
+    keep = blocks_needed(length, self.block_size)
""", name="TruncateSameLengthReturns")


BUGS = cases({   # the check of each exercise: the planted bugs it must name, with words of their hints
    ch03.check_reserve: {
        ReservePartial: ["raised OutOfBlocks", "allocates some blocks then fails"],
        ReserveExtraBlock: ["expected 1, got 2", "one block too many at a block boundary"],
        ReserveCommitsLength: ["length(", "reserve only makes room"],
        ReserveUncountedCopy: ["shared partial block", "no error", "needs a copy too",
                               "len(self.shared_writes(seq, n))"],
        ReserveNeverCopies: ["the copies reserve asked copy_on_write for", "expected [(0, 1)], got []"],
    },
    ch03.check_set_batch: {
        SetBatchPadsWithMinusOne: ["padding of row", "pad short rows with block 0"],
        SetBatchSortsRows: ["self.batch", "keep the sequences in the order given"],
    },
    ch03.check_write: {
        WriteIgnoresTable: ["taken from the logical block and the table ignored"],
        WritesPadding: ["padding was written", "positions >= 0"],
        KvLensOneShort: ["kv_lens returned by write(layer=0)", "one short"],
        KvLensFromSlots: ["kv_lens", "slots reserved", "exactly on a block boundary"],
        CommitsEveryLayer: ["lengths after write(layer=0) of 2 layers", "committed per layer"],
    },
    ch03.check_gather: {GatherIgnoresTable: ["the logical block number: the table was ignored"]},
    ch03.check_free: {
        FreeLeaks: ["blocks back on the free list", "a free that leaks", "refcount 1, expected 0"],
        FreeKeepsLastBlock: ["a free that leaks"],
    },
    ch03.check_truncate: {
        TruncateWithoutRelease: ["refcounts of the dropped blocks", "drops table entries without releasing them"],
        TruncateDropsPartialBlock: ["the partial last block still holds tokens"],
        TruncateRebinds: ["the table list a caller took with table(", "cut the list in place"],
        TruncateSameLengthReturns: ["with room reserved for", "no early return"],
    },
})


# A truncate that cuts the table in place, written as learners write it: slice deletion, pops, a
# slice assignment, clear-and-extend. Each keeps the list object, so each passes where it runs.
TRUNCATES_IN_PLACE = {
    "pop": "-    del table[keep:]\n+    while len(table) > keep:\n+        table.pop()",
    "slice_assignment": "-    del table[keep:]\n+    table[:] = table[:keep]",
    "clear_and_extend": "-    del table[keep:]\n+    kept = table[:keep]\n+    table.clear()\n+    table.extend(kept)",
}


def test_truncate_list_identity_is_the_notebooks_check_and_never_the_graders_word(monkeypatch):
    """The classic bug (truncate into a new list) fails the check where the cache is the notebook's own,
    with its hint. make grade holds the learner's class in another process, whose tables the judge
    reads as data (copies): which list object holds a table cannot be seen there, so the grader
    neither asks the host about it nor scores it. The rebinding truncate passes there; every other
    part of the check still runs on the host's answers (an early return still fails), and the host is
    asked to run none of the checks' helpers but the one that builds the cache, so a host that would
    lie about the list has no say."""
    import engine.course.grading.sealed.host as host
    fails_with(ch03.check_truncate, TruncateRebinds, ["the table list a caller took with table(",
                                                      "cut the list in place"])
    asked, named = [], host.named

    def lying(module: str, qualname: str):
        asked.append(qualname)
        return named(module, qualname) if qualname == "_built" else (lambda *a, **k: [0])
    monkeypatch.setattr(host, "named", lying)
    in_place = {name: mutant(PagedKVCache, "truncate", diff, name=f"Truncate_{name}")
                for name, diff in TRUNCATES_IN_PLACE.items()}
    with hosted(right=PagedKVCache, rebinds=TruncateRebinds, early=TruncateSameLengthReturns,
                **in_place) as remote:
        passes(ch03.check_truncate, remote["right"])
        passes(ch03.check_truncate, remote["rebinds"])
        fails_with(ch03.check_truncate, remote["early"], ["no early return"])
        for name in in_place:
            passes(ch03.check_truncate, remote[name])
    assert set(asked) == {"_built"}
    for cls in in_place.values():
        passes(ch03.check_truncate, cls)


@pytest.mark.parametrize("check, bug, words", BUGS, ids=by_name)
def test_bug_is_caught_with_its_own_hint(check, bug, words):
    fails_with(check, bug, words)


@pytest.mark.parametrize("check, bug, words", BUGS, ids=by_name)
def test_bug_leaves_the_other_method_checks_passing(check, bug, words):
    # A bug in write, gather, free or truncate costs only its own exercise's checks. (In the notebook
    # each exercise cell subclasses the engine's cache, so the later exercises' checks run on the
    # engine's reserve and set_batch; a class with a bug there fails them all, as it should.)
    exercise = next(group for group in EXERCISES if check in group)
    if exercise is EXERCISES[0]:
        return
    for other in METHOD_CHECKS:
        if other not in exercise:
            passes(other, bug)


@pytest.mark.parametrize("bug, words", [
    (WriteIgnoresTable, ["from-scratch run", "check_write fails on your class too", "table ignored"]),
    (WritesPadding, ["from-scratch run", "padding was written"]),
    (KvLensOneShort, ["one short"]),
    (CommitsEveryLayer, ["committed per layer"]),
    (GatherIgnoresTable, ["from-scratch run", "the table was ignored"]),
    (FreeLeaks, ["a free that leaks"]),
    (TruncateWithoutRelease, ["drops table entries without releasing them"]),
], ids=by_name)
def test_decisive_check_names_the_bug(bug, words):
    fails_with(ch03.check_cache_matches_scratch, bug, words)


def test_utilization_demo_reproduces_the_seed():
    from engine.seeded import request_lengths
    lengths = request_lengths(32, 20, 500, seed=0)
    paged = ch03.utilization(PagedKVCache, lengths, 16)
    assert paged["tokens_stored"] == sum(lengths)
    assert 0.95 < paged["utilization"] < 1.0


# ---- honest styles: each check drives the learner's own classes, put together as one -------------------

def counted(method):
    """A learner's own decorator: counts the calls of a method on the instance."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        self.__dict__["calls"] = self.__dict__.get("calls", 0) + 1
        return method(self, *args, **kwargs)
    return wrapper


class ReserveBySuper(PagedKVCache):
    """Exercise 3.1 with zero-argument super(), a property and a helper method of its own."""

    @property
    def free_blocks(self):
        return self.allocator.num_free

    def _more_blocks(self, table, seq, n):
        return max(0, blocks_needed(self.lengths[seq] + n, self.block_size) - len(table))

    def reserve(self, seq, n):
        table = super().table(seq)
        copies = self.shared_writes(seq, n)
        new = self._more_blocks(table, seq, n)
        if new + len(copies) > self.free_blocks:
            raise OutOfBlocks(new + len(copies), self.free_blocks, f"sequence {seq}")
        for index in copies:
            self.copy_on_write(seq, index)
        table.extend(self.allocator.allocate(new))


class StorageChained(ReserveBySuper):
    """Exercise 3.2 written on the learner's own Exercise 3.1 class (class PagedKVCache(PagedKVCache))."""

    @counted
    def write(self, layer, k, v, positions):
        return super().write(layer, k, v, positions)


class FreeChained(StorageChained):
    """Exercise 3.3 chained on the learner's Exercise 3.2 class."""

    def free(self, seq):
        for block in super().table(seq):
            self.allocator.release(block)
        del self.tables[seq], self.lengths[seq]


class StorageOwn(PagedKVCache):
    """Exercise 3.2 on the engine's class, as the cell starts (the reserve comes from YourReserve)."""


class FreeOwn(PagedKVCache):
    """Exercise 3.3 on the engine's class, with zero-argument super()."""

    def free(self, seq):
        for block in super().table(seq):
            self.allocator.release(block)
        del self.tables[seq], self.lengths[seq]


def test_each_exercise_is_checked_on_the_learners_classes_together():
    passes(ch03.check_write, StorageOwn, ReserveBySuper)
    passes(ch03.check_gather, StorageChained, ReserveBySuper)          # chained: the earlier class is inside
    passes(ch03.check_free, FreeChained, StorageChained, ReserveBySuper)
    passes(ch03.check_truncate, FreeOwn, StorageOwn, ReserveBySuper)
    passes(ch03.check_cache_matches_scratch, FreeOwn, StorageOwn, ReserveBySuper)
    assert "every logit matches" in passes(ch03.check_cache_matches_scratch, FreeChained, StorageChained,
                                           ReserveBySuper)
    assert ch03.your_cache(FreeChained, StorageChained, ReserveBySuper) is FreeChained
    made = ch03.your_cache(FreeOwn, StorageOwn, ReserveBySuper)
    assert made.__mro__[1:4] == (FreeOwn, StorageOwn, ReserveBySuper)   # the later exercise's methods win


def test_an_earlier_exercise_that_fails_is_named_where_it_costs_this_one():
    message = fails_with(lambda cls: ch03.check_write(cls, SetBatchSortsRows), StorageOwn,
                         ["runs your reserve and set_batch from YourReserve (Exercise 3.1) too",
                          "that exercise's own check fails on it: set_batch([2, 0, 1, 3]): self.batch",
                          "Fix Exercise 3.1 first"])
    assert message.startswith("check_write: ")


class Mixin:
    """A learner's own helper class, put in two different orders by two cells."""


class ReserveMixinFirst(Mixin, PagedKVCache):
    pass


class FreeMixinLast(PagedKVCache, Mixin):
    pass


def test_classes_without_a_method_order_are_named_in_the_notebooks_terms():
    message = fails_with(lambda cls: ch03.check_truncate(cls, StorageOwn, ReserveMixinFirst), FreeMixinLast,
                         ["PagedKVCache (Exercise 3.3)",
                          "YourReserve (Exercise 3.1)", "cannot be put together into one class",
                          "no method order", "class X(X) chains them"])
    assert "YourStorage (Exercise 3.2)" in message


def test_the_learners_classes_are_put_together_where_they_live():
    with hosted(free=FreeOwn, storage=StorageOwn, reserve=ReserveBySuper) as remote:
        passes(ch03.check_free, remote["free"], remote["storage"], remote["reserve"])
        passes(ch03.check_write, remote["storage"], remote["reserve"])


@pytest.mark.slow
def test_honest_styles_score_full_marks_through_the_grader():
    """Through make grade's sealed grader (the learner's classes in the host, on its stubbed engine): reserve
    reading its table with zero-argument super(), and the 3.2 and 3.3 cells chained on the class before
    (class PagedKVCache(PagedKVCache)); every exercise keeps its points."""
    from fixtures.course_support import REPO, assert_full_marks, expanded, with_cell_edited
    chapter = REPO / "solutions" / "ch03_paged_cache.py"
    notebook = with_cell_edited(expanded(chapter), "ch03_reserve", lambda source: source.replace(
        "        table = self.table(seq)\n        new", "        table = super().table(seq)\n        new"))
    for cell in ("ch03_write", "ch03_free"):
        notebook = with_cell_edited(notebook, cell, lambda source: source.replace(
            "class PagedKVCache(engine.cache.paged.PagedKVCache):", "class PagedKVCache(PagedKVCache):"))
    assert_full_marks(notebook, chapter, "ch03")


def test_the_milestone_writes_the_divergence_out_as_text():
    """A cache that writes without its table writes a different sentence than the recompute: the
    milestone's message shows both, and the token where they part."""
    text = ch03.continuations.side_by_side(ch03.written_out(ch03.your_cache(WriteIgnoresTable), 4))
    assert text.parted_at is not None
    message = fails_with(ch03.check_cache_matches_scratch, WriteIgnoresTable,
                         ["The trained tiny model writes it out: from-scratch: ", ", yours: ",
                          f", token {text.parted_at}"])
    assert str(text) in message


def test_the_engine_writes_the_recompute_s_sentence():
    text = ch03.continuations.side_by_side(ch03.written_out(ch03.your_cache(PagedKVCache), 4))
    assert text.parted_at is None and str(text).startswith("from-scratch and yours both write 'The block table")
