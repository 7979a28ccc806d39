"""Seeded token ids and request lengths: the same workload on every machine, for checks, demos and tests."""
from __future__ import annotations

import random

import torch


def seeded_tokens(count: int, seed: int, vocab: int = 256) -> list[int]:
    """count token ids drawn from a seeded generator: the same prompt on every machine."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count,), generator=generator).tolist()


def request_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    """Token counts of `count` live requests, uniform in [low, high], from a fixed seed."""
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]
