"""`make autograde SUBMISSIONS=dir`: the instructor's path, through nbgrader from end to end.

The submissions folder holds one folder per student, each with the chapter notebooks under their
released names:

    SUBMISSIONS/<student>/<chNN_topic>.ipynb      e.g. submissions/ada/ch02_block_tables.ipynb

This refreshes an nbgrader course directory (default ./course/, gitignored): nbgrader_config.py (with
a per-cell timeout for Triton-interpreter kernels), source/ from the chapters, generate_assignment; then
copies every submission it can read into submitted/<id>/<chNN>/, grades each one in the sealed worker
inside the sandbox (`--jobs` at a time, or `--cluster tcp://host:8786`: each one a task on a Dask
cluster's workers, engine/course/grading/cluster.py), runs nbgrader autograde (which takes those sealed
results), generate_feedback (HTML) and export (grades.csv, plus `flags` and `nbgrader_id` columns),
and prints a per-student summary and where each output went.

Each sealed result is a record in course/sandbox/results/ that only this process writes, with an HMAC
under the course's key (course/instructor/result-key, 0600, where no sandbox looks) over the student,
the chapter, the notebook's sha256 and the result: any other record (rewritten, moved from another
student, for another notebook) is refused, here and in nbgrader's step, and graded again. An authentic
record for the same notebook, chapter text, grader and limits is kept by the next run, which grades
only the rest (a run stopped half-way loses nothing).

A class always gets its grades: a submission that cannot be graded (unreadable, binary or truncated,
not a notebook, a folder named like a notebook, a notebook for no chapter of the course, corrupted
nbgrader metadata) is left out of nbgrader's run and reported by student and file, with the reason;
everyone else is graded, and the command then exits 1 with a one-line summary. Every student folder
appears in grades.csv under its own name: a name nbgrader cannot take as a student id (a leading dot,
glob characters `*?[]`, spaces, non-ASCII letters) is graded under a safe id (the `nbgrader_id` column,
also the feedback folder's name); a name that is not valid UTF-8 cannot be written into grades.csv and
is refused by name.

Sandbox: each submission runs as an unprivileged user in its own namespaces, seeing a read-only system
and nothing of the course directory or other students' work, with a memory, process, disk and
per-notebook time limit (engine/course/grading/sandbox.py). Without bubblewrap (`apt-get install bubblewrap`)
it refuses to grade (`--sandbox required`, the default); `--sandbox auto` runs the submissions unconfined
with a warning instead, and `--sandbox off` skips the sandbox.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from engine.course.authoring.nbgrader_course import (AUTOGRADE_CELL_TIMEOUT, COURSE_ID, NbgraderError, file_digest,
                                                     result_path, run_nbgrader, stage_sources, write_config)
from engine.course.paths import (CHAPTER_PATTERN, assignment_id, chapter_files, chapter_name, offline_cpu_environ,
                                 repo_root, solutions_refusal)

ALL_ASSIGNMENTS = "ch[0-9][0-9]"
DEFAULT_JOBS = 2
# A folder name nbgrader takes as it is: its globs skip a leading dot and read *?[] as patterns, its
# config strips spaces at the ends, and its exclusion list splits on commas.
SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")
NOT_GRADED_FILE = "not-graded.json"


@dataclass
class Fault:
    """A submission (or a whole student folder) that could not be graded, and why."""

    student: str          # the folder name as found (the whole SUBMISSIONS entry for a stray file)
    entry: str            # the file or folder inside it ("" for the student folder itself)
    reason: str
    assignment: str = ""  # chNN when the entry was meant for a chapter of the course

    def line(self) -> str:
        where = shown(self.student) + (f"/{shown(self.entry)}" if self.entry else "")
        return f"{where}: {self.reason}"


@dataclass
class Roster:
    """What collect() found: the submissions copied for nbgrader, the students' ids, what it could not take."""

    copied: list[Path] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)      # folder name -> nbgrader student id
    faults: list[Fault] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def names(self) -> dict[str, str]:
        """nbgrader id -> folder name."""
        return {ident: name for name, ident in self.ids.items()}


def shown(name: str) -> str:
    """A folder or file name as it can be printed on one line (control characters escaped)."""
    return name if name.isprintable() else repr(name)[1:-1]


def student_ids(names: list[str]) -> dict[str, str]:
    """{folder name: nbgrader student id}: the name itself where nbgrader takes it, else a safe id made of
    its ASCII letters and a hash of the whole name (distinct for distinct names)."""
    ids = {name: name for name in names if SAFE_ID.fullmatch(name)}
    taken = set(ids)
    for name in sorted(set(names) - set(ids)):
        ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
        slug = re.sub(r"[^A-Za-z0-9_]+", "_", ascii_name).strip("_")[:32] or "student"
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()
        size = 8
        while f"{slug}-{digest[:size]}" in taken:
            size += 1
        ids[name] = f"{slug}-{digest[:size]}"
        taken.add(ids[name])
    return ids


def notebook_fault(path: Path) -> str:
    """Why `path` cannot be graded as a notebook ('' when it can): what nbgrader would stop on, found first."""
    if path.is_symlink():
        return "a symbolic link: only plain files are graded"
    if path.is_dir():
        return "a folder named like a notebook, not a notebook file"
    if not path.is_file():
        return "not a regular file"
    try:
        data = path.read_bytes()
    except OSError as error:
        return f"unreadable: {error.strerror or error}"
    if not data.strip():
        return "an empty file (an interrupted upload?)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"not a text file: byte {error.start} of {len(data)} is not UTF-8 (a binary file?)"
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        return f"not JSON: {error.msg} (line {error.lineno}, column {error.colno}: a truncated upload?)"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", raw.get("worksheets")), list):
        return "not a notebook: JSON without a list of cells"
    import nbformat
    try:
        notebook = nbformat.reads(text, as_version=4)
        if not all(isinstance(cell, dict) and "cell_type" in cell and "source" in cell for cell in notebook.cells):
            return "not a notebook: a cell without cell_type or source"
    except Exception as error:
        return f"not a notebook: {_first_line(error)}"
    from nbgrader.nbgraderformat import MetadataValidator
    try:
        MetadataValidator().validate_nb(notebook)
    except Exception as error:  # nbgrader's autograde would stop on it (an outdated schema stops the whole run)
        return f"its nbgrader metadata is corrupted: {_first_line(error)}"
    return ""


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def prepare_course(course_dir: Path, chapters: list[Path], timeout: int, sandbox: str = "required",
                   hide: list[Path] = ()) -> None:
    """Config, source/ and release/ for every chapter (nbgrader records each chapter's tests in its gradebook)."""
    solutions = chapters[0].parent if chapters else None
    write_config(course_dir, timeout, solutions=solutions, sandbox=sandbox, hide=list(hide))
    shutil.rmtree(course_dir / "source", ignore_errors=True)
    stage_sources(course_dir, chapters)
    run_nbgrader(course_dir, "generate_assignment", ALL_ASSIGNMENTS, "--force")


def collect(submissions: Path, course_dir: Path, chapters: list[Path]) -> Roster:
    """Copy every gradable SUBMISSIONS/<student>/<chNN_topic>.ipynb into submitted/<id>/<chNN>/; the roster
    says what was copied, each student's nbgrader id, and every entry that could not be taken and why."""
    known = {chapter_name(path): assignment_id(path) for path in chapters}
    shutil.rmtree(course_dir / "submitted", ignore_errors=True)
    roster = Roster()
    students = []
    for entry in sorted(submissions.iterdir(), key=lambda p: p.name):
        name = entry.name
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            printable = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            roster.faults.append(Fault(printable, "", "refused: the folder name is not valid UTF-8, so it cannot "
                                                      "be written into grades.csv; rename the folder"))
            continue
        if entry.is_symlink():
            roster.faults.append(Fault(name, "", "refused: a symbolic link, not a student folder"))
        elif not entry.is_dir():
            roster.faults.append(Fault(name, "", "not in a student folder: expected "
                                                 "<student>/<chNN_topic>.ipynb"))
        else:
            students.append(entry)
    roster.ids = student_ids([s.name for s in students])
    for student in students:
        ident, found = roster.ids[student.name], 0
        for notebook in sorted(student.iterdir(), key=lambda p: p.name):
            if not notebook.name.endswith(".ipynb"):
                continue
            stem = notebook.name[:-len(".ipynb")]
            if stem not in known:
                nearest = CHAPTER_PATTERN.match(stem)
                chapter = nearest.group(1) if nearest and nearest.group(1) in known.values() else ""
                roster.faults.append(Fault(student.name, notebook.name, "no chapter of this course is named "
                                           f"{stem} (have {', '.join(known)})", chapter))
                continue
            fault = notebook_fault(notebook)
            if fault:
                roster.faults.append(Fault(student.name, notebook.name, fault, known[stem]))
                continue
            target = course_dir / "submitted" / ident / known[stem] / notebook.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(notebook, target)
            roster.copied.append(target)
            found += 1
        if not found and not any(f.student == student.name for f in roster.faults):
            roster.notes.append(f"{shown(student.name)}: no chapter notebook ({', '.join(known)}.ipynb)")
    if not roster.copied and not roster.faults:
        raise SystemExit(f"no submissions in {submissions}: expected {submissions}/<student_id>/<chNN_topic>.ipynb")
    return roster


def grade_submissions(copied: list[Path], course_dir: Path, chapters: list[Path], timeout: int, jobs: int,
                      sandbox: str, hide: list[Path], progress=print, limits=None,
                      names: dict[str, str] | None = None, cluster: str = ""):
    """Run every collected submission in the sealed worker (sandboxed): `jobs` at a time here, or each one
    task on the Dask cluster at `cluster`; a line as each finishes. The results wait, authenticated, in
    course/sandbox/results/ for nbgrader's autograde to take; an authentic result of an earlier run for
    the same notebook, chapter and settings is kept, not graded again. The Tally says what was done."""
    from engine.course.grading.cluster import Job, Tally, grade_on_cluster
    from engine.course.grading.cluster_task import grade_file, grader_digest, settings
    from engine.course.authoring.nbgrader_course import cached_result, result_key, write_result
    from engine.course.grading.sandbox import Limits, available, limits_note
    by_name = {chapter_name(path): path for path in chapters}
    work_root = course_dir / "sandbox"
    limits = limits or Limits()
    usable, why = available()
    if sandbox == "required" and not usable and not cluster:
        raise SystemExit(f"autograde: the sandbox is required, and {why} (--sandbox auto grades the "
                         "submissions unconfined instead)")
    if sandbox != "off" and not usable and not cluster:
        progress(f"WARNING: {why}")
    elif sandbox != "off" and limits_note() and not cluster:
        progress(f"WARNING: the sandbox runs with less than its limits here: {limits_note()}")
    key = result_key(course_dir, create=True)
    names = names or {}
    todo, engine = [], grader_digest()
    for path in copied:
        job = Job(path, by_name[path.stem], settings(by_name[path.stem], timeout, sandbox, limits, engine))
        if cached_result(work_root, job.student, job.assignment, path, job.grader) is None:
            result_path(work_root, job.student, job.assignment).unlink(missing_ok=True)
            todo.append(job)
    tally = Tally(len(todo), progress, kept=len(copied) - len(todo))
    if tally.kept:
        progress(f"{tally.kept} submission(s) already graded (authentic results for the same notebook, chapter "
                 f"and settings in {work_root / 'results'}): kept")
    lock = threading.Lock()

    def accept(job: Job, reply: dict) -> None:
        if reply["result"] is not None:   # else the grader failed: nbgrader's own step grades it again
            write_result(work_root, job.student, job.assignment, reply["sha256"], reply["result"], key)

    def one(job: Job) -> None:
        result, score = grade_file(job.path, job.chapter, work_root / "work" / job.student / job.assignment,
                                   timeout, sandbox, limits, [*hide, course_dir])
        accept(job, {"sha256": file_digest(job.path), "result": result})
        with lock:
            tally.where["this machine"] += 1
            tally.line(f"{shown(names.get(job.student, job.student))} {job.path.stem}: {score}")

    try:
        if cluster and todo:
            grade_on_cluster(cluster, todo, tally, accept, {ident: shown(name) for ident, name in names.items()})
        elif todo:
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                for future in as_completed([pool.submit(one, job) for job in todo]):
                    future.result()
    finally:
        tally.close()
    progress(tally.summary())
    return tally


def run_tolerant(course_dir: Path, step: str, *args: str) -> dict[tuple[str, str], str]:
    """`nbgrader STEP ARGS`, going on past submissions it fails on: {(assignment, student id): why} for
    each. A submission that stops nbgrader's whole run is set aside (course/not-graded/) and the run
    resumed without it; anything else that stops it raises NbgraderError. Logs go to course/logs/."""
    failed: dict[tuple[str, str], str] = {}
    logs = course_dir / "logs"
    logs.mkdir(exist_ok=True)
    force = ["--force"]
    from engine.course.grading.sandbox import die_with_parent   # nbgrader ends with this process, however it ends
    for attempt in range(1, 1000):
        result = subprocess.run([sys.executable, "-m", "nbgrader", step, *args, *force], cwd=course_dir,
                                env=offline_cpu_environ(), capture_output=True, text=True,
                                preexec_fn=die_with_parent)
        log = result.stdout + result.stderr
        (logs / f"{step}-{attempt}.log").write_text(log)
        pairs = re.findall(r"There was an error processing assignment '([^']*)' for student '([^']*)'", log)
        for pair in pairs:
            failed[pair] = f"nbgrader {step} failed on it (course/logs/{step}-{attempt}.log)"
        if result.returncode == 0 or pairs:
            return failed
        named = re.findall(r"(?:Converting notebook|Sanitizing) (.+\.ipynb)\s*$", log, re.MULTILINE)
        culprit = next(filter(None, (_submission_of(course_dir, path) for path in reversed(named))), None)
        if culprit is None:
            raise NbgraderError(f"nbgrader {step} failed (exit {result.returncode}) in {course_dir}:\n{log}")
        assignment, student = culprit
        errors = [line for line in log.splitlines() if "[ERROR]" in line]
        failed[culprit] = f"nbgrader {step} stopped on it: {errors[-1].split('] ', 1)[-1] if errors else log[-200:]}"
        set_aside(course_dir, student, assignment, "submitted" if step == "autograde" else "autograded")
        force = []   # what was done stays done
    return failed


def set_aside(course_dir: Path, student: str, assignment: str, where: str = "submitted") -> None:
    """Move course/WHERE/<student>/<assignment> to course/not-graded/, out of nbgrader's next step."""
    aside = course_dir / "not-graded" / student / assignment
    shutil.rmtree(aside, ignore_errors=True)
    aside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(course_dir / where / student / assignment), str(aside))


def _submission_of(course_dir: Path, notebook: str) -> tuple[str, str] | None:
    """(assignment, student id) of a notebook path nbgrader named in its log."""
    path = Path(notebook)
    path = path if path.is_absolute() else course_dir / path
    parts = path.resolve().relative_to(course_dir.resolve()).parts if path.resolve().is_relative_to(
        course_dir.resolve()) else ()
    if len(parts) >= 4 and parts[0] in ("submitted", "autograded"):
        return parts[2], parts[1]
    return None


def enrol(course_dir: Path, ids: list[str]) -> None:
    """Make sure every student is in the gradebook, so grades.csv has a row for each (0 where not graded)."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}", COURSE_ID) as gradebook:
        for ident in ids:
            gradebook.update_or_create_student(ident)


def autograde(submissions: Path, course_dir: Path, chapters: list[Path],
              timeout: int = AUTOGRADE_CELL_TIMEOUT, jobs: int = DEFAULT_JOBS, sandbox: str = "required",
              progress=print, limits=None, cluster: str = "") -> dict[str, Path]:
    """Run the whole instructor path; {what: where} for each output. Submissions that could not be graded
    are listed in course/not-graded.json (see not_graded()). With `cluster` (a Dask scheduler's address)
    the sealed runs are tasks on its workers; everything else happens here, in course_dir."""
    why = folders_refusal(submissions, course_dir)
    if why:                                 # before anything is written: the course folder is rewritten
        raise SystemExit(f"autograde: {why}")
    course_dir = course_dir.resolve()
    hide = [submissions.resolve()]
    prepare_course(course_dir, chapters, timeout, sandbox, hide)
    roster = collect(submissions, course_dir, chapters)
    for note in roster.notes:
        progress(note)
    for fault in roster.faults:
        progress(f"not graded: {fault.line()}")
    tally = grade_submissions(roster.copied, course_dir, chapters, timeout, jobs, sandbox, hide, progress, limits,
                              roster.names, cluster)
    names = roster.names
    faults = list(roster.faults)
    for path, why in tally.stopped.items():   # left out of nbgrader's run, which would grade it here
        ident, assignment = path.parent.parent.name, path.parent.name
        faults.append(Fault(names.get(ident, ident), path.name, why, assignment))
        set_aside(course_dir, ident, assignment)
        roster.copied.remove(path)
    if roster.copied:
        for (assignment, ident), why in run_tolerant(course_dir, "autograde", ALL_ASSIGNMENTS, "--create").items():
            faults.append(Fault(names.get(ident, ident), f"{assignment}", why, assignment))
    enrol(course_dir, sorted(roster.ids.values()))
    # Feedback only for what nbgrader autograded: with none (autograde failed on every submission, each
    # one a fault above with its log), nbgrader's feedback step would stop on "No notebooks were matched"
    # and hide why.
    if any((course_dir / "autograded").glob(f"*/{ALL_ASSIGNMENTS}/*.ipynb")):
        for (assignment, ident), why in run_tolerant(course_dir, "generate_feedback", ALL_ASSIGNMENTS).items():
            progress(f"no feedback for {shown(names.get(ident, ident))} {assignment}: {why}")
    grades = course_dir / "grades.csv"
    run_nbgrader(course_dir, "export", "--to", str(grades))
    finish_grades(grades, course_dir / "sandbox" / "flags", roster.ids, faults)
    record = course_dir / NOT_GRADED_FILE
    record.write_text(json.dumps([vars(f) for f in faults], indent=1, ensure_ascii=False))
    outputs = {
        "course directory": course_dir,
        "submissions collected": course_dir / "submitted",
        "autograded notebooks": course_dir / "autograded",
        "feedback (HTML)": course_dir / "feedback",
        "grades": grades,
        "gradebook": course_dir / "gradebook.db",
    }
    if faults:
        outputs["not graded"] = record
    return outputs


def not_graded(course_dir: Path) -> list[Fault]:
    """The submissions the last autograde run in course_dir could not grade."""
    record = Path(course_dir) / NOT_GRADED_FILE
    return [Fault(**f) for f in json.loads(record.read_text())] if record.is_file() else []


def finish_grades(grades_csv: Path, flags_dir: Path, ids: dict[str, str], faults: list[Fault] = ()) -> None:
    """grades.csv as the instructor reads it: each row under the student's folder name (the nbgrader id in
    its own column), and a `flags` column: what the sealed run found (taught code copied verbatim,
    chapter cells put back, no sandbox) or why the notebook was not graded."""
    with grades_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
        fields = [f for f in (rows[0].keys() if rows else []) if f not in ("flags", "nbgrader_id")]
    if not rows:
        return
    names = {ident: name for name, ident in ids.items()}
    for row in rows:
        ident = row.get("nbgrader_id") or row["student_id"]
        record = flags_dir / ident / f"{row['assignment']}.json"
        found = json.loads(record.read_text()) if record.is_file() else {}
        name = names.get(ident, row["student_id"])
        failed = [f"not graded: {f.entry}: {f.reason}" for f in faults
                  if f.student == name and f.assignment == row["assignment"]]
        row["flags"] = " | ".join(failed + found.get("flags", []) + found.get("changes", []))
        row["student_id"], row["nbgrader_id"] = name, ident
    with grades_csv.open("w", newline="") as handle:
        at = fields.index("student_id") + 1 if "student_id" in fields else len(fields)
        writer = csv.DictWriter(handle, fieldnames=[*fields[:at], "nbgrader_id", *fields[at:], "flags"])
        writer.writeheader()
        writer.writerows(rows)


def has_submissions(submissions: Path) -> bool:
    """Whether collect() would find anything in SUBMISSIONS: a student folder holding a *.ipynb entry,
    or an entry it reports as not gradable (a stray file, a link, a name that is not UTF-8)."""
    for entry in submissions.iterdir():
        try:
            entry.name.encode("utf-8")
            if entry.is_symlink() or not entry.is_dir() or any(p.name.endswith(".ipynb") for p in entry.iterdir()):
                return True
        except (UnicodeEncodeError, OSError):
            return True
    return False


def folders_refusal(submissions: Path, course_dir: Path) -> str:
    """Why SUBMISSIONS and --course cannot be used together ('' when they can): autograde rewrites the
    course directory (its submitted/, source/, sandbox/ ...), so neither may hold the other."""
    subs, course = submissions.resolve(), course_dir.resolve()
    if subs == course:
        return f"SUBMISSIONS {submissions} is the --course folder {course_dir}; autograde rewrites that folder"
    if subs.is_relative_to(course):
        return f"SUBMISSIONS {submissions} is inside --course {course_dir}; autograde rewrites that folder"
    if course.is_relative_to(subs):
        return (f"--course {course_dir} is inside SUBMISSIONS {submissions}; autograde would grade its own "
                "course directory as a student")
    return ""


def main(argv: list[str] | None = None) -> int:
    """Autograde SUBMISSIONS into the course directory and print where the outputs are; exit 1 (with a
    one-line summary) when some submission could not be graded. A bad argument (an empty or missing
    SUBMISSIONS, one that overlaps --course, a --solutions without chapters, --sandbox required where
    there is no sandbox) is refused in one line, exit 2, before anything is written."""
    from engine.course.grading.sandbox import Limits
    from engine.course.write_guard import folder_refusal
    root = repo_root()
    from engine.tools import cli_args
    parser = cli_args.Parser(prog="python -m engine.course.grading.autograde", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submissions", help="folder of <student_id>/<chNN_topic>.ipynb")
    parser.add_argument("--course", type=Path, default=root / "course", help="nbgrader course directory")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="the chapter sources")
    parser.add_argument("--timeout", type=cli_args.positive_int, default=AUTOGRADE_CELL_TIMEOUT,
                        help="seconds per cell (a whole number >= 1)")
    parser.add_argument("--notebook-timeout", type=cli_args.positive_int, default=Limits.notebook_seconds,
                        help="seconds per notebook, all its cells together (default %(default)s)")
    parser.add_argument("--jobs", type=cli_args.int_in(1, 256), default=DEFAULT_JOBS,
                        help="submissions graded at once (1 to 256)")
    parser.add_argument("--sandbox", choices=("required", "auto", "off"), default="required",
                        help="bubblewrap sandbox per submission (required: refuse to grade without it; auto: "
                             "when it works here, else unconfined with a warning; off: never)")
    parser.add_argument("--cluster", default="", metavar="tcp://HOST:8786",
                        help="a Dask scheduler: each submission one task on its workers (default: --jobs here)")
    args = parser.parse_args(argv)
    if args.cluster and not re.fullmatch(r"(tcp|tls)://[^\s/]+:[0-9]+", args.cluster):
        parser.error(f"--cluster {args.cluster!r} is not a Dask scheduler's address: expected tcp://HOST:PORT "
                     "(or tls://HOST:PORT), as `dask scheduler` prints it")
    if not args.submissions.strip():
        parser.error("SUBMISSIONS is empty: name the folder of <student>/<chNN_topic>.ipynb "
                     "(make autograde SUBMISSIONS=dir)")
    submissions = Path(args.submissions)
    if not submissions.is_dir():
        parser.error(f"{submissions} is not a folder (expected <student_id>/<chNN_topic>.ipynb inside)")
    why = folder_refusal("--course", args.course, root=root) or folders_refusal(submissions, args.course)
    if why:
        parser.error(why)
    why = solutions_refusal(args.solutions)
    if why:
        parser.error(why)
    chapters = chapter_files(args.solutions)
    if not has_submissions(submissions):
        parser.error(f"SUBMISSIONS {submissions} holds no submission: expected "
                     f"{submissions}/<student_id>/<chNN_topic>.ipynb")
    if args.cluster:
        from engine.course.grading.cluster import unreachable
        why = unreachable(args.cluster)
        if why:
            parser.error(why)
    if args.sandbox == "required" and not args.cluster:   # on a cluster each worker checks its own
        from engine.course.grading.sandbox import available
        usable, why = available()
        if not usable:
            parser.error(f"--sandbox required (the default), but there is no working sandbox here: {why} "
                         "(--sandbox auto grades the submissions unconfined instead)")
    started = time.monotonic()
    outputs = autograde(submissions, args.course, chapters, args.timeout, args.jobs, args.sandbox,
                        limits=Limits(notebook_seconds=args.notebook_timeout), cluster=args.cluster)
    elapsed = time.monotonic() - started
    faults = not_graded(outputs["course directory"])
    print(summary(outputs["grades"], chapters))
    rows = len(list((outputs["course directory"] / "submitted").glob("*/*/*.ipynb")))
    where = f"on the cluster at {args.cluster}" if args.cluster else f"{args.jobs} at a time"
    print(f"graded {rows} submission(s) in {elapsed:.0f} s ({elapsed / max(rows, 1):.1f} s each, {where})")
    for what, where in outputs.items():
        print(f"{what + ':':24} {where}")
    if faults:
        print(f"autograde: {len(faults)} submission(s) could not be graded (everyone else is in grades.csv): "
              + "; ".join(f.line() for f in faults), file=sys.stderr)
        return 1
    return 0


def summary(grades_csv: Path, chapters: list[Path] = (), submitted: Path | None = None) -> str:
    """One line per student and assignment from grades.csv: the score nbgrader gave (manual parts pending),
    a note where a student sent no notebook for a chapter, why one was not graded, and the flags."""
    with grades_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    course = grades_csv.parent
    names = {assignment_id(path): chapter_name(path) for path in chapters}
    lines = []
    for row in sorted(rows, key=lambda r: (r["student_id"], r["assignment"])):
        line = (f"{shown(row['student_id']):16} {row['assignment']:6} "
                f"{float(row['score']):g}/{float(row['max_score']):g}")
        ident = row.get("nbgrader_id") or row["student_id"]
        folder = (submitted or course / "submitted") / ident / row["assignment"]
        flags = row.get("flags", "")
        if flags.startswith("not graded:"):
            line += f"  {flags}"
        elif folder.parent.is_dir() and not folder.is_dir():
            chapter = names.get(row["assignment"], row["assignment"])
            line += f"  no notebook for {chapter}: 0 in grades.csv"
        elif flags:
            line += f"  flagged: {flags}"
        lines.append(line)
    return "\n".join(["student          chapter score (written answers count once graded by hand)", *lines])


if __name__ == "__main__":
    sys.exit(main())
