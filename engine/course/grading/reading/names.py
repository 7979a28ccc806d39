"""The names a cell's text binds and reads: which names a test takes from the host, which chapter cells
the judge runs itself, and which cell last defined a graded name. The texts read here are Python already
(the judge reads a learner cell as engine.course.cells.python_source makes it; chapter cells hold no
magics), so they are parsed as they are."""
from __future__ import annotations

import ast
import sys

_OWN_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def names_bound(source: str) -> set[str]:
    """The names a cell binds in the notebook's namespace: assignments (of every kind: `for` and `with`
    targets, `except ... as`, `:=`, `del`), imports, defs and classes, inside `if`, `for`, `while`,
    `with` and `try` too; not what a def, class, lambda or comprehension binds for itself."""
    tree = _tree(source)
    names: set[str] = set()
    todo = list(tree.body) if tree is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo += node.decorator_list      # what a def's decorators and defaults bind is the cell's
            if not isinstance(node, ast.ClassDef):
                todo += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*")
            continue
        if isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        if not isinstance(node, _OWN_SCOPES):
            todo += list(ast.iter_child_nodes(node))
    return names


def names_read(source: str) -> set[str]:
    """Every name the cell's text mentions (read or written, at any depth)."""
    tree = _tree(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} if tree is not None else set()


def imported(source: str) -> set[str]:
    """The names a chapter cell binds by import (the checks' module, torch, the engine's modules)."""
    tree = _tree(source)
    return {(a.asname or a.name).split(".")[0] for node in (ast.walk(tree) if tree is not None else ())
            if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}


def needed_cells(cells: list[tuple[str, str, str]]) -> set[str]:
    """The chapter cells (kind trusted) whose names the tests read, directly or through another such cell:
    the judge runs those itself. cells: [(kind, name, source)] in notebook order."""
    wanted: set[str] = set()
    chosen: set[str] = set()
    for kind, _, source in cells:
        if kind == "test":
            wanted |= names_read(source)
    for kind, name, source in reversed(cells):
        if kind == "trusted" and names_bound(source) & wanted:
            chosen.add(name)
            wanted |= names_read(source)
    return chosen


def named(module_name: str, qualname: str):
    """The object `qualname` (a function, class or Class.method) of a module, imported if need be."""
    target = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    for part in qualname.split("."):
        target = getattr(target, part)
    return target
