"""`make grade [DIR=notebooks]`: run each learner notebook offline on the CPU and score its tests.

The scoring is nbgrader's: every graded test cell's source is restored from the chapter (hidden tests
included, so an edited test cannot change the score), the cell earns its points when it runs without an
error or stderr output (`nbgrader.utils.determine_grade`), and written answers are left to the
instructor. A syntax error, an endless loop or a crashed kernel costs only the points it touches: the
kernel is interrupted or restarted, the cells that had run cleanly are replayed, and grading goes on.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbgrader.utils import determine_grade

from engine.course import cells

from engine.course.authoring import exercises
from engine.course.grading.kernel import SealedKernel
from engine.course.paths import chapter_files, chapter_name, offline_cpu_environ, repo_root, solutions_refusal

TIMEOUT_ENV = "GRADE_CELL_TIMEOUT"
DEFAULT_TIMEOUT_S = 60
DEFAULT_JOBS = 2
TABLE_WIDTH = 120          # the table's width when the terminal's is unknown (a pipe, a file)
MIN_MESSAGE_WIDTH = 48     # the message column never wraps narrower than this


@dataclass
class Exercise:
    """One graded cell's result. earned is None for a cell graded by hand."""

    grade_id: str
    possible: float
    earned: float | None
    kind: str  # "test" or "manual"
    message: str = ""


@dataclass
class ChapterGrade:
    """A chapter's exercises, and how long running it took."""

    chapter: str
    notebook: str
    exercises: list[Exercise] = field(default_factory=list)
    seconds: float = 0.0
    flags: list[str] = field(default_factory=list)     # for the instructor: own work, copies
    changes: list[str] = field(default_factory=list)   # where the notebook could not be graded as written

    @property
    def earned(self) -> float:
        return sum(e.earned or 0 for e in self.exercises if e.kind == "test")

    @property
    def possible(self) -> float:
        return sum(e.possible for e in self.exercises if e.kind == "test")

    @property
    def manual(self) -> float:
        """Points of the written answers, graded by hand."""
        return sum(e.possible for e in self.exercises if e.kind == "manual")


def cells_to_run(learner, chapter, changes: list[str] | None = None) -> list:
    """The learner's cells, with every locked cell (tests included) as the chapter has it.

    Only the chapter's graded cells can earn points: a cell the learner added keeps its code but loses
    any nbgrader metadata, and a copy of a chapter cell runs once. Locked code cells the learner deleted
    (tests, and the setup cells that define what later cells use) are put back after the cell that
    preceded them in the chapter, so they run and score instead of vanishing; `changes` (if given)
    receives a line saying what was put back and which solution cells are missing.
    """
    by_id = {cells.grade_id(c): c for c in chapter.cells if cells.grade_id(c)}
    result, placed = [], set()
    for cell in learner.cells:
        grade_id = cells.grade_id(cell)
        original = by_id.get(grade_id)
        if original is None:
            own = nbformat.from_dict(dict(cell))
            own.metadata.pop("nbgrader", None)  # the learner's own cell: worth nothing
            result.append(own)
        elif grade_id in placed:
            continue  # a copy of a chapter cell
        elif cells.is_locked(original) or cells.is_test(original):
            result.append(_fresh(original))
        else:
            restored = nbformat.from_dict(dict(cell))  # the learner's answer, the chapter's metadata
            checksum = {k: v for k, v in cells.meta(cell).items() if k == "checksum"}
            restored.metadata["nbgrader"] = dict(cells.meta(original), **checksum)
            result.append(restored)
        placed.add(grade_id)
    nothing_placed = not placed
    put_back, front = [], 0
    for index, original in enumerate(chapter.cells):
        grade_id = cells.grade_id(original)
        if grade_id in placed or original.cell_type != "code" or not (
                cells.is_locked(original) or cells.is_test(original)):
            continue
        if nothing_placed and not cells.is_test(original):
            at, front = front, front + 1  # no chapter cell survived: setup first, tests after the learner's
        elif nothing_placed:
            at = len(result)
        else:
            earlier = {cells.grade_id(c) for c in chapter.cells[:index]}
            later = {cells.grade_id(c) for c in chapter.cells[index + 1:]}
            at = max((i + 1 for i, c in enumerate(result) if cells.grade_id(c) in earlier), default=None)
            if at is None:
                at = min((i for i, c in enumerate(result) if cells.grade_id(c) in later), default=len(result))
        result.insert(at, _fresh(original))
        placed.add(grade_id)
        put_back.append(grade_id)
    missing = [cells.grade_id(c) for c in chapter.cells
               if cells.is_solution(c) and c.cell_type == "code" and cells.grade_id(c) not in placed]
    if changes is not None and (put_back or missing):
        parts = []
        if put_back:
            parts.append(f"{len(put_back)} locked cell(s) were missing and were put back from the chapter "
                         f"({', '.join(put_back[:6])}{', ...' if len(put_back) > 6 else ''})")
        if missing:
            parts.append(f"solution cell(s) {', '.join(missing)} are missing, so their tests find nothing of yours")
        changes.append("the notebook's cells were changed: " + "; ".join(parts))
    return result


def _fresh(original):
    """A copy of a chapter cell, with no outputs."""
    cell = nbformat.from_dict(dict(original))
    if cell.cell_type == "code":
        cell.outputs = []
    return cell


def cell_kind(cell) -> str:
    """How the sealed worker treats a cell: a graded test, the chapter's own code, or the learner's."""
    if cells.is_test(cell):
        return "test"
    if cells.is_locked(cell) and not cells.is_solution(cell) and cells.grade_id(cell):
        return "trusted"
    return "learner"


@dataclass
class SealedRun:
    """The cells as run, with their outputs, and what the run found."""

    cells: list
    failed_above: dict
    flags: list[str]
    changes: list[str]


def run_sealed(learner, chapter_path: Path, timeout: float, cwd: Path, chapter=None, wrap=None,
               env: dict | None = None) -> SealedRun:
    """Run a learner notebook in the sealed worker (engine.course.grading.sealed.host): each cell's outputs set, each
    graded test's verdict signed; the flags (own work, copies) for the instructor."""
    chapter = chapter if chapter is not None else exercises.load_any(chapter_path)
    plan = exercises.plan_for(chapter_path, chapter)
    changes: list[str] = []
    to_run = cells_to_run(learner, chapter, changes)
    ran_cleanly: list = []  # cells to replay after a restart, so later exercises have their definitions
    failed_above: dict[int, str] = {}  # cell index -> the failing solution cell above it, if any
    latest_failure = ""
    flags: list[str] = []
    environ = env if env is not None else offline_cpu_environ({"COURSE_EXPLORERS": "static", "MPLBACKEND": "Agg"})
    from engine.course.grading.reading.names import needed_cells
    worker_plan = dict(plan.for_worker(), judge_cells=sorted(needed_cells(
        [(cell_kind(c), cells.grade_id(c), c.source) for c in to_run if c.cell_type == "code"])))
    from engine.course.authoring.edition import host_engine
    home = host_engine(chapter_path)
    names = cell_names(to_run)
    with SealedKernel(worker_plan, cwd=cwd, env=environ, wrap=wrap, host_home=home and str(home)) as kernel:
        for index, cell in enumerate(to_run):
            if cell.cell_type != "code":
                continue
            kind = cell_kind(cell)
            run = kernel.run_cell(cell.source, kind, names[id(cell)], timeout)
            cell.outputs = run.outputs
            _flag(flags, cell, run)
            if not run.usable:
                _restart(kernel, ran_cleanly, timeout, names)
            if run.status == "ok" and kind != "test":
                ran_cleanly.append(cell)
            if cells.is_solution(cell):
                latest_failure = "" if run.status == "ok" else f"{cells.grade_id(cell)}: {first_failure(cell)}"
            failed_above[index] = latest_failure
        # A check that could not serve a later exercise of the chapter yet (the notebook had not
        # defined it) runs again once every cell has run: that run decides its points.
        for cell in to_run:
            if cell.cell_type == "code" and cell_kind(cell) == "test" and _not_checked_yet(cell):
                run = kernel.run_cell(cell.source, "test", cells.grade_id(cell), timeout, last=True)
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=AGAIN)] + run.outputs
                _flag(flags, cell, run)
                if not run.usable:
                    _restart(kernel, ran_cleanly, timeout, names)
        if kernel.tampered_channel:
            flags.append("the notebook's code wrote to the grader's result channel")
    learner_code = {cells.grade_id(c): c.source for c in to_run if cells.is_solution(c) and c.cell_type == "code"}
    flags += exercises.own_work_flags(plan, learner_code)
    return SealedRun(to_run, failed_above, flags, changes)


AGAIN = "(run again after the last cell, with every exercise this notebook writes written)\n"


def _not_checked_yet(cell) -> bool:
    return any("(not checked yet:" in str(o.get("text", "")) for o in cell.outputs if o.get("output_type") == "stream")


def _flag(flags: list[str], cell, run) -> None:
    """The instructor's flags from a test's verdict (own work, a typed-in reference)."""
    verdict = getattr(run, "verdict", {}) or {}
    if verdict.get("reasons"):
        flags.append(f"{cells.grade_id(cell)}: refused: {verdict['reasons'][0]}")
    if verdict.get("copied"):
        flags.append(f"{cells.grade_id(cell)}: typed in, the reference's code (copied, renamed or reformatted): "
                     + "; ".join(verdict["copied"][:3]))


def _restart(kernel, ran_cleanly: list, timeout: float, names: dict) -> None:
    """A fresh host and judge, with the cells that ran cleanly run again (later cells need them)."""
    kernel.restart()
    for earlier in ran_cleanly:
        kernel.run_cell(earlier.source, cell_kind(earlier), names[id(earlier)], timeout)


def cell_names(notebook_cells: list) -> dict:
    """{id(cell): its name in the grader's messages}: a graded cell's id, else the cell as the learner sees
    it, by the heading above it, its place under that heading and its first line ("the 2nd code cell under
    '3.2 Reserve' (x = cache.tables)")."""
    names, heading, count = {}, "the notebook's start", 0
    for cell in notebook_cells:
        if cell.cell_type == "markdown":
            title = next((line.lstrip("#").strip() for line in cell.source.splitlines() if line.startswith("#")), "")
            if title:
                heading, count = f"'{title[:48]}'", 0
            continue
        if cell.cell_type != "code":
            continue
        count += 1
        first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "empty")
        names[id(cell)] = cells.grade_id(cell) or (
            f"the {_ordinal(count)} code cell under {heading} ({first[:40]}{'...' if len(first) > 40 else ''})")
    return names


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def read_learner(notebook_path: Path) -> tuple[nbformat.NotebookNode, list[str]]:
    """The learner's notebook as nbformat 4, and a note when it had to be converted."""
    raw = json.loads(Path(notebook_path).read_text())
    version = raw.get("nbformat") if isinstance(raw, dict) else None
    notebook = nbformat.read(notebook_path, as_version=4)
    notes = []
    if version != 4:
        notes.append(f"the notebook's cells were changed: it was saved as nbformat {version} and was "
                     "converted to nbformat 4 (cells may have lost their nbgrader ids)")
    return notebook, notes


def grade_notebook(notebook_path: Path, chapter_path: Path, timeout: float, wrap=None,
                   workdir: Path | None = None) -> ChapterGrade:
    """Run one learner notebook against its chapter source; the score of each graded cell."""
    started = time.monotonic()
    chapter = exercises.load_any(chapter_path)
    try:
        learner, notes = read_learner(notebook_path)
    except Exception as error:  # not JSON, not a notebook: every exercise scores 0, grading goes on
        return _unreadable(notebook_path, chapter_path, chapter, error)
    cwd = workdir or notebook_path.parent.resolve()
    sealed = run_sealed(learner, chapter_path, timeout, cwd, chapter=chapter, wrap=wrap)
    result = ChapterGrade(chapter_name(chapter_path), str(notebook_path))
    result.flags, result.changes = sealed.flags, notes + sealed.changes
    for index, cell in enumerate(sealed.cells):
        if cells.is_graded(cell):
            result.exercises.append(_score(cell, sealed.failed_above.get(index, "")))
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _unreadable(notebook_path: Path, chapter_path: Path, chapter, error: Exception) -> ChapterGrade:
    """A notebook that cannot be read: its tests at 0, its written answers unanswered, saying why."""
    message = f"could not read the notebook: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    result = ChapterGrade(chapter_name(chapter_path), str(notebook_path))
    for cell in chapter.cells:
        if cells.is_graded(cell):
            kind = "manual" if cells.is_manual(cell) else "test"
            result.exercises.append(Exercise(cells.grade_id(cell), cells.points(cell),
                                             None if kind == "manual" else 0.0, kind, message))
    return result


def _score(cell, failed_above: str) -> Exercise:
    """nbgrader's score for one graded cell, with the whole message of what went wrong (and the failing
    solution cell above it, the likely cause)."""
    earned, possible = determine_grade(cell)
    if cells.is_manual(cell):
        answered = earned is None
        return Exercise(cells.grade_id(cell), possible, None, "manual",
                        "answered: graded by hand" if answered else "not answered")
    message = "" if earned == possible else first_failure(cell)
    if message and failed_above:
        message += f" (after {failed_above})"
    return Exercise(cells.grade_id(cell), possible, earned, "test", message)


def first_failure(cell) -> str:
    """What went wrong in the cell, whole: its error as `Name: message` (a check's message is what it
    did, what it expected, what it got and a hint, and the hint is at the end), or the first line it
    wrote to stderr. Line breaks become spaces, so the table can wrap the message as it likes."""
    for output in cell.get("outputs", []):
        if output.output_type == "error":
            text = f"{output.ename}: {output.evalue}".strip().rstrip(":")
        elif output.output_type == "stream" and output.name == "stderr":
            lines = [line for line in "".join(output.text).splitlines() if line.strip()]
            text = "wrote to stderr: " + (lines[0].strip() if lines else "")
        else:
            continue
        return " ".join(text.split())
    return ""


SELF_ASSESSMENT = ("note: no sandbox here ({why}): the notebooks' code could read the course's reference, "
                   "so these scores are self-assessment, not grades to give credit for")


def sandboxed_grade(notebook: Path, chapter: Path, timeout: float) -> ChapterGrade:
    """grade_notebook with the host in the autograder's sandbox (engine.course.grading.sandbox): it sees the
    system, the Python installation and its own copy of its engine, not the repository."""
    import tempfile

    from engine.course.grading.sandbox import Sandbox
    with tempfile.TemporaryDirectory(prefix="paged-kv-grade-") as workdir:
        wrap = Sandbox(Path(workdir))
        try:
            return grade_notebook(notebook, chapter, timeout, wrap=wrap, workdir=Path(workdir))
        finally:
            wrap.close()


def grade_directory(notebook_dir: Path, solutions_dir: Path, timeout: float,
                    jobs: int = DEFAULT_JOBS, sandbox: bool = False) -> tuple[list[ChapterGrade], list[str]]:
    """Grade every notebook in notebook_dir named after a chapter, `jobs` kernels at a time (each host
    in the sandbox when `sandbox`); (grades in chapter order, notes about skipped files)."""
    chapters = {chapter_name(path): path for path in chapter_files(solutions_dir)}
    notes, work = [], []
    for notebook in sorted(notebook_dir.glob("*.ipynb")):
        if notebook.stem in chapters:
            work.append((notebook, chapters[notebook.stem]))
        else:
            notes.append(f"skipped {notebook.name}: no chapter {notebook.stem}.py in {solutions_dir}")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each chapter has its own kernel process
        grade = sandboxed_grade if sandbox else grade_notebook
        grades = list(pool.map(lambda pair: grade(*pair, timeout), work))
    for name in sorted(set(chapters) - {Path(g.notebook).stem for g in grades}):
        notes.append(f"no notebook for {name} in {notebook_dir}")
    return grades, notes


def format_table(grades: list[ChapterGrade], notes: list[str], width: int | None = None) -> str:
    """The score table: chapter, exercise, points and what went wrong, a subtotal under each chapter,
    then the total. A long message is wrapped, whole, onto indented lines under its row's message
    column; `width` is the table's width (default: the terminal's, else TABLE_WIDTH)."""
    header = ("chapter", "exercise", "points", "message")
    blocks: list[list[tuple[str, str, str, str]]] = []
    for grade in grades:
        rows = []
        for e in grade.exercises:
            score = f"{e.earned:g}/{e.possible:g}" if e.kind == "test" else f"-/{e.possible:g}"
            rows.append((grade.chapter, e.grade_id, score, e.message))
        rows.append((grade.chapter, "subtotal", f"{grade.earned:g}/{grade.possible:g}",
                     f"+{grade.manual:g} graded by hand" if grade.manual else ""))
        blocks.append(rows)
    every = [header] + [row for rows in blocks for row in rows]
    widths = [max(len(row[i]) for row in every) for i in range(3)]
    indent = sum(widths) + 2 * 3
    width = width or shutil.get_terminal_size((TABLE_WIDTH, 24)).columns
    wrap = max(MIN_MESSAGE_WIDTH, width - indent)

    def lines_of(row) -> list[str]:
        left = "  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  "
        parts = textwrap.wrap(row[3], wrap, break_on_hyphens=False) or [""]
        return [(left + parts[0]).rstrip()] + [" " * indent + part for part in parts[1:]]

    rule = "-" * min(width, max(len(line) for row in every for line in lines_of(row)))
    lines = lines_of(header) + [rule]
    for number, rows in enumerate(blocks):
        if number:
            lines.append("")
        for row in rows:
            lines += lines_of(row)
    extra = [f"{g.chapter}: {change}" for g in grades for change in g.changes]
    extra += [f"{g.chapter}: flagged for the instructor: {flag}" for g in grades for flag in g.flags]
    if extra:
        lines.append("")
        lines += [part for line in extra for part in textwrap.wrap(line, max(width, MIN_MESSAGE_WIDTH),
                                                                   subsequent_indent="    ")]
    lines.append(rule)
    earned = sum(g.earned for g in grades)
    possible = sum(g.possible for g in grades)
    manual = sum(g.manual for g in grades)
    lines.append(f"total: {earned:g}/{possible:g} points" + (f" (+{manual:g} graded by hand)" if manual else ""))
    return "\n".join(lines + notes)


def main(argv: list[str] | None = None) -> int:
    """Grade DIR (default notebooks/) and print the table (or --json); exit 0 whatever the score, once at
    least one chapter notebook was graded (chapters without a notebook are noted). Nothing to grade (no
    chapter notebook in DIR, an empty DIR, a --solutions without chapters) is refused in one line, exit 2."""
    root = repo_root()
    from engine.tools import cli_args
    parser = cli_args.Parser(prog="python -m engine.course.grading.grade", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", default=str(root / "notebooks"),
                        help="folder of chNN_topic.ipynb notebooks (default: notebooks/)")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="the chapter sources")
    parser.add_argument("--timeout", type=cli_args.positive_float,
                        default=os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S),
                        help=f"seconds per cell, > 0 (default ${TIMEOUT_ENV} or {DEFAULT_TIMEOUT_S})")
    parser.add_argument("--jobs", type=cli_args.int_in(1, 256), default=DEFAULT_JOBS,
                        help="chapters graded at once (1 to 256)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)            # (argparse checks a default from the environment too)
    started = time.monotonic()
    if not args.dir.strip():
        parser.error("DIR is empty: name the folder of your chNN_topic.ipynb notebooks (make grade DIR=path), "
                     "or leave DIR out for notebooks/")
    args.dir = Path(args.dir)
    if not args.dir.is_dir():
        parser.error(f"{args.dir} is not a folder of notebooks")
    why = solutions_refusal(args.solutions)
    if why:
        parser.error(why)
    chapters = [chapter_name(path) for path in chapter_files(args.solutions)]
    if not any((args.dir / f"{name}.ipynb").exists() for name in chapters):
        parser.error(f"{args.dir} holds no chapter notebook: nothing to grade (expected one of "
                     f"{', '.join(name + '.ipynb' for name in chapters)})")
    from engine.course.grading.sandbox import available
    usable, why = available()
    if not usable:
        print(SELF_ASSESSMENT.format(why=why.split(":")[0]), file=sys.stderr)
    grades, notes = grade_directory(args.dir, args.solutions, args.timeout, args.jobs, sandbox=usable)
    if args.json:
        print(json.dumps({"chapters": [dict(asdict(g), earned=g.earned, possible=g.possible, manual=g.manual)
                                       for g in grades],
                          "earned": sum(g.earned for g in grades),
                          "possible": sum(g.possible for g in grades), "notes": notes}, indent=1))
    else:
        print(format_table(grades, notes))
        print(f"graded {len(grades)} notebook(s) in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
