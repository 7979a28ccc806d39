"""No reference within the host's reach: the host (the process that runs a notebook's cells under make
grade and make autograde) sees its own stubbed copy of the engine, the Python installation and the
system, and nothing of the course: no repository, no editable-install finder on its path, no other
chapter's host engine, no solutions, no .git, no bytecode of the reference.
"""

from engine.course.grading import grade
from engine.course.grading.grade import run_sealed
from engine.course.grading.sandbox import Sandbox
from fixtures.course_support import REPO, expanded, sandbox_or_skip, stubbed, with_cells_added
from fixtures.sealed_reach import taught_lines, walked, walker

CH02 = REPO / "solutions" / "ch02_block_tables.py"
WHERE = """
import sys, engine, os
print("WHERE", engine.__file__, sys.path, sorted(os.listdir({repo!r})))
"""


def test_the_walker_finds_the_reference_where_it_is(tmp_path):
    lines, stems = taught_lines(CH02)
    copy = tmp_path / "engine" / "cache"
    copy.mkdir(parents=True)
    (copy / "slots.py").write_text((REPO / "engine" / "cache" / "slots.py").read_text())
    namespace = {}
    cell = walker(lines, stems).replace('os.walk("/")', f'os.walk({str(tmp_path)!r})')
    exec(compile(cell, "<walker>", "exec"), namespace)
    assert namespace["found"] == {str(copy / "slots.py")} and len(lines) >= 8


def test_a_host_cell_that_walks_everything_it_can_read_finds_no_taught_body(tmp_path):
    sandbox_or_skip()
    lines, stems = taught_lines(CH02)
    notebook = with_cells_added(stubbed(expanded(CH02)), "ch02_setup", walker(lines, stems),
                                WHERE.format(repo=str(REPO)))
    wrap = Sandbox(tmp_path)
    try:
        run = run_sealed(notebook, CH02, 300, tmp_path, wrap=wrap)
    finally:
        wrap.close()
    listed, read, found = walked(run.cells)
    assert found == [] and listed > 10_000 and read > 1_000, (listed, read, found)
    [where] = [str(o.get("text", "")) for c in run.cells for o in c.get("outputs", [])
               if str(o.get("text", "")).startswith("WHERE")]
    engine_file, rest = where.split(" ", 2)[1:]
    assert not engine_file.startswith(str(REPO)) and "/paged-kv-host-" in engine_file, where
    assert "__editable__" not in rest and "host-engines" not in rest, where
    assert rest.rstrip().endswith("['.venv']"), where       # the repository's folder holds the venv only


def test_make_grade_without_a_sandbox_says_its_scores_are_self_assessment(monkeypatch, capsys, tmp_path):
    import engine.course.grading.sandbox as sandbox
    monkeypatch.setattr(sandbox, "available", lambda: (False, "bubblewrap is not installed (the `bwrap` command)"))
    seen = {}
    monkeypatch.setattr(grade, "grade_directory", lambda *a, **k: seen.update(k) or ([], []))
    (tmp_path / "ch02_block_tables.ipynb").write_text("{}")
    assert grade.main([str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [grade.SELF_ASSESSMENT.format(why="bubblewrap is not installed (the `bwrap` command)")]
    assert seen["sandbox"] is False


def test_make_grade_runs_the_host_in_the_sandbox_where_there_is_one(monkeypatch, capsys, tmp_path):
    import engine.course.grading.sandbox as sandbox
    monkeypatch.setattr(sandbox, "available", lambda: (True, ""))
    seen = {}
    monkeypatch.setattr(grade, "grade_directory", lambda *a, **k: seen.update(k) or ([], []))
    (tmp_path / "ch02_block_tables.ipynb").write_text("{}")
    grade.main([str(tmp_path)])
    assert seen["sandbox"] is True and "self-assessment" not in capsys.readouterr().err

