"""`make autograde`: how submissions are laid out and collected, and a class that always gets its grades.

The last tests run one autograde (nbgrader's own commands, no sandbox: the sandboxed run is in
test_grade_sandbox) over the fixture chapter with students whose folder names nbgrader cannot take as
ids and students whose notebook cannot be graded at all: everyone else gets a grade and feedback,
everyone appears in grades.csv, and each fault is reported by name.
"""
import contextlib
import csv
import io
import json
import os
import shutil

import nbformat
import pytest

from engine.course import cells
from engine.course.grading.autograde import collect, main, not_graded, student_ids, summary
from engine.course.authoring.nbgrader_course import write_config
from fixtures.course_support import (FIXTURE_CHAPTER, FIXTURE_SOLUTIONS, expanded, stubbed, with_cells_added,
                                     write_notebook)


def test_submissions_are_collected_into_nbgraders_layout(tmp_path):
    submissions, course = tmp_path / "submissions", tmp_path / "course"
    for student in ("ada", "bob"):
        (submissions / student).mkdir(parents=True)
        (submissions / student / "ch99_fixture.ipynb").write_text("{}")
    (submissions / "bob" / "notes.ipynb").write_text("{}")
    for student in ("ada", "bob"):
        write_notebook(stubbed(expanded(FIXTURE_CHAPTER)), submissions / student, "ch99_fixture")
    roster = collect(submissions, course, [FIXTURE_CHAPTER])
    assert sorted(p.relative_to(course).as_posix() for p in roster.copied) == [
        "submitted/ada/ch99/ch99_fixture.ipynb", "submitted/bob/ch99/ch99_fixture.ipynb"]
    assert [f.line() for f in roster.faults] == ["bob/notes.ipynb: no chapter of this course is named notes "
                                                 "(have ch99_fixture)"]


def test_an_empty_submissions_folder_explains_the_layout(tmp_path):
    (tmp_path / "submissions").mkdir()
    with pytest.raises(SystemExit, match=r"expected .*/<student_id>/<chNN_topic>\.ipynb"):
        collect(tmp_path / "submissions", tmp_path / "course", [FIXTURE_CHAPTER])


def test_config_raises_nbgraders_timeout_and_names_the_kernel(tmp_path):
    config = write_config(tmp_path, timeout=600).read_text()
    assert "c.Execute.timeout = 600" in config and 'c.Execute.kernel_name = "python3"' in config
    assert f"c.CourseDirectory.root = {str(tmp_path.resolve())!r}" in config


def test_summary_lists_each_student_and_chapter(tmp_path):
    grades = tmp_path / "grades.csv"
    grades.write_text("assignment,duedate,timestamp,student_id,last_name,first_name,email,raw_score,"
                      "late_submission_penalty,score,max_score\n"
                      "ch02,,,bob,,,,3.0,0.0,3.0,27.0\nch02,,,ada,,,,17.0,0.0,17.0,27.0\n")
    assert summary(grades).splitlines()[1:] == ["ada              ch02   17/27", "bob              ch02   3/27"]


def test_summary_names_a_chapter_a_student_did_not_send(tmp_path):
    grades = tmp_path / "grades.csv"
    grades.write_text("assignment,duedate,timestamp,student_id,last_name,first_name,email,raw_score,"
                      "late_submission_penalty,score,max_score\n"
                      "ch99,,,ada,,,,6.0,0.0,6.0,7.0\nch99,,,bob,,,,0.0,0.0,0.0,7.0\n")
    (tmp_path / "submitted" / "ada" / "ch99").mkdir(parents=True)
    (tmp_path / "submitted" / "bob").mkdir(parents=True)
    lines = summary(grades, [FIXTURE_CHAPTER]).splitlines()
    assert lines[1] == "ada              ch99   6/7"
    assert lines[2] == "bob              ch99   0/7  no notebook for ch99_fixture: 0 in grades.csv"


def test_grades_csv_gets_the_folder_names_and_a_flags_column(tmp_path):
    from engine.course.grading.autograde import Fault, finish_grades
    grades = tmp_path / "grades.csv"
    grades.write_text("assignment,student_id,raw_score\nch99,ada,6.0\nch99,dot-1234abcd,0.0\n")
    (tmp_path / "flags" / "ada").mkdir(parents=True)
    (tmp_path / "flags" / "ada" / "ch99.json").write_text('{"flags": ["counter: verbatim"], "changes": []}')
    finish_grades(grades, tmp_path / "flags", {"ada": "ada", ".dot": "dot-1234abcd"},
                  [Fault(".dot", "ch99_fixture.ipynb", "not JSON", "ch99")])
    assert grades.read_text().splitlines() == ["assignment,student_id,nbgrader_id,raw_score,flags",
                                               "ch99,ada,ada,6.0,counter: verbatim",
                                               "ch99,.dot,dot-1234abcd,0.0,not graded: ch99_fixture.ipynb: not JSON"]


def test_no_feedback_step_when_nbgrader_autograded_nothing(tmp_path, monkeypatch):
    """nbgrader's autograde failing on every submission is reported by student; the feedback step, which
    would stop on "No notebooks were matched" and hide why, is not run."""
    from engine.course.grading import autograde as steps
    from engine.course.grading.cluster import Tally
    ran = []

    def tolerant(course, step, *args):
        ran.append(step)
        return {("ch98", "ada"): "nbgrader autograde failed on it (course/logs/autograde-1.log)"}

    monkeypatch.setattr(steps, "prepare_course", lambda *args, **kwargs: None)
    monkeypatch.setattr(steps, "grade_submissions", lambda *args, **kwargs: Tally(0, progress=lambda line: None))
    monkeypatch.setattr(steps, "enrol", lambda *args: None)
    monkeypatch.setattr(steps, "run_tolerant", tolerant)
    monkeypatch.setattr(steps, "run_nbgrader", lambda course, *args: open(args[-1], "w").write("student_id\n"))
    write_notebook(expanded(FIXTURE_CHAPTER), tmp_path / "submissions" / "ada", FIXTURE_CHAPTER.stem)
    steps.autograde(tmp_path / "submissions", tmp_path / "course", [FIXTURE_CHAPTER], progress=lambda line: None)
    assert ran == ["autograde"]
    assert [f.reason for f in not_graded(tmp_path / "course")] == [
        "nbgrader autograde failed on it (course/logs/autograde-1.log)"]


def test_every_folder_name_gets_an_id_nbgrader_can_take():
    odd = [".dot", "a*b?[c]", "with space", "ünï", "a,b", " x ", "ada"]
    ids = student_ids(odd)
    assert ids["ada"] == "ada" and len(set(ids.values())) == len(odd)
    for name, ident in ids.items():
        assert not ident.startswith(".") and not set(ident) & set("*?[], ") and ident.isascii(), (name, ident)
    assert student_ids(odd) == ids, "ids must not depend on the run"


# ---- one autograde run: odd folder names graded, faulty submissions reported, everyone in grades.csv --

GOOD = {"ada": "solution", ".a *?[c] ü": "solution", "with space": "stubs"}
FAULTS = {   # student -> (file or folder, what it holds) and words its report must hold
    "binary": ("ch99_fixture.ipynb", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not a text file"),
    "truncated": ("ch99_fixture.ipynb", "truncated", "not JSON"),
    "empty": ("ch99_fixture.ipynb", b"", "an empty file"),
    "json": ("ch99_fixture.ipynb", b'{"not": "a notebook"}', "not a notebook"),
    "old_metadata": ("ch99_fixture.ipynb", "old", "nbgrader metadata is corrupted"),
    "folder": ("ch99_fixture.ipynb", None, "a folder named like a notebook"),
    "no_chapter": ("ch97_missing.ipynb", "solution", "no chapter of this course is named ch97_missing"),
}


def _faulty_content(what):
    notebook = expanded(FIXTURE_CHAPTER)
    if what == "solution":
        return nbformat.writes(notebook).encode()
    if what == "truncated":
        return nbformat.writes(notebook).encode()[:300]
    if what == "old":
        for cell in notebook.cells:
            if "nbgrader" in cell.metadata:
                cell.metadata["nbgrader"]["schema_version"] = 1
        return nbformat.writes(notebook).encode()
    return what


@pytest.fixture(scope="module")
def class_run(tmp_path_factory):
    # A folder of this run's own: two runs (two xdist workers, or two suites) sharing one would remove each
    # other's submitted/ under nbgrader, which then stops on "No notebooks were matched".
    root = tmp_path_factory.mktemp("autograde-faults")
    submissions = root / "submissions"
    for student, kind in GOOD.items():
        notebook = expanded(FIXTURE_CHAPTER)
        write_notebook(notebook if kind == "solution" else stubbed(notebook), submissions / student, "ch99_fixture")
    for student, (entry, content, _) in FAULTS.items():
        path = submissions / student / entry
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if content is None else path.write_bytes(_faulty_content(content))
    os.mkdir(os.fsencode(submissions) + b"/bad\xff")                  # a folder name that is not UTF-8
    (submissions / "stray.ipynb").write_text("{}")                    # not in a student folder
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(submissions), "--course", str(root / "course"), "--solutions", str(FIXTURE_SOLUTIONS),
                       "--sandbox", "off", "--timeout", "60", "--jobs", "2"])
    return root / "course", status, out.getvalue(), err.getvalue()


def test_everyone_else_is_graded_with_feedback(class_run):
    course = class_run[0]
    rows = {row["student_id"]: row for row in csv.DictReader((course / "grades.csv").open(newline=""))}
    full = sum(cells.points(c) for c in expanded(FIXTURE_CHAPTER).cells if cells.is_test(c))   # written answers aside
    assert {name: float(rows[name]["raw_score"] or 0) for name in GOOD} == {
        "ada": full, ".a *?[c] ü": full, "with space": 0.0}
    for name in GOOD:
        assert (course / "feedback" / rows[name]["nbgrader_id"] / "ch99" / "ch99_fixture.html").is_file(), name
    assert rows[".a *?[c] ü"]["nbgrader_id"] != ".a *?[c] ü"


def test_each_fault_is_reported_by_student_with_its_reason(class_run):
    course, status = class_run[:2]
    assert status == 1
    reported = {(f.student, f.entry): f.reason for f in not_graded(course)}
    for student, (entry, _, words) in FAULTS.items():
        assert words in reported.get((student, entry), ""), (student, reported)
    assert "not valid UTF-8" in reported[("bad\\xff", "")]
    assert "not in a student folder" in reported[("stray.ipynb", "")]
    rows = {row["student_id"]: row for row in csv.DictReader((course / "grades.csv").open(newline=""))}
    for student, (entry, _, words) in FAULTS.items():   # in grades.csv too, with 0 and the reason
        assert student in rows and float(rows[student]["score"]) == 0, student
        if student != "no_chapter":
            assert rows[student]["flags"].startswith("not graded:") and words in rows[student]["flags"]


def test_the_summary_and_the_exit_line(class_run):
    _, _, out, err = class_run
    [line] = err.strip().splitlines()
    assert line.startswith("autograde: 9 submission(s) could not be graded (everyone else is in grades.csv): ")
    for student, (entry, _, _) in FAULTS.items():
        assert f"{student}/{entry}: " in line
    assert "bad\\xff: refused" in line
    assert ".a *?[c] ü       ch99" in out and "not graded: ch99_fixture.ipynb: a folder named like a notebook" in out


# ---- result records: authenticated, refused when rewritten, moved or for another notebook ------------

def _class_in_course(course, students):
    """course/submitted/<student>/ch99/ch99_fixture.ipynb for each, every notebook different."""
    paths = []
    for number, student in enumerate(students):
        notebook = with_cells_added(expanded(FIXTURE_CHAPTER), "setup", f"student = {student!r}  # {number}")
        paths.append(write_notebook(notebook, course / "submitted" / student / "ch99", FIXTURE_CHAPTER.stem))
    return paths


def test_rewritten_moved_or_foreign_records_are_refused_and_graded_again(tmp_path, monkeypatch):
    from engine.course.grading import cluster_task
    from engine.course.grading.autograde import grade_submissions
    from engine.course.authoring.nbgrader_course import cached_result, result_path
    graded = []

    def grade_file(notebook, chapter, workdir, timeout, sandbox, limits, hide):   # the sealed run, stood in for
        graded.append(notebook.parent.parent.name)
        result = {"outputs": {"grade:test_increment": [{"output_type": "stream", "name": "stdout",
                                                        "text": notebook.parent.parent.name}]},
                  "flags": [], "changes": [], "grader": cluster_task.settings(chapter, timeout, sandbox, limits)}
        return result, "6/6"

    monkeypatch.setattr(cluster_task, "grade_file", grade_file)
    course, work = tmp_path / "course", tmp_path / "course" / "sandbox"
    students = ["ada", "bob", "cy", "dan"]
    copied = _class_in_course(course, students)

    def run():
        graded.clear()
        grade_submissions(copied, course, [FIXTURE_CHAPTER], 60, 2, "off", [], progress=lambda line: None)
        return sorted(graded)

    assert run() == students
    key = course / "instructor" / "result-key"
    assert oct(key.stat().st_mode & 0o777) == "0o600" and oct(key.parent.stat().st_mode & 0o777) == "0o700"
    record = {s: result_path(work, s, "ch99") for s in students}
    assert all(cached_result(work, s, "ch99", path) is not None for s, path in zip(students, copied))
    assert run() == [], "authentic results for the same notebooks are kept"

    rewritten = json.loads(record["ada"].read_text())      # ada's result rewritten, its HMAC kept
    rewritten["result"]["outputs"]["grade:test_increment"][0]["text"] = "forged"
    record["ada"].write_text(json.dumps(rewritten))
    shutil.copyfile(record["cy"], record["bob"])           # cy's record moved to bob
    copied[3].write_text(copied[3].read_text().replace("# 3", "# 3, sent again"))   # dan's notebook changed
    kept = record["cy"].read_bytes()
    assert [cached_result(work, s, "ch99", path) is None for s, path in zip(students, copied)] == \
        [True, True, False, True]
    assert run() == ["ada", "bob", "dan"], "each refused record graded again, the rest as they were"
    assert record["cy"].read_bytes() == kept
    assert json.loads(record["bob"].read_text())["student"] == "bob"
    assert all(cached_result(work, s, "ch99", path) is not None for s, path in zip(students, copied))


def test_an_unsigned_record_or_one_without_the_courses_key_is_refused(tmp_path):
    from engine.course.authoring.nbgrader_course import (cached_result, file_digest, result_key, result_path,
                                                         write_result)
    course = tmp_path / "course"
    [path] = _class_in_course(course, ["ada"])
    work, digest = course / "sandbox", file_digest(path)
    result = {"outputs": {}, "flags": [], "changes": []}
    target = result_path(work, "ada", "ch99")
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps({"sha256": digest, **result}))        # the unsigned record of old
    assert cached_result(work, "ada", "ch99", path) is None
    write_result(work, "ada", "ch99", digest, result, b"not the course's key")
    assert result_key(course) is None and cached_result(work, "ada", "ch99", path) is None
    write_result(work, "ada", "ch99", digest, result, result_key(course, create=True))
    assert cached_result(work, "ada", "ch99", path) == result
    assert cached_result(work, "ada", "ch99", path, grader={"timeout": 1}) is None   # other settings: not reused
