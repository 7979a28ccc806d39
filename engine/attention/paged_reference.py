"""Attention over a paged KV pool, in plain torch: the spec the Triton kernels are checked against.

A paged cache keeps every sequence's keys and values in one pool of fixed-size blocks,
`k_pool[N, Hkv, bs, D]`, and a block table per sequence: logical position `p` lives in physical
block `block_tables[b, p // bs]` at slot `p % bs`. This module gathers each sequence's history
back into a contiguous `[B, Hkv, L, D]` tensor through that table, then runs the ordinary
reference attention on it. The kernels compute the same thing without the gather.
"""

from __future__ import annotations

import torch

from engine.attention.reference import attention
from engine.blocks import ceil_div


def check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens) -> None:
    """Raise a ValueError naming the numbers when the inputs of paged attention disagree.

    Shared by the torch path and the Triton launchers, so every backend rejects the same inputs.
    """
    if q.ndim != 4:
        raise ValueError(f"q must be [B, Hq, T, D], got {tuple(q.shape)}")
    if k_pool.ndim != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(
            f"k_pool and v_pool must both be [N, Hkv, block_size, D], got "
            f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        )
    batch, q_heads, steps, head_dim = q.shape
    _, kv_heads, _, pool_dim = k_pool.shape
    if pool_dim != head_dim:
        raise ValueError(f"head_dim differs: q has {head_dim}, the pool has {pool_dim}")
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads cannot be grouped over {kv_heads} KV heads")
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [B={batch}, max_blocks], got {tuple(block_tables.shape)}")
    if block_tables.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_tables must be int32 or int64, got {block_tables.dtype}")
    if tuple(q_positions.shape) != (batch, steps) or q_positions.dtype != torch.long:
        raise ValueError(
            f"q_positions must be long [B={batch}, T={steps}], got {q_positions.dtype} {tuple(q_positions.shape)}"
        )
    if tuple(kv_lens.shape) != (batch,) or kv_lens.dtype != torch.long:
        raise ValueError(f"kv_lens must be long [B={batch}], got {kv_lens.dtype} {tuple(kv_lens.shape)}")
    if q.dtype != k_pool.dtype or k_pool.dtype != v_pool.dtype:
        raise ValueError(f"dtypes differ: q {q.dtype}, k_pool {k_pool.dtype}, v_pool {v_pool.dtype}")
    devices = {t.device for t in (q, k_pool, v_pool, block_tables, q_positions, kv_lens)}
    if len(devices) != 1:
        raise ValueError(
            "all inputs must be on one device, got "
            + ", ".join(f"{name} on {t.device}" for name, t in
                        zip(("q", "k_pool", "v_pool", "block_tables", "q_positions", "kv_lens"),
                            (q, k_pool, v_pool, block_tables, q_positions, kv_lens)))
        )


def check_table_covers(block_tables: torch.Tensor, kv_lens: torch.Tensor, block_size: int) -> None:
    """Raise when some row's kv_len needs more blocks than its table has columns (reads a GPU value)."""
    longest = int(kv_lens.max()) if kv_lens.numel() else 0
    capacity = block_tables.shape[1] * block_size
    if longest > capacity:
        raise ValueError(
            f"a kv_len of {longest} needs {ceil_div(longest, block_size)} blocks of {block_size}, "
            f"but block_tables has only {block_tables.shape[1]} columns"
        )


def gather_history(pool: torch.Tensor, block_tables: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """Copy every row's positions 0..max(kv_lens)-1 out of the pool: [N, Hkv, bs, D] -> [B, Hkv, L, D].

    Positions at or past a row's kv_len read block 0 instead of the table, so whatever the
    cache pads its tables with (0, -1, stale ids) is never used as an index.
    """
    block_size = pool.shape[2]
    length = max(int(kv_lens.max()) if kv_lens.numel() else 0, 1)
    positions = torch.arange(length, device=pool.device)
    # The indirection: logical position p is in physical block table[p // bs], at slot p % bs.
    blocks = block_tables[:, positions // block_size].long()        # [B, L]
    blocks = torch.where(positions < kv_lens[:, None], blocks, 0)  # never index with padding
    slots = (positions % block_size).expand_as(blocks)              # [B, L]
    history = pool[blocks, :, slots]                                # advanced indexing -> [B, L, Hkv, D]
    return history.transpose(1, 2)


def paged_attention_reference(q, k_pool, v_pool, block_tables, q_positions, kv_lens) -> torch.Tensor:
    """Attention of q [B, Hq, T, D] over each row's paged history; returns [B, Hq, T, D] in q's dtype.

    Key j is visible to a query at position p iff j <= p and j < kv_len; rows of padding
    (position -1) produce meaningless output, as everywhere in the engine.
    """
    check_paged_inputs(q, k_pool, v_pool, block_tables, q_positions, kv_lens)
    check_table_covers(block_tables, kv_lens, k_pool.shape[2])
    keys = gather_history(k_pool, block_tables, kv_lens)
    values = gather_history(v_pool, block_tables, kv_lens)
    return attention(q, keys, values, q_positions, kv_lens)
