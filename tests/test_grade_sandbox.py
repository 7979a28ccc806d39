"""`make autograde`, sealed and sandboxed: nbgrader's scores are the sealed worker's, and hostile
submissions cost only their own points and harm nothing.

One autograde run (nbgrader's own commands, the course's config) grades every case of
tests/fixtures/sealed_cases.py (the cheats earn their honest score here too) and five hostile
submissions, each the full solution with the physical_slot exercise replaced by something hostile:
writing outside its folder, reading another student's notebook, opening a socket, allocating far beyond
the memory limit, forking without end.
"""
import csv
import subprocess
import sys
import shutil

import pytest

from engine.course import sandbox
from engine.course.autograde import autograde
from fixtures.course_support import (BUILD, REPO, SEALED_CHAPTER, once_per_run, sandbox_or_skip,
                                     with_solution, write_notebook)
from fixtures.sealed_cases import ALLOC, CASES, FULL, HOSTILE, SHARED, _solution

pytestmark = [pytest.mark.slow]
TARGET = REPO / "sandbox-escape-probe.txt"
GOOD_SLOT = ("def physical_slot(block_table, pos, block_size):\n"
             "    return block_table[pos // block_size], pos % block_size\n")


def hostile_cases(submissions) -> dict:
    other = submissions / "honest_solution" / f"{SEALED_CHAPTER.stem}.ipynb"
    sources = {name: code.format(target=str(TARGET), other=str(other)) for name, code in HOSTILE.items()}
    if sandbox.limits_note():
        sources.pop("fork_bomb")  # no pids cgroup here: a fork bomb would not be bounded
    return {f"hostile_{name}": with_solution(_solution(), "ch98_physical_slot", code + GOOD_SLOT)
            for name, code in sources.items()}


def run_autograde() -> dict:
    root = BUILD / "sandbox-autograde"
    shutil.rmtree(root, ignore_errors=True)
    submissions = root / "submissions"
    for name, (make, _, _) in CASES.items():
        write_notebook(make(), submissions / name, SEALED_CHAPTER.stem)
    for name, notebook in hostile_cases(submissions).items():
        write_notebook(notebook, submissions / name, SEALED_CHAPTER.stem)
    lines = []
    outputs = autograde(submissions, root / "course", [SEALED_CHAPTER], timeout=60, jobs=2,
                        sandbox="required", progress=lines.append)
    rows = {row["student_id"]: row for row in csv.DictReader(outputs["grades"].open())}
    return {"rows": rows, "progress": lines, "escaped": TARGET.exists()}


@pytest.fixture(scope="module")
def graded():
    sandbox_or_skip()
    return once_per_run("sandbox-autograde", run_autograde)


@pytest.mark.parametrize("case", list(CASES))
def test_autograde_gives_every_case_its_honest_score(graded, case):
    _, expected, _ = CASES[case]
    row = graded["rows"][case]
    assert float(row["raw_score"]) == sum(expected.values()), row


def test_hostile_code_costs_only_its_own_exercise_and_harms_nothing(graded):
    hostile = {name: row for name, row in graded["rows"].items() if name.startswith("hostile_")}
    assert len(hostile) >= 4
    for name, row in hostile.items():
        assert float(row["raw_score"]) == FULL[ALLOC] + FULL[SHARED], (name, row)
    assert not graded["escaped"], "a submission wrote outside its folder"


def test_progress_and_flags(graded):
    assert any(line.startswith("[1/") for line in graded["progress"])
    assert any(line.startswith(f"[{len(graded['rows'])}/") for line in graded["progress"])
    assert "verbatim" in graded["rows"]["honest_solution"]["flags"]
    assert "refused" in graded["rows"]["cheat_gc_key_hunt"]["flags"]


def test_a_missing_sandbox_is_said_clearly(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.available.cache_clear()
    try:
        usable, why = sandbox.available()
    finally:
        monkeypatch.undo()
        sandbox.available.cache_clear()
    assert not usable and "bubblewrap is not installed" in why and "apt-get install bubblewrap" in why


def test_a_python_installed_under_tmp_stays_visible_in_the_sandbox(monkeypatch, tmp_path):
    # The sandbox gives /tmp a fresh tmpfs; a clone or venv in /tmp (a fresh clone in /tmp/course, a
    # venv built there) must be bound back, or the worker cannot even start Python.
    sandbox_or_skip()
    if not str(tmp_path).startswith("/tmp/"):
        pytest.skip(f"pytest's tmp_path {tmp_path} is not under /tmp")
    prefix = tmp_path / "venv"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "marker.txt").write_text("still here")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "secret.txt").write_text("no")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    box = sandbox.Sandbox(tmp_path / "work", hide=[tmp_path / "hidden"])
    try:
        run = subprocess.run(box(["cat", str(prefix / "lib" / "marker.txt"), str(tmp_path / "hidden" / "secret.txt")],
                                 tmp_path / "work"), capture_output=True, text=True, timeout=60)
    finally:
        box.close()
    assert run.stdout.startswith("still here"), f"the prefix under /tmp vanished in the sandbox: {run.stderr}"
    assert "secret.txt" in run.stderr and "no" not in run.stdout.replace("still here", ""), \
        "a hidden folder became readable again"


def test_a_worker_that_cannot_start_says_why(tmp_path):
    # A wrapper that breaks Python (as a sandbox hiding the venv does): the message carries what
    # starting Python that way printed, not only a guess.
    from engine.course.kernel import SealedKernel

    def broken(argv, cwd):
        return ["sh", "-c", "echo 'python3: No module named engine' >&2; exit 3"]
    kernel = SealedKernel({}, cwd=tmp_path, wrap=broken, startup_timeout=5)
    with pytest.raises(RuntimeError) as raised:
        kernel.start()
    assert kernel.process is None, "the failed worker's process and pipes were left behind"
    assert "did not start" in str(raised.value) and "exits 3: python3: No module named engine" in str(raised.value)
