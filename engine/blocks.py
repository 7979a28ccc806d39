"""Block arithmetic every part of the engine shares, with no torch: a valid block size, and a / b rounded up.

The lowest module of the runtime, so the caches, the attention kernels' reference and the scheduler can
all count blocks the same way without importing one another.
"""
from __future__ import annotations


def check_block_size(block_size) -> int:
    """Return block_size if it is a positive int; otherwise raise a ValueError naming the value."""
    # bool is a subclass of int, but block_size=True is always a mistake.
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return block_size


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up, for b > 0: the runtime's and the checks' one home for block counts and padded tiles.

    Untaught on purpose, so it works in every chapter's engine; the taught `blocks_needed` keeps its own body.
    """
    return -(-a // b)
