"""`make autograde`: how submissions are laid out and collected (the nbgrader run itself is in test_course_pipeline)."""
import pytest

from engine.course.autograde import collect, summary
from engine.course.nbgrader_course import write_config
from fixtures.course_support import FIXTURE_CHAPTER


def test_submissions_are_collected_into_nbgraders_layout(tmp_path):
    submissions, course = tmp_path / "submissions", tmp_path / "course"
    for student in ("ada", "bob"):
        (submissions / student).mkdir(parents=True)
        (submissions / student / "ch99_fixture.ipynb").write_text("{}")
    (submissions / "bob" / "notes.ipynb").write_text("{}")
    copied, notes = collect(submissions, course, [FIXTURE_CHAPTER])
    assert sorted(p.relative_to(course).as_posix() for p in copied) == [
        "submitted/ada/ch99/ch99_fixture.ipynb", "submitted/bob/ch99/ch99_fixture.ipynb"]
    assert len(notes) == 1 and "notes.ipynb: not a chapter notebook (ch99_fixture)" in notes[0]


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


def test_grades_csv_gets_a_flags_column(tmp_path):
    from engine.course.autograde import add_flags
    grades = tmp_path / "grades.csv"
    grades.write_text("assignment,student_id,raw_score\nch99,ada,6.0\nch99,bob,0.0\n")
    (tmp_path / "flags" / "ada").mkdir(parents=True)
    (tmp_path / "flags" / "ada" / "ch99.json").write_text('{"flags": ["counter: verbatim"], "changes": []}')
    add_flags(grades, tmp_path / "flags")
    assert grades.read_text().splitlines() == ["assignment,student_id,raw_score,flags",
                                               "ch99,ada,6.0,counter: verbatim", "ch99,bob,0.0,"]
