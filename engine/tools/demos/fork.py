"""`python -m engine fork`: one prompt forked n ways; blocks are shared, then copied on first write.

A 40-token prompt (the course's own text, for the trained model) fills 3 blocks of 16, the last one
half full. Forking copies block tables, not data, so it costs no blocks. When each fork writes its
first sampled token, the token lands in the shared, half-full last block, so that block alone is
copied: one new block per fork.
"""
from __future__ import annotations

import argparse

from engine.cache.paged import PagedKVCache
from engine.cache.slots import blocks_needed
from engine.tools.demos import add_model_argument, check_tiny_run, demo_model, demo_prompt, emit
from engine.seeded import seeded_tokens
from engine.generate import cached_step, max_abs_diff, scratch_logits


def run(prompt_tokens: int = 40, forks: int = 4, block_size: int = 16, seed: int = 0,
        model_name: str = "trained") -> dict:
    """Prefill a prompt through the real PagedKVCache and a tiny model, fork it, let each fork write once."""
    model = demo_model(model_name, seed)
    # Room for the prompt, and for one block per fork: a copy of the shared last block, or a new one.
    num_blocks = max(64, blocks_needed(prompt_tokens, block_size) + forks)
    cache = PagedKVCache(model.config, num_blocks=num_blocks, block_size=block_size)
    prompt = demo_prompt(model_name, prompt_tokens, seed)
    parent, children = 0, list(range(1, forks + 1))
    cache.create(parent)
    cached_step(model, cache, [parent], [prompt])
    parent_blocks, in_use = len(cache.tables[parent]), cache.blocks_in_use

    for child in children:
        cache.fork(parent, child)
    after_forking = cache.blocks_in_use - in_use

    samples = seeded_tokens(forks, seed + 1)            # each fork continues with its own token
    got = cached_step(model, cache, children, [[token] for token in samples])
    after_writes = cache.blocks_in_use - in_use
    want = scratch_logits(model, [prompt + [token] for token in samples])
    return {"prompt_tokens": prompt_tokens, "forks": forks, "block_size": block_size,
            "parent_blocks": parent_blocks,
            "new_blocks_after_forking": after_forking,
            "new_blocks_after_each_fork_writes_a_token": after_writes,
            "blocks_for_independent_copies": forks * blocks_needed(prompt_tokens + 1, block_size),
            "max_abs_diff_vs_scratch": max_abs_diff(got, [w[-1:] for w in want])}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Prompt length, number of forks, block size and seed."""
    from engine.tools import cli_args as check
    parser.epilog = ("Limits: whole numbers >= 1 (--forks at most 256, --seed 0 to 2**63 - 1); the prompt plus "
                     "one token must fit the tiny models' 4,096-token context, and the run half the memory. "
                     "A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--prompt-tokens", type=check.positive_int, default=40,
                        help="length of the shared prompt (>= 1; + 1 within the 4,096-token context)")
    parser.add_argument("--forks", type=check.int_in(1, MAX_FORKS), default=4,
                        help=f"children forked from the prompt (1 to {MAX_FORKS})")
    parser.add_argument("--block-size", type=check.positive_int, default=16, help="tokens per block (>= 1)")
    parser.add_argument("--seed", type=check.seed, default=0,
                        help="picks the prompt's paragraph and each fork's token (and --model tiny's weights); "
                             "0 to 2**63 - 1")
    add_model_argument(parser)


MAX_FORKS = 256


def main(args: argparse.Namespace) -> int:
    """Print the fork demo's block counts as one JSON object."""
    blocks = max(64, blocks_needed(args.prompt_tokens, args.block_size) + args.forks)
    check_tiny_run(f"--prompt-tokens {args.prompt_tokens} + 1, --forks {args.forks}, --block-size {args.block_size}",
                   args.forks, args.prompt_tokens + 1, blocks * args.block_size, args.model)
    emit(run(args.prompt_tokens, args.forks, args.block_size, args.seed, args.model))
    return 0
