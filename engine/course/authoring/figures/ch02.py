"""Chapter 2's figures: one sequence's block table, the block-size trade-off, and a pool of blocks
coloured by owner. The chapter computes what is drawn; these functions only draw it."""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from engine.blocks import ceil_div


def draw_block_table(table: Sequence[int], length: int, block_size: int) -> None:
    """One row per logical block, labelled with its physical block; filled cells hold tokens. The
    cells narrow as the block grows, so the picture stays about 5 inches wide (a phone's width)."""
    pitch, label = min(0.34, 3.6 / block_size), 1.0    # inches per cell, inches of row label
    fig, ax = plt.subplots(figsize=(label + pitch * block_size + 0.2, 0.45 * len(table) + 1.1))
    for row, physical in enumerate(table):
        for col in range(block_size):
            pos = row * block_size + col
            filled = pos < length
            ax.add_patch(plt.Rectangle((col, -row), 0.92, 0.85, edgecolor="tab:blue",
                                       facecolor="tab:blue" if filled else "white"))
            if filled and block_size <= 16:
                ax.text(col + 0.46, -row + 0.42, str(pos), ha="center", va="center", fontsize=11,
                        color="white")
        ax.text(-0.3, -row + 0.42, f"{row} → block {physical}", ha="right", va="center", fontsize=11)
    ax.set_xlim(-label / pitch, block_size + 0.2)
    ax.set_ylim(-len(table) + 0.7, 1.1)
    ax.axis("off")
    tail = len(table) * block_size - length
    ax.set_title(f"{length} tokens in blocks of {block_size}: {tail} empty slot(s)\n"
                 "row: logical block → physical block", fontsize=11)
    fig.subplots_adjust(left=0, right=1)
    plt.show()


def plot_block_size_tradeoff(sizes: Sequence[int], waste_percent: Sequence[float],
                             entries: Sequence[int], length: int) -> None:
    """Bars: expected tail waste per block size; line (second axis): block-table entries."""
    labels = [str(b) for b in sizes]
    fig, left = plt.subplots(figsize=(5, 3.8))
    left.bar(labels, waste_percent, color="tab:blue", label="expected tail waste (%)")
    left.set(xlabel="block size (tokens)", ylabel=f"expected waste, % of {length} tokens")
    right = left.twinx()
    right.plot(labels, entries, "o-", color="tab:orange", label="block-table entries")
    right.set_ylabel("table entries = kernel lookups per head")
    left.set_title(f"A {length}-token sequence: waste grows with the\nblock, the table shrinks", fontsize=11)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.82), fontsize=11)
    fig.tight_layout()
    plt.show()


def draw_pool(owner: Mapping[int, int], num_blocks: int, per_row: int = 8) -> None:
    """One cell per physical block, `per_row` to a row, coloured by the sequence that owns it
    (white = free)."""
    rows = ceil_div(num_blocks, per_row)
    fig, ax = plt.subplots(figsize=(0.55 * per_row, 0.62 * rows + 0.6))
    colours = plt.get_cmap("tab10")
    for block in range(num_blocks):
        seq = owner.get(block)
        x, y = block % per_row, -(block // per_row)
        ax.add_patch(plt.Rectangle((x, y), 0.92, 0.9, edgecolor="grey",
                                   facecolor=colours(seq) if seq is not None else "white"))
        ax.text(x + 0.46, y + 0.45, str(block) if seq is None else f"{block}\ns{seq}",
                ha="center", va="center", fontsize=11)
    ax.set_xlim(0, per_row)
    ax.set_ylim(-rows + 1, 1)
    ax.axis("off")
    ax.set_title("The pool: physical block id and owning\nsequence (white = free)", fontsize=11)
    plt.show()
