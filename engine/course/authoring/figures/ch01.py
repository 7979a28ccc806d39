"""Chapter 1's figures: what decoding costs with and without a cache, and what a static cache
reserves against what it uses. The chapter computes the numbers; these functions only draw them."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt


def plot_decode_cost(steps: Sequence[int], scratch_positions: Sequence[int], cached_positions: Sequence[int],
                     scratch_ms: Sequence[float], cached_ms: Sequence[float]) -> None:
    """Two figures against the decode step (side by side where they fit): token positions the model
    runs, and measured milliseconds."""
    for scratch, cached, ylabel, title in ((scratch_positions, cached_positions, "token positions through the model",
                                            "Work per step"),
                                           (scratch_ms, cached_ms, "milliseconds (measured)", "Time per step")):
        fig, ax = plt.subplots(figsize=(4.4, 3.2))
        ax.plot(steps, scratch, color="tab:red", label="from scratch")
        ax.plot(steps, cached, color="tab:blue", label="with a KV cache")
        ax.set(xlabel="generation step", ylabel=ylabel, title=title)
        ax.legend()
        fig.tight_layout()
        plt.show()


def plot_reserved_vs_used(lengths: Sequence[int], capacity: int, title: str | None = None) -> None:
    """One bar per request: the slot it reserves (pale) and the tokens it stores (dark)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    used = [lengths[i] for i in order]
    x = range(len(used))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(x, [capacity] * len(used), color="tab:blue", alpha=0.18, label=f"reserved ({capacity:,} each)")
    ax.bar(x, used, color="tab:blue", label="holds tokens")
    ax.set(xlabel="request (sorted by length)", ylabel="token positions", xticks=[])
    utilization = sum(used) / (capacity * len(used))
    ax.set_title(title or f"{len(used)} requests in static slots of {capacity:,}:\n"
                          f"{utilization:.0%} of the reservation holds tokens", fontsize=11)
    ax.legend(loc="upper left", fontsize=11)
    fig.tight_layout()
    plt.show()
