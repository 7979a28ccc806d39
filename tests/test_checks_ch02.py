"""The chapter-2 checks pass on the engine's reference, fail on stubs, and fail on classic bugs with a
message that says what went wrong."""
import pytest
import torch

from engine.cache import slots
from engine.cache.allocator import BlockAllocator
from engine.cache.errors import OutOfBlocks
from engine.checks import CheckFailed, ch02
from fixtures.check_support import by_name, cases, fails, fails_with, passes, stub

SLOT_CHECKS = [
    (ch02.check_physical_slot, slots.physical_slot),
    (ch02.check_slot_index, slots.slot_index),
    (ch02.check_blocks_needed, slots.blocks_needed),
    (ch02.check_slot_mapping, slots.slot_mapping),
]
ALLOCATOR_CHECKS = [
    ch02.check_allocator_basics,
    ch02.check_allocator_errors,
    ch02.check_refcounts_balance,
    ch02.check_allocator_in_engine,
]


# ---- the reference passes -------------------------------------------------------------------------

@pytest.mark.parametrize("check, fn", SLOT_CHECKS, ids=by_name)
def test_reference_slot_math_passes(check, fn):
    passes(check, fn)


@pytest.mark.parametrize("check", ALLOCATOR_CHECKS, ids=by_name)
def test_reference_allocator_passes(check):
    passes(check, BlockAllocator)


# ---- stubs are "not implemented yet" ---------------------------------------------------------------

def stub_function(*args, **kwargs):
    raise NotImplementedError()


StubAllocator = stub(BlockAllocator, "allocate", "share", "release", name="StubAllocator")
STUBS = [(check, stub_function, "stub_function") for check, _ in SLOT_CHECKS] + [
    (check, StubAllocator, "StubAllocator.allocate") for check in ALLOCATOR_CHECKS]


@pytest.mark.parametrize("check, unwritten, where", STUBS, ids=by_name)
def test_stub_is_not_implemented(check, unwritten, where):
    fails_with(check, unwritten, [where, "not implemented yet"])


def test_a_crash_is_reported_with_its_place():
    def crashes(table, pos, bs):
        return table[pos]  # IndexError for most positions

    fails_with(ch02.check_physical_slot, crashes, ["crashes", ("expected (7, 1)", "IndexError")])


# ---- planted bugs in the slot math ----------------------------------------------------------------

def slot_before_boundary(table, pos, bs):
    """Treats the first slot of a block as the last of the previous one."""
    return table[(pos - 1) // bs if pos else 0], pos % bs


def slot_ignores_table(table, pos, bs):
    """Returns the logical block, not the physical one."""
    return pos // bs, pos % bs


def index_without_scale(table, pos, bs):
    return table[pos // bs] + pos % bs


def index_one_past(table, pos, bs):
    return table[pos // bs] * bs + pos % bs + 1


def blocks_floor_plus_one(n, bs):
    return n // bs + 1


def blocks_floor(n, bs):
    return n // bs


def mapping_keeps_padding(block_tables, positions, bs):
    safe = positions.clamp(min=0)
    return block_tables.gather(1, safe // bs) * bs + safe % bs


def index_ignores_table(table, pos, bs):
    """The flat slot of the logical block: the position itself."""
    return pos


def mapping_ignores_table(block_tables, positions, bs):
    """Returns the logical slots: the positions, padding kept at -1."""
    return torch.where(positions >= 0, positions, -1)


def mapping_next_block(block_tables, positions, bs):
    """(pos + 1) // bs: the last slot of each block put in the next block (and past a full table)."""
    safe = positions.clamp(min=0)
    return torch.where(positions >= 0, block_tables.gather(1, (safe + 1) // bs) * bs + safe % bs, -1)


def mapping_row_zero(block_tables, positions, bs):
    """Every row's positions looked up in the first row's table."""
    safe = positions.clamp(min=0)
    return torch.where(positions >= 0, block_tables[0][safe // bs] * bs + safe % bs, -1)


def mapping_off_by_one(block_tables, positions, bs):
    out = slots.slot_mapping(block_tables, positions, bs)
    return out.where(positions < 0, out + 1)


@pytest.mark.parametrize("check, bug, words", cases({
    ch02.check_physical_slot: {
        slot_before_boundary: ["FIRST slot of logical block"],
        slot_ignores_table: ["worked example", "expected (7, 1), got (2, 1)", "block table was ignored"],
    },
    ch02.check_slot_index: {
        index_without_scale: ["expected 29, got 8", "block id was not scaled"],
        index_one_past: ["expected 29, got 30", "one slot off"],
        index_ignores_table: ["expected 29, got 9", "block table was ignored"],
    },
    ch02.check_blocks_needed: {
        blocks_floor_plus_one: ["blocks_needed(0, 16)", "expected 0, got 1"],
        blocks_floor: ["expected 1, got 0", "start one more"],
    },
    ch02.check_slot_mapping: {
        mapping_keeps_padding: ["position -1", "expected -1", "padding"],
        mapping_off_by_one: ["expected 28, got 29", "one slot off"],
        mapping_ignores_table: ["expected 28, got 8", "block table was ignored", "table[pos // bs] = 7"],
        mapping_next_block: ["slot_mapping crashed with", "index 3 is out of bounds", "off by one at a block boundary",
                             "(pos + 1) // bs"],
        mapping_row_zero: ["row 1 (table [2, 9, 0]), position 3", "expected 11, got 23",
                           "every row read the first table row", "block_tables[b, pos // bs]"],
    },
}), ids=by_name)
def test_slot_math_bug_is_caught(check, bug, words):
    fails_with(check, bug, words)


# ---- planted bugs in the allocator (each overrides one method through the public API) --------------

class HalfAllocate(BlockAllocator):
    """Takes blocks one at a time and raises when it runs dry, keeping what it took."""

    def allocate(self, n=1):
        blocks = []
        for _ in range(n):
            if self.num_free == 0:
                raise OutOfBlocks(n, 0)
            blocks += super().allocate(1)
        return blocks


class SilentDoubleFree(BlockAllocator):
    def release(self, block):
        if self.refcount(block) > 0:
            super().release(block)


class SilentShareOfFree(BlockAllocator):
    def share(self, block):
        if self.refcount(block) > 0:
            super().share(block)


class LeakyRelease(BlockAllocator):
    """The last owner's release is dropped: the block never returns to the free list."""

    def release(self, block):
        if self.refcount(block) > 1:
            super().release(block)


class EagerRelease(BlockAllocator):
    """Any release frees the block, whoever else still names it."""

    def release(self, block):
        while self.refcount(block) > 0:
            super().release(block)


class FreesWhileOwned(BlockAllocator):
    """Drops one reference, but puts the block back on the free list even when owners remain."""

    def release(self, block):
        shared = self.refcount(block) > 1
        super().release(block)
        if shared:
            self.free.append(block)


class HandsOutLiveBlock(BlockAllocator):
    """From the fourth call on, allocate(1) hands out a block that is still in use."""

    calls = 0

    def allocate(self, n=1):
        blocks = super().allocate(n)
        self.calls += 1
        if n == 1 and self.calls > 3 and self.num_free < self.num_blocks - 2:
            super().release(blocks[0])
            in_use = next(b for b in range(self.num_blocks) if self.refcount(b) > 0)
            return [in_use]
        return blocks


@pytest.mark.parametrize("check, bug, words", [
    (ch02.check_allocator_errors, HalfAllocate, ["must change nothing", "BEFORE taking any"]),
    (ch02.check_allocator_errors, SilentDoubleFree, ["double free", "BlockRefError to be raised", "no error"]),
    (ch02.check_allocator_errors, SilentShareOfFree, ["share", "of a free block", "no error"]),
    (ch02.check_allocator_basics, LeakyRelease, ["after the last release", "expected 0, got 1"]),
    (ch02.check_allocator_basics, EagerRelease, ["then release", "expected 1, got 0", "ONE reference",
                                                 "until its last owner releases it"]),
    (ch02.check_allocator_basics, HandsOutLiveBlock, ["allocate() call 3 of 8", "still in use",
                                                      "handed out twice", "only from the free list"]),
    (ch02.check_refcounts_balance, LeakyRelease, ["never dropped (a leak)"]),
    (ch02.check_refcounts_balance, EagerRelease, ["dropped more than one reference", "use after free"]),
    (ch02.check_allocator_basics, FreesWhileOwned, ["expected 4, got 5", "while it still has an owner"]),
    (ch02.check_refcounts_balance, FreesWhileOwned, ["while a table still names it"]),
    (ch02.check_allocator_in_engine, FreesWhileOwned, ["expected 24, got 27", "on the free list twice"]),
    (ch02.check_allocator_in_engine, LeakyRelease, ["releasing it", "expected 24, got 0", "(a leak)"]),
    (ch02.check_allocator_in_engine, EagerRelease, ["refcount of the child's block", "expected 1, got 0",
                                                    "freed the child's block"]),
    (ch02.check_allocator_in_engine, HandsOutLiveBlock,
     ["from-scratch run", "max |Δ|", ("twice", "in the tables of both"), "still in use"]),
], ids=by_name)
def test_allocator_bug_is_caught(check, bug, words):
    fails_with(check, bug, words)


def test_a_live_block_handed_out_again_is_named_with_its_refcount():
    fails_with(ch02.check_allocator_basics, HandsOutLiveBlock, ["it handed out block", "(refcount 1)"])


@pytest.mark.parametrize("bug", [HalfAllocate, SilentDoubleFree, SilentShareOfFree, LeakyRelease, EagerRelease,
                                 FreesWhileOwned, HandsOutLiveBlock], ids=by_name)
def test_every_planted_allocator_bug_fails_a_bookkeeping_check(bug):
    # The basics check covers normal use (allocate, share, release); the error paths (a failed
    # allocation, a double free, a share of a free block) are the errors check's. Together, with no
    # model run, they catch every planted bug.
    caught = []
    for check in (ch02.check_allocator_basics, ch02.check_allocator_errors):
        try:
            check(bug)
        except CheckFailed:
            caught.append(check.__name__)
    assert caught, f"{bug.__name__} passes both the basics and the errors check"


def test_a_table_ignored_is_not_called_an_off_by_one():
    for check, bug in ((ch02.check_slot_mapping, mapping_ignores_table),
                       (ch02.check_slot_index, index_ignores_table),
                       (ch02.check_physical_slot, slot_ignores_table)):
        assert "+1 or -1" not in fails(check, bug)


@pytest.mark.parametrize("check", [ch02.check_allocator_basics, ch02.check_refcounts_balance,
                                   ch02.check_allocator_in_engine], ids=by_name)
@pytest.mark.parametrize("bug", [EagerRelease, FreesWhileOwned], ids=by_name)
def test_freeing_a_block_with_owners_is_not_called_a_leak(check, bug):
    assert "leak" not in fails(check, bug)


def test_half_allocation_names_the_leaked_blocks():
    fails_with(ch02.check_allocator_errors, HalfAllocate, ["num_free 0"])  # it took the last 2 free blocks


# ---- the chapter's small exercise ------------------------------------------------------------------

def utilization(lengths, block_size):
    return sum(lengths) / (sum(-(-n // block_size) for n in lengths) * block_size)


def utilization_floor(lengths, block_size):
    return sum(lengths) / (sum(n // block_size for n in lengths) * block_size)


def utilization_of_a_reservation(lengths, block_size):
    return sum(lengths) / (len(lengths) * max(lengths))


def test_utilization_reference_passes():
    assert "98.7%" in passes(ch02.check_paged_utilization, utilization)


@pytest.mark.parametrize("bug, words", [
    (utilization_floor, ["paged_utilization([3, 4, 5, 9], block_size=4)", "21/28 = 0.7500", "whole block"]),
    (utilization_of_a_reservation, ["21/28 = 0.7500", "got 0.5833"]),
    (stub_function, ["not implemented yet"]),
], ids=by_name)
def test_utilization_bug_is_caught(bug, words):
    fails_with(ch02.check_paged_utilization, bug, words)
