"""How a failed check reads in a notebook: engine.checks' IPython handler shows the check's message,
wrapped, and the learner's own frames when their code crashed, never the checking code; the cell still
fails (so Run All, nbgrader's executor and grading count it as before)."""
import pytest

from engine import checks
from engine.checks import CheckFailed, check, fail

IPython = pytest.importorskip("IPython")


@pytest.fixture(scope="module")
def shell():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    checks._install_report()  # engine.checks may have been imported before this shell existed
    return shell


def run(shell, source: str, capsys) -> tuple[bool, str]:
    """(the cell succeeded, what it showed)."""
    capsys.readouterr()
    result = shell.run_cell(source)
    return result.success, capsys.readouterr().out


def test_a_stub_shows_the_not_implemented_line_and_no_traceback(shell, capsys):
    shell.user_ns["check"] = check
    ok, shown = run(shell, "class Stub:\n    def go(self):\n        raise NotImplementedError()\n\n"
                           "@check\ndef check_go(cls):\n    cls().go()\n\ncheck_go(Stub)", capsys)
    assert not ok
    assert "Stub.go (line 3) is not implemented yet" in shown and "✗ check failed" in shown
    assert "Traceback" not in shown and "engine/checks" not in shown and "functools" not in shown


def test_a_crash_in_learner_code_shows_only_the_learners_frames(shell, capsys):
    shell.user_ns["checks_go"] = check(lambda cls: cls().go())
    ok, shown = run(shell, "def helper(i):\n    return [1, 2][i]\n\nclass Crashes:\n    def go(self):\n"
                           "        return helper(5)\n\nchecks_go(Crashes)", capsys)
    assert not ok
    assert "crashed in helper (line 2) with IndexError" in shown
    assert "Where your code crashed" in shown and "return helper(5)" in shown and "return [1, 2][i]" in shown
    assert "IndexError: list index out of range" in shown
    assert "engine/checks" not in shown and "wrapper" not in shown


def test_a_failure_is_wrapped_at_88_columns_with_the_hint_on_its_own_line(shell, capsys):
    shell.user_ns["fail"] = fail
    ok, shown = run(shell, "fail('after allocate(3), num_free', 5, 4, 'allocate takes blocks ' * 10)", capsys)
    assert not ok
    lines = shown.splitlines()
    assert "after allocate(3), num_free: expected 5, got 4" in lines
    assert any(line.startswith("Hint: allocate takes blocks") for line in lines)
    assert max(len(line) for line in lines if "\x1b" not in line) <= checks.REPORT_WIDTH


def test_other_errors_keep_ipythons_traceback(shell, capsys):
    ok, shown = run(shell, "1 / 0", capsys)
    assert not ok and "ZeroDivisionError" in shown and "✗ check failed" not in shown


def test_outside_ipython_a_check_still_raises_check_failed():
    with pytest.raises(CheckFailed, match="expected 5, got 4"):
        fail("num_free", 5, 4)


def test_a_cell_that_runs_a_stub_says_which_in_one_line(shell, capsys):
    ok, shown = run(shell, "def mine(x):\n    raise NotImplementedError()\n\nsorted([3, 1], key=mine)", capsys)
    assert not ok
    assert "✗ not written yet" in shown and "mine (Cell In[" in shown and "raised NotImplementedError" in shown
    assert "Traceback" not in shown and "sorted" not in shown


def test_an_engine_not_implemented_error_keeps_its_traceback(shell, capsys):
    namespace = {}
    exec(compile("def engine_side():\n    raise NotImplementedError('not in this engine')\n", "/engine/x.py", "exec"),
         namespace)
    shell.user_ns["engine_side"] = namespace["engine_side"]
    ok, shown = run(shell, "engine_side()", capsys)
    assert not ok and "Traceback" in shown and "not in this engine" in shown and "not written yet" not in shown


def test_a_stub_behind_another_error_is_named_too(shell, capsys):
    # Triton's interpreter raises InterpreterError from the kernel's NotImplementedError.
    ok, shown = run(shell, "def kernel():\n    raise NotImplementedError()\n\ntry:\n    kernel()\n"
                           "except NotImplementedError as e:\n    raise RuntimeError('wrapped') from e", capsys)
    assert not ok and "✗ not written yet" in shown and "kernel (Cell In[" in shown and "Traceback" not in shown


def test_an_untouched_answer_cell_says_it_is_yours_to_write(shell, capsys):
    ok, shown = run(shell, "r1_answer = None\n# YOUR CODE HERE\nraise NotImplementedError()", capsys)
    assert not ok and "✗ not written yet" in shown and "this cell is yours to write" in shown
    assert "line 3" in shown and "an exercise above" not in shown and "Traceback" not in shown


def test_a_kernel_stub_the_gpu_compiler_refuses_is_named_without_a_traceback(shell, capsys):
    # On a GPU, Triton's compiler refuses the stub's `raise` with a CompilationError quoting the source.
    ok, shown = run(shell, "class CompilationError(Exception):\n    pass\n\n"
                           "raise CompilationError('at 3:4:\\n    raise NotImplementedError()\\n    ^')", capsys)
    assert not ok and "✗ not written yet" in shown and "Triton kernel" in shown and "Traceback" not in shown
    ok, shown = run(shell, "raise CompilationError('at 3:4: unsupported tensor index')", capsys)
    assert not ok and "Traceback" in shown and "not written yet" not in shown
