"""`python -m engine paged`: how much of the reserved KV memory holds tokens, static slots vs blocks.

The same live requests are stored in a StaticKVCache (one slot of `--capacity` tokens each) and in a
PagedKVCache (blocks of `--block-size`); both caches count what they store and what they reserved.
`--sweep` repeats the paged side for block sizes 1..128 and plots utilization and table length.
"""
from __future__ import annotations

import argparse

import torch

from engine.cache.fill import data_only_config, store
from engine.cache.paged import PagedKVCache
from engine.cache.slots import blocks_needed
from engine.cache.static import StaticKVCache
from engine.tools.demos import emit
from engine.errors import InputError
from engine.seeded import request_lengths

SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def paged_figures(lengths: list[int], block_size: int) -> dict:
    """Store the requests in a PagedKVCache just big enough for them; report its accounting."""
    num_blocks = sum(blocks_needed(n, block_size) for n in lengths)
    cache = PagedKVCache(data_only_config(), num_blocks, block_size=block_size, attention="reference")
    store(cache, lengths)
    return {"block_size": block_size, "tokens_stored": cache.tokens_stored,
            "slots_reserved": cache.slots_reserved, "utilization": round(cache.utilization(), 3),
            "mean_table_length": round(sum(map(len, cache.tables.values())) / len(lengths), 1)}


def static_figures(lengths: list[int], capacity: int) -> dict:
    """Store the requests in a StaticKVCache with one slot of `capacity` tokens each."""
    cache = StaticKVCache(data_only_config(), len(lengths), capacity)
    store(cache, lengths)
    return {"tokens_stored": sum(cache.lengths.values()), "slots_reserved": capacity * len(cache.slot),
            "utilization": round(cache.utilization(), 3)}


def plot_sweep(sweep: list[dict], path: str) -> None:
    """Utilization and block-table length against block size, on one figure with two y axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["block_size"] for row in sweep]
    fig, left = plt.subplots(figsize=(6.4, 4))
    left.plot(sizes, [row["utilization"] for row in sweep], "o-", color="tab:blue", label="utilization")
    left.set(xscale="log", xlabel="block size (tokens)", ylabel="utilization (tokens / slots reserved)")
    left.set_xticks(sizes, [str(s) for s in sizes])
    right = left.twinx()
    right.plot(sizes, [row["mean_table_length"] for row in sweep], "s--", color="tab:orange",
               label="block-table length")
    right.set(yscale="log", ylabel="mean block-table length (entries)")
    fig.legend(loc="lower left", bbox_to_anchor=(0.12, 0.15))
    left.set_title("Smaller blocks waste less; larger blocks mean shorter tables")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload: how many requests, their length range, the static slot and the block size."""
    from engine.tools import cli_args as check
    parser.epilog = ("Limits: whole numbers >= 1 (--requests at most 100,000, --seed 0 to 2**63 - 1); "
                     "--min-tokens <= --max-tokens <= --capacity; the caches must fit in half the memory; "
                     "--out's folder must exist. A bad input prints one 'error: ...' line and exits with status 2.")
    parser.add_argument("--requests", type=check.int_in(1, MAX_REQUESTS), default=32,
                        help=f"live requests (1 to {MAX_REQUESTS:,})")
    parser.add_argument("--min-tokens", type=check.positive_int, default=20,
                        help="shortest request, in tokens (1 to --max-tokens)")
    parser.add_argument("--max-tokens", type=check.positive_int, default=500,
                        help="longest request, in tokens (--min-tokens to --capacity)")
    parser.add_argument("--capacity", type=check.positive_int, default=1024,
                        help="tokens per static slot (at least --max-tokens: a slot holds any request)")
    parser.add_argument("--block-size", type=check.positive_int, default=16, help="tokens per paged block (>= 1)")
    parser.add_argument("--seed", type=check.seed, default=0, help="seed of the request lengths (0 to 2**63 - 1)")
    parser.add_argument("--sweep", action="store_true", help="also sweep block sizes 1..128 and plot")
    parser.add_argument("--out", default="paged_sweep.png", type=check.output_file(*check.FIGURE_SUFFIXES),
                        help="where --sweep writes its figure (its folder must exist; .png, .pdf, .svg, ...)")


MAX_REQUESTS = 100_000


def check_args(args: argparse.Namespace) -> None:
    """Refuse lengths that contradict each other, or caches too big for this machine, before storing any."""
    from engine.tools.cli_args import check_memory
    if args.min_tokens > args.max_tokens:
        raise InputError(f"--min-tokens {args.min_tokens} is greater than --max-tokens {args.max_tokens}: give "
                         "--min-tokens <= --max-tokens")
    if args.max_tokens > args.capacity:
        raise InputError(f"--max-tokens {args.max_tokens} is greater than --capacity {args.capacity}: a static "
                         "slot must hold the longest request; give --capacity >= --max-tokens")
    per_token = data_only_config().kv_bytes_per_token(torch.float32)
    widest = max(args.block_size, max(SWEEP_BLOCK_SIZES) if args.sweep else 1)
    tokens = args.requests * (args.capacity + args.max_tokens + widest)      # static slots + the paged pool
    check_memory(tokens * per_token + args.requests * args.max_tokens * 64,  # + the batch written at once
                 f"--requests {args.requests} x (--capacity {args.capacity} + --max-tokens {args.max_tokens} + "
                 f"--block-size {args.block_size}) tokens")


def main(args: argparse.Namespace) -> int:
    """Print static vs paged accounting for the same requests as one JSON object."""
    check_args(args)
    lengths = request_lengths(args.requests, args.min_tokens, args.max_tokens, args.seed)
    static, paged = static_figures(lengths, args.capacity), paged_figures(lengths, args.block_size)
    result = {"requests": len(lengths), "tokens_stored": paged["tokens_stored"],
              "static_slots_reserved": static["slots_reserved"], "paged_slots_reserved": paged["slots_reserved"],
              "static_utilization": static["utilization"], "paged_utilization": paged["utilization"],
              "static_capacity": args.capacity, "block_size": args.block_size}
    if args.sweep:
        result["sweep"] = [paged_figures(lengths, size) for size in SWEEP_BLOCK_SIZES]
        plot_sweep(result["sweep"], args.out)
        result["plot"] = args.out
    emit(result)
    return 0
