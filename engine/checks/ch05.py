"""Chapter 5's checks: a prefix cache that keys each block by its whole history, reuses the longest
cached chain, publishes only full computed blocks and evicts least recently used leaves nobody holds.

The learner writes four small pieces, each a subclass of the engine's PrefixCache that defines only
its methods: the keys (`chain`, `matches`), `attach` and `detach`, `remember`, and eviction
(`evictable`, `evict`, `forget`). Each check takes the class of one piece (every other method is the
engine's), so a piece can pass while the others are unfinished. The last check puts the four pieces
together and serves requests through the engine's scheduler and paged cache, comparing every logit
with a from-scratch run.
"""
from __future__ import annotations

import contextlib
import functools
import io
import random
import traceback

import torch

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import Entry
from engine.checks import (ATOL, CheckFailed, Proved, ceil_div, check, compare_logits, continuations, expect_equal,
                           expect_raises, fail, made_beside, passed, review_choice, review_number, served, shows_text,
                           tiny, where_it_lives)
from engine.checks.compose import naming_earlier_pieces, one_class, together, written_later
from engine.checks.recording import constant_hash   # made where cls lives: no function of the grader's
from engine.generate import cached_step, scratch_logits
from engine.sampling import SamplingParams
from engine.seeded import seeded_tokens
from engine.serve.engine import Engine
from engine.serve.shared_prompt import run as run_prefix_demo

BS = 4      # the checks' block size: small, so every case is a few blocks of a tiny model

OWN_TOKENS = ("a key made from the block's own tokens")
LOUD = (f"{OWN_TOKENS}, with no parent to check on lookup: two requests with the same block text "
        "after different histories share a block whose K/V was computed for the other history")
QUIET = (f"{OWN_TOKENS} (the quiet form: the parent is still checked on lookup, so nothing wrong is "
         "shared, but X after A and X after B want the same entry, and one of them stops hitting). "
         "Hash the parent's key into the key")
SALT = ("the salt is ignored: requests of different tenants must never share a block, so the salt "
        "must change the key of the first block, and through the chain every key after it")
PARTIAL = ("a partial block got a key: only full blocks are cached, since a block that is not full "
           "will still be written, and its last tokens are not known yet")
NO_PREFILL = ("a fully cached, block-aligned prompt was left with nothing to prefill: the last "
              "prompt token must always run through the model, because its logits choose the first "
              "new token. Reuse at most len(prompt) - 1 tokens")
UNDONE = ("a hit counted for an admission that was then undone: detach() must take back the query, "
          "the hit and the tokens that attach() counted")
IN_USE = ("a block in use was evicted: a block that a sequence still holds (refcount above 1) must "
          "never be evicted")
PARENT_FIRST = ("a parent was evicted before its leaf: an entry with cached children continues a "
                "chain and must stay until its children are gone")
NOT_LRU = ("eviction is not least recently used first: the line `self.lru` has the next victim at "
           "its front; popitem(last=False) takes it")
UNCOMPUTED = ("only blocks whose K/V has been computed may be published: chain over "
              "tokens[:self.cache.length(seq)], not over the whole prompt")
DOUBLE_REMOVAL = ("the entry was taken out of self.lru twice: evict already pops it "
                  "(self.lru.popitem(last=False)) before calling forget, so forget must remove it only if "
                  "it is still there: self.lru.pop(entry.key, None)")
PARENT_KEY = ("entry.parent is the parent's key (an int, or None for a first block), not an Entry: "
              "the parent entry is self.entries[entry.parent]")


# ---- helpers ---------------------------------------------------------------------------------------

def _prefix(cls, hash_fn=None, num_blocks: int = 32, block_size: int = BS):
    """cls over a fresh PagedKVCache of the tiny model's shape (with `hash_fn`, when given)."""
    return _built(cls, tiny().config, num_blocks, block_size, hash_fn)


@where_it_lives
def _built(cls, config, num_blocks: int, block_size: int, hash_fn):
    """_prefix's work, where cls lives: in the grader the learner's process builds the cache and the
    prefix cache from its own engine, and the grader holds them as the learner's objects."""
    cache = PagedKVCache(config, num_blocks, block_size=block_size, dtype=torch.float32)
    return cls(cache) if hash_fn is None else cls(cache, hash_fn=hash_fn)


def _serve(prefix, seq: int, prompt: list[int], salt=None) -> tuple[int, float]:
    """attach, prefill the rest, remember; return (tokens reused, worst gap to a cold prefill)."""
    reused = prefix.attach(seq, prompt, salt=salt)
    got = cached_step(tiny(), prefix.cache, [seq], [prompt[reused:]])[0]
    prefix.remember(seq, prompt, salt=salt)
    cold = scratch_logits(tiny(), [prompt])[0][reused:]
    return reused, float((got - cold).abs().max())


def _engine_key(prefix, parent, tokens, extra) -> int:
    return prefix.hash_fn(parent, tuple(tokens), tuple(extra))


# The notebook's names of the four pieces, the latest first, as the test cells pass them.
PIECES = ("Evict (Exercise 5.4)", "Remember (Exercise 5.3)", "Attach (Exercise 5.2)", "Keys (Exercise 5.1)")


# The methods of each piece, by the notebook's name of its class.
METHODS = {"Keys": ("chain", "matches"), "Attach": ("attach", "detach"), "Remember": ("remember",),
           "Evict": ("evictable", "evict", "forget")}


def your_pieces(*pieces, latest: str = "Evict"):
    """One PrefixCache class from the pieces given, from the piece named `latest` ("Evict", "Remember", ...)
    back to Keys (each a subclass of the engine's that defines only its own methods; a piece may inherit an
    earlier one), then the notebook's pieces of the later exercises that are written (compose.written_later):
    an instance of it is an instance of every piece whose methods a check may run, so a piece's super() and
    helpers work wherever a check calls them (Exercise 5.2's check evicts through the scheduler, and so runs
    Exercise 5.4's evict and forget). A CheckFailed in the notebook's names when Python finds no method order
    for the pieces given; later pieces that cannot join them are left out."""
    start = next(i for i, label in enumerate(PIECES) if label.startswith(latest + " "))
    labels, later = PIECES[start:start + len(pieces)], PIECES[:start][::-1]
    found = written_later(pieces[0], tuple((label.split(" (")[0], METHODS[label.split(" (")[0]])
                                          for label in later)) if later else ()
    joined = [(label, cls) for label, cls in zip(later, found) if cls is not None]
    if joined:
        made = together("YourPrefixCache", labels + tuple(label for label, _ in joined), *pieces,
                        *(cls for _, cls in joined))
        if not isinstance(made, str):
            return made
    if len(pieces) == 1:
        return pieces[0]
    return one_class("YourPrefixCache", labels, *pieces)


def _naming_earlier(subject: str, latest: str, earlier):
    """compose.naming_earlier_pieces around the check of piece `latest`: each earlier piece given is probed
    with its own exercise's checks (on it and the pieces before it)."""
    return naming_earlier_pieces(subject, PIECES, latest, earlier,
                                 {"Remember": (check_remember,), "Attach": (check_attach,),
                                  "Keys": (check_chain, check_matches)},
                                 {"Remember": "remember", "Attach": "attach and detach", "Keys": "chain and matches"})


def combine(keys, attach, remember, evict):
    """One PrefixCache class from the four pieces: the chapter's last check serves requests through it."""
    return your_pieces(evict, remember, attach, keys)


# ---- exercise 5.1: the key of a block ----------------------------------------------------------------

def _diagnose_keys(cls) -> str | None:
    """Name the way a chain's keys go wrong, or None when they do not (computed without the model)."""
    prefix = _prefix(cls)
    a, b, x = seeded_tokens(BS, 1), seeded_tokens(BS, 2), seeded_tokens(BS, 3)
    after_a, after_b = list(prefix.chain(a + x)), list(prefix.chain(b + x))
    if len(after_a) == 2 and len(after_b) == 2 and after_a[1][0] == after_b[1][0]:
        return LOUD if after_a[1][1] == after_b[1][1] else QUIET
    first_a = list(prefix.chain(a + x, salt="tenant-a"))
    first_b = list(prefix.chain(a + x, salt="tenant-b"))
    if [k for k, *_ in first_a] == [k for k, *_ in first_b] or first_a[0][3] == first_b[0][3]:
        return SALT
    return None


@check
def check_chain(cls) -> None:
    """chain(tokens, salt, extra_keys) yields (key, parent key, token ids, extra keys) for each full
    block, in order: key = self.hash_fn(parent key, token ids, extra), the salt in the first block's
    extra, so every key depends on the whole history and the tenant."""
    cls = your_pieces(cls, latest="Keys")        # with the later pieces written, whose methods serving runs
    for length in (2 * BS + 3, 3 * BS, BS - 1, 1):
        tokens = seeded_tokens(length, seed=4)
        prefix = _prefix(cls)
        got = list(prefix.chain(tokens))
        full = length // BS
        if len(got) != full:
            hint = PARTIAL if len(got) == ceil_div(length, BS) else "one tuple per full block of tokens"
            fail(f"chain() of a {length}-token prompt in blocks of {BS}: tuples yielded", full, len(got), hint)
        parent = None
        for index, item in enumerate(got):
            if len(item) != 4:
                fail(f"chain(): item {index} should be (key, parent, tokens, extra)", 4, len(item),
                     "yield a 4-tuple per block")
            key, item_parent, block_tokens, extra = item
            expect_equal(tuple(block_tokens), tuple(tokens[index * BS:(index + 1) * BS]),
                         f"chain() of a {length}-token prompt: the token ids of block {index}",
                         f"block {index} holds tokens [{index * BS}, {(index + 1) * BS})")
            if item_parent != parent:
                loud = item_parent is None and key == _engine_key(prefix, None, block_tokens, extra)
                fail(f"chain(): the parent key of block {index}", parent, item_parent, LOUD if loud else
                     "the first block has no parent (None); block i's parent is block i-1's key")
            want = _engine_key(prefix, parent, block_tokens, extra)
            if key != want:
                if key == _engine_key(prefix, None, block_tokens, extra) and index > 0:
                    fail(f"chain(): the key of block {index}", want, key, QUIET)
                fail(f"chain(): the key of block {index}", want, key,
                     "key = self.hash_fn(parent key, the block's token ids, its extra keys)")
            parent = key
    why = _diagnose_keys(cls)
    if why:
        fail("chain() of A + X and of B + X (X the same block text after different blocks A and B), "
             "or of one prompt under two salts", hint=why)
    collide = _prefix(cls, hash_fn=constant_hash(cls, 7))
    keys = [k for k, *_ in collide.chain(seeded_tokens(2 * BS, 5))]
    expect_equal(keys, [7, 7], "chain() with hash_fn always returning 7: the keys",
                 "compute each key with self.hash_fn, so a cache can be built with another hash")
    extra = [e for *_, e in _prefix(cls).chain(seeded_tokens(2 * BS, 6), salt="t", extra_keys=("lora",))]
    if not all("lora" in e for e in extra):
        fail("chain(..., extra_keys=('lora',)): the extra keys of each block", "'lora' in every block's extra",
             extra, "extra keys (an adapter id, say) change every block's K/V: put them in every block")
    if [tuple(e) for e in extra] != [("t", "lora"), ("lora",)]:
        hint = "extra = (salt,) + tuple(extra_keys) for the first block, tuple(extra_keys) for the others"
        if all("t" in e for e in extra):
            hint = ("the salt goes into the first block's extra only: every later key is chained on the "
                    "first, so it carries the salt already")
        fail("chain(tokens, salt='t', extra_keys=('lora',)): the extra of each block",
             [("t", "lora"), ("lora",)], [tuple(e) for e in extra], hint)
    proved = Proved("chain")
    proved.note("one key per full block, chained on the parent's key, the salt in the first block's extra "
                "and the extra keys in every block's")
    # Served: both histories keep hitting (the engine's attach and remember use this chain).
    with served("serving A+X and B+X", proved, f"A+X and B+X each keep reusing all {2 * BS} tokens of their "
                "two full blocks when served", essential=False):     # chain's keys are checked above
        prefix = _prefix(cls)
        a, b, x = seeded_tokens(BS, 7), seeded_tokens(BS, 8), seeded_tokens(BS, 9)
        reused = []
        for seq, prompt in enumerate([a + x + [1], b + x + [2], a + x + [3], b + x + [4]]):
            got, gap = _serve(prefix, seq, prompt)
            if gap > ATOL:
                fail(f"serving {['A+X', 'B+X', 'A+X', 'B+X'][seq]}: the logits differ from a cold prefill "
                     f"(max |Δ| {gap:.3g})", hint=LOUD)
            reused.append(got)
            prefix.cache.free(seq)
        expect_equal(reused[2:], [2 * BS, 2 * BS], "serving A+X, B+X, then A+X and B+X again: tokens the last "
                     "two reuse", QUIET)
    proved.passed()


@check
def check_matches(cls) -> None:
    """matches(entry, parent, tokens, extra) is True only when the entry was computed from exactly this
    parent, these tokens and these extra keys: equal keys may still collide."""
    cls = your_pieces(cls, latest="Keys")
    entry = made_beside(cls, Entry, key=7, block=3, parent=11, tokens=(1, 2, 3, 4), extra=("t",))
    cases = [((11, (1, 2, 3, 4), ("t",)), True, "the very block it was computed for"),
             ((12, (1, 2, 3, 4), ("t",)), False, "the parent key must match too"),
             ((None, (1, 2, 3, 4), ("t",)), False, "the parent key must match too"),
             ((11, (1, 2, 3, 5), ("t",)), False, "compare the token ids: equal keys may collide"),
             ((11, (1, 2, 3, 4), ("u",)), False, "compare the extra keys: " + SALT)]
    for (parent, tokens, extra), want, hint in cases:
        got = cls.matches(entry, parent, tokens, extra)
        if bool(got) != want:
            fail(f"matches(entry computed from parent 11, tokens (1, 2, 3, 4), extra ('t',)) against "
                 f"parent {parent}, tokens {tokens}, extra {extra}", want, got, hint)
    proved = Proved("matches")
    proved.note("a hit needs the same parent, tokens and extra keys")
    # Served with a hash under which every block collides: a lookup must verify, not trust the key.
    with served("serving colliding keys", proved, "colliding keys are misses when served", essential=False):
        prefix = _prefix(cls, hash_fn=constant_hash(cls, 0))
        first, other = seeded_tokens(2 * BS + 1, 10), seeded_tokens(2 * BS + 1, 11)
        _serve(prefix, 0, first)
        reused, gap = _serve(prefix, 1, other)
        if reused or gap > ATOL:
            fail("with a hash under which every block collides, a different prompt reused tokens",
                 0, reused, "a lookup must verify the parent, tokens and extra keys of what it finds")
    proved.passed()


# ---- exercise 5.2: attach and detach --------------------------------------------------------------------

@check
def check_attach(cls, *earlier) -> None:
    """attach(seq, prompt) creates seq on the longest chain of cached full blocks, shares them, sets
    its length, always leaves one prompt token to prefill, and counts the lookup; detach undoes it.
    `earlier`: Keys, when the class does not inherit it already."""
    with _naming_earlier("check_attach", "Attach", earlier):
        _check_attach(your_pieces(cls, *earlier, latest="Attach"))


def _check_attach(cls) -> None:
    """check_attach's work, on the learner's pieces as one class."""
    prefix = _prefix(cls)
    cache = prefix.cache
    shared = seeded_tokens(2 * BS, 12)
    expect_equal(prefix.attach(0, shared + [1]), 0, "attach to an empty cache: tokens reused",
                 "nothing is cached yet")
    expect_equal(cache.tables.get(0), [], "attach(0, ...) to an empty cache: sequence 0's table",
                 "attach creates the sequence (cache.create) even when nothing is reused")
    queries = prefix.stats()["queries"]
    expect_raises(ValueError, lambda: prefix.attach(9, []), "attach(9, []): an empty prompt",
                  "an empty prompt has no last token to prefill: raise ValueError")
    if 9 in cache.tables or prefix.stats()["queries"] != queries:
        fail("attach(9, []) raised, but created sequence 9 or counted a query",
             hint="check the prompt first, then create the sequence and count")
    proved = Proved("attach")
    proved.note("a sequence created even when nothing is reused; an empty prompt refused, changing nothing")
    with served("attaching to remembered blocks", proved, "the longest cached chain, shared; one prompt token "
                "always left to prefill; lookups counted; detach undoes an admission and its count, in the "
                "scheduler too"):
        cached_step(tiny(), cache, [0], [shared + [1]])
        prefix.remember(0, shared + [1])
        blocks = cache.tables[0][:2]
        for seq, prompt, want, what in ((1, shared + [2, 3], 2 * BS, "two cached blocks and a tail"),
                                        (2, shared[:BS] + [9] * BS + [4], BS, "a miss in the second block"),
                                        (3, shared[:BS - 1], 0, "shorter than one block")):
            got = prefix.attach(seq, prompt)
            if got != want:
                hint = ("walk the chain block by block; the first miss ends the prefix" if got > want else
                        "share every cached full block up to the first miss")
                if got == want - 1 and want > 0:
                    hint = ("one token short: a token is held back only when the cached blocks cover the "
                            "whole prompt; reused = min(blocks x block_size, len(prompt) - 1)")
                fail(f"attach of a prompt with {what} ({len(prompt)} tokens): tokens reused", want, got, hint)
            expect_equal(cache.length(seq), want, f"after attach of a prompt with {what}: cache.length({seq})",
                         "set the sequence's length to the tokens reused (cache.set_length)")
            expect_equal(cache.tables[seq], blocks[:want // BS], f"after attach of a prompt with {what}: "
                         f"sequence {seq}'s table", "the table holds the cached blocks, in order")
        refs = [cache.allocator.refcount(b) for b in blocks]
        expect_equal(refs, [4, 3], f"after three attaches, the refcounts of the cached blocks {blocks}",
                     "each hit adds an owner (cache.share_blocks): sequence 0, the cache, and each sequence "
                     "that attached to the block. A hit without a reference could be evicted under it")
        got = prefix.attach(4, shared)                      # exactly the cached blocks: block-aligned
        if got != 2 * BS - 1:
            fail(f"attach of a {2 * BS}-token prompt whose {2} blocks are both cached: tokens reused",
                 2 * BS - 1, got, NO_PREFILL if got == 2 * BS else "reuse all but the last prompt token")
        expect_equal(cache.length(4), 2 * BS - 1, "after attach of a fully cached prompt: cache.length(4)",
                     f"{NO_PREFILL}: set the length to the capped count too, "
                     "self.cache.set_length(seq, reused) with reused = min(blocks x block_size, len(prompt) - 1)")
        expect_equal(cache.tables[4], blocks, "after attach of a fully cached prompt: its table",
                     "both blocks are attached; the last is copied on write when its last token is prefilled")
        want = {"queries": 5, "hits": 3, "tokens_saved": 3 * BS + 2 * BS - 1}
        got = {k: prefix.stats()[k] for k in want}
        expect_equal(got, want, "stats() after attaching 5 prompts (3 of them hits)",
                     "count every attach as a query, one that reused tokens as a hit, and the tokens reused")
        # detach: the scheduler undoes an admission that does not fit.
        before = (prefix.stats(), [cache.allocator.refcount(b) for b in blocks], cache.allocator.num_free)
        prefix.attach(5, shared + [7])
        prefix.detach(5)
        if 5 in cache.tables:
            fail("after attach(5, ...) then detach(5), sequence 5 still exists", hint="detach frees the sequence")
        after = (prefix.stats(), [cache.allocator.refcount(b) for b in blocks], cache.allocator.num_free)
        if after[1:] != before[1:]:
            fail("attach then detach changed the refcounts or free blocks", before[1:], after[1:],
                 "detach must give back every reference attach took (free the sequence)")
        expect_equal(after[0], before[0], "stats() after an attach that detach undid", UNDONE)
        miss = seeded_tokens(2 * BS + 1, 25)
        prefix.attach(6, miss)
        prefix.detach(6)
        expect_equal(prefix.stats(), before[0], "stats() after attach then detach of a prompt that reused "
                     "nothing", "detach takes back exactly what attach counted: a query always, a hit only "
                     "if that attach reused tokens, and the tokens it reused")
        _check_undone_admissions(cls)
    proved.passed()


def _check_undone_admissions(cls) -> None:
    """Through the engine's scheduler: a request that hits but cannot fit is attached and undone,
    step after step; only the admission that stands may count."""
    cache = made_beside(cls, PagedKVCache, tiny().config, 11, block_size=BS)
    engine = Engine(tiny(), cache, prefix_caching=False)
    prefix = engine.scheduler.prefix = cls(cache)
    shared = seeded_tokens(2 * BS, 13)
    engine.generate([shared + [1]], SamplingParams(max_tokens=1))
    engine.add_request(seeded_tokens(5 * BS, 14), SamplingParams(max_tokens=3 * BS))
    engine.add_request(shared + seeded_tokens(3 * BS, 15), SamplingParams(max_tokens=1))
    engine.run(progress=False)
    expect_equal(prefix.stats()["queries"], engine.scheduler.prefix_stats["queries"],
                 "served through the scheduler, where a third request that hits the cache is attached "
                 "and undone while the pool is full: stats()['queries'] against the requests admitted",
                 UNDONE)


# ---- exercise 5.3: remember ------------------------------------------------------------------------------

@check
def check_remember(cls, *earlier) -> None:
    """remember(seq, tokens) publishes seq's full blocks whose K/V was computed, each once, with the
    cache's own reference (self.publish), and returns how many it published. `earlier`: the pieces of the
    exercises before (Attach, Keys), whose methods the check runs too."""
    with _naming_earlier("check_remember", "Remember", earlier):
        _check_remember(your_pieces(cls, *earlier, latest="Remember"))


def _check_remember(cls) -> None:
    """check_remember's work, on the learner's pieces as one class."""
    prefix = _prefix(cls)
    cache = prefix.cache
    prompt = seeded_tokens(2 * BS + 1, 16)
    prefix.attach(0, prompt)
    cached_step(tiny(), cache, [0], [prompt])
    proved = Proved("remember")
    # publish keeps the eviction line: evictable, Exercise 5.4
    with served("publishing a block", proved, "full computed blocks only, each published once with the "
                "cache's reference; they outlive their sequence; collisions stop the chain"):
        got = prefix.remember(0, prompt)
        table = cache.tables[0]
        if table[2] in prefix.block_keys:
            fail(f"remember of a {2 * BS + 1}-token sequence published its partial third block", hint=PARTIAL)
        expect_equal(got, 2, f"remember of a {2 * BS + 1}-token prefilled sequence: blocks published",
                     "publish each full block of the computed tokens")
        expect_equal(sorted(prefix.block_keys), sorted(table[:2]), "the blocks published",
                     "publish table[i] for block i of the chain")
        expect_equal([cache.allocator.refcount(b) for b in table[:2]], [2, 2], "refcounts of the published blocks",
                     "self.publish adds the cache's own reference: the sequence and the cache")
        expect_equal(prefix.remember(0, prompt), 0, "remember of the same sequence again: blocks published",
                     "a block already cached under its key is not published again")
        refs = [cache.allocator.refcount(b) for b in table[:2]]
        expect_equal(prefix.remember(0, prompt, salt="other"), 0, "remember of the same sequence under "
                     "another salt (other keys, the same blocks): blocks published",
                     "one block, one entry: a block already published (in self.block_keys) under another "
                     "key is not published again; stop there")
        expect_equal([cache.allocator.refcount(b) for b in table[:2]], refs, "refcounts after that remember",
                     "one block, one entry: stop at a block that self.block_keys already holds")
        # Chunked prefill: only what has been computed.
        long = seeded_tokens(3 * BS, 17)
        prefix.attach(1, long)
        cached_step(tiny(), cache, [1], [long[:BS + 1]])
        what = f"remember after a first prefill chunk of {BS + 1} of {3 * BS} tokens"
        try:
            got = prefix.remember(1, long)
        except IndexError as error:
            fail(f"{what} crashed with IndexError ({error}): the prompt has 3 full blocks, the sequence's "
                 f"table only {len(cache.tables[1])} so far", hint=UNCOMPUTED)
        expect_equal(got, 1, f"{what}: blocks published", UNCOMPUTED)
        cached_step(tiny(), cache, [1], [long[BS + 1:]])
        expect_equal(prefix.remember(1, long), 2, "remember after the rest of the prompt: blocks published")
        # The published blocks serve a later request, after their sequence is gone.
        cache.free(0)
        reused, gap = _serve(prefix, 2, prompt[:2 * BS] + [5, 6])
        expect_equal(reused, 2 * BS, "after sequence 0 is freed, a request with its two full blocks: tokens "
                     "reused", "the cache's own reference keeps a published block alive after its sequence")
        if gap > ATOL:
            fail(f"the request served from remembered blocks: max |Δ| {gap:.3g} against a cold prefill",
                 hint="publish each block under the key of the tokens it really holds")
        # A hash under which every block collides: nothing may be overwritten.
        collide = _prefix(cls, hash_fn=constant_hash(cls, 0))
        _serve(collide, 0, seeded_tokens(2 * BS + 1, 18))
        expect_equal(sorted(collide.block_keys), collide.cache.tables[0][:1], "with a hash under which every "
                     "block collides: the blocks published by one remember", "a key taken by a different "
                     "block is a collision: stop publishing there (self.matches tells), never overwrite it")
    proved.passed()


# ---- exercise 5.4: eviction ------------------------------------------------------------------------------

def _eviction_setup(cls):
    """Three prompts: p (chain e1 <- e2 <- e3), q (e1 <- f2), p again; every sequence still live."""
    prefix = _prefix(cls, num_blocks=32)
    p = seeded_tokens(3 * BS + 1, 19)
    q = p[:BS] + seeded_tokens(BS + 1, 20)
    for seq, prompt in enumerate((p, q, p)):
        _serve(prefix, seq, prompt)
    e1, e2, e3 = prefix.cache.tables[0][:3]
    f2 = prefix.cache.tables[1][1]
    return prefix, (e1, e2, e3, f2)


def _evict(prefix, blocks_wanted: int) -> int:
    """prefix.evict(blocks_wanted), with the two crashes of a slip in forget named."""
    try:
        return prefix.evict(blocks_wanted)
    except KeyError as error:
        key = error.args[0] if error.args else None
        line = (traceback.extract_tb(error.__traceback__)[-1].line or "").strip()
        if "lru" in line or (key in prefix.entries and key not in prefix.lru):
            fail(f"evict({blocks_wanted}) crashed with KeyError: {key}, the key of an entry that "
                 "evict had already taken out of self.lru" + (f" (in `{line}`)" if line else ""),
                 hint=DOUBLE_REMOVAL)
        raise
    except AttributeError as error:
        if "children" in str(error) and "'int'" in str(error):
            fail(f"evict({blocks_wanted}) crashed with AttributeError: {error}", hint=PARENT_KEY)
        raise


def _evict_one_by_one(prefix) -> list[int]:
    order = []
    for _ in range(len(prefix.entries) + 1):
        before = {entry.block for entry in prefix.entries.values()}
        free = prefix.cache.allocator.num_free
        freed = _evict(prefix, free + 1)
        gone = before - {entry.block for entry in prefix.entries.values()}
        if gone and prefix.cache.allocator.num_free - free != len(gone):
            fail(f"evict({free + 1}) with {free} blocks free: blocks freed in the pool against entries "
                 "evicted", len(gone), prefix.cache.allocator.num_free - free,
                 "forget() must release the cache's own reference on the block "
                 "(self.cache.allocator.release(entry.block)), or the pool never gets it back")
        if freed != len(gone):
            fail("evict(): its return value against the entries that left the cache", len(gone), freed,
                 "forget() must remove each evicted entry from self.entries" if freed > len(gone)
                 else "return how many blocks were evicted")
        if not gone:
            break
        order += sorted(gone)
    return order


@check
def check_evict(cls, *earlier) -> None:
    """evict(blocks_wanted) releases evictable entries (leaves only the cache holds), least recently
    released first, until blocks_wanted blocks are free; a parent whose last child goes is next.
    `earlier`: the pieces of the exercises before (Remember, Attach, Keys), whose methods it runs too."""
    with _naming_earlier("check_evict", "Evict", earlier):
        _check_evict(your_pieces(cls, *earlier, latest="Evict"))


def _check_evict(cls) -> None:
    """check_evict's work, on the learner's pieces as one class."""
    prefix, (e1, e2, e3, f2) = _eviction_setup(cls)
    cache = prefix.cache
    names = {e1: "e1", e2: "e2", e3: "e3", f2: "f2"}
    for block, name in names.items():
        if prefix.evictable(prefix.entries[prefix.block_keys[block]]):
            fail(f"evictable({name}) while sequences still hold its block (refcount "
                 f"{cache.allocator.refcount(block)})", False, True, IN_USE)
    got = _evict(prefix, cache.num_blocks)
    if got:
        taken = [names.get(b, b) for b in names if b not in prefix.block_keys]
        fail("evict(all blocks) while every cached block is held by a sequence: blocks evicted", 0, got,
             f"{IN_USE} (evicted: {taken})")
    for seq in (0, 1):
        cache.free(seq)                                # f2 is released first, then nothing else
    expect_equal(_evict(prefix, cache.allocator.num_free), 0, "evict(n) when n blocks are already free",
                 "stop as soon as the pool has blocks_wanted free blocks")
    cache.free(2)                                      # now e3 too; e1 and e2 still have children
    if prefix.evictable(prefix.entries[prefix.block_keys[e2]]):
        fail("evictable(e2) while its child e3 is still cached", False, True, PARENT_FIRST)
    if not prefix.evictable(prefix.entries[prefix.block_keys[f2]]):
        fail(f"evictable(f2), a leaf that no sequence holds any more (refcount "
             f"{cache.allocator.refcount(f2)}: the cache's own reference)", True, False,
             "a block only the cache holds has refcount 1, not 0: evictable means no children and "
             "refcount == 1")
    order = [names.get(b, b) for b in _evict_one_by_one(prefix)]
    if order != ["f2", "e3", "e2", "e1"]:
        hint = "evict one least recently released evictable entry at a time"
        if order[:1] == ["e3"]:
            hint = NOT_LRU + " (f2 was released first)"
        elif order and order[0] in ("e1", "e2"):
            hint = PARENT_FIRST
        elif len(order) < 4:
            hint = ("a parent whose last child was evicted must become evictable: forget() lowers the "
                    "parent's children count and refreshes it (at the front of the line)")
        fail("blocks evicted one by one after chains e1<-e2<-e3 and e1<-f2 were released (f2 first)",
             ["f2", "e3", "e2", "e1"], order, hint)
    expect_equal(cache.allocator.num_free, cache.num_blocks, "after evicting everything: free blocks",
                 "forget() releases the cache's reference on the block")
    # A parent left childless goes to the front: chain g1 <- g2 released before h1.
    prefix = _prefix(cls, num_blocks=32)
    g, h = seeded_tokens(2 * BS + 1, 23), seeded_tokens(BS + 1, 24)
    for seq, prompt in enumerate((g, h)):
        _serve(prefix, seq, prompt)
    (g1, g2), h1 = prefix.cache.tables[0][:2], prefix.cache.tables[1][0]
    for seq in (0, 1):
        prefix.cache.free(seq)
    names = {g1: "g1", g2: "g2", h1: "h1"}
    order = [names.get(b, b) for b in _evict_one_by_one(prefix)]
    # evict takes as many as it needs, not one per call.
    again = _prefix(cls, num_blocks=32)
    for seq, prompt in enumerate((g, h)):
        _serve(again, seq, prompt)
        again.cache.free(seq)
    free = again.cache.allocator.num_free
    expect_equal(_evict(again, free + 3), 3, f"evict({free + 3}) with {free} blocks free and 3 cached blocks "
                 "nobody holds: blocks evicted", "keep taking the front of the line while fewer than "
                 "blocks_wanted blocks are free (a while loop, not one eviction per call)")
    if order != ["g2", "g1", "h1"]:
        fail("blocks evicted one by one after chain g1<-g2 and then h1 were released",
             ["g2", "g1", "h1"], order,
             "a parent left childless goes to the FRONT of the line (self.refresh(parent, front=True)): "
             "its chain was released before h1" if order[:2] == ["g2", "h1"] else
             "evict one least recently released evictable entry at a time")
    if prefix.entries or prefix.block_keys or prefix.lru:
        fail("after evicting everything, the cache still has entries", hint="forget() removes every trace of "
             "the entry: its key in self.entries, its block in self.block_keys and its place in self.lru")
    # An evicted block that is reused must not be found under its old key.
    prefix = _prefix(cls, num_blocks=4)
    cache = prefix.cache
    old = seeded_tokens(BS + 1, 21)
    _serve(prefix, 0, old)
    cache.free(0)
    expect_equal(_evict(prefix, 4), 1, "evict(4) on a pool of 4 with one cached block: blocks evicted")
    cache.create(1)
    cache.reserve(1, 4 * BS)
    cached_step(tiny(), cache, [1], [seeded_tokens(4 * BS, 22)])     # overwrites the evicted block
    cache.free(1)
    reused, gap = _serve(prefix, 2, old)
    if reused or gap > ATOL:
        fail("a block evicted and then overwritten by another sequence was found under its old key",
             0, reused, "forget() must delete the entry (self.entries) and its record in self.block_keys, "
             "or a later request finds a block that holds someone else's K/V under its old key")
    passed("evict: never a block in use; least recently released leaves first, a parent after its children "
           "and at the front once childless; as many as blocks_wanted asks in one call; nothing left behind, "
           "so a block evicted and reused is never found under its old key")


# ---- the milestone: all four pieces in the engine ---------------------------------------------------

def prefix_demo(cls) -> dict:
    """The seed's demo through `cls`: 8 requests sharing a 96-token system prompt, 8 tokens each."""
    return run_prefix_demo(prefix_class=cls, make_cache=functools.partial(made_beside, cls, PagedKVCache))


def _diagnose_pieces(cls) -> str | None:
    """What the first piece check that fails on the combined class (run quietly) says, or None. A check
    that fails with a message is preferred to one that crashes (a crash may be another piece's bug)."""
    crashed = None
    for probe in (check_chain, check_matches, check_attach, check_remember, check_evict):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                probe.__wrapped__(cls)
        except CheckFailed as failure:
            return f"{probe.__name__} fails on your pieces too: " + str(failure).replace(". Hint: ", "; its hint: ")
        except Exception as error:  # a crash in the probe: reported plainly if nothing says more
            crashed = crashed or f"{probe.__name__} crashes on your pieces too, with {type(error).__name__}: {error}"
    return crashed


def _milestone_run(cls, block_size: int, seed: int):
    """The milestone's two waves through the engine's scheduler with cls as its prefix cache.
    Returns (engine, prefix, served requests); nothing is compared yet."""
    bs = block_size
    rng = random.Random(seed)
    system = seeded_tokens(2 * bs + 1, seed=30 + seed)
    a, b, x = (seeded_tokens(bs, seed=31 + seed + i) for i in range(3))
    lengths = [bs - 1, bs, bs + 1, 2 * bs + 1]
    # Ragged, mostly one prefix; X after A and X after B, then X after B again.
    first = [system[:n] for n in lengths] + [a + x + [1], b + x + [2]]
    second = ([system[:n] for n in lengths] + [b + x + [3]]            # hits, block-aligned ones too
              + [system + [rng.randrange(256) for _ in range(n)] for n in lengths])
    steps = 20
    # A pool that holds the second wave only if cached blocks are evicted and sequences preempted.
    cache = made_beside(cls, PagedKVCache, tiny().config, num_blocks=4 * ceil_div(3 * bs + steps, bs), block_size=bs)
    engine = Engine(tiny(), cache, prefix_caching=False, keep_logits=True)
    prefix = engine.scheduler.prefix = cls(cache)
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    served = []
    for wave in (first, second):
        served += engine.generate(wave, params)
    return engine, prefix, served


def _crash_named(cls, action, what: str):
    """action(), where a crash in the engine is reported with the piece check that explains it."""
    try:
        return action()
    except (CheckFailed, NotImplementedError):
        raise
    except Exception as error:
        why = _diagnose_pieces(cls)
        if why is None:
            raise
        fail(f"{what} crashed with {type(error).__name__}: {error}", hint=why)


def served_text(cls, block_size: int = BS):
    """A run for continuations: the trained model served by the engine's scheduler with `cls` as its prefix
    cache, on a pool too small to keep every cached block (so it evicts). Served first: the prompt's first
    block with another ending, then the prompt's later blocks after three other blocks (the same block
    text after another history and at other positions: keys that ignore the history share them, and the
    text parts at once, whatever the trained weights), then the prompt itself; the text is the prompt
    served once more, from the blocks the cache kept."""
    from engine.tokenizer import ByteTokenizer

    def run(model, prompt: list[int], tokens: int) -> list[int]:
        bs, other = block_size, ByteTokenizer().encode("Each block holds the rest of it")
        cache = made_beside(cls, PagedKVCache, model.config,
                            ceil_div(len(prompt) + tokens, bs) + ceil_div(len(prompt), bs) + 4, block_size=bs)
        engine = Engine(model, cache, prefix_caching=False)
        engine.scheduler.prefix = cls(cache)
        for wave in (prompt[:bs] + other[bs:], other[:3 * bs] + prompt[bs:], prompt):
            continuations.served(engine, [wave], tokens)
        return continuations.served(engine, [prompt], tokens)[0]

    return run


@check
def check_prefix_cache_in_engine(keys, attach, remember, evict, block_size: int = BS, seed: int = 0) -> None:
    """Your four pieces as one PrefixCache, plugged into the engine's scheduler over its PagedKVCache:
    the seed's demo reproduces, and every request served from cached blocks, then decoded for 20 steps
    under memory pressure, has exactly the logits of a from-scratch run."""
    cls = combine(keys, attach, remember, evict)
    demo = _crash_named(cls, lambda: prefix_demo(cls), "the demo through your prefix cache")
    got = {k: demo[k] for k in ("prompt_tokens", "tokens_prefilled", "blocks_in_use", "blocks_without_sharing")}
    want = {"prompt_tokens": 832, "tokens_prefilled": 160, "blocks_in_use": 14, "blocks_without_sharing": 56}
    if got != want:
        expect_equal(got, want, "the demo: 8 requests sharing a 96-token system prompt plus 8 tokens each, "
                     "blocks of 16", _diagnose_pieces(cls) or "the first request prefills 104 tokens, each "
                     "later one only its own 8; the 6 shared blocks are stored once, plus one block of its "
                     "own per request")

    def text():      # the trained model's text through the learner's pieces, written only on a failure
        return shows_text(lambda: continuations.shown(served_text(cls)))
    if demo["max_abs_diff_vs_cold_prefill"] > ATOL:
        with text():
            fail(f"the demo's logits differ from cold prefills (max |Δ| {demo['max_abs_diff_vs_cold_prefill']:.3g})",
                 hint=_diagnose_keys(cls) or _diagnose_pieces(cls) or LOUD)
    engine, prefix, served = _crash_named(cls, lambda: _milestone_run(cls, block_size, seed),
                                          "serving two waves of requests through your prefix cache")
    cache, stats = engine.cache, prefix.stats()
    if stats["tokens_saved"] == 0:
        fail("served the same prompts twice through the engine: no tokens were reused",
             hint="attach must reuse the blocks that remember published")
    for request in served:
        [seq] = request.sequences
        prompt, out = request.prompt, seq.output
        want = scratch_logits(tiny(), [prompt + out[:-1]])[0][len(prompt) - 1:]
        what = f"request {request.request_id} (prompt of {len(prompt)} tokens, {len(out)} generated)"
        try:
            compare_logits(torch.stack(seq.logits), want, what, first_position=len(prompt) - 1)
        except CheckFailed:
            with text():
                compare_logits(torch.stack(seq.logits), want, what, first_position=len(prompt) - 1,
                               hint=_diagnose_keys(cls) or _diagnose_pieces(cls) or "a cached block must hold "
                               "exactly the K/V of the tokens (and the history) its key names")
    expect_equal(stats["queries"], engine.scheduler.prefix_stats["queries"],
                 "stats()['queries'] against the admissions the scheduler kept", UNDONE)
    expect_equal(cache.allocator.num_free + len(prefix.entries), cache.num_blocks,
                 "after every request finished: free blocks + cached blocks",
                 "every block is either free or held by the cache alone")
    passed(f"your prefix cache in the engine: the demo gives {demo['tokens_prefilled']} of "
           f"{demo['prompt_tokens']} tokens prefilled and {demo['blocks_in_use']} blocks "
           f"({demo['blocks_without_sharing']} without sharing); {len(served)} requests (bs {block_size}), "
           f"{stats['tokens_saved']} prompt tokens reused, "
           f"{sum(engine.scheduler.preemptions.values())} preemptions, every logit within {ATOL:g} of from scratch")


# ---- review questions ------------------------------------------------------------------------------------

@check
def check_review_prefill(answer) -> None:
    """R1: 20 requests share a 200-token system prompt and add 10 tokens each; blocks of 16. Tokens
    prefilled in all, served one after another with a prefix cache."""
    cached = 200 // 16 * 16
    want = 210 + 19 * (210 - cached)
    review_number(answer, "R1", "r1_answer", want,
                  f"{want} tokens prefilled: the first request all 210, each later one the {210 - cached} "
                  f"tokens past the {200 // 16} full shared blocks", "is not the number of tokens prefilled",
                  "only full blocks are cached: how many of the 200 shared tokens fill whole blocks of 16?",
                  {210 + 19 * 10: "that counts the whole system prompt as cached; 200 is not a multiple of 16, "
                                  "and the last 8 shared tokens sit in a block that also holds the request's "
                                  "own tokens",
                   20 * 210: "that is without a prefix cache"})


@check
def check_review_order(answer) -> None:
    """R2: which block goes first (choice c: a leaf nobody holds, released longest ago)."""
    hints = {"a": "the root of the system prompt's chain has children, and a running request holds it",
             "b": "a running request holds that block: evicting it would pull K/V from under it",
             "d": "that block was released most recently: LRU takes the one released longest ago"}
    review_choice(answer, "R2", "r2_answer", "c", "a leaf only the cache holds, released longest ago",
                  "is not what evict() takes first", hints)
