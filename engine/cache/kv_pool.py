"""KVPool: the storage half of the paged cache, one K and one V tensor per layer, indexed by physical block.

Each tensor is `[num_blocks, *per_block]`: `[num_blocks, kv_heads, block_size, head_dim]` for the K/V
pools, `[num_blocks, kv_heads]` for the int8 cache's scales. Block tables (block_tables.py) say which
block holds what; the cache's taught methods write, gather, copy and swap the blocks, and the attention
kernels read them in place. The pool only holds them, so nothing of a taught method lives here.
"""
from __future__ import annotations

import torch


class KVPool:
    """K and V of every layer, allocated once, zeroed: `keys[layer]` and `values[layer]`."""

    def __init__(self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        """`shape` is one layer's tensor, blocks first: (num_blocks, kv_heads, block_size, head_dim)."""
        self.shape, self.dtype, self.device = tuple(shape), dtype, torch.device(device)
        self.keys = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds, all layers, K and V."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
