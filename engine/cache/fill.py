"""Fill a cache with zeros through its protocol: the bookkeeping of a workload, without a model.

The caches' accounting (tokens stored, slots reserved, utilization) depends only on how many tokens
each sequence holds, so a one-layer, one-head shape is enough, and tiny in memory.
"""
from __future__ import annotations

import torch

from engine.checkpoint import tiny_config
from engine.generate import pack


def data_only_config():
    """A one-layer, one-head shape: enough to exercise the caches' bookkeeping, tiny in memory."""
    return tiny_config(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2)


def store(cache, lengths: list[int]) -> None:
    """Write lengths[i] tokens of zeros for sequence i through the cache protocol, like a prefill."""
    config = data_only_config()
    seqs = list(range(len(lengths)))
    for seq, n in zip(seqs, lengths):
        cache.create(seq)
        cache.reserve(seq, n)
    cache.set_batch(seqs)
    _, positions = pack([[0] * n for n in lengths], [0] * len(lengths))
    kv = torch.zeros(len(lengths), config.num_kv_heads, positions.shape[1], config.head_dim)
    cache.update(0, kv, kv, positions)
