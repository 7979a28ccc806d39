"""Issue 36's attack classes, each graded as `make grade` grades it, against a control.

Each attack (tests/fixtures/hostile_notebooks.py) is a notebook a learner could hand in: the judge's own
swap kept through the cache a check handed the scheduler (ch07), an exercise raising the student
edition's "not written yet" so the checks skip it (ch05), a host that adds the checks themselves to its
answer to the judge's lookup (ch03, from the release notebook), an exercise answering with 20 million
values (ch02). Each control is the same notebook with that exercise honestly unwritten. An attack earns
at most its control's points, and the flood costs only its own test, in seconds.
"""
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.course.grading import sandbox
from engine.course.grading.grade import grade_notebook, sandboxed_grade
from fixtures.course_support import BUILD, once_per_run
from fixtures.hostile_notebooks import notebooks, write_all

pytestmark = [pytest.mark.slow]
TIMEOUT_S = 60
# attack -> its control (None: the chapter's solution, every test but the flooded one passing)
PAIRS = {"ch07_borrowed_swap": "ch07_control", "ch05_fake_not_written": "ch05_control",
         "ch03_extra_names": "ch03_control", "ch02_huge_list": None}


def grade_all() -> dict:
    """{notebook: {"earned": {test: points}, "messages": {test: message}, "seconds": s}}."""
    import time
    grader = sandboxed_grade if sandbox.available()[0] else grade_notebook
    wanted = set(PAIRS) | {c for c in PAIRS.values() if c}
    written = write_all(BUILD / "attacks")

    def one(name):
        path, chapter = written[name]
        started = time.monotonic()
        result = grader(path, chapter, TIMEOUT_S)
        return name, {"earned": {e.grade_id: e.earned for e in result.exercises if e.kind == "test"},
                      "messages": {e.grade_id: e.message for e in result.exercises if e.kind == "test"},
                      "seconds": time.monotonic() - started}
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, sorted(wanted)))


@pytest.fixture(scope="module")
def graded():
    assert set(PAIRS) <= set(notebooks())
    return once_per_run("attack-grade", grade_all)


@pytest.mark.parametrize("attack", [a for a, c in PAIRS.items() if c])
def test_an_attack_earns_no_more_than_its_control_in_any_test(graded, attack):
    got, control = graded[attack]["earned"], graded[PAIRS[attack]]["earned"]
    gained = {test: (control[test], points) for test, points in got.items() if points > control[test]}
    assert not gained, f"{attack} earned more than {PAIRS[attack]} (control, attack): {gained}"


def test_a_flood_of_values_costs_its_own_test_only_and_stops_at_the_bound(graded):
    flood = graded["ch02_huge_list"]
    lost = {test for test, points in flood["earned"].items() if points == 0}
    assert lost == {"ch02_test_slot_mapping"}, flood["messages"]
    assert "the grader's bound is" in flood["messages"]["ch02_test_slot_mapping"], flood["messages"]
    assert flood["seconds"] < 300, flood["seconds"]          # issue 36 measured 735 s before the bound
