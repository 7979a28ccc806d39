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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_intro", "locked": true, "schema_version": 3, "solution": false}
# # 7. Continuous batching: admission, preemption and swap
#
# Chapters 2 to 6 built a cache that wastes at most one partial block per sequence. Memory saved is
# only worth something if a server turns it into more sequences running at once, and that is the
# scheduler's job. Every engine step it decides who runs, how many tokens each gets, and, when the
# pool runs dry, who has to give memory back.
#
# The engine's scheduler does this in one loop, `Scheduler.schedule()`, called once per step:
#
# 1. **Running sequences first**, decodes before prefill chunks. Each gets its tokens only after
#    `cache.reserve` has found room for them. If it cannot, the scheduler first **evicts** prefix-cache
#    blocks that nobody uses, and if that is not enough it **preempts the newest running sequence**,
#    by *recompute* (drop its K/V, prefill it again later) or by *swap* (copy its K/V to host memory).
# 2. **Swapped sequences** come back next, when their blocks and a safety margin fit.
# 3. **Waiting sequences** are admitted oldest first, but only if their whole prompt plus the margin
#    fits, and their first chunk is reserved before anything is computed.
#
# A token budget (`max_batched_tokens`) caps each step's work, so a long prompt is prefilled in
# chunks across several steps while the others keep decoding. That is *continuous batching*: the batch
# changes every step, and a finished sequence's blocks go to someone else right away.
#
# You write the decisions, as methods of the engine's own `Scheduler` and `PagedKVCache`:
#
# * Exercise 7.1, `admit`: let a waiting sequence in, reserving before any compute;
# * Exercise 7.2, `reserve_or_preempt`, `choose_victim`, `preempt`: what happens when `reserve` fails;
# * Exercise 7.3, `swap_out` and `swap_in` of the paged cache: the part chapter 3 left out;
# * Exercise 7.4, `fork_samples`: n samples of one request from one prefill.
#
# The milestone runs your scheduler and your swap inside the real engine on a pool so small that
# requests get preempted both ways, and demands that every request's output equal its solo run token
# for token, every logit a from-scratch run within $10^{-5}$, and that no block leak.
#
# **Which cells need your code.** Figures and benchmarks use the engine's reference scheduler. In a
# student edition of the engine its methods that you write are the ones your notebook defines, so the
# measurements of section 7.7 stop with "not written yet" until you have written the exercises; the
# cells before the exercises need none of them. Besides the graded checks, one cell, headed **With your code**,
# runs yours, after the milestone; until all four exercises are done it stops with
# `NotImplementedError`, which is expected.

# %% nbgrader={"grade": false, "grade_id": "ch07_setup", "locked": true, "schema_version": 3, "solution": false}
import math

from typing import Iterator

import torch

from engine.cache.paged import PagedKVCache as ReferenceCache   # the engine's
from engine.checks import ch07
from engine.course.authoring.figures import ch07 as figures
from engine.tools import simulate
from engine.serve.engine import Engine
from engine.serve.scheduler import Scheduler as ReferenceScheduler
from engine.serve.scheduler import SchedulerConfig

# The names the included engine methods below use.
from engine.cache.errors import OutOfBlocks  # noqa: F401
from engine.cache.paged import SwappedSequence  # noqa: F401
from engine.cache.slots import blocks_needed  # noqa: F401
from engine.serve.request import Sequence, Status, make_generator  # noqa: F401

torch.set_num_threads(1)
KiB, MiB, GiB = 2**10, 2**20, 2**30

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.1 Why: the same bytes, more sequences
#
# A server that gives each sequence a contiguous region must size the region when it admits the
# sequence, before anyone knows how long its output will be. The vLLM paper's Orca baselines size it
# three ways: `max` (every region as long as the longest request may get), `pow2` (the true final
# length rounded up to a power of two), and `oracle` (exactly the true final length, which no real
# server knows in advance). A paged cache, `paged`, takes small blocks as tokens arrive, so it holds
# only what the sequences have written, and the same bytes hold more sequences at once.
#
# It admits on the prompt alone and lets outputs grow into the pool, so when outputs outgrow the pool,
# somebody has to give memory back. A `max` region never has to: it reserved the worst case up front,
# which is exactly the waste paging removes. So paging moves the problem from the allocator to the
# scheduler: admit boldly, and have a correct, cheap answer for when the bet goes wrong. That answer
# is this chapter. Section 7.7 serves one workload all four ways on the same KV budget with the
# engine's scheduler, whose decisions are this chapter's exercises, and measures both claims.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_admit_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.2 Admission: reserve before any compute
#
# A step is planned completely before the forward pass runs: which rows, which tokens, and room in the
# cache for every one of those tokens. A failure discovered *during* the forward would leave some
# layers written and others not; a failure during planning just changes the plan. So every chunk the
# scheduler hands to the model has had `cache.reserve(seq, count)` succeed first.
#
# Admission adds one more rule. Reserving only the first chunk of a new prompt would let the scheduler
# admit sequences until the pool is exactly full, and at the next step every running sequence needs
# a new block for its next token and finds none: every step ends in preemption churn. So a newcomer is
# admitted only if its **whole remaining prompt** fits with a **margin** of free blocks left over for
# the running sequences to grow into:
#
# $$
# \begin{aligned}
# \text{admit} &\iff \text{free} \ge \text{blocks wanted}(\text{prompt} - \text{cached}) + \text{margin},\\
# \text{margin} &= \max\left(m,\ \lceil w \cdot \text{pool} \rceil\right),
# \end{aligned}
# $$
#
# where $m$ is `margin_blocks`, $w$ the `watermark` and "pool" the number of blocks in the pool,
# and the margin is 0 while nothing runs (otherwise a prompt that fills the pool would wait forever).
# vLLM's watermark defaults to 1% of the pool. Blocks that only the prefix cache holds count as free:
# `make_room(need)` evicts them when that is what it takes. And blocks reused from the prefix cache are
# counted *after* attaching, when they are already pinned by the newcomer and no longer evictable.

# %% nbgrader={"grade": false, "grade_id": "ch07_margin", "locked": true, "schema_version": 3, "solution": false}
config = SchedulerConfig()
llama, a100 = simulate.load_config("llama-2-13b"), simulate.GPUS["A100-40GB"]
roofline = simulate.Roofline(llama, a100)
pool_blocks = int(roofline.kv_budget_bytes() // (16 * roofline.kv_bytes_per_token))
margin = max(config.margin_blocks, math.ceil(config.watermark * pool_blocks))
print(f"defaults: margin_blocks={config.margin_blocks}, "
      f"watermark={config.watermark:.0%}, "
      f"token budget per step {config.max_batched_tokens}")
print(f"Llama-2-13B on an A100-40GB: {pool_blocks} blocks of 16 tokens; the margin is "
      f"{margin} blocks,")
print(f"room for {margin} running sequences to cross into a new block at once")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_ex_admit_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 7.1 — `admit` (4 points)
#
# The next cell is a subclass of the engine's `Scheduler` that defines only `admit(seq, budget)`;
# every other method is the engine's. `schedule()` calls it for the oldest
# waiting sequence while the step has token budget left, and stops admitting at the first 0. On
# success, `schedule()` pops `seq` from `self.waiting` and appends the chunk
# `Chunk(seq, seq.num_computed, count)`. `admit` either admits `seq` and returns how many of its
# tokens run this step, or returns 0 with nothing changed:
#
# * **Look up first.** `self.attach(seq)` creates `seq` in the cache, shares any cached prefix blocks
#   and returns how many of its tokens are already computed. Only then is it known what the sequence
#   still needs.
# * **Room for the rest of what it holds, plus the margin.** It needs blocks for *every* token of
#   `seq.tokens` that `attach` did not reuse (the prompt, and any output a recompute left to redo),
#   not just this step's, and not the output it may still generate:
#   `self.cache.blocks_wanted(seq_id, tokens)` counts them (the copy of a shared last block
#   included), and `self.margin()` is the margin of section 7.2.
#   `self.make_room(blocks)` says whether that many are free, or can be freed by evicting cached
#   blocks.
# * **No room: undo.** `self.detach(seq)` takes the attach back, and nothing else may have changed.
# * **Room: run.** The sequence starts from what the cache holds (`seq.num_computed`, and
#   `seq.cached_tokens` for the statistics). This step's chunk is as many of its pending tokens
#   (`seq.num_pending`) as the budget allows, and the cache reserves room for exactly that chunk.
#   The sequence is then running (`seq.status`, and the end of `self.running`). Leave the prefix
#   statistics alone: `schedule()` counts the lookup (`self.count_prefix_hit(seq)`) once `admit`
#   returns, so counting it here too would count every lookup twice.

# %% nbgrader={"grade": false, "grade_id": "ch07_admit", "locked": false, "schema_version": 3, "solution": true}
#| include engine/serve/scheduler.py::Scheduler.admit solve=admit

Admission = Scheduler

# %% nbgrader={"grade": true, "grade_id": "ch07_test_admit", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch07.check_admit(Admission)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_preempt_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.3 When `reserve` fails: evict, then preempt the newest
#
# Admission keeps a margin, but outputs keep growing, and sooner or later a running sequence asks for
# a block that is not there. `reserve` raises `OutOfBlocks` (a `MemoryError`) and changes nothing. The
# scheduler then frees memory in order of cost:
#
# 1. **Evict** prefix-cache blocks nobody uses (`self.evict_for(seq, count)` returns how many it
#    freed). They cost nothing now; a later request may have to recompute them.
# 2. **Preempt** a running sequence, and retry. Which one? The **newest**, the last in
#    `self.running` (admission order) that does not already hold its room for this step (its id is not
#    in `scheduled`). It has the least work invested, and first-come-first-served stays intact: old
#    requests keep moving, new ones wait. If the newest is the very sequence asking, it preempts
#    itself and steps aside.
#
# Preempting takes a sequence's memory back in one of two ways, chosen by the engine's
# `preemption_mode(seq)`:
#
# * **recompute**: free its blocks (publishing its full blocks to the prefix cache first, so they may
#   still be there when it returns), set `num_computed = 0`, and put it at the *front* of the waiting
#   queue. Its tokens stay: prompt *and* the tokens it already generated are prefilled again on
#   re-admission, and it continues exactly where it stopped. Nothing is sampled twice.
# * **swap**: copy its K/V to host memory (`cache.swap_out`), free its blocks, keep `num_computed`, and
#   queue it in `self.swapped` (nothing is published). `resume` (the engine's) brings it back when its
#   blocks fit again.
#
# Which is cheaper? Recompute costs a prefill of every token the victim has, swap costs moving its
# K/V over the host link twice. The next cell puts numbers on both for Llama-2-13B on an A100-40GB,
# pricing the prefill two ways: as a step of its own, and as the time it adds to a step that runs
# anyway, 16 decodes of sequences with 500-token histories.

# %% nbgrader={"grade": false, "grade_id": "ch07_costs", "locked": true, "schema_version": 3, "solution": false}
link = simulate.GPUS["A100-40GB"].host_gbps * 1e9
decodes = [(500, 1, True)] * 16        # (start, new tokens, samples?) per row
base = roofline.step_seconds(decodes)
print(f"Llama-2-13B: {roofline.kv_bytes_per_token / KiB:.0f} KiB of KV per token; "
      f"host link {link / 1e9:.0f} GB/s each way")
print(f"{'victim':>13s} {'swap out + in':>13s} {'prefill alone':>13s} "
      f"{'prefill added to 16 decodes':>28s}")
for tokens in (64, 256, 1024, 2048):
    swap_ms = 2 * tokens * roofline.kv_bytes_per_token / link * 1e3
    alone_ms = roofline.step_seconds([(0, tokens, True)]) * 1e3
    added_ms = (roofline.step_seconds(decodes + [(0, tokens, True)]) - base) * 1e3
    print(f"{tokens:6d} tokens {swap_ms:10.1f} ms {alone_ms:10.1f} ms "
          f"{added_ms:25.1f} ms")
print(f"engine default: preemption={config.preemption!r}, "
      f"swap_min_tokens={config.swap_min_tokens}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_costs2_md", "locked": true, "schema_version": 3, "solution": false}
# As a step of its own, a prefill is dominated by reading the weights once, which costs the same
# for 1 token or 64, and swap looks cheaper at every length. But a recomputed victim is prefilled
# inside a step that runs anyway: added to 16 decodes, a short victim's prefill costs almost nothing,
# because that step reads the weights regardless and has compute to spare, while its swap still
# moves every byte twice. A long victim makes the step compute-bound: its prefill costs FLOPs that
# grow with its length (attention's with its square), so its cost catches up with swap's, which
# grows with the bytes only, and then passes it. So short victims favour recompute and long ones
# swap, and where the two meet depends on the model, the GPU and what else runs. The engine's default
# `preemption="auto"` swaps victims with at least `swap_min_tokens` computed tokens (printed above)
# and recomputes shorter ones; the threshold is a knob (see Going deeper). vLLM recomputes by
# default, which also needs no host memory at all.
#
# ### Exercise 7.2 — `reserve_or_preempt`, `choose_victim`, `preempt` (3 + 2 + 4 points)
#
# * `reserve_or_preempt(seq, count, scheduled)`: get room in the cache for `count` more tokens of
#   `seq`, freeing memory in the order above until the reservation works (return True) or `seq`
#   itself is the one preempted (return False: it steps aside this step). A failed `reserve` raises
#   a `MemoryError` and changes nothing, so it can simply be tried again. `self.evict_for(seq,
#   count)` evicts and returns how many blocks it freed; a sequence is preempted only when eviction
#   freed none.
# * `choose_victim(scheduled)`: the newest sequence in `self.running` whose `seq_id` is not in the set
#   `scheduled` (newest by admission: `self.running` is in admission order, a re-admitted sequence
#   at its end whatever its id). There is always one: `reserve_or_preempt(seq, ...)` is its only
#   caller, and `seq` itself is running and not yet in `scheduled`, so at worst the asker is its own
#   victim. You need not handle an empty choice (the engine's `next(...)` would raise
#   `StopIteration`).
# * `preempt(seq)`: take `seq` out of `self.running` in the mode `self.preemption_mode(seq)` picks,
#   as described above, and return the mode. Choose the mode first: it depends on the sequence's
#   progress. The engine's helpers move the memory: `self.release(seq)` frees its blocks,
#   `self.release(seq, swap=True)` swaps them out to host memory first, and `self.publish(seq)` offers
#   the full blocks of its first `seq.num_computed` tokens to the prefix cache. So publish before
#   the release (the blocks are gone afterwards: the prefix cache raises `KeyError`) and before the
#   progress is reset (at 0 it publishes nothing). Only a recompute publishes: a swapped victim's K/V
#   come back from host memory, and blocks it published would stay in the pool, held by the prefix
#   cache, so the swap would free fewer blocks. Afterwards:
#   * after a swap, it is `Status.SWAPPED` at the end of `self.swapped`, its `num_computed` kept and
#     added to `self.swapped_tokens`;
#   * after a recompute, it is `Status.WAITING` at the *front* of `self.waiting`, with nothing
#     computed;
#   * either way, `seq.preemptions` and `self.preemptions[mode]` count one more.

# %% nbgrader={"grade": false, "grade_id": "ch07_preempt", "locked": false, "schema_version": 3, "solution": true}
#| include engine/serve/scheduler.py::Scheduler.reserve_or_preempt,choose_victim,preempt solve=reserve_or_preempt,choose_victim,preempt

Preemption = Scheduler

# %% nbgrader={"grade": true, "grade_id": "ch07_test_choose_victim", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch07.check_choose_victim(Preemption, Admission)

# %% nbgrader={"grade": true, "grade_id": "ch07_test_preempt", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch07.check_preempt(Preemption, Admission)

# %% nbgrader={"grade": true, "grade_id": "ch07_test_reserve_or_preempt", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch07.check_reserve_or_preempt(Preemption, Admission)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_swap_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.4 Swap out, swap in
#
# Swapping is where the block table earns its keep again. A swapped-out sequence's K/V leave the pool
# block by block, and when it comes back the allocator hands out whatever blocks are free then, almost
# never the ones it had. That is fine, because attention reads through the table: as long as the
# *i*-th saved block lands in the block the new table lists *i*-th, the sequence's history is intact.
# Get that order wrong and every logit after the swap is computed over a scrambled history.
#
# ### Exercise 7.3 — `swap_out` and `swap_in` (4 points)
#
# The cell is a subclass of the engine's `PagedKVCache` (chapter 3's cache) defining only the two
# swap methods. A swapped sequence is kept in `self.swapped[seq]` as a
# `SwappedSequence(length, keys, values)`, with `keys` and `values` on the CPU, each
# `[layers, blocks, kv_heads, block_size, head_dim]`.
#
# * `swap_out(seq)`: take the table entries that hold its `self.lengths[seq]` tokens
#   (`blocks_needed(length, self.block_size)` of them), gather those blocks from every layer's
#   `self.k_pools` / `self.v_pools` (a `torch.long` index tensor on `self.device`), stack them per layer
#   and move them `.to("cpu")`; store the `SwappedSequence`; `self.allocator.release` every block of
#   the table (a shared block just loses one owner); delete `self.tables[seq]` and `self.lengths[seq]`.
#   Return the number of blocks copied.
# * `swap_in(seq)`: a `KeyError` if `seq` is not swapped out; if the saved blocks outnumber
#   `self.allocator.num_free`, raise `OutOfBlocks(wanted, free, message)` and change nothing. Otherwise
#   allocate that many blocks, write saved block *i* of every layer into the *i*-th new block, drop
#   `self.swapped[seq]`, and set the table (the new blocks, in order) and the length it saved,
#   `self.lengths[seq] = saved.length`. Return the number of blocks.

# %% nbgrader={"grade": false, "grade_id": "ch07_swap", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/paged.py::PagedKVCache.swap_out,swap_in solve=swap_out,swap_in

# %% nbgrader={"grade": true, "grade_id": "ch07_test_swap", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch07.check_swap(PagedKVCache)
### BEGIN HIDDEN TESTS
ch07.check_swap(PagedKVCache, block_size=2)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_fork_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.5 n samples, one prefill
#
# Chapter 4 forked sequences by hand. In the engine, a request with `n > 1` runs as one sequence while
# its prompt is prefilled; when the last prompt chunk has run, the engine calls
# `scheduler.fork_samples(seq, new_ids)` and then samples a first token for the parent *and* each new
# sequence from the same logits row, each with its own generator. From then on the samples are
# ordinary running sequences that share the prompt's blocks n ways, copy the partial last block on
# their first write, and can be preempted, swapped and finished one by one.
#
# Sample $i$ must draw exactly what a request with seed $s + i$ would draw alone: the check compares
# each sample with a solo run of the same prompt and seed.
#
# ### Exercise 7.4 — `fork_samples` (3 points)
#
# `fork_samples(seq, new_ids)` turns a request's one prefilled sequence into its `n` samples and
# returns the `n - 1` new ones, in order. Sample $i$ ($1 \le i < n$, with `n` and `seed` from
# `seq.request`) is a `Sequence(seq_id, request, tokens, generator, sample_index=i)` whose id is the
# next of `new_ids`, whose tokens are its own copy of the parent's, and whose generator is
# `make_generator(seed + i)`: that is what makes it draw what a solo request with seed $s + i$ draws.
# Each new sample is listed in `request.sequences`, shares the parent's blocks in the cache (chapter
# 4's `fork`), has computed what the parent has, and is running (its status, and the end of
# `self.running`).

# %% nbgrader={"grade": false, "grade_id": "ch07_fork", "locked": false, "schema_version": 3, "solution": true}
#| include engine/serve/scheduler.py::Scheduler.fork_samples solve=fork_samples

Sampling = Scheduler

# %% nbgrader={"grade": true, "grade_id": "ch07_test_parallel_sampling", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch07.check_parallel_sampling(Sampling, Preemption, Admission)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_milestone_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.6 The milestone: serving under pressure
#
# The next cell puts your three scheduler cells together into one class (later classes first, so
# each method comes from the exercise that defines it) and runs it with your `PagedKVCache` in the
# real engine (6 points). Six greedy requests with prompts of $b - 1$, $b$, $b + 1$, $2b + 1$,
# $3b + 2$ and $4b + 3$ tokens (blocks of $b$), 21 output tokens each, share a pool that holds the longest
# request plus four blocks. A chunk budget of $4b$ tokens per step makes long prompts prefill over
# several steps, victims of $6b$ tokens or more are swapped and shorter ones recomputed, and one
# request is aborted after 12 engine steps, while it still holds blocks.
#
# Every surviving request's output must equal its solo run token for token, every logit it sampled
# from must equal a from-scratch run of its history within $10^{-5}$, both kinds of preemption must
# have happened, and once everything is done no block may remain taken.

# %% nbgrader={"grade": false, "grade_id": "ch07_compose", "locked": true, "schema_version": 3, "solution": false}
YourScheduler = ch07.your_scheduler(Sampling, Preemption, Admission)  # one class

# %% nbgrader={"grade": true, "grade_id": "ch07_test_serving", "locked": true, "points": 6, "schema_version": 3, "solution": false}
ch07.check_serving_under_pressure((Sampling, Preemption, Admission), PagedKVCache)
### BEGIN HIDDEN TESTS
ch07.check_serving_under_pressure((Sampling, Preemption, Admission), PagedKVCache,
                                  block_size=2, seed=1)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_trace_md", "locked": true, "schema_version": 3, "solution": false}
# ### Watching the step loop
#
# The milestone's workload once more, with the engine's reference scheduler and cache and without the
# abort, recorded step by step: blocks in use (top, with every preemption marked), and how many
# sequences run, wait, or sit swapped out (bottom). The table under it lists the first steps: watch
# the $4b$-token budget split the long prompts into chunks while the short ones already decode.

# %% nbgrader={"grade": false, "grade_id": "ch07_trace", "locked": true, "schema_version": 3, "solution": false}
reference_engine, _ = ch07.pressure_engine(ReferenceScheduler, ReferenceCache)
trace = figures.traced(reference_engine)
print(f"{'step':>4s} {'rows':>4s} {'tokens':>6s} {'free':>4s}  "
      "running / waiting / swapped (ids)")
for i, t in enumerate(trace[:8], 1):
    print(f"{i:4d} {t['rows']:4d} {t['tokens']:6d} {t['free_blocks']:4d}  "
          f"{t['running']} / {t['waiting']} / {t['swapped']}")
print(f"... {len(trace)} steps in all, "
      f"preemptions {reference_engine.scheduler.preemptions}")
figures.plot_trace(trace, reference_engine.cache.allocator.num_blocks,
                   "the milestone's workload, engine's scheduler (blocks of 4)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_yours_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your scheduler, step by step.** This cell needs Exercises 7.1 to 7.4; until they
# are done it stops with `NotImplementedError`. It replays the same workload with `YourScheduler` and
# your `PagedKVCache` and compares every step's plan with the engine's: with the same decisions, the
# two runs take the same steps.

# %% nbgrader={"grade": false, "grade_id": "ch07_yours", "locked": true, "schema_version": 3, "solution": false}
your_engine, _ = ch07.pressure_engine(YourScheduler, PagedKVCache)
your_trace = figures.traced(your_engine)
same = sum(a["running"] == b["running"] and a["tokens"] == b["tokens"]
           for a, b in zip(trace, your_trace))
print(f"your scheduler: {len(your_trace)} steps (engine's {len(trace)}), preemptions "
      f"{your_engine.scheduler.preemptions}")
print(f"(engine's {reference_engine.scheduler.preemptions}); "
      f"{same} of {len(trace)} steps planned identically")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_bench_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.7 When concurrency becomes tokens per second
#
# The measurement section 7.1 announced. The cell below serves one workload four times on this CPU,
# with the tiny model cut to one layer, and the same KV budget each time: the bytes of a few `max`
# slots. Three runs reserve a contiguous region per sequence at admission (`max`, `pow2`, `oracle`);
# the fourth, `paged`, takes small blocks as tokens arrive. The scheduler is the engine's, the same in
# all four runs (in a student edition of the engine, its `Scheduler` runs the methods your notebook
# defines: until you have written Exercises 7.1 to 7.4 the cell stops with "not written yet").
#
# "concurrent" is the mean number of running sequences over the steps in which requests were queued,
# the steps where memory was the limit. The figure shows, for the `max` and `paged` runs, the fraction
# of the KV pool that holds tokens and the number of running sequences over engine time; the cell
# prints each run's mean fill.

# %% nbgrader={"grade": false, "grade_id": "ch07_why", "locked": true, "schema_version": 3, "solution": false}
slots, max_len, block_size = 4, 96, 8
measured, measured_metrics = figures.no_grad(lambda: figures.measured(
    requests=32, slots=slots, max_len=max_len, block_size=block_size))
print(f"KV budget: the bytes of {slots} max slots of {max_len} tokens "
      f"({slots * max_len} tokens); paged blocks of {block_size}")
print(f"{'policy':8s} {'concurrent':>10s} {'peak':>5s} {'KV used':>8s} "
      f"{'tokens/s':>9s} {'preempted':>9s}")
for kind, run in measured.items():
    preempted = run["preemptions_recompute"] + run["preemptions_swap"]
    print(f"{kind:8s} {run['concurrent_mean_saturated']:10.2f} "
          f"{run['concurrent_peak']:5d} {run['kv_utilization_mean']:8.0%} "
          f"{run['output_tokens_per_s']:9.0f} {preempted:9d}")
concurrency = {k: run["concurrent_mean_saturated"] for k, run in measured.items()}
ratio = concurrency["paged"] / concurrency["max"]
print(f"paged runs {ratio:.1f}x as many sequences as max slots on the same bytes")
figures.plot_fill_and_batch({k: measured_metrics[k] for k in ("max", "paged")},
                            "MEASURED on this CPU: tiny model, one KV budget")
for kind in ("max", "paged"):
    steps = measured_metrics[kind].steps
    fill = sum(s.live_tokens / s.pool_tokens for s in steps) / len(steps)
    print(f"{kind:6s}: mean pool fill {fill:.0%}, {len(steps)} steps, "
          f"{measured[kind]['output_tokens_per_s']:.0f} output tokens/s")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_why2_md", "locked": true, "schema_version": 3, "solution": false}
# Paging holds the most sequences, and it is the only run that preempted anyone: the bet of section
# 7.1 and its price. Max slots sit well below full however long the queue is: each region is sized
# for the worst case. The paged pool holds more tokens and runs more sequences, until the queue drains.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_sim_md", "locked": true, "schema_version": 3, "solution": false}
# On a CPU, tokens per second barely follow: every extra row costs its own arithmetic. The vLLM paper's
# claim, 2-4x the throughput of the Orca baselines, is about GPUs, where a decode step is bound by
# *memory bandwidth*: it reads every weight once whatever the batch, so a step of 20 sequences costs
# little more than a step of 1. The next cell serves the bench's workload (prompts of 20-500 tokens,
# outputs of 10-200) with the real scheduler, allocator and caches on a roofline clock
# (`engine/tools/simulate.py`): each step costs
# $\max(\text{bytes}/\text{HBM bandwidth},\ \text{FLOPs}/\text{peak})$ plus swap traffic. It is a
# SIMULATION, good for ratios, not for absolute speed.

# %% nbgrader={"grade": false, "grade_id": "ch07_sim", "locked": true, "schema_version": 3, "solution": false}
sim, sim_metrics, constants = figures.simulated(requests=128)
print(f"SIMULATION: Llama-2-13B on an A100-40GB, {constants['kv_tokens']:,} tokens of "
      f"KV, weights {constants['weight_bytes'] / GiB:.1f} GiB")
print(f"  {'kind':6s} {'concurrent':>10s} {'tokens/s':>8s} {'memory-bound':>12s} "
      f"{'KV share of bytes':>17s}")
for kind, run in sim.items():
    print(f"  {kind:6s} {run['concurrent_mean_saturated']:10.1f} "
          f"{run['output_tokens_per_s']:8.0f} {run['memory_bound_fraction']:12.0%} "
          f"{run['kv_share_of_bytes']:17.0%}")
paged, slots_run = sim["paged"], sim["max"]
more = paged["concurrent_mean_saturated"] / slots_run["concurrent_mean_saturated"]
faster = paged["output_tokens_per_s"] / slots_run["output_tokens_per_s"]
print(f"paged / max: {more:.2f}x the sequences, {faster:.2f}x the tokens/s")
print(f"paged preempted {paged['preemptions_recompute']} by recompute, "
      f"{paged['preemptions_swap']} by swap")
figures.plot_fill_and_batch(sim_metrics, "SIMULATION: Llama-2-13B / A100-40GB")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_rates_md", "locked": true, "schema_version": 3, "solution": false}
# Why the tokens/s ratio is smaller than the concurrency ratio, and when it would vanish, shows in one
# decode step. The cell prices a step of $B$ sequences of 500 tokens each on the same roofline and
# prints the two kinds of bytes it reads. While the weights are most of them, adding a sequence adds
# only its own KV reads, and tokens/s grow almost as fast as $B$. Once KV reads rival the weights,
# each extra sequence makes every step slower, and the curve bends away from perfect scaling.
#
# Three things turn concurrency into little or no throughput (the verdicts of
# `engine/serve/README.md`): steps that are **compute-bound** (big prefill chunks, or a GPU with few
# FLOPs per byte), **KV reads dominating** the bytes (small weights, GQA models whose pools hold
# hundreds of sequences), and **preemption churn**. The paper's setting, a 13B model without GQA on a
# 40 GB card, is the sweet spot: the KV budget holds only tens of sequences, all of them in the region
# where a bigger batch is nearly free.

# %% nbgrader={"grade": false, "grade_id": "ch07_rates", "locked": true, "schema_version": 3, "solution": false}
rates = figures.decode_rates()
print(f"weights {roofline.weight_bytes / GiB:.1f} GiB, read once per step; KV of one "
      f"500-token sequence {500 * roofline.kv_bytes_per_token / MiB:.0f} MiB")
for r in rates:
    fits = "fits" if r["fits"] else "does not fit"
    print(f"  B={r['batch']:3d}: step {r['step_ms']:6.2f} ms, "
          f"{r['tokens_per_s']:5d} tokens/s, KV {r['kv_share']:.0%} of bytes, "
          f"{fits} in the KV budget")
figures.plot_decode_rates(rates, "SIMULATION: Llama-2-13B / A100-40GB, 500-token "
                                 "histories")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 7.8 Check your understanding
#
# R1 to R3 are graded automatically: put your answer in the cell under the question. Q4 and Q5 are
# answered in a few sentences; your instructor grades them by hand.
#
# **R1 (1 point).** A pool of 2,048 blocks, `margin_blocks=2`, `watermark=0.01`, and sequences are
# running. How many free blocks must a newcomer leave beyond its own prompt? Set `r1_answer`.

# %% nbgrader={"grade": false, "grade_id": "ch07_r1", "locked": false, "schema_version": 3, "solution": true}
r1_answer = None
### BEGIN SOLUTION
r1_answer = max(2, math.ceil(0.01 * 2048))
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch07_test_r1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch07.check_review_margin(r1_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_r2_md", "locked": true, "schema_version": 3, "solution": false}
# **R2 (1 point).** Three sequences run, admitted in the order A (900 tokens computed), B (300), C (40).
# A needs a new block; none is free and nothing is evictable. With `preemption="auto"` and
# `swap_min_tokens=128`, what does the engine's scheduler do? Set `r2_answer` to one letter.
#
# * (a) swap out A
# * (b) recompute C
# * (c) swap out C
# * (d) recompute B

# %% nbgrader={"grade": false, "grade_id": "ch07_r2", "locked": false, "schema_version": 3, "solution": true}
r2_answer = None
### BEGIN SOLUTION
r2_answer = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch07_test_r2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch07.check_review_victim(r2_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_r3_md", "locked": true, "schema_version": 3, "solution": false}
# **R3 (1 point).** Llama-2-13B stores 800 KiB (819,200 bytes) of KV per token in fp16. How many
# milliseconds of host-link time does one preemption by swap of a 2,000-token sequence cost in total
# (out, and later back in) over a link of 25 GB/s ($25 \cdot 10^9$ bytes/s) each way? Set `r3_answer`.

# %% nbgrader={"grade": false, "grade_id": "ch07_r3", "locked": false, "schema_version": 3, "solution": true}
r3_answer = None
### BEGIN SOLUTION
r3_answer = 2 * 2000 * 819_200 / 25e9 * 1e3
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch07_test_r3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch07.check_review_swap_ms(r3_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** Why does the scheduler preempt the *newest* running sequence rather than the
# oldest, and why must a sequence preempted by recompute go to the *front* of the waiting queue?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch07_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) the newest has the least work invested (fewest tokens computed, so the cheapest to
# recompute or swap) and preempting it keeps first-come-first-served: the oldest requests, which have
# waited longest, keep making progress; preempting the oldest can starve it (it is preempted again
# each time it comes back). (1 point) It was admitted before everything still waiting; putting it at
# the front restores its place in arrival order, so requests that arrived after it cannot overtake
# it; at the back it would wait behind the whole queue, and could be overtaken again and again.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_q5_md", "locked": true, "schema_version": 3, "solution": false}
# **Q5 (2 points).** Paging lets a server run several times as many sequences in the same KV memory
# (section 7.7 printed the ratio). Give two situations in which that brings little or no extra
# tokens per second, and say why.

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch07_q5", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: one point each for two of: (a) compute-bound steps (large prefill chunks, all prompts at
# once, a CPU, a GPU with few FLOPs per byte): step time grows with the tokens in it, so more rows
# just make steps longer; (b) KV reads dominate the bytes (small weights or many GQA sequences): each
# extra sequence adds its own reads, so step time grows with the batch; (c) preemption churn: an
# output-heavy mix fills the pool and the extra work of swapping or recomputing eats the gain;
# (d) not enough load: with few requests memory never binds, so both systems run everything.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch07_deeper", "locked": true, "schema_version": 3, "solution": false}
# ## 7.9 Going deeper
#
# * **Deadline-aware victims.** `choose_victim` sees every running sequence's blocks, computed tokens
#   and age in O(1). Replace "newest" by "most slack to its deadline" or "cheapest to recompute" and
#   measure time-to-first-token percentiles with `python -m engine bench --request-rate R`.
# * **vLLM V1's unified scheduler**
#   ([`vllm/v1/core/sched/scheduler.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/sched/scheduler.py)) schedules every
#   request's tokens in one budget each step (no separate prefill and decode phases) and preempts by
#   recompute only; compare its `schedule()` with this engine's three-phase loop.
# * **Swap or recompute, in the loop.** Run `python -m engine bench --simulate llama-2-13b --gpu
#   A100-40GB --workload sharegpt --kinds max paged` and read how the paged run's preemptions split
#   between the two modes; then raise `swap_min_tokens` in `SchedulerConfig`
#   (`engine/serve/batch.py`) and watch recompute take over, or set `preemption="recompute"`,
#   vLLM's choice, and compare tokens/s.
# * **Chunked prefill and latency.** Vary `max_batched_tokens`: small budgets keep decodes flowing
#   (low inter-token latency) at the price of a longer time to first token
#   ([Sarathi-Serve](https://arxiv.org/abs/2403.02310), Agrawal et al., OSDI 2024).
# * **The paper.** Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165),
#   SOSP 2023 ([arXiv:2309.06180](https://arxiv.org/abs/2309.06180)), section 4.5 (scheduling and preemption) and section 6
#   (evaluation).
#
# ## Summary
#
# * A step is planned before it runs: every scheduled token has had `reserve` succeed, and a newcomer
#   is admitted only if its whole prompt fits with a margin for the running sequences to grow into.
# * When `reserve` fails: evict unused prefix blocks, then preempt the newest running sequence, by
#   recompute (short victims; re-prefill prompt and outputs) or swap (long ones; K/V to host and
#   back, restored block for block in table order).
# * n samples of one request cost one prefill: the prompt's blocks are shared n ways through fork.
# * Paging buys concurrency; concurrency buys tokens/s only while steps stay bound by reading the
#   weights.
#
# **Next.** Chapter 8 goes past the paper: blocks as quantization groups, and architectures that
# change the byte math.
