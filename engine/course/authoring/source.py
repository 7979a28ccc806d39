"""Read a chapter source (jupytext py:percent with nbgrader cell metadata) into a notebook."""
from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat

from engine.course.authoring.include import IncludeError, expand_cell
from engine.course.paths import repo_root

# Cell metadata worth keeping; jupytext's own bookkeeping (lines_to_next_cell, ...) is dropped.
KEPT_CELL_METADATA = ("nbgrader", "tags", "jupyter", "editable", "deletable", "slideshow")
CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")


def load_chapter(path: Path | str, root: Path | None = None) -> nbformat.NotebookNode:
    """The chapter as a notebook with includes expanded: the full solution, nbgrader metadata kept.

    Cell ids come from the nbgrader grade ids (falling back to the cell's position), so a notebook built
    twice from the same source is byte-for-byte the same; the jupytext metadata is removed, so nothing
    downstream pairs the notebook back to a text file.
    """
    path = Path(path)
    root = Path(root) if root else _root_for(path)
    notebook = jupytext.read(path, fmt="py:percent")
    notebook.metadata.pop("jupytext", None)
    for index, cell in enumerate(notebook.cells):
        try:
            cell.source = expand_cell(cell.source, root)
        except IncludeError as error:
            raise IncludeError(f"{path.name}, cell {_describe(cell, index)}: {error}") from None
        cell.metadata = nbformat.NotebookNode(
            {key: value for key, value in cell.metadata.items() if key in KEPT_CELL_METADATA})
        cell.id = _cell_id(cell, index)
    _dedupe_ids(notebook)
    nbformat.validate(notebook)
    return notebook


def _root_for(path: Path) -> Path:
    """Includes resolve against the repository holding the chapter, else the one holding this package."""
    try:
        return repo_root(path.parent)
    except FileNotFoundError:
        return repo_root()


def _describe(cell, index: int) -> str:
    """'3 (grade_id allocate)': how an error message points at a cell."""
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"{index + 1} (grade_id {grade_id})" if grade_id else str(index + 1)


def _cell_id(cell, index: int) -> str:
    """The cell's grade id when it is a valid notebook cell id, else `cell-<position>`."""
    grade_id = str(cell.metadata.get("nbgrader", {}).get("grade_id", ""))
    return grade_id if CELL_ID.match(grade_id) else f"cell-{index + 1}"


def _dedupe_ids(notebook) -> None:
    """Make cell ids unique (duplicate grade ids are the linter's to report, not a crash here)."""
    seen: set[str] = set()
    for index, cell in enumerate(notebook.cells):
        if cell.id in seen:
            cell.id = f"cell-{index + 1}"
        seen.add(cell.id)
