"""What the judge decides from the text of the notebook's cells: whether a graded name is the learner's own work.

The learner owns the host process (README), so the text decides only what text can decide, and every
learner cell may import, open, print and explore what it likes. A graded name counts as the learner's
own work when the learner cell that last binds it defines it there with `def` (a function) or `class`
(whose taught methods are defined in its body, or in a notebook class it inherits from, chained across
cells too), decorated or not (the judge calls the host's object, whatever a decorator made of it); when
no learner cell afterwards sets a taught method on it to anything but a `def` of the notebook; and when
its code, with every notebook definition it reads, neither hands back the engine's own version of the
method it defines (`super().allocate` inside `allocate`, `engine....allocate`) nor calls into the
checks. Cells are read as the Python they hold (engine.course.cells.python_source: magics, `!cmd`).
"""
from __future__ import annotations

import ast

from engine.course.cells import parse


_COMPOUND = (ast.If, ast.Try, ast.With, ast.For, ast.While, ast.AsyncFor, ast.AsyncWith) + (
    (ast.TryStar,) if hasattr(ast, "TryStar") else ())


def _binder(statement, name: str):
    """The node of `statement` that binds `name` last (a def or class inside an `if` or `try` too), or None."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return statement if statement.name == name else None
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        bound = any((a.asname or a.name).split(".")[0] == name for a in statement.names)
        return statement if bound else None
    if isinstance(statement, _COMPOUND):
        found = None
        heads = [statement.target] if isinstance(statement, (ast.For, ast.AsyncFor)) else [
            item.optional_vars for item in getattr(statement, "items", []) if item.optional_vars is not None]
        if any(_stores(head, name) for head in heads):
            found = statement
        for inner in _inner_statements(statement):
            found = _binder(inner, name) or found
        return found
    return statement if _stores(statement, name) else None


def _inner_statements(statement) -> list:
    inner = list(getattr(statement, "body", [])) + list(getattr(statement, "orelse", []))
    for handler in getattr(statement, "handlers", []):
        inner += handler.body
    return inner + list(getattr(statement, "finalbody", []))


_OWN_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
               ast.DictComp, ast.GeneratorExp)


def _stores(node, name: str) -> bool:
    """Whether `node` assigns `name` itself (not inside a function, class or comprehension it holds)."""
    todo = [node]
    while todo:
        sub = todo.pop()
        if isinstance(sub, ast.Name) and sub.id == name and isinstance(sub.ctx, ast.Store):
            return True
        if sub is node or not isinstance(sub, _OWN_SCOPES):
            todo += list(ast.iter_child_nodes(sub))
    return False


class Notebook:
    """The learner cells seen so far, in order, and what the chapter's cells bind to the engine and the
    checks. `graded` may grow as cells arrive (the judge adds each exercise cell's names)."""

    def __init__(self, graded: dict):
        self.graded = graded
        self.engine_names: set[str] = set()     # names bound to engine modules
        self.check_names: set[str] = set()      # ... and to the checks (engine.checks)
        self.cells: list[tuple[str, ast.Module]] = []

    def chapter_cell(self, source: str) -> None:
        """A chapter cell: the names it binds to the engine and to the checks."""
        engine_names, check_names = chapter_names(source)
        self.engine_names |= engine_names
        self.check_names |= check_names

    def add(self, name: str, source: str) -> None:
        """A learner cell, in notebook order (one that is not Python binds nothing)."""
        tree = parse(source)
        if tree is None:
            return
        self.cells.append((name, tree))
        self.chapter_cell(source)         # what it binds to the engine and the checks, as a chapter cell's

    def _binding(self, name: str, before: tuple[int, int] | None = None):
        """(cell index, statement index, node) of the last learner statement before `before` (the end
        when None) that binds `name`, or None."""
        last_cell = len(self.cells) - 1 if before is None else before[0]
        for cell in range(last_cell, -1, -1):
            body = self.cells[cell][1].body
            stop = len(body) if before is None or cell < before[0] else before[1]
            for index in range(stop - 1, -1, -1):
                node = _binder(body[index], name)
                if node is not None:
                    return cell, index, node
        return None

    def _class_defines(self, found, method: str, depth: int = 0):
        """The node that binds `method` in the class `found` or in a notebook class it inherits from
        (each base as it was bound before the class: `class C(C)` chains to the earlier C)."""
        cell, index, node = found
        body = [n for n in node.body if _binder(n, method) is not None]
        if body:
            return _binder(body[-1], method)
        for base in node.bases:
            if isinstance(base, ast.Name) and depth < 20:
                parent = self._binding(base.id, (cell, index))
                if parent is not None and isinstance(parent[2], ast.ClassDef):
                    inherited = self._class_defines(parent, method, depth + 1)
                    if inherited is not None:
                        return inherited
        return None

    def own_work(self, name: str) -> str:
        """'' when graded `name` is defined by the learner's own def or class; else why not."""
        found = self._binding(name)
        if found is None:
            return f"{name} is not defined in any of your cells"
        node = found[2]
        methods = self.graded.get(name, {}).get("methods")
        if not methods:
            return "" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else (
                f"{name} is not a function written with def in your cell")
        if not isinstance(node, ast.ClassDef):
            return f"{name} is not a class written in your cell"
        set_later = {attr for attr, _, _ in self._set_on(name, found)}
        for method in methods:
            if method in set_later:
                continue                  # _set_on's own rule: a def of the notebook, or refused there
            if not isinstance(self._class_defines(found, method), (ast.FunctionDef, ast.AsyncFunctionDef)):
                return f"{name}.{method} is not written in the notebook (it is inherited or assigned)"
        return ""

    def _set_on(self, name: str, found) -> list:
        """(attribute, value, where) for each taught method of class `name` (the code of function
        `name`) a learner statement after its definition sets (`Name.method = value`)."""
        taught = set(self.graded.get(name, {}).get("methods") or ("__code__",))
        seen = []
        for cell, (_, tree) in enumerate(self.cells):
            for index, statement in enumerate(tree.body):
                if (cell, index) <= found[:2]:
                    continue
                for node in ast.walk(statement):
                    if isinstance(node, ast.Assign):
                        for target in node.targets:
                            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                    and target.value.id == name and target.attr in taught:
                                seen.append((target.attr, node.value, (cell, index)))
        return seen

    def _definitions(self, names: list[str]) -> list:
        """The graded definitions and every notebook definition they read (names their code reads as
        bound at the end; a class's bases as bound before it)."""
        todo = [(name, None) for name in names]
        seen, result = set(), []
        while todo:
            name, before = todo.pop()
            found = self._binding(name, before)
            if found is None or found[:2] in seen:
                continue
            seen.add(found[:2])
            cell, index, node = found
            result.append(node)
            if isinstance(node, ast.ClassDef):
                todo += [(b.id, (cell, index)) for b in node.bases if isinstance(b, ast.Name)]
                parts = node.decorator_list + node.body
            else:
                parts = [node]
            todo += [(read, None) for part in parts for read in _global_reads(part)]
            if name in names:
                todo += [(value.id, where) for _, value, where in self._set_on(name, found)
                         if isinstance(value, ast.Name)]
        return result

    def graded_behind(self, names) -> list[str]:
        """The graded names a test reaches through the names it reads: those it reads itself, and those a
        notebook definition it reads is built from (ch05's `class Attach(PrefixCache, Keys)`: PrefixCache)."""
        found = {name for name in names if name in self.graded}
        for node in self._definitions(sorted(set(names) - found)):
            found |= {read for read in _global_reads(node) if read in self.graded}
        return sorted(found)

    def reasons(self, names: list[str]) -> list[str]:
        """Why a test of the graded `names` must not count (empty when it may)."""
        reasons = []
        own = [why for why in (self.own_work(name) for name in names) if why]
        for name in names:
            found = self._binding(name)
            if found is not None:
                own += self._set_otherwise(name, found)
        if own:
            reasons.append("; ".join(own) + ": the exercise must be your own code")
        for node in self._definitions(names):
            borrowed = self._borrowed(node)
            if borrowed:
                reasons.append(f"your code {borrowed}: the exercise must be your own code")
        return list(dict.fromkeys(reasons))

    def _set_otherwise(self, name: str, found) -> list[str]:
        """A taught method set on the class after it, to anything but a def of the notebook."""
        why = []
        for method, value, where in self._set_on(name, found):
            bound = self._binding(value.id, where) if isinstance(value, ast.Name) else None
            if bound is None or not isinstance(bound[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
                why.append(f"your cell {self.cells[where[0]][0]} sets {name}.{method} to "
                           f"{ast.unparse(value)[:40]}, not a def of yours")
        return why

    def _borrowed(self, node) -> str:
        """How a definition hands back the engine's own version of a taught name, or calls the checks.

        The checks are refused because some of them compute an exercise's answer under a name of their
        own (ch04.simulate_forks is shared_blocks', ch08.kv_bytes_reference kv_bytes_per_token_hf's):
        graded code calling them would earn points the learner did not write. This is a statement about
        the text, and it is not the barrier: the host's engine keeps of the checks only what the
        chapter's own cells use there, with an answer those cells print as a table of their values
        (engine.course.authoring.edition.host_checks), so a route the text does not show (getattr,
        sys.modules) finds nothing to call either."""
        taught = set(self.graded) | {m for spec in self.graded.values() for m in spec.get("methods") or ()}
        if isinstance(node, ast.ClassDef):      # its bases may be the engine's: the body and decorators
            parts = [(part, part.name if isinstance(part, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
                     for part in node.decorator_list + node.body]
        else:
            parts = [(node, None)]
        found = []
        for part, method in parts:
            for sub in ast.walk(part):
                if isinstance(sub, ast.Attribute) and sub.attr == "checks" and _root(sub.value) in self.engine_names:
                    return "calls into the checks (engine.checks)"
                if isinstance(sub, ast.Name) and sub.id in self.check_names:
                    return f"calls into the checks ({sub.id})"
                if isinstance(sub, ast.Attribute) and sub.attr in taught:
                    root = sub.value
                    if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super":
                        if sub.attr == method and not self._notebook_base_defines(node, method):
                            found.append(f"calls the engine's own {sub.attr} (super().{sub.attr})")
                    elif _root(root) in self.engine_names and self._taught_there(sub):
                        found.append(f"calls the engine's own {sub.attr}")
        return found[0] if found else ""

    def _taught_there(self, attribute: ast.Attribute) -> bool:
        """Whether `engine....name` is a taught body: a graded function, or a graded class's taught method
        read on that class (`...PagedKVCache.copy_on_write` in ch04). A graded class itself (its name in
        an annotation, `...BlockAllocator.__init__(self)`) or a method of another class is not."""
        spec = self.graded.get(attribute.attr)
        if spec is not None:
            return not spec.get("methods")
        owner = attribute.value
        named = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else None
        return attribute.attr in (self.graded.get(named, {}).get("methods") or ())

    def _notebook_base_defines(self, node: ast.ClassDef, method: str) -> bool:
        """Whether a notebook class that `node` inherits from defines `method` (super() reaches it)."""
        found = next(((c, i, n) for c, (_, tree) in enumerate(self.cells) for i, statement in enumerate(tree.body)
                      for n in [_binder(statement, node.name)] if n is node), None)
        if found is None:
            return False
        for base in node.bases:
            parent = self._binding(base.id, found[:2]) if isinstance(base, ast.Name) else None
            if parent is not None and isinstance(parent[2], ast.ClassDef) and isinstance(
                    self._class_defines(parent, method), (ast.FunctionDef, ast.AsyncFunctionDef)):
                return True
        return False


def _global_reads(node, local: frozenset = frozenset()) -> list[str]:
    """The names `node` reads from the notebook's namespace: not a parameter or a local of a function
    in it (a scratch cell's `block` is not the `block` a method assigns)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = node.args
        outside = [*getattr(node, "decorator_list", []), *args.defaults, *(d for d in args.kw_defaults if d)]
        body = node.body if isinstance(node.body, list) else [node.body]
        params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
        stored = {n.id for part in body for n in ast.walk(part)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        shared = {name for part in body for n in ast.walk(part) if isinstance(n, (ast.Global, ast.Nonlocal))
                  for name in n.names}
        inner = local | params | (stored - shared)
        return [read for part in outside for read in _global_reads(part, local)] + \
            [read for part in body for read in _global_reads(part, inner)]
    if isinstance(node, ast.Name):
        return [node.id] if isinstance(node.ctx, ast.Load) and node.id not in local else []
    return [read for child in ast.iter_child_nodes(node) for read in _global_reads(child, local)]


def _root(node):
    """The name an attribute or subscript chain starts from (`a` of `a.b[0].c`), None for another start
    (a call's result, a literal)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def chapter_names(source: str) -> tuple[set[str], set[str]]:
    """(names a chapter cell binds to engine modules, names it binds to the checks)."""
    tree = parse(source)
    engine, checks = set(), set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("engine.checks") and alias.asname:
                    checks.add(alias.asname)
                elif alias.name.split(".")[0] == "engine":
                    engine.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine"):
            for alias in node.names:
                bound = alias.asname or alias.name
                if (node.module or "").startswith("engine.checks") or (node.module == "engine"
                                                                       and alias.name == "checks"):
                    checks.add(bound)
                elif bound[:1].islower():   # a module or function of the engine (its classes may be bases)
                    engine.add(bound)
    return engine, checks


def defined_in_text(qualname: str, sources: list[str]) -> bool:
    """Whether a learner cell's text defines `qualname`, however it binds it: a def of that name (for
    Class.method, in any class the cells write), an assignment to the name (`evictable = lambda ...` in a
    class body, `physical_slot = helper`), or to an attribute of that name (`PrefixCache.evictable = f`).
    A def whose body is the release's `raise NotImplementedError()` (a docstring before it) is not
    written yet. Erring towards "written" only ever runs more of a check."""
    owner, _, method = qualname.rpartition(".")
    for source in sources:
        tree = parse(source)
        for node in ast.walk(tree) if tree is not None else ():
            if _binds_attribute(node, method):
                return True
            body = node.body if owner and isinstance(node, ast.ClassDef) else [node] if not owner else []
            if any(_binds(n, method) for n in body):
                return True
    return False


def _binds(node, name: str) -> bool:
    """Whether the statement `node` binds `name` (`_binder`), other than with the release's stub def."""
    bound = _binder(node, name)
    return bound is not None and not (isinstance(bound, (ast.FunctionDef, ast.AsyncFunctionDef))
                                      and _unwritten_body(bound))


def _binds_attribute(node, name: str) -> bool:
    """Whether `node` assigns an attribute called `name` (`Cls.name = ...`, `setattr(Cls, "name", ...)`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
        return len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == name
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(t, ast.Attribute) and t.attr == name for t in targets)


def _unwritten_body(definition) -> bool:
    """Whether a def's body is the release's stub: `raise NotImplementedError()`, a docstring before it."""
    body = [s for s in definition.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) and not body[0].exc.args else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def unwritten(taught: set, sources: list[str]):
    """The judge's own answer to "is `qualname` not written yet?" (for the checks' `served`): one of this
    chapter's taught names that no learner cell defines. What the host says of an exception it raised
    is never asked."""
    return lambda qualname: qualname in taught and not defined_in_text(qualname, sources)
