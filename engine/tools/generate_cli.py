"""`python -m engine generate`: the command-line face of engine/generate.py.

The options are checked by their types before the model loads (engine/tools/cli_args.py); the run
itself (generate, check_limits) is the runtime's.
"""
from __future__ import annotations

import argparse

from engine.generate import check_limits, generate
from engine.sampling import SamplingParams


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options, each checked by its type before the model loads (engine/tools/cli_args.py)."""
    from engine.tools import cli_args as check
    parser.epilog = ("Limits: a prompt plus --max-tokens must fit the model's trained context "
                     "(max_position_embeddings in config.json; 4,096 for both tiny models); --max-tokens "
                     "is at least 1; --temperature >= 0 and --top-p in (0, 1] are finite numbers (a --temperature "
                     "below 1e-6 is greedy, like 0; the likeliest token is kept however small --top-p is); "
                     "--top-k >= 0; --seed from 0 to 2**63 - 1. "
                     "A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--model", default="trained", type=check.model_source,
                        help="'trained' (the default: the tiny Qwen3 trained on the course's prose, "
                             "engine/tiny_model/), 'tiny' (seeded random weights, what the checks use) "
                             "or a Hugging Face Qwen3 checkpoint directory")
    parser.add_argument("--prompt", action="append", required=True, type=check.non_empty,
                        help="repeat for a batch; not empty (bytes that are not UTF-8 are kept as raw bytes)")
    parser.add_argument("--max-tokens", type=check.positive_int, default=32,
                        help="new tokens per prompt at most (1 to the context left after the prompt)")
    parser.add_argument("--temperature", type=check.nonneg_float, default=0.0,
                        help="0 = greedy (a finite number >= 0; below 1e-6 it is greedy too)")
    parser.add_argument("--top-k", type=check.nonneg_int, default=0,
                        help="sample among the k likeliest tokens (0 = all; a whole number >= 0)")
    parser.add_argument("--top-p", type=check.fraction, default=1.0, help="nucleus sampling mass in (0, 1] (1 = off)")
    parser.add_argument("--seed", type=check.seed, default=0, help="prompt i samples with seed + i (0 to 2**63 - 1)")
    parser.add_argument("--cache", choices=["none", "static", "paged", "int8"], default="paged",
                        help="none recomputes from scratch each step; static slots; paged blocks of 16; "
                             "int8: paged blocks of int8 codes with a scale per block and KV head")


def encode_argument(tokenizer, text: str) -> list[int]:
    """A command-line prompt as token ids; bytes that were not UTF-8 reach the byte tokenizer as they were."""
    raw = text.encode("utf-8", errors="surrogateescape")
    if hasattr(tokenizer, "encode_bytes"):
        return tokenizer.encode_bytes(raw)
    return tokenizer.encode(raw.decode("utf-8", errors="replace"))


def main(args: argparse.Namespace) -> int:
    """`python -m engine generate`: print each prompt's continuation."""
    from engine.cache.paged import PagedKVCache
    from engine.cache.slots import blocks_needed
    from engine.cache.static import StaticKVCache
    from engine.checkpoint import load_model, tiny_model, trained_model
    from engine.tokenizer import load_tokenizer

    params = [SamplingParams(args.temperature, args.top_k, args.top_p, args.max_tokens, args.seed + i)
              for i in range(len(args.prompt))]          # options are checked before the model loads
    named = {"trained": trained_model, "tiny": tiny_model}     # both read bytes: no tokenizer.json
    model = named[args.model]() if args.model in named else load_model(args.model)
    tokenizer = load_tokenizer(None if args.model in named else args.model, model.config.eos_token_id)
    prompts = [encode_argument(tokenizer, p) for p in args.prompt]
    check_limits(prompts, args.max_tokens, model.config.max_position_embeddings)
    dtype, longest = next(model.parameters()).dtype, max(len(p) for p in prompts) + args.max_tokens
    cache = None
    if args.cache == "static":
        cache = StaticKVCache(model.config, len(prompts), longest, dtype)
    elif args.cache in ("paged", "int8"):
        from engine.cache.quantized import QuantizedPagedKVCache
        kind = PagedKVCache if args.cache == "paged" else QuantizedPagedKVCache
        cache = kind(model.config, len(prompts) * blocks_needed(longest, 16), 16, dtype)
    for prompt, out in zip(args.prompt, generate(model, prompts, params, cache)):
        shown = prompt.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
        print(f"{shown!r} -> {tokenizer.decode(out.tokens)!r} ({out.finish_reason}, {len(out.tokens)} tokens)")
    return 0
