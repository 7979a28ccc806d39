"""`make student-edition`: what an instructor hands out holds no locked reference body, and every
chapter runs in it: full marks with the solution pasted in. Its notebooks are the release's own
(notebooks/, the same text), which test_course_pipeline grades untouched to 0 on the whole engine.

Each chapter k is handed out with every other chapter unlocked (the chapters before it, and those
whose engine parts its decisive checks run: ch02's runs the paged cache of ch03 and ch04). Its own
taught bodies are stubs that call the learner's definitions, so a check of an early exercise that
serves the engine through a later exercise's method finds the learner's one once it is written.
"""
import ast
import json
import os
import subprocess
import sys

import pytest

from engine.course.authoring.edition import build, taught
from fixtures.course_support import BUILD, REPO, build_lock, expanded, once_per_run, real_chapters, write_notebook

pytestmark = [pytest.mark.slow]
CHAPTERS = {path.stem[:4]: path for path in real_chapters()}
EDITION = BUILD / "edition"


def body_text(path, qualname) -> str:
    """A taught function's reference body (after its docstring), comments and layout dropped."""
    tree = ast.parse((REPO / path).read_text())
    node = tree
    for part in qualname.split("."):
        node = next(n for n in node.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part)
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
    return " ".join(" ".join(ast.unparse(statement).split()) for statement in body)


def edition_texts(out) -> dict:
    """{file: its text with code normalized} for every text file of the edition."""
    texts = {}
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in {".py", ".ipynb", ".md", ".txt", ".toml", ""}:
            text = path.read_text(errors="replace")
            if path.suffix == ".py":
                try:
                    text = ast.unparse(ast.parse(text))
                except SyntaxError:
                    pass
            elif path.suffix == ".ipynb":
                text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
                try:
                    text = "\n".join(ast.unparse(ast.parse(chunk)) for chunk in [text] if chunk)
                except SyntaxError:
                    pass
            texts[path] = " ".join(text.split())
    return texts


def grade_in(edition, folder) -> dict:
    env = dict(os.environ, PYTHONPATH=str(edition))
    result = subprocess.run([sys.executable, "-m", "engine.course.grading.grade", str(folder), "--solutions", "course",
                             "--json"], capture_output=True, text=True, cwd=edition, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def build_and_grade() -> dict:
    """{chapter: the grade of its solution pasted into its release}, each chapter in its own edition."""
    from concurrent.futures import ThreadPoolExecutor
    jobs = []
    for chapter, path in CHAPTERS.items():
        out = EDITION / chapter
        build(out, [chapter], [c for c in CHAPTERS if c != chapter])
        jobs.append((out, write_notebook(expanded(path), EDITION / f"{chapter}-pasted", path.stem).parent))
    with ThreadPoolExecutor(2) as pool:
        grades = list(pool.map(lambda job: grade_in(*job), jobs))
    return dict(zip(CHAPTERS, grades))


@pytest.fixture(scope="module")
def editions():
    with build_lock("edition"):
        return once_per_run("editions", build_and_grade)


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_each_chapter_scores_full_marks_with_the_solution_pasted_into_its_edition(editions, chapter):
    pasted = editions[chapter]
    assert pasted["possible"] > 0 and pasted["earned"] == pasted["possible"], [
        (e["grade_id"], e["message"]) for c in pasted["chapters"] for e in c["exercises"]
        if e["message"] and e["kind"] == "test" and e["earned"] != e["possible"]]


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_no_locked_reference_body_is_findable(editions, chapter):
    edition = EDITION / chapter
    assert (edition / "notebooks" / f"{CHAPTERS[chapter].stem}.ipynb").is_file()
    assert not (edition / "solutions").exists() and not (edition / "tests").exists()
    notebook = (edition / "notebooks" / f"{CHAPTERS[chapter].stem}.ipynb").read_text()
    # the release's own notebook: what test_course_pipeline grades untouched, to 0
    assert notebook == (REPO / "notebooks" / f"{CHAPTERS[chapter].stem}.ipynb").read_text()
    assert "BEGIN HIDDEN TESTS" not in notebook and "BEGIN SOLUTION" not in notebook
    texts = edition_texts(edition)
    locked = taught(CHAPTERS[chapter])
    for path, name in locked:
        body = body_text(path, name)
        holders = [str(file.relative_to(edition)) for file, text in texts.items() if body in text]
        assert not holders, f"{path}::{name}'s reference body is in {holders}"
    for other in CHAPTERS:  # the unlocked chapters keep theirs
        for path, name in (taught(CHAPTERS[other]) if other != chapter else []):
            if (path, name) not in locked:
                assert body_text(path, name) in texts[edition / path], f"{path}::{name} should be kept"


LEARNER_FORK = """
import sys
from engine.cache.paged import PagedKVCache
from engine.checkpoint import tiny_config

class Mine(PagedKVCache):                 # as a learner's cell defines it, in __main__
    def fork(self, parent, child):
        print("the learner's fork ran")

cache = PagedKVCache(tiny_config(), 4, block_size=4)
cache.create(0)
if sys.argv[1] == "judge":
    from engine.course.grading.sealed import judge
    judge._no_notebook()
try:
    cache.fork(0, 1)
except NotImplementedError as error:
    print(type(error).__name__, error.qualname)
"""


def test_the_editions_judge_runs_no_learner_definition(editions):
    """In ch04's edition PagedKVCache.fork is a stub that runs the notebook's own fork: in a notebook
    it does, and in the judge (which runs no learner code; the host holds the learner's objects) it
    finds nothing and says not written yet."""
    said = {}
    for where in ("notebook", "judge"):
        run = subprocess.run([sys.executable, "-c", LEARNER_FORK, where], capture_output=True, text=True,
                             cwd=EDITION / "ch04", env=dict(os.environ, PYTHONPATH=str(EDITION / "ch04")))
        assert run.returncode == 0, run.stderr
        said[where] = run.stdout.strip()
    assert said == {"notebook": "the learner's fork ran", "judge": "NotWrittenYet PagedKVCache.fork"}, said


def test_the_release_names_the_same_triton_kernels_as_the_solutions():
    """Which graded functions the judge builds from the cell's text (and launches in the kernel process)
    is read from the chapter's signatures, so a student edition, which has no solutions/, knows them too.
    It once read them from the solutions' include lines: the edition then had none, and ch06's solution
    pasted into its edition scored 5/20 (every kernel 'not from the cell's text')."""
    from engine.course.authoring.exercises import plan_for
    for chapter, path in CHAPTERS.items():
        release = REPO / "notebooks" / f"{path.stem}.ipynb"
        assert plan_for(release).kernels == plan_for(path).kernels, chapter
    assert plan_for(CHAPTERS["ch06"]).kernels == ["gather_rows_program", "paged_decode_head_program"]


def test_edition_refuses_to_replace_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "mine.txt").write_text("an instructor's notes")
    with pytest.raises(SystemExit, match="holds files this command did not write"):
        build(tmp_path, ["ch02"], [])
    assert (tmp_path / "mine.txt").read_text() == "an instructor's notes"
    done = subprocess.run([sys.executable, "-m", "engine.course.authoring.edition", "--chapters", "ch02", "--out",
                           str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode != 0 and "name an empty or new folder" in done.stderr and (tmp_path / "mine.txt").exists()
    done = subprocess.run([sys.executable, "-m", "engine.course.authoring.edition", "--chapters", "ch02", "--out",
                           str(tmp_path), "--force"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "--force or not" in done.stderr and (tmp_path / "mine.txt").exists()


def test_the_hubs_student_engine_keeps_only_the_unlocked_chapters_reference(tmp_path):
    """engine/course/classroom/hub/student_engine.py: ch02 unlocked keeps its allocator, ch03's cache is stubbed;
    unlocking a chapter not due yet is refused, naming its due date."""
    from datetime import datetime, timezone

    from engine.course.classroom.hub import student_engine
    engine = student_engine.build(tmp_path / "student", ["ch02"])
    texts = {path.relative_to(engine).as_posix(): text for path, text in edition_texts(engine).items()}
    allocator, paged = texts["cache/allocator.py"], texts["cache/paged.py"]
    assert body_text("engine/cache/allocator.py", "BlockAllocator.allocate") in allocator
    assert "_edition.yours" not in allocator
    assert "_edition.yours('ch03_paged_cache', 'PagedKVCache.reserve'" in paged
    assert body_text("engine/cache/paged.py", "PagedKVCache.reserve") not in paged
    assert student_engine.unlocked(tmp_path / "student") == ["ch02"]
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "roster.ini").write_text("[chapters]\nch02 = 2027-02-08 23:59\n[students]\nada = Ada\n")
    assert student_engine.due_refusal(tmp_path / "course", ["ch02"], datetime(2027, 2, 1, tzinfo=timezone.utc)) == (
        "--unlock ch02 (due 2027-02-08 23:59 UTC): not due yet, so students could import its reference answers; "
        "unlock it after its due date (or --force)")
    assert student_engine.due_refusal(tmp_path / "course", ["ch02"], datetime(2027, 3, 1, tzinfo=timezone.utc)) == ""
