"""What a chapter grades, read from its source: the exercises, their taught code, and what to watch.

For each solution cell of a chapter this finds the names the learner must write (its top-level
functions and classes) and, for a class, the *taught* methods (those holding a `### BEGIN SOLUTION`
region, which is what `#| include ... solve=` marks); methods without one are given and may stay the
engine's. The include directive names the engine's reference, whose code must not stand in for the
learner's. The sealed worker (engine.course.grading.sealed.host) uses this plan; `own_work_flags` compares a
submission's taught code with the reference source (a verbatim copy is flagged for the instructor, not
zeroed).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import jupytext

from engine.course import cells
from engine.course.authoring.source import load_chapter

DIRECTIVE = re.compile(r"^#\|\s*include\s+(?P<path>[^\s:]+)::(?P<name>[A-Za-z_][\w.,]*)(?:\s+solve=(?P<solve>\S+))?")


@dataclass
class Exercise:
    """One solution cell: the names it defines, their taught methods, the reference it was cut from."""

    cell: str                                  # the solution cell's grade_id
    names: dict[str, list[str] | None]         # name -> taught methods (None: a function, all of it taught)
    reference: str | None = None               # "engine/cache/slots.py::physical_slot", from the include
    reference_module: str | None = None        # "engine.cache.slots"
    reference_source: dict[str, str] = field(default_factory=dict)  # "Name.method" -> body dump (ast)


@dataclass
class Plan:
    """Everything the sealed worker needs to know about a chapter."""

    exercises: list[Exercise]
    preimport: list[str]
    references: list[tuple[str, str]]   # (module, qualname) of each taught reference function
    helpers: list[str]                  # the chapter's check modules: their helpers are not for learners
    kernels: list[str] = field(default_factory=list)  # graded functions that are Triton programs

    def graded(self) -> dict[str, dict]:
        return {name: {"methods": methods, "cell": ex.cell, "reference": ex.reference}
                for ex in self.exercises for name, methods in ex.names.items()}

    def graded_by_cell(self) -> dict[str, dict[str, dict]]:
        """Per solution cell, the specs of the names it defines: cells that define one name (a class
        split over several exercise cells) each hold its spec from the cell on."""
        return {ex.cell: {name: {"methods": methods, "cell": ex.cell, "reference": ex.reference}
                          for name, methods in ex.names.items()} for ex in self.exercises}

    def for_worker(self) -> dict:
        return {"preimport": self.preimport, "references": self.references, "helpers": self.helpers,
                "kernels": self.kernels,
                "graded": self.graded(), "graded_by_cell": self.graded_by_cell()}


def load_any(chapter_path: Path):
    """A chapter source (chNN_topic.py) expanded, or a released notebook (chNN_topic.ipynb) as it is."""
    import nbformat
    if Path(chapter_path).suffix == ".ipynb":
        return nbformat.read(chapter_path, as_version=4)
    return load_chapter(chapter_path)


def _module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _parse(source: str):
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _body_dump(function: ast.AST) -> str:
    """A function's body without its docstring, as a layout- and comment-free string."""
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return "\n".join(ast.dump(statement, annotate_fields=False) for statement in body)


def taught_in(source: str) -> dict[str, list[str] | None]:
    """{name: taught methods or None} for the top-level definitions of an expanded solution cell."""
    tree = _parse(source)
    if tree is None:
        return {}
    lines = source.splitlines()

    def has_solution(node) -> bool:
        return any(line.strip() == cells.BEGIN_SOLUTION for line in lines[node.lineno - 1:node.end_lineno])

    names: dict[str, list[str] | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            taught = [item.name for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and has_solution(item)]
            if taught:
                names[node.name] = taught
    return names


def is_constexpr_program(definition: ast.AST) -> bool:
    """Whether a definition is a Triton program: a function with an argument annotated tl.constexpr."""
    return isinstance(definition, ast.FunctionDef) and any(
        isinstance(a.annotation, ast.Attribute) and a.annotation.attr == "constexpr"
        for a in definition.args.args + definition.args.kwonlyargs)


def kernels_in(source: str) -> list[str]:
    """The top-level functions of an exercise cell that are Triton programs (an argument annotated
    tl.constexpr). Read from the signature, which the solution and the student's stub share, so a
    release without solutions/ (the student edition) knows its kernels too."""
    tree = _parse(source)
    return [node.name for node in (tree.body if tree else []) if is_constexpr_program(node)]


def definitions(source: str) -> dict[str, str]:
    """{"name" or "Class.method": body dump} of a cell's top-level functions and methods."""
    tree = _parse(source)
    found: dict[str, str] = {}
    if tree is None:
        return found
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = _body_dump(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = _body_dump(item)
    return found


def _imports(source: str) -> set[str]:
    tree = _parse(source)
    modules: set[str] = set()
    for node in ast.walk(tree) if tree else []:
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def plan_for(chapter_path: Path, chapter=None) -> Plan:
    """The chapter's exercises and what the worker must load and watch."""
    chapter = chapter if chapter is not None else load_any(chapter_path)
    source = jupytext.read(chapter_path, fmt="py:percent") if Path(chapter_path).suffix == ".py" else chapter
    raw = {cells.grade_id(c): c.source for c in source.cells if cells.grade_id(c)}
    exercises, references, kernels, preimport = [], [], [], {"engine", "engine.checks"}
    for cell in chapter.cells:
        if cell.cell_type != "code":
            continue
        if cells.is_solution(cell) and not cells.is_graded(cell):
            names = taught_in(cell.source)
            kernels += [name for name in kernels_in(cell.source) if names.get(name, 0) is None]
            exercise = Exercise(cells.grade_id(cell), names)
            match = DIRECTIVE.match(raw.get(cells.grade_id(cell), "").lstrip().split("\n", 1)[0])
            if match:
                exercise.reference = f"{match['path']}::{match['name']}"
                exercise.reference_module = _module_of(match["path"])
                preimport.add(exercise.reference_module)
                for name, methods in names.items():
                    for method in methods or [None]:
                        references.append((exercise.reference_module, f"{name}.{method}" if method else name))
            exercise.reference_source = {k: v for k, v in definitions(cell.source).items()
                                         if k in names or k.split(".")[0] in names
                                         and k.split(".")[1] in (names.get(k.split(".")[0]) or [])}
            if names:
                exercises.append(exercise)
        elif cells.is_locked(cell) or cells.is_test(cell):
            preimport.update(_imports(cell.source))
    helpers = sorted(m for m in preimport if re.fullmatch(r"engine\.checks\.ch\d\d", m))
    return Plan(exercises, sorted(preimport), sorted(set(references)), helpers, sorted(set(kernels)))


def own_work_flags(plan: Plan, learner_cells: dict[str, str]) -> list[str]:
    """Exercises whose taught code is the reference source verbatim (not zeroed: flagged)."""
    flags = []
    for exercise in plan.exercises:
        source = learner_cells.get(exercise.cell)
        if source is None or not exercise.reference_source:
            continue
        mine = definitions(source)
        copied = [k for k, body in exercise.reference_source.items() if body and mine.get(k) == body]
        if copied and len(copied) == len(exercise.reference_source):
            flags.append(f"{exercise.cell}: the taught code is the reference source verbatim "
                         f"({', '.join(copied)})")
    return flags


