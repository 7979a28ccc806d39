"""Chapter 8's figures and the one measurement they draw: the serving simulator run with fp16 and with
int8 blocks of the same KV budget, how each way of fixing a block's scale reads back, and the block-size
trade-off of GQA against MLA. The chapter computes the numbers it prints; these functions draw them."""
from __future__ import annotations

import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import torch

from engine.cache.paged import PagedKVCache
from engine.cache.quantized import QMAX, QuantizedPagedKVCache, kv_bytes_per_token
from engine.config import known_config
from engine.generate import cached_step
from engine.sampling import SamplingParams
from engine.tools.bench import make_workload
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig
from engine.tools.simulate import GPUS, BookkeepingPagedCache, Roofline, SimulatedRunner
from engine.blocks import ceil_div

KiB, MiB = 2 ** 10, 2 ** 20


def simulated_capacity(config_name: str = "llama-2-13b", gpu_name: str = "A100-40GB", kv: str = "fp16",
                       requests: int = 256, block_size: int = 16, seed: int = 0) -> dict:
    """The bench's simulation (real scheduler, allocator and paged cache; a roofline clock) on the GPU's
    KV budget, the pool cut into blocks of fp16 or int8 (scales included). Returns what it measured."""
    config = known_config(config_name)
    roofline = Roofline(config, GPUS[gpu_name], name=config_name)
    per_token = kv_bytes_per_token(config, kv, block_size)
    roofline.kv_bytes_per_token = per_token          # the clock reads (and writes) int8 blocks too
    budget = roofline.kv_budget_bytes()
    blocks = int(budget // (per_token * block_size))
    cache = BookkeepingPagedCache(blocks, block_size)
    engine = Engine(None, cache, SchedulerConfig(max_num_seqs=4096, max_batched_tokens=8192),
                    runner=SimulatedRunner(roofline, cache))
    for index, (prompt, outputs) in enumerate(make_workload(requests, seed)):
        engine.add_request(prompt, SamplingParams(max_tokens=outputs, ignore_eos=True), seed=index)
    engine.run(progress=False)
    summary = engine.metrics.summary(engine)
    return {"kv": kv, "bytes_per_token": per_token, "kv_budget_bytes": budget, "blocks": blocks,
            "concurrent_mean": summary["concurrent_mean_saturated"], "concurrent_peak": summary["concurrent_peak"],
            "output_tokens_per_s": summary["output_tokens_per_s"],
            "preemptions": summary["preemptions_recompute"] + summary["preemptions_swap"]}


def plot_capacity(runs: Sequence[dict], title: str) -> None:
    """One row of bars per figure (blocks in the pool, concurrent sequences while requests queue,
    output tokens/s), one bar per KV format."""
    names = [run["kv"] for run in runs]
    colors = ["tab:blue", "tab:green", "tab:orange"][:len(runs)]
    fig, axes = plt.subplots(3, 1, figsize=(5, 0.55 * len(runs) * 3 + 2.2))
    for ax, key, label in zip(axes, ("blocks", "concurrent_mean", "output_tokens_per_s"),
                              ("blocks of 16 in the pool", "concurrent sequences (mean)",
                               "output tokens/s (simulated)")):
        values = [run[key] for run in runs]
        ax.barh(names, values, color=colors)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:,.0f}", ha="left", va="center", fontsize=11)
        ax.set_title(label, fontsize=11, loc="left")
        ax.invert_yaxis()
        ax.margins(x=0.22)
        ax.set_xticks([])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    fig.suptitle("\n".join(textwrap.wrap(title, 46)), fontsize=11)
    fig.tight_layout()
    plt.show()


def block_values(model, tokens: Sequence[int], layer: int = 0) -> torch.Tensor:
    """The fp32 values (V) the model stores for `tokens` in one layer: [len(tokens), Hkv, D]."""
    cache = PagedKVCache(model.config, 1, len(tokens))
    cache.create(0)
    cached_step(model, cache, [0], [list(tokens)])
    return cache.v_pools[layer][cache.tables[0][0]].transpose(0, 1).clone()


def readback_errors(values: torch.Tensor) -> dict[str, list[float]]:
    """values [bs, Hkv, D] written into one block one token at a time, three ways; the largest
    readback error of each token at the end. 'scale set by the first token' clamps later tokens;
    'scale grows, codes re-rounded' is the engine's; 'whole block at once' is the floor."""
    from types import SimpleNamespace

    size, heads, dim = values.shape
    shape = SimpleNamespace(num_layers=1, num_kv_heads=heads, head_dim=dim)
    cache = QuantizedPagedKVCache(shape, 1, size)
    for offset in range(size):
        cache.quantize_into(cache.v_pools[0], cache.v_scales[0], torch.tensor([0]),
                            torch.tensor([offset]), values[offset:offset + 1])
    grown = cache.dequantize(cache.v_pools[0], cache.v_scales[0], torch.tensor(0)).transpose(0, 1)
    first = values[0].abs().amax(dim=-1) / QMAX                                # [Hkv]
    clamped = torch.round(values / first[None, :, None]).clamp(-QMAX, QMAX) * first[None, :, None]
    whole = values.abs().amax(dim=(0, 2)) / QMAX
    once = torch.round(values / whole[None, :, None]) * whole[None, :, None]

    def worst(read):
        return (read - values).abs().amax(dim=(1, 2)).tolist()
    return {"scale set by the first token, later ones clamped": worst(clamped),
            "scale grows, codes re-rounded (the engine)": worst(grown),
            "whole block quantized at once": worst(once)}


def plot_readback_error(errors: dict[str, Sequence[float]], block_size: int) -> None:
    """Largest readback error of each token of one block, per way of setting the block's scale."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for (name, values), color in zip(errors.items(), ["tab:red", "tab:blue", "tab:gray"]):
        ax.plot(range(block_size), values, marker="o", color=color, label=name)
    ax.set_yscale("log")
    ax.set(xlabel="offset of the token in its block", ylabel="max |stored - read back|",
           title="Tokens written one at a time into one block")
    ax.legend(fontsize=11, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    plt.show()


def plot_block_tradeoff(per_token: dict[str, int], block_sizes: Sequence[int], context: int,
                        marker: int | None = None) -> None:
    """Two figures against the block size (side by side where they fit): bytes per block, and table
    entries for one long sequence (a dashed line at `marker`, the block size being explored)."""
    fig, left = plt.subplots(figsize=(4.4, 3.3))
    for name, bytes_per_token in per_token.items():
        left.plot(block_sizes, [b * bytes_per_token / MiB for b in block_sizes], marker="o", label=name)
    left.axhline(16 * max(per_token.values()) / MiB, color="gray", ls=":", lw=1)
    left.set(xscale="log", yscale="log", xlabel="block size (tokens)", ylabel="MiB per block",
             title="Bytes one block holds")
    left.legend(fontsize=11)
    fig_table, right = plt.subplots(figsize=(4.4, 3.3))
    right.plot(block_sizes, [ceil_div(context, b) for b in block_sizes], marker="o", color="tab:purple")
    right.set(xscale="log", yscale="log", xlabel="block size (tokens)", ylabel="table entries",
              title=f"Block table of one {context:,}-token\nsequence")
    for figure, ax in ((fig, left), (fig_table, right)):
        if marker is not None:
            ax.axvline(marker, color="black", ls="--", lw=1)
        ax.set_xticks(block_sizes, [str(b) for b in block_sizes])
        figure.tight_layout()
    plt.show()


def draw_block(codes: torch.Tensor, scale: float, title: str) -> None:
    """One block of one head as a heat map of its int8 codes, with its scale in the title."""
    fig, ax = plt.subplots(figsize=(5, 2.4))
    image = ax.imshow(codes.float().numpy(), cmap="coolwarm", vmin=-127, vmax=127, aspect="auto")
    ax.set(xlabel="head_dim", ylabel="offset", title=f"{title}\n(scale {scale:.2e})")
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    plt.show()


def plot_block_choice(name: str, bytes_per_token: int, reference: tuple[str, int],
                      block_sizes: Sequence[int], block_size: int) -> None:
    """One small panel for the explorer: MiB per block against the block size, the choice marked,
    and a reference model's 16-token block as a dotted line."""
    fig, ax = plt.subplots(figsize=(4.8, 2.8))
    ax.plot(block_sizes, [b * bytes_per_token / MiB for b in block_sizes], marker="o", label=name)
    ax.axhline(16 * reference[1] / MiB, color="gray", ls=":", lw=1, label=f"16 tokens of {reference[0]}")
    ax.axvline(block_size, color="black", ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="block size (tokens)", ylabel="MiB per block")
    ax.set_xticks(block_sizes, [str(b) for b in block_sizes])
    ax.legend(fontsize=11)
    fig.tight_layout()
    plt.show()
