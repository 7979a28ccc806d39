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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_intro", "locked": true, "schema_version": 3, "solution": false}
# # 1. The KV cache and what it costs
#
# A language model writes one token at a time, and every new token attends to all the tokens before
# it. Recomputing that whole history at every step would make the cost of a reply grow with the
# square of its length, so every inference engine keeps the attention keys and values of past tokens
# in memory: the **KV cache**. This chapter opens the course's engine, shows the cache at work, and
# then puts a price on it. The price turns out to be large, and the simplest way to pay it, one
# contiguous region per request, wastes most of what it reserves. The rest of the course is about
# not wasting it.
#
# What you will do:
#
# 1. take a tour of the engine: a tiny Qwen3 model, a forward pass from scratch, and the six methods
#    through which the model talks to any cache;
# 2. measure why decoding needs a cache;
# 3. write **`kv_bytes_per_token`**, the bytes one token costs, from a model's `config.json`;
# 4. write **`update`** of the contiguous (static) cache, and plug it into the engine: its logits must
#    equal a run with no cache at all;
# 5. measure the **fragmentation tax** of that cache: how much of its reservation holds tokens, and how
#    few requests a real model fits on a real GPU because of it.
#
# **How to work.** Run the cells in order. A cell that contains `raise NotImplementedError()` is yours
# to write; the locked cell after it runs the graded check and prints one line starting with ✓ when
# your code is right, or a message that says what it expected, what came back, and a hint.
#
# Figures and demonstrations use the engine's own code. Those before the exercises run before you
# have written anything. The two after Exercise 1.2 (the static cache's utilization, and what fits on
# one GPU) use the engine's `StaticKVCache` and `kv_bytes_per_token`; in a student edition of the
# engine those are the ones your notebook defines, so there they stop with "not written yet" until
# Exercises 1.1 and 1.2 are done. Three small cells run *your* code by name, each right after an
# exercise's tests, under a heading that starts with **With your code**. Until that exercise is done
# they stop with `NotImplementedError`, which is expected.

# %% nbgrader={"grade": false, "grade_id": "ch01_setup", "locked": true, "schema_version": 3, "solution": false}
import inspect
import time

import torch

from engine.blocks import ceil_div
from engine.cache.protocol import KVCache, new_lengths
from engine.checkpoint import TRAINED_DIR, tiny_model, trained_model
from engine.checks import ch01
from engine.config import ModelConfig, known_config
from engine.config import kv_bytes_per_token as reference_kv_bytes    # the engine's
from engine.course.authoring.figures.ch01 import plot_decode_cost, plot_reserved_vs_used
from engine.course.authoring.widgets import explorer
from engine.tools.contiguous import ContiguousKVCache
from engine.tools.demos.paged import request_lengths, static_figures
from engine.generate import cached_step, generate, pack, scratch_logits
from engine.sampling import SamplingParams
from engine.seeded import seeded_tokens
from engine.tokenizer import ByteTokenizer
from engine.tools.simulate import GPUS, Roofline

KiB, MiB, GiB = 2**10, 2**20, 2**30
torch.set_num_threads(1)           # models this small run fastest on one thread
model = tiny_model(seed=0)
config = model.config

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_tour_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.1 The engine in one page
#
# The package `engine` is a small but complete inference engine for Qwen3-style models (the Llama
# family has the same shape). Each of its modules holds one idea, and each chapter rebuilds one of
# them. The model (`engine/model.py`) is a stack of decoder layers; in each layer every token is
# turned into a query $q$, a key $k$ and a value $v$ per head, and the token's output mixes the values
# of the tokens it may see, weighted by $\mathrm{softmax}(q \cdot k / \sqrt{d})$. Tokens only see
# themselves and earlier tokens (the causal mask).
#
# The course works with a **tiny** model with random, seeded weights, `engine.checkpoint.tiny_model`:
# it has the real architecture (grouped-query attention with fewer KV heads than query heads, RMSNorm
# on $q$ and $k$, rotary positions, a SwiGLU MLP) at a size that runs in milliseconds on a CPU. Its
# logits are meaningless as language but exact as arithmetic, which is all a check needs.
#
# The model takes two integer tensors of the same shape `[B, T]`: `token_ids`, and `positions`, the
# position of each token in its sequence. A batch is *ragged*: each row holds one sequence's new
# tokens, left-aligned, and the rest of the row is padding, marked by **position -1**.
# `engine.generate.pack` builds such a batch. With no cache (`cache=None`) the model runs **from
# scratch**: each row must hold a whole sequence from position 0, and it returns logits
# `[B, T, vocab]` for every position.

# %% nbgrader={"grade": false, "grade_id": "ch01_tour", "locked": true, "schema_version": 3, "solution": false}
print(f"tiny Qwen3: {config.num_layers} layers, {config.num_heads} query heads share "
      f"{config.num_kv_heads} KV heads, head_dim {config.head_dim}, "
      f"hidden {config.hidden_size}, vocab {config.vocab_size}")
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

prompts = [seeded_tokens(5, seed=1), seeded_tokens(3, seed=2)]
token_ids, positions = pack(prompts, starts=[0, 0])
print("token_ids:\n", token_ids)
print("positions (-1 = padding):\n", positions)
logits = model(token_ids, positions)
print(f"logits: {list(logits.shape)} = [batch, tokens, vocab]")
for b, prompt in enumerate(prompts):
    following = int(logits[b, len(prompt) - 1].argmax())
    print(f"row {b}: next token after {prompt} is {following}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_trained_md", "locked": true, "schema_version": 3, "solution": false}
# Random weights make the arithmetic exact and the output noise. So that you can see the engine
# write, the repository also holds a second tiny Qwen3 of the same architecture whose weights were
# *trained*, on this course's own prose: the text of the eight chapters, code left out, frozen once
# as `engine/tiny_model/corpus.txt`. `make tiny-model` retrains it from a seed on one CPU thread
# (`engine/tools/train_tiny.py`). It reads and writes bytes, one letter at a time, and it knows
# nothing but these chapters: expect their phrases stitched together, not answers.
# `python -m engine generate` uses it unless `--model` names another, and a real Qwen3 checkpoint
# (a Hugging Face folder with `config.json` and safetensors, such as Qwen3-0.6B) loads with
# `--model path/to/folder`. The checks and the figures keep the seeded model, so nothing graded
# depends on how well this one writes. The cell below prints its size and how it continues three
# prompts, greedily, through the engine's own loop.

# %% nbgrader={"grade": false, "grade_id": "ch01_trained", "locked": true, "schema_version": 3, "solution": false}
trained = trained_model()
shape, weights = trained.config, TRAINED_DIR / "model.safetensors"
params = sum(p.numel() for p in trained.parameters())
print(f"trained tiny Qwen3: {shape.num_layers} layers, hidden {shape.hidden_size}, "
      f"{params:,} parameters, {weights.stat().st_size / MiB:.2f} MiB of bfloat16")
corpus = (TRAINED_DIR / "corpus.txt").stat().st_size
print(f"trained on {corpus:,} bytes of the chapters' prose")
for text in ["The block table maps", "A paged KV cache", "Copy-on-write"]:
    out = generate(trained, [list(text.encode())], SamplingParams(max_tokens=48))[0]
    print(f"{text!r} -> {ByteTokenizer().decode(out.tokens)!r}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_causal_md", "locked": true, "schema_version": 3, "solution": false}
# The causal mask has a consequence that the whole course rests on. The key and value of position $i$
# are computed from tokens $0..i$ only, so they do not change when later tokens arrive. Run the model
# on the first 4 tokens of a prompt and on all 5: the logits of the first 4 positions are the same
# (up to float rounding), and so are their keys and values in every layer. Whatever was computed for
# a prefix can be kept and reused.

# %% nbgrader={"grade": false, "grade_id": "ch01_causal", "locked": true, "schema_version": 3, "solution": false}
prompt = prompts[0]
short, full = scratch_logits(model, [prompt[:4], prompt])
difference = float((short - full[:4]).abs().max())
print(f"logits of positions 0-3, computed from 4 tokens vs from 5: "
      f"max |Δ| = {difference:.1e}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_protocol_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.2 The cache protocol
#
# The model never knows which cache it runs on. It talks to any cache through six methods, written
# down once in `engine/cache/protocol.py` (and in `engine/README.md`); any class that has them drops
# in. The cell below prints them from the source, in the order one step uses them.

# %% nbgrader={"grade": false, "grade_id": "ch01_protocol", "locked": true, "schema_version": 3, "solution": false}
for name in ("create", "reserve", "set_batch", "update", "free", "length"):
    method = getattr(KVCache, name)
    signature = str(inspect.signature(method)).replace("'", "")
    if len(name + signature) > 88:              # update: its return type below
        signature = signature.replace(" -> ", "\n        -> ")
    print(f"{name}{signature}\n    {inspect.getdoc(method).splitlines()[0]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_protocol_md2", "locked": true, "schema_version": 3, "solution": false}
# One step of generation (`engine.generate.cached_step`) goes like this: `reserve` room for each
# sequence's new tokens *before* any compute (so a full cache fails early and changes nothing);
# `set_batch` names the sequences of the batch, in row order; then the model runs, and each layer
# calls `update(layer, k, v, positions)` once: the cache stores the new keys and values and hands
# back each row's whole history, `keys, values [B, Hkv, L, D]` with key index $j$ at position $j$,
# plus `kv_lens [B]`, how many of those keys are real. The **last** layer's call also commits the
# new lengths. `length(seq)` says how many tokens a sequence holds, and `free(seq)` forgets it.
#
# The cell below watches a contiguous cache of the engine through one prefill of two prompts and one
# decode step, printing every protocol call the engine makes. It is `ContiguousKVCache`
# (`engine/tools/contiguous.py`, the baseline chapter 7 measures paging against) with a region of 16
# positions per sequence: the same layout as the `StaticKVCache` of `engine/cache/static.py`, whose
# `update` is yours to write in Exercise 1.2, so this cell runs before you have written it.

# %% nbgrader={"grade": false, "grade_id": "ch01_trace", "locked": true, "schema_version": 3, "solution": false}
class TracedCache(ContiguousKVCache):
    """The engine's contiguous cache, printing each protocol call it receives."""

    def reserve(self, seq, num_new):
        print(f"  reserve(seq={seq}, num_new={num_new})")
        return super().reserve(seq, num_new)

    def set_batch(self, seqs):
        print(f"  set_batch({list(seqs)})")
        return super().set_batch(seqs)

    def update(self, layer, k, v, positions):
        keys, values, kv_lens = super().update(layer, k, v, positions)
        print(f"  update(layer={layer}, k {list(k.shape)}, "
              f"positions {positions.tolist()})\n"
              f"    -> keys {list(keys.shape)}, kv_lens {kv_lens.tolist()}")
        return keys, values, kv_lens


traced = TracedCache(config, pool_tokens=2 * 16, max_len=16)   # 2 regions of 16
for seq in (0, 1):
    traced.create(seq)
print("prefill:")
first = cached_step(model, traced, [0, 1], prompts)
print("decode one token each:")
nxt = [[int(rows[-1].argmax())] for rows in first]
second = cached_step(model, traced, [0, 1], nxt)
print(f"lengths now: {traced.length(0)} and {traced.length(1)}")
fresh = scratch_logits(model, [p + n for p, n in zip(prompts, nxt)])
print(f"decode logits vs a from-scratch run of the whole sequences: max |Δ| = "
      f"{max(float((s[-1] - f[-1]).abs().max()) for s, f in zip(second, fresh)):.1e}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.3 Why decoding needs a cache
#
# Without a cache, step $i$ of generation runs the model over the prompt and all $i$ tokens generated
# so far, only to use the logits of the last position. With a cache, the prompt goes through once
# (the *prefill*) and every later step runs one token (a *decode* step), which reads the stored keys
# and values of the others. For a prompt of $p$ tokens and $n$ new tokens that is
#
# $$
# \underbrace{\sum_{i=0}^{n-1} (p + i) = np + \tfrac{n(n-1)}{2}}_{\text{from scratch}}
# \qquad\text{against}\qquad
# \underbrace{p + (n - 1)}_{\text{with a cache}}
# $$
#
# token positions through the model: quadratic against linear. The cell below generates the same
# greedy continuation both ways (the cache is the contiguous one of the cell above), checks the tokens
# agree, and times every step. It uses a model a little wider than the tiny one (hidden size 192
# instead of 64), so that the arithmetic, not Python's per-call overhead, takes most of the time.

# %% nbgrader={"grade": false, "grade_id": "ch01_why", "locked": true, "schema_version": 3, "solution": false}
wide = tiny_model(seed=0, hidden_size=192, intermediate_size=384,
                  num_heads=6, head_dim=32)
prompt, steps = seeded_tokens(96, seed=3), 32

scratch_tokens, scratch_ms, scratch_positions = list(prompt), [], []
for step in range(steps):
    start = time.perf_counter()
    last = scratch_logits(wide, [scratch_tokens])[0][-1]
    scratch_ms.append(1000 * (time.perf_counter() - start))
    scratch_positions.append(len(scratch_tokens))
    scratch_tokens.append(int(last.argmax()))

cache = ContiguousKVCache(wide.config, pool_tokens=len(prompt) + steps,
                          max_len=len(prompt) + steps)
cache.create(0)
cached_tokens, cached_ms, cached_positions, new = list(prompt), [], [], list(prompt)
for step in range(steps):
    start = time.perf_counter()
    last = cached_step(wide, cache, [0], [new])[0][-1]
    cached_ms.append(1000 * (time.perf_counter() - start))
    cached_positions.append(len(new))
    new = [int(last.argmax())]
    cached_tokens.append(new[0])

print(f"{steps} greedy tokens after a {len(prompt)}-token prompt; "
      f"same tokens both ways: {scratch_tokens == cached_tokens}")
print(f"token positions through the model: from scratch {sum(scratch_positions):,}, "
      f"with a cache {sum(cached_positions):,} "
      f"({sum(scratch_positions) / sum(cached_positions):.0f}x fewer)")
median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
print(f"median step: from scratch {median(scratch_ms):.1f} ms, with a cache "
      f"{median(cached_ms):.1f} ms ({median(scratch_ms) / median(cached_ms):.1f}x)")
plot_decode_cost(range(1, steps + 1), scratch_positions, cached_positions,
                 scratch_ms, cached_ms)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_why_md2", "locked": true, "schema_version": 3, "solution": false}
# On the left, the work of a step from scratch grows with the sequence while a cached decode step
# stays at one position (the first cached step is the prefill of the whole prompt). On the right,
# the measured time, which is noisy on a shared CPU: a model this small still pays a fixed overhead
# per call, so the measured ratio in the last printed line is smaller than the ratio of the work,
# but the from-scratch steps are clearly the slower ones. With billions of parameters the arithmetic
# dominates and the gap approaches the ratio of the work; it is the reason decoding is fast enough
# to serve at all. The cache is not optional; the question is only what it costs.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_bytes_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.4 What one token costs
#
# For every token, every layer stores one key vector and one value vector per **KV head**, each of
# `head_dim` numbers. With grouped-query attention several query heads read the same KV head, so it
# is `num_key_value_heads`, not `num_attention_heads`, that counts. The bytes per token are
#
# $$
# \text{bytes per token} = 2 \times \text{layers} \times \text{KV heads} \times \text{head dim}
# \times \text{bytes per value},
# $$
#
# the 2 counting K and V. **Worked example**: Llama-3-8B has 32 layers, 8 KV heads of dimension 128;
# in fp16 (2 bytes per value) a token costs $2 \times 32 \times 8 \times 128 \times 2 = 131{,}072$
# bytes, 128 KiB. A 4,096-token context is then half a gibibyte, for one request.
#
# `engine/configs/` holds the `config.json` of four published models (no weights).
# `ModelConfig.from_json(path)` (or `known_config(name)`) reads one into a `ModelConfig` whose fields
# are `num_layers`, `num_heads` (query heads), `num_kv_heads`, `head_dim`, `hidden_size`, and so on.

# %% nbgrader={"grade": false, "grade_id": "ch01_configs", "locked": true, "schema_version": 3, "solution": false}
for name in ("llama-2-13b", "llama-3-8b", "llama-3-70b", "qwen3-0.6b"):
    c = known_config(name)
    print(f"{name:12s} layers {c.num_layers:3d}, query heads {c.num_heads:3d}, "
          f"KV heads {c.num_kv_heads:3d}, head_dim {c.head_dim}, "
          f"hidden {c.hidden_size}")
c = known_config("llama-3-8b")
worked = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2
print(f"the worked example, llama-3-8b in fp16: 2 x {c.num_layers} x "
      f"{c.num_kv_heads} x {c.head_dim} x 2 = {worked:,} bytes")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_ex_bytes_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 1.1: `kv_bytes_per_token` (2 points)
#
# Write `kv_bytes_per_token(config, dtype_bytes=2)`: the bytes of KV cache one token costs for the
# model `config` (a `ModelConfig`) when each number takes `dtype_bytes` bytes (2 for fp16 and bf16,
# 4 for fp32, 1 for int8). Return an `int`. The cell below is the engine's own function from
# `engine/config.py` with its body removed (the engine's `ModelConfig.kv_bytes_per_token(dtype)`
# calls it). The check tries the four published models and several made-up shapes, and each of the
# classic mistakes (K and V counted once, query heads for KV heads, a factor left out, the wrong
# bytes per value) gives a number it recognises.

# %% nbgrader={"grade": false, "grade_id": "ch01_kv_bytes_per_token", "locked": false, "schema_version": 3, "solution": true}
#| include engine/config.py::kv_bytes_per_token

# %% nbgrader={"grade": true, "grade_id": "ch01_test_kv_bytes_per_token", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch01.check_kv_bytes_per_token(kv_bytes_per_token)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_yours_bytes_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: what a context costs.** This cell needs your `kv_bytes_per_token` (Exercise 1.1);
# until you have written it, it stops with `NotImplementedError`. For each model it prints the fp16
# bytes per token and what one request with a 4,096-token context holds.

# %% nbgrader={"grade": false, "grade_id": "ch01_yours_bytes", "locked": true, "schema_version": 3, "solution": false}
for name in ("llama-2-13b", "llama-3-8b", "llama-3-70b", "qwen3-0.6b"):
    per_token = kv_bytes_per_token(known_config(name), 2)
    print(f"{name:12s} {per_token:>9,} B = {per_token / KiB:4.0f} KiB per token; "
          f"a 4,096-token context: {4096 * per_token / GiB:.2f} GiB")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_bytes_md2", "locked": true, "schema_version": 3, "solution": false}
# Grouped-query attention is why Llama-3-70B costs less per token than Llama-2-13B, a much smaller
# model: Llama-2-13B keeps all 40 of its heads as KV heads, Llama-3-70B shares each of its 8 KV
# heads among 8 query heads. Even so, a few thousand tokens of context cost gigabytes, and a serving
# engine holds the contexts of dozens of requests at once.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_static_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.5 The contiguous cache
#
# The simplest cache gives every sequence one contiguous **slot** of `capacity` positions, reserved
# when the sequence is created, whether it ends up using 20 of them or all. That is what
# `engine.cache.static.StaticKVCache(config, max_seqs, capacity, dtype)` does. Its bookkeeping is
# given:
#
# * `self.k[layer]` and `self.v[layer]`: one tensor per layer, `[max_seqs, Hkv, capacity, D]`; row
#   `r` is a slot, and position $p$ of the sequence in that slot lives at index `[r, :, p]`.
#   `len(self.k)` is the number of layers.
# * `self.slot[seq]`: the slot row of sequence `seq` (set by `create`, which takes a free row).
# * `self.batch`: the sequences of the current forward, in batch-row order (set by `set_batch`).
#   **Batch row `b` is not slot row `b`**: its sequence is `self.batch[b]`, in slot row
#   `self.slot[self.batch[b]]`.
# * `self.lengths[seq]`: the tokens committed for `seq` (what `length(seq)` returns).
#
# **Worked example.** Sequences 12 and 10 sit in slot rows 3 and 1 and hold 5 and 2 tokens. The
# batch `[12, 10]` brings 1 new token for sequence 12 and 3 for sequence 10:
#
# ```
# positions = [[5, -1, -1],      row 0: sequence 12, slot row 3: write position 5
#              [2,  3,  4]]      row 1: sequence 10, slot row 1: write positions 2, 3, 4
# ```
#
# `update` writes `k[0, :, 0]` to `self.k[layer][3, :, 5]` and `k[1, :, t]` to
# `self.k[layer][1, :, 2 + t]`, skips the two padding columns, and returns the slots of rows 3 and 1
# cut to 6 positions, with `kv_lens = [6, 5]`: sequence 10's key at position 5 is a leftover that
# attention ignores because its `kv_len` is 5.
#
# ### Exercise 1.2: the static cache's `update` (3 + 5 points)
#
# The cell below is a subclass of the engine's `StaticKVCache` that defines only `update`, with its
# body removed; every other method is the engine's. Write it:
#
# * store `k, v [B, Hkv, T, D]` at `positions [B, T]` in each row's slot, skipping padding
#   (position -1; careful: index -1 is a valid Python index, the slot's *last* position);
# * return `(keys, values, kv_lens)`: the batch's slots in batch order, cut to the longest new length,
#   `[B, Hkv, max(kv_lens), D]`, and `kv_lens`, a `torch.long` tensor of each row's length after this
#   step (its highest position + 1, never less than before: a row that is all padding keeps its
#   length);
# * only on the last layer (`layer == len(self.k) - 1`), commit the new lengths into `self.lengths`.
#
# `new_lengths(positions, old_lengths)` (from `engine.cache.protocol`, already imported) computes
# the new lengths for you if you like. The first check calls `update` directly and looks at where
# each token landed; the second plugs your class into the engine for a ragged prefill, 20 decode
# steps and a newcomer that reuses a freed slot, and compares every logit with a from-scratch run.

# %% nbgrader={"grade": false, "grade_id": "ch01_static_update", "locked": false, "schema_version": 3, "solution": true}
#| include engine/cache/static.py::StaticKVCache.update solve=update

# %% nbgrader={"grade": true, "grade_id": "ch01_test_static_update", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch01.check_static_update(StaticKVCache)

# %% nbgrader={"grade": true, "grade_id": "ch01_test_static_in_engine", "locked": true, "points": 5, "schema_version": 3, "solution": false}
ch01.check_static_cache_in_engine(StaticKVCache)
### BEGIN HIDDEN TESTS
ch01.check_static_cache_in_engine(StaticKVCache, bs=2, decode_steps=24, seed=3)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_yours_static_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: generation through your cache.** This cell needs your `update` (Exercise 1.2);
# until you have written it, it stops with `NotImplementedError`. It generates 24 greedy tokens for
# three prompts of different lengths, once from scratch and once through your `StaticKVCache`.

# %% nbgrader={"grade": false, "grade_id": "ch01_yours_static", "locked": true, "schema_version": 3, "solution": false}
three = [seeded_tokens(n, seed=10 + n) for n in (3, 8, 13)]
params = SamplingParams(max_tokens=24)
from_scratch = generate(model, three, params)
yours = generate(model, three, params, cache=StaticKVCache(config, 3, capacity=13 + 24))
for prompt, a, b in zip(three, from_scratch, yours):
    print(f"{len(prompt):2d}-token prompt: same 24 tokens as from scratch: "
          f"{a.tokens == b.tokens}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_tax_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.6 The fragmentation tax
#
# A static slot must be sized before the request starts, for the longest answer it might give, since
# nobody knows when a reply will stop. Most replies stop far earlier, and the rest of the slot is
# reserved but dead: **internal fragmentation**. (A contiguous allocator that sized regions per
# request would trade it for **external fragmentation**: holes between live regions that are too
# small for the next request even when the free bytes add up.)
#
# The cell below stores a workload of 32 live requests of 20 to 500 tokens (uniform, seed 0) in the
# engine's `StaticKVCache` with slots of 1,024 tokens, and reports what the cache itself counts:
# tokens stored over positions reserved. The figure shows every request's slot.

# %% nbgrader={"grade": false, "grade_id": "ch01_tax", "locked": true, "schema_version": 3, "solution": false}
lengths = request_lengths(32, 20, 500, seed=0)
static = static_figures(lengths, capacity=1024)
mean = sum(lengths) / len(lengths)
print(f"{len(lengths)} requests of {min(lengths)}-{max(lengths)} tokens "
      f"(mean {mean:.0f}): {static['tokens_stored']:,} tokens stored")
print(f"static slots of 1,024: {static['slots_reserved']:,} positions reserved, "
      f"utilization {static['utilization']:.1%}")
plot_reserved_vs_used(lengths, 1024)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_tax_md2", "locked": true, "schema_version": 3, "solution": false}
# Read the utilization line: more than two thirds of the cache holds nothing. The workload is
# synthetic, but real systems are no better. The vLLM paper (Kwon et al., *Efficient Memory
# Management for Large Language Model Serving with PagedAttention*, SOSP 2023, figure 2)
# measured the serving systems of the day and found that only **20.4% to 38.2%** of their
# KV cache memory held the states of actual tokens; the rest was reserved for tokens that never came,
# lost in the tails of reservations, or stranded between them.
#
# ### Exercise 1.3: measuring the tax (1 + 2 points)
#
# Write two small functions.
#
# * `static_utilization(lengths, capacity)`: the fraction of the reserved positions that hold tokens
#   when each request, of the given token counts, gets its own slot of `capacity` positions:
#   $U = \sum_i n_i / (k \cdot \text{capacity})$ for $k$ requests.
# * `slots_that_fit(gpu_bytes, weight_bytes, slot_tokens, bytes_per_token)`: how many whole slots of
#   `slot_tokens` tokens fit in the memory the model's weights leave free on the GPU; an `int`, and
#   0 when the weights leave no room at all.

# %% nbgrader={"grade": false, "grade_id": "ch01_static_utilization", "locked": false, "schema_version": 3, "solution": true}
def static_utilization(lengths, capacity):
    """Tokens stored / positions reserved, each request in its own `capacity` slot."""
    ### BEGIN SOLUTION
    return sum(lengths) / (len(lengths) * capacity)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ch01_test_static_utilization", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch01.check_static_utilization(static_utilization)

# %% nbgrader={"grade": false, "grade_id": "ch01_slots_that_fit", "locked": false, "schema_version": 3, "solution": true}
def slots_that_fit(gpu_bytes, weight_bytes, slot_tokens, bytes_per_token):
    """Whole slots of `slot_tokens` tokens that fit beside the weights (0 if none)."""
    ### BEGIN SOLUTION
    free = max(gpu_bytes - weight_bytes, 0)
    return free // (slot_tokens * bytes_per_token)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "ch01_test_slots_that_fit", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch01.check_slots_that_fit(slots_that_fit)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_capacity_md", "locked": true, "schema_version": 3, "solution": false}
# ### What the tax costs on a real GPU
#
# Take the setting of the vLLM paper: Llama-2-13B in fp16 on an A100 with 40 GB. The weights come
# first; their size follows from the config (every matrix of every layer, plus the embedding and the
# output layer; `engine.tools.simulate.Roofline` counts them). What is left holds the KV cache. The
# cell below works out how many 1,024-token static slots fit in it, ignoring activations and
# workspace (a real engine also keeps a few GB for those, so the true count is lower), and how many
# requests of the workload above the same bytes would hold if the cache stored only what the
# requests use, in 16-token blocks (chapters 2 and 3): each request takes $\lceil n/16 \rceil$ whole
# blocks, counted with the engine's ceiling division (`engine.blocks.ceil_div`).

# %% nbgrader={"grade": false, "grade_id": "ch01_capacity", "locked": true, "schema_version": 3, "solution": false}
llama13 = known_config("llama-2-13b")
gpu = GPUS["A100-40GB"]
gpu_bytes = int(gpu.memory_gb * 10**9)         # 40 GB as sold: decimal gigabytes
weights = Roofline(llama13, gpu).weight_bytes
per_token = reference_kv_bytes(llama13, 2)
free = gpu_bytes - weights
slots = free // (1024 * per_token)
blocks = sum(ceil_div(n, 16) for n in lengths)   # whole blocks of 16 per request
per_request = blocks * 16 / len(lengths) * per_token
print(f"Llama-2-13B fp16 weights: {weights / 1e9:.1f} GB of {gpu.memory_gb:.0f} GB; "
      f"{free / 1e9:.1f} GB left for the KV cache")
print(f"{per_token:,} B per token -> a 1,024-token slot is "
      f"{1024 * per_token / GiB:.2f} GiB;\n{slots} slots fit, "
      f"so at most {slots} requests at once")
print(f"at {static['utilization']:.1%} utilization those {slots} slots hold "
      f"{slots * 1024 * static['utilization']:,.0f} tokens")
print(f"in blocks of 16 ({sum(lengths) / (blocks * 16):.1%} utilization), "
      f"the same bytes hold {free / per_request:.0f} requests of this workload")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_capacity_md2", "locked": true, "schema_version": 3, "solution": false}
# The last two lines are the tax in requests: the same GPU, the same model, the same requests, and
# several times more of them served at once when the cache stops reserving what it does not use. In
# decoding, throughput grows with the batch, so that factor comes close to a factor in tokens per
# second. Chapter 2 builds the tool that collects it: fixed-size blocks and a block table.
#
# **With your code: your numbers.** This cell needs both functions of Exercise 1.3. It recomputes the
# utilization and the slot count with your code, next to the engine's.

# %% nbgrader={"grade": false, "grade_id": "ch01_yours_capacity", "locked": true, "schema_version": 3, "solution": false}
print(f"utilization of the workload: yours {static_utilization(lengths, 1024):.3f}, "
      f"the engine's StaticKVCache {static['utilization']:.3f}")
print(f"1,024-token slots of Llama-2-13B on an A100-40GB: yours "
      f"{slots_that_fit(gpu_bytes, weights, 1024, per_token)}, the cell above {slots}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_explorer_md", "locked": true, "schema_version": 3, "solution": false}
# **Explore.** How does the tax move with the slot size and with the length of the requests? The
# explorer draws 32 requests of 20 up to `longest` tokens in slots of `capacity`. A slot must be at
# least as long as the longest request it may get; the gap between that and the typical request is
# what the static cache pays. Every combination of the two menus is drawn when the cell runs, so the
# menus work in JupyterLab and in the book alike.

# %% nbgrader={"grade": false, "grade_id": "ch01_explorer", "locked": true, "schema_version": 3, "solution": false}
def show_slots(capacity=1024, longest=500):
    """32 requests of 20..longest tokens in static slots of `capacity`."""
    requests = request_lengths(32, 20, longest, seed=0)
    plot_reserved_vs_used(requests, capacity)


explorer(show_slots, capacity=([512, 1024, 2048, 4096], 1024),
         longest=([100, 250, 500], 500))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 1.7 Check your understanding
#
# R1 and R2 are graded automatically: put your answer in the cell under the question. Q3 and Q4 are
# answered in a few sentences; your instructor grades them by hand.
#
# **R1 (1 point).** A from-scratch loop generates 50 tokens after a 100-token prompt, running the
# model over the whole sequence at every step. How many token positions go through the model in
# total? Set `r1_answer` to a number.

# %% nbgrader={"grade": false, "grade_id": "ch01_r1", "locked": false, "schema_version": 3, "solution": true}
r1_answer = None
### BEGIN SOLUTION
r1_answer = sum(100 + i for i in range(50))
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch01_test_r1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch01.check_review_recompute(r1_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_r2_md", "locked": true, "schema_version": 3, "solution": false}
# **R2 (1 point).** Which change to a model's `config.json`, all else equal, halves its KV bytes per
# token? Set `r2_answer` to one letter.
#
# * (a) halve `num_attention_heads`, keeping `num_key_value_heads`
# * (b) halve `num_key_value_heads`
# * (c) halve `vocab_size`
# * (d) halve `max_position_embeddings`

# %% nbgrader={"grade": false, "grade_id": "ch01_r2", "locked": false, "schema_version": 3, "solution": true}
r2_answer = None
### BEGIN SOLUTION
r2_answer = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch01_test_r2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch01.check_review_kv_heads(r2_answer)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_q3_md", "locked": true, "schema_version": 3, "solution": false}
# **Q3 (2 points).** Why can the keys and values of earlier tokens be stored and reused during
# decoding, while the *queries* of earlier tokens are never needed again?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch01_q3", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) the causal mask: position $i$'s key and value depend only on tokens $0..i$, so
# they do not change when later tokens arrive and can be computed once. (1 point) A query is only used
# to compute its own position's output; once a token's output (and so the next token) is known, its
# query is never read again, while every later token's query is compared with all earlier keys and
# mixes all earlier values.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** A static cache's slots are 1,024 tokens and its utilization is about 30%. Why
# not simply use slots of 512 tokens? Name the kind of fragmentation the static cache suffers from,
# and what a smaller slot would cost.

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch01_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric: (1 point) internal fragmentation: each request reserves a whole slot up front and leaves
# its unused tail dead; the slot must be sized for the longest reply a request may produce, since the
# length is unknown until generation stops. (1 point) A 512-token slot cannot hold a request that
# grows past 512 tokens: it would have to be cut off, or moved to a larger region (a copy, and with
# regions of several sizes, external fragmentation: holes too small to use). Smaller slots only move
# the waste; the fix is to reserve memory in small pieces as the sequence grows.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch01_deeper", "locked": true, "schema_version": 3, "solution": false}
# ## Going deeper
#
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): the measurement of 20.4-38.2% KV utilization in earlier
#   systems, and the paged cache this course builds.
# * Ainslie et al., [*GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
#   Checkpoints*](https://arxiv.org/abs/2305.13245) (2023), and Shazeer, [*Fast Transformer Decoding:
#   One Write-Head is All You Need*](https://arxiv.org/abs/1911.02150) (2019): why KV heads are fewer
#   than query heads, and what it does to bytes per token.
# * Pope et al., [*Efficiently Scaling Transformer Inference*](https://arxiv.org/abs/2211.05102)
#   (2022): memory and compute budgets of decoding, and why its speed is bounded by reading weights
#   and the KV cache.
# * DeepSeek-AI, [*DeepSeek-V2*](https://arxiv.org/abs/2405.04434) (2024): multi-head latent
#   attention, which caches a compressed latent instead of K and V and changes the bytes-per-token
#   arithmetic of this chapter.
# * `python -m engine paged` stores the workload of section 1.6 in both the static and the paged
#   cache; `python -m engine bench --simulate engine/configs/llama-2-13b.json --gpu A100-40GB`
#   simulates serving it (engine/serve/README.md).
#
# ## Summary
#
# * Keys and values of past tokens never change (causal mask), so decoding keeps them in a cache and
#   runs one new token per step instead of the whole sequence.
# * The engine talks to any cache through six methods: `create`, `reserve`, `set_batch`, `update`,
#   `free`, `length`; the last layer's `update` commits the new lengths.
# * One token costs $2 \times$ layers $\times$ KV heads $\times$ head dim $\times$ bytes per value:
#   hundreds of KiB for today's models.
# * A contiguous slot per request must be sized for the longest reply; most of it stays empty, and
#   the empty part caps how many requests fit on a GPU.
#
# **Next.** Chapter 2 cuts the cache into small blocks reached through a block table, so a request
# holds only the memory it uses.
