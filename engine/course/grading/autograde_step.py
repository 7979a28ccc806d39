"""The autograde step: nbgrader's Execute preprocessor replaced by the course's sealed, sandboxed run.

engine/course/authoring/nbgrader_course.py writes the nbgrader configuration that names this preprocessor
(AUTOGRADE_PREPROCESSORS); it lives apart from the course directory's runner so that `make release`
(which uses the runner) does not reach the grader.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, List, Unicode

from engine.course import cells
from engine.course.authoring.nbgrader_course import AUTOGRADE_CELL_TIMEOUT, _cell_key, cached_result, outputs_by_cell


class SealedExecute(NbGraderPreprocessor):
    """nbgrader's Execute, replaced: the notebook runs in the sealed worker, sandboxed, and each graded
    test cell gets the outputs of its signed verdict (an error output when it failed), which nbgrader's
    SaveAutoGrades then scores as usual. Flags for the instructor go to work_root/flags/."""

    solutions = Unicode("", help="folder of the chapter sources (chNN_topic.py)").tag(config=True)
    timeout = Integer(AUTOGRADE_CELL_TIMEOUT, help="seconds per cell").tag(config=True)
    sandbox = Unicode("required", help="required | auto | off").tag(config=True)
    work_root = Unicode("", help="where each submission's working folder goes").tag(config=True)
    hide = List(Unicode(), help="folders a submission may not see (other students' work)").tag(config=True)

    def preprocess(self, nb, resources):
        from engine.course.grading.grade import run_sealed
        from engine.course.grading.sandbox import Sandbox, available
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
