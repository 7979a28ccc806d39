"""Honest learner code of every ordinary style counts; a graded name the learner did not write does not.

The sealed grader reads from the cells' text only whether each graded name is the learner's own `def`
or `class` (engine.course.grading.reading.decide); everything else a learner cell does (import, open, print,
explore, decorate, time, shell out, run a cell twice, answer over two cells) is graded as the code it
holds. Each variant below is one small change a learner makes to a chapter's full-mark solution: at the
unit level the judge's own record of the notebook refuses none of its tests; through the real grader a
few representative ones keep full marks. A graded name bound by an import, an assignment or a lambda
still earns nothing, whatever else the notebook does.
"""
import copy
import functools
import re

import pytest

from engine.course.authoring import exercises
from engine.course.cells import python_source
from engine.course.grading.grade import cell_kind, grade_notebook
from engine.course.grading.reading import decide
from engine.course.grading.reading.names import names_read
from fixtures.course_support import BUILD, REPO, expanded, stubbed, with_cell_edited, with_cells_added, write_notebook

CHAPTERS = {p.stem[:4]: p for p in (REPO / "solutions").glob("ch0*.py")}


def judged(notebook, chapter: str) -> dict[str, list[str]]:
    """{test grade id: the judge's reasons it must not count} for `notebook`, read as the judge reads it:
    every code cell in order, the exercise cells adding their graded names."""
    plan = _plan(chapter)
    graded, by_cell = copy.deepcopy(plan["graded"]), plan["graded_by_cell"]
    book = decide.Notebook(graded)
    reasons = {}
    for seq, cell in enumerate((c for c in notebook.cells if c.cell_type == "code"), 1):
        kind, name = cell_kind(cell), cell.metadata.get("nbgrader", {}).get("grade_id") or f"cell{seq}"
        if kind == "learner":
            graded.update(by_cell.get(name, {}))
            book.add(name, cell.source)
        elif kind == "trusted":
            book.chapter_cell(cell.source)
        else:
            reasons[name] = book.reasons(book.graded_behind(names_read(cell.source)))
    return reasons


@functools.cache
def _plan(chapter: str) -> dict:
    return exercises.plan_for(CHAPTERS[chapter]).for_worker()


@functools.cache
def _solution(chapter: str):
    return expanded(CHAPTERS[chapter])


def solution(chapter: str):
    return copy.deepcopy(_solution(chapter))


def source_of(notebook, cell: str) -> str:
    return next(c.source for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == cell)


def scratch(chapter: str, after: str, *sources: str):
    """The chapter's solution with learner cells of its own after cell `after`."""
    return lambda: with_cells_added(solution(chapter), after, *sources)


def edited(chapter: str, cell: str, edit):
    return lambda: with_cell_edited(solution(chapter), cell, edit)


def over_two_cells(chapter: str, cell: str):
    """The exercise cell left as handed out (its stub) and the answer typed into a new cell below it."""
    def make():
        answer, stub = source_of(solution(chapter), cell), source_of(stubbed(solution(chapter)), cell)
        notebook = with_cell_edited(solution(chapter), cell, lambda _: stub)
        return with_cells_added(notebook, cell, answer)
    return make


def twice(chapter: str, cell: str):
    """The exercise cell copied and run again just below itself."""
    def make():
        return with_cells_added(solution(chapter), cell, source_of(solution(chapter), cell))
    return make


def replacing(old: str, new: str):
    """An edit that replaces the first `old` (which must be there) with `new`."""
    def edit(source):
        assert old in source, old
        return source.replace(old, new, 1)
    return edit


def decorated(method: str, decorator: str):
    """Insert `decorator` above `def method(` (at its indentation)."""
    def edit(source):
        return re.sub(rf"^(\s*)def {method}\(", lambda m: f"{m.group(1)}{decorator}{m.group(1)}def {method}(",
                      source, count=1, flags=re.M)
    return edit


def in_body(method: str, line: str):
    """Insert `line` as the first statement of `method` (after its signature)."""
    def edit(source):
        return re.sub(rf"(\n(\s*)def {method}\(.*?\).*?:\n)", lambda m: f"{m.group(1)}{m.group(2)}    {line}\n",
                      source, count=1, flags=re.S)
    return edit


# name: (chapter, the notebook). Each was refused by the list of names before (issue 36's honest variants).
VARIANTS = {
    "print(dir(engine)) in a scratch cell": ("ch05", scratch("ch05", "ch05_setup", "print(dir(engine))\n")),
    "json, pathlib, open and globals() in a scratch cell": ("ch07", scratch("ch07", "ch07_setup", (
        "import json\nfrom pathlib import Path\nwith open('notes.json', 'w') as f:\n    json.dump({'seen': 1}, f)\n"
        "print(Path('notes.json').read_text(), sorted(globals())[:3])\n"))),
    "vars(), .__dict__ and traceback in a scratch cell": ("ch03", scratch("ch03", "ch03_setup", (
        "import traceback\nprint(sorted(vars(ReferenceCache))[:3], list(ReferenceCache.__dict__)[:3])\n"
        "traceback.print_stack(limit=1)\n"))),
    "import sys in a scratch cell": ("ch01", scratch("ch01", "ch01_setup", "import sys\nprint(sys.version)\n")),
    "logging, IPython.display, torch.manual_seed in a scratch cell": ("ch02", scratch("ch02", "ch02_setup", (
        "import logging\nlogging.basicConfig(level=logging.INFO)\nlogging.getLogger('notes').info('hi')\n"
        "from IPython.display import Markdown, display\ndisplay(Markdown('**notes**'))\ntorch.manual_seed(1)\n"))),
    "@torch.no_grad() on copy_on_write": ("ch04", edited("ch04", "ch04_cache",
                                                         decorated("copy_on_write", "@torch.no_grad()\n"))),
    "@functools.cache on blocks_needed": ("ch02", edited("ch02", "ch02_blocks_needed", lambda s: (
        "import functools\n\n\n" + decorated("blocks_needed", "@functools.cache\n")(s)))),
    "@staticmethod and @property helpers in the class": ("ch03", edited("ch03", "ch03_free", lambda s: s + (
        "\n    @staticmethod\n    def _kept(length):\n        return length\n\n"
        "    @property\n    def in_use(self):\n        return len(self.tables)\n"))),
    "setattr in truncate": ("ch03", edited("ch03", "ch03_free", in_body("truncate", (
        "setattr(self, 'last_truncated', (seq, length))")))),
    "%%time on an exercise cell": ("ch02", edited("ch02", "ch02_physical_slot", lambda s: "%%time\n" + s)),
    "%timeit, !cmd, %matplotlib inline in scratch cells": ("ch02", scratch(
        "ch02", "ch02_physical_slot", "%timeit physical_slot([3, 1], 5, 4)\n",
        "%matplotlib inline\n!echo hello\nfiles = !ls\n",
        "%%time\nrows = [physical_slot([3, 1], p, 4) for p in range(8)]\n")),
    "a cell run twice": ("ch03", twice("ch03", "ch03_free")),
    "an exercise answered over two cells": ("ch02", over_two_cells("ch02", "ch02_allocator")),
    "a class answered over two cells": ("ch04", over_two_cells("ch04", "ch04_cache")),
    "a class chained onto the learner's own": ("ch05", edited("ch05", "ch05_evict", lambda s: s.replace(
        "class PrefixCache(engine.cache.prefix.PrefixCache):", "class PrefixCache(PrefixCache):", 1))),
    "super() into the learner's own method of a chained class": ("ch03", scratch("ch03", "ch03_free", (
        "class PagedKVCache(PagedKVCache):\n    def truncate(self, seq, length):\n"
        "        print('truncating', seq, 'to', length)\n        return super().truncate(seq, length)\n"))),
    "super() into another method": ("ch03", edited("ch03", "ch03_free", lambda s: s.replace(
        "self.table(seq)", "super().table(seq)"))),
    "super() into the engine's helper in the allocator": ("ch02", edited("ch02", "ch02_allocator", lambda s: s.replace(
        "self.check_id(block)", "super().check_id(block)"))),
    "super() into ch03's methods in fork": ("ch04", edited("ch04", "ch04_cache", lambda s: s.replace(
        "list(self.table(parent))", "list(super().table(parent))").replace(
        "self.create(child)", "super().create(child)"))),
    # (issue 36's later honest variants, found by an outside tester)
    "a scratch cell binding names a function uses as locals": ("ch02", lambda: with_cells_added(
        with_cell_edited(solution("ch02"), "ch02_physical_slot", lambda _: MY_PHYSICAL_SLOT), "ch02_physical_slot",
        "block, offset = engine.cache.slots.physical_slot([5, 1, 7], 9, 4)\n"
        "print(block, offset, physical_slot([5, 1, 7], 9, 4))\n")),
    "the engine's base class named in full (__init__, an annotation)": ("ch02", edited("ch02", "ch02_allocator", (
        replacing("class BlockAllocator(engine.cache.allocator.BlockAllocator):\n", (
            "class BlockAllocator(engine.cache.allocator.BlockAllocator):\n"
            "    def __init__(self, num_blocks: int) -> None:\n"
            "        engine.cache.allocator.BlockAllocator.__init__(self, num_blocks)\n\n"
            "    @classmethod\n    def small(cls) -> engine.cache.allocator.BlockAllocator:\n"
            "        return cls(4)\n\n"))))),
    "the parent's copy_on_write named in full": ("ch08", edited("ch08", "ch08_cache", replacing(
        "PagedKVCache.copy_on_write(self, seq, index)",
        "engine.cache.paged.PagedKVCache.copy_on_write(self, seq, index)"))),
}
MY_PHYSICAL_SLOT = ("def physical_slot(table, pos, block_size):\n    check_block_size(block_size)\n"
                    "    if not 0 <= pos < len(table) * block_size:\n"
                    "        raise IndexError(f'position {pos} is past the {len(table)} blocks of this table')\n"
                    "    block = table[pos // block_size]\n    offset = pos % block_size\n    return block, offset\n")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_an_honest_variant_is_refused_nowhere(variant):
    chapter, make = VARIANTS[variant]
    reasons = judged(make(), chapter)
    assert reasons and all(why == [] for why in reasons.values()), {t: w for t, w in reasons.items() if w}


def test_the_solutions_themselves_are_refused_nowhere():
    for chapter in CHAPTERS:
        reasons = judged(solution(chapter), chapter)
        assert all(why == [] for why in reasons.values()), (chapter, {t: w for t, w in reasons.items() if w})


NOT_WRITTEN = {   # the graded name bound by something else than the learner's def or class
    "the engine's class imported under the graded name": (
        "ch02_allocator", "from engine.cache.allocator import BlockAllocator\n", "not a class written"),
    "Name = engine.x.Y": ("ch02_allocator", "import engine.cache.allocator\n"
                          "BlockAllocator = engine.cache.allocator.BlockAllocator\n", "not a class written"),
    "a lambda assigned": ("ch02_physical_slot", "physical_slot = lambda table, pos, block_size: "
                          "(table[pos // block_size], pos % block_size)\n", "not a function written with def"),
    "the engine's method set on the class": ("ch02_allocator", None, "sets BlockAllocator.allocate"),
    "super() into the engine's own method": ("ch02_allocator", "class BlockAllocator(ReferenceAllocator):\n"
                                             "    def allocate(self, n=1):\n        return super().allocate(n)\n"
                                             "    def share(self, b):\n        return super().share(b)\n"
                                             "    def release(self, b):\n        return super().release(b)\n",
                                             "calls the engine's own"),
}


@pytest.mark.parametrize("case", list(NOT_WRITTEN))
def test_a_graded_name_the_learner_did_not_write_is_refused(case):
    cell, source, says = NOT_WRITTEN[case]
    if source is None:   # the learner's class, then a scratch cell puts the engine's method on it
        notebook = with_cells_added(solution("ch02"), "ch02_allocator",
                                    "BlockAllocator.allocate = ReferenceAllocator.allocate\n")
    else:
        notebook = with_cell_edited(solution("ch02"), cell, lambda _: source)
    name = "BlockAllocator" if cell == "ch02_allocator" else "physical_slot"
    refused = {test: why for test, why in judged(notebook, "ch02").items() if why}
    assert refused and all(any(says in w and "must be your own code" in w for w in why)
                           for why in refused.values()), refused
    tests = {"BlockAllocator": {"ch02_test_allocator_basics", "ch02_test_allocator_errors", "ch02_test_refcounts"},
             "physical_slot": {"ch02_test_physical_slot"}}
    assert tests[name] <= set(refused), refused


@pytest.mark.parametrize("source, python", [
    ("%%time\nx = 1\ndef f():\n    return 2\n", "\nx = 1\ndef f():\n    return 2\n"),
    ("\n%%timeit -n 3 y = 2\nx = y\n", "\ny = 2\nx = y\n"),
    ("%timeit -n 10 -r 2 f(x)\n", "f(x)\n"),
    ("!ls -l\nfiles = !ls\n", "pass\nfiles = []\n"),
    ("answer = %time f(37) - f(20)\n", "answer = (f(37) - f(20))\n"),       # %time gives its value
    ("%matplotlib inline\nimport torch\n", "pass\nimport torch\n"),
    ("def f():\n    %time g()\n    return 1\n", "def f():\n    g()\n    return 1\n"),
    ("%%capture out\nprint(1)\n", "\nprint(1)\n"),
    ("%%writefile notes.py\nprint(1)\n", "\n"),
    ("x = 1\n", "x = 1\n"),
    ("x = 1 +\n", "x = 1 +\n"),
])
def test_ipython_syntax_is_read_as_the_code_it_holds_line_for_line(source, python):
    assert python_source(source) == python


# Through the real grader: one notebook per chapter holding several variants at once, full marks.
GRADED = {
    "ch02": lambda: with_cell_edited(with_cells_added(
        with_cell_edited(solution("ch02"), "ch02_physical_slot", lambda s: "%%time\n" + s),
        "ch02_setup", "import json, sys\nfrom pathlib import Path\nprint(dir(engine)[:3], sorted(globals())[:2], "
        "vars(ReferenceAllocator)['__module__'], json.dumps(sys.version_info[:2]), Path('.').exists())\n",
        "%matplotlib inline\n!echo hello\n"), "ch02_blocks_needed", lambda s: (
        "import functools\n\n\n" + decorated("blocks_needed", "@functools.cache\n")(s))),
    "ch04": lambda: with_cell_edited(solution("ch04"), "ch04_cache", decorated("copy_on_write", "@torch.no_grad()\n")),
}


@pytest.mark.slow
@pytest.mark.parametrize("chapter", sorted(GRADED))
def test_honest_variants_keep_full_marks_through_the_grader(chapter):
    path = write_notebook(GRADED[chapter](), BUILD / "honest" / chapter, CHAPTERS[chapter].stem)
    result = grade_notebook(path, CHAPTERS[chapter], 120)
    lost = {e.grade_id: e.message for e in result.exercises if e.kind == "test" and e.earned != e.possible}
    assert lost == {} and result.earned == result.possible > 0, lost


# What crosses from the learner's process as it would in a plain kernel: numpy's numbers as the numbers
# they are, a learner's own exception class as one of the class it derives from (`except OutOfBlocks`).
OWN_ERRORS = "class PoolExhausted(OutOfBlocks):\n    pass\n\n\nclass DoubleRelease(BlockRefError):\n    pass\n"
NUMPY_SLOT_INDEX = ("import numpy as np\n\n\ndef slot_index(table, pos, block_size):\n"
                    "    block, offset = physical_slot(table, pos, block_size)\n"
                    "    return np.int64(block) * block_size + np.int64(offset)\n")


@pytest.mark.slow
def test_numpy_numbers_and_the_learners_own_exception_classes_keep_full_marks_through_the_grader():
    notebook = with_cells_added(solution("ch02"), "ch02_yours_util", OWN_ERRORS)
    notebook = with_cell_edited(notebook, "ch02_slot_index", lambda _: NUMPY_SLOT_INDEX)
    notebook = with_cell_edited(notebook, "ch02_allocator", lambda s: replacing(
        "raise OutOfBlocks(", "raise PoolExhausted(")(s).replace("raise BlockRefError(", "raise DoubleRelease("))
    path = write_notebook(notebook, BUILD / "honest" / "numpy-errors", CHAPTERS["ch02"].stem)
    result = grade_notebook(path, CHAPTERS["ch02"], 120)
    lost = {e.grade_id: e.message for e in result.exercises if e.kind == "test" and e.earned != e.possible}
    assert lost == {} and result.earned == result.possible > 0, lost
