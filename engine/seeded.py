"""Seeded token ids: the same prompt on every machine, for checks, demos and tests."""
from __future__ import annotations

import torch


def seeded_tokens(count: int, seed: int, vocab: int = 256) -> list[int]:
    """count token ids drawn from a seeded generator: the same prompt on every machine."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count,), generator=generator).tolist()
