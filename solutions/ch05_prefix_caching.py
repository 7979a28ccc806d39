# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (paged-kv-course)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_intro", "locked": true, "schema_version": 3, "solution": false}
# # 5. Prefix caching: computing a shared prompt once
#
# Chapter 4 shared blocks between the samples of *one* request. Nothing in a block table says that
# sharing has to stop at the edge of a request. Production traffic is full of prompts that start the
# same way: one system prompt in front of every chat, the same tool definitions in every agent turn,
# the same few-shot examples, the growing history of a conversation sent again at each turn. Their
# keys and values for that common start are identical, so they can be computed once, stored once,
# and found again by the next request that starts with the same tokens. This is **prefix caching**
# (vLLM calls it automatic prefix caching and turns it on by default).
#
# You will write the four pieces of the engine's `PrefixCache`:
#
# 1. the **key** of a cached block, chained on everything before it, and the check that a block
#    found under a key really is the one asked for (`chain`, `matches`);
# 2. **`attach`**: a new request reuses the longest chain of cached full blocks (and `detach`,
#    which takes that back when the scheduler cannot admit the request after all);
# 3. **`remember`**: after prefill, a request publishes its full blocks for later requests;
# 4. **eviction**: when the pool runs low, give back the least recently used blocks that nobody
#    holds, leaves before their parents (`evictable`, `evict`, `forget`).
#
# The last check puts your four pieces together, serves requests through the engine's scheduler
# and paged cache, and compares every logit with a run that uses no cache at all.
#
# **Which cells need your code.** The demonstrations of section 5.1 use a small prefix cache of their
# own, so they run before you have written anything. The eviction timing after Exercise 5.4 and the
# explorer after the milestone use the engine's `PrefixCache`; in a student edition of the engine its
# methods are the ones your notebook defines, so those cells stop with "not written yet" until you
# have written them. Two cells run *your* code by name, each after the tests it
# needs, under a heading that starts with **With your code** ("your keys" after Exercise 5.1, "your
# prefix tree" after the milestone). Until then they stop with `NotImplementedError`, which is
# expected; no other cell needs your code.

# %% nbgrader={"grade": false, "grade_id": "ch05_setup", "locked": true, "schema_version": 3, "solution": false}
from pathlib import Path
from typing import Hashable, Iterator, Sequence  # noqa: F401  (type hints below)

import torch

import engine.config
from engine.cache.paged import PagedKVCache
from engine.cache.prefix import Entry  # noqa: F401  (the included code names it)
from engine.checkpoint import tiny_model
from engine.checks import ch05
from engine.config import ModelConfig
from engine.course.authoring.figures import ch05 as figures
from engine.course.authoring.widgets import explorer
from engine.tools.demos import bench_prefix
from engine.serve.shared_prompt import run as prefix_demo
from engine.generate import cached_step
from engine.seeded import seeded_tokens

from engine.cache.prefix import PrefixCache as ReferencePrefixCache  # for the figures

CONFIGS = Path(engine.config.__file__).parent / "configs"  # published config.json files
KiB, MiB, GiB = 2**10, 2**20, 2**30
model = tiny_model(seed=0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.1 What a shared prompt costs
#
# Take the 70B-class model of chapter 2 and a 2,000-token system prompt that every request carries.
# Without sharing, each live request stores the prompt's keys and values again, and each new request
# runs the whole prompt through the model again before it can produce its first token. With a
# prefix cache, the prompt's full blocks are stored once, and a new request prefills only what
# follows them.

# %% nbgrader={"grade": false, "grade_id": "ch05_costs", "locked": true, "schema_version": 3, "solution": false}
config = ModelConfig.from_json(CONFIGS / "llama-3-70b.json")
per_token = config.kv_bytes_per_token(torch.float16)
system, requests, bs = 2000, 1000, 16
full_blocks = system // bs
print(f"KV per token: {per_token / KiB:.0f} KiB; "
      f"the {system:,}-token system prompt is {system * per_token / MiB:.0f} MiB")
print(f"{requests:,} live requests, each with its own copy: "
      f"{requests * system * per_token / GiB:.0f} GiB")
partial = system - full_blocks * bs
print(f"...with a prefix cache: {full_blocks} full blocks stored once, "
      f"{full_blocks * bs * per_token / MiB:.0f} MiB"
      + (f",\n   plus the {partial} tokens of the last partial block per request"
         if partial else f"\n   (the prompt fills whole blocks of {bs})"))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_demo_md", "locked": true, "schema_version": 3, "solution": false}
# The same effect at the scale of our tiny model: a few requests, each a system prompt of a few full
# blocks followed by tokens of its own, served one after another by the engine's
# `shared_prompt.run` (what `python -m engine prefix` runs) over the engine's `PagedKVCache`. Its
# prefix cache here is `OnePromptPrefix`, this section's idea cut down to one prompt: it remembers the
# full blocks of the first prompt, and a later prompt that starts with the same tokens shares those
# blocks (one more owner each) instead of prefilling them. The real `PrefixCache`, which finds any
# cached prefix, is this chapter's exercises; section 5.6 reruns this demo through yours. Every
# request's logits are compared with a cold prefill of its whole prompt.

# %% nbgrader={"grade": false, "grade_id": "ch05_demo", "locked": true, "schema_version": 3, "solution": false}
class OnePromptPrefix:
    """A prefix cache that knows one prompt: the first one's full blocks."""

    def __init__(self, cache):
        self.cache, self.tokens, self.blocks = cache, [], []

    def attach(self, seq, prompt):
        """Create seq on the remembered blocks its prompt starts with; return the
        tokens reused."""
        bs, shared = self.cache.block_size, []
        for i, block in enumerate(self.blocks):
            if list(prompt[:(i + 1) * bs]) != self.tokens[:(i + 1) * bs]:
                break
            shared.append(block)
        self.cache.create(seq)
        self.cache.share_blocks(seq, shared)
        reused = min(len(shared) * bs, len(prompt) - 1)   # the last token is prefilled
        self.cache.set_length(seq, reused)
        return reused

    def remember(self, seq, prompt):
        """The first prompt's full, computed blocks and their tokens."""
        if not self.blocks:
            full = self.cache.length(seq) // self.cache.block_size
            self.blocks = list(self.cache.tables[seq][:full])
            self.tokens = list(prompt[:full * self.cache.block_size])

    def stats(self):
        return {"cached_blocks": len(self.blocks)}


shape = dict(requests=8, system_tokens=96, own_tokens=8, block_size=16)
demo = prefix_demo(**shape, prefix_class=OnePromptPrefix)
print(f"{shape['requests']} requests: a {shape['system_tokens']}-token system prompt "
      f"({shape['system_tokens'] // shape['block_size']} full blocks of "
      f"{shape['block_size']}) + {shape['own_tokens']} tokens of their own")
print(f"prompt tokens {demo['prompt_tokens']}, prefilled {demo['tokens_prefilled']} "
      f"({1 - demo['tokens_prefilled'] / demo['prompt_tokens']:.0%} less prefill)")
print(f"blocks in use {demo['blocks_in_use']} vs {demo['blocks_without_sharing']} "
      f"without sharing; max |Δ| vs cold prefill "
      f"{demo['max_abs_diff_vs_cold_prefill']:.1e}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_growth_md", "locked": true, "schema_version": 3, "solution": false}
# The first request prefills its whole prompt and publishes the system prompt's full blocks; each
# later one attaches to them and prefills only its own tokens, into one block of its own. The figure
# follows the same workload as requests pile up, through the same `OnePromptPrefix` (the engine's
# bookkeeping of tables and blocks, no model): without sharing, prefill work and memory both grow by
# the whole prompt per request; with it, by the request's own tokens.

# %% nbgrader={"grade": false, "grade_id": "ch05_growth", "locked": true, "schema_version": 3, "solution": false}
growth = figures.sharing_growth(max_requests=16, prefix_class=OnePromptPrefix)
print(f"the first request prefills {growth['prefilled'][0]} tokens in "
      f"{growth['blocks'][0]} blocks; each later one "
      f"{growth['prefilled'][1] - growth['prefilled'][0]} tokens in "
      f"{growth['blocks'][1] - growth['blocks'][0]} block")
print(f"after 16 requests: {growth['prefilled'][-1]} tokens prefilled vs "
      f"{growth['prefilled_without'][-1]}, {growth['blocks'][-1]} blocks vs "
      f"{growth['blocks_without'][-1]}")
figures.plot_sharing_growth(growth, "96-token prompt + 8 own tokens, blocks of 16")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_key_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.2 The key of a block is the whole prefix
#
# To find a cached block again, we need a key for it. The tempting key is the block's own tokens:
# "these 16 token ids". It is wrong. The key and value of position $i$ in layer $\ell > 0$ come from
# the hidden state at $i$, and attention has mixed every earlier position into that state. Block
# $X$ after block $A$ and block $X$ after block $B$ hold the same token ids but different keys and
# values. The experiment below prefills $A + X$ and $B + X$ and compares the two copies of $X$,
# layer by layer.

# %% nbgrader={"grade": false, "grade_id": "ch05_key_demo", "locked": true, "schema_version": 3, "solution": false}
a, b, x = seeded_tokens(4, seed=1), seeded_tokens(4, seed=2), seeded_tokens(4, seed=3)
kv = PagedKVCache(model.config, num_blocks=8, block_size=4)
for seq, history in enumerate((a, b, a)):
    kv.create(seq)
    cached_step(model, kv, [seq], [history + x])
x_blocks = [kv.tables[seq][1] for seq in range(3)]     # where each copy of X lives
for layer in range(model.config.num_layers):
    pool = kv.k_pools[layer]
    after_a, after_b, again = (pool[block] for block in x_blocks)
    print(f"layer {layer}: keys of X after A vs after B differ by up to "
          f"{float((after_a - after_b).abs().max()):.3f}; after A twice: "
          f"{float((after_a - again).abs().max()):.3f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_chain_md", "locked": true, "schema_version": 3, "solution": false}
# Layer 0's keys are the same: they see only the token and its position. From layer 1 on, every key
# carries its history. So a block may be reused only by a request whose tokens agree *from position
# 0 to the end of that block*. The key must name that whole prefix.
#
# Storing the whole prefix as the key would make the key of block $i$ grow with $i$. Engines hash a
# **chain** instead: block $i$'s key is a hash of block $i-1$'s key and block $i$'s own tokens,
#
# $$
# k_0 = H(\varnothing,\ t_0,\ e_0), \qquad k_i = H(k_{i-1},\ t_i,\ e_i),
# $$
#
# so $k_i$ depends on every token up to the end of block $i$, and each key costs one hash of one
# block. $e_i$ holds the **extra keys**: whatever else changes the keys and values (an adapter id,
# say) goes into every block. A **salt** goes into the first block's $e_0$ only: since every later
# key is chained on $k_0$, two tenants with different salts share nothing. The salt matters beyond
# memory: a cache hit skips prefill, so a tenant who can time its first token could learn whether
# someone else recently sent a given prompt. A per-tenant salt closes that side channel.
#
# Only **full** blocks get a key. The last, partial block of a prompt will still be written (by the
# next tokens of the same request), and its key would name tokens that are not there yet.
#
# A 64-bit key is short enough to collide now and then, and a test may give the cache a hash under
# which everything collides. So a lookup never trusts the key alone: each cached entry keeps the
# parent key, the tokens and the extra keys it was computed from, and a hit must match all three.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_ex_keys_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 5.1 — `chain` and `matches` (3 + 2 points)
#
# The cell below is a subclass of the engine's `PrefixCache` (every method you do not write is the
# engine's). Write:
#
# * `chain(self, tokens, salt=None, extra_keys=())`: yield, for each **full** block of `tokens` in
#   order (blocks of `self.cache.block_size`), a 4-tuple `(key, parent, block_tokens, extra)`:
#   `block_tokens` the block's token ids as a tuple; `parent` the previous block's key (`None` for
#   the first); `extra` a tuple, `(salt,) + tuple(extra_keys)` for the first block and
#   `tuple(extra_keys)` for the others; and `key = self.hash_fn(parent, block_tokens, extra)`
#   (by default the engine's `block_key`, a SHA-256 of the three, cut to 64 bits).
# * `matches(entry, parent, tokens, extra)` (a static method): whether `entry`, an `Entry` found
#   under the key, was computed from exactly this parent key (`entry.parent`), these tokens
#   (`entry.tokens`) and these extra keys (`entry.extra`).
#
# The last line of the cell names your class `Keys`; the tests use that name, and the milestone
# combines it with your other pieces.

# %% nbgrader={"grade": false, "grade_id": "ch05_keys", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/prefix.py::PrefixCache.chain,matches solve=chain,matches

Keys = PrefixCache

# %% nbgrader={"grade": true, "grade_id": "ch05_test_chain", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch05.check_chain(Keys)

# %% nbgrader={"grade": true, "grade_id": "ch05_test_matches", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch05.check_matches(Keys)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_yours_keys_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your keys.** This cell needs your `chain` (Exercise 5.1). It prints the keys of
# $A + X$, $B + X$ and $A + X$ under another salt: the first blocks differ, and so does every block
# after them, although the second block is $X$ in all three.

# %% nbgrader={"grade": false, "grade_id": "ch05_yours_keys", "locked": true, "schema_version": 3, "solution": false}
yours = Keys(PagedKVCache(model.config, num_blocks=8, block_size=4))
for name, tokens, salt in (("A + X", a + x, None), ("B + X", b + x, None),
                          ("A + X, salt 't'", a + x, "t")):
    keys = [f"{key:016x}" for key, *_ in yours.chain(tokens, salt=salt)]
    print(f"{name:>16}: {' -> '.join(keys)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_attach_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.3 A request arrives: `attach`
#
# When the scheduler admits a request, it asks the prefix cache for the longest cached start of the
# prompt. `attach` walks the chain of the prompt's full blocks and looks each key up in
# `self.entries` (a dict from key to `Entry`); the first block that is missing, or found but does not
# match, ends the prefix. Nothing after a miss can be a hit: its key is chained on the missing one.
#
# The blocks found become the first entries of the new sequence's block table, each with **one more
# owner**: from that moment eviction cannot take them. The sequence's length is set to the tokens
# reused, and the scheduler prefills only the rest.
#
# **Always leave one token to prefill.** The logits that choose the first new token come from the
# prompt's *last* position, and only a forward pass produces them. When the whole prompt is cached
# (its length a multiple of the block size), `attach` still attaches every block but reports
# `len(prompt) - 1` tokens reused. The last block is then shared and only partly counted; the
# chapter-4 rule does the rest: before the last token is written, `reserve` copies that shared block.
#
# **Undoing an admission.** After `attach`, the scheduler checks that the rest of the prompt fits in
# the pool (its `admit`, which you write in chapter 7). When it does not, it undoes the admission by
# calling `detach(seq)`, and tries again a later step. `attach` also counts each lookup for
# `stats()`: a query, a hit if it reused any token, and the tokens reused. An admission that is
# undone was no lookup: `detach` must take its counts back, or a request that waits ten steps counts
# as ten hits. (The engine itself had this bug until this chapter was written.)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_ex_attach_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 5.2 — `attach` and `detach` (4 points)
#
# * `attach(self, seq, prompt, salt=None, extra_keys=())` creates `seq` in the cache with the
#   longest cached start of `prompt` already in its table, and returns how many tokens that reuses.
#   An empty prompt is a `ValueError`, raised before anything changes: no sequence created,
#   nothing counted.
#   * The reused start is a run of the prompt's blocks from the first: each is cached in
#     `self.entries` under its key from `self.chain(prompt, salt, extra_keys)` *and* passes
#     `self.matches(...)`. The first block that fails ends the run, since every later key is
#     chained on it.
#   * The new sequence (`self.cache.create`) takes those entries' blocks, each with one more owner
#     (`self.cache.share_blocks`), and its length (`self.cache.set_length`) is the tokens reused.
#   * At least one token is always left to prefill: the model needs a last position to compute the
#     next token's logits from, so a fully cached prompt reuses `len(prompt) - 1` tokens.
#   * It counts the lookup for `stats()`: `self.queries`, `self.hits` (a lookup that reused
#     anything) and `self.tokens_saved`.
# * `detach(self, seq)` undoes an `attach`, before any prefill: the sequence's blocks each lose the
#   owner it added, the cache forgets the sequence, and the three counts are what they were before.
#
# Your `attach` calls `self.chain` and `self.matches`: the class `Attach` at the end of the cell
# puts your methods on top of your `Keys`, so they are yours from Exercise 5.1, not the engine's.

# %% nbgrader={"grade": false, "grade_id": "ch05_attach", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/prefix.py::PrefixCache.attach,detach solve=attach,detach


class Attach(PrefixCache, Keys):
    """Your attach and detach, calling your chain and matches from Exercise 5.1."""

# %% nbgrader={"grade": true, "grade_id": "ch05_test_attach", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch05.check_attach(Attach, Keys)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_remember_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.4 After prefill: `remember`
#
# A block can be published once its keys and values are written and will never change: a **full**
# block whose tokens have all been through the model. The engine calls `remember(seq, tokens)` after
# every prefill chunk, so with chunked prefill some blocks of the prompt are not computed yet; only
# `tokens[:self.cache.length(seq)]` count.
#
# For block $i$ of that chain, `remember` looks the key up. If nothing is cached under it, it
# publishes the sequence's physical block `self.cache.tables[seq][i]` with `self.publish(block, key,
# parent, block_tokens, extra)`: that records the `Entry`, takes **the cache's own reference** on the
# block (so it outlives the request), and counts it as a child of its parent's entry. If the key is
# cached and matches, the block is already there (perhaps this very block, attached earlier; perhaps
# another copy computed by a request that ran at the same time): skip it. If the key is cached but
# does *not* match, it is a collision: stop, since every later key is chained on this one. And if
# the sequence's block is already published under another key, stop too: one block, one entry.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_ex_remember_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 5.3 — `remember` (3 points)
#
# `remember(self, seq, tokens, salt=None, extra_keys=())` returns how many blocks it published.
# Useful: `self.cache.tables[seq]`, `self.cache.length(seq)`, `self.chain`, `self.entries`,
# `self.matches`, `self.block_keys` (a dict from block to the key it is published under) and
# `self.publish`. As in Exercise 5.2, the class `Remember` at the end of the cell builds your
# `remember` on your `Keys`.

# %% nbgrader={"grade": false, "grade_id": "ch05_remember", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/prefix.py::PrefixCache.remember solve=remember


class Remember(PrefixCache, Keys):
    """Your remember, calling your chain and matches from Exercise 5.1."""

# %% nbgrader={"grade": true, "grade_id": "ch05_test_remember", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch05.check_remember(Remember, Attach, Keys)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_evict_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.5 When the pool runs low: eviction
#
# Cached blocks hold memory after their requests end. When a reservation fails, the scheduler
# first asks the prefix cache to give some back: `evict(blocks_wanted)` releases cached blocks until
# the pool has `blocks_wanted` free ones. Three rules decide which:
#
# * **never a block in use**: a block that some sequence still holds (reference count above 1: the
#   cache plus at least one table) stays; evicting its entry would free nothing and lose the hit;
# * **leaves before parents**: an entry that other cached entries continue (`entry.children > 0`)
#   stays until they are gone. Evicting a parent would strand its children, unreachable behind a
#   missing key but still holding memory;
# * **least recently used first** among the rest.
#
# **O(1) per evicted block.** A cache may hold a million entries while most are in use. Scanning
# the entries for an evictable one would step over every held one, every time. Instead the cache
# keeps a line of the evictable entries only, `self.lru` (an `OrderedDict` from key to entry), in
# the order they became evictable, next victim first. Membership changes exactly when an entry's
# owners or children change: the engine wraps the cache's allocator (`OwnerWatch`) so that every
# `share` and `release` of a published block calls `refresh(entry)`, which asks your
# `evictable(entry)` and puts the entry at the back of the line or takes it out. So `evict` only
# ever takes the entry at the front, the `OrderedDict`'s first item, in O(1). (Its `popitem()`
# without an argument takes the *last* item: say which end you want.)
#
# When an evicted entry's parent loses its last child, the parent becomes a leaf. It goes to the
# *front* of the line (`refresh(parent, front=True)`): its chain was the least recently used one,
# and a chain leaves the cache from its tail, like vLLM frees a request's blocks tail first.
# `python -m engine bench-prefix` measures what one eviction costs as the cache grows; after the
# exercise, a small run of it evicts with yours.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_ex_evict_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 5.4 — `evictable`, `evict` and `forget` (4 points)
#
# * `evictable(self, entry)`: whether `evict` may take the entry now, by the first two rules above.
#   The allocator's `refcount(block)` says how many owners a block has; the cache's own reference is
#   one of them.
# * `evict(self, blocks_wanted)`: forget entries from the front of the line until the pool has
#   `blocks_wanted` free blocks (`self.cache.allocator.num_free`) or the line is empty; return how
#   many it forgot.
# * `forget(self, entry)`: remove every trace of the entry and release the cache's own reference
#   on its block.
#   * Its traces are its place in the line `self.lru`, its key in `self.entries` and its block in
#     `self.block_keys`. It may have left the line already: when `evict` calls `forget`, it has just
#     taken the entry off the front.
#   * A trace left behind is a wrong answer later: once the released block is handed out again and
#     overwritten, a prompt with the old tokens would find it under its old key.
#   * Its parent, if it has one, has one child fewer, and may have just become a leaf: it goes to
#     the *front* of the line, `self.refresh(parent, front=True)`. `entry.parent` is the parent's
#     *key* (`None` for a first block), not an `Entry`.

# %% nbgrader={"grade": false, "grade_id": "ch05_evict", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/prefix.py::PrefixCache.evictable,evict,forget solve=evictable,evict,forget

Evict = PrefixCache

# %% nbgrader={"grade": true, "grade_id": "ch05_test_evict", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch05.check_evict(Evict, Remember, Attach, Keys)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_bench_md", "locked": true, "schema_version": 3, "solution": false}
# **What one eviction costs.** A small run of `python -m engine bench-prefix`: caches of growing size,
# half their entries held by a sequence, evicting through the engine's `PrefixCache` (in a student
# edition of the engine, with the methods your notebook defines: until you have written them, the cell
# stops with "not written yet"). The time per evicted block should not grow with the cache.

# %% nbgrader={"grade": false, "grade_id": "ch05_bench", "locked": true, "schema_version": 3, "solution": false}
for entries in (1_000, 10_000, 30_000):
    ns = bench_prefix.time_evict(entries, rounds=3)
    print(f"{entries:>7,} entries, half held: {ns / 1000:.1f} µs per evicted block")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_milestone_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.6 The milestone: your prefix cache in the engine
#
# The next check builds one `PrefixCache` from your four classes and plugs it into the engine's
# scheduler over the engine's `PagedKVCache`. First it reruns the demo of section 5.1 through it,
# which must print the same numbers as there (tokens prefilled, blocks in use). Then it serves a
# ragged batch (prompts of $b-1$, $b$, $b+1$ and $2b+1$ tokens sharing one start, and $X$ after $A$
# and after $B$), then a second wave that hits the cache, fully cached block-aligned prompts
# included, each decoding 20 tokens in a pool small enough that the scheduler must evict cached
# blocks and preempt requests. Every logit must equal a from-scratch run within $10^{-5}$.

# %% nbgrader={"grade": true, "grade_id": "ch05_test_milestone", "locked": true, "points": 6, "schema_version": 3, "solution": false}
ch05.check_prefix_cache_in_engine(Keys, Attach, Remember, Evict)
### BEGIN HIDDEN TESTS
ch05.check_prefix_cache_in_engine(Keys, Attach, Remember, Evict, block_size=3, seed=1)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_explorer_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.7 Watching the prefix tree
#
# The cached entries form a tree: each chain of a prompt's blocks hangs off its parent, and prompts
# that start the same way share their first nodes. The explorer replays a short script through the
# engine's `PrefixCache` (blocks of 4, bookkeeping only): four requests arrive and finish, three of
# them after a two-block system prompt (`sys-1`, `sys-2`), two of those (R0 and R3) with the same own
# block `a`, and the pool runs low three times. Orange blocks are held by sequences (and by how many),
# green ones are in the eviction line (with their place in it), gray ones are cached but still have
# a child. Move the step: watch `a` leave the line when R3 attaches to it, `b` go before `t` because
# it was released earlier, and `sys-2` join the line, at its front, the moment its last child is
# evicted.

# %% nbgrader={"grade": false, "grade_id": "ch05_explorer", "locked": true, "schema_version": 3, "solution": false}
walk = figures.prefix_tree_walk(ReferencePrefixCache)


def show_step(step=6):
    """The prefix tree after `step` events of the script."""
    figures.draw_prefix_tree(walk[step], step)


# A static view first; in JupyterLab, the control above the picture redraws it.
explorer(show_step, step=(0, len(walk) - 1, 6))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_yours_walk_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your prefix tree.** This cell needs all four exercises. It replays the same
# script through your combined cache and compares every step with the engine's: the entries, who
# holds them, the eviction line and the free blocks (block ids may differ).

# %% nbgrader={"grade": false, "grade_id": "ch05_yours_walk", "locked": true, "schema_version": 3, "solution": false}
your_walk = figures.prefix_tree_walk(ch05.combine(Keys, Attach, Remember, Evict))
pairs = zip(figures.comparable(your_walk), figures.comparable(walk))
same = [mine == ref for mine, ref in pairs]
print(f"your cache matches the engine's at {sum(same)} of {len(same)} steps"
      + ("" if all(same) else f"; first difference at step {same.index(False)}"))
figures.draw_prefix_tree(your_walk[-3], len(your_walk) - 3)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 5.8 Check your understanding
#
# R1 and R2 are graded automatically: put your answer in the cell under the question. Q3 to Q5 are
# answered in a few sentences; your instructor grades them by hand.
#
# **R1 (1 point).** Twenty requests, served one after another, share a 200-token system prompt and
# add 10 tokens each; blocks of 16. How many prompt tokens are prefilled in all, with a prefix
# cache? Set `r1_answer` to a number.

# %% nbgrader={"grade": false, "grade_id": "ch05_r1", "locked": false, "schema_version": 3, "solution": true}
r1_answer = None
### BEGIN SOLUTION
r1_answer = 210 + 19 * (210 - 200 // 16 * 16)
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch05_test_r1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch05.check_review_prefill(r1_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_r2_md", "locked": true, "schema_version": 3, "solution": false}
# **R2 (1 point).** A request is running on a cached system prompt; two finished requests left
# their own last blocks in the cache. The pool runs low. Which block does `evict` take first? Set
# `r2_answer` to one letter.
#
# * (a) the first block of the system prompt's chain
# * (b) the last full block of the running request's prompt
# * (c) the leaf of the finished request that let go of its blocks first
# * (d) the leaf of the finished request that let go of its blocks last

# %% nbgrader={"grade": false, "grade_id": "ch05_r2", "locked": false, "schema_version": 3, "solution": true}
r2_answer = None
### BEGIN SOLUTION
r2_answer = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch05_test_r2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch05.check_review_order(r2_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_q3_md", "locked": true, "schema_version": 3, "solution": false}
# **Q3 (2 points).** Why is the key of a cached block the whole prefix up to the end of the block,
# and not just the block's own tokens? Name what would go wrong with the shorter key, in both of
# its forms: when a lookup checks only the tokens, and when it also checks the parent.

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch05_q3", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) a block's keys and values depend on every earlier token: from the second layer
# on, attention has mixed the whole history into each position, so the same token ids after a
# different history give different K/V (layer 0 alone agrees). The key must name everything from
# position 0 to the end of the block; a chained hash does that at the cost of one hash per block.
# (1 point) With a key of the block's own tokens and no further check, a request would attach to K/V
# computed for another history and produce wrong logits. With the parent still checked, nothing wrong
# is shared, but $X$ after $A$ and $X$ after $B$ compete for one key: one of them cannot be published
# (or overwrites the other), so one of the two stops hitting.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** Why does `attach` always leave at least one prompt token to prefill, even when
# every block of the prompt is cached? What happens to the last cached block in that case?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch05_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) the first new token is sampled from the logits at the prompt's last position, and
# a cache holds keys and values, not logits: only a forward pass over that position produces them. So
# at least the last prompt token must run. (1 point) The prompt's last block is attached (shared)
# but counted only up to its second-to-last token; when the last token is written, the block is
# shared (refcount above 1), so `reserve` copies it first (copy-on-write) and the cached original
# stays intact for other requests.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_q5_md", "locked": true, "schema_version": 3, "solution": false}
# **Q5 (2 points).** A provider serves many customers from one engine with prefix caching on. Give
# one reason to salt the cache per customer, and what the salt costs.

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch05_q5", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) a cache hit skips prefill and so shortens the time to the first token; a customer
# who measures it precisely can probe whether some prompt (say, a document or someone else's message)
# is in the cache right now, i.e. whether another customer recently sent it: a timing side channel.
# With a per-customer salt in the first block's key, other customers' blocks are never hits. (1 point)
# The cost: prompts that really are identical across customers (a public system prompt, common tool
# definitions) are computed and stored once per customer instead of once in all, so the hit rate
# and the memory saved drop.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch05_deeper", "locked": true, "schema_version": 3, "solution": false}
# ## 5.9 Stretch exercises (ungraded) and going deeper
#
# ★ **Hit rate against block size.** With `figures.sharing_growth`, vary the block size from 4 to
# 64 for a 100-token system prompt. Prefill saved drops as blocks grow: by how much, and why? (Only
# full blocks are shared, so up to $b - 1$ shared tokens are recomputed per request.)
#
# ★★ **Exact LRU.** Our line orders entries by when they became evictable and sends a parent to the
# front when its last child goes. Build a workload where that differs from evicting by last use, and
# measure the hit rate of both on it. What would exact LRU over leaves cost per eviction?
#
# ★★★ **A radix tree.** SGLang keeps cached prefixes in a radix tree of token sequences rather than a
# hash table of blocks, so it can match prefixes at token granularity and schedule requests to
# maximize hits. Sketch what `attach` and `evict` become on such a tree.
#
# **Going deeper**
#
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): block sharing across sequences, the basis of prefix caching in
#   vLLM.
# * Zheng et al., [*SGLang: Efficient Execution of Structured Language Model Programs*](https://arxiv.org/abs/2312.07104) (2024):
#   RadixAttention, a radix tree over cached prefixes and cache-aware scheduling.
# * vLLM's [`vllm/v1/core/block_pool.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/block_pool.py) and
#   [`kv_cache_manager.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_manager.py): block hashes chained on the
#   parent with extra keys and a per-request cache salt, a doubly linked free queue that evicts in
#   O(1), and a full hit that still recomputes the last token.
# * [GPU Mode](https://github.com/gpu-mode/lectures) lecture 35 (SGLang) and lecture 40
#   (FlashInfer), on serving systems built around shared prefixes.
#
# ## Summary
#
# * A block's keys and values depend on its whole history, so its key is a hash chained on its
#   parent's key, its tokens and its extra keys, with a tenant salt in the first block; a hit is
#   verified against what the entry was computed from.
# * `attach` shares the longest chain of cached full blocks and always leaves one prompt token to
#   prefill; `detach` undoes an admission and its count.
# * `remember` publishes only full, computed blocks, with the cache's own reference.
# * `evict` takes the front of a line of evictable leaves: least recently released first, parents
#   after their children, never a block in use, O(1) per block.
#
# **Next.** Chapter 6 writes the attention kernel that reads the block tables directly: a Triton
# paged-decode kernel.
