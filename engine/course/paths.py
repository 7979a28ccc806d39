"""Where things are: the repository root, the chapter sources and their names."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

CHAPTER_PATTERN = re.compile(r"^(ch\d\d)_[a-z0-9_]+$")


def repo_root(start: Path | None = None) -> Path:
    """The directory holding pyproject.toml and engine/, searched upward from `start` (default: here)."""
    here = Path(start or __file__).resolve()
    for candidate in [here, *here.parents]:
        if (candidate / "pyproject.toml").is_file() and (candidate / "engine").is_dir():
            return candidate
    raise FileNotFoundError(f"no repository root (pyproject.toml + engine/) above {here}")


def chapter_files(solutions_dir: Path | None = None) -> list[Path]:
    """The chapter sources `solutions/chNN_topic.py` (else released `chNN_topic.ipynb`), in chapter order."""
    folder = Path(solutions_dir) if solutions_dir else repo_root() / "solutions"
    found = sorted(path for path in folder.glob("ch*.py") if CHAPTER_PATTERN.match(path.stem))
    # a student edition grades against the released notebooks (course/chNN_topic.ipynb) instead
    return found or sorted(path for path in folder.glob("ch*.ipynb") if CHAPTER_PATTERN.match(path.stem))


def chapter_name(path: Path | str) -> str:
    """`solutions/ch02_block_tables.py` -> `ch02_block_tables` (also the notebook's file name)."""
    stem = Path(path).stem
    if not CHAPTER_PATTERN.match(stem):
        raise ValueError(f"{path}: a chapter is named chNN_topic (lowercase, digits, underscores)")
    return stem


def assignment_id(path: Path | str) -> str:
    """`ch02_block_tables` -> `ch02`: the nbgrader assignment that holds the chapter's notebook."""
    return CHAPTER_PATTERN.match(chapter_name(path)).group(1)


def venv_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ with this interpreter's bin/ first on PATH, so nbgrader and jupyter find the venv kernel."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    env.update(extra or {})
    return env


def offline_cpu_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment notebooks run in when graded or built: venv first, offline, CPU only.

    TRITON_INTERPRET=1 lets the kernel chapter run its Triton kernels on the CPU; the Hugging Face
    variables keep anything from reaching for the network. One thread per kernel: chapters are graded
    side by side, and the tiny model gains nothing from threads that only contend for the cores.
    """
    env = venv_environ(
        {
            "CUDA_VISIBLE_DEVICES": "",
            "TRITON_INTERPRET": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "COURSE_EXPLORERS": "static",  # explorers draw their default view only (the book turns this off)
        }
    )
    env.update(extra or {})
    return env


def chapter_source_refusal(path_text: str) -> str:
    """Why a CHAPTER argument is not a chapter source file ('' when it is one)."""
    if not path_text.strip():
        return "CHAPTER '' is empty: name a chapter source, e.g. solutions/ch02_block_tables.py"
    path = Path(path_text)
    if path.is_dir():
        return f"CHAPTER {path_text} is a folder: name the chapter sources in it (solutions/chNN_topic.py)"
    if path.suffix != ".py" or not CHAPTER_PATTERN.match(path.stem):
        return f"CHAPTER {path_text} is not a chapter source: expected a file named chNN_topic.py"
    if not path.is_file():
        return f"CHAPTER {path_text} does not exist"
    return ""


def solutions_refusal(solutions: Path) -> str:
    """Why --solutions holds no chapters to grade against ('' when it does)."""
    if not solutions.is_dir():
        return f"--solutions {solutions} is not a folder of chapter sources (chNN_topic.py)"
    if not chapter_files(solutions):
        return (f"--solutions {solutions} holds no chapter source (chNN_topic.py, or a student edition's "
                "chNN_topic.ipynb)")
    return ""
