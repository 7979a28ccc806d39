"""Chapter 3's checks: the paged KV cache's bookkeeping, its scatter and gather, and the whole cache in the engine.

Each check takes the learner's cache class (a subclass of the engine's `PagedKVCache` that defines some of
`reserve`, `set_batch`, `write`, `gather`, `free`, `truncate`), builds it over the tiny model's shape with
a free list in scrambled order, and compares tables, reference counts, pools and lengths with what the
chapter's rules say they must be. The decisive check runs the tiny model through the cache and compares
every logit with a from-scratch run. Where a classic bug explains a difference, the hint names it.
"""

from __future__ import annotations

import random

import torch

from engine.cache.errors import OutOfBlocks
from engine.checks import (ATOL, CheckFailed, Proved, ceil_div, check, chosen_letter, compare_logits, continuations,
                           expect_equal, expect_raises, fail, passed, review_number, shows_text, tiny,
                           where_it_lives)
from engine.checks.compose import naming_earlier, one_class
from engine.checks.recording import calls as recorded
from engine.checks.recording import record_copy_on_write
from engine.seeded import seeded_tokens


def _lengths(bs: int) -> list[int]:
    """The lengths where paged bookkeeping goes wrong: short of a block, a block, one past, two past."""
    return [bs - 1, bs, bs + 1, 2 * bs + 1]



def shuffled_allocator(num_blocks: int, seed: int):
    """The engine's BlockAllocator with its free list in scrambled order (as a busy server leaves it)."""
    from engine.cache.allocator import BlockAllocator
    allocator = BlockAllocator(num_blocks)
    order = list(allocator.free)
    random.Random(seed).shuffle(order)
    allocator.free.clear()
    allocator.free.extend(order)
    return allocator


def _cache(cls, num_blocks: int, block_size: int, seed: int = 0):
    """The learner's cache over the tiny model's shape; attention="reference" runs update, so write and
    gather are the learner's whatever device the check runs on."""
    return _built(cls, tiny().config, num_blocks, block_size, seed)


@where_it_lives
def _built(cls, config, num_blocks: int, block_size: int, seed: int):
    """cls over `config` with a scrambled allocator, built where the class lives: in the grader, the
    learner's process builds it, allocator included, from its own engine (the grader hands it data only)."""
    return cls(config, num_blocks, block_size=block_size, dtype=torch.float32, device="cpu",
               allocator=shuffled_allocator(num_blocks, seed), attention="reference")


# The notebook's names of the earlier exercises' classes, the latest first, as the test cells pass them.
EARLIER = (("YourStorage", "Exercise 3.2", "write and gather"),
           ("YourReserve", "Exercise 3.1", "reserve and set_batch"))


def your_cache(cls, *earlier):
    """The learner's cache: `cls` (the latest exercise's class, whose methods win) with the classes of the
    exercises before it (YourStorage, YourReserve), as one class that inherits each (see compose.together);
    a CheckFailed in the notebook's names when Python finds no method order for them."""
    if not earlier:
        return cls
    named = EARLIER[-len(earlier):]
    exercise = EARLIER[-len(earlier) - 1][1] if len(earlier) < len(EARLIER) else "Exercise 3.3"
    labels = (f"PagedKVCache ({exercise})",) + tuple(f"{name} ({ex})" for name, ex, _ in named)
    return one_class("YourCache", labels, cls, *earlier)


def _blaming_earlier(subject: str, earlier):
    """naming_earlier around a check of `earlier` classes (YourStorage, YourReserve, the latest first): each is
    probed with its own exercise's checks, on it and the classes before it."""
    probes = {"YourReserve": (check_reserve, check_set_batch), "YourStorage": (check_write, check_gather)}
    named = EARLIER[-len(earlier):] if earlier else ()

    def probe(at: int, checks):
        def run():
            for one in checks:
                one(your_cache(earlier[at], *earlier[at + 1:]))
        return run
    return naming_earlier(subject, [(f"{name} ({exercise})", methods, probe(at, probes[name]))
                                    for at, (name, exercise, methods) in enumerate(named)])


def _refcounts(cache) -> list[int]:
    return [cache.allocator.refcount(b) for b in range(cache.allocator.num_blocks)]


def _state(cache) -> tuple:
    return ({s: list(t) for s, t in cache.tables.items()}, dict(cache.lengths), _refcounts(cache),
            cache.allocator.num_free)


# --------------------------------------------------------------------------------------------------
# Exercise 3.1: reserve and set_batch
# --------------------------------------------------------------------------------------------------

@check
def check_reserve(cls, block_size: int = 4, seed: int = 0) -> None:
    """reserve(seq, n) appends exactly the blocks positions [length, length + n) need, changes no length,
    and on OutOfBlocks changes nothing at all: no table, refcount, length or free-list change."""
    bs = block_size
    cache = _cache(cls, num_blocks=64, block_size=bs, seed=seed)
    checked = 0
    for seq, n in enumerate(_lengths(bs) + [0]):
        cache.create(seq)
        free = cache.allocator.num_free
        cache.reserve(seq, n)
        table = cache.tables[seq]
        want = ceil_div(n, bs)
        if len(table) != want:
            hint = (f"{n} token(s) need ceil({n}/{bs}) = {want} block(s) of {bs}"
                    + (": one block too many at a block boundary; use ceil, not n // bs + 1"
                       if len(table) == want + 1 and n % bs == 0 else "")
                    + (": one block too few; a partial block still takes a whole block"
                       if len(table) == want - 1 else ""))
            fail(f"reserve({seq}, {n}) on an empty sequence with blocks of {bs}: blocks in its table",
                 want, len(table), hint)
        expect_equal(cache.length(seq), 0, f"after reserve({seq}, {n}): length({seq})",
                     "reserve only makes room; the forward pass writes the tokens and the last layer's "
                     "write commits the length")
        expect_equal(free - cache.allocator.num_free, want, f"reserve({seq}, {n}): blocks taken off the "
                     "free list", "take the blocks from self.allocator, exactly as many as the table gains")
        expect_equal([cache.allocator.refcount(b) for b in table], [1] * want,
                     f"after reserve({seq}, {n}): refcounts of its blocks {table}",
                     "each new block has one owner: this table")
        checked += 1
    # Growing a sequence that already holds tokens: only the blocks past its last one are new.
    for stored, more in ((bs - 1, 1), (bs - 1, 2), (bs, 1), (2 * bs + 1, bs), (bs + 1, 0)):
        seq = 100 + checked
        cache.create(seq)
        cache.reserve(seq, stored)
        cache.set_length(seq, stored)              # as if a forward pass had written them
        before = list(cache.tables[seq])
        cache.reserve(seq, more)
        want = ceil_div(stored + more, bs)
        table = cache.tables[seq]
        if table[:len(before)] != before:
            fail(f"reserve({seq}, {more}) on a sequence of {stored} tokens changed its existing entries",
                 before, table[:len(before)], "keep the table and append the new blocks at its end")
        if len(table) != want:
            fail(f"reserve({seq}, {more}) on a sequence of {stored} tokens (blocks of {bs}, {len(before)} in "
                 f"its table): blocks in its table", want, len(table),
                 f"positions {stored}..{stored + more - 1} need ceil(({stored} + {more}) / {bs}) = {want} "
                 "blocks in all; count from the stored length and subtract the blocks the table already has")
        checked += 1
    # All or nothing: a reserve the pool cannot cover changes nothing.
    small = _cache(cls, num_blocks=6, block_size=bs, seed=seed + 1)
    small.create(0)
    small.reserve(0, 2 * bs + 1)                   # 3 blocks; 3 stay free
    small.set_length(0, 2 * bs + 1)
    small.create(1)
    small.reserve(1, 1)                            # 1 more; 2 free
    before = _state(small)
    ask = 3 * bs + 1                               # sequence 0 needs ceil((3bs + 1 + 2bs + 1) / bs) - 3 = 3
    expect_raises(OutOfBlocks, lambda: small.reserve(0, ask),
                  f"reserve(0, {ask}) on a sequence of {2 * bs + 1} tokens with {before[3]} free blocks "
                  f"(it needs 3 more)", "check the free blocks first and raise OutOfBlocks(wanted, free) "
                  "before taking any")
    after = _state(small)
    if after != before:
        taken = before[3] - after[3]
        grown = len(after[0].get(0, [])) - len(before[0][0])
        if taken or grown:
            hint = (f"reserve took {taken} block(s) and grew the table by {grown} entries before it failed: "
                    "a reserve that allocates some blocks then fails leaks them. Count what is needed, "
                    "compare with allocator.num_free, and only then allocate, all in one go")
        else:
            hint = "a failed reserve must change nothing: not the table, the length or any refcount"
        fail(f"after reserve(0, {ask}) raised OutOfBlocks: (tables, lengths, refcounts, num_free)",
             before, after, hint)
    try:
        small.reserve(0, 3 * bs - 1)               # 2 blocks: fits exactly
    except OutOfBlocks as exc:
        fail(f"reserve(0, {3 * bs - 1}) on a sequence of {2 * bs + 1} tokens needs 2 more blocks and "
             f"{before[3]} are free: it raised OutOfBlocks ({exc})", hint="a reserve that needs exactly the "
             "free blocks fits: raise only when wanted > free, not when wanted >= free")
    expect_equal(small.allocator.num_free, 0, f"then reserve(0, {3 * bs - 1}), which fits: num_free",
                 "after a failed reserve the same pool must still serve one that fits")
    _check_reserve_counts_the_copy(cls, bs, seed)
    passed(f"reserve: {checked} cases at block boundaries (bs {bs}) take exactly ceil(length / bs) blocks "
           f"in all; a reserve that cannot fit raises OutOfBlocks and changes nothing, one that needs exactly the "
           f"free blocks succeeds, the copy of a shared last block counted")


def _shared_partial(cls, bs: int, seed: int, num_blocks: int):
    """A cache whose sequence 0 holds bs + 1 tokens in 2 blocks that sequence 1 shares (refcount 2, as
    fork makes it in chapter 4); copy_on_write (chapter 4's to write) only records its calls here, where the
    cache lives (engine.checks.recording): the record is read with recorded(), as data."""
    cache = _cache(cls, num_blocks=num_blocks, block_size=bs, seed=seed)
    cache.create(0)
    cache.reserve(0, bs + 1)
    cache.set_length(0, bs + 1)
    cache.create(1)
    cache.tables[1], cache.lengths[1] = list(cache.tables[0]), bs + 1
    for block in cache.tables[0]:
        cache.allocator.share(block)
    return cache, record_copy_on_write(cache)


def _check_reserve_counts_the_copy(cls, bs: int, seed: int) -> None:
    """A sequence whose partial last block is shared grows into it: reserve pays for the new block and for
    the copy before taking either, and asks copy_on_write for the copy."""
    stored, more = bs + 1, bs                      # positions bs + 1 .. 2 bs: 1 new block and 1 copy
    cache, record = _shared_partial(cls, bs, seed + 2, num_blocks=3)
    before = _state(cache)
    table = before[0][0]
    what = (f"sequence 0 holds {stored} tokens in blocks {table} (blocks of {bs}), both shared with sequence 1 "
            f"(refcount 2); reserve(0, {more}) writes into the shared partial block {table[1]}, so it needs "
            f"1 new block and 1 copy, with {before[3]} free block")
    uncounted = ("the shared partial last block needs a copy too, and the copy takes a block: add "
                 "len(self.shared_writes(seq, n)) to the blocks you need before comparing with "
                 "allocator.num_free, and make the copies only after that check")
    expect_raises(OutOfBlocks, lambda: cache.reserve(0, more), what, uncounted)
    asked = recorded(record, "copy_on_write's calls")
    if _state(cache) != before or asked:
        fail(f"{what}: after it raised OutOfBlocks, (tables, lengths, refcounts, num_free) and the copies "
             "asked for", (before, []), (_state(cache), asked),
             "a failed reserve changes nothing: count the copy with the new blocks, compare with "
             "allocator.num_free, and only then copy or allocate")
    cache, record = _shared_partial(cls, bs, seed + 2, num_blocks=4)
    before = _state(cache)
    cache.reserve(0, more)
    asked = recorded(record, "copy_on_write's calls")
    expect_equal(asked, [(0, 1)], f"{what.replace('1 free block', '2 free blocks')}: the copies reserve asked "
                 "copy_on_write for, as (seq, table index)",
                 "for each index in self.shared_writes(seq, n), call self.copy_on_write(seq, index) once the "
                 "pool is known to cover everything")
    expect_equal(len(cache.tables[0]), 3, f"after that reserve(0, {more}): blocks in sequence 0's table",
                 f"ceil(({stored} + {more}) / {bs}) = 3: the two it had and one new")
    expect_equal(cache.tables[1], before[0][1], "sequence 1's table after sequence 0 reserved",
                 "reserve changes only the table of the sequence it reserves for")


@check
def check_set_batch(cls, block_size: int = 4, seed: int = 0) -> None:
    """set_batch(seqs): batch, the block-table tensor [B, M] (rows in batch order, padded with a real
    block id), batch_lengths and batch_capacity; an empty or repeated batch is a ValueError."""
    bs = block_size
    num_blocks = 32
    cache = _cache(cls, num_blocks=num_blocks, block_size=bs, seed=seed)
    stored = {0: bs + 1, 1: 2 * bs + 1, 2: bs - 1, 3: 0}
    for seq, n in stored.items():
        cache.create(seq)
        cache.reserve(seq, n)
        cache.set_length(seq, n)
    for order in ([2, 0, 1, 3], [1], [3, 2]):
        cache.set_batch(order)
        tables = [cache.tables[s] for s in order]
        width = max(1, max(len(t) for t in tables))
        got = cache.block_tables
        if not isinstance(got, torch.Tensor):
            fail(f"set_batch({order}): self.block_tables", "a torch.Tensor", type(got).__name__)
        expect_equal(list(cache.batch), order, f"set_batch({order}): self.batch",
                     "keep the sequences in the order given: row b of every tensor is seqs[b]")
        expect_equal(tuple(got.shape), (len(order), width),
                     f"set_batch({order}) with tables of {[len(t) for t in tables]} block(s): block_tables "
                     "shape", "one row per sequence, as wide as the longest table (at least 1 column)")
        if got.dtype not in (torch.long, torch.int32):
            fail(f"set_batch({order}): block_tables dtype", "torch.long", got.dtype,
                 "block ids index the pools: use an integer tensor")
        for b, table in enumerate(tables):
            row = got[b].tolist()
            if row[:len(table)] != table:
                other = [i for i, t in enumerate(tables) if row[:len(t)] == t and t]
                hint = (f"row {b} holds the table of {order[other[0]]}: rows follow the order of seqs"
                        if other else "row b starts with the table of seqs[b], in table order")
                fail(f"set_batch({order}): row {b} (sequence {order[b]}) of block_tables starts with",
                     table, row[:len(table)], hint)
            pad = row[len(table):]
            if any(not 0 <= x < num_blocks for x in pad):
                fail(f"set_batch({order}): the padding of row {b} (sequence {order[b]}, {len(table)} of "
                     f"{width} columns)", f"real block ids, e.g. {[0] * len(pad)}", pad,
                     "pad short rows with block 0: kernels may read a padded column, and -1 is no block; "
                     "kv_lens keeps those reads out of every result")
        expect_equal(cache.batch_lengths, [stored[s] for s in order], f"set_batch({order}): batch_lengths",
                     "each row's stored length, self.lengths[seq], in batch order")
        expect_equal(cache.batch_capacity, [len(cache.tables[s]) * bs for s in order],
                     f"set_batch({order}): batch_capacity",
                     "the slots each row's blocks hold: len(table) * block_size")
    for bad in ([], [0, 2, 0]):
        expect_raises(ValueError, lambda: cache.set_batch(bad), f"set_batch({bad})",
                      "a batch names at least one sequence, each once")
    passed("set_batch: rows in batch order, padded with real block ids to the longest table, lengths and "
           "capacities per row, ValueError for an empty or repeated batch")


# --------------------------------------------------------------------------------------------------
# Exercise 3.2: write and gather (update = write, then gather)
# --------------------------------------------------------------------------------------------------

SENTINEL = -7.0     # every pool slot starts at this value, so a stray write shows up


def _batch(cache, stored: dict[int, int], new: dict[int, int], offset: float = 0.0):
    """Reserve `new[s]` more positions for each sequence of `stored` tokens, set the batch, and build
    positions [B, T] (padding -1) and distinct k, v [B, Hkv, T, D] (padding columns get huge values)."""
    seqs = list(new)
    for s in seqs:
        cache.reserve(s, new[s])
    cache.set_batch(seqs)
    width = max(new.values())
    positions = torch.full((len(seqs), width), -1, dtype=torch.long)
    for b, s in enumerate(seqs):
        positions[b, :new[s]] = torch.arange(stored[s], stored[s] + new[s])
    config = tiny().config
    shape = (len(seqs), config.num_kv_heads, width, config.head_dim)
    k = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape) + 1 + offset
    v = -k
    pad = (positions < 0)[:, None, :, None].expand(shape)
    k = torch.where(pad, 1e6 + k, k)
    v = torch.where(pad, -1e6 - k, v)
    return seqs, positions, k, v


def _where_is(cache, layer: int, vector: torch.Tensor) -> list[tuple[int, int]]:
    """(block, offset) of every slot of layer's K pool that holds `vector` [Hkv, D]."""
    pool = cache.k_pools[layer]                    # [N, Hkv, bs, D]
    hits = (pool.permute(0, 2, 1, 3) == vector).flatten(2).all(-1).nonzero().tolist()
    return [(int(b), int(o)) for b, o in hits]


@where_it_lives
def _fresh_pools(cache) -> None:
    """Every slot of every pool set to SENTINEL, where the cache lives (a pool read elsewhere is a copy)."""
    for pool in list(cache.k_pools) + list(cache.v_pools):
        pool.fill_(SENTINEL)


@where_it_lives
def _random_pools(cache, seed: int) -> None:
    """Every pool filled with seeded random values, where the cache lives."""
    generator = torch.Generator().manual_seed(seed)
    for pool in list(cache.k_pools) + list(cache.v_pools):
        pool.copy_(torch.randn(pool.shape, generator=generator))


def _write_lens_hint(cache, seqs, got, want_lens, new, layer: int) -> str:
    """What wrong kv_lens from write say about the bug."""
    bs = cache.block_size
    b = next(i for i, (g, w) in enumerate(zip(got, want_lens)) if g != w)
    s, w, g = seqs[b], want_lens[b], got[b]
    if got == [len(cache.tables[x]) * bs for x in seqs]:
        return ("that is the slots reserved (len(table) * bs), right only when a row ends exactly on a block "
                "boundary: count the positions written, not the slots")
    if g == w - 1:
        return (f"one short: row {b} wrote positions up to {w - 1}, so it holds {w} keys; kv_len is the highest "
                "position written + 1")
    if g == w + 1:
        return "one too many: kv_len is the highest position written + 1, not + 2"
    if layer > 0 and g == w + new[s] * layer:
        return (f"the count grew on every layer: the length was committed per layer, so layer {layer} started "
                f"from layer {layer - 1}'s new length")
    return "kv_len[b] = max(stored length, highest valid position in row b + 1); padding (-1) does not count"


def _write_every_layer(cache, stage: str, seqs, stored, new, k, v, positions) -> None:
    """write() of each layer: kv_lens right at every layer, lengths committed by the last one only."""
    layers = len(cache.k_pools)
    want_lens = [stored[s] + new[s] for s in seqs]
    for layer in range(layers):
        got = [int(x) for x in torch.as_tensor(cache.write(layer, k, v, positions)).tolist()]
        if got != want_lens:
            b = next(i for i, (g, w) in enumerate(zip(got, want_lens)) if g != w)
            fail(f"{stage}: kv_lens returned by write(layer={layer}) for rows {seqs} (row {b} had "
                 f"{stored[seqs[b]]} tokens and wrote {new[seqs[b]]})", want_lens, got,
                 _write_lens_hint(cache, seqs, got, want_lens, new, layer))
        now = [cache.lengths[s] for s in seqs]
        if layer < layers - 1 and now != [stored[s] for s in seqs]:
            fail(f"{stage}: lengths after write(layer={layer}) of {layers} layers", [stored[s] for s in seqs], now,
                 f"the length was committed per layer: only the last layer's write (layer == {layers - 1}) may "
                 "commit the new lengths, since every layer writes the same positions")
    expect_equal([cache.lengths[s] for s in seqs], want_lens, f"{stage}: lengths after the last layer's write",
                 "the last layer commits kv_lens as each sequence's new length (self.lengths and self.batch_lengths)")


def _expect_no_padding_written(pool, stage: str, layer: int) -> None:
    """A padding column's k (values >= 1e6) anywhere in the pool is the bug."""
    padded = (pool >= 1e6).all(dim=-1).all(dim=1).nonzero().tolist()        # [N, bs] slots
    if padded:
        fail(f"{stage}: layer {layer}, the K pool at (block, offset) {tuple(int(x) for x in padded[0])}",
             "no padding there", "the k of a padding column (position -1)",
             "padding was written: positions of -1 mark padding and must be skipped (write only where positions "
             ">= 0; slot_mapping gives -1 there, and -1 as an index is the pool's last slot)")


def _landed_hint(cache, layer: int, k, positions, b: int, t: int, block: int, offset: int) -> str:
    """Where the k of (row b, column t) went instead of its slot, as a hint."""
    p, bs = int(positions[b, t]), cache.block_size
    found = _where_is(cache, layer, k[b, :, t])
    same_position = [k[b2, :, t2] for b2, t2 in (positions == p).nonzero().tolist()]
    at_logical = cache.k_pools[layer][p // bs, :, offset]
    if (p // bs, offset) in found or any(torch.equal(at_logical, x) for x in same_position):
        return (f"it landed in block {p // bs}, the logical block number: the slot was taken from the logical "
                "block and the table ignored. Look the physical block up: block_tables[b, p // bs] (slot_mapping "
                "does it)")
    if found:
        return (f"it landed at (block, offset) {found[0]}: the slot of position p is "
                "block_tables[b, p // bs] * bs + p % bs")
    if torch.equal(cache.k_pools[layer][block, :, offset], k[b, :, t]):
        return "the keys are there but the values are not: write v into v_pools[layer]"
    return ("nothing was written there: scatter into self.k_pools[layer] and self.v_pools[layer] in place, "
            "indexed [block, :, offset]")


def _expect_landed(cache, stage: str, layer: int, seqs, new, k, v, positions) -> None:
    """Each new position's K and V at block_tables[b, p // bs], offset p % bs."""
    bs = cache.block_size
    for b, s in enumerate(seqs):
        table = cache.tables[s]
        for t in range(new[s]):
            p = int(positions[b, t])
            block, offset = table[p // bs], p % bs
            if torch.equal(cache.k_pools[layer][block, :, offset], k[b, :, t]) and \
                    torch.equal(cache.v_pools[layer][block, :, offset], v[b, :, t]):
                continue
            fail(f"{stage}: layer {layer}, sequence {s} (row {b}), position {p}: K/V at block {block} (table "
                 f"{table}), offset {offset}", "the k and v of that position", "something else",
                 _landed_hint(cache, layer, k, positions, b, t, block, offset))


def _expect_nothing_stray(cache, pool, stage: str, layer: int, seqs, stored, positions) -> None:
    """No slot changed that neither this batch nor an earlier one wrote."""
    bs = cache.block_size
    written = {(cache.tables[s][int(p) // bs], int(p) % bs)
               for b, s in enumerate(seqs) for p in positions[b].tolist() if p >= 0}
    earlier = {(cache.tables[s][p // bs], p % bs) for s in stored for p in range(stored[s])}
    changed = (pool != SENTINEL).any(dim=1).any(dim=-1).nonzero().tolist()   # [N, bs] slots
    stray = [slot for slot in sorted((int(b), int(o)) for b, o in changed)
             if slot not in written and slot not in earlier]
    if stray:
        fail(f"{stage}: layer {layer}, K pool slots written that no position of the batch maps to", "none",
             stray[:4], "write each valid position once, at its own slot, and nothing else")


@check
def check_write(cls, *earlier, block_size: int = 4, seed: int = 0) -> None:
    """write(layer, k, v, positions) stores each valid position p of row b at block
    block_tables[b, p // bs], offset p % bs, in this layer's K and V pools; skips padding (-1); returns
    kv_lens (the highest position written + 1, never less than the stored length); only the last layer
    commits the new lengths."""
    with _blaming_earlier("check_write", earlier):
        _check_write(your_cache(cls, *earlier), block_size, seed)


def _check_write(cls, block_size: int, seed: int) -> None:
    """check_write's work, on the learner's whole class."""
    bs = block_size
    cache = _cache(cls, num_blocks=48, block_size=bs, seed=seed)
    _fresh_pools(cache)
    layers = len(cache.k_pools)
    stored = {s: 0 for s in range(4)}
    for s in stored:
        cache.create(s)
    rounds = [
        ("a ragged prefill of lengths " + str(_lengths(bs)), dict(enumerate(_lengths(bs)))),
        ("one decode token each", {s: 1 for s in stored}),
        (f"a chunk of {bs + 1} for sequence 1 beside one token for 3 and 0", {1: bs + 1, 3: 1, 0: 1}),
    ]
    for number, (stage, new) in enumerate(rounds):
        seqs, positions, k, v = _batch(cache, stored, new, offset=10_000.0 * number)
        _write_every_layer(cache, stage, seqs, stored, new, k, v, positions)
        for layer in range(layers):
            pool = cache.k_pools[layer]
            _expect_no_padding_written(pool, stage, layer)
            _expect_landed(cache, stage, layer, seqs, new, k, v, positions)
            _expect_nothing_stray(cache, pool, stage, layer, seqs, stored, positions)
        for s in seqs:
            stored[s] += new[s]
    passed(f"write: a ragged prefill, decode steps and a chunk across block boundaries (bs {bs}) land at "
           f"block_tables[b, p // bs], offset p % bs, in all {layers} layers; padding skipped; kv_lens "
           "right at every boundary; lengths committed by the last layer only; no other K slot written")


@check
def check_gather(cls, *earlier, block_size: int = 4, seed: int = 1) -> None:
    """gather(pool, kv_lens) reads each row's positions 0..kv_len-1 back through its block table:
    [B, Hkv, L, D] with key j = position j (L at least the longest kv_len; past a row's kv_len,
    anything)."""
    with _blaming_earlier("check_gather", earlier):
        _check_gather(your_cache(cls, *earlier), block_size, seed)


def _check_gather(cls, block_size: int, seed: int) -> None:
    """check_gather's work, on the learner's whole class."""
    bs = block_size
    cache = _cache(cls, num_blocks=48, block_size=bs, seed=seed)
    lengths = _lengths(bs) + [3 * bs]
    config = tiny().config
    for s, n in enumerate(lengths):
        cache.create(s)
        cache.reserve(s, n)
        cache.set_length(s, n)
    _random_pools(cache, seed)
    for order in (list(range(len(lengths))), [4, 1], [2]):
        cache.set_batch(order)
        kv_lens = torch.tensor([lengths[s] for s in order])
        for layer, pool in ((0, cache.k_pools[0]), (len(cache.v_pools) - 1, cache.v_pools[-1])):
            got = cache.gather(pool, kv_lens)
            longest = int(kv_lens.max())
            want_shape = (len(order), config.num_kv_heads, longest, config.head_dim)
            if not isinstance(got, torch.Tensor) or got.dim() != 4 or got.shape[:2] != want_shape[:2] \
                    or got.shape[3] != want_shape[3] or got.shape[2] < longest:
                fail(f"gather for rows {order} with kv_lens {kv_lens.tolist()}: the shape",
                     want_shape, tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__,
                     "[B, kv_heads, L, head_dim] with L >= the longest kv_len: transpose the "
                     "[B, L, kv_heads, D] you index out of the pool")
            for b, s in enumerate(order):
                table = cache.tables[s]
                for p in range(lengths[s]):
                    want = pool[table[p // bs], :, p % bs]
                    if torch.equal(got[b, :, p], want):
                        continue
                    if torch.equal(got[b, :, p], pool[p // bs, :, p % bs]):
                        hint = (f"that is block {p // bs}, the logical block number: the table was "
                                "ignored. Read block_tables[b, p // bs] (slot_mapping does it)")
                    elif p + 1 < lengths[s] and torch.equal(got[b, :, p], pool[table[(p + 1) // bs], :,
                                                                           (p + 1) % bs]):
                        hint = "it holds position p + 1: key index j must be position j, from 0"
                    else:
                        hint = "key index j of row b is position j: pool[block_tables[b, j // bs], :, j % bs]"
                    fail(f"gather for rows {order}, row {b} (sequence {s}, {lengths[s]} tokens, table "
                         f"{table}): key {p}", f"pool[{table[p // bs]}, :, {p % bs}]", "another vector", hint)
    passed(f"gather: rows of lengths {lengths} (bs {bs}) read back through scrambled tables, in any batch "
           "order, key j = position j")


# --------------------------------------------------------------------------------------------------
# Exercise 3.3: free and truncate
# --------------------------------------------------------------------------------------------------

def _hold(cache, seq: int, n: int) -> list[int]:
    cache.create(seq)
    cache.reserve(seq, n)
    cache.set_length(seq, n)
    return list(cache.tables[seq])


def _leaked(cache, blocks: list[int], want: list[int]) -> str:
    counts = [cache.allocator.refcount(b) for b in blocks]
    return "; ".join(f"block {b}: refcount {c}, expected {w}" for b, c, w in zip(blocks, counts, want)
                     if c != w)


@check
def check_free(cls, *earlier, block_size: int = 4, seed: int = 2) -> None:
    """free(seq) releases each block of seq's table once (a block another owner still names stays in
    use), then forgets seq's table and length."""
    with _blaming_earlier("check_free", earlier):
        _check_free(your_cache(cls, *earlier), block_size, seed)


def _check_free(cls, block_size: int, seed: int) -> None:
    """check_free's work, on the learner's whole class."""
    bs = block_size
    cache = _cache(cls, num_blocks=32, block_size=bs, seed=seed)
    blocks = {s: _hold(cache, s, n) for s, n in enumerate(_lengths(bs))}
    for s in (2, 0, 3):
        free = cache.allocator.num_free
        cache.free(s)
        if cache.allocator.num_free != free + len(blocks[s]):
            fail(f"free({s}) of a sequence with {len(blocks[s])} block(s) {blocks[s]}: blocks back on the "
                 "free list", len(blocks[s]), cache.allocator.num_free - free,
                 "a free that leaks: release every block of the table, once each ("
                 + (_leaked(cache, blocks[s], [0] * len(blocks[s])) or "refcounts are 0 but") + ")")
        if s in cache.tables or s in cache.lengths:
            fail(f"after free({s}), sequence {s} is still in self.tables or self.lengths",
                 hint="forget the sequence: delete its table and its length")
        expect_raises(KeyError, lambda: cache.length(s), f"length({s}) after free({s})",
                      "a freed sequence is unknown to the cache")
    # A block another owner names (a fork, a prefix cache) stays in use after free.
    shared = blocks[1][0]
    cache.allocator.share(shared)
    free = cache.allocator.num_free
    cache.free(1)
    if cache.allocator.refcount(shared) != 1:
        fail(f"free(1), whose block {shared} has a second owner: refcount of block {shared} afterwards", 1,
             cache.allocator.refcount(shared),
             "release each block exactly once: the other owner keeps its reference")
    expect_equal(cache.allocator.num_free, free + len(blocks[1]) - 1,
                 f"free(1) with block {shared} still owned elsewhere: blocks back on the free list",
                 "release each block once; only blocks nobody else names become free")
    cache.allocator.release(shared)
    expect_equal(cache.allocator.num_free, 32, "after freeing every sequence: num_free",
                 "a free that leaks: release every block of the table")
    passed(f"free: each block released once ({sum(len(b) for b in blocks.values())} blocks over 4 "
           "sequences), a block with another owner stays in use, the sequence is forgotten")


def _truncate_cases(bs: int) -> list[tuple[int, int, int, str]]:
    """(tokens held, new length, tokens reserved past them, what the case shows)."""
    return [(2 * bs + 3, bs + 1, 0, "to mid-block"), (2 * bs + 3, bs, 0, "onto a block boundary"),
            (2 * bs + 1, 2 * bs - 1, 0, "back across one block boundary"),
            (bs + 1, bs + 1, 0, "to the same length"),
            (bs + 1, bs + 1, 2 * bs, "to the same length with reserved blocks past it"),
            (bs + 2, bs, bs, "onto a boundary with a reserved block past it"),
            (3 * bs, 0, 0, "to 0"), (bs - 1, 1, 0, "within one block")]


def _truncate_table_hint(got: list[int], keep: int, length: int, bs: int, reserved: int) -> str:
    """What a wrong table after truncate says about the bug."""
    if len(got) == keep - 1:
        return (f"{length} tokens need ceil({length}/{bs}) = {keep} block(s): the partial last block still "
                "holds tokens, keep it")
    if len(got) == keep + 1 and length % bs == 0 and not reserved:
        return f"{length} tokens fill exactly {keep} block(s); the next one holds nothing: ceil, not length // bs + 1"
    if reserved and len(got) > keep:
        return ("blocks reserved past the tokens are the sequence's too: truncate keeps only the blocks the "
                f"{length} tokens need and releases the rest, also when the length does not change (no early "
                "return)")
    return "keep the first ceil(length / bs) entries, in order, and drop the rest"


def truncate_holding_the_table(cache, seq: int, length: int) -> list[int]:
    """cache.truncate(seq, length) while a caller holds the table list it took before; what that list
    reads afterwards. Only for a cache of this process: see _seen_as_data."""
    held = cache.tables[seq]
    cache.truncate(seq, length)
    return list(held)


def _seen_as_data(cache) -> bool:
    """Whether `cache` lives in another process (the grader's host): the grader's judge reads its tables
    as data, copies, so which list object holds a table cannot be seen there, and is not scored (the
    notebook's own run of the check, where the cache is in the same process, shows the classic bug)."""
    return hasattr(type(cache), "call_there")


def _check_one_truncate(cache, seq: int, n: int, length: int, reserved: int) -> None:
    """Truncate a sequence holding n tokens (and `reserved` more reserved) to `length`; check its table (the
    same list object), the dropped and kept blocks' refcounts, and its length."""
    bs = cache.block_size
    cache.create(seq)
    cache.reserve(seq, n + reserved)
    cache.set_length(seq, n)
    table = list(cache.tables[seq])
    free = cache.allocator.num_free
    if _seen_as_data(cache):
        cache.truncate(seq, length)
        held = None
    else:
        held = truncate_holding_the_table(cache, seq, length)
    keep = ceil_div(length, bs)
    what = f"truncate({seq}, {length}) of a {n}-token sequence" + (
        f" with room reserved for {reserved} more" if reserved else "") + f", table {table} (bs {bs})"
    got = cache.tables.get(seq)
    if got is None:
        fail(f"{what} removed its table", hint="truncate keeps the sequence (even at length 0); only free forgets it")
    if list(got) != table[:keep]:
        fail(f"{what}: its table", table[:keep], list(got), _truncate_table_hint(list(got), keep, length, bs, reserved))
    if held is not None and held != table[:keep]:
        fail(f"{what}: the table list a caller took with table({seq}) before the truncate still reads",
             table[:keep], held, "cut the list in place (del table[keep:]): self.tables[seq] = table[:keep] "
             "makes a new list, and whoever holds the old one still sees blocks already released")
    released = table[keep:]
    counts = [cache.allocator.refcount(b) for b in released]
    if counts != [0] * len(released) or cache.allocator.num_free != free + len(released):
        hint = ("a truncate that drops table entries without releasing them leaks those blocks: release each "
                "dropped block with self.allocator.release" if any(c > 0 for c in counts) else
                "release each dropped block exactly once")
        fail(f"{what}: refcounts of the dropped blocks {released}", [0] * len(released), counts, hint)
    expect_equal([cache.allocator.refcount(b) for b in table[:keep]], [1] * keep,
                 f"{what}: refcounts of the kept blocks {table[:keep]}", "the kept blocks stay exactly as they were")
    expect_equal(cache.length(seq), length, f"{what}: length({seq})", "set self.lengths[seq] to the new length")


@check
def check_truncate(cls, *earlier, block_size: int = 4, seed: int = 3) -> None:
    """truncate(seq, length) keeps the first ceil(length / bs) blocks in the same list, releases the rest
    (reserved ones too), sets the length; a length outside [0, current] is a ValueError."""
    with _blaming_earlier("check_truncate", earlier):
        _check_truncate(your_cache(cls, *earlier), block_size, seed)


def _check_truncate(cls, block_size: int, seed: int) -> None:
    """check_truncate's work, on the learner's whole class."""
    bs = block_size
    cache = _cache(cls, num_blocks=64, block_size=bs, seed=seed)
    proved = Proved("truncate")
    cases = _truncate_cases(bs)
    for seq, (n, length, reserved, shows) in enumerate(cases):
        _check_one_truncate(cache, seq, n, length, reserved)
        proved.note(shows)
    if not _seen_as_data(cache):
        proved.note("the table stays the same list object")
    seq = len(cases)
    _hold(cache, seq, bs + 2)
    before = _state(cache)
    for bad in (bs + 3, -1):
        expect_raises(ValueError, lambda: cache.truncate(seq, bad), f"truncate({seq}, {bad}) on a sequence of "
                      f"{bs + 2} tokens", "a new length outside [0, length] is a ValueError: truncate only rolls back")
        expect_equal(_state(cache), before, f"after the refused truncate({seq}, {bad}): every table, length, "
                     "refcount and the free count", "check the length before changing anything")
    proved.note("a length above the current one or below 0 raises ValueError and changes nothing")
    proved.passed(f"{len(cases)} rollbacks keep ceil(length / bs) blocks and release exactly the rest")


# --------------------------------------------------------------------------------------------------
# The decisive check: the whole cache in the engine, against from-scratch runs
# --------------------------------------------------------------------------------------------------

def _diagnose(cls) -> str:
    """Run the method checks on `cls` quietly; the hint of the first that fails, else a general one."""
    import contextlib
    import io
    for probe in (check_reserve, check_set_batch, check_write, check_gather, check_free, check_truncate):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                probe(cls)
        except CheckFailed as exc:
            return f"{probe.__name__} fails on your class too: {exc}"
    return ("each method passes on its own; look at how they meet: reserve's room, the lengths set_batch "
            "reads, and the length the last layer commits")


def written_out(cls, block_size: int, seed: int = 0):
    """A run for continuations: the trained model's prompt through the learner's composed cache class,
    its free list scrambled as in the milestone (a cache that ignores its table writes elsewhere)."""
    def make(config, tokens: int):
        return _built(cls, config, 2 * ceil_div(tokens, block_size) + 1, block_size, seed)
    return continuations.plain_run(make)


@check
def check_cache_matches_scratch(cls, *earlier, block_size: int = 4, seed: int = 0, steps: int = 20) -> None:
    """The decisive check: the tiny model through the learner's cache (`cls` with the earlier exercises'
    classes, as one class; scrambled free list), a ragged prefill of lengths bs-1, bs, bs+1, 2bs+1, `steps`
    decode steps with a rollback, a free and a newcomer on the way; every logit equals a from-scratch run
    within 1e-5, and the pool is whole at the end."""
    from engine.generate import cached_step, scratch_logits
    cls = your_cache(cls, *earlier)
    model = tiny()
    bs = block_size
    lengths = _lengths(bs)
    longest = max(lengths) + steps + 2 * bs
    num_blocks = (len(lengths) + 1) * (ceil_div(longest, bs) + 1)
    cache = _cache(cls, num_blocks=num_blocks, block_size=bs, seed=seed)
    # The pool's last block goes to the longest sequence's first block: a write through slot -1
    # (padding not skipped) then lands in history that later steps read.
    order = [b for b in cache.allocator.free if b != num_blocks - 1]
    order.insert(sum(ceil_div(n, bs) for n in lengths[:-1]), num_blocks - 1)
    cache.allocator.free.clear()
    cache.allocator.free.extend(order)
    seqs: dict[int, list[int]] = {}
    diagnosis: list[str] = []

    def hint() -> str:
        if not diagnosis:
            diagnosis.append(_diagnose(cls))
        return diagnosis[0]

    def step(new: dict[int, list[int]], stage: str) -> None:
        active = list(new)
        for s in active:
            seqs[s] = seqs[s] + new[s]
        try:
            got = cached_step(model, cache, active, [new[s] for s in active])
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as exc:                    # name the bug behind the crash, not just the crash
            fail(f"{stage}: the forward pass through your cache crashed with {type(exc).__name__}: {exc}",
                 hint=hint())
        want = scratch_logits(model, [seqs[s] for s in active])
        for s, g, w in zip(active, got, want):
            n = len(new[s])
            close = g.shape == w[-n:].shape and bool((g - w[-n:]).abs().max() <= ATOL)
            with shows_text(lambda: continuations.shown(written_out(cls, bs, seed))):
                compare_logits(g, w[-n:], f"{stage}, sequence {s} ({len(seqs[s])} tokens)",
                               first_position=len(seqs[s]) - n, hint=None if close else hint())
            if cache.length(s) != len(seqs[s]):
                fail(f"{stage}: length({s})", len(seqs[s]), cache.length(s), hint())

    for s in range(len(lengths)):
        cache.create(s)
        seqs[s] = []
    step({s: seeded_tokens(n, seed=300 + s) for s, n in enumerate(lengths)},
         f"after a ragged prefill of lengths {lengths} (bs {bs})")
    rng = random.Random(seed)
    newcomer = len(lengths)
    for t in range(1, steps + 1):
        if t == 6:                                  # speculative decoding rejects 3 draft tokens
            keep = len(seqs[3]) - 3
            cache.truncate(3, keep)
            seqs[3] = seqs[3][:keep]
        if t == 11:                                 # a request finishes; a newcomer takes its blocks
            cache.free(1)
            del seqs[1]
            cache.create(newcomer)
            seqs[newcomer] = []
        new = {s: [rng.randrange(256)] for s in seqs}
        if t == 11:
            new[newcomer] = seeded_tokens(2 * bs + 2, seed=400)
        step(new, f"at decode step {t}" + (" (after truncating sequence 3 by 3 tokens)" if t == 6 else "")
             + (f" (sequence 1 freed, newcomer {newcomer} prefilled)" if t == 11 else ""))
    for s in list(seqs):
        cache.free(s)
    if cache.allocator.num_free != num_blocks:
        fail("after freeing every sequence: blocks on the free list", num_blocks, cache.allocator.num_free,
             hint())
    passed(f"your cache in the engine: a ragged prefill of lengths {lengths} (bs {bs}, scrambled free "
           f"list), {steps} decode steps with a rollback, a free and a newcomer; every logit matches a "
           f"from-scratch run within {ATOL:g}; all {num_blocks} blocks free at the end")


# --------------------------------------------------------------------------------------------------
# The seed's demo and the review questions
# --------------------------------------------------------------------------------------------------

def utilization(cls, lengths: list[int], block_size: int) -> dict:
    """Store requests of `lengths` tokens in a cache of `cls` just big enough for them (a one-layer,
    one-head shape: only the bookkeeping matters); its tokens, slots reserved and utilization."""
    from engine.cache.fill import data_only_config, store
    num_blocks = sum(ceil_div(n, block_size) for n in lengths)
    cache = cls(data_only_config(), num_blocks, block_size=block_size, attention="reference")
    store(cache, lengths)
    return {"block_size": block_size, "tokens_stored": cache.tokens_stored,
            "slots_reserved": cache.slots_reserved, "utilization": cache.utilization(),
            "mean_table_length": sum(len(cache.tables[s]) for s in range(len(lengths))) / len(lengths)}


@check
def check_q1_truncate_releases(answer) -> None:
    """Q1: a 37-token sequence in blocks of 16 is truncated to 20 tokens; how many blocks are released?"""
    review_number(answer, "Q1", "answer_q1", 1, "3 blocks before, 2 kept, 1 released",
                  "blocks released by truncate(seq, 20) of a 37-token sequence (bs 16)",
                  "the table holds ceil(37/16) blocks and keeps ceil(20/16); the difference is released",
                  unit="a whole number", reveal=True)


@check
def check_q2_failed_reserve(answer) -> None:
    """Q2: the free blocks left after a reserve that raised OutOfBlocks on a pool with 5 free blocks."""
    review_number(answer, "Q2", "answer_q2", 5, "a failed reserve takes nothing, so all 5 blocks are still free",
                  "free blocks after reserve(seq, 100) raised OutOfBlocks with 5 free",
                  "reserve is all or nothing: what did the failed call take?", unit="a whole number", reveal=True)


@check
def check_q3_slot(answer) -> None:
    """Q3: where update stores the key of position p of batch row b (a choice, "a" to "d")."""
    expect_equal(chosen_letter(answer, "Q3", "answer_q3"), "b", "Q3: the slot of position p of row b",
                 "the table of row b maps the logical block p // bs to a physical block; p % bs is the "
                 "offset inside it")
    passed("Q3: k_pool[block_tables[b, p // bs], :, p % bs]")
