"""Beam search on a paged cache: beams are forks, and only the blocks they write get copied.

Every step each live beam proposes its next tokens; the `width` best (beam score + log-probability)
survive. A surviving parent chosen once keeps its sequence; chosen again, it is forked (a table
copy, refcounts + 1); a parent nobody chose is freed. The next write into a shared, partly filled
last block triggers copy-on-write inside `reserve`, so a beam never disturbs its siblings, and the
prompt's blocks stay stored once for the whole search.

Ties are broken the same way every time: by beam order, then token id (a stable sort), so the
search equals a plain reference that keeps full copies of every hypothesis and recomputes them.
This version runs a fixed number of steps and ignores EOS, which keeps every beam the same length.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from engine.blocks import ceil_div
from engine.serve.engine import ModelRunner


@dataclass
class Beam:
    """One hypothesis: the cache sequence that holds it, its generated tokens, its log-probability."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    score: float = 0.0


@dataclass
class BeamResult:
    """The final beams, best first, and how many blocks the search needed at its peak."""

    beams: list[Beam]
    peak_blocks: int          # blocks in use at the worst step, with sharing
    unshared_blocks: int      # what `width` private copies of the longest hypothesis would take


def select(beams: list[Beam], logits: torch.Tensor, width: int) -> list[tuple[int, int, float]]:
    """The `width` best (parent index, token, new score) over all beams' next-token candidates."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)                      # [beams, vocab]
    scores = torch.tensor([b.score for b in beams], dtype=torch.float32)[:, None] + logprobs.cpu()
    flat = scores.flatten()
    order = torch.sort(flat, descending=True, stable=True).indices[:width]   # ties: lower index first
    vocab = logits.shape[-1]
    return [(int(i) // vocab, int(i) % vocab, float(flat[i])) for i in order]


def beam_search(model, cache, prompt: list[int], width: int, max_tokens: int,
                first_seq_id: int = 0) -> BeamResult:
    """Search `max_tokens` tokens deep with `width` beams over a cache that has fork (paged)."""
    if width < 1 or max_tokens < 1 or not prompt:
        raise ValueError(f"need width >= 1, max_tokens >= 1 and a prompt; got {width}, {max_tokens}, "
                         f"{len(prompt)} prompt tokens")
    runner, ids = ModelRunner(model, cache), itertools.count(first_seq_id)
    allocator = cache.allocator
    root = Beam(next(ids))
    beams = [root]
    cache.create(root.seq_id)
    live = {root.seq_id}                               # every sequence in the cache: freed on any exit
    peak = 0
    try:
        cache.reserve(root.seq_id, len(prompt))
        logits = runner.forward([root.seq_id], [list(prompt)], [0])
        for step in range(max_tokens):
            chosen = select(beams, logits, width)
            survivors, kept = [], set()
            for parent_index, token, score in chosen:
                parent = beams[parent_index]
                if parent_index in kept:               # chosen again: a fork shares all its blocks
                    seq = next(ids)
                    cache.fork(parent.seq_id, seq)
                    live.add(seq)
                else:
                    seq = parent.seq_id
                    kept.add(parent_index)
                survivors.append(Beam(seq, parent.tokens + [token], score))
            for index, beam in enumerate(beams):
                if index not in kept:
                    cache.free(beam.seq_id)            # a dropped hypothesis gives its blocks back
                    live.discard(beam.seq_id)
            beams = survivors
            if step == max_tokens - 1:
                break
            for beam in beams:                         # copy-on-write happens here, block by block
                cache.reserve(beam.seq_id, 1)
            peak = max(peak, allocator.num_blocks - allocator.num_free)
            logits = runner.forward([b.seq_id for b in beams], [[b.tokens[-1]] for b in beams],
                                    [len(prompt) + len(b.tokens) - 1 for b in beams])
    finally:
        for seq in live:
            cache.free(seq)
    longest = len(prompt) + max_tokens - 1
    return BeamResult(beams, peak, width * ceil_div(longest, cache.block_size))
