"""What an nbgrader cell is, read from its metadata: solution, graded test, written answer, locked;
and the roles the chapters give cells by convention: the setup cell, the "With your code" cells."""
from __future__ import annotations

import ast
import re

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
# A chapter heads each cell that runs the learner's code outside a graded test with a paragraph that
# starts **With your code** (in the markdown cell just before it); on a stub such a cell raises.
YOUR_CODE_HEADING = re.compile(r"(?:\A|\n[ \t]*\n)[ \t]*\*\*With your code\b")
RAISES_TAG = "raises-exception"  # JupyterLab's Run All goes on past an error in a cell tagged so
TRUSTED_PREFIX = "<trusted "     # the file name of every chapter cell the sealed grader compiles
LEARNER_PREFIX = "<learner "     # ... and of every learner cell


def meta(cell) -> dict:
    """The cell's nbgrader metadata ({} for a plain cell)."""
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def grade_id(cell) -> str | None:
    """The nbgrader grade id, the name of an exercise in every table."""
    return meta(cell).get("grade_id")


def is_solution(cell) -> bool:
    """A cell the learner writes in."""
    return bool(meta(cell).get("solution"))


def is_graded(cell) -> bool:
    """A cell worth points: a test cell, or a manually graded answer."""
    return bool(meta(cell).get("grade"))


def is_test(cell) -> bool:
    """An autograded code cell: graded, not a solution; it earns its points when it runs without error."""
    return cell.get("cell_type") == "code" and is_graded(cell) and not is_solution(cell)


def is_manual(cell) -> bool:
    """A graded cell the instructor marks by hand (a written answer, or graded code the learner writes)."""
    return is_graded(cell) and is_solution(cell)


def is_locked(cell) -> bool:
    """A cell the learner may not change; grading restores its source from the chapter."""
    return bool(meta(cell).get("locked")) and not is_solution(cell)


def is_setup(cell) -> bool:
    """The chapter's setup cell (grade id `chNN_setup`): imports and shared objects, folded in the book."""
    return cell.get("cell_type") == "code" and str(grade_id(cell) or "").endswith("_setup")


def your_code_cells(notebook_cells) -> list[int]:
    """Indices of the code cells that run the learner's code outside a test: the first code cell after
    each markdown cell holding a **With your code** heading."""
    found, waiting = [], False
    for index, cell in enumerate(notebook_cells):
        if cell.get("cell_type") == "markdown" and YOUR_CODE_HEADING.search(cell.get("source", "")):
            waiting = True
        elif cell.get("cell_type") == "code" and waiting:
            found.append(index)
            waiting = False
    return found


STUB_LINE = "raise NotImplementedError()"   # nbgrader's stub for a cleared solution


def raises_as_released(cell) -> bool:
    """A solution cell whose stub raises when the cell runs (a review answer, `r1_answer = None` then
    the stub at the top level), not only when a function it defines is called."""
    return is_solution(cell) and cell.get("cell_type") == "code" and any(
        line.rstrip() == STUB_LINE for line in cell.source.splitlines())


def fails_on_a_stub(notebook_cells) -> list[int]:
    """Indices of the cells that stop with an error in an untouched learner edition: every graded test,
    every "With your code" cell and every answer cell whose stub raises at its top level (what the
    release tags RAISES_TAG)."""
    yours = set(your_code_cells(notebook_cells))
    return [i for i, cell in enumerate(notebook_cells) if is_test(cell) or i in yours or raises_as_released(cell)]


def shows_an_answer(notebook_cells) -> list[int]:
    """Indices of the code cells whose output, computed with the reference solution, gives an answer
    away: the graded tests (their ✓ lines), the solution cells and the "With your code" cells."""
    yours = set(your_code_cells(notebook_cells))
    return [i for i, cell in enumerate(notebook_cells) if cell.get("cell_type") == "code"
            and (is_test(cell) or is_solution(cell) or i in yours)]


def points(cell) -> float:
    """The points a graded cell is worth."""
    return float(meta(cell).get("points", 0))


def marked_regions(source: str, begin: str, end: str) -> list[list[str]]:
    """The lines strictly inside each begin/end marker pair, in order."""
    regions: list[list[str]] = []
    current: list[str] | None = None
    for line in source.splitlines():
        if line.strip() == begin:
            current = []
        elif line.strip() == end and current is not None:
            regions.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return regions


def solution_text(cell) -> list[str]:
    """The lines a learner must not see: inside the solution regions, or the whole cell if it has none."""
    if not is_solution(cell):
        return []
    regions = marked_regions(cell.source, BEGIN_SOLUTION, END_SOLUTION)
    if regions:
        return [line for region in regions for line in region]
    return cell.source.splitlines()


# Magics whose line or cell is Python that IPython runs (timed, profiled or with its output captured):
# graded as that code, run once. Every other magic, and `!cmd`, holds no Python of the notebook's.
CODE_MAGICS = {"time", "timeit", "prun", "capture"}
_MAGIC_OPTIONS = re.compile(r"\A\s*(?:-(?:[nrp]\s*\d+|[a-zA-Z])\s+)*")   # %timeit -n 10 -r 3 -o ...


def parse(source: str) -> ast.Module | None:
    """A cell's syntax tree, IPython's syntax read as the code it holds; None when it is not Python."""
    try:
        return ast.parse(python_source(source))
    except (SyntaxError, ValueError):
        return None


def python_source(source: str) -> str:
    """The Python a code cell holds, as IPython reads it: `%%time`, `%timeit`, `%%capture` and `%prun`
    become the code they time, profile or capture; other magics (`%matplotlib inline`, `%%writefile`),
    `!cmd` and `name?` become nothing (`x = !ls` an empty list). Read with IPython's own transformer
    (IPython.core.inputtransformer2), line for line, so a traceback's line numbers stay the cell's.
    Plain Python comes back as it is; text that is not Python either way comes back as it is too."""
    try:
        ast.parse(source)
        return source
    except (SyntaxError, ValueError):
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        text = TransformerManager().transform_cell(source)
        tree = ast.parse(text)
    except Exception:  # noqa: BLE001 - not IPython's syntax either: the grader reports the SyntaxError
        return source
    if len(tree.body) == 1 and _magic_call(tree.body[0]) == "run_cell_magic":
        name, line, body = (a.value for a in tree.body[0].value.args)
        above = "\n" * (len(source) - len(source.lstrip("\n")) + 1)      # blank lines, then the %% line
        if name not in CODE_MAGICS:
            return above
        setup = _MAGIC_OPTIONS.sub("", line) if name == "timeit" else ""
        return above[:-1] + setup + "\n" + python_source(body)
    lines = text.splitlines(keepends=True)
    statements = [n for n in ast.walk(tree) if _magic_call(n)]
    inside = {id(n.value) for n in statements}
    values = [n for n in ast.walk(tree) if _magic_value(n) and id(n) not in inside]
    for node in sorted(statements + values, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        if node.lineno != node.end_lineno:
            continue
        row = lines[node.lineno - 1].encode()
        start, end = node.col_offset, node.end_col_offset
        replaced = _lowered_statement(node) if _magic_call(node) else _lowered_value(node)
        lines[node.lineno - 1] = (row[:start] + replaced.encode() + row[end:]).decode()
    return "".join(lines)


def _magic_value(node) -> str | None:
    """The method of `get_ipython().<method>(...)` a node calls, if it is one (an expression)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call) \
            and isinstance(node.func.value.func, ast.Name) and node.func.value.func.id == "get_ipython" \
            and node.func.attr in ("run_line_magic", "run_cell_magic", "system", "getoutput") \
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
        return node.func.attr
    return None


def _lowered_value(call: ast.Call) -> str:
    """A magic used as a value, as the value IPython gives it: `%time expr` is expr's value, `!cmd`'s
    output an empty list, any other magic None."""
    if call.func.attr == "getoutput":
        return "[]"
    if call.func.attr == "run_line_magic" and call.args[0].value == "time":
        code = _MAGIC_OPTIONS.sub("", call.args[1].value).strip()
        try:
            ast.parse(code, mode="eval")
            return f"({code})"
        except SyntaxError:
            pass
    return "None"


def _magic_call(node) -> str | None:
    """The same, for a statement that is only that call."""
    return _magic_value(node.value) if isinstance(node, ast.Expr) else None


def _lowered_statement(node: ast.Expr) -> str:
    """A magic statement as the code it holds (one line: the magic's own), or `pass`."""
    call = node.value
    if call.func.attr == "run_line_magic" and call.args[0].value in CODE_MAGICS:
        code = _MAGIC_OPTIONS.sub("", call.args[1].value).strip()
        try:
            ast.parse(code)
            return code or "pass"
        except SyntaxError:
            pass
    return "pass"
