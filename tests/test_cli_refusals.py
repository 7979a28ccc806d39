"""The course and GPU commands refuse a bad argument in one `error:` line, exit status 2, before any work,
and never delete what they did not write (review of the command-line entry points).

Every destructive case runs in throwaway folders under tmp_path, or in a small copy of the repository
(pyproject.toml, engine/, solutions/ and sentinel files in the other source folders), run with its cwd
in the copy so that `python -m engine...` imports the copy and repo_root() is the copy. No test here runs
nbgrader or a notebook: a refusal is fast because nothing runs.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from engine.course.authoring import edition, release

from engine.course.grading import grade
from engine.sampling import SamplingParams, sample
from fixtures.commands import run_command
from fixtures.course_support import FIXTURE_CHAPTER, FIXTURE_SOLUTIONS, REPO

SENTINELS = ["book/intro.md", "notebooks/ch02_block_tables.ipynb", "notebooks/ch03_paged_cache.ipynb",
             "tests/test_keep.py", "course/submitted/ada/ch02_block_tables.ipynb", "notes.txt"]


def run(module, *args, cwd, env=None, timeout=120):
    """`python -m module args` in cwd (importing the copy's engine when cwd is the copy); the finished run."""
    return run_command(module, *args, cwd=cwd, env=env, timeout=timeout)


def assert_refused(done, *words):
    """Exit 2, nothing on stdout but the refusal on stderr: one `error:` line holding every word."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert str(word) in done.stderr, (word, done.stderr)


def intact(root, names=SENTINELS):
    return [name for name in names if not (Path(root) / name).is_file()]


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """A small copy of the repository, with a sentinel file in each folder a command must not touch."""
    root = tmp_path_factory.mktemp("parent") / "repo"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    for name in ("engine", "solutions"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in SENTINELS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("keep me\n")
    return root


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "afile").write_text("a file\n")
    return tmp_path


# ---- finding 2 and 9: edition --out, --chapters, --unlock --------------------------------------------

@pytest.mark.parametrize("out, words", [
    (".", ["--out . is the repository itself"]),
    ("..", ["--out .. holds the repository"]),
    ("engine/x", ["--out engine/x is inside the repository's engine/"]),
    ("solutions", ["inside the repository's solutions/"]),
    ("notebooks/edition", ["inside the repository's notebooks/"]),
    ("book", ["inside the repository's book/"]),
    ("tests/out", ["inside the repository's tests/"]),
])
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_edition_refuses_the_repository_and_its_sources_even_with_force(copy, out, words, force):
    done = run("engine.course.authoring.edition", "--chapters", "ch02", "--out", out, *force, cwd=copy)
    assert_refused(done, *words)
    assert str(copy.resolve()) in done.stderr or out != "..", "the command did not run the copy"
    assert not intact(copy) and not (copy / "engine" / "x").exists() and not (copy / "tests" / "out").exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_edition_force_never_empties_a_folder_it_did_not_write(tmp, force):
    (tmp / "handout").mkdir()
    (tmp / "handout" / "mine.txt").write_text("an instructor's notes")
    done = run("engine.course.authoring.edition", "--chapters", "ch02", "--out", "handout", *force, cwd=tmp)
    assert_refused(done, "--out handout", "did not write", "name an empty or new folder")
    assert (tmp / "handout" / "mine.txt").read_text() == "an instructor's notes"


@pytest.mark.parametrize("args, words", [
    (["--chapters", "ch02", "--out", "afile/x"], ["--out afile/x:", "afile is a file, not a folder"]),
    (["--chapters", "ch02", "--out", "afile"], ["--out afile is a file, not a folder"]),
    (["--chapters", "ch02", "--out", ""], ["argument --out: '' is empty"]),
    (["--chapters", "ch02", "--out", "/proc/no-such-edition"], ["--out /proc/no-such-edition: cannot create it"]),
    (["--chapters", "ch02_typo_here", "--unlock", "ch02"], ["--chapters: no chapter 'ch02_typo_here'"]),
    (["--chapters", "ch02_"], ["--chapters: no chapter 'ch02_'"]),
    (["--chapters", "ch03", "--unlock", "ch02_block_tabels"], ["--unlock: no chapter 'ch02_block_tabels'"]),
    (["--chapters", "ch02,ch02_block_tables"], ["--chapters: ch02 is given twice"]),
    (["--chapters", "ch02", "--unlock", "ch02"], ["--unlock ch02 is also in --chapters", "reference answers"]),
    (["--chapters", "ch02,ch03", "--unlock", "ch03"], ["--unlock ch03 is also in --chapters"]),
])
def test_edition_refuses_a_bad_argument_in_one_line(tmp, args, words):
    out = [] if "--out" in args else ["--out", "ed"]
    assert_refused(run("engine.course.authoring.edition", *args, *out, cwd=tmp), *words)
    assert sorted(p.name for p in tmp.iterdir()) == ["afile"]


def test_edition_names_resolve_exactly_and_the_documented_unlock_passes():
    names = {"ch02": "ch02_block_tables", "ch03": "ch03_paged_cache"}
    assert edition.parse_list("ch02_block_tables, ch03", names) == ["ch02", "ch03"]
    with pytest.raises(SystemExit, match="no chapter 'ch02_typo_here'"):
        edition.parse_list("ch02_typo_here", names)
    # make student-edition CHAPTERS=ch02,ch03 UNLOCK=ch02 (README.md): ch02's deadline passed, ch03 is due
    assert edition.unlock_refusal(["ch02", "ch03"], ["ch02"]) == ""
    assert edition.unlock_refusal(["ch02"], ["ch03", "ch04"]) == ""
    assert "also in --chapters" in edition.unlock_refusal(["ch02"], ["ch02"])


# ---- finding 3 and 16: release ------------------------------------------------------------------------

def fake_nbgrader(course_dir, *args):
    """generate_assignment without nbgrader: the staged source notebooks, copied to release/."""
    for source in (Path(course_dir) / "source").glob("*/*.ipynb"):
        target = Path(course_dir) / "release" / source.parent.name / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return ""


def test_releasing_one_chapter_keeps_the_other_notebooks(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(release, "run_nbgrader", fake_nbgrader)
    out = tmp_path / "notebooks"
    out.mkdir()
    for name in ("ch01_kv_cache", "ch03_paged_cache", "ch07_continuous_batching"):
        nbformat.write(nbformat.v4.new_notebook(), out / f"{name}.ipynb")
    chapter = REPO / "solutions" / "ch02_block_tables.py"
    assert release.main([str(chapter), "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    assert sorted(p.name for p in out.glob("*.ipynb")) == ["ch01_kv_cache.ipynb", "ch02_block_tables.ipynb",
                                                          "ch03_paged_cache.ipynb", "ch07_continuous_batching.ipynb"]
    assert "`ch07_continuous_batching.ipynb`" in (out / "README.md").read_text()
    assert f"wrote {out / 'ch02_block_tables.ipynb'}" in capsys.readouterr().out
    # only a full release (every chapter of their folder) removes a notebook whose chapter is gone
    assert release.is_full_release([FIXTURE_CHAPTER]) and not release.is_full_release([chapter])


@pytest.mark.parametrize("args, words", [
    (["README.md"], ["CHAPTER README.md is not a chapter source"]),
    (["solutions"], ["CHAPTER solutions is a folder"]),
    ([""], ["CHAPTER '' is empty"]),
    (["solutions/ch99_gone.py"], ["CHAPTER solutions/ch99_gone.py does not exist"]),
    (["solutions/ch02_block_tables.py", "solutions/ch02_block_tables.py"],
     ["CHAPTER solutions/ch02_block_tables.py is given twice"]),
    (["--out", "."], ["--out . is the repository itself"]),
    (["--out", "engine"], ["--out engine is inside the repository's engine/"]),
    (["--out", "notes.txt"], ["--out notes.txt is a file, not a folder"]),
    (["--out", ""], ["argument --out: '' is empty"]),
    (["--work", "tests"], ["--work tests is inside the repository's tests/"]),
    (["--work", "course"], ["--work course holds files release did not write"]),
    (["--work", "."], ["--work . is the repository itself"]),
])
def test_release_refuses_before_any_work(copy, args, words):
    done = run("engine.course.authoring.release", *args, cwd=copy)
    assert_refused(done, *words)
    assert not intact(copy) and not (copy / "README.md").exists()
    assert (copy / "engine" / "README.md").read_text() == (REPO / "engine" / "README.md").read_text()


def test_release_work_never_empties_a_folder_it_did_not_create(tmp):
    (tmp / "important").mkdir()
    (tmp / "important" / "notes.txt").write_text("mine")
    chapter = REPO / "solutions" / "ch02_block_tables.py"
    done = run("engine.course.authoring.release", str(chapter), "--out", "nb", "--work", "important", cwd=tmp)
    assert_refused(done, "--work important holds files release did not write")
    assert (tmp / "important" / "notes.txt").read_text() == "mine" and not (tmp / "nb").exists()
    done = run("engine.course.authoring.release", "/no/such/ch02_x.py", "--work", "important", cwd=tmp)
    assert_refused(done, "CHAPTER /no/such/ch02_x.py does not exist")
    assert (tmp / "important" / "notes.txt").read_text() == "mine"


# ---- finding 4 and 18: book --out, --pdf --instructor --------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--out", "book"], ["--out book is inside the repository's book/"]),
    (["--out", "."], ["--out . is the repository itself"]),
    (["--out", ".."], ["--out .. holds the repository"]),
    (["--out", "tests/html"], ["inside the repository's tests/"]),
    (["--out", "course"], ["--out course holds files that are not an earlier HTML build"]),
    (["--out", "notes.txt"], ["--out notes.txt is a file, not a folder"]),
    (["--out", ""], ["argument --out: '' is empty"]),
    (["--pdf", "--out", "notes.txt"], ["--out notes.txt does not end in .pdf"]),
    (["--pdf", "--out", "course"], ["--out course is a folder"]),
    (["--pdf", "--instructor"], ["--instructor does not apply to --pdf"]),
])
def test_book_refuses_its_out_before_executing_a_chapter(copy, args, words):
    done = run("engine.course.authoring.book", *args, cwd=copy)
    assert_refused(done, *words)
    assert "executed" not in done.stdout and not intact(copy)


def test_book_takes_a_new_folder_or_an_earlier_build(tmp_path):
    from engine.course.authoring.book import out_refusal
    assert out_refusal(tmp_path / "new") == ""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / ".buildinfo").write_text("# Sphinx build info version 1\n")
    (tmp_path / "old" / "index.html").write_text("<html>")
    assert out_refusal(tmp_path / "old") == ""
    assert out_refusal(REPO / "book" / "_build" / "html") == ""
    assert out_refusal(tmp_path / "book.pdf", pdf=True) == ""


# ---- finding 1, 5, 6 and 11: autograde ------------------------------------------------------------------

@pytest.fixture
def subs(tmp):
    """tmp/course/submitted/ada/... (nbgrader's own layout), tmp/subs/ada/..., an empty folder."""
    for folder in ("course/submitted/ada", "subs/ada"):
        (tmp / folder).mkdir(parents=True)
        (tmp / folder / "ch02_block_tables.ipynb").write_text("{}")
    (tmp / "empty").mkdir()
    return tmp


@pytest.mark.parametrize("args, words", [
    (["course/submitted", "--course", "course", "--sandbox", "off"],
     ["SUBMISSIONS course/submitted is inside --course course; autograde rewrites that folder"]),
    (["course", "--course", "course/submitted"], ["--course course/submitted is inside SUBMISSIONS course"]),
    (["course", "--course", "course"], ["SUBMISSIONS course is the --course folder course"]),
    ([""], ["SUBMISSIONS is empty"]),
    (["   "], ["SUBMISSIONS is empty"]),
    (["empty", "--course", "scratch"], ["SUBMISSIONS empty holds no submission"]),
    (["subs", "--course", "afile"], ["--course afile is a file, not a folder"]),
    (["subs", "--course", "scratch", "--solutions", "/no/such"], ["--solutions /no/such is not a folder"]),
    (["subs", "--course", "scratch", "--solutions", "empty"], ["--solutions empty holds no chapter source"]),
])
def test_autograde_refuses_before_writing_or_deleting(subs, args, words):
    done = run("engine.course.grading.autograde", *args, cwd=subs)
    assert_refused(done, *words)
    assert (subs / "course" / "submitted" / "ada" / "ch02_block_tables.ipynb").read_text() == "{}"
    assert not (subs / "scratch").exists() and not (subs / "course" / "nbgrader_config.py").exists()


def test_autograde_refuses_the_repository_as_its_course(copy):
    (copy / "subs" / "ada").mkdir(parents=True, exist_ok=True)
    (copy / "subs" / "ada" / "ch02_block_tables.ipynb").write_text("{}")
    for course, words in ((".", "--course . is the repository itself"),
                          ("notebooks", "--course notebooks is inside the repository's notebooks/")):
        assert_refused(run("engine.course.grading.autograde", "subs", "--course", course, cwd=copy), words)
    assert not intact(copy) and not (copy / "nbgrader_config.py").exists()


def test_make_autograde_with_an_empty_submissions_is_refused(tmp_path):
    done = subprocess.run(["make", "-s", "-C", str(REPO), "autograde", "SUBMISSIONS="], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "error: SUBMISSIONS is empty" in done.stderr, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("option", [["--sandbox", "required"], []], ids=["asked", "the default"])
def test_autograde_without_a_sandbox_is_refused_up_front(subs, option):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}           # no bwrap on this PATH
    done = run("engine.course.grading.autograde", "subs", "--course", "scratch", *option, cwd=subs, env=env)
    assert_refused(done, "--sandbox required (the default), but there is no working sandbox here", "bubblewrap",
                   "--sandbox auto grades the submissions unconfined")
    assert not (subs / "scratch").exists()


# ---- finding 10: grade ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    ([""], ["DIR is empty"]),
    (["empty"], ["empty holds no chapter notebook: nothing to grade", "ch99_fixture.ipynb"]),
    (["nb", "--solutions", "/no/such"], ["--solutions /no/such is not a folder"]),
    (["nb", "--solutions", "afile"], ["--solutions afile is not a folder"]),
    (["nb", "--solutions", "empty"], ["--solutions empty holds no chapter"]),
])
def test_grade_refuses_to_grade_nothing(tmp, args, words):
    (tmp / "empty").mkdir()
    (tmp / "nb").mkdir()
    (tmp / "nb" / "ch99_fixture.ipynb").write_text("{}")
    solutions = [] if "--solutions" in args else ["--solutions", str(FIXTURE_SOLUTIONS)]
    assert_refused(run("engine.course.grading.grade", *args, *solutions, cwd=tmp), *words)


def test_grade_with_some_chapters_missing_still_grades_the_others(tmp_path, monkeypatch):
    (tmp_path / "ch99_fixture.ipynb").write_text("{}")
    seen = []
    monkeypatch.setattr(grade, "grade_directory",
                        lambda *args, **kwargs: seen.append(args) or ([], ["no notebook for x"]))
    assert grade.main([str(tmp_path), "--solutions", str(FIXTURE_SOLUTIONS)]) == 0 and seen


# ---- finding 6: lint --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["/no/such/ch02_x.py"], ["CHAPTER /no/such/ch02_x.py does not exist"]),
    ([str(REPO / "solutions")], ["is a folder"]),
    ([""], ["CHAPTER '' is empty"]),
    ([str(REPO / "engine" / "model.py")], ["model.py is not a chapter source"]),
    ([str(FIXTURE_CHAPTER), "--outputs", "/no/such"], ["--outputs /no/such is not a folder", "does not exist"]),
    ([str(FIXTURE_CHAPTER), "--outputs", str(FIXTURE_CHAPTER)], ["is not a folder of executed chapters (a file"]),
])
def test_lint_tells_a_bad_argument_exit_2_from_a_broken_rule_exit_1(tmp_path, args, words):
    assert_refused(run("engine.course.authoring.lint", *args, cwd=tmp_path), *words)


# ---- finding 6 and 16: gpu_check; finding 8: compile_check ------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--out", "afile/x.json"], ["argument --out: afile/x.json:", "afile is a file, not a folder"]),
    (["--out", "afile"], ["argument --out: afile is a file that does not end in .json"]),
    (["--out", ""], ["argument --out: '' is empty"]),
    (["--parts", "tests,tests"], ["argument --parts: tests is given twice"]),
    (["--chapters", "ch99"], ["argument --chapters: ch99 names no chapter"]),
    (["--chapters", "ch06", "--parts", "tests"], ["argument --chapters: ch06 applies to the notebooks part"]),
])
def test_gpu_check_refuses_before_the_first_part(tmp, monkeypatch, capsys, args, words):
    from engine.tools import gpu_check
    monkeypatch.chdir(tmp)
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(gpu_check, "run", lambda *a, **k: pytest.fail("a part ran"))
    assert gpu_check.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and all(w in err for w in words), err
    assert sorted(p.name for p in tmp.iterdir()) == ["afile"]


def test_gpu_check_sh_refuses_an_out_that_is_a_file(tmp):
    env = {**os.environ, "OUT": str(tmp / "afile")}
    done = subprocess.run(["bash", str(REPO / "engine" / "tools" / "gpu_check.sh"), "--parts", "tests"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert_refused(done, f"$OUT {tmp / 'afile'} is a file")
    assert (tmp / "afile").read_text() == "a file\n"


@pytest.mark.parametrize("value", ["95", "71", "101", "abc"])
def test_compile_check_takes_only_real_architectures(tmp_path, value):
    done = run("engine.tools.compile_check", "--arch", value, "--quick", cwd=tmp_path)
    assert_refused(done, f"argument --arch: {value} is not a GPU architecture", "90, 100, 103, 110, 120")


# ---- finding 7: generate with a tiny temperature or top-p ---------------------------------------------------

@pytest.mark.parametrize("temperature, top_p", [(1e-38, 1.0), (1e-300, 1.0), (5e-324, 0.5), (1.0, 1e-300),
                                                (1e-5, 1e-45)])
def test_a_tiny_temperature_or_top_p_samples_the_likeliest_token(temperature, top_p):
    logits = torch.tensor([3.0, 40.0, -2.0, 39.5, 0.0])
    params = SamplingParams(temperature=temperature, top_p=top_p, seed=1)
    assert sample(logits, params, params.generator()) == 1
    assert params.greedy == (temperature < 1e-6)


def test_generate_with_a_tiny_temperature_runs(tmp_path):
    for args in (["--temperature", "1e-38"], ["--temperature", "1", "--top-p", "1e-300"]):
        done = run("engine", "generate", "--prompt", "hi", "--max-tokens", "2", *args, cwd=tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    help_text = " ".join(run("engine", "generate", "--help", cwd=tmp_path).stdout.split())
    assert "below 1e-6 is greedy" in help_text

