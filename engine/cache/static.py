"""StaticKVCache: one contiguous slot of fixed capacity per sequence, the baseline paging replaces.

Every sequence reserves `capacity` positions up front, whether it uses 20 of them or all; that
reserved-but-empty memory is the fragmentation tax chapter 1 measures.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.cache.errors import CacheFull
from engine.cache.protocol import new_lengths
from engine.config import ModelConfig


class StaticKVCache:
    """K/V per layer as [max_seqs, kv_heads, capacity, head_dim]; a sequence owns one row."""

    def __init__(self, config: ModelConfig, max_seqs: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if max_seqs <= 0 or capacity <= 0:
            raise ValueError(f"max_seqs and capacity must be positive, got {max_seqs} and {capacity}")
        shape = (max_seqs, config.num_kv_heads, capacity, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.capacity, self.max_seqs = capacity, max_seqs
        self.free_slots = list(range(max_seqs - 1, -1, -1))
        self.slot: dict[int, int] = {}
        self.lengths: dict[int, int] = {}
        self.batch: list[int] = []

    def create(self, seq: int) -> None:
        """Give `seq` a free slot of `capacity` positions."""
        if seq in self.slot:
            raise ValueError(f"sequence {seq} already exists")
        if not self.free_slots:
            raise CacheFull(f"all {self.max_seqs} slots are in use; free a sequence first")
        self.slot[seq], self.lengths[seq] = self.free_slots.pop(), 0

    def reserve(self, seq: int, num_new: int) -> None:
        """Check the slot can hold `num_new` more positions (a static slot never grows)."""
        if self.length(seq) + num_new > self.capacity:
            raise CacheFull(f"sequence {seq} holds {self.lengths[seq]} tokens; {num_new} more exceed "
                            f"its slot of {self.capacity}")

    def set_batch(self, seqs: Sequence[int]) -> None:
        """Remember which slot each batch row uses."""
        for seq in seqs:
            self.length(seq)                     # raises for a sequence that was never created
        self.batch = list(seqs)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> tuple:
        """Store k, v [B, Hkv, T, D] at positions [B, T]; return each row's history.

        Batch row b is sequence self.batch[b], whose slot is row self.slot[seq] of
        self.k[layer] and self.v[layer] ([max_seqs, Hkv, capacity, D]). The token
        in column t goes to position positions[b, t]; padding (position -1) is
        never written. Returns (keys, values, kv_lens): the batch's slots in batch
        order, cut to the longest new length ([B, Hkv, max(kv_lens), D]), and
        kv_lens [B] (long), each row's length after this step. Only the last
        layer's call commits the new lengths.
        """
        rows = torch.tensor([self.slot[s] for s in self.batch], device=k.device)
        valid = positions >= 0  # padding is never written
        row_of = rows[:, None].expand_as(positions)[valid]
        self.k[layer][row_of, :, positions[valid]] = k.transpose(1, 2)[valid]
        self.v[layer][row_of, :, positions[valid]] = v.transpose(1, 2)[valid]
        lengths = new_lengths(positions, [self.lengths[s] for s in self.batch])
        if layer == len(self.k) - 1:  # the last layer commits the new lengths
            self.lengths.update(zip(self.batch, lengths))
        span = max(lengths)
        kv_lens = torch.tensor(lengths, device=k.device)
        return self.k[layer][rows, :, :span], self.v[layer][rows, :, :span], kv_lens

    def free(self, seq: int) -> None:
        """Return `seq`'s slot to the free list."""
        self.length(seq)
        self.free_slots.append(self.slot.pop(seq))
        del self.lengths[seq]

    def length(self, seq: int) -> int:
        """Tokens stored for `seq`; a KeyError that says so for a sequence this cache does not hold."""
        if seq not in self.lengths:
            raise KeyError(f"sequence {seq} is unknown to this cache (create it first, or it was freed)")
        return self.lengths[seq]

    def utilization(self) -> float:
        """Tokens stored / positions reserved by live sequences."""
        reserved = self.capacity * len(self.slot)
        return sum(self.lengths.values()) / reserved if reserved else 0.0
