"""Paged decode attention in Triton: each sequence's one new query reads its history through the block table.

One program per (sequence, KV head) handles every query head of that KV group at once, so each
key and value tile is loaded from memory once and used by the whole group (grouped-query
attention makes decode memory-bound; loading K/V once per group is the whole game).

Split-K (flash-decoding): when there are too few (sequence, KV head) programs to fill the GPU,
each program takes one slice of the history and writes a partial result (m, l, acc); a second
kernel merges the slices by log-sum-exp.

`attend_pages` is the inner loop shared with the prefill kernel (triton_prefill.py).

`paged_decode_head_kernel` is the simplest correct paged decode kernel: one program per
(sequence, query head), no tl.dot. Chapter 6 has the learner write its function,
`paged_decode_head_program`, and `paged_decode_per_head` launches it (or a learner's function or
kernel with the same signature). The
grouped kernel above is what `engine.attention.paged_attention` runs: it reads each K/V tile
once per KV group instead of once per query head.
"""

from __future__ import annotations

import math

import torch

from engine.attention import prepare_triton

INTERPRETED = prepare_triton()  # before `import triton`: kernels are interpreted or compiled when defined

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.attention.paged_reference import check_paged_inputs, check_table_covers  # noqa: E402

MIN_DOT = 16  # tl.dot needs every tile side >= 16 to compile on a GPU (the interpreter accepts less)


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
    """A launchable Triton kernel: `fn` itself if it is one (anything indexed by a grid), else
    triton.jit(fn), made once per function."""
    if hasattr(fn, "__getitem__"):
        return fn
    if fn not in _KERNELS:
        _KERNELS[fn] = triton.jit(fn)
    return _KERNELS[fn]


@triton.jit
def attend_pages(q, row_last, k_pool, v_pool, table_row, kv_head, start, stop, head_dim,
                 s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                 ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 D_PAD: tl.constexpr, PRECISION: tl.constexpr):
    """Online softmax of q's rows over key positions [start, stop), read through one block table.

    q [ROWS, D_PAD] is float32 and already scaled; row r may see positions <= row_last[r]
    (-1: nothing). Returns the running max m, the sum of exponentials l and the unnormalized
    output acc = sum_j exp(s_j - m) v_j, all float32, so a caller can normalize or merge them.
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
        # Cast right after the load: all arithmetic below is float32 (the interpreter mangles bf16 math).
        k = tl.load(k_addr, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_N, D_PAD]
        v = tl.load(v_addr, mask=kv_mask, other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [ROWS, BLOCK_N]
        visible = in_range[None, :] & (pos[None, :] <= row_last[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        # A row that has seen nothing yet keeps m = -inf; subtract 0 instead so exp gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        # Online softmax: scores so far were exponentiated against the old max; rescale them to the new one.
        alpha = tl.exp(m - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new
    return m, l, acc


@triton.jit
def load_query_group(q_ptr, seq, kv_head, group, head_dim, scale, s_qb, s_qh, s_qd,
                     GROUP_PAD: tl.constexpr, D_PAD: tl.constexpr):
    """The decode query of every head in one KV group as a scaled float32 [GROUP_PAD, D_PAD] tile (pad rows 0)."""
    member = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, D_PAD)
    heads = kv_head * group + member  # query head h reads KV head h // group
    mask = (member[:, None] < group) & (dims[None, :] < head_dim)
    q = tl.load(q_ptr + seq * s_qb + heads[:, None] * s_qh + dims[None, :] * s_qd, mask=mask, other=0.0)
    return q.to(tl.float32) * scale


@triton.jit
def paged_decode_kernel(q_ptr, k_pool, v_pool, tables_ptr, q_pos_ptr, kv_lens_ptr, out_ptr,
                        group, head_dim, scale,
                        s_qb, s_qh, s_qd, s_ob, s_oh, s_od, s_tb,
                        s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                        GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                        D_PAD: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (B, Hkv): one program attends every query head of one KV group over one whole sequence."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q = load_query_group(q_ptr, seq, kv_head, group, head_dim, scale, s_qb, s_qh, s_qd, GROUP_PAD, D_PAD)
    # The query at position p sees keys j <= p that are stored (j < kv_len); padding (p = -1) sees none.
    last = tl.minimum(tl.load(q_pos_ptr + seq), tl.load(kv_lens_ptr + seq) - 1)
    stop = tl.maximum(last + 1, 0)
    row_last = tl.zeros([GROUP_PAD], tl.int64) + last
    m, l, acc = attend_pages(q, row_last, k_pool, v_pool, tables_ptr + seq * s_tb, kv_head, 0, stop, head_dim,
                             s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                             GROUP_PAD, BLOCK_SIZE, BLOCK_N, D_PAD, PRECISION)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # a padding row saw nothing: write 0, not 0/0
    member = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, D_PAD)
    heads = kv_head * group + member
    mask = (member[:, None] < group) & (dims[None, :] < head_dim)
    tl.store(out_ptr + seq * s_ob + heads[:, None] * s_oh + dims[None, :] * s_od,
             out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def paged_decode_split_kernel(q_ptr, k_pool, v_pool, tables_ptr, q_pos_ptr, kv_lens_ptr,
                              m_ptr, l_ptr, acc_ptr,
                              group, head_dim, scale, num_splits,
                              s_qb, s_qh, s_qd, s_tb,
                              s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                              GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                              D_PAD: tl.constexpr, PRECISION: tl.constexpr):
    """Grid (B, Hkv, splits): one program attends one KV group over one slice of the history.

    Writes the slice's unnormalized partials m, l [B, Hq, S] and acc [B, Hq, S, D]; a slice
    past the end of a short sequence writes m = -inf, l = 0, acc = 0 (an empty split).
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q = load_query_group(q_ptr, seq, kv_head, group, head_dim, scale, s_qb, s_qh, s_qd, GROUP_PAD, D_PAD)
    last = tl.minimum(tl.load(q_pos_ptr + seq), tl.load(kv_lens_ptr + seq) - 1)
    visible = tl.maximum(last + 1, 0)
    # Slices are whole tiles long, so every tile a program loads starts on a tile boundary.
    per_split = tl.cdiv(tl.cdiv(visible, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    stop = tl.minimum(start + per_split, visible)
    row_last = tl.zeros([GROUP_PAD], tl.int64) + last
    m, l, acc = attend_pages(q, row_last, k_pool, v_pool, tables_ptr + seq * s_tb, kv_head, start, stop, head_dim,
                             s_kn, s_kh, s_ks, s_kd, s_vn, s_vh, s_vs, s_vd,
                             GROUP_PAD, BLOCK_SIZE, BLOCK_N, D_PAD, PRECISION)
    member = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, D_PAD)
    heads = kv_head * group + member
    row = (seq * tl.num_programs(1) * group + heads) * num_splits + split  # index into [B, Hq, S]
    is_head = member < group
    tl.store(m_ptr + row, m, mask=is_head)
    tl.store(l_ptr + row, l, mask=is_head)
    tl.store(acc_ptr + row[:, None] * D_PAD + dims[None, :], acc, mask=is_head[:, None])


@triton.jit
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


def tile_sizes(block_size: int, head_dim: int, group: int) -> tuple[int, int, int]:
    """(BLOCK_N, D_PAD, GROUP_PAD): key tile, padded head dim and padded group, all powers of 2 and >= 16."""
    d_pad = max(MIN_DOT, triton.next_power_of_2(head_dim))
    group_pad = max(MIN_DOT, triton.next_power_of_2(group))
    # About 4K elements per K tile: 32 keys at head_dim 128, 64 at 64; at least one whole block.
    block_n = max(MIN_DOT, triton.next_power_of_2(block_size), min(64, 4096 // d_pad))
    return block_n, d_pad, group_pad


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot precision: full fp32 ("ieee") for every input dtype.

    Loads are cast to fp32, and both dots also take fp32 values the kernel computed (q * scale, the
    softmax weights p), which tf32 would round to 10 mantissa bits. Decode is bound by memory, not math.
    """
    return "ieee"


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


def paged_decode(q, k_pool, v_pool, block_tables, q_positions, kv_lens, num_splits: int = 1,
                 block_n: int | None = None) -> torch.Tensor:
    """Decode attention of q [B, Hq, 1, D] over the paged pools; returns [B, Hq, 1, D] in q's dtype.

    num_splits > 1 runs the split-K variant: each sequence's history is cut into that many
    slices, attended in parallel, then merged.
    """
    check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    if q.shape[2] != 1:
        raise ValueError(f"decode takes one query per sequence (T=1), got T={q.shape[2]}")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    batch, q_heads, _, head_dim = q.shape
    kv_heads, block_size = k_pool.shape[1], k_pool.shape[2]
    check_runnable(q, block_tables, kv_lens, block_size)
    # The kernels index these small tensors as dense rows; q, out and the pools may be any strided views.
    block_tables, q_positions, kv_lens = block_tables.contiguous(), q_positions.contiguous(), kv_lens.contiguous()
    group = q_heads // kv_heads
    tile_n, d_pad, group_pad = tile_sizes(block_size, head_dim, group)
    block_n = block_n or tile_n
    if block_n < MIN_DOT or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of 2 >= {MIN_DOT}, got {block_n}")
    out = torch.empty_like(q)
    if batch == 0:
        return out
    scale = 1.0 / math.sqrt(head_dim)
    shared = dict(GROUP_PAD=group_pad, BLOCK_SIZE=block_size, BLOCK_N=block_n, D_PAD=d_pad,
                  PRECISION=dot_precision(q.dtype))
    pool_strides = (*k_pool.stride(), *v_pool.stride())
    q_strides = (q.stride(0), q.stride(1), q.stride(3))
    if num_splits == 1:
        paged_decode_kernel[(batch, kv_heads)](
            q, k_pool, v_pool, block_tables, q_positions, kv_lens, out,
            group, head_dim, scale, *q_strides, out.stride(0), out.stride(1), out.stride(3),
            block_tables.stride(0), *pool_strides, **shared)
        return out
    m, l, acc = split_partials(q, k_pool, v_pool, block_tables, q_positions, kv_lens, num_splits, block_n,
                               checked=True)
    merge_splits_kernel[(batch, q_heads)](
        m, l, acc, out, q_heads, num_splits, head_dim, out.stride(0), out.stride(1), out.stride(3),
        SPLITS_PAD=triton.next_power_of_2(num_splits), D_PAD=d_pad)
    return out


def split_partials(q, k_pool, v_pool, block_tables, q_positions, kv_lens, num_splits: int,
                   block_n: int | None = None, checked: bool = False):
    """Split-K's first half: each of `num_splits` slices of every history, attended on its own.

    Returns float32 partials m, l [B, Hq, S] (each slice's max score and sum of exp(score - m))
    and acc [B, Hq, S, D_PAD] (sum of exp(score - m) * value, unnormalized); a slice past a short
    sequence's end is empty: m = -inf, l = 0, acc = 0. `merge_partials` (or the merge kernel)
    combines them into the attention output.
    """
    if not checked:
        check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
        check_runnable(q, block_tables, kv_lens, k_pool.shape[2])
        block_tables, q_positions, kv_lens = (block_tables.contiguous(), q_positions.contiguous(),
                                              kv_lens.contiguous())
    batch, q_heads, _, head_dim = q.shape
    kv_heads, block_size = k_pool.shape[1], k_pool.shape[2]
    tile_n, d_pad, group_pad = tile_sizes(block_size, head_dim, q_heads // kv_heads)
    m = torch.empty(batch, q_heads, num_splits, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(batch, q_heads, num_splits, d_pad, device=q.device, dtype=torch.float32)
    paged_decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_pool, v_pool, block_tables, q_positions, kv_lens, m, l, acc,
        q_heads // kv_heads, head_dim, 1.0 / math.sqrt(head_dim), num_splits,
        q.stride(0), q.stride(1), q.stride(3), block_tables.stride(0), *k_pool.stride(), *v_pool.stride(),
        GROUP_PAD=group_pad, BLOCK_SIZE=block_size, BLOCK_N=block_n or tile_n, D_PAD=d_pad,
        PRECISION=dot_precision(q.dtype))
    return m, l, acc


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
