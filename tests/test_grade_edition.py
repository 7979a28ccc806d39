"""`make student-edition`: what an instructor hands out holds no locked reference body, and each
released chapter runs in it: 0 untouched, full marks with the solution pasted in.

ch02 is handed out with ch03 and ch04 unlocked: ch02's decisive check runs the engine's paged cache,
whose fork (ch04) and block writes (ch03) must then be the reference.
"""
import ast
import json
import os
import subprocess
import sys

import pytest

from engine.course.edition import build, taught
from fixtures.course_support import BUILD, REPO, build_lock, expanded, real_chapters, write_notebook

pytestmark = [pytest.mark.slow]
CHAPTERS = {path.stem[:4]: path for path in real_chapters()}
HANDED_OUT, UNLOCKED = ["ch02"], ["ch03", "ch04"]


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


@pytest.fixture(scope="module")
def edition():
    if not all(c in CHAPTERS for c in HANDED_OUT + UNLOCKED):
        pytest.skip("needs chapters 2-4 in solutions/")
    out = BUILD / "edition" / "student-edition"
    with build_lock("edition"):
        build(out, HANDED_OUT, UNLOCKED)
    return out


def test_the_edition_holds_what_a_class_needs_and_nothing_more(edition):
    assert (edition / "notebooks" / f"{CHAPTERS['ch02'].stem}.ipynb").is_file()
    assert not (edition / "solutions").exists() and not (edition / "tests").exists()
    assert sorted(p.name for p in (edition / "engine" / "checks").glob("ch*.py")) == [
        f"{c}.py" for c in sorted(HANDED_OUT + UNLOCKED) if (REPO / "engine" / "checks" / f"{c}.py").exists()]
    notebook = (edition / "notebooks" / f"{CHAPTERS['ch02'].stem}.ipynb").read_text()
    assert "BEGIN HIDDEN TESTS" not in notebook and "BEGIN SOLUTION" not in notebook


def test_no_locked_reference_body_is_findable(edition):
    texts = edition_texts(edition)
    locked = [(path, name) for chapter, source in CHAPTERS.items() if chapter not in UNLOCKED
              for path, name in taught(source)]
    assert locked
    for path, name in locked:
        body = body_text(path, name)
        holders = [str(file.relative_to(edition)) for file, text in texts.items() if body in text]
        assert not holders, f"{path}::{name}'s reference body is in {holders}"
    for chapter in UNLOCKED:  # the unlocked chapters keep theirs
        for path, name in taught(CHAPTERS[chapter]):
            assert body_text(path, name) in texts[edition / path], f"{path}::{name} should be kept"


def grade_in(edition, folder) -> dict:
    env = dict(os.environ, PYTHONPATH=str(edition))
    result = subprocess.run([sys.executable, "-m", "engine.course.grade", str(folder), "--solutions", "course",
                             "--json"], capture_output=True, text=True, cwd=edition, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_released_chapter_scores_zero_untouched_and_full_with_the_solution(edition):
    name = CHAPTERS["ch02"].stem
    solution = write_notebook(expanded(CHAPTERS["ch02"]), BUILD / "edition" / "pasted", name).parent
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        untouched, pasted = pool.map(lambda folder: grade_in(edition, folder), [edition / "notebooks", solution])
    assert untouched["earned"] == 0 and untouched["possible"] > 0
    assert pasted["earned"] == pasted["possible"], [
        e for c in pasted["chapters"] for e in c["exercises"] if e["message"] and e["kind"] == "test"]
