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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_intro", "locked": true, "schema_version": 3, "solution": false}
# # 2. Block tables, slot math and the refcounted allocator
#
# Chapter 1 put a price on the naive KV cache: give every request one contiguous region sized for the
# longest answer it might produce, and most of that region never holds a token. This chapter builds
# the replacement that every serious serving engine now uses. The cache is cut into small blocks of a
# fixed number of token slots; each sequence gets a short *block table* that says which physical block
# holds each stretch of its tokens; and a small *allocator* hands blocks out and takes them back,
# counting how many tables name each one.
#
# You will write three pieces of the engine yourself:
#
# 1. **slot math** — where position $p$ of a sequence lives in the pool (`engine/cache/slots.py`);
# 2. a small measurement, **paged utilization**, to see what blocks buy;
# 3. the **`BlockAllocator`** — a free list with a reference count per block
#    (`engine/cache/allocator.py`).
#
# The last check of the chapter plugs *your* allocator into the engine's paged cache, runs the tiny
# Qwen3 model through it, and compares every logit with a run of the same model that uses no cache at
# all. If your allocator ever hands one block to two sequences, or frees a block someone still reads,
# that comparison finds it.
#
# **How to work.** Run the cells in order. A cell that contains `raise NotImplementedError()` is
# yours to write; the locked cell after it runs the graded check and prints one line starting with ✓
# when your code is right, or a message that says what it expected, what came back, and where to look.
#
# Figures and explorers use the engine's own code, so they run before you have written anything,
# except the pool figure of section 2.6: it hands the engine's `BlockAllocator` to a paged cache, and
# in a student edition of the engine that class's methods are the ones your notebook defines, so it
# stops with "not written yet" until Exercise 2.3 is done. Two small cells run *your* code by name,
# each right after an exercise's tests, under a heading that starts with **With your code** ("With
# your code: utilization" after Exercise 2.2, "With your code: your allocator in the cache" after
# Exercise 2.3). Until that exercise is done they stop with `NotImplementedError`, which is expected.

# %% nbgrader={"grade": false, "grade_id": "ch02_setup", "locked": true, "schema_version": 3, "solution": false}
import math
import random
from collections import deque
from pathlib import Path
from typing import Sequence

import torch

import engine.config
from engine.blocks import ceil_div
from engine.cache.allocator import BlockAllocator as ReferenceAllocator  # the engine's
from engine.cache.errors import BlockRefError, OutOfBlocks
from engine.cache.slots import check_block_size
from engine.checkpoint import tiny_model
from engine.checks import ch02
from engine.course.authoring.figures.ch02 import (draw_block_table, draw_pool,
                                                  plot_block_size_tradeoff)
from engine.course.authoring.widgets import explorer
from engine.config import ModelConfig
from engine.tools.demos.paged import request_lengths, static_figures
from engine.generate import cached_step, scratch_logits

paged_figures = ch02.paged_figures   # a paged cache's figures, from block counts alone

CONFIGS = Path(engine.config.__file__).parent / "configs"  # published config.json files
KiB, MiB, GiB = 2**10, 2**20, 2**30
_ = torch.manual_seed(0)                                    # the prompts of section 2.6

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.1 Why blocks
#
# A transformer's decoder keeps, for every token it has seen, one key vector and one value vector per
# KV head in every layer. The per-token cost is therefore
#
# $$
# \text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim} \times
# \text{bytes per value},
# $$
#
# the 2 counting K and V. The cell below reads the published `config.json` of three models and lets
# the engine's `ModelConfig.kv_bytes_per_token` do the multiplication, then replays the arithmetic of
# chapter 1 for the largest of them: a request that reserves a 4,096-token context up front but only
# ever uses 300 tokens.

# %% nbgrader={"grade": false, "grade_id": "ch02_costs", "locked": true, "schema_version": 3, "solution": false}
per_token = {}
for name in ("llama-2-13b", "llama-3-8b", "llama-3-70b"):
    config = ModelConfig.from_json(CONFIGS / f"{name}.json")
    per_token[name] = config.kv_bytes_per_token(torch.float16)
    print(f"{name:11s} {config.num_layers:3d} layers x "
          f"{config.num_kv_heads:2d} KV heads x {config.head_dim} dims: "
          f"{per_token[name]:>9,} B = "
          f"{per_token[name] / KiB:.0f} KiB per token (fp16)")

big = per_token["llama-3-70b"]
reserved_tokens, used_tokens, block_size = 4096, 300, 16
reserved = reserved_tokens * big
used = used_tokens * big
blocks = math.ceil(used_tokens / block_size)
paged = blocks * block_size * big
table_bytes = reserved_tokens // block_size * 4
print(f"\ncontiguous: reserve {reserved_tokens} tokens = {reserved / GiB:.2f} GiB, "
      f"use {used_tokens} tokens = {used / MiB:.1f} MiB "
      f"-> {1 - used / reserved:.1%} dead")
print(f"paged:      {blocks} blocks of {block_size} = {blocks * block_size} slots = "
      f"{paged / MiB:.1f} MiB -> {blocks * block_size - used_tokens} empty slots, "
      f"{1 - used / paged:.1%} wasted")
print(f"block table of {reserved_tokens:,} tokens: "
      f"{reserved_tokens // block_size} entries x 4 bytes = "
      f"{table_bytes / KiB:.0f} KiB, guarding {reserved / GiB:.2f} GiB of K/V")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_why_md2", "locked": true, "schema_version": 3, "solution": false}
# Read the last three lines the cell printed. Even with grouped-query attention a 70B model costs
# hundreds of KiB per token, so one contiguous 4K reservation runs past a gibibyte, and a 300-token
# chat leaves the printed share of it dead. Paging does not make the request smaller; it makes the *reservation*
# match the request, to within one partly filled block. The bookkeeping that buys this, the block
# table, is tiny next to the data it guards.
#
# Internal fragmentation (the dead tail of a reservation) is only one of the losses. Contiguous
# regions of different sizes also leave holes between them as requests come and go, and a hole is
# useless to a request larger than it even when the free bytes add up (external fragmentation). With
# fixed-size blocks there are no holes that matter: any free block fits any request, and the blocks of
# one sequence need not be next to each other.
#
# The next cell stores the same 32 live requests (20 to 500 tokens each) twice, with the engine's
# caches: once in static slots of 1,024 tokens, once in 16-token blocks, and prints how much of the
# reserved memory holds tokens.

# %% nbgrader={"grade": false, "grade_id": "ch02_workload", "locked": true, "schema_version": 3, "solution": false}
lengths = request_lengths(32, 20, 500, seed=0)
static = static_figures(lengths, capacity=1024)
paged16 = paged_figures(lengths, block_size=16)
print(f"{len(lengths)} requests, {sum(lengths):,} tokens stored")
print(f"static slots of 1,024: {static['slots_reserved']:,} slots reserved, "
      f"utilization {static['utilization']:.1%}")
print(f"blocks of 16:          {paged16['slots_reserved']:,} slots reserved, "
      f"utilization {paged16['utilization']:.1%}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_math_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.2 The slot formula
#
# Fix a block size $b$ (tokens per block). A sequence's tokens are numbered $0, 1, 2, \dots$; we call
# these *logical positions*. Cut them into *logical blocks* of $b$ consecutive positions. The block
# table $T$ of the sequence maps logical block $i$ to a *physical block* $T[i]$ somewhere in the pool.
# Position $p$ then lives at
#
# $$
# \text{logical block} = \lfloor p / b \rfloor, \qquad
# \text{offset} = p \bmod b, \qquad
# \text{physical block} = T[\lfloor p / b \rfloor].
# $$
#
# If the pool is viewed as one flat array of slots, `[num_blocks * b, ...]`, the slot of $p$ is
#
# $$
# \text{slot}(p) = T[\lfloor p / b \rfloor]\cdot b + (p \bmod b).
# $$
#
# A sequence of $n$ tokens needs $\lceil n / b \rceil$ blocks, so at most $b - 1$ slots of its last
# block are empty, whatever $n$ is. If $n \bmod b$ is spread evenly, the expected tail is $(b-1)/2$
# slots.
#
# **Worked example.** With $b = 4$ and table $T = [5, 1, 7]$, position 9 is in logical block
# $\lfloor 9/4 \rfloor = 2$, at offset $9 \bmod 4 = 1$; the table sends logical block 2 to physical
# block 7. Its flat slot is $7 \cdot 4 + 1 = 29$.

# %% nbgrader={"grade": false, "grade_id": "ch02_worked", "locked": true, "schema_version": 3, "solution": false}
table, b, p = [5, 1, 7], 4, 9
print(f"position {p}: logical block {p // b}, offset {p % b}, "
      f"physical block {table[p // b]}, flat slot {table[p // b] * b + p % b}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_ex_slots_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 2.1 — slot math (1 + 1 + 1 + 2 points)
#
# The next four cells hold the engine's own functions from `engine/cache/slots.py` with their bodies
# removed. Fill each one in. The boundaries are where slot math goes wrong: the last slot of a block
# ($p = b - 1$), the first slot of the next ($p = b$), a sequence of $b + 1$ tokens. The checks try
# all of them, for several block sizes, with block tables in scrambled order.
#
# * `physical_slot(table, pos, block_size) -> (block, offset)`
# * `slot_index(table, pos, block_size) -> int` (the flat slot)
# * `blocks_needed(num_tokens, block_size) -> int` ($\lceil n/b \rceil$ with integer arithmetic)
# * `slot_mapping(block_tables, positions, block_size)`: the batched version the cache uses in every
#   forward pass. `block_tables` is `[B, M]`, `positions` is `[B, T]` with `-1` marking padding; return
#   the flat slots `[B, T]`, with `-1` wherever the position is `-1`. Tensor operations
#   (`torch.gather`, `torch.where`) keep it fast on the batches the cache sees in every forward pass;
#   a Python loop over rows and columns gives the same answer, only slower, and the check grades the
#   answer.
#
# Each stub keeps only the function's signature and docstring. The engine's own versions also reject
# bad arguments (`check_block_size`, imported in the setup cell, and an `IndexError` for a position
# outside the table); you may do the same, but it is not graded: the checks only pass valid inputs.

# %% nbgrader={"grade": false, "grade_id": "ch02_physical_slot", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/slots.py::physical_slot

# %% nbgrader={"grade": true, "grade_id": "ch02_test_physical_slot", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch02.check_physical_slot(physical_slot)

# %% nbgrader={"grade": false, "grade_id": "ch02_slot_index", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/slots.py::slot_index

# %% nbgrader={"grade": true, "grade_id": "ch02_test_slot_index", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch02.check_slot_index(slot_index)

# %% nbgrader={"grade": false, "grade_id": "ch02_blocks_needed", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/slots.py::blocks_needed

# %% nbgrader={"grade": true, "grade_id": "ch02_test_blocks_needed", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch02.check_blocks_needed(blocks_needed)

# %% nbgrader={"grade": false, "grade_id": "ch02_slot_mapping", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/slots.py::slot_mapping

# %% nbgrader={"grade": true, "grade_id": "ch02_test_slot_mapping", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch02.check_slot_mapping(slot_mapping)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_explorer_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.3 A block table, up close
#
# The explorer below draws one sequence stored in a pool of 48 blocks. Each row is one logical block
# of the sequence; the label on the left is the physical block the table sends it to (scrambled, as a
# real allocator leaves them after a while); filled cells hold tokens, hollow cells are the unused
# tail. Move the sliders: watch a new table entry appear the moment the length passes a multiple of
# the block size, and watch the tail never exceed $b - 1$ slots.
#
# The explorer draws every state its controls can reach when the cell runs (a few seconds), so the
# sliders work in JupyterLab and in the book alike, with no kernel behind them; the grader draws only
# the starting view, a 37-token sequence in blocks of 8.

# %% nbgrader={"grade": false, "grade_id": "ch02_explorer", "locked": true, "schema_version": 3, "solution": false}
POOL_BLOCKS = 48


def scrambled_table(length, block_size, seed=0):
    """Physical blocks for `length` tokens, drawn in scrambled order from the pool."""
    count = ceil_div(length, block_size)
    return random.Random(seed).sample(range(POOL_BLOCKS), count)


def show_table(length=37, block_size=8, seed=0):
    """Print and draw where each position of one sequence lives."""
    table = scrambled_table(length, block_size, seed)
    tail = len(table) * block_size - length
    print(f"length {length}, block size {block_size}: {len(table)} blocks, "
          f"{len(table) * block_size} slots, {tail} empty in the last block")
    print(f"table {table}")
    last = length - 1
    block, offset = table[last // block_size], last % block_size   # the slot formula
    flat = block * block_size + offset
    print(f"last position {last}: logical block {last // block_size} -> physical block "
          f"{block}, offset {offset}, flat slot {flat}")
    draw_block_table(table, length, block_size)


# Every state precomputed, swapped in the browser (engine/course/authoring/widgets.py).
explorer(show_table, length=(1, 40, 37), block_size=([4, 8, 16], 8))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_util_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.4 What blocks buy, and what they cost
#
# ### Exercise 2.2 — paged utilization (2 points)
#
# Write `paged_utilization(lengths, block_size)`: the fraction of the reserved slots that hold tokens
# when sequences of the given lengths are each stored in whole blocks. For lengths $n_1, \dots, n_k$
# it is
#
# $$
# U(b) = \frac{\sum_i n_i}{b \sum_i \lceil n_i / b \rceil}.
# $$
#
# (A one-token sequence still takes a whole block.)

# %% nbgrader={"grade": false, "grade_id": "ch02_paged_utilization", "locked": false, "schema_version": 3, "solution": true}
def paged_utilization(lengths, block_size):
    """Tokens stored / slots in the blocks that hold them, one sequence per length."""
    ### BEGIN SOLUTION
    slots_reserved = sum(-(-n // block_size) for n in lengths) * block_size
    return sum(lengths) / slots_reserved
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ch02_test_paged_utilization", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch02.check_paged_utilization(paged_utilization)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_yours_util_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: utilization.** This cell needs your `paged_utilization` (Exercise 2.2); until you
# have written it, it stops with `NotImplementedError`. It evaluates your function on the 32-request
# workload of section 2.1 for several block sizes and sets each value beside what a paged cache
# reserves for those requests, counted block by block (`paged_figures`, the same figures the engine's
# `PagedKVCache` reports when it stores them; rounded to three places).

# %% nbgrader={"grade": false, "grade_id": "ch02_yours_util", "locked": true, "schema_version": 3, "solution": false}
print(f"{len(lengths)} requests, paged utilization by block size:")
for size in (8, 16, 32, 64, 128):
    counted = paged_figures(lengths, block_size=size)["utilization"]
    yours = paged_utilization(lengths, size)
    flag = "" if abs(yours - counted) < 5e-4 else "  <- differs"
    print(f"blocks of {size:3d}: your paged_utilization {yours:.3f}, "
          f"counted block by block {counted:.3f}{flag}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_tradeoff_md", "locked": true, "schema_version": 3, "solution": false}
# The cell below draws the trade-off that decides the block size, from the runtime's own ceiling
# division (`engine.blocks.ceil_div`), so it runs whether or not you have finished the exercises.
# Smaller blocks waste less of the last block, but every block is one more table entry for the
# attention kernel to look up and one more small, scattered load. For a 300-token sequence the
# expected tail is $(b-1)/2$ slots and the table has $\lceil 300/b \rceil$ entries.

# %% nbgrader={"grade": false, "grade_id": "ch02_tradeoff", "locked": true, "schema_version": 3, "solution": false}
sizes = [8, 16, 32, 64, 128]
n = 300
waste = [(b - 1) / 2 for b in sizes]
entries = [ceil_div(n, b) for b in sizes]
for b, w, e in zip(sizes, waste, entries):
    print(f"block size {b:3d}: expected tail {w:5.1f} slots "
          f"({w / n:5.1%} of {n} tokens), table {e:2d} entries")
at = {b: i for i, b in enumerate(sizes)}
print(f"16 -> 128: the table gets {entries[at[16]] / entries[at[128]]:.1f}x shorter, "
      f"the expected tail {waste[at[128]] / waste[at[16]]:.1f}x longer")
print(f"16 -> 8:   the tail shrinks by {100 * (waste[at[16]] - waste[at[8]]) / n:.1f} "
      f"points of memory, the table gets "
      f"{entries[at[8]] / entries[at[16]]:.1f}x longer")
plot_block_size_tradeoff(sizes, [100 * w / n for w in waste], entries, n)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_tradeoff_md2", "locked": true, "schema_version": 3, "solution": false}
# The last two lines of the printout are the trade-off. Going from 16 to 128 shortens the table by the
# first factor but stretches the expected dead tail by the second, and short sequences, the bulk of
# real traffic, feel that tail the most. Going from 16 down to 8 buys back about a point of memory
# while the number of table lookups doubles. Sixteen, vLLM's default, sits near the knee for typical request
# lengths; it is a tunable number, not a law, and it moves when the bytes per token move (chapter 1).
# Block size also sets the granularity of *sharing*, which chapters 4 and 5 exploit: only whole blocks
# can be shared.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_alloc_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.5 The allocator: a free list with reference counts
#
# Blocks have to come from somewhere. The allocator owns the pool's block ids $0, \dots, N-1$ and
# answers three requests, each in $O(1)$ per block:
#
# * **`allocate(n=1) -> list[int]`** takes $n$ blocks off the free list and gives each a reference
#   count of 1. It is *all or nothing*: if fewer than $n$ blocks are free it raises
#   `OutOfBlocks(wanted, free)` (here `OutOfBlocks(n, number of free blocks)`) and changes nothing. The scheduler (chapter 7) reacts to that
#   error by waiting, evicting or preempting; it can only do so safely if the failed call left no
#   half-taken blocks behind, because no table would ever name, and so release, those blocks.
# * **`share(block)`** adds an owner to a block that is in use. Today nobody calls it; in chapter 4 a
#   forked sequence shares all its parent's blocks, and in chapter 5 a prefix cache shares blocks
#   across requests.
# * **`release(block)`** drops one owner. Only the *last* release puts the block back on the free
#   list. Releasing a block that is already free is a bug in the caller (a double free) and raises
#   `BlockRefError(block, message)`, with the block's id and a message that names it (for example
#   `BlockRefError(7, "block 7 released too often: it is already free")`); so does sharing a free
#   block.
#
# The invariant that makes it correct: **a block's reference count equals the number of owners that
# name it**, and a block is on the free list exactly when that count is 0. Break it one way and blocks
# leak until the pool runs dry; break it the other way and a block still read by one sequence is
# handed to another, which overwrites it. The second failure does not crash anything: the memory is
# valid, it just holds someone else's keys, and the model quietly produces different logits.
#
# ### Exercise 2.3 — `BlockAllocator` (2 + 3 + 2 + 5 points)
#
# The cell below is a subclass of the engine's `BlockAllocator` that defines only `allocate`, `share`
# and `release`, with their bodies removed; everything else is the engine's. Its constructor,
# `BlockAllocator(num_blocks)`, sets up `self.num_blocks`, the free list `self.free` (a `deque` of
# block ids, every block at the start, the next to hand out on the left) and the counts
# `self.refs` (a list, `self.refs[block]`, all 0); `refcount(block)`, the property `num_free` and
# `check_id(block)` (an `IndexError` for an id outside the pool) are given too. The two errors come
# from `engine.cache.errors`, already imported: `OutOfBlocks(wanted, free)` and
# `BlockRefError(block, message)`. Write the three methods. Four checks follow: the basics, the
# errors, a 300-step random workload of grow / fork / free compared after every step with the true
# counts, and finally your allocator inside the real cache.

# %% nbgrader={"grade": false, "grade_id": "ch02_allocator", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/allocator.py::BlockAllocator.allocate,share,release solve=allocate,share,release

# %% nbgrader={"grade": true, "grade_id": "ch02_test_allocator_basics", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch02.check_allocator_basics(BlockAllocator)

# %% nbgrader={"grade": true, "grade_id": "ch02_test_allocator_errors", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch02.check_allocator_errors(BlockAllocator)

# %% nbgrader={"grade": true, "grade_id": "ch02_test_refcounts", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch02.check_refcounts_balance(BlockAllocator)
### BEGIN HIDDEN TESTS
ch02.check_refcounts_balance(BlockAllocator, steps=600, seed=7)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_engine_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.6 Your allocator inside the engine
#
# `PagedKVCache` accepts any object with the allocator's methods. The decisive check hands it *your*
# class, first scrambling the free list so physical blocks come out in no particular order. The methods
# that store and read keys and values through the tables are chapter 3's exercises, so until then the
# check uses its own plain, one-position-at-a-time versions (`ch02.BlockTableCache`, a subclass of the
# engine's `PagedKVCache`); the K/V pools and the attention that reads them through your tables are the
# engine's. The check:
#
# 1. prefills a ragged batch of four sequences of lengths $b-1$, $b$, $b+1$ and $2b+1$ ($b = 4$);
# 2. forks the longest one (a new sequence whose table names the same blocks, each with one more owner)
#    and frees the parent, so the child's blocks must survive with one owner;
# 3. admits a newcomer, whose blocks come off the free list and must not be the child's;
# 4. decodes four steps for everyone.
#
# After every step each sequence's logits must match, within $10^{-5}$, the logits the same model
# computes from scratch for that sequence's full token list, with no cache at all. At the end every
# sequence is freed and the whole pool must be free again.

# %% nbgrader={"grade": true, "grade_id": "ch02_test_allocator_in_engine", "locked": true, "points": 5, "schema_version": 3, "solution": false}
ch02.check_allocator_in_engine(BlockAllocator)
### BEGIN HIDDEN TESTS
ch02.check_allocator_in_engine(BlockAllocator, block_size=2, num_blocks=40, seed=3)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_pool_md", "locked": true, "schema_version": 3, "solution": false}
# Here is what that looks like from the inside. The cell prefills five prompts through a cache whose
# free list has been scrambled, prints each block table, compares the logits with a from-scratch run,
# and draws the pool: one cell per physical block, coloured by the sequence that owns it. The
# sequences' blocks interleave in the pool, yet every sequence reads back exactly its own history. The
# cache is the check's `ch02.BlockTableCache`, as above. This cell uses the engine's `BlockAllocator`
# (in a student edition of the engine, whose chapter-2 methods call the ones your notebook defines, that
# is yours, and the cell needs Exercise 2.3); the cell after it runs the same prompts through yours.

# %% nbgrader={"grade": false, "grade_id": "ch02_pool", "locked": true, "schema_version": 3, "solution": false}
model = tiny_model(seed=0)
prompts = [torch.randint(0, 256, (n,)).tolist() for n in (3, 9, 6, 13, 4)]


def fill_pool(allocator_class, num_blocks=24, block_size=4):
    """Prefill `prompts` through a paged cache whose allocator (an `allocator_class`)
    hands blocks out in scrambled order; print each table and its largest logit
    difference from a from-scratch run."""
    allocator = allocator_class(num_blocks)
    order = allocator.allocate(num_blocks)
    random.Random(1).shuffle(order)
    for block in order:        # scramble the free list, as a long-running server would
        allocator.release(block)
    cache = ch02.BlockTableCache(model.config, num_blocks, block_size=block_size,
                                 allocator=allocator)
    for seq in range(len(prompts)):
        cache.create(seq)
    cached = cached_step(model, cache, list(range(len(prompts))), prompts)
    fresh = scratch_logits(model, prompts)
    for seq, prompt in enumerate(prompts):
        diff = float((cached[seq] - fresh[seq]).abs().max())
        print(f"sequence {seq}: {len(prompt):2d} tokens, table {cache.tables[seq]}, "
              f"max |Δ| vs from scratch {diff:.1e}")
    print(f"blocks in use {cache.blocks_in_use} of {num_blocks}, "
          f"tokens {cache.tokens_stored}, utilization {cache.utilization():.1%}")
    return cache


def owners(cache):
    """{physical block: the sequence whose table names it}."""
    return {block: seq for seq, table in cache.tables.items() for block in table}


def free_all(cache):
    for seq in list(cache.tables):
        cache.free(seq)
    allocator = cache.allocator
    print(f"after freeing everyone: {allocator.num_free} of {allocator.num_blocks} "
          "blocks free")


engine_cache = fill_pool(ReferenceAllocator)
draw_pool(owners(engine_cache), engine_cache.allocator.num_blocks)
engine_tables = {seq: list(table) for seq, table in engine_cache.tables.items()}
free_all(engine_cache)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_yours_pool_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your allocator in the cache.** This cell needs your `BlockAllocator` (Exercise
# 2.3); until you have written it, it stops with `NotImplementedError`. It runs the same five prompts
# through a cache that uses your allocator: every $|\Delta|$ should be as small as above, and at the
# end the whole pool should be free again. (Your tables may name other physical blocks than the
# engine's if your free list hands blocks out in another order; that is allowed.)

# %% nbgrader={"grade": false, "grade_id": "ch02_yours_pool", "locked": true, "schema_version": 3, "solution": false}
your_cache = fill_pool(BlockAllocator)
print("the same physical blocks as with the engine's allocator:",
      {seq: list(table) for seq, table in your_cache.tables.items()} == engine_tables)
free_all(your_cache)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 2.7 Check your understanding
#
# Answer each question in the cell under it, in a few sentences. Your instructor grades these by hand.
#
# **Q1 (2 points).** Why can't a serving engine simply allocate, for each request, exactly the KV
# memory it will need, in one contiguous piece?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch02_q1", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Because the length of the answer is unknown until generation stops: the engine must hold the cache
# while it grows. Reserving the maximum wastes the unused tail (internal fragmentation); growing a
# contiguous region means copying it somewhere larger or finding free space right behind it, and as
# requests of different sizes come and go the free space splits into holes that a larger request
# cannot use even when enough bytes are free in total (external fragmentation). Blocks allocated on
# demand avoid both: a sequence grows one block at a time, anywhere in the pool.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_q2_md", "locked": true, "schema_version": 3, "solution": false}
# **Q2 (2 points).** With blocks of 16 tokens, which kind of fragmentation disappears, and which is
# only bounded? Give the bound, per sequence, in tokens.

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch02_q2", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# External fragmentation disappears: every free block fits every request, so there are no unusable
# holes and no need to compact. Internal fragmentation remains but is bounded by the last, partly
# filled block of each sequence: at most $b - 1 = 15$ empty slots per sequence, about $7.5$ on
# average, independent of how long the sequence becomes or how large the context window is.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_q3_md", "locked": true, "schema_version": 3, "solution": false}
# **Q3 (2 points).** `allocate(3)` finds only 2 free blocks. Why must it raise *before* taking any,
# instead of taking the 2 and then raising? What goes wrong over time if it does not?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch02_q3", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# The caller gets an exception, not a list, so it never learns which blocks were taken and no block
# table ever names them. Nobody will release them: they leak with a refcount of 1. Each failed
# allocation under memory pressure (exactly when failures happen) shrinks the pool further, which
# causes more failures. An all-or-nothing allocate lets the scheduler treat `OutOfBlocks` as "nothing
# happened, decide what to evict or preempt, try again".

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** A bug releases a block twice. Why is it worse if the allocator accepts that
# silently than if it raises? What would a user of the model observe?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch02_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# A silent double free puts the block on the free list while a table still names it (or twice on the
# list), so it is later handed to a second sequence, whose writes overwrite the first one's keys and
# values. Nothing crashes: the memory is valid, it just holds the wrong data, and attention computes
# plausible-looking but different outputs. The user sees degraded or inconsistent text that depends on
# what else was running. Raising `BlockRefError` with the block id turns that into an immediate,
# reproducible error at the line with the bug.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch02_stretch", "locked": true, "schema_version": 3, "solution": false}
# ## 2.8 Stretch exercise (ungraded)
#
# ★ **Utilization against block size.** Using your `paged_utilization` and the 32-request workload of
# section 2.1 (`lengths`), plot utilization for every block size from 1 to 128 (all of them, not only
# the powers of two). Where does it drop below 95 %? Below 90 %? Overlay the estimate
# $1 - \frac{(b-1)/2}{\bar n}$, where $\bar n$ is the mean length, and explain where the estimate is
# off and why (hint: what happens to a sequence shorter than one block?). Compare with
# `python -m engine paged --sweep`, which stores the same requests in the engine's cache for the
# powers of two.
#
# ## Summary
#
# * A paged cache stores each sequence in fixed-size blocks reached through a block table:
#   position $p$ lives in physical block $T[\lfloor p/b \rfloor]$ at offset $p \bmod b$.
# * Memory is taken one block at a time, so a sequence wastes at most $b - 1$ slots and free memory
#   never fragments.
# * The allocator's reference counts say how many owners each block has; only the last release frees
#   a block, and a failed allocation changes nothing.
#
# **Going deeper.**
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): the paper that brought block tables to the KV cache, and its
#   analogy with an operating system's virtual memory.
# * vLLM's [`vllm/v1/core/block_pool.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/block_pool.py): a production free-block
#   queue with reference counts, the bookkeeping your `BlockAllocator` does.
# * PMPP (Hwu, Kirk, El Hajj), §20.7, on the memory needs of attention.
# * Any operating-systems text on paging: logical pages, physical frames, page tables, and why
#   fixed-size pages leave no external fragmentation.
#
# **Next.** Chapter 3 builds the paged cache itself: `reserve`, `set_batch` and the
# scatter/gather of K and V through the tables. Chapter 4 lets several sequences share blocks.
