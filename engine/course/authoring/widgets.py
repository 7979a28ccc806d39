"""The chapters' interactive explorers: every state precomputed, swapped in the browser without a kernel.

`explorer(draw, **specs)` calls `draw(**values)` once for every combination of its controls' values,
keeps what each call prints and the figures it draws (PNG), and shows one small HTML widget: the
controls, the printed text and the pictures of the current state. Moving a control only swaps in
another precomputed state with a few lines of JavaScript, so the explorer works the same in
JupyterLab, in the static book (no kernel), in nbconvert's HTML and offline; where scripts do not run
(an untrusted notebook) the default state's picture still shows. The output bundle also carries that
picture as image/png and the printed text as text/plain, for viewers that show no HTML.

A spec is `(min, max, value)` or `(min, max, value, step)` for an integer slider, `(options, value)`
for a menu. The product of the controls' sizes is capped at MAX_STATES (the explorer then raises and
says how many states each control gives): pick coarse steps or a menu of telling values.

With COURSE_EXPLORERS=static in the environment, only the default state is drawn (plain figure and
text, no widget): for runs that nobody looks at.

Pictures are drawn at DPI (twice the 72 px per inch they are shown at, so they stay sharp); each is
audited for text too small on a desktop and on a phone (engine/course/authoring/figures), and a state's
pictures sit side by side where they fit, one under the other on a phone. states_without_picture() names
the states that draw nothing while others draw: an explorer should show a picture at every position.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import html
import io
import itertools
import json
import os
from dataclasses import dataclass
from typing import Callable

MAX_STATES = 150  # pictures one explorer may precompute (each costs a draw: ~0.1-0.4 s, ~30 kB)
DPI = 144  # twice the inline backend's 72: each picture is shown at half its pixels, sharp on any screen
PIXELS_PER_PX = DPI // 72
STATIC_ENV = "COURSE_EXPLORERS"
MIME_HTML, MIME_PNG, MIME_TEXT = "text/html", "image/png", "text/plain"


@dataclass(frozen=True)
class Control:
    """One argument of draw(): its values, the default's index, and how the browser shows it."""
    name: str
    values: tuple
    default: int
    kind: str  # "slider" or "menu"

    @property
    def label(self) -> str:
        return self.name.replace("_", " ")


def control(name: str, spec) -> Control:
    """(min, max, value[, step]) is an integer slider, (options, value) a menu; anything else raises."""
    if isinstance(spec, (list, tuple)) and len(spec) == 2 and isinstance(spec[0], (list, tuple, range)):
        options, value = list(spec[0]), spec[1]
        if not options or value not in options:
            raise ValueError(f"explorer control {name!r}: the value {value!r} is not one of the options {options}")
        return Control(name, tuple(options), options.index(value), "menu")
    if isinstance(spec, (list, tuple)) and len(spec) in (3, 4) and all(isinstance(v, int) for v in spec):
        low, high, value, step = (*spec, 1) if len(spec) == 3 else spec
        values = tuple(range(low, high + 1, step)) if step > 0 else ()
        if value not in values:
            raise ValueError(f"explorer control {name!r}: the value {value} is not on the slider "
                             f"{low}..{high} in steps of {step}")
        return Control(name, values, values.index(value), "slider")
    raise ValueError(f"explorer control {name!r}: {spec!r} is neither (min, max, value[, step]) with integers "
                     "nor (options, value)")


def state_count(controls: list[Control]) -> int:
    count = 1
    for c in controls:
        count *= len(c.values)
    return count


def check_size(draw: Callable, controls: list[Control], limit: int = MAX_STATES) -> None:
    """Raise if the controls reach more than `limit` states, saying what each control contributes."""
    count = state_count(controls)
    if count > limit:
        sizes = " x ".join(f"{len(c.values)} ({c.name})" for c in controls)
        raise ValueError(
            f"explorer({getattr(draw, '__name__', 'draw')}): {sizes} = {count} states, more than the "
            f"{limit} an explorer precomputes. Give a slider a step, (min, max, value, step), or use a "
            f"menu of telling values, ([...], value), or drop a control.")


def render(draw: Callable, values: dict) -> tuple[str, list[bytes]]:
    """(what draw(**values) printed, PNG bytes of each figure it drew); nothing reaches the notebook."""
    import matplotlib.pyplot as plt

    before = set(plt.get_fignums())
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text), _no_show(plt):
            draw(**values)
    except Exception as error:
        for number in set(plt.get_fignums()) - before:
            plt.close(number)
        raise RuntimeError(f"explorer: {getattr(draw, '__name__', 'draw')}(**{values}) raised "
                           f"{type(error).__name__}: {error}") from error
    from engine.course.authoring.figures import audit, png_metadata

    images = []
    for number in sorted(set(plt.get_fignums()) - before):
        figure = plt.figure(number)
        audit(figure, f"explorer {getattr(draw, '__name__', 'draw')}{values}", px_per_inch=DPI / PIXELS_PER_PX)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", metadata=png_metadata(figure, DPI))
        plt.close(figure)
        images.append(buffer.getvalue())
    return text.getvalue(), images


@contextlib.contextmanager
def _no_show(plt):
    """plt.show() does nothing inside: the figures stay open for render() to save and close."""
    show = plt.show
    plt.show = lambda *args, **kwargs: None
    try:
        yield
    finally:
        plt.show = show


def precompute(draw: Callable, controls: list[Control]) -> dict:
    """Every state's text and pictures, deduplicated: the data the browser side reads."""
    texts: list[str] = []
    images: list[str] = []
    text_index: dict[str, int] = {}
    image_index: dict[str, int] = {}
    states = []
    for combination in itertools.product(*(c.values for c in controls)):
        text, pngs = render(draw, {c.name: v for c, v in zip(controls, combination)})
        if text not in text_index:
            text_index[text] = len(texts)
            texts.append(text)
        shown = []
        for png in pngs:
            encoded = base64.b64encode(png).decode("ascii")
            if encoded not in image_index:
                image_index[encoded] = len(images)
                images.append(encoded)
            shown.append(image_index[encoded])
        states.append([text_index[text], shown])
    widths = [png_width(base64.b64decode(image)) // PIXELS_PER_PX for image in images]
    return {"sizes": [len(c.values) for c in controls], "texts": texts, "images": images, "widths": widths,
            "states": states}


def png_width(png: bytes) -> int:
    """The width in pixels of a PNG, from its header."""
    return int.from_bytes(png[16:20], "big")


def states_without_picture(data: dict) -> list[int]:
    """The states that show no picture in an explorer whose other states show one ([] when all do, or
    when none does: an explorer of text only)."""
    empty = [index for index, (_, shown) in enumerate(data["states"]) if not shown]
    return empty if len(empty) < len(data["states"]) else []


def default_state(controls: list[Control]) -> int:
    """The flat index of the defaults (the last control varies fastest, as in itertools.product)."""
    index = 0
    for c in controls:
        index = index * len(c.values) + c.default
    return index


def _control_html(c: Control, position: int) -> str:
    label = html.escape(c.label)
    shown = html.escape(str(c.values[c.default]))
    if c.kind == "slider":
        widget = (f'<input type="range" min="0" max="{len(c.values) - 1}" step="1" value="{c.default}" '
                  f'data-control="{position}" aria-label="{label}">'
                  f'<output class="course-explorer-value">{shown}</output>')
    else:
        options = "".join(f'<option value="{i}"{" selected" if i == c.default else ""}>{html.escape(str(v))}</option>'
                          for i, v in enumerate(c.values))
        widget = f'<select data-control="{position}" aria-label="{label}">{options}</select>'
    return f'<label class="course-explorer-control"><span>{label}</span> {widget}</label>'


SCRIPT = """(function () {
  var me = document.currentScript;
  var root = (me && me.closest('.course-explorer')) || document.getElementById('%(id)s');
  if (!root || root.dataset.ready) return;
  var data = JSON.parse(root.querySelector('script.course-explorer-data').textContent);
  var inputs = Array.prototype.slice.call(root.querySelectorAll('[data-control]'));
  var text = root.querySelector('.course-explorer-text');
  var figures = root.querySelector('.course-explorer-figures');
  function update() {
    var index = 0;
    inputs.forEach(function (input, k) {
      var at = parseInt(input.value, 10);
      index = index * data.sizes[k] + at;
      var shown = input.parentNode.querySelector('output');
      if (shown) shown.textContent = data.values[k][at];
    });
    var state = data.states[index];
    text.textContent = data.texts[state[0]];
    text.style.display = data.texts[state[0]] ? '' : 'none';
    while (figures.children.length > state[1].length) figures.removeChild(figures.lastChild);
    state[1].forEach(function (image, k) {
      var img = figures.children[k];
      if (!img) { img = document.createElement('img'); figures.appendChild(img); }
      img.src = 'data:image/png;base64,' + data.images[image];
      img.width = data.widths[image];
    });
    root.dataset.state = index;
  }
  inputs.forEach(function (input) {
    input.addEventListener('input', update);
    input.addEventListener('change', update);
  });
  root.dataset.ready = '1';
  update();
})();"""

STYLE = (".course-explorer{border:1px solid #ccc;border-radius:4px;padding:.5em;margin:.5em 0}"
         ".course-explorer-controls{display:flex;flex-wrap:wrap;gap:.3em 1.5em;margin-bottom:.4em}"
         ".course-explorer-control{display:inline-flex;align-items:center;gap:.4em;font-size:90%}"
         ".course-explorer-value{min-width:2.5em;font-family:monospace}"
         ".course-explorer-text{margin:.2em 0;font-size:85%;white-space:pre-wrap}"
         ".course-explorer-figures{display:flex;flex-wrap:wrap;gap:.5em;align-items:flex-start}"
         ".course-explorer-figures img{max-width:100%;height:auto;display:block}"
         ".course-explorer-note{font-size:80%;color:#666}")


def explorer_html(draw: Callable, controls: list[Control], data: dict) -> str:
    """The widget: controls, the default state's text and pictures, the data and the script."""
    payload = json.dumps({**data, "values": [[str(v) for v in c.values] for c in controls]},
                         separators=(",", ":"))
    escaped = payload.replace("</", "<\\/")  # the JSON may not close its <script>
    widget_id = "course-explorer-" + hashlib.sha1(payload.encode()).hexdigest()[:12]
    text_at, shown = data["states"][default_state(controls)]
    text = data["texts"][text_at]
    images = "".join(f'<img src="data:image/png;base64,{data["images"][i]}" width="{data["widths"][i]}" '
                     f'alt="the explorer\'s picture">' for i in shown)
    controls_html = "".join(_control_html(c, k) for k, c in enumerate(controls))
    name = html.escape(getattr(draw, "__name__", "draw"))
    count = len(data["states"])
    return (f'<div class="course-explorer" id="{widget_id}" data-draw="{name}" data-states="{count}">'
            f"<style>{STYLE}</style>"
            f'<div class="course-explorer-controls">{controls_html}</div>'
            f'<pre class="course-explorer-text"{"" if text else " style=display:none"}>{html.escape(text)}</pre>'
            f'<div class="course-explorer-figures">{images}</div>'
            f'<div class="course-explorer-note">{count} precomputed states: moving a control swaps the '
            f"picture in your browser, no kernel needed.</div>"
            f'<script type="application/json" class="course-explorer-data">{escaped}</script>'
            f"<script>{SCRIPT % {'id': widget_id}}</script></div>")


def explorer(draw: Callable[..., None], **specs) -> None:
    """Show draw(**values) for every combination of the controls' values, switched in the browser.

    specs: name=(min, max, value[, step]) for an integer slider, name=([options], value) for a menu.
    """
    controls = [control(name, spec) for name, spec in specs.items()]
    check_size(draw, controls)
    if os.environ.get(STATIC_ENV, "") == "static":
        draw(**{c.name: c.values[c.default] for c in controls})
        return
    from IPython.display import display

    data = precompute(draw, controls)
    text_at, shown = data["states"][default_state(controls)]
    bundle = {MIME_HTML: explorer_html(draw, controls, data), MIME_TEXT: data["texts"][text_at] or "(explorer)"}
    metadata = {}
    if shown:
        bundle[MIME_PNG] = data["images"][shown[0]]
        metadata[MIME_PNG] = {"width": data["widths"][shown[0]]}
    display(bundle, metadata=metadata, raw=True)
