"""`make grade` on the fixture chapter: nbgrader's scoring, and a run that survives anything a learner does.

Each broken notebook is the full solution with one exercise damaged; it must lose exactly the points of
the tests that exercise reaches, and nothing else.
"""
import copy
import json
import subprocess
import sys

import nbformat
import pytest

from engine.course.grading.grade import ChapterGrade, Exercise, first_failure, format_table, grade_notebook, main
from engine.course.authoring.source import load_chapter
from fixtures.course_support import FIXTURE_CHAPTER, FIXTURE_SOLUTIONS, REPO, with_cell_edited, write_notebook

NAME = "ch99_fixture"
FULL = {"test_increment": 2, "test_reset": 1, "test_triple": 2, "test_square": 1}
TIMEOUT_S = 8  # long enough for a normal cell on a busy machine, short enough for the loop tests


def earned(tmp_path, notebook, timeout=TIMEOUT_S) -> dict[str, float]:
    """{grade_id: earned} for the autograded cells of `notebook`, graded as the fixture chapter."""
    result = grade_notebook(write_notebook(notebook, tmp_path, NAME), FIXTURE_CHAPTER, timeout)
    assert [e.grade_id for e in result.exercises if e.kind == "manual"] == ["why"]
    return {e.grade_id: e.earned for e in result.exercises if e.kind == "test"}


def losing(*grade_ids):
    """The full score with the given tests at zero."""
    return {grade_id: 0 if grade_id in grade_ids else points for grade_id, points in FULL.items()}


@pytest.fixture(scope="module")
def solution():
    return load_chapter(FIXTURE_CHAPTER)


@pytest.mark.slow
def test_the_solution_earns_full_marks(tmp_path, solution):
    assert earned(tmp_path, solution) == FULL


@pytest.mark.slow
def test_a_planted_bug_costs_exactly_its_exercise(tmp_path, solution):
    buggy = with_cell_edited(solution, "triple", lambda s: s.replace("double(x) + x", "double(x) + 1"))
    assert earned(tmp_path, buggy) == losing("test_triple")


@pytest.mark.slow
def test_a_syntax_error_costs_only_the_broken_cells_tests(tmp_path, solution):
    broken = with_cell_edited(solution, "counter", lambda s: s.replace("self.value += by", "self.value += by )"))
    assert earned(tmp_path, broken) == losing("test_increment", "test_reset")


@pytest.mark.slow
def test_an_endless_loop_is_interrupted_and_grading_goes_on(tmp_path, solution):
    looping = with_cell_edited(solution, "triple",
                               lambda s: s.replace("return double(x) + x", "while True:\n        pass"))
    # A short limit keeps the loop short: it spins until it has used 2 s x the cores of CPU time.
    result = grade_notebook(write_notebook(looping, tmp_path, NAME), FIXTURE_CHAPTER, 2)
    by_id = {e.grade_id: e for e in result.exercises}
    assert by_id["test_triple"].earned == 0
    assert by_id["test_triple"].message.startswith("TimeoutError: the cell used more than its")
    assert {e.grade_id: e.earned for e in result.exercises if e.kind == "test"} == losing("test_triple")


@pytest.mark.slow
def test_a_loop_that_ignores_interrupts_gets_a_fresh_kernel_and_later_cells_their_definitions(tmp_path, solution):
    # test_square needs `double` from the setup cell: it only passes if the restart replayed that cell.
    stubborn = with_cell_edited(solution, "triple", lambda s: s.replace("return double(x) + x", (
        "import time\n    while True:\n        try:\n            time.sleep(0.05)\n"
        "        except KeyboardInterrupt:\n            pass")))
    # It sleeps, so only the wall-clock backstop (10 x the limit) stops it: a short limit keeps the wait short.
    assert earned(tmp_path, stubborn, timeout=2) == losing("test_triple")


@pytest.mark.slow
def test_a_dead_kernel_is_restarted_and_only_that_exercise_is_lost(tmp_path, solution):
    # os._exit inside increment: no text screen refuses the cell (the learner owns its process), so the
    # process dies in the test that calls increment, which earns nothing; it is restarted with the cells
    # before replayed, and reset's test (which never calls increment), triple and square still pass.
    dying = with_cell_edited(solution, "counter", lambda s: s.replace("self.value += by", "import os; os._exit(1)")
                             .replace("Counter().increment(5)", ""))
    assert earned(tmp_path, dying) == losing("test_increment")


@pytest.mark.slow
def test_an_edited_test_cell_is_restored_from_the_chapter_with_its_hidden_tests(tmp_path, solution):
    # The learner "fixes" their failing tests by editing them; the originals run instead, hidden ones too.
    cheating = with_cell_edited(solution, "test_triple", lambda s: "pass")
    cheating = with_cell_edited(cheating, "triple", lambda s: s.replace("double(x) + x", "0"))
    cheating = with_cell_edited(cheating, "test_increment", lambda s: s.split("### BEGIN HIDDEN TESTS")[0])
    cheating = with_cell_edited(cheating, "counter", lambda s: s.replace("return self.value", (
        "return self.value if self.value >= 0 else 0")))  # passes the visible tests, not the hidden one
    assert earned(tmp_path, cheating) == losing("test_triple", "test_increment")


@pytest.mark.slow
def test_a_deleted_test_cell_is_put_back_and_scored(tmp_path, solution):
    missing = with_cell_edited(solution, "triple", lambda s: s.replace("double(x) + x", "0"))
    missing.cells = [cell for cell in missing.cells if cell.id != "test_triple"]
    assert earned(tmp_path, missing) == losing("test_triple")


@pytest.mark.slow
def test_added_or_copied_graded_cells_earn_nothing(tmp_path, solution):
    padded = with_cell_edited(solution, "triple", lambda s: s.replace("double(x) + x", "0"))
    fake = nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {
        "grade": True, "grade_id": "bonus", "locked": True, "points": 100, "schema_version": 3, "solution": False}})
    copy_of_test = next(cell for cell in padded.cells if cell.id == "test_square")
    padded.cells += [fake, nbformat.from_dict(dict(copy_of_test, id="copied"))]
    assert earned(tmp_path, padded) == losing("test_triple")


def test_an_unreadable_notebook_scores_zero_and_says_why(tmp_path):
    (tmp_path / f"{NAME}.ipynb").write_text("{ not json")
    result = grade_notebook(tmp_path / f"{NAME}.ipynb", FIXTURE_CHAPTER, TIMEOUT_S)
    assert {e.grade_id: e.earned for e in result.exercises if e.kind == "test"} == losing(*FULL)
    assert all(e.message.startswith("could not read the notebook") for e in result.exercises)


@pytest.mark.slow
def test_grade_command_prints_the_table_and_exits_zero(tmp_path, solution):
    write_notebook(with_cell_edited(solution, "square", lambda s: s.replace("x * x", "x + x")), tmp_path, NAME)
    command = [sys.executable, "-m", "engine.course.grading.grade", str(tmp_path), "--solutions",
               str(FIXTURE_SOLUTIONS)]
    table = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={"GRADE_CELL_TIMEOUT": "9",
                           "PATH": "/usr/bin:/bin"})
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["chapter", "exercise", "points", "message"]
    square = next(line for line in lines if "test_square" in line)
    assert square.split()[:3] == [NAME, "test_square", "0/1"]
    assert "AssertionError: square(3) should be 9, got 6" in square
    assert "why" in table.stdout and "-/1" in table.stdout and "answered: graded by hand" in table.stdout
    subtotal = next(line for line in lines if "subtotal" in line)
    assert subtotal.split() == [NAME, "subtotal", "5/6", "+1", "graded", "by", "hand"]
    assert lines[-2] == "total: 5/6 points (+1 graded by hand)"
    assert lines[-1].startswith("graded 1 notebook(s) in ")



def test_grade_command_json_has_the_scores_and_the_notes(tmp_path, monkeypatch, capsys):
    # --json formats what grade_directory returned (the grading itself is the table test's run above)
    import engine.course.grading.grade as grade
    exercises = [Exercise("test_square", 1, 0, "test", "AssertionError: no"), Exercise("test_reset", 1, 1, "test"),
                 Exercise("why", 1, None, "manual")]
    graded = ChapterGrade(NAME, f"{NAME}.ipynb", exercises)
    monkeypatch.setattr(grade, "grade_directory", lambda *args, **kwargs: ([graded], ["ch02: no notebook"]))
    write_notebook(load_chapter(FIXTURE_CHAPTER), tmp_path, NAME)
    assert main([str(tmp_path), "--solutions", str(FIXTURE_SOLUTIONS), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["earned"], report["possible"], report["notes"]) == (1, 2, ["ch02: no notebook"])
    [chapter] = report["chapters"]
    assert (chapter["earned"], chapter["possible"], chapter["manual"]) == (1, 2, 1)
    assert [e["grade_id"] for e in chapter["exercises"]] == ["test_square", "test_reset", "why"]


def test_table_format_lists_every_exercise_and_the_total():
    grade = ChapterGrade("ch01_x", "nb", [Exercise("t1", 2, 2, "test"), Exercise("t2", 3, 0, "test", "Boom"),
                                          Exercise("q", 1, None, "manual", "not answered")])
    table = format_table([grade], ["no notebook for ch02_y in notebooks"])
    assert [line.split() for line in table.splitlines()[2:6]] == [
        ["ch01_x", "t1", "2/2"], ["ch01_x", "t2", "0/3", "Boom"], ["ch01_x", "q", "-/1", "not", "answered"],
        ["ch01_x", "subtotal", "2/5", "+1", "graded", "by", "hand"]]
    assert "total: 2/5 points (+1 graded by hand)" in table
    assert table.endswith("no notebook for ch02_y in notebooks")


# A check's message as the notebooks show it: what it did, what it expected, what it got, and the hint
# at the very end (the part a cut message loses first).
LONG = ("CheckFailed: after fork + one different token each, sequence 0: the logits differ from a from-scratch "
        "run of the same sequence at position 10: max |Δ| 0.711 (allowed 1e-05). Hint: did the write land in "
        "a block another sequence still uses? A shared block (refcount > 1) must be copied before it is written")


def test_table_prints_a_long_message_whole_wrapped_under_its_row():
    one = ChapterGrade("ch04_x", "nb", [Exercise("test_diverge", 5, 0, "test", LONG), Exercise("t2", 2, 2, "test")])
    two = ChapterGrade("ch05_y", "nb", [Exercise("test_z", 1, 1, "test"), Exercise("q", 2, None, "manual", "")])
    table = format_table([one, two], [], width=100)
    lines = table.splitlines()
    assert all(len(line) <= 100 for line in lines), table
    row = lines.index(next(line for line in lines if "test_diverge" in line))
    column = lines[row].index("CheckFailed:")
    continued = []
    for line in lines[row + 1:]:
        if line[:column].strip():
            break
        continued.append(line[column:])
    assert len(continued) >= 2, table  # wrapped onto indented lines under the message column
    assert " ".join([lines[row][column:]] + continued) == LONG  # whole, word for word: nothing cut
    assert "at position 10: max |Δ| 0.711 (allowed 1e-05). Hint:" in " ".join(continued)
    assert lines[row + 1 + len(continued)].split()[:2] == ["ch04_x", "t2"]
    subtotals = [line.split() for line in lines if "subtotal" in line]
    assert subtotals == [["ch04_x", "subtotal", "2/7"], ["ch05_y", "subtotal", "1/1", "+2", "graded", "by", "hand"]]
    assert lines[-1] == "total: 3/8 points (+2 graded by hand)"


def test_first_failure_keeps_the_whole_message():
    cell = nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output(
        "error", ename="CheckFailed", evalue=LONG.removeprefix("CheckFailed: "), traceback=[])])
    assert first_failure(cell) == LONG


@pytest.mark.slow
def test_a_long_failure_message_reaches_the_table_and_the_json_whole(tmp_path, solution, capsys):
    long_triple = with_cell_edited(solution, "triple", lambda s: s.replace(
        "return double(x) + x", f"raise AssertionError({LONG.removeprefix('CheckFailed: ')!r})"))
    write_notebook(long_triple, tmp_path, NAME)
    main([str(tmp_path), "--solutions", str(FIXTURE_SOLUTIONS), "--timeout", str(TIMEOUT_S), "--json"])
    report = json.loads(capsys.readouterr().out)
    [triple] = [e for e in report["chapters"][0]["exercises"] if e["grade_id"] == "test_triple"]
    assert triple["earned"] == 0
    assert triple["message"] == "AssertionError: " + LONG.removeprefix("CheckFailed: ")
    assert report["chapters"][0]["earned"] == 4 and report["chapters"][0]["manual"] == 1
    main([str(tmp_path), "--solutions", str(FIXTURE_SOLUTIONS), "--timeout", str(TIMEOUT_S)])
    table = capsys.readouterr().out
    assert "must be copied before it is written" in table
    assert " ".join(table.split()).count("Hint: did the write land in a block another sequence still uses?") == 1


@pytest.mark.slow
def test_a_deleted_locked_setup_cell_is_put_back_and_said(tmp_path, solution):
    # test_square needs `double` from the setup cell (worth 0 points): deleting it used to cost everything.
    missing = nbformat.from_dict(dict(solution))
    missing.cells = [cell for cell in solution.cells if cell.id != "setup"]
    result = grade_notebook(write_notebook(missing, tmp_path, NAME), FIXTURE_CHAPTER, TIMEOUT_S)
    assert {e.grade_id: e.earned for e in result.exercises if e.kind == "test"} == FULL
    assert result.changes and result.changes[0].startswith("the notebook's cells were changed: 1 locked cell")
    assert "setup" in result.changes[0]


@pytest.mark.slow
def test_a_notebook_in_nbformat_3_is_converted_and_graded(tmp_path, solution):
    (tmp_path / f"{NAME}.ipynb").write_text(nbformat.writes(nbformat.convert(copy.deepcopy(solution), 3)))
    result = grade_notebook(tmp_path / f"{NAME}.ipynb", FIXTURE_CHAPTER, TIMEOUT_S)
    assert {e.grade_id: e.earned for e in result.exercises if e.kind == "test"} == FULL
    assert any("saved as nbformat 3" in change for change in result.changes)


@pytest.mark.slow
def test_a_notebook_with_every_cell_deleted_says_what_is_missing(tmp_path, solution):
    empty = nbformat.from_dict(dict(solution))
    empty.cells = []
    result = grade_notebook(write_notebook(empty, tmp_path, NAME), FIXTURE_CHAPTER, TIMEOUT_S)
    assert {e.grade_id: e.earned for e in result.exercises if e.kind == "test"} == losing(*FULL)
    [change] = result.changes
    assert change.startswith("the notebook's cells were changed:")
    assert "solution cell(s) counter, triple, square are missing" in change
    assert "square is not defined in any of your cells" in next(
        e.message for e in result.exercises if e.grade_id == "test_square")
    table = format_table([result], [])
    assert "the notebook's cells were changed" in table


def test_make_grade_takes_a_folder_whose_name_has_a_space(tmp_path):
    folder = tmp_path / "my notebooks"
    folder.mkdir()
    done = subprocess.run(["make", "-s", "grade", f"DIR={folder}"], capture_output=True, text=True, cwd=REPO)
    # the folder reaches the grader whole; it holds no chapter notebook, so there is nothing to grade
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"error: {folder} holds no chapter notebook: nothing to grade" in done.stderr, done.stdout + done.stderr
