"""The chapter-5 checks pass on the engine's PrefixCache, say "not implemented yet" on stubs, and fail
on each classic prefix-cache bug with a hint that names that bug."""
import pytest

from engine.cache.prefix import PrefixCache
from engine.cache.slots import blocks_needed
from engine.checks import ch05
from fixtures.check_support import fails

pytestmark = pytest.mark.usefixtures("one_thread")     # the tiny model is fastest on one thread

PIECE_CHECKS = [ch05.check_chain, ch05.check_matches, ch05.check_attach, ch05.check_remember,
                ch05.check_evict]


def in_engine(keys=PrefixCache, attach=PrefixCache, remember=PrefixCache, evict=PrefixCache):
    """The decisive check with the engine's pieces except those given."""
    ch05.check_prefix_cache_in_engine(keys, attach, remember, evict)


@pytest.mark.parametrize("check", PIECE_CHECKS, ids=lambda c: c.__name__)
def test_reference_passes(check, capsys):
    check(PrefixCache)
    assert capsys.readouterr().out.startswith("✓")


def test_reference_passes_in_the_engine(capsys):
    in_engine()
    out = capsys.readouterr().out
    assert out.startswith("✓") and "160 of 832 tokens prefilled and 14 blocks" in out


def test_the_demo_through_the_engine_pieces():
    demo = ch05.prefix_demo(PrefixCache)
    assert (demo["prompt_tokens"], demo["tokens_prefilled"], demo["blocks_in_use"],
            demo["blocks_without_sharing"]) == (832, 160, 14, 56)


def test_review_answers(capsys):
    ch05.check_review_prefill(552)
    ch05.check_review_order("c")
    assert capsys.readouterr().out.count("✓") == 2
    assert "not answered yet" in fails(ch05.check_review_prefill, None)
    assert "without a prefix cache" in fails(ch05.check_review_prefill, 20 * 210)
    assert "whole system prompt as cached" in fails(ch05.check_review_prefill, 210 + 19 * 10)
    assert "released most recently" in fails(ch05.check_review_order, "d")


# ---- stubs -------------------------------------------------------------------------------------------

class StubKeys(PrefixCache):
    def chain(self, tokens, salt=None, extra_keys=()):
        raise NotImplementedError()

    @staticmethod
    def matches(entry, parent, tokens, extra):
        raise NotImplementedError()


class StubAttach(PrefixCache):
    def attach(self, seq, prompt, salt=None, extra_keys=()):
        raise NotImplementedError()

    def detach(self, seq):
        raise NotImplementedError()


class StubRemember(PrefixCache):
    def remember(self, seq, tokens, salt=None, extra_keys=()):
        raise NotImplementedError()


class StubEvict(PrefixCache):
    def evictable(self, entry):
        raise NotImplementedError()

    def evict(self, blocks_wanted):
        raise NotImplementedError()

    def forget(self, entry):
        raise NotImplementedError()


@pytest.mark.parametrize("check, stub", [
    (ch05.check_chain, StubKeys), (ch05.check_matches, StubKeys), (ch05.check_attach, StubAttach),
    (ch05.check_remember, StubRemember), (ch05.check_evict, StubEvict),
], ids=lambda x: x.__name__)
def test_stub_is_not_implemented(check, stub):
    message = fails(check, stub)
    assert "not implemented yet" in message and stub.__name__ in message


def test_stubs_in_the_engine_are_not_implemented():
    message = fails(lambda _: in_engine(StubKeys, StubAttach, StubRemember, StubEvict), None)
    assert "not implemented yet" in message


# ---- planted bugs: keys ------------------------------------------------------------------------------

class OwnTokensLoud(PrefixCache):
    """Each block keyed by its own tokens, and no parent recorded: nothing tells histories apart."""

    def chain(self, tokens, salt=None, extra_keys=()):
        for _, _, block_tokens, extra in super().chain(tokens, salt, extra_keys):
            yield self.hash_fn(None, block_tokens, extra), None, block_tokens, extra


class OwnTokensQuiet(PrefixCache):
    """Each block keyed by its own tokens; the parent is still recorded and checked on lookup."""

    def chain(self, tokens, salt=None, extra_keys=()):
        for _, parent, block_tokens, extra in super().chain(tokens, salt, extra_keys):
            yield self.hash_fn(None, block_tokens, extra), parent, block_tokens, extra


class SaltIgnored(PrefixCache):
    def chain(self, tokens, salt=None, extra_keys=()):
        size, parent = self.cache.block_size, None
        for start in range(0, len(tokens) - size + 1, size):
            block_tokens, extra = tuple(tokens[start:start + size]), tuple(extra_keys)
            key = self.hash_fn(parent, block_tokens, extra)
            yield key, parent, block_tokens, extra
            parent = key


class SaltInEveryBlock(PrefixCache):
    """Puts the salt into every block's extra, not only the first's."""

    def chain(self, tokens, salt=None, extra_keys=()):
        size, parent = self.cache.block_size, None
        for start in range(0, len(tokens) - size + 1, size):
            block_tokens, extra = tuple(tokens[start:start + size]), (salt,) + tuple(extra_keys)
            key = self.hash_fn(parent, block_tokens, extra)
            yield key, parent, block_tokens, extra
            parent = key


class PartialBlockKeyed(PrefixCache):
    """Walks every block, the partial last one too."""

    def chain(self, tokens, salt=None, extra_keys=()):
        size, parent = self.cache.block_size, None
        for start in range(0, len(tokens), size):
            block_tokens = tuple(tokens[start:start + size])
            extra = ((salt,) if start == 0 else ()) + tuple(extra_keys)
            key = self.hash_fn(parent, block_tokens, extra)
            yield key, parent, block_tokens, extra
            parent = key


class MatchesTrustsTheKey(PrefixCache):
    @staticmethod
    def matches(entry, parent, tokens, extra):
        return True


class MatchesIgnoresExtra(PrefixCache):
    @staticmethod
    def matches(entry, parent, tokens, extra):
        return entry.parent == parent and entry.tokens == tokens


# ---- planted bugs: attach and detach -------------------------------------------------------------------

def cached_blocks(prefix, prompt, salt, extra_keys):
    """The blocks of prompt's longest cached chain (what a correct attach finds)."""
    blocks = []
    for key, parent, tokens, extra in prefix.chain(prompt, salt, extra_keys):
        entry = prefix.entries.get(key)
        if entry is None or not prefix.matches(entry, parent, tokens, extra):
            break
        blocks.append(entry.block)
    return blocks


def count(prefix, reused):
    prefix.queries += 1
    prefix.hits += reused > 0
    prefix.tokens_saved += reused
    return reused


class NothingLeftToPrefill(PrefixCache):
    """Reuses every cached block, even when that is the whole prompt."""

    def attach(self, seq, prompt, salt=None, extra_keys=()):
        blocks = cached_blocks(self, prompt, salt, extra_keys)
        self.cache.create(seq)
        self.cache.share_blocks(seq, blocks)
        self.cache.set_length(seq, len(blocks) * self.cache.block_size)
        return count(self, len(blocks) * self.cache.block_size)


class HitWithoutReference(PrefixCache):
    """Puts cached blocks in the table without taking a reference on them."""

    def attach(self, seq, prompt, salt=None, extra_keys=()):
        blocks = cached_blocks(self, prompt, salt, extra_keys)
        self.cache.create(seq)
        self.cache.tables[seq].extend(blocks)
        reused = min(len(blocks) * self.cache.block_size, len(prompt) - 1)
        self.cache.set_length(seq, reused)
        return count(self, reused)


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


class DetachTakesAHitBack(PrefixCache):
    """Takes back a hit on every detach, also after an attach that reused nothing."""

    def detach(self, seq):
        reused = self.cache.length(seq)
        self.cache.free(seq)
        self.queries -= 1
        self.hits -= 1
        self.tokens_saved -= reused


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


class RemembersUncomputed(PrefixCache):
    """Chains over the whole prompt, not only the tokens whose K/V is in the cache."""

    def remember(self, seq, tokens, salt=None, extra_keys=()):
        table, published = self.cache.tables[seq], 0
        for index, (key, parent, block_tokens, extra) in enumerate(self.chain(tokens, salt, extra_keys)):
            if index >= len(table):
                break
            if key not in self.entries and table[index] not in self.block_keys:
                self.publish(table[index], key, parent, block_tokens, extra)
                published += 1
        return published


class RepublishesABlock(PrefixCache):
    """Publishes a block under a new key although it is already published under another."""

    def remember(self, seq, tokens, salt=None, extra_keys=()):
        table, published = self.cache.tables[seq], 0
        for index, (key, parent, block_tokens, extra) in enumerate(
                self.chain(tokens[:self.cache.length(seq)], salt, extra_keys)):
            entry = self.entries.get(key)
            if entry is None:
                self.publish(table[index], key, parent, block_tokens, extra)
                published += 1
            elif not self.matches(entry, parent, block_tokens, extra):
                break
        return published


class RememberOverwrites(PrefixCache):
    """Replaces whatever entry holds a key, a colliding one included."""

    def remember(self, seq, tokens, salt=None, extra_keys=()):
        table, published = self.cache.tables[seq], 0
        for index, (key, parent, block_tokens, extra) in enumerate(
                self.chain(tokens[:self.cache.length(seq)], salt, extra_keys)):
            entry = self.entries.get(key)
            if entry is not None and not self.matches(entry, parent, block_tokens, extra):
                self.entries.pop(key)
                entry = None
            if entry is None and table[index] not in self.block_keys:
                self.publish(table[index], key, parent, block_tokens, extra)
                published += 1
        return published


# ---- planted bugs: eviction ----------------------------------------------------------------------------

class EvictsNewestFirst(PrefixCache):
    def evict(self, blocks_wanted):
        freed = 0
        while self.cache.allocator.num_free < blocks_wanted and self.lru:
            _, entry = self.lru.popitem()
            self.forget(entry)
            freed += 1
        return freed


class EvictsBlocksInUse(PrefixCache):
    def evictable(self, entry):
        return entry.children == 0


class EvictsParentsFirst(PrefixCache):
    def evictable(self, entry):
        return self.cache.allocator.refcount(entry.block) == 1


class ForgetLeavesParentStuck(PrefixCache):
    def forget(self, entry):
        self.lru.pop(entry.key, None)
        del self.entries[entry.key], self.block_keys[entry.block]
        self.cache.allocator.release(entry.block)


class EvictsOnePerCall(PrefixCache):
    def evict(self, blocks_wanted):
        if self.cache.allocator.num_free < blocks_wanted and self.lru:
            _, entry = self.lru.popitem(last=False)
            self.forget(entry)
            return 1
        return 0


class EvictableAtRefcountZero(PrefixCache):
    """Forgets the cache's own reference: waits for refcount 0, which never comes."""

    def evictable(self, entry):
        return entry.children == 0 and self.cache.allocator.refcount(entry.block) == 0


class ForgetDoesNotRelease(PrefixCache):
    def forget(self, entry):
        self.lru.pop(entry.key, None)
        del self.entries[entry.key], self.block_keys[entry.block]
        if entry.parent is not None:
            parent = self.entries[entry.parent]
            parent.children -= 1
            self.refresh(parent, front=True)


class ParentToTheBack(PrefixCache):
    """A parent left childless joins the back of the line instead of the front."""

    def forget(self, entry):
        self.lru.pop(entry.key, None)
        del self.entries[entry.key], self.block_keys[entry.block]
        if entry.parent is not None:
            parent = self.entries[entry.parent]
            parent.children -= 1
            self.refresh(parent)
        self.cache.allocator.release(entry.block)


class ForgetKeepsTheOldKey(PrefixCache):
    def forget(self, entry):
        self.lru.pop(entry.key, None)
        del self.entries[entry.key]
        if entry.parent is not None:
            parent = self.entries[entry.parent]
            parent.children -= 1
            self.refresh(parent, front=True)
        self.cache.allocator.release(entry.block)


@pytest.mark.parametrize("check, bug, words", [
    # keys
    (ch05.check_chain, OwnTokensLoud, ["parent key of block 1", "own tokens", "different histories share"]),
    (ch05.check_chain, OwnTokensQuiet, ["key of block 1", "quiet form", "one of them stops hitting"]),
    (ch05.check_chain, SaltIgnored, ["two salts", "the salt is ignored"]),
    (ch05.check_chain, SaltInEveryBlock, ["the extra of each block", "first block's extra only"]),
    (ch05.check_chain, PartialBlockKeyed, ["tuples yielded", "expected 2, got 3", "partial block got a key"]),
    (ch05.check_matches, MatchesTrustsTheKey, ["against parent 12", "parent key must match"]),
    (ch05.check_matches, MatchesIgnoresExtra, ["extra ('u',)", "the salt is ignored"]),
    # attach and detach
    (ch05.check_attach, NothingLeftToPrefill, ["both cached", "expected 7, got 8", "nothing to prefill"]),
    (ch05.check_attach, HitWithoutReference, ["refcounts of the cached blocks", "expected [4, 3], got [2, 2]",
                                              "adds an owner"]),
    (ch05.check_attach, AlwaysHoldsOneBack, ["expected 8, got 7", "one token short"]),
    (ch05.check_attach, DetachTakesAHitBack, ["reused nothing", "a hit only if that attach reused"]),
    (ch05.check_attach, EmptyPromptAccepted, ["attach(9, [])", "ValueError to be raised"]),
    (ch05.check_attach, DetachKeepsTheCount, ["that detach undid", "admission that was then undone"]),
    # remember
    (ch05.check_remember, RemembersPartialBlock, ["partial third block", "partial block got a key"]),
    (ch05.check_remember, RemembersUncomputed, ["first prefill chunk", "expected 1, got 2",
                                                "only blocks whose K/V has been computed"]),
    (ch05.check_remember, RepublishesABlock, ["under another salt", "expected 0, got 2",
                                              "one block, one entry"]),
    (ch05.check_remember, RememberOverwrites, ["every block collides", "never overwrite"]),
    # eviction
    (ch05.check_evict, EvictsNewestFirst, ["evicted one by one", "not least recently used first"]),
    (ch05.check_evict, EvictsBlocksInUse, ["still hold its block", "a block in use was evicted"]),
    (ch05.check_evict, EvictsParentsFirst, ["evictable(e2)", "parent was evicted before its leaf"]),
    (ch05.check_evict, ForgetLeavesParentStuck, ["expected [f2, e3, e2, e1], got [f2, e3]",
                                                 "parent whose last child was evicted"]),
    (ch05.check_evict, EvictsOnePerCall, ["expected 3, got 1", "a while loop"]),
    (ch05.check_evict, EvictableAtRefcountZero, ["evictable(f2)", "refcount 1, not 0"]),
    (ch05.check_evict, ForgetDoesNotRelease, ["blocks freed in the pool", "release the cache's own reference"]),
    (ch05.check_evict, ParentToTheBack, ["expected [g2, g1, h1], got [g2, h1, g1]", "to the FRONT of the line"]),
    (ch05.check_evict, ForgetKeepsTheOldKey, ["still has entries", "block_keys"]),
], ids=lambda x: getattr(x, "__name__", ""))
def test_bug_is_caught(check, bug, words):
    message = fails(check, bug)
    for word in words:
        assert word in message, message


def test_a_key_of_the_blocks_own_tokens_is_caught_in_the_engine():
    message = fails(lambda _: in_engine(keys=OwnTokensLoud), None)
    for word in ("differ from a from-scratch run", "different histories share"):
        assert word in message, message
