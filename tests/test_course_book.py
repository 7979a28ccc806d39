"""`make book`: outputs from the reference solution, no solution text in the learner edition's HTML.

The leak check is proven on the instructor edition: the same search finds every solution line there.
"""
import html
import json
from html.parser import HTMLParser

import nbformat
import pytest

from engine.course import cells
from engine.course.book import learner_edition
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
    return {"solution": solution - shown - {""}, "hidden": hidden - shown - {""}}


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
        assert [cell.get("outputs") for cell in edition.cells] == [cell.get("outputs") for cell in executed.cells]
        errors = [o for cell in executed.cells for o in cell.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{chapter.stem}: the reference solution raised {errors[0].ename}"


def test_every_figure_of_the_executed_chapter_is_on_its_page(book, chapters):
    for chapter, executed in chapters:
        figures = sum("image/png" in output.get("data", {}) for cell in executed.cells
                      for output in cell.get("outputs", []))
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
