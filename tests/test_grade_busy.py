"""The same score on a busy machine: a cell's time is the host's own CPU time (its answers to the
judge, and its cells), with a wall-clock backstop for code that sleeps or waits that counts only while
the judge waits for the host. A slow or stuck answer costs only the test it is in.
"""
import subprocess
import sys
import time

import pytest

from engine.course.grading.grade import grade_directory, grade_notebook
from fixtures.course_support import BUILD, REPO, expanded, with_cell_edited, write_notebook

pytestmark = [pytest.mark.slow]
CH02 = REPO / "solutions" / "ch02_block_tables.py"
SLEEPING = "    import time\n    time.sleep(3600)\n"
OWN_SLOT_INDEX = ('def slot_index(table, pos, block_size):\n'
                  '    check_block_size(block_size)\n'
                  '    if not 0 <= pos < len(table) * block_size:\n'
                  '        raise IndexError(f"position {pos} is past the {len(table)} blocks of this table")\n'
                  '    return table[pos // block_size] * block_size + pos % block_size\n')


def _scores(grade) -> dict:
    return {e.grade_id: e.earned for e in grade.exercises if e.kind == "test"}


def test_a_sleeping_answer_costs_only_its_own_test():
    # physical_slot sleeps; slot_index is written without it, so only physical_slot's test may lose.
    notebook = with_cell_edited(expanded(CH02), "ch02_physical_slot",
                                lambda s: s.replace("    check_block_size(block_size)\n", SLEEPING, 1))
    notebook = with_cell_edited(notebook, "ch02_slot_index", lambda s: OWN_SLOT_INDEX)
    path = write_notebook(notebook, BUILD / "busy" / "sleeping", CH02.stem)
    started = time.monotonic()
    grade = grade_notebook(path, CH02, timeout=2)   # its backstop: 10 x 2 s of waiting
    got = _scores(grade)
    full = {e.grade_id: e.possible for e in grade.exercises if e.kind == "test"}
    assert got == dict(full, ch02_test_physical_slot=0), {e.grade_id: e.message[:120] for e in grade.exercises}
    [message] = [e.message for e in grade.exercises if e.grade_id == "ch02_test_physical_slot"]
    assert "took more than 20 s (wall clock)" in message, message
    assert time.monotonic() - started < 600


def test_the_solutions_earn_full_marks_beside_cpu_burning_processes():
    folder = BUILD / "busy" / "solutions"
    for name in ("ch02_block_tables", "ch06_triton_decode", "ch07_continuous_batching"):
        write_notebook(expanded(REPO / "solutions" / f"{name}.py"), folder, name)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
    try:
        grades, _ = grade_directory(folder, REPO / "solutions", timeout=60)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for grade in grades:
        assert grade.earned == grade.possible > 0, (grade.chapter, {e.grade_id: e.message[:160] for e in grade.exercises
                                                                     if e.earned != e.possible})
    assert {g.chapter for g in grades} == {"ch02_block_tables", "ch06_triton_decode", "ch07_continuous_batching"}


BURNERS = 8
