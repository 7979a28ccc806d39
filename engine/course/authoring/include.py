"""The `#| include` directive: a chapter shows reference code that lives once, in `engine`.

    #| include engine/cache/allocator.py::BlockAllocator solve=allocate,share,release
    #| include engine/cache/slots.py::slot_index
    #| include engine/cache/paged.py::PagedKVCache.fork,copy_on_write solve=fork,copy_on_write

The directive, the first line of a cell, is replaced by the exact source of the named top-level class or
function (found by `ast` line numbers, decorators included). Each method named in `solve=` (for a function:
its whole body, `solve=` omitted) has its body after the docstring wrapped in `### BEGIN SOLUTION` /
`### END SOLUTION`, so nbgrader turns it into a stub for the learner. Lines after the directive stay,
after the included code.

`Class.a,b` selects methods: the cell becomes a subclass of the engine's class, under the same name,
that defines only `a` and `b` (their exact source), so an exercise cell holds just what the chapter
teaches and every other method is the engine's:

    import engine.cache.paged


    class PagedKVCache(engine.cache.paged.PagedKVCache):
        (a one-line docstring)

        def fork(self, parent, child): ...

The base is named through its module, so running the cell twice gives the same class.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import jupytext

from engine.course import cells

DIRECTIVE = re.compile(r"^#\|\s*include\s+(?P<path>[^\s:]+)::(?P<name>[A-Za-z_]\w*)"
                       r"(?:\.(?P<methods>[A-Za-z_]\w*(?:,[A-Za-z_]\w*)*))?(?:\s+solve=(?P<solve>\S+))?\s*$")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


class IncludeError(ValueError):
    """An include directive that cannot be expanded; the message names what is wrong and where."""


@dataclass(frozen=True)
class Include:
    """One parsed directive: a module path (relative to the repository root), a name, what to solve."""

    path: str
    name: str
    solve: tuple[str, ...] | None  # None: solve= omitted
    methods: tuple[str, ...] | None = None  # Class.a,b: a subclass defining only these


def parse_directive(line: str) -> Include | None:
    """The Include on this line, None if the line is not an include directive at all."""
    if not line.lstrip().startswith("#|") or "include" not in line:
        return None
    match = DIRECTIVE.match(line.strip())
    if not match:
        raise IncludeError(f"malformed include directive {line.strip()!r}; "
                           "expected '#| include path/to/module.py::Name[.method,method] [solve=a,b]'")
    solve = match["solve"]
    names = tuple(name for name in solve.split(",") if name) if solve else None
    methods = tuple(match["methods"].split(",")) if match["methods"] else None
    return Include(match["path"], match["name"], names, methods)


def taught(chapter_path: Path) -> list[tuple[str, str]]:
    """(engine file, qualname) of every function or method a chapter's include directives mark as taught."""
    found = []
    for cell in jupytext.read(chapter_path, fmt="py:percent").cells:
        if not (cells.is_solution(cell) and cell.cell_type == "code"):
            continue
        include = parse_directive(cell.source.split("\n", 1)[0]) if cell.source.lstrip().startswith("#|") else None
        if include is None:
            continue
        methods = include.solve or include.methods
        if methods:
            found += [(include.path, f"{include.name}.{method}") for method in methods]
        else:
            found.append((include.path, include.name))
    return found


def expand_cell(source: str, root: Path) -> str:
    """The cell source with a leading include directive expanded; other cells come back unchanged."""
    first, _, rest = source.partition("\n")
    include = parse_directive(first)
    if include is None:
        return source
    code = included_source(include, root)
    rest = rest.strip("\n")
    return f"{code}\n\n{rest}" if rest else code


def included_source(include: Include, root: Path) -> str:
    """The named definition's source with its solution regions marked."""
    module_path = (root / include.path).resolve()
    if not module_path.is_file():
        raise IncludeError(f"include {include.path}: no such file ({module_path})")
    text = module_path.read_text()
    lines = text.splitlines()
    node = _top_level(ast.parse(text, filename=str(module_path)), include, module_path)
    regions = [_body_region(fn, lines) for fn in _functions_to_solve(node, include)]
    if include.methods:
        return _subclass_source(include, node, lines, regions)
    return "\n".join(_marked_lines(node, lines, regions))


def _marked_lines(node: ast.AST, lines: list[str], regions: list[tuple[int, int, str]]) -> list[str]:
    """A definition's source lines (decorators included) with solution markers around the regions."""
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    out: list[str] = []
    for number in range(start, node.end_lineno + 1):  # 1-based line numbers, as ast gives them
        for first, _, indent in regions:
            if number == first:
                out.append(f"{indent}{BEGIN}")
        out.append(lines[number - 1])
        for _, last, indent in regions:
            if number == last:
                out.append(f"{indent}{END}")
    return out


def _subclass_source(include: Include, node: ast.ClassDef, lines: list[str],
                     regions: list[tuple[int, int, str]]) -> str:
    """`class Name(module.Name):` defining only the selected methods, in the order they are named."""
    module = include.path.removesuffix(".py").replace("/", ".")
    methods = _methods(node, include, include.methods)
    named = " and ".join(", ".join(include.methods).rsplit(", ", 1))
    docstring = f'    """The engine\'s {include.name}, with {named} written here."""'
    if len(docstring) > 88:                                   # the book's code column
        docstring = f'    """The engine\'s {include.name}, with the methods below written here."""'
    out = [f"import {module}", "", "", f"class {include.name}({module}.{include.name}):", docstring]
    for name in include.methods:
        out.append("")
        out.extend(_marked_lines(methods[name], lines, regions))
    return "\n".join(out)


def _methods(node: ast.AST, include: Include, names: tuple[str, ...]) -> dict[str, ast.AST]:
    """The class's methods called `names`, by name; an error names the ones missing."""
    if not isinstance(node, ast.ClassDef):
        raise IncludeError(f"include {include.path}::{include.name}: .method selects methods of a class, "
                           f"and {include.name} is a function")
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    methods = {item.name: item for item in node.body if isinstance(item, functions)}
    unknown = [name for name in names if name not in methods]
    if unknown:
        raise IncludeError(f"include {include.path}::{include.name}: no method {', '.join(map(repr, unknown))} "
                           f"in class {include.name}; it has: {', '.join(methods) or 'none'}")
    return methods


def _top_level(tree: ast.Module, include: Include, module_path: Path) -> ast.AST:
    """The top-level class or function called include.name."""
    definitions = {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    if include.name not in definitions:
        raise IncludeError(f"include {include.path}::{include.name}: no top-level class or function "
                           f"{include.name!r} in {module_path.name}; it has: {', '.join(definitions) or 'none'}")
    return definitions[include.name]


def _functions_to_solve(node: ast.AST, include: Include) -> list[ast.AST]:
    """The functions whose bodies become exercises: named methods of a class, or the function itself."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    if isinstance(node, functions):
        if include.solve:
            raise IncludeError(f"include {include.path}::{include.name}: solve= names methods of a class; "
                               "omit it to solve the whole function body")
        return [node]
    if not include.solve:
        return []
    if include.methods and set(include.solve) - set(include.methods):
        extra = sorted(set(include.solve) - set(include.methods))
        raise IncludeError(f"include {include.path}::{include.name}: solve= names {', '.join(extra)}, "
                           f"which the cell does not include (it selects {', '.join(include.methods)})")
    methods = _methods(node, include, include.solve)
    return [methods[name] for name in include.solve]


def _body_region(function: ast.AST, lines: list[str]) -> tuple[int, int, str]:
    """(first line, last line, indentation) of a function's body after its docstring."""
    body = function.body
    has_docstring = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                     and isinstance(body[0].value.value, str))
    statements = body[1:] if has_docstring else body
    if not statements:
        raise IncludeError(f"{function.name} (line {function.lineno}) has only a docstring: nothing to solve")
    if has_docstring:
        first = body[0].end_lineno + 1
    else:
        first = statements[0].lineno
        while first - 1 > function.lineno and lines[first - 2].strip().startswith("#"):
            first -= 1  # comments that open the body belong to the solution
    shares_a_line = statements[0].lineno == (body[0].end_lineno if has_docstring else function.lineno)
    if shares_a_line:
        raise IncludeError(f"{function.name} (line {function.lineno}): put its body on lines of its own")
    last = function.end_lineno
    region = lines[first - 1:last]
    if any(BEGIN in line or END in line for line in region):
        raise IncludeError(f"{function.name} (line {function.lineno}) already holds solution markers")
    indent = re.match(r"\s*", lines[statements[0].lineno - 1]).group(0)
    return first, last, indent
