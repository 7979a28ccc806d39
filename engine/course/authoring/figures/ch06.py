"""Chapter 6's figures: what a decode step reads, the online softmax tile by tile, and which slots one
program of the paged kernel reads. The chapter computes the numbers; these functions draw them."""
from __future__ import annotations

import textwrap

from typing import Sequence

import matplotlib.pyplot as plt
import torch

from engine.course.authoring.figures import draw_slot_rows
from engine.blocks import ceil_div


def online_softmax_trace(scores: torch.Tensor, block_n: int) -> list[dict]:
    """The running max m and running sum l = sum exp(s - m) after each tile of `block_n` scores,
    computed the way the kernel does: rescale the old sum by exp(m_old - m_new), add the tile."""
    m, l, rows = float("-inf"), 0.0, []
    for start in range(0, scores.numel(), block_n):
        tile = scores[start:start + block_n].double()
        m_new = max(m, float(tile.max()))
        alpha = float(torch.exp(torch.tensor(m - m_new, dtype=torch.float64)))
        l = l * alpha + float(torch.exp(tile - m_new).sum())
        rows.append({"tile": len(rows), "keys": (start, start + tile.numel() - 1), "m": m_new, "alpha": alpha,
                     "l": l})
        m = m_new
    return rows


def plot_online_softmax(scores: torch.Tensor, trace: Sequence[dict], block_n: int) -> None:
    """Scores by key position with the tiles marked and the running max after each tile (top); the
    running sum l after each tile against the exact sum exp(s - max) over all keys (bottom)."""
    pos = range(scores.numel())
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 4.8), sharex=True)
    top.plot(pos, scores.tolist(), ".", color="tab:blue", label="score of key j")
    for row in trace:
        lo, hi = row["keys"]
        top.hlines(row["m"], lo - 0.4, hi + 0.4, color="tab:red")
        top.axvline(lo - 0.5, color="grey", lw=0.5, ls=":")
        bottom.hlines(row["l"], lo - 0.4, hi + 0.4, color="tab:green")
    top.plot([], [], color="tab:red", label="running max m after the tile")
    top.set_ylabel("score")
    top.legend(fontsize=11, loc="lower right")
    exact = float(torch.exp(scores.double() - scores.max()).sum())
    bottom.axhline(exact, color="black", ls="--", lw=0.8, label=f"exact sum exp(s - max) = {exact:.3f}")
    bottom.plot([], [], color="tab:green", label="running sum l after the tile")
    bottom.set_ylabel("l")
    bottom.set_xlabel(f"key position j (tiles of {block_n})")
    bottom.legend(fontsize=11, loc="lower right")
    fig.suptitle("online softmax: one pass, tile by tile", fontsize=11)
    fig.tight_layout()
    plt.show()


def plot_decode_traffic(contexts: Sequence[int], kv_gib: dict[int, Sequence[float]], weights_gib: float,
                        bandwidth_gbs: float, model: str) -> None:
    """GiB read per decode step against context, one line per batch size, with the weights for scale;
    the right axis converts bytes to the time they take at `bandwidth_gbs`."""
    fig, ax = plt.subplots(figsize=(5, 3.8))
    for batch, values in kv_gib.items():
        ax.plot(contexts, values, ".-", label=f"K/V, batch {batch}")
    ax.axhline(weights_gib, color="black", ls="--", lw=0.8, label="the weights (read once per step)")
    ax.set(xscale="log", yscale="log", xlabel="context length (tokens per sequence)",
           ylabel="GiB read per decode step", title=f"{model}: what one decode step\nreads (fp16)")
    ax.set_xticks(list(contexts), [f"{c // 1024}K" if c >= 1024 else str(c) for c in contexts])
    right = ax.secondary_yaxis("right", functions=(lambda g: g * 2**30 / (bandwidth_gbs * 1e9) * 1e3,
                                                   lambda ms: ms * 1e-3 * bandwidth_gbs * 1e9 / 2**30))
    right.set_ylabel(f"ms at {bandwidth_gbs / 1000:g} TB/s")
    ax.legend(fontsize=11)
    fig.tight_layout()
    plt.show()


def draw_kernel_walk(tables: torch.Tensor, lengths: Sequence[int], num_blocks: int, block_size: int,
                     seq: int, tile: int, block_n: int) -> None:
    """Two figures (side by side where they fit): the pool as rows of slots, the slots program
    (seq, h) reads in one tile green; and the tile's positions, with its table lookups, those past the
    sequence's end (masked) red. A tile past the last one the kernel visits is drawn too, all red: it
    reads nothing."""
    fig, left = plt.subplots(figsize=(1.9 + 0.36 * block_size, 0.34 * num_blocks + 1.1))
    pitch = min(0.42, 4.2 / block_n)       # inches per position of the tile's strip
    tall = block_n > 8                     # rotated labels need room under the strip
    fig_tile, right = plt.subplots(figsize=(pitch * block_n + 0.6, 3.1 if tall else 1.9))
    n = lengths[seq]
    tiles = ceil_div(n, block_n)
    positions = range(tile * block_n, (tile + 1) * block_n)
    read = {(int(tables[seq, p // block_size]), p % block_size): p for p in positions if p < n}
    owner = {int(b): (s, i) for s, row in enumerate(tables.tolist()) for i, b in enumerate(row)
             if i < ceil_div(lengths[s], block_size)}
    colours = plt.get_cmap("tab10")

    def row_label(block: int) -> str:
        s, i = owner.get(block, (None, None))
        return f"block {block}" + (f" (seq {s}, logical {i})" if s is not None else "")

    def slot(block: int, offset: int):
        if (block, offset) in read:
            return "tab:green", str(read[(block, offset)])
        s, i = owner.get(block, (None, None))
        stored = s is not None and i * block_size + offset < lengths[s]
        return (*colours(s % 10)[:3], 0.35) if stored else "white", ""

    draw_slot_rows(left, num_blocks, block_size, row_label, slot)
    left.set_xlim(-1.9 / 0.36, block_size + 0.1)
    left.set_title("the pool (green: read by this tile,\nthe number is its position)", fontsize=11)
    fig.tight_layout()
    # The tile's positions: which logical block, which physical block, and the tail mask.
    for col, p in enumerate(positions):
        logical = p // block_size
        valid = p < n
        right.add_patch(plt.Rectangle((col, 0), 0.92, 0.8, facecolor="tab:green" if valid else "tab:red",
                                      alpha=0.8 if valid else 0.35, edgecolor="grey", lw=0.5))
        right.text(col + 0.46, 0.4, str(p), ha="center", va="center", fontsize=11,
                   rotation=0 if block_n <= 8 else 90)
        if p % block_size == 0 or col == 0:           # one table lookup per block the tile touches
            name = f"T[{logical}]={int(tables[seq, logical])}" if valid else f"T[{logical}]: -"
            right.text(col + 0.05, -0.25, name, fontsize=11, ha="left", va="top", rotation=-90 if block_n > 8 else 0)
    right.set_xlim(-0.2, block_n + 0.2)
    right.set_ylim(-3.2 if tall else -1.6, 1.2)
    right.axis("off")
    head = f"sequence {seq} ({n} keys, {tiles} tile{'s' if tiles != 1 else ''} of {block_n}), tile {tile}"
    body = (f"positions {positions.start}..{positions.stop - 1}; red = past the end, masked" if tile < tiles
            else "past the last tile: the kernel never runs it")
    right.set_title("\n".join(textwrap.wrap(head, 46) + textwrap.wrap(body, 46)), fontsize=11)
    fig_tile.tight_layout()
    plt.show()
