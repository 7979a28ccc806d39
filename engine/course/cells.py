"""What an nbgrader cell is, read from its metadata: solution, graded test, written answer, locked;
and the roles the chapters give cells by convention: the setup cell, the "With your code" cells."""
from __future__ import annotations

import re

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
# A chapter heads each cell that runs the learner's code outside a graded test with a paragraph that
# starts **With your code** (in the markdown cell just before it); on a stub such a cell raises.
YOUR_CODE_HEADING = re.compile(r"(?:\A|\n[ \t]*\n)[ \t]*\*\*With your code\b")
RAISES_TAG = "raises-exception"  # JupyterLab's Run All goes on past an error in a cell tagged so


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
