"""The engine's fast attention on any device: PyTorch's fused scaled_dot_product_attention.

Same contract as `reference.attention` (key j holds position j; a query at position p reads keys
j <= p with j < kv_len; padding queries read key 0), computed without the reference's explicit
`repeat_interleave`, `masked_fill` and `softmax` (the reference stays the ground truth the tests
compare against). A mask is built only where one is needed: a single sequence whose new tokens end its
history needs none (decode) or the causal flag (a whole prompt).

Every layer of a forward reads with the same positions, lengths and block tables, so what to read and
which mask to apply (a `ReadPlan`) is worked out by the first layer and reused by the others.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import torch
from torch.nn.functional import scaled_dot_product_attention

from engine.attention.reference import visibility_mask
from engine.blocks import ceil_div


class ReadPlan(NamedTuple):
    """How every row of one forward reads its history: the first `length` keys, masked or not."""

    length: int                   # keys read per row (the longest kv_len)
    mask: torch.Tensor | None     # [B, 1, T, length] float, 0 or -inf (see additive), or None when no key is hidden
    causal: bool                  # a whole prompt in order: the fused causal flag replaces the mask
    blocks: torch.Tensor | None   # paged only: the pool slabs to gather (see _rows_of_blocks), flattened
    rows: torch.Tensor | None = None  # paged decode groups only: which rows of the batch these are


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              q_positions: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention of q [B,Hq,T,D] over histories [B,Hkv,L,D]; result in q's dtype."""
    plan = read_plan(q_positions, kv_lens, keys.shape[2])
    return _sdpa(q, keys[:, :, :plan.length], values[:, :, :plan.length], plan)


def read_plan(q_positions: torch.Tensor, kv_lens: torch.Tensor, num_keys: int,
              blocks: torch.Tensor | None = None) -> ReadPlan:
    """The mask (or none) that gives `reference.attention`'s visibility for these rows."""
    batch, tokens = q_positions.shape
    if batch == 1:                # one row reads only its own kv_len keys
        kv_len = int(kv_lens[0])
        if ends_history(q_positions[0], kv_len):          # its new tokens end its history, in order
            if tokens == 1:
                return ReadPlan(kv_len, None, False, blocks)
            if tokens == kv_len:
                return ReadPlan(kv_len, None, True, blocks)
        return ReadPlan(kv_len, additive(visibility_mask(q_positions, kv_lens, kv_len)[:, None]), False, blocks)
    if tokens == 1 and bool((q_positions[:, 0] == kv_lens - 1).all()):
        # a decode batch: each row reads its whole history, so the mask is just "j < kv_len"
        stored = torch.arange(num_keys, device=q_positions.device)[None, :] < kv_lens[:, None]
        return ReadPlan(num_keys, additive(stored[:, None, None, :]), False, blocks)
    return ReadPlan(num_keys, additive(visibility_mask(q_positions, kv_lens, num_keys)[:, None]), False, blocks)


def ends_history(positions: torch.Tensor, kv_len: int) -> bool:
    """Whether one row's positions [T] are kv_len - T, ..., kv_len - 1: its new tokens, in order, are the last
    of its history. One token (a decode step) is one number to read, not a comparison with a range."""
    if positions.shape[0] == 1:
        return int(positions[0]) == kv_len - 1
    expected = torch.arange(kv_len - positions.shape[0], kv_len, device=positions.device)
    return bool((positions == expected).all())


def additive(visible: torch.Tensor) -> torch.Tensor:
    """A boolean mask as the fused kernel applies it, added to the scores: 0 where a key is visible, -inf
    where not (float32, the kernel's dtype here). Made once per forward; a boolean mask would be converted
    by every layer's call."""
    return torch.zeros(visible.shape, dtype=torch.float32, device=visible.device).masked_fill_(~visible, float("-inf"))


def _sdpa(q, keys, values, plan: ReadPlan) -> torch.Tensor:
    """Fused attention in float32 with grouped-query heads (query head h reads KV head h // group)."""
    batch, heads, tokens, dim = q.shape
    kv_heads = keys.shape[1]
    if tokens == 1 and heads != kv_heads:
        return _sdpa_decode_groups(q, keys, values, plan.mask)
    out = scaled_dot_product_attention(as_float(q), as_float(keys), as_float(values), attn_mask=plan.mask,
                                       is_causal=plan.causal, enable_gqa=heads != kv_heads)
    return as_dtype(out, q.dtype)


def _sdpa_decode_groups(q, keys, values, mask) -> torch.Tensor:
    """One new token per row: a KV head's `group` query heads attend as `group` query rows of that head.

    They share the token's position, so the same mask [B, 1, 1, L] fits each of them; the fused kernel
    then reads each KV head once instead of once per query head (`enable_gqa`), half the time on a CPU.
    """
    batch, heads, _, dim = q.shape
    kv_heads = keys.shape[1]
    rows = as_float(q).reshape(batch, kv_heads, heads // kv_heads, dim)   # head h = kv head h // group, row h % group
    out = scaled_dot_product_attention(rows, as_float(keys), as_float(values), attn_mask=mask)
    return as_dtype(out.reshape(batch, heads, 1, dim), q.dtype)


def as_float(x: torch.Tensor) -> torch.Tensor:
    """x in float32, itself when it already is (a cast that copies nothing still costs a dispatch)."""
    return x if x.dtype == torch.float32 else x.float()


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in `dtype`, itself when it already is."""
    return x if x.dtype == dtype else x.to(dtype)


def paged_sdpa(q, k_pool, v_pool, block_tables, q_positions, kv_lens) -> torch.Tensor:
    """`paged_attention` on the CPU: read each row's history through its block table, then fused attention.

    Whole blocks are gathered with one `index_select` (not one copy per slot). A lone row (a prompt
    chunk) reads exactly its own blocks. A decode batch is split into groups of similar history
    length (`length_groups`); each group reads as many blocks as its longest row and masks the rest
    by length, in one fused call, so no row pays for a much longer one.
    """
    plans = _paged_plans(block_tables, q_positions, kv_lens, k_pool.shape[2], k_pool.shape[1])
    if plans[0].rows is None:
        return _paged_group(q, k_pool, v_pool, plans[0])
    out = torch.empty_like(q)
    for plan in plans:
        out[plan.rows] = _paged_group(q[plan.rows], k_pool, v_pool, plan)
    return out


def _paged_group(q, k_pool, v_pool, plan: ReadPlan) -> torch.Tensor:
    """Gather one group's histories into scratch memory, then attend."""
    key_rows, value_rows = _scratch(2, (plan.blocks.numel(), *k_pool.shape[2:]), k_pool)
    keys = _rows_of_blocks(k_pool, plan, q.shape[0], key_rows)
    values = _rows_of_blocks(v_pool, plan, q.shape[0], value_rows)
    return _sdpa(q, keys, values, plan)


# What one more group of a decode batch costs (a gather, a fused call, a scatter of its rows), in padded
# key positions. With the gathers in scratch memory, padding is cheap on a CPU (the bench workloads run
# as fast with one group as with several), so a batch splits only where rows differ by about a
# thousand keys or more: there one group would gather (and hold) every short row at the longest length.
GROUP_COST_KEYS = 1024


def length_groups(lengths: list[int], group_cost: int = GROUP_COST_KEYS, most: int = 8) -> list[list[int]]:
    """Row indices in groups of similar length: sorted by length, cut into 1..`most` equal parts,
    whichever count costs least (padded keys + `group_cost` per group)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    best: tuple[int, list[list[int]]] | None = None
    for count in range(1, min(most, len(order)) + 1):
        size = ceil_div(len(order), count)
        groups = [order[start:start + size] for start in range(0, len(order), size)]
        padding = sum(len(group) * lengths[group[-1]] - sum(lengths[i] for i in group) for group in groups)
        cost = padding + group_cost * len(groups)
        if best is None or cost < best[0]:
            best = (cost, groups)
    return best[1]


# Per thread: the last read plans with the tensors they were made from, and the gathers' scratch memory.
_per_thread = threading.local()


def _paged_plans(block_tables, q_positions, kv_lens, block_size: int, kv_heads: int) -> list[ReadPlan]:
    """The read plans of a paged forward, made once: later layers pass equal tables, positions and lengths
    (each layer's write returns a kv_lens tensor of its own, with the same values)."""
    key, plans = getattr(_per_thread, "plans", (None, None))
    if key is not None and key[3] == (block_size, kv_heads) and all(
            old is new or torch.equal(old, new) for old, new in zip(key[:3], (block_tables, q_positions, kv_lens))):
        return plans
    decoding = q_positions.shape[0] > 1 and q_positions.shape[1] == 1 \
        and bool((q_positions[:, 0] == kv_lens - 1).all())
    groups = length_groups(kv_lens.tolist()) if decoding else [None]
    if len(groups) == 1:
        groups = [None]
    plans = [_group_plan(block_tables, q_positions, kv_lens, block_size, kv_heads, rows) for rows in groups]
    _per_thread.plans = ((block_tables, q_positions, kv_lens, (block_size, kv_heads)), plans)
    return plans


def _group_plan(block_tables, q_positions, kv_lens, block_size: int, kv_heads: int,
                rows: list[int] | None) -> ReadPlan:
    """The read plan of some rows (None: all of them): their blocks' slabs, KV head by KV head, and their mask."""
    index = None
    if rows is not None:
        index = torch.tensor(rows, device=q_positions.device)
        block_tables, q_positions, kv_lens = block_tables[index], q_positions[index], kv_lens[index]
    stored = int(kv_lens.max())
    longest = max(stored, 1)
    count = ceil_div(longest, block_size)
    blocks = block_tables[:, :count].long()
    # A lone row holding keys reads each of its first `count` blocks; in a batch, shorter rows end sooner.
    if not (stored > 0 and blocks.shape == (1, count)):
        # Table entries past a row's blocks are padding: read block 0 there, masked by kv_lens anyway.
        used = torch.arange(count, device=q_positions.device)[None, :] * block_size < kv_lens[:, None]
        blocks = torch.where(used, blocks, 0)
    slabs = (blocks * kv_heads + head_offsets(kv_heads, blocks.device)).flatten()   # [Hkv, B, count]: _rows_of_blocks
    return read_plan(q_positions, kv_lens, longest, slabs)._replace(rows=index)


@functools.lru_cache(maxsize=16)
def head_offsets(kv_heads: int, device: torch.device) -> torch.Tensor:
    """0, 1, ..., kv_heads - 1 as [Hkv, 1, 1]: the slab of a block's KV head h is block * Hkv + h. The same
    every plan, so made once."""
    with torch.inference_mode(False):       # a normal tensor, usable in and out of inference mode
        return torch.arange(kv_heads, device=device)[:, None, None]


def _rows_of_blocks(pool: torch.Tensor, plan: ReadPlan, batch: int, rows: torch.Tensor) -> torch.Tensor:
    """Each row's history [B, Hkv, length, D] (key j = position j) from a pool [N, Hkv, bs, D].

    The pool is read as slabs [bs, D] (block n's KV head h is slab n * Hkv + h), gathered KV head by KV
    head into the scratch `rows` [slabs, bs, D] in one copy: [Hkv, B, blocks * bs, D] there is the
    history, read as one strided view.
    """
    _, heads, block_size, dim = pool.shape
    keys = rows.shape[0] // (heads * batch) * block_size      # each row's blocks, in key positions
    torch.index_select(pool.reshape(-1, block_size, dim), 0, plan.blocks, out=rows)
    return rows.as_strided((batch, heads, plan.length, dim), (keys * dim, batch * keys * dim, dim, 1))


def _scratch(parts: int, shape: tuple[int, ...], like: torch.Tensor) -> list[torch.Tensor]:
    """`parts` buffers of `shape`, reused from call to call (grown when too small).

    A decode step gathers megabytes per layer; fresh tensors that size are fresh pages from the
    operating system each time, and those page faults cost as much as the copy itself. The memory
    is kept (the largest step's gathers) until a call needs another dtype or device.
    """
    numel = math.prod(shape)
    buffer, key, views = getattr(_per_thread, "scratch", (None, None, None))
    if buffer is None or buffer.numel() < parts * numel or buffer.dtype != like.dtype \
            or buffer.device != like.device:
        with torch.inference_mode(False):    # a normal tensor: writable inside inference mode and out of it
            buffer = torch.empty(parts * numel, dtype=like.dtype, device=like.device)
        key = None
    # Every layer of a forward asks for the same parts: its views are kept (a view made in inference
    # mode must not be written outside it, so the mode is part of the key).
    if key != (parts, shape, torch.is_inference_mode_enabled()):
        key = (parts, shape, torch.is_inference_mode_enabled())
        views = list(buffer[:parts * numel].view(parts, *shape))
    _per_thread.scratch = (buffer, key, views)
    return views
