"""What the scheduler works with: its knobs (SchedulerConfig) and one row of a step (Chunk)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InputError
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
        """Reject settings that could never schedule anything (or would schedule nonsense), naming them."""
        if self.preemption not in ("recompute", "swap", "auto"):
            raise InputError(f"SchedulerConfig: preemption must be 'recompute', 'swap' or 'auto', "
                             f"got {self.preemption!r}")
        for name, least in (("max_num_seqs", 1), ("max_batched_tokens", 1), ("margin_blocks", 0),
                            ("swap_min_tokens", 0), ("swap_space_tokens", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InputError(f"SchedulerConfig: {name} must be an int >= {least}, got {value!r}")
        watermark = self.watermark
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)) or not 0 <= watermark < 1:
            raise InputError(f"SchedulerConfig: watermark must be a fraction of the pool in [0, 1), "
                             f"got {watermark!r}")


@dataclass(frozen=True)
class Chunk:
    """One row of the next forward: `count` tokens of `seq`, starting at position `start`. A value, never
    changed once made (so the grader's judge gets a step's chunks as data, in one answer)."""

    seq: Sequence
    start: int
    count: int

    @property
    def tokens(self) -> list[int]:
        """The token ids this row feeds to the model."""
        return self.seq.tokens[self.start:self.start + self.count]
