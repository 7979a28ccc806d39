"""`make book`: the chapters as an HTML book (jupyter-book 1.x, offline) in book/_build/html.

The book never executes anything itself (execute_notebooks: off). This script runs every chapter with
the full solution, then, for the learner edition, puts back nbgrader's stubs in place of each solution
region (and drops hidden tests), keeping the outputs: every figure comes from the reference solution,
no solution text reaches the page. `--instructor` keeps the solutions (book/_build/instructor-html).
"""
from __future__ import annotations

import argparse
import copy
import shutil
import subprocess
import sys
import time
from pathlib import Path

from nbclient import NotebookClient
from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme, ClearSolutions
import nbformat

from . import cells
from .paths import chapter_files, chapter_name, offline_cpu_environ, repo_root, venv_environ
from .source import load_chapter

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
EXECUTE_TIMEOUT_S = 600  # per cell; the kernel chapter runs Triton in the CPU interpreter
# Pages the book's table of contents names; until the chapter author writes one, the build uses a stub.
WRITTEN_PAGES = ("intro.md", "course_guide.md")
STUB_PAGE = "# {title}\n\n*This page is not written yet (no book/{name} in the repository).*\n"


def execute_chapter(chapter_path: Path, workdir: Path, timeout: int = EXECUTE_TIMEOUT_S):
    """The chapter with the full solution, executed offline on the CPU; an error stops the build."""
    notebook = load_chapter(chapter_path)
    workdir.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=False,
                            extra_arguments=["--HistoryManager.hist_file=:memory:"],
                            resources={"metadata": {"path": str(workdir)}})
    client.execute(env=offline_cpu_environ(), stderr=subprocess.DEVNULL)  # the kernel process's own noise
    return stable_widget_ids(notebook)


def stable_widget_ids(notebook):
    """The notebook with each ipywidgets model id (a random uuid) renamed by its order of creation,
    so executing the same chapter twice gives the same page."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    if not state:
        return notebook
    text = nbformat.writes(notebook)
    for index, model_id in enumerate(list(state)):
        text = text.replace(model_id, f"widget{index:08d}")
    return nbformat.reads(text, as_version=4)


def learner_edition(executed):
    """The executed chapter with each solution region replaced by nbgrader's stub, hidden tests removed.

    The stubs come from nbgrader's own preprocessors (those generate_assignment runs), so the book shows
    exactly what notebooks/ holds; the outputs stay those of the reference solution.
    """
    stubbed = copy.deepcopy(executed)
    resources: dict = {}
    for preprocessor in (ClearSolutions(), ClearHiddenTests(), ClearMarkScheme()):
        stubbed, resources = preprocessor.preprocess(stubbed, resources)
    edition = copy.deepcopy(executed)
    for cell, stub in zip(edition.cells, stubbed.cells):
        if cells.is_solution(cell) or cells.is_test(cell):
            cell.source = stub.source
    return edition


def stage(chapters: dict[str, object], stage_dir: Path, book_dir: Path) -> None:
    """Lay out the book's source: book/'s files, stub pages for missing ones, chapters/<name>.ipynb."""
    shutil.rmtree(stage_dir, ignore_errors=True)
    shutil.copytree(book_dir, stage_dir, ignore=shutil.ignore_patterns("_build", "README.md"))
    for name in WRITTEN_PAGES:
        if not (stage_dir / name).exists():
            title = name.removesuffix(".md").replace("_", " ").capitalize()
            (stage_dir / name).write_text(STUB_PAGE.format(title=title, name=name))
    (stage_dir / "chapters").mkdir()
    for name, notebook in chapters.items():
        nbformat.write(notebook, stage_dir / "chapters" / f"{name}.ipynb")


def build_html(stage_dir: Path, out_html: Path) -> Path:
    """jupyter-book build of stage_dir, copied to out_html; raises with the log if the build fails."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book), "build", str(stage_dir), "--builder", "html", "--keep-going"]
    result = subprocess.run(command, env=venv_environ(), capture_output=True, text=True)
    built = stage_dir / "_build" / "html"
    if result.returncode != 0 or not (built / "index.html").exists():
        raise RuntimeError(f"jupyter-book build failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    shutil.rmtree(out_html, ignore_errors=True)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built, out_html)
    return out_html


def build_book(executed: dict[str, object], out_html: Path, instructor: bool = False,
               book_dir: Path | None = None, stage_dir: Path | None = None) -> Path:
    """Stage the executed chapters (stubbed unless `instructor`) with book/'s pages and build the HTML."""
    root = repo_root()
    edition = executed if instructor else {name: learner_edition(nb) for name, nb in executed.items()}
    stage_dir = stage_dir or root / "build" / "book" / ("instructor" if instructor else "learner")
    stage(edition, stage_dir, book_dir or root / "book")
    return build_html(stage_dir, out_html)


def execute_all(chapters: list[Path], workdir: Path) -> dict[str, object]:
    """{chapter name: executed notebook}, printing how long each took."""
    executed = {}
    for chapter in chapters:
        started = time.monotonic()
        executed[chapter_name(chapter)] = execute_chapter(chapter, workdir)
        print(f"executed {chapter.name} in {time.monotonic() - started:.1f} s")
    return executed


def main(argv: list[str] | None = None) -> int:
    """Execute the chapters and build the learner (or --instructor) edition of the book."""
    root = repo_root()
    parser = argparse.ArgumentParser(prog="python -m engine.course.book", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instructor", action="store_true", help="show the solutions")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="the chapter sources")
    parser.add_argument("--out", type=Path, help="where the HTML goes "
                        "(default book/_build/html, or book/_build/instructor-html)")
    args = parser.parse_args(argv)
    chapters = chapter_files(args.solutions)
    if not chapters:
        parser.error(f"no chapters (chNN_topic.py) in {args.solutions}")
    out = args.out or root / "book" / "_build" / ("instructor-html" if args.instructor else "html")
    executed = execute_all(chapters, root / "build" / "book" / "run")
    html = build_book(executed, out, instructor=args.instructor)
    print(f"built {'instructor' if args.instructor else 'learner'} edition: {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
