"""Chapter 2's checks: slot math, the refcounted block allocator, and the allocator inside the engine.

Each check takes the learner's function or class. The slot math is compared with the arithmetic it
must implement (`table[p // bs]`, `p % bs`); the allocator is driven through scripted workloads and
compared with a model of what its refcounts must be; the decisive check plugs the allocator into the
engine's `PagedKVCache` and compares every logit with a from-scratch run of the same model. The cache's
methods that chapters 3 and 4 teach are done here, plainly (`BlockTableCache`), so the check runs in an
edition of the engine where those chapters are still to write.
"""

from __future__ import annotations

import random

import torch

from engine.cache.errors import BlockRefError, OutOfBlocks
from engine.cache.paged import PagedKVCache
from engine.checks import (ATOL, CheckFailed, ceil_div, check, compare_logits, expect_equal, expect_raises, fail,
                           passed, tiny, where_it_lives)
from engine.seeded import seeded_tokens

# Block sizes and lengths where slot math goes wrong: one short of a block, a full block, one past.
BLOCK_SIZES = (1, 2, 4, 16)


def _boundary_lengths(bs: int) -> list[int]:
    return sorted({1, bs - 1, bs, bs + 1, 2 * bs, 2 * bs + 1, 3 * bs + 2} - {0})


def _table_for(length: int, bs: int, seed: int) -> list[int]:
    """A block table in scrambled physical order, long enough for `length` tokens."""
    count = ceil_div(length, bs)
    rng = random.Random(seed)
    return rng.sample(range(100, 100 + 4 * count + 4), count)


def paged_figures(lengths: list[int], block_size: int) -> dict:
    """What a paged cache with blocks of `block_size` reserves for requests of `lengths` tokens: the same
    figures as engine.tools.demos.paged.paged_figures (which stores them in a PagedKVCache), counted with the
    runtime's ceiling division, so the chapter's figures run in every edition of the engine, before the
    learner's slot math and chapter 3's cache are written."""
    blocks = [ceil_div(n, block_size) for n in lengths]
    slots = sum(blocks) * block_size
    return {"block_size": block_size, "tokens_stored": sum(lengths), "slots_reserved": slots,
            "utilization": round(sum(lengths) / slots, 3) if slots else 0.0,
            "mean_table_length": round(sum(blocks) / len(lengths), 1) if lengths else 0.0}


# --------------------------------------------------------------------------------------------------
# slot math
# --------------------------------------------------------------------------------------------------

@check
def check_physical_slot(physical_slot) -> None:
    """`physical_slot(table, pos, bs) -> (block, offset)`: the worked example, then every boundary."""
    got = physical_slot([5, 1, 7], 9, 4)
    got = tuple(got) if isinstance(got, (tuple, list)) else got
    expect_equal(got, (7, 1),
                 "physical_slot([5, 1, 7], 9, 4), the worked example: position 9 with blocks of 4",
                 _pair_hint([5, 1, 7], 9, 4, got) if got == (2, 1) else
                 "position 9 is in logical block 9 // 4 = 2, which the table maps to physical block 7, "
                 "at offset 9 % 4 = 1")
    cases = 1
    for bs in BLOCK_SIZES:
        for length in _boundary_lengths(bs):
            table = _table_for(length, bs, seed=length * 31 + bs)
            for pos in sorted({0, length - 1, max(length - 2, 0)}):
                want = (table[pos // bs], pos % bs)
                got = physical_slot(list(table), pos, bs)
                got = tuple(got) if isinstance(got, (tuple, list)) else got
                expect_equal(got, want, f"physical_slot(table={table}, pos={pos}, bs={bs})",
                             _pair_hint(table, pos, bs, got))
                cases += 1
    passed(f"physical_slot: {cases} positions, including the last slot of a block and the first of "
           f"the next; table [5, 1, 7], position 9, bs 4 -> block 7, offset 1")


@check
def check_slot_index(slot_index) -> None:
    """`slot_index(table, pos, bs)`: the flat index of a position's slot in the pool."""
    got = slot_index([5, 1, 7], 9, 4)
    expect_equal(got, 7 * 4 + 1, "slot_index([5, 1, 7], 9, 4): block 7, offset 1, blocks of 4 slots",
                 _slot_hint([5, 1, 7], 9, 4, got))
    checked = 1
    for bs in BLOCK_SIZES:
        for length in _boundary_lengths(bs):
            table = _table_for(length, bs, seed=length * 17 + bs)
            slots = []
            for pos in range(length):
                want = table[pos // bs] * bs + pos % bs
                got = slot_index(list(table), pos, bs)
                expect_equal(got, want, f"slot_index(table={table}, pos={pos}, bs={bs})",
                             _slot_hint(table, pos, bs, got))
                slots.append(got)
                checked += 1
            if len(set(slots)) != len(slots):
                fail(f"slot_index gave two positions of one sequence (length {length}, bs {bs}) the same "
                     f"slot", hint="each position must land in its own slot")
    passed(f"slot_index: {checked} positions across block sizes {list(BLOCK_SIZES)}, every slot "
           f"distinct; table [5, 1, 7], position 9, bs 4 -> slot 29")


@check
def check_blocks_needed(blocks_needed) -> None:
    """`blocks_needed(n, bs)`: the ceiling of n / bs, 0 for an empty sequence."""
    expect_equal(blocks_needed(0, 16), 0, "blocks_needed(0, 16): an empty sequence",
                 "no tokens need no blocks")
    checked = 1
    for bs in BLOCK_SIZES:
        for n in _boundary_lengths(bs):
            want = ceil_div(n, bs)
            expect_equal(blocks_needed(n, bs), want, f"blocks_needed({n}, {bs})",
                         f"{n} tokens fill {n // bs} whole block(s) of {bs}"
                         + (" and start one more" if n % bs else ", with no partial block"))
            checked += 1
    expect_equal(blocks_needed(40, 16), 3, "blocks_needed(40, 16), the chapter's example",
                 "40 tokens fill 2 whole blocks of 16 and start one more")
    passed(f"blocks_needed: {checked + 1} lengths, including bs-1, bs, bs+1 and 2bs+1; 40 tokens in "
           "blocks of 16 need 3")


OFF_BY_ONE_BLOCK = ("off by one at a block boundary: each position was put in the logical block of the position "
                    "after it ((pos + 1) // bs), so the last slot of every block lands in the next block, and "
                    "the last position of a full table runs past it. Logical block = pos // bs, offset = pos % bs")
ROW_ZERO = ("every row read the first table row: row b's positions map through its own table, "
            "block_tables[b, pos // bs], not block_tables[0, ...] (index the table with the row too)")
WRONG_ROW = ("each row read another row's table: row b's positions map through block_tables[b, pos // bs]; "
             "keep the batch index of each position when you look its block up")


def _mapping_probe(slot_mapping) -> str | None:
    """The classic slot_mapping bug that reproduces the learner's answer on a batch whose tables are wide
    enough that no bug runs past them (positions at every boundary, rows with distinct tables), or None."""
    bs = 4
    tables = torch.tensor([[5, 1, 7, 6, 11], [2, 9, 3, 8, 10], [4, 12, 13, 14, 15]], dtype=torch.long)
    positions = torch.tensor([[3, 4, 7, 8], [0, 3, 4, 11], [1, 5, 8, -1]], dtype=torch.long)
    try:
        got = slot_mapping(tables.clone(), positions.clone(), bs)
        got = [[int(x) for x in row] for row in torch.as_tensor(got).tolist()]
    except Exception:  # a crash here says nothing more than the check's own
        return None
    valid = positions >= 0
    p = positions.clamp(min=0)
    rows = torch.arange(len(tables))[:, None].expand_as(p)
    emulated = {OFF_BY_ONE_BLOCK: tables[rows, (p + 1) // bs] * bs + p % bs,
                ROW_ZERO: tables[0][p // bs] * bs + p % bs,
                WRONG_ROW: tables[(rows + 1) % len(tables), p // bs] * bs + p % bs}
    right = tables[rows, p // bs] * bs + p % bs
    for hint, slots in emulated.items():
        if hint == ROW_ZERO or hint == WRONG_ROW:
            same = all(got[b][t] == int(slots[b, t]) for b in range(1, len(tables)) for t in range(4) if valid[b, t])
        else:
            same = all(got[b][t] == int(slots[b, t]) for b in range(len(tables)) for t in range(4) if valid[b, t])
        if same and any(got[b][t] != int(right[b, t]) for b in range(len(tables)) for t in range(4) if valid[b, t]):
            return hint
    return None


@check
def check_slot_mapping(slot_mapping) -> None:
    """`slot_mapping(block_tables [B, M], positions [B, T], bs) -> slots [B, T]`, -1 where padding. When a
    slot is wrong, or the function crashes, the hint names the rule the numbers break (see _mapping_probe)."""
    try:
        _check_slot_mapping(slot_mapping)
    except CheckFailed as failed:
        why = _mapping_probe(slot_mapping)
        if why is None:
            raise
        raise CheckFailed(f"{str(failed).partition('. Hint: ')[0]}. Hint: {why}") from failed
    except NotImplementedError:
        raise
    except Exception as error:
        why = _mapping_probe(slot_mapping)
        if why is None:
            raise
        fail(f"slot_mapping crashed with {type(error).__name__}: {error}, on a batch whose tables are as wide as "
             "its positions need", hint=why)


def _check_slot_mapping(slot_mapping) -> None:
    """check_slot_mapping's cases: the example batch, then ragged batches for every block size."""
    bs = 4
    tables = torch.tensor([[5, 1, 7], [2, 9, 0], [3, 0, 0]], dtype=torch.long)
    positions = torch.tensor([[8, 9, 10, 11],
                              [3, 4, -1, -1],
                              [0, 1, 2, 3]], dtype=torch.long)
    want = torch.tensor([[28, 29, 30, 31],
                         [11, 36, -1, -1],
                         [12, 13, 14, 15]], dtype=torch.long)
    got = slot_mapping(tables.clone(), positions.clone(), bs)
    if not isinstance(got, torch.Tensor):
        fail("slot_mapping must return a tensor", "a torch.Tensor of shape [3, 4]", type(got).__name__)
    expect_equal(tuple(got.shape), (3, 4), "slot_mapping on a batch of 3 rows of 4 positions: shape")
    for b in range(3):
        for t in range(4):
            if int(got[b, t]) != int(want[b, t]):
                pos = int(positions[b, t])
                what = (f"slot_mapping, row {b} (table {tables[b].tolist()}), position {pos}, bs {bs}")
                hint = ("position -1 is padding: it has no slot, mark it -1" if pos < 0
                        else _slot_hint(tables[b].tolist(), pos, bs, int(got[b, t])))
                fail(what, int(want[b, t]), int(got[b, t]), hint)
    rng = random.Random(5)
    for bs in BLOCK_SIZES:
        # A ragged decode/prefill batch: row b writes positions [start, start + n) of a longer sequence.
        starts = [bs - 1, bs, 2 * bs + 1, 0]
        counts = [1, bs + 1, 2, 3 * bs]
        width = max(counts)
        columns = max(ceil_div(st + n, bs) for st, n in zip(starts, counts)) + 1
        rows = [rng.sample(range(200), columns) for _ in starts]
        positions = torch.full((len(starts), width), -1, dtype=torch.long)
        for b, (st, n) in enumerate(zip(starts, counts)):
            positions[b, :n] = torch.arange(st, st + n)
        got = slot_mapping(torch.tensor(rows, dtype=torch.long), positions.clone(), bs)
        for b in range(len(starts)):
            for t in range(width):
                pos = int(positions[b, t])
                want = -1 if pos < 0 else rows[b][pos // bs] * bs + pos % bs
                if int(got[b, t]) != want:
                    fail(f"slot_mapping with bs {bs}, row {b} (table {rows[b]}), position {pos}", want,
                         int(got[b, t]), "position -1 is padding: mark it -1" if pos < 0
                         else _slot_hint(rows[b], pos, bs, int(got[b, t])))
    passed(f"slot_mapping: ragged batches across block boundaries for block sizes {list(BLOCK_SIZES)}, "
           "padding mapped to -1")


IGNORED_TABLE = ("the block table was ignored: that is the slot of logical block {logical}, as if the "
                 "sequence sat in blocks 0, 1, 2, ...; look up the physical block table[pos // bs] = "
                 "{physical} and use it")


def _pair_hint(table, pos: int, bs: int, got) -> str:
    """Name the bug behind a wrong (block, offset) for position pos."""
    if got == (pos // bs, pos % bs) and table[pos // bs] != pos // bs:
        return IGNORED_TABLE.format(logical=pos // bs, physical=table[pos // bs])
    return _boundary_hint(pos, bs)


def _slot_hint(table, pos: int, bs: int, got) -> str:
    """Name the bug behind a wrong flat slot for position pos (not padding)."""
    block, offset = table[pos // bs], pos % bs
    want = block * bs + offset
    if got == pos and want != pos:
        return IGNORED_TABLE.format(logical=pos // bs, physical=block)
    if got == -1:
        return "only padding (position -1) maps to -1; this is a real position"
    if got == block + offset and bs > 1:
        return "the block id was not scaled: the flat slot is block * bs + offset, not block + offset"
    if got in (want - 1, want + 1):
        return (f"one slot off: block {block} starts at slot {block * bs} and position {pos} sits at "
                f"offset {offset} in it; use pos // bs and pos % bs, with no +1 or -1")
    return _boundary_hint(pos, bs)


def _boundary_hint(pos: int, bs: int) -> str:
    if pos % bs == 0 and pos > 0:
        return (f"position {pos} is the FIRST slot of logical block {pos // bs}, not the last of block "
                f"{pos // bs - 1}: use pos // bs and pos % bs, with no +1 or -1")
    if pos % bs == bs - 1:
        return (f"position {pos} is the LAST slot of logical block {pos // bs} (offset {bs - 1}), not the first "
                f"of block {pos // bs + 1}: use pos // bs and pos % bs, with no +1 or -1")
    return "logical block = pos // bs, offset = pos % bs, physical block = table[logical block]"


# --------------------------------------------------------------------------------------------------
# the allocator
# --------------------------------------------------------------------------------------------------

@where_it_lives
def _refcounts(allocator, blocks) -> dict[int, int]:
    """{block: allocator.refcount(block)}, asked where the allocator lives: in the grader one question to
    the learner's process, not one per block."""
    return {b: allocator.refcount(b) for b in blocks}


@where_it_lives
def _counts_and_free(allocator, blocks) -> tuple[dict[int, int], object]:
    """(_refcounts(allocator, blocks), allocator.num_free), read together where the allocator lives."""
    return _refcounts(allocator, blocks), allocator.num_free


def _new(cls, num_blocks: int):
    allocator = cls(num_blocks)
    expect_equal(allocator.num_blocks, num_blocks, f"BlockAllocator({num_blocks}).num_blocks")
    expect_equal(allocator.num_free, num_blocks, f"a fresh BlockAllocator({num_blocks}): num_free",
                 "every block starts on the free list")
    return allocator


@check
def check_allocator_basics(cls) -> None:
    """allocate hands out distinct blocks with refcount 1; share and release move the count."""
    allocator = _new(cls, 8)
    got = allocator.allocate(3)
    if not isinstance(got, list) or len(got) != 3:
        fail("allocate(3) on a fresh pool of 8", "a list of 3 block ids", got)
    if len(set(got)) != 3 or not all(isinstance(b, int) and 0 <= b < 8 for b in got):
        fail("allocate(3) on a fresh pool of 8", "3 distinct ints in 0..7", got,
             "take each block off the free list as you hand it out")
    expect_equal(allocator.num_free, 5, "after allocate(3) on a pool of 8: num_free")
    for b in got:
        expect_equal(allocator.refcount(b), 1, f"refcount of newly allocated block {b}",
                     "a block handed out belongs to exactly one table")
    single = allocator.allocate()
    if not isinstance(single, list) or len(single) != 1 or single[0] in got:
        fail("allocate() with the default n=1 after allocate(3)", "a list with one new block id", single)
    a, rest = got[0], got[1:] + single
    allocator.share(a)
    expect_equal(allocator.refcount(a), 2, f"after share({a}): refcount({a})",
                 "share adds one reference: a second table now names the block")
    expect_equal(allocator.num_free, 4, f"after share({a}): num_free", "sharing allocates nothing")
    allocator.release(a)
    expect_equal(allocator.refcount(a), 1, f"after share({a}) then release({a}): refcount({a})",
                 "release drops ONE reference; a block with another owner stays in use, off the free list, "
                 "until its last owner releases it")
    expect_equal(allocator.num_free, 4, f"after release({a}) with one reference left: num_free",
                 f"release put block {a} back on the free list while it still has an owner (refcount "
                 f"{allocator.refcount(a)}): a block returns to the free list only when its refcount "
                 "reaches 0" if allocator.num_free > 4 else
                 "a block returns to the free list only when its refcount reaches 0")
    allocator.release(a)
    expect_equal(allocator.refcount(a), 0, f"after the last release({a}): refcount({a})")
    expect_equal(allocator.num_free, 5, f"after the last release({a}): num_free",
                 "at refcount 0 the block goes back on the free list")
    for b in rest:
        allocator.release(b)
    expect_equal(allocator.num_free, 8, "after releasing every block: num_free")
    # Take the whole pool back one block at a time: no block may be handed out while it is still in use.
    live: list[int] = []
    for call in range(1, 9):
        [block] = _one_block(allocator.allocate(), f"allocate() call {call} of 8 on an emptying pool")
        if block in live:
            fail(f"allocate() call {call} of 8, after the whole pool was released and {len(live)} blocks "
                 f"allocated again ({live}): it handed out block {block}, which is still in use "
                 f"(refcount {allocator.refcount(block)}): the same block is now handed out twice",
                 hint="allocate must take blocks only from the free list, and a block leaves the free "
                      "list when it is handed out; a block in use belongs to a table until its last "
                      "release")
        expect_equal(allocator.refcount(block), 1, f"allocate() call {call} of 8: refcount of block {block}",
                     "a block handed out belongs to exactly one table")
        live.append(block)
    expect_equal(sorted(live), list(range(8)), "8 calls of allocate() after everything was released",
                 "every block must be handed out exactly once: is a released block put back twice, "
                 "or one never put back?")
    expect_equal(allocator.num_free, 0, "after allocating the whole pool: num_free")
    passed("allocator basics: distinct blocks with refcount 1, share 1 -> 2, release 2 -> 1 -> 0, "
           "free list refilled, the whole pool allocatable again one block at a time, never a live block")


def _one_block(got, what: str) -> list[int]:
    """`got` must be a list of one block id; return it."""
    if not isinstance(got, list) or len(got) != 1 or not isinstance(got[0], int):
        fail(what, "a list with one block id", got, "allocate(n) returns a list of n block ids, also for n=1")
    return got


@check
def check_allocator_errors(cls) -> None:
    """Exhaustion is all-or-nothing and says how many blocks; double free and share-of-free raise."""
    allocator = _new(cls, 6)
    held = allocator.allocate(4)
    allocator.share(held[0])
    before = _refcounts(allocator, range(6))
    exc = expect_raises(OutOfBlocks, lambda: allocator.allocate(3),
                        "allocate(3) with only 2 blocks free",
                        "raise engine.cache.errors.OutOfBlocks(wanted, free) before touching anything")
    after = _refcounts(allocator, range(6))
    if after != before or allocator.num_free != 2:
        changed = {b: (before[b], after[b]) for b in range(6) if before[b] != after[b]}
        fail("a failed allocate(3) with 2 blocks free must change nothing",
             f"refcounts {before} and num_free 2",
             f"refcounts {after} and num_free {allocator.num_free}"
             + (f" (block: (before, after) = {changed})" if changed else ""),
             "check there are enough free blocks BEFORE taking any: a half-done allocation leaks "
             "the blocks it took, since no table will ever release them")
    expect_equal((getattr(exc, "wanted", None), getattr(exc, "free", None)), (3, 2),
                 "the OutOfBlocks of allocate(3) with 2 free: its (wanted, free)",
                 "OutOfBlocks(wanted=3, free=2) tells the scheduler how short it is")
    last = allocator.allocate(2)
    expect_equal(allocator.num_free, 0, "after the failed allocate(3), allocate(2) still works: num_free")
    for b in last:
        allocator.release(b)

    victim = held[1]
    allocator.release(victim)
    exc = expect_raises(BlockRefError, lambda: allocator.release(victim),
                        f"a double free: release({victim}) when block {victim} is already free",
                        "raise engine.cache.errors.BlockRefError(block, message); a silent double free "
                        "puts the block on the free list twice and two sequences will get it")
    expect_equal(getattr(exc, "block", None), victim, "the BlockRefError of the double free: its .block")
    if str(victim) not in str(exc):
        fail("the message of the double-free BlockRefError should name the block",
             f"a message mentioning block {victim}", repr(str(exc)))
    expect_equal(allocator.refcount(victim), 0, f"after the rejected double free: refcount({victim})",
                 "a rejected release must not push the count below 0")
    expect_equal(allocator.num_free, 3, "after the rejected double free: num_free",
                 "a rejected release must not put the block on the free list again")
    exc = expect_raises(BlockRefError, lambda: allocator.share(victim),
                        f"share({victim}) of a free block",
                        "sharing a free block would let a table name a block the allocator may hand "
                        "to someone else; raise BlockRefError")
    expect_equal(getattr(exc, "block", None), victim, "the BlockRefError of share-of-a-free-block: its .block")
    expect_equal(allocator.refcount(victim), 0, f"after the rejected share({victim}): refcount({victim})")
    passed("allocator errors: OutOfBlocks(wanted=3, free=2) with every refcount left alone; "
           f"double free of block {victim} and share of a free block raise BlockRefError naming it")


@check
def check_refcounts_balance(cls, steps: int = 300, seed: int = 0) -> None:
    """Leak detection: a random workload of grow / fork / free, compared op by op with the true counts.

    The true refcount of a block is the number of block tables naming it; after every operation the
    allocator must agree, and once every table is gone the whole pool must be free again.
    """
    num_blocks = 24
    allocator = _new(cls, num_blocks)
    rng = random.Random(seed)
    tables: dict[int, list[int]] = {}
    next_id = 0
    log: list[str] = []

    def truth() -> dict[int, int]:
        counts = {b: 0 for b in range(num_blocks)}
        for table in tables.values():
            for b in table:
                counts[b] += 1
        return counts

    for step in range(steps):
        free_now = allocator.num_free
        action = rng.choice(["grow", "grow", "fork", "free"] if tables else ["grow"])
        if action == "grow":
            seq = rng.choice(list(tables)) if tables and rng.random() < 0.6 else None
            n = rng.randint(1, 3)
            if n > free_now:
                action = "free"
            else:
                if seq is None:
                    seq, next_id = next_id, next_id + 1
                    tables[seq] = []
                tables[seq] += allocator.allocate(n)
                log.append(f"allocate({n}) for sequence {seq}")
        if action == "fork":
            parent = rng.choice(list(tables))
            tables[next_id] = list(tables[parent])
            for b in tables[next_id]:
                allocator.share(b)
            log.append(f"fork sequence {parent} (blocks {tables[parent]}) into {next_id}: share each block")
            next_id += 1
        if action == "free" and tables:
            seq = rng.choice(list(tables))
            blocks = tables.pop(seq)
            for b in blocks:
                allocator.release(b)
            log.append(f"free sequence {seq}: release blocks {blocks}")
        _compare_counts(allocator, truth(), log)

    for seq in list(tables):
        blocks = tables.pop(seq)
        for b in blocks:
            allocator.release(b)
        log.append(f"free sequence {seq}: release blocks {blocks}")
        _compare_counts(allocator, truth(), log)
    expect_equal(allocator.num_free, num_blocks,
                 f"after {len(log)} operations and freeing every sequence: num_free",
                 "blocks went missing: a block whose refcount reaches 0 must go back on the free list")
    again = allocator.allocate(num_blocks)
    expect_equal(sorted(again), list(range(num_blocks)),
                 "allocate(all) after freeing every sequence", "each block must come back exactly once")
    passed(f"refcount balance: {len(log)} grow/fork/free operations, every refcount equal to the "
           f"number of tables naming the block, no leak at the end")


def _pool_hint(free: int, num_blocks: int) -> str:
    """Why num_free is not the whole pool once nobody owns a block."""
    if free > num_blocks:
        return (f"the free list holds {free} entries for a pool of {num_blocks} blocks: release put a "
                "block back while it still had owners, so it went on the free list twice; free a block "
                "only when its refcount reaches 0")
    return "blocks released by their last owner never came back on the free list (a leak)"


def _clash(tables: dict[int, list[int]]) -> str:
    """'block b is in the tables of both sequence x and sequence y', or '' when no block is named twice."""
    owners: dict[int, int] = {}
    for seq, table in tables.items():
        for b in table:
            if b in owners:
                if owners[b] == seq:
                    return f"block {b} is in the table of sequence {seq} twice: {table}"
                return f"block {b} is in the tables of both sequence {owners[b]} and sequence {seq}"
            owners[b] = seq
    return ""


def _compare_counts(allocator, counts: dict[int, int], log: list[str]) -> None:
    got_counts, num_free = _counts_and_free(allocator, list(counts))
    for b, want in counts.items():
        got = got_counts[b]
        if got != want:
            recent = "; ".join(log[-3:])
            if got > want:
                hint = ("a reference was counted but never dropped (a leak): does release decrement, "
                        "and does allocate set the count to 1 rather than adding to it?")
            elif log[-1].startswith("free"):
                hint = ("release dropped more than one reference: a block still named by another "
                        "table became free and could be handed to another sequence (a use after "
                        "free); release must drop exactly ONE reference")
            else:
                hint = ("a reference was dropped too early: a block still named by a table could be "
                        "handed to another sequence (a use after free); does share increment?")
            fail(f"after step {len(log)} ({recent}): refcount({b}), the number of tables naming block {b}",
                 want, got, hint)
    free_truth = sum(1 for c in counts.values() if c == 0)
    if num_free != free_truth:
        fail(f"after step {len(log)} ({log[-1]}): num_free, the number of blocks no table names",
             free_truth, num_free,
             "num_free must count exactly the blocks whose refcount is 0"
             + (": some block at refcount 0 never went back on the free list"
                if num_free < free_truth else
                ": some block went back on the free list while a table still names it (release "
                "freed it before its last owner released it)"))


# --------------------------------------------------------------------------------------------------
# the decisive check: the learner's allocator inside the engine
# --------------------------------------------------------------------------------------------------

class BlockTableCache(PagedKVCache):
    """The engine's PagedKVCache (its K/V pools, its block tables, its attention, which reads the pools
    through the tables) with chapter 3's and chapter 4's methods done here the plain, slow way, one
    position at a time, so that chapter 2 runs in an edition of the engine where those chapters are
    still to write. reserve takes the blocks the next tokens need from the allocator, set_batch names
    the batch, write stores the key and value of position p at offset p % bs of block table[p // bs],
    free and truncate give blocks back, fork shares a table's blocks (no copy-on-write: nothing here
    writes into a shared block). Chapter 3 has the learner write the real ones."""

    def __init__(self, config, num_blocks: int, block_size: int = 16, dtype=torch.float32, device="cpu",
                 allocator=None):
        super().__init__(config, num_blocks, block_size=block_size, dtype=dtype, device=device,
                         allocator=allocator, attention="torch")

    def reserve(self, seq: int, n: int) -> None:
        """Take from the allocator the blocks that positions [length, length + n) need."""
        if self.shared_writes(seq, n):
            raise ValueError(f"sequence {seq} would write into a shared block: that needs chapter 4")
        self.table(seq).extend(self.allocator.allocate(self.blocks_wanted(seq, n)))

    def set_batch(self, seqs) -> None:
        """The batch's sequences, their tables (padded with block 0) and their lengths, as tensors."""
        self.batch = list(seqs)
        width = max([1] + [len(self.table(seq)) for seq in self.batch])
        rows = [self.table(seq) + [0] * (width - len(self.table(seq))) for seq in self.batch]
        self.block_tables = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.batch_lengths = torch.tensor([self.lengths[seq] for seq in self.batch], dtype=torch.long,
                                          device=self.device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Store k, v [B, Hkv, T, D] position by position; return each row's length after the step."""
        bs = self.block_size
        lengths = []
        for row, seq in enumerate(self.batch):
            table, length = self.tables[seq], self.lengths[seq]
            for column, p in enumerate(positions[row].tolist()):
                if p >= 0:                                    # -1 is padding
                    self.k_pools[layer][table[p // bs], :, p % bs] = k[row, :, column].to(self.dtype)
                    self.v_pools[layer][table[p // bs], :, p % bs] = v[row, :, column].to(self.dtype)
                    length = max(length, p + 1)
            lengths.append(length)
        if layer == len(self.k_pools) - 1:                    # the last layer commits the lengths
            self.lengths.update(zip(self.batch, lengths))
        return torch.tensor(lengths, dtype=torch.long, device=self.device)

    def free(self, seq: int) -> None:
        """Release every block of seq's table and forget it."""
        for block in self.table(seq):
            self.allocator.release(block)
        del self.tables[seq], self.lengths[seq]

    def truncate(self, seq: int, length: int) -> None:
        """Keep seq's first `length` tokens; release the blocks past them."""
        table = self.table(seq)
        keep = ceil_div(length, self.block_size)
        for block in table[keep:]:
            self.allocator.release(block)
        del table[keep:]
        self.lengths[seq] = length

    def fork(self, parent: int, child: int) -> None:
        """child starts as parent's tokens: the same blocks, each with one more owner."""
        self.create(child)
        self.share_blocks(child, self.table(parent))
        self.set_length(child, self.lengths[parent])


@check
def check_allocator_in_engine(cls, block_size: int = 4, num_blocks: int = 24, seed: int = 0) -> None:
    """Plug the allocator into PagedKVCache and compare logits with from-scratch runs.

    A ragged batch (lengths bs-1, bs, bs+1, 2bs+1) is prefilled, one sequence is forked and its parent
    freed, a newcomer is admitted into the released blocks, and everyone decodes; at every step each
    sequence's logits must equal those of a from-scratch run of its whole sequence.
    """
    from engine.generate import cached_step, scratch_logits

    model = tiny()
    allocator = _new(cls, num_blocks)
    # Scramble the physical order: take every block, give them back shuffled.
    order = allocator.allocate(num_blocks)
    random.Random(seed).shuffle(order)
    for b in order:
        allocator.release(b)
    expect_equal(allocator.num_free, num_blocks, "after allocating the whole pool and releasing it: num_free",
                 _pool_hint(allocator.num_free, num_blocks))
    cache = BlockTableCache(model.config, num_blocks, block_size=block_size, allocator=allocator)
    bs = block_size
    lengths = [bs - 1, bs, bs + 1, 2 * bs + 1]
    prompts = {i: seeded_tokens(n, seed=100 + i) for i, n in enumerate(lengths)}
    seqs: dict[int, list[int]] = {s: [] for s in prompts}

    def step(active: list[int], new: dict[int, list[int]], stage: str, hint: str) -> None:
        for s in active:
            seqs[s] = seqs[s] + new[s]
        got = cached_step(model, cache, active, [new[s] for s in active])
        want = scratch_logits(model, [seqs[s] for s in active])
        clash = _clash(cache.tables)
        if clash:
            hint = clash + ": allocate handed out a block that was still in use"
        for s, g, w in zip(active, got, want):
            n = len(new[s])
            compare_logits(g, w[-n:], f"with your BlockAllocator in PagedKVCache, {stage}, sequence {s} "
                           f"({len(seqs[s])} tokens)", first_position=len(seqs[s]) - n, hint=hint)
        if clash:
            fail(f"with your BlockAllocator in PagedKVCache, {stage}, {clash}",
                 hint="allocate must hand out only blocks on the free list")

    for s in seqs:
        cache.create(s)
    step(list(seqs), prompts, "after prefilling a ragged batch of lengths " + str(lengths),
         "two sequences may have been handed the same block: does allocate take each block off the "
         "free list?")

    # Fork the longest sequence, free its parent: the child's blocks must survive with refcount 1.
    parent, child = 3, 4
    cache.fork(parent, child)
    seqs[child] = list(seqs[parent])
    shared = list(cache.tables[child])
    cache.free(parent)
    del seqs[parent]
    for b in shared:
        got = allocator.refcount(b)
        expect_equal(got, 1,
                     f"after fork({parent} -> {child}) and free({parent}): refcount of the child's block {b}",
                     "share adds one, release takes one away: 1 + 1 - 1 = 1"
                     + ("; release freed the child's block when the parent released it, though the "
                        "child still owns it: drop ONE reference per release" if got == 0 else
                        "; a reference was never dropped (a leak): release must decrement"
                        if got > 1 else ""))
    # A newcomer takes blocks from the free list; they must not be the child's.
    newcomer = 5
    cache.create(newcomer)
    seqs[newcomer] = []
    rng = random.Random(seed + 1)
    for t in range(4):
        active = sorted(seqs)
        new = {s: [rng.randrange(256)] for s in active}
        if t == 0:
            new[newcomer] = seeded_tokens(2 * bs + 2, seed=200)
        step(active, new, f"at decode step {t + 1} after a fork, a free and a newcomer",
             "a block was reused while a table still named it: release must return a block to the free "
             "list only when its refcount reaches 0, and allocate must hand out only free blocks")
    for s in list(seqs):
        cache.free(s)
    expect_equal(allocator.num_free, num_blocks, "after every sequence was freed: num_free",
                 _pool_hint(allocator.num_free, num_blocks))
    bad = {b: allocator.refcount(b) for b in range(num_blocks) if allocator.refcount(b) != 0}
    expect_equal(bad, {}, "after every sequence was freed: blocks with a nonzero refcount")
    passed(f"your BlockAllocator inside PagedKVCache (bs {bs}, {num_blocks} blocks in scrambled order): "
           f"prefill of lengths {lengths}, fork + free + newcomer, 4 decode steps; every logit matches "
           f"a from-scratch run within {ATOL:g}; the pool is whole again at the end")


# --------------------------------------------------------------------------------------------------
# the chapter's small exercise: utilization of paged memory
# --------------------------------------------------------------------------------------------------

@check
def check_paged_utilization(paged_utilization) -> None:
    """`paged_utilization(lengths, block_size)`: tokens stored / slots in the blocks they occupy."""
    cases = [([3, 4, 5, 9], 4), ([300], 16), ([1], 16), ([16, 32, 48], 16), ([7, 100, 250, 499], 1),
             ([20, 500, 137, 64, 65], 128)]
    for lengths, bs in cases:
        tokens = sum(lengths)
        slots = sum(ceil_div(n, bs) for n in lengths) * bs
        want = tokens / slots
        got = paged_utilization(list(lengths), bs)
        try:
            close = abs(float(got) - want) <= 1e-9
        except (TypeError, ValueError):
            close = False
        if not close:
            fail(f"paged_utilization({lengths}, block_size={bs})", f"{tokens}/{slots} = {want:.4f}",
                 got if not isinstance(got, float) else f"{got:.4f}",
                 "each sequence occupies blocks_needed(n, bs) whole blocks; utilization is the tokens "
                 "stored over all the slots of those blocks"
                 + (" (a sequence of 1 token still takes a whole block)" if min(lengths) < bs else ""))
    passed(f"paged_utilization: {len(cases)} workloads; a 300-token sequence in blocks of 16 uses "
           f"{paged_utilization([300], 16):.1%} of its slots")
