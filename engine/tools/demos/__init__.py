"""The demo commands of `python -m engine`: paged, fork, prefix, bench-alloc.

Each module has `add_arguments(parser)` and `main(args)` and prints one JSON object, which the tests
read back; the figures are computed by the engine's own caches, never typed in.
"""
from __future__ import annotations

import json

import torch

from engine.tools.cli_args import check_memory
from engine.errors import InputError


def emit(result: dict) -> dict:
    """Print a demo's result as one JSON line (what the tests parse) and hand it back."""
    print(json.dumps(result))
    return result


def check_tiny_run(options: str, rows: int, length: int, cache_tokens: int) -> None:
    """Refuse, before the tiny model is built, a demo whose sequences pass its trained context or whose
    from-scratch reference (`rows` sequences of `length` tokens) and cache would fill half the memory.

    `options` names the options that set the sizes, for the message.
    """
    from engine.checkpoint import tiny_config
    config = tiny_config()
    context = config.max_position_embeddings
    if length > context:
        raise InputError(f"{options}: sequences of {length} tokens, past the tiny model's trained context of "
                         f"{context} (max_position_embeddings): lower them")
    scores = rows * config.num_heads * length ** 2 * 4 * 3      # from-scratch scores, mask and softmax
    check_memory(scores + cache_tokens * config.kv_bytes_per_token(torch.float32), options)
