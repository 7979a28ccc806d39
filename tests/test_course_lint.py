"""The nbgrader metadata linter: every chapter passes it, and each rule catches what it should."""
import json
import os

import nbformat
import pytest

from engine.course.authoring import lint
from engine.course.authoring.lint import lint_chapter, main
from fixtures.course_support import FIXTURE_CHAPTER, real_chapters

CHAPTERS = real_chapters() + [FIXTURE_CHAPTER]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_is_clean(chapter):
    assert lint_chapter(chapter) == []


def test_lint_command_exits_zero_on_clean_chapters(capsys):
    assert main([str(FIXTURE_CHAPTER)]) == 0
    assert "1 chapter(s), 0 problem(s)" in capsys.readouterr().out


def broken(tmp_path, old, new, count=1):
    """The fixture chapter with `old` replaced by `new` (which must occur), as a file in tmp_path."""
    text = FIXTURE_CHAPTER.read_text()
    assert text.count(old) >= count, old
    path = tmp_path / "ch98_broken.py"
    path.write_text(text.replace(old, new, count))
    return path


@pytest.mark.parametrize("old, new, message", [
    ('"grade_id": "test_reset"', '"grade_id": "test_increment"', "grade_id also used by cell 4"),
    ('"grade_id": "test_triple", "locked": true', '"grade_id": "test_triple", "locked": false',
     "a graded test cell must be locked"),
    ('"points": 2, "schema_version": 3, "solution": false}\nassert triple',
     '"schema_version": 3, "solution": false}\nassert triple', "a graded cell needs points > 0"),
    ("    ### END SOLUTION\n\n# %% nbgrader={\"grade\": true, \"grade_id\": \"test_square\"",
     "\n# %% nbgrader={\"grade\": true, \"grade_id\": \"test_square\"", "'### BEGIN SOLUTION' never closed"),
    ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS\n### BEGIN HIDDEN TESTS", "without a '### BEGIN HIDDEN TESTS'"),
    ("def double(x):\n    return 2 * x",
     "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION",
     "in a cell where nbgrader ignores it"),
    ('"grade": true, "grade_id": "test_triple"', '"grade": false, "grade_id": "test_triple"',
     "exercise 'triple' has no graded test cell before the next one"),
    ('"grade": true, "grade_id": "test_square"', '"grade": false, "grade_id": "test_square"',
     "exercise 'square' has no graded test cell after it"),
    ("fixture_lib.py::triple", "fixture_lib.py::quadruple", "no top-level class or function 'quadruple'"),
    ("fixture_lib.py::Counter solve=increment,reset", "fixture_lib.py::Counter solve=increment,decrement",
     "no method 'decrement' in class Counter"),
    ('# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false}',
     "# %%", "cell 2: no nbgrader metadata"),
    ('assert triple(4) == 12', 'assert triple(FOUR) == 12',
     "cell test_triple uses FOUR, which no cell of the chapter defines or imports"),
    ("def double(x):\n    return 2 * x", "def double(x):\n    return 2 * x" + " " * 70 + "# a long comment",
     "code line 2 is 102 columns (at most 88)"),
])
def test_each_rule_reports_the_broken_cell(tmp_path, old, new, message):
    problems = lint_chapter(broken(tmp_path, old, new))
    assert any(message in problem for problem in problems), problems
    assert all(problem.startswith("ch98_broken.py") for problem in problems)


def test_lint_command_exits_one_and_prints_problems(tmp_path, capsys):
    path = broken(tmp_path, '"grade_id": "test_reset"', '"grade_id": "test_increment"')
    assert main([str(path)]) == 1
    assert "grade_id also used" in capsys.readouterr().out


def test_names_used_by_included_code_must_be_imported(tmp_path):
    """Code included from a module may use that module's names; the chapter must import them."""
    fixtures = tmp_path / "tests" / "fixtures"
    fixtures.mkdir(parents=True)
    fixtures.joinpath("fixture_lib.py").write_text((FIXTURE_CHAPTER.parents[1] / "fixture_lib.py").read_text())
    fixtures.joinpath("lib.py").write_text("from math import tau\n\n\ndef turn(x):\n    return tau * x\n")
    chapter = broken(tmp_path, "fixture_lib.py::triple", "fixture_lib.py::triple")
    text = chapter.read_text().replace("#| include tests/fixtures/fixture_lib.py::triple",
                                       "#| include tests/fixtures/lib.py::turn\ntriple = turn")
    chapter.write_text(text)
    problems = lint_chapter(chapter, root=tmp_path)
    assert any("uses tau, which no cell" in problem for problem in problems), problems
    chapter.write_text(text.replace("import matplotlib.pyplot as plt",
                                    "import matplotlib.pyplot as plt\nfrom math import tau"))
    assert not any("uses tau" in problem for problem in lint_chapter(chapter, root=tmp_path))


def executed(*cells_and_outputs):
    """A notebook of code cells with the given outputs (an executed chapter in miniature)."""
    notebook = nbformat.v4.new_notebook()
    for outputs, meta in cells_and_outputs:
        cell = nbformat.v4.new_code_cell("pass", outputs=outputs)
        cell.metadata["nbgrader"] = meta
        notebook.cells.append(cell)
    return notebook


TEST = {"grade": True, "solution": False, "locked": True, "points": 1, "grade_id": "test_x", "schema_version": 3}
PLAIN = {"grade": False, "solution": False, "locked": True, "grade_id": "demo", "schema_version": 3}


def test_printed_lines_wider_than_88_columns_are_reported_outside_graded_tests():
    wide = "x" * 89
    stream = nbformat.v4.new_output("stream", name="stdout", text=f"fits\n{wide}\n")
    result = nbformat.v4.new_output("execute_result", data={"text/plain": wide}, execution_count=1)
    figure = nbformat.v4.new_output("display_data", data={"text/plain": wide, "image/png": "iVBOR"})
    problems = lint.output_problems(executed(([stream, result, figure], PLAIN), ([stream], TEST)), "ch98.py")
    assert problems == [f"ch98.py cell 1 (grade_id demo): printed line 2 is 89 columns (at most 88): {wide[:60]!r}",
                        f"ch98.py cell 1 (grade_id demo): printed line 1 is 89 columns (at most 88): {wide[:60]!r}"]


def test_an_explorers_states_are_summed_up_in_one_problem():
    data = {"texts": ["short\n", "y" * 90 + "\n", "z" * 95 + "\n" + "z" * 91]}
    page = f'<div class="course-explorer"><script class="course-explorer-data">{json.dumps(data)}</script></div>'
    output = nbformat.v4.new_output("display_data", data={"text/html": page, "text/plain": "short"})
    [problem] = lint.output_problems(executed(([output], PLAIN)), "ch98.py")
    assert "the explorer prints 3 line(s) wider than 88 columns over its states, the widest 95" in problem


def test_fenced_code_in_the_text_counts_prose_does_not(tmp_path):
    cell = nbformat.v4.new_markdown_cell("p" * 120 + "\n\n```python\n" + "c" * 89 + "\n```\n")
    assert lint.code_lines(cell) == ["c" * 89]


def test_the_command_checks_printed_lines_of_executed_chapters_and_skips_stale_ones(tmp_path, capsys):
    outputs = tmp_path / "executed"
    outputs.mkdir()
    stream = nbformat.v4.new_output("stream", name="stdout", text="w" * 100)
    nbformat.write(executed(([stream], PLAIN)), outputs / f"{FIXTURE_CHAPTER.stem}.ipynb")
    assert main([str(FIXTURE_CHAPTER), "--outputs", str(outputs)]) == 1
    assert "printed line 1 is 100 columns" in capsys.readouterr().out
    stale = FIXTURE_CHAPTER.stat().st_mtime - 10
    os.utime(outputs / f"{FIXTURE_CHAPTER.stem}.ipynb", (stale, stale))
    assert main([str(FIXTURE_CHAPTER), "--outputs", str(outputs)]) == 0
    assert "older than the chapter" in capsys.readouterr().out
