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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_intro", "locked": true, "schema_version": 3, "solution": false}
# # 4. Copy-on-write fork: parallel sampling and beam search
#
# Ask a model for four answers to one prompt, or run a beam search of width four, and you get several
# sequences that start with the same tokens. Their keys and values for those tokens are identical:
# position $i$ depends only on tokens $0..i$, and inference is deterministic. Storing them four times
# is pure waste. The block table from chapter 2 makes it cheap not to: two tables can name the same
# physical block, and the allocator's reference count records how many do.
#
# Sharing is easy while everyone only reads. The difficulty is the first *write*: the sequences
# diverge, and a token written into a shared block would silently change the history of every other
# sequence that reads that block. The answer is the one operating systems give after `fork()`:
# **copy on write**. A block stays shared until someone is about to write into it; that writer gets a
# private copy first.
#
# In this chapter you write the two methods of the paged cache that do this:
#
# * `fork(parent, child)` — the child starts with the parent's whole history, sharing every block;
#   no block is allocated and no key or value is copied;
# * `copy_on_write(seq, index)` — if logical block `index` of `seq` is shared, give `seq` its own copy.
#
# The milestone check forks sequences, lets parent and children continue with *different* tokens, and
# requires every one of them to produce exactly the logits of a from-scratch run of its own tokens.
#
# **Which cells need your code.** Figures and explorers use the engine's own `PagedKVCache`. The cost
# figure of section 4.1 runs before you have written anything. Those from section 4.4 on fork through
# the engine's cache; in a student edition of the engine that fork is the one your notebook defines,
# so there they stop with "not written yet" until Exercise 4.1 is done. Three small cells run *your*
# code by name, each after the tests of the exercise it needs, under a heading that starts with
# **With your code** ("your fork, step by step" and "your cache draws the same samples" need
# Exercise 4.1, "your formula" needs Exercise 4.2). Until that exercise is done they stop with
# `NotImplementedError`, which is expected.

# %% nbgrader={"grade": false, "grade_id": "ch04_setup", "locked": true, "schema_version": 3, "solution": false}
import math
from pathlib import Path

import torch

import engine.cache.paged
import engine.config
from engine.cache.slots import blocks_needed
from engine.checkpoint import tiny_model
from engine.checks import ch04
from engine.config import ModelConfig
from engine.course.authoring.figures import ch04 as figures
from engine.course.authoring.widgets import explorer
from engine.generate import cached_step, scratch_logits
from engine.sampling import SamplingParams, sample
from engine.seeded import seeded_tokens

ReferenceCache = engine.cache.paged.PagedKVCache   # the engine's, for the figures

CONFIGS = Path(engine.config.__file__).parent / "configs"   # published config.json
KiB, MiB, GiB = 2**10, 2**20, 2**30
model = tiny_model(seed=0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.1 What sharing saves
#
# Take the 70B-class model of chapter 2 and ask for 4 completions of a 2,000-token prompt. Without
# sharing, each completion stores its own copy of the prompt's K and V; with sharing, the prompt is
# stored once and each completion pays only for the tokens it generates (plus, as we will see, one
# copied block). And when a beam search's hypotheses part ways in the middle of a block, the price of
# the divergence is one block copy, never the whole history.

# %% nbgrader={"grade": false, "grade_id": "ch04_costs", "locked": true, "schema_version": 3, "solution": false}
llama_70b = ModelConfig.from_json(CONFIGS / "llama-3-70b.json")
per_token = llama_70b.kv_bytes_per_token(torch.float16)
prompt_tokens, samples, bs = 2000, 4, 16
unshared = samples * prompt_tokens * per_token
shared = prompt_tokens * per_token
print(f"KV per token: {per_token / KiB:.0f} KiB; the prompt fills "
      f"{math.ceil(prompt_tokens / bs)} blocks of {bs}")
print(f"{samples} samples, prompt stored {samples} times: {unshared / GiB:.2f} GiB")
print(f"{samples} samples, prompt stored once:    {shared / MiB:.0f} MiB "
      f"({unshared / shared:.1f}x less, {(unshared - shared) / GiB:.2f} GiB saved)")
diverge_slots = 10
print(f"a beam diverging in a block that holds {diverge_slots} of its {bs} tokens "
      f"copies the whole block:\n  "
      f"{bs * per_token / MiB:.0f} MiB (its {diverge_slots} used slots are "
      f"{diverge_slots * per_token / MiB:.1f} MiB of it), however long the beam is")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_rules_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.2 The rules of sharing
#
# Everything rests on the allocator's invariant from chapter 2: *the reference count of a block is the
# number of tables that name it.* Three rules keep it true and keep every sequence's history intact.
#
# **Fork.** `fork(parent, child)` creates the child with a *copy of the parent's table* (a new list
# with the same block ids), the parent's length, and one `share` per block. Afterwards every block of
# the parent has one more owner. Nothing is allocated, nothing is copied in the pools.
#
# **Reads never check.** Attention walks a table block by block whether the blocks are shared or not.
# A shared block is read-only by construction, so any number of sequences may read it at once. All the
# care goes into the write path, which keeps the hot loop, attention, free of any sharing logic.
#
# **Copy before a write.** Before `n` new tokens are written at positions $L, \dots, L+n-1$ of a
# sequence with table $T$, every existing entry they land in,
#
# $$
# i \in \left[\lfloor L/b \rfloor,\; \min\left(|T|,\ \lceil (L+n)/b \rceil\right)\right),
# $$
#
# is checked. If $\mathrm{refcount}(T[i]) > 1$, the writer allocates a fresh block, copies the old
# block's keys and values into it *in every layer*, releases its reference to the old block, and
# points $T[i]$ at the copy. The other owners keep the original, untouched. A block with count 1 is
# private and is written in place.
#
# History never changes, so full blocks are never written again: in practice the only block that gets
# copied is the *partially filled last block* that a fork shares. That is why a fork of a 40-token
# prompt in blocks of 16 costs nothing at first and one block per child at its first token.
#
# **How many blocks?** Take $n$ samples of a prompt of $L$ tokens, each having generated $g \ge 1$
# tokens. The $\lfloor L/b \rfloor$ full prompt blocks stay shared. Every sample ends up with its own
# copy of the partial block (the first $n - 1$ writers copy it; the last finds it private again) and
# its own new blocks. So
#
# $$
# \begin{aligned}
# \text{blocks}_{\text{shared}} &= \lfloor L/b \rfloor + n\left(\lceil (L+g)/b \rceil - \lfloor L/b \rfloor\right),\\
# \text{blocks}_{\text{unshared}} &= n \lceil (L+g)/b \rceil .
# \end{aligned}
# $$
#
# **Reserve first, then copy.** `reserve(seq, n)` runs before the forward pass. It counts the copies
# *and* the new blocks it will need, raises `OutOfBlocks` if the pool cannot cover all of them, and
# only then copies and allocates. A reservation that failed halfway would leave a sequence with some
# blocks copied and others not, and the scheduler could not simply retry.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_ex_cache_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.3 Fork and copy-on-write in the cache
#
# ### Exercise 4.1 — `fork` and `copy_on_write` (2 + 3 + 2 + 5 points)
#
# The next cell is a subclass of the engine's `PagedKVCache` (the cache you built in chapter 3) that
# defines only `fork` and `copy_on_write`; every other method is the engine's, so this works whether or
# not you finished chapter 3. The engine's `reserve` already calls `copy_on_write(seq, index)` for each
# index of `self.shared_writes(seq, n)`, the existing table entries the new tokens write into while
# another table names the block, after checking that the pool can pay for every copy and every new
# block.
#
# Useful pieces: `self.table(seq)` (the block table, a list of block ids; a `KeyError` for an unknown
# sequence), `self.tables[seq]`, `self.lengths[seq]`, `self.create(seq)` (registers an empty sequence,
# a `ValueError` if it exists), `self.allocator` (`allocate(n) -> list[int]`, `share(block)`,
# `release(block)`, `refcount(block)`), and the pools `self.k_pools[layer]`, `self.v_pools[layer]`,
# each `[num_blocks, kv_heads, block_size, head_dim]`, so `pool[block]` is one whole block of one layer.
#
# * `fork(parent, child)`: the child gets a *new list* with the parent's block ids and the parent's
#   length, and every one of those blocks one more owner.
# * `copy_on_write(seq, index)`: if block `table[index]` has more than one owner, allocate a fresh
#   block, copy the old block into it in every K and V pool, release the old block, and set
#   `table[index]` to the fresh one; a block with one owner is left alone.

# %% nbgrader={"grade": false, "grade_id": "ch04_cache", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/paged.py::PagedKVCache.fork,copy_on_write solve=fork,copy_on_write

# %% nbgrader={"grade": true, "grade_id": "ch04_test_fork_shares", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch04.check_fork_shares(PagedKVCache)

# %% nbgrader={"grade": true, "grade_id": "ch04_test_copy_on_write", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch04.check_copy_on_write(PagedKVCache)

# %% nbgrader={"grade": true, "grade_id": "ch04_test_block_counts", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch04.check_fork_block_counts(PagedKVCache)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_diverge_md", "locked": true, "schema_version": 3, "solution": false}
# ### The milestone: fork, then diverge
#
# The next check is the one that matters. It prefills two sequences, one ending in the middle of a
# block and one exactly on a block boundary, forks them, and lets parents and children continue with
# different tokens for several steps. Along the way it frees a parent while its children live on,
# forks a fork, and finally appends several tokens at once into a shared partial block. After every
# step, every sequence's logits must equal, within $10^{-5}$, a from-scratch run of that sequence's own
# tokens. If one write lands in a block that another sequence still reads, that other sequence's
# logits move, and the message names the sequence and the first position that differs.

# %% nbgrader={"grade": true, "grade_id": "ch04_test_diverge", "locked": true, "points": 5, "schema_version": 3, "solution": false}
ch04.check_fork_then_diverge(PagedKVCache)
### BEGIN HIDDEN TESTS
ch04.check_fork_then_diverge(PagedKVCache, block_size=3, seed=1)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_walk_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.4 Watching a fork
#
# The cell below replays the chapter's running example with the engine's cache: a 40-token prompt in
# blocks of 16, forked four ways, then each fork writes one token. It prints the tables and reference
# counts at each stage and checks each fork against a from-scratch run; the figure shows the final
# tables, with shared blocks in orange and private blocks in blue. It runs before you have written
# anything; the cell after it replays the same example with your cache.

# %% nbgrader={"grade": false, "grade_id": "ch04_walk", "locked": true, "schema_version": 3, "solution": false}
def describe(cache, seqs):
    for seq in seqs:
        table = cache.tables[seq]
        counts = [cache.allocator.refcount(b) for b in table]
        print(f"  sequence {seq}: table {table}, refcounts {counts}")
    print(f"  blocks in use: {cache.blocks_in_use}")


def sharing(cache, seqs):
    """Sharing, whatever the block ids: each table's refcounts, the blocks in use."""
    counts = [[cache.allocator.refcount(b) for b in cache.tables[seq]] for seq in seqs]
    return counts, cache.blocks_in_use


children = [1, 2, 3, 4]
prompt = seeded_tokens(40, seed=0)
firsts = [[100 + c] for c in children]


def fork_walk(cache_class):
    """The running example in a `cache_class`: prefill, 4 forks, a token per fork."""
    cache = cache_class(model.config, num_blocks=32, block_size=16)
    cache.create(0)
    cached_step(model, cache, [0], [prompt])
    print("after the 40-token prefill:")
    describe(cache, [0])
    for child in children:
        cache.fork(0, child)
    print("after 4 forks:")
    describe(cache, [0] + children)
    got = cached_step(model, cache, children, firsts)
    print("after each fork writes one token:")
    describe(cache, [0] + children)
    want = scratch_logits(model, [prompt + t for t in firsts])
    gaps = [f"{float((g - w[-1:]).abs().max()):.1e}" for g, w in zip(got, want)]
    print("max |Δ| vs from scratch per fork:", gaps)
    counts = ch04.fork_block_counts(cache_class)
    print(f"summary: {counts['parent_blocks']} parent blocks, "
          f"{counts['new_blocks_after_forks']} new after forking, "
          f"{counts['new_blocks_after_each_fork_writes_a_token']} new after each fork "
          f"writes a token\n  ({counts['blocks_for_independent_copies']} for four "
          "independent copies of the prompt)")
    return cache


cache = fork_walk(ReferenceCache)
figures.draw_tables(cache, [0] + children,
            "physical blocks per table: orange = shared, blue = private")
engine_sharing = sharing(cache, [0] + children)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_yours_walk_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your fork, step by step.** This cell needs your `fork` and `copy_on_write`
# (Exercise 4.1); until you have written them, it stops with `NotImplementedError`. It replays the same
# example with your `PagedKVCache` and compares the sharing (each table's reference counts and the
# blocks in use) with the engine's. The block ids themselves may differ if your copy-on-write takes
# blocks in another order; that is allowed.

# %% nbgrader={"grade": false, "grade_id": "ch04_yours_walk", "locked": true, "schema_version": 3, "solution": false}
your_cache = fork_walk(PagedKVCache)
same = sharing(your_cache, [0] + children) == engine_sharing
print("the same sharing as the engine's cache:", same)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_ex_count_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 4.2 — counting shared blocks (2 points)
#
# Write `shared_blocks(prompt_len, n, generated, block_size)`: how many blocks a paged cache holds for
# `n` samples forked from one prompt of `prompt_len` tokens, after each sample has generated
# `generated` tokens (section 4.2 has the formula for `generated >= 1`; think about `generated == 0`
# separately). The check compares your answer with a real `PagedKVCache` on ten cases, including a
# prompt that ends exactly on a block boundary.

# %% nbgrader={"grade": false, "grade_id": "ch04_shared_blocks", "locked": false, "schema_version": 3, "solution": true}
def shared_blocks(prompt_len, n, generated, block_size):
    """Blocks held by n forked samples of a prompt, each with `generated` new tokens."""
    ### BEGIN SOLUTION
    if generated == 0:
        return -(-prompt_len // block_size)   # everyone still shares every prompt block
    full = prompt_len // block_size           # never written again: shared forever
    return full + n * (-(-(prompt_len + generated) // block_size) - full)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ch04_test_shared_blocks", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch04.check_shared_blocks(shared_blocks)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_plot_md", "locked": true, "schema_version": 3, "solution": false}
# The engine's cache can show the whole curve. The figure follows 4 samples of the 40-token prompt as
# they generate up to 100 tokens each, counting the blocks a real `PagedKVCache` holds at every step
# (`ch04.simulate_forks`, the bookkeeping the check compares your formula with): the shared line jumps
# once at the first token (the partial block is copied for each sample), then both lines climb by $n$
# blocks every 16 tokens, and the gap between them, the prompt's full blocks stored once instead of $n$
# times, stays constant. It runs before you have written `shared_blocks`; the cell after it compares
# your formula with this curve.

# %% nbgrader={"grade": false, "grade_id": "ch04_plot", "locked": true, "schema_version": 3, "solution": false}
L, n, b = 40, 4, 16
steps = list(range(0, 101))
with_sharing = [ch04.simulate_forks(L, n, g, b).blocks_in_use for g in steps]
without = [n * blocks_needed(L + g, b) for g in steps]
print(f"after 1 token: {with_sharing[1]} blocks shared vs {without[1]} unshared; "
      f"after 100 tokens: {with_sharing[100]} vs {without[100]}")
print(f"gap {without[100] - with_sharing[100]} blocks "
      f"= {n - 1} extra copies of the prompt's {L // b} full blocks")
figures.plot_blocks_in_use(steps, without, with_sharing, samples=n, prompt_len=L,
                           block_size=b)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_yours_count_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your formula.** This cell needs your `shared_blocks` (Exercise 4.2); until you have
# written it, it stops with `NotImplementedError`. It evaluates your formula at every point of the
# curve above and lists the points where it disagrees with the engine's cache (none, once it is right).

# %% nbgrader={"grade": false, "grade_id": "ch04_yours_count", "locked": true, "schema_version": 3, "solution": false}
yours = [shared_blocks(L, n, g, b) for g in steps]
wrong = [(g, yours[g], with_sharing[g]) for g in steps if yours[g] != with_sharing[g]]
print(f"your shared_blocks agrees with the engine's cache at {len(steps) - len(wrong)} "
      f"of {len(steps)} points")
for g, mine, engine_count in wrong[:3]:
    print(f"  after {g} generated tokens: yours {mine}, the engine's {engine_count}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_explorer_md", "locked": true, "schema_version": 3, "solution": false}
# ### A fork explorer
#
# Pick a prompt length, a number of samples and how many tokens each has generated; the explorer runs
# the cache's bookkeeping (`reserve`, `fork`, and copy-on-write, without the model) and draws every
# table. Try a prompt that ends exactly on a block boundary: nothing is ever copied. Try a block size
# of 64 with a short prompt: the whole prompt is one partial block, and every sample but the last to
# write copies all of it (the last writer is its only owner by then and keeps the original).
# The explorer uses the engine's own cache, so it works even before your methods pass. It draws every
# state its controls can reach when the cell runs, so the controls work in the book too; the grader
# draws only the running example.

# %% nbgrader={"grade": false, "grade_id": "ch04_explorer", "locked": true, "schema_version": 3, "solution": false}
def explore_fork(prompt_len=40, samples=4, generated=1, block_size=16):
    """The engine's cache, bookkeeping only (reserve, fork, copy-on-write), drawn."""
    sim = ch04.simulate_forks(prompt_len, samples, generated, block_size)
    unshared = samples * blocks_needed(prompt_len + generated, block_size)
    print(f"prompt {prompt_len}, {samples} samples, {generated} token(s) each, "
          f"blocks of {block_size}: {sim.blocks_in_use} blocks in use vs {unshared} "
          "unshared")
    figures.draw_tables(sim, list(range(samples)), "orange = shared, blue = private")


# Every state precomputed, swapped in the browser (engine/course/authoring/widgets.py).
explorer(explore_fork, prompt_len=([16, 40, 64], 40), samples=([2, 4], 4),
         generated=([0, 1, 9], 1), block_size=([4, 16, 64], 16))


# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_sampling_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.5 Parallel sampling
#
# Parallel sampling ($n > 1$ in vLLM's API) is the easy customer of fork: prefill the prompt once,
# fork it $n - 1$ times, then give each sample its own random generator and let all $n$ decode in one
# batch. The samples never merge again, so no table surgery is needed beyond what `reserve` does.
# The cell draws 4 samples with seeds 0 to 3 through the engine's cache, then recomputes each sample
# from scratch and compares logits at every step. It runs before you have written anything; the graded
# test after it, and the cell after that, put your cache in its place.

# %% nbgrader={"grade": false, "grade_id": "ch04_sampling", "locked": true, "schema_version": 3, "solution": false}
def sample_n(cache, prompt, seeds, steps, temperature=1.0):
    """One prefill, a fork per extra sample, then each sample draws with its own seeded
    generator.

    Returns each sample's tokens and the logits the cache produced at each of its steps.
    """
    cache.create(0)
    last = cached_step(model, cache, [0], [prompt])[0][-1]
    for s in range(1, len(seeds)):
        cache.fork(0, s)
    params = [SamplingParams(temperature=temperature, seed=seed) for seed in seeds]
    generators = [p.generator() for p in params]
    outputs = [[] for _ in seeds]
    history = [[last] for _ in seeds]
    for _ in range(steps):
        tokens = [sample(history[s][-1], params[s], generators[s])
                  for s in range(len(seeds))]
        rows = cached_step(model, cache, list(range(len(seeds))), [[t] for t in tokens])
        for s, (token, row) in enumerate(zip(tokens, rows)):
            outputs[s].append(token)
            history[s].append(row[-1])
    return outputs, history


sampling_prompt = seeded_tokens(9, seed=6)
sampling_cache = ReferenceCache(model.config, num_blocks=32, block_size=4)
outputs, history = sample_n(sampling_cache, sampling_prompt, seeds=[0, 1, 2, 3],
                            steps=8)
fresh = scratch_logits(model, [sampling_prompt + out for out in outputs])
print("max |Δ| vs from scratch over all steps, and the tokens drawn:")
for s, out in enumerate(outputs):
    diff = (torch.stack(history[s]) - fresh[s][len(sampling_prompt) - 1:]).abs().max()
    print(f"sample {s} (seed {s}): {float(diff):.1e}  {out}")
first = sampling_cache.tables[0][0]
print(f"blocks in use: {sampling_cache.blocks_in_use} "
      f"({4 * blocks_needed(len(sampling_prompt) + 8, 4)} for 4 unshared copies); "
      f"the prompt's first block {first} has refcount "
      f"{sampling_cache.allocator.refcount(first)}")

# %% nbgrader={"grade": true, "grade_id": "ch04_test_parallel_sampling", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch04.check_parallel_sampling(PagedKVCache)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_yours_sampling_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your cache draws the same samples.** This cell needs your `fork` and
# `copy_on_write` (Exercise 4.1); until you have written them, it stops with `NotImplementedError`. It
# draws the same 4 samples through your `PagedKVCache`: with the same seeds and the same logits, every
# sample must pick exactly the engine's tokens.

# %% nbgrader={"grade": false, "grade_id": "ch04_yours_sampling", "locked": true, "schema_version": 3, "solution": false}
your_outputs, _ = sample_n(PagedKVCache(model.config, num_blocks=32, block_size=4),
                           sampling_prompt, seeds=[0, 1, 2, 3], steps=8)
print("your cache draws the engine's samples:", your_outputs == outputs)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_beam_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.6 Beam search
#
# Beam search is the demanding customer. After every step it keeps the $k$ best hypotheses, and a
# survivor may be the child of any current beam, several survivors may share a parent, and some
# parents have no surviving child. With a paged cache each step is pure table work:
#
# 1. for each surviving (parent, token) pair: the parent's first survivor keeps the parent's sequence,
#    every further one is a `fork(parent, new_id)`; a parent with no survivor is `free`d, which drops
#    one reference from each of its blocks;
# 2. `reserve` the next token for every survivor. Siblings that share a partial block copy it on this
#    write (the last one to write finds it private and writes in place);
# 3. run one batched forward step over the survivors.
#
# Full blocks that all hypotheses agree on stay shared for the whole search, and a divergence never
# costs more than one block per beam. Getting the counting wrong here is not a crash: it is a beam
# whose history was overwritten by a sibling, which then scores and outputs the wrong tokens. The
# stretch exercise below asks you to build it and prove it correct the same way the checks do.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 4.7 Check your understanding
#
# Answer each question in the cell under it. Your instructor grades these by hand.
#
# **Q1 (2 points).** When does copy-on-write copy a block, and which block of a sequence is it
# usually? Why that one?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch04_q1", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# It copies a block only when a sequence is about to write into it and its reference count is above 1,
# i.e. another table still names it. Usually it is the partially filled last block of a sequence that
# was just forked: the full blocks before it hold finished history, which is never written again, so
# they stay shared forever; the new token goes into the first free slot of the shared partial block.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_q2_md", "locked": true, "schema_version": 3, "solution": false}
# **Q2 (2 points).** A 40-token prompt (blocks of 16) is forked 4 ways. Why do the forks cost 0 new
# blocks, and why does each fork's first token cost exactly one block, not three?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch04_q2", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# A fork copies the table and increments reference counts; it allocates nothing. The prompt occupies
# two full blocks and one block holding 8 of 16 tokens. Token 40 is written at offset 8 of that third
# block, which is shared, so the writer copies that block and only that one. The two full blocks are
# not written and stay shared by all five tables.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_q3_md", "locked": true, "schema_version": 3, "solution": false}
# **Q3 (2 points).** `reserve` computes how many copies and new blocks it needs and raises
# `OutOfBlocks` *before* doing any copy. What could go wrong if it copied block by block and raised
# when the pool ran out?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch04_q3", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# The sequence would be left half-prepared: some shared blocks already replaced by copies (consuming
# free blocks and changing tables and refcounts), others not, and no new blocks. The scheduler sees an
# exception and assumes nothing happened; it may preempt another sequence and retry, but the blocks
# taken by the partial work are held without being accounted for, and a retry computes a different
# plan. All-or-nothing keeps a failure free of side effects, so it can be retried or handled cleanly.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** Why does the attention kernel never need to know whether a block is shared? What
# would change if it had to check?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch04_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Because sharing only matters for writes, and writes go through `reserve`, which copies a shared block
# before anyone writes into it. By the time attention runs, every block a sequence reads holds exactly
# that sequence's history, shared or not, so reading it needs no check. If attention had to check, the
# hottest loop of the engine would pay a reference-count lookup and a branch per block for every head
# and every step, for a decision that the write path already made once.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch04_stretch", "locked": true, "schema_version": 3, "solution": false}
# ## 4.8 Stretch exercises (ungraded)
#
# ★★ **Beam search.** Write `beam_search(model, cache, prompt, width, max_tokens)` with the recipe of
# section 4.6: score hypotheses by summed log-probabilities, fork survivors, free the losers, and stop
# after `max_tokens` generated tokens. Verify it the way the checks do: after every step, each live
# beam's last logits must match `scratch_logits(model, [prompt + beam_tokens])`. Then track
# `cache.blocks_in_use` per step and compare its peak with `width` independent caches. How often does
# copy-on-write fire per step, and on which blocks? The engine's version, to compare with once you have
# tried, is `engine.serve.beam.beam_search(model, cache, prompt, width, max_tokens, first_seq_id=0)`:
# it takes sequence ids from `first_seq_id` on, breaks ties by beam order then token id, frees every
# sequence it created before it returns, and returns a `BeamResult` with `beams` (best first, each a
# `Beam` with `seq_id`, `tokens` and `score`), `peak_blocks` (blocks in use at the worst step) and
# `unshared_blocks` (what `width` private copies of the longest hypothesis would take).
#
# ★★ **Forks under memory pressure.** Chapter 7's engine prefills a request with `n > 1` once and
# forks it `n - 1` times (its Exercise 7.4). Before you get there, predict with this chapter's
# bookkeeping alone: when a pool is too small for all `n` samples, which of their blocks are still
# shared when the first sample must give its memory back, and how many blocks does that free? Then
# check: fork the samples in a small `PagedKVCache`, let each write a few tokens, free one, and compare
# `allocator.num_free` before and after.
#
# ★ **Truncate after a fork.** `truncate(seq, length)` rolls back rejected draft tokens in speculative
# decoding. Fork a sequence, truncate the child into the middle of a block that both still share, then
# let both continue. Which block is copied, and when? Check both against from-scratch runs.
#
# ## Summary
#
# * A fork copies a block table and adds one reference to each block: no allocation, no data copied.
# * Reads never care about sharing; a write into a block with refcount > 1 first copies that block,
#   in every layer, releases the old reference and repoints only the writer's table.
# * In practice only the shared, partially filled last block is ever copied, so $n$ samples of a long
#   prompt cost one copy of its full blocks plus about one block per sample.
#
# **Going deeper.**
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): parallel sampling and beam search share blocks through reference
#   counts and copy-on-write, as in this chapter.
# * vLLM's [`vllm/v1/core/block_pool.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/block_pool.py) and
#   [`kv_cache_manager.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_manager.py): reference-counted blocks in a
#   production engine.
# * Zheng et al., [*SGLang: Efficient Execution of Structured Language Model Programs*](https://arxiv.org/abs/2312.07104) (2024):
#   RadixAttention shares cached blocks across requests through a prefix tree (chapter 5 builds a
#   simpler prefix cache).
# * `fork()` with copy-on-write pages in Unix: the operating-system idea this chapter borrows.
#
# **Next.** Chapter 5 shares blocks *across requests*: a prefix cache keyed by chained block
# hashes, with LRU eviction of blocks nobody uses.
