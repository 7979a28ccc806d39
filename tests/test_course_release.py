"""`make release`: the committed notebooks/ is exactly what the chapters generate, and holds no answers."""
import json

import nbformat
import pytest

from engine.course import cells
from engine.course.authoring.release import release
from engine.course.authoring.source import load_chapter
from fixtures.course_support import BUILD, REPO, real_chapters

pytestmark = [pytest.mark.slow]
NOTEBOOKS = REPO / "notebooks"


@pytest.fixture(scope="module")
def fresh():
    """A release of solutions/ generated now, in a build folder."""
    out = BUILD / "release" / "notebooks"
    release(real_chapters(), out, BUILD / "release" / "course")
    return out


def normalized(path):
    """The notebook as parsed JSON (so formatting differences would not matter, content does)."""
    return json.loads(path.read_text())


def test_committed_release_equals_a_fresh_generation(fresh):
    assert real_chapters(), "no chapters in solutions/"
    assert sorted(p.name for p in fresh.iterdir()) == sorted(p.name for p in NOTEBOOKS.iterdir()), \
        "notebooks/ and a fresh release hold different files: run `make release`"
    for path in sorted(fresh.iterdir()):
        committed = NOTEBOOKS / path.name
        if path.suffix == ".ipynb":
            assert normalized(committed) == normalized(path), f"{committed} is stale: run `make release`"
        else:
            assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make release`"


@pytest.mark.parametrize("chapter", real_chapters(), ids=lambda p: p.stem)
def test_learner_edition_has_stubs_and_no_answers_hidden_tests_or_pairing(chapter):
    learner = nbformat.read(NOTEBOOKS / f"{chapter.stem}.ipynb", as_version=4)
    source = load_chapter(chapter)
    assert "jupytext" not in learner.metadata
    assert [cells.grade_id(c) for c in learner.cells] == [cells.grade_id(c) for c in source.cells]
    text = "\n".join(cell.source for cell in learner.cells)
    for marker in (cells.BEGIN_SOLUTION, cells.BEGIN_HIDDEN, cells.END_HIDDEN):
        assert marker not in text
    assert "raise NotImplementedError()" in text and "YOUR ANSWER HERE" in text
    for cell in learner.cells:
        assert cell.get("outputs", []) == []
        if cells.is_test(cell):
            assert cell.metadata.get("editable") is False and cell.metadata.get("deletable") is False
    hidden = [line for c in source.cells
              for region in cells.marked_regions(c.source, cells.BEGIN_HIDDEN, cells.END_HIDDEN)
              for line in region if line.strip()]
    assert not [line for line in hidden if line in text.splitlines()]


@pytest.mark.parametrize("chapter", real_chapters(), ids=lambda p: p.stem)
def test_exactly_the_cells_that_fail_on_a_stub_are_tagged_raises_exception(chapter):
    """Run All goes on past a failing check: every graded test, every "With your code" cell and every
    unanswered answer cell (and no other, so an error in a demo still stops the run) carries
    JupyterLab's `raises-exception` tag."""
    learner = nbformat.read(NOTEBOOKS / f"{chapter.stem}.ipynb", as_version=4)
    tagged = [i for i, cell in enumerate(learner.cells) if cells.RAISES_TAG in cell.metadata.get("tags", [])]
    tests = [i for i, cell in enumerate(learner.cells) if cells.is_test(cell)]
    yours = cells.your_code_cells(learner.cells)
    assert tests and set(tests) <= set(tagged), f"{chapter.stem}: untagged tests {sorted(set(tests) - set(tagged))}"
    answers = [i for i, cell in enumerate(learner.cells) if cells.raises_as_released(cell)]
    assert tagged == sorted(set(tests) | set(yours) | set(answers))
    headings = sum(bool(cells.YOUR_CODE_HEADING.search(cell.source)) for cell in learner.cells
                   if cell.cell_type == "markdown")
    assert len(yours) == headings, f"{chapter.stem}: a **With your code** heading with no code cell after it"


def test_your_code_cells_are_the_code_cells_under_a_with_your_code_paragraph():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Cells headed **With your code** run your code."),  # not a paragraph start
        nbformat.v4.new_code_cell("setup()"),
        nbformat.v4.new_markdown_cell("Some text.\n\n**With your code: the demo.** Needs Exercise 1."),
        nbformat.v4.new_code_cell("demo(yours)"),
        nbformat.v4.new_code_cell("more()"),
    ])
    assert cells.your_code_cells(notebook.cells) == [3]


def test_release_readme_lists_the_chapters():
    readme = (NOTEBOOKS / "README.md").read_text()
    for chapter in real_chapters():
        assert f"`{chapter.stem}.ipynb`" in readme
