"""Paged prefill attention in Triton: a tile of new queries attends causally to its sequence's paged history.

By the time the kernel runs, the cache has already written the new tokens' K/V into the pool,
so "history plus new tokens" is one paged range, 0..kv_len-1. Each query row gets its own
causal limit (its position), and padding rows (position -1) see nothing. `attend_pages` is the
tile loop (an online softmax through the block table); only the per-row limits are prefill's own.

Arguments that change from one engine step to the next (the number of new tokens, the strides that
follow it, the block table's width) are not specialized on (`do_not_specialize`): Triton would
otherwise compile a new variant whenever one of them turns 1 or a multiple of 16.
"""

from __future__ import annotations

import math

import torch

from engine.attention.triton_setup import prepare_triton

INTERPRETED = prepare_triton()  # before `import triton`: kernels are interpreted or compiled when defined

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.attention.decode_config import MIN_DOT  # noqa: E402
from engine.attention.paged_reference import check_paged_inputs  # noqa: E402
from engine.attention.triton_decode import LOG2E, check_runnable  # noqa: E402

STEP_VARYING = ("steps", "s_qb", "s_qh", "s_ob", "s_oh", "s_tb", "s_pb")


@triton.jit
def attend_pages(q, qk_scale, row_last, k_pool, v_pool, table_row, kv_head, start, stop, head_dim,
                 s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                 ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 D_PAD: tl.constexpr, DOT_FP32: tl.constexpr):
    """Online softmax of q's rows over key positions [start, stop), read through one block table.

    q [ROWS, D_PAD] is in the pool's dtype (float32 when DOT_FP32); scores are q.k * qk_scale in
    base 2 (qk_scale = log2(e) / sqrt(D)). Row r may see positions <= row_last[r] (-1: nothing).
    Returns the running max m, the sum of exponentials l and the unnormalized output
    acc = sum_j exp2(s_j - m) v_j, all float32, so a caller can normalize them.
    """
    dims = tl.arange(0, D_PAD)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D_PAD], tl.float32)
    for tile_start in range(start, stop, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        in_range = pos < stop  # the tail: slots past the sequence's end hold garbage, never read them
        # The indirection: logical position p lives in physical block table[p // bs], at slot p % bs.
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        kv_mask = in_range[:, None] & (dims[None, :] < head_dim)
        k_addr = k_pool + block[:, None] * s_kn + kv_head * s_kh + slot[:, None] * s_ks + dims[None, :] * s_kd
        v_addr = v_pool + block[:, None] * s_vn + kv_head * s_vh + slot[:, None] * s_vs + dims[None, :] * s_vd
        k = tl.load(k_addr, mask=kv_mask, other=0.0)  # [BLOCK_N, D_PAD], the pool's dtype
        v = tl.load(v_addr, mask=kv_mask, other=0.0)
        if DOT_FP32:   # fp32 pools (full precision, "ieee"), and bf16 in the interpreter (its bf16 math is wrong)
            k = k.to(tl.float32)
            v = v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale    # [ROWS, BLOCK_N]
        else:          # fp16/bf16 operands, float32 accumulation: the tensor cores
            scores = tl.dot(q, tl.trans(k)) * qk_scale
        visible = in_range[None, :] & (pos[None, :] <= row_last[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        # A row that has seen nothing yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        # Online softmax: scores so far were exponentiated against the old max; rescale them to the new one.
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    return m, l, acc


@triton.jit(do_not_specialize=STEP_VARYING)
def paged_prefill_kernel(q_ptr, k_pool, v_pool, tables_ptr, q_pos_ptr, kv_lens_ptr, out_ptr,
                         steps, group, head_dim, qk_scale,
                         s_qb, s_qh, s_qt, s_qd, s_ob, s_oh, s_ot, s_od, s_tb, s_pb, s_pt,
                         s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                         BLOCK_M: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                         D_PAD: tl.constexpr, DOT_FP32: tl.constexpr):
    """Grid (B, Hq, query tiles): BLOCK_M queries of one head of one sequence over its paged keys."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D_PAD)
    in_batch = rows < steps
    mask = in_batch[:, None] & (dims[None, :] < head_dim)
    q = tl.load(q_ptr + seq * s_qb + head * s_qh + rows[:, None] * s_qt + dims[None, :] * s_qd, mask=mask, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    # Row r sees keys j <= its position that are stored (j < kv_len); padding rows (position -1) see none.
    kv_len = tl.load(kv_lens_ptr + seq)
    positions = tl.load(q_pos_ptr + seq * s_pb + rows * s_pt, mask=in_batch, other=-1)
    row_last = tl.minimum(positions, kv_len - 1)
    stop = tl.maximum(tl.max(row_last, axis=0) + 1, 0)  # keys past the tile's last query are never needed
    m, l, acc = attend_pages(q, qk_scale, row_last, k_pool, v_pool, tables_ptr + seq * s_tb, head // group, 0,
                             stop, head_dim, s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                             BLOCK_M, BLOCK_SIZE, BLOCK_N, D_PAD, DOT_FP32)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # padding rows saw nothing: write 0, not 0/0
    tl.store(out_ptr + seq * s_ob + head * s_oh + rows[:, None] * s_ot + dims[None, :] * s_od,
             out.to(out_ptr.dtype.element_ty), mask=mask)


def tile_sizes(block_size: int, head_dim: int, steps: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, D_PAD): queries and keys per tile and the padded head dim, powers of 2 >= 16.

    fp16/bf16 run on tensor cores with tiles of up to 64 queries x 32-64 keys; float32 runs its dots
    at full precision without them, in tiles of 16 queries (larger ones spill registers).
    """
    d_pad = max(MIN_DOT, triton.next_power_of_2(head_dim))
    block_m = max(MIN_DOT, min(16 if dtype == torch.float32 else 64, triton.next_power_of_2(steps)))
    # About 4K elements per K tile: 32 keys at head_dim 128, 64 at 64.
    block_n = max(MIN_DOT, min(64, 4096 // d_pad))
    return block_m, block_n, d_pad


def paged_prefill(q, k_pool, v_pool, block_tables, q_positions, kv_lens, block_m: int | None = None,
                  block_n: int | None = None) -> torch.Tensor:
    """Causal attention of q [B, Hq, T, D] (ragged rows, position -1 = padding) over the paged pools.

    Returns [B, Hq, T, D] in q's dtype; padding rows come back as zeros.
    """
    check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    batch, q_heads, steps, head_dim = q.shape
    kv_heads, block_size = k_pool.shape[1], k_pool.shape[2]
    check_runnable(q, block_tables, kv_lens, block_size)
    block_tables, kv_lens = block_tables.contiguous(), kv_lens.contiguous()  # indexed as dense rows
    tile_m, tile_n, d_pad = tile_sizes(block_size, head_dim, steps, q.dtype)
    block_n = block_n or tile_n
    block_m = block_m or tile_m
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if size < MIN_DOT or size & (size - 1):
            raise ValueError(f"{name} must be a power of 2 >= {MIN_DOT}, got {size}")
    out = torch.empty_like(q)
    if batch == 0 or steps == 0:
        return out
    grid = (batch, q_heads, triton.cdiv(steps, block_m))
    paged_prefill_kernel[grid](
        q, k_pool, v_pool, block_tables, q_positions, kv_lens, out,
        steps, q_heads // kv_heads, head_dim, LOG2E / math.sqrt(head_dim),
        *q.stride(), *out.stride(), block_tables.stride(0), *q_positions.stride(),
        *k_pool.stride(), *v_pool.stride(),
        BLOCK_M=block_m, BLOCK_SIZE=block_size, BLOCK_N=block_n, D_PAD=d_pad,
        DOT_FP32=q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16))
    return out
