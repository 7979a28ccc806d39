"""Attention in plain torch: the reference every kernel in the course is checked against."""
import torch


def expand_kv_heads(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat each KV head for its group of query heads: query head h reads KV head h // group."""
    num_kv_heads = x.shape[1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads cannot share {num_kv_heads} KV heads evenly")
    # repeat_interleave keeps heads of one group adjacent: [kv0, kv0, kv1, kv1] for group 2.
    return x.repeat_interleave(num_q_heads // num_kv_heads, dim=1)


def visibility_mask(q_positions: torch.Tensor, kv_lens: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[B, T, L] True where key j may be read by the query at position p: j <= p and j < kv_len."""
    keys = torch.arange(num_keys, device=q_positions.device)
    causal = keys[None, None, :] <= q_positions[:, :, None]
    stored = keys[None, None, :] < kv_lens[:, None, None]
    # Padding queries (position -1) see key 0 only, so their softmax stays finite; their output is unused.
    padding = (q_positions < 0)[:, :, None] & (keys == 0)[None, None, :]
    return (causal & stored) | padding


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              q_positions: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention of q [B,Hq,T,D] over a history keys/values [B,Hkv,L,D].

    Key index j holds position j. Scores and softmax run in float32; the result has q's dtype.
    """
    batch, num_q_heads, _, head_dim = q.shape
    if keys.shape[0] != batch or keys.shape != values.shape or keys.shape[-1] != head_dim:
        raise ValueError(f"q {tuple(q.shape)} does not fit keys {tuple(keys.shape)} / values {tuple(values.shape)}")
    k = expand_kv_heads(keys, num_q_heads).float()
    v = expand_kv_heads(values, num_q_heads).float()
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * head_dim ** -0.5      # [B, Hq, T, L]
    mask = visibility_mask(q_positions, kv_lens, keys.shape[2])[:, None]          # [B, 1, T, L]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).to(q.dtype)
