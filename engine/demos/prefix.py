"""`python -m engine prefix`: requests that share a system prompt prefill it once and store it once.

Eight requests start with the same 96-token system prompt (6 full blocks of 16) and add 8 tokens of
their own. The first request prefills all 104 tokens and publishes its 6 full blocks; each later one
attaches to them and prefills only its own 8 tokens, into one block of its own.
"""
from __future__ import annotations

import argparse

from engine.cache.paged import PagedKVCache
from engine.cache.prefix import PrefixCache
from engine.cache.slots import blocks_needed
from engine.checkpoint import tiny_model
from engine.demos import check_tiny_run, emit, max_abs_diff
from engine.seeded import seeded_tokens
from engine.generate import cached_step, scratch_logits


def run(requests: int = 8, system_tokens: int = 96, own_tokens: int = 8, block_size: int = 16,
        seed: int = 0, prefix_class=PrefixCache) -> dict:
    """Serve the requests one after another through a PrefixCache (or `prefix_class`, chapter 5's
    checks pass the learner's) over a PagedKVCache and the tiny model."""
    model = tiny_model(seed=seed)
    system = seeded_tokens(system_tokens, seed)
    prompts = [system + seeded_tokens(own_tokens, seed + 1 + i) for i in range(requests)]
    num_blocks = sum(blocks_needed(len(p), block_size) for p in prompts)     # enough even without sharing
    cache = PagedKVCache(model.config, num_blocks, block_size=block_size)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """How many requests, the shared and own prompt lengths, block size and seed."""
    from engine import cli_args as check
    parser.epilog = ("Limits: whole numbers >= 1 (--own-tokens >= 0, --requests at most 1,024, --seed 0 to "
                     "2**63 - 1); a prompt must fit the tiny model's 4,096-token context, and the run half the "
                     "memory. A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--requests", type=check.int_in(1, MAX_REQUESTS), default=8,
                        help=f"requests served one after another (1 to {MAX_REQUESTS:,})")
    parser.add_argument("--system-tokens", type=check.positive_int, default=96, help="the shared system prompt (>= 1)")
    parser.add_argument("--own-tokens", type=check.nonneg_int, default=8, help="tokens each request adds (>= 0)")
    parser.add_argument("--block-size", type=check.positive_int, default=16, help="tokens per block (>= 1)")
    parser.add_argument("--seed", type=check.seed, default=0, help="seed of the model and the tokens (0 to 2**63 - 1)")


MAX_REQUESTS = 1024


def main(args: argparse.Namespace) -> int:
    """Print the prefix demo's prefill and block counts as one JSON object."""
    length = args.system_tokens + args.own_tokens
    check_tiny_run(f"--requests {args.requests} x (--system-tokens {args.system_tokens} + --own-tokens "
                   f"{args.own_tokens}), --block-size {args.block_size}", args.requests, length,
                   args.requests * blocks_needed(length, args.block_size) * args.block_size)
    emit(run(args.requests, args.system_tokens, args.own_tokens, args.block_size, args.seed))
    return 0
