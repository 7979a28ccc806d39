"""Sampling: turn one row of logits into the next token, reproducibly per request."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens. temperature 0 is greedy; a seed makes sampling reproducible."""

    temperature: float = 0.0
    top_k: int = 0              # 0 = no limit
    top_p: float = 1.0          # nucleus: keep the smallest set of tokens whose mass reaches top_p
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if not math.isfinite(self.temperature) or not math.isfinite(self.top_p):
            raise InputError(f"temperature and top_p must be finite numbers, got {self.temperature} "
                             f"and {self.top_p}")
        if self.temperature < 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_tokens < 0:
            raise InputError(f"top_k and max_tokens must be >= 0, got {self.top_k} and {self.max_tokens}")

    def generator(self) -> torch.Generator:
        """A private random stream for this request, so batching never changes its samples."""
        g = torch.Generator()
        return g.manual_seed(self.seed) if self.seed is not None else g.manual_seed(torch.seed())


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Pick a token id from logits [vocab]: argmax when greedy, else temperature, top-k, top-p."""
    if params.temperature == 0:
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
        scores[order[drop]] = float("-inf")
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))
