"""`make book`: outputs from the reference solution, no solution text and no answer in the learner edition.

The leak check is proven on the instructor edition: the same search finds every solution line there.
No answer either: the learner pages show no ✓ line and none of the review answers (the values the
review checks accept, taken from the checks themselves), and the search finds them in the instructor
edition. The pages read: every figure's text is 11 px or more at the book's width and 10 px or more on
a phone (audited while the chapter ran), every explorer shows a picture at every position, every
printed line fits 88 columns, no formula shows a literal \\_, and the setup cell is folded under a one-line summary.
Every link of the built book is well formed (https, a host, no spaces) or resolves to a file and an id
of the build (no network is used); every paper and vLLM file a "Going deeper" list names is linked;
every external link is an address the course's text writes (or the repository book/_config.yml names:
none yet, so no repository button). No `$` is left in the text outside the formulas (a formula that
did not parse as math, as in a list item). Code lines are spans that keep the text.
The built book needs no network: MathJax is served from the book itself and no page names a CDN;
explorers are precomputed widgets; each chapter page keeps its review questions and "Going deeper"
list, and the instructor edition shows the written answers' rubrics. (The browser checks of the same
pages are in test_course_browser.py.)
"""
import contextlib
import html
import importlib
import json
import re
from html.parser import HTMLParser
from unittest import mock
from urllib.parse import urlparse

import nbformat
import pytest

from engine.course import cells

from engine.course.authoring import lint, widgets
from engine.course.authoring.book import RUBRIC_LABEL, learner_edition, setup_summary
from engine.course.authoring.widgets import MIME_HTML
from engine.course.paths import chapter_files
from fixtures.course_support import built_book, expanded, solutions_dir

pytestmark = [pytest.mark.slow]


class _Text(HTMLParser):
    """The text of an HTML page, tags dropped (code blocks come out as their lines: Pygments only adds spans)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


def visible_lines(html_dir) -> set[str]:
    """Every stripped line of text in the built site: pages (tags dropped), sources, notebooks, JS."""
    lines = set()
    for path in html_dir.rglob("*"):
        if not path.is_file() or path.suffix not in {".html", ".ipynb", ".txt", ".md", ".js", ".json", ".py"}:
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".html":
            parser = _Text()
            parser.feed(text)
            text = "".join(parser.parts)
        elif path.suffix == ".ipynb":
            notebook = json.loads(text)
            text = "\n".join("".join(cell["source"]) for cell in notebook["cells"])
        lines |= {" ".join(html.unescape(line).split()) for line in text.splitlines()}
    return lines


def learner_source_lines(chapters) -> set[str]:
    """Every source line of every chapter's learner edition: what the learner is meant to see."""
    return {" ".join(line.split()) for _, executed in chapters for cell in learner_edition(executed).cells
            for line in cell.source.splitlines()}


def secret_lines(chapter, shown: set[str]) -> dict[str, set[str]]:
    """{'solution': lines inside solution regions, 'hidden': lines of hidden tests}, minus any line the
    learner edition shows anyway: a stub, the prose, the unsolved parts of an included class, or a later
    chapter's included reference code (chapter 4 shows the cache, whose slot math chapter 2 asks for)."""
    source = expanded(chapter)
    solution = {" ".join(line.split()) for cell in source.cells for line in cells.solution_text(cell)}
    hidden = {" ".join(line.split()) for cell in source.cells
              for region in cells.marked_regions(cell.source, cells.BEGIN_HIDDEN, cells.END_HIDDEN) for line in region}
    trivial = {line for line in solution | hidden if len(line) < 8}  # `return`, `else:`: in any code
    return {"solution": solution - shown - trivial, "hidden": hidden - shown - trivial}


@pytest.fixture(scope="module")
def book():
    return built_book()


@pytest.fixture(scope="module")
def chapters(book):
    """[(chapter source, executed notebook)]"""
    return [(chapter, nbformat.read(book["executed"] / f"{chapter.stem}.ipynb", as_version=4))
            for chapter in chapter_files(solutions_dir())]


def test_learner_html_holds_no_solution_or_hidden_test_line(book, chapters):
    shown, meant = visible_lines(book["learner"]), learner_source_lines(chapters)
    for chapter, _ in chapters:
        secrets = secret_lines(chapter, meant)
        assert secrets["solution"], f"{chapter.stem}: no solution text to look for"
        leaked = sorted((secrets["solution"] | secrets["hidden"]) & shown)
        assert not leaked, f"{chapter.stem}: the learner book shows solution text: {leaked[:5]}"


def test_the_leak_search_finds_every_solution_code_line_in_the_instructor_edition(book, chapters):
    shown, meant = visible_lines(book["instructor"]), learner_source_lines(chapters)
    for chapter, _ in chapters:
        code_cells = [cell for cell in expanded(chapter).cells if cells.is_solution(cell) and cell.cell_type == "code"]
        code = {" ".join(line.split()) for cell in code_cells for line in cells.solution_text(cell)}
        secrets = code & secret_lines(chapter, meant)["solution"]
        assert secrets, f"{chapter.stem}: no solution code to look for"
        missing = sorted(secrets - shown)
        assert not missing, f"{chapter.stem}: the search misses solution lines in the instructor book: {missing[:5]}"


def test_learner_pages_show_the_stubs_and_the_reference_outputs(book, chapters):
    for chapter, executed in chapters:
        page = (book["learner"] / "chapters" / f"{chapter.stem}.html").read_text()
        assert "YOUR CODE HERE" in page and "NotImplementedError" in page
        assert "YOUR CODE HERE" not in (book["instructor"] / "chapters" / f"{chapter.stem}.html").read_text()
        edition = learner_edition(executed)
        hidden = set(cells.shows_an_answer(executed.cells))
        assert hidden and all(not edition.cells[i].get("outputs") for i in hidden)
        assert [cell.get("outputs") for i, cell in enumerate(edition.cells) if i not in hidden] == \
            [cell.get("outputs") for i, cell in enumerate(executed.cells) if i not in hidden]
        errors = [o for cell in executed.cells for o in cell.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{chapter.stem}: the reference solution raised {errors[0].ename}"


def is_explorer(output) -> bool:
    """An explorer's output (engine/course/authoring/widgets.py): HTML first, its default picture as a fallback."""
    return 'class="course-explorer"' in output.get("data", {}).get(MIME_HTML, "")


def test_every_figure_of_the_executed_chapter_is_on_its_page(book, chapters):
    for chapter, executed in chapters:
        figures = sum("image/png" in output.get("data", {}) and not is_explorer(output)
                      for cell in learner_edition(executed).cells for output in cell.get("outputs", []))
        page = book["learner"] / "chapters" / f"{chapter.stem}.html"
        images = [src for src in _image_sources(page.read_text()) if "_images/" in src]
        assert len(images) == figures, f"{chapter.stem}: {figures} figures executed, {len(images)} on the page"
        for src in images:
            assert (page.parent / src).resolve().stat().st_size > 1000, src


def test_the_book_has_the_written_pages_and_a_table_of_contents(book, chapters):
    index = (book["learner"] / "intro.html").read_text()
    for chapter, _ in chapters:
        assert f"chapters/{chapter.stem}.html" in index
    assert (book["learner"] / "course_guide.html").is_file()


def _image_sources(page: str) -> list[str]:
    """The src of every <img> in the page."""
    found = []

    class Images(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "img":
                found.append(dict(attrs).get("src", ""))

    Images().feed(page)
    return found


def test_every_explorer_is_on_its_page_with_all_its_states(book, chapters):
    """Each explorer the chapter ran is a precomputed widget on the page: controls, data, script."""
    for chapter, executed in chapters:
        outputs = [o for cell in executed.cells for o in cell.get("outputs", []) if is_explorer(o)]
        page = (book["learner"] / "chapters" / f"{chapter.stem}.html").read_text()
        on_page = re.findall(r'<div class="course-explorer" id="[^"]+" data-draw="[^"]+" data-states="(\d+)"', page)
        assert len(on_page) == len(outputs), f"{chapter.stem}: {len(outputs)} explorers ran, {len(on_page)} on the page"
        for output, states in zip(outputs, on_page):
            data = json.loads(re.search(r'class="course-explorer-data">(.*?)</script>',
                                        output["data"][MIME_HTML], re.S).group(1).replace("<\\/", "</"))
            count = 1
            for size in data["sizes"]:
                count *= size
            assert len(data["states"]) == count == int(states) > 1, f"{chapter.stem}: {states} states"
            assert len(data["images"]) > 1, f"{chapter.stem}: every state of an explorer draws the same picture"


class _Links(HTMLParser):
    """(tag, attribute, URL) of everything a page loads: scripts, stylesheets, images, frames, fonts."""

    LOADS = {("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src"), ("source", "src"),
             ("embed", "src"), ("object", "data"), ("audio", "src"), ("video", "src")}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.loads = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link" and not ({"stylesheet", "preload", "modulepreload", "icon", "prefetch", "preconnect",
                                   "dns-prefetch", "manifest"} & set((attrs.get("rel") or "").split())):
            return  # rel="next", "prev", "index", ... are plain links
        for wanted_tag, attribute in self.LOADS:
            if tag == wanted_tag and attrs.get(attribute):
                self.loads.append((tag, attribute, attrs[attribute]))


CDN_HOSTS = re.compile(r"(cdn\.jsdelivr\.net|unpkg\.com|cdnjs\.cloudflare\.com|fonts\.googleapis\.com|"
                       r"ajax\.googleapis\.com|code\.jquery\.com|cdn\.plot\.ly|polyfill\.io|mathjax\.org)")


@pytest.mark.parametrize("edition", ["learner", "instructor"])
def test_no_page_loads_anything_from_the_network(book, edition):
    """Every script, stylesheet, font and image a page loads is a file of the built book (no CDN, no URL),
    and no page or stylesheet even names a CDN host (inline scripts included)."""
    site = book[edition]
    pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts)  # not templates
    assert len(pages) >= 3
    for page in pages:
        text = page.read_text()
        links = _Links()
        links.feed(text)
        remote = [(tag, url) for tag, _, url in links.loads if urlparse(url).scheme not in {"", "data"}]
        assert not remote, f"{page.relative_to(site)} loads from the network: {remote[:5]}"
        for _, _, url in links.loads:
            if not urlparse(url).scheme:
                target = (page.parent / url.split("#")[0].split("?")[0]).resolve()
                assert target.is_file(), f"{page.relative_to(site)} loads {url}, which the book does not have"
        cdn = CDN_HOSTS.findall(text)
        assert not cdn, f"{page.relative_to(site)} names a CDN: {sorted(set(cdn))}"
    for sheet in site.glob("_static/**/*.css"):
        urls = re.findall(r"url\(\s*['\"]?(https?:[^'\")]+)", sheet.read_text(errors="replace"))
        assert not urls, f"{sheet.relative_to(site)} loads {urls[:3]}"


def test_mathjax_is_served_from_the_book_and_every_chapter_loads_it(book, chapters):
    site = book["learner"]
    assert (site / "_static" / "mathjax" / "tex-chtml.js").stat().st_size > 100_000
    fonts = list((site / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert len(fonts) > 10, "MathJax's CHTML fonts are not in the book"
    for chapter, _ in chapters:
        page = (site / "chapters" / f"{chapter.stem}.html").read_text()
        assert '<script defer="defer" src="../_static/mathjax/tex-chtml.js"></script>' in page, chapter.stem


def test_each_chapter_page_has_its_review_questions_and_going_deeper_list(book, chapters):
    """The chapter's review questions (every hand-graded answer cell and its question) and its
    "Going deeper" reading list are on both editions' pages."""
    for chapter, executed in chapters:
        for edition in ("learner", "instructor"):
            text = "\n".join(visible_lines_of(book[edition] / "chapters" / f"{chapter.stem}.html"))
            assert re.search(r"check your understanding|review questions", text, re.I), \
                f"{chapter.stem} ({edition}): no review questions section"
            assert "Going deeper" in text, f"{chapter.stem} ({edition}): no \"Going deeper\" list"
        written = [cell for cell in executed.cells if cells.is_manual(cell) and cell.cell_type == "markdown"]
        learner = (book["learner"] / "chapters" / f"{chapter.stem}.html").read_text()
        assert learner.count("YOUR ANSWER HERE") >= len(written), f"{chapter.stem}: answer cells missing"


def test_the_instructor_edition_shows_each_written_answers_rubric(book, chapters):
    label = RUBRIC_LABEL.strip("*")
    for chapter, executed in chapters:
        written = [cell for cell in executed.cells if cells.is_manual(cell) and cell.cell_type == "markdown"]
        instructor = visible_lines_of(book["instructor"] / "chapters" / f"{chapter.stem}.html")
        learner = visible_lines_of(book["learner"] / "chapters" / f"{chapter.stem}.html")
        assert sum(label in line for line in instructor) == len(written), f"{chapter.stem}: rubric labels"
        assert not any(label in line for line in learner), f"{chapter.stem}: a rubric label in the learner book"
        for cell in written:
            first = plain(" ".join(cell.source.split("\n")[0].split()))[:40]
            assert any(first in plain(line) for line in instructor), \
                f"{chapter.stem}: the instructor page lacks the rubric of {cells.grade_id(cell)}"


def plain(text: str) -> str:
    """Text without markdown marks and with the book's typographic quotes and dashes made plain."""
    text = re.sub(r"[*_`$]", "", text)
    return text.translate(str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"',
                                         "\u2013": "-", "\u2014": "-"}))


def test_the_search_index_covers_every_page(book, chapters):
    """Sphinx's client-side search reads searchindex.js from the book itself: no server, no network."""
    index = (book["learner"] / "searchindex.js").read_text()
    for chapter, _ in chapters:
        assert f'"chapters/{chapter.stem}"' in index, f"{chapter.stem} is not in the search index"
    assert '"course_guide"' in index and '"intro"' in index
    search = (book["learner"] / "search.html").read_text()
    assert "searchindex.js" in search and "searchtools.js" in search


def visible_lines_of(page) -> list[str]:
    parser = _Text()
    parser.feed(page.read_text())
    return [" ".join(html.unescape(line).split()) for line in "".join(parser.parts).splitlines() if line.strip()]



# ---- no answers in the learner book ---------------------------------------------------------------------------

class _Outputs(HTMLParser):
    """The text of a page's output areas (div.cell_output), scripts left out, one string per area."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.areas, self.depth, self.script = [], 0, False

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "div" and (self.depth or "cell_output" in classes):
            if not self.depth:
                self.areas.append("")
            self.depth += 1
        self.script = self.script or tag in ("script", "style")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.script = False
        elif tag == "div" and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth and not self.script:
            self.areas[-1] += data


def output_text(page) -> str:
    parser = _Outputs()
    parser.feed(page.read_text())
    return "\n".join(html.unescape(area) for area in parser.areas)


class _Said(BaseException):
    """Stops a review check once it has named its answer (a BaseException: @check lets it through)."""


def _head(praise: str) -> str | None:
    """The start of a check's praise, up to a colon, a semicolon or a bracket: '552 tokens prefilled'."""
    head = re.split(r"[:;(]", praise)[0].strip()
    return head if len(head) >= 12 else None


def _number_forms(want: float, praise: str) -> list[str]:
    """How a printed number would give the answer away (only numbers of 3 digits or more: '164,160')."""
    if float(want) != int(want) or abs(want) < 100:
        return []
    forms = {f"{int(want):,}", f"{int(want)}"}
    if "bytes" in praise and want >= 1024:
        forms.add(f"{want / 1024:.2f} KiB")
    return sorted(forms)


def review_answers(chapter, executed) -> dict[str, list[str]]:
    """{review test grade id: texts that give its answer away}. A review test checks an answer the learner
    sets in the cell before it (`r1_answer = None`); the texts come from the check's own call of
    review_number / review_choice (the praise, the number), else from the ✓ line it printed."""
    source = expanded(chapter)
    modules = {name: importlib.import_module(f"engine.checks.{name}") for name in
               sorted({m for cell in source.cells for m in re.findall(r"\b(ch\d\d)\.check_", cell.source)})}
    printed = {cells.grade_id(c): "".join(o.get("text", "") for o in c.get("outputs", [])) for c in executed.cells}
    found = {}
    for before, cell in zip(source.cells, source.cells[1:]):
        names = re.findall(r"^(\w+) = None\b", before.source, re.M) if cells.is_solution(before) else []
        if not (cells.is_test(cell) and names and any(re.search(rf"\b{n}\b", cell.source) for n in names)):
            continue
        said: list[str] = []

        def number(answer, question, variable, want, praise, *args, **kwargs):
            said.extend([h for h in [_head(praise)] if h] + _number_forms(want, praise))
            raise _Said

        def choice(answer, question, variable, right, praise, *args, **kwargs):
            said.extend(h for h in [_head(praise)] if h)
            raise _Said

        with contextlib.ExitStack() as patches:
            for module in modules.values():
                for name, recorder in (("review_number", number), ("review_choice", choice)):
                    if hasattr(module, name):
                        patches.enter_context(mock.patch.object(module, name, recorder))
            with contextlib.suppress(_Said, Exception):
                exec(cell.source, {**modules, **{name: None for name in names}})
        if not said:  # a check with its own wording: what its ✓ line said
            tick = next((line for line in printed.get(cells.grade_id(cell), "").splitlines() if "✓" in line), "")
            said = [h for h in [_head(re.sub(r"^\s*✓\s*(\w+:\s*)?", "", tick))] if h]
        found[cells.grade_id(cell)] = said
    return found


def leaks(text: str, answers: dict[str, list[str]]) -> list[str]:
    """'grade_id: form' for each answer text found in text, and each ✓ line."""
    found = [f"{grade_id}: {form!r}" for grade_id, forms in answers.items() for form in forms
             if re.search(rf"(?<![\w.,]){re.escape(form)}(?![\w]|[.,]\d)", text)]
    return found + [f"a ✓ line: {line.strip()[:60]!r}" for line in text.splitlines() if line.lstrip().startswith("✓")]


def test_the_learner_book_prints_no_answer_and_the_instructor_book_does(book, chapters):
    """No ✓ line and no review answer in any output of a learner page; the same search finds both in
    the instructor edition (proof that it looks where the answers would be)."""
    asked = 0
    for chapter, executed in chapters:
        answers = review_answers(chapter, executed)
        asked += len(answers)
        assert all(answers.values()), f"{chapter.stem}: no answer text found for {answers}"
        learner = leaks(output_text(book["learner"] / "chapters" / f"{chapter.stem}.html"), answers)
        assert not learner, f"{chapter.stem}: the learner book gives answers away: {learner[:6]}"
        instructor = leaks(output_text(book["instructor"] / "chapters" / f"{chapter.stem}.html"), answers)
        shown = {leak.split(":")[0] for leak in instructor}
        assert set(answers) <= shown and any("✓" in leak for leak in instructor), \
            f"{chapter.stem}: the search misses answers in the instructor book: {sorted(set(answers) - shown)}"
    assert asked >= 10, f"only {asked} review questions found"


def test_the_answer_search_catches_a_printed_answer():
    answers = {"ch05_test_r1": ["552 tokens prefilled", "552"]}
    assert leaks("prompt tokens 832, prefilled 552 in all", answers) == ["ch05_test_r1: '552'"]
    assert leaks("5520 tokens, 1,552 blocks, 5.52 GiB", answers) == []
    assert leaks("  ✓ R1: right", {}) == ["a ✓ line: '✓ R1: right'"]


# ---- the pages read ------------------------------------------------------------------------------------------

def test_every_figure_reads_at_the_books_width(book, chapters):
    """The chapter's run audited every figure it showed (engine/course/authoring/figures): none has text that shows
    under 11 px at the book's width."""
    for chapter, executed in chapters:
        audited = executed.metadata["course"]["figures"]
        pictures = sum("image/png" in o.get("data", {}) for c in executed.cells for o in c.get("outputs", []))
        assert len(audited) >= pictures > 0 or not pictures, f"{chapter.stem}: {len(audited)} figures audited"
        small = [f"{f['where']} ({f['figure']!r}): {f['small'][:2]}" for f in audited if f["small"]]
        assert not small, f"{chapter.stem}: text too small at the book's width: {small[:3]}"


def test_every_explorer_shows_a_picture_at_every_position(chapters):
    for chapter, executed in chapters:
        for cell in executed.cells:
            for output in cell.get("outputs", []):
                if is_explorer(output):
                    data = json.loads(re.search(r'class="course-explorer-data">(.*?)</script>',
                                                output["data"][MIME_HTML], re.S).group(1).replace("<\\/", "</"))
                    empty = widgets.states_without_picture(data)
                    assert not empty, (f"{chapter.stem} {cells.grade_id(cell)}: {len(empty)} of "
                                       f"{len(data['states'])} positions show no picture (states {empty[:8]})")


def test_every_printed_line_fits_88_columns(chapters):
    problems = [p for chapter, executed in chapters for p in lint.output_problems(executed, chapter.name)]
    assert not problems, f"{len(problems)} printed lines wider than {lint.WIDTH} columns:\n" + "\n".join(problems[:12])


MATH = re.compile(r'<(?:span|div) class="math[^"]*">(.*?)</(?:span|div)>', re.S)


def test_no_formula_shows_a_literal_backslash_underscore(book, chapters):
    """A formula whose TeX holds `\\_` (kv\\_len) shows the backslash on the page: every formula of every
    learner page is searched (a name with underscores belongs in code, not in math)."""
    offenders = []
    for page in sorted(book["learner"].rglob("*.html")):
        if "_static" in page.parts:
            continue
        offenders += [f"{page.relative_to(book['learner'])}: {html.unescape(tex)[:60]!r}"
                      for tex in MATH.findall(page.read_text()) if "\\_" in html.unescape(tex)]
    assert not offenders, f"formulas with a literal \\_: {offenders}"


class _Prose(HTMLParser):
    """A page's text outside code, outputs, scripts and typeset formulas: what reads as prose."""

    VOID = {"br", "img", "meta", "link", "input", "hr", "wbr", "source", "col", "area", "base", "embed"}
    SKIP = {"pre", "code", "script", "style", "kbd", "samp", "textarea"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.skipping, self.parts = [], []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            classes = (dict(attrs).get("class") or "").split()
            self.skipping.append(tag in self.SKIP or bool({"math", "highlight", "cell_output"} & set(classes)))

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.skipping:
            self.skipping.pop()

    def handle_data(self, data):
        if not any(self.skipping):
            self.parts.append(data)


def stray_dollars(page_html: str) -> list[str]:
    """The prose around each `$` left in a page's text: TeX that was not read as math."""
    parser = _Prose()
    parser.feed(page_html)
    text = " ".join("".join(parser.parts).split())
    return [text[max(0, m.start() - 40):m.end() + 40] for m in re.finditer(r"\$+", text)]


def test_no_page_shows_a_dollar_of_unparsed_math(book, chapters):
    """A display formula MyST did not read as math (`$$ ... $$` inside a list item's paragraph) prints
    inline with a literal `$` on each side: no page of either edition shows a `$` outside code,
    outputs and the formulas."""
    for edition in ("learner", "instructor"):
        for page in sorted(book[edition].rglob("*.html")):
            if "_static" not in page.relative_to(book[edition]).parts:
                found = stray_dollars(page.read_text())
                assert not found, f"{edition} {page.relative_to(book[edition])}: TeX left as text: {found[:3]}"


def test_the_dollar_search_catches_a_list_items_unparsed_formula():
    page = ('<ol><li><p>so $<span class="math notranslate nohighlight">\\( \\text{new blocks} = b \\)</span>$ '
            'If the pool</p></li></ol><pre>echo $HOME</pre><p><code>$x</code> <span class="math">\\($a$\\)</span></p>')
    assert stray_dollars(page) == ["so $$ If the pool"], stray_dollars(page)


def test_the_setup_cell_is_folded_under_a_one_line_summary(book, chapters):
    for chapter, executed in chapters:
        page = (book["learner"] / "chapters" / f"{chapter.stem}.html").read_text()
        setup = next(cell for cell in executed.cells if cells.is_setup(cell))
        summary = setup_summary(setup.source)
        assert re.match(r"Setup: \d+ imports?", summary), summary
        assert 'class="cell tag_hide-input' in page and html.escape(summary, quote=False) in page, chapter.stem


# ---- links --------------------------------------------------------------------------------------------

class _Anchors(HTMLParser):
    """Every <a href> of a page, and every id (and <a name>) it defines."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        if tag == "a" and attrs.get("href") is not None:
            self.hrefs.append(attrs["href"])


def link_problems(site) -> list[str]:
    """Each link of the built site that is broken: an external one not well formed (https, a host, no
    spaces), an internal one whose file or anchor the build does not have. No network is used."""
    pages = {page: _Anchors() for page in sorted(site.rglob("*.html")) if "_static" not in page.relative_to(site).parts}
    for page, anchors in pages.items():
        anchors.feed(page.read_text())
    problems = []
    for page, anchors in pages.items():
        where = page.relative_to(site)
        for href in anchors.hrefs:
            url = urlparse(href)
            if url.scheme or href.startswith("//"):
                if url.scheme == "mailto":
                    continue
                if url.scheme != "https" or not re.fullmatch(r"[a-z0-9.-]+\.[a-z]{2,}", url.netloc or "") \
                        or re.search(r"\s|[<>\"{}|\\^`]", href):
                    problems.append(f"{where}: external link not well formed: {href!r}")
                continue
            target = (page.parent / url.path).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{where}: links to {href!r}, which the build does not have")
            elif url.fragment and target in pages and url.fragment not in pages[target].ids:
                problems.append(f"{where}: links to {href!r}, whose page has no id {url.fragment!r}")
    return problems


@pytest.mark.parametrize("edition", ["learner", "instructor"])
def test_every_link_of_the_book_is_well_formed_or_resolves(book, edition):
    problems = link_problems(book[edition])
    assert not problems, f"{len(problems)} broken links:\n" + "\n".join(problems[:20])


def test_the_link_check_catches_a_broken_link(tmp_path):
    (tmp_path / "a.html").write_text('<p id="here"><a href="b.html#gone">x</a> <a href="#here">y</a> '
                                     '<a href="http://example.com">z</a> <a href="https://exa mple.com/x">w</a> '
                                     '<a href="missing.html">v</a> <a href="https://arxiv.org/abs/2309.06180">u</a></p>')
    (tmp_path / "b.html").write_text('<h1 id="there">b</h1>')
    problems = link_problems(tmp_path)
    assert len(problems) == 4, problems
    assert any("no id 'gone'" in p for p in problems) and any("missing.html" in p for p in problems)


def going_deeper_items(chapter) -> list[str]:
    """The bullet items of a chapter's "Going deeper" list, from its source (markdown, joined lines)."""
    for cell in expanded(chapter).cells:
        if cell.cell_type == "markdown" and re.search(r"Going deeper", cell.source):
            text = cell.source.split("Going deeper", 1)[1].split("## Summary")[0].split("**Next.**")[0]
            return [" ".join(item.split()) for item in re.split(r"\n\* ", "\n" + text)[1:]]
    return []


def test_every_paper_and_engine_file_in_going_deeper_is_linked():
    """Each paper a "Going deeper" list names (an "et al." or a DeepSeek-AI reference) links to arXiv
    or a DOI, and each vLLM file or folder it names links to vLLM's repository."""
    for chapter in chapter_files(solutions_dir()):
        items = going_deeper_items(chapter)
        assert items, f"{chapter.stem}: no Going deeper list"
        for item in items:
            if re.search(r"et al\.|DeepSeek-AI", item):
                assert re.search(r"\]\(https://(arxiv\.org/abs/\d{4}\.\d{4,5}|doi\.org/10\.\d+/)", item), \
                    f"{chapter.stem}: a paper without its arXiv or DOI link: {item[:90]!r}"
            for path in re.findall(r"`(vllm/[\w/.]+)`", item):
                assert re.search(rf"\[`{re.escape(path)}`\]\(https://github\.com/vllm-project/vllm/(blob|tree)/main/",
                                 item), f"{chapter.stem}: {path} is not linked to vLLM's repository"


# The address book/_config.yml named as a placeholder while the course had none: never a link.
PLACEHOLDER_REPOSITORY = "https://github.com/paged-kv-course/"
URL = re.compile(r"https://[^\s)>\]\"'`]+")


def written_urls() -> set[str]:
    """Every https address the course's own text writes: the chapters' sources and book/'s pages."""
    from fixtures.course_support import REPO
    texts = [chapter.read_text() for chapter in chapter_files(solutions_dir())]
    texts += [page.read_text() for page in (REPO / "book").glob("*.md")]
    return {url.rstrip(".,;:") for text in texts for url in URL.findall(text)}


def unwritten_links(site, allowed: set[str]) -> list[str]:
    """'page: url' for each external link of the built site that is none of `allowed` (a theme's
    default, a placeholder): a link to an address nobody wrote is one nobody checked exists."""
    found = []
    for page in sorted(site.rglob("*.html")):
        if "_static" in page.relative_to(site).parts:
            continue
        anchors = _Anchors()
        anchors.feed(page.read_text())
        found += [f"{page.relative_to(site)}: {href}" for href in anchors.hrefs
                  if urlparse(href).scheme in {"http", "https"} and href.rstrip("/") not in allowed]
    return found


@pytest.mark.parametrize("edition", ["learner", "instructor"])
def test_the_book_links_only_addresses_the_course_names(book, edition):
    """Every external link of the built book is an address the course's text writes, or the
    repository book/_config.yml names; with none named (as now) no page has a repository button and
    the intro names no repository (book.book_config)."""
    import yaml

    from fixtures.course_support import REPO
    url = (yaml.safe_load((REPO / "book" / "_config.yml").read_text())["repository"]["url"] or "").rstrip("/")
    allowed = {u.rstrip("/") for u in written_urls()} | ({url} if url else set())
    stray = unwritten_links(book[edition], allowed)
    assert not stray, f"{len(stray)} links to addresses the course never names:\n" + "\n".join(stray[:10])
    placeholder = [link for link in unwritten_links(book[edition], set()) if PLACEHOLDER_REPOSITORY in link]
    assert not placeholder, f"links to the placeholder repository: {placeholder[:3]}"
    pages = [f"chapters/{c.stem}.html" for c in chapter_files(solutions_dir())] + ["intro.html", "course_guide.html"]
    buttons = [page for page in pages if 'title="Source repository"' in (book[edition] / page).read_text()]
    if url:
        assert len(buttons) == len(pages), f"pages without the repository button: {sorted(set(pages) - set(buttons))}"
    else:
        assert not buttons, f"a repository button with no repository configured: {buttons[:3]}"
        intro = " ".join(visible_lines_of(book[edition] / "intro.html"))
        assert "Get the course from your instructor" in intro, "the intro does not say where the course comes from"


def test_the_link_search_catches_a_placeholder_and_a_themes_default(tmp_path):
    (tmp_path / "a.html").write_text('<a href="https://github.com/paged-kv-course/paged-kv-course">repo</a> '
                                     '<a href="https://github.com/executablebooks/jupyter-book">theme</a> '
                                     '<a href="https://arxiv.org/abs/2309.06180">paper</a> <a href="b.html">b</a>')
    stray = unwritten_links(tmp_path, {"https://arxiv.org/abs/2309.06180"})
    assert stray == ["a.html: https://github.com/paged-kv-course/paged-kv-course",
                     "a.html: https://github.com/executablebooks/jupyter-book"], stray
    assert "https://arxiv.org/abs/2309.06180" in written_urls()


def test_a_repository_is_linked_only_where_the_configuration_names_one():
    """book.book_config: an https repository url turns the button on and the intro links it; an empty
    one turns both off; anything else stops the build with a message naming the setting."""
    from engine.course.authoring.book import COURSE_SOURCE_UNSET, book_config
    base = {"repository": {"url": "", "branch": "main"}, "html": {"use_repository_button": True},
            "parse": {"myst_substitutions": {"course_source": "from your instructor"}}}
    unset = book_config(base)
    assert unset["html"]["use_repository_button"] is False and unset["repository"]["url"] == ""
    assert unset["parse"]["myst_substitutions"]["course_source"] == COURSE_SOURCE_UNSET
    assert "http" not in COURSE_SOURCE_UNSET and base["html"]["use_repository_button"] is True  # a copy
    named = book_config({**base, "repository": {"url": "https://gitlab.com/a-university/paged-kv"}})
    assert named["html"]["use_repository_button"] is True
    assert named["parse"]["myst_substitutions"]["course_source"] == "from its repository, <https://gitlab.com/a-university/paged-kv>"
    for bad in ("http://github.com/a/b", "placeholder", "https://github.com/", "https://git.example.edu/a/b"):
        with pytest.raises(ValueError, match="repository url"):
            book_config({**base, "repository": {"url": bad}})


def test_code_lines_are_spans_that_keep_the_text():
    """book.hang_lines wraps each line of a <pre> in a span with its indentation and changes no
    character of the text; a <pre> whose tags cross lines, and an explorer's text, stay as they were."""
    from engine.course.authoring.book import hang_lines
    page = ('<pre><span></span><span class="k">def</span> f():\n    <span class="k">return</span> 1\n\n</pre>'
            '<pre class="course-explorer-text">a\nb</pre><pre>x <b>y\nz</b></pre>')
    out = hang_lines(page)
    assert out.count('class="course-line"') == 3 and 'style="--indent:4ch">    <span class="k">return' in out
    strip = re.compile(r"<[^>]+>")
    assert strip.sub("", out) == strip.sub("", page)
    assert out.endswith('<pre class="course-explorer-text">a\nb</pre><pre>x <b>y\nz</b></pre>')
