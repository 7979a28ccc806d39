"""`make autograde SUBMISSIONS=dir`: the instructor's path, through nbgrader from end to end.

The submissions folder holds one folder per student, each with the chapter notebooks under their
released names:

    SUBMISSIONS/<student_id>/<chNN_topic>.ipynb      e.g. submissions/ada/ch02_block_tables.ipynb

This refreshes an nbgrader course directory (default ./course/, gitignored): nbgrader_config.py (with
a per-cell timeout for Triton-interpreter kernels), source/ from the chapters, generate_assignment; then
copies the submissions into submitted/<student_id>/<chNN>/, grades each one in the sealed worker inside
the bubblewrap sandbox (`--jobs` at a time, with progress), runs nbgrader autograde (which takes those
sealed results), generate_feedback (HTML) and export (grades.csv, plus a `flags` column for the
instructor), and prints a per-student summary and where each output went.

Sandbox: each submission runs with the file system read-only, only its own working folder writable,
other students' work hidden, no network, and bounded memory, CPU time, file size and processes
(engine/course/sandbox.py). Without bubblewrap (`apt-get install bubblewrap`) it says so and runs the
submissions unconfined; `--sandbox required` refuses to, `--sandbox off` skips it.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path


from .nbgrader_course import (AUTOGRADE_CELL_TIMEOUT, file_digest, outputs_by_cell, result_path, run_nbgrader,
                              stage_sources, write_config)
from .paths import assignment_id, chapter_files, chapter_name, repo_root

ALL_ASSIGNMENTS = "ch[0-9][0-9]"


DEFAULT_JOBS = 2


def prepare_course(course_dir: Path, chapters: list[Path], timeout: int, sandbox: str = "auto",
                   hide: list[Path] = ()) -> None:
    """Config, source/ and release/ for every chapter (nbgrader records each chapter's tests in its gradebook)."""
    solutions = chapters[0].parent if chapters else None
    write_config(course_dir, timeout, solutions=solutions, sandbox=sandbox, hide=list(hide))
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


def grade_submissions(copied: list[Path], course_dir: Path, chapters: list[Path], timeout: int, jobs: int,
                      sandbox: str, hide: list[Path], progress=print) -> None:
    """Run every collected submission in the sealed worker (sandboxed), `jobs` at a time, printing a line
    as each finishes; the results wait in course/sandbox/results/ for nbgrader's autograde to take."""
    from .grade import read_learner, run_sealed
    from .sandbox import Sandbox, available
    by_name = {chapter_name(path): path for path in chapters}
    work_root = course_dir / "sandbox"
    usable, why = available()
    if sandbox == "required" and not usable:
        raise SystemExit(f"autograde: {why}")
    if sandbox != "off" and not usable:
        progress(f"WARNING: {why}")
    lock, done, started = threading.Lock(), [0], time.monotonic()

    def one(path: Path) -> str:
        student, assignment, notebook = path.parent.parent.name, path.parent.name, path.stem
        workdir = work_root / "work" / student / assignment
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True, exist_ok=True)
        wrap = Sandbox(workdir, hide=[*hide, course_dir, by_name[notebook].parent]) \
            if sandbox != "off" and usable else None
        flags = [] if wrap is not None or sandbox == "off" else [f"not sandboxed: {why}"]
        try:
            learner, notes = read_learner(path)
            sealed = run_sealed(learner, by_name[notebook], timeout, workdir, wrap=wrap)
            record = {"sha256": file_digest(path), "outputs": outputs_by_cell(sealed.cells),
                      "flags": flags + sealed.flags, "changes": notes + sealed.changes}
            from nbgrader.utils import determine_grade
            earned = sum(determine_grade(c)[0] or 0 for c in sealed.cells if _is_test(c))
            possible = sum(determine_grade(c)[1] for c in sealed.cells if _is_test(c))
            score = f"{earned:g}/{possible:g}"
        except Exception as error:  # unreadable: nbgrader's own run reports it
            record, score = None, f"not graded here ({type(error).__name__}: {error})"
        finally:
            if wrap is not None:
                wrap.close()
        if record is not None:
            target = result_path(work_root, student, assignment)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(record))
        with lock:
            done[0] += 1
            elapsed = time.monotonic() - started
            progress(f"[{done[0]}/{len(copied)}] {student} {notebook}: {score}  ({elapsed:.0f} s)")
        return score

    shutil.rmtree(work_root / "results", ignore_errors=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in as_completed([pool.submit(one, path) for path in copied]):
            future.result()


def _is_test(cell) -> bool:
    from . import cells
    return cells.is_test(cell)


def autograde(submissions: Path, course_dir: Path, chapters: list[Path],
              timeout: int = AUTOGRADE_CELL_TIMEOUT, jobs: int = DEFAULT_JOBS, sandbox: str = "auto",
              progress=print) -> dict[str, Path]:
    """Run the whole instructor path; {what: where} for each output."""
    course_dir = course_dir.resolve()
    hide = [submissions.resolve()]
    prepare_course(course_dir, chapters, timeout, sandbox, hide)
    copied, notes = collect(submissions, course_dir, chapters)
    for note in notes:
        progress(note)
    grade_submissions(copied, course_dir, chapters, timeout, jobs, sandbox, hide, progress)
    run_nbgrader(course_dir, "autograde", ALL_ASSIGNMENTS, "--create", "--force")
    run_nbgrader(course_dir, "generate_feedback", ALL_ASSIGNMENTS, "--force")
    grades = course_dir / "grades.csv"
    run_nbgrader(course_dir, "export", "--to", str(grades))
    add_flags(grades, course_dir / "sandbox" / "flags")
    return {
        "course directory": course_dir,
        "submissions collected": course_dir / "submitted",
        "autograded notebooks": course_dir / "autograded",
        "feedback (HTML)": course_dir / "feedback",
        "grades": grades,
        "gradebook": course_dir / "gradebook.db",
    }


def add_flags(grades_csv: Path, flags_dir: Path) -> None:
    """Add a `flags` column to grades.csv: what the sealed run found for the instructor to look at
    (taught code copied verbatim, tampering put back, grader-probing calls refused, no sandbox)."""
    with grades_csv.open() as handle:
        rows = list(csv.DictReader(handle))
        fields = list(rows[0].keys()) if rows else []
    if not rows:
        return
    for row in rows:
        record = flags_dir / row["student_id"] / f"{row['assignment']}.json"
        found = json.loads(record.read_text()) if record.is_file() else {}
        row["flags"] = " | ".join(found.get("flags", []) + found.get("changes", []))
    with grades_csv.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*[f for f in fields if f != "flags"], "flags"])
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    """Autograde SUBMISSIONS into the course directory and print where the outputs are."""
    root = repo_root()
    parser = argparse.ArgumentParser(prog="python -m engine.course.autograde", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", type=Path, help="folder of <student_id>/<chNN_topic>.ipynb")
    parser.add_argument("--course", type=Path, default=root / "course", help="nbgrader course directory")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="the chapter sources")
    parser.add_argument("--timeout", type=int, default=AUTOGRADE_CELL_TIMEOUT, help="seconds per cell")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="submissions graded at once")
    parser.add_argument("--sandbox", choices=("auto", "required", "off"), default="auto",
                        help="bubblewrap sandbox per submission (auto: when it works here)")
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder (expected <student_id>/<chNN_topic>.ipynb inside)")
    chapters = chapter_files(args.solutions)
    started = time.monotonic()
    outputs = autograde(args.submissions, args.course, chapters, args.timeout, args.jobs, args.sandbox)
    elapsed = time.monotonic() - started
    print(summary(outputs["grades"], chapters))
    rows = len(list(args.submissions.glob("*/*.ipynb")))
    print(f"graded {rows} submission(s) in {elapsed:.0f} s ({elapsed / max(rows, 1):.1f} s each, "
          f"{args.jobs} at a time)")
    for what, where in outputs.items():
        print(f"{what + ':':24} {where}")
    return 0


def summary(grades_csv: Path, chapters: list[Path] = (), submitted: Path | None = None) -> str:
    """One line per student and assignment from grades.csv: the score nbgrader gave (manual parts pending),
    a note where a student sent no notebook for a chapter, and the flags for the instructor."""
    with grades_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    course = grades_csv.parent
    names = {assignment_id(path): chapter_name(path) for path in chapters}
    lines = []
    for row in sorted(rows, key=lambda r: (r["student_id"], r["assignment"])):
        line = f"{row['student_id']:16} {row['assignment']:6} {float(row['score']):g}/{float(row['max_score']):g}"
        folder = (submitted or course / "submitted") / row["student_id"] / row["assignment"]
        if folder.parent.is_dir() and not folder.is_dir():
            chapter = names.get(row["assignment"], row["assignment"])
            line += f"  no notebook for {chapter}: 0 in grades.csv"
        elif row.get("flags"):
            line += f"  flagged: {row['flags']}"
        lines.append(line)
    return "\n".join(["student          chapter score (written answers count once graded by hand)", *lines])


if __name__ == "__main__":
    sys.exit(main())
