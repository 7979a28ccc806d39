"""What a class's grading round leaves for the instructor and the students, read from nbgrader's gradebook.

- `grades.csv`: one row per student and chapter handed in (`all_chapters=True`: every chapter, a
  missing one with the code MISSING), the late penalty applied, and the flags as short codes
  (FLAG_CODES) so a cell stays one word or a few;
- each flag's full text goes into that student's feedback page (a "Notes from the grader" box) and
  into `reports/students/<id>.md`, which also lists every submission's time and each exercise's points;
- `reports/summary.csv`, `summary.md` and `summary.png`: per exercise, the class's mean, how many got
  full marks, and the check that failed most often, with its message.
"""
from __future__ import annotations

import csv
import html
import json
import re
from collections import Counter
from datetime import timezone
from pathlib import Path

from engine.course import cells
from engine.course.paths import assignment_id, chapter_name

# (code, what in the full text gives it away, what it means): the first match names a flag.
FLAG_CODES = [
    ("WRONGCH", r"^this is (not )?ch\d\d", "a notebook of another chapter, handed in under this one's name"),
    ("NOTGRADED", r"^not graded|could not be graded|autograde (failed|stopped)", "could not be graded (why: "
                                                                                 "in the report)"),
    ("NOSANDBOX", r"not sandboxed", "graded without the sandbox"),
    ("TIME", r"ran past its|deadline|NotebookTimeout", "the notebook ran past its time limit"),
    ("COPY", r"typed in, the reference's code|verbatim", "the reference's code typed into a cell (copied, "
                                                           "renamed or reformatted): points kept, flagged"),
    ("OWN", r"not the learner's own code|must be your own", "the engine's reference used instead of own code"),
    ("CHANNEL", r"result channel", "the notebook wrote to the grader's channel"),
    ("EDITED", r"cells were changed", "the chapter's own cells were edited (put back)"),
    ("ERROR", r"grading failed", "the grader failed on this notebook"),
    ("LATE", r"^late:", "submitted after the due date (penalty applied)"),
    ("RESUBMITTED", r"^resubmitted:", "submitted more than once (the last one is graded)"),
]
GRADE_FIELDS = ["student_id", "first_name", "last_name", "email", "assignment", "chapter", "due", "submitted_at",
                "submissions", "seconds_late", "raw_score", "late_penalty", "score", "max_score", "flags"]


HISTORY_FILE = "submissions.csv"    # every submission collected, with its time (class_folder.record_history)
FAULTS_FILE = "not-graded.csv"      # what each chapter's latest round could not grade, and why
FAULT_FIELDS = ["student", "entry", "reason", "assignment"]


def record_faults(course_dir: Path, assignment: str, faults) -> Path:
    """Keep this round's faults for `assignment` (replacing its earlier round's): a wrong chapter's row
    stays whatever chapter is graded next."""
    path = Path(course_dir) / FAULTS_FILE
    rows = [r for r in read_csv(path) if r["assignment"] != assignment]
    rows += [{"student": f.student, "entry": f.entry, "reason": f.reason, "assignment": f.assignment}
             for f in faults if f.assignment == assignment]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FAULT_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def recorded_faults(course_dir: Path, faults=()) -> list:
    """`faults`, and those recorded (FAULTS_FILE) for the chapters they do not cover."""
    from types import SimpleNamespace
    covered = {f.assignment for f in faults}
    return [*faults, *(SimpleNamespace(**row) for row in read_csv(Path(course_dir) / FAULTS_FILE)
                       if row["assignment"] not in covered)]


def duration(seconds: float) -> str:
    """A time span in the unit that reads best: '18 s', '25 min', '3.5 h', '2.1 days'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def history(course_dir: Path) -> list[dict]:
    """The rows of the course's submission history (HISTORY_FILE), oldest first."""
    return read_csv(Path(course_dir) / HISTORY_FILE)


def read_csv(path: Path) -> list[dict]:
    """The rows of a CSV file as dicts; [] when there is no such file."""
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))

def flag_code(text: str) -> str:
    for code, pattern, _ in FLAG_CODES:
        if re.search(pattern, text):
            return code
    return "OTHER"


def flag_codes(texts: list[str]) -> str:
    """The codes of these flags, each once, in FLAG_CODES order: 'COPY OWN'."""
    found = {flag_code(text) for text in texts}
    order = [code for code, _, _ in FLAG_CODES] + ["OTHER"]
    return " ".join(code for code in order if code in found)


def chapter_cells(chapter: Path) -> set[str]:
    """The grade ids of a chapter's cells, read from its source text (or a released notebook)."""
    return set(re.findall(r'"grade_id": "([^"]+)"', Path(chapter).read_text()))


def wrong_chapter(notebook: Path, assignment: str, chapters: list[Path]) -> str:
    """Why NOTEBOOK, handed in as ASSIGNMENT, is another chapter's ('' when it is ASSIGNMENT's, or cannot
    be read): 'this is ch03_paged_cache, handed in as ch02', found by the chapter its graded cells are
    from (their chNN_ prefix, else the chapter sharing the most of them)."""
    import nbformat
    try:
        ids = {cells.grade_id(cell) for cell in nbformat.read(notebook, as_version=4).cells} - {None}
    except Exception:
        return ""
    if not ids:
        return ""
    names = {assignment_id(path): chapter_name(path) for path in chapters}
    shared = {assignment_id(path): len(ids & chapter_cells(path)) for path in chapters}
    prefixes = Counter(match.group(1) for ident in ids if (match := re.match(r"(ch\d\d)_", ident)))
    if prefixes:
        found = prefixes.most_common(1)[0][0]
    elif max(shared.values(), default=0) == 0:
        return (f"this is not {names.get(assignment, assignment)}: none of its graded cells is one of that "
                f"chapter's (another notebook, handed in as {assignment}?)")
    else:
        found = max(shared, key=lambda ident: (shared[ident], ident == assignment))
    if found == assignment:
        return ""
    return f"this is {names.get(found, found)}, handed in as {assignment}"


# ---- reading the gradebook ----------------------------------------------------------------------

def _utc(moment) -> str:
    return moment.replace(tzinfo=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def sealed_flags(course_dir: Path, student: str, assignment: str) -> list[str]:
    """The sealed run's flags and repairs for one submission (course/sandbox/flags/)."""
    record = Path(course_dir) / "sandbox" / "flags" / student / f"{assignment}.json"
    found = json.loads(record.read_text()) if record.is_file() else {}
    return found.get("flags", []) + found.get("changes", [])


def class_rows(course_dir: Path, roster, chapters: list[Path], faults=(), all_chapters: bool = False) -> list[dict]:
    """One dict per student and chapter handed in (or every chapter), with the flags' full text in
    `notes` (a list) and their codes in `flags`."""
    from nbgrader.api import Gradebook, MissingEntry

    from engine.course.authoring.nbgrader_course import COURSE_ID
    names = {assignment_id(path): chapter_name(path) for path in chapters}
    faults = recorded_faults(course_dir, faults)
    times: dict[tuple[str, str], list[str]] = {}
    for row in history(course_dir):
        times.setdefault((row["student_id"], row["assignment"]), []).append(row["submitted_at"])
    rows = []
    with Gradebook(f"sqlite:///{Path(course_dir) / 'gradebook.db'}", COURSE_ID) as gradebook:
        students = {s.id: s for s in gradebook.students}
        for student_id in sorted(students):
            student = students[student_id]
            for assignment in names:
                try:
                    due = gradebook.find_assignment(assignment).duedate
                except MissingEntry:
                    due = None
                notes = [f"not graded: {f.entry}: {f.reason}" if not f.reason.startswith("this is ") else f.reason
                         for f in faults if f.student == student_id and f.assignment == assignment]
                try:
                    submission = gradebook.find_submission(assignment, student_id)
                except MissingEntry:
                    submission = None
                handed_in = submission is not None or bool(notes)
                if not handed_in and not all_chapters:
                    continue
                row = {"student_id": student_id, "first_name": student.first_name or "",
                       "last_name": student.last_name or "", "email": student.email or "",
                       "assignment": assignment, "chapter": names[assignment], "due": _utc(due),
                       "submitted_at": "", "submissions": len(times.get((student_id, assignment), [])),
                       "seconds_late": 0, "raw_score": 0.0, "late_penalty": 0.0, "score": 0.0,
                       "max_score": _max_score(gradebook, assignment), "exercises": {}}
                if submission is not None and not notes:
                    penalty = sum(nb.late_submission_penalty or 0 for nb in submission.notebooks)
                    row.update(submitted_at=_utc(submission.timestamp), seconds_late=round(
                        submission.total_seconds_late), raw_score=submission.score, late_penalty=penalty,
                        score=max(0.0, submission.score - penalty), max_score=submission.max_score,
                        exercises={g.name: (g.score, g.max_score) for nb in submission.notebooks
                                   for g in nb.grades})
                    notes += sealed_flags(course_dir, student_id, assignment)
                    if row["seconds_late"] > 0:
                        notes.append(f"late: {duration(row['seconds_late'])} after {row['due']}; "
                                     f"penalty {penalty:g} point(s)")
                stamps = times.get((student_id, assignment), [])
                if len(stamps) > 1:
                    notes.append(f"resubmitted: {len(stamps)} submissions ({', '.join(stamps)}); the last is graded")
                if not handed_in:
                    notes.append("not handed in")
                row["notes"] = notes
                row["flags"] = "MISSING" if not handed_in else flag_codes(notes)
                rows.append(row)
    return rows


def _max_score(gradebook, assignment: str) -> float:
    from nbgrader.api import MissingEntry
    try:
        return gradebook.find_assignment(assignment).max_score
    except MissingEntry:
        return 0.0


# ---- writing ------------------------------------------------------------------------------------

def write_grades(path: Path, rows: list[dict]) -> Path:
    with Path(path).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=GRADE_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **{k: f"{row[k]:g}" for k in ("raw_score", "late_penalty", "score",
                                                                    "max_score")}})
    return Path(path)


def annotate_feedback(course_dir: Path, rows: list[dict]) -> list[Path]:
    """Put each row's flags, in full, at the top of that student's feedback page(s) for the chapter."""
    changed = []
    for row in rows:
        if not row["notes"]:
            continue
        box = ('<div id="grader-notes" style="border:2px solid #c60;padding:8px;margin:8px">'
               "<b>Notes from the grader</b><ul>"
               + "".join(f"<li>[{flag_code(n)}] {html.escape(n)}</li>" for n in row["notes"]) + "</ul></div>")
        for page in (Path(course_dir) / "feedback" / row["student_id"] / row["assignment"]).glob("*.html"):
            text = re.sub(r'<div id="grader-notes".*?</div>', "", page.read_text(), flags=re.DOTALL)
            body = re.search(r"<body[^>]*>", text)
            if body:
                page.write_text(text[:body.end()] + box + text[body.end():])
                changed.append(page)
    return changed


def student_report(rows: list[dict]) -> str:
    """One student's report (Markdown): each chapter's score, late penalty, submissions, flags in full
    and points per exercise."""
    first = rows[0]
    name = " ".join(filter(None, [first["first_name"], first["last_name"]])) or first["student_id"]
    lines = [f"# {name} ({first['student_id']})", ""]
    for row in rows:
        lines += [f"## {row['chapter']}: {row['score']:g}/{row['max_score']:g}", "",
                  f"- due {row['due'] or 'no due date'}; graded submission {row['submitted_at'] or 'none'}"
                  f" ({row['submissions']} submitted)"]
        if row["late_penalty"]:
            lines.append(f"- late by {duration(row['seconds_late'])}: {row['late_penalty']:g} point(s) off "
                         f"{row['raw_score']:g}")
        lines += [f"- [{flag_code(note)}] {note}" for note in row["notes"]]
        if row["exercises"]:
            lines += ["", "| exercise | points |", "|---|---|"]
            lines += [f"| {ident} | {'not graded yet' if score is None else f'{score:g}'}/{top:g} |"
                      for ident, (score, top) in row["exercises"].items()]
        lines.append("")
    return "\n".join(lines)


def exercises_of(chapter: Path) -> dict[str, list[str]]:
    """{solution cell: the graded cells after it, up to the next solution cell}: what each exercise is
    scored on (a hand-graded answer is an exercise of its own)."""
    from engine.course.authoring.exercises import load_any
    found: dict[str, list[str]] = {}
    current = None
    for cell in load_any(chapter).cells:
        ident = cells.grade_id(cell)
        if cells.is_solution(cell) and not cells.is_graded(cell):
            current = ident
            found.setdefault(current, [])
        elif cells.is_graded(cell):
            found.setdefault(current if current and cells.is_test(cell) else ident, []).append(ident)
    return {k: v for k, v in found.items() if v}


def failures(course_dir: Path, student: str, assignment: str) -> dict[str, str]:
    """{test cell: what it said when it failed}, from the autograded notebook."""
    from engine.course.grading.grade import first_failure
    import nbformat
    found = {}
    for path in (Path(course_dir) / "autograded" / student / assignment).glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            if cells.is_test(cell) and cell.cell_type == "code":
                message = first_failure(cell)
                if message:
                    found[cells.grade_id(cell)] = message
    return found


def summary_rows(course_dir: Path, rows: list[dict], chapters: list[Path]) -> list[dict]:
    """Per exercise of each chapter handed in: students, mean points, full marks, the failing check seen
    most often and its message (its 'expected ..., got ...' cut off)."""
    out = []
    for chapter in chapters:
        assignment = assignment_id(chapter)
        graded = [r for r in rows if r["assignment"] == assignment and r["exercises"]]
        if not graded:
            continue
        failed = {r["student_id"]: failures(course_dir, r["student_id"], assignment) for r in graded}
        for exercise, tests in exercises_of(chapter).items():
            # a written answer not graded yet in formgrader has no score: left out, never counted as 0
            done = [r for r in graded if all(r["exercises"].get(t, (0, 0))[0] is not None for t in tests)]
            scores = [sum(r["exercises"].get(t, (0, 0))[0] or 0 for t in tests) for r in done]
            top = sum(graded[0]["exercises"].get(t, (0, 0))[1] or 0 for t in tests)
            seen = Counter((t, _what(failed[r["student_id"]][t])) for r in graded for t in tests
                           if t in failed[r["student_id"]])
            (check, message), times = seen.most_common(1)[0] if seen else (("", ""), 0)
            mean = f"{sum(scores) / len(scores):.2f}" if scores else NOT_GRADED_YET
            if scores and len(done) < len(graded):
                mean += f" ({len(done)} of {len(graded)} graded)"
            out.append({"chapter": chapter_name(chapter), "exercise": exercise, "max_points": f"{top:g}",
                        "students": len(graded), "mean": mean,
                        "full_marks": sum(1 for s in scores if s >= top > 0),
                        "most_failed_check": check, "failed": times, "message": message})
    return out


NOT_GRADED_YET = "not graded yet"     # the mean of written answers no one has graded in formgrader


def _share(row: dict) -> float:
    """The mean as a share of the exercise's points (0 where not graded yet or worth nothing)."""
    mean = row["mean"].split()[0]
    if row["mean"] == NOT_GRADED_YET or not float(row["max_points"]):
        return 0.0
    return float(mean) / float(row["max_points"])


def _what(message: str) -> str:
    """A failure's situation without its numbers: the part before ': expected' (at most 100 characters)."""
    head = message.split(": expected")[0].split(". Hint:")[0]
    return head if len(head) <= 100 else head[:99] + "…"


def write_summary(folder: Path, summary: list[dict]) -> dict[str, Path]:
    """summary.csv, summary.md and summary.png (mean share of points per exercise, full marks marked)."""
    folder.mkdir(parents=True, exist_ok=True)
    fields = ["chapter", "exercise", "max_points", "students", "mean", "full_marks", "most_failed_check",
              "failed", "message"]
    with (folder / "summary.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(summary)
    table = ["| chapter | exercise | mean / max | full marks | most failed check (times): message |",
             "|---|---|---|---|---|"]
    table += [f"| {r['chapter']} | {r['exercise']} | {r['mean']} / {r['max_points']} | {r['full_marks']}/"
              f"{r['students']} | {r['most_failed_check'] or '-'} ({r['failed']}): {r['message']} |" for r in summary]
    (folder / "summary.md").write_text("# The class, per exercise\n\n" + "\n".join(table) + "\n")
    outputs = {"class summary": folder / "summary.md", "class summary (CSV)": folder / "summary.csv"}
    if summary:
        outputs["class summary (plot)"] = plot_summary(summary, folder / "summary.png")
    return outputs


def plot_summary(summary: list[dict], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['exercise']} ({NOT_GRADED_YET})" if r["mean"] == NOT_GRADED_YET else
              f"{r['exercise']} ({r['full_marks']}/{r['students']} full)" for r in summary]
    shares = [_share(r) for r in summary]
    figure, axes = plt.subplots(figsize=(7, 0.4 * len(summary) + 1.2))
    axes.barh(range(len(summary)), shares, color="#4a7")
    axes.set_yticks(range(len(summary)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(0, 1)
    axes.set_xlabel("the class's mean, as a share of the exercise's points")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write_all(course_dir: Path, roster, chapters: list[Path], faults=(), all_chapters: bool = False) -> dict:
    """grades.csv, the feedback notes, every student's report and the class summary: {what: where}."""
    course_dir = Path(course_dir)
    rows = class_rows(course_dir, roster, chapters, faults, all_chapters)
    folder = course_dir / "reports"
    students = folder / "students"
    students.mkdir(parents=True, exist_ok=True)
    for student in sorted({r["student_id"] for r in rows}):
        (students / f"{student}.md").write_text(student_report([r for r in rows if r["student_id"] == student]))
    annotate_feedback(course_dir, rows)
    outputs = {"grades": write_grades(course_dir / "grades.csv", rows), "student reports": students}
    outputs.update(write_summary(folder, summary_rows(course_dir, rows, chapters)))
    return outputs
