"""The layers of engine/ hold (pyproject.toml's import contract, run by `lint-imports`), and the contract
would catch a break: the same run on a copy of the engine with one import planted against it fails."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the engine under `root`, with its pyproject.toml, and no cache."""
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_engine_keeps_its_layers_and_has_no_import_circle():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 kept, 0 broken" in done.stdout


def planted(tmp_path: Path, plants: dict[str, str]) -> subprocess.CompletedProcess:
    """lint-imports on a copy of the engine where each file of `plants` (under engine/) gains a function
    that imports the module named."""
    shutil.copytree(REPO / "engine", tmp_path / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for i, (name, module) in enumerate(plants.items()):
        path = tmp_path / "engine" / name
        path.write_text(path.read_text() + f"\n\ndef _planted_{i}():\n    import {module}  # noqa: F401\n")
    return lint_imports(tmp_path)


def test_a_planted_import_from_the_runtime_into_the_course_breaks_the_layers(tmp_path):
    done = planted(tmp_path, {"model.py": "engine.course.paths"})
    assert done.returncode != 0
    assert "engine.model -> engine.course.paths" in done.stdout, done.stdout[-3000:]
    assert "engine layers: runtime < checks, tools (independent) < course < __main__ BROKEN" in done.stdout


def test_a_planted_import_from_authoring_into_grading_breaks_the_course_layers(tmp_path):
    """The course's three products: what makes the chapters and the book (authoring) never imports the
    grader, nor the grader the class."""
    done = planted(tmp_path, {"course/authoring/release.py": "engine.course.grading.sandbox",
                              "course/grading/grade.py": "engine.course.classroom.reports"})
    assert done.returncode != 0, done.stdout[-3000:]
    assert "engine.course.authoring.release -> engine.course.grading.sandbox" in done.stdout, done.stdout[-3000:]
    assert "engine.course.grading.grade -> engine.course.classroom.reports" in done.stdout, done.stdout[-3000:]


def test_a_planted_import_from_the_checks_into_the_tools_breaks_the_layers(tmp_path):
    done = planted(tmp_path, {"checks/ch01.py": "engine.tools.simulate"})
    assert done.returncode != 0 and "engine.checks.ch01 -> engine.tools.simulate" in done.stdout, done.stdout[-3000:]


def test_a_planted_circle_between_two_tools_breaks_the_acyclic_contract(tmp_path):
    done = planted(tmp_path, {"tools/simulate.py": "engine.tools.cli", "tools/cli.py": "engine.tools.simulate"})
    assert done.returncode != 0 and "No cycles are allowed in engine.tools." in done.stdout, done.stdout[-3000:]
