"""Issue 36's attack classes, graded by `make autograde`, each against a control.

Each attack (tests/fixtures/hostile_notebooks.py) is a notebook a learner could hand in: the judge's own
swap kept through the cache a check handed the scheduler (ch07), an exercise raising the student
edition's "not written yet" so the checks skip it (ch05), a host that adds the checks themselves to its
answer to the judge's lookup (ch03, from the release notebook), kernels whose bodies reach Python's
builtins and try to blank the checks and every result record in the class (ch06, from the release
notebook), an exercise answering with 20 million values (ch02). Each control is the same notebook with
that exercise honestly unwritten. An attack passes no test its control fails, the flood costs only its
own test (in seconds under `make grade` too), and a classmate who hands in every attacked chapter's
solution keeps full marks and unchanged files.
`python tests/fixtures/attack_runs.py grade` prints each attack's points under `make grade`.
"""
import pytest

from fixtures.attack_runs import CHAPTERS, CLASSMATE, PAIRS, full_points, graded_by_autograde, graded_by_make_grade
from fixtures.course_support import once_per_run, sandbox_or_skip
from fixtures.hostile_notebooks import notebooks

pytestmark = [pytest.mark.slow]
ATTACKS = [a for a, c in PAIRS.items() if c]
FLOODED = "ch02_test_slot_mapping"


@pytest.fixture(scope="module")
def flooded():
    assert set(PAIRS) <= set(notebooks())
    return once_per_run("attack-grade", lambda: graded_by_make_grade({"ch02_huge_list"}))["ch02_huge_list"]


@pytest.fixture(scope="module")
def autograded():
    sandbox_or_skip()
    return once_per_run("attack-autograde", graded_by_autograde)


def test_under_make_grade_a_flood_of_values_costs_its_own_test_only_and_stops_at_the_bound(flooded):
    lost = {test for test, points in flooded["earned"].items() if points == 0}
    assert lost == {FLOODED}, flooded["messages"]
    assert "the grader's bound is" in flooded["messages"][FLOODED], flooded["messages"]
    assert flooded["seconds"] < 300, flooded["seconds"]          # issue 36 measured 735 s before the bound


@pytest.mark.parametrize("attack", ATTACKS)
def test_under_autograde_an_attack_passes_no_test_its_control_fails(autograded, attack):
    control = PAIRS[attack]
    chapter = attack[:4]
    passed_only_by_attack = set(autograded["failed"].get(control, {})) - set(autograded["failed"].get(attack, {}))
    assert not passed_only_by_attack, (attack, passed_only_by_attack)
    assert autograded["scores"][attack][chapter] <= autograded["scores"][control][chapter], autograded["scores"]


def test_under_autograde_the_flood_costs_its_own_test_only(autograded):
    failed = autograded["failed"].get("ch02_huge_list", {})
    assert set(failed) == {FLOODED}, failed
    assert "the grader's bound is" in failed[FLOODED], failed


def test_under_autograde_the_classmate_keeps_full_marks_and_their_files(autograded):
    want = {chapter.stem[:4]: full_points(chapter) for chapter in CHAPTERS}
    got = autograded["scores"][CLASSMATE]
    assert got == want, (got, autograded["failed"].get(CLASSMATE))
    assert CLASSMATE not in autograded["failed"]
    assert autograded["classmate_files_changed"] == []
