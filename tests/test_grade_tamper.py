"""Scores learner code cannot forge, and exercises that must be the learner's own code (make grade).

Each case (tests/fixtures/sealed_cases.py) is graded as the learner's `make grade` does, in the sealed
worker, its host in the sandbox where bubblewrap works; a cheat earns exactly the honest score of what
it leaves (0 here), whatever it does to the checks, torch, the builtins, sys.modules, the interpreter,
the disk or the grader's channel, and honest habits (imports, files, magics, decorators) keep every
point: no list of names is read from the cells, only whether each graded name is the learner's own def
or class. The same cases go through nbgrader's autograde in tests/test_grade_sandbox.py.
"""
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.course.grading import sandbox
from engine.course.grading.grade import grade_notebook, sandboxed_grade
from fixtures.course_support import BUILD, SEALED_CHAPTER, once_per_run, write_notebook
from fixtures.sealed_cases import CASES, NEEDS_SANDBOX, OWN, SLOT

pytestmark = [pytest.mark.slow]
TIMEOUT_S = 30


def grade_all() -> dict:
    """{case: {"earned": {test: points}, "messages": {test: message}, "flags": [...]}} for every case
    (those that need the sandbox left out where there is none)."""
    boxed = sandbox.available()[0]
    grader = sandboxed_grade if boxed else grade_notebook

    def one(name):
        make = CASES[name][0]
        path = write_notebook(make(), BUILD / "tamper" / name, SEALED_CHAPTER.stem)
        result = grader(path, SEALED_CHAPTER, TIMEOUT_S)
        return name, {"earned": {e.grade_id: e.earned for e in result.exercises if e.kind == "test"},
                      "messages": {e.grade_id: e.message for e in result.exercises}, "flags": result.flags}
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, [name for name in CASES if boxed or name not in NEEDS_SANDBOX]))


@pytest.fixture(scope="module")
def graded():
    return once_per_run("tamper-grade", grade_all)


@pytest.mark.parametrize("case", list(CASES))
def test_a_case_earns_exactly_its_honest_score(graded, case):
    if case not in graded:
        pytest.skip(f"{case}: only the sandbox keeps the course's files from the host, and there is none here")
    _, expected, words = CASES[case]
    got = graded[case]
    assert got["earned"] == expected, got["messages"]
    for word in words:
        assert any(word in message for message in got["messages"].values()), got["messages"]


def test_the_reference_in_place_of_the_learners_code_says_why(graded):
    messages = graded["own_imported"]["messages"]
    assert "physical_slot is not a function written with def in your cell" in messages[SLOT] and OWN in messages[SLOT]
    assert "BlockAllocator is not a class written in your cell" in messages["ch98_test_allocator"]
    delegating = graded["own_delegating"]["messages"]
    assert "calls the engine's own physical_slot" in delegating[SLOT]
    assert "calls the engine's own allocate (super().allocate)" in delegating["ch98_test_allocator"]
    assert "calls into the checks (ch04)" in delegating["ch98_test_shared_blocks"]


def test_a_verbatim_copy_of_the_reference_is_flagged_not_zeroed(graded):
    flags = " ".join(graded["honest_solution"]["flags"])
    assert "ch98_allocator: the taught code is the reference source verbatim" in flags
    assert not any("verbatim" in flag for flag in graded["honest_own_subclass"]["flags"])


def test_tampering_and_probing_earn_nothing_and_nothing_is_refused_for_its_words(graded):
    # the host's copy of the checks replaced: the judge runs its own, so nothing is earned, and no list
    # of names refuses the cell (it earns nothing because the stubs fail the judge's checks); walking the
    # garbage collector, a tracing hook or /proc in the host runs, finds nothing of value, and earns 0
    assert set(graded["cheat_noop_checks"]["earned"].values()) == {0}
    assert not any("graded notebooks may not" in m for m in graded["cheat_noop_checks"]["messages"].values())
    for probe in ("cheat_gc_key_hunt", "cheat_settrace", "cheat_proc_memory", "cheat_helper_globals"):
        assert set(graded[probe]["earned"].values()) == {0}, graded[probe]["messages"]
        assert not any("may not" in text for text in [*graded[probe]["flags"], *graded[probe]["messages"].values()])


def test_a_renamed_copy_typed_into_the_cell_is_flagged_by_meaning(graded):
    flags = " ".join(graded["flagged_renamed_reference"]["flags"])
    assert "ch98_test_allocator: typed in, the reference's code (copied, renamed or reformatted)" in flags, flags
    assert "BlockAllocator is the reference's code by meaning" in flags
    # the reference's statements in the reference's order, with messages of its own: on structure alone
    # that is the reference too (a flag for the instructor; its points are kept)
    assert graded["honest_own_subclass"]["earned"]["ch98_test_allocator"] == 2
    assert "renamed or reformatted" not in " ".join(graded["own_imported"]["flags"])   # refused, not typed


def test_code_made_at_run_time_is_not_the_learners_own_work(graded):
    messages = graded["own_recompiled_reference"]["messages"]
    assert "physical_slot is not defined in any of your cells" in messages[SLOT] and OWN in messages[SLOT], messages
    assert "BlockAllocator is not defined in any of your cells" in messages["ch98_test_allocator"], messages


def test_honest_habits_around_the_solution_keep_every_point_and_raise_no_flag(graded):
    got = graded["honest_habits"]
    assert got["earned"] == CASES["honest_habits"][1], got["messages"]
    assert not any("refused" in flag or "may not" in flag for flag in got["flags"]), got["flags"]


def test_the_chapters_helper_reaches_only_the_learners_own_code(graded):
    # the chapter's helper calls the host engine's stub, which calls the learner's own physical_slot
    assert any(OWN in m for m in graded["own_via_chapter_helper"]["messages"].values())
