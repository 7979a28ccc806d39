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

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_intro", "locked": true, "schema_version": 3, "solution": false}
# # 6. A Triton paged-decode kernel
#
# Chapters 2 to 5 stored every sequence's keys and values in blocks scattered over one pool. Until now
# attention read them back the simple way: gather each sequence's history into a contiguous tensor,
# then run ordinary attention on the copy. That is a correct specification and a poor implementation.
# A decode step does almost no arithmetic per byte: each new token multiplies one query vector with
# every cached key and value once. Its speed is the speed at which those bytes come out of memory,
# and the gather reads them, writes a copy, and reads the copy again.
#
# A *paged attention kernel* reads the keys and values where they are. Each program of the kernel
# walks one sequence's block table, turns each logical block into a physical block id, and loads
# the keys straight from the pool. This chapter writes that kernel in Triton, a Python dialect for GPU
# kernels that also runs, slowly but exactly, in an interpreter on the CPU.
#
# You will write:
#
# 1. a **toy kernel** that gathers rows of a matrix through an index vector: program ids, pointer
#    arithmetic and masks, in the spirit of Triton-Puzzles (Exercise 6.1);
# 2. the **paged decode kernel**: one program per (sequence, query head), block table lookups, a
#    masked tail, grouped-query heads and an online softmax in float32 (Exercise 6.2);
# 3. as a graded stretch, the **log-sum-exp merge** of split-K decoding (Exercise 6.3).
#
# The milestone check plugs your kernel into the engine's paged cache, runs a one-layer cut of the
# course's tiny Qwen3 model through 20 decode steps of a ragged batch, and compares every logit
# with a from-scratch run.
#
# **Which cells need your code.** Figures, the explorer and the demos use the engine's kernels, so they
# run before you have written anything. Cells under a heading that starts with **With your code** run
# yours instead; until the exercise they name is done they stop with `NotImplementedError`, which is
# expected. **Where it runs.** Without a GPU every kernel runs in Triton's interpreter on the CPU (the
# setup cell arranges it); with one, the same cells run compiled. On macOS and Windows, where Triton
# cannot be installed, everything except the kernels runs (section 6.1 says what that means).

# %% nbgrader={"grade": false, "grade_id": "ch06_setup", "locked": true, "schema_version": 3, "solution": false}
import math
import os
from pathlib import Path

import torch

import engine.config
from engine.attention import triton_installed, triton_modules
from engine.tools.bench_decode import PEAK_GBS
from engine.attention.paged_reference import gather_history, paged_attention_reference
from engine.checks import ch06
from engine.config import ModelConfig
from engine.course.authoring.figures import ch06 as figures
from engine.course.authoring.widgets import explorer

# Before any kernel is defined: without CUDA, turn on Triton's interpreter
# (TRITON_INTERPRET=1). Without Triton at all (macOS, Windows): stand-ins that
# define kernels but cannot launch them.
triton, tl = triton_modules()
TRITON = triton_installed()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_GPU = TRITON and torch.cuda.is_available() and not INTERPRETED
DEVICE = "cuda" if ON_GPU else "cpu"
if TRITON:
    from engine.attention.triton_decode import paged_decode, split_partials
from engine.attention.decode_config import split_count

CONFIGS = Path(engine.config.__file__).parent / "configs"  # published config.json files
GiB, MiB = 2**30, 2**20

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_platform_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.1 Where your kernels run
#
# Triton compiles a kernel for NVIDIA or AMD GPUs. With the environment variable `TRITON_INTERPRET=1`
# it instead runs the kernel's Python body with numpy, one program after another: every result is the
# same as on the GPU (bf16 aside), only thousands of times slower, so the chapter keeps its shapes small.
# The variable must be set before the first kernel is *defined*, which is why the setup cell calls
# `triton_modules()` before anything else. Triton publishes Linux wheels only: on macOS or Windows the
# kernel cells cannot run, and their checks say so; use WSL2 on Windows, or a hosted notebook.

# %% nbgrader={"grade": false, "grade_id": "ch06_platform", "locked": true, "schema_version": 3, "solution": false}
if not TRITON:
    print("Triton is not available on this platform (Linux wheels only): the kernel")
    print("exercises and their checks cannot run here. Everything else in this chapter")
    print("does: the figures, the split-K merge (Exercise 6.3, plain torch) and the")
    print("review questions.")
elif ON_GPU:
    print(f"Triton {triton.__version__}: kernels compile for "
          f"{torch.cuda.get_device_name()}")
else:
    print(f"Triton {triton.__version__}: no GPU here, so kernels run in the")
    print(f"interpreter on the CPU (TRITON_INTERPRET={int(INTERPRETED)})")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_primer_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.2 A Triton primer
#
# A Triton kernel is a function decorated with `@triton.jit`. Launching it with a *grid*,
# `kernel[(n,)](args...)`, starts `n` independent **programs**; `tl.program_id(0)` tells each which
# one it is. Tensors arrive as **pointers** to their first element, and the kernel computes the address
# of every element it touches: element `i` of a contiguous vector is at `ptr + i`, element `(r, c)` of a
# matrix with row stride `s` at `ptr + r * s + c`. A program works on whole **tiles**: `tl.arange(0, B)`
# is the vector `0, 1, ..., B-1` (B a power of 2), so `ptr + offsets` is a tile of B addresses and
# `tl.load` reads them all at once. When the data does not fill the last tile, a **mask** says which
# lanes are real: `tl.load(ptrs, mask=m, other=0.0)` reads only where `m` holds and gives `other`
# elsewhere, and `tl.store(ptrs, x, mask=m)` writes only there.
#
# The first kernel below writes, into each element of a length-10 vector, the id of the program that
# owns it (tiles of 4). The second reads with a mask: lanes past the end come back as `other`.

# %% nbgrader={"grade": false, "grade_id": "ch06_primer_demo", "locked": true, "schema_version": 3, "solution": false}
@triton.jit
def owner_kernel(out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                         # which program am I?
    offsets = pid * BLOCK + tl.arange(0, BLOCK)    # the elements of my tile
    tl.store(out_ptr + offsets, offsets * 0 + pid, mask=offsets < n)


@triton.jit
def masked_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    # lanes >= n read nothing and give -1; out has BLOCK lanes, all stored
    values = tl.load(x_ptr + offsets, mask=offsets < n, other=-1.0)
    tl.store(out_ptr + offsets, values)


if TRITON:
    owners = torch.full((10,), -1, dtype=torch.int32, device=DEVICE)
    owner_kernel[(triton.cdiv(10, 4),)](owners, 10, BLOCK=4)
    print(f"{triton.cdiv(10, 4)} programs, tiles of 4; owner of each element:",
          owners.tolist())
    x = torch.arange(5, dtype=torch.float32, device=DEVICE)
    lanes = torch.empty(8, device=DEVICE)
    masked_read_kernel[(1,)](x, lanes, 5, BLOCK=8)
    print("a tile of 8 over a vector of 5, other=-1:", lanes.tolist())
else:
    print("skipped: Triton is not available on this platform")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_ex_gather_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 6.1 — gather rows through an index (2 points)
#
# **Spec.** `out[r, c] = x[index[r], c]` for every `r < rows` and `c < cols`; in torch, `x[index]`.
# This is the paged read in miniature: `index` plays the block table, and row `r` of the output comes
# from wherever the index says.
#
# **Kernel.** Write `gather_rows_program(x_ptr, index_ptr, out_ptr, rows, cols, s_x, s_out,
# BLOCK_ROWS, BLOCK_COLS)`, the code each program runs. It has no `@triton.jit` above it: the
# launcher `gather_rows(x, index, kernel=gather_rows_program)` makes the kernel with
# `triton.jit(gather_rows_program)`, which is exactly what the decorator does, and the grader
# sees a plain function of yours. The launch is a grid of `cdiv(rows, BLOCK_ROWS)` programs;
# program `i` owns output rows
# `i*BLOCK_ROWS ... i*BLOCK_ROWS + BLOCK_ROWS - 1` and all columns (`BLOCK_COLS` is `cols` rounded up
# to a power of 2). Row `j` of `x` starts at `x_ptr + j * s_x`, row `r` of `out` at `out_ptr + r *
# s_out`; inside a row the values are contiguous. Build a `[BLOCK_ROWS, BLOCK_COLS]` tile of addresses
# with broadcasting (`a[:, None] + b[None, :]`), load the tile's `index` entries, then the rows of
# `x`, then store. Nothing outside `out[:rows, :cols]` may be written, and no index past `rows`
# used.
#
# **Check.** The check runs your kernel with `x` and `out` as views into larger buffers: NaN to the
# right of each row of `x`, and -7 all around `out`. When something differs it prints the expected and
# the returned buffer side by side, and which entries differ.

# %% nbgrader={"grade": false, "grade_id": "ch06_gather_rows", "locked": false, "schema_version": 3, "solution": true}
#| include engine/attention/triton_primer.py::gather_rows_program

# %% nbgrader={"grade": true, "grade_id": "ch06_test_gather_rows", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch06.check_gather_rows(gather_rows_program)
### BEGIN HIDDEN TESTS
ch06.check_gather_rows(gather_rows_program, seed=7)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_yours_gather_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your gather.** This cell needs Exercise 6.1. It gathers rows 3, 0, 3 of a 4 x 3
# matrix with your kernel, next to `x[index]`.

# %% nbgrader={"grade": false, "grade_id": "ch06_yours_gather", "locked": true, "schema_version": 3, "solution": false}
if TRITON:
    from engine.attention.triton_primer import gather_rows
    x = torch.arange(12, dtype=torch.float32, device=DEVICE).view(4, 3)
    index = torch.tensor([3, 0, 3], device=DEVICE)
    print("x[index]:   ", x[index].tolist())
    print("your kernel:", gather_rows(x, index, kernel=gather_rows_program).tolist())
else:
    print("skipped: Triton is not available on this platform")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_why_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.3 What a decode step reads
#
# At decode, each sequence adds one token. For every layer, its one query vector per head is compared
# with all $L$ cached keys and mixes all $L$ cached values: about $4 L D$ floating-point operations per
# head against $2 L D$ values read from memory. One or two operations per byte is far below what a GPU
# can compute per byte it loads (its peak FLOP/s over its bandwidth), so decode attention is
# **memory-bound**: its time is the bytes of K and V divided by the memory bandwidth. The cell
# computes those bytes for Llama-3-8B (fp16) against context length, beside the weights every step
# also reads once.

# %% nbgrader={"grade": false, "grade_id": "ch06_traffic", "locked": true, "schema_version": 3, "solution": false}
def weight_bytes(config: ModelConfig, bytes_per_value: int = 2) -> int:
    """Bytes of a Qwen3/Llama-style model's weights: embeddings, attention, MLP."""
    heads = 2 * config.num_heads + 2 * config.num_kv_heads      # q, o and k, v
    attention = config.hidden_size * config.head_dim * heads
    mlp = 3 * config.hidden_size * config.intermediate_size
    tables = 1 if config.tie_word_embeddings else 2             # embedding, output head
    embeddings = config.vocab_size * config.hidden_size * tables
    return (embeddings + config.num_layers * (attention + mlp)) * bytes_per_value


llama = ModelConfig.from_json(CONFIGS / "llama-3-8b.json")
per_token = llama.kv_bytes_per_token(torch.float16)
contexts = [1024, 2048, 4096, 8192, 16384, 32768]
batches = [1, 8, 32]
kv_gib = {b: [b * c * per_token / GiB for c in contexts] for b in batches}
weights_gib = weight_bytes(llama) / GiB
h100 = dict(PEAK_GBS)["H100"]
print(f"Llama-3-8B: {per_token // 1024} KiB of K/V per token, "
      f"{weights_gib:.1f} GiB of weights")
for b in batches:
    crossing = next((c for c, g in zip(contexts, kv_gib[b]) if g > weights_gib), None)
    more = f"; above the weights from {crossing} tokens on" if crossing else ""
    print(f"batch {b:2d}: {kv_gib[b][2]:5.2f} GiB of K/V per step at 4K tokens{more}")
floor_ms = kv_gib[32][-1] * GiB / (h100 * 1e9) * 1e3
print(f"at {h100} GB/s (H100), reading batch 32's K/V at 32K tokens takes at least "
      f"{floor_ms:.0f} ms a step")
figures.plot_decode_traffic(contexts, kv_gib, weights_gib, h100, "Llama-3-8B")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_idea_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.4 The paged decode kernel, on paper
#
# **Addresses.** The pool is `k_pool[N, Hkv, bs, D]` (and `v_pool` alike), each a contiguous tensor with
# strides `(s_kn, s_kh, s_ks, 1)`. Position $p$ of sequence $b$ lives, as in chapter 2, in physical
# block $T[b, \lfloor p / bs \rfloor]$ at slot $p \bmod bs$, so, with $K_0$ the address of
# `k_pool`'s first element, the key of position $p$ for KV head $g$ starts at
#
# $$
# K_0 + T[b, \lfloor p/bs \rfloor]\, s_{kn} + g\, s_{kh} + (p \bmod bs)\, s_{ks}.
# $$
#
# The kernel visits positions in tiles of `BLOCK_N` (a power of 2, independent of the block size):
# for a tile `pos = start + tl.arange(0, BLOCK_N)` it loads the `BLOCK_N` table entries `T[b, pos //
# bs]` as one vector, then a `[BLOCK_N, D]` tile of keys. Positions at or past the sequence's length
# are not the sequence's: the slots after its last token hold whatever was there before, and the table
# entries past its last block name some other block. They are masked, in the loads and in the scores.
#
# **Grouped-query attention.** With $H_q$ query heads and $H_{kv}$ KV heads, the group size is
# $g = H_q / H_{kv}$ and query head $h$ reads KV head $\lfloor h / g \rfloor$: heads $0..g-1$ share KV
# head 0, and so on (the engine's `expand_kv_heads` repeats each KV head $g$ times in a row).
#
# **Online softmax.** Attention for one query is $o = \sum_j e^{s_j - M} v_j \,/\, \sum_j e^{s_j - M}$
# with $s_j = q \cdot k_j / \sqrt{D}$ and $M = \max_j s_j$; subtracting $M$ changes nothing
# mathematically and keeps every exponential at most 1 (in float32 $e^{89}$ is already infinite). The
# kernel cannot know $M$ before it has seen every key, so it keeps three running values: the max $m$
# so far, $l = \sum e^{s_j - m}$ and $\mathit{acc} = \sum e^{s_j - m} v_j$. For each new tile with
# maximum $\tilde m$, the new max is $m' = \max(m, \tilde m)$; what was summed so far is rescaled by
# $\alpha = e^{m - m'}$, and the tile is added:
#
# $$
# l \leftarrow \alpha\, l + \sum_{j \in \text{tile}} e^{s_j - m'}, \qquad
# \mathit{acc} \leftarrow \alpha\, \mathit{acc} + \sum_{j \in \text{tile}} e^{s_j - m'} v_j, \qquad
# m \leftarrow m'.
# $$
#
# After the last tile, $o = \mathit{acc} / l$, exactly. The figure follows one query over 40 keys in
# tiles of 8: the running max steps up when a tile holds a larger score, and the running sum, rescaled
# each time, ends at the exact $\sum_j e^{s_j - M}$.

# %% nbgrader={"grade": false, "grade_id": "ch06_online_softmax", "locked": true, "schema_version": 3, "solution": false}
gen = torch.Generator().manual_seed(3)
scores = torch.randn(40, generator=gen) * 2 + torch.linspace(0, 3, 40)
trace = figures.online_softmax_trace(scores, block_n=8)
for row in trace:
    first, last = row["keys"]
    print(f"tile {row['tile']} (keys {first:2d}-{last:2d}): m = {row['m']:5.2f}, "
          f"alpha = {row['alpha']:.3f}, l = {row['l']:.3f}")
exact = float(torch.exp(scores.double() - scores.max()).sum())
print(f"exact: max = {float(scores.max()):.2f}, sum exp(s - max) = {exact:.3f}")
figures.plot_online_softmax(scores, trace, block_n=8)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_ex_kernel_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 6.2 — `paged_decode_head_program` (4 + 2 + 2 + 3 + 2 points)
#
# Write the body of the function below; its signature and docstring are given. The launcher
# `paged_decode_per_head(q, k_pool, v_pool, block_tables, q_positions, kv_lens,
# kernel=paged_decode_head_program)` compiles your function with `triton.jit` and starts a grid
# of `(B, Hq)` programs, one per (sequence, query head), passing:
#
# * `q_ptr`, `out_ptr`: the queries and the output, `[B, Hq, 1, D]`; the vector of sequence `b`,
#   head `h` starts at `b * s_qb + h * s_qh` (`s_ob`, `s_oh` for the output), its `D` values contiguous;
# * `k_pool`, `v_pool`: the pools `[N, Hkv, BLOCK_SIZE, D]`, strides `s_kn, s_kh, s_ks` (`s_vn, ...`);
# * `tables_ptr`: the block tables `[B, max_blocks]`, row `b` at `tables_ptr + b * s_tb`;
# * `lengths_ptr`: how many keys each sequence's query sees (`lengths[b] >= 1`);
# * `group` $= H_q / H_{kv}$, `scale` $= 1/\sqrt{D}$; constexprs `HEAD_DIM` ($= D$, a power of 2),
#   `BLOCK_SIZE` (any size) and `BLOCK_N` (keys per tile, a power of 2).
#
# Write the output in the output's dtype (`.to(out_ptr.dtype.element_ty)`); do all arithmetic in
# float32 (`.to(tl.float32)` right after each load, as fp16 and bf16 pools would otherwise be summed in
# their own precision). `tl.sum(x, axis=...)`, `tl.max`, `tl.exp`, `tl.maximum`, `tl.where`,
# `tl.zeros(shape, dtype)` and `tl.full(shape, value, dtype)` are what you need; a loop
# `for start in range(0, length, BLOCK_N):` runs over the tiles (`length` loaded from `lengths_ptr`).
# Use `tl.sum` for the dot products, not `tl.dot`: a `tl.dot` needs every side at least 16 to compile
# for a GPU, and here one side is a single query.
#
# **Start what the loop carries as Triton values of their final shape and dtype**, before the loop:
# `m = tl.full((), float("-inf"), tl.float32)`, `l = tl.zeros((), tl.float32)` and
# `acc = tl.zeros((HEAD_DIM,), tl.float32)`. A Python number (`acc = 0.0`, `l = 0`) runs in the
# interpreter, which is plain numpy, but a GPU compiles the loop with each carried value's type
# fixed at its start, and refuses a value that turns into a vector, or an int that turns into a
# float: "Loop-carried variable acc has initial type fp32 but is re-assigned to <['16'], fp32>". On
# a GPU the check reports that refusal; in the interpreter it prints a warning under its ✓ line.
#
# The checks compare your kernel with the engine's torch reference (`paged_attention_reference`) on
# scrambled block tables with spare blocks, lengths from 1 to a few blocks, blocks of 3, 4 and 16, tiles
# that cut blocks in two, GQA groups 1, 2 and 4, in float32 and fp16. When a result is wrong, the
# check recomputes in torch what each classic bug would have returned on the same inputs, and names the
# one that matches: the unmasked tail, `h % Hkv` for the KV head, the logical block used as the physical
# one, a missing scale, a softmax without the running max or without the rescaling, the wrong row of
# the table.

# %% nbgrader={"grade": false, "grade_id": "ch06_decode_kernel", "locked": false, "schema_version": 3, "solution": true}
#| include engine/attention/triton_decode.py::paged_decode_head_program

# %% nbgrader={"grade": true, "grade_id": "ch06_test_decode_kernel", "locked": true, "points": 4, "schema_version": 3, "solution": false}
ch06.check_decode_kernel(paged_decode_head_program)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_garbage_md", "locked": true, "schema_version": 3, "solution": false}
# **Garbage in the tail.** In a real pool, the slots after a sequence's last token hold stale keys of
# a sequence that finished, or nothing ever written. The next check fills every slot that no sequence
# owns with NaN. Masking only the scores is not enough: a masked score gives $p = 0$, and
# $0 \times \text{NaN} = \text{NaN}$. (On a GPU an unmasked read past the pool can also fault; the
# interpreter reads whatever memory is there, silently.)

# %% nbgrader={"grade": true, "grade_id": "ch06_test_decode_garbage", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch06.check_decode_garbage(paged_decode_head_program)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_large_md", "locked": true, "schema_version": 3, "solution": false}
# **Large scores.** Real activations give scores far larger than random test vectors do. The next check
# scales the queries by 60, so scores reach the hundreds: $e^{s}$ overflows float32 past $s \approx 88$
# (fp16 past $s \approx 11$), and only a softmax that subtracts its running max stays finite.

# %% nbgrader={"grade": true, "grade_id": "ch06_test_decode_large_scores", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch06.check_decode_large_scores(paged_decode_head_program)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_explorer_md", "locked": true, "schema_version": 3, "solution": false}
# ### What one program reads
#
# The explorer shows a pool of 4-slot blocks holding three sequences (lengths 3, 6 and 11) in
# scrambled blocks. Pick a sequence, a tile and the tile size: on the left, the slots that program
# reads in that tile are green, labelled with their positions; on the right, the tile's positions,
# with the table lookups `T[i] = block` and, in red, the positions past the sequence's end that the
# mask must drop. A tile of 8 over 4-slot blocks reads two blocks, which need not be neighbours.

# %% nbgrader={"grade": false, "grade_id": "ch06_explorer", "locked": true, "schema_version": 3, "solution": false}
walk = ch06.decode_case([3, 6, 11], group=1, block_size=4, block_n=8, seed=4, spare=2)
walk_lengths = walk["kv_lens"].tolist()


def explore_walk(seq=2, tile=0, block_n=8):
    """The slots program (seq, head) reads in one tile of the engine's kernel."""
    tiles = -(-walk_lengths[seq] // block_n)
    if tile >= tiles:      # drawn all red: the tile the kernel never runs
        print(f"sequence {seq} has {walk_lengths[seq]} keys: {tiles} tile(s) of "
              f"{block_n}; tile {tile} is never visited")
    figures.draw_kernel_walk(walk["block_tables"], walk_lengths,
                             walk["k_pool"].shape[0], 4, seq, tile, block_n)


explorer(explore_walk, seq=([0, 1, 2], 2), tile=(0, 2, 0), block_n=([4, 8, 16], 8))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_yours_kernel_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your kernel on one batch.** This cell needs Exercise 6.2. It runs your kernel and
# the engine's on the explorer's batch with four query heads over two KV heads, and prints the largest
# difference from the torch reference for each.

# %% nbgrader={"grade": false, "grade_id": "ch06_yours_kernel", "locked": true, "schema_version": 3, "solution": false}
if TRITON:
    batch = ch06.decode_case([3, 6, 11], group=2, block_size=4, block_n=8, seed=4)
    expected = ch06.reference(batch)
    for name, kernel in (("engine's", None), ("your", paged_decode_head_program)):
        got = ch06.run_decode(kernel, batch)
        worst = float((got - expected).abs().max())
        print(f"{name} kernel: max |out - reference| = {worst:.1e}")
else:
    print("skipped: Triton is not available on this platform")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_engine_md", "locked": true, "schema_version": 3, "solution": false}
# ### The milestone: your kernel in the engine
#
# The last two checks of the exercise subclass the engine's `PagedKVCache` so that every decode step
# (one new token per sequence) attends through your kernel, reading the pool in place, while the
# prompts' prefill stays on the torch path. Each prefills a ragged batch in blocks of $bs = 4$,
# decodes 20 tokens for every sequence, and compares every decode step's logits with a from-scratch
# run of the same tokens, within $10^{-5}$, as blocks fill and new blocks are taken. The first batch
# holds prompts of $bs - 1$ and $2bs + 1$ tokens, the second $bs$ and $bs + 1$. The model is the
# course's tiny Qwen3 cut to one layer with one head: the interpreter runs each program of these
# steps in Python, and the other checks have already covered heads and groups.

# %% nbgrader={"grade": true, "grade_id": "ch06_test_decode_in_engine", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ch06.check_decode_in_engine(paged_decode_head_program, lengths=[3, 9])

# %% nbgrader={"grade": true, "grade_id": "ch06_test_decode_in_engine_edges", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch06.check_decode_in_engine(paged_decode_head_program, lengths=[4, 5])

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_speed_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.5 How fast is it?
#
# On a GPU the next cell times, on one fp16 batch of 32 sequences of 4,096 tokens with Qwen3-0.6B's
# heads (16 query heads over 8 KV heads of 128), your kernel, the engine's grouped kernel and torch's
# `scaled_dot_product_attention` on the same keys and values laid out contiguously. It reports the
# bandwidth each achieves: bytes of K and V read per second (each cached byte counted once), as a
# fraction of the card's peak and of SDPA's. In the interpreter such timings would measure Python,
# not memory, so on a CPU the cell says so and prints no figure.
#
# What to look for. Your kernel runs one program per query head, so each key is loaded once per
# head of its group (twice here; the second load may hit the L2 cache). The engine's kernel, the one
# `paged_attention` runs, differs in three ways, the steps of the stretch exercise at the end of the
# chapter: one program per (sequence, KV head) attends the whole group with one load of each tile;
# its products are float32 without padding the group (2 rows here) or `tl.dot` in fp16 on the
# tensor cores, whichever its table picks for the shape; and long histories are split over several
# programs when the batch is too small to fill the GPU (split-K, section 6.6). SDPA reads one
# contiguous stream per head, the easiest pattern for the memory system: the bar to compare with.
#
# **With your code: the bandwidth of your kernel.** This cell needs Exercise 6.2 (on a GPU; on a CPU
# it measures nothing).

# %% nbgrader={"grade": false, "grade_id": "ch06_bench", "locked": true, "schema_version": 3, "solution": false}
NAMES = {"sdpa_contiguous": "SDPA", "per_head_kernel": "your kernel",
         "grouped_kernel": "engine's kernel"}
if ON_GPU:
    from engine.tools.bench_decode import compare_kernels
    rows = compare_kernels(batch=32, context=4096, kernel=paged_decode_head_program)
    for row in rows:
        share = "peak unknown"
        if row["peak_gbs"]:
            share = f"{row['fraction_of_peak']:.0%} of peak"
        diff = row["max_abs_diff_vs_sdpa"]
        print(f"{NAMES[row['impl']]:15s} {row['ms']:7.3f} ms {row['gbs']:6.0f} GB/s "
              f"{share:>12s} {row['vs_sdpa']:5.2f}x SDPA  |Δ| {diff:.0e}")
    print(f"peak: {rows[0]['peak_gbs']} GB/s ({torch.cuda.get_device_name()})")
elif not TRITON:
    print("skipped: bandwidth needs a GPU, and Triton is not available here")
else:
    print("skipped: bandwidth needs a GPU; in the interpreter a kernel runs at the")
    print("speed of Python, not of memory")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_split_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.6 Split-K: many programs for one long sequence
#
# A batch of 2 sequences with 8 KV heads is 16 programs; an H100 has 132 streaming multiprocessors, and
# most would idle while 16 programs each walk 100,000 keys. **Split-K** (flash-decoding) cuts each
# history into $S$ slices, attends each slice in its own program, and merges. A slice $s$ returns its
# own max $m_s$, $l_s = \sum_{j \in s} e^{x_j - m_s}$ and $\mathit{acc}_s = \sum_{j \in s} e^{x_j - m_s}
# v_j$: unnormalized, so the slices can be combined exactly. With $M = \max_s m_s$,
#
# $$
# o = \frac{\sum_s e^{m_s - M}\, \mathit{acc}_s}{\sum_s e^{m_s - M}\, l_s}.
# $$
#
# A slice past the end of a short sequence is empty: $m_s = -\infty$, $l_s = 0$, weight $e^{-\infty} =
# 0$. If *every* slice is empty (a padding row), $M = -\infty$ too and $e^{-\infty - (-\infty)}$ is
# NaN, so the merge takes $M = 0$ there and returns 0. The engine's `paged_decode(..., num_splits=S)`
# does this with two kernels; `split_partials` runs the first and returns the partials.
#
# **How many slices.** Splitting pays only while the (sequence, KV head) programs are too few to
# occupy the GPU; beyond that every slice only adds partials to write and read back, and a second
# launch for the merge. The engine's split chooser, `choose_num_splits(batch, kv_heads, max_blocks,
# block_size, device)`, counts the programs, $B \cdot H_{kv}$, against a target of two per streaming
# multiprocessor (SM). At or above the target it does not split. Below it, it takes as many slices as
# reach the target, but never a slice shorter than 512 keys and never more than 16 slices; the
# history's length comes from the block table's width, so it reads nothing back from the GPU. On a
# CPU it always answers 1. The next cell asks it about a few batches on a GPU with 132 SMs (an H100's
# count), through `split_count`, the same rule with the SM count given.

# %% nbgrader={"grade": false, "grade_id": "ch06_splits", "locked": true, "schema_version": 3, "solution": false}
for batch, context in ((64, 4096), (16, 4096), (2, 100_000), (2, 512)):
    splits = split_count(batch, kv_heads=8, max_blocks=-(-context // 16), block_size=16,
                         sm_count=132)
    programs = batch * 8
    print(f"batch {batch:2d} x {context:7,d} tokens: {programs:3d} programs, 132 SMs "
          f"-> {splits:2d} slice(s)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_merge_md", "locked": true, "schema_version": 3, "solution": false}
# ### Exercise 6.3 (stretch, graded) — `merge_partials` (2 points)
#
# Write the merge in torch: `merge_partials(m, l, acc)` takes `m`, `l` of shape `[..., S]` and `acc`
# of shape `[..., S, D]` and returns `[..., D]` (float32). The check builds partials for histories of
# 0 to 50 keys cut into 1, 4 and 8 slices (empty ones included) and compares with the softmax over
# each whole history; it runs in plain torch, on every platform.

# %% nbgrader={"grade": false, "grade_id": "ch06_merge_partials", "locked": false, "schema_version": 3, "solution": true}
#| include engine/attention/triton_decode.py::merge_partials

# %% nbgrader={"grade": true, "grade_id": "ch06_test_merge_partials", "locked": true, "points": 2, "schema_version": 3, "solution": false}
ch06.check_merge_partials(merge_partials)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_yours_split_md", "locked": true, "schema_version": 3, "solution": false}
# **With your code: your merge after the engine's split kernel.** This cell needs Exercise 6.3. It runs
# the engine's split kernel with 4 slices on three sequences of 2, 17 and 70 keys, with 4 query heads.
# The 2 keys of the first fit in its first slice, so its other slices are empty for every head; the
# cell counts those empty (head, slice) pairs, merges the partials with your `merge_partials`, and
# compares with the unsplit kernel.

# %% nbgrader={"grade": false, "grade_id": "ch06_yours_split", "locked": true, "schema_version": 3, "solution": false}
if TRITON:
    split = ch06.decode_case([2, 17, 70], group=2, block_size=16, block_n=16, seed=9)
    names = ("q", "k_pool", "v_pool", "block_tables", "q_positions", "kv_lens")
    args = [split[name].to(DEVICE) for name in names]
    m, l, acc = split_partials(*args, num_splits=4)
    empty = int((m[0] == float("-inf")).sum())
    heads, slices = m.shape[1], m.shape[2]
    print(f"2-key sequence: {empty} of its {heads} heads x {slices} slices are empty "
          f"(m = -inf)")
    merged = merge_partials(m, l, acc)[..., :16]
    whole = paged_decode(*args)[:, :, 0].float()
    worst = float((merged - whole).abs().max())
    print(f"your merge vs the unsplit kernel: max |Δ| = {worst:.1e}")
else:
    print("skipped: Triton is not available on this platform")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_gap_md", "locked": true, "schema_version": 3, "solution": false}
# ### Stretch (ungraded): close the gap to the engine's kernel
#
# The bandwidth cell of section 6.5 shows, on a GPU, how far your per-head kernel is from the card's
# peak and from the engine's kernel. Three changes close that gap. Make them one at a time on a copy of
# your kernel, keep each equal to `paged_attention_reference` within fp16 tolerance (the interpreter
# checks that much on a CPU), and measure each on a GPU: the effect depends on the card, the group size
# and the batch, so this text gives no figure; the cell below prints yours.
#
# 1. **Group the heads.** One program per (sequence, KV head) instead of per query head: load the
#    group's query vectors as a `[GROUP, D]` tile, each K and V tile once for all of them, and take the
#    scores as a `[GROUP, BLOCK_N]` tile, `tl.sum(q[:, None, :] * k[None, :, :], axis=2)` (GROUP a
#    power of 2, rows past the group masked). What to measure: GB/s, each cached byte counted once;
#    the per-head kernel loads every byte once per head of the group.
# 2. **The dtype of the products.** Keep K and V in fp16 as loaded and multiply on the tensor cores
#    with `tl.dot(q, tl.trans(k))` and a float32 accumulator, the group padded to 16 rows (the
#    smallest `tl.dot` that many GPUs and Triton versions compile), against step 1's float32
#    products. What to measure: both versions, at the group size of your model; the engine picks
#    one per shape from a table.
# 3. **Split-K.** At small batches, cut each history into slices (section 6.6) and merge them with
#    your `merge_partials`. What to measure: a batch of 4 as well as 32; split-K should help only
#    where the programs are too few for the SMs.
#
# **With your code: the steps, measured.** This cell needs Exercise 6.2 (on a GPU; on a CPU it
# measures nothing). For a batch of 32 and one of 4 sequences it times your per-head kernel, then the
# engine's kernel configured as each step (grouped with float32 products, fp16 `tl.dot`, then the
# better of the two split), and SDPA, and prints GB/s, the fraction of the card's peak and of SDPA.

# %% nbgrader={"grade": false, "grade_id": "ch06_gap", "locked": true, "schema_version": 3, "solution": false}
STEPS = {"per_head": "your kernel", "grouped": "1. grouped",
         "grouped_fp16_dot": "2. fp16 dot", "split_k": "3. split-K",
         "sdpa_contiguous": "SDPA"}
if ON_GPU:
    from engine.tools.bench_decode import ladder
    for batch, context in ((32, 4096), (4, 16384)):
        print(f"batch {batch}, {context:,d} tokens each:")
        for row in ladder(batch, context, kernel=paged_decode_head_program):
            share = "peak unknown"
            if row["peak_gbs"]:
                share = f"{row['fraction_of_peak']:.0%} of peak"
            slices = f" ({row['num_splits']} slices)" if "num_splits" in row else ""
            print(f"  {STEPS[row['impl']]:13s} {row['gbs']:6.0f} GB/s {share:>12s} "
                  f"{row['vs_sdpa']:5.2f}x SDPA{slices}")
else:
    print("skipped: these steps are measured on a GPU; there this cell prints")
    print("each one's GB/s and fraction of the card's peak and of SDPA")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_prefill_md", "locked": true, "schema_version": 3, "solution": false}
# ★★★ **A paged prefill kernel (ungraded).** Prefill attends a block of new queries of one sequence,
# causally, to its paged history plus the new tokens (already written to the pool). Each query row
# gets its own limit (its position), and padding rows (position -1) see nothing. Write it as a grid of
# (sequence, head, query tile) programs that reuses the decode kernel's tile loop with a per-row limit;
# test it against `paged_attention_reference` with ragged chunks that start mid-block.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_review_md", "locked": true, "schema_version": 3, "solution": false}
# ## 6.7 Check your understanding
#
# Q1 to Q3 are graded automatically: replace `None` with your answer. Q4 and Q5 are written answers,
# graded by your instructor.
#
# **Q1 (1 point).** Qwen3-0.6B has 28 layers and 8 KV heads of dimension 128. How many MiB of keys
# and values ($2^{20}$ bytes) does one decode step read for one sequence with 4,096 cached tokens, in
# fp16?

# %% nbgrader={"grade": false, "grade_id": "ch06_q1", "locked": false, "schema_version": 3, "solution": true}
q1_mib = None  # a number
### BEGIN SOLUTION
q1_mib = 2 * 4096 * 28 * 8 * 128 * 2 / 2**20
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch06_test_q1", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch06.check_answer_decode_bytes(q1_mib)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_q2_md", "locked": true, "schema_version": 3, "solution": false}
# **Q2 (1 point).** Llama-3-70B has 64 query heads and 8 KV heads. Which KV head does query head 37
# read?

# %% nbgrader={"grade": false, "grade_id": "ch06_q2", "locked": false, "schema_version": 3, "solution": true}
q2_kv_head = None  # an int
### BEGIN SOLUTION
q2_kv_head = 37 // (64 // 8)
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch06_test_q2", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch06.check_answer_kv_head(q2_kv_head)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_q3_md", "locked": true, "schema_version": 3, "solution": false}
# **Q3 (1 point).** A model has 32 query heads and 8 KV heads. In one decode step, how many times is
# each cached key loaded from memory by your per-head kernel, and by the engine's grouped kernel
# (one program per KV head)? Answer a pair `(per_head, grouped)`.

# %% nbgrader={"grade": false, "grade_id": "ch06_q3", "locked": false, "schema_version": 3, "solution": true}
q3_loads = None  # a pair (per_head, grouped)
### BEGIN SOLUTION
q3_loads = (32 // 8, 1)
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ch06_test_q3", "locked": true, "points": 1, "schema_version": 3, "solution": false}
ch06.check_answer_loads(q3_loads)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_q4_md", "locked": true, "schema_version": 3, "solution": false}
# **Q4 (2 points).** Your kernel sets the scores of positions past the sequence's length to $-\infty$.
# Why must it also mask the loads of K and V? Give two different reasons.

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch06_q4", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric (1 point each). (1) Values: a masked score gives weight $p = 0$, but $0 \times v$ is NaN
# when the unused slot holds NaN or inf (stale or never-written memory), so one bad slot poisons the
# output; the load mask with `other=0.0` makes the product a true 0. (2) Addresses: past the last
# block, the table entries are padding (or another sequence's blocks, or past the table's end), and
# past the pool the address is outside the allocation: on a GPU that can fault, and in the interpreter
# it silently reads foreign memory. Masked lanes are never dereferenced at all. (Also accept: fewer
# bytes read, since masked lanes cost no memory traffic.)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_q5_md", "locked": true, "schema_version": 3, "solution": false}
# **Q5 (2 points).** When does split-K make decode faster, and when does it make it slower? The
# engine's `choose_num_splits` (section 6.6) bounds the history's length by the block table's width,
# not by `kv_lens`: why?

# %% [markdown] nbgrader={"grade": true, "grade_id": "ch06_q5", "locked": false, "points": 2, "schema_version": 3, "solution": true}
# Rubric (1 point each). (1) Faster when there are too few (sequence, KV head) programs to occupy the
# GPU's SMs, i.e. small batches with long contexts: the slices of one history are read in parallel,
# so more of the memory bandwidth is used. Slower, or no better, when the batch already fills the GPU
# or the slices are short: every slice adds a partial result to write and read back and the merge a
# second kernel launch, for no extra parallelism (hence the 512-key minimum). (2) `kv_lens` lives on
# the GPU: reading it on the host (`.max()`, `.item()`) waits for the GPU to finish everything queued
# before, a sync in every layer of every step; the table's width is a shape, known on the host for
# free, and it bounds every history of the batch (a row never has more keys than its table holds).

# %% [markdown] nbgrader={"grade": false, "grade_id": "ch06_deeper", "locked": true, "schema_version": 3, "solution": false}
# ## 6.8 Going deeper
#
# * Kwon et al., [*Efficient Memory Management for Large Language Model Serving with PagedAttention*](https://doi.org/10.1145/3600006.3613165)
#   (SOSP 2023, [arXiv:2309.06180](https://arxiv.org/abs/2309.06180)): the paged cache and the first paged attention kernels (vLLM).
# * Dao et al., [*FlashAttention*](https://arxiv.org/abs/2205.14135) (2022), and the
#   [flash-decoding write-up](https://crfm.stanford.edu/2023/10/12/flashdecoding.html) (Dao, Haziza,
#   Massa, Sizov, 2023): the online softmax in tiles, and split-K for long-context decode.
# * Ye et al., [*FlashInfer*](https://arxiv.org/abs/2501.01005) (2025) and
#   [GPU Mode](https://github.com/gpu-mode/lectures) lecture 40: paged and ragged attention kernels
#   in production, with block tables as a first-class input.
# * [Triton's tutorials](https://triton-lang.org/main/getting-started/tutorials/index.html) (fused
#   softmax, fused attention) and Sasha Rush's [*Triton-Puzzles*](https://github.com/srush/Triton-Puzzles),
#   which this chapter's primer follows: small kernels, a torch spec, a check in the interpreter.
# * Kirk, Hwu and El Hajj, *Programming Massively Parallel Processors*, 4th ed., §20.7 (the memory
#   of the attention mechanism).
# * vLLM's attention backends
#   ([`vllm/v1/attention/backends/`](https://github.com/vllm-project/vllm/tree/main/vllm/v1/attention/backends)),
#   whose paged decode kernels follow the structure of this chapter, adding FP8 caches and mixed
#   prefill/decode batches.
#
# ## Summary
#
# * Decode attention reads every cached key and value once per token with little math per byte: it is
#   bound by memory bandwidth, so reading the pool in place (no gather) is the whole point.
# * A paged kernel turns position $p$ into physical block $T[b, \lfloor p/bs \rfloor]$ and slot
#   $p \bmod bs$, masks everything at or past the sequence's length, maps query head $h$ to KV head
#   $\lfloor h/g \rfloor$, and runs an online softmax in float32 that rescales its sums whenever the
#   running max grows.
# * Loading each K/V tile once per KV group and splitting long histories over programs (merged by
#   log-sum-exp) are the next steps toward speed; measure each against the card's peak and SDPA.
