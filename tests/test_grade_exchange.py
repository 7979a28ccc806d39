"""The nbgrader exchange end to end, with nbgrader's own commands and the course's configuration.

The instructor releases the fixture chapter; two students, each with their own home folder, fetch it,
work (ada pastes the solution, bob leaves the stubs and adds a cheat), and submit; the instructor
collects, autogrades (the sealed worker, in the bubblewrap sandbox), generates and releases feedback;
the students fetch it; the instructor exports grades.csv.
"""
import csv
import os

import nbformat
import pytest

from engine.course import cells
from engine.course.nbgrader_course import stage_sources, write_config
from fixtures.course_support import exchange_folders, nbgrader, SEALED_CHAPTER, expanded, sandbox_or_skip
from fixtures.sealed_cases import NOOP_CHECKS

pytestmark = [pytest.mark.slow]
ASSIGNMENT = "ch98"


def test_release_fetch_submit_collect_autograde_feedback_export():
    sandbox_or_skip()
    exchange, course, homes = exchange_folders("exchange")
    settings = f"c.Exchange.root = {str(exchange)!r}\n"
    write_config(course, timeout=60, solutions=SEALED_CHAPTER.parent, sandbox="required",
                 hide=[exchange, homes], extra=settings)
    stage_sources(course, [SEALED_CHAPTER])
    nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
    nbgrader(course, "release_assignment", ASSIGNMENT, "--force")

    solution = {cells.grade_id(c): c.source for c in expanded(SEALED_CHAPTER).cells if cells.is_solution(c)}
    for student in ("ada", "bob"):
        home = homes / student
        home.mkdir(parents=True)
        (home / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.CourseDirectory.course_id = 'paged-kv-course'\n{settings}")
        nbgrader(home, "fetch_assignment", ASSIGNMENT, user=student, home=home)
        path = home / ASSIGNMENT / f"{SEALED_CHAPTER.stem}.ipynb"
        notebook = nbformat.read(path, as_version=4)
        for cell in notebook.cells:
            if student == "ada" and cells.grade_id(cell) in solution:
                cell.source = solution[cells.grade_id(cell)]
        if student == "bob":
            notebook.cells.insert(3, nbformat.v4.new_code_cell(NOOP_CHECKS))
        nbformat.write(notebook, path)
        # one OS account for both here: name the student (on JupyterHub each student is their own user)
        nbgrader(home, "submit", ASSIGNMENT, f"--student={student}", user=student, home=home)

    nbgrader(course, "collect", ASSIGNMENT)
    nbgrader(course, "autograde", ASSIGNMENT, "--force")
    nbgrader(course, "generate_feedback", ASSIGNMENT, "--force")
    nbgrader(course, "release_feedback", ASSIGNMENT)
    for student in ("ada", "bob"):
        home = homes / student
        nbgrader(home, "fetch_feedback", ASSIGNMENT, f"--student={student}", user=student, home=home)
        assert list((home / ASSIGNMENT / "feedback").rglob(f"{SEALED_CHAPTER.stem}.html")), student
    nbgrader(course, "export", "--to", str(course / "grades.csv"))
    scores = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader((course / "grades.csv").open())}
    assert scores == {"ada": 5.0, "bob": 0.0}
    assert (course / "sandbox" / "work" / "ada" / ASSIGNMENT).is_dir()  # graded in its own sandbox folder
    assert not os.path.exists(homes / "ada" / "pwned")
