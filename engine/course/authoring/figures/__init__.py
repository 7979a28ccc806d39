"""Plotting helpers of the chapters: the figure code lives here, so a chapter page shows the call and the picture.

Every figure must read in the book on a desktop and on a phone: no text smaller than MIN_TEXT_PX once
the picture is scaled to fit the book's column at a 1,280 px window (BOOK_WIDTH_PX), nor smaller than
MIN_PHONE_TEXT_PX at a 390 px phone (PHONE_WIDTH_PX): small_text() lists what breaks that. So a
figure is about 5 inches wide at most, and a figure of two panels side by side is drawn as two
figures, which the page sets side by side where they fit and one under the other on a phone.
Importing this package sets the course's style (text of 12 pt, 72 px per inch: 1 pt of a figure is
1 CSS px at its natural size) and, in a notebook's kernel, shows figures at twice their pixels
("retina"), so they stay sharp on any screen. Every PNG carries the size of its smallest text in its
own pixels (TEXT_PX_KEY, a PNG text chunk), so a browser test can measure the text as shown. With
COURSE_FIGURE_AUDIT naming a file (the book's build sets it), every figure shown, inline or in an
explorer, appends its small texts there as one JSON line; tests/test_course_book.py reads them from
the executed chapters.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import matplotlib
import matplotlib.pyplot as plt

BOOK_WIDTH_PX = 670   # CSS px a picture gets in the book's column at a 1,280 px window (an explorer's)
MIN_TEXT_PX = 11      # the smallest text there, in CSS px (1 pt of a figure = 1 px at its natural size)
PHONE_WIDTH_PX = 340  # CSS px a picture gets at a 390 px phone (an explorer's; an output's is 358)
MIN_PHONE_TEXT_PX = 10
PAD_INCHES = 0.1      # savefig's pad around the tight bounding box
AUDIT_ENV = "COURSE_FIGURE_AUDIT"
TEXT_PX_KEY = "course-smallest-text-px"  # PNG text chunk: the smallest text's size in the PNG's pixels
STYLE = {"font.size": 12, "axes.titlesize": 12, "axes.labelsize": 12, "xtick.labelsize": 11,
         "ytick.labelsize": 11, "legend.fontsize": 11, "figure.titlesize": 12, "figure.dpi": 72}


def shown_width_px(fig, px_per_inch: float = 72) -> float:
    """The CSS width of the figure saved with bbox_inches="tight" and shown at `px_per_inch` (a retina
    picture is shown at fig.dpi px per inch, an explorer's at 72)."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return (box.width + 2 * PAD_INCHES) * px_per_inch


def texts(fig) -> list:
    """The visible, non-empty texts of fig."""
    return [text for text in fig.findobj(matplotlib.text.Text)
            if text.get_visible() and text.get_text().strip() and text.get_figure() is fig]


def small_text(fig, px_per_inch: float = 72,
               widths: tuple = ((BOOK_WIDTH_PX, MIN_TEXT_PX, "desktop"),
                                (PHONE_WIDTH_PX, MIN_PHONE_TEXT_PX, "phone"))) -> list[str]:
    """Each visible text of fig that shows smaller than its minimum once the figure, shown at
    `px_per_inch`, is scaled down to fit each (width px, minimum px, where) of `widths`:
    '"logical 0 → block 7" 11 pt shows at 6.1 px on a phone (under 10)'."""
    found = []
    for width_px, minimum, where in widths:
        scale = min(1.0, width_px / shown_width_px(fig, px_per_inch))
        for text in texts(fig):
            size = text.get_fontsize() * px_per_inch / 72 * scale
            if size < minimum - 1e-6:
                found.append(f"{text.get_text().strip()[:40]!r} {text.get_fontsize():g} pt shows at {size:.1f} px "
                             f"on a {where} (under {minimum})")
    return found


def png_metadata(fig, dpi: float) -> dict:
    """savefig's metadata for a PNG of fig at `dpi`: no Software stamp (the same figure gives the same
    bytes), and the size of its smallest text in the PNG's own pixels (TEXT_PX_KEY)."""
    sizes = [text.get_fontsize() for text in texts(fig)]
    smallest = min(sizes) * dpi / 72 if sizes else 0
    return {"Software": None, TEXT_PX_KEY: f"{smallest:.2f}"}


def smallest_text_px(png: bytes) -> float | None:
    """The TEXT_PX_KEY a course PNG carries (None if it has none): its smallest text, in its pixels."""
    at = 8
    while at + 8 <= len(png):
        length, kind = int.from_bytes(png[at:at + 4], "big"), png[at + 4:at + 8]
        if kind == b"tEXt":
            key, _, value = png[at + 8:at + 8 + length].partition(b"\0")
            if key.decode("latin-1") == TEXT_PX_KEY:
                return float(value)
        if kind == b"IEND":
            break
        at += 12 + length
    return None


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
    return retina_figure(fig, base64=True, bbox_inches="tight", metadata=png_metadata(fig, 2 * fig.dpi))


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
