"""The engine's fast attention on any device: PyTorch's fused scaled_dot_product_attention.

Same contract as `reference.attention` (key j holds position j; a query at position p reads keys
j <= p with j < kv_len; padding queries read key 0), computed without the reference's explicit
`repeat_interleave`, `masked_fill` and `softmax` (the reference stays the ground truth the tests
compare against). A mask is built only where one is needed: a single sequence whose new tokens end its
history needs none (decode) or the causal flag (a whole prompt).
"""
from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from engine.attention.reference import visibility_mask


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              q_positions: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention of q [B,Hq,T,D] over histories [B,Hkv,L,D]; result in q's dtype."""
    batch, _, tokens, _ = q.shape
    if batch == 1:
        return _one_sequence(q, keys, values, q_positions[0], int(kv_lens[0]))
    if tokens == 1 and bool((q_positions[:, 0] == kv_lens - 1).all()):
        # a decode batch: each row reads its whole history, so the mask is just "j < kv_len"
        stored = torch.arange(keys.shape[2], device=q.device)[None, :] < kv_lens[:, None]
        return _sdpa(q, keys, values, stored[:, None, None, :])
    return _sdpa(q, keys, values, visibility_mask(q_positions, kv_lens, keys.shape[2])[:, None])


def _one_sequence(q, keys, values, positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """One row: read only its own kv_len keys; no mask when its new tokens end the history in order."""
    tokens = q.shape[2]
    keys, values = keys[:, :, :kv_len], values[:, :, :kv_len]
    in_order = bool((positions == torch.arange(kv_len - tokens, kv_len, device=q.device)).all())
    if in_order and tokens == 1:
        return _sdpa(q, keys, values, None)
    if in_order and tokens == kv_len:
        return _sdpa(q, keys, values, None, causal=True)
    mask = visibility_mask(positions[None], torch.tensor([kv_len], device=q.device), kv_len)
    return _sdpa(q, keys, values, mask[:, None])


def _sdpa(q, keys, values, mask, causal: bool = False) -> torch.Tensor:
    """Fused attention in float32 with grouped-query heads (query head h reads KV head h // group)."""
    out = scaled_dot_product_attention(q.float(), keys.float(), values.float(), attn_mask=mask,
                                       is_causal=causal, enable_gqa=q.shape[1] != keys.shape[1])
    return out.to(q.dtype)


def paged_sdpa(q, k_pool, v_pool, block_tables, q_positions, kv_lens) -> torch.Tensor:
    """`paged_attention` on the CPU: read each row's history through its block table, then fused attention.

    Whole blocks are gathered (one contiguous copy per block, not one per slot). A lone row (a
    prompt chunk) reads exactly its own blocks; a decode batch reads as many blocks as its longest
    row and masks the rest by length, in one fused call for all rows.
    """
    batch, block_size = q.shape[0], k_pool.shape[2]
    longest = max(int(kv_lens.max()) if batch > 1 else int(kv_lens[0]), 1)
    count = -(-longest // block_size)
    # Table entries past a row's blocks are padding: read block 0 there, masked by kv_lens anyway.
    used = torch.arange(count, device=q.device)[None, :] * block_size < kv_lens[:, None]
    blocks = torch.where(used, block_tables[:, :count].long(), 0)
    keys, values = (_rows_of_blocks(pool[blocks], longest) for pool in (k_pool, v_pool))
    return attention(q, keys, values, q_positions, kv_lens)


def _rows_of_blocks(blocks: torch.Tensor, length: int) -> torch.Tensor:
    """[B, n, Hkv, bs, D] gathered blocks -> [B, Hkv, length, D] histories (key j = position j)."""
    batch, count, heads, block_size, dim = blocks.shape
    history = blocks.permute(0, 2, 1, 3, 4).reshape(batch, heads, count * block_size, dim)
    return history[:, :, :length]
