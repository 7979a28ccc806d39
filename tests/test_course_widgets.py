"""engine/course/authoring/widgets.py without a browser: controls, the state cap, precomputed states, the HTML.

(The browser tests move the controls: tests/test_course_browser.py in the book, test_lab_notebooks.py
in JupyterLab.)
"""
import base64
import json
import re

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from engine.course.authoring import widgets  # noqa: E402


def draw(length=3, shape="bar"):
    print(f"length {length}, {shape}")
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.bar(range(length), range(length)) if shape == "bar" else ax.plot(range(length))
    plt.show()


def test_controls_are_sliders_with_steps_or_menus():
    assert widgets.control("n", (1, 9, 5, 2)).values == (1, 3, 5, 7, 9)
    assert widgets.control("n", (0, 3, 1)).default == 1
    menu = widgets.control("bs", ([4, 8, 16], 8))
    assert (menu.kind, menu.values, menu.default) == ("menu", (4, 8, 16), 1)
    with pytest.raises(ValueError, match="not on the slider"):
        widgets.control("n", (1, 9, 4, 2))
    with pytest.raises(ValueError, match="not one of the options"):
        widgets.control("bs", ([4, 8], 16))


def test_too_many_states_is_an_error_that_says_what_each_control_gives():
    with pytest.raises(ValueError, match=r"40 \(length\) x 5 \(shape\) = 200 states, more than the 150"):
        widgets.check_size(draw, [widgets.control("length", (1, 40, 3)),
                                  widgets.control("shape", (["a", "b", "c", "d", "e"], "a"))])


def test_every_state_is_precomputed_with_its_text_and_picture_and_nothing_leaks():
    controls = [widgets.control("length", (2, 4, 3)), widgets.control("shape", (["bar", "line"], "bar"))]
    data = widgets.precompute(draw, controls)
    assert data["sizes"] == [3, 2] and len(data["states"]) == 6
    assert [data["texts"][t] for t, _ in data["states"]] == [
        f"length {n}, {s}\n" for n in (2, 3, 4) for s in ("bar", "line")]
    assert len({tuple(images) for _, images in data["states"]}) == 6
    assert plt.get_fignums() == []  # every figure saved and closed: none reaches the notebook
    text_at, shown = data["states"][widgets.default_state(controls)]
    assert data["texts"][text_at] == "length 3, bar\n" and len(shown) == 1


def test_the_html_holds_the_controls_the_default_view_and_every_state():
    controls = [widgets.control("length", (2, 4, 3)), widgets.control("shape", (["bar", "line"], "bar"))]
    data = widgets.precompute(draw, controls)
    page = widgets.explorer_html(draw, controls, data)
    assert 'type="range" min="0" max="2" step="1" value="1"' in page and "<select" in page
    assert "length 3, bar" in page and page.count("<img ") == 1
    payload = json.loads(re.search(r'class="course-explorer-data">(.*?)</script>', page).group(1))
    assert payload["values"] == [["2", "3", "4"], ["bar", "line"]] and len(payload["states"]) == 6
    assert page == widgets.explorer_html(draw, controls, widgets.precompute(draw, controls))  # deterministic


def test_a_failing_state_names_its_values():
    def broken(n=1):
        if n == 2:
            raise KeyError("boom")

    with pytest.raises(RuntimeError, match=r"broken\(\*\*\{'n': 2\}\) raised KeyError"):
        widgets.precompute(broken, [widgets.control("n", (1, 3, 1))])


def test_static_mode_draws_only_the_default(monkeypatch, capsys):
    monkeypatch.setenv(widgets.STATIC_ENV, "static")
    widgets.explorer(draw, length=(2, 4, 3), shape=(["bar", "line"], "line"))
    assert capsys.readouterr().out == "length 3, line\n"
    plt.close("all")


def test_pictures_are_drawn_at_twice_the_pixels_they_are_shown_at():
    controls = [widgets.control("length", (2, 4, 3))]
    data = widgets.precompute(draw, controls)
    for image, width in zip(data["images"], data["widths"]):
        assert widgets.png_width(base64.b64decode(image)) == 2 * width
    assert 100 < data["widths"][0] < 300  # a 2-inch figure, cropped tight, shown at 72 px per inch
    page = widgets.explorer_html(draw, controls, data)
    assert f'width="{data["widths"][data["states"][1][1][0]]}"' in page and "img.width = data.widths" in page


def test_states_without_a_picture_are_named_unless_the_explorer_draws_none():
    def sometimes(n=1):
        print(f"n {n}")
        if n != 2:
            draw(length=n)

    data = widgets.precompute(sometimes, [widgets.control("n", (1, 3, 1))])
    assert widgets.states_without_picture(data) == [1]
    text_only = widgets.precompute(lambda n=1: print(n), [widgets.control("n", (1, 3, 1))])
    assert widgets.states_without_picture(text_only) == []


def test_small_text_lists_what_shows_too_small_on_a_desktop_and_on_a_phone():
    from engine.course.authoring import figures

    fig, ax = plt.subplots(figsize=(4, 2))
    ax.set_title("readable", fontsize=12)
    ax.text(0.5, 0.5, "tiny", fontsize=7)
    ax.axis("off")
    assert [line.split(" pt")[0] for line in figures.small_text(fig)] == ["'tiny' 7", "'tiny' 7"]
    wide, axes = plt.subplots(figsize=(7, 2))  # ~500 px: whole on a desktop, 340/500 of it on a phone
    axes.set_title("readable", fontsize=12)
    assert [line.split(" px ")[1] for line in figures.small_text(wide) if line.startswith("'readable'")] == \
        ["on a phone (under 10)"]
    plt.close(wide)
    fig.set_size_inches(20, 2)  # 1,440 px wide: scaled to the book's 670 px, 12 pt shows at ~5.6 px
    assert any(line.startswith("'readable' 12 pt shows at") and "desktop" in line for line in figures.small_text(fig))
    plt.close(fig)


def test_a_course_png_carries_its_smallest_text():
    from engine.course.authoring import figures

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_title("eleven", fontsize=11)
    ax.axis("off")
    buffer = __import__("io").BytesIO()
    fig.savefig(buffer, format="png", dpi=144, metadata=figures.png_metadata(fig, 144))
    plt.close(fig)
    assert figures.smallest_text_px(buffer.getvalue()) == 22.0   # 11 pt at 144 dpi
    assert figures.smallest_text_px(b"\x89PNG\r\n\x1a\n") is None


def test_the_prefix_tree_explorer_shows_every_state_it_names():
    """Chapter 5's walk: a step that leaves the cache empty (the start, the last eviction) says so in
    its picture, and every step prints the free blocks it has (the picture matches the state)."""
    from engine.course.authoring.figures import ch05

    walk = ch05.prefix_tree_walk()
    for step in (0, len(walk) - 1):
        assert not walk[step].nodes
        text, pngs = widgets.render(lambda: ch05.draw_prefix_tree(walk[step], step), {})
        assert len(pngs) == 1 and f"free blocks: {walk[step].free_blocks}" in text
    last = walk[-1]
    assert last.free_blocks == 14 and "(sys-1, sys-2)" in last.event, last.event
    with widgets._no_show(plt):
        ch05.draw_prefix_tree(last, len(walk) - 1)
    figure = plt.gcf()
    said = [t.get_text() for t in figure.findobj(plt.Text)]
    plt.close(figure)
    assert any("no cached blocks" in t and "all 14 blocks" in t for t in said), said
