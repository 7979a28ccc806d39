"""Chapter 3's figures: a paged pool slot by slot, and utilization against block size. The chapter
computes the numbers (through a cache); these functions only draw them."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from engine.course.authoring.figures import draw_slot_rows


def draw_pool(cache, title: str = "") -> None:
    """Every physical block of `cache` as a row of slots, coloured by the sequence whose table names it;
    a filled slot shows the position it holds, a pale one is reserved room, a white row is free."""
    owner = {block: (seq, index) for seq, table in cache.tables.items() for index, block in enumerate(table)}
    bs, num_blocks = cache.block_size, cache.allocator.num_blocks
    colours = plt.get_cmap("tab10")
    pitch, label = min(0.42, 3.2 / bs), 1.5                 # inches per slot, inches of row label
    fig, ax = plt.subplots(figsize=(label + pitch * bs + 0.1, 0.34 * num_blocks + 1.1))

    def row_label(block: int) -> str:
        seq, index = owner.get(block, (None, None))
        return f"block {block}" + (f": seq {seq}[{index}]" if seq is not None else "")

    def slot(block: int, offset: int):
        if block not in owner:
            return "white", ""
        seq, index = owner[block]
        pos = index * bs + offset
        stored = pos < cache.lengths[seq]
        face = colours(seq % 10) if stored else (*colours(seq % 10)[:3], 0.2)
        return face, str(pos) if stored and bs <= 16 else ""

    draw_slot_rows(ax, num_blocks, bs, row_label, slot)
    ax.set_xlim(-label / pitch, bs + 0.1)
    ax.set_title(title or "the pool: one row per physical block,\nthe number in a slot is its position",
                 fontsize=11)
    fig.tight_layout()
    plt.show()


def plot_block_size_sweep(sweep: Sequence[dict], static_utilization: float | None = None,
                          mark: int = 16) -> None:
    """Utilization (left axis) and mean block-table length (right axis, log) against block size (log),
    one point per block size; `static_utilization` draws the static cache's level for comparison."""
    sizes = [row["block_size"] for row in sweep]
    fig, left = plt.subplots(figsize=(5, 3.8))
    left.plot(sizes, [row["utilization"] for row in sweep], ".-", color="tab:blue", label="paged utilization")
    if static_utilization is not None:
        left.axhline(static_utilization, color="tab:red", ls=":", label="static slots of 1,024")
    left.set(xscale="log", xlabel="block size (tokens)", ylabel="tokens stored / slots reserved", ylim=(0, 1.02))
    ticks = [s for s in (1, 2, 4, 8, 16, 32, 64, 128) if min(sizes) <= s <= max(sizes)]
    left.set_xticks(ticks, [str(s) for s in ticks])
    if mark in sizes:
        at = sizes.index(mark)
        left.annotate(f"{sweep[at]['utilization']:.1%} at {mark}", (mark, sweep[at]["utilization"]),
                      xytext=(mark * 1.6, 0.78), arrowprops={"arrowstyle": "->"}, fontsize=11)
    right = left.twinx()
    right.plot(sizes, [row["mean_table_length"] for row in sweep], "--", color="tab:orange",
               label="mean block-table length")
    right.set(yscale="log", ylabel="block-table entries per request")
    fig.legend(loc="lower left", bbox_to_anchor=(0.13, 0.17), fontsize=11)
    left.set_title("Smaller blocks waste less;\nlarger blocks mean shorter tables", fontsize=11)
    fig.tight_layout()
    plt.show()
