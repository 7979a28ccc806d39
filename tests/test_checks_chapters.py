"""Each chapter's test cells call checks that exist, and every check of a chapter's module is graded."""
import importlib
import inspect
import pkgutil
import re

import pytest

from engine import checks
from engine.course import cells
from engine.course.paths import chapter_files
from engine.course.authoring.source import load_chapter


CHAPTER_MODULES = [importlib.import_module(f"engine.checks.{info.name}")
                   for info in sorted(pkgutil.iter_modules(checks.__path__), key=lambda i: i.name)
                   if re.fullmatch(r"ch\d\d", info.name)]


def test_every_chapter_has_a_checks_module():
    chapters = {path.stem[:4] for path in chapter_files()}
    assert chapters == {m.__name__.rsplit(".", 1)[-1] for m in CHAPTER_MODULES}


@pytest.mark.parametrize("module", CHAPTER_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_chapter_grades_every_check_and_only_checks(module):
    prefix = module.__name__.rsplit(".", 1)[-1]
    [chapter] = [path for path in chapter_files() if path.stem.startswith(prefix + "_")]
    called = set()
    for cell in load_chapter(chapter).cells:
        if cells.is_test(cell):
            names = re.findall(rf"\b{prefix}\.(\w+)\(", cell.source)
            assert names, f"test cell {cells.grade_id(cell)} calls no check of {prefix}"
            called.update(names)
    for name in called:
        assert getattr(getattr(module, name, None), "is_check", False), f"{prefix}.{name} is not a check"
    assert {name for name in dir(module) if name.startswith("check_")} == called


def test_a_check_reports_a_crash_as_a_failure_naming_the_place():
    @checks.check
    def check_something(fn):
        fn()

    def learner_code():
        return {}["missing"]

    with pytest.raises(checks.CheckFailed) as info:
        check_something(learner_code)
    assert "crashed in" in str(info.value) and "learner_code" in str(info.value) and "KeyError" in str(info.value)


def test_logit_comparison_names_the_first_differing_position():
    import torch

    expected = torch.zeros(5, 3)
    got = expected.clone()
    got[3, 1] = 0.5
    with pytest.raises(checks.CheckFailed) as info:
        checks.compare_logits(got, expected, "sequence 7", first_position=40, hint="look here")
    message = str(info.value)
    assert "sequence 7" in message and "at position 43" in message and "max |Δ| 0.5" in message
    assert message.endswith("Hint: look here")
    assert checks.compare_logits(expected + 1e-7, expected, "close enough") < checks.ATOL


def test_a_tick_line_is_made_of_the_facts_a_check_noted():
    """Proved renders only what was noted, once each in order; a check that noted nothing cannot pass."""
    proved = checks.Proved("thing")
    proved.note("case a")
    proved.note("case b")
    proved.note("case a")
    assert proved.line("3 launches match") == "thing: 3 launches match (case a; case b)"
    assert proved.line() == "thing: case a; case b" and proved.holds("case b") and not proved.holds("c")
    with pytest.raises(checks.CheckFailed, match="verified nothing"):
        checks.Proved("empty").line()


def _not_written(qualname: str) -> NotImplementedError:
    """What the student edition raises for an exercise still to write (as the grader's host reports it)."""
    error = NotImplementedError(f"{qualname} is yours to write")
    error._course_edition, error.qualname = True, qualname
    return error


def test_a_skipped_served_part_adds_no_fact_to_the_tick_line(capsys):
    """In the student edition a part served through a later exercise is skipped: its fact is not claimed."""
    proved = checks.Proved("thing")
    proved.note("checked directly")
    with checks.served("serving it", proved, "served through the engine"):
        raise _not_written("Cache.later")
    with checks.served("serving again", proved, "served once more"):
        pass
    proved.passed()
    out = capsys.readouterr().out
    assert "(not checked yet: serving it runs Cache.later" in out
    assert "✓ thing: checked directly; served once more" in out and "served through the engine" not in out
    only_served = checks.Proved("other")
    with checks.served("serving it", only_served, "served through the engine"):
        raise _not_written("Cache.later")
    only_served.passed()
    assert "✓" not in capsys.readouterr().out


REVIEW_CHECKS = [(module, name) for module in CHAPTER_MODULES for name in dir(module)
                 if name.startswith("check_")
                 and list(inspect.signature(getattr(module, name)).parameters) == ["answer"]]


@pytest.mark.parametrize("module,name", REVIEW_CHECKS, ids=[f"{m.__name__[-4:]}.{n}" for m, n in REVIEW_CHECKS])
@pytest.mark.parametrize("answer", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_no_review_question_takes_a_number_that_is_not_finite(module, name, answer):
    # NaN compares False with everything: `if abs(answer - want) > tol: fail` would pass it.
    with pytest.raises(checks.CheckFailed):
        getattr(module, name)(answer)


def test_on_the_last_run_only_a_part_that_is_not_essential_waits_for_a_later_exercise(monkeypatch, capsys):
    """The grader runs a skipped test again after every cell: then "not written yet" (the learner's process's
    word) skips only a part beside what the points rest on, and a check that verified nothing fails."""
    monkeypatch.setattr(checks, "LAST_RUN", True)
    proved = checks.Proved("thing")
    proved.note("checked directly")
    with checks.served("serving it", proved, "served through the engine", essential=False):
        raise _not_written("Cache.later")
    proved.passed()
    assert "✓ thing: checked directly" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="serving it runs Cache.later, which this notebook does not write"):
        with checks.served("serving it", checks.Proved("other"), "served"):
            raise _not_written("Cache.later")
    nothing = checks.Proved("other")
    with checks.served("serving it", nothing, "served", essential=False):
        raise _not_written("Cache.later")
    with pytest.raises(checks.CheckFailed, match="nothing of it could be checked"):
        nothing.passed()
