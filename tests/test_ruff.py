"""The linter is clean: ruff, configured in pyproject.toml, finds nothing in the engine and the tests."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: run make setup (it is pinned in requirements.txt)")
    result = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-1000:]


def test_ruff_would_catch_a_mistake(tmp_path):
    """The configuration is live: an unused import in a file under the project's settings is reported."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: run make setup (it is pinned in requirements.txt)")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    result = subprocess.run([ruff, "check", "--config", str(ROOT / "pyproject.toml"), str(bad)], capture_output=True,
                            text=True)
    assert result.returncode == 1 and "F401" in result.stdout
