"""Slot math: logical position p lives in block table[p // bs] at offset p % bs."""
import pytest
import torch

from engine.cache.slots import blocks_needed, ceil_div, check_block_size, physical_slot, slot_index, slot_mapping


def test_the_worked_example():
    # block size 4, table [5, 1, 7]: position 9 is logical block 2 -> physical block 7, offset 1
    assert physical_slot([5, 1, 7], 9, 4) == (7, 1)
    assert slot_index([5, 1, 7], 9, 4) == 7 * 4 + 1


def test_every_position_of_a_table_gets_a_distinct_slot_in_its_own_block():
    table, size = [3, 0, 6, 2], 5
    slots = [slot_index(table, p, size) for p in range(len(table) * size)]
    assert len(set(slots)) == len(slots)
    for p, slot in enumerate(slots):
        assert slot // size == table[p // size] and slot % size == p % size


@pytest.mark.parametrize("tokens, size, expected", [
    (0, 16, 0), (1, 16, 1), (15, 16, 1), (16, 16, 1), (17, 16, 2), (33, 16, 3), (40, 16, 3), (7, 1, 7),
])
def test_blocks_needed_is_the_ceiling(tokens, size, expected):
    assert blocks_needed(tokens, size) == expected


@pytest.mark.parametrize("a, b, expected", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (7, 1, 7), (-3, 4, 0)])
def test_ceil_div_rounds_up(a, b, expected):
    assert ceil_div(a, b) == expected


def test_ceil_div_agrees_with_blocks_needed():
    assert all(ceil_div(n, b) == blocks_needed(n, b) for n in range(70) for b in (1, 3, 16))


@pytest.mark.parametrize("bad", [0, -4, 2.0, "16", True, None])
def test_a_bad_block_size_is_named(bad):
    with pytest.raises(ValueError, match=f"block_size must be a positive int, got {bad!r}"):
        check_block_size(bad)
    with pytest.raises(ValueError, match="block_size"):
        blocks_needed(10, bad)


def test_positions_outside_the_table_are_refused_with_the_numbers():
    with pytest.raises(IndexError, match="position 12 is outside the 3 block"):
        physical_slot([5, 1, 7], 12, 4)
    with pytest.raises(IndexError, match="position -1"):
        slot_index([5], -1, 4)
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -1"):
        blocks_needed(-1, 4)


def test_slot_mapping_matches_slot_index_and_keeps_padding():
    size = 4
    tables = [[5, 1, 7], [2, 0, 0]]            # row 1 holds one real block, padded with 0
    positions = torch.tensor([[7, 8, 9, 10], [2, 3, -1, -1]])
    got = slot_mapping(torch.tensor(tables), positions, size)
    expected = [[slot_index(tables[b], int(p), size) if p >= 0 else -1 for p in positions[b]] for b in range(2)]
    assert got.tolist() == expected
    assert got[1, 2:].tolist() == [-1, -1]


def test_slot_mapping_of_pure_padding_needs_no_blocks():
    got = slot_mapping(torch.zeros(2, 0, dtype=torch.long), torch.full((2, 3), -1), 16)
    assert got.tolist() == [[-1] * 3] * 2


def test_slot_mapping_refuses_a_position_past_the_table():
    with pytest.raises(IndexError, match="position 12 needs block column 3, but the block tables have 3"):
        slot_mapping(torch.tensor([[5, 1, 7]]), torch.tensor([[11, 12]]), 4)
    with pytest.raises(ValueError, match="same B"):
        slot_mapping(torch.tensor([[5, 1, 7]]), torch.tensor([[1], [2]]), 4)
