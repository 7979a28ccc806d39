"""The chapter-5 checks pass on the engine's PrefixCache, say "not implemented yet" on stubs, and fail
on each classic prefix-cache bug with a hint that names that bug."""
import sys

import pytest

from engine.cache.prefix import PrefixCache
from engine.cache.slots import blocks_needed
from engine.checks import ch05
from fixtures.check_support import by_name, cases, fails, fails_with, mutant, passes, stub

pytestmark = pytest.mark.usefixtures("one_thread")     # the tiny model is fastest on one thread

PIECE_CHECKS = [ch05.check_chain, ch05.check_matches, ch05.check_attach, ch05.check_remember,
                ch05.check_evict]


def in_engine(keys=PrefixCache, attach=PrefixCache, remember=PrefixCache, evict=PrefixCache):
    """The decisive check with the engine's pieces except those given."""
    ch05.check_prefix_cache_in_engine(keys, attach, remember, evict)


@pytest.mark.parametrize("check", PIECE_CHECKS, ids=by_name)
def test_reference_passes(check):
    passes(check, PrefixCache)


def test_reference_passes_in_the_engine():
    assert "160 of 832 tokens prefilled and 14 blocks" in passes(in_engine)


def test_the_demo_through_the_engine_pieces():
    demo = ch05.prefix_demo(PrefixCache)
    assert (demo["prompt_tokens"], demo["tokens_prefilled"], demo["blocks_in_use"],
            demo["blocks_without_sharing"]) == (832, 160, 14, 56)


def test_review_answers():
    passes(ch05.check_review_prefill, 552)
    passes(ch05.check_review_order, "c")
    assert "not answered yet" in fails(ch05.check_review_prefill, None)
    assert "without a prefix cache" in fails(ch05.check_review_prefill, 20 * 210)
    assert "whole system prompt as cached" in fails(ch05.check_review_prefill, 210 + 19 * 10)
    assert "released most recently" in fails(ch05.check_review_order, "d")


# ---- stubs -------------------------------------------------------------------------------------------

StubKeys = stub(PrefixCache, "chain", "matches", name="StubKeys")
StubAttach = stub(PrefixCache, "attach", "detach", name="StubAttach")
StubRemember = stub(PrefixCache, "remember", name="StubRemember")
StubEvict = stub(PrefixCache, "evictable", "evict", "forget", name="StubEvict")


@pytest.mark.parametrize("check, unwritten", [
    (ch05.check_chain, StubKeys), (ch05.check_matches, StubKeys), (ch05.check_attach, StubAttach),
    (ch05.check_remember, StubRemember), (ch05.check_evict, StubEvict),
], ids=by_name)
def test_stub_is_not_implemented(check, unwritten):
    fails_with(check, unwritten, ["not implemented yet", unwritten.__name__])


def test_stubs_in_the_engine_are_not_implemented():
    fails_with(lambda _: in_engine(StubKeys, StubAttach, StubRemember, StubEvict), None, ["not implemented yet"])


# ---- planted bugs: keys (a mutant is the engine's method with the edit shown as a diff) ---------------

class OwnTokensLoud(PrefixCache):
    """Each block keyed by its own tokens, and no parent recorded: nothing tells histories apart."""

    def chain(self, tokens, salt=None, extra_keys=()):
        for _, _, block_tokens, extra in super().chain(tokens, salt, extra_keys):
            yield self.hash_fn(None, block_tokens, extra), None, block_tokens, extra


# Each block keyed by its own tokens; the parent is still recorded and checked on lookup.
OwnTokensQuiet = mutant(PrefixCache, "chain", """
-        key = self.hash_fn(parent, block_tokens, extra)
+        key = self.hash_fn(None, block_tokens, extra)
""", name="OwnTokensQuiet")
SaltIgnored = mutant(PrefixCache, "chain", """
-        extra = ((salt,) if start == 0 else ()) + tuple(extra_keys)
+        extra = tuple(extra_keys)
""", name="SaltIgnored")
# The salt goes into every block's extra, not only the first's.
SaltInEveryBlock = mutant(PrefixCache, "chain", """
-        extra = ((salt,) if start == 0 else ()) + tuple(extra_keys)
+        extra = (salt,) + tuple(extra_keys)
""", name="SaltInEveryBlock")
# Walks every block, the partial last one too.
PartialBlockKeyed = mutant(PrefixCache, "chain", """
-    for start in range(0, len(tokens) - size + 1, size):
+    for start in range(0, len(tokens), size):
""", name="PartialBlockKeyed")


class MatchesTrustsTheKey(PrefixCache):
    @staticmethod
    def matches(entry, parent, tokens, extra):
        return True


MatchesIgnoresExtra = mutant(PrefixCache, "matches", """
-    return same and entry.extra == extra
+    return same
""", name="MatchesIgnoresExtra")


# ---- planted bugs: attach and detach -------------------------------------------------------------------

# Reuses every cached block, even when that is the whole prompt.
NothingLeftToPrefill = mutant(PrefixCache, "attach", """
-    reused = min(len(blocks) * self.cache.block_size, len(prompt) - 1)
+    reused = len(blocks) * self.cache.block_size
""", name="NothingLeftToPrefill")
# Puts cached blocks in the table without taking a reference on them.
HitWithoutReference = mutant(PrefixCache, "attach", """
-    self.cache.share_blocks(seq, blocks)
+    self.cache.tables[seq].extend(blocks)
""", name="HitWithoutReference")


class EmptyPromptAccepted(PrefixCache):
    """Creates the sequence for an empty prompt instead of raising."""

    def attach(self, seq, prompt, salt=None, extra_keys=()):
        if not prompt:
            self.cache.create(seq)
            return 0
        return super().attach(seq, prompt, salt, extra_keys)


class AlwaysHoldsOneBack(PrefixCache):
    """Leaves one token to prefill even when the cached blocks do not cover the whole prompt."""

    def attach(self, seq, prompt, salt=None, extra_keys=()):
        reused = super().attach(seq, prompt, salt, extra_keys)
        if reused and reused % self.cache.block_size == 0:
            self.cache.set_length(seq, reused - 1)
            self.tokens_saved -= 1
            return reused - 1
        return reused


# Caps the tokens it returns, but sets the length to every cached token: nothing left to prefill.
AttachLengthUncapped = mutant(PrefixCache, "attach", """
-    self.cache.set_length(seq, reused)
+    self.cache.set_length(seq, len(blocks) * self.cache.block_size)
""", name="AttachLengthUncapped")


# Takes back a hit on every detach, also after an attach that reused nothing.
DetachTakesAHitBack = mutant(PrefixCache, "detach", """
-    self.hits -= reused > 0
+    self.hits -= 1
""", name="DetachTakesAHitBack")


class DetachKeepsTheCount(PrefixCache):
    """Undoes the admission but not the hit it counted (the engine's own bug, once)."""

    def detach(self, seq):
        self.cache.free(seq)


# ---- planted bugs: remember -----------------------------------------------------------------------------

class RemembersPartialBlock(PrefixCache):
    """Publishes every block of the computed tokens, the partial last one too."""

    def remember(self, seq, tokens, salt=None, extra_keys=()):
        size, parent, published = self.cache.block_size, None, 0
        computed = tokens[:self.cache.length(seq)]
        for index in range(blocks_needed(len(computed), size)):
            block_tokens = tuple(computed[index * size:(index + 1) * size])
            extra = ((salt,) if index == 0 else ()) + tuple(extra_keys)
            key = self.hash_fn(parent, block_tokens, extra)
            if key not in self.entries and self.cache.tables[seq][index] not in self.block_keys:
                self.publish(self.cache.tables[seq][index], key, parent, block_tokens, extra)
                published += 1
            parent = key
        return published


# Chains over the prompt as far as the table reaches, not only the tokens whose K/V is in the cache.
RemembersUncomputed = mutant(PrefixCache, "remember", """
-    computed = tokens[:self.cache.length(seq)]
+    computed = tokens[:len(table) * self.cache.block_size]
""", name="RemembersUncomputed")
# Chains over the whole prompt: after a first prefill chunk the table has fewer blocks than that.
RemembersAllTokens = mutant(PrefixCache, "remember", """
-    computed = tokens[:self.cache.length(seq)]
+    computed = tokens
""", name="RemembersAllTokens")
# Publishes a block under a new key although it is already published under another.
RepublishesABlock = mutant(PrefixCache, "remember", """
-            if table[index] in self.block_keys:
-                break
""", name="RepublishesABlock")
# Replaces whatever entry holds a key, a colliding one included.
RememberOverwrites = mutant(PrefixCache, "remember", """
-        if entry is None:
+        if entry is None or not self.matches(entry, parent, block_tokens, extra):
""", name="RememberOverwrites")


# ---- planted bugs: eviction ----------------------------------------------------------------------------

EvictsNewestFirst = mutant(PrefixCache, "evict", """
-        _, entry = self.lru.popitem(last=False)
+        _, entry = self.lru.popitem()
""", name="EvictsNewestFirst")
EvictsOnePerCall = mutant(PrefixCache, "evict", """
-    while self.cache.allocator.num_free < blocks_wanted and self.lru:
+    if self.cache.allocator.num_free < blocks_wanted and self.lru:
""", name="EvictsOnePerCall")
EvictsBlocksInUse = mutant(PrefixCache, "evictable", """
-    return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 1
+    return entry.children == 0
""", name="EvictsBlocksInUse")
EvictsParentsFirst = mutant(PrefixCache, "evictable", """
-    return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 1
+    return self.cache.allocator.refcount(entry.block) == 1
""", name="EvictsParentsFirst")
# Forgets the cache's own reference: waits for refcount 0, which never comes.
EvictableAtRefcountZero = mutant(PrefixCache, "evictable", """
-    return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 1
+    return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 0
""", name="EvictableAtRefcountZero")
# The parent keeps its child count: a parent whose last child was evicted never becomes evictable.
ForgetLeavesParentStuck = mutant(PrefixCache, "forget", """
-        parent.children -= 1
""", name="ForgetLeavesParentStuck")
ForgetDoesNotRelease = mutant(PrefixCache, "forget", """
-    self.cache.allocator.release(entry.block)
""", name="ForgetDoesNotRelease")
# A parent left childless joins the back of the line instead of the front.
ParentToTheBack = mutant(PrefixCache, "forget", """
-        self.refresh(parent, front=True)
+        self.refresh(parent)
""", name="ParentToTheBack")
# Removes the entry from the line although evict has popped it already: KeyError.
ForgetDeletesFromTheLine = mutant(PrefixCache, "forget", """
-    self.lru.pop(entry.key, None)
+    del self.lru[entry.key]
""", name="ForgetDeletesFromTheLine")
ForgetPopsWithoutDefault = mutant(PrefixCache, "forget", """
-    self.lru.pop(entry.key, None)
+    self.lru.pop(entry.key)
""", name="ForgetPopsWithoutDefault")
# Takes entry.parent, a key, for the parent entry itself.
ForgetParentAsEntry = mutant(PrefixCache, "forget", """
-        parent = self.entries[entry.parent]
+        parent = entry.parent
""", name="ForgetParentAsEntry")
ForgetKeepsTheOldKey = mutant(PrefixCache, "forget", """
-    del self.entries[entry.key], self.block_keys[entry.block]
+    del self.entries[entry.key]
""", name="ForgetKeepsTheOldKey")


@pytest.mark.parametrize("check, bug, words", cases({
    ch05.check_chain: {
        OwnTokensLoud: ["parent key of block 1", "own tokens", "different histories share"],
        OwnTokensQuiet: ["key of block 1", "quiet form", "one of them stops hitting"],
        SaltIgnored: ["two salts", "the salt is ignored"],
        SaltInEveryBlock: ["the extra of each block", "first block's extra only"],
        PartialBlockKeyed: ["tuples yielded", "expected 2, got 3", "partial block got a key"],
    },
    ch05.check_matches: {
        MatchesTrustsTheKey: ["against parent 12", "parent key must match"],
        MatchesIgnoresExtra: ["extra ('u',)", "the salt is ignored"],
    },
    ch05.check_attach: {
        NothingLeftToPrefill: ["both cached", "expected 7, got 8", "nothing to prefill"],
        HitWithoutReference: ["refcounts of the cached blocks", "expected [4, 3], got [2, 2]", "adds an owner"],
        AlwaysHoldsOneBack: ["expected 8, got 7", "one token short"],
        DetachTakesAHitBack: ["reused nothing", "a hit only if that attach reused"],
        EmptyPromptAccepted: ["attach(9, [])", "ValueError to be raised"],
        DetachKeepsTheCount: ["that detach undid", "admission that was then undone"],
        AttachLengthUncapped: ["cache.length(4)", "expected 7, got 8", "set_length(seq, reused)",
                               "len(prompt) - 1"],
    },
    ch05.check_remember: {
        RemembersPartialBlock: ["partial third block", "partial block got a key"],
        RemembersUncomputed: ["first prefill chunk", "expected 1, got 2", "only blocks whose K/V has been computed"],
        RepublishesABlock: ["under another salt", "expected 0, got 2", "one block, one entry"],
        RememberOverwrites: ["every block collides", "never overwrite"],
        RemembersAllTokens: ["first prefill chunk", "crashed with IndexError", "table only 2",
                             "tokens[:self.cache.length(seq)]"],
    },
    ch05.check_evict: {
        EvictsNewestFirst: ["evicted one by one", "not least recently used first"],
        EvictsBlocksInUse: ["still hold its block", "a block in use was evicted"],
        EvictsParentsFirst: ["evictable(e2)", "parent was evicted before its leaf"],
        ForgetLeavesParentStuck: ["expected [f2, e3, e2, e1], got [f2, e3]", "parent whose last child was evicted"],
        EvictsOnePerCall: ["expected 3, got 1", "a while loop"],
        EvictableAtRefcountZero: ["evictable(f2)", "refcount 1, not 0"],
        ForgetDoesNotRelease: ["blocks freed in the pool", "release the cache's own reference"],
        ParentToTheBack: ["expected [g2, g1, h1], got [g2, h1, g1]", "to the FRONT of the line"],
        ForgetKeepsTheOldKey: ["still has entries", "block_keys"],
        ForgetDeletesFromTheLine: ["KeyError", "already taken out of self.lru", "self.lru.pop(entry.key, None)"],
        ForgetPopsWithoutDefault: ["KeyError", "taken out of self.lru twice"],
        ForgetParentAsEntry: ["has no attribute 'children'", "self.entries[entry.parent]"],
    },
}), ids=by_name)
def test_bug_is_caught(check, bug, words):
    fails_with(check, bug, words)


class ForgetReleasesFirst(PrefixCache):
    """Releases the block first, then removes the traces: nothing runs in between, so nothing can tell."""

    def forget(self, entry):
        self.cache.allocator.release(entry.block)
        self.lru.pop(entry.key, None)
        del self.entries[entry.key], self.block_keys[entry.block]
        if entry.parent is not None:
            parent = self.entries[entry.parent]
            parent.children -= 1
            self.refresh(parent, front=True)


def test_the_order_of_release_and_traces_in_forget_is_free():
    """Ex 5.4 asks for no trace left and the reference released, not an order nothing can observe."""
    passes(ch05.check_evict, ForgetReleasesFirst)


def test_a_key_of_the_blocks_own_tokens_is_caught_in_the_engine():
    fails_with(lambda _: in_engine(keys=OwnTokensLoud), None, ["differ from a from-scratch run",
                                                                "different histories share"])


@pytest.mark.parametrize("pieces, words", [
    (dict(attach=NothingLeftToPrefill), ["check_attach fails on your pieces too", "expected 7, got 8",
                                         "nothing to prefill", "len(prompt) - 1"]),
    (dict(attach=AttachLengthUncapped), ["check_attach fails on your pieces too", "cache.length(4)",
                                         "nothing to prefill"]),
    (dict(evict=ForgetDeletesFromTheLine), ["check_evict fails on your pieces too", "self.lru twice"]),
], ids=lambda value: next(iter(value.values())).__name__ if isinstance(value, dict) else "")
def test_a_piece_that_breaks_the_engine_is_named_by_the_milestone(pieces, words):
    """The milestone names the piece check that explains a crash, not the engine function that crashed."""
    message = fails_with(lambda _: in_engine(**pieces), None, words)
    assert "PagedKVCache.create" not in message


# ---- honest styles: each piece's check drives the learner's pieces put together as one ----------------

class KeysOwn(PrefixCache):
    """Exercise 5.1 as its cell leaves it (the engine's chain and matches stand in for the learner's)."""


class AttachBySuper(PrefixCache):
    """Exercise 5.2 reading its entries through zero-argument super() and a property of its own."""

    @property
    def lookups(self):
        return self.queries

    def attach(self, seq, prompt, salt=None, extra_keys=()):
        reused = super().attach(seq, prompt, salt, extra_keys)
        assert self.lookups == self.queries
        return reused


class AttachOnKeys(AttachBySuper, KeysOwn):
    """The cell's `class Attach(PrefixCache, Keys)`."""


class RememberChained(AttachOnKeys):
    """Exercise 5.3 chained on the learner's Attach (class PrefixCache(Attach)), publishing through super()."""

    def publish(self, block, key, parent, tokens, extra):
        return super().publish(block, key, parent, tokens, extra)


class EvictBySuper(PrefixCache):
    """Exercise 5.4 with zero-argument super() in forget."""

    def forget(self, entry):
        super().forget(entry)


def test_each_piece_is_checked_on_the_learners_pieces_together():
    passes(ch05.check_attach, AttachOnKeys, KeysOwn)
    passes(ch05.check_remember, RememberChained, AttachOnKeys, KeysOwn)
    passes(ch05.check_evict, EvictBySuper, RememberChained, AttachOnKeys, KeysOwn)
    assert "160 of 832 tokens prefilled" in passes(in_engine, KeysOwn, AttachOnKeys, RememberChained, EvictBySuper)
    made = ch05.your_pieces(EvictBySuper, RememberChained, AttachOnKeys, KeysOwn)
    assert made.__mro__[1:3] == (EvictBySuper, RememberChained)     # AttachOnKeys, KeysOwn come with Remember


class Mixin:
    """A learner's own helper class, put in two different orders by two cells."""


class EvictMixinFirst(Mixin, PrefixCache):
    pass


class RememberMixinLast(PrefixCache, Mixin):
    pass


def test_pieces_without_a_method_order_are_named_in_the_notebooks_terms():
    fails_with(lambda cls: ch05.check_evict(cls, RememberMixinLast), EvictMixinFirst,
               ["Evict (Exercise 5.4), Remember (Exercise 5.3) cannot be put together", "no method order"])


# Exercise 5.2 with the sequence never created: every later piece's check that attaches crashes.
AttachNeverCreates = mutant(PrefixCache, "attach", """
-    self.cache.create(seq)
+    pass
""", name="AttachNeverCreates")


def test_an_earlier_piece_that_fails_is_named_where_it_costs_this_one():
    fails_with(lambda cls: ch05.check_remember(cls, AttachNeverCreates, KeysOwn), RememberChained,
               ["check_remember: the code under test crashed with", "This check runs your attach and detach from "
                "Attach (Exercise 5.2) too, and that exercise's own check fails on it",
                "Fix Exercise 5.2 first: until it passes, this exercise's points are lost with it"])


# ---- the milestone writes text: the trained model through the learner's prefix cache -------------------

def test_the_milestone_writes_the_divergence_out_as_text():
    """Keys of a block's own tokens share K/V computed after another history: the milestone's message shows
    the trained model's sentence from scratch and through the learner's pieces, and the token where they part."""
    text = ch05.continuations.side_by_side(ch05.served_text(ch05.combine(OwnTokensLoud, PrefixCache, PrefixCache,
                                                                         PrefixCache)))
    assert text.parted_at is not None and text.scratch != text.cached
    message = fails_with(lambda _: in_engine(keys=OwnTokensLoud), None,
                         ["different histories share", "The trained tiny model writes it out: from-scratch: ",
                          ", yours: ", f", token {text.parted_at}"])
    assert str(text) in message


def test_the_engine_s_prefix_cache_writes_the_recompute_s_sentence():
    text = ch05.continuations.side_by_side(ch05.served_text(PrefixCache))
    assert text.parted_at is None and str(text).startswith("from-scratch and yours both write 'The block table")


def test_a_passing_milestone_writes_no_text(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("continuations computed for a passing check")
    monkeypatch.setattr(ch05.continuations, "shown", never)
    passes(in_engine)


# ---- a later piece's super() where an earlier piece's check serves through it (the grader's host) --------

class EditionEngine(PrefixCache):
    """The engine as the grader's host (a student edition) has it: Exercise 5.4's bodies run the notebook's
    definitions (engine/course/authoring/edition.py `yours`), on whatever instance the check hands them."""

    def evictable(self, entry):
        return sys.modules["__main__"].Evict.evictable(self, entry)

    def evict(self, blocks_wanted):
        return sys.modules["__main__"].Evict.evict(self, blocks_wanted)

    def forget(self, entry):
        return sys.modules["__main__"].Evict.forget(self, entry)


class KeysOnEdition(EditionEngine):
    """Exercise 5.1's cell (the engine's chain and matches stand in)."""


class AttachOnEdition(EditionEngine):
    """Exercise 5.2's cell (the engine's attach and detach stand in)."""


class EvictHonest(EditionEngine):
    """Exercise 5.4 written whole, its forget refreshing the parent through zero-argument super()."""

    def evictable(self, entry):
        return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 1

    def evict(self, blocks_wanted):
        freed = 0
        while self.cache.allocator.num_free < blocks_wanted and self.lru:
            _, entry = self.lru.popitem(last=False)
            self.forget(entry)
            freed += 1
        return freed

    def forget(self, entry):
        self.lru.pop(entry.key, None)
        del self.entries[entry.key], self.block_keys[entry.block]
        if entry.parent is not None:
            parent = self.entries[entry.parent]
            parent.children -= 1
            super().refresh(parent, front=True)
        self.cache.allocator.release(entry.block)


def test_a_later_piece_s_super_runs_on_its_own_class_in_an_earlier_piece_s_check(monkeypatch):
    """Exercise 5.2's check evicts through the scheduler, so it runs Exercise 5.4's forget. The notebook's
    written later pieces join the class the check drives, so that forget runs on an instance of its own
    class and its super() works; without them (the notebook's Evict run on another class) it crashes."""
    monkeypatch.setattr(sys.modules["__main__"], "Evict", EvictHonest, raising=False)
    monkeypatch.setattr(ch05, "written_later", lambda anchor, wanted: (None,) * len(wanted))
    assert "super(type, obj)" in fails(lambda cls: ch05.check_attach(cls, KeysOnEdition), AttachOnEdition)
    monkeypatch.undo()
    monkeypatch.setattr(sys.modules["__main__"], "Evict", EvictHonest, raising=False)
    passes(ch05.check_attach, AttachOnEdition, KeysOnEdition)
    passes(ch05.check_chain, KeysOnEdition)
    made = ch05.your_pieces(AttachOnEdition, KeysOnEdition, latest="Attach")
    assert made.__mro__[1:4] == (AttachOnEdition, KeysOnEdition, EvictHonest)


def test_a_later_piece_left_as_the_release_has_it_joins_nothing(monkeypatch):
    """The release's `raise NotImplementedError()` is not written: the engine's methods stay (in a student
    edition, its stubs: the part is 'not checked yet')."""
    class EvictUnwritten(PrefixCache):
        def evictable(self, entry):
            raise NotImplementedError()

        def evict(self, blocks_wanted):
            raise NotImplementedError()

        def forget(self, entry):
            raise NotImplementedError()
    monkeypatch.setattr(sys.modules["__main__"], "Evict", EvictUnwritten, raising=False)
    assert ch05.your_pieces(AttachOnKeys, KeysOwn, latest="Attach") is AttachOnKeys
    passes(ch05.check_attach, AttachOnKeys, KeysOwn)


@pytest.mark.slow
def test_honest_styles_score_full_marks_through_the_grader():
    """Through make grade's sealed grader (the pieces in the host, on its stubbed engine, where Exercise 5.4's
    bodies run the notebook's definitions): forget refreshing the parent through zero-argument super() keeps
    Exercise 5.2's points (its check evicts through the scheduler), and every other exercise's."""
    from fixtures.course_support import REPO, assert_full_marks, expanded, with_cell_edited
    chapter = REPO / "solutions" / "ch05_prefix_caching.py"
    notebook = with_cell_edited(expanded(chapter), "ch05_evict", lambda source: source.replace(
        "            self.refresh(parent, front=True)", "            super().refresh(parent, front=True)"))
    assert_full_marks(notebook, chapter, "ch05")


# What a learner's method can raise to claim "a later exercise is not written yet" (the grader's host
# reports it as the student edition's error; the judge checks only that the qualname is unwritten).
CLAIMS_EVICTABLE = ('        error = NotImplementedError("PrefixCache.evictable is yours to write later")\n'
                    '        error.qualname = "PrefixCache.evictable"\n'
                    '        raise error\n')


@pytest.mark.slow
def test_a_not_written_yet_claimed_by_the_learners_own_code_earns_nothing():
    """From the release: attach does only what its unserved parts check and remember implements nothing;
    both raise "evictable is not written yet" (evictable stays the release's stub). The parts the points rest
    on are skipped on a test's first run only: on its last run (after every cell) they fail the test."""
    import nbformat
    from engine.course.grading.grade import grade_notebook
    from fixtures.course_support import BUILD, REPO, with_solution, write_notebook
    chapter = REPO / "solutions" / "ch05_prefix_caching.py"
    release = nbformat.read(REPO / "notebooks" / f"{chapter.stem}.ipynb", as_version=4)
    attach = ("import engine.cache.prefix\n\n\nclass PrefixCache(engine.cache.prefix.PrefixCache):\n"
              "    def attach(self, seq, prompt, salt=None, extra_keys=()):\n"
              "        if not prompt:\n            raise ValueError('an empty prompt')\n"
              "        if seq == 0 and 0 not in self.cache.tables:\n"
              "            self.cache.create(seq)\n            return 0\n" + CLAIMS_EVICTABLE +
              "\n    def detach(self, seq):\n" + CLAIMS_EVICTABLE + "\n\nclass Attach(PrefixCache, Keys):\n    pass\n")
    remember = ("import engine.cache.prefix\n\n\nclass PrefixCache(engine.cache.prefix.PrefixCache):\n"
                "    def remember(self, seq, tokens, salt=None, extra_keys=()):\n" + CLAIMS_EVICTABLE +
                "\n\nclass Remember(PrefixCache, Keys):\n    pass\n")
    notebook = with_solution(with_solution(release, "ch05_attach", attach), "ch05_remember", remember)
    grade = grade_notebook(write_notebook(notebook, BUILD / "claims" / "evictable", chapter.stem), chapter, 60)
    earned = {e.grade_id: e.earned for e in grade.exercises if e.kind == "test"}
    assert earned["ch05_test_attach"] == 0 and earned["ch05_test_remember"] == 0, earned
    [message] = [e.message for e in grade.exercises if e.grade_id == "ch05_test_remember"]
    assert "runs PrefixCache.evictable, which this notebook does not write" in message, message
