"""`make autograde SUBMISSIONS=dir`: the instructor's path, through nbgrader from end to end.

The submissions folder holds one folder per student, each with the chapter notebooks under their
released names:

    SUBMISSIONS/<student_id>/<chNN_topic>.ipynb      e.g. submissions/ada/ch02_block_tables.ipynb

This refreshes an nbgrader course directory (default ./course/, gitignored): nbgrader_config.py (with
a per-cell timeout for Triton-interpreter kernels), source/ from the chapters, generate_assignment; then
copies the submissions into submitted/<student_id>/<chNN>/, runs nbgrader autograde, generate_feedback
(HTML) and export (grades.csv), and prints where each went.
"""
from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

from .nbgrader_course import AUTOGRADE_CELL_TIMEOUT, run_nbgrader, stage_sources, write_config
from .paths import assignment_id, chapter_files, chapter_name, repo_root

ALL_ASSIGNMENTS = "ch[0-9][0-9]"


def prepare_course(course_dir: Path, chapters: list[Path], timeout: int) -> None:
    """Config, source/ and release/ for every chapter (nbgrader records each chapter's tests in its gradebook)."""
    write_config(course_dir, timeout)
    shutil.rmtree(course_dir / "source", ignore_errors=True)
    stage_sources(course_dir, chapters)
    run_nbgrader(course_dir, "generate_assignment", ALL_ASSIGNMENTS, "--force")


def collect(submissions: Path, course_dir: Path, chapters: list[Path]) -> tuple[list[Path], list[str]]:
    """Copy SUBMISSIONS/<student>/<chNN_topic>.ipynb into submitted/; (copied files, skipped-file notes)."""
    known = {chapter_name(path): assignment_id(path) for path in chapters}
    shutil.rmtree(course_dir / "submitted", ignore_errors=True)
    copied, notes = [], []
    for student in sorted(p for p in submissions.iterdir() if p.is_dir()):
        for notebook in sorted(student.glob("*.ipynb")):
            if notebook.stem not in known:
                notes.append(f"skipped {notebook}: not a chapter notebook ({', '.join(known)})")
                continue
            target = course_dir / "submitted" / student.name / known[notebook.stem] / notebook.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(notebook, target)
            copied.append(target)
    if not copied:
        raise SystemExit(f"no submissions in {submissions}: expected {submissions}/<student_id>/<chNN_topic>.ipynb")
    return copied, notes


def autograde(submissions: Path, course_dir: Path, chapters: list[Path],
              timeout: int = AUTOGRADE_CELL_TIMEOUT) -> dict[str, Path]:
    """Run the whole instructor path; {what: where} for each output."""
    course_dir = course_dir.resolve()
    prepare_course(course_dir, chapters, timeout)
    copied, notes = collect(submissions, course_dir, chapters)
    for note in notes:
        print(note)
    run_nbgrader(course_dir, "autograde", ALL_ASSIGNMENTS, "--create", "--force")
    run_nbgrader(course_dir, "generate_feedback", ALL_ASSIGNMENTS, "--force")
    grades = course_dir / "grades.csv"
    run_nbgrader(course_dir, "export", "--to", str(grades))
    return {
        "course directory": course_dir,
        "submissions collected": course_dir / "submitted",
        "autograded notebooks": course_dir / "autograded",
        "feedback (HTML)": course_dir / "feedback",
        "grades": grades,
        "gradebook": course_dir / "gradebook.db",
    }


def main(argv: list[str] | None = None) -> int:
    """Autograde SUBMISSIONS into the course directory and print where the outputs are."""
    root = repo_root()
    parser = argparse.ArgumentParser(prog="python -m engine.course.autograde", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", type=Path, help="folder of <student_id>/<chNN_topic>.ipynb")
    parser.add_argument("--course", type=Path, default=root / "course", help="nbgrader course directory")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="the chapter sources")
    parser.add_argument("--timeout", type=int, default=AUTOGRADE_CELL_TIMEOUT, help="seconds per cell")
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder (expected <student_id>/<chNN_topic>.ipynb inside)")
    outputs = autograde(args.submissions, args.course, chapter_files(args.solutions), args.timeout)
    print(summary(outputs["grades"]))
    for what, where in outputs.items():
        print(f"{what + ':':24} {where}")
    return 0


def summary(grades_csv: Path) -> str:
    """One line per student and assignment from grades.csv: the score nbgrader gave (manual parts pending)."""
    with grades_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    lines = [f"{row['student_id']:16} {row['assignment']:6} {float(row['score']):g}/{float(row['max_score']):g}"
             for row in sorted(rows, key=lambda r: (r["student_id"], r["assignment"]))]
    return "\n".join(["student          chapter score (written answers count once graded by hand)", *lines])


if __name__ == "__main__":
    sys.exit(main())
