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
