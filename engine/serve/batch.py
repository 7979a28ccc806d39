"""What the scheduler works with: its knobs (SchedulerConfig) and one row of a step (Chunk)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.serve.request import Sequence


@dataclass
class SchedulerConfig:
    """The knobs of one scheduler: budgets, the admission margin, and the preemption policy."""

    max_num_seqs: int = 256           # sequences in one batch
    max_batched_tokens: int = 2048    # tokens in one step: prefill chunks + decodes (vLLM V1's default)
    margin_blocks: int = 2            # free blocks left after admitting a prompt (room to decode)...
    watermark: float = 0.01           # ...or this fraction of the pool, if more (vLLM's default 1%)
    preemption: str = "auto"          # "recompute", "swap", or "auto" (by length, see preemption_mode)
    swap_min_tokens: int = 128        # auto: swap victims at least this long, recompute shorter ones
    swap_space_tokens: int = 1 << 20  # host memory for swapped KV, in tokens

    def __post_init__(self):
        """Reject settings that could never schedule anything, naming them."""
        if self.preemption not in ("recompute", "swap", "auto"):
            raise ValueError(f"preemption must be 'recompute', 'swap' or 'auto', got {self.preemption!r}")
        if self.max_num_seqs < 1 or self.max_batched_tokens < 1 or self.margin_blocks < 0 \
                or not 0 <= self.watermark < 1:
            raise ValueError(f"need max_num_seqs >= 1, max_batched_tokens >= 1, margin_blocks >= 0 and "
                             f"0 <= watermark < 1; got {self.max_num_seqs}, {self.max_batched_tokens}, "
                             f"{self.margin_blocks}, {self.watermark}")


@dataclass
class Chunk:
    """One row of the next forward: `count` tokens of `seq`, starting at position `start`."""

    seq: Sequence
    start: int
    count: int

    @property
    def tokens(self) -> list[int]:
        """The token ids this row feeds to the model."""
        return self.seq.tokens[self.start:self.start + self.count]
