"""BlockTables, the paged cache's bookkeeping: tables, lengths and refcounts answered from ints alone,
with no tensor and no model (each test runs in microseconds)."""
import ast
from pathlib import Path

import pytest

import engine.cache.block_tables
from engine.cache.allocator import BlockAllocator
from engine.cache.block_tables import BlockTables

BS = 4


def books_with(*lengths, num_blocks=16, away=()):
    """BlockTables where sequence i holds lengths[i] tokens in just the blocks they need."""
    books = BlockTables(BS, BlockAllocator(num_blocks), away=away)
    for seq, n in enumerate(lengths):
        books.create(seq)
        books.tables[seq].extend(books.allocator.allocate(-(-n // BS)))
        books.set_length(seq, n)
    return books


def forked(length):
    """Sequence 0 of `length` tokens, and sequence 1 naming all of its blocks (a fork: refcount 2 each)."""
    books = books_with(length)
    books.create(1)
    books.share_blocks(1, books.tables[0])
    books.set_length(1, length)
    return books


def test_the_module_imports_no_torch():
    tree = ast.parse(Path(engine.cache.block_tables.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name == "torch" or name.startswith("torch.") for name in names)


def test_create_starts_empty_and_refuses_a_sequence_that_exists():
    books = BlockTables(BS, BlockAllocator(4), away={7})
    books.create(0)
    assert books.table(0) == [] and books.length(0) == 0
    with pytest.raises(ValueError, match="sequence 0 already exists"):
        books.create(0)
    with pytest.raises(ValueError, match="sequence 7 already exists"):   # swapped out still exists
        books.create(7)


def test_table_says_why_there_is_none():
    books = books_with(3, away={5})
    assert books.table(0) is books.tables[0]                           # the list itself, not a copy
    with pytest.raises(KeyError, match="sequence 9 is unknown \\(create it first\\)"):
        books.table(9)
    with pytest.raises(KeyError, match="sequence 5 is swapped out \\(swap_in first\\)"):
        books.length(5)


@pytest.mark.parametrize("length, shared", [(BS - 1, [0]), (BS, []), (BS + 1, [1]), (2 * BS + 1, [2])])
def test_one_new_token_writes_into_the_shared_block_it_lands_in(length, shared):
    """Position `length` lands in block length // BS: shared if the table has it, a new block if not."""
    books = forked(length)
    assert books.shared_writes(1, 1) == shared
    assert books.shared_writes(1, 0) == []                             # no token, no write


def test_many_new_tokens_write_into_every_shared_block_they_cross():
    books = forked(BS - 1)
    books.tables[0].extend(books.allocator.allocate(1))                # seq 0 reserved a 2nd block
    books.share_blocks(1, [books.tables[0][1]]) if False else None
    assert books.shared_writes(1, BS + 1) == [0]                       # seq 1 has 1 block: only it
    assert books.shared_writes(0, BS + 1) == [0]                       # seq 0's 2nd block is its own


def test_a_private_block_is_no_shared_write():
    books = forked(BS + 1)
    assert books.shared_writes(1, 1) == [1]
    books.allocator.release(books.tables[0][1])                        # seq 0 lets go: seq 1 owns it alone
    books.tables[0][1] = books.allocator.allocate(1)[0]
    assert books.shared_writes(1, 1) == [] and books.shared_writes(0, 1) == []


@pytest.mark.parametrize("n", [-1, True, 1.0, "2"])
def test_shared_writes_refuses_what_is_no_token_count(n):
    with pytest.raises(ValueError, match="can only reserve an int >= 0 of tokens"):
        forked(BS).shared_writes(1, n)


@pytest.mark.parametrize("length, n, wanted", [
    (BS - 1, 1, 1),            # copy block 0, no new block
    (BS, 1, 1),                # block 0 is full: one new block, nothing copied
    (BS + 1, BS, 2),           # copy block 1, add block 2
    (2 * BS + 1, 0, 0),        # nothing written, nothing taken
    (BS - 1, 2 * BS + 1, 3),   # copy block 0, add blocks 1 and 2
])
def test_blocks_wanted_counts_copies_of_shared_blocks_and_new_ones(length, n, wanted):
    books = forked(length)
    free, refs = books.allocator.num_free, list(books.allocator.refs)
    assert books.blocks_wanted(1, n) == wanted
    assert (books.allocator.num_free, books.allocator.refs) == (free, refs)   # a question changes nothing


def test_blocks_wanted_without_sharing_is_the_blocks_past_the_table():
    books = books_with(BS + 1)
    assert [books.blocks_wanted(0, n) for n in (0, BS - 1, BS, 2 * BS - 1, 2 * BS)] == [0, 0, 1, 1, 2]


def test_share_blocks_adds_an_owner_to_each_and_appends_them():
    books = books_with(2 * BS, 0)
    blocks = list(books.tables[0])
    books.share_blocks(1, blocks)
    assert books.tables[1] == blocks and [books.allocator.refcount(b) for b in blocks] == [2, 2]


def test_share_blocks_refuses_a_free_block_and_changes_nothing():
    books = books_with(2 * BS, 0, num_blocks=4)
    held = books.tables[0][0]
    [free] = [b for b in range(4) if books.allocator.refcount(b) == 0][:1]
    refs = list(books.allocator.refs)
    with pytest.raises(ValueError, match=f"sequence 1: block {free} is free"):
        books.share_blocks(1, [held, free])
    assert books.tables[1] == [] and books.allocator.refs == refs      # not even the first block


@pytest.mark.parametrize("length", [0, 1, 2 * BS])
def test_set_length_takes_any_count_its_blocks_hold(length):
    books = books_with(2 * BS)
    books.set_length(0, length)
    assert books.length(0) == length


@pytest.mark.parametrize("length", [-1, 2 * BS + 1, True, 2.0, None])
def test_set_length_refuses_a_count_outside_its_blocks(length):
    books = books_with(2 * BS)
    with pytest.raises(ValueError, match="outside the 8 slots of its blocks"):
        books.set_length(0, length)
    assert books.length(0) == 2 * BS
