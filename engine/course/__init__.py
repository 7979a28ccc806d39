"""The course tooling: one chapter source in `solutions/`, three products, each a folder.

    authoring/   the chapters and what is made of them: source.py (jupytext + `#| include`), lint.py,
                 exercises.py (what a chapter grades), release.py (`make release` -> notebooks/),
                 edition.py (`make student-edition`), book.py (`make book`), figures/, widgets.py
    grading/     `make grade` (grade.py) and `make autograde` (autograde.py, its nbgrader step
                 autograde_step.py), on a Dask cluster (cluster.py, cluster_task.py); each notebook run by
                 the sealed grader (kernel.py, sealed/) in a sandbox (sandbox.py)
    classroom/   a class: class_folder.py (roster, collect, grade, release feedback), inbound.py,
                 reports.py, export.py, hub/ (JupyterHub)

Shared below all three: cells.py (what an nbgrader cell is), paths.py, write_guard.py. Authoring imports
neither of the others, grading imports authoring, the classroom both (pyproject's import-linter contract).
"""
