"""A notebook process that dies during a test is started again, with the cells that ran cleanly run
again, and the later tests earn their points: the restart path, through a death the judge's static
screen lets by.

os._exit, signals and ctypes are refused from the cell's text (tests/test_course_grade.py), so the
host here dies the way a cell may still make it die: it lowers its own CPU-time limit (RLIMIT_CPU)
below what it has used and spins, and the kernel ends it with SIGXCPU, deterministically, within
milliseconds. The grader's CPU budget (host.cpu_limit) is seconds away, so it is not what stops it.
"""
import pytest

from engine.course.grading.grade import grade_notebook
from engine.course.authoring.source import load_chapter
from fixtures.course_support import FIXTURE_CHAPTER, with_cell_edited, write_notebook

pytestmark = [pytest.mark.slow]
FULL = {"test_increment": 2, "test_reset": 1, "test_triple": 2, "test_square": 1}
DIE = ("import resource\n"
       "    resource.setrlimit(resource.RLIMIT_CPU, (1, resource.getrlimit(resource.RLIMIT_CPU)[1]))\n"
       "    while True:\n        pass")


def test_a_host_killed_during_a_test_is_restarted_and_later_tests_earn_their_points(tmp_path):
    # triple kills its process when test_triple calls it; test_square needs `double` from the setup
    # cell, which only the replay after the restart defines again.
    dying = with_cell_edited(load_chapter(FIXTURE_CHAPTER), "triple",
                             lambda s: s.replace("return double(x) + x", DIE))
    result = grade_notebook(write_notebook(dying, tmp_path, "ch99_fixture"), FIXTURE_CHAPTER, 8)
    earned = {e.grade_id: e.earned for e in result.exercises if e.kind == "test"}
    assert earned == dict(FULL, test_triple=0), {e.grade_id: e.message[:160] for e in result.exercises}
    [message] = [e.message for e in result.exercises if e.grade_id == "test_triple"]
    assert "the other process closed the connection" in message, message     # the judge saw the host die
