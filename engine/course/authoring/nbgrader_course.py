"""An nbgrader course directory, driven through nbgrader's own command line (run from the venv).

Both `make release` (a scratch course in build/) and `make autograde` (./course/) use one: the chapter
notebooks go into source/<chNN>/<chNN_topic>.ipynb, and nbgrader does the rest.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat

from engine.course import cells
from engine.course.paths import assignment_id, chapter_name, offline_cpu_environ, repo_root
from engine.course.authoring.source import load_chapter

COURSE_ID = "paged-kv-course"
# nbgrader's default per-cell timeout is 30 s; a test cell running Triton kernels in the interpreter
# on a CPU can take minutes.
AUTOGRADE_CELL_TIMEOUT = 600

CONFIG_TEMPLATE = '''"""nbgrader configuration, written by engine/course/authoring/nbgrader_course.py (rewritten on
each run)."""
c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
# Test cells running Triton kernels in the CPU interpreter are slow: raise nbgrader's 30 s default.
c.Execute.timeout = {timeout}
# The course's kernel: the venv's python3 (nbgrader runs with the venv's bin first on PATH).
c.Execute.kernel_name = "python3"
c.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:"]
# Autograde runs each submission in the course's sealed worker (engine/course/grading/sealed/host.py), sandboxed with
# bubblewrap (engine/course/grading/sandbox.py), instead of nbgrader's Execute: learner code cannot forge a score.
c.Autograde.autograde_preprocessors = {preprocessors!r}
c.SealedExecute.solutions = {solutions!r}
c.SealedExecute.timeout = {timeout}
c.SealedExecute.sandbox = {sandbox!r}
c.SealedExecute.work_root = {work_root!r}
c.SealedExecute.hide = {hide!r}
'''
AUTOGRADE_PREPROCESSORS = [
    "engine.course.grading.autograde_step.SealedExecute",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]


class NbgraderError(RuntimeError):
    """nbgrader exited with an error; the message carries its log."""


def write_config(course_dir: Path, timeout: int = AUTOGRADE_CELL_TIMEOUT, solutions: Path | None = None,
                 sandbox: str = "required", hide: list[Path] = (), extra: str = "") -> Path:
    """Write course_dir/nbgrader_config.py (the course id, its root, the per-cell timeout, the sealed and
    sandboxed autograde: `sandbox` is required (refuse without bubblewrap), auto (bubblewrap when it works
    here) or off)."""
    course_dir.mkdir(parents=True, exist_ok=True)
    root = course_dir.resolve()
    config = course_dir / "nbgrader_config.py"
    config.write_text(CONFIG_TEMPLATE.format(
        course_id=COURSE_ID, root=str(root), timeout=timeout, preprocessors=AUTOGRADE_PREPROCESSORS,
        solutions=str(Path(solutions or repo_root() / "solutions").resolve()), sandbox=sandbox,
        work_root=str(root / "sandbox"), hide=[str(Path(p).resolve()) for p in hide]) + extra)
    return config


def _cell_key(cell) -> str:
    return f"grade:{cells.grade_id(cell)}" if cells.grade_id(cell) else f"id:{cell.get('id')}"


def outputs_by_cell(run_cells) -> dict[str, list]:
    """{cell key: outputs} of a sealed run (chapter cells by grade id, the learner's own by cell id)."""
    return {_cell_key(cell): [dict(o) for o in cell.get("outputs", [])] for cell in run_cells
            if cell.cell_type == "code"}


def result_path(work_root: Path, student: str, assignment: str) -> Path:
    return Path(work_root) / "results" / student / f"{assignment}.json"


def file_digest(path: Path) -> str:
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if Path(path).is_file() else ""


KEY_FILE = Path("instructor") / "result-key"


def result_key(course_dir: Path, create: bool = False) -> bytes | None:
    """The course's key for result records: course/instructor/result-key (folder 0700, file 0600), in the
    course folder that no sandbox sees; made on first use when `create`, else None where there is none."""
    import os
    import secrets
    path = Path(course_dir) / KEY_FILE
    if not path.is_file():
        if not create:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        try:
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:        # another grader of this course made it first
            return path.read_bytes()
        with os.fdopen(handle, "wb") as out:
            out.write(secrets.token_bytes(32))
    return path.read_bytes()


def record_mac(key: bytes, student: str, assignment: str, sha256: str, result: dict) -> str:
    """HMAC-SHA256 over (student, chapter, notebook sha256, result): a record names what it is for."""
    import hashlib
    import hmac
    text = json.dumps([student, assignment, sha256, result], sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def write_result(work_root: Path, student: str, assignment: str, sha256: str, result: dict, key: bytes) -> Path:
    """Write the authenticated record of one sealed run (only the grader that holds the course folder does)."""
    record = {"student": student, "assignment": assignment, "sha256": sha256, "result": result,
              "mac": record_mac(key, student, assignment, sha256, result)}
    path = result_path(work_root, student, assignment)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(record))
    partial.replace(path)
    return path


def cached_result(work_root: Path, student: str, assignment: str, submitted: Path,
                  grader: dict | None = None) -> dict | None:
    """The sealed result made ahead of nbgrader (make autograde grades submissions in parallel) for exactly
    this submitted file, else None: the record must carry the course key's HMAC and name this student,
    this chapter and this notebook's sha256 (and, when given, these grader settings). Anything else
    (rewritten, moved from another student, for another notebook, unsigned) is refused: it is graded again."""
    import hmac
    path = result_path(work_root, student, assignment)
    key = result_key(Path(work_root).parent)
    if key is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        result, mac = record["result"], record["mac"]
        named = (record["student"], record["assignment"], record["sha256"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(result, dict) or not isinstance(mac, str) or not all(isinstance(n, str) for n in named):
        return None
    if named != (student, assignment, file_digest(submitted)) or not named[2]:
        return None
    if not hmac.compare_digest(mac, record_mac(key, *named, result)):
        return None
    if grader is not None and result.get("grader") != grader:
        return None
    return result


def stage_sources(course_dir: Path, chapters: list[Path]) -> dict[str, Path]:
    """Write each chapter, expanded, to source/<chNN>/<chNN_topic>.ipynb; {chapter name: that path}."""
    staged = {}
    for chapter in chapters:
        target = course_dir / "source" / assignment_id(chapter) / f"{chapter_name(chapter)}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(load_chapter(chapter), target)
        staged[chapter_name(chapter)] = target
    return staged


def run_nbgrader(course_dir: Path, *args: str) -> str:
    """Run `nbgrader ARGS` in course_dir with the venv's bin first on PATH; its log, or NbgraderError."""
    command = [sys.executable, "-m", "nbgrader", *args]
    result = subprocess.run(command, cwd=course_dir, env=offline_cpu_environ(),
                            capture_output=True, text=True)
    log = result.stdout + result.stderr
    if result.returncode != 0 or "[ERROR]" in log:
        raise NbgraderError(f"nbgrader {' '.join(args)} failed (exit {result.returncode}) in {course_dir}:\n{log}")
    return log
