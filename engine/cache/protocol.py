"""The cache protocol: the six methods through which the model stores and reads keys and values.

Every cache in the course (static slots, the paged cache, a learner's own) implements it, so the model
runs on any of them unchanged. Shapes are those of engine/README.md.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class KVCache(Protocol):
    """What the engine asks of a KV cache, in the order one step uses it."""

    def create(self, seq: int) -> None:
        """Start an empty sequence with id `seq`."""

    def reserve(self, seq: int, num_new: int) -> None:
        """Make room for `num_new` more positions before any compute.

        Raises a MemoryError subclass (CacheFull, OutOfBlocks) and changes nothing when it cannot,
        so a scheduler can wait, evict or preempt and try again.
        """

    def set_batch(self, seqs: Sequence[int]) -> None:
        """Name the sequences of the next forward pass, in batch-row order."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store k, v [B, Hkv, T, D] at positions [B, T] (skip -1), return each row's history.

        Returns (keys, values, kv_lens): keys/values [B, Hkv, L, D] with key index j at position j,
        kv_lens [B] the valid keys per row. The last layer's call commits the new lengths.
        """

    def free(self, seq: int) -> None:
        """Forget `seq` and give its memory back."""

    def length(self, seq: int) -> int:
        """Number of tokens stored for `seq`."""


def new_lengths(positions: torch.Tensor, old_lengths: Sequence[int]) -> list[int]:
    """Each row's length after this step: one past its highest position, never shorter than before."""
    highest = positions.max(dim=1).values.tolist()
    return [max(old, int(top) + 1) for old, top in zip(old_lengths, highest)]
