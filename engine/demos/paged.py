"""`python -m engine paged`: how much of the reserved KV memory holds tokens, static slots vs blocks.

The same live requests are stored in a StaticKVCache (one slot of `--capacity` tokens each) and in a
PagedKVCache (blocks of `--block-size`); both caches count what they store and what they reserved.
`--sweep` repeats the paged side for block sizes 1..128 and plots utilization and table length.
"""
from __future__ import annotations

import argparse
import random

import torch

from engine.cache.paged import PagedKVCache
from engine.cache.slots import blocks_needed
from engine.cache.static import StaticKVCache
from engine.checkpoint import tiny_config
from engine.demos import emit
from engine.generate import pack

SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def request_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    """Token counts of `count` live requests, uniform in [low, high], from a fixed seed."""
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


def data_only_config():
    """A one-layer, one-head shape: enough to exercise the caches' bookkeeping, tiny in memory."""
    return tiny_config(num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2)


def store(cache, lengths: list[int]) -> None:
    """Write lengths[i] tokens of zeros for sequence i through the cache protocol, like a prefill."""
    config = data_only_config()
    seqs = list(range(len(lengths)))
    for seq, n in zip(seqs, lengths):
        cache.create(seq)
        cache.reserve(seq, n)
    cache.set_batch(seqs)
    _, positions = pack([[0] * n for n in lengths], [0] * len(lengths))
    kv = torch.zeros(len(lengths), config.num_kv_heads, positions.shape[1], config.head_dim)
    cache.update(0, kv, kv, positions)


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
    parser.add_argument("--requests", type=int, default=32, help="live requests")
    parser.add_argument("--min-tokens", type=int, default=20, help="shortest request, in tokens")
    parser.add_argument("--max-tokens", type=int, default=500, help="longest request, in tokens")
    parser.add_argument("--capacity", type=int, default=1024, help="tokens per static slot")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per paged block")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request lengths")
    parser.add_argument("--sweep", action="store_true", help="also sweep block sizes 1..128 and plot")
    parser.add_argument("--out", default="paged_sweep.png", help="where --sweep writes its PNG")


def main(args: argparse.Namespace) -> int:
    """Print static vs paged accounting for the same requests as one JSON object."""
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
