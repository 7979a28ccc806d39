"""Chapter 1's figures: what decoding costs with and without a cache, and what a static cache
reserves against what it uses. The chapter computes the numbers; these functions only draw them."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt


def plot_decode_cost(steps: Sequence[int], scratch_positions: Sequence[int], cached_positions: Sequence[int],
                     scratch_ms: Sequence[float], cached_ms: Sequence[float]) -> None:
    """Two panels against the decode step: token positions the model runs, and measured milliseconds."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.plot(steps, scratch_positions, color="tab:red", label="from scratch")
    left.plot(steps, cached_positions, color="tab:blue", label="with a KV cache")
    left.set(xlabel="generation step", ylabel="token positions through the model",
             title="Work per step")
    left.legend()
    right.plot(steps, scratch_ms, color="tab:red", label="from scratch")
    right.plot(steps, cached_ms, color="tab:blue", label="with a KV cache")
    right.set(xlabel="generation step", ylabel="milliseconds (measured)",
              title="Time per step")
    right.legend()
    fig.tight_layout()
    plt.show()


def plot_reserved_vs_used(lengths: Sequence[int], capacity: int, title: str | None = None) -> None:
    """One bar per request: the slot it reserves (pale) and the tokens it stores (dark)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    used = [lengths[i] for i in order]
    x = range(len(used))
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.bar(x, [capacity] * len(used), color="tab:blue", alpha=0.18, label=f"reserved ({capacity:,} each)")
    ax.bar(x, used, color="tab:blue", label="holds tokens")
    ax.set(xlabel="request (sorted by length)", ylabel="token positions", xticks=[])
    utilization = sum(used) / (capacity * len(used))
    ax.set_title(title or f"{len(used)} requests in static slots of {capacity:,}: "
                          f"{utilization:.0%} of the reservation holds tokens", fontsize=11)
    ax.legend(loc="upper left", fontsize=11)
    fig.tight_layout()
    plt.show()
