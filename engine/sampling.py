"""Sampling: turn one row of logits into the next token, reproducibly per request."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.errors import InputError


# What torch.Generator.manual_seed takes: a seed that does not fit is refused before anything runs.
SEED_MIN, SEED_MAX = -2 ** 63, 2 ** 64 - 1
# A temperature below this samples greedily (the argmax): softmax(logits / T) is then one-hot to float
# precision, and logits / T itself overflows float32 (to inf, then nan) once T is near 1e-38.
GREEDY_BELOW = 1e-6


def check_seed(seed, what: str = "seed", count: int = 1) -> None:
    """Refuse a seed that is not an int or whose seeds seed .. seed + count - 1 torch cannot take."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_MIN <= seed <= SEED_MAX - (count - 1):
        top = "2**64 - 1" if count == 1 else f"2**64 - {count} (seed + i for {count} samples)"
        raise InputError(f"{what} must be an int from -2**63 to {top}, got {seed!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens. temperature 0 (or below GREEDY_BELOW = 1e-6) is greedy; a seed makes
    sampling reproducible."""

    temperature: float = 0.0
    top_k: int = 0              # 0 = no limit
    top_p: float = 1.0          # nucleus: keep the smallest set of tokens whose mass reaches top_p
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        """Refuse, naming the field and its value, what sampling cannot do."""
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"SamplingParams: {name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            raise InputError(f"SamplingParams: temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        for name in ("top_k", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"SamplingParams: {name} must be an int >= 0, got {value!r}")
        if self.seed is not None:
            check_seed(self.seed, "SamplingParams: seed")

    @property
    def greedy(self) -> bool:
        """Whether tokens are picked by argmax: temperature 0, or one so small that sampling is the argmax."""
        return self.temperature < GREEDY_BELOW

    def generator(self) -> torch.Generator:
        """A private random stream for this request, so batching never changes its samples."""
        g = torch.Generator()
        return g.manual_seed(self.seed) if self.seed is not None else g.manual_seed(torch.seed())


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Pick a token id from logits [vocab]: argmax when greedy (temperature below 1e-6), else temperature,
    top-k, top-p (the likeliest token always stays, however small top_p is)."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits.float().cpu() / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the first always stays)
        drop = probs.cumsum(-1) - probs >= params.top_p
        drop[0] = False       # a top_p below float32's smallest number compares as 0: keep the first anyway
        scores[order[drop]] = float("-inf")
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))
