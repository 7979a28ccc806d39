"""How alike two pieces of code are once what does not change their meaning is set aside.

A definition becomes a list of tokens: its syntax tree in pre-order, with every local name and argument
renamed by order of first use (so renaming changes nothing), docstrings, comments and layout gone,
`x += 1` read as `x = x + 1`, a comprehension and a `for` or `while` loop read alike (each is a LOOP
over its parts), a call to a helper the same notebook defines (a function, or a method of the same
class) replaced by what the call hands it and the helper's own tokens, and every string constant one
token S (rewording a message changes nothing). Only this structure is compared, with difflib's ratio
(1.0: the same), above a high threshold (ALIKE); short code is not compared: a three-line answer is
written the same way by everyone (MIN_TOKENS). A match is a flag for the instructor, never a grade.
"""
from __future__ import annotations

import ast
import difflib
import inspect
import textwrap

from engine.course.cells import parse
from engine.course.grading.reading.names import named

MIN_TOKENS = 45          # below this (the size of the reference's tokens) code is not compared
# Structure at least this alike: the reference by meaning. Chapter 2's reference re-typed (renamed, a
# helper split out, a loop rewritten) is 0.86-0.90 alike, with its three messages reworded 1.0; three
# learners' own answers 0.57-0.82 (tests/fixtures/sealed_styles.py, tests/test_grade_honest.py).
ALIKE = 0.85
_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SKIP_FIELDS = {"ctx", "type_comment", "kind", "lineno", "col_offset", "end_lineno", "end_col_offset"}


def _body(node) -> list:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


class _Tokens:
    def __init__(self, helpers: dict, methods: dict):
        self.helpers, self.methods = helpers, methods   # name -> FunctionDef the notebook defines
        self.names: dict[str, str] = {}
        self.out: list[str] = []
        self.inlining: list[str] = []

    def local(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def function(self, node) -> None:
        for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            self.local(arg.arg)
        for stored in ast.walk(node):
            if isinstance(stored, ast.Name) and isinstance(stored.ctx, ast.Store):
                self.local(stored.id)
        for statement in _body(node):
            self.visit(statement)

    def inline(self, name: str, node) -> None:
        self.inlining.append(name)
        saved = self.names
        self.names = dict(saved)
        self.function(node)
        self.names = saved
        self.inlining.pop()

    def visit(self, node) -> None:
        if isinstance(node, ast.AugAssign):     # x += e  ->  x = x + e
            node = ast.Assign(targets=[node.target], value=ast.BinOp(left=node.target, op=node.op, right=node.value))
        if isinstance(node, _LOOPS):
            self.out.append("LOOP")
        if isinstance(node, ast.Call):
            target = node.func
            helper = None
            if isinstance(target, ast.Name) and target.id in self.helpers and target.id not in self.names:
                helper = target.id, self.helpers[target.id]
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.attr in self.methods and self.names.get(target.value.id) == "v0":
                helper = target.attr, self.methods[target.attr]
            if helper is not None and helper[0] not in self.inlining and len(self.inlining) < 4:
                for argument in node.args + [k.value for k in node.keywords]:
                    self.visit(argument)          # what the call hands the helper, then the helper's body
                self.inline(*helper)
                return
        if isinstance(node, ast.Name):
            self.out.append(self.names.get(node.id, node.id))
            return
        if isinstance(node, ast.Constant):
            self.out.append("S" if isinstance(node.value, str) else repr(node.value))   # words set aside
            return
        if isinstance(node, ast.Attribute):
            self.visit(node.value)
            self.out.append("." + node.attr)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            self.out.append("DEF")
        elif not isinstance(node, _LOOPS + (ast.expr_context,)):
            self.out.append(type(node).__name__)
        for field, value in ast.iter_fields(node):
            if field in _SKIP_FIELDS or field == "decorator_list":
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self.visit(child)
                elif isinstance(child, str) and field in ("arg", "name") and not isinstance(node, ast.ClassDef):
                    self.out.append(self.names.get(child, child))


def tokens(node, helpers: dict | None = None, methods: dict | None = None) -> list[str]:
    """The normalized tokens of a function definition (see the module's docstring)."""
    reader = _Tokens(helpers or {}, methods or {})
    reader.function(node)
    return reader.out


def similarity(mine: list[str], reference: list[str]) -> float:
    """How alike two token lists are, 0.0 to 1.0."""
    return difflib.SequenceMatcher(None, mine, reference, autojunk=False).ratio()


def alike(mine: list[str], reference: list[str]) -> bool:
    """Whether `mine` is `reference` by meaning: the same structure, ALIKE or more, whatever the words
    of its strings (the reference's messages reworded are still the reference)."""
    if len(reference) < MIN_TOKENS:
        return False
    return similarity(mine, reference) >= ALIKE


def definitions(source: str) -> tuple[dict, dict]:
    """({top-level function name: node}, {class name: {method name: node}}) of a cell's text."""
    tree = parse(source)
    if tree is None:
        return {}, {}
    functions, classes = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = {n.name: n for n in node.body
                                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return functions, classes


def exercise_tokens(name: str, methods: list | None, source: str, helpers: dict) -> list[str] | None:
    """The tokens of graded `name` as `source` defines it: the function, or the taught methods of the
    class one after the other (helpers: the notebook's other functions, inlined where called)."""
    functions, classes = definitions(source)
    if not methods:
        node = functions.get(name)
        return tokens(node, dict(helpers, **functions)) if node is not None else None
    body = classes.get(name)
    if body is None or not all(m in body for m in methods):
        return None
    own = {k: v for k, v in body.items() if k not in methods}
    return [token for m in methods for token in ["METHOD"] + tokens(body[m], dict(helpers, **functions), own)]


def every_function(source: str) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method a module's text defines, nested ones too:
    what a copy of a taught body could hide in, under any name."""
    tree = parse(source)
    found, todo = [], [("", node) for node in (tree.body if tree is not None else [])]
    while todo:
        prefix, node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                found.append((name, node))
            todo += [(f"{name}.", child) for child in node.body]
        else:
            todo += [(prefix, child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return found


def copies(functions: list[tuple[str, ast.AST]], references: dict[str, list[str]]) -> list[tuple[str, str, float]]:
    """(function, reference, likeness) for each function of `functions` that is a reference of
    `references` ({name: tokens}) by meaning (alike). Cheap bounds first: most pairs are far apart."""
    found = []
    for name, node in functions:
        mine = tokens(node)
        for reference, theirs in references.items():
            if len(theirs) < MIN_TOKENS or 2 * min(len(mine), len(theirs)) < ALIKE * (len(mine) + len(theirs)):
                continue
            matcher = difflib.SequenceMatcher(None, mine, theirs, autojunk=False)
            if matcher.real_quick_ratio() >= ALIKE and matcher.quick_ratio() >= ALIKE and matcher.ratio() >= ALIKE:
                found.append((name, reference, round(matcher.ratio(), 3)))
    return found


def reference_tokens(references: list, graded: dict) -> dict:
    """{graded name: normalized tokens of its reference} (exercise_tokens), read from the
    source of the judge's engine: a function, or a class's taught methods one after the other."""
    by_name: dict = {}
    for module_name, qualname in references:
        try:
            source = textwrap.dedent(inspect.getsource(named(module_name, qualname)))
        except (ImportError, AttributeError, OSError, TypeError):
            continue
        by_name.setdefault(qualname.split(".")[0], {})[qualname.split(".")[-1]] = source
    prints = {}
    for name, parts in by_name.items():
        methods = (graded.get(name) or {}).get("methods")
        if methods and all(m in parts for m in methods):
            text = "class _Reference:\n" + "".join(textwrap.indent(parts[m], "    ") for m in methods)
            prints[name] = exercise_tokens("_Reference", methods, text, {})
        elif not methods and name in parts:
            prints[name] = exercise_tokens(name, None, parts[name], {})
    return {name: tokens for name, tokens in prints.items() if tokens}


def copies_of_the_reference(names: list, graded: dict, sources: dict, references: dict) -> list[str]:
    """The graded names whose code, as typed into the learner's cell that last defined them, is the
    reference's by meaning (renamed, reformatted, loops rewritten, helpers split out): read from the
    cell's text, never from the host."""
    found = []
    helpers: dict = {}
    for source in dict.fromkeys(sources.values()):
        helpers.update(definitions(source)[0])
    for name in names:
        if name not in sources or name not in references:
            continue
        mine = exercise_tokens(name, graded[name].get("methods"), sources[name], helpers)
        if mine and alike(mine, references[name]):
            found.append(f"{name} is the reference's code by meaning")
    return sorted(set(found))
