"""A class's course folder (engine/course/classroom/class_folder.py) and its reports (reports.py, export.py).

The cheap parts run in-process: the roster, the late-submission plugin, flag codes, a notebook of
the wrong chapter. One flow with nbgrader's own commands (slow): `prepare` makes the course folder and
gradebook with no submission; through the exchange ada submits twice (untouched, then the solution),
bob submits the solution after the due date, cy hands in another chapter's notebook under ch98's
name, eve leaves it untouched but adds a cell that replaces the checks with ones that always pass, and
dan hands in nothing; `grade` collects, grades each submission in the sandbox, gives feedback and
reports; nbgrader's own export agrees.
"""
import csv
import os
import re
import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest

from engine.course import cells

from engine.course.classroom import class_folder, reports
from engine.course.classroom.class_folder import LatePenalty, read_roster
from fixtures.course_support import (FIXTURE_CHAPTER, REPO, SEALED_CHAPTER, exchange_folders, expanded, nbgrader,
                                     sandbox_or_skip, stubbed)
from fixtures.sealed_cases import NOOP_CHECKS

ROSTER = """\
[course]
late_penalty_per_day = 0.25   ; a quarter of the score per started day late
[chapters]
ch98 = {due}
[instructors]
grace = Grace Hopper <grace@example.edu>
[students]
ada = Ada Lovelace <ada@example.edu>
bob = Bob Byte
cy = Cy Borg
dan = Dan Idle
eve = Eve Early
"""


def test_roster_gives_students_chapters_and_due_dates(tmp_path):
    path = tmp_path / "roster.ini"
    path.write_text(ROSTER.format(due="2027-02-01 23:59"))
    roster = read_roster(path)
    assert [p.ident for p in roster.students] == ["ada", "bob", "cy", "dan", "eve"]
    assert (roster.students[0].first_name, roster.students[0].last_name, roster.students[0].email) == \
        ("Ada", "Lovelace", "ada@example.edu")
    assert roster.instructors[0].ident == "grace" and roster.late_penalty_per_day == 0.25
    assert roster.due == {"ch98": datetime(2027, 2, 1, 23, 59, tzinfo=timezone.utc)}


@pytest.mark.parametrize("line, words", [
    ("ch98 = 1 February", "[chapters] ch98 = 1 February: expected a UTC due date YYYY-MM-DD HH:MM (or HH:MM:SS)"),
    ("chapter2 = 2027-02-01 23:59", "[chapters] chapter2: a chapter is named chNN (e.g. ch02)"),
])
def test_roster_refuses_a_bad_line_naming_it(tmp_path, line, words):
    path = tmp_path / "roster.ini"
    path.write_text(ROSTER.format(due="2027-02-01 23:59").replace("ch98 = 2027-02-01 23:59", line))
    with pytest.raises(SystemExit) as refused:
        read_roster(path)
    assert str(refused.value) == f"roster {path}: {words}"


def test_late_penalty_is_a_share_of_the_score_per_started_day_capped_at_all():
    plugin = LatePenalty(per_day=0.25)
    assert plugin.late_submission_penalty("ada", 8.0, 1) == 2.0          # one second late: one day
    assert plugin.late_submission_penalty("ada", 8.0, 86400 * 2 + 1) == 6.0
    assert plugin.late_submission_penalty("ada", 8.0, 86400 * 30) == 8.0  # never more than the score


def test_flags_become_short_codes_each_once():
    flags = ["ch02_allocate: typed in, the reference's code (copied, renamed or reformatted): x" * 20,
             "ch02_test: refused: allocate is not a function written with def in your cell: the exercise must be "
             "your own code", "not sandboxed: no bwrap",
             "ch02_alloc: typed in, the reference's code (copied, renamed or reformatted): y"]
    assert reports.flag_codes(flags) == "NOSANDBOX COPY OWN"
    assert reports.flag_code("the notebook's cells were changed: 1 locked cell(s) were missing and were put "
                             "back from the chapter (ch02_setup)") == "EDITED"     # a slip, not tampering
    assert reports.flag_code("this is ch03_paged_cache, handed in as ch02") == "WRONGCH"
    assert reports.flag_code("something new") == "OTHER"


def test_a_notebook_of_another_chapter_is_named():
    chapters = [REPO / "solutions" / "ch02_block_tables.py", REPO / "solutions" / "ch03_paged_cache.py"]
    assert reports.wrong_chapter(REPO / "notebooks" / "ch03_paged_cache.ipynb", "ch02", chapters) == \
        "this is ch03_paged_cache, handed in as ch02"
    assert reports.wrong_chapter(REPO / "notebooks" / "ch02_block_tables.ipynb", "ch02", chapters) == ""
    # a chapter the course does not have is named by its number (a notebook without chNN_ ids: see the flow)
    assert reports.wrong_chapter(REPO / "notebooks" / "ch02_block_tables.ipynb", "ch98", [SEALED_CHAPTER]) == \
        "this is ch02, handed in as ch98"


def test_collect_takes_only_what_nbgrader_submit_made_and_names_the_rest(tmp_path):
    from engine.course.classroom.inbound import is_account, sort_inbound
    stamp = "2027-02-01 10:00:00.000000 UTC"
    for name, files in ((f"ada+ch98+{stamp}+a1", ["timestamp.txt", "submission_secret.txt", "ch98_sealed.ipynb"]),
                        (f"bob+ch98+{stamp}+b1", ["timestamp.txt", "ch98_sealed.ipynb"]),
                        ("garbage", ["x"]), (f"cy+ch97+{stamp}+c1", ["timestamp.txt"])):
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text("x")
    (tmp_path / f"dan+ch98+{stamp}+d1").symlink_to(tmp_path / f"ada+ch98+{stamp}+a1")
    (tmp_path / f"eve+ch98+{stamp}+e1").mkdir()
    (tmp_path / f"eve+ch98+{stamp}+e1" / "submission_secret.txt").symlink_to("/etc/passwd")
    taken, refused = sort_inbound(tmp_path, "ch98", require_owner=False)
    assert [e.student for e in taken] == ["ada"]
    said = {e.name.split("+")[0]: e.why for e in refused}
    assert said["bob"].startswith("no submission_secret.txt (not made by nbgrader submit), put there by ")
    assert said["garbage"].startswith("not a submission's name (STUDENT+CHAPTER+TIME), put there by ")
    assert said["dan"].startswith("not a folder") and said["eve"].startswith("holds a symbolic link")
    assert "cy" not in said                                  # another chapter's: not this round's business
    forged = tmp_path / f"nobody+ch98+{stamp}+n1"           # an account's name, another account's files
    shutil.copytree(tmp_path / f"ada+ch98+{stamp}+a1", forged)
    checked = {e.name.split("+")[0]: e.why for e in sort_inbound(tmp_path, "ch98")[1]}
    assert checked["ada"].startswith("names ada, who has no account here; put there by ")
    if is_account("nobody") and os.geteuid() != 65534:
        assert checked["nobody"].startswith("claims to be nobody's, but is owned by "), checked


def test_lateness_reads_in_its_own_unit():
    assert [reports.duration(t) for t in (18, 1500, 3.5 * 3600, 2.1 * 86400)] == \
        ["18 s", "25 min", "3.5 h", "2.1 days"]


def test_a_wrong_chapter_keeps_its_row_when_another_chapter_is_graded(tmp_path, monkeypatch):
    from nbgrader.api import Gradebook
    from engine.course.grading.autograde import Fault
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")   # nbgrader's alembic
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}", "paged-kv-course") as gradebook:
        gradebook.update_or_create_student("cy")
        gradebook.update_or_create_assignment("ch98")
    reports.record_faults(tmp_path, "ch98", [Fault("cy", "ch98_sealed.ipynb", "this is ch02, handed in as ch98",
                                                   "ch98")])
    reports.record_faults(tmp_path, "ch97", [])                 # a later round, another chapter
    rows = reports.class_rows(tmp_path, None, [SEALED_CHAPTER], faults=[Fault("bob", "x", "why", "ch97")])
    assert [(r["student_id"], r["score"], r["flags"]) for r in rows] == [("cy", 0.0, "WRONGCH")]


def test_written_answers_not_graded_yet_are_shown_so_never_as_zero(tmp_path):
    summary = [{"chapter": "ch98_sealed", "exercise": "ch98_review", "max_points": "2", "students": 2,
                "mean": reports.NOT_GRADED_YET, "full_marks": 0, "most_failed_check": "", "failed": 0,
                "message": ""}]
    reports.write_summary(tmp_path, summary)
    assert "| ch98_review | not graded yet / 2 |" in (tmp_path / "summary.md").read_text()


# ---- the class through nbgrader's exchange --------------------------------------------------------


@pytest.mark.slow
def test_a_class_from_roster_to_reports_through_the_exchange():
    from nbgrader.api import Gradebook
    sandbox_or_skip()
    exchange, course, homes = exchange_folders("class")
    roster_file = course.parent / "roster.ini"
    roster_file.write_text(ROSTER.format(due="2099-01-01 00:00"))

    # prepared with no submission: the course folder, the chapter released, the gradebook from the roster
    class_folder.prepare(course, roster_file, SEALED_CHAPTER.parent, str(exchange))
    assert (course / "release" / "ch98" / "ch98_sealed.ipynb").is_file() and not (course / "submitted").exists()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "paged-kv-course") as gradebook:
        assert sorted(s.id for s in gradebook.students) == ["ada", "bob", "cy", "dan", "eve"]
        assert gradebook.find_student("ada").email == "ada@example.edu"
        assert gradebook.find_assignment("ch98").duedate == datetime(2099, 1, 1)
    nbgrader(course, "release_assignment", "ch98", "--force", user="grace")

    solution = {cells.grade_id(c): c.source for c in expanded(SEALED_CHAPTER).cells if cells.is_solution(c)}
    other_chapter = stubbed(expanded(FIXTURE_CHAPTER))

    def submit(student, work):
        home = homes / student
        if not home.is_dir():
            home.mkdir(parents=True)
            (home / "nbgrader_config.py").write_text(
                f"c = get_config()\nc.CourseDirectory.course_id = 'paged-kv-course'\n"
                f"c.Exchange.root = {str(exchange)!r}\n")
            nbgrader(home, "fetch_assignment", "ch98", user=student, home=home)
        path = home / "ch98" / "ch98_sealed.ipynb"
        notebook = nbformat.read(path, as_version=4)
        if work == "solution":
            for cell in notebook.cells:
                if cells.grade_id(cell) in solution:
                    cell.source = solution[cells.grade_id(cell)]
        if work == "cheat":           # the checks replaced by ones that always pass: still nothing earned
            notebook.cells.insert(3, nbformat.v4.new_code_cell(NOOP_CHECKS))
        nbformat.write(other_chapter if work == "other chapter" else notebook, path)
        nbgrader(home, "submit", "ch98", f"--student={student}", user=student, home=home)

    submit("ada", "untouched")
    submit("ada", "solution")        # the resubmission replaces the first
    submit("eve", "cheat")
    submit("cy", "other chapter")
    # the due date moves to now (the instructor edits the roster and prepares again): bob is late
    due = datetime.now(timezone.utc) - timedelta(seconds=1)
    roster_file.write_text(ROSTER.format(due=due.strftime("%Y-%m-%d %H:%M:%S")))   # to the second: ada was on time
    class_folder.prepare(course, roster_file, SEALED_CHAPTER.parent, str(exchange))
    submit("bob", "solution")

    outputs = class_folder.grade(course, "ch98", jobs=2, release=True, progress=lambda line: None)
    rows = {r["student_id"]: r for r in csv.DictReader((course / "grades.csv").open(newline=""))}
    assert sorted(rows) == ["ada", "bob", "cy", "eve"]          # one row per chapter handed in: no dan
    assert (rows["ada"]["score"], rows["ada"]["late_penalty"], rows["ada"]["submissions"]) == ("5", "0", "2")
    assert rows["ada"]["flags"] == "COPY RESUBMITTED"           # codes; the full text is in the report
    assert (rows["bob"]["raw_score"], rows["bob"]["late_penalty"], rows["bob"]["score"]) == ("5", "1.25", "3.75")
    assert "LATE" in rows["bob"]["flags"].split() and int(rows["bob"]["seconds_late"]) > 0
    assert (rows["cy"]["score"], rows["cy"]["flags"]) == ("0", "WRONGCH")
    assert rows["eve"]["score"] == "0"
    assert (course / "sandbox" / "work" / "ada" / "ch98").is_dir()   # each graded in its own sandbox folder
    assert rows["bob"]["due"].startswith(due.strftime("%Y-%m-%d %H:%M"))

    history = [r for r in csv.DictReader((course / "submissions.csv").open()) if r["student_id"] == "ada"]
    assert len(history) == 2 and [r["graded"] for r in history] == ["no", "yes"]   # both kept, the last graded
    assert [r["graded"] for r in csv.DictReader((course / "submissions.csv").open()) if r["student_id"] == "cy"] == \
        ["no"]                                                    # the wrong chapter: set aside, not graded
    assert history[0]["submitted_at"] < history[1]["submitted_at"]

    ada = (outputs["student reports"] / "ada.md").read_text()
    assert "typed in, the reference's code" in ada and "2 submissions" in ada and "ch98_sealed: 5/5" in ada
    assert "this is not ch98_sealed: none of its graded cells" in (outputs["student reports"] / "cy.md").read_text()
    feedback = next((course / "feedback" / "bob" / "ch98").glob("*.html")).read_text()
    assert "Notes from the grader" in feedback and re.search(r"late: \d+ (s|min) after", feedback)
    wrong = (course / "feedback" / "cy" / "ch98" / "ch98_sealed.html").read_text()   # cy is told what was handed in
    assert "ch98_sealed.ipynb was not graded (0 points)" in wrong and "this is not ch98_sealed" in wrong

    summary = list(csv.DictReader((course / "reports" / "summary.csv").open()))
    assert [r["exercise"] for r in summary] == ["ch98_physical_slot", "ch98_allocator", "ch98_shared_blocks"]
    assert all((r["students"], r["full_marks"], r["failed"]) == ("3", "2", "1") for r in summary)
    assert all(r["most_failed_check"].startswith("ch98_test_") and r["message"] for r in summary)
    assert (course / "reports" / "summary.png").stat().st_size > 1000

    with outputs["export"].open(newline="") as handle:
        exported = list(csv.reader(handle))
    assert exported[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "ch98_sealed", "Total"]
    assert exported[1] == ["Points Possible", "", "", "", "", "5", "5"]
    by_id = {row[2]: row for row in exported[2:]}
    assert by_id["ada"] == ["Lovelace, Ada", "", "ada", "ada@example.edu", "", "5", "5"]
    assert by_id["bob"][5:] == ["3.75", "3.75"] and by_id["dan"][5:] == ["", "0"] and by_id["cy"][5:] == ["0", "0"]

    nbgrader(course, "export", "--to", str(course / "nbgrader-grades.csv"), user="grace")
    raw = {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader((course / "nbgrader-grades.csv").open())}
    assert (raw["ada"], raw["eve"], raw["cy"]) == (5.0, 0.0, 0.0)

    # the feedback was released: ada fetches it
    nbgrader(homes / "ada", "fetch_feedback", "ch98", "--student=ada", user="ada", home=homes / "ada")
    assert list((homes / "ada" / "ch98" / "feedback").rglob("ch98_sealed.html"))
    nbgrader(homes / "cy", "fetch_feedback", "ch98", "--student=cy", user="cy", home=homes / "cy")
    assert list((homes / "cy" / "ch98" / "feedback").rglob("ch98_sealed.html"))
