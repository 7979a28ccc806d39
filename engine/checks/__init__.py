"""The graded checks, shared by the notebooks' test cells and `make grade`.

A check takes the learner's object (a function or a class), exercises it, on its own and plugged
into the real engine, and either prints one line starting with a tick or raises `CheckFailed`.
The message of a failure is written for the learner: what the check did, what it expected, what
came back, and a hint where to look. A check never depends on how the learner laid out their code,
only on the names and behaviour the chapter asks for.

Every public check is wrapped in `@check`, which turns the two ways unfinished code fails into
plain failures: a stub's `NotImplementedError` becomes "not implemented yet", and any other
exception becomes "crashed with ...", naming the function and line where it happened.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import math
import numbers
import os
import sys
import textwrap
import traceback
import types
from typing import Any, Callable, NoReturn

import torch

# The runtime's ceiling division (untaught, so never a learner's stub): checks and engine count blocks alike.
from engine.blocks import ceil_div

__all__ = [
    "ceil_div",
    "CheckFailed",
    "check",
    "fail",
    "expect_equal",
    "expect_raises",
    "compare_logits",
    "shows_text",
    "passed",
    "Proved",
    "tiny",
    "ATOL",
    "chosen_letter",
    "answered_number",
    "review_choice",
    "review_number",
    "one_thread",
    "where_it_lives",
]

# Logits of the cached and the from-scratch path come from different reduction orders, so they are
# compared with a tolerance, in float32 (never bitwise).
ATOL = 1e-5

_CHECKS_DIR = os.path.dirname(os.path.abspath(__file__))


class CheckFailed(AssertionError):
    """A check found a difference. The message says what was expected, what came back, and a hint."""


def fail(what: str, expected: Any = None, got: Any = None, hint: str | Callable[[], str] | None = None) -> NoReturn:
    """Raise `CheckFailed` with a message in plain words.

    `what` describes the situation ("after allocate(3) on a pool of 8 blocks, num_free"); when
    `expected` or `got` is given, the message continues "expected X, got Y". A `hint` that takes work
    to find (reading the learner's bookkeeping) can be a function: it is called only here, on a failure.
    """
    message = what
    if expected is not None or got is not None:
        message += f": expected {_show(expected)}, got {_show(got)}"
    if callable(hint):
        hint = hint()
    if hint:
        message += f". Hint: {hint}"
    raise CheckFailed(message)


def expect_equal(got: Any, expected: Any, what: str, hint: str | Callable[[], str] | None = None) -> None:
    """Fail unless `got == expected` (lists, tuples and ints compared as plain values).

    Only built-in values are compared: an object with its own idea of equality (an `__eq__` that says
    yes to everything) fails here instead of passing for the right answer.
    """
    plain_got, plain_expected = _plain(got), _plain(expected)
    if _builtin(plain_expected) and not _builtin(plain_got):
        fail(what, expected, f"a {type(got).__name__} object, not a plain value", hint)
    if plain_got != plain_expected:
        fail(what, expected, got, hint)


def expect_raises(errors: type | tuple, action: Callable[[], Any], what: str, hint: str | None = None):
    """Run `action`, which must raise one of `errors`; return the exception.

    A stub's NotImplementedError still reads "not implemented yet" (it propagates to `@check`).
    """
    expected = " or ".join(e.__name__ for e in (errors if isinstance(errors, tuple) else (errors,)))
    try:
        result = action()
    except NotImplementedError:
        raise
    except errors as exc:
        return exc
    except Exception as exc:  # the wrong kind of error is a failure worth naming
        fail(what, f"{expected} to be raised", f"{type(exc).__name__}: {exc}", hint)
    fail(what, f"{expected} to be raised", f"no error (it returned {_show(result)})", hint)


def compare_logits(got: torch.Tensor, expected: torch.Tensor, what: str, first_position: int = 0,
                   hint: str | Callable[[], str] | None = None, atol: float = ATOL) -> float:
    """Fail unless two `[n, vocab]` logit tensors agree within `atol`; return the largest difference.

    `first_position` is the sequence position of row 0, so the message can name the position where
    the two runs first part ways.
    """
    got, expected = _plain_tensor(got), _plain_tensor(expected)
    if got.shape != expected.shape:
        fail(f"{what}: the logits have the wrong shape", tuple(expected.shape), tuple(got.shape), hint)
    if not torch.isfinite(got).all():
        row = int((~torch.isfinite(got)).any(dim=-1).nonzero()[0])
        fail(f"{what}: the logits at position {first_position + row} are not finite (NaN or inf)",
             hint=hint)
    diff = (got - expected).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if worst > atol:
        row = int((diff.amax(dim=-1) > atol).nonzero()[0])
        fail(f"{what}: the logits differ from a from-scratch run of the same sequence at position "
             f"{first_position + row}: max |Δ| {worst:.3g} (allowed {atol:g})", hint=hint)
    return worst


@contextlib.contextmanager
def shows_text(text: Callable[[], str]):
    """Around a decisive compare_logits: when it fails, its message goes on with `text()`, e.g. the
    trained model's two continuations (engine/checks/continuations.py). Called only on a failure."""
    try:
        yield
    except CheckFailed as failure:
        raise CheckFailed(f"{failure}. {text()}") from None


@functools.lru_cache(maxsize=None)
def tiny(seed: int = 0):
    """The course's tiny seeded model, built once per process (no check changes its weights)."""
    from engine.checkpoint import tiny_model
    return tiny_model(seed=seed)


def chosen_letter(answer: Any, question: str, variable: str, letters: str = "abcd") -> str:
    """A multiple-choice answer as one lower-case letter ("(B)" reads as "b"); fails, in plain words,
    when the question is unanswered or the answer is not one of the letters."""
    options = ", ".join(f"'{letter}'" for letter in letters[:-1]) + f" or '{letters[-1]}'"
    if answer is None:
        fail(f"Review question {question} is not answered yet: set {variable} to {options}")
    choice = str(answer).strip().lower().strip("()")
    if len(choice) != 1 or choice not in letters:
        fail(f"{question}: answer with one letter, {options} (got {answer!r})")
    return choice


def answered_number(answer: Any, question: str, variable: str, unit: str = "a number") -> float:
    """A review answer as a plain number ("552" reads as 552.0); fails, in plain words, when the question
    is unanswered (None or ...) or the answer is not a number."""
    if answer is None or answer is ...:
        fail(f"Review question {question} is not answered yet: set {variable} to {unit}")
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    try:
        value = _plain(answer) if isinstance(answer, numbers.Real) and not isinstance(answer, bool) else float(answer)
    except (TypeError, ValueError):
        fail(f"{question}: {variable} must be a number, got {answer!r}")
    if not math.isfinite(value):          # NaN is "near" nothing, and compares False with everything
        fail(f"{question}: {variable} must be a finite number, got {value!r}")
    return value


def review_choice(answer: Any, question: str, variable: str, right: str, praise: str,
                  wrong: str | dict[str, str], hint: str | dict[str, str]) -> None:
    """A multiple-choice review question: a tick and `praise` for the `right` letter; any other letter
    fails, saying it `wrong`, with its hint (`wrong` and `hint` are one text, or one per letter)."""
    choice = chosen_letter(answer, question, variable)
    if choice == right:
        passed(f"{question}: {praise}")
        return
    wrong = wrong if isinstance(wrong, str) else wrong[choice]
    fail(f"{question}: ({choice}) {wrong}", hint=hint if isinstance(hint, str) else hint[choice])


def review_number(answer: Any, question: str, variable: str, want: float, praise: str, wrong: str,
                  hint: str, hints: dict[float, str] | None = None, unit: str = "a number",
                  rel: float = 0.0, reveal: bool = False) -> None:
    """A review question with a number for an answer: a tick and `praise` for `want` (within a relative
    `rel`); any other number fails, saying it is `wrong`, with the hint `hints` keeps for that common
    slip, else the general `hint`. `reveal` shows the expected number too."""
    value = answered_number(answer, question, variable, unit)

    def near(target: float) -> bool:
        return abs(value - target) <= rel * abs(target)

    if near(want):
        passed(f"{question}: {praise}")
        return
    hint = next((slip for target, slip in (hints or {}).items() if near(target)), hint)
    if reveal:
        fail(f"{question}: {wrong}", want, value, hint)
    fail(f"{question}: {answer!r} {wrong}", hint=hint)


@contextlib.contextmanager
def one_thread():
    """Torch on one thread while a check runs the tiny model: on a shared CPU more threads only wait."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def passed(message: str) -> None:
    """Print the line a check prints when everything held."""
    print(f"✓ {message}")


class Proved:
    """The facts a check has verified, noted as it verifies each one; its ✓ line is made of them alone,
    so the line can never claim a case the check did not run.

        proved = Proved("gather_rows")
        ...compare...; proved.note("repeated indices")      # only after that comparison held
        proved.passed("match x[index]")                      # ✓ gather_rows: ... (repeated indices)
    """

    def __init__(self, subject: str):
        self.subject, self.facts, self.counts = subject, [], {}
        self.skipped: list[str] = []          # parts `served` skipped (the student edition, see served)

    def note(self, fact: str) -> None:
        """Record one verified fact (a repeated fact counts once in the line, and is counted)."""
        if fact not in self.counts:
            self.facts.append(fact)
        self.counts[fact] = self.counts.get(fact, 0) + 1

    def holds(self, fact: str) -> bool:
        return fact in self.counts

    def line(self, claim: str = "") -> str:
        """The ✓ line's text: the subject, the claim, then every noted fact."""
        if not self.facts and not claim:
            raise CheckFailed(f"{self.subject}: the check verified nothing (a check's own defect)")
        facts = "; ".join(self.facts)
        return f"{self.subject}: " + (f"{claim} ({facts})" if claim and facts else claim or facts)

    def passed(self, claim: str = "") -> None:
        """Print the ✓ line; nothing when every part was skipped (served's note says why), and on the
        grader's last run (LAST_RUN) a check that verified nothing fails."""
        if self.skipped and not self.facts:
            if LAST_RUN:
                fail(f"{self.subject}: nothing of it could be checked: every part needs an exercise this "
                     f"notebook does not write ({', '.join(self.skipped)})",
                     hint="write the later exercises of this chapter: this test checks yours through them")
            return
        passed(self.line(claim))


def _edition_error():
    """The student edition's NotWrittenYet (engine/_edition.py exists only there), else None."""
    try:
        from engine import _edition
    except ImportError:
        return None
    return getattr(_edition, "NotWrittenYet", None)


EDITION_ERROR = _edition_error()


# True while the grader's judge runs a test for the last time, after every cell of the notebook: a
# part the exercise's points rest on can no longer wait for a later exercise (see served).
LAST_RUN = False


@contextlib.contextmanager
def served(what: str, proved: Proved | None = None, fact: str | None = None, essential: bool = True):
    """Around the part of a check that serves the engine through a later exercise of the chapter. In
    the student edition, while that exercise is still the learner's to write, the part is skipped
    with a note (the chapter's milestone serves everything); everywhere else it always runs. When the
    part ran to its end, `fact` is noted in `proved`; when it was skipped, `proved` knows.

    On the grader's last run (LAST_RUN) an `essential` part (one that checks the exercise itself, not
    only how it serves) is skipped no more: an exercise that part needs, still not written once every
    cell has run, fails the test. "Not written yet" is what the learner's process says, so a skip that
    decided points would be the learner's to claim."""
    try:
        yield
    except NotImplementedError as error:
        if not _edition_stub(error):
            raise
        if LAST_RUN and essential:
            fail(f"{what} runs {error.qualname}, which this notebook does not write: this test checks your "
                 "exercise through it", hint=f"write {error.qualname} (a later exercise of this chapter), "
                 "then this test can check yours")
        print(f"(not checked yet: {what} runs {error.qualname}, yours to write later in this chapter)")
        if proved is not None:
            proved.skipped.append(what)
        return
    if proved is not None and fact:
        proved.note(fact)


def _edition_stub(error: BaseException) -> bool:
    """The student edition's NotWrittenYet: raised here, or in the learner's process (the grader's host
    runs the edition's engine)."""
    return (EDITION_ERROR is not None and type(error) is EDITION_ERROR) or (
        getattr(error, "_course_edition", False) is True and isinstance(getattr(error, "qualname", None), str))


def _refuse_the_reference(check_name: str, chapter: str, values, from_cell: bool) -> None:
    """Fail at once when a function or class handed to the check is the engine's reference of the
    chapter, or calls it (see own_work). An object of the grader's host (a Remote) is not screened here."""
    from engine.checks.own_work import borrowed
    for value in values:
        if hasattr(type(value), "call_there"):
            continue
        if isinstance(value, (type, types.FunctionType)) and (why := borrowed(value, chapter, from_cell)):
            raise CheckFailed(f"{check_name}: {why}. Hint: this exercise must be your own code, and make grade "
                              f"gives it 0 points: write its body without the engine's version")


def _calls_itself(error: BaseException) -> bool:
    """The student edition's CallsItself: the learner's definition called the engine's own name for it
    (raised here, or in the grader's host, whose engine is that edition's for the graded chapter)."""
    kind = type(error)
    return (kind.__module__ == "engine._edition" and kind.__name__ == "CallsItself") or (
        getattr(error, "_course_calls_itself", False) is True)


def where_it_lives(fn: Callable) -> Callable:
    """For a check's helper that builds on the learner's class or kernel (a subclass, a recorder, the
    cache or sequences learner code will hold): when that object lives in another process (the
    grader's host), the helper runs there, on the host's own copy of the engine, and what it returns
    stays there too; here it runs as written."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        remote = next((v for v in (*args, *kwargs.values()) if hasattr(type(v), "call_there")), None)
        if remote is not None:
            return type(remote).call_there(remote, wrapper, *args, **kwargs)
        return fn(*args, **kwargs)

    return wrapper


@where_it_lives
def made_beside(anchor, make: Callable, *args, **kwargs):
    """make(*args, **kwargs), an engine class or function, called where `anchor` lives. In the grader an
    object that learner code will hold (a prefix cache over the learner's cache, the scheduler's
    sequences) is built in the learner's process from its own engine copy: the grader sends data only."""
    return make(*args, **kwargs)


def check(fn: Callable) -> Callable:
    """Make a check report unfinished or crashing learner code as a plain `CheckFailed`."""

    chapter = fn.__module__.rpartition(".")[2]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "IPython" in sys.modules:      # a notebook's kernel: the grader's processes screen their own way
            from engine.checks.own_work import cell_file
            _refuse_the_reference(fn.__name__, chapter, (*args, *kwargs.values()),
                                  cell_file(sys._getframe(1).f_code.co_filename))
        try:
            with torch.no_grad():
                return fn(*args, **kwargs)
        except CheckFailed:
            raise
        except NotImplementedError as exc:
            if _edition_stub(exc):
                raise CheckFailed(f"{fn.__name__}: {exc}") from exc
            where = _learner_frame(exc)
            raise CheckFailed(f"{fn.__name__}: {where} is not implemented yet (it raised "
                              f"NotImplementedError). Write it, run its cell again, then this one.") from exc
        except Exception as exc:
            if _calls_itself(exc):
                raise CheckFailed(f"{fn.__name__}: {exc}") from exc
            where = _learner_frame(exc)
            raise CheckFailed(f"{fn.__name__}: the code under test crashed in {where} with "
                              f"{type(exc).__name__}: {exc}") from exc

    wrapper.is_check = True
    return wrapper


def _learner_frame(exc: BaseException) -> str:
    """Name the innermost frame of the traceback that is not inside torch or the checks."""
    remote = getattr(exc, "_course_where", None)
    if isinstance(remote, list):          # raised in the learner's process: its frames, as data
        for filename, lineno, name in reversed(remote):
            path = str(filename)
            if f"{os.sep}checks{os.sep}" in path or f"{os.sep}torch{os.sep}" in path or "site-packages" in path \
                    or f"{os.sep}course{os.sep}" in path:
                continue
            return f"{name} (line {lineno})"
        return "your code"
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    for tb in reversed(frames):
        code = tb.tb_frame.f_code
        path = os.path.abspath(code.co_filename)
        if path.startswith(_CHECKS_DIR) or f"{os.sep}torch{os.sep}" in path or "site-packages" in path:
            continue
        name = getattr(code, "co_qualname", code.co_name)
        return f"{name} (line {tb.tb_lineno})"
    summary = traceback.extract_tb(exc.__traceback__)
    return summary[-1].name if summary else "your code"


def _plain_tensor(value: Any) -> torch.Tensor:
    """A plain float32 CPU tensor: a tensor subclass loses its own operators (`__torch_function__`)."""
    with torch._C.DisableTorchFunctionSubclass():
        value = torch.as_tensor(value)
        return torch.Tensor.clone(value.detach()).to("cpu", torch.float32)


_BUILTIN_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _builtin(value: Any) -> bool:
    """Made only of built-in scalars, lists, tuples and dicts (exact types, no subclasses)."""
    if type(value) in _BUILTIN_SCALARS:
        return True
    if type(value) in (list, tuple):
        return all(_builtin(v) for v in value)
    if type(value) is dict:
        return all(_builtin(k) and _builtin(v) for k, v in value.items())
    return False


def _plain(value: Any) -> Any:
    copy = getattr(type(value), "plain_copy", None)
    if copy is not None:                  # a list or dict of the learner's process: its contents
        value = copy(value)
    if isinstance(value, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.tolist(value.detach())
    if isinstance(value, bool) or type(value) in _BUILTIN_SCALARS:
        return bool(value) if isinstance(value, bool) else value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return repr(_plain(value))


# --------------------------------------------------------------------------------------------------
# How a failed check reads in a notebook (IPython only: `make grade` runs checks outside IPython)
# --------------------------------------------------------------------------------------------------

REPORT_WIDTH = 88  # the course's column limit: a message wraps instead of scrolling sideways
_RED, _BOLD, _RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


def report_lines(error: CheckFailed, cell_name: Callable[[str], str | None] = lambda filename: None) -> list[str]:
    """What a failed check shows: its message wrapped at REPORT_WIDTH, the hint on a line of its own and,
    when the learner's code crashed (the error's cause, not a stub's NotImplementedError), the crash's
    frames that are the learner's: `cell_name(filename)` names a notebook cell ("In[7]"), else None."""
    message, _, hint = str(error).partition(". Hint: ")
    lines = [f"{_RED}{_BOLD}✗ check failed{_RESET}"] + _wrapped(message) + (_wrapped(f"Hint: {hint}") if hint else [])
    cause = error.__cause__
    if cause is None or isinstance(cause, NotImplementedError):
        return lines
    frames = [(cell_name(frame.filename), frame) for frame in traceback.extract_tb(cause.__traceback__)]
    frames = [(cell, frame) for cell, frame in frames if cell]
    if frames:
        lines.append("")
        lines.append("Where your code crashed (innermost last):")
        for cell, frame in frames:
            source = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
            lines.append(f"  {cell}, line {frame.lineno}, in {frame.name}")
            lines += [f"    {part}" for part in _wrapped(source, REPORT_WIDTH - 4)] if source else []
        lines += _wrapped(f"{type(cause).__name__}: {cause}")
    return lines


def _wrapped(text: str, width: int = REPORT_WIDTH) -> list[str]:
    """Each line of text wrapped at width (long words, such as a tensor's repr, are kept whole)."""
    return [part for line in text.splitlines() or [""]
            for part in textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False) or [""]]


def _chain(error: BaseException | None, context: bool = False):
    """`error` and, up to 8 links, what caused it (`__cause__`; with `context`, else `__context__`)."""
    for _ in range(8):
        if error is None:
            return
        yield error
        error = error.__cause__ or (error.__context__ if context else None)


def _stub_error(error: BaseException) -> NotImplementedError | None:
    """The NotImplementedError a stub raised, if `error` is one or was caused by one (Triton's
    interpreter raises its own InterpreterError from the kernel's error)."""
    return next((e for e in _chain(error) if isinstance(e, NotImplementedError)), None)


def _uncompiled_stub(error: BaseException) -> bool:
    """Triton's compiler refusing a kernel whose body is still the stub's `raise NotImplementedError()`
    (on a GPU; the interpreter raises the NotImplementedError itself)."""
    return any(type(e).__name__ == "CompilationError" and "NotImplementedError" in str(e)
               for e in _chain(error, context=True))


def not_written_lines(error: BaseException, tb, cell_name: Callable[[str], str | None]) -> list[str] | None:
    """What a cell shows when it ran a stub of the learner's (a "With your code" cell before its
    exercise is written): one line naming the stub, not a traceback through the engine or Triton.
    None when it is not that (an error of the engine's own, with a message: its traceback is kept)."""
    if _uncompiled_stub(error):
        return [f"{_RED}{_BOLD}✗ not written yet{_RESET}"] + _wrapped(
            "a Triton kernel this cell launches still has its `raise NotImplementedError()` (on a GPU the "
            "compiler refuses a `raise`): write that exercise above, run its cell, then this one again.")
    stub = _stub_error(error)
    if stub is None:
        return None
    if EDITION_ERROR is not None and isinstance(stub, EDITION_ERROR):
        return [f"{_RED}{_BOLD}✗ not written yet{_RESET}"] + _wrapped(str(stub))
    # A stub raises NotImplementedError() without a message, in a cell; one with a message raised by
    # the engine's own code keeps its traceback.
    frames = [(cell_name(f.filename), f) for f in traceback.extract_tb(tb)]
    if stub is not error:
        frames += [(cell_name(f.filename), f) for f in traceback.extract_tb(stub.__traceback__)]
    cells_seen = [(cell, frame) for cell, frame in frames if cell]
    if not cells_seen or (frames[-1][0] is None and str(stub)):
        return None
    cell, frame = cells_seen[-1]
    if frame.name == "<module>" and frame is frames[-1][1]:   # raised by this very cell's own top level
        return [f"{_RED}{_BOLD}✗ not written yet{_RESET}"] + _wrapped(
            f"this cell is yours to write ({cell}, line {frame.lineno}): put your code or answer in place "
            "of its `raise NotImplementedError()` line, then run it again.")
    where = f"{cell}" if frame.name == "<module>" else f"{frame.name} ({cell}, line {frame.lineno})"
    return [f"{_RED}{_BOLD}✗ not written yet{_RESET}"] + _wrapped(
        f"{where} raised NotImplementedError: this cell runs code you write in an exercise above. Write "
        "it, run its cell, then this one again.")


def _show_check_failed(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """IPython's custom handler for CheckFailed (and a learner's NotImplementedError): shows
    report_lines() instead of the traceback through the checking code. The cell still ends in error
    (IPython records it; the kernel replies "error"), so Run All, nbgrader's executor and grading see
    a failed test cell as before."""
    compiler = getattr(shell, "compile", None)

    def cell_name(filename: str) -> str | None:
        named = compiler.format_code_name(filename) if hasattr(compiler, "format_code_name") else None
        return f"{named[0]} {named[1]}" if named else None

    if isinstance(value, CheckFailed):
        stb = report_lines(value, cell_name)
    else:
        stb = not_written_lines(value, tb, cell_name) or shell.InteractiveTB.structured_traceback(
            etype, value, tb, tb_offset=tb_offset)
    shell._showtraceback(etype, value, stb)
    return stb


def _install_report() -> None:
    """Inside IPython (a notebook's kernel) show failed checks with _show_check_failed. IPython is
    looked for among the modules already imported, so the grader's plain Python never loads it."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None and hasattr(shell, "set_custom_exc"):
        # Every error comes here; those that are neither a failed check nor a stub's get IPython's own
        # traceback, as without the handler.
        shell.set_custom_exc((Exception,), _show_check_failed)


_install_report()
