"""`python -m engine beam`: beam search on the paged cache; beams are forks, the prompt is stored once.

A prompt (the course's own text, for the trained model) is searched `--tokens` deep with `--width`
beams (engine/serve/beam.py). Each surviving parent chosen again is forked, a dropped one is freed,
and copy-on-write copies only the block a beam writes into; the peak blocks in use are set against
`--width` private copies of the longest beam.
"""
from __future__ import annotations

import argparse

from engine.cache.paged import PagedKVCache
from engine.cache.slots import blocks_needed
from engine.serve.beam import beam_search
from engine.tokenizer import ByteTokenizer
from engine.tools.demos import add_model_argument, check_tiny_run, demo_model, demo_prompt, emit

MAX_WIDTH = 64


def run(prompt_tokens: int = 40, width: int = 4, tokens: int = 8, block_size: int = 16, seed: int = 0,
        model_name: str = "trained") -> dict:
    """Search a tiny model's continuations of a prompt; the beams (with their text), best first, and the blocks."""
    model = demo_model(model_name, seed)
    num_blocks = width * blocks_needed(prompt_tokens + tokens, block_size)     # enough without any sharing
    cache = PagedKVCache(model.config, num_blocks=num_blocks, block_size=block_size)
    prompt = demo_prompt(model_name, prompt_tokens, seed)
    result = beam_search(model, cache, prompt, width, tokens)
    text = ByteTokenizer().decode
    return {"prompt_tokens": prompt_tokens, "width": width, "tokens": tokens, "block_size": block_size,
            "prompt": text(prompt),
            "beams": [{"tokens": beam.tokens, "score": round(beam.score, 4), "text": text(beam.tokens)}
                      for beam in result.beams],
            "peak_blocks": result.peak_blocks, "unshared_blocks": result.unshared_blocks,
            "blocks_in_use_after": cache.blocks_in_use}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Prompt length, beam width, search depth, block size and seed."""
    from engine.tools import cli_args as check
    parser.epilog = (f"Limits: whole numbers >= 1 (--width at most {MAX_WIDTH}, --seed 0 to 2**63 - 1); the "
                     "prompt plus --tokens must fit the tiny models' 4,096-token context, and the run half the "
                     "memory. A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--prompt-tokens", type=check.positive_int, default=40, help="prompt length (>= 1)")
    parser.add_argument("--width", type=check.int_in(1, MAX_WIDTH), default=4,
                        help=f"beams kept each step (1 to {MAX_WIDTH})")
    parser.add_argument("--tokens", type=check.positive_int, default=8, help="tokens each beam generates (>= 1)")
    parser.add_argument("--block-size", type=check.positive_int, default=16, help="tokens per block (>= 1)")
    parser.add_argument("--seed", type=check.seed, default=0,
                        help="picks the prompt's paragraph (and --model tiny's weights and tokens); 0 to 2**63 - 1")
    add_model_argument(parser)


def main(args: argparse.Namespace) -> int:
    """Print the beam search's beams and block counts as one JSON object."""
    length = args.prompt_tokens + args.tokens
    check_tiny_run(f"--prompt-tokens {args.prompt_tokens} + --tokens {args.tokens}, --width {args.width}, "
                   f"--block-size {args.block_size}", args.width, length,
                   args.width * blocks_needed(length, args.block_size) * args.block_size, args.model)
    emit(run(args.prompt_tokens, args.width, args.tokens, args.block_size, args.seed, args.model))
    return 0
