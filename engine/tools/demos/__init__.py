"""The demo commands of `python -m engine`: paged, fork, beam, prefix, bench-alloc.

Each module has `add_arguments(parser)` and `main(args)` and prints one JSON object, which the tests
read back; the figures are computed by the engine's own caches, never typed in. The demos that run a
model (fork, beam) run the tiny Qwen3 trained on the course's prose unless `--model tiny` asks for the
seeded random one the checks use.
"""
from __future__ import annotations

import json
import re

import torch

from engine.tools.cli_args import check_memory
from engine.errors import InputError


def emit(result: dict) -> dict:
    """Print a demo's result as one JSON line (what the tests parse) and hand it back."""
    print(json.dumps(result))
    return result


MODELS = ("trained", "tiny")


def add_model_argument(parser) -> None:
    """--model: the trained tiny model (the default) or the seeded random one."""
    parser.add_argument("--model", choices=MODELS, default="trained",
                        help="'trained' (the default: the tiny Qwen3 trained on the course's prose, prompted "
                             "with its text) or 'tiny' (seeded random weights and tokens, what the checks use)")


def demo_config(name: str):
    """The shape of the named model, known before its weights are read."""
    from engine.checkpoint import tiny_config, trained_config
    return trained_config() if name == "trained" else tiny_config()


def demo_model(name: str, seed: int):
    """The trained tiny model, or the seeded one of `seed`."""
    from engine.checkpoint import tiny_model, trained_model
    return trained_model() if name == "trained" else tiny_model(seed=seed)


def demo_prompt(name: str, tokens: int, seed: int) -> list[int]:
    """`tokens` prompt ids: for the trained model the course's own text, from the start of the
    seed-th prose paragraph of its corpus on (wrapping round); for the seeded model seeded tokens."""
    from engine.checkpoint import TRAINED_DIR
    from engine.seeded import seeded_tokens
    if name != "trained":
        return seeded_tokens(tokens, seed)
    text = (TRAINED_DIR / "corpus.txt").read_bytes()
    starts = [m.end() for m in re.finditer(rb"\n\n(?=[A-Z])", text)]
    start = starts[seed % len(starts)]
    wrapped = text[start:] + text * (1 + tokens // len(text))
    return list(wrapped[:tokens])


def check_tiny_run(options: str, rows: int, length: int, cache_tokens: int, model: str = "tiny") -> None:
    """Refuse, before the tiny model is built, a demo whose sequences pass its trained context or whose
    from-scratch reference (`rows` sequences of `length` tokens) and cache would fill half the memory.

    `options` names the options that set the sizes, for the message.
    """
    config = demo_config(model)
    context = config.max_position_embeddings
    if length > context:
        raise InputError(f"{options}: sequences of {length} tokens, past the tiny model's trained context of "
                         f"{context} (max_position_embeddings): lower them")
    scores = rows * config.num_heads * length ** 2 * 4 * 3      # from-scratch scores, mask and softmax
    check_memory(scores + cache_tokens * config.kv_bytes_per_token(torch.float32), options)
