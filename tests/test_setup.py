"""The environment is pinned once: requirements.txt, environment.yml and constraints agree."""
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def pins(lines):
    return {line.strip() for line in lines if re.match(r"^[A-Za-z0-9_.\-\[\]]+==", line.strip())}


def test_every_requirement_is_pinned_exactly():
    lines = [l for l in (ROOT / "requirements.txt").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines and all("==" in l for l in lines), [l for l in lines if "==" not in l]
    assert "torch==2.13.0" in lines
    assert 'triton==3.7.1; sys_platform == "linux"' in lines


def test_environment_yml_names_exactly_the_requirements_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "python=3.11" in env["dependencies"]
    assert pins(pip_section) == pins((ROOT / "requirements.txt").read_text().splitlines())


def test_constraints_agree_with_requirements():
    constraints = dict(l.split("==") for l in pins((ROOT / "constraints.txt").read_text().splitlines()))
    for pin in pins((ROOT / "requirements.txt").read_text().splitlines()):
        name, version = pin.split(";")[0].split("==")
        if name not in ("torch", "triton"):
            assert constraints.get(name) == version, \
                f"{name}: requirements {version}, constraints {constraints.get(name)}"


LAYOUT = {"book", "notebooks", "engine", "solutions", "tests", "environment.yml", "Makefile", "README.md"}
PACKAGING = {"pyproject.toml", "requirements.txt", "constraints.txt", ".ci", ".gitignore"}


def test_top_level_layout_is_exactly_the_course_layout():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip(f"not a git checkout: {tracked.stderr.strip()}")
    top = {path.split("/")[0] for path in tracked.stdout.splitlines()}
    assert LAYOUT <= top, f"missing: {sorted(LAYOUT - top)}"
    assert top <= LAYOUT | PACKAGING, f"unexpected top-level entries: {sorted(top - LAYOUT - PACKAGING)}"


def test_the_offline_book_and_the_browser_tests_are_in_the_pinned_environment():
    """MathJax for the book and Playwright for the browser tests come from pinned packages; CI installs
    the system's Chromium and poppler and runs the browser tests with CI=true (a skip is a failure)."""
    pinned = {pin.split("==")[0] for pin in pins((ROOT / "requirements.txt").read_text().splitlines())}
    assert {"sphinx-mathjax-offline", "playwright"} <= pinned
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export CI=true" in ci and "chromium" in ci and "poppler-utils" in ci
    config = yaml.safe_load((ROOT / "book" / "_config.yml").read_text())
    assert "sphinx-mathjax-offline" in config["sphinx"]["config"]["extensions"]


def test_a_browser_test_without_chromium_skips_with_a_hint_and_fails_in_ci(monkeypatch):
    import fixtures.browser_support as browser_support

    monkeypatch.setattr(browser_support, "chromium_executable", lambda: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        browser_support.need_chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        browser_support.need_chromium()
