"""The chapters' interactive explorers: a static drawing first, then sliders that redraw it.

The controls redraw into an Output widget only when moved, so a run without a browser (the book
build, the grader) never renders into a widget; ipywidgets' interact() does, and can hang such runs.
"""
from __future__ import annotations

from typing import Callable


def control(name: str, spec):
    """An ipywidgets control for one argument: (min, max, value) is a slider, (options, value) a menu."""
    import ipywidgets as widgets
    label = name.replace("_", " ")
    if isinstance(spec[0], (list, tuple)):
        options, value = spec
        return widgets.Dropdown(options=list(options), value=value, description=label)
    low, high, value = spec
    return widgets.IntSlider(value=value, min=low, max=high, description=label)


def explorer(draw: Callable[..., None], **specs) -> None:
    """Call draw() once (the static view), then show controls that redraw draw(**values) when moved."""
    draw()
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        print("(ipywidgets is not installed: the static view above is all there is)")
        return
    controls = {name: control(name, spec) for name, spec in specs.items()}
    view = widgets.Output()

    def redraw(_change=None):
        with view:
            view.clear_output(wait=True)
            draw(**{name: c.value for name, c in controls.items()})

    for c in controls.values():
        c.observe(redraw, names="value")
    display(widgets.VBox([widgets.HTML("Move a control to redraw:"), *controls.values(), view]))
