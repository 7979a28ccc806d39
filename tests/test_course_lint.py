"""The nbgrader metadata linter: every chapter passes it, and each rule catches what it should."""
import pytest

from engine.course.lint import lint_chapter, main
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
