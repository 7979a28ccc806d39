"""One submission graded where it lands (this machine's pool or a Dask worker): its sealed, sandboxed run.

The same function grades on every machine, so a class gets the same scores on one machine and on a
cluster. On a worker, `grade_task` gets the notebook's bytes and the chapter's text, never the course
folder: it writes both into a private folder (mode 0700, outside the sandbox's view), grades, and
returns the result with an HMAC under the task's own key, which the coordinator made for this task
alone and checks before it writes anything into the course folder.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from engine.course.paths import repo_root


class GraderMismatch(RuntimeError):
    """This worker's course grader is not the coordinator's: its scores could differ, so it grades nothing."""


def grader_digest(root: Path | None = None) -> str:
    """sha256 of the grader a machine runs now (engine/ and solutions/, whose bodies the host engines stub;
    read from disk each time, as the grader's processes import it: 20 ms)."""
    root = root or repo_root()
    digest = hashlib.sha256()
    for folder in ("engine", "solutions"):
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def settings(chapter: Path, timeout: int, sandbox: str, limits, engine: str = "") -> dict:
    """What a result depends on besides the notebook: the chapter's text, the grader (`engine`, else read
    now), the limits. A result made under other settings (the chapter changed, another timeout) is not reused."""
    return {"chapter": hashlib.sha256(Path(chapter).read_bytes()).hexdigest(), "engine": engine or grader_digest(),
            "timeout": timeout, "sandbox": sandbox, "limits": dataclasses.asdict(limits)}


def grade_file(notebook: Path, chapter: Path, workdir: Path, timeout: int, sandbox: str, limits,
               hide: list[Path]) -> tuple[dict | None, str]:
    """(the result {outputs, flags, changes, grader}, its score as a line) of one notebook, run in the sealed
    worker inside a fresh sandbox in `workdir`; (None, why) when the grader itself failed (nbgrader's own
    step grades it again and reports it)."""
    from engine.course.authoring import nbgrader_course
    from engine.course.grading.grade import read_learner, run_sealed
    from engine.course.grading.sandbox import Sandbox, available
    usable, why = available()
    if sandbox == "required" and not usable:
        raise RuntimeError(f"autograde needs the sandbox here: {why}")
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    wrap = Sandbox(workdir, hide=[*hide, chapter.parent], limits=limits) if sandbox != "off" and usable else None
    flags = [] if wrap is not None or sandbox == "off" else [f"not sandboxed: {why}"]
    grader = settings(chapter, timeout, sandbox, limits)
    try:
        learner, notes = read_learner(notebook)
        sealed = run_sealed(learner, chapter, timeout, workdir, wrap=wrap)
        earned, possible = _points(sealed.cells)
        result = {"outputs": nbgrader_course.outputs_by_cell(sealed.cells), "flags": flags + sealed.flags,
                  "changes": notes + sealed.changes, "grader": grader}
        return result, f"{earned:g}/{possible:g}"
    except Exception as error:
        if wrap is not None and wrap.expired:  # the notebook's deadline passed: its tests score 0, and say why
            return dict(_expired(chapter, wrap.expired_message, flags), grader=grader), \
                f"0 ({wrap.expired_message})"
        return None, f"not graded here ({type(error).__name__}: {error})"
    finally:
        if wrap is not None:
            wrap.close()


def _points(run_cells) -> tuple[float, float]:
    from nbgrader.utils import determine_grade

    from engine.course import cells
    graded = [determine_grade(c) for c in run_cells if cells.is_test(c)]
    return sum(e or 0 for e, _ in graded), sum(p for _, p in graded)


def _expired(chapter_path: Path, message: str, flags: list[str]) -> dict:
    """The result of a notebook stopped at its deadline: every test an error output saying so."""
    from engine.course import cells
    from engine.course.authoring import exercises
    from engine.course.authoring.nbgrader_course import _cell_key
    outputs = {}
    for cell in exercises.load_any(chapter_path).cells:
        if cells.is_test(cell):
            outputs[_cell_key(cell)] = [{"output_type": "error", "ename": "NotebookTimeout", "evalue": message,
                                         "traceback": [f"NotebookTimeout: {message}"]}]
    return {"outputs": outputs, "flags": [*flags, message], "changes": []}


def reply_mac(key: bytes, reply: dict) -> str:
    """HMAC-SHA256, under one task's key, over what a worker says: which submission, its result, its score."""
    named = [reply.get(k) for k in ("student", "assignment", "sha256", "result", "score", "worker")]
    return hmac.new(key, json.dumps(named, sort_keys=True, separators=(",", ":")).encode(),
                    hashlib.sha256).hexdigest()


def _chapter_file(name: str, data: bytes) -> Path:
    """The chapter's text in a private folder of the grader's (0700), one per chapter version, so that its
    host engine is built once per worker machine, not once per submission."""
    base = Path(tempfile.gettempdir()) / f"paged-kv-chapters-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    state = os.lstat(base)
    if stat.S_ISLNK(state.st_mode) or state.st_uid != os.getuid() or state.st_mode & 0o077:
        raise RuntimeError(f"{base} is not this grader's private folder (owner {state.st_uid}, mode "
                           f"{stat.S_IMODE(state.st_mode):o}): remove it")
    path = base / hashlib.sha256(data).hexdigest()[:24] / name
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(exist_ok=True)
        partial = Path(tempfile.mkstemp(dir=path.parent)[1])
        partial.write_bytes(data)
        partial.replace(path)
    return path


def grade_task(task: dict) -> dict:
    """A Dask task: grade one submission from its bytes, on whichever worker it lands; the reply names the
    submission, the worker, and carries the task key's HMAC. Nothing is written outside a private folder."""
    here = grader_digest()
    if task["engine"] != here:
        raise GraderMismatch(f"this worker's course grader ({here[:12]}) is not the coordinator's "
                             f"({task['engine'][:12]}): install the same commit of the course on every worker")
    from engine.course.grading.sandbox import Limits
    try:
        from distributed import get_worker
        worker = get_worker().address
    except (ImportError, ValueError):
        worker = "this process"
    chapter = _chapter_file(task["chapter_name"], task["chapter"])
    private = Path(tempfile.mkdtemp(prefix="paged-kv-task-"))      # 0700: the notebook's bytes, out of reach
    try:
        notebook = private / "submission" / task["notebook_name"]
        notebook.parent.mkdir()
        notebook.write_bytes(task["notebook"])
        result, score = grade_file(notebook, chapter, private / "work", task["timeout"], task["sandbox"],
                                   Limits(**task["limits"]), [private / "submission", repo_root() / "solutions"])
    finally:
        shutil.rmtree(private, ignore_errors=True)
    reply = {"student": task["student"], "assignment": task["assignment"],
             "sha256": hashlib.sha256(task["notebook"]).hexdigest(), "result": result, "score": score,
             "worker": worker}
    reply["mac"] = reply_mac(task["key"], reply)
    return reply
