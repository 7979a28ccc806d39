"""The built book in a real browser with the network cut: math, figures, explorers, search, the PDF.

Headless Chromium (the system's, driven by Playwright's Python package) opens each chapter page of the
learner edition from disk, as a reader does, with every non-local request refused: each formula must be
typeset by the book's own MathJax, each figure decoded, and moving an explorer's control must swap its
picture with no kernel behind the page. At a 1,280 px window no code or output box scrolls sideways
and 88 columns of code fit a code box. At 390 px (a phone) no page scrolls sideways, every figure's
text shows at 10 px or more (its size in the PNG times the width the browser gives it), wrapped code
hangs, every displayed formula is whole in its column and in no box that scrolls, and one search box
shows; at 1,280 px figure text is 11 px or more. Search must find every
chapter, and served over HTTP its summaries show no TeX. `make book-pdf`'s PDF numbers every page,
gives in its contents the page each chapter's heading is on (its outline's page), has an outline
naming every chapter, cuts no box and no formula at the margin (measured in print layout, as
book.print_pdf lays it out) and leaves no empty box behind a split one (pdftoppm's pages searched for
a tall empty grey frame).
Screenshots go to build/artifacts/. Without Chromium these tests
skip with a one-line hint; in CI (CI=true) they fail instead (tests/fixtures/browser_support.py).
"""
import html
import re
import subprocess

import nbformat
import pytest

from engine.course.authoring import book as course_book
from engine.course.paths import chapter_files
from fixtures.browser_support import chromium, need_tool, offline_context
from fixtures.course_support import REPO, build_lock, built_book, solutions_dir

pytestmark = [pytest.mark.browser, pytest.mark.slow]
ARTIFACTS = REPO / "build" / "artifacts"
CHAPTERS = chapter_files(solutions_dir())
VIEWPORT = {"width": 1280, "height": 1400}

PAGE_JS = """() => {
  const outside = el => !el.closest('.course-explorer');
  const math = Array.from(document.querySelectorAll('.math'));
  return {
    heading: (document.querySelector('main h1') || {}).textContent || '',
    figures: Array.from(document.querySelectorAll('.cell_output img')).filter(outside).map(
        img => ({src: img.getAttribute('src'), width: img.naturalWidth, complete: img.complete})),
    math: math.length,
    untypeset: math.filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 60)),
    errors: document.querySelectorAll('mjx-merror').length,
    mathWidth: math.length ? math[0].getBoundingClientRect().width : 0,
    explorers: document.querySelectorAll('.course-explorer').length,
    ready: document.querySelectorAll('.course-explorer[data-ready="1"]').length,
  };
}"""
BOXES_JS = """() => {
  const boxes = Array.from(document.querySelectorAll('main pre')).filter(el => el.offsetWidth > 0);
  const code = boxes.find(el => el.closest('.cell_input'));
  let room = 0, columns = 0;
  if (code) {
    const probe = document.createElement('span');
    probe.textContent = 'x'.repeat(88);
    code.appendChild(probe);
    columns = probe.getBoundingClientRect().width;
    probe.remove();
    const style = getComputedStyle(code);
    room = code.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  }
  return {boxes: boxes.length, room: room, columns88: columns,
          scrolling: boxes.filter(el => el.scrollWidth > el.clientWidth + 1).map(
              el => el.textContent.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), '').slice(0, 80))};
}"""
EXPLORER_JS = """el => ({
  state: el.dataset.state,
  pictures: Array.from(el.querySelectorAll('.course-explorer-figures img')).map(img => img.src),
  decoded: Array.from(el.querySelectorAll('.course-explorer-figures img')).every(
      img => img.complete && img.naturalWidth > 0),
  text: el.querySelector('.course-explorer-text').textContent,
})"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:  # skips (fails in CI) before the book is built if there is no Chromium
        yield browser


@pytest.fixture(scope="module")
def book(browser):
    return built_book()


@pytest.fixture
def offline(browser):
    context = offline_context(browser, viewport=VIEWPORT)
    yield context
    context.close()


def executed_notebook(book, chapter):
    return nbformat.read(book["executed"] / f"{chapter.stem}.ipynb", as_version=4)


def static_figures(notebook) -> int:
    """Figures the learner page shows outside its explorers (the learner edition drops the answers' outputs)."""
    return sum("image/png" in o.get("data", {}) and 'class="course-explorer"' not in o["data"].get("text/html", "")
               for cell in course_book.learner_edition(notebook).cells for o in cell.get("outputs", []))


def has_math(notebook) -> bool:
    return any(cell.cell_type == "markdown" and re.search(r"\$[^$\s][^$]*\$", cell.source) for cell in notebook.cells)


def move_controls(explorer) -> list[str]:
    """Move each control of one explorer through its values; return the controls whose moves changed the
    picture (each move must change the state the widget shows)."""
    changed = []
    controls = explorer.locator("[data-control]")
    for k in range(controls.count()):
        control = controls.nth(k)
        before = explorer.evaluate(EXPLORER_JS)
        is_slider = control.evaluate("el => el.tagName") == "INPUT"
        size = int(control.get_attribute("max")) + 1 if is_slider else control.locator("option").count()
        start = int(control.input_value())
        for value in [v for v in range(size) if v != start]:
            if is_slider:
                control.fill(str(value))
            else:
                control.select_option(index=value)
            after = explorer.evaluate(EXPLORER_JS)
            assert after["state"] != before["state"], f"control {k} moved to {value}: the widget did not update"
            assert after["decoded"], f"control {k} at {value}: a picture did not decode"
            if after["pictures"] != before["pictures"]:
                changed.append(control.get_attribute("aria-label"))
                break
        if is_slider:
            control.fill(str(start))
        else:
            control.select_option(index=start)
    return changed


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_chapter_page_offline_math_figures_and_explorers(book, offline, chapter):
    executed = executed_notebook(book, chapter)
    page = offline.new_page()
    page.goto((book["learner"] / "chapters" / f"{chapter.stem}.html").as_uri(), wait_until="load")
    course_book.wait_for_math(page)
    found = page.evaluate(PAGE_JS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"book-{chapter.stem}.png"))

    assert found["heading"].strip(), f"{chapter.stem}: the page has no title heading"
    assert len(found["figures"]) == static_figures(executed), f"{chapter.stem}: {found['figures']}"
    broken = [f["src"] for f in found["figures"] if not (f["complete"] and f["width"] > 0)]
    assert not broken, f"{chapter.stem}: figures that did not load: {broken}"
    if has_math(executed):
        assert found["math"] > 0, f"{chapter.stem}: the chapter has math, the page has none"
    assert not found["untypeset"], f"{chapter.stem}: formulas left as TeX: {found['untypeset'][:3]}"
    assert found["errors"] == 0 and (found["math"] == 0 or found["mathWidth"] > 0)

    boxes = page.evaluate(BOXES_JS)
    assert boxes["boxes"] > 0 and not boxes["scrolling"], \
        f"{chapter.stem}: {len(boxes['scrolling'])} of {boxes['boxes']} boxes scroll sideways: {boxes['scrolling'][:3]}"
    assert 0 < boxes["columns88"] <= boxes["room"], f"{chapter.stem}: 88 columns of code do not fit a code box: {boxes}"

    assert found["ready"] == found["explorers"], f"{chapter.stem}: {found} (an explorer's script did not run)"
    for k in range(found["explorers"]):
        explorer = page.locator(".course-explorer").nth(k)
        explorer.scroll_into_view_if_needed()
        changed = move_controls(explorer)
        assert changed, f"{chapter.stem}: explorer {k}: no control changes the picture"
        explorer.locator("[data-control]").first.evaluate(
            "el => { el.value = el.tagName === 'INPUT' ? el.max : el.options.length - 1;"
            " el.dispatchEvent(new Event('input')); }")
        explorer.screenshot(path=str(ARTIFACTS / f"book-{chapter.stem}-explorer{k}.png"))
    assert not offline.refused, f"{chapter.stem}: the page reached for the network: {offline.refused[:5]}"


def test_search_finds_every_chapter_offline(book, offline):
    page = offline.new_page()
    for chapter in CHAPTERS:
        title = executed_notebook(book, chapter).cells[0].source.splitlines()[0]
        word = max(re.findall(r"[A-Za-z]{5,}", title), key=len).lower()
        page.goto((book["learner"] / "search.html").as_uri() + f"?q={word}", wait_until="load")
        page.wait_for_selector("#search-results li a", timeout=30_000)
        hrefs = [a.get_attribute("href") for a in page.locator("#search-results li > a").all()]
        assert any(f"chapters/{chapter.stem}.html" in href for href in hrefs), f"search {word!r}: {hrefs}"
    page.screenshot(path=str(ARTIFACTS / "book-search.png"))
    assert not offline.refused, f"search reached for the network: {offline.refused[:5]}"


@pytest.fixture(scope="module")
def book_pdf(book):
    """make book-pdf's PDF of the shared book build (printed once per build, reused while unchanged)."""
    pdf = book["executed"].parent / "pdf" / "book.pdf"
    with build_lock("book-pdf"):
        if not pdf.exists():
            executed = {c.stem: executed_notebook(book, c) for c in CHAPTERS}
            course_book.build_pdf(executed, pdf, stage_dir=pdf.parent / "stage")
    return pdf


def empty_frames(png_path, min_rows: int) -> int:
    """The tallest run of rows of a page that are box background (light grey over half the width) and hold
    no text: what a box moved to the next page leaves behind. 0 when there is none as tall as min_rows."""
    import numpy
    from PIL import Image

    page = numpy.asarray(Image.open(png_path).convert("L")).astype(int)
    grey = ((page >= 236) & (page <= 250)).sum(axis=1) > 0.5 * page.shape[1]
    ink = (page < 160).sum(axis=1) > 3
    run = best = 0
    for is_grey, has_ink in zip(grey, ink):
        run = run + 1 if is_grey and not has_ink else 0
        best = max(best, run)
    return best if best >= min_rows else 0


PRINT_JS = """() => Array.from(document.querySelectorAll('pre')).filter(el => el.offsetWidth > 0).map(
    el => el.scrollWidth > el.clientWidth + 1)"""


def test_the_book_pdf_numbers_every_page_has_an_outline_and_cuts_no_box(browser, book, book_pdf, tmp_path):
    pdftoppm, pdftotext = need_tool("pdftoppm", "poppler-utils"), need_tool("pdftotext", "poppler-utils")
    pdftohtml = need_tool("pdftohtml", "poppler-utils")
    info = subprocess.run([need_tool("pdfinfo", "poppler-utils"), str(book_pdf)], capture_output=True, text=True,
                          check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    text = subprocess.run([pdftotext, "-layout", str(book_pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    numbered = [n for n, page in enumerate(text.split("\f")[:pages], start=1) if f"{n} / {pages}" in page]
    assert len(numbered) == pages, f"{pages - len(numbered)} of {pages} pages have no page number"
    outline = subprocess.run([pdftohtml, "-xml", "-i", "-q", "-stdout", str(book_pdf)], capture_output=True,
                             text=True, check=True).stdout
    items = [html.unescape(item) for item in re.findall(r"<item[^>]*>(.*?)</item>", outline)]
    for chapter in CHAPTERS:
        title = executed_notebook(book, chapter).cells[0].source.splitlines()[0].lstrip("# ").strip()
        assert any(title[:30] in item for item in items), f"the PDF's outline lacks {title!r}: {items[:10]}"
    subprocess.run([pdftoppm, "-png", "-r", "30", str(book_pdf), str(tmp_path / "p")], check=True)
    frames = {png.stem: rows for png in sorted(tmp_path.glob("p-*.png")) if (rows := empty_frames(png, 30))}
    assert not frames, f"pages with an empty box of 25 mm or more (rows at 30 dpi): {frames}"
    single = book_pdf.parent / "stage-singlehtml" / "intro.html"
    # laid out as book.print_pdf lays it out: print media, as wide as A4 less the margins
    context = browser.new_context(viewport={"width": course_book.PRINT_COLUMN_PX, "height": 1000})
    try:
        page = context.new_page()
        page.emulate_media(media="print")
        page.goto(single.as_uri(), wait_until="load")
        course_book.wait_for_math(page)
        cut, formulas = page.evaluate(PRINT_JS), page.evaluate(CUT_MATH_JS)
    finally:
        context.close()
    assert cut and not any(cut), f"{sum(cut)} of {len(cut)} boxes are cut at the margin in print"
    assert not formulas, f"{len(formulas)} formulas are not whole in print: {formulas[:3]}"


def test_the_book_pdf_has_every_chapter_with_typeset_math(book, book_pdf, tmp_path):
    pdftoppm, pdftotext = need_tool("pdftoppm", "poppler-utils"), need_tool("pdftotext", "poppler-utils")
    info = subprocess.run([need_tool("pdfinfo", "poppler-utils"), str(book_pdf)], capture_output=True, text=True,
                          check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    text = subprocess.run([pdftotext, "-layout", str(book_pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    for chapter in CHAPTERS:
        title = executed_notebook(book, chapter).cells[0].source.splitlines()[0].lstrip("# ").strip()
        assert " ".join(title.split()[:4]) in " ".join(text.split()), f"{chapter.stem}'s title is not in the PDF"
    assert pages >= 2 * len(CHAPTERS), f"{pages} pages for {len(CHAPTERS)} chapters"
    assert "\\frac" not in text and "$$" not in text, "the PDF shows raw TeX"
    from PIL import Image

    for number in sorted({1, pages // 2, pages}):
        subprocess.run([pdftoppm, "-png", "-r", "60", "-f", str(number), "-l", str(number), str(book_pdf),
                        str(tmp_path / "page")], check=True)
        [png] = sorted(tmp_path.glob("page*.png"))
        image = Image.open(png).convert("L")
        low, high = image.getextrema()
        assert image.width > 400 and high - low > 100, f"PDF page {number} renders blank"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        png.rename(ARTIFACTS / f"book-pdf-page{number}.png")


# ---- on a phone: every page at 390 px ------------------------------------------------------------------

# Every displayed formula that is not whole in its column: wider than its box (cut or shrunk past it),
# past the column's edge, or in a box that scrolls sideways (itself or any box around it).
CUT_MATH_JS = """() => {
  const main = document.querySelector('main') || document.body, column = main.getBoundingClientRect();
  const scrolls = el => { const x = getComputedStyle(el).overflowX;
    return (x === 'auto' || x === 'scroll') && el.scrollWidth > el.clientWidth + 1; };
  return Array.from(main.querySelectorAll('mjx-container[display="true"]')).map(formula => {
    const math = formula.querySelector('mjx-math').getBoundingClientRect(), box = formula.closest('div.math');
    let scrolling = formula.scrollWidth > formula.clientWidth + 1;
    for (let el = formula.parentElement; el && el !== document.body; el = el.parentElement) scrolling ||= scrolls(el);
    return {tex: ((box && box.dataset.courseTex) || formula.textContent).trim().slice(0, 50),
            over: Math.round(Math.max(math.width - formula.clientWidth, math.right - column.right,
                                      column.left - math.left)), scrolling};
  }).filter(f => f.over > 1 || f.scrolling);
}"""
PHONE = {"width": 390, "height": 844}
PHONE_PAGES = ["intro.html", *[f"chapters/{c.stem}.html" for c in CHAPTERS], "course_guide.html"]
PHONE_JS = """() => {
  const visible = el => { const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden' && r.right > 0
      && r.left < window.innerWidth; };
  const main = document.querySelector('main') || document.body;
  const scrolls = Array.from(main.querySelectorAll('*')).filter(el => !el.closest('mjx-container')).filter(el => {
    const x = getComputedStyle(el).overflowX;
    return (x === 'auto' || x === 'scroll') && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0;
  }).map(el => el.tagName.toLowerCase() + '.' + (el.className.baseVal ?? el.className) + ': '
                + el.textContent.trim().slice(0, 50));
  const figures = Array.from(main.querySelectorAll('.cell_output img')).filter(img => !img.closest('.course-explorer'))
    .map(img => ({src: img.getAttribute('src'), shown: img.getBoundingClientRect().width, pixels: img.naturalWidth}));
  const explorers = Array.from(main.querySelectorAll('.course-explorer')).map(el => {
    const data = JSON.parse(el.querySelector('script.course-explorer-data').textContent);
    return {room: el.querySelector('.course-explorer-figures').clientWidth, widths: data.widths, images: data.images};
  });
  const searches = Array.from(document.querySelectorAll('.search-button__button, .bd-search'))
    .filter(el => !el.parentElement.closest('.search-button__button, .bd-search')).filter(visible).length;
  const lines = Array.from(main.querySelectorAll('pre')).filter(pre => !pre.closest('.course-explorer'))
    .map(pre => pre.querySelectorAll(':scope > .course-line').length > 0 || !pre.textContent.trim());
  const hanging = [];
  for (const line of Array.from(main.querySelectorAll('pre .course-line')).slice(0, 400)) {
    const range = document.createRange();
    range.selectNodeContents(line);
    const rects = Array.from(range.getClientRects()).filter(r => r.width > 0);
    const tops = [...new Set(rects.map(r => Math.round(r.top)))];
    if (tops.length < 2) continue;
    const box = line.getBoundingClientRect(), pad = parseFloat(getComputedStyle(line).paddingLeft);
    const starts = tops.slice(1).map(top => Math.min(...rects.filter(r => Math.round(r.top) === top).map(r => r.left)));
    hanging.push({text: line.textContent.slice(0, 60), indent: parseInt(line.style.getPropertyValue('--indent')),
                  pad: pad, ch: parseFloat(getComputedStyle(line).fontSize) * 0.6, half: box.width / 2,
                  continuation: Math.min(...starts) - box.left});
    if (hanging.length >= 20) break;
  }
  return {scrollWidth: document.documentElement.scrollWidth, viewport: window.innerWidth, scrolls, figures,
          explorers, searches, lines, hanging};
}"""


LONG_FORMULAS_JS = r"""async () => {
  const boxes = Array.from(document.querySelectorAll('main div.math')).slice(0, 2);
  const parts = n => Array.from({length: n}, (_, k) => `a_{${k}} + b_{${k}} = c_{${k}}`);
  const tex = [parts(4).join(', \\qquad '),                             // breaks at its \qquad's
               parts(12).join(' + ').replace(/=/g, '+')];               // nowhere to break
  boxes.forEach((box, k) => { MathJax.typesetClear([box]); delete box.dataset.courseTex;
                              box.textContent = `\\[${tex[k]}\\]`; });
  await MathJax.typesetPromise(boxes);
  window.dispatchEvent(new Event('resize'));
  await window.courseMathReady;
  return boxes.map(box => box.dataset.courseBroken === '1');
}"""


def test_a_formula_too_wide_for_a_phone_is_broken_at_its_qquads_and_one_that_cannot_be_is_caught(book, browser):
    """At 390 px, a displayed formula three columns wide with \\qquad's between its parts is set as
    one part a line and is whole (book/_static/course.js); one with nowhere to break is shrunk to
    70% of the text and still too wide, and the phone check (CUT_MATH_JS) names it."""
    context = offline_context(browser, viewport=PHONE)
    try:
        page = context.new_page()
        page.goto((book["learner"] / "chapters" / f"{CHAPTERS[0].stem}.html").as_uri(), wait_until="load")
        course_book.wait_for_math(page)
        assert not page.evaluate(CUT_MATH_JS), "the page's own formulas are not whole at 390 px"
        broken = page.evaluate(LONG_FORMULAS_JS)
        cut = page.evaluate(CUT_MATH_JS)
    finally:
        context.close()
    assert broken == [True, False], broken
    assert [f["tex"][:8] for f in cut] == ["a_{0} + "] and cut[0]["over"] > 100, cut


def png_text_px(png: bytes) -> float:
    """The smallest text of a course figure, in its own pixels (engine/course/authoring/figures: TEXT_PX_KEY)."""
    from engine.course.authoring.figures import smallest_text_px
    size = smallest_text_px(png)
    assert size, "a figure without the size of its smallest text (not drawn through engine/course/authoring/figures)"
    return size


def shown_text(found: dict, page_dir) -> list[tuple[str, float]]:
    """(which figure, the px its smallest text shows at) for every figure of a page: a static figure
    as the browser laid it out, every state of every explorer at the width its box gives it."""
    import base64

    from engine.course.authoring.widgets import png_width
    shown = []
    for figure in found["figures"]:
        png = (page_dir / figure["src"]).read_bytes()
        shown.append((figure["src"].rsplit("/", 1)[-1][:12], png_text_px(png) * figure["shown"] / figure["pixels"]))
    for k, explorer in enumerate(found["explorers"]):
        for i, (image, width) in enumerate(zip(explorer["images"], explorer["widths"])):
            png = base64.b64decode(image)
            shown.append((f"explorer {k} picture {i}",
                          png_text_px(png) * min(width, explorer["room"]) / png_width(png)))
    return shown


def test_every_page_reads_on_a_phone_and_on_a_desktop(browser, book):
    """At 390 px: no page scrolls sideways (nor any box in it: a table, code), every displayed formula
    is whole in its column and in no box that scrolls (set smaller or broken into lines by
    book/_static/course.js), every
    figure's smallest text shows at 10 px or more (measured: the text's size in the PNG times the
    width the browser gives the picture over its pixels; an explorer's every state), wrapped code
    lines hang four columns right of their indentation (at most half the box), and one search box
    shows. At 1,280 px the
    same figures show their text at 11 px or more, and one search box shows."""
    problems = []
    for viewport, least in ((PHONE, 10), (VIEWPORT, 11)):
        context = offline_context(browser, viewport=viewport)
        try:
            page = context.new_page()
            for name in PHONE_PAGES:
                path = book["learner"] / name
                page.goto(path.as_uri(), wait_until="load")
                course_book.wait_for_math(page)
                found = page.evaluate(PHONE_JS)
                where = f"{name} at {viewport['width']} px"
                if viewport is PHONE:
                    ARTIFACTS.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(ARTIFACTS / f"phone-{path.stem}.png"))
                    if found["scrollWidth"] > found["viewport"]:
                        problems.append(f"{where}: the page is {found['scrollWidth']} px wide")
                    problems += [f"{where}: scrolls sideways: {box}" for box in found["scrolls"][:3]]
                    problems += [f"{where}: a wrapped line does not hang: {line}" for line in found["hanging"]
                                 if line["continuation"] < min((line["indent"] + 4) * line["ch"], line["half"]) - 1.5]
                    if not all(found["lines"]):
                        problems.append(f"{where}: {found['lines'].count(False)} code boxes without line spans")
                problems += [f"{where}: a formula is not whole ({f['over']} px past its column"
                             f"{', in a box that scrolls' if f['scrolling'] else ''}): {f['tex']!r}"
                             for f in page.evaluate(CUT_MATH_JS)]
                small = [(which, round(px, 1)) for which, px in shown_text(found, path.parent) if px < least - 0.05]
                problems += [f"{where}: figure text shows at {px} px (under {least}): {which}"
                             for which, px in small[:3]]
                if found["searches"] != 1:
                    problems.append(f"{where}: {found['searches']} search boxes show")
            assert not context.refused, f"the pages reached for the network: {context.refused[:5]}"
        finally:
            context.close()
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])


def test_search_summaries_are_plain_text(book, offline):
    """Served over HTTP (the search page fetches each page it found for its summary), the summaries
    show formulas as plain text, never their TeX (book/_static/course.js)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(book["learner"]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = offline.new_page()
        summaries = []
        for word in ("tile", "position"):
            page.goto(f"http://127.0.0.1:{server.server_port}/search.html?q={word}", wait_until="load")
            page.wait_for_selector("#search-results p.context", timeout=30_000)
            page.wait_for_timeout(500)
            summaries += page.locator("#search-results p.context").all_text_contents()
    finally:
        server.shutdown()
    assert len(summaries) >= 4, summaries
    tex = [text[:80] for text in summaries if re.search(r"\\[()\[\]]|\\[a-z]+", text)]
    assert not tex, f"{len(tex)} of {len(summaries)} search summaries show TeX: {tex[:3]}"


def contents_and_headings(book_pdf, pdftotext: str, pdftohtml: str) -> tuple[list[str], list[tuple[int, str]]]:
    """(the lines of the PDF's first page, where its contents are; [(page, heading)] of its outline:
    the page each heading landed on, as Chromium wrote it)."""
    contents = subprocess.run([pdftotext, "-f", "1", "-l", "1", "-layout", str(book_pdf), "-"],
                              capture_output=True, text=True, check=True).stdout.splitlines()
    outline = subprocess.run([pdftohtml, "-xml", "-i", "-q", "-stdout", str(book_pdf)], capture_output=True,
                             text=True, check=True).stdout
    items = re.findall(r'<item page="(\d+)">(.*?)</item>', outline)
    headings = [(int(page), html.unescape(text)) for page, text in items]
    return contents, headings


def contents_problems(contents: list[str], headings: list[tuple[int, str]], titles: list[str]) -> list[str]:
    """Each chapter whose contents entry gives no page number, or one that is not the page its
    heading (the first outline item that holds its title) is on."""
    squeeze = lambda text: "".join(text.split())  # noqa: E731 (pdftohtml drops the spaces at line breaks
    # and may repeat part of a heading's text: "2. Block tables, slot math and the2. Block tables, ...")
    problems = []
    for title in titles:
        line = next((line for line in contents if squeeze(line).startswith(squeeze(title))), "")
        given = re.search(r"\s(\d+)\s*$", line)
        heading = next((page for page, text in headings if squeeze(title) in squeeze(text)), None)
        if not given:
            problems.append(f"{title!r}: the contents give no page ({line.strip()!r})")
        elif heading is None:
            problems.append(f"{title!r}: the PDF's outline has no such heading")
        elif int(given.group(1)) != heading:
            problems.append(f"{title!r}: the contents say page {given.group(1)}, its heading is on page {heading}")
    return problems


def test_the_pdf_contents_give_each_chapters_page(book, book_pdf):
    """Each entry of the contents on the PDF's first page ends with the page its chapter's heading
    is on (the outline's page for it, pdftohtml), and that page shows the chapter's title (pdftotext)."""
    pdftotext, pdftohtml = need_tool("pdftotext", "poppler-utils"), need_tool("pdftohtml", "poppler-utils")
    contents, headings = contents_and_headings(book_pdf, pdftotext, pdftohtml)
    titles = [executed_notebook(book, c).cells[0].source.splitlines()[0].lstrip("# ").strip() for c in CHAPTERS]
    problems = contents_problems(contents, headings, titles)
    assert not problems, "the PDF's contents are wrong:\n" + "\n".join(problems)
    for title in titles:
        page = next(page for page, text in headings if "".join(title.split()) in "".join(text.split()))
        text = subprocess.run([pdftotext, "-f", str(page), "-l", str(page), "-layout", str(book_pdf), "-"],
                              capture_output=True, text=True, check=True).stdout
        assert " ".join(title.split()) in " ".join(text.split()), f"page {page} does not show {title!r}"


def test_the_contents_check_catches_a_wrong_page():
    """The contents the tester read: chapter 3 given page 1, the book title's page (its heading id was
    the title's), and a chapter given no page at all."""
    contents = ["    1. The KV cache and what it costs          5", "    3. The paged KV cache     1",
                "    4. Copy-on-write fork"]
    headings = [(1, "The paged KV cache"), (5, "1. The KV cache and what it costs"),
                (36, "3. The paged KV cache3. The paged KV cache"), (49, "4. Copy-on-write fork")]
    problems = contents_problems(contents, headings, ["1. The KV cache and what it costs", "3. The paged KV cache",
                                                      "4. Copy-on-write fork"])
    assert problems == ["'3. The paged KV cache': the contents say page 1, its heading is on page 36",
                        "'4. Copy-on-write fork': the contents give no page ('4. Copy-on-write fork')"], problems
