"""Shared test setup: Triton's interpreter on machines without CUDA, and the tiny model."""
import os

import torch

# Must happen before any module defines a Triton kernel (the interpreter is chosen at decoration time).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    """The course's tiny seeded Qwen3 (fp32, CPU)."""
    from engine.checkpoint import tiny_model
    return tiny_model(seed=0)


@pytest.fixture
def one_thread():
    """The tiny model runs fastest on one thread (no thread handoffs); restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The files that take minutes (grading runs, the book build, JupyterLab and Chromium) run first, so that
# `make test`'s two workers (-n 2 --dist loadfile --no-loadscope-reorder) do not end on one long file
# while the other idles, and the book is built before the browser tests that read it start.
SLOWEST_FIRST = ["test_course_pipeline.py", "test_lab_notebooks.py", "test_course_book.py", "test_hub_e2e.py",
                 "test_grade_sandbox.py", "test_grade_edition.py", "test_grade_attacks.py", "test_grade_tamper.py",
                 "test_course_class.py", "test_course_cluster.py", "test_course_browser.py"]


def pytest_collection_modifyitems(items):
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: the rest keep their order
