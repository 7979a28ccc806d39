"""The course tooling: one chapter source in `solutions/`, four products.

    source.py    load_chapter: jupytext read + `#| include` expansion (include.py)
    lint.py      the nbgrader metadata rules every chapter must follow
    release.py   `make release`   -> notebooks/ (learner edition, via nbgrader generate_assignment)
    grade.py     `make grade`     -> score table (kernel.py runs cells and survives crashes)
    autograde.py `make autograde` -> an nbgrader course dir: feedback HTML and grades.csv
    cluster.py   `make autograde CLUSTER=tcp://host:8786`: each submission one task on a Dask cluster
    cluster_task.py  one submission's sealed run, wherever it lands (the local pool or a worker)
    book.py      `make book`      -> book/_build/html (executed with the solution, shown with stubs)
"""
