"""An nbgrader course directory, driven through nbgrader's own command line (run from the venv).

Both `make release` (a scratch course in build/) and `make autograde` (./course/) use one: the chapter
notebooks go into source/<chNN>/<chNN_topic>.ipynb, and nbgrader does the rest.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, List, Unicode

from . import cells
from .paths import assignment_id, chapter_name, offline_cpu_environ, repo_root
from .source import load_chapter

COURSE_ID = "paged-kv-course"
# nbgrader's default per-cell timeout is 30 s; a test cell running Triton kernels in the interpreter
# on a CPU can take minutes.
AUTOGRADE_CELL_TIMEOUT = 600

CONFIG_TEMPLATE = '''"""nbgrader configuration, written by engine/course/nbgrader_course.py (rewritten on each run)."""
c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
# Test cells running Triton kernels in the CPU interpreter are slow: raise nbgrader's 30 s default.
c.Execute.timeout = {timeout}
# The course's kernel: the venv's python3 (nbgrader runs with the venv's bin first on PATH).
c.Execute.kernel_name = "python3"
c.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:"]
# Autograde runs each submission in the course's sealed worker (engine/course/sealed/host.py), sandboxed with
# bubblewrap (engine/course/sandbox.py), instead of nbgrader's Execute: learner code cannot forge a score.
c.Autograde.autograde_preprocessors = {preprocessors!r}
c.SealedExecute.solutions = {solutions!r}
c.SealedExecute.timeout = {timeout}
c.SealedExecute.sandbox = {sandbox!r}
c.SealedExecute.work_root = {work_root!r}
c.SealedExecute.hide = {hide!r}
'''
AUTOGRADE_PREPROCESSORS = [
    "engine.course.nbgrader_course.SealedExecute",
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
                 sandbox: str = "auto", hide: list[Path] = (), extra: str = "") -> Path:
    """Write course_dir/nbgrader_config.py (the course id, its root, the per-cell timeout, the sealed and
    sandboxed autograde: `sandbox` is auto (bubblewrap when it works here), required, or off)."""
    course_dir.mkdir(parents=True, exist_ok=True)
    root = course_dir.resolve()
    config = course_dir / "nbgrader_config.py"
    config.write_text(CONFIG_TEMPLATE.format(
        course_id=COURSE_ID, root=str(root), timeout=timeout, preprocessors=AUTOGRADE_PREPROCESSORS,
        solutions=str(Path(solutions or repo_root() / "solutions").resolve()), sandbox=sandbox,
        work_root=str(root / "sandbox"), hide=[str(Path(p).resolve()) for p in hide]) + extra)
    return config


class SealedExecute(NbGraderPreprocessor):
    """nbgrader's Execute, replaced: the notebook runs in the sealed worker, sandboxed, and each graded
    test cell gets the outputs of its signed verdict (an error output when it failed), which nbgrader's
    SaveAutoGrades then scores as usual. Flags for the instructor go to work_root/flags/."""

    solutions = Unicode("", help="folder of the chapter sources (chNN_topic.py)").tag(config=True)
    timeout = Integer(AUTOGRADE_CELL_TIMEOUT, help="seconds per cell").tag(config=True)
    sandbox = Unicode("auto", help="auto | required | off").tag(config=True)
    work_root = Unicode("", help="where each submission's working folder goes").tag(config=True)
    hide = List(Unicode(), help="folders a submission may not see (other students' work)").tag(config=True)

    def preprocess(self, nb, resources):
        from .grade import run_sealed
        from .sandbox import Sandbox, available
        info = resources.get("nbgrader", {})
        student, assignment, notebook = info.get("student", "student"), info.get("assignment", "x"), \
            info.get("notebook") or resources.get("unique_key", "notebook")
        chapter = Path(self.solutions) / f"{notebook}.py"
        work_root = Path(self.work_root or Path.cwd() / "sandbox")
        workdir = work_root / "work" / student / assignment
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True, exist_ok=True)
        wrap, flags = None, []
        usable, why = available()
        if self.sandbox == "required" and not usable:
            raise RuntimeError(f"autograde needs the sandbox: {why}")
        if self.sandbox != "off" and usable:
            hide = [Path(p) for p in self.hide] + [Path(self.solutions), work_root.parent]
            wrap = Sandbox(workdir, hide=hide)
        elif self.sandbox != "off":
            flags.append(f"not sandboxed: {why}")
            self.log.warning("SANDBOX ABSENT: %s", why)
        submitted = work_root.parent / "submitted" / student / assignment / f"{notebook}.ipynb"
        cached = cached_result(work_root, student, assignment, submitted)
        if cached is not None and wrap is not None:
            wrap.close()  # make autograde ran this submission ahead, sandboxed: nothing to run here
        if cached is None:
            try:
                sealed = run_sealed(nb, chapter, self.timeout, workdir, wrap=wrap)
                outputs = outputs_by_cell(sealed.cells)
                found, changes = flags + sealed.flags, sealed.changes
            except Exception as error:  # the grader itself failed: every test scores 0, and says why
                self.log.error("sealed run of %s/%s failed: %s", student, notebook, error)
                outputs, found, changes = {}, flags + [f"grading failed: {type(error).__name__}: {error}"], []
            finally:
                if wrap is not None:
                    wrap.close()
        else:
            outputs, found, changes = cached["outputs"], cached["flags"], cached["changes"]
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            ran = outputs.get(_cell_key(cell))
            cell.outputs = [nbformat.from_dict(o) for o in ran] if ran is not None else []
            if cells.is_test(cell) and ran is None:
                cell.outputs = [nbformat.v4.new_output("error", ename="NotRun", evalue="this test did not run",
                                                       traceback=["NotRun: this test did not run"])]
        record = work_root / "flags" / student / f"{assignment}.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"notebook": notebook, "flags": found, "changes": changes}, indent=1))
        return nb, resources


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


def cached_result(work_root: Path, student: str, assignment: str, submitted: Path) -> dict | None:
    """A sealed run made ahead of nbgrader (make autograde runs submissions in parallel) for exactly
    this submitted file, else None."""
    path = result_path(work_root, student, assignment)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if record.get("sha256") and record["sha256"] == file_digest(submitted) else None


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
