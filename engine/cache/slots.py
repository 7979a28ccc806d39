"""Slot math: where logical position `p` of a sequence lives in a pool of fixed-size blocks.

A sequence's block table maps logical block `p // block_size` to a physical block; inside that
block the token sits at offset `p % block_size`. Flattening (block, offset) gives one slot index,
`table[p // bs] * bs + p % bs`, the number a kernel uses to address a pool `[num_blocks * bs, ...]`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.blocks import ceil_div, check_block_size  # noqa: F401  (slots.check_block_size: the chapters import it here)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """How many blocks hold num_tokens tokens: num_tokens / block_size, rounded up."""
    check_block_size(block_size)
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // block_size)


def physical_slot(table: Sequence[int], pos: int, block_size: int) -> tuple[int, int]:
    """(physical block, offset inside it) of logical position pos, through the table."""
    check_block_size(block_size)
    slots = len(table) * block_size
    if not 0 <= pos < slots:
        raise IndexError(f"position {pos} is outside the {len(table)} block(s) of this "
                         f"table ({slots} slots of block_size {block_size})")
    return table[pos // block_size], pos % block_size


def slot_index(table: Sequence[int], pos: int, block_size: int) -> int:
    """Flat slot of position pos: table[pos // block_size] * block_size + offset."""
    block, offset = physical_slot(table, pos, block_size)
    return block * block_size + offset


def slot_mapping(block_tables: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """Flat slots [B, T] for positions [B, T] through block_tables [B, M]; -1 stays -1.

    The caller makes sure each valid position lies inside its row's table (reserve did).
    """
    check_block_size(block_size)
    tables, rows = tuple(block_tables.shape), tuple(positions.shape)
    if len(tables) != 2 or len(rows) != 2 or tables[0] != rows[0]:
        raise ValueError(f"block_tables {tables} and positions {rows} must be [B, M] "
                         "and [B, T] with the same B")
    valid = positions >= 0
    safe = positions.clamp(min=0)      # padding reads column 0, then is masked to -1
    columns = safe // block_size
    if bool((columns[valid] >= tables[1]).any()):
        longest = int(positions.max())
        raise IndexError(f"position {longest} needs block column "
                         f"{longest // block_size}, but the block tables have "
                         f"{tables[1]} column(s)")
    if tables[1] == 0:                 # nothing but padding, and no blocks to look up
        return torch.full_like(positions, -1)
    blocks = torch.gather(block_tables.long(), 1, columns)
    slots = blocks * block_size + safe % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1))
