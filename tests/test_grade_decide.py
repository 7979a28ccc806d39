"""Every decision in the judge, from the cells' text: own work and copies of the reference.

Three learners' own chapter 2 solutions (tests/fixtures/sealed_styles.py) are never refused; those
written independently are not flagged, while B's allocator, the reference's structure token for token
with its own messages, is (a flag, never a grade); the reference re-typed with meaning-preserving edits
is flagged, and so is the reference with its three messages reworded. Graded names bound any way but
the learner's own def or class, or whose code hands back the engine's own version of the taught name
or calls the checks, are refused. The host's replies are checked against a schema: a malformed one
costs the cell. (What learner cells may do besides: tests/test_grade_honest.py.)
"""
import inspect
import textwrap

import pytest

from engine.course.authoring import exercises
from engine.course.grading.reading import decide, likeness
from engine.course.grading.reading.likeness import copies_of_the_reference, reference_tokens
from engine.course.grading.sealed.judge import _checked, CELL_REPLY, EMPTY_REPLY
from fixtures.course_support import REPO, expanded
from fixtures.sealed_styles import HONEST, RETYPED

CH02 = REPO / "solutions" / "ch02_block_tables.py"
PLAN = exercises.plan_for(CH02)
GRADED = PLAN.graded()
SETUP = next(c.source for c in expanded(CH02).cells if c.metadata.get("nbgrader", {}).get("grade_id") == "ch02_setup")
NAMES = {"ch02_physical_slot": "physical_slot", "ch02_allocator": "BlockAllocator"}


def notebook(cells: dict) -> decide.Notebook:
    """The judge's record of a notebook: the chapter's setup, then the learner cells `cells`."""
    book = decide.Notebook(GRADED)
    book.chapter_cell(SETUP)
    for name, source in cells.items():
        book.add(name, source)
    return book


def copies(cells: dict) -> list[str]:
    sources = {NAMES[cell]: source for cell, source in cells.items() if cell in NAMES}
    return copies_of_the_reference(sorted(sources), GRADED, sources, reference_tokens(PLAN.references, GRADED))


@pytest.mark.parametrize("who", sorted(HONEST))
def test_honest_solutions_in_their_own_styles_are_not_refused(who):
    book = notebook(HONEST[who])
    for name in NAMES.values():
        assert book.reasons([name]) == [], (who, name)
    expected = ["BlockAllocator is the reference's code by meaning"] if who == "B" else []
    assert copies(HONEST[who]) == expected, who     # B's allocator: the reference's structure, its own words


def test_the_reference_retyped_with_meaning_preserving_edits_is_flagged():
    assert copies(RETYPED) == ["BlockAllocator is the reference's code by meaning",
                               "physical_slot is the reference's code by meaning"]
    assert notebook(RETYPED).reasons(list(NAMES.values())) == []     # its points are kept: it works


def test_the_solution_itself_is_flagged_as_the_reference():
    solution = {c.metadata["nbgrader"]["grade_id"]: c.source for c in expanded(CH02).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") in NAMES}
    assert len(copies(solution)) == 2


def test_the_reference_with_its_three_messages_reworded_is_flagged():
    import engine.cache.allocator as allocator
    head = "import engine.cache.allocator\nclass BlockAllocator(engine.cache.allocator.BlockAllocator):\n"
    reference = head + "".join(
        textwrap.indent(textwrap.dedent(inspect.getsource(getattr(allocator.BlockAllocator, m))), "    ")
        for m in ("allocate", "share", "release"))
    reworded = reference
    for message, mine in (("can only allocate an int >= 0 of blocks, got", "that is no count of blocks:"),
                          ("is free: it cannot be shared", "has no owner to share it with"),
                          ("released too often: it is already free", "was given back twice")):
        assert message in reworded
        reworded = reworded.replace(message, mine)
    assert copies({"ch02_allocator": reworded}) == ["BlockAllocator is the reference's code by meaning"]


BOUND_OTHERWISE = {   # the graded name bound by something other than the learner's own def or class
    "imported": "from engine.cache.slots import physical_slot\n",
    "aliased": "import engine.cache.slots as s\nphysical_slot = s.physical_slot\n",
    "a lambda": "physical_slot = lambda table, pos, block_size: (table[pos // block_size], pos % block_size)\n",
    "decorated with the engine's": "import engine.cache.slots as s\n@lambda f: s.physical_slot\n"
                                   "def physical_slot(table, pos, block_size):\n    return 0, 0\n",
    "rebound after": "def physical_slot(t, p, b):\n    return 0, 0\nphysical_slot = len\n",
    "its code replaced": "import engine.cache.slots as s\ndef physical_slot(t, p, b):\n    return 0, 0\n"
                         "physical_slot.__code__ = s.physical_slot.__code__\n",
}


@pytest.mark.parametrize("case", sorted(BOUND_OTHERWISE))
def test_a_graded_function_not_defined_by_the_learners_def_is_refused(case):
    reasons = notebook({"ch02_physical_slot": BOUND_OTHERWISE[case]}).reasons(["physical_slot"])
    assert reasons and all("must be your own code" in why for why in reasons), reasons


CLASSES = {
    "empty subclass": "import engine.cache.allocator\nclass BlockAllocator(engine.cache.allocator.BlockAllocator):\n"
                      "    pass\n",
    "assigned method": "import engine.cache.allocator as a\nclass BlockAllocator(a.BlockAllocator):\n"
                       "    allocate = a.BlockAllocator.allocate\n    def share(self, b): pass\n"
                       "    def release(self, b): pass\n",
    "super": "import engine.cache.allocator as a\nclass BlockAllocator(a.BlockAllocator):\n"
             "    def allocate(self, n=1):\n        return super().allocate(n)\n"
             "    def share(self, b): pass\n    def release(self, b): pass\n",
    "the engine's own": "import engine.cache.allocator as a\nclass BlockAllocator(a.BlockAllocator):\n"
                        "    def allocate(self, n=1):\n        return a.BlockAllocator.allocate(self, n)\n"
                        "    def share(self, b): pass\n    def release(self, b): pass\n",
}


@pytest.mark.parametrize("case", sorted(CLASSES))
def test_a_graded_class_whose_taught_methods_are_not_the_learners_is_refused(case):
    reasons = notebook({"ch02_allocator": CLASSES[case]}).reasons(["BlockAllocator"])
    assert reasons and all("must be your own code" in why for why in reasons), reasons


def test_a_taught_method_from_the_learners_own_base_class_counts():
    cell = ("class Base:\n    def allocate(self, n=1):\n        return []\n    def share(self, b): pass\n"
            "    def release(self, b): pass\nclass BlockAllocator(Base):\n    pass\n")
    assert notebook({"ch02_allocator": cell}).reasons(["BlockAllocator"]) == []


CALLING_THE_CHECKS = {   # the checks live in the host too, and some compute an exercise's answer
    "the chapter's name": ("", "def physical_slot(table, pos, block_size):\n"
                               "    return ch02.physical_slot(table, pos, block_size)\n"),
    "imported in a scratch cell": ("import engine.checks.ch02 as helper\n",
                                   "def physical_slot(table, pos, block_size):\n"
                                   "    return helper.physical_slot(table, pos, block_size)\n"),
    "through the package": ("import engine.checks.ch02\n",
                            "def physical_slot(table, pos, block_size):\n"
                            "    return engine.checks.ch02.physical_slot(table, pos, block_size)\n"),
    "through a helper": ("from engine.checks import ch02 as c\nanswer = c.physical_slot\n",
                         "def physical_slot(table, pos, block_size):\n    return answer(table, pos, block_size)\n"),
}


@pytest.mark.parametrize("case", sorted(CALLING_THE_CHECKS))
def test_a_graded_function_that_calls_into_the_checks_is_refused(case):
    scratch, cell = CALLING_THE_CHECKS[case]
    reasons = notebook({"cell9": scratch, "ch02_physical_slot": cell}).reasons(["physical_slot"])
    assert any("calls into the checks" in why for why in reasons), reasons


def test_a_helper_split_out_is_read_into_the_code_that_calls_it():
    helper = "def _where(t, p, b):\n    return t[p // b], p % b\n"
    whole = "def physical_slot(t, p, b):\n    return t[p // b], p % b\n"
    split = "def physical_slot(t, p, b):\n    return _where(t, p, b)\n"
    inline = likeness.exercise_tokens("physical_slot", None, whole, {})
    apart = likeness.exercise_tokens("physical_slot", None, helper + split, likeness.definitions(helper)[0])
    assert likeness.similarity(apart, inline) > 0.8


def test_a_malformed_or_out_of_turn_host_reply_costs_the_cell():
    good = {"status": "ok", "outputs": [{"output_type": "stream", "name": "stdout", "text": "hi"}]}
    assert _checked(good, CELL_REPLY) == good
    for bad in (None, [], {"status": "ok"}, dict(good, status="passed"), dict(good, outputs=[{"output_type": "x"}]),
                dict(good, outputs=[{"output_type": "stream", "text": 3}]), dict(good, outputs="ok")):
        checked = _checked(bad, CELL_REPLY)
        assert checked["status"] == "error" and checked["malformed"], bad
    assert _checked(None, EMPTY_REPLY)["malformed"] and _checked([], EMPTY_REPLY)["malformed"]
    assert _checked({"notes": ["anything"]}, EMPTY_REPLY) == {}         # nothing in it is read


@pytest.mark.parametrize("source", [
    "class Evict(PrefixCache):\n    evictable = lambda self, entry: entry.refs == 1\n",
    "class Evict(PrefixCache):\n    evictable: object = staticmethod(lambda entry: True)\n",
    "PrefixCache.evictable = lambda self, entry: True\n",
    "setattr(PrefixCache, 'evictable', lambda self, entry: True)\n",
    "class Evict(PrefixCache):\n    def evictable(self, entry):\n        return True\n",
])
def test_a_later_exercise_bound_any_way_is_written(source):
    # "Not written yet" lets a check skip a part: a binding the text shows, of any kind, is written.
    assert decide.unwritten({"PrefixCache.evictable"}, [source])("PrefixCache.evictable") is False


def test_the_releases_stub_is_not_written():
    stub = "class Evict(PrefixCache):\n    def evictable(self, entry):\n        raise NotImplementedError()\n"
    assert decide.unwritten({"PrefixCache.evictable"}, [stub])("PrefixCache.evictable") is True
