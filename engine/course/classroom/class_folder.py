"""`make course ROSTER=roster.ini`: a class's nbgrader course folder, and grading it through the exchange.

The roster file says who is in the class, which chapters are set and when each is due:

    [course]
    late_penalty_per_day = 0.1        ; share of the score taken per day (or part of one) late, at most all
    [chapters]
    ch02 = 2027-02-01 23:59           ; due date, UTC
    [instructors]
    grace = Grace Hopper <grace@example.edu>
    [students]
    ada = Ada Lovelace <ada@example.edu>

`prepare` writes the course folder with no submission at all: nbgrader_config.py (the sealed, sandboxed
autograde, the exchange, the late-submission plugin), source/ and release/ for the roster's chapters,
and a gradebook holding the students and the chapters with their due dates.

`grade CHAPTER` is the instructor's round after students submit through the exchange: collect (only
what belongs to the account it names, engine/course/classroom/inbound.py, the rest reported in not-collected.csv;
a resubmission replaces the earlier one; every submission's time stays in submissions.csv), set aside
what cannot be graded (a notebook of another chapter is named as such, keeps its row and gets a
feedback page saying so), grade every submission in the
sealed worker in the sandbox (`--jobs` at a time), nbgrader autograde (late penalties) and feedback,
then the reports (engine/course/classroom/reports.py) and the gradebook export (engine/course/classroom/export.py).
`--release` also releases the feedback to the students.
"""
from __future__ import annotations

import argparse
import configparser
import csv
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float

from engine.course.paths import assignment_id, chapter_files, repo_root
from engine.course.classroom.reports import HISTORY_FILE, read_csv

DEFAULT_EXCHANGE = "/srv/nbgrader/exchange"
PERSON = re.compile(r"^\s*(?P<name>[^<]*?)\s*(?:<(?P<email>[^>]*)>)?\s*$")


class LatePenalty(LateSubmissionPlugin):
    """nbgrader's late-submission plugin: `per_day` of the score for each day (or part of one) late."""

    per_day = Float(0.0, help="share of the score taken per started day late (0.1: 10 %)").tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float) -> float:
        days = math.ceil(total_seconds_late / 86400)
        return round(score * min(1.0, self.per_day * days), 6)


@dataclass
class Person:
    ident: str
    first_name: str = ""
    last_name: str = ""
    email: str = ""


@dataclass
class ClassRoster:
    """What a roster file says: the students, the instructors, the chapters and their due dates."""

    students: list[Person] = field(default_factory=list)
    instructors: list[Person] = field(default_factory=list)
    due: dict[str, datetime] = field(default_factory=dict)      # chNN -> due date (UTC)
    late_penalty_per_day: float = 0.0


def _person(ident: str, text: str) -> Person:
    match = PERSON.match(text)
    name, email = (match["name"], match["email"] or "") if match else (text, "")
    first, _, last = name.rpartition(" ")
    return Person(ident, first or last, last if first else "", email)


def _due_date(text: str):
    """A roster's due date, to the minute or to the second; None if it is neither."""
    for form in ("%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(text, form)
        except ValueError:
            pass
    return None


def read_roster(path: Path) -> ClassRoster:
    """Parse a roster file; a bad line is a SystemExit naming the file, the section and the value."""
    parser = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), interpolation=None)
    parser.optionxform = str          # student ids keep their case
    try:
        parser.read_string(Path(path).read_text(), source=str(path))
    except (OSError, configparser.Error) as error:
        raise SystemExit(f"roster {path}: {str(error).splitlines()[0]}") from None
    roster = ClassRoster()
    for section in ("students", "chapters"):
        if not parser.has_section(section) or not parser[section]:
            raise SystemExit(f"roster {path}: no [{section}] entries")
    for ident, text in parser["chapters"].items():
        if not re.fullmatch(r"ch\d\d", ident):
            raise SystemExit(f"roster {path}: [chapters] {ident}: a chapter is named chNN (e.g. ch02)")
        due = _due_date(text.strip())
        if due is None:
            raise SystemExit(f"roster {path}: [chapters] {ident} = {text}: expected a UTC due date "
                             "YYYY-MM-DD HH:MM (or HH:MM:SS)")
        roster.due[ident] = due.replace(tzinfo=timezone.utc)
    for section, people in (("students", roster.students), ("instructors", roster.instructors)):
        for ident, text in (parser[section].items() if parser.has_section(section) else []):
            if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", ident):
                raise SystemExit(f"roster {path}: [{section}] {ident}: an id is a local account name "
                                 "(lowercase letters, digits, _ and -, at most 32)")
            people.append(_person(ident, text))
    penalty = parser.get("course", "late_penalty_per_day", fallback="0")
    try:
        roster.late_penalty_per_day = float(penalty)
    except ValueError:
        raise SystemExit(f"roster {path}: late_penalty_per_day = {penalty}: expected a number, "
                         "e.g. 0.1 for 10 % a day") from None
    if not 0 <= roster.late_penalty_per_day <= 1:
        raise SystemExit(f"roster {path}: late_penalty_per_day = {penalty}: expected 0 to 1 (a share of the score)")
    return roster


def owners_checked(roster: ClassRoster) -> bool:
    """Whether collect takes a submission only from the account it names: where every student of the
    roster is a local account (a hub), not where the whole class runs in one account (a test)."""
    from engine.course.classroom.inbound import is_account
    return all(is_account(person.ident) for person in roster.students)


def class_settings(roster: ClassRoster, exchange: str | None) -> str:
    """The lines nbgrader_config.py gets for a class: the late penalty, the collect that takes only what
    belongs to who it names (engine/course/classroom/inbound.py) and (when given) the exchange."""
    lines = ["# The class (engine/course/classroom/class_folder.py): late penalties through nbgrader's plugin.",
             'c.AssignLatePenalties.plugin_class = "engine.course.classroom.class_folder.LatePenalty"',
             f"c.LatePenalty.per_day = {roster.late_penalty_per_day!r}",
             'c.ExchangeFactory.collect = "engine.course.classroom.inbound.OwnedCollect"',
             f"c.OwnedCollect.require_owner = {owners_checked(roster)!r}"]
    if exchange:
        lines.append(f"c.Exchange.root = {str(exchange)!r}")
    return "\n".join(lines) + "\n"


def roster_chapters(roster: ClassRoster, solutions: Path) -> list[Path]:
    """The chapter sources the roster sets, or a SystemExit naming one the course does not have."""
    found = {assignment_id(path): path for path in chapter_files(solutions)}
    missing = [ident for ident in roster.due if ident not in found]
    if missing:
        raise SystemExit(f"roster: no chapter {', '.join(missing)} in {solutions} (have {', '.join(found)})")
    return [found[ident] for ident in roster.due]


def prepare(course_dir: Path, roster_file: Path, solutions: Path | None = None, exchange: str | None = None,
            sandbox: str = "required", timeout: int | None = None) -> dict[str, Path]:
    """The course folder and its gradebook, with no submission: {what: where}."""
    from nbgrader.api import Gradebook

    from engine.course.grading.autograde import prepare_course
    from engine.course.authoring.nbgrader_course import AUTOGRADE_CELL_TIMEOUT, COURSE_ID
    roster = read_roster(roster_file)
    solutions = Path(solutions or repo_root() / "solutions").resolve()
    chapters = roster_chapters(roster, solutions)
    course_dir = Path(course_dir).resolve()
    course_dir.mkdir(parents=True, exist_ok=True)
    if not (course_dir / "roster.ini").exists() or not (course_dir / "roster.ini").samefile(roster_file):
        shutil.copyfile(roster_file, course_dir / "roster.ini")
    exchange = str(exchange or exchange_root(course_dir))     # the site's (or nbgrader's) when not given
    hide = [Path(exchange)]
    prepare_course(course_dir, chapters, timeout or AUTOGRADE_CELL_TIMEOUT, sandbox, hide)
    exchange_course_folder(Path(exchange))
    with (course_dir / "nbgrader_config.py").open("a") as config:
        config.write(class_settings(roster, exchange))
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}", COURSE_ID) as gradebook:
        for person in roster.students:
            gradebook.update_or_create_student(person.ident, first_name=person.first_name,
                                               last_name=person.last_name, email=person.email)
        for ident, due in roster.due.items():
            gradebook.update_or_create_assignment(ident, duedate=due.replace(tzinfo=None))
    return {"course directory": course_dir, "roster": course_dir / "roster.ini",
            "gradebook": course_dir / "gradebook.db",
            "chapters to release": course_dir / "release", "chapter sources": solutions}


def exchange_course_folder(exchange: Path) -> Path:
    """The course's folder in the exchange, this account's: made where missing (inbound/ 3733: students
    write, only its owner and group list it, and nobody removes another's entry); a SystemExit naming the
    owner where it belongs to another account (a student could have made it before the instructor)."""
    from engine.course.authoring.nbgrader_course import COURSE_ID
    folder = exchange / COURSE_ID
    if not exchange.is_dir():
        return folder              # nbgrader's release_assignment makes the exchange (and says so)
    for path, mode in ((folder, 0o755), (folder / "inbound", 0o3733)):
        if not path.is_dir():
            path.mkdir()
            os.chmod(path, mode)
        elif path.stat().st_uid != os.geteuid():
            from engine.course.classroom.inbound import _account
            raise SystemExit(f"prepare: the exchange's {path} belongs to {_account(path.stat().st_uid)}, not to "
                             "you: it controls what students fetch and submit. Have root remove it (make "
                             "hub-accounts makes it for the roster's first instructor), then prepare again")
    return folder


def describe(roster: ClassRoster, course_dir: Path) -> list[str]:
    """What prepare stored, for the instructor to check: the students, each chapter's due date, the rules."""
    people = ", ".join(person.ident for person in roster.students)
    lines = [f"students ({len(roster.students)}): {people}"]
    lines += [f"{ident} due {due:%Y-%m-%d %H:%M} UTC" for ident, due in roster.due.items()]
    lines.append(f"late penalty: {roster.late_penalty_per_day:g} of the score per started day late")
    lines.append("collect takes a submission only from the account it names: "
                 + ("yes" if owners_checked(roster) else "no (not every student is a local account here)"))
    return [f"prepare: stored in {course_dir}: " + lines[0], *(f"prepare: {line}" for line in lines[1:])]


# ---- after students submit through the exchange -------------------------------------------------

def exchange_root(course_dir: Path) -> Path:
    """The exchange nbgrader uses from course_dir (its configuration files, the course's last)."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config.loader import Config, PyFileConfigLoader
    merged = Config()
    for folder in [*reversed(jupyter_config_path()), str(course_dir)]:
        if (Path(folder) / "nbgrader_config.py").is_file():
            try:
                merged.merge(PyFileConfigLoader("nbgrader_config.py", path=folder).load_config())
            except Exception:   # a site file nbgrader itself reads: its own errors show there
                continue
    root = merged.get("Exchange", {}).get("root")
    return Path(root if isinstance(root, str) else DEFAULT_EXCHANGE)


def inbound_entries(course_dir: Path, assignment: str) -> tuple[list, list]:
    """(the submissions of ASSIGNMENT collect takes, the entries of inbound/ it refuses):
    engine/course/classroom/inbound.py."""
    from engine.course.classroom.inbound import sort_inbound
    from engine.course.authoring.nbgrader_course import COURSE_ID
    require = _config_value(course_dir, "OwnedCollect", "require_owner", bool)
    return sort_inbound(exchange_root(course_dir) / COURSE_ID / "inbound", assignment, require is not False)


def submission_times(course_dir: Path, assignment: str) -> dict[str, list[str]]:
    """{student: every time they submitted ASSIGNMENT, oldest first}, of the submissions collect takes."""
    found: dict[str, list] = {}
    for entry in inbound_entries(course_dir, assignment)[0]:
        found.setdefault(entry.student, []).append(entry.timestamp)
    return {student: [str(t) for t in sorted(times)] for student, times in found.items()}


def record_history(course_dir: Path, assignment: str, times: dict[str, list[str]]) -> Path:
    """course/submissions.csv: one row per submission (student, chapter, time), graded yes or no (the one
    in course/submitted/ is graded; an earlier one, or one set aside, is not)."""
    path = Path(course_dir) / HISTORY_FILE
    rows = [r for r in read_csv(path) if r["assignment"] != assignment]
    for student, stamps in sorted(times.items()):
        graded = _graded_timestamp(course_dir, student, assignment)
        for stamp in stamps:
            rows.append({"student_id": student, "assignment": assignment, "submitted_at": stamp,
                         "graded": "yes" if stamp == graded else "no"})
    _write_csv(path, ["student_id", "assignment", "submitted_at", "graded"], rows)
    return path


def _graded_timestamp(course_dir: Path, student: str, assignment: str) -> str:
    from nbgrader.utils import parse_utc
    stamp = Path(course_dir) / "submitted" / student / assignment / "timestamp.txt"
    return str(parse_utc(stamp.read_text().strip())) if stamp.is_file() else ""


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def collect(course_dir: Path, assignment: str) -> list[Path]:
    """nbgrader collect --update (the latest submission replaces an earlier one; only what belongs to
    who it names, engine/course/classroom/inbound.py), the history recorded; the collected notebooks."""
    from engine.course.authoring.nbgrader_course import run_nbgrader
    from engine.course.authoring.nbgrader_course import NbgraderError
    try:
        run_nbgrader(course_dir, "collect", "--update", assignment)
    except NbgraderError as error:
        said = [line.split("] ", 1)[-1] for line in str(error).splitlines() if "CRITICAL" in line or "ERROR]" in line]
        raise SystemExit(f"grade: nbgrader collect {assignment} failed: {said[0] if said else error}") from None
    record_history(course_dir, assignment, submission_times(course_dir, assignment))
    return sorted((Path(course_dir) / "submitted").glob(f"*/{assignment}/*.ipynb"))


NOT_COLLECTED = "not-collected.csv"


def not_collected(course_dir: Path, assignment: str) -> list[str]:
    """What collect refused in inbound/, one line each (who it names, who owns it, why), also written to
    course/not-collected.csv (every chapter's, the latest round of each)."""
    path = Path(course_dir) / NOT_COLLECTED
    refused = inbound_entries(course_dir, assignment)[1]
    rows = [r for r in read_csv(path) if r["assignment"] != assignment]
    rows += [{"assignment": assignment, "inbound": e.name, "names": e.student, "owner": e.owner, "why": e.why}
             for e in refused]
    if rows:
        _write_csv(path, ["assignment", "inbound", "names", "owner", "why"], rows)
    return [entry.line() for entry in refused]


def set_aside(course_dir: Path, notebooks: list[Path], chapters: list[Path]) -> tuple[list[Path], list]:
    """(the notebooks nbgrader can grade, a Fault for each it cannot): a notebook of another chapter is
    named as such, an unreadable one says why; both move to course/not-graded/."""
    from engine.course.grading.autograde import Fault, notebook_fault
    from engine.course.classroom.reports import wrong_chapter
    gradable, faults = [], []
    for path in notebooks:
        student, assignment = path.parent.parent.name, path.parent.name
        why = wrong_chapter(path, assignment, chapters) or notebook_fault(path)
        if not why:
            gradable.append(path)
            continue
        faults.append(Fault(student, path.name, why, assignment))
        aside = Path(course_dir) / "not-graded" / student / assignment
        shutil.rmtree(aside, ignore_errors=True)
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path.parent), str(aside))
    return gradable, faults


def not_graded_page(course_dir: Path, fault) -> Path | None:
    """A feedback page for a submission set aside (course/not-graded/), so the student is told which
    notebook was handed in and why it earned nothing (reports.annotate_feedback adds the notes); it is
    released with the others (nbgrader's release_feedback needs the submission's timestamp and secret)."""
    import html
    aside = Path(course_dir) / "not-graded" / fault.student / fault.assignment
    notebook = aside / fault.entry
    if not (aside / "submission_secret.txt").is_file() or notebook.suffix != ".ipynb":
        return None
    folder = Path(course_dir) / "feedback" / fault.student / fault.assignment
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("timestamp.txt", "submission_secret.txt"):
        shutil.copyfile(aside / name, folder / name)
    page = folder / f"{notebook.stem}.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(notebook.name)}"
                    f"</title></head><body><h1>{html.escape(fault.assignment)}: {html.escape(notebook.name)} was "
                    f"not graded (0 points)</h1><p>{html.escape(fault.reason)}.</p><p>Submit the chapter's own "
                    "notebook again before the due date to be graded.</p></body></html>\n")
    return page


def grade(course_dir: Path, assignment: str, jobs: int = 2, sandbox: str = "required", release: bool = False,
          progress=print) -> dict[str, Path]:
    """The instructor's round for one chapter after the students submitted: {what: where}."""
    from engine.course.classroom import export, reports
    from engine.course.grading.autograde import grade_submissions, run_tolerant
    from engine.course.authoring.nbgrader_course import AUTOGRADE_CELL_TIMEOUT, NbgraderError, run_nbgrader
    course_dir = Path(course_dir).resolve()
    roster = read_roster(course_dir / "roster.ini")
    solutions = Path(_config_value(course_dir, "SealedExecute", "solutions") or repo_root() / "solutions")
    chapters = roster_chapters(roster, solutions)
    chapter = [path for path in chapters if assignment_id(path) == assignment]
    if not chapter:
        raise SystemExit(f"grade: {assignment} is not a chapter of the roster (have {', '.join(roster.due)})")
    steps = {}
    started = time.monotonic()
    collected = collect(course_dir, assignment)
    refused = not_collected(course_dir, assignment)
    for line in refused:
        progress(f"not collected: {line}")
    steps["collect"] = time.monotonic() - started
    gradable, faults = set_aside(course_dir, collected, chapter_files(solutions))
    record_history(course_dir, assignment, submission_times(course_dir, assignment))   # set aside: graded=no
    for fault in faults:
        progress(f"not graded: {fault.line()}")
    started = time.monotonic()
    grade_submissions(gradable, course_dir, chapter, AUTOGRADE_CELL_TIMEOUT, jobs, sandbox,
                      [exchange_root(course_dir), *course_sources()], progress)
    steps["sealed runs"] = time.monotonic() - started
    started = time.monotonic()
    failed = run_tolerant(course_dir, "autograde", assignment, "--create") if gradable else {}
    for (_, student), why in failed.items():
        faults.append(_fault(student, assignment, why))
    steps["nbgrader autograde"] = time.monotonic() - started
    started = time.monotonic()
    if gradable:
        run_tolerant(course_dir, "generate_feedback", assignment)
    reports.record_faults(course_dir, assignment, faults)
    for fault in faults:
        not_graded_page(course_dir, fault)
    outputs = reports.write_all(course_dir, roster, chapters, faults)
    outputs["export"] = export.write(course_dir, roster, chapters, faults)
    steps["feedback and reports"] = time.monotonic() - started
    if refused:
        outputs["refused in inbound"] = Path(course_dir) / NOT_COLLECTED
    if release:
        started = time.monotonic()
        try:
            run_nbgrader(course_dir, "release_feedback", assignment)
        except NbgraderError as error:   # the feedback made is kept; the instructor sees why in one place
            log = Path(course_dir) / "logs" / "release_feedback.log"
            log.write_text(str(error))
            progress(f"release_feedback {assignment} failed: see {log}")
        steps["release_feedback"] = time.monotonic() - started
    progress("steps: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in steps.items()))
    return outputs


def course_sources() -> list[Path]:
    """The course's full engine and tests, kept from the sandbox where they lie inside what it binds (a
    hub install, whose Python environment holds src/: an instructor's sandbox could read them by group);
    the grader's host gets its own engine (engine.course.authoring.edition.host_engine)."""
    return [repo_root() / "engine", repo_root() / "tests"]


def _fault(student: str, assignment: str, why: str):
    from engine.course.grading.autograde import Fault
    return Fault(student, assignment, why, assignment)


def _config_value(course_dir: Path, section: str, name: str, kind: type = str):
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course_dir)).load_config()
    value = config.get(section, {}).get(name)
    return value if isinstance(value, kind) else None


def main(argv: list[str] | None = None) -> int:
    """`prepare` the course folder from a roster, or `grade` one chapter after the students submitted."""
    from engine.tools import cli_args
    parser = cli_args.Parser(prog="python -m engine.course.classroom.class_folder", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("prepare", help="the course folder and gradebook from a roster, no submission")
    first.add_argument("--roster", type=Path, help="the roster file (see --help above; default: the course "
                       "folder's roster.ini, where make hub-accounts puts the class's one roster)")
    first.add_argument("--solutions", type=Path, default=repo_root() / "solutions")
    first.add_argument("--exchange", default=None, help="nbgrader's exchange folder (default: the site's, "
                       f"else {DEFAULT_EXCHANGE})")
    first.add_argument("--sandbox", choices=("required", "auto", "off"), default="required")
    for sub in (first, commands.add_parser("grade", help="collect, grade, feedback and reports for a chapter")):
        sub.add_argument("--course", type=Path, default=repo_root() / "course", help="the course folder")
    second = commands.choices["grade"]
    second.add_argument("assignment", help="the chapter, chNN")
    second.add_argument("--jobs", type=cli_args.int_in(1, 256), default=2, help="submissions graded at once")
    second.add_argument("--sandbox", choices=("required", "auto", "off"), default="required")
    second.add_argument("--release", action="store_true", help="release the feedback to the students too")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        args.roster = args.roster or args.course / "roster.ini"
        if not args.roster.is_file():
            parser.error(f"--roster {args.roster} is not a file (copy engine/course/classroom/hub/roster.example.ini)")
        outputs = prepare(args.course, args.roster, args.solutions, args.exchange, args.sandbox)
        print("\n".join(describe(read_roster(args.roster), outputs["course directory"])))
    else:
        if not (args.course / "roster.ini").is_file():
            parser.error(f"--course {args.course} has no roster.ini: run make course ROSTER=... first")
        outputs = grade(args.course, args.assignment, args.jobs, args.sandbox, args.release)
    for what, where in outputs.items():
        print(f"{what + ':':28} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
