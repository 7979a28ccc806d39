"""`python -m engine prefix`: requests that share a system prompt prefill it once and store it once.

The run is engine/serve/shared_prompt.py's; this command checks its options and prints it.

Eight requests start with the same 96-token system prompt (6 full blocks of 16) and add 8 tokens of
their own (the course's own text on the trained tiny model, the default; seeded ids with --model tiny).
The first request prefills all 104 tokens and publishes its 6 full blocks; each later one
attaches to them and prefills only its own 8 tokens, into one block of its own.
"""
from __future__ import annotations

import argparse

from engine.cache.slots import blocks_needed
from engine.serve.shared_prompt import run
from engine.tools.demos import add_model_argument, check_tiny_run, demo_model, demo_prompt, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """How many requests, the shared and own prompt lengths, block size and seed."""
    from engine.tools import cli_args as check
    parser.epilog = ("Limits: whole numbers >= 1 (--own-tokens >= 0, --requests at most 1,024, --seed 0 to "
                     "2**63 - 1); a prompt must fit the tiny model's 4,096-token context, and the run half the "
                     "memory. A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--requests", type=check.int_in(1, MAX_REQUESTS), default=8,
                        help=f"requests served one after another (1 to {MAX_REQUESTS:,})")
    parser.add_argument("--system-tokens", type=check.positive_int, default=96, help="the shared system prompt (>= 1)")
    parser.add_argument("--own-tokens", type=check.nonneg_int, default=8, help="tokens each request adds (>= 0)")
    parser.add_argument("--block-size", type=check.positive_int, default=16, help="tokens per block (>= 1)")
    parser.add_argument("--seed", type=check.seed, default=0,
                        help="picks the system prompt's paragraph and each request's own (and --model tiny's weights "
                             "and tokens); 0 to 2**63 - 1")
    add_model_argument(parser)


MAX_REQUESTS = 1024


def main(args: argparse.Namespace) -> int:
    """Print the prefix demo's prefill and block counts as one JSON object."""
    length = args.system_tokens + args.own_tokens
    check_tiny_run(f"--requests {args.requests} x (--system-tokens {args.system_tokens} + --own-tokens "
                   f"{args.own_tokens}), --block-size {args.block_size}", args.requests, length,
                   args.requests * blocks_needed(length, args.block_size) * args.block_size, args.model)
    emit(run(args.requests, args.system_tokens, args.own_tokens, args.block_size, args.seed,
             model=demo_model(args.model, args.seed), tokens=lambda n, seed: demo_prompt(args.model, n, seed)))
    return 0
