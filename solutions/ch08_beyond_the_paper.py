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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_intro", "locked": true, "schema_version": 3, "solution": false}
# # 8. Beyond the paper: int8 blocks, latent caches, production engines
#
# Seven chapters built the paged KV cache of the vLLM paper: the price of a token (chapter 1), block
# tables and a reference-counted allocator (2), the paged cache (3), copy-on-write (4), the prefix
# cache (5), a paged attention kernel (6) and the scheduler that turns all of it into throughput (7).
# This chapter takes up two questions the paper leaves open, and ends with a map of what production
# engines have built on the same mechanism.
#
# 1. **Blocks as quantization groups.** Storing K and V in 8 bits halves the bytes per token, and so
#    doubles how many tokens fit. Quantization needs a group of numbers that share a scale, and a
#    block is already the unit the cache allocates, shares, copies and moves. You will write the int8
#    path of the engine's cache: quantize on write, dequantize on read, and a copy-on-write that
#    carries the scales.
# 2. **Architectures that change the byte math.** DeepSeek-V2's multi-head latent attention (MLA)
#    caches one small latent vector per token and layer instead of K and V per head. You will compute
#    the bytes per token of any `config.json`, GQA or MLA, and see what the change does to the choice
#    of block size.
# 3. **What production engines add**: vLLM, SGLang and TensorRT-LLM, each feature traced back to the
#    chapter where you built its mechanism.
#
# **How to work.** Run the cells in order. A cell with `raise NotImplementedError()` is yours to write;
# the locked cell after it runs the graded check and prints a line starting with ✓, or says what it
# expected, what came back, and a hint. Figures and demonstrations use the engine's own code, so they
# run before you have written anything, except the two after Exercise 8.1 that write int8 blocks
# with the engine's `quantize_into`: in a student edition of the engine that method is the one your
# notebook defines. Two cells run *your* code, each under a heading that starts
# with **With your code**, after the tests of the exercise it needs; until then they stop with
# `NotImplementedError`, which is expected.

# %% nbgrader={"grade": false, "grade_id": "ch08_setup", "locked": true, "schema_version": 3, "solution": false}
import torch

import engine.cache.quantized
from engine.cache.paged import PagedKVCache
from engine.cache.quantized import QMAX, SCALE_FLOOR  # noqa: F401  (for your code)
from engine.cache.quantized import kv_bytes_per_token
from engine.cache.quantized import QuantizedPagedKVCache as ReferenceInt8Cache
from engine.checks import ch08, tiny
from engine.checks.ch08 import INT8_ATOL, kv_bytes_reference, load_hf
from engine.config import known_config
from engine.course.authoring.figures.ch08 import (
    block_values, draw_block, plot_block_choice, plot_block_tradeoff, plot_capacity,
    plot_readback_error, readback_errors, simulated_capacity)
from engine.course.authoring.widgets import explorer
from engine.generate import cached_step, scratch_logits
from engine.seeded import seeded_tokens

KiB, MiB, GiB = 2**10, 2**20, 2**30
model = tiny()

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.1 Why: capacity is bytes per token
#
# Chapter 1 priced a token of Llama-2-13B at 800 KiB of fp16 K and V, and chapter 7 showed that on an
# A100-40GB the KV budget left after the weights, not the compute, caps how many requests run at once.
# Every byte saved per token is a request more in the batch. The cell below prices one token three
# ways, with the engine's `kv_bytes_per_token(config, kv_dtype, block_size)`: in fp16, in int8 with a
# float32 scale per block of 16 tokens, per KV head, per layer, for K and for V, and the share of the
# int8 figure that is scales.

# %% nbgrader={"grade": false, "grade_id": "ch08_why", "locked": true, "schema_version": 3, "solution": false}
print(f"{'model':12s} {'fp16 KiB':>8s} {'int8 KiB':>8s} {'int8/fp16':>9s} "
      f"{'scales B':>8s} {'scales/int8':>11s}   (per token)")
for name in ("llama-2-13b", "llama-3-8b", "qwen3-0.6b"):
    config = known_config(name)
    fp16 = kv_bytes_per_token(config, "fp16")
    int8 = kv_bytes_per_token(config, "int8", 16)
    scales = int8 - fp16 / 2
    print(f"{name:12s} {fp16 / KiB:8.0f} {int8 / KiB:8.2f} {int8 / fp16:9.2%} "
          f"{scales:8.0f} {scales / int8:11.2%}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_idea_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.2 The idea: one scale per block per KV head
#
# **Symmetric int8.** A group of numbers $x_1, \dots, x_n$ shares one scale
# $s = \max_i |x_i| / 127$. Each number is stored as the code $q_i = \mathrm{round}(x_i / s)$, an
# integer in $[-127, 127]$, and read back as $\hat x_i = q_i\, s$. Rounding costs at most half a step:
# $|x_i - \hat x_i| \le s/2$, that is, $1/254$ of the group's largest magnitude. The group is the whole
# question: one outlier in a group coarsens the step for all its members, so smaller groups are more
# accurate, and every group pays for its scale.
#
# **The block is the group.** The engine's `QuantizedPagedKVCache` keeps, per layer, int8 pools `[num_blocks, kv_heads, block_size, head_dim]` for K and V and, beside
# them, float32 scales `[num_blocks, kv_heads]`: one scale per physical block per KV head (heads differ
# in range, so they get their own). Because a scale is indexed by the *physical* block id, it lives
# wherever the block lives:
#
# * a **fork** or a **prefix-cache hit** puts the same block id in a second table: the codes and the
#   scale are shared together, at no cost;
# * **copy-on-write** copies a block into a fresh one: the scale must be copied with it;
# * **swap** moves a sequence's blocks to host memory and back, maybe into other block ids: the
#   scales travel beside the codes.
#
# For a 16-token block with head_dim 128 a scale costs 4 bytes against $16 \times 128 = 2{,}048$
# bytes of codes, 0.2%.
#
# **Where the cache does it.** Every write goes through `store(layer, blocks, offsets, keys, values)`,
# which quantizes K and V with `quantize_into`; every read dequantizes the blocks of each row's table
# with `dequantize`, then runs ordinary attention over the values (the Triton kernels of chapter 6
# read fp pools; a kernel that dequantizes as it loads is a stretch exercise).

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_when_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.3 When is a block's scale set?
#
# A block fills one token per decode step. When token 0 arrives, the other 15 do not exist yet, so
# the scale cannot be the maximum over the block. Three answers:
#
# 1. **Fix the scale at the first write and clamp** later tokens to $[-127, 127]$. Simple, and wrong
#    whenever a later token is larger than the first: it is clipped, by any amount.
# 2. **Grow the scale and re-round.** When a write needs a larger scale $s' > s$, the codes already in
#    the block are re-rounded, $q \leftarrow \mathrm{round}(q\, s / s')$, and the new tokens are coded
#    with $s'$. Each growth adds at most half a new step of error to the earlier tokens. A scale never
#    shrinks: it must keep covering what is stored. This is what the engine does.
# 3. **Keep the partial block in full precision** and quantize it once it is full, with its exact
#    maximum (KIVI keeps such a full-precision residual of recent tokens). Exact groups, at the cost
#    of one unquantized block per sequence and a second storage format; a stretch exercise.
#
# Section 8.4 measures the three rules once you have written the engine's `quantize_into`
# (Exercise 8.1).

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_shared_md", "locked": true, "schema_version": 3, "solution": false}
# **Re-rounding rewrites the block, so only its sole owner may do it.** Suppose a fork shares a
# partially filled block, and the child's next token needs a larger scale. Re-rounding the shared
# block in place would change the codes and the scale the *parent* reads: the parent's history, which
# chapter 3 made immutable, shifts under it, and its logits change although none of its tokens did.
# The rule that prevents this is the one chapter 4 already enforces: `reserve` copies a shared block
# before anything is written into it, so every block a write touches has reference count 1. The
# engine's `store` checks it and refuses to write into a shared block, and a write may change *no
# other block* than the ones it writes into: a scale for the whole pool, or a pass that rescales
# blocks a write does not touch, breaks sharing the same way.
#
# **Identical tokens, identical bytes?** The prefix cache (chapter 5) reuses a full block for any
# request with the same prefix, on the promise that the block holds exactly what that request would
# have computed. With rule 2, a block's final codes depend on *how* its tokens arrived: written in one
# prefill, its scale is set once; written token by token, earlier codes were re-rounded on the way.
# Both read back within a rounding step of the fp32 values, so a prefix hit still keeps the logits
# within the tolerance, but "identical tokens, identical bytes" becomes "identical within int8
# rounding" unless blocks are quantized once, when full (rule 3). Section 8.4 counts the codes that
# differ.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_ex_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.4 The int8 path of the cache
#
# ### Exercise 8.1 — `quantize_into`, `dequantize` and `copy_on_write` (4 + 2 + 2 points)
#
# The next cell defines `QuantizedPagedKVCache` as a subclass of the engine's holding only the
# three methods you write; everything else (reserve, fork, swap, the
# write and read paths) is the engine's. The cache has, per layer, `self.k_pools[layer]` and
# `self.v_pools[layer]` (int8, `[num_blocks, Hkv, block_size, D]`), `self.k_scales[layer]` and
# `self.v_scales[layer]` (float32, `[num_blocks, Hkv]`), `self.block_size` and `self.read_dtype`
# (the dtype reads return, float32 here). The constants `QMAX = 127` and `SCALE_FLOOR = 1e-12` are
# imported.
#
# **`quantize_into(pool, scales, blocks, offsets, rows)`** writes `rows` `[N, Hkv, D]` (floats): row
# `i` goes to block `blocks[i]`, slot `offsets[i]` (`blocks`, `offsets`: `[N]` long tensors; several
# rows may go to one block, and one call may touch several blocks). For each block it touches:
#
# * the block's *kept* scale is its current scale, or 0 if this write reaches offset 0 (then the
#   block is fresh: whatever it holds belongs to a previous owner);
# * its new scale, per head, is `max(kept scale, largest |value| of that head among this write's rows
#   for the block / QMAX)`, at least `SCALE_FLOOR`;
# * the codes it already holds are re-rounded to the new scale: `round(code * kept / new)` (this
#   leaves them unchanged where the scale did not grow, and zeroes a fresh block);
# * then each row is stored as `round(row / new scale)`, clamped to `[-QMAX, QMAX]`, as int8.
#
# It must not change any other block. `torch.unique(blocks, return_inverse=True)` gives each touched
# block once and, for each row, the index of its block; `Tensor.scatter_reduce_(0, index, src, "amax")`
# (or `"amin"`) reduces rows per block. A Python loop over the touched blocks is fine too.
#
# **`dequantize(pool, scales, blocks)`** returns the values of the blocks whose ids are in `blocks`
# (a long tensor of any shape): `blocks.shape + [Hkv, block_size, D]`, each code times the scale of
# its block and head, in `self.read_dtype`.
#
# **`copy_on_write(seq, index)`** does what the paged cache's does (call
# `PagedKVCache.copy_on_write(self, seq, index)`: it copies a shared block's codes into a fresh block
# and repoints the table) and, if the table entry changed, copies the old block's scales to the fresh
# block in every layer, for K and for V.

# %% nbgrader={"grade": false, "grade_id": "ch08_cache", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/quantized.py::QuantizedPagedKVCache.quantize_into,dequantize,copy_on_write solve=quantize_into,dequantize,copy_on_write

# %% nbgrader={"grade": true, "grade_id": "ch08_test_quantize", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch08.check_quantize_on_write(QuantizedPagedKVCache)

# %% nbgrader={"grade": true, "grade_id": "ch08_test_dequantize", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch08.check_dequantize_on_read(QuantizedPagedKVCache)

# %% nbgrader={"grade": true, "grade_id": "ch08_test_cow", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch08.check_copy_on_write_carries_scales(QuantizedPagedKVCache)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_when_measured_md", "locked": true, "schema_version": 3, "solution": false}
# ### When the scale is set, measured
#
# The next two cells measure the rules of section 8.3 with the engine's int8 cache. They come after
# Exercise 8.1 because in a student edition of the engine its `quantize_into` is the one your notebook
# defines: until you have written it they stop with `NotImplementedError`. The first writes the 16
# values of one real block of the tiny model (layer 0's V of a 16-token prompt) one token at a time,
# the way decoding does, and plots how far each token reads back from its fp32 value under each rule.

# %% nbgrader={"grade": false, "grade_id": "ch08_when", "locked": true, "schema_version": 3, "solution": false}
values = block_values(model, seeded_tokens(16, seed=3))
errors = readback_errors(values)
for policy, errs in errors.items():
    print(f"{policy:50s} worst {max(errs):.4f}   mean {sum(errs) / len(errs):.4f}")
plot_readback_error(errors, block_size=16)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_bytes_differ_md", "locked": true, "schema_version": 3, "solution": false}
# The second writes the same 16 values both ways, in one write as a prefill does and in 16 as decoding
# does, and counts the codes that differ (identical tokens, identical bytes?).

# %% nbgrader={"grade": false, "grade_id": "ch08_bytes_differ", "locked": true, "schema_version": 3, "solution": false}
def write_block(values, one_by_one):
    """values [16, Hkv, D] into block 0 of an engine int8 pool: one write or 16."""
    cache = ReferenceInt8Cache(model.config, 1, block_size=len(values))
    pool, scales = cache.v_pools[0], cache.v_scales[0]
    everyone = list(range(len(values)))
    writes = [[i] for i in everyone] if one_by_one else [everyone]
    for offsets in writes:
        cache.quantize_into(pool, scales, torch.zeros(len(offsets), dtype=torch.long),
                            torch.tensor(offsets), values[offsets])
    return cache, pool[0].clone(), scales[0].clone()


_, prefill_codes, prefill_scale = write_block(values, one_by_one=False)
decode_cache, decode_codes, decode_scale = write_block(values, one_by_one=True)
differ = int((prefill_codes != decode_codes).sum())
print(f"same scales either way: {torch.equal(prefill_scale, decode_scale)}; "
      f"{differ} of {prefill_codes.numel()} codes differ, by at most "
      f"{int((prefill_codes.int() - decode_codes.int()).abs().max())} step(s)")
draw_block(decode_codes[0], float(decode_scale[0]), "head 0, written token by token")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_milestone_md", "locked": true, "schema_version": 3, "solution": false}
# ### The milestone: int8 blocks in the engine
#
# Quantized logits cannot equal the fp32 ones to $10^{-5}$; the question is how far they may move.
# The checks allow `INT8_ATOL` (printed below) on the tiny model: well above what the engine's int8
# cache reaches on these runs (each check prints its worst difference), small beside the logits
# themselves (the **With your code** cell after the checks prints their size), and far below the
# damage of a scale fixed at the first token, with later tokens clamped. They add what quantization must never break: a block another sequence reads stays *bit
# for bit* the same.
#
# The first check (3 points) forks a sequence in the middle of a block and lets the child write (its
# copy of the partial block must carry the scales; the parent's blocks must not change), swaps the
# child out and back in, and serves a prompt that reuses two int8 blocks from the prefix cache. The
# second (5 points) is the decisive one: a ragged batch of 4 sequences (lengths
# $b-1, b, b+1, 2b+1$), prefilled and decoded for 20 steps, with a fork and a swap on the way; every
# step's logits against an fp32 from-scratch run of the same tokens.

# %% nbgrader={"grade": true, "grade_id": "ch08_test_sharing", "locked": true, "points": 3, "schema_version": 3, "solution": false}
print(f"INT8_ATOL = {INT8_ATOL}")
ch08.check_sharing_keeps_scales(QuantizedPagedKVCache)

# %% nbgrader={"grade": true, "grade_id": "ch08_test_logits", "locked": true, "points": 5, "schema_version": 3, "solution": false}
ch08.check_int8_logits(QuantizedPagedKVCache)
### BEGIN HIDDEN TESTS
ch08.check_int8_logits(QuantizedPagedKVCache, block_size=8, seed=1)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_yours_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: how far int8 moves the logits.** This cell needs Exercise 8.1. It prefills a
# 40-token prompt through your cache and through the engine's fp32 `PagedKVCache`, and prints the
# size of the logits, the largest logit difference of each cache from a from-scratch run, and whether
# the greedy next tokens agree.

# %% nbgrader={"grade": false, "grade_id": "ch08_yours", "locked": true, "schema_version": 3, "solution": false}
prompt = seeded_tokens(40, seed=8)
want = scratch_logits(model, [prompt])[0]
print(f"the from-scratch logits: largest |x| {float(want.abs().max()):.1f}, "
      f"standard deviation {float(want.std()):.1f}")
for label, cache in (("fp32 PagedKVCache", PagedKVCache(model.config, 4, 16)),
                     ("your int8 cache", QuantizedPagedKVCache(model.config, 4, 16))):
    cache.create(0)
    got = cached_step(model, cache, [0], [prompt])[0]
    same = bool((got.argmax(-1) == want.argmax(-1)).all())
    print(f"{label:18s} max |Δ| {float((got - want).abs().max()):.2e}; "
          f"greedy picks agree at all 40 positions: {same}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_capacity_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.5 What int8 buys
#
# **Bytes, measured.** The first line measures bytes per token slot from the tensors of the engine's
# caches on the tiny model (whose small head_dim, printed, makes the scales' share larger than on
# real models).
#
# **Capacity, simulated.** The serving simulator of `engine/serve` (chapter 7) runs the real scheduler,
# allocator and paged cache against a roofline clock. The cell gives it the KV budget an A100-40GB
# has left after Llama-2-13B's weights, cut into blocks of 16 tokens in fp16 and in int8 (scales
# included), serves the same requests (prompts of 20-500 tokens, 10-200 output tokens, all queued
# at time 0), and reports the mean number of sequences running while requests wait. The clock also
# reads half the KV bytes per step in int8; it does not charge for dequantizing. This is a simulation
# (`engine/serve/README.md` says what it can and cannot predict), not a measurement on a GPU.

# %% nbgrader={"grade": false, "grade_id": "ch08_capacity", "locked": true, "schema_version": 3, "solution": false}
fp16_cache = PagedKVCache(model.config, 8, 16, dtype=torch.float16)
fp16_pools = fp16_cache.k_pools + fp16_cache.v_pools
fp16_per_slot = sum(p.numel() * p.element_size() for p in fp16_pools) / (8 * 16)
int8_per_slot = ReferenceInt8Cache(model.config, 8, 16).bytes_per_token()
print(f"tiny model (head_dim {model.config.head_dim}), measured: fp16 "
      f"{fp16_per_slot:.0f} B/token, int8 {int8_per_slot:.0f} B/token "
      f"({int8_per_slot / fp16_per_slot:.1%})")
requests = 160
runs = [simulated_capacity("llama-2-13b", "A100-40GB", kv, requests=requests)
        for kv in ("fp16", "int8")]
print(f"{requests} requests:")
for run in runs:
    print(f"{run['kv']}: {run['blocks']:,} blocks of 16 in "
          f"{run['kv_budget_bytes'] / GiB:.2f} GiB; {run['concurrent_mean']:.1f} "
          f"sequences running on average (peak {run['concurrent_peak']});\n      "
          f"{run['output_tokens_per_s']:,.0f} output tokens/s; "
          f"{run['preemptions']} preemptions")
fp16_run, int8_run = runs
print(f"int8 / fp16: {int8_run['blocks'] / fp16_run['blocks']:.2f}x the blocks, "
      f"{int8_run['concurrent_mean'] / fp16_run['concurrent_mean']:.2f}x the "
      "concurrency, "
      f"{int8_run['output_tokens_per_s'] / fp16_run['output_tokens_per_s']:.2f}x "
      "the tokens/s")
plot_capacity(runs, "SIMULATED (roofline): Llama-2-13B on an A100-40GB, same KV budget")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_capacity_read_md", "locked": true, "schema_version": 3, "solution": false}
# Twice the blocks give about twice the sequences in flight: capacity scales with the inverse of the
# bytes per token, exactly as chapter 1's arithmetic said. Throughput grows less than concurrency:
# the weights are read once per step whatever the batch, so doubling the batch does not double the
# tokens per second (chapter 7 explains when concurrency turns into tokens/s).

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_mla_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.6 Architectures that change the byte math
#
# Every number so far assumed that a layer caches K and V for each KV head:
# $2 \cdot \text{layers} \cdot \text{KV heads} \cdot \text{head dim}$ numbers per token (chapter 1).
# Grouped-query attention shrinks the kv_heads factor. **Multi-head latent attention** (MLA, DeepSeek-V2,
# 2024) changes the formula: each layer compresses a token's hidden state into one latent vector of
# `kv_lora_rank` numbers, from which every head's K and V are rebuilt by matrix products, and caches
# that latent, plus one small key of `qk_rope_head_dim` numbers that carries the rotary position and is
# shared by all heads. So per token and layer MLA caches `kv_lora_rank + qk_rope_head_dim` numbers,
# once, not once for K and once for V:
#
# $$\text{MLA bytes/token} = \text{layers} \cdot (d_c + d_r) \cdot \text{bytes},$$
#
# where $d_c$ is the latent's size, `kv_lora_rank`, and $d_r$ the rotary key's, `qk_rope_head_dim`.
#
# DeepSeek-V2 (`engine/configs/mla/deepseek-v2.json`) has 60 layers, a latent of 512 and a rotary key
# of 64: it caches $512 + 64$ numbers per token and layer, where Llama-3-70B caches $2 \times 8
# \times 128$ (K and V of its 8 KV heads of 128); the cell after Exercise 8.2 prints what that makes
# per token. The paging mechanism does not care what a block holds; the
# arithmetic of the previous chapters does.
#
# ### Exercise 8.2 — `kv_bytes_per_token_hf(hf, dtype_bytes=2)` (3 points)
#
# Write `kv_bytes_per_token_hf(hf, dtype_bytes=2)`: it takes a `config.json` as a dict and the bytes
# of one stored number, and returns the KV bytes of one token:
#
# * if the dict has `"kv_lora_rank"`, it is MLA: use the formula above;
# * otherwise GQA/MHA: `2 * num_hidden_layers * kv_heads * head_dim * dtype_bytes`, where `kv_heads`
#   is `num_key_value_heads` (or `num_attention_heads` if that key is absent) and `head_dim` is the
#   config's `head_dim` when present, else `hidden_size // num_attention_heads`. Some `config.json`
#   files write `"head_dim": null`: a key that is there with the value `None` counts as absent, so
#   compute it as the engine does, `hidden_size // num_attention_heads` (`hf.get("head_dim")` is
#   `None` then; a default in `hf.get("head_dim", default)` is not used).
#
# The check runs it on the four configs of `engine/configs`, DeepSeek-V2 and a small made-up MLA
# config, with 2 and with 1 byte per number. `load_hf(name)` reads one of them, e.g.
# `load_hf("deepseek-v2")`.

# %% nbgrader={"grade": false, "grade_id": "ch08_kv_bytes", "locked": false, "schema_version": 3, "solution": true}
def kv_bytes_per_token_hf(hf, dtype_bytes=2):
    """KV bytes of one token for a config.json dict: GQA/MHA, or MLA (kv_lora_rank)."""
    ### BEGIN SOLUTION
    layers = hf["num_hidden_layers"]
    if "kv_lora_rank" in hf:             # MLA: one latent + one rotary key per layer
        return layers * (hf["kv_lora_rank"] + hf["qk_rope_head_dim"]) * dtype_bytes
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ch08_test_kv_bytes", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch08.check_kv_bytes_from_config(kv_bytes_per_token_hf)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_yours_bytes_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: every config.** This cell needs Exercise 8.2. It prices one token of each model
# with your function, in bf16 and in 8 bits, beside the engine's reference.

# %% nbgrader={"grade": false, "grade_id": "ch08_yours_bytes", "locked": true, "schema_version": 3, "solution": false}
for name in ("llama-2-13b", "llama-3-8b", "llama-3-70b", "qwen3-0.6b", "deepseek-v2"):
    hf = load_hf(name)
    yours = [kv_bytes_per_token_hf(hf, b) for b in (2, 1)]
    engine_says = [kv_bytes_reference(hf, b) for b in (2, 1)]
    print(f"{name:12s} bf16 {yours[0] / KiB:6.1f}, 8-bit {yours[1] / KiB:6.1f} "
          f"KiB/token; the engine's reference agrees: {yours == engine_says}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_tradeoff_md", "locked": true, "schema_version": 3, "solution": false}
# ### What MLA does to the block size
#
# Chapter 2 chose 16 tokens per block by weighing waste (about half a block per sequence, in bytes)
# against overhead (one table entry, one kernel iteration and, for the prefix cache, one hash per
# block). With several times fewer bytes per token, a 16-token MLA block holds a fraction of the
# bytes a Llama-3-70B block does (the cell prints both), while the per-block overheads stay the
# same: the balance moves toward larger blocks. The cell prints, with the engine's reference
# numbers, the bytes of a block, the table entries of one sequence of $2^{20}$ (about a million)
# tokens, and the mean waste per sequence (half a block) for both models; the figure draws the first
# two against the block size (the dotted line marks a 16-token Llama-3-70B block). A larger MLA
# block also coarsens what the prefix cache can share: a hit counts only whole blocks.

# %% nbgrader={"grade": false, "grade_id": "ch08_tradeoff", "locked": true, "schema_version": 3, "solution": false}
models = {"Llama-3-70B (GQA, bf16)": "llama-3-70b",
          "DeepSeek-V2 (MLA, bf16)": "deepseek-v2"}
per_token = {label: kv_bytes_reference(load_hf(name)) for label, name in models.items()}
context, sizes = 2**20, [1, 2, 4, 8, 16, 32, 64, 128, 256]
for (name, b), hf in zip(per_token.items(), map(load_hf, models.values())):
    layers = hf["num_hidden_layers"]
    print(f"{name}: {b / KiB:.1f} KiB/token, {b / layers:,.0f} B per layer")
    for size in (16, 256):
        print(f"   blocks of {size:3d}: {size * b / MiB:6.2f} MiB each, "
              f"{-(-context // size):6,d} table entries, "
              f"~{size / 2 * b / MiB:5.2f} MiB wasted per sequence")
ratio = per_token["Llama-3-70B (GQA, bf16)"] / per_token["DeepSeek-V2 (MLA, bf16)"]
print(f"GQA/MLA bytes per token: {ratio:.2f}")
plot_block_tradeoff(per_token, sizes, context)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_explorer_md", "locked": true, "schema_version": 3, "solution": false}
# **An explorer.** Pick a model and a block size; it prints what one block holds, the block table of a
# million-token sequence and the mean waste, and marks the choice on the curve of bytes per block (the
# dotted line is a 16-token Llama-3-70B block). Every state is drawn in advance, so it also works in
# the static book.

# %% nbgrader={"grade": false, "grade_id": "ch08_explorer", "locked": true, "schema_version": 3, "solution": false}
MODELS = ["llama-3-8b", "llama-3-70b", "deepseek-v2"]
gqa = per_token["Llama-3-70B (GQA, bf16)"]


def explore_blocks(model_name="deepseek-v2", block_size=16):
    b = kv_bytes_reference(load_hf(model_name))
    print(f"{model_name}: {b / KiB:.1f} KiB/token at bf16; blocks of {block_size}: "
          f"{block_size * b / MiB:.2f} MiB per block,")
    print(f"{-(-context // block_size):,} table entries for {context:,} tokens, "
          f"~{block_size / 2 * b / MiB:.2f} MiB wasted per sequence")
    plot_block_choice(model_name, b, ("Llama-3-70B", gqa), sizes[2:], block_size)


explorer(explore_blocks, model_name=(MODELS, "deepseek-v2"),
         block_size=([16, 32, 64, 128], 16))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_production_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.7 What production engines add, and where you built it
#
# vLLM, SGLang and TensorRT-LLM all serve from a pool of fixed-size KV blocks reached through
# per-request tables. What they add sits on mechanisms you have written:
#
# | feature | what it does | built on |
# |---|---|---|
# | the byte math behind every choice | KV bytes per token decide batch size, GPU choice, block size | ch01 cost |
# | **paged KV** (vLLM's PagedAttention; block pools in SGLang and TensorRT-LLM) | memory taken one block at a time, through block tables and a refcounted free list | ch02 tables and allocator, ch03 paged cache |
# | **parallel sampling, beam search** | one prompt's blocks shared by n continuations | ch04 copy-on-write |
# | **automatic prefix caching** (vLLM: hashed full blocks, LRU eviction; TensorRT-LLM: KV cache reuse) | a new request starts on blocks an earlier one computed | ch05 prefix cache |
# | **RadixAttention** (SGLang) | every cached prefix in one radix tree keyed by tokens; leaves evicted LRU; the scheduler favours requests with long cached prefixes | ch05 chained hashes, ch07 scheduling |
# | **paged attention kernels** (FlashAttention, FlashInfer backends) | attention that reads K/V through the block table | ch06 kernel |
# | **continuous / in-flight batching**, chunked prefill, preemption | a token budget per step, admission that reserves first, recompute or swap | ch07 scheduler |
# | **hierarchical / offloaded KV** (SGLang's hierarchical cache, vLLM's KV connectors with LMCache, TensorRT-LLM's host offloading) | cold blocks move to host memory or storage and come back on a hit | ch07 swap, ch05 eviction |
# | **disaggregated prefill** (Splitwise, DistServe, Mooncake; vLLM and SGLang support it) | prefill on one GPU pool, decode on another; the prompt's KV is shipped between them *block by block* | ch02-03: a table is small and names blocks, so moving a sequence is moving its blocks and rewriting its table |
# | **quantized KV** (fp8 / int8 KV caches) | fewer bytes per token; scales stored beside the data | this chapter |
#
# Two questions remain open. *Bigger blocks, smarter eviction*: at a million tokens a 16-token
# block means 65,536 table entries per sequence (section 8.6 printed them); keeping shared prefixes in
# small blocks and private tails in large ones would cut that without losing sharing granularity, an
# analogue of an operating system's huge pages. *Block tables that span machines*: once blocks are
# the unit of transfer, a sequence's blocks could live on several machines, with refcounts,
# copy-on-write and prefix sharing coordinated across a fleet.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 8.8 Check your understanding
#
# R1 to R3 are graded automatically: put your answer in the cell under the question. Q4 and Q5 are
# answered in a few sentences; your instructor grades them by hand.
#
# **R1 (1 point).** Llama-3-70B (80 layers, 8 KV heads of 128) stores its KV cache in int8 blocks of
# 16 tokens, with one float32 scale per block, per KV head, per layer, for K and for V. How many bytes
# does one token cost, scales included? Set `r1_answer` to a number.

# %% nbgrader={"grade": false, "grade_id": "ch08_r1", "locked": false, "schema_version": 3, "solution": true}
r1_answer = None
### BEGIN SOLUTION
r1_answer = 2 * 80 * 8 * 128 + 2 * 80 * 8 * 4 / 16
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch08_test_r1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch08.check_review_int8_bytes(r1_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_r2_md", "locked": true, "schema_version": 3, "solution": false}
# **R2 (1 point).** Which block size for DeepSeek-V2 (MLA, bf16) comes closest to the bytes of a
# 16-token Llama-3-70B block (bf16)? Set `r2_answer` to one letter.
#
# * (a) 16 &nbsp; (b) 32 &nbsp; (c) 64 &nbsp; (d) 128

# %% nbgrader={"grade": false, "grade_id": "ch08_r2", "locked": false, "schema_version": 3, "solution": true}
r2_answer = None
### BEGIN SOLUTION
r2_answer = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch08_test_r2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch08.check_review_mla_block(r2_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_r3_md", "locked": true, "schema_version": 3, "solution": false}
# **R3 (1 point).** How many block-table entries does one sequence of 100,000 tokens need in blocks
# of 48 tokens? Set `r3_answer` to a number.

# %% nbgrader={"grade": false, "grade_id": "ch08_r3", "locked": false, "schema_version": 3, "solution": true}
r3_answer = None
### BEGIN SOLUTION
r3_answer = -(-100_000 // 48)
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch08_test_r3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch08.check_review_table_entries(r3_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** A fork shares a half-full int8 block, and the child's next token is larger than
# anything in it. Why must the child not re-round the shared block in place, and what in the engine
# makes sure it never does?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch08_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Re-rounding changes the block's codes and its scale, and the parent reads the same block: its
# history would change after the fact, so its logits would move although none of its tokens did (and
# a prefix-cache hit on such a block would no longer get the bytes it was promised). A shared block's
# bytes must stay frozen while anyone else reads them. The engine keeps chapter 4's rule: `reserve`
# copies a shared block (copy-on-write, scales included) before the child writes, so the child grows
# the scale of its private copy; `store` refuses to write into a block whose refcount is above 1, and
# `quantize_into` touches no block but the ones it writes.
#
# Rubric: 1 point for "the other sequence's history/logits change" (or the prefix cache's identical-
# bytes promise breaks); 1 point for copy-on-write before the write (reserve copies the shared
# block, with its scales), or the refusal in `store`.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_q5_md", "locked": true, "schema_version": 3, "solution": false}
# **Q5 (2 points).** In disaggregated serving, one GPU pool prefills a prompt and another decodes it.
# What has to move from the first to the second, why are blocks and block tables a convenient unit
# for it, and what must travel with an int8 block?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch08_q5", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# The prompt's K and V in every layer (plus the request's tokens and sampling state). With a paged
# cache that KV already sits in fixed-size blocks: the sender ships the blocks its table names, the
# receiver allocates the same number of free blocks wherever it has them and writes a new table; no
# contiguous region has to be found, transfers can start as soon as a block is full, and a prefix both
# sides already hold need not be sent. An int8 block's scales are part of its contents and must travel
# with it, or the receiver cannot read the codes.
#
# Rubric: 1 point for "the KV blocks (and the table/tokens)" with why blocks make it easy (fixed size,
# any free block will do, only the small table is rewritten); 1 point for the scales travelling with
# their block.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch08_stretch", "locked": true, "schema_version": 3, "solution": false}
# ## 8.9 Stretch exercises (ungraded)
#
# ★★ **Quantize a block once, when it is full.** Keep each sequence's partial last block in fp32 (a
# small side pool indexed by block id) and quantize it in one go when its last slot is written
# (rule 3 of section 8.3). Show that a block written token by token now has exactly the bytes of the
# same block written in one prefill, and measure the logit error against `ReferenceInt8Cache`. What
# must copy-on-write, swap and the prefix cache do with the fp32 tail?
#
# ★★ **Dequantize in the kernel.** Give chapter 6's Triton decode kernel an int8 path: load a block's
# codes and its per-head scale, multiply in fp32 after the load, and check it against this chapter's
# cache within `INT8_ATOL`. How many more bytes per block does the kernel load, and how many fewer?
#
# ★ **int4.** Pack two 4-bit codes per byte (codes in $[-7, 7]$). What happens to the logit error on
# the tiny model, and to the scales' share of the bytes at block size 16 and head_dim 128?
#
# ## Going deeper
#
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): the paper this course rebuilt.
# * Zheng et al., [*SGLang: Efficient Execution of Structured Language Model Programs*](https://arxiv.org/abs/2312.07104) (2024):
#   RadixAttention and cache-aware scheduling.
# * DeepSeek-AI, [*DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
#   Model*](https://arxiv.org/abs/2405.04434) (2024): multi-head latent attention; the paper reports a
#   93.3% smaller KV cache than its MHA baseline.
# * Liu et al., [*KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV
#   Cache*](https://arxiv.org/abs/2402.02750) (ICML 2024): grouped KV quantization with a
#   full-precision window of recent tokens; Hooper et al., [*KVQuant*](https://arxiv.org/abs/2401.18079)
#   (2024).
# * Qin et al., [*Mooncake: A KVCache-centric Disaggregated Architecture for LLM
#   Serving*](https://arxiv.org/abs/2407.00079) (2024); Zhong et al.,
#   [*DistServe*](https://arxiv.org/abs/2401.09670) (OSDI 2024); Patel et al.,
#   [*Splitwise*](https://arxiv.org/abs/2311.18677) (ISCA 2024): prefill and decode apart, KV moved
#   between them.
# * vLLM's documentation on [quantized KV
#   cache](https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/), [automatic prefix
#   caching](https://docs.vllm.ai/en/latest/design/prefix_caching/) and [disaggregated
#   prefilling](https://docs.vllm.ai/en/latest/features/disagg_prefill/), and its block pool
#   ([`vllm/v1/core/block_pool.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/block_pool.py)) and KV cache manager
#   ([`kv_cache_manager.py`](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_manager.py)).
#
# ## Summary
#
# * A block is a natural quantization group: one scale per block per KV head, indexed by the physical
#   block, travels with the block through forks, prefix hits, copy-on-write and swaps.
# * A partial block's scale grows as tokens arrive, and its codes are re-rounded; only a block's sole
#   owner may do that, which copy-on-write already guarantees.
# * int8 halves the bytes per token (plus 0.2% of scales at head_dim 128), and about doubles the
#   sequences that fit. MLA cuts DeepSeek-V2's token to 1,152 bytes per layer and moves the best
#   block size up; the paging mechanism stays the same, only its arithmetic changes.
