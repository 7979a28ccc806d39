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
