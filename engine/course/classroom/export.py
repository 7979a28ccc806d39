"""The class's scores for a learning-management system: `course/reports/lms_export.csv`.

One row per student of the roster, in the shape Canvas's gradebook import reads (Gradescope's roster
export has the same first columns):

| column | what it holds |
|---|---|
| `Student` | "Last, First" (the id when the roster gives no name) |
| `ID` | empty: the LMS's own number, which the course does not know; Canvas matches on the next two |
| `SIS User ID` | the student's id (their account on the hub) |
| `SIS Login ID` | their e-mail from the roster (empty if none) |
| `Section` | empty |
| `chNN_topic` | one column per chapter of the roster: the score after the late penalty; 0 for a notebook |
| | that could not be graded (another chapter's); empty if not handed in |
| `Total` | the sum of the chapter columns |

The second row, `Points Possible`, holds each chapter's maximum (and the total's).
"""
from __future__ import annotations

import csv
from pathlib import Path

from engine.course.paths import chapter_name

FIXED = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def write(course_dir: Path, roster, chapters: list[Path], faults=()) -> Path:
    """Write reports/lms_export.csv from the gradebook (and what could not be graded: 0); its path."""
    from engine.course.classroom.reports import class_rows
    rows = class_rows(course_dir, roster, chapters, faults, all_chapters=True)
    names = [chapter_name(path) for path in chapters]
    top = {row["chapter"]: row["max_score"] for row in rows}
    path = Path(course_dir) / "reports" / "lms_export.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*FIXED, *names, "Total"])
        writer.writerow(["Points Possible", "", "", "", "", *(f"{top.get(n, 0):g}" for n in names),
                         f"{sum(top.get(n, 0) for n in names):g}"])
        for student in roster.students:
            mine = {row["chapter"]: row for row in rows if row["student_id"] == student.ident}
            scores = [mine[n]["score"] if n in mine and mine[n]["flags"] != "MISSING" else None for n in names]
            shown = ", ".join(filter(None, [student.last_name, student.first_name])) or student.ident
            writer.writerow([shown, "", student.ident, student.email, "",
                             *("" if s is None else f"{s:g}" for s in scores),
                             f"{sum(s for s in scores if s is not None):g}"])
    return path
