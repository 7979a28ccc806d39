"""The checks' helpers that run in the host (engine.checks.where_it_lives: ch03's truncate_holding_the_table,
ch04's aliased_tables, ch05's combine, ch06's launch and launch_gather, ch08's _audited) cannot be
replaced by learner code: the host runs the helper it found when it started, before any learner cell,
with its module's globals put back; and the judge refuses, from the cells' text, a cell that writes
into the checks, the engine or any module it imported, directly or through an alias.
"""
import pytest

import engine.checks.ch03 as ch03
import engine.checks.ch04 as ch04
from engine.course import exercises
from engine.course.grade import grade_notebook
from engine.course.sealed import decide
from engine.course.sealed.host import EngineHelpers
from fixtures.course_support import BUILD, REPO, expanded, with_cell_edited, with_cells_added, write_notebook

CH03 = REPO / "solutions" / "ch03_paged_cache.py"


class Cache:
    def __init__(self):
        self.tables = {0: [1, 2, 3], 1: [4]}

    def truncate(self, seq, length):
        self.tables[seq] = self.tables[seq][:length]     # a new list: the held one still reads [1, 2, 3]


def test_the_host_runs_the_helper_it_had_at_its_start_with_its_globals_put_back(monkeypatch):
    helpers = EngineHelpers()
    assert ("engine.checks.ch03", "truncate_holding_the_table") in helpers.table
    assert ("engine.checks.ch04", "aliased_tables") in helpers.table
    monkeypatch.setattr(ch03, "truncate_holding_the_table", lambda cache, seq, length: [1])
    assert helpers.call("engine.checks.ch03", "truncate_holding_the_table", (Cache(), 0, 1), {}) == [1, 2, 3]
    shared = Cache()
    shared.tables[1] = shared.tables[0]
    vars(ch04)["list"] = lambda items: []            # a builtin shadowed in its module
    try:
        assert helpers.call("engine.checks.ch04", "aliased_tables", (shared,), {}) == [(0, 1)]
        assert "list" not in vars(ch04)
    finally:
        vars(ch04).pop("list", None)
    with pytest.raises(PermissionError, match="not a helper"):
        helpers.call("engine.checks.ch03", "check_truncate", (object(),), {})
    with pytest.raises(PermissionError, match="not a helper"):
        helpers.call("os", "system", ("true",), {})


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
    """The host's modules are the learner's (README: the learner owns the host): what the helpers run
    there is put back before each call (above), and the judge's own checks and torch are never the host's."""
    book = decide.Notebook(PLAN.graded(), set(PLAN.graded_by_cell()), set(), set())
    book.chapter_cell(SETUP)
    book.add("cell9", REBINDING[case])
    assert [why for why in book.reasons(["PagedKVCache"]) if "cell9" in why] == [], case


def test_a_cell_writing_into_its_own_objects_is_not_refused():
    book = decide.Notebook(PLAN.graded(), set(PLAN.graded_by_cell()), set(), set())
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
    assert earned["wrong"]["ch03_test_truncate"] == 0 and sum(earned["wrong"].values()) > 0, earned["wrong"]
    for name in ("forged", "in_the_exercise"):
        assert earned[name]["ch03_test_truncate"] == 0, (name, earned[name])
        assert all(earned[name][test] <= points for test, points in earned["wrong"].items()), (name, earned[name])
