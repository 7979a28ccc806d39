"""`make book`: the chapters as an HTML book (jupyter-book 1.x, offline) in book/_build/html.

The book never executes anything itself (execute_notebooks: off). This script runs every chapter with
the full solution, then, for the learner edition, puts back nbgrader's stubs in place of each solution
region (and drops hidden tests), keeping the outputs: every figure comes from the reference solution,
no solution text reaches the page, and no answer either: the outputs of the graded tests (their ✓
lines), of the solution cells and of the "With your code" cells are dropped, since a learner's stub
would print none of them. `--instructor` keeps the solutions and those outputs and heads each written
answer as its rubric (book/_build/instructor-html). In both editions the setup cell is folded under a
one-line summary of what it imports and defines. `--pdf` prints the learner edition, built as one page, with
the system's Chromium (book/_build/pdf/book.pdf). Explorers are precomputed while the chapter runs
(engine/course/authoring/widgets.py), and MathJax ships inside the book (book/_config.yml): nothing needs a network.
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import copy
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nbclient import NotebookClient
from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme, ClearSolutions
import nbformat

from engine.course import cells
from engine.course.paths import chapter_files, chapter_name, offline_cpu_environ, repo_root, venv_environ
from engine.course.authoring.source import load_chapter
from engine.course.authoring.figures import AUDIT_ENV as FIGURE_AUDIT_ENV
from engine.course.authoring.widgets import STATIC_ENV as EXPLORERS_ENV

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
EXECUTE_TIMEOUT_S = 600  # per cell; the kernel chapter runs Triton in the CPU interpreter
# Pages the book's table of contents names; until the chapter author writes one, the build uses a stub.
WRITTEN_PAGES = ("intro.md", "course_guide.md")
STUB_PAGE = "# {title}\n\n*This page is not written yet (no book/{name} in the repository).*\n"
REPOSITORY_HOSTS = ("github.com", "gitlab.com", "bitbucket.org")  # sphinx-book-theme's repository button
# What the intro says where book/_config.yml names no repository for the course ("Get the course ...").
COURSE_SOURCE_UNSET = "from your instructor (the course's folder, or the repository they publish it in)"
RUBRIC_LABEL = "**Rubric: the model answer (instructor edition only)"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
PDF_FOOTER = ('<div style="font-size:8pt;color:#555;width:100%;text-align:center;">'
              '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')
PRINT_COLUMN_PX = 703  # A4 (210 mm) less the PDF's 12 mm margins, in CSS px (96 to the inch)
CHROMIUM_HINT = ("needs Chromium: `sudo apt-get install chromium` (Debian/Ubuntu), or set COURSE_CHROMIUM to a "
                 "Chromium or Chrome binary")


def execute_chapter(chapter_path: Path, workdir: Path, timeout: int = EXECUTE_TIMEOUT_S):
    """The chapter with the full solution, executed offline on the CPU; an error stops the build."""
    notebook = load_chapter(chapter_path)
    workdir.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=False,
                            extra_arguments=["--HistoryManager.hist_file=:memory:"],
                            resources={"metadata": {"path": str(workdir)}})
    # Explorers precompute every state here (the grader's environment asks them for the default view only).
    # Every figure shown is audited for text too small at the book's width (engine/course/authoring/figures).
    audit_file = workdir / f"{chapter_path.stem}.figures.jsonl"
    audit_file.unlink(missing_ok=True)
    env = offline_cpu_environ({EXPLORERS_ENV: "all", FIGURE_AUDIT_ENV: str(audit_file.resolve())})
    client.execute(env=env, stderr=subprocess.DEVNULL)  # the kernel process's own noise
    audited = [json.loads(line) for line in audit_file.read_text().splitlines()] if audit_file.exists() else []
    notebook.metadata["course"] = {"figures": audited}  # tests/test_course_book.py reads it
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
    for index in cells.shows_an_answer(edition.cells):
        edition.cells[index].outputs = []  # what the reference printed there is an answer
        edition.cells[index].execution_count = None
    return fold_setup(edition)


def fold_setup(notebook):
    """The notebook with its setup cell folded in the book (hide-input) under a one-line summary."""
    for cell in notebook.cells:
        if cells.is_setup(cell):
            tags = cell.metadata.setdefault("tags", [])
            if "hide-input" not in tags:
                tags.append("hide-input")
            cell.metadata["mystnb"] = {"code_prompt_show": f"{setup_summary(cell.source)} (show the code)",
                                       "code_prompt_hide": "Hide the setup code"}
    return notebook


def setup_summary(source: str) -> str:
    """'Setup: 17 imports; defines KiB, MiB, GiB, model, config': what a setup cell brings in, in one line."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return "Setup"
    imports = sum(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body)
    names = [name.id for node in body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             for name in ast.walk(target) if isinstance(name, ast.Name)]
    names += [node.name for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    summary = f"Setup: {imports} import{'s' if imports != 1 else ''}"
    if names:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        summary += f"; defines {shown}"
    return summary


def book_config(config: dict) -> dict:
    """book/_config.yml as the build uses it: a repository button on every page and the intro's link
    only where `repository: url:` names the course's repository (https://HOST/OWNER/NAME on a host of
    REPOSITORY_HOSTS); left empty, the book links no repository and the intro says where the course
    comes from in words."""
    config = copy.deepcopy(config)
    url = str((config.get("repository") or {}).get("url") or "").strip()
    if url and not re.fullmatch(rf"https://({'|'.join(map(re.escape, REPOSITORY_HOSTS))})/[^/\s]+/[^/\s]+/?", url):
        raise ValueError(f"book/_config.yml: repository url {url!r} is not a repository on "
                         f"{', '.join(REPOSITORY_HOSTS)} (https://HOST/OWNER/NAME, the hosts the book theme's button "
                         "knows); set the course's public repository there, or leave it empty for a book without one")
    config["repository"] = {**(config.get("repository") or {}), "url": url}
    config.setdefault("html", {})["use_repository_button"] = bool(url)
    substitutions = config.setdefault("parse", {}).setdefault("myst_substitutions", {})
    substitutions["course_source"] = f"from its repository, <{url}>" if url else COURSE_SOURCE_UNSET
    return config


def stage(chapters: dict[str, object], stage_dir: Path, book_dir: Path) -> None:
    """Lay out the book's source: book/'s files (its configuration as book_config makes it), stub pages
    for missing ones, chapters/<name>.ipynb."""
    import yaml

    shutil.rmtree(stage_dir, ignore_errors=True)
    shutil.copytree(book_dir, stage_dir, ignore=shutil.ignore_patterns("_build", "README.md"))
    config = book_config(yaml.safe_load((book_dir / "_config.yml").read_text()))
    (stage_dir / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    for name in WRITTEN_PAGES:
        if not (stage_dir / name).exists():
            title = name.removesuffix(".md").replace("_", " ").capitalize()
            (stage_dir / name).write_text(STUB_PAGE.format(title=title, name=name))
    (stage_dir / "chapters").mkdir()
    for name, notebook in chapters.items():
        nbformat.write(notebook, stage_dir / "chapters" / f"{name}.ipynb")


def out_refusal(out: Path, pdf: bool = False, root: Path | None = None) -> str:
    """Why --out may not take the book ('' when it may), checked before any chapter runs: never the
    repository, a folder above it or inside its sources (book/_build excepted); an HTML folder is replaced
    whole, so it must be new, empty or an earlier HTML build (Sphinx's .buildinfo in it); a PDF is a
    .pdf file that is new or a PDF already."""
    from engine.course.write_guard import folder_refusal, refusal
    root = (root or repo_root()).resolve()
    allow = (root / "book" / "_build",)
    if pdf:
        why = refusal("--out", out, root=root, allow=allow)
        if why:
            return why
        if out.is_dir():
            return f"--out {out} is a folder: with --pdf, name the PDF file to write (e.g. {out / 'book.pdf'})"
        if out.suffix.lower() != ".pdf":
            return f"--out {out} does not end in .pdf: with --pdf, name the PDF file to write"
        if out.exists():
            try:
                with out.open("rb") as handle:
                    is_pdf = handle.read(5) == b"%PDF-"
            except OSError:
                is_pdf = False
            if not is_pdf:
                return f"--out {out} is a file that is not a PDF: it would be overwritten; name a new file"
        return folder_refusal("--out", out.parent, root=root, allow=allow)
    why = folder_refusal("--out", out, root=root, allow=allow)
    if why:
        return why
    if out.is_dir() and any(out.iterdir()) and not (out / ".buildinfo").is_file():
        return (f"--out {out} holds files that are not an earlier HTML build of the book (no .buildinfo): it "
                "would be replaced whole, so name a new or empty folder")
    return ""


def build_html(stage_dir: Path, out_html: Path, builder: str = "html") -> Path:
    """jupyter-book build of stage_dir (builder "html", or "singlehtml": the whole book as one page),
    copied to out_html, which is replaced whole (never the repository, a folder above it or one of its
    sources: write_guard.refusal); raises with the log if the build fails."""
    from engine.course.write_guard import refusal
    root = repo_root()
    why = refusal("out_html", out_html, root=root, allow=(root / "book" / "_build",))
    if why:
        raise ValueError(why)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    command = [str(jupyter_book), "build", str(stage_dir), "--builder", builder, "--keep-going"]
    result = subprocess.run(command, env=venv_environ(), capture_output=True, text=True)
    built = stage_dir / "_build" / builder
    if result.returncode != 0 or not (built / "index.html").exists():
        raise RuntimeError(f"jupyter-book build failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    for page in built.rglob("*.html"):
        if "_static" not in page.relative_to(built).parts:
            page.write_text(hang_lines(page.read_text()))
    shutil.rmtree(out_html, ignore_errors=True)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built, out_html)
    return out_html


PRE = re.compile(r"(<pre(?![^>]*course-explorer-text)[^>]*>)(.*?)(</pre>)", re.S)
TAG = re.compile(r"<(/?)(\w+)[^>]*>")


def hang_lines(page: str) -> str:
    """The page with each line of each <pre> (code, outputs) in a span carrying its indentation, which
    book/_static/course.css turns into a hanging indent when the line wraps. A <pre> whose tags cross a
    line (never Pygments') and an explorer's text (its script rewrites it) are left as they are."""
    def lines(match: re.Match) -> str:
        start, body, end = match.groups()
        pieces = body.split("\n")
        tail = pieces.pop() if pieces and pieces[-1] == "" else None
        spans = []
        for piece in pieces:
            depth = 0
            for tag in TAG.finditer(piece):
                depth += -1 if tag.group(1) else (0 if tag.group(0).endswith("/>") else 1)
                if depth < 0:
                    return match.group(0)
            if depth:
                return match.group(0)
            text = html.unescape(TAG.sub("", piece))
            indent = len(text) - len(text.lstrip(" "))
            spans.append(f'<span class="course-line" style="--indent:{indent}ch">{piece}</span>')
        return start + "\n".join(spans) + ("\n" if tail is not None else "") + end
    return PRE.sub(lines, page)


def instructor_edition(executed):
    """The executed chapter with every written answer (a hand-graded solution cell) marked as the
    rubric: the model answer the instructor grades against, shown only in this edition."""
    edition = copy.deepcopy(executed)
    for cell in edition.cells:
        if cell.cell_type == "markdown" and cells.is_solution(cell) and cells.is_graded(cell):
            points = cells.points(cell)
            cell.source = f"{RUBRIC_LABEL} ({points:g} points)**\n\n{cell.source}"
    return fold_setup(edition)


def build_book(executed: dict[str, object], out_html: Path, instructor: bool = False,
               book_dir: Path | None = None, stage_dir: Path | None = None, builder: str = "html") -> Path:
    """Stage the executed chapters (stubbed unless `instructor`) with book/'s pages and build the HTML."""
    root = repo_root()
    make_edition = instructor_edition if instructor else learner_edition
    edition = {name: make_edition(notebook) for name, notebook in executed.items()}
    stage_dir = stage_dir or root / "build" / "book" / ("instructor" if instructor else "learner")
    stage(edition, stage_dir, book_dir or root / "book")
    return build_html(stage_dir, out_html, builder=builder)


def chromium_executable() -> str | None:
    """Chromium for the PDF and the browser tests: $COURSE_CHROMIUM, else `chromium` (Debian's package)
    or `chromium-browser` on PATH; None if there is none."""
    for candidate in (os.environ.get("COURSE_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
                      "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def launch_chromium(playwright):
    """Headless Chromium through Playwright's Python package (no browser download: the system's Chromium).

    --no-sandbox lets it run as root (containers); the background-networking flags keep it from calling
    home, so a machine without network stays quiet."""
    executable = chromium_executable()
    if executable is None:
        raise RuntimeError(CHROMIUM_HINT)
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)


def wait_for_math(page, timeout_ms: int = 60_000) -> None:
    """Wait until MathJax (if the page loads it) has typeset the page and book/_static/course.js has
    fitted its displayed formulas to the column (window.courseMathReady)."""
    page.wait_for_function("() => !document.querySelector('script[src*=\"mathjax\"]') || "
                           "(window.MathJax && window.MathJax.startup && window.MathJax.startup.promise)",
                           timeout=timeout_ms)
    page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate("() => window.courseMathReady")


def print_pdf(page_path: Path, out_pdf: Path) -> Path:
    """Chromium's print-to-PDF of one local HTML page, once its math is typeset.

    Playwright's sync API refuses to start inside a running event loop (a notebook, or another
    Playwright session in the same thread), so there it runs in a thread of its own.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _print_pdf(page_path, out_pdf)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_print_pdf, page_path, out_pdf).result()


def _print_pdf(page_path: Path, out_pdf: Path) -> Path:
    from playwright.sync_api import sync_playwright

    out_pdf.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            # Laid out as printed (print media, a window as wide as the paper's column) before the
            # formulas are fitted to the column (book/_static/course.js), so none is cut at the margin.
            page = browser.new_page(viewport={"width": PRINT_COLUMN_PX, "height": 1000})
            page.emulate_media(media="print")
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            wait_for_math(page)
            # outline: bookmarks from the headings (Chromium's generateDocumentOutline, which needs a
            # tagged PDF); the footer numbers every page.
            options = dict(format="A4", print_background=True, outline=True, tagged=True,
                           display_header_footer=True, header_template="<span></span>", footer_template=PDF_FOOTER,
                           margin={"top": "15mm", "bottom": "17mm", "left": "12mm", "right": "12mm"})
            # Printed twice: the first print says on which page each heading landed, the contents
            # list gets those numbers (on lines it already fills, so no page moves), the second is kept.
            page.evaluate(MARK_CONTENTS_JS)
            pages = pdf_destination_pages(page.pdf(**options))
            page.evaluate(NUMBER_CONTENTS_JS, pages)
            page.pdf(path=str(out_pdf), **options)
        finally:
            browser.close()
    return out_pdf


# Each entry of the printed contents links its chapter's heading by an id of its own: a chapter's
# section id can be another's (chapter 3, "The paged KV cache", has the book title's), and a PDF has one
# destination per name. The heading, not the document anchor before it, which can stay at the foot of
# the page before when the heading moves on to the next one.
MARK_CONTENTS_JS = """() => {
  const links = document.querySelectorAll('.onlyprint li.toctree-l1 > a[href^="#"]');  // the printed contents
  const sections = Array.from(document.querySelectorAll('section'));
  links.forEach((link, k) => {
    const anchor = document.getElementById(decodeURIComponent(link.getAttribute('href').slice(1)));
    const section = anchor && sections.find(
        s => s === anchor || anchor.compareDocumentPosition(s) & Node.DOCUMENT_POSITION_FOLLOWING);
    const heading = section && section.querySelector('h1, h2, h3');
    if (heading) {
      heading.id = `course-contents-${k + 1}`;  // Chromium names a destination only for a link's target
      link.dataset.courseHeading = heading.id;
      link.setAttribute('href', `#${heading.id}`);
    }
  });
  return links.length;
}"""
NUMBER_CONTENTS_JS = """pages => {
  const links = document.querySelectorAll('.onlyprint li.toctree-l1 > a[data-course-heading]');
  for (const link of links) {
    const page = pages[link.dataset.courseHeading];
    if (page && !link.querySelector('.course-toc-page')) {
      const number = document.createElement('span');
      number.className = 'course-toc-page';
      number.textContent = page;
      link.appendChild(number);
    }
  }
  return links.length;
}"""


def pdf_destination_pages(pdf: bytes) -> dict[str, int]:
    """{named destination: page number from 1} of a PDF as Chromium writes it (plain objects, the
    catalog's /Dests naming [page /XYZ ...] arrays): where each heading of the printed page landed."""
    starts = {int(m.group(1)): m.end() for m in re.finditer(rb"(?<![0-9])(\d+) 0 obj", pdf)}

    def body(number: int) -> bytes:
        start = starts[number]
        return pdf[start:pdf.index(b"endobj", start)]

    def ref(text: bytes, key: bytes) -> int | None:
        found = re.search(rb"/" + key + rb"\s+(\d+) 0 R", text)
        return int(found.group(1)) if found else None

    catalog = next((n for n in starts if b"/Type /Catalog" in body(n)[:200]), None)
    if catalog is None or ref(body(catalog), b"Dests") is None:
        return {}
    order: list[int] = []

    def walk(node: int) -> None:
        text = body(node)
        kids = re.search(rb"/Kids\s*\[([^\]]*)\]", text)
        if kids and b"/Type /Pages" in text:
            for kid in re.findall(rb"(\d+) 0 R", kids.group(1)):
                walk(int(kid))
        else:
            order.append(node)

    walk(ref(body(catalog), b"Pages"))
    number_of = {node: index + 1 for index, node in enumerate(order)}
    pages = {}
    for name, page in re.findall(rb"/([^\s\[/]+)\s*\[(\d+) 0 R", body(ref(body(catalog), b"Dests"))):
        decoded = re.sub(rb"#([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), name)
        if int(page) in number_of:
            pages[decoded.decode("utf-8", "replace")] = number_of[int(page)]
    return pages


def build_pdf(executed: dict[str, object], out_pdf: Path, stage_dir: Path | None = None) -> Path:
    """The learner edition as one page (jupyter-book's singlehtml builder), printed to out_pdf by Chromium."""
    root = repo_root()
    stage_dir = stage_dir or root / "build" / "book" / "pdf"
    single = build_book(executed, stage_dir.parent / f"{stage_dir.name}-singlehtml", stage_dir=stage_dir,
                        builder="singlehtml")
    # index.html only redirects (after it loads) to the one page that holds the whole book: print that.
    pages = [page for page in single.glob("*.html") if page.name not in {"index.html", "search.html", "genindex.html"}]
    return print_pdf(pages[0] if len(pages) == 1 else single / "index.html", out_pdf)


def execute_all(chapters: list[Path], workdir: Path) -> dict[str, object]:
    """{chapter name: executed notebook}, printing how long each took."""
    executed = {}
    for chapter in chapters:
        started = time.monotonic()
        executed[chapter_name(chapter)] = execute_chapter(chapter, workdir)
        print(f"executed {chapter.name} in {time.monotonic() - started:.1f} s")
    return executed


def save_executed(executed: dict[str, object], folder: Path) -> None:
    """Write each executed chapter to folder/<name>.ipynb (python -m engine.course.authoring.lint checks what they
    print)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, notebook in executed.items():
        nbformat.write(notebook, folder / f"{name}.ipynb")


def main(argv: list[str] | None = None) -> int:
    """Execute the chapters and build the learner (or --instructor) edition of the book."""
    root = repo_root()
    from engine.tools import cli_args

    from engine.tools.cli_args import path_text
    parser = cli_args.Parser(prog="python -m engine.course.authoring.book", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instructor", action="store_true", help="show the solutions")
    parser.add_argument("--solutions", type=Path, default=root / "solutions", help="the chapter sources")
    parser.add_argument("--pdf", action="store_true", help="the learner edition as one PDF (Chromium prints "
                        "the single-page build; default book/_build/pdf/book.pdf)")
    parser.add_argument("--out", type=path_text("--out"), help="where the HTML goes (default book/_build/html, "
                        "or book/_build/instructor-html; new, empty or an earlier build: it is replaced whole), "
                        "or with --pdf the .pdf file")
    args = parser.parse_args(argv)
    if args.pdf and args.instructor:
        parser.error("--instructor does not apply to --pdf: the PDF is the learner edition (make "
                     "book-instructor builds the instructor edition as HTML)")
    chapters = chapter_files(args.solutions)
    if not chapters:
        parser.error(f"no chapters (chNN_topic.py) in {args.solutions}")
    if args.out is not None:                   # before minutes of executing chapters, not after
        why = out_refusal(args.out, pdf=args.pdf, root=root)
        if why:
            parser.error(why)
    if args.pdf and chromium_executable() is None:
        parser.error(f"make book-pdf {CHROMIUM_HINT}")
    executed = execute_all(chapters, root / "build" / "book" / "run")
    save_executed(executed, root / "build" / "book" / "executed")  # the course lint reads their outputs
    if args.pdf:
        pdf = build_pdf(executed, args.out or root / "book" / "_build" / "pdf" / "book.pdf")
        print(f"built the book as a PDF: {pdf}")
        return 0
    out = args.out or root / "book" / "_build" / ("instructor-html" if args.instructor else "html")
    html = build_book(executed, out, instructor=args.instructor)
    print(f"built {'instructor' if args.instructor else 'learner'} edition: {html / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
