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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_intro", "locked": true, "schema_version": 3, "solution": false}
# # 3. The paged KV cache
#
# Chapter 1 measured the price of giving every request one contiguous slot: most of the reserved
# memory never holds a token. Chapter 2 built the two parts that fix it: the slot math that finds
# position $p$ of a sequence in a pool of fixed-size blocks, and a `BlockAllocator` that hands blocks
# out and counts their owners. This chapter puts them together into the cache that the rest of the
# course runs on, the engine's `PagedKVCache` (`engine/cache/paged.py`).
#
# It is the same six-method protocol as the static cache of chapter 1 (`create`, `reserve`,
# `set_batch`, `update`, `length`, `free`), plus `truncate` for rolling back. You write the parts that
# make it paged:
#
# 1. **`reserve` and `set_batch`**: blocks for the next tokens, all or nothing, and the block tables of
#    a batch as one tensor;
# 2. **`write` and `gather`**, the two halves of `update`: store the new keys and values through the
#    block tables, and read each row's history back out;
# 3. **`free` and `truncate`**: give blocks back, all of them or the tail.
#
# The last check runs the tiny Qwen3 model through your cache, with physical blocks handed out in
# scrambled order, for a prefill and twenty decode steps, and compares every logit with a run that
# uses no cache at all.
#
# **Stuck in chapter 2?** Nothing here uses your chapter-2 code: the cache runs on the engine's
# `BlockAllocator` and `slot_mapping`.
#
# **How to work.** Run the cells in order. A cell that contains `raise NotImplementedError()` is
# yours to write; the locked cell after it runs the graded check and prints one line starting with ✓,
# or a message that says what it expected, what came back, and a hint. Each exercise cell is a small
# subclass of the engine's `PagedKVCache` that defines only the methods of that exercise; everything
# else is the engine's. The figures of section 3.1 use the engine's bookkeeping, so they run before
# you have written anything. The pool figure after Exercise 3.2 and the block-size sweep of section
# 3.6 store tokens in the engine's `PagedKVCache`; in a student edition of the engine its methods that
# you write are the ones your notebook defines, so those cells stop with "not written yet" until you
# have written them. Cells under a heading that starts with **With your code** run your code and stop
# with `NotImplementedError` until the exercise they name is done; that is expected.

# %% nbgrader={"grade": false, "grade_id": "ch03_setup", "locked": true, "schema_version": 3, "solution": false}
import torch

import engine.cache.paged
from engine.cache.block_tables import BlockTables
from engine.cache.errors import OutOfBlocks
from engine.cache.slots import blocks_needed, slot_mapping
from engine.checkpoint import tiny_model
from engine.checks import ch03
from engine.course.authoring.figures import ch03 as figures
from engine.course.authoring.widgets import explorer
from engine.tools.demos.paged import request_lengths, static_figures
from engine.generate import cached_step, scratch_logits
from engine.seeded import seeded_tokens

ReferenceCache = engine.cache.paged.PagedKVCache    # the engine's, for the figures
model = tiny_model(seed=0)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 3.1 Why: the same requests, two caches
#
# The workload of chapter 1: 32 live requests of 20 to 500 tokens. The cell stores them in the
# engine's `StaticKVCache`, which gives each request a slot of 1,024 tokens, and counts what a paged
# cache with blocks of 16 reserves for them: $\lceil n/16 \rceil$ whole blocks for a request of $n$
# tokens (chapter 2's `blocks_needed`; the cache you build in this chapter reserves exactly that).
# It prints how much of the reserved memory holds tokens.

# %% nbgrader={"grade": false, "grade_id": "ch03_why", "locked": true, "schema_version": 3, "solution": false}
lengths = request_lengths(32, 20, 500, seed=0)
static = static_figures(lengths, capacity=1024)
blocks = sum(blocks_needed(n, 16) for n in lengths)
paged = {"tokens_stored": sum(lengths), "slots_reserved": 16 * blocks,
         "utilization": sum(lengths) / (16 * blocks)}
print(f"{len(lengths)} requests, {sum(lengths):,} tokens")
print(f"static slots of 1,024: {static['slots_reserved']:,} slots reserved, "
      f"utilization {static['utilization']:.1%}")
print(f"blocks of 16:          {paged['slots_reserved']:,} slots reserved, "
      f"utilization {paged['utilization']:.1%}")
print(f"                       ({paged['slots_reserved'] - paged['tokens_stored']} "
      "empty slots, at most 15 per request)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_idea_md", "locked": true, "schema_version": 3, "solution": false}
# The static cache leaves most of what it reserves empty; the paged one wastes only the unused tail of
# each request's last block. The vLLM paper (Kwon et al., 2023) measured real serving
# systems of the time using only 20-38% of their KV memory for tokens, so the first number is no
# straw man. Memory that holds nothing still caps how many requests fit in a batch.
#
# ## 3.2 The idea: one step of the paged cache
#
# All blocks of all sequences live in one pool per layer: `k_pools[layer]` and `v_pools[layer]`, each
# `[num_blocks, kv_heads, block_size, head_dim]`. Sequence `s` owns a block table `tables[s]` (a list of
# physical block ids) and a length `lengths[s]` (tokens stored). One forward step uses the cache in a
# fixed order:
#
# 1. **`reserve(seq, n)`** for every sequence of the batch, *before* any compute: make positions
#    $L, \dots, L+n-1$ writable, where $L$ is the stored length. With block size $b$ and table $T$ the
#    sequence needs $\lceil (L+n)/b \rceil$ blocks in all, so
#
#    $$
#    \text{new blocks} = \max\left(0,\ \lceil (L+n)/b \rceil - |T|\right).
#    $$
#
#    If the pool cannot hand out that many, `reserve` raises `OutOfBlocks` and changes *nothing*: the
#    scheduler (chapter 7) then waits, evicts or preempts and simply tries again.
# 2. **`set_batch(seqs)`** names the batch's sequences in row order and builds one `[B, M]` tensor of
#    their block tables, padded to the longest table, for the kernels.
# 3. **`update(layer, k, v, positions)`**, once per layer, inside the model: `write` scatters the new
#    `k`, `v` `[B, Hkv, T, D]` to the slots of their positions (`positions` `[B, T]`, `-1` = padding)
#    and returns `kv_lens`, the keys each row has after this step; `gather` reads each row's positions
#    $0, \dots, \ell - 1$ back ($\ell$ is the row's `kv_len`), in order, so plain attention can run
#    over them. The last layer's `write` commits the new lengths.
# 4. When a request ends, **`free(seq)`** gives its blocks back; **`truncate(seq, length)`** gives
#    back only the blocks past a shorter length (speculative decoding rejects draft tokens that way).
#
# **Worked example.** The cell follows one sequence's block table, blocks of 4, in a pool whose free
# list is scrambled: room for a 5-token prompt, then one more token at a time. It works the formula
# above by hand, on the engine's bookkeeping (`BlockTables`, `engine/cache/block_tables.py`: the tables
# and lengths of a paged cache, no tensors) and allocator, which is what `reserve` does while nothing
# is shared; where the forward pass would store the tokens and its last layer commit the length, it
# only adds to the length.

# %% nbgrader={"grade": false, "grade_id": "ch03_worked", "locked": true, "schema_version": 3, "solution": false}
scrambled = ch03.shuffled_allocator(12, seed=5)      # free list in scrambled order
worked = BlockTables(4, scrambled)                   # tables and lengths, no tensors
worked.create(0)


def room_for(seq, n):
    """max(0, ceil((L + n) / b) - |T|) new blocks from the allocator, nothing shared."""
    table = worked.table(seq)
    new = max(0, blocks_needed(worked.lengths[seq] + n, 4) - len(table))
    table.extend(scrambled.allocate(new))


room_for(0, 5)
print(f"room for 5 tokens: table {worked.tables[0]}, length {worked.length(0)} "
      f"(ceil(5 / 4) = {blocks_needed(5, 4)} blocks;\n"
      "  the forward pass writes the tokens)")
worked.lengths[0] += 5                                 # the prefill's last layer
print(f"after the prefill: length {worked.length(0)}; position 4 lives in block "
      f"{worked.tables[0][4 // 4]} at offset {4 % 4}")
for step in range(4):
    before = list(worked.tables[0])
    room_for(0, 1)
    worked.lengths[0] += 1                             # one decode step
    print(f"decode step {step + 1}: position {worked.length(0) - 1}, "
          f"table {worked.tables[0]}"
          + ("  <- a new block" if worked.tables[0] != before else ""))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_ex1_md", "locked": true, "schema_version": 3, "solution": false}
# A new block appears only when a token lands past the end of the last one (the marked step), never
# before. That is the whole memory story of a paged cache: memory follows the tokens.
#
# ### Exercise 3.1: `reserve` and `set_batch` (3 + 2 points)
#
# Write the two methods in the cell below, a subclass of the engine's `PagedKVCache`.
#
# **`reserve(self, seq, n)`**: make positions `[length, length + n)` of `seq` writable.
# * `self.table(seq)` is the sequence's block table (a `list[int]`; a `KeyError` for an unknown
#   sequence), `self.lengths[seq]` its stored length, `self.block_size` the block size $b$, and
#   `blocks_needed(num_tokens, block_size)` the ceiling $\lceil n/b \rceil$ from chapter 2.
# * `self.allocator` is a `BlockAllocator`: `num_free`, `allocate(k) -> list[int]`.
# * Count *everything* the call will take before taking anything. There is one more kind of block to
#   pay for, which chapter 4 explains: `self.shared_writes(seq, n)` lists the table indices that these
#   tokens write into while another sequence shares the block; each needs a fresh copy, made by
#   `self.copy_on_write(seq, index)`. Until chapter 4 nothing is shared and the list is empty, but add
#   its length to what you need and make the copies after the check.
# * If the pool has fewer free blocks than needed, raise `OutOfBlocks(wanted, free, what)` (`what`: a
#   few words such as `f"sequence {seq} cannot reserve {n} token(s)"`) and change nothing: no table,
#   no reference count, no length. Otherwise append the new blocks to the table.
# * `reserve` never changes the length: the forward pass writes the tokens, and the last layer's
#   `write` commits the length.
#
# **`set_batch(self, seqs)`**: the sequences of the next forward, in batch-row order.
# * Raise `ValueError` if `seqs` is empty or names a sequence twice.
# * Set `self.batch` (the list of sequence ids), `self.block_tables` (a `torch.long` tensor
#   `[B, M]` on `self.device`: row `b` is the table of `seqs[b]`, padded with block `0` to the longest
#   table, `M` at least 1), `self.batch_lengths` (`[B]`, each row's stored length) and
#   `self.batch_capacity` (`[B]`, the slots each row's table holds: `len(table) * block_size`).
#   Padding uses a real block id because kernels may read it; `kv_lens` keeps such reads out of every
#   result.

# %% nbgrader={"grade": false, "grade_id": "ch03_reserve", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/paged.py::PagedKVCache.reserve,set_batch solve=reserve,set_batch

# %% nbgrader={"grade": true, "grade_id": "ch03_test_reserve", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch03.check_reserve(PagedKVCache)
### BEGIN HIDDEN TESTS
ch03.check_reserve(PagedKVCache, block_size=3, seed=4)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "ch03_test_set_batch", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch03.check_set_batch(PagedKVCache)
### BEGIN HIDDEN TESTS
ch03.check_set_batch(PagedKVCache, block_size=2, seed=5)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_keep1_md", "locked": true, "schema_version": 3, "solution": false}
# Each exercise cell defines its own `PagedKVCache`, a subclass of the engine's. The next cell keeps
# this one under another name, so the last check can put your methods from all three exercises
# together.

# %% nbgrader={"grade": false, "grade_id": "ch03_keep1", "locked": true, "schema_version": 3, "solution": false}
YourReserve = PagedKVCache

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_ex2_md", "locked": true, "schema_version": 3, "solution": false}
# ## 3.3 Writing and reading through the block tables
#
# Inside the model, every layer calls `update(layer, k, v, positions)`, which in the engine is two
# lines:
#
# ```python
# kv_lens = self.write(layer, k, v, positions)
# keys = self.gather(self.k_pools[layer], kv_lens)
# values = self.gather(self.v_pools[layer], kv_lens)
# return keys, values, kv_lens
# ```
#
# **Write.** Row $b$ of the batch writes position $p = $ `positions[b, t]` to physical block
# $T_b[\lfloor p/b_s \rfloor]$ at offset $p \bmod b_s$, where $T_b$ is row $b$ of `block_tables`.
# Chapter 2's `slot_mapping(block_tables, positions, block_size)` gives all of them at once as flat
# slots `block * block_size + offset`, and `-1` where `positions` is `-1` (padding of a short row).
# Padding must never be written: as an index, `-1` is the pool's *last* slot, which belongs to
# somebody. After the write, row $b$ holds
#
# $$ \ell_b = \max\left(L_b,\ 1 + \max_t\{\,p_{b,t} : p_{b,t} \ge 0\,\}\right) $$
#
# keys (`kv_lens[b]`), $L_b$ its stored length (`self.batch_lengths[b]`). Every layer writes the same positions, so
# only the last layer (`layer == len(self.k_pools) - 1`) commits: it sets `self.lengths[seq]` for each
# sequence of the batch and `self.batch_lengths` to `kv_lens`. Commit earlier and the next layer starts
# from the new length.
#
# **Gather.** `gather(pool, kv_lens)` returns `[B, Hkv, L, D]` with `L = max(kv_lens)` (at least 1):
# key $j$ of row $b$ is position $j$ of that row, read from `pool[T_b[j // bs], :, j % bs]`. Past a
# row's `kv_len` anything may stand there (attention masks it), but the index must be a real slot.
#
# ### Exercise 3.2: `write` and `gather` (4 + 2 points)
#
# * `write(self, layer, k, v, positions) -> kv_lens`: `k`, `v` are `[B, Hkv, T, D]`; the pools
#   `self.k_pools[layer]`, `self.v_pools[layer]` are `[num_blocks, Hkv, block_size, D]`, so
#   `pool[blocks, :, offsets] = values` with `values` `[N, Hkv, D]` stores $N$ vectors (hint:
#   `k.transpose(1, 2)[valid]`). Store in the pool's dtype (`.to(self.dtype)`). Call
#   `self.check_positions(positions)` on layer 0 first: it refuses rows that `set_batch` did not
#   name and positions outside a row's reserved room, with a message naming the sequence.
# * `gather(self, pool, kv_lens) -> [B, Hkv, L, D]`: build the positions $0..L-1$ of every row
#   (`torch.arange`), turn those at or past a row's `kv_len` into `-1`, map them through
#   `slot_mapping`, clamp `-1` to `0`, and index the pool. Use `self.device` for new tensors.

# %% nbgrader={"grade": false, "grade_id": "ch03_write", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/paged.py::PagedKVCache.write,gather solve=write,gather

# %% nbgrader={"grade": true, "grade_id": "ch03_test_write", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch03.check_write(PagedKVCache, YourReserve)
### BEGIN HIDDEN TESTS
ch03.check_write(PagedKVCache, YourReserve, block_size=3, seed=6)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "ch03_test_gather", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch03.check_gather(PagedKVCache, YourReserve)
### BEGIN HIDDEN TESTS
ch03.check_gather(PagedKVCache, YourReserve, block_size=2, seed=7)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "ch03_keep2", "locked": true, "schema_version": 3, "solution": false}
YourStorage = PagedKVCache

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_pool_md", "locked": true, "schema_version": 3, "solution": false}
# ### A pool, slot by slot
#
# The explorer prefills four prompts of lengths $b-1$, $b$, $b+1$ and $2b+1$ through the engine's
# cache, with the free list scrambled by `seed`, and draws the pool: one row per physical block, its
# slots coloured by the sequence that owns it, each stored slot labelled with its position. Pale slots
# are reserved but empty (the tail of a last block), white rows are free. Change the block size and
# watch the number of pale slots; change the seed and watch the blocks move while every sequence still
# reads its positions in order (the printed line compares the logits with a from-scratch run). It
# uses the engine's cache, so it runs before your exercises pass. Without a browser you see the static
# view for blocks of 4.

# %% nbgrader={"grade": false, "grade_id": "ch03_pool", "locked": true, "schema_version": 3, "solution": false}
def show_pool(block_size=4, seed=0):
    """Prefill lengths bs-1, bs, bs+1, 2bs+1 into the engine's cache; draw its pool."""
    lengths_here = [block_size - 1, block_size, block_size + 1, 2 * block_size + 1]
    prompts = [seeded_tokens(n, seed=10 + i) for i, n in enumerate(lengths_here)]
    num_blocks = sum(blocks_needed(len(p), block_size) for p in prompts) + 3
    cache = ReferenceCache(model.config, num_blocks, block_size=block_size,
                           allocator=ch03.shuffled_allocator(num_blocks, seed))
    for seq in range(len(prompts)):
        cache.create(seq)
    got = cached_step(model, cache, list(range(len(prompts))), prompts)
    want = scratch_logits(model, prompts)
    worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
    tables = [cache.tables[s] for s in range(len(prompts))]
    print(f"blocks of {block_size}: tables {tables}, "
          f"{cache.slots_reserved - cache.tokens_stored} empty slots\n"
          f"logits vs a from-scratch run: max |Δ| {worst:.1e}")
    figures.draw_pool(cache)


# A static view first; in JupyterLab, the controls above the picture redraw it.
explorer(show_pool, block_size=([2, 4, 8], 4), seed=(0, 3, 0))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_ex3_md", "locked": true, "schema_version": 3, "solution": false}
# ## 3.4 Giving blocks back
#
# A block returns to the free list only when its *last* owner releases it (chapter 2). A finished
# request therefore releases each of its blocks once, and a block that another owner still names (a
# fork in chapter 4, the prefix cache in chapter 5) stays in use. Rolling back is the same operation
# on the tail: a sequence truncated to `length` tokens keeps its first $\lceil \text{length}/b \rceil$
# blocks and releases the rest; its length drops, and the next `reserve` takes new blocks as needed.
#
# ### Exercise 3.3: `free` and `truncate` (2 + 2 points)
#
# * `free(self, seq)`: the request is finished. Afterwards the cache knows nothing of `seq` (no
#   table, no length), and every block its table named has lost exactly one owner: a block nobody
#   else holds is back on the free list, one that a fork or the prefix cache still holds stays in use.
#   (The engine's version also drops a sequence swapped out to host memory, chapter 7; yours need
#   not.)
# * `truncate(self, seq, length)`: roll `seq` back to its first `length` tokens. A `length` below 0
#   or above the sequence's length is a `ValueError`, with nothing changed. Afterwards the table holds
#   only the blocks those tokens need (a block reserved past them goes too, even when `length` is the
#   current length), each block cut off has lost one owner, and the length is `length`. Cut the
#   table in place, so that it stays the *same list object*: a caller that took `self.table(seq)`
#   earlier still sees the current table. The sequence stays, even at length 0.

# %% nbgrader={"grade": false, "grade_id": "ch03_free", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/paged.py::PagedKVCache.free,truncate solve=free,truncate

# %% nbgrader={"grade": true, "grade_id": "ch03_test_free", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch03.check_free(PagedKVCache, YourStorage, YourReserve)

# %% nbgrader={"grade": true, "grade_id": "ch03_test_truncate", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch03.check_truncate(PagedKVCache, YourStorage, YourReserve)
### BEGIN HIDDEN TESTS
ch03.check_truncate(PagedKVCache, YourStorage, YourReserve, block_size=3, seed=8)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_milestone_md", "locked": true, "schema_version": 3, "solution": false}
# ## 3.5 The milestone: your cache in the engine
#
# The next cell puts your methods from the three exercises into one class (everything else is the
# engine's). The check runs the tiny model through it with the free list scrambled:
#
# 1. a ragged prefill of four prompts of lengths $b-1$, $b$, $b+1$ and $2b+1$ ($b = 4$);
# 2. twenty decode steps for everyone; at step 6 the longest sequence is truncated by 3 tokens (as
#    speculative decoding would), at step 11 another is freed and a newcomer is prefilled beside the
#    decoding rows, taking blocks the freed one gave back.
#
# After every step each sequence's logits must equal, within $10^{-5}$, those of a from-scratch run of
# its tokens, and at the end every block must be free again. When a step differs, the message runs the
# method checks on your class and quotes the first one that fails.

# %% nbgrader={"grade": false, "grade_id": "ch03_together", "locked": true, "schema_version": 3, "solution": false}
YourCache = ch03.your_cache(PagedKVCache, YourStorage, YourReserve)


# %% nbgrader={"grade": true, "grade_id": "ch03_test_engine", "locked": true, "points": 6, "schema_version": 3, "solution": false}
ch03.check_cache_matches_scratch(PagedKVCache, YourStorage, YourReserve)
### BEGIN HIDDEN TESTS
ch03.check_cache_matches_scratch(PagedKVCache, YourStorage, YourReserve,
                                   block_size=3, seed=1)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_yours_demo_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: the chapter's demo.** This cell needs all three exercises. It stores the 32
# requests of section 3.1 in *your* cache, with blocks of 16, and sets the result beside the static
# cache of 1,024-token slots and the block count of section 3.1.

# %% nbgrader={"grade": false, "grade_id": "ch03_yours_demo", "locked": true, "schema_version": 3, "solution": false}
yours = ch03.utilization(YourCache, lengths, block_size=16)
print(f"static slots of 1,024: utilization {static['utilization']:.3f}")
print(f"your paged cache (16): utilization {yours['utilization']:.3f}, "
      f"{yours['slots_reserved']:,} slots for {yours['tokens_stored']:,} tokens")
print(f"block count (16):      utilization {paged['utilization']:.3f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_sweep_md", "locked": true, "schema_version": 3, "solution": false}
# ## 3.6 Choosing the block size
#
# Why 16? The figure stores the same 32 requests in the engine's cache for block sizes from 1 to 128
# and plots the utilization and the mean block-table length. Utilization falls as blocks grow (each
# request wastes up to $b-1$ slots of its last block, $(b-1)/2$ on average), while the table, and with
# it the number of lookups the attention kernel makes per head, shrinks as $1/b$. The printed lines
# give the numbers the argument rests on.

# %% nbgrader={"grade": false, "grade_id": "ch03_sweep", "locked": true, "schema_version": 3, "solution": false}
sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
sweep = [ch03.utilization(ReferenceCache, lengths, block_size=size) for size in sizes]
for row in sweep:
    if row["block_size"] in (1, 16, 128):
        print(f"block size {row['block_size']:3d}: "
              f"utilization {row['utilization']:.1%}, "
              f"{row['mean_table_length']:.1f} table entries per request")
below = next(row["block_size"] for row in sweep if row["utilization"] < 0.95)
print(f"utilization first drops below 95% at block size {below}")
figures.plot_block_size_sweep(sweep, static_utilization=static["utilization"])

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_sweep_md2", "locked": true, "schema_version": 3, "solution": false}
# Blocks of 16 keep utilization near the top while the tables stay short; going to 128 buys tables a
# few entries long at the price of a large share of the memory, and for a request shorter than one
# block, most of its block. Block size also sets the granularity of sharing in
# chapters 4 and 5: only whole blocks can be shared.
#
# ## 3.7 Check your understanding
#
# Q1 to Q3 are graded automatically: set the variable in the cell under the question. Q4 is answered
# in a few sentences and graded by your instructor.
#
# **Q1 (1 point).** With blocks of 16, a sequence holds 37 tokens. How many blocks does
# `truncate(seq, 20)` release? Set `answer_q1` to a number.

# %% nbgrader={"grade": false, "grade_id": "ch03_q1", "locked": false, "schema_version": 3, "solution": true}
answer_q1 = None
### BEGIN SOLUTION
answer_q1 = blocks_needed(37, 16) - blocks_needed(20, 16)
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch03_test_q1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch03.check_q1_truncate_releases(answer_q1)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_q2_md", "locked": true, "schema_version": 3, "solution": false}
# **Q2 (1 point).** The pool has 5 free blocks. `reserve(seq, 100)` with blocks of 16 needs 7 of them
# and raises `OutOfBlocks`. How many blocks are free after the call? Set `answer_q2` to a number.

# %% nbgrader={"grade": false, "grade_id": "ch03_q2", "locked": false, "schema_version": 3, "solution": true}
answer_q2 = None
### BEGIN SOLUTION
answer_q2 = 5
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch03_test_q2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch03.check_q2_failed_reserve(answer_q2)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_q3_md", "locked": true, "schema_version": 3, "solution": false}
# **Q3 (1 point).** Where does `write` store the key of position `p` of batch row `b` (block size
# `bs`)? Set `answer_q3` to one letter.
#
# * (a) `k_pool[p // bs, :, p % bs]`
# * (b) `k_pool[block_tables[b, p // bs], :, p % bs]`
# * (c) `k_pool[block_tables[b, p % bs], :, p // bs]`
# * (d) `k_pool[block_tables[b, p // bs], :, p]`

# %% nbgrader={"grade": false, "grade_id": "ch03_q3", "locked": false, "schema_version": 3, "solution": true}
answer_q3 = None
### BEGIN SOLUTION
answer_q3 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch03_test_q3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch03.check_q3_slot(answer_q3)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** Why does the cache reserve room *before* the forward pass, rather than taking a
# block inside `write` at the moment a token needs one? And why does only the last layer's `write`
# commit the new lengths?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch03_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) reserving first moves the only failure, running out of blocks, to a point where
# nothing has been computed or written: the scheduler can wait, evict or preempt and retry, and the
# model never stops halfway through a batch with some layers written and others not (on a GPU,
# before any kernel is launched). (1 point) every layer writes the same positions and each layer's
# `write` needs the *old* length to compute `kv_lens` and to check positions; committing on an early
# layer would let later layers see a length that already includes this step's tokens (or add them
# again), so only the last layer, after every layer has written, may commit.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch03_stretch", "locked": true, "schema_version": 3, "solution": false}
# ## 3.8 Stretch exercises (ungraded)
#
# ★ **Utilization against block size, with your cache.** Redo the figure of section 3.6 with
# `ch03.utilization(YourCache, lengths, size)` for *every* block size from 1 to 128 and plot it with
# `figures.plot_block_size_sweep`. Overlay the estimate $1 - \frac{(b-1)/2}{\bar n}$ ($\bar n$ the
# mean request length). Where is the estimate off, and why (what happens to a request shorter than
# one block)? Compare with `python -m engine paged --sweep`.
#
# ★★ **A paged cache without the gather.** `gather` copies every row's whole history at every layer
# and step. Read `attend` in `engine/cache/paged.py` and `engine/attention/paged_reference.py`: with
# `attention="torch"` or `"triton"` the cache only stores the step's K/V (through `write`, or for the
# engine's own class through `store`, `write` done once per forward) and attention reads the pool
# through the block tables. Time 64 decode steps of a batch of 8 with `attention="reference"` and with
# `attention="torch"`; where does the difference come from?
#
# ★★ **Truncate into the middle of a block.** After `truncate(seq, 5)` with blocks of 4, position 5
# is written again into the block that still holds position 4. Show with a from-scratch comparison that
# the stale key left in that slot by the rolled-back token is never read before it is overwritten.
# Which line of `gather` or of attention guarantees it?
#
# ## Summary
#
# * A paged cache keeps all K/V in one pool of fixed-size blocks per layer; each sequence's block table
#   maps its logical blocks to physical ones, so memory follows the tokens, at most $b-1$ slots idle
#   per sequence.
# * `reserve` takes every block a step needs before any compute, all or nothing; `set_batch` turns the
#   batch's tables into one tensor; `write` scatters through the slot mapping, skipping padding, and the
#   last layer commits the lengths; `gather` reads each history back in position order.
# * `free` and `truncate` release blocks once per owner: a block is free again only when nobody names
#   it.
#
# **Going deeper.**
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)), the vLLM paper: the block table, the measured 20-38% utilization
#   of earlier systems.
# * vLLM's [`vllm/v1/core/kv_cache_manager.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_manager.py)
#   (`allocate_slots` answers "no room" without touching state) and
#   [`block_pool.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/block_pool.py); nano-vllm's
#   [`block_manager.py`](https://github.com/GeeeekExplorer/nano-vllm/blob/main/nanovllm/engine/block_manager.py)
#   for the same ideas in ~100 lines.
# * PMPP (Hwu, Kirk, El Hajj), §20.7, on the memory needs of attention.
# * [GPU Mode](https://github.com/gpu-mode/lectures) lecture 40 (FlashInfer) on paged and ragged
#   attention kernels in production.
#
# **Next.** Chapter 4 lets several sequences share blocks: `fork` and copy-on-write, the
# `shared_writes` your `reserve` already pays for.
