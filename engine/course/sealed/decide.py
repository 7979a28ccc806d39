"""What the judge decides from the text of the notebook's cells: own work and refusals.

The judge receives every cell's text before the host runs it, so it needs nothing the host says to
decide whether a test may count. A graded name counts as the learner's own work when the learner cell
that last binds it defines it there with `def` (a function) or `class` (whose taught methods are
defined in its body, or in a class of the notebook it inherits from), undecorated, and no learner cell
rebinds it or its methods afterwards. A test is refused when the code it grades, or any learner cell
that is not an exercise's (it could rebind anything), reaches for what grading relies on: code built at
run time (exec, eval, compile, importlib), files and the process (open, os, sys, inspect, ctypes,
socket, gc, threads, frames and functions' insides), the engine's own version of the taught name, or
the checks.
"""
from __future__ import annotations

import ast

# Calls, modules, attributes and names refused in learner cells: each reaches the grader's files, its
# process or its code, or builds code at run time.
CALLS = {"exec", "eval", "compile", "__import__", "open", "globals", "locals", "vars", "breakpoint",
         "setattr", "delattr", "get_ipython", "input"}
MODULES = {"importlib", "inspect", "runpy", "marshal", "ctypes", "socket", "subprocess", "pickle", "gc", "os",
           "sys", "io", "pathlib", "shutil", "glob", "site", "code", "codeop", "zipimport", "pkgutil",
           "builtins", "multiprocessing", "signal", "mmap", "dis", "linecache", "tokenize", "types",
           "threading", "_thread", "pty", "fcntl", "tempfile", "hmac", "json", "struct", "selectors",
           "sysconfig", "posix", "_io", "_socket", "__main__", "asyncio", "concurrent", "faulthandler",
           "tracemalloc", "weakref", "atexit", "copyreg", "zipfile", "tarfile", "urllib", "http", "traceback"}
ENGINE_ONLY = ("engine.course", "engine.checks")    # parts of the engine no learner cell imports
ATTRIBUTES = {"__code__", "__globals__", "__closure__", "__builtins__", "__subclasses__", "__dict__",
              "__getattribute__", "__loader__", "__spec__", "__file__", "__import__", "__func__", "__wrapped__",
              "__reduce__", "__reduce_ex__", "__bases__", "__base__", "__mro__", "__defaults__",
              "__kwdefaults__", "f_back", "f_globals", "f_locals", "f_code", "tb_frame", "gi_frame", "cr_frame",
              "ag_frame", "co_code", "sendall", "send", "recv"}
NAMES = {"__builtins__", "__loader__", "__spec__", "__file__", "get_ipython", "__import__"}
PLAIN_DECORATORS = {"staticmethod", "classmethod", "property"}


def parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def refusals(source: str) -> list[str]:
    """What in a learner cell's text grading refuses (one phrase each, in the order found)."""
    tree = parse(source)
    if tree is None:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                top = module.split(".")[0]
                if top in MODULES or module.startswith(ENGINE_ONLY) or (
                        isinstance(node, ast.ImportFrom) and module == "engine"
                        and any(a.name in ("course", "checks") for a in node.names)):
                    found.append(f"imports {module}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS:
            found.append(f"calls {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
            found.append(f"reads .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NAMES:
            found.append(f"uses {node.id}")
    return list(dict.fromkeys(found))


def _last_binding(tree: ast.Module, name: str):
    """The last top-level statement of `tree` that binds `name`, or None."""
    last = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            last = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name).split(".")[0] == name for a in node.names):
            last = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With, ast.Try, ast.If,
                               ast.While)):
            if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
                   for n in ast.walk(node)):
                last = node
    return last


def _decorated(node) -> bool:
    return any(not (isinstance(d, ast.Name) and d.id in PLAIN_DECORATORS) for d in node.decorator_list)


class Notebook:
    """The learner cells seen so far, in order: (cell name, text, whether it is an exercise's cell)."""

    def __init__(self, graded: dict, exercise_cells: set[str], engine_names: set[str], check_names: set[str]):
        self.graded, self.exercise_cells = graded, exercise_cells
        self.engine_names = set(engine_names)   # names the chapter's cells bind to engine modules
        self.check_names = set(check_names)     # ... and to the checks (engine.checks)
        self.cells: list[tuple[str, str, ast.Module | None]] = []
        self.imported = {"engine"} | self.engine_names | self.check_names   # names bound to what a cell imported
        self.writes: dict[str, list[str]] = {}     # learner cell -> what it writes into what was imported

    def chapter_cell(self, source: str) -> None:
        """A chapter cell: the names it binds to the engine, the checks, and any import."""
        engine_names, check_names = chapter_names(source)
        self.engine_names |= engine_names
        self.check_names |= check_names
        tree = parse(source)
        self.imported |= engine_names | check_names | (_imported(tree) if tree is not None else set())

    def add(self, name: str, source: str) -> None:
        tree = parse(source)
        self.cells.append((name, source, tree))
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "engine":
                        self.engine_names.add((alias.asname or alias.name).split(".")[0])
        if tree is not None:
            self.writes[name] = self._writes_into_imports(tree)

    def _writes_into_imports(self, tree: ast.Module) -> list[str]:
        """What a learner cell changes in a module or in what it imported (`torch.equal = ...`,
        `Base.method = ...`, `del ch03.fail`, `engine.checks...`, a dunder of anything), through an
        alias too (`c = ch03; c.fail = ...`): the host runs the checks' helpers
        (engine.checks.where_it_lives) on its own copy of the engine and its libraries, which such a
        write would change. Updates the names bound to imports as it reads the cell."""
        found = []
        self.imported |= _imported(tree)
        for node in ast.walk(tree):                   # aliases first: `c = ch03`, `for m in (torch,)`
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) else (
                node.iter if isinstance(node, (ast.For, ast.comprehension)) else None)
            if value is not None and self._reaches_import(value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                self.imported |= {n.id for t in targets for n in _plain_names(t)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("checks", "course") \
                    and _root(node.value) in self.engine_names | {"engine"}:
                found.append(f"reaches engine.{node.attr}")
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id in self.check_names | {"engine"}
                                                  for a in node.args + [k.value for k in node.keywords]):
                found.append("hands the checks' module to other code")
            if not (isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del))):
                continue
            root = _root(node.value)
            shown = ast.unparse(node)[:40]
            if isinstance(node, ast.Attribute) and (root is None or root in self.imported
                                                    or (node.attr.startswith("__") and node.attr.endswith("__"))):
                found.append(f"replaces {shown}")
            elif isinstance(node, ast.Subscript) and root in self.engine_names | self.check_names | {"engine"}:
                found.append(f"writes into {shown}")
        return list(dict.fromkeys(found))

    def _reaches_import(self, value) -> bool:
        """Whether an expression hands on what was imported itself: a name, an attribute of it, a
        container or getattr of them (not a call's result, an instance, which is the cell's own)."""
        if isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
            return _root(value) in self.imported
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            return any(self._reaches_import(e) for e in value.elts)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "getattr":
            return bool(value.args) and self._reaches_import(value.args[0])
        if isinstance(value, (ast.IfExp, ast.BoolOp)):
            parts = [value.body, value.orelse] if isinstance(value, ast.IfExp) else value.values
            return any(self._reaches_import(e) for e in parts)
        return False

    def _defining_cell(self, name: str):
        for cell_name, _, tree in reversed(self.cells):
            if tree is not None:
                node = _last_binding(tree, name)
                if node is not None:
                    return cell_name, tree, node
        return None

    def _class_defines(self, node: ast.ClassDef, method: str, seen: int = 0):
        """The FunctionDef of `method` in class `node` or in a notebook class it inherits from."""
        body = [n for n in node.body if _binds(n, method)]
        if body:
            return body[-1]
        for base in node.bases:
            if isinstance(base, ast.Name) and seen < 20:
                found = self._defining_cell(base.id)
                if found and isinstance(found[2], ast.ClassDef):
                    inherited = self._class_defines(found[2], method, seen + 1)
                    if inherited is not None:
                        return inherited
        return None

    def own_work(self, name: str) -> str:
        """'' when graded `name` is defined by the learner's own def or class; else why not."""
        found = self._defining_cell(name)
        if found is None:
            return f"{name} is not defined in any of your cells"
        _, _, node = found
        methods = self.graded.get(name, {}).get("methods")
        if not methods:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return f"{name} is not a function written with def in your cell"
            return f"{name} is decorated: a decorator may hand back any function" if _decorated(node) else ""
        if not isinstance(node, ast.ClassDef):
            return f"{name} is not a class written in your cell"
        for method in methods:
            defined = self._class_defines(node, method)
            if not isinstance(defined, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return f"{name}.{method} is not written in the notebook (it is inherited or assigned)"
            if _decorated(defined):
                return f"{name}.{method} is decorated: a decorator may hand back any function"
        return ""

    def _definitions(self, names: list[str]) -> list[tuple[str, ast.AST]]:
        """(cell name, node) of the graded definitions and of every notebook definition they read."""
        todo, seen, result = list(names), set(), []
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            found = self._defining_cell(name)
            if found is None:
                continue
            cell_name, _, node = found
            result.append((cell_name, node))
            todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
        return result

    def reasons(self, names: list[str]) -> list[str]:
        """Why a test of the graded `names` must not count (empty when it may)."""
        reasons = []
        for cell_name, source, tree in self.cells:
            if cell_name not in self.exercise_cells and tree is not None:
                refused = refusals(source) + self.writes.get(cell_name, [])
                if refused:
                    reasons.append(f"your cell {cell_name} {', '.join(refused[:3])}: graded notebooks may not")
        own = [why for why in (self.own_work(name) for name in names) if why]
        if own:
            reasons.append("; ".join(own) + ": the exercise must be your own code")
        texts = {cell_name: source for cell_name, source, _ in self.cells}
        definitions = self._definitions(names)
        graded_cells = [self.graded.get(name, {}).get("cell") for name in names]
        for cell_name in dict.fromkeys([c for c, _ in definitions] + graded_cells):
            refused = refusals(texts.get(cell_name, "")) + self.writes.get(cell_name, [])
            if refused and cell_name in self.exercise_cells:
                reasons.append(f"your {cell_name} {', '.join(refused[:3])}: graded code may not")
        for cell_name, node in definitions:
            borrowed = self._borrowed(node)
            if borrowed:
                reasons.append(f"your code {borrowed}: the exercise must be your own code")
        reasons += self._rebound(names)
        return list(dict.fromkeys(reasons))

    def _borrowed(self, node) -> str:
        """How a definition calls the engine's version of a taught name or the checks, if it does."""
        taught = set(self.graded) | {m for spec in self.graded.values() for m in spec.get("methods") or ()}
        inside = node.body if isinstance(node, ast.ClassDef) else [node]   # a class's bases may be the engine's
        for sub in (n for part in inside for n in ast.walk(part)):
            if isinstance(sub, ast.Attribute) and sub.attr in taught:
                root = sub.value
                if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super":
                    return f"calls the engine's own {sub.attr} (super().{sub.attr})"
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in self.engine_names:
                    return f"calls the engine's own {sub.attr}"
            if isinstance(sub, ast.Name) and sub.id in self.check_names:
                return f"calls into the checks ({sub.id})"
        return ""

    def _rebound(self, names: list[str]) -> list[str]:
        """A graded class's or function's attribute assigned from outside its definition."""
        found = []
        for cell_name, _, tree in self.cells:
            for node in ast.walk(tree) if tree is not None else ():
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                for target in targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id in names:
                        found.append(f"your cell {cell_name} replaces {target.value.id}.{target.attr}: the "
                                     "exercise must be your own code")
        return found


def _root(node):
    """The name an attribute or subscript chain starts from (`a` of `a.b[0].c`), None for another start
    (a call's result, a literal)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _plain_names(target) -> list:
    """The names an assignment target binds itself (`a`, `a, *b`), not those it writes into (`a.x`)."""
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _plain_names(e)]
    return _plain_names(target.value) if isinstance(target, ast.Starred) else []


def _imported(tree: ast.Module) -> set[str]:
    """The names a cell's import statements bind."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    return names


def _binds(node, name: str) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    return False


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
