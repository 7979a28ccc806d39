"""A chapter's locked cells run on the engine a learner of that chapter has: no later chapter's reference.

Chapter k is run on the grader's host engine for chapter k (engine/course/authoring/edition.py's host_engine: the
chapters before it whole, the taught bodies of chapter k and of every later chapter stubs that call the
notebook's own definitions, of the checks only what the chapter's own cells use). A student edition that
hands out chapter k has the same taught bodies.

The cells covered are those that stopped there before they were rewritten (LISTED), with every code cell
before them that is not a graded test, run in order in one Python process (IPython's shell, as a kernel
runs them; no Jupyter kernel, to keep the test quick).

- With the chapter's solution pasted in, every one of those cells runs: none needs a later chapter's
  taught body, and none needs one of its own chapter before the cell that defines it.
- In the untouched release, a locked cell that is not a "With your code" cell either runs or stops with
  the edition's "not written yet" for an exercise of its own chapter, never for a later chapter's, and
  with no other error.
"""
import json
import re
import subprocess
import sys

import nbformat
import pytest

from engine.course import cells
from engine.course.authoring.edition import JUDGE_ONLY, host_engine, write_engine
from engine.course.paths import assignment_id, offline_cpu_environ
from engine.course.authoring.source import load_chapter
from fixtures.course_support import REPO, real_chapters

pytestmark = [pytest.mark.slow]
CHAPTERS = {assignment_id(path): path for path in real_chapters()}
NOT_WRITTEN = re.compile(r"is yours to write in (ch\d\d)")
LISTED = {
    "ch01": ["ch01_trace", "ch01_why", "ch01_tax", "ch01_capacity"],
    "ch02": ["ch02_pool", "ch02_yours_pool"],
    "ch03": ["ch03_why", "ch03_worked", "ch03_yours_demo"],
    "ch05": ["ch05_demo", "ch05_growth", "ch05_bench"],
    "ch07": ["ch07_why"],
    "ch08": ["ch08_when", "ch08_bytes_differ"],
}
RUNNER = r"""
import json, sys
from IPython.core.interactiveshell import InteractiveShell
import __main__
shell = InteractiveShell.instance(user_module=__main__)
failed = {}
for cell_id, source in json.load(open(sys.argv[1])):
    result = shell.run_cell(source, silent=True)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        failed[cell_id] = f"{type(error).__name__}: {str(error)[:300]}"
print("FAILED=" + json.dumps(failed))
"""


def covered(notebook, chapter: str) -> list:
    """The code cells that are not graded tests, from the first up to the last LISTED one."""
    ids = [cells.grade_id(cell) for cell in notebook.cells]
    missing = [name for name in LISTED[chapter] if name not in ids]
    assert not missing, f"{chapter}: no cells {missing}"
    last = max(ids.index(name) for name in LISTED[chapter])
    return [cell for cell in notebook.cells[:last + 1] if cell.cell_type == "code" and not cells.is_test(cell)]


def run(code_cells, engine_home, tmp_path) -> dict[str, str]:
    """{grade id: 'Name: message'} of the cells that raised, run in order in a fresh Python on that engine."""
    source = tmp_path / "cells.json"
    source.write_text(json.dumps([(cells.grade_id(cell) or cell.id, cell.source) for cell in code_cells]))
    done = subprocess.run([sys.executable, "-c", RUNNER, str(source)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env=offline_cpu_environ({"PYTHONPATH": str(engine_home), "MPLBACKEND": "Agg"}))
    report = [line for line in done.stdout.splitlines() if line.startswith("FAILED=")]
    assert done.returncode == 0 and report, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(report[-1][len("FAILED="):])


@pytest.mark.parametrize("chapter", sorted(LISTED))
def test_with_the_solution_pasted_the_cells_run_on_the_chapters_host_engine(chapter, tmp_path):
    notebook = load_chapter(CHAPTERS[chapter])
    code_cells = covered(notebook, chapter)
    assert {cells.grade_id(cell) for cell in code_cells} >= set(LISTED[chapter])
    failed = run(code_cells, host_engine(CHAPTERS[chapter], REPO), tmp_path)
    assert not failed, f"{chapter}: cells that raised on its host engine: {failed}"


@pytest.mark.parametrize("chapter", sorted(LISTED))
def test_in_the_release_a_locked_cell_waits_only_for_its_own_chapter(chapter, tmp_path):
    notebook = nbformat.read(REPO / "notebooks" / f"{CHAPTERS[chapter].stem}.ipynb", as_version=4)
    yours = {cells.grade_id(notebook.cells[i]) for i in cells.your_code_cells(notebook.cells)}
    code_cells = covered(notebook, chapter)
    failed = run(code_cells, host_engine(CHAPTERS[chapter], REPO), tmp_path)
    wrong = {}
    for cell in code_cells:
        name = cells.grade_id(cell)
        if name not in failed or name in yours or cells.is_solution(cell):
            continue
        named = NOT_WRITTEN.search(failed[name])
        if not (failed[name].startswith("NotWrittenYet:") and named and named[1] == chapter):
            wrong[name] = failed[name]
    assert not wrong, f"{chapter}: locked cells that stop for another reason than an exercise of {chapter}: {wrong}"


def test_a_later_chapters_stub_is_named_as_such(tmp_path):
    """The release test tells a later chapter's stub from this chapter's: ch01 on ch02's slot math; and the
    host engine's checks of a later chapter are stand-ins."""
    home = host_engine(CHAPTERS["ch01"], REPO)
    cell = nbformat.v4.new_code_cell("from engine.cache.slots import blocks_needed\nblocks_needed(5, 4)")
    [message] = run([cell], home, tmp_path).values()
    assert message.startswith("NotWrittenYet:") and NOT_WRITTEN.search(message)[1] == "ch02"
    ch02_checks = (home / "engine" / "checks" / "ch02.py").read_text()
    assert JUDGE_ONLY.split("{what}")[1][:40] in ch02_checks and "def check_allocator_in_engine" in ch02_checks
    assert (home / "engine" / "_edition.py").is_file()


def test_ch02_allocator_check_runs_in_a_lab_without_chapter_3(tmp_path):
    """A student edition with chapters 1 and 2 unlocked (ch03's taught cache methods stubbed): chapter 2's
    decisive check, run in the lab's own process, passes the engine's allocator without chapter 3."""
    write_engine(tmp_path, REPO, CHAPTERS, ["ch01", "ch02"])
    assert "_edition.yours('ch03" in (tmp_path / "engine" / "cache" / "paged.py").read_text()   # ch03 stubbed
    assert "_edition.yours(" not in (tmp_path / "engine" / "cache" / "allocator.py").read_text()   # ch02 whole
    script = ("from engine.cache.allocator import BlockAllocator\n"
              "from engine.checks import ch02\n"
              "ch02.check_allocator_in_engine(BlockAllocator)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=offline_cpu_environ({"PYTHONPATH": str(tmp_path)}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "✓" in done.stdout and "not written yet" not in done.stdout + done.stderr, done.stdout
