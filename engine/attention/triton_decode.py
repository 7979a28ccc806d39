"""Paged decode attention in Triton: each sequence's one new query reads its history through the block table.

Two kernels compute the same thing:

`paged_decode_head_kernel` is the simplest correct one, chapter 6's: one program per (sequence,
query head), float32 products reduced with tl.sum. The chapter has the learner write its function,
`paged_decode_head_program`; `paged_decode_per_head` launches it (or a learner's function or kernel
with the same signature).

`paged_decode_grouped_kernel` is what `engine.attention.paged_attention` runs. Decode reads every
cached key and value once and does little math on each, so its speed is memory bandwidth, and the
kernel is built to read each byte once, in big contiguous pieces:
  * one program per (sequence, KV head) attends every query head of that KV group, so a K/V tile
    is loaded once for the whole group (not once per query head);
  * K and V are loaded in their storage dtype (fp16/bf16: half the bytes of float32); the products
    are float32 elementwise ("sum", for small groups, no padding) or tl.dot in the storage dtype
    with float32 accumulation ("dot", on tensor cores), chosen by `decode_config`;
  * the block table is read once per tile (one entry per block the tile covers), and a tile's
    keys of one block are one contiguous run of the pool;
  * split-K (flash-decoding): when the (sequence, KV head) programs cannot fill the GPU, each
    history is cut into slices attended by separate programs, which write partials (m, l, acc)
    that `merge_splits_kernel` combines by log-sum-exp (`merge_partials` is its torch spec).
Scores are kept in base 2 (q.k * scale * log2(e), then exp2), which is exp() with one multiply
less; the partials' m is converted back to natural units, so they mean what the chapter says.
A row that sees no key (padding, position -1, or kv_len 0) comes back as zeros.
"""

from __future__ import annotations

import math
import types

import torch

from engine.attention.triton_setup import prepare_triton

INTERPRETED = prepare_triton()  # before `import triton`: kernels are interpreted or compiled when defined

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.attention.decode_config import (  # noqa: E402
    DecodeConfig, candidates, check_config, default_config, fastest, ids_per_tile,
)
from engine.attention.paged_reference import check_paged_inputs, check_table_covers  # noqa: E402

LOG2E = 1.4426950408889634   # exp(x) = exp2(x * log2(e))
# Integer arguments that change from step to step (the block table's width, the split count):
# never specialized on, or Triton compiles a new variant whenever one turns 1 or a multiple of 16.
STEP_VARYING = ("s_tb", "num_splits")


def paged_decode_head_program(q_ptr, k_pool, v_pool, tables_ptr, lengths_ptr, out_ptr,
                              group, scale, s_qb, s_qh, s_ob, s_oh, s_tb,
                              s_kn, s_kh, s_ks, s_vn, s_vh, s_vs,
                              HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                              BLOCK_N: tl.constexpr):
    """Grid (B, Hq): program (b, h) attends head h of sequence b to keys 0..length-1.

    The query of (b, h) starts at q_ptr + b * s_qb + h * s_qh, its output at out_ptr +
    b * s_ob + h * s_oh; the HEAD_DIM values of a vector are contiguous. The pools are
    [N, Hkv, BLOCK_SIZE, HEAD_DIM] with strides s_kn, s_kh, s_ks (s_vn, s_vh, s_vs).
    Position p is at slot p % BLOCK_SIZE of physical block tables[b, p // BLOCK_SIZE]
    (row b of the table starts at tables_ptr + b * s_tb); length = lengths_ptr[b] >= 1.
    Query head h reads KV head h // group. Visit the keys BLOCK_N positions at a time
    with an online softmax in float32; scores are q.k * scale, scale = 1/sqrt(HEAD_DIM).
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group                  # `group` query heads share one KV head
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * s_qb + head * s_qh + dims).to(tl.float32) * scale
    length = tl.load(lengths_ptr + seq)
    m = tl.full((), float("-inf"), tl.float32)  # running max of the scores so far
    l = tl.zeros((), tl.float32)                # running sum of exp(score - m)
    acc = tl.zeros((HEAD_DIM,), tl.float32)     # running sum of exp(score - m) * value
    for start in range(0, length, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < length                 # past the end: not this sequence's keys
        table = tables_ptr + seq * s_tb
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        slot = pos % BLOCK_SIZE
        k_at = k_pool + block * s_kn + kv_head * s_kh + slot * s_ks
        v_at = v_pool + block * s_vn + kv_head * s_vh + slot * s_vs
        tile = valid[:, None]
        k = tl.load(k_at[:, None] + dims[None, :], mask=tile, other=0.0).to(tl.float32)
        v = tl.load(v_at[:, None] + dims[None, :], mask=tile, other=0.0).to(tl.float32)
        scores = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        alpha = tl.exp(m - m_new)            # rescales what was summed against old m
        p = tl.exp(scores - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    out = (acc / l).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + seq * s_ob + head * s_oh + dims, out)


# The kernel: what @triton.jit above the function would make. The chapter has the learner write the
# plain function (a function of their own), and `as_kernel` compiles it the same way.
paged_decode_head_kernel = triton.jit(paged_decode_head_program)
_KERNELS: dict = {}


def as_kernel(fn):
    """A launchable Triton kernel: `fn` itself if triton.jit made it, else triton.jit(fn) of a plain
    function, made once per function. Anything else (an object merely indexed by a grid) is refused."""
    if isinstance(fn, triton.runtime.KernelInterface):
        return fn
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"a kernel is a function in Triton's language or a triton.jit kernel, not a "
                        f"{type(fn).__name__}")
    if fn not in _KERNELS:
        _KERNELS[fn] = triton.jit(fn)
    return _KERNELS[fn]


@triton.jit
def tile_blocks(table_row, tile_start, stop, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                IDS_PER_TILE: tl.constexpr):
    """The physical block of each of a tile's BLOCK_N positions, [BLOCK_N] int64.

    The IDS_PER_TILE table entries the tile covers are loaded once each and repeated over their
    BLOCK_SIZE slots (one entry when the tile lies inside one block). IDS_PER_TILE = 0, for a
    block size that is not a power of 2, looks up each position's entry instead.
    """
    pos = tile_start + tl.arange(0, BLOCK_N)
    if IDS_PER_TILE == 0:
        block = tl.load(table_row + pos // BLOCK_SIZE, mask=pos < stop, other=0).to(tl.int64)
    else:
        entry = tile_start // BLOCK_SIZE + tl.arange(0, IDS_PER_TILE)
        ids = tl.load(table_row + entry, mask=entry * BLOCK_SIZE < stop, other=0).to(tl.int64)
        repeated = tl.broadcast_to(ids[:, None], (IDS_PER_TILE, BLOCK_N // IDS_PER_TILE))
        block = tl.reshape(repeated, (BLOCK_N,))
    return block


@triton.jit
def query_operand(q, qk_scale, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr):
    """The group's query rows [ROWS, D_PAD] in the dtype the score products take.

    tl.dot multiplies in the pool's dtype (float32 when DOT_FP32) and scales the scores after;
    the elementwise "sum" path scales the float32 queries once here instead.
    """
    if USE_DOT:
        if DOT_FP32:
            q = q.to(tl.float32)
    else:
        q = q.to(tl.float32) * qk_scale
    return q


@triton.jit
def slice_bounds(q_pos_ptr, kv_lens_ptr, seq, split, num_splits, BLOCK_N: tl.constexpr):
    """[start, stop) of the keys split `split` of sequence `seq` attends (split-K slices).

    Slices are whole tiles long, so every tile starts on a tile boundary (and a block boundary).
    """
    # The query at position p sees keys j <= p that are stored (j < kv_len); padding (p = -1) sees none.
    last = tl.minimum(tl.load(q_pos_ptr + seq), tl.load(kv_lens_ptr + seq) - 1)
    visible = tl.maximum(last + 1, 0)
    per_split = tl.cdiv(tl.cdiv(visible, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    stop = tl.minimum(start + per_split, visible)
    return start, stop


@triton.jit
def tile_scores(q, k, v, qk_scale, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr):
    """Base-2 scores [ROWS, BLOCK_N] of the group's rows against one K tile, and the V tile in the
    dtype `weighted_values` multiplies it in."""
    if USE_DOT:
        if DOT_FP32:                     # fp32 pools, and bf16 in the interpreter (its bf16 math is wrong):
            k = k.to(tl.float32)         # full float32 products ("ieee"), never tf32's 10-bit mantissa
            v = v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale   # [ROWS, BLOCK_N]
        else:                            # fp16/bf16 operands, float32 accumulation, on tensor cores
            scores = tl.dot(q, tl.trans(k)) * qk_scale
    else:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)               # [ROWS, BLOCK_N]
    return scores, v


@triton.jit
def weighted_values(p, v, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr):
    """p @ v of one tile: weights [ROWS, BLOCK_N] times values [BLOCK_N, D_PAD], summed in float32."""
    if USE_DOT:
        if DOT_FP32:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    return pv


@triton.jit
def store_group(out_ptr, m_ptr, l_ptr, acc_ptr, m, l, acc, seq, split, num_splits, group, heads, is_head,
                q_mask, dims, s_ob, s_oh, D_PAD: tl.constexpr, SPLIT: tl.constexpr):
    """Write one group's result: with SPLIT the slice's partials (m in natural units, l, acc) into
    [B, Hq, S] and [B, Hq, S, D_PAD]; else the normalized output rows."""
    if SPLIT:
        row = (seq * tl.num_programs(1) * group + heads) * num_splits + split   # index into [B, Hq, S]
        tl.store(m_ptr + row, m * 0.6931471805599453, mask=is_head)           # base 2 -> natural: * ln 2
        tl.store(l_ptr + row, l, mask=is_head)
        tl.store(acc_ptr + row[:, None] * D_PAD + dims[None, :], acc, mask=is_head[:, None])
    else:
        out = acc / tl.where(l > 0, l, 1.0)[:, None]     # a row that saw no key: 0, not 0/0
        tl.store(out_ptr + seq * s_ob + heads[:, None] * s_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit(do_not_specialize=STEP_VARYING)
def paged_decode_grouped_kernel(q_ptr, k_pool, v_pool, tables_ptr, q_pos_ptr, kv_lens_ptr, out_ptr,
                                m_ptr, l_ptr, acc_ptr, group, qk_scale, num_splits,
                                s_qb, s_qh, s_ob, s_oh, s_tb, s_kn, s_kh, s_ks, s_vn, s_vh, s_vs,
                                HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, ROWS: tl.constexpr,
                                BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, IDS_PER_TILE: tl.constexpr,
                                USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr, SPLIT: tl.constexpr):
    """Grid (B, Hkv, splits): the `group` query heads of one KV head over one slice of one history.

    ROWS >= group query rows (a power of 2; 16 or more for tl.dot), vectors of HEAD_DIM contiguous
    values padded to D_PAD. qk_scale = log2(e) / sqrt(HEAD_DIM). SPLIT: write the slice's partials
    m (natural units), l [B, Hq, S] and acc [B, Hq, S, D_PAD]; else the normalized output.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, ROWS)
    dims = tl.arange(0, D_PAD)
    heads = kv_head * group + rows           # query head h reads KV head h // group
    is_head = rows < group
    dim_ok = dims < HEAD_DIM
    q_mask = is_head[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + seq * s_qb + heads[:, None] * s_qh + dims[None, :], mask=q_mask, other=0.0)
    start, stop = slice_bounds(q_pos_ptr, kv_lens_ptr, seq, split, num_splits, BLOCK_N)
    q = query_operand(q, qk_scale, USE_DOT, DOT_FP32)
    m = tl.full([ROWS], float("-inf"), tl.float32)   # running max (base 2), one per query row
    l = tl.zeros([ROWS], tl.float32)                 # running sum of exp2(score - m)
    acc = tl.zeros([ROWS, D_PAD], tl.float32)        # running sum of exp2(score - m) * value
    table_row = tables_ptr + seq * s_tb
    for tile_start in range(start, stop, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)
        in_range = pos < stop                # past the slice's end: not ours (garbage, or the next slice)
        block = tile_blocks(table_row, tile_start, stop, BLOCK_SIZE, BLOCK_N, IDS_PER_TILE)
        slot = pos % BLOCK_SIZE
        kv_mask = in_range[:, None] & dim_ok[None, :]
        k = tl.load(k_pool + block[:, None] * s_kn + kv_head * s_kh + slot[:, None] * s_ks + dims[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_pool + block[:, None] * s_vn + kv_head * s_vh + slot[:, None] * s_vs + dims[None, :],
                    mask=kv_mask, other=0.0)
        scores, v = tile_scores(q, k, v, qk_scale, USE_DOT, DOT_FP32)
        scores = tl.where(in_range[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))    # finite: every tile has a key in range
        alpha = tl.exp2(m - m_new)                       # rescales what was summed against the old max
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + weighted_values(p, v, USE_DOT, DOT_FP32)
        m = m_new
    store_group(out_ptr, m_ptr, l_ptr, acc_ptr, m, l, acc, seq, split, num_splits, group, heads, is_head,
                q_mask, dims, s_ob, s_oh, D_PAD, SPLIT)


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, num_heads, num_splits, head_dim,
                        s_ob, s_oh, s_od, SPLITS_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """Grid (B, Hq): combine the split partials of one query head into its output by log-sum-exp."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, D_PAD)
    row = (seq * num_heads + head) * num_splits + splits
    is_split = splits < num_splits
    m = tl.load(m_ptr + row, mask=is_split, other=float("-inf"))
    l = tl.load(l_ptr + row, mask=is_split, other=0.0)
    acc = tl.load(acc_ptr + row[:, None] * D_PAD + dims[None, :], mask=is_split[:, None], other=0.0)
    m_all = tl.max(m, axis=0)  # the global max; empty splits hold m = -inf and never win
    # Every split empty (a padding row): subtract 0, so that weights are exp(-inf) = 0, not exp(-inf - -inf) = NaN.
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    # Each split's sums were taken against its own max m_s; exp(m_s - m_all) rescales them to the global max.
    # An empty split (m_s = -inf, l_s = 0) gets weight exp(-inf) = 0: it is skipped.
    weight = tl.exp(m - m_all)
    total = tl.sum(weight * l, axis=0)
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)  # all empty: padding, output 0
    tl.store(out_ptr + seq * s_ob + head * s_oh + dims * s_od, out.to(out_ptr.dtype.element_ty),
             mask=dims < head_dim)




def check_runnable(q: torch.Tensor, block_tables: torch.Tensor, kv_lens: torch.Tensor, block_size: int) -> None:
    """Raise when these kernels cannot run on q's device (compiled kernels need CUDA tensors).

    On the CPU also check that every table is wide enough for its kv_len: the interpreter
    would silently read past it. On a GPU that check would cost a device sync per layer.
    """
    if q.device.type != "cuda":
        if not INTERPRETED:
            raise RuntimeError(
                f"the Triton kernels were compiled for a GPU but the tensors are on {q.device}; move them to CUDA, "
                "or set TRITON_INTERPRET=1 before engine.attention's kernels are imported to run them on the CPU"
            )
        check_table_covers(block_tables, kv_lens, block_size)


def dtype_name(dtype: torch.dtype) -> str:
    """"float16", "bfloat16", "float32": the key `decode_config` tables use."""
    return str(dtype).removeprefix("torch.")


TUNED: dict[tuple, tuple[DecodeConfig, dict]] = {}   # shape key -> (fastest config, ms of each candidate)


def tuned_config(run, dtype: torch.dtype, head_dim: int, block_size: int, group: int, splits: bool):
    """The fastest of `candidates` for this shape, timed once on the caller's data (`run(config)` launches).

    Cached per (dtype, head_dim, block_size, group, split or not): the batch and the context change every
    step and are left out, so a serving run tunes once per shape. Needs CUDA (it times with do_bench).
    """
    key = (dtype_name(dtype), head_dim, block_size, group, splits)
    if key not in TUNED:
        from triton.testing import do_bench
        TUNED[key] = fastest(candidates(dtype_name(dtype), head_dim, group),
                             lambda config: do_bench(lambda: run(config), warmup=5, rep=20))
    return TUNED[key][0]


def paged_decode(q, k_pool, v_pool, block_tables, q_positions, kv_lens, num_splits: int = 1,
                 block_n: int | None = None, config: DecodeConfig | None = None, tune: bool = False) -> torch.Tensor:
    """Decode attention of q [B, Hq, 1, D] over the paged pools; returns [B, Hq, 1, D] in q's dtype.

    num_splits > 1 runs split-K: each history is cut into that many slices, attended in parallel,
    then merged. `config` sets the tiling (default: `decode_config.default_config`; `tune=True` on a
    GPU times the candidates once per shape instead); `block_n` overrides its keys per tile.
    A row that sees no key (position -1, or kv_len 0) comes back as zeros.
    """
    check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    if q.shape[2] != 1:
        raise ValueError(f"decode takes one query per sequence (T=1), got T={q.shape[2]}")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    batch, q_heads, _, head_dim = q.shape
    kv_heads, block_size = k_pool.shape[1], k_pool.shape[2]
    group = q_heads // kv_heads
    check_runnable(q, block_tables, kv_lens, block_size)
    args = _contiguous_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    out = torch.empty_like(args[0])
    if batch == 0:
        return out
    if tune and config is None and q.is_cuda:
        config = tuned_config(lambda c: _launch(*args, out, num_splits, c), q.dtype, head_dim, block_size,
                              group, num_splits > 1)
    config = config or default_config(dtype_name(q.dtype), head_dim, group)
    if block_n:
        config = DecodeConfig(block_n, config.products, config.num_warps, config.num_stages)
    check_config(config, head_dim, group)
    _launch(*args, out, num_splits, config)
    return out


def _contiguous_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens):
    """The kernels index the small tensors as dense rows and every vector's D values as contiguous:
    copy only what is not laid out that way (q, out and the pools may otherwise be any strided views)."""
    q, k_pool, v_pool = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_pool, v_pool))
    return q, k_pool, v_pool, block_tables.contiguous(), q_positions.contiguous(), kv_lens.contiguous()


def _launch(q, k_pool, v_pool, block_tables, q_positions, kv_lens, out, num_splits: int, config: DecodeConfig):
    """One grouped-kernel launch into `out`, plus the merge when num_splits > 1."""
    batch, q_heads, _, head_dim = q.shape
    if num_splits > 1:
        m, l, acc = _grouped(q, k_pool, v_pool, block_tables, q_positions, kv_lens, None, num_splits, config)
        merge_splits_kernel[(batch, q_heads)](
            m, l, acc, out, q_heads, num_splits, head_dim, out.stride(0), out.stride(1), out.stride(3),
            SPLITS_PAD=triton.next_power_of_2(num_splits), D_PAD=acc.shape[-1])
    else:
        _grouped(q, k_pool, v_pool, block_tables, q_positions, kv_lens, out, 1, config)


def _grouped(q, k_pool, v_pool, block_tables, q_positions, kv_lens, out, num_splits: int, config: DecodeConfig):
    """Launch `paged_decode_grouped_kernel`: into `out` (normalized), or, with out=None, into new partials
    m, l [B, Hq, S] and acc [B, Hq, S, D_PAD] (float32), which it returns."""
    batch, q_heads, _, head_dim = q.shape
    kv_heads, block_size = k_pool.shape[1], k_pool.shape[2]
    group = q_heads // kv_heads
    d_pad = max(16, triton.next_power_of_2(head_dim))
    if out is None:
        m = torch.empty(batch, q_heads, num_splits, device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        acc = torch.empty(batch, q_heads, num_splits, d_pad, device=q.device, dtype=torch.float32)
        target = m                                   # out_ptr is unused when SPLIT
    else:
        m = l = acc = target = out                   # the partial pointers are unused without SPLIT
    use_dot = config.products == "dot"
    paged_decode_grouped_kernel[(batch, kv_heads, num_splits)](
        q, k_pool, v_pool, block_tables, q_positions, kv_lens, target, m, l, acc,
        group, LOG2E / math.sqrt(head_dim), num_splits,
        q.stride(0), q.stride(1), target.stride(0), target.stride(1), block_tables.stride(0),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), v_pool.stride(0), v_pool.stride(1),
        v_pool.stride(2),
        HEAD_DIM=head_dim, D_PAD=d_pad, ROWS=config.group_rows(group), BLOCK_SIZE=block_size,
        BLOCK_N=config.block_n, IDS_PER_TILE=ids_per_tile(config.block_n, block_size), USE_DOT=use_dot,
        DOT_FP32=use_dot and (q.dtype == torch.float32 or (INTERPRETED and q.dtype == torch.bfloat16)),
        SPLIT=out is None, num_warps=config.num_warps, num_stages=config.num_stages)
    return m, l, acc


def split_partials(q, k_pool, v_pool, block_tables, q_positions, kv_lens, num_splits: int,
                   block_n: int | None = None, config: DecodeConfig | None = None):
    """Split-K's first half: each of `num_splits` slices of every history, attended on its own.

    Returns float32 partials m, l [B, Hq, S] (each slice's max score and sum of exp(score - m))
    and acc [B, Hq, S, D_PAD] (sum of exp(score - m) * value, unnormalized); a slice past a short
    sequence's end is empty: m = -inf, l = 0, acc = 0. `merge_partials` (or the merge kernel)
    combines them into the attention output.
    """
    check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    head_dim, group = q.shape[-1], q.shape[1] // k_pool.shape[1]
    check_runnable(q, block_tables, kv_lens, k_pool.shape[2])
    config = config or default_config(dtype_name(q.dtype), head_dim, group)
    if block_n:
        config = DecodeConfig(block_n, config.products, config.num_warps, config.num_stages)
    check_config(config, head_dim, group)
    args = _contiguous_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    return _grouped(*args, None, num_splits, config)


def merge_partials(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Split-K's merge in torch (the merge kernel's spec): S partial softmaxes -> one.

    m, l [..., S] and acc [..., S, D] as `split_partials` returns them; returns [..., D]
    (float32). Slice s summed exponentials against its own max m_s; against the global
    max M they weigh exp(m_s - M). An empty slice (m_s = -inf, l_s = 0) weighs 0, and a
    row whose slices are all empty comes back as zeros, never NaN.
    """
    top = m.amax(dim=-1, keepdim=True)
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)  # all empty
    weight = torch.exp(m - top)                                          # [..., S]
    total = (weight * l).sum(dim=-1, keepdim=True)
    merged = (weight[..., None] * acc).sum(dim=-2)
    return merged / torch.where(total > 0, total, torch.ones_like(total))


def paged_decode_per_head(q, k_pool, v_pool, block_tables, q_positions, kv_lens, kernel=None,
                          block_n: int | None = None) -> torch.Tensor:
    """Decode attention of q [B, Hq, 1, D] through `paged_decode_head_kernel`; returns [B, Hq, 1, D].

    `kernel` is a Triton kernel with that kernel's signature, or a plain function to compile with
    triton.jit (the chapter passes the learner's `paged_decode_head_program`).
    Each row sees its keys 0..min(position, kv_len - 1); a padding row (position -1) sees key 0,
    as in the torch reference. D must be a power of 2; block_n (keys per tile, default 64) too.
    """
    check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    if q.shape[2] != 1:
        raise ValueError(f"decode takes one query per sequence (T=1), got T={q.shape[2]}")
    batch, q_heads, _, head_dim = q.shape
    block_n = block_n or 64
    for name, size in (("head_dim", head_dim), ("block_n", block_n)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"the per-head kernel needs {name} to be a power of 2, got {size}")
    check_runnable(q, block_tables, kv_lens, k_pool.shape[2])
    # The kernel takes each row's number of visible keys, and vectors whose head_dim values are contiguous.
    lengths = torch.minimum(q_positions[:, 0] + 1, kv_lens).clamp(min=1).contiguous()
    q, k_pool, v_pool = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_pool, v_pool))
    block_tables = block_tables.contiguous()
    out = torch.empty(batch, q_heads, 1, head_dim, device=q.device, dtype=q.dtype)
    if batch == 0:
        return out
    as_kernel(kernel or paged_decode_head_kernel)[(batch, q_heads)](
        q, k_pool, v_pool, block_tables, lengths, out, q_heads // k_pool.shape[1], 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_pool.stride(0), k_pool.stride(1), k_pool.stride(2), v_pool.stride(0), v_pool.stride(1),
        v_pool.stride(2), HEAD_DIM=head_dim, BLOCK_SIZE=k_pool.shape[2], BLOCK_N=block_n)
    return out
