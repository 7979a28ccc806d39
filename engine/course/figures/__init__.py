"""Plotting helpers of the chapters: the figure code lives here, so a chapter page shows the call and the picture."""
from __future__ import annotations

from typing import Any, Callable

import matplotlib.pyplot as plt


def draw_slot_rows(ax, num_blocks: int, block_size: int, row_label: Callable[[int], str],
                   slot: Callable[[int, int], tuple[Any, str]]) -> None:
    """A pool as one row of `block_size` slots per physical block, block 0 on top: `row_label(block)` left
    of its row, and `slot(block, offset)` gives each slot's face colour and the text in it ("" for none)."""
    for block in range(num_blocks):
        y = -block
        ax.text(-0.3, y + 0.4, row_label(block), ha="right", va="center", fontsize=7)
        for offset in range(block_size):
            face, text = slot(block, offset)
            ax.add_patch(plt.Rectangle((offset, y), 0.92, 0.8, facecolor=face, edgecolor="grey", lw=0.5))
            if text:
                ax.text(offset + 0.46, y + 0.4, text, ha="center", va="center", fontsize=6, color="white")
    ax.set_ylim(-num_blocks + 0.6, 1.1)
    ax.axis("off")
