"""Kernels from source, launched in a process of their own: the judge takes the learner's Triton kernel
from the cell's text (a plain function in Triton's language, its globals tl, triton and the cell's
constants), never builds or runs it, and launches it in the kernel process (engine.course.grading.sealed.kernelbox),
which gets the text and the tensors as data and sends back the tensors' bytes. Whatever the host holds
under the kernel's name is never launched, and the launcher takes only a function or a Triton kernel.
"""
import os
import pytest
import torch

from engine.attention.triton_decode import as_kernel
from engine.course.grading.grade import grade_notebook, sandboxed_grade
from engine.course.grading.kernel import kernel_argv
from engine.course.grading.sealed.kernelbox import KernelBox, KernelProcessError, from_cell, sandboxed_kernel
from fixtures.course_support import (BUILD, expanded, sandbox_or_skip, stubbed, with_cells_added,
                                     write_notebook)
from fixtures.hostile_notebooks import ATTACK_CODE, BUILTINS_ATTACK, CH06, MARKER, builtins_attack
from fixtures.sealed_cases import FAKE_JIT

DOUBLE = '''
SCALE = 2
def double_program(x_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(x_ptr + i, tl.load(x_ptr + i).to(tl.float32) * SCALE)
'''
UNSCREENED = ("def k(x_ptr, N: tl.constexpr):\n    import os\n    print('debugging', os.getpid(), tl.__name__)\n"
              "    i = tl.arange(0, N)\n    tl.store(x_ptr + i, tl.load(x_ptr + i) + 1)\n")
@pytest.fixture()
def box():
    made = KernelBox(kernel_argv())
    yield made
    made.stop()


def test_a_kernel_is_launched_in_the_kernel_process_and_writes_reach_the_judges_tensor(box):
    program, why = from_cell("double_program", DOUBLE)
    assert why == "" and program.constants == {"SCALE": 2}
    x = torch.arange(8.0)
    as_kernel(sandboxed_kernel(box, program))[(1,)](x[2:6], N=4)
    assert x.tolist() == [0.0, 1.0, 4.0, 6.0, 8.0, 10.0, 6.0, 7.0]
    assert box.process.pid != os.getpid() and box.launches == 1


def test_a_kernel_keeps_its_cells_jit_helpers_and_constexpr_globals(box):
    # As the engine's own kernels are written: a @triton.jit helper beside the kernel, a global
    # annotated `tl.constexpr` (Triton's way to declare one), both in the kernel's cell.
    cell = ("import triton\nimport triton.language as tl\n\nOFFSET: tl.constexpr = 0.5\n\n\n"
            "@triton.jit\ndef scaled(values, by):\n    return values * by\n\n\n"
            "def double_program(x_ptr, N: tl.constexpr):\n    i = tl.arange(0, N)\n"
            "    tl.store(x_ptr + i, scaled(tl.load(x_ptr + i).to(tl.float32), 2) + OFFSET)\n")
    program, why = from_cell("double_program", cell)
    assert why == "" and program.code.co_name == "double_program"
    x = torch.arange(4.0)
    as_kernel(sandboxed_kernel(box, program))[(1,)](x, N=4)
    assert x.tolist() == [0.5, 2.5, 4.5, 6.5]


def test_a_kernel_crash_names_its_line_and_the_next_launch_works(box):
    broken = DOUBLE.replace("tl.load(x_ptr + i)", "tl.load(x_ptr + i[:, None] + tl.zeros((N, 3), tl.int32))")
    program, _ = from_cell("double_program", broken)
    with pytest.raises(RuntimeError) as raised:
        as_kernel(sandboxed_kernel(box, program))[(1,)](torch.zeros(4), N=4)
    frames = [f for f in __import__("traceback").extract_tb(raised.value.__cause__.__traceback__)
              if f.filename == "<kernel double_program>"]
    assert frames and "tl.store" in frames[-1].line
    x = torch.ones(4)
    as_kernel(sandboxed_kernel(box, from_cell("double_program", DOUBLE)[0]))[(1,)](x, N=4)
    assert x.tolist() == [2.0] * 4


def test_a_kernel_past_its_time_or_a_dead_process_costs_only_that_launch(box):
    slow = "def spin(x_ptr, N: tl.constexpr):\n    i = 0\n    while i >= 0:\n        i = i + 1\n"
    program, _ = from_cell("spin", slow)
    import time
    box.deadline = time.monotonic() + 8
    with pytest.raises(KernelProcessError, match="within the cell's time"):
        as_kernel(sandboxed_kernel(box, program))[(1,)](torch.zeros(4), N=4)
    assert box.process is None
    box.deadline = None
    x = torch.ones(4)
    as_kernel(sandboxed_kernel(box, from_cell("double_program", DOUBLE)[0]))[(1,)](x, N=4)
    assert x.tolist() == [2.0] * 4


def test_the_builtins_route_runs_in_the_kernel_process_not_in_the_judge(box):
    if os.path.exists(MARKER):
        os.remove(MARKER)
    program, why = from_cell("k", BUILTINS_ATTACK.format(name="k", args="x_ptr, N: tl.constexpr", code=ATTACK_CODE))
    assert why == ""              # nothing reads the text: the process it runs in is the boundary
    as_kernel(sandboxed_kernel(box, program))[(1,)](torch.zeros(4), N=4)
    pid, engine_there = open(MARKER).read().split()
    os.remove(MARKER)
    assert int(pid) == box.process.pid and engine_there == "False"


def test_nothing_reads_a_kernels_text_for_what_it_may_do(box):
    """An import, a print or a dunder in a kernel runs where the kernel runs, in the kernel process; code
    that is no kernel fails its own launch there. Only a kernel that is not a def is not built."""
    program, why = from_cell("k", UNSCREENED)
    assert why == ""
    x = torch.zeros(4)
    as_kernel(sandboxed_kernel(box, program))[(1,)](x, N=4)
    assert x.tolist() == [1.0] * 4
    program, why = from_cell("k", "def k(x_ptr, N: tl.constexpr):\n    torch.ones(1)\n")
    with pytest.raises(RuntimeError, match="torch"):
        as_kernel(sandboxed_kernel(box, program))[(1,)](x, N=4)
    fn, why = from_cell("k", "k = lambda x_ptr, N: None\n")
    assert fn is None and "not a function written with def" in why


def test_the_launcher_takes_no_object_merely_indexed_by_a_grid():
    class Grid:
        def __getitem__(self, grid):
            return lambda *a, **k: None
    with pytest.raises(TypeError, match="not a Grid"):
        as_kernel(Grid())




@pytest.mark.slow
def test_the_fake_jit_attack_earns_nothing_and_the_solution_everything():
    attack = with_cells_added(stubbed(expanded(CH06)), "ch06_setup", FAKE_JIT)
    for cell in attack.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in ("ch06_decode_kernel", "ch06_gather_rows"):
            name = "paged_decode_head_program" if "decode" in cell.metadata["nbgrader"]["grade_id"] \
                else "gather_rows_program"
            cell.source = f"{name} = Program()\n"
    path = write_notebook(attack, BUILD / "kernels" / "fake_jit", CH06.stem)
    grade = grade_notebook(path, CH06, timeout=120)
    kernel_tests = {e.grade_id: e.earned for e in grade.exercises if e.kind == "test" and "decode" in e.grade_id
                    or "gather" in e.grade_id}
    assert kernel_tests and set(kernel_tests.values()) == {0}, {e.grade_id: e.message[:160] for e in grade.exercises}
    assert grade.earned == 0, {e.grade_id: e.message[:160] for e in grade.exercises if e.earned}


def _leftover_kernel_processes() -> list[str]:
    """Kernel processes this test's grading left: still under this process, or orphaned (another pytest
    worker's grading, running beside this one, has kernel processes of its own under that worker)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if b"The kernel process: builds" in handle.read() and _ours_or_orphaned(int(entry)):
                    found.append(entry)
        except (OSError, ValueError):
            continue
    return found


def _ours_or_orphaned(pid: int) -> bool:
    """Whether `pid` descends from this process, or from no pytest process at all (an orphan)."""
    while pid > 1:
        if pid == os.getpid():
            return True
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            if b"pytest" in handle.read():
                return False                 # another pytest worker's own grading
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rpartition(")")[2].split()[1])
    return True


def _builtins_attack_notebook(tag: str):
    return write_notebook(builtins_attack(), BUILD / "kernels" / tag, CH06.stem)


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
def test_the_builtins_attack_earns_nothing_runs_nothing_in_the_judge_and_leaves_no_process(sandboxed):
    if sandboxed:
        sandbox_or_skip()
    if os.path.exists(MARKER):
        os.remove(MARKER)
    path = _builtins_attack_notebook("builtins_" + ("sandboxed" if sandboxed else "plain"))
    grade = (sandboxed_grade if sandboxed else grade_notebook)(path, CH06, 120)
    kernel_tests = {e.grade_id: e.earned for e in grade.exercises if e.kind == "test" and (
        "decode" in e.grade_id or "gather" in e.grade_id)}
    assert kernel_tests and set(kernel_tests.values()) == {0}, {e.grade_id: e.message[:160] for e in grade.exercises}
    assert grade.earned == 0
    if sandboxed:             # its /tmp was the sandbox's own
        assert not os.path.exists(MARKER)
    else:                     # it ran, in a process without the engine (the kernel process)
        assert open(MARKER).read().split()[1] == "False"
        os.remove(MARKER)
    assert _leftover_kernel_processes() == []
