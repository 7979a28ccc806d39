"""What the engine serves: a Request (what a user asked for) and its Sequences (what the cache holds).

A request with `n = 1` has one sequence. A request for `n` parallel samples has one sequence while its
prompt is prefilled, then `n` sequences that share the prompt's blocks through `cache.fork`.
Each sequence carries everything needed to resume it after a preemption: its token ids (prompt plus
output), how many of them have K/V in the cache, and its own random generator.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from engine.errors import InputError


class Status(enum.Enum):
    """Where a sequence is in its life. Only RUNNING sequences hold KV memory on the device."""

    WAITING = "waiting"        # queued: not yet admitted, or preempted by recompute (no KV anywhere)
    RUNNING = "running"        # admitted: its KV lives in the cache
    SWAPPED = "swapped"        # preempted by swap: its KV was copied to host memory
    FINISHED = "finished"      # done (length, eos, aborted); its blocks are already freed


class RequestTooLarge(InputError):
    """A request that could not run even with the whole KV pool to itself; rejected on arrival."""

    def __init__(self, request_id: int, tokens: int, capacity: int, what: str):
        """Keep the numbers on the exception and put them in the message."""
        self.request_id, self.tokens, self.capacity = request_id, tokens, capacity
        super().__init__(f"request {request_id} rejected: {what} needs {tokens} KV token slots but the "
                         f"whole cache holds {capacity}")


@dataclass
class Request:
    """One user request: prompt ids, sampling parameters, a seed, and how many samples to draw."""

    request_id: int
    prompt: list[int]
    params: object                      # engine.sampling.SamplingParams
    seed: int = 0                       # sample i draws from torch.Generator seeded with seed + i
    n: int = 1                          # parallel samples sharing one prefill
    arrival: float = 0.0                # engine clock at add_request
    sequences: list["Sequence"] = field(default_factory=list)
    aborted: bool = False               # Engine.abort: finished, whatever samples it never forked

    @property
    def finished(self) -> bool:
        """True once every sample of the request has finished (at once when no token was asked for,
        and once aborted, even before its prompt ran and split it into its n samples)."""
        if self.params.max_tokens == 0 or self.aborted:
            return True
        return len(self.sequences) == self.n and all(s.status is Status.FINISHED for s in self.sequences)

    @property
    def outputs(self) -> list[list[int]]:
        """Generated token ids of each sample, in sample order."""
        return [s.output for s in sorted(self.sequences, key=lambda s: s.sample_index)]


@dataclass(eq=False)
class Sequence:
    """One token stream in the KV cache: the unit the scheduler admits, runs, preempts and frees."""

    seq_id: int
    request: Request
    tokens: list[int]                   # prompt followed by the generated tokens
    generator: torch.Generator
    sample_index: int = 0
    num_computed: int = 0               # tokens whose K/V are in the cache (0 after a recompute preemption)
    status: Status = Status.WAITING
    finish_reason: str | None = None    # "length", "eos", "aborted"
    first_token_time: float | None = None
    finish_time: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0              # prompt tokens taken from the prefix cache at the last admission
    logits: list[torch.Tensor] = field(default_factory=list)   # rows that produced each output (if kept)

    @property
    def prompt_len(self) -> int:
        """Number of prompt tokens (the first part of `tokens`)."""
        return len(self.request.prompt)

    @property
    def output(self) -> list[int]:
        """The generated tokens so far."""
        return self.tokens[self.prompt_len:]

    @property
    def num_pending(self) -> int:
        """Tokens that still need a forward pass before the next sample: a prompt chunk, a replay, or 1."""
        return len(self.tokens) - self.num_computed

    @property
    def max_length(self) -> int:
        """The longest this sequence can get: prompt plus the output limit."""
        return self.prompt_len + self.request.params.max_tokens

    @property
    def forked(self) -> bool:
        """True once this request's prompt has been prefilled and split into its n samples."""
        return len(self.request.sequences) == self.request.n

    def __repr__(self) -> str:
        """Id, request, status and progress: what a scheduler trace needs."""
        return (f"Sequence(id={self.seq_id}, request={self.request.request_id}, {self.status.value}, "
                f"tokens={len(self.tokens)}, computed={self.num_computed})")


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator for one sample; sampling draws from it only, so a run replays exactly."""
    return torch.Generator().manual_seed(int(seed))
