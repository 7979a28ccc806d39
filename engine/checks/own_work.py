"""Own work, in the notebook: an exercise that hands the engine's reference back is told so at once.

`make grade` gives such an exercise 0 (its host engine has no reference of the graded chapter: the
call comes back to the learner's own definition and is refused). In the learner's own kernel the full
engine is present, so without this screen the check would pass and the grade disagree. The screen
reads the learner's code, not its behaviour: it names the forms a learner writes (the engine's
function under an alias, `super().update(...)`, `Reference.update(self, ...)`, or the engine's method
bound into the class); the grader's run catches every other route.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import linecache
import os
import sys
import textwrap
import types
from pathlib import Path

CHECKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
ROOT = Path(__file__).resolve().parents[2]
# {chapter id: [[engine file, qualname], ...]}: what each chapter teaches, written by `make release`
# (engine/course/authoring/release.py) so that the checks read it without importing the course
TAUGHT_FILE = ROOT / "notebooks" / ".taught.json"


@functools.cache
def taught_code(chapter: str) -> frozenset:
    """The code objects of the engine functions and methods chapter `chapter` (e.g. "ch03") teaches:
    read from the list `make release` writes beside the notebooks (TAUGHT_FILE, from the solutions'
    include directives); empty where there is no solutions/ (a student edition, whose engine has no
    reference to hand back) or no list."""
    if not (ROOT / "solutions").is_dir() or not TAUGHT_FILE.is_file():
        return frozenset()
    codes = set()
    for engine_file, qualname in json.loads(TAUGHT_FILE.read_text()).get(chapter, []):
        value = importlib.import_module(engine_file.removesuffix(".py").replace("/", "."))
        for part in qualname.split("."):
            value = getattr(value, part, None)
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None:
            codes.add(code)
    return frozenset(codes)


def cell_file(filename: str) -> bool:
    """Whether `filename` is a notebook cell's (IPython names those); never outside IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    compiler = getattr(shell, "compile", None)
    return bool(compiler.format_code_name(filename)) if hasattr(compiler, "format_code_name") else False


def _notebook_made(value) -> bool:
    code = _code(value)
    return isinstance(code, types.CodeType) and cell_file(code.co_filename)


def _code(value):
    return getattr(getattr(value, "__func__", value), "__code__", None)


def _resolve(node: ast.expr, function, owner: type | None):
    """What a call's callee names, where it can be told without running anything: a global, an
    attribute of one, or `super().name` inside a method of `owner`; else None."""
    if isinstance(node, ast.Name):
        return function.__globals__.get(node.id)
    if isinstance(node, ast.Attribute):
        base = node.value
        if (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"
                and owner is not None):
            return next((vars(k)[node.attr] for k in owner.__mro__[1:] if node.attr in vars(k)), None)
        parent = _resolve(base, function, owner)
        try:
            return inspect.getattr_static(parent, node.attr, None) if parent is not None else None
        except Exception:
            return None
    return None


def _borrowed_call(function, owner: type | None, taught: frozenset) -> str | None:
    """The source text of a call in `function` to the taught engine body of its own name (the grader's
    engine has the learner's own there, so the call would come back), or to anything of the checks
    (the grader refuses those calls too), if any."""
    code = function.__code__
    lines = linecache.getlines(code.co_filename)    # a notebook cell's text is there (IPython puts it)
    try:
        tree = ast.parse(textwrap.dedent("".join(inspect.getblock(lines[code.co_firstlineno - 1:]))))
    except (IndexError, SyntaxError, TypeError, ValueError):
        return None
    for node in ast.walk(tree):
        code = _code(_resolve(node.func, function, owner)) if isinstance(node, ast.Call) else None
        if (code in taught and code.co_name == function.__name__) or (
                isinstance(code, types.CodeType) and os.path.abspath(code.co_filename).startswith(CHECKS_DIR)):
            return ast.unparse(node.func)
    return None


def borrowed(value, chapter: str, from_cell: bool) -> str | None:
    """Why `value` (a function or class handed to one of chapter `chapter`'s checks, by a notebook cell
    when `from_cell`) is the engine's reference of that chapter rather than the learner's own code, in
    words; None when it is not. The engine's own object counts only when a cell hands it over (the
    course's tests hand the reference to the checks on purpose)."""
    taught = taught_code(chapter)
    name = getattr(value, "__qualname__", getattr(value, "__name__", "it"))
    if isinstance(value, type):
        members = [(klass, key, member) for klass in value.__mro__ if klass.__module__ == value.__module__
                   for key, member in vars(klass).items()]
    else:
        members = [(None, name, value)]
    for klass, key, member in members:
        where = f"{klass.__qualname__}.{key}" if klass is not None else name
        if _code(member) in taught and _code(member).co_name == key.rpartition(".")[2] and (
                from_cell or _notebook_made_class(klass)):
            return f"{where} is the engine's own {_code(member).co_qualname}, not code you wrote"
        if _notebook_made(member):
            call = _borrowed_call(getattr(member, "__func__", member), klass, taught)
            if call:
                return f"your {where} calls the engine's reference ({call}(...))"
    return None


def _notebook_made_class(klass: type | None) -> bool:
    return klass is not None and any(_notebook_made(member) for member in vars(klass).values())
