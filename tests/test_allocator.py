"""BlockAllocator: a free list plus reference counts; failures name the numbers and change nothing."""
import pytest

from engine.cache.allocator import BlockAllocator
from engine.cache.errors import BlockRefError, CacheFull, OutOfBlocks


def test_allocate_hands_out_distinct_blocks_with_count_one():
    pool = BlockAllocator(8)
    blocks = pool.allocate(3) + pool.allocate()
    assert len(set(blocks)) == 4 and all(0 <= b < 8 for b in blocks)
    assert [pool.refcount(b) for b in blocks] == [1, 1, 1, 1]
    assert pool.num_free == 4 and pool.num_blocks == 8
    assert pool.allocate(0) == [] and pool.num_free == 4


def test_a_shared_block_is_freed_by_its_last_owner_only():
    pool = BlockAllocator(4)
    [block] = pool.allocate()
    pool.share(block)
    pool.share(block)
    assert pool.refcount(block) == 3
    pool.release(block)
    pool.release(block)
    assert pool.refcount(block) == 1 and block not in pool.free and pool.num_free == 3
    pool.release(block)
    assert pool.refcount(block) == 0 and pool.num_free == 4


def test_shortage_raises_out_of_blocks_with_the_numbers_and_changes_nothing():
    pool = BlockAllocator(5)
    held = pool.allocate(3)
    pool.share(held[0])
    before = (list(pool.free), list(pool.refs))
    with pytest.raises(OutOfBlocks, match="wanted 3 block\\(s\\), 2 free") as caught:
        pool.allocate(3)
    assert (caught.value.wanted, caught.value.free) == (3, 2)
    assert isinstance(caught.value, CacheFull) and isinstance(caught.value, MemoryError)
    assert (list(pool.free), list(pool.refs)) == before        # all or nothing: not a single block taken
    assert len(pool.allocate(2)) == 2                          # and what was there is still there


def test_releasing_a_free_block_says_which_block():
    pool = BlockAllocator(4)
    [block] = pool.allocate()
    pool.release(block)
    with pytest.raises(BlockRefError, match=f"block {block} released too often") as caught:
        pool.release(block)
    assert caught.value.block == block
    assert pool.num_free == 4 and list(pool.free).count(block) == 1   # never on the free list twice


def test_sharing_a_free_block_is_a_use_after_free():
    pool = BlockAllocator(4)
    with pytest.raises(BlockRefError, match="block 2 is free") as caught:
        pool.share(2)
    assert caught.value.block == 2 and pool.refcount(2) == 0


@pytest.mark.parametrize("bad", [-1, 4, 100, "1", 1.0, None, True])
def test_ids_outside_the_pool_are_named(bad):
    pool = BlockAllocator(4)
    for method in (pool.share, pool.release, pool.refcount):
        with pytest.raises(IndexError, match=f"block {bad!r} is not in this pool of 4 blocks"):
            method(bad)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_bad_counts_are_refused(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        BlockAllocator(4).allocate(bad)
    with pytest.raises(ValueError, match=repr(bad)):
        BlockAllocator(bad)


def test_freed_blocks_come_back_last_in_line():
    # First in, first out: a just-freed block is reused last, which spreads wear and aids debugging.
    pool = BlockAllocator(3)
    a, b, c = pool.allocate(3)
    pool.release(b)
    pool.release(a)
    assert pool.allocate(2) == [b, a]


def test_every_method_has_a_one_line_docstring_and_a_short_body():
    # The course pulls this class verbatim and stubs out each body after its docstring.
    import inspect
    for name, member in vars(BlockAllocator).items():
        function = member.fget if isinstance(member, property) else member
        if not callable(function):
            continue
        doc = inspect.getdoc(function)
        assert doc and "\n" not in doc, f"{name} needs a one-line docstring"
        assert len(inspect.getsource(function).splitlines()) <= 15, f"{name} is too long to be a good exercise"
