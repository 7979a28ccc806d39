"""The demo commands of `python -m engine`: paged, fork, prefix, bench-alloc.

Each module has `add_arguments(parser)` and `main(args)` and prints one JSON object, which the tests
read back; the figures are computed by the engine's own caches, never typed in.
"""
from __future__ import annotations

import json

import torch


def emit(result: dict) -> dict:
    """Print a demo's result as one JSON line (what the tests parse) and hand it back."""
    print(json.dumps(result))
    return result


def max_abs_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """The largest absolute difference between matching logits tensors."""
    return max(float((g - w).abs().max()) for g, w in zip(got, want))
