"""`python -m engine.course.authoring.run_chapters`: every chapter's full solution executed, each timed; one JSON.

Each chapter runs in a fresh kernel with this process's environment (engine/tools/gpu_check.py runs
this command on the GPU, with compiled kernels), and stops on its first error, which is reported with
the cell it came from. `--list` prints the chapter names only (gpu_check checks its --chapters with it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.course.paths import chapter_files, chapter_name, repo_root
from engine.course.authoring.source import load_chapter

CH06_FIGURE_CELLS = ("ch06_bench", "ch06_gap")   # the chapter's cells that print measured bandwidth


def run_chapters(timeout: float, chapters: list[str] | None = None, solutions: Path | None = None) -> dict:
    """Every chapter's full solution (or those whose names start with one of `chapters`); seconds each,
    the first error if any."""
    runs = {}
    for path in chapter_files(solutions or repo_root() / "solutions"):
        name = chapter_name(path)
        if chapters and not any(name.startswith(c) for c in chapters):
            continue
        runs[name] = run_notebook(path, timeout)
    failed = [name for name, run in runs.items() if run["status"] != "ok"]
    return {"status": "ok" if not failed else "failed", "chapters": runs, **({"failed": failed} if failed else {})}


def run_notebook(path: Path, timeout: float) -> dict:
    """One chapter with the full solution in a fresh kernel (cells stop the run on their first error)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    notebook = load_chapter(path)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=False,
                                extra_arguments=["--HistoryManager.hist_file=:memory:"],
                                resources={"metadata": {"path": workdir}})
        try:
            client.execute(env=dict(os.environ) | {"COURSE_EXPLORERS": "static"}, stderr=subprocess.DEVNULL)
            result = {"status": "ok"}
        except (CellExecutionError, CellTimeoutError) as exc:
            where = next((cell.get("id") for cell in notebook.cells
                          if any(o.get("output_type") == "error" for o in cell.get("outputs", []))), None)
            what = f"{exc.ename}: {exc.evalue}" if getattr(exc, "ename", None) else str(exc).splitlines()[0]
            result = {"status": "failed", "error": what[:500], "cell": where}
    result["seconds"] = round(time.perf_counter() - started, 1)
    printed = {}
    for cell in notebook.cells:
        if cell.get("id") in CH06_FIGURE_CELLS:
            printed[cell.id] = "".join(o.get("text", "") for o in cell.get("outputs", [])
                                       if o.get("output_type") == "stream").splitlines()
    if printed:
        result["printed"] = printed
    return result


def main(argv: list[str] | None = None) -> int:
    """Print the chapters' runs (or, with --list, their names) as one JSON object; 1 when one failed."""
    from engine.tools import cli_args
    parser = cli_args.Parser(prog="python -m engine.course.authoring.run_chapters", description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", default=None, help="only these chapters, comma-separated (e.g. ch06,ch07)")
    parser.add_argument("--timeout", type=cli_args.positive_int, default=600, help="seconds per cell")
    parser.add_argument("--list", action="store_true", help="print the chapter names, run nothing")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps([chapter_name(path) for path in chapter_files(repo_root() / "solutions")]))
        return 0
    chapters = [c.strip() for c in args.chapters.split(",") if c.strip()] if args.chapters else None
    result = run_chapters(args.timeout, chapters)
    print(json.dumps(result))
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
