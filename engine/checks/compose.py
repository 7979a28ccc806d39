"""The learner's exercise classes of one chapter put together into one class, the way the learner built them.

A chapter whose exercise cells each define a small subclass (chapter 3's three caches, chapter 5's four
prefix-cache pieces) has checks that drive methods of several exercises on one object. That object must be
an instance of every class whose methods run on it, so that zero-argument `super()`, the learner's own
helpers and base classes work as in plain Python. `together` builds that class: the classes given, the one
under test first (its methods win), each class dropped that another already inherits (a cell that chains
`class PagedKVCache(PagedKVCache)` brings the earlier one with it), and one class only when that is all
that is left. Where Python finds no method order for them, it says so in the names the learner's cells use.
"""
from __future__ import annotations

import contextlib
import io
import sys

from engine.checks import CheckFailed, where_it_lives


@where_it_lives
def together(name: str, labels: tuple, *classes) -> type | str:
    """One class (named `name`) that inherits every class of `classes` (`labels[i]` is how the notebook
    names `classes[i]`, "YourReserve (Exercise 3.1)"), or a message saying why there is none. Runs where
    the classes live (the grader's host), so the class it makes is the learner's own."""
    for cls, label in zip(classes, labels):
        if not isinstance(cls, type):
            return (f"{label} is not a class (it is a {type(cls).__name__}): run the cell that defines it "
                    f"again, and do not rebind the name")
    parts, kept = [], []
    for cls, label in zip(classes, labels):
        if not any(cls is p for p in parts):
            parts.append(cls)
            kept.append(label)
    bases = [(c, label) for c, label in zip(parts, kept)
             if not any(o is not c and issubclass(o, c) for o in parts)]
    if len(bases) == 1:
        return bases[0][0]
    try:
        return type(name, tuple(c for c, _ in bases), {"__module__": bases[0][0].__module__,
                                                       "__doc__": f"{' + '.join(kept)}, as one class."})
    except TypeError as error:
        order = ", ".join(label for _, label in bases)
        return (f"your classes {order} cannot be put together into one class: Python finds no method order "
                f"for class {name}({', '.join(label.split(' (')[0] for _, label in bases)}) "
                f"({' '.join(str(error).split())}). Let "
                f"each exercise's class subclass the engine's class, as its cell starts, or the class of the "
                f"exercise before it (class X(X) chains them); change the class line of {bases[0][1]}'s cell, "
                f"run it and the cells after it again")


def _unwritten() -> None:
    raise NotImplementedError()


def _written(function) -> bool:
    """Whether `function` is the learner's: not the engine's (a student edition's stub included), and not
    an exercise cell's `raise NotImplementedError()` as the release leaves it."""
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    if code is None or str(getattr(function, "__module__", "")).startswith("engine."):
        return False
    return not (code.co_code == _unwritten.__code__.co_code and code.co_names == _unwritten.__code__.co_names)


@where_it_lives
def written_later(anchor, wanted: tuple) -> tuple:
    """The classes the running notebook binds to the names of `wanted` ((name, method names) pairs: the later
    exercises of a chapter, "Evict", ("evictable", "evict", "forget")) that define every one of those methods
    as the learner wrote them, in that order; None for a name unbound, or bound to a class with one unwritten.
    Runs where `anchor` (the learner's class) lives, so in the grader's host it reads the notebook there.
    A check that serves the engine through a later exercise puts these classes into the one it drives: the
    later method then runs on an instance of its own class, so its super() and helpers work."""
    namespace = getattr(sys.modules.get("__main__"), "__dict__", {})
    found = []
    for name, methods in wanted:
        cls = namespace.get(name)
        written = isinstance(cls, type) and all(_written(getattr(cls, method, None)) for method in methods)
        found.append(cls if written else None)
    return tuple(found)


def one_class(name: str, labels: tuple, *classes) -> type:
    """`together`'s class, where the checks run; its message as a CheckFailed when there is none."""
    made = together(name, labels, *classes)
    if isinstance(made, str):
        raise CheckFailed(made)
    return made


@contextlib.contextmanager
def naming_earlier(subject: str, earlier):
    """Around a check that runs the earlier exercises' methods too. `earlier`: (label, methods, probe) for
    each earlier class ("YourReserve (Exercise 3.1)", "reserve and set_batch", a callable that runs that
    exercise's own checks on it and raises CheckFailed). When the check fails and a probe fails too, the
    message says which earlier exercise is at fault, that this exercise's points go with it, and what to fix."""
    try:
        yield
    except Exception as error:
        if isinstance(error, NotImplementedError) and not isinstance(error, CheckFailed):
            raise
        for label, methods, probe in earlier:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    probe()
            except CheckFailed as probe_failed:
                said = str(error) if isinstance(error, CheckFailed) else \
                    f"the code under test crashed with {type(error).__name__}: {error}"
                exercise = label.partition(" (")[2].rstrip(")")
                probe_said = str(probe_failed).replace(". Hint: ", "; its hint: ")
                raise CheckFailed(
                    f"{subject}: {said.removeprefix(subject + ': ')}. This check runs your {methods} from "
                    f"{label} too, and that exercise's own check fails on it: {probe_said}. Fix {exercise} "
                    f"first: until it passes, this exercise's points are lost with it") from error
        raise


def naming_earlier_pieces(subject: str, labels: tuple, latest: str, earlier, checks: dict, methods: dict):
    """naming_earlier around the check of the exercise whose class is named `latest`, in a chapter whose
    exercise classes the notebook names `labels`, the latest first ("Evict (Exercise 5.4)", ...). `earlier`:
    the classes of the exercises before it that the test cell passes, the latest first; each is probed with
    `checks[name]`, its own exercise's checks (on it and the classes before it; the first exercise's class
    alone), and named with `methods[name]`, its methods in words."""
    names = [label.split(" (")[0] for label in labels]
    start, first = names.index(latest) + 1, names[-1]

    def probe(at: int, name: str):
        def run():
            for one in checks[name]:
                one(*((earlier[at],) if name == first else earlier[at:]))
        return run
    return naming_earlier(subject, [(label, methods[names[start + at]], probe(at, names[start + at]))
                                    for at, label in enumerate(labels[start:start + len(earlier)])])
