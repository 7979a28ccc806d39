"""Text for a failed logits check: the trained tiny model continues a prompt from scratch and through
the learner's cache, greedily, and the two continuations are shown side by side with where they part.

A cache bug is a number in a logits comparison (max |Δ| 0.8 at position 14); the same bug makes the
cache write a different sentence than the recompute does. Only a failing check calls this, so a
passing one costs nothing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

PROMPT = "The block table maps"
TOKENS = 24


@functools.lru_cache(maxsize=1)
def trained():
    """The tiny Qwen3 trained on the course's prose (engine/tiny_model/), loaded once per process."""
    from engine.checkpoint import trained_model
    return trained_model()


@dataclass(frozen=True)
class Continuations:
    """A prompt, its greedy continuation from scratch (or by the engine's `reference` run) and through
    the learner's cache, and the first token where they differ (counted from the start of the text,
    prompt included; None when they agree)."""

    prompt: str
    scratch: str
    cached: str
    parted_at: int | None
    reference: str = "from-scratch"

    def __str__(self) -> str:
        if self.parted_at is None:
            return f"{self.reference} and yours both write {self.prompt + self.scratch!r}"
        return (f"{self.reference}: {self.prompt + self.scratch!r}, yours: {self.prompt + self.cached!r}, "
                f"token {self.parted_at}")


def greedy_from_scratch(model, prompt: list[int], tokens: int) -> list[int]:
    """`tokens` greedy tokens after `prompt`, the whole sequence recomputed at every step."""
    from engine.generate import scratch_logits
    ids = list(prompt)
    for _ in range(tokens):
        ids.append(int(scratch_logits(model, [ids])[0][-1].argmax()))
    return ids[len(prompt):]


def greedy_cached(model, cache, seq: int, first_logits: torch.Tensor, tokens: int,
                  others: dict[int, list[int]] | None = None) -> list[int]:
    """`tokens` greedy tokens of `seq` through `cache`, starting from the logits its prefill gave. Each
    sequence in `others` writes its own next token in the same steps (a fork's parent going its own way)."""
    from engine.generate import cached_step
    others = others or {}
    out, logits = [], first_logits
    for step in range(tokens):
        out.append(int(logits.argmax()))
        rows = [seq] + [s for s, forced in others.items() if step < len(forced)]
        new = [[out[-1]]] + [[others[s][step]] for s in rows[1:]]
        logits = cached_step(model, cache, rows, new)[0][-1]
    return out


def parted_at(prompt: list[int], scratch: list[int], cached: list[int]) -> int | None:
    """The index, prompt included, of the first token where the two continuations differ."""
    for i, (a, b) in enumerate(zip(scratch, cached)):
        if a != b:
            return len(prompt) + i
    return None if len(scratch) == len(cached) else len(prompt) + min(len(scratch), len(cached))


def side_by_side(run_cached: Callable, prompt: str = PROMPT, tokens: int = TOKENS,
                 reference: Callable | None = None) -> Continuations:
    """Both continuations of `prompt`. `run_cached(model, prompt_ids, tokens)` continues it through the
    learner's cache (built for `model.config`) and returns the new token ids; see `plain_run`. The other
    side is from scratch, or `reference` (the same call through the engine's cache) where the cache is
    not meant to be exact (int8 blocks)."""
    from engine.checks import one_thread
    from engine.tokenizer import ByteTokenizer
    model, tokenizer = trained(), ByteTokenizer()
    ids = tokenizer.encode(prompt)
    with one_thread():
        scratch = list(reference(model, ids, tokens)) if reference else greedy_from_scratch(model, ids, tokens)
        cached = list(run_cached(model, ids, tokens))
    return Continuations(prompt, tokenizer.decode(scratch), tokenizer.decode(cached), parted_at(ids, scratch, cached),
                         "the engine's" if reference else "from-scratch")


def plain_run(make_cache: Callable) -> Callable:
    """A `run_cached` for side_by_side: `make_cache(config, tokens)` builds the learner's cache for a
    sequence of that many tokens; the prompt is prefilled as sequence 0, then decoded a token a step."""
    from engine.generate import cached_step

    def run(model, prompt: list[int], tokens: int) -> list[int]:
        cache = make_cache(model.config, len(prompt) + tokens)
        cache.create(0)
        first = cached_step(model, cache, [0], [prompt])[0][-1]
        return greedy_cached(model, cache, 0, first, tokens)

    return run


def served(engine, prompts: list[list[int]], tokens: int, limit: int = 1000) -> list[list[int]]:
    """The greedy outputs of `prompts` (token ids) served by `engine` to the end, `tokens` each; a run that
    has not finished after `limit` steps raises (a scheduler that never finishes cannot hang a message)."""
    from engine.sampling import SamplingParams
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    requests = [engine.add_request(prompt, params) for prompt in prompts]
    for _ in range(limit):
        if not engine.has_unfinished():
            return [request.outputs[0] for request in requests]
        engine.step()
    raise RuntimeError(f"the engine had not finished after {limit} steps")


def shown(run_cached: Callable, prompt: str = PROMPT, tokens: int = TOKENS, reference: Callable | None = None) -> str:
    """side_by_side as one line for a check's message; a cache that crashes on the way says so instead."""
    try:
        return f"The trained tiny model writes it out: {side_by_side(run_cached, prompt, tokens, reference)}"
    except Exception as exc:   # the learner's cache failing here must not hide the check's own message
        return f"(The trained tiny model could not write through your cache: {type(exc).__name__}: {exc})"
