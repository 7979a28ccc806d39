"""Kernels from source: the judge builds the learner's Triton kernel from the cell's text (a plain
function in Triton's language, its globals only tl, triton and the cell's constants) and launches it
itself; whatever the host holds under the kernel's name is never launched, and the launcher takes
only a function or a kernel triton.jit made.
"""
import pytest
import torch

from engine.attention.triton_decode import as_kernel
from engine.course.grade import grade_notebook
from engine.course.sealed import kernels
from fixtures.course_support import BUILD, REPO, expanded, stubbed, with_cells_added, write_notebook
from fixtures.sealed_cases import FAKE_JIT

CH06 = REPO / "solutions" / "ch06_triton_decode.py"
DOUBLE = '''
SCALE = 2
def double_program(x_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(x_ptr + i, tl.load(x_ptr + i).to(tl.float32) * SCALE)
'''
NOT_KERNEL_CODE = {
    "a module": "def k(x_ptr, N: tl.constexpr):\n    import os\n",
    "a global": "def k(x_ptr, N: tl.constexpr):\n    torch.ones(1)\n",
    "a dunder": "def k(x_ptr, N: tl.constexpr):\n    y = tl.__dict__\n",
    "a value's insides": "def k(x_ptr, N: tl.constexpr):\n    y = tl.arange(0, N).handle.data\n",
    "triton's runtime": "def k(x_ptr, N: tl.constexpr):\n    y = triton.runtime\n",
    "a decorator": "@print\ndef k(x_ptr, N: tl.constexpr):\n    pass\n",
    "an inner function": "def k(x_ptr, N: tl.constexpr):\n    def f():\n        pass\n",
    "not a def": "k = lambda x_ptr, N: None\n",
}


def test_a_kernel_is_built_from_the_cells_text_and_runs():
    fn, why = kernels.build("double_program", DOUBLE)
    assert why == "" and fn.__globals__.keys() >= {"tl", "triton", "SCALE"}
    x = torch.arange(4.0)
    as_kernel(fn)[(1,)](x, N=4)
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("case", sorted(NOT_KERNEL_CODE))
def test_code_that_is_not_plain_triton_is_not_built(case):
    fn, why = kernels.build("k", NOT_KERNEL_CODE[case])
    assert fn is None and why, case


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
