"""Plotting helpers of the chapters: the figure code lives here, so a chapter page shows the call and the picture.

Every figure must read at the book's width: drawn at BOOK_WIDTH_PX or narrower, no text smaller than
MIN_TEXT_PX once the picture is scaled to fit (small_text() lists what breaks that). Importing this
package sets the course's style (text of 12 pt) and, in a notebook's kernel, shows figures at twice
their pixels ("retina"), so they stay sharp on any screen. With COURSE_FIGURE_AUDIT naming a file (the
book's build sets it), every figure shown, inline or in an explorer, appends its small texts there as
one JSON line; tests/test_course_book.py reads them from the executed chapters.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import matplotlib
import matplotlib.pyplot as plt

BOOK_WIDTH_PX = 670   # CSS px a picture gets in the book's column at a 1,280 px window (an explorer's)
MIN_TEXT_PX = 11      # the smallest text, in CSS px (1 pt of a figure = 1 px at its natural size)
PAD_INCHES = 0.1      # savefig's pad around the tight bounding box
AUDIT_ENV = "COURSE_FIGURE_AUDIT"
STYLE = {"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11,
         "ytick.labelsize": 11, "legend.fontsize": 11, "figure.titlesize": 12}


def shown_width_px(fig, px_per_inch: float = 72) -> float:
    """The CSS width of the figure saved with bbox_inches="tight" and shown at `px_per_inch` (a retina
    picture is shown at fig.dpi px per inch, an explorer's at 72)."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return (box.width + 2 * PAD_INCHES) * px_per_inch


def small_text(fig, px_per_inch: float = 72, width_px: float = BOOK_WIDTH_PX,
               minimum: float = MIN_TEXT_PX) -> list[str]:
    """Each visible text of fig that shows smaller than `minimum` CSS px once the figure, shown at
    `px_per_inch`, is scaled down to fit `width_px`: '"logical 0 → block 7" 8 pt shows at 6.1 px'."""
    scale = min(1.0, width_px / shown_width_px(fig, px_per_inch))
    found = []
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_visible() and text.get_text().strip() and text.get_figure() is fig:
            size = text.get_fontsize() * px_per_inch / 72 * scale
            if size < minimum - 1e-6:
                found.append(f"{text.get_text().strip()[:40]!r} {text.get_fontsize():g} pt shows at {size:.1f} px")
    return found


def audit(fig, where: str, px_per_inch: float = 72) -> None:
    """Append fig's small texts to the file $COURSE_FIGURE_AUDIT names (nothing when it is unset)."""
    path = os.environ.get(AUDIT_ENV)
    if not path:
        return
    title = next((t.get_text() for ax in fig.axes for t in (ax.title, ax._left_title) if t.get_text()), "")
    record = {"where": where, "figure": (getattr(fig._suptitle, "get_text", lambda: "")() or title)[:60],
              "width_px": round(shown_width_px(fig, px_per_inch)), "small": small_text(fig, px_per_inch)}
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def _retina_png(fig):
    """IPython's PNG of a figure: twice the pixels, shown at the natural size, audited first."""
    from IPython.core.pylabtools import retina_figure

    audit(fig, "inline", px_per_inch=fig.dpi)
    return retina_figure(fig, base64=True, bbox_inches="tight")


def _use_course_style() -> None:
    """The course's text sizes; inside a notebook's kernel with the inline backend, retina figures."""
    matplotlib.rcParams.update(STYLE)
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None or "inline" not in str(matplotlib.rcParams["backend"]):
        return
    import matplotlib_inline.backend_inline  # noqa: F401  (configures the inline backend now, not later)
    from matplotlib.figure import Figure

    shell.display_formatter.formatters["image/png"].for_type(Figure, _retina_png)


_use_course_style()


def draw_slot_rows(ax, num_blocks: int, block_size: int, row_label: Callable[[int], str],
                   slot: Callable[[int, int], tuple[Any, str]]) -> None:
    """A pool as one row of `block_size` slots per physical block, block 0 on top: `row_label(block)` left
    of its row, and `slot(block, offset)` gives each slot's face colour and the text in it ("" for none)."""
    for block in range(num_blocks):
        y = -block
        ax.text(-0.3, y + 0.4, row_label(block), ha="right", va="center", fontsize=11)
        for offset in range(block_size):
            face, text = slot(block, offset)
            ax.add_patch(plt.Rectangle((offset, y), 0.92, 0.8, facecolor=face, edgecolor="grey", lw=0.5))
            if text:
                ax.text(offset + 0.46, y + 0.4, text, ha="center", va="center", fontsize=11, color="white")
    ax.set_ylim(-num_blocks + 0.6, 1.1)
    ax.axis("off")
