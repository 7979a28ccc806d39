"""Requests that share a system prompt prefill it once and store it once (chapter 5).

Each request starts with the same system prompt and adds tokens of its own. The first request
prefills all of it and publishes its full blocks; each later one attaches to them and prefills only
its own tokens. `python -m engine prefix` prints this run, and chapter 5's checks run it with the
learner's prefix cache.
"""
from __future__ import annotations

from typing import Callable

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.cache.slots import blocks_needed
from engine.checkpoint import tiny_model
from engine.generate import cached_step, max_abs_diff, scratch_logits
from engine.seeded import seeded_tokens


def run(requests: int = 8, system_tokens: int = 96, own_tokens: int = 8, block_size: int = 16,
        seed: int = 0, prefix_class=PrefixCache, model=None,
        tokens: Callable[[int, int], list[int]] = seeded_tokens, make_cache: Callable = PagedKVCache) -> dict:
    """Serve the requests one after another through a PrefixCache (or `prefix_class`, chapter 5's
    checks pass the learner's) over a PagedKVCache and `model` (the tiny seeded one of `seed` unless
    given). `tokens(n, seed)` makes n prompt ids: the system prompt's with `seed`, request i's own with
    seed + 1 + i (seeded ids unless given; `python -m engine prefix` gives the trained model's text).
    `make_cache(config, num_blocks, block_size=...)` builds the cache (the grader builds it beside the
    learner's class)."""
    model = model if model is not None else tiny_model(seed=seed)
    system = tokens(system_tokens, seed)
    prompts = [system + tokens(own_tokens, seed + 1 + i) for i in range(requests)]
    num_blocks = sum(blocks_needed(len(p), block_size) for p in prompts)     # enough even without sharing
    cache = make_cache(model.config, num_blocks, block_size=block_size)
    prefix = prefix_class(cache)

    prefilled, last_logits = 0, []
    for seq, prompt in enumerate(prompts):
        reused = prefix.attach(seq, prompt)
        logits = cached_step(model, cache, [seq], [prompt[reused:]])[0]
        prefix.remember(seq, prompt)
        prefilled += len(prompt) - reused
        last_logits.append(logits[-1:])
    cold = [rows[-1:] for rows in scratch_logits(model, prompts)]   # every prompt computed from nothing
    return {"requests": requests, "prompt_tokens": sum(map(len, prompts)), "tokens_prefilled": prefilled,
            "blocks_in_use": cache.blocks_in_use,
            "blocks_without_sharing": sum(blocks_needed(len(p), block_size) for p in prompts),
            "prefix_cache": prefix.stats(),
            "max_abs_diff_vs_cold_prefill": max_abs_diff(last_logits, cold)}
