"""Handing the engine's reference back as an exercise: told at once in the notebook, 0 points in make grade.

In the learner's kernel the check reads the learner's code (engine.checks.own_work); in `make grade`
the host's engine has no reference of the graded chapter, so the call comes back to the learner's own
definition and the edition's stub refuses it (CallsItself) instead of recursing until Python gives up.
"""
import pytest

from engine.cache.slots import physical_slot
from engine.cache.static import StaticKVCache as Reference
from engine.checks import CheckFailed, ch01, ch02, own_work
from engine.checks.ch08 import kv_bytes_reference
from engine.config import kv_bytes_per_token as reference_kv_bytes
from engine.course.grading.grade import grade_notebook
from engine.course.authoring.source import load_chapter
from fixtures.course_support import REPO, with_cell_edited, write_notebook


@pytest.fixture
def as_notebook(monkeypatch):
    """Code of this file counts as a notebook cell's, as IPython's cells do in a learner's kernel."""
    monkeypatch.setattr(own_work, "cell_file", lambda filename: filename == __file__)


def kv_bytes_per_token(config, dtype_bytes=2):
    return reference_kv_bytes(config, dtype_bytes)


def own_kv_bytes(config, dtype_bytes=2):
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


def kv_bytes_per_token_hf(hf, dtype_bytes=2):      # chapter 8's exercise, through the checks' own answer
    return kv_bytes_reference(hf, dtype_bytes)


class BySuper(Reference):
    def update(self, layer, k, v, positions):
        return super().update(layer, k, v, positions)


class ByName(Reference):
    def update(self, layer, k, v, positions):
        return Reference.update(self, layer, k, v, positions)


class Bound(Reference):
    update = Reference.update

    def reserve(self, seq, num_new):      # own code elsewhere in the class: the binding still counts
        return super().reserve(seq, num_new)


class SetupOnly(Reference):
    def __init__(self, *args, **kwargs):  # super() to a body the chapter does not teach: fine
        super().__init__(*args, **kwargs)


@pytest.mark.parametrize("value, says", [
    (kv_bytes_per_token, "calls the engine's reference (reference_kv_bytes(...))"),
    (BySuper, "your BySuper.update calls the engine's reference (super().update(...))"),
    (ByName, "your ByName.update calls the engine's reference (Reference.update(...))"),
    (Bound, "Bound.update is the engine's own StaticKVCache.update"),
    (kv_bytes_per_token_hf, "calls the engine's reference (kv_bytes_reference(...))"),
])
def test_the_reference_handed_back_is_named(as_notebook, value, says):
    why = own_work.borrowed(value, "ch01", from_cell=True)
    assert why is not None and says in why, why


@pytest.mark.parametrize("value", [own_kv_bytes, SetupOnly])
def test_own_code_passes_the_screen(as_notebook, value):
    assert own_work.borrowed(value, "ch01", from_cell=True) is None


def test_the_engine_object_counts_only_when_a_cell_hands_it_over(as_notebook):
    assert "is the engine's own kv_bytes_per_token" in own_work.borrowed(reference_kv_bytes, "ch01", from_cell=True)
    assert own_work.borrowed(reference_kv_bytes, "ch01", from_cell=False) is None   # the course's tests do
    assert own_work.borrowed(kv_bytes_per_token, "ch02", from_cell=True) is None     # not chapter 2's body


def test_outside_a_notebook_the_checks_take_the_reference():
    ch01.check_kv_bytes_per_token(reference_kv_bytes)       # this suite's own proof that the checks pass it
    ch02.check_physical_slot(physical_slot)


def test_the_check_fails_with_the_reason_in_a_notebook(as_notebook, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "IPython", object())   # the wrapper screens under IPython
    with pytest.raises(CheckFailed, match="must be your own code"):
        ch01.check_static_update(BySuper)


@pytest.mark.slow
def test_make_grade_gives_the_handed_back_reference_nothing_and_says_why(tmp_path):
    chapter = REPO / "solutions" / "ch01_kv_cache.py"
    solution = load_chapter(chapter)
    borrowing = with_cell_edited(solution, "ch01_kv_bytes_per_token", lambda s: (
        "def kv_bytes_per_token(config, dtype_bytes=2):\n    return reference_kv_bytes(config, dtype_bytes)\n"))
    borrowing = with_cell_edited(borrowing, "ch01_static_update", lambda s: (
        "class StaticKVCache(ReferenceStaticCache):\n"
        "    def update(self, layer, k, v, positions):\n"
        "        return super().update(layer, k, v, positions)\n"))
    result = grade_notebook(write_notebook(borrowing, tmp_path, "ch01_kv_cache"), chapter, 120)
    tests = {e.grade_id: e for e in result.exercises if e.kind == "test"}
    for grade_id in ("ch01_test_kv_bytes_per_token", "ch01_test_static_update"):
        assert tests[grade_id].earned == 0, grade_id
        assert "calls the engine's own" in tests[grade_id].message, tests[grade_id].message
        assert "must be your own code" in tests[grade_id].message
    assert tests["ch01_test_static_utilization"].earned == tests["ch01_test_static_utilization"].possible
    assert not any("profiling hook" in flag for flag in result.flags)
