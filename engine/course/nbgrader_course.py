"""An nbgrader course directory, driven through nbgrader's own command line (run from the venv).

Both `make release` (a scratch course in build/) and `make autograde` (./course/) use one: the chapter
notebooks go into source/<chNN>/<chNN_topic>.ipynb, and nbgrader does the rest.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

from .paths import assignment_id, chapter_name, offline_cpu_environ
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
'''


class NbgraderError(RuntimeError):
    """nbgrader exited with an error; the message carries its log."""


def write_config(course_dir: Path, timeout: int = AUTOGRADE_CELL_TIMEOUT) -> Path:
    """Write course_dir/nbgrader_config.py (the course id, its root, the per-cell timeout)."""
    course_dir.mkdir(parents=True, exist_ok=True)
    config = course_dir / "nbgrader_config.py"
    config.write_text(CONFIG_TEMPLATE.format(course_id=COURSE_ID, root=str(course_dir.resolve()), timeout=timeout))
    return config


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
