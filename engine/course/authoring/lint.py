"""The rules every chapter's nbgrader metadata follows; `python -m engine.course.authoring.lint [FILES]`.

A chapter that breaks one would release, but then grade wrongly (a duplicate grade id merges two
exercises; an unlocked test can be edited; an exercise with no test earns nothing), so the test suite
lints every chapter in solutions/.

It also keeps the page readable: every line a chapter shows in a code box (its code cells, included
reference code and stubs, fenced code in its text) fits in WIDTH = 88 columns, and so does every line
its cells print (outside the graded checks, whose messages wrap), read from the chapter as `make book`
executed it (build/book/executed/, or --outputs DIR); a chapter whose source is newer than its executed
copy is not judged on stale outputs.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import re
import symtable
import sys
from pathlib import Path

from engine.course import cells
from engine.course.authoring.include import IncludeError
from engine.course.paths import chapter_files, chapter_name, chapter_source_refusal, repo_root
from engine.course.authoring.source import load_chapter

WIDTH = 88  # columns of code the book's text column shows without wrapping (book/_static/course.css)
FENCE = re.compile(r"^ *(```|~~~)")


def lint_chapter(path: Path | str, root: Path | None = None) -> list[str]:
    """Every rule the chapter breaks, one message each ('ch02_x.py cell 4 (grade_id y): ...').

    `root` is where include paths start (default: the repository the chapter is in).
    """
    path = Path(path)
    try:
        notebook = load_chapter(path, root)
    except (IncludeError, ValueError, SyntaxError) as error:
        return [f"{path.name}: {error}"]
    problems: list[str] = []
    if notebook.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append(f"{path.name}: the jupytext header needs a kernelspec named python3")
    seen: dict[str, int] = {}
    for index, cell in enumerate(notebook.cells):
        where = f"{path.name} {_where(cell, index)}"
        problems += [f"{where}: {message}" for message in _cell_problems(cell)]
        grade_id = cells.grade_id(cell)
        if grade_id in seen:
            problems.append(f"{where}: grade_id also used by cell {seen[grade_id] + 1}")
        elif grade_id:
            seen[grade_id] = index
    problems += [f"{path.name}: {message}" for message in _ungraded_exercises(notebook.cells)]
    problems += [f"{path.name}: {message}" for message in _undefined_names(notebook.cells)]
    problems += [f"{path.name} {message}" for message in width_problems(notebook)]
    return problems


def _where(cell, index: int) -> str:
    return f"cell {index + 1}" + (f" (grade_id {cells.grade_id(cell)})" if cells.grade_id(cell) else "")


def _too_wide(lines, where: str, what: str) -> list[str]:
    return [f"{where}: {what} line {number} is {len(line)} columns (at most {WIDTH}): {line.strip()[:60]!r}"
            for number, line in enumerate(lines, start=1) if len(line.rstrip()) > WIDTH]


def code_lines(cell) -> list[str]:
    """The lines a cell shows in a code box: a code cell's source, a markdown cell's fenced blocks."""
    if cell.cell_type == "code":
        return cell.source.splitlines()
    shown, fenced = [], False
    for line in cell.source.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            shown.append(line)
    return shown


def width_problems(notebook) -> list[str]:
    """Code lines wider than WIDTH in the chapter (includes expanded: what the book and the lab show)."""
    return [problem for index, cell in enumerate(notebook.cells)
            for problem in _too_wide(code_lines(cell), _where(cell, index), "code")]


def printed_texts(output) -> list[str]:
    """The texts an output prints: a stream, a plain-text result (unless a richer form is shown), or an
    explorer's printed text in each of its states (engine/course/authoring/widgets.py)."""
    if output.get("output_type") == "stream":
        return [output.get("text", "")]
    data = output.get("data", {})
    explorer = re.search(r'class="course-explorer-data">(.*?)</script>', data.get("text/html", ""), re.S)
    if explorer:
        return json.loads(explorer.group(1).replace("<\\/", "</"))["texts"]
    if "text/plain" in data and not {"text/html", "image/png", "image/svg+xml"} & set(data):
        return [data["text/plain"]]
    return []


def output_problems(executed, name: str) -> list[str]:
    """Printed lines wider than WIDTH in an executed chapter, outside its graded test cells (a check's
    message is the checks' to phrase; the lab wraps it, and the learner book does not show it). An
    explorer's states are summed up in one problem."""
    problems = []
    for index, cell in enumerate(executed.cells):
        if cell.cell_type != "code" or cells.is_test(cell):
            continue
        for output in cell.get("outputs", []):
            texts = printed_texts(output)
            if len(texts) == 1:
                problems += _too_wide(texts[0].splitlines(), f"{name} {_where(cell, index)}", "printed")
                continue
            wide = [line for text in texts for line in text.splitlines() if len(line.rstrip()) > WIDTH]
            if wide:
                widest = max(wide, key=len)
                problems.append(f"{name} {_where(cell, index)}: the explorer prints {len(wide)} line(s) wider "
                                f"than {WIDTH} columns over its states, the widest {len(widest)}: "
                                f"{widest.strip()[:60]!r}")
    return problems


def _undefined_names(notebook_cells) -> list[str]:
    """Names a code cell reads as globals that no cell of the chapter defines or imports.

    Included reference code uses its module's names (an error class, a helper): the chapter must
    import them, or the learner's copy fails with NameError only when that line first runs.
    """
    sources = [_python(cell.source) for cell in notebook_cells if cell.cell_type == "code"]
    trees = [tree for tree in (_parse(source) for source in sources) if tree is not None]
    defined = set(dir(builtins)) | {"__name__", "__file__", "get_ipython", "display"}
    for tree in trees:
        defined |= _top_level_bindings(tree)
    problems = []
    for cell, source in zip([c for c in notebook_cells if c.cell_type == "code"], sources):
        try:
            table = symtable.symtable(source, "<cell>", "exec")
        except SyntaxError:
            continue
        missing = sorted(_global_reads(table) - defined)
        if missing:
            where = cells.grade_id(cell) or "a code cell"
            problems.append(f"cell {where} uses {', '.join(missing)}, which no cell of the chapter defines or "
                            "imports (included code needs its module's names imported in the setup cell)")
    return problems


def _python(source: str) -> str:
    """A cell's source without IPython magics and shell lines, which are not Python."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _top_level_bindings(tree: ast.Module) -> set[str]:
    """Names a cell binds at module level: imports, definitions, assignments, loop and with targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Global):
            names |= set(node.names)
    return names


def _global_reads(table: symtable.SymbolTable) -> set[str]:
    """Every name read as a global in a cell (module level and inside its functions and classes)."""
    reads = set()
    for symbol in table.get_symbols():
        if symbol.is_referenced() and (table.get_type() == "module" or symbol.is_global()):
            reads.add(symbol.get_name())
    for child in table.get_children():
        reads |= _global_reads(child)
    return reads


def _cell_problems(cell) -> list[str]:
    """The rules one cell breaks on its own."""
    meta = cells.meta(cell)
    if not meta:
        return ["no nbgrader metadata (every cell has it, so the release and the grader agree on cells)"]
    problems = []
    if not meta.get("grade_id"):
        problems.append("no grade_id")
    if meta.get("schema_version") != 3:
        problems.append("schema_version must be 3")
    for key in ("grade", "solution", "locked"):
        if not isinstance(meta.get(key), bool):
            problems.append(f"{key} must be true or false")
    if cells.is_graded(cell) and not (isinstance(meta.get("points"), (int, float)) and meta["points"] > 0):
        problems.append("a graded cell needs points > 0")
    if cells.is_test(cell) and not meta.get("locked"):
        problems.append("a graded test cell must be locked, or the learner could edit the test")
    if cells.is_solution(cell) and meta.get("locked"):
        problems.append("a solution cell cannot be locked")
    if cells.is_graded(cell) and not cells.is_solution(cell) and cell.cell_type != "code":
        problems.append("a graded cell that is not a solution must be code (a test)")
    problems += _marker_problems(cell, cells.BEGIN_SOLUTION, cells.END_SOLUTION, allowed=cells.is_solution(cell))
    problems += _marker_problems(cell, cells.BEGIN_HIDDEN, cells.END_HIDDEN, allowed=cells.is_test(cell))
    return problems


def _marker_problems(cell, begin: str, end: str, allowed: bool) -> list[str]:
    """Unbalanced or nested begin/end markers, or markers in a cell where nbgrader ignores them."""
    depth, problems = 0, []
    for number, line in enumerate(cell.source.splitlines(), start=1):
        marker = line.strip()
        if marker not in (begin, end):
            continue
        if not allowed:
            problems.append(f"line {number}: {marker!r} in a cell where nbgrader ignores it")
        if marker == begin:
            if depth:
                problems.append(f"line {number}: {begin!r} inside another region")
            depth += 1
        elif depth == 0:
            problems.append(f"line {number}: {end!r} without a {begin!r} before it")
        else:
            depth -= 1
    if depth:
        problems.append(f"{begin!r} never closed by {end!r}")
    return problems


def _ungraded_exercises(notebook_cells) -> list[str]:
    """Solution cells with no graded test after them before the next solution cell (or the end)."""
    problems, open_exercise = [], None
    for cell in notebook_cells:
        if cells.is_solution(cell) and not cells.is_graded(cell):
            if open_exercise:
                problems.append(f"exercise {open_exercise!r} has no graded test cell before the next one")
            open_exercise = cells.grade_id(cell) or "?"
        elif cells.is_test(cell):
            open_exercise = None
    if open_exercise:
        problems.append(f"exercise {open_exercise!r} has no graded test cell after it")
    return problems


def executed_output_problems(paths: list[Path], folder: Path) -> tuple[list[str], list[str]]:
    """(problems of the printed lines, notes on chapters not checked) for the executed copies in folder."""
    import nbformat

    problems, notes = [], []
    for path in paths:
        executed = folder / f"{chapter_name(path)}.ipynb"
        if not executed.is_file():
            notes.append(f"{path.name}: printed lines not checked: no {executed} (run make book)")
        elif executed.stat().st_mtime < path.stat().st_mtime:
            notes.append(f"{path.name}: printed lines not checked: {executed} is older than the chapter "
                         "(run make book)")
        else:
            problems += output_problems(nbformat.read(executed, as_version=4), path.name)
    return problems, notes


def main(argv: list[str] | None = None) -> int:
    """Lint the given chapter files (default: all of solutions/); exit 1 if any rule is broken, 2 (one
    `error:` line, nothing linted) for a bad argument: a CHAPTER that is not a chapter source file, or an
    --outputs that is not a folder."""
    from engine.tools import cli_args
    parser = cli_args.Parser(prog="python -m engine.course.authoring.lint", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog="Exit status: 0 every rule holds, 1 a rule is broken, 2 a bad argument.")
    parser.add_argument("chapters", nargs="*", help="chapter sources (default: solutions/ch*.py)")
    parser.add_argument("--outputs", type=Path, default=None,
                        help="the chapters as make book executed them (default: build/book/executed)")
    args = parser.parse_args(argv)
    for text in args.chapters:
        why = chapter_source_refusal(text)
        if why:
            parser.error(why)
    if args.outputs is not None and not args.outputs.is_dir():
        parser.error(f"--outputs {args.outputs} is not a folder of executed chapters "
                     f"({'a file' if args.outputs.exists() else 'it does not exist'}; make book writes "
                     "build/book/executed)")
    outputs = args.outputs or repo_root() / "build" / "book" / "executed"
    paths = [Path(text) for text in args.chapters] or chapter_files()
    problems = [problem for path in paths for problem in lint_chapter(path)]
    printed, notes = executed_output_problems(paths, outputs)
    for line in problems + printed + notes:
        print(line)
    print(f"{len(paths)} chapter(s), {len(problems) + len(printed)} problem(s)")
    return 1 if problems or printed else 0


if __name__ == "__main__":
    sys.exit(main())
