"""PagedKVCache: the cache protocol over one pool of fixed-size blocks, reached through block tables.

Per layer the pool is `[num_blocks, kv_heads, block_size, head_dim]` for K and the same for V.
Sequence `s` keeps a block table `tables[s]`: logical block i of `s` is physical block
`tables[s][i]`. Blocks come from an allocator with reference counts, so several tables may name the
same block (a fork, a prefix-cache hit); such a shared block is copied before anyone writes into it.

Three pieces, one concern each: the bookkeeping (tables, lengths, refcounts: block_tables.py, no
tensors), the storage (the K/V pools: kv_pool.py), and the methods the chapters teach, here, which
join them. Attention over the pools is engine.attention's (`attend` only hands the pools over).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.attention import paged_attention
from engine.attention.reference import attention as reference_attention
from engine.attention.sdpa import as_dtype
from engine.cache.allocator import BlockAllocator
from engine.cache.block_tables import BlockTables
from engine.cache.errors import OutOfBlocks
from engine.cache.kv_pool import KVPool
from engine.cache.slots import blocks_needed, check_block_size, slot_mapping

# "auto": Triton on CUDA, torch on CPU (engine.attention decides); "reference": update, then plain attention.
ATTENTION_PATHS = ("auto", "torch", "triton", "reference")
# The student edition (engine/course/authoring/edition.py) swaps taught bodies for stubs that run the learner's
# code, and imports engine._edition here to do so: then attend stores through `write` itself, the learner's.
EDITION_STUBS = "_edition" in globals()


class WritePlan(NamedTuple):
    """Where one forward's new K/V go in every layer's pools, worked out once by layer 0 (see `store`)."""

    positions: torch.Tensor       # the forward's positions [B, T]; the plan is for them
    tables: torch.Tensor          # and for the block tables set_batch made
    rows: torch.Tensor            # [n * Hkv] rows of a pool viewed as [N * Hkv * bs, D], (token, KV head) in order
    keep: torch.Tensor | None     # which of the B * T * Hkv new (token, KV head) rows are stored (None: all)
    kv_lens: torch.Tensor         # [B]: the keys each row holds after this forward, what write returns


@dataclass
class SwappedSequence:
    """A preempted sequence's K/V on the host, [layers, blocks, kv_heads, block_size, head_dim] each."""

    length: int
    keys: torch.Tensor
    values: torch.Tensor


class PagedKVCache:
    """KV cache in blocks: memory is taken one block at a time, so at most block_size - 1 slots idle."""

    def __init__(self, config, num_blocks: int, block_size: int = 16, dtype=torch.float32,
                 device="cpu", allocator=None, attention: str = "auto"):
        """Allocate the K and V pools of every layer up front; `allocator` may be any BlockAllocator look-alike."""
        if attention not in ATTENTION_PATHS:
            raise ValueError(f"attention must be one of {ATTENTION_PATHS}, got {attention!r}")
        allocator = BlockAllocator(num_blocks) if allocator is None else allocator
        if getattr(allocator, "num_blocks", num_blocks) != num_blocks:
            raise ValueError(f"the allocator manages {allocator.num_blocks} blocks, the pool has {num_blocks}")
        self.swapped: dict[int, SwappedSequence] = {}
        self.books = BlockTables(check_block_size(block_size), allocator, away=self.swapped)
        self.allocator = allocator
        self.config, self.num_blocks, self.attention = config, num_blocks, attention
        self.device, self.dtype = torch.device(device), dtype
        shape = (num_blocks, config.num_kv_heads, block_size, config.head_dim)
        self.pool = KVPool(config.num_layers, shape, dtype, device)
        self.k_pools, self.v_pools = self.pool.keys, self.pool.values
        self.batch: list[int] = []
        self.block_tables = self.batch_lengths = self.batch_capacity = None
        self.write_plan: WritePlan | None = None

    # ---- the bookkeeping, read and written through BlockTables (the same objects) ----

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self.books.block_size

    def __setattr__(self, name, value) -> None:
        """`allocator` stays a plain attribute (a prefix cache wraps it by setting it, which the grader allows
        for data only); the one set here is the one the block tables count with."""
        object.__setattr__(self, name, value)
        if name == "allocator" and "books" in self.__dict__:
            self.books.allocator = value

    @property
    def tables(self) -> dict[int, list[int]]:
        """Block table of each live sequence: logical block i is physical block tables[seq][i]."""
        return self.books.tables

    @property
    def lengths(self) -> dict[int, int]:
        """Tokens stored for each live sequence."""
        return self.books.lengths

    # ---- the protocol: create, reserve, set_batch, update, length, free ----

    def create(self, seq: int) -> None:
        """Start an empty sequence: no blocks until reserve asks for them."""
        self.books.create(seq)

    def reserve(self, seq: int, n: int) -> None:
        """Make positions [length, length + n) writable; if they cannot be, raise
        OutOfBlocks and change nothing."""
        table = self.table(seq)
        new = max(0, blocks_needed(self.lengths[seq] + n, self.block_size) - len(table))
        copies = self.shared_writes(seq, n)   # chapter 4: shared blocks written into
        wanted = new + len(copies)
        free = self.allocator.num_free
        if wanted > free:                     # before the first copy or allocation
            what = f"sequence {seq} cannot reserve {n} token(s)"
            raise OutOfBlocks(wanted, free, what)
        for index in copies:
            self.copy_on_write(seq, index)
        table.extend(self.allocator.allocate(new))

    def set_batch(self, seqs) -> None:
        """Name the sequences of the next forward (batch-row order); build their block
        tables as one tensor, with their lengths and capacities."""
        seqs = list(seqs)
        if not seqs or len(set(seqs)) != len(seqs):
            raise ValueError(f"a batch needs distinct sequences, got {seqs}")
        tables = [self.table(seq) for seq in seqs]
        width = max(1, max(len(table) for table in tables))
        # Short rows are padded with block 0: only positions past kv_len read it.
        rows = [table + [0] * (width - len(table)) for table in tables]
        lengths = [self.lengths[seq] for seq in seqs]
        capacity = [len(table) * self.block_size for table in tables]
        self.batch = seqs
        self.block_tables = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.batch_lengths = torch.tensor(lengths, dtype=torch.long, device=self.device)
        self.batch_capacity = torch.tensor(capacity, dtype=torch.long,
                                           device=self.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor):
        """Store k, v [B, Hkv, T, D] at their slots, then read each row's history back
        (the reference path)."""
        kv_lens = self.write(layer, k, v, positions)
        keys = self.gather(self.k_pools[layer], kv_lens)
        return keys, self.gather(self.v_pools[layer], kv_lens), kv_lens

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
        """Scatter k, v [B, Hkv, T, D] into this layer's pools through the slot
        mapping; return kv_lens [B], the keys each row holds after this step."""
        if layer == 0:
            self.check_positions(positions)   # in reserved room, above the history
        valid = positions >= 0                # padding (-1) is never written
        slots = slot_mapping(self.block_tables, positions, self.block_size)[valid]
        blocks, offsets = slots // self.block_size, slots % self.block_size
        k_pool, v_pool = self.k_pools[layer], self.v_pools[layer]
        k_pool[blocks, :, offsets] = k.transpose(1, 2)[valid].to(self.dtype)
        v_pool[blocks, :, offsets] = v.transpose(1, 2)[valid].to(self.dtype)
        newest = torch.where(valid, positions + 1, 0)   # one past each written position
        kv_lens = torch.cat([self.batch_lengths[:, None], newest], dim=1).amax(dim=1)
        if layer == len(self.k_pools) - 1:    # the last layer commits the new lengths
            for seq, n in zip(self.batch, kv_lens.tolist()):
                self.lengths[seq] = n
            self.batch_lengths = kv_lens
        return kv_lens

    def gather(self, pool: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
        """Each row's positions 0..kv_len-1 read back out of the pool:
        [B, Hkv, L, D], key j = position j."""
        span = max(int(kv_lens.max()), 1)
        history = torch.arange(span, device=self.device).expand(len(self.batch), span)
        history = torch.where(history < kv_lens[:, None], history, -1)
        # Past a row's kv_len: slot -1, clamped to slot 0; kv_lens masks those keys.
        slots = slot_mapping(self.block_tables, history, self.block_size).clamp(min=0)
        bs = self.block_size
        return pool[slots // bs, :, slots % bs].transpose(1, 2)

    def attend(self, layer: int, q, k, v, positions: torch.Tensor) -> torch.Tensor:
        """Store k, v as `write` does (see `store`), then attend q [B, Hq, T, D] over the pools through the
        block tables (engine.attention picks the kernel; Triton's read the pool in place)."""
        if self.attention == "reference":            # gather a contiguous history, then plain attention
            keys, values, kv_lens = self.update(layer, k, v, positions)
            return reference_attention(q, keys, values, positions, kv_lens)
        kv_lens = self.store(layer, k, v, positions)
        out = paged_attention(as_dtype(q, self.dtype), self.k_pools[layer], self.v_pools[layer], self.block_tables,
                              positions, kv_lens, backend=self.attention)
        return as_dtype(out, q.dtype)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`write` for attend: the same slots, lengths and kv_lens, with what every layer repeats (the checks,
        the slot mapping, kv_lens) done once per forward by layer 0. A class with a write of its own (a
        learner's), or the student edition's stub, stores through that write."""
        if type(self).write is not ENGINE_WRITE or EDITION_STUBS:
            return self.write(layer, k, v, positions)
        plan = self.write_plan
        if layer == 0 or plan is None or plan.positions is not positions or plan.tables is not self.block_tables:
            plan = self.write_plan = self.plan_writes(positions)
        store_rows(self.k_pools[layer], k, plan)
        store_rows(self.v_pools[layer], v, plan)
        if layer == len(self.k_pools) - 1:    # the last layer commits the new lengths
            for seq, n in zip(self.batch, plan.kv_lens.tolist()):
                self.lengths[seq] = n
            self.batch_lengths = plan.kv_lens
        return plan.kv_lens

    def plan_writes(self, positions: torch.Tensor) -> WritePlan:
        """write's checks, slots and kv_lens for these positions, as pool rows (see WritePlan)."""
        self.check_positions(positions)       # in reserved room, above the history
        bs, heads = self.block_size, self.k_pools[0].shape[1]
        valid = positions >= 0                # padding (-1) is never written
        slots = slot_mapping(self.block_tables, positions, bs)[..., None]              # [B, T, 1]
        head = torch.arange(heads, device=positions.device)
        rows = ((slots // bs * heads + head) * bs + slots % bs).flatten()           # [B * T * Hkv]
        keep = None
        if not bool(valid.all()):
            keep = valid[..., None].expand(*valid.shape, heads).flatten().nonzero().flatten()
            rows = rows[keep]
        newest = torch.where(valid, positions + 1, 0)   # one past each written position
        kv_lens = torch.cat([self.batch_lengths[:, None], newest], dim=1).amax(dim=1)
        return WritePlan(positions, self.block_tables, rows, keep, kv_lens)

    def length(self, seq: int) -> int:
        """Tokens stored for seq (also while it is swapped out)."""
        if seq in self.swapped:
            return self.swapped[seq].length
        return self.books.length(seq)

    def free(self, seq: int) -> None:
        """Forget seq: each of its blocks loses one owner; blocks nobody else names
        are free again."""
        if self.swapped.pop(seq, None) is not None:   # swapped out (chapter 7)
            return
        for block in self.table(seq):
            self.allocator.release(block)
        del self.tables[seq], self.lengths[seq]

    def truncate(self, seq: int, length: int) -> None:
        """Roll seq back to its first `length` tokens (rejected draft tokens); release
        the blocks past them."""
        table = self.table(seq)
        if not 0 <= length <= self.lengths[seq]:
            raise ValueError(f"cannot truncate sequence {seq} of {self.lengths[seq]} "
                             f"tokens to {length}")
        keep = blocks_needed(length, self.block_size)
        for block in table[keep:]:
            self.allocator.release(block)
        del table[keep:]
        # A kept block that is shared and now partial is copied by the next reserve.
        self.lengths[seq] = length

    # ---- for callers that place K/V without a forward pass (prefix hit, simulator)

    def share_blocks(self, seq: int, blocks) -> None:
        """Append blocks that already hold seq's next positions (a prefix-cache hit),
        each with one more owner."""
        self.books.share_blocks(seq, blocks)

    def set_length(self, seq: int, length: int) -> None:
        """Record that seq's first `length` positions hold K/V written without update
        (a prefix hit, a simulation)."""
        self.books.set_length(seq, length)

    # ---- sharing: fork and copy-on-write (chapter 4) ----

    def fork(self, parent: int, child: int) -> None:
        """Start child as an alias of parent: copy the table, add an owner to each
        block; no data is copied."""
        table = list(self.table(parent))
        self.create(child)
        self.tables[child], self.lengths[child] = table, self.lengths[parent]
        for block in self.tables[child]:
            self.allocator.share(block)

    def copy_on_write(self, seq: int, index: int) -> None:
        """Give seq a private copy of logical block `index` if another owner shares it;
        seq writes there next."""
        table = self.tables[seq]
        block = table[index]
        if self.allocator.refcount(block) == 1:   # private already: write in place
            return
        [fresh] = self.allocator.allocate(1)
        for pool in self.k_pools + self.v_pools:  # every layer, K and V
            pool[fresh].copy_(pool[block])
        self.allocator.release(block)             # the other owners keep the original
        table[index] = fresh

    # ---- preemption: swap to host memory and back ----

    def swap_out(self, seq: int) -> int:
        """Copy seq's K/V to host memory and release its blocks (preemption).

        Returns the number of blocks copied.
        """
        table = self.table(seq)
        used = table[:blocks_needed(self.lengths[seq], self.block_size)]
        index = torch.tensor(used, dtype=torch.long, device=self.device)
        keys = torch.stack([pool[index] for pool in self.k_pools]).to("cpu")
        values = torch.stack([pool[index] for pool in self.v_pools]).to("cpu")
        self.swapped[seq] = SwappedSequence(self.lengths[seq], keys, values)
        for block in table:
            self.allocator.release(block)
        del self.tables[seq], self.lengths[seq]
        return len(used)

    def swap_in(self, seq: int) -> int:
        """Bring a swapped-out seq back into freshly allocated (maybe different) blocks.

        Returns their number.
        """
        if seq not in self.swapped:
            raise KeyError(f"sequence {seq} is not swapped out")
        saved = self.swapped[seq]
        if saved.keys.shape[1] > self.allocator.num_free:   # seq stays swapped out
            raise OutOfBlocks(saved.keys.shape[1], self.allocator.num_free,
                              f"sequence {seq} cannot swap in")
        blocks = self.allocator.allocate(saved.keys.shape[1])
        index = torch.tensor(blocks, dtype=torch.long, device=self.device)
        for layer, (k_pool, v_pool) in enumerate(zip(self.k_pools, self.v_pools)):
            k_pool[index] = saved.keys[layer].to(self.device)
            v_pool[index] = saved.values[layer].to(self.device)
        del self.swapped[seq]
        self.tables[seq], self.lengths[seq] = blocks, saved.length
        return len(blocks)

    # ---- accounting ----

    @property
    def blocks_in_use(self) -> int:
        """Physical blocks some owner holds (tables or a prefix cache)."""
        return self.num_blocks - self.allocator.num_free

    @property
    def tokens_stored(self) -> int:
        """Tokens of all live sequences; a shared block's tokens count once per sequence."""
        return sum(self.lengths.values())

    @property
    def slots_reserved(self) -> int:
        """Token slots in the blocks in use."""
        return self.blocks_in_use * self.block_size

    def utilization(self) -> float:
        """Tokens stored per slot reserved: about 1 minus the empty tails of last blocks (above 1 with sharing)."""
        return self.tokens_stored / self.slots_reserved if self.slots_reserved else 0.0

    # ---- helpers ----

    def table(self, seq: int) -> list[int]:
        """seq's block table, or a KeyError that says why there is none."""
        return self.books.table(seq)

    def shared_writes(self, seq: int, n: int) -> list[int]:
        """Table indices that n new tokens of seq write into while another owner still
        names the block."""
        return self.books.shared_writes(seq, n)

    def blocks_wanted(self, seq: int, n: int) -> int:
        """Free blocks reserve(seq, n) would take: new blocks plus copies of shared
        blocks it writes into."""
        return self.books.blocks_wanted(seq, n)

    def check_positions(self, positions: torch.Tensor) -> None:
        """Refuse a batch set_batch did not name, writes below a row's length (history is immutable) and
        writes past what reserve made room for."""
        if self.block_tables is None or positions.shape[0] != len(self.batch):
            raise ValueError(f"positions has {positions.shape[0]} rows but set_batch named {len(self.batch)}")
        valid = positions >= 0
        below = positions < self.batch_lengths[:, None]
        beyond = positions >= self.batch_capacity[:, None]
        bad = valid & (below | beyond)
        if bool(bad.any()):
            row, column = (int(i) for i in bad.nonzero()[0])
            seq, pos = self.batch[row], int(positions[row, column])
            raise ValueError(f"sequence {seq}: position {pos} is outside [{self.lengths[seq]}, "
                             f"{int(self.batch_capacity[row])}), the stored length and the reserved room")


# write as this module defined it: a class whose write is another (a learner's subclass, or PagedKVCache.write
# replaced in place) stores through that one.
ENGINE_WRITE = PagedKVCache.write


def store_rows(pool: torch.Tensor, new: torch.Tensor, plan: WritePlan) -> None:
    """Copy new [B, Hkv, T, D] into its rows of one layer's pool [N, Hkv, bs, D] (write's scatter, as one
    index_copy_ into the pool viewed as rows [N * Hkv * bs, D])."""
    rows = as_dtype(new, pool.dtype).transpose(1, 2).reshape(-1, new.shape[-1])   # [B * T * Hkv, D]
    if plan.keep is not None:
        rows = rows.index_select(0, plan.keep)
    pool.view(-1, pool.shape[-1]).index_copy_(0, plan.rows, rows)
