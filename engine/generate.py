"""The simple generation loop: a batch of prompts, from scratch or through any cache.

From scratch (cache=None) recomputes every sequence in full at every step. It is slow on purpose:
it is the ground truth that every cached path in the course must reproduce.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.errors import InputError
from engine.model import check_prompt_ids
from engine.sampling import SamplingParams, sample


def pack(rows: Sequence[Sequence[int]], starts: Sequence[int],
         device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows of token ids -> (token_ids, positions) [B, T]; row b starts at position starts[b].

    Short rows are padded with token 0 at position -1, which the model and caches skip.
    """
    width = max((len(r) for r in rows), default=0)
    # Built as Python lists, then one tensor each: a decode step's rows are short, and a tensor op
    # per step costs more than the list.
    ids = [list(row) + [0] * (width - len(row)) for row in rows]
    places = [list(range(start, start + len(row))) + [-1] * (width - len(row)) for row, start in zip(rows, starts)]
    token_ids = torch.tensor(ids, dtype=torch.long, device=device).reshape(len(rows), width)
    return token_ids, torch.tensor(places, dtype=torch.long, device=device).reshape(len(rows), width)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def scratch_logits(model, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Logits of every position of every sequence, recomputed from nothing: [len_i, vocab] each."""
    token_ids, positions = pack(sequences, [0] * len(sequences), model_device(model))
    logits = model(token_ids, positions)
    return [logits[b, :len(seq)] for b, seq in enumerate(sequences)]


def max_abs_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest absolute difference between matching logits tensors (a cached run against scratch_logits)."""
    return max(float((g - w).abs().max()) for g, w in zip(got, want))


def cached_step(model, cache, seqs: Sequence[int], new_tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """One forward through `cache`: append new_tokens[b] to sequence seqs[b]; logits [n_b, vocab] each.

    Everything is checked, and room reserved, before any compute: bad input (unknown or repeated
    sequences, an id outside the vocabulary) or a full cache raises here and leaves the cache as it was.
    """
    seqs, new_tokens = list(seqs), [token_list(tokens, f"new_tokens[{b}]") for b, tokens in enumerate(new_tokens)]
    if len(seqs) != len(new_tokens) or len(set(seqs)) != len(seqs):
        raise InputError(f"cached_step: give one row of new tokens per distinct sequence, got sequences {seqs} "
                         f"and {len(new_tokens)} row(s)")
    for b, tokens in enumerate(new_tokens):
        check_prompt_ids(tokens, model.config.vocab_size, f"new_tokens[{b}] (sequence {seqs[b]})")
    starts = [cache.length(s) for s in seqs]           # an unknown sequence raises here, before any change
    reserved = []
    try:
        for seq, tokens in zip(seqs, new_tokens):
            cache.reserve(seq, len(tokens))
            reserved.append(seq)
    except MemoryError:
        for seq, start in zip(reserved, starts):       # give back what this call reserved
            if hasattr(cache, "truncate"):
                cache.truncate(seq, start)
        raise
    cache.set_batch(seqs)
    token_ids, positions = pack(new_tokens, starts, model_device(model))
    logits = model(token_ids, positions, cache)
    return [logits[b, :len(tokens)] for b, tokens in enumerate(new_tokens)]


def token_list(prompt, what: str = "prompt") -> list:
    """A prompt as a list: a sequence of token ids or a 1-D integer tensor (its ids are checked later).

    Text and anything that is not a sequence are refused by name, as is a tensor that is not 1-D or
    holds something other than integers.
    """
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype.is_complex \
                or prompt.dtype == torch.bool:
            raise InputError(f"{what}: a tensor of token ids must be 1-D and of an integer dtype, got shape "
                             f"{tuple(prompt.shape)} and {prompt.dtype}")
        return prompt.tolist()
    if isinstance(prompt, (str, bytes)):
        raise InputError(f"{what}: give token ids, not text: encode {prompt[:20]!r} with the tokenizer first")
    try:
        return list(prompt)
    except TypeError:
        raise InputError(f"{what}: expected a sequence of token ids, got {type(prompt).__name__}") from None


@dataclass
class Generation:
    """What one prompt produced: the new tokens, why it stopped, and (optionally) each step's logits."""

    tokens: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    logits: list[torch.Tensor] = field(default_factory=list)


def generate(model, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] = None,
             cache=None, keep_logits: bool = False) -> list[Generation]:
    """Generate for a batch of prompts; the same call with cache=None recomputes from scratch."""
    params = params or SamplingParams()
    params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(params) != len(prompts):
        raise ValueError(f"give one SamplingParams per prompt: {len(prompts)} prompts, {len(params)} params")
    prompts = [token_list(p, f"prompt {i}") for i, p in enumerate(prompts)]
    empty = [i for i, p in enumerate(prompts) if len(p) == 0]
    if empty:
        raise InputError(f"prompt {empty[0]} is empty: every prompt needs at least one token")
    for i, prompt in enumerate(prompts):
        check_prompt_ids(list(prompt), model.config.vocab_size, f"prompt {i}")
    eos = model.config.eos_token_id
    generators = [p.generator() for p in params]
    results = [Generation() for _ in prompts]
    live = [i for i, p in enumerate(params) if p.max_tokens > 0]
    if cache is not None:
        for i in live:
            cache.create(i)
    pending = {i: list(prompts[i]) for i in live}         # tokens not yet seen by the model
    try:
        while live:
            if cache is None:
                every = scratch_logits(model, [list(prompts[i]) + results[i].tokens for i in live])
                last = [rows[-1] for rows in every]
            else:
                last = [rows[-1] for rows in cached_step(model, cache, live, [pending[i] for i in live])]
            still = []
            for i, row in zip(live, last):
                token = sample(row, params[i], generators[i])
                out = results[i]
                out.tokens.append(token)
                if keep_logits:
                    out.logits.append(row.clone())
                if token == eos and not params[i].ignore_eos:
                    out.finish_reason = "stop"
                elif len(out.tokens) < params[i].max_tokens:
                    still.append(i)
                    pending[i] = [token]
            live = still
    finally:
        if cache is not None:
            for i, p in enumerate(params):
                if p.max_tokens > 0:
                    cache.free(i)
    return results


def check_limits(prompts: list[list[int]], max_tokens: int, context: int) -> None:
    """Refuse, before any memory is reserved, a run that cannot be done as asked."""
    if max_tokens < 1:
        raise InputError(f"--max-tokens must be at least 1, got {max_tokens}")
    for i, prompt in enumerate(prompts):           # an empty prompt is refused by generate() itself
        if len(prompt) + max_tokens > context:
            raise InputError(f"prompt {i} ({len(prompt)} tokens) + --max-tokens {max_tokens} = "
                             f"{len(prompt) + max_tokens} positions, past the model's trained context of "
                             f"{context} (max_position_embeddings); " + (
                                 f"lower --max-tokens to at most {context - len(prompt)}"
                                 if len(prompt) < context else "shorten the prompt"))
