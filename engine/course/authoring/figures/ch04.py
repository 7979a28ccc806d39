"""Chapter 4's figures: block tables with shared blocks marked, and blocks in use with and without
sharing. The chapter computes the numbers (through a cache); these functions only draw them."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt


def draw_tables(cache, seqs: Sequence[int], title: str) -> None:
    """One row per sequence, one cell per table entry labelled with its physical block: orange
    where another table shares the block (refcount > 1), blue where it is private."""
    fig, ax = plt.subplots(figsize=(5.5, 0.5 * len(seqs) + 0.8))
    for row, seq in enumerate(seqs):
        for col, block in enumerate(cache.tables[seq]):
            shared = cache.allocator.refcount(block) > 1
            ax.add_patch(plt.Rectangle((col, -row), 0.9, 0.8, edgecolor="black",
                                       facecolor="tab:orange" if shared else "tab:blue"))
            ax.text(col + 0.45, -row + 0.4, f"{block}", ha="center", va="center", color="white",
                    fontsize=11)
        ax.text(-0.2, -row + 0.4, f"seq {seq}", ha="right", va="center", fontsize=11)
    width = max(len(cache.tables[s]) for s in seqs)
    ax.set_xlim(-1.5, width + 0.2)
    ax.set_ylim(-len(seqs) + 0.6, 1.2)
    ax.axis("off")
    ax.set_title(title, fontsize=11)
    plt.show()


def plot_blocks_in_use(steps: Sequence[int], without: Sequence[int], with_sharing: Sequence[int],
                       samples: int, prompt_len: int, block_size: int) -> None:
    """Blocks in use against tokens generated per sample: independent copies vs forks."""
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.step(steps, without, where="post", label=f"{samples} independent copies", color="tab:red")
    ax.step(steps, with_sharing, where="post", label=f"{samples} forks, copy-on-write",
            color="tab:blue")
    ax.set_xlabel("tokens generated per sample")
    ax.set_ylabel(f"blocks of {block_size} in use")
    ax.set_title(f"{samples} samples of a {prompt_len}-token prompt")
    ax.legend()
    fig.tight_layout()
    plt.show()
