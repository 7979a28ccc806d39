"""The checks' helpers that run in the host (engine.checks.where_it_lives) are the host's own: learner
code may replace them, and what they return is the host's word, like any reply. The judge does not refuse,
from the cells' text, a cell that writes into the checks, the engine or any module it imported: those are
the host's own. ch03's list identity (truncate_holding_the_table) and ch04's aliasing (aliased_tables) are
not asked of the host at all (tests/test_checks_ch03.py, test_checks_ch04.py), so rebinding them there
earns nothing.
"""
import pytest

from engine.course.authoring import exercises
from engine.course.grading.grade import grade_notebook
from engine.course.grading.reading import decide
from fixtures.course_support import BUILD, REPO, expanded, with_cell_edited, with_cells_added, write_notebook

CH03 = REPO / "solutions" / "ch03_paged_cache.py"


PLAN = exercises.plan_for(CH03)
SETUP = next(c.source for c in expanded(CH03).cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ch03_setup")
REBINDING = {   # each would change what a helper the host runs does
    "the helper": "ch03.truncate_holding_the_table = lambda cache, seq, length: list(cache.tables[seq])",
    "through the package": "import engine\nengine.checks.ch03.truncate_holding_the_table = print",
    "a module global": "ch03.fail = lambda *a, **k: None",
    "an alias": "c = ch03\nc.fail = print",
    "a loop's alias": "for m in (ch03,):\n    m.truncate_holding_the_table = print",
    "getattr's alias": "T = getattr(torch, 'Tensor')\nT.__eq__ = lambda a, b: True",
    "a library": "torch.equal = lambda *a: True",
    "a class's dunder": "type(torch.ones(1)).__eq__ = lambda a, b: True",
    "the module handed on": "def patch(m):\n    m.fail = print\npatch(ch03)",
    "deleted": "del ch03.fail",
}


@pytest.mark.parametrize("case", sorted(REBINDING))
def test_a_cell_that_writes_into_the_hosts_modules_is_not_refused_by_its_text(case):
    """The host's modules are the learner's (README: the learner owns the host); the judge's own checks
    and torch are never the host's."""
    book = decide.Notebook(PLAN.graded())
    book.chapter_cell(SETUP)
    book.add("cell9", REBINDING[case])
    assert [why for why in book.reasons(["PagedKVCache"]) if "cell9" in why] == [], case


def test_a_cell_writing_into_its_own_objects_is_not_refused():
    book = decide.Notebook(PLAN.graded())
    book.chapter_cell(SETUP)
    book.add("cell9", "class A:\n    def f(self):\n        self.dtype = torch.float32\n        self.dtype = 2\n"
                      "a = A()\na.f()\na.x = 1\nrows = [1]\nrows[0] = 2\nt = torch.zeros(2)\nt[0] = 1\n")
    assert [why for why in book.reasons(["PagedKVCache"]) if "cell9" in why] == []


WRONG_TRUNCATE = ("        del table[keep:]", "        self.tables[seq] = table[:keep]")
FORGE = "ch03.truncate_holding_the_table = lambda cache, seq, length: (cache.truncate(seq, length), " \
        "list(cache.tables[seq]))[1]\n"


@pytest.mark.slow
def test_rebinding_a_host_helper_earns_nothing_extra():
    wrong = with_cell_edited(expanded(CH03), "ch03_free", lambda source: source.replace(*WRONG_TRUNCATE))
    forged = with_cells_added(wrong, "ch03_setup", FORGE)
    in_the_exercise = with_cell_edited(wrong, "ch03_free", lambda source: source + "\n" + FORGE)
    from concurrent.futures import ThreadPoolExecutor

    def grade(pair):
        name, notebook = pair
        path = write_notebook(notebook, BUILD / "helpers" / name, CH03.stem)
        result = grade_notebook(path, CH03, 120)
        return name, {e.grade_id: e.earned for e in result.exercises if e.kind == "test"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        earned = dict(pool.map(grade, [("wrong", wrong), ("forged", forged), ("in_the_exercise", in_the_exercise)]))
    # list identity is not scored by the grader (its judge sees the table as data): the classic bug
    # keeps truncate's points there, and rebinding the helper in the host changes nothing
    assert earned["wrong"]["ch03_test_truncate"] > 0 and sum(earned["wrong"].values()) > 0, earned["wrong"]
    for name in ("forged", "in_the_exercise"):
        assert all(earned[name][test] <= points for test, points in earned["wrong"].items()), (name, earned[name])
